//! The runner's event loop: one thread, one poll over the output pipe and a
//! signalfd, deadlines for the wall time and the cancel grace.

use crate::exit_record::{ExitRecord, Outcome};
use crate::logsink::LogSink;
use crate::sandbox::scratch::Scratch;
use crate::spec::RunnerSpec;
use crate::{launch, now_unix_ms, sandbox};
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{sigprocmask, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The signals the runner handles (defined in init, which blocks the same).
pub use crate::init::handled_signals;

/// How long the runner keeps draining the output pipe after the run's
/// init ended.
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

/// How an attempt's init and agent are doing.
struct Loop {
    init: Pid,
    /// The agent's raw wait status, from init, once init has ended.
    agent: Option<i32>,
    leftovers: u32,
    /// Init saw the run at its RLIMIT_NPROC process limit.
    nproc_reached: bool,
    init_done: bool,
    cancelled: bool,
    timed_out: bool,
    kill_at: Option<Instant>,
}

impl Loop {
    /// Reaps init if it has ended, and reads what it reported.
    fn reap(&mut self, status: &OwnedFd) {
        if self.init_done {
            return;
        }
        match waitpid(self.init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            _ => {
                self.init_done = true;
                let mut b = [0u8; crate::init::STATUS_LEN];
                if let Ok(n) = nix::unistd::read(status, &mut b) {
                    if let Some(st) = crate::init::decode(&b[..n]) {
                        self.agent = Some(st.wait_status);
                        self.leftovers = st.leftovers;
                        self.nproc_reached = st.nproc_reached;
                    }
                }
            }
        }
    }

    fn signal_init(&self, sig: Signal) {
        if !self.init_done {
            let _ = nix::sys::signal::kill(self.init, sig);
        }
    }
}

/// What the run's first attempt makes ready before the daemon says go:
/// the runner's own user namespace (unprivileged runners), the scratch
/// file system and the attempt's sandbox but for the idmaps. None of it
/// touches the run folder, which may not have its name yet.
pub struct Ready {
    /// Lines for child.log, once it is open.
    notes: Vec<String>,
    scratch: Result<Scratch, sandbox::mountapi::MountError>,
    /// The first attempt's sandbox; absent when there is no scratch.
    first: Option<Result<sandbox::Prepared, sandbox::SandboxError>>,
    /// The channels to the daemon.
    channels: Channels,
}

/// The runner's channels to the daemon, as it handed them over.
#[derive(Debug, Clone, Copy, Default)]
pub struct Channels {
    /// To the daemon's egress proxy (allowlist mode).
    pub egress: Option<std::os::fd::RawFd>,
    /// To the daemon's model gateway (a driver run).
    pub gateway: Option<std::os::fd::RawFd>,
}

impl Ready {
    /// Gets the first attempt ready; `channels` lead to the daemon's proxy
    /// and gateway, when the daemon handed them over.
    pub fn prepare(spec: &RunnerSpec, channels: Channels) -> Ready {
        let mut notes = Vec::new();
        if !sandbox::caps::effective_has(sandbox::caps::CAP_SYS_ADMIN) {
            // An unprivileged runner makes the run's namespaces from a user
            // namespace of its own.
            if let Err(e) = sandbox::namespaces::enter_own_user_ns() {
                notes.push(format!("[subagentd: {e}]\n"));
            }
        }
        let scratch = scratch_for(spec);
        let first = scratch.is_ok().then(|| {
            sandbox::prepare_host(&spec.sandbox, &spec.cgroup_plan, &spec.run_id, spec.run_as)
        });
        Ready {
            notes,
            scratch,
            first,
            channels,
        }
    }

    /// Undoes what was made, for a run that will not start.
    pub fn abandon(self) {
        if let Some(Ok(p)) = &self.first {
            p.cgroups().remove();
        }
    }
}

fn prepare_attempt(spec: &RunnerSpec) -> Result<sandbox::Prepared, sandbox::SandboxError> {
    sandbox::prepare(&spec.sandbox, &spec.cgroup_plan, &spec.run_id, spec.run_as)
}

/// The signalfd the runner's loop reads, and child.log.
fn signals_and_log(spec: &RunnerSpec) -> Result<(SignalFd, LogSink), RunnerError> {
    let mask = handled_signals();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).map_err(setup("sigprocmask"))?;
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(setup("signalfd"))?;
    let sink = LogSink::open(&spec.log_path, spec.output_bytes).map_err(|source| {
        RunnerError::OpenLog {
            path: spec.log_path.clone(),
            source,
        }
    })?;
    Ok((sfd, sink))
}

/// Runs the agent command to its end, starting from `ready`, and returns
/// how it ended. The caller writes the record to exit.json.
pub fn run(spec: &RunnerSpec, ready: Ready) -> Result<ExitRecord, RunnerError> {
    let (sfd, mut sink) = signals_and_log(spec)?;
    let started = Instant::now();
    // The wall time covers every attempt. Far-future limits saturate
    // instead of overflowing the clock.
    let deadline = started
        .checked_add(Duration::from_secs(spec.wall_time_s))
        .unwrap_or(started + Duration::from_secs(100 * 365 * 24 * 3600));
    let first_start = now_unix_ms();
    let Ready {
        notes,
        scratch,
        mut first,
        channels,
    } = ready;
    for n in notes {
        sink.note(&n);
    }
    let scratch = match scratch {
        Ok(s) => s,
        Err(e) => {
            let reason = format!(
                "sandbox: required mechanism disk cannot be enforced: {e}; the agent was not started"
            );
            sink.note(&format!("[subagentd: {reason}]\n"));
            let mut rec = not_started(now_unix_ms(), None, reason);
            finish_record(&mut rec, sink, first_start, 1);
            return Ok(rec);
        }
    };
    let max_attempts = spec.restart.as_ref().map_or(1, |r| r.max_attempts.max(1));
    let mut attempt = 1;
    let mut first_exec = None;
    loop {
        if let Some(r) = &spec.restart {
            crate::restart::record_attempt(r, attempt);
            if attempt > 1 {
                sink.note(&format!(
                    "\n[subagentd: attempt {attempt} of {max_attempts}]\n"
                ));
            }
        }
        let prepared = match first.take() {
            // The run folder has its name now: the owners can be read.
            Some(p) => p.and_then(|mut p| p.map_owners().map(|()| p)),
            None => prepare_attempt(spec),
        }
        .map(|mut p| {
            p.set_egress_channel(channels.egress);
            p.set_gateway_channel(channels.gateway);
            p
        });
        let mut rec = attempt_once(spec, &sfd, &mut sink, &scratch, prepared, deadline)?;
        first_exec = first_exec.or(rec.exec_at_us);
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
                match restart(r, &scratch, attempt + 1) {
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
        rec.kept = Some(keep(spec, &scratch));
        rec.exec_at_us = first_exec;
        finish_record(&mut rec, sink, first_start, attempt);
        return Ok(rec);
    }
}

/// Composes attempt `next`'s context with the child's handoff note, read
/// from its scratch file system.
fn restart(
    r: &crate::spec::RestartSpec,
    scratch: &Scratch,
    next: u32,
) -> Result<(), crate::restart::RestartError> {
    let handoff = scratch
        .head(
            policy::sandbox::mounts::SCRATCH_ARTIFACTS,
            "handoff.md",
            crate::restart::MAX_HANDOFF_BYTES,
        )
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    crate::restart::prepare_next(r, next, handoff.as_deref())
}

fn finish_record(rec: &mut ExitRecord, sink: LogSink, first_start: u64, attempts: u32) {
    let (log_bytes, log_truncated, log_error) = sink.finish();
    rec.log_bytes = log_bytes;
    rec.log_truncated = log_truncated;
    rec.log_error = log_error;
    rec.started_at_ms = first_start;
    rec.attempts = attempts;
}

/// The run's scratch file system, its dirs owned by the run's user.
fn scratch_for(spec: &RunnerSpec) -> Result<Scratch, sandbox::mountapi::MountError> {
    let owner = spec.run_as.unwrap_or_else(|| {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    });
    let m = &spec.sandbox.mounts;
    Scratch::create(m.scratch_bytes, &m.scratch_dirs, owner)
}

/// The largest delta.json kept (the daemon reads no more either).
pub const MAX_DELTA_BYTES: u64 = 1 << 20;

/// Copies what the run leaves in its artifact dir (and its temp dir, when
/// kept) to their places on disk, within the run's disk budget, and its
/// delta.json when it is a regular file of at most [`MAX_DELTA_BYTES`].
fn keep(spec: &RunnerSpec, scratch: &Scratch) -> crate::exit_record::Kept {
    use policy::sandbox::mounts::{Source, SCRATCH_ARTIFACTS, SCRATCH_DELTA, SCRATCH_TEMP};
    let mut kept = crate::exit_record::Kept::default();
    // The proxy's audit log of the run shares its disk budget.
    let audited = spec
        .egress_log
        .as_ref()
        .and_then(|p| std::fs::symlink_metadata(p).ok())
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len());
    let mut budget = scratch.bytes.saturating_sub(audited);
    for m in &spec.sandbox.mounts.mounts {
        let Source::Scratch { dir } = &m.source else {
            continue;
        };
        if dir == SCRATCH_DELTA {
            keep_delta(scratch, &m.target, &mut kept);
            continue;
        }
        if !(dir == SCRATCH_ARTIFACTS || (dir == SCRATCH_TEMP && spec.keep_temp)) {
            continue;
        }
        match scratch.copy_out(dir, &m.target, budget) {
            Ok(r) => {
                budget = r.budget;
                kept.files += r.files;
                kept.bytes += r.bytes;
                kept.skipped_count += r.skipped_count;
                let room = 20usize.saturating_sub(kept.skipped.len());
                kept.skipped
                    .extend(r.skipped.into_iter().take(room).map(|(path, why)| {
                        crate::exit_record::Skipped {
                            dir: dir.clone(),
                            path,
                            why: why.to_owned(),
                        }
                    }));
            }
            Err(e) => kept.error = Some(e.to_string()),
        }
    }
    kept
}

/// Copies delta.json to `dest`, or records why it was left out.
fn keep_delta(scratch: &Scratch, dest: &std::path::Path, kept: &mut crate::exit_record::Kept) {
    use crate::sandbox::scratch::NotRead;
    use policy::sandbox::mounts::SCRATCH_DELTA;
    let why = match scratch.file(SCRATCH_DELTA, "delta.json", MAX_DELTA_BYTES) {
        Ok(bytes) => {
            if let Err(e) = crate::atomic::write_atomic(&dest.join("delta.json"), &bytes) {
                kept.error = Some(e.to_string());
            }
            return;
        }
        Err(NotRead::Absent) => return,
        Err(NotRead::NotRegular) => "not a regular file".to_owned(),
        Err(NotRead::TooLarge(n)) => {
            format!("{n} bytes, over the limit of {MAX_DELTA_BYTES} bytes")
        }
    };
    kept.skipped_count += 1;
    kept.skipped.push(crate::exit_record::Skipped {
        dir: SCRATCH_DELTA.to_owned(),
        path: "delta.json".to_owned(),
        why,
    });
}

/// Whether a cancel signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) is waiting
/// on the signalfd; other signals read here are dropped (SIGCHLD: the
/// attempt's init is reaped already).
fn cancel_pending(sfd: &SignalFd) -> bool {
    let mut cancel = false;
    while let Ok(Some(info)) = sfd.read_signal() {
        if info.ssi_signo as i32 != libc::SIGCHLD {
            cancel = true;
        }
    }
    cancel
}

/// The record of an attempt whose agent never ran.
fn not_started(started_at_ms: u64, exit_code: Option<i32>, reason: String) -> ExitRecord {
    ExitRecord {
        outcome: Outcome::SpawnFailed,
        exit_code,
        signal: None,
        reason,
        child_pid: 0,
        started_at_ms,
        ended_at_ms: now_unix_ms(),
        log_bytes: 0,
        log_truncated: false,
        log_error: None,
        leftover_killed: 0,
        isolation: None,
        resources: Default::default(),
        attempts: 1,
        kept: None,
        setup_us: Default::default(),
        exec_at_us: None,
    }
}

/// The output pipe: the runner's end is non-blocking, the child's blocks.
fn output_pipe() -> Result<(std::fs::File, OwnedFd), RunnerError> {
    let (pipe_r, pipe_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(setup("pipe2"))?;
    // Best effort: a larger pipe means fewer wake-ups for chatty children.
    let _ = crate::sys::set_pipe_size(pipe_r.as_raw_fd(), 1 << 20);
    nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))
        .map_err(setup("fcntl(pipe)"))?;
    Ok((std::fs::File::from(pipe_r), pipe_w))
}

/// One attempt: starts the agent in a fresh sandbox and supervises it to
/// its end. The caller fills in the log fields.
fn attempt_once(
    spec: &RunnerSpec,
    sfd: &SignalFd,
    sink: &mut LogSink,
    scratch: &Scratch,
    prepared: Result<sandbox::Prepared, sandbox::SandboxError>,
    deadline: Instant,
) -> Result<ExitRecord, RunnerError> {
    let (pipe, pipe_w) = output_pipe()?;
    let started_at_ms = now_unix_ms();
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            let reason = format!("sandbox: {e}; the agent was not started");
            sink.note(&format!("[subagentd: {reason}]\n"));
            return Ok(not_started(started_at_ms, None, reason));
        }
    };
    let started = match launch::start(spec, pipe_w, &prepared, scratch) {
        Ok(s) => s,
        Err(e) => {
            prepared.cgroups().remove();
            sink.note(&format!("[subagentd: {e}]\n"));
            return Ok(not_started(
                started_at_ms,
                Some(e.exit_code()),
                e.to_string(),
            ));
        }
    };
    let mut st = Loop {
        init: started.init,
        agent: None,
        leftovers: 0,
        nproc_reached: false,
        init_done: false,
        cancelled: false,
        timed_out: false,
        kill_at: None,
    };
    supervise_attempt(spec, sfd, sink, pipe, &started.status, &mut st, deadline)?;
    let ended_at_ms = now_unix_ms();
    let (peak_memory_bytes, ooms) = prepared.cgroups().memory_stats();
    let pids_refused = prepared.cgroups().pids_refused();
    prepared.cgroups().remove();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).ok();
    let ms = |t: nix::sys::time::TimeVal| (t.tv_sec() as u64) * 1000 + (t.tv_usec() as u64) / 1000;
    let resources = crate::exit_record::Resources {
        cpu_user_ms: usage.map_or(0, |u| ms(u.user_time())),
        cpu_system_ms: usage.map_or(0, |u| ms(u.system_time())),
        peak_memory_bytes,
        oom_killed: ooms.unwrap_or(0) > 0,
        pids_refused,
        pids_limit_reached: st.nproc_reached,
    };
    let (outcome, exit_code, signal, reason) = judge(spec, &st, &resources);
    let mut setup_us = std::collections::BTreeMap::new();
    setup_us.insert("fork_to_exec".to_owned(), started.fork_to_exec_us);
    Ok(ExitRecord {
        outcome,
        exit_code,
        signal,
        reason,
        child_pid: started.init.as_raw(),
        started_at_ms,
        ended_at_ms,
        log_bytes: 0,
        log_truncated: false,
        log_error: None,
        leftover_killed: st.leftovers,
        isolation: Some(prepared.report.clone()),
        resources,
        attempts: 1,
        kept: None,
        setup_us,
        exec_at_us: Some(started.exec_at_us),
    })
}

/// Copies the agent's output to the log until init has ended and the pipe
/// is drained; passes a cancel on, enforces the wall time.
fn supervise_attempt(
    spec: &RunnerSpec,
    sfd: &SignalFd,
    sink: &mut LogSink,
    mut pipe: std::fs::File,
    status: &OwnedFd,
    st: &mut Loop,
    deadline: Instant,
) -> Result<(), RunnerError> {
    let grace = Duration::from_millis(spec.kill_grace_ms);
    let mut pipe_open = true;
    let mut buf = vec![0u8; 256 * 1024];
    let mut drain_until: Option<Instant> = None;
    loop {
        if st.init_done && drain_until.is_none() {
            // Every process of the run is gone; what is left in the pipe
            // is read, within a bound.
            drain_until = Some(Instant::now() + CLEANUP_BUDGET);
        }
        if let Some(d) = drain_until {
            if !pipe_open || Instant::now() >= d {
                return Ok(());
            }
        }
        let mut next = drain_until.unwrap_or(deadline);
        if !st.init_done {
            if !st.timed_out && !st.cancelled {
                next = next.min(deadline);
            }
            if let Some(k) = st.kill_at {
                next = next.min(k);
            }
        }
        let wait_ms = next
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(60_000) as i32;
        let timeout = PollTimeout::try_from(wait_ms.max(0)).unwrap_or(PollTimeout::MAX);
        let mut fds = vec![PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
        if pipe_open {
            fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return Err(RunnerError::Setup {
                    op: "poll",
                    source: e,
                })
            }
        }
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        let (pipe_ready, sig_ready) = (fds.get(1).is_some_and(ready), ready(&fds[0]));
        drop(fds);
        if sig_ready {
            while let Ok(Some(info)) = sfd.read_signal() {
                if info.ssi_signo as i32 == libc::SIGCHLD {
                    st.reap(status);
                } else if !st.init_done && !st.cancelled && !st.timed_out {
                    st.cancelled = true;
                    st.signal_init(Signal::SIGTERM);
                    st.kill_at = Some(Instant::now() + grace);
                }
            }
        }
        if pipe_ready {
            pipe_open = drain(&mut pipe, &mut buf, sink);
        }
        let now = Instant::now();
        if !st.init_done && !st.timed_out && !st.cancelled && now >= deadline {
            st.timed_out = true;
            st.signal_init(Signal::SIGKILL);
        }
        if !st.init_done && st.kill_at.is_some_and(|k| now >= k) {
            st.kill_at = None;
            st.signal_init(Signal::SIGKILL);
        }
    }
}

/// Reads what the pipe holds into the log; false at end of file.
fn drain(pipe: &mut std::fs::File, buf: &mut [u8], sink: &mut LogSink) -> bool {
    loop {
        match pipe.read(buf) {
            Ok(0) => return false,
            Ok(n) => sink.write(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// How the attempt ended, from what init reported and what the runner did.
fn judge(
    spec: &RunnerSpec,
    st: &Loop,
    resources: &crate::exit_record::Resources,
) -> (Outcome, Option<i32>, Option<i32>, String) {
    let (exit_code, signal) = match st.agent {
        Some(s) if libc::WIFEXITED(s) => (Some(libc::WEXITSTATUS(s)), None),
        Some(s) if libc::WIFSIGNALED(s) => (None, Some(libc::WTERMSIG(s))),
        // Init was killed (time limit, a cancel past its grace).
        _ => (None, Some(libc::SIGKILL)),
    };
    if st.timed_out {
        let why = format!(
            "wall time limit ({} s) exceeded; the process tree was killed",
            spec.wall_time_s
        );
        return (Outcome::TimedOut, exit_code, signal, why);
    }
    if st.cancelled {
        return (
            Outcome::Cancelled,
            exit_code,
            signal,
            "cancelled on request".to_owned(),
        );
    }
    if resources.oom_killed && exit_code != Some(0) {
        // The OOM killer ended a process of the run, and the run failed.
        let outcome = if signal.is_some() {
            Outcome::Signaled
        } else {
            Outcome::Exited
        };
        let mib = spec.sandbox.memory_bytes >> 20;
        return (
            outcome,
            exit_code,
            signal,
            format!("memory limit ({mib} MiB) exceeded"),
        );
    }
    let refused = resources.pids_refused.unwrap_or(0);
    match (exit_code, signal) {
        (Some(code), _) if code != 0 && refused > 0 => (
            Outcome::Exited,
            exit_code,
            None,
            format!(
                "exited with code {code}; the process limit ({}) refused {}",
                spec.sandbox.pids_max,
                if refused == 1 {
                    "a fork".to_owned()
                } else {
                    format!("{refused} forks")
                }
            ),
        ),
        (Some(code), _) if code != 0 && resources.pids_limit_reached => (
            Outcome::Exited,
            exit_code,
            None,
            format!(
                "exited with code {code}; the run reached its process limit ({}), past which forks fail",
                spec.sandbox.pids_max
            ),
        ),
        (Some(code), _) => (
            Outcome::Exited,
            exit_code,
            None,
            format!("exited with code {code}"),
        ),
        (None, Some(sig)) if st.agent.is_some() => (
            Outcome::Signaled,
            None,
            signal,
            format!("killed by signal {sig} ({})", signal_name(sig)),
        ),
        _ => (
            Outcome::Signaled,
            None,
            signal,
            "the run's init ended without a status".to_owned(),
        ),
    }
}

/// The conventional name of a signal number, e.g. "SIGKILL".
pub fn signal_name(sig: i32) -> &'static str {
    Signal::try_from(sig)
        .map(|s| s.as_str())
        .unwrap_or("unknown signal")
}
