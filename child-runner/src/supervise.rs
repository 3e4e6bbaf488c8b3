//! The runner's event loop: one thread, one poll over the output pipe and a
//! signalfd, deadlines for the wall time and the cancel grace.

use crate::exit_record::{ExitRecord, Outcome};
use crate::logsink::LogSink;
use crate::spec::RunnerSpec;
use crate::{launch, now_unix_ms, sandbox, tree};
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::WaitStatus;
use std::io::Read;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// How long the runner keeps killing leftovers and draining the pipe after
/// the agent process ended, before it gives up on a stuck process.
const CLEANUP_BUDGET: Duration = Duration::from_secs(5);

/// The runner could not do its job at all (the run is then `lost`).
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// A setup step failed before the agent process could be started.
    #[error("{op}: {source}")]
    Setup {
        /// The step.
        op: &'static str,
        /// The errno.
        source: nix::Error,
    },
    /// child.log could not be opened.
    #[error("open {path}: {source}")]
    OpenLog {
        /// child.log.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn setup(op: &'static str) -> impl FnOnce(nix::Error) -> RunnerError {
    move |source| RunnerError::Setup { op, source }
}

/// The signals the runner handles through its signalfd.
pub fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        set.add(s);
    }
    set
}

struct Loop {
    child_pid: i32,
    status: Option<WaitStatus>,
    cancelled: bool,
    timed_out: bool,
    kill_at: Option<Instant>,
    leftover_killed: u32,
}

impl Loop {
    fn note_reaped(&mut self, statuses: Vec<WaitStatus>) {
        for st in statuses {
            if st.pid().map(|p| p.as_raw()) == Some(self.child_pid) && self.status.is_none() {
                self.status = Some(st);
            }
        }
    }
}

/// Runs the agent command to its end and returns how it ended. The caller
/// writes the record to exit.json.
/// `main_started` is when the runner's `main` began; the time from it to
/// the first attempt is reported as `runner_start` in `setup_us`.
pub fn run(spec: &RunnerSpec, main_started: Instant) -> Result<ExitRecord, RunnerError> {
    let me = nix::unistd::getpid().as_raw();
    let mask = handled_signals();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).map_err(setup("sigprocmask"))?;
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(setup("signalfd"))?;
    nix::sys::prctl::set_child_subreaper(true).map_err(setup("prctl(PR_SET_CHILD_SUBREAPER)"))?;
    let mut sink = LogSink::open(&spec.log_path, spec.output_bytes).map_err(|source| {
        RunnerError::OpenLog {
            path: spec.log_path.clone(),
            source,
        }
    })?;
    let started = Instant::now();
    // The wall time covers every attempt. Far-future limits saturate
    // instead of overflowing the clock.
    let deadline = started
        .checked_add(Duration::from_secs(spec.wall_time_s))
        .unwrap_or(started + Duration::from_secs(100 * 365 * 24 * 3600));
    let max_attempts = spec.restart.as_ref().map_or(1, |r| r.max_attempts.max(1));
    let mut attempt = 1;
    let first_start = now_unix_ms();
    loop {
        if let Some(r) = &spec.restart {
            crate::restart::record_attempt(r, attempt);
            if attempt > 1 {
                sink.note(&format!(
                    "\n[subagentd: attempt {attempt} of {max_attempts}]\n"
                ));
            }
        }
        let runner_start_us = main_started.elapsed().as_micros() as u64;
        let mut rec = attempt_once(spec, &sfd, &mut sink, me, deadline)?;
        if attempt == 1 {
            rec.setup_us.insert("runner_start".into(), runner_start_us);
        }
        let mut continue_me =
            rec.outcome == Outcome::Exited && rec.exit_code == Some(crate::restart::EXIT_CONTINUE);
        // A cancel that arrived as the attempt ended is not lost: no restart.
        if continue_me && cancel_pending(&sfd) {
            rec.outcome = Outcome::Cancelled;
            rec.reason = "cancelled on request".to_owned();
            continue_me = false;
        }
        if continue_me && attempt < max_attempts {
            if let Some(r) = &spec.restart {
                match crate::restart::prepare_next(r, attempt + 1) {
                    Ok(()) => {
                        attempt += 1;
                        continue;
                    }
                    Err(e) => {
                        sink.note(&format!("[subagentd: cannot restart: {e}]\n"));
                        rec.reason = format!("exited with code 75 and could not be restarted: {e}");
                    }
                }
            }
        } else if continue_me && max_attempts > 1 {
            rec.reason = format!(
                "asked to be continued (exit 75) after the last of {max_attempts} attempts"
            );
        }
        let (log_bytes, log_truncated, log_error) = sink.finish();
        rec.log_bytes = log_bytes;
        rec.log_truncated = log_truncated;
        rec.log_error = log_error;
        rec.started_at_ms = first_start;
        rec.attempts = attempt;
        return Ok(rec);
    }
}

/// Whether a cancel signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) is waiting
/// on the signalfd; other signals read here are dropped (SIGCHLD: every
/// child of the attempt is reaped already).
fn cancel_pending(sfd: &SignalFd) -> bool {
    let mut cancel = false;
    while let Ok(Some(info)) = sfd.read_signal() {
        if info.ssi_signo as i32 != libc::SIGCHLD {
            cancel = true;
        }
    }
    cancel
}

/// One attempt: starts the agent in a fresh sandbox and supervises it to
/// its end. The caller fills in the log fields.
fn attempt_once(
    spec: &RunnerSpec,
    sfd: &SignalFd,
    sink: &mut LogSink,
    me: i32,
    deadline: Instant,
) -> Result<ExitRecord, RunnerError> {
    let (pipe_r, pipe_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(setup("pipe2"))?;
    // Best effort: a larger pipe means fewer wake-ups for chatty children.
    let _ = crate::sys::set_pipe_size(std::os::fd::AsRawFd::as_raw_fd(&pipe_r), 1 << 20);
    // The child's end must block: clear O_NONBLOCK on the write side.
    nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))
        .map_err(setup("fcntl(pipe)"))?;

    let started_at_ms = now_unix_ms();
    let not_started = |exit_code: Option<i32>, reason: String| {
        let (log_bytes, log_truncated, log_error) = (0, false, None);
        ExitRecord {
            outcome: Outcome::SpawnFailed,
            exit_code,
            signal: None,
            reason,
            child_pid: 0,
            started_at_ms,
            ended_at_ms: now_unix_ms(),
            log_bytes,
            log_truncated,
            log_error,
            leftover_killed: 0,
            isolation: None,
            resources: Default::default(),
            attempts: 1,
            setup_us: Default::default(),
        }
    };
    let prepare_started = Instant::now();
    let prepared =
        match sandbox::prepare(&spec.sandbox, &spec.cgroup_plan, &spec.run_id, spec.run_as) {
            Ok(p) => std::sync::Arc::new(p),
            Err(e) => {
                let reason = format!("sandbox: {e}; the agent was not started");
                sink.note(&format!("[subagentd: {reason}]\n"));
                return Ok(not_started(None, reason));
            }
        };
    let prepare_us = prepare_started.elapsed().as_micros() as u64;
    let spawn_started = Instant::now();
    let (child, step_times) = match launch::start(spec, pipe_w, prepared.clone()) {
        Ok(c) => c,
        Err(e) => {
            prepared.cgroups().remove();
            sink.note(&format!("[subagentd: {e}]\n"));
            let code = e.exit_code();
            return Ok(not_started(Some(code), e.to_string()));
        }
    };
    let spawn_us = spawn_started.elapsed().as_micros() as u64;
    let grace = Duration::from_millis(spec.kill_grace_ms);
    let mut st = Loop {
        child_pid: child.id() as i32,
        status: None,
        cancelled: false,
        timed_out: false,
        kill_at: None,
        leftover_killed: 0,
    };
    let mut pipe = std::fs::File::from(pipe_r);
    let mut pipe_open = true;
    let mut buf = vec![0u8; 256 * 1024];
    let mut cleanup_deadline: Option<Instant> = None;

    loop {
        if st.status.is_some() && cleanup_deadline.is_none() {
            // The agent process is gone: nothing it started may outlive it.
            prepared.cgroups().kill_all();
            let (killed, reaped) = tree::kill_tree(me, CLEANUP_BUDGET);
            st.leftover_killed += killed;
            st.note_reaped(reaped);
            cleanup_deadline = Some(Instant::now() + CLEANUP_BUDGET);
        }
        if let Some(cd) = cleanup_deadline {
            if !pipe_open || Instant::now() >= cd {
                break;
            }
        }
        let now = Instant::now();
        let mut next = cleanup_deadline.unwrap_or(deadline);
        if st.status.is_none() {
            if !st.timed_out && !st.cancelled {
                next = next.min(deadline);
            }
            if let Some(k) = st.kill_at {
                next = next.min(k);
            }
        }
        let wait_ms = next.saturating_duration_since(now).as_millis().min(60_000) as i32;
        let timeout = PollTimeout::try_from(wait_ms.max(0)).unwrap_or(PollTimeout::MAX);
        let (pipe_ready, sig_ready) = {
            let mut fds = vec![PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
            if pipe_open {
                fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    return Err(RunnerError::Setup {
                        op: "poll",
                        source: e,
                    })
                }
            }
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (fds.get(1).is_some_and(ready), ready(&fds[0]))
        };
        if sig_ready {
            while let Ok(Some(info)) = sfd.read_signal() {
                let signo = info.ssi_signo as i32;
                if signo == libc::SIGCHLD {
                    let reaped = tree::reap_all();
                    st.note_reaped(reaped);
                } else if st.status.is_none() && !st.cancelled && !st.timed_out {
                    st.cancelled = true;
                    tree::signal_tree(me, Signal::SIGTERM);
                    st.kill_at = Some(Instant::now() + grace);
                }
            }
        }
        if pipe_ready {
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => {
                        pipe_open = false;
                        break;
                    }
                    Ok(n) => sink.write(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        pipe_open = false;
                        break;
                    }
                }
            }
        }
        if st.status.is_none() {
            let now = Instant::now();
            if !st.timed_out && !st.cancelled && now >= deadline {
                st.timed_out = true;
                prepared.cgroups().kill_all();
                let (killed, reaped) = tree::kill_tree(me, CLEANUP_BUDGET);
                st.leftover_killed += killed.saturating_sub(1);
                st.note_reaped(reaped);
            }
            if st.kill_at.is_some_and(|k| now >= k) {
                st.kill_at = None;
                prepared.cgroups().kill_all();
                let (_, reaped) = tree::kill_tree(me, CLEANUP_BUDGET);
                st.note_reaped(reaped);
            }
        }
    }
    drop(child);
    let ended_at_ms = now_unix_ms();
    let (peak_memory_bytes, ooms) = prepared.cgroups().memory_stats();
    prepared.cgroups().remove();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).ok();
    let ms = |t: nix::sys::time::TimeVal| (t.tv_sec() as u64) * 1000 + (t.tv_usec() as u64) / 1000;
    let resources = crate::exit_record::Resources {
        cpu_user_ms: usage.map_or(0, |u| ms(u.user_time())),
        cpu_system_ms: usage.map_or(0, |u| ms(u.system_time())),
        peak_memory_bytes,
        oom_killed: ooms.unwrap_or(0) > 0,
    };
    let (log_bytes, log_truncated, log_error) = (0, false, None);
    let (exit_code, signal) = match st.status {
        Some(WaitStatus::Exited(_, code)) => (Some(code), None),
        Some(WaitStatus::Signaled(_, sig, _)) => (None, Some(sig as i32)),
        _ => (None, None),
    };
    let (outcome, reason) = if st.timed_out {
        (
            Outcome::TimedOut,
            format!(
                "wall time limit ({} s) exceeded; the process tree was killed",
                spec.wall_time_s
            ),
        )
    } else if st.cancelled {
        (Outcome::Cancelled, "cancelled on request".to_owned())
    } else if resources.oom_killed && exit_code != Some(0) {
        // The OOM killer ended a process of the run, and the run failed.
        let outcome = if signal.is_some() {
            Outcome::Signaled
        } else {
            Outcome::Exited
        };
        let mib = spec.sandbox.memory_bytes >> 20;
        (outcome, format!("memory limit ({mib} MiB) exceeded"))
    } else if let Some(code) = exit_code {
        (Outcome::Exited, format!("exited with code {code}"))
    } else if let Some(sig) = signal {
        (
            Outcome::Signaled,
            format!("killed by signal {sig} ({})", signal_name(sig)),
        )
    } else {
        (
            Outcome::Signaled,
            "the agent process could not be reaped".to_owned(),
        )
    };
    Ok(ExitRecord {
        outcome,
        exit_code,
        signal,
        reason,
        child_pid: st.child_pid,
        started_at_ms,
        ended_at_ms,
        log_bytes,
        log_truncated,
        log_error,
        leftover_killed: st.leftover_killed,
        isolation: Some(prepared.report.clone()),
        resources,
        attempts: 1,
        setup_us: {
            let mut m: std::collections::BTreeMap<String, u64> = step_times
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
                .collect();
            m.insert("prepare".into(), prepare_us);
            m.insert("fork_to_exec".into(), spawn_us);
            m
        },
    })
}

/// The conventional name of a signal number, e.g. "SIGKILL".
pub fn signal_name(sig: i32) -> &'static str {
    Signal::try_from(sig)
        .map(|s| s.as_str())
        .unwrap_or("unknown signal")
}
