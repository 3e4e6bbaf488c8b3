//! Launching a run: one `subagent-runner` process per run, started with
//! `posix_spawn` ([`super::spawn`]) in its own session so it outlives the
//! daemon, holding the run's runner.lock, and watched through a pidfd. Its
//! spec is handed over in a sealed memfd, from the bytes committed at
//! accept: kept in the run's slot, or read from the store after a restart.
//!
//! A run spawned while a slot is free gets its runner at once, gated: the
//! runner starts and prepares the sandbox while the daemon makes the run's
//! records durable, and starts the agent only when the daemon opens the
//! gate (see `subagent_runner::gate`).

use super::state::{Inner, Slot};
use super::{finish, pidfd};
use crate::paths::RunFiles;
use crate::run::record::{EndState, RunRecord, RunState};
use crate::runservice::Source;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
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
    Lock(#[from] crate::lockfile::LockError),
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
    Open {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The sealed memfd of the runner spec could not be made.
    #[error(transparent)]
    Spec(#[from] subagent_runner::spec::SpecError),
    /// The run's runner spec could not be read from the store.
    #[error("reading the runner spec from state.db: {0}")]
    SpecRead(#[source] crate::store::StoreError),
    /// The store holds no runner spec for the run (it cannot start).
    #[error("state.db holds no runner spec for the run")]
    NoSpec,
    /// The gate's pipe could not be made.
    #[error("pipe for the runner's gate: {0}")]
    Gate(#[source] nix::Error),
    /// The driver's key is not in the daemon's environment.
    #[error(transparent)]
    NoKey(#[from] super::drivers::KeyUnset),
    /// The socket pair to the egress proxy could not be made.
    #[error("socket pair for the runner's egress proxy: {0}")]
    Channel(#[source] nix::Error),
    /// The socket pair to the model gateway could not be made.
    #[error("socket pair for the runner's model gateway: {0}")]
    GatewayChannel(#[source] nix::Error),
    /// The runner could not be spawned.
    #[error(transparent)]
    Spawn(#[from] super::spawn::SpawnError),
    /// The uid that asked for the run no longer holds a right it needs.
    #[error("the run's requester: {}", requester_text(.0))]
    Rights(#[from] crate::rights::RightsError),
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
    /// The write end of its gate, while it waits there.
    gate: Option<OwnedFd>,
    /// The daemon's end of its channel to the egress proxy, until served.
    egress: Option<OwnedFd>,
    /// The daemon's end of its channel to the model gateway, and what the
    /// gateway forwards to, until served.
    gateway: Option<(OwnedFd, crate::gateway::Setup)>,
}

/// The numbers the runner finds its descriptors at.
const LOCK_FD: RawFd = 3;
const SPEC_FD: RawFd = 4;
const UID_LOCK_FD: RawFd = 5;
const GATE_FD: RawFd = 6;
const EGRESS_FD: RawFd = 7;
const GATEWAY_FD: RawFd = 9;

/// A rights refusal with the field it is about in front.
fn requester_text(e: &crate::rights::RightsError) -> String {
    match e.field() {
        Some(f) => format!("{f}: {e}"),
        None => e.to_string(),
    }
}

/// Opens runner.log at `path` for the runner to append to (never through
/// a link).
fn open_log(path: &Path) -> Result<std::fs::File, LaunchError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| LaunchError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// What a runner is handed: runner.lock (locked) and runner.log from its
/// run folder, and its spec in a sealed memfd. Opened before the folder
/// may be renamed.
pub struct RunnerFiles {
    lock: std::fs::File,
    log: std::fs::File,
    spec: OwnedFd,
}

impl RunnerFiles {
    /// Opens them in the run folder `files` (as it is named now), with
    /// `spec`, the run's runner spec as committed.
    pub fn open(files: &RunFiles, spec: &[u8]) -> Result<RunnerFiles, LaunchError> {
        let path = files.runner_lock();
        let lock = crate::lockfile::open(&path)?;
        match crate::lockfile::try_lock(&lock) {
            Ok(true) => {}
            Ok(false) => return Err(LaunchError::Held { path }),
            Err(source) => return Err(LaunchError::Flock { path, source }),
        }
        Ok(RunnerFiles {
            lock,
            log: open_log(&files.runner_log())?,
            spec: subagent_runner::spec::sealed_memfd("subagent-runner-spec", spec)?,
        })
    }
}

/// Starts a runner with `handed`. With `uid_lock` (the run's uid lease),
/// the runner holds that too. With `gated`, it prepares the first attempt
/// and waits until [`Launched::open_gate`]. With `egress` (allowlist
/// mode), it gets one end of a channel to the proxy. With `gateway` (a
/// driver run), one end of a channel to the model gateway. Blocking.
pub fn start_runner(
    runner: &Path,
    handed: &RunnerFiles,
    uid_lock: Option<BorrowedFd<'_>>,
    gated: bool,
    egress: bool,
    gateway: Option<crate::gateway::Setup>,
) -> Result<Launched, LaunchError> {
    let gateway = match gateway {
        Some(g) => Some((
            crate::egress::channel().map_err(LaunchError::GatewayChannel)?,
            g,
        )),
        None => None,
    };
    let channel = match egress {
        true => Some(crate::egress::channel().map_err(LaunchError::Channel)?),
        false => None,
    };
    let gate = if gated {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(LaunchError::Gate)?;
        Some((r, w))
    } else {
        None
    };
    let mut fds = vec![
        (handed.lock.as_fd(), LOCK_FD),
        (handed.spec.as_fd(), SPEC_FD),
    ];
    let mut args = vec![
        "--lock-fd".to_owned(),
        LOCK_FD.to_string(),
        "--spec-fd".to_owned(),
        SPEC_FD.to_string(),
    ];
    if let Some(fd) = uid_lock {
        fds.push((fd, UID_LOCK_FD));
        args.extend(["--uid-lock-fd".to_owned(), UID_LOCK_FD.to_string()]);
    }
    if let Some((r, _)) = &gate {
        fds.push((r.as_fd(), GATE_FD));
        args.extend(["--gate-fd".to_owned(), GATE_FD.to_string()]);
    }
    if let Some((_, theirs)) = &channel {
        fds.push((theirs.as_fd(), EGRESS_FD));
        args.extend(["--egress-fd".to_owned(), EGRESS_FD.to_string()]);
    }
    if let Some(((_, theirs), _)) = &gateway {
        fds.push((theirs.as_fd(), GATEWAY_FD));
        args.extend(["--gateway-fd".to_owned(), GATEWAY_FD.to_string()]);
    }
    // The runner reads its signals through a signalfd, so they are blocked
    // from its first instruction and an early cancel is never lost.
    let pid = super::spawn::spawn(&super::spawn::RunnerSpawn {
        program: runner,
        args: &args,
        output: Some(handed.log.as_fd()),
        fds: &fds,
        blocked: subagent_runner::supervise::handled_signals(),
    })?;
    let mut l = Launched::of(pid, gate.map(|(_, w)| w))?;
    l.egress = channel.map(|(ours, _)| ours);
    l.gateway = gateway.map(|((ours, _), g)| (ours, g));
    Ok(l)
}

impl Launched {
    /// A handle on the runner just started as `pid` (its pidfd and start
    /// time).
    fn of(pid: i32, gate: Option<OwnedFd>) -> Result<Launched, LaunchError> {
        let pidfd = match pidfd::open(pid) {
            Ok(fd) => fd,
            Err(e) => {
                // Unwatchable: it must not go on, nor stay a zombie holding
                // runner.lock.
                let child = nix::unistd::Pid::from_raw(pid);
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(e.into());
            }
        };
        let start_ticks = subagent_runner::procstat::read_stat(pid)
            .map(|s| s.start_ticks)
            .unwrap_or(0);
        Ok(Launched {
            pid,
            start_ticks,
            pidfd,
            gate,
            egress: None,
            gateway: None,
        })
    }

    /// Serves the run's gateway channel, if it has one (a driver run):
    /// the gateway lives as long as the runner holds its end, or until the
    /// handle stops it.
    pub(crate) fn serve_gateway(&mut self, rec: &RunRecord) -> Option<crate::gateway::Handle> {
        let (fd, setup) = self.gateway.take()?;
        gateway_for(rec, setup, Source::Channel(fd))
    }

    /// Serves the run's egress channel, if it has one (allowlist mode):
    /// the proxy lives as long as the runner holds its end, or until the
    /// handle stops it.
    pub(crate) fn serve_egress(&mut self, rec: &RunRecord) -> Option<crate::egress::Handle> {
        let fd = self.egress.take()?;
        Some(egress_for(rec, Source::Channel(fd)))
    }

    /// Lets a gated runner start the agent. A runner that died meanwhile is
    /// seen through its pidfd like any other.
    pub fn open_gate(&mut self) {
        if let Some(w) = self.gate.take() {
            let _ = nix::unistd::write(&w, &[subagent_runner::gate::GO]);
        }
    }

    /// Calls a gated runner's run off: it undoes what it made and exits
    /// (status 3) without starting the agent. Waits for it and says how it
    /// ended. Blocking.
    pub fn call_off(mut self) -> pidfd::RunnerExit {
        drop(self.gate.take());
        pidfd::reap(&self.pidfd)
    }
}

/// Run `rec`'s model gateway, forwarding by `setup`, serving the
/// connections `source` brings.
pub(crate) fn gateway_for(
    rec: &RunRecord,
    setup: crate::gateway::Setup,
    source: Source,
) -> Option<crate::gateway::Handle> {
    let cap = rec
        .limits
        .disk_bytes()
        .min(crate::gateway::log::MAX_LOG_BYTES);
    match crate::gateway::RunGateway::new(
        rec.run_id.to_string(),
        setup,
        rec.files().gateway_log(),
        cap,
    ) {
        Ok(run) => Some(crate::gateway::start(source, Arc::new(run))),
        Err(e) => {
            // The runner's init then finds no one at the channel's end.
            tracing::error!(run_id = %rec.run_id, "the run has no model gateway: {e}");
            None
        }
    }
}

/// Run `rec`'s egress proxy, for its allowlist, serving the connections
/// `source` brings.
pub(crate) fn egress_for(rec: &RunRecord, source: Source) -> crate::egress::Handle {
    let allow = policy::sandbox::network::parse_list(&rec.network_allow).unwrap_or_default();
    let run = crate::egress::RunProxy::new(
        rec.run_id.to_string(),
        allow,
        rec.files().egress_log(),
        rec.limits
            .disk_bytes()
            .min(crate::egress::log::MAX_LOG_BYTES),
    );
    crate::egress::start(source, Arc::new(run))
}

/// `rec` as running with runner `l`.
pub(crate) fn running(mut rec: RunRecord, l: &Launched) -> RunRecord {
    rec.started(l.pid, l.start_ticks, crate::timefmt::now_ms());
    rec
}

impl Slot {
    /// Notes the run's runner, for cancels; returns its pidfd to watch.
    pub(crate) fn set_runner(&self, l: Launched) -> Arc<OwnedFd> {
        let fd = Arc::new(l.pidfd);
        *self.runner.lock().unwrap_or_else(|p| p.into_inner()) = Some((fd.clone(), l.pid));
        fd
    }
}

/// The runner spec of run `id`: `kept` (its slot's copy from accept), or
/// the store's after a restart. No spec in either fails the start. Blocking.
fn spec_of(
    store: &crate::store::Store,
    id: &crate::ids::RunId,
    kept: Option<Vec<u8>>,
) -> Result<Vec<u8>, LaunchError> {
    match kept {
        Some(spec) => Ok(spec),
        None => store
            .spec(id)
            .map_err(LaunchError::SpecRead)?
            .ok_or(LaunchError::NoSpec),
    }
}

/// Starts a queued run, watches it, and finishes it. Holds a concurrency
/// slot until the run has ended.
pub(crate) async fn run_lifecycle(
    inner: Arc<Inner>,
    slot: Arc<Slot>,
    permit: OwnedSemaphorePermit,
) {
    let mut rec = slot.rec.lock().await;
    if rec.state() != RunState::Accepted {
        return;
    }
    let files = rec.files();
    let egress = rec.network == Some(policy::sandbox::network::NetworkMode::Allowlist);
    let runner = inner.cfg.runner.clone();
    let lease = inner.take_lease(&rec.run_id);
    let driver = rec
        .driver_run
        .as_ref()
        .map_or(Default::default(), |d| d.driver);
    let gateway = super::drivers::gateway_setup(&inner.cfg.settings, &inner.daemon_env, driver);
    let on_behalf = rec.on_behalf.clone();
    let (store, id, kept) = (inner.store.clone(), rec.run_id.clone(), slot.take_spec());
    let launched = tokio::task::spawn_blocking(move || {
        // Queued since its spawn, or since a restart: what its requester
        // may reach can have changed meanwhile.
        if let Some(ob) = &on_behalf {
            crate::rights::check(&ob.requester, &ob.needs)?;
        }
        // The runner holds the uid lease from here on; ours goes with
        // this task.
        let gateway = gateway.map_err(LaunchError::NoKey)?;
        let spec = spec_of(&store, &id, kept)?;
        let handed = RunnerFiles::open(&files, &spec)?;
        start_runner(
            &runner,
            &handed,
            lease.as_ref().map(|l| l.lock()),
            false,
            egress,
            gateway,
        )
    })
    .await
    .unwrap_or_else(|e| Err(LaunchError::Task(e)));
    match launched {
        Ok(mut l) => {
            *rec = running(rec.clone(), &l);
            slot.set_egress(l.serve_egress(&rec));
            slot.set_gateway(l.serve_gateway(&rec));
            let fd = slot.set_runner(l);
            drop(rec);
            run_started(inner, slot, permit, fd).await;
        }
        Err(reason) => {
            let mut next = rec.clone();
            tracing::error!(run_id = %next.run_id, "{reason}");
            let why = format!("{}: {reason}", crate::metrics::reason::START_FAILED);
            next.ended(EndState::Failed, why, crate::timefmt::now_ms());
            if let Err(e) = inner.persist(&slot, &mut rec, next).await {
                tracing::error!("{e}");
            }
            drop(rec);
            finish::finalize(&inner, &slot).await;
        }
    }
}

/// Records the running state of a run whose runner is going (durably)
/// and publishes it, then watches the runner (`fd`) and finishes the run.
/// Holds `permit` until the run has ended.
pub(crate) async fn run_started(
    inner: Arc<Inner>,
    slot: Arc<Slot>,
    permit: OwnedSemaphorePermit,
    fd: Arc<OwnedFd>,
) {
    let rec = slot.rec.lock().await;
    let (id, pid) = (rec.run_id.to_string(), rec.runner_pid().unwrap_or(0));
    let started = crate::store::Op::Started {
        id: rec.run_id.clone(),
        pid,
        ticks: rec.runner_start_ticks().unwrap_or(0),
        at_ms: rec.started_at_ms().unwrap_or_else(crate::timefmt::now_ms),
    };
    if let Err(e) = inner.store.commit(vec![started]).await {
        // The runner is already going; keep watching it.
        tracing::error!(run_id = %id, "recording the running state: {e}");
    }
    slot.published.send_replace(rec.clone());
    inner.metrics.started();
    tracing::info!(run_id = %id, runner_pid = pid, "run started");
    drop(rec);
    watch(inner, slot, fd).await;
    drop(permit);
}

/// Waits for the runner behind `fd` to exit, then finishes the run.
pub(crate) async fn watch(inner: Arc<Inner>, slot: Arc<Slot>, fd: Arc<OwnedFd>) {
    // SAFETY: the Arc keeps the pidfd open, and always the same descriptor,
    // for as long as the AsyncFd (which holds a clone of it) lives.
    let registered = unsafe { AsyncFd::register_with_interest(fd.clone(), Interest::READABLE) };
    match registered {
        Ok(afd) => {
            let _ = afd.readable().await;
        }
        Err(e) => {
            tracing::warn!("watching a runner's pidfd with epoll: {e}; using a blocking poll");
            // A thread of its own: it waits the whole run, and the blocking
            // pool is capped for short work.
            let (fd2, (tx, rx)) = (fd.clone(), tokio::sync::oneshot::channel());
            let wait = move || {
                let mut fds = [nix::poll::PollFd::new(
                    std::os::fd::AsFd::as_fd(&*fd2),
                    nix::poll::PollFlags::POLLIN,
                )];
                // A signal the daemon handles may land on this thread.
                let polled = loop {
                    match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                        Err(nix::errno::Errno::EINTR) => continue,
                        other => break other,
                    }
                };
                let _ = tx.send(polled);
            };
            let spawned = std::thread::Builder::new()
                .name("runner-poll".into())
                .spawn(wait);
            if let Err(e) = spawned {
                tracing::error!("starting a thread to watch a runner: {e}; its run is finished at the next start");
                return;
            }
            let _ = rx.await;
        }
    }
    let status = pidfd::reap(&fd);
    *slot.runner.lock().unwrap_or_else(|p| p.into_inner()) = None;
    finish::finish_run(&inner, &slot, status).await;
}
