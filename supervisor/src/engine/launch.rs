//! Launching a run: one `subagent-runner` process per run, in its own
//! session so it outlives the daemon, holding the run's runner.lock, and
//! watched through a pidfd. The run goes to a warm runner when one waits
//! ([`super::warm`]); else a runner is started with `posix_spawn`
//! ([`super::spawn`]).

use super::{finish, pidfd, Slot, Supervisor};
use crate::paths::RunFiles;
use crate::record::RunState;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::OwnedSemaphorePermit;

/// A run's runner could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// runner.lock could not be opened.
    #[error(transparent)]
    Lock(#[from] super::lockfile::LockError),
    /// Another runner holds runner.lock.
    #[error("{} is held by another runner", path.display())]
    Held {
        /// runner.lock.
        path: PathBuf,
    },
    /// runner.lock could not be locked.
    #[error("flock {}: {source}", path.display())]
    Flock {
        /// runner.lock.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// runner.log could not be opened.
    #[error("open {}: {source}", path.display())]
    OpenLog {
        /// runner.log.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The runner could not be spawned.
    #[error(transparent)]
    Spawn(#[from] super::spawn::SpawnError),
    /// No pidfd could be had on the runner just started.
    #[error(transparent)]
    Pidfd(#[from] pidfd::PidfdError),
    /// The blocking task starting it panicked.
    #[error("launch task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// A runner that was started.
pub struct Launched {
    /// Its pid.
    pub pid: i32,
    /// Its start time in clock ticks (tells pid reuse apart).
    pub start_ticks: u64,
    /// A pidfd on it.
    pub pidfd: OwnedFd,
}

/// Starts the runner for the run in `files`: hands it to a warm runner when
/// one waits (see [`super::warm`]), else starts one. Blocking.
/// With `uid_lock` (the run's uid lease), the runner holds that too.
pub fn start_runner(
    runner: &Path,
    warm: &super::warm::WarmRunners,
    files: &RunFiles,
    uid_lock: Option<BorrowedFd<'_>>,
) -> Result<Launched, LaunchError> {
    let path = files.runner_lock();
    let lock = super::lockfile::open(&path)?;
    match super::lockfile::try_lock(&lock) {
        Ok(true) => {}
        Ok(false) => return Err(LaunchError::Held { path }),
        Err(source) => return Err(LaunchError::Flock { path, source }),
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(files.runner_log())
        .map_err(|source| LaunchError::OpenLog {
            path: files.runner_log(),
            source,
        })?;
    if let Some(l) = warm.hand_over(&files.runner_spec(), lock.as_fd(), log.as_fd(), uid_lock) {
        return Ok(l);
    }
    let mut args = vec!["--lock-fd".to_owned(), super::spawn::LOCK_FD.to_string()];
    if uid_lock.is_some() {
        args.extend([
            "--uid-lock-fd".to_owned(),
            super::spawn::UID_LOCK_FD.to_string(),
        ]);
    }
    args.push(files.runner_spec().display().to_string());
    // The runner reads its signals through a signalfd, so they are blocked
    // from its first instruction and an early cancel is never lost. It gets
    // runner.lock as fd 3 and holds it until it dies.
    let pid = super::spawn::spawn(&super::spawn::RunnerSpawn {
        program: runner,
        args: &args,
        stdin: None,
        output: Some(log.as_fd()),
        lock: Some(lock.as_fd()),
        uid_lock,
        blocked: subagent_runner::supervise::handled_signals(),
    })?;
    drop(log);
    drop(lock);
    Launched::of(pid)
}

impl Launched {
    /// A handle on the runner just started as `pid` (its pidfd and start
    /// time).
    pub fn of(pid: i32) -> Result<Launched, LaunchError> {
        let pidfd = pidfd::open(pid)?;
        let start_ticks = subagent_runner::procstat::read_stat(pid)
            .map(|s| s.start_ticks)
            .unwrap_or(0);
        Ok(Launched {
            pid,
            start_ticks,
            pidfd,
        })
    }
}

/// Starts a queued run, watches it, and finishes it. Holds a concurrency
/// slot until the run has ended.
pub(crate) async fn run_lifecycle(sup: Supervisor, slot: Arc<Slot>, permit: OwnedSemaphorePermit) {
    let mut rec = slot.rec.lock().await;
    if rec.state != RunState::Accepted {
        return;
    }
    let files = rec.files();
    let runner = sup.inner.cfg.runner.clone();
    let warm = sup.inner.warm.clone();
    let accepted = rec.clone();
    let lease = rec.id().and_then(|id| sup.take_lease(&id));
    // The runner is started and the running state recorded (durably) in
    // one blocking task: one hand-off to the blocking pool less per run.
    let launched = tokio::task::spawn_blocking(move || {
        // The runner holds the uid lease from here on; ours goes with
        // this task.
        let l = start_runner(&runner, &warm, &files, lease.as_ref().map(|l| l.lock()))?;
        let mut next = accepted;
        next.state = RunState::Running;
        next.started_at_ms = Some(crate::timefmt::now_ms());
        next.runner_pid = Some(l.pid);
        next.runner_start_ticks = Some(l.start_ticks);
        let saved = next.save();
        Ok((l, next, saved))
    })
    .await
    .unwrap_or_else(|e| Err(LaunchError::Task(e)));
    match launched {
        Ok((l, running, saved)) => {
            let id = running.run_id.clone();
            if let Err(e) = saved {
                // The runner is already going; keep watching it.
                tracing::error!(run_id = %id, "recording the running state: {e}");
            }
            *rec = running;
            slot.published.send_replace(rec.clone());
            let fd = Arc::new(l.pidfd);
            *slot.runner.lock().unwrap_or_else(|p| p.into_inner()) = Some((fd.clone(), l.pid));
            tracing::info!(run_id = %id, runner_pid = l.pid, "run started");
            drop(rec);
            watch(sup, slot, fd).await;
        }
        Err(reason) => {
            let mut next = rec.clone();
            tracing::error!(run_id = %next.run_id, "{reason}");
            next.state = RunState::Failed;
            next.reason = Some(format!("could not start the runner: {reason}"));
            next.ended_at_ms = Some(crate::timefmt::now_ms());
            if let Err(e) = sup.persist(&slot, &mut rec, next).await {
                tracing::error!("{e}");
            }
            drop(rec);
            finish::finalize(&sup, &slot).await;
        }
    }
    drop(permit);
}

/// Waits for the runner behind `fd` to exit, then finishes the run.
pub(crate) async fn watch(sup: Supervisor, slot: Arc<Slot>, fd: Arc<OwnedFd>) {
    // SAFETY: the Arc keeps the pidfd open, and always the same descriptor,
    // for as long as the AsyncFd (which holds a clone of it) lives.
    let registered = unsafe { AsyncFd::register_with_interest(fd.clone(), Interest::READABLE) };
    match registered {
        Ok(afd) => {
            let _ = afd.readable().await;
        }
        Err(e) => {
            tracing::warn!("watching a runner's pidfd with epoll: {e}; using a blocking poll");
            let fd2 = fd.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let mut fds = [nix::poll::PollFd::new(
                    std::os::fd::AsFd::as_fd(&*fd2),
                    nix::poll::PollFlags::POLLIN,
                )];
                nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE)
            })
            .await;
        }
    }
    let status = pidfd::reap(&fd);
    *slot.runner.lock().unwrap_or_else(|p| p.into_inner()) = None;
    finish::finish_run(&sup, &slot, status).await;
}
