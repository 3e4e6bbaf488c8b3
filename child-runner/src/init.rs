//! The run's init: pid 1 of the run's PID namespace, the runner's only
//! child. It joins the run's cgroups, builds the run's root, starts the
//! agent (pid 2), then only reaps: orphans of the run are re-parented to
//! it. When the agent ends it tells the runner how (on the status pipe)
//! and exits, and the kernel ends every other process of the run. A
//! cancel from the runner (SIGTERM, SIGINT, SIGHUP or SIGQUIT, from
//! outside the namespace) is passed on as SIGTERM to every process of the
//! run; signals sent from inside the run are ignored.

use crate::sandbox::scratch::Scratch;
use crate::sandbox::Prepared;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::os::fd::{OwnedFd, RawFd};

/// The signals the runner handles through its signalfd; init blocks and
/// reads the same ones (here, below the runner's loop, so both can use it).
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

/// What init writes on the status pipe when the agent has ended: its raw
/// wait status, how many other processes of the run were still alive, and
/// whether the run was seen at its RLIMIT_NPROC process limit.
pub const STATUS_LEN: usize = 12;

/// How often init counts the run's tasks when RLIMIT_NPROC is the limit,
/// and how often once the run holds half of it (a bomb at the limit moves
/// fast: its refused children die).
const NPROC_SAMPLE: std::time::Duration = std::time::Duration::from_millis(100);
const NPROC_SAMPLE_NEAR: std::time::Duration = std::time::Duration::from_millis(5);

/// What init reports when the agent has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The agent's raw wait status.
    pub wait_status: i32,
    /// Other processes of the run still alive.
    pub leftovers: u32,
    /// The run's tasks were seen at the process limit (RLIMIT_NPROC).
    pub nproc_reached: bool,
}

/// Encodes a status record.
pub fn encode(s: Status) -> [u8; STATUS_LEN] {
    let mut b = [0u8; STATUS_LEN];
    b[..4].copy_from_slice(&s.wait_status.to_le_bytes());
    b[4..8].copy_from_slice(&s.leftovers.to_le_bytes());
    b[8..].copy_from_slice(&u32::from(s.nproc_reached).to_le_bytes());
    b
}

/// Decodes a status record.
pub fn decode(b: &[u8]) -> Option<Status> {
    let word = |r: std::ops::Range<usize>| -> Option<[u8; 4]> { b.get(r)?.try_into().ok() };
    Some(Status {
        wait_status: i32::from_le_bytes(word(0..4)?),
        leftovers: u32::from_le_bytes(word(4..8)?),
        nproc_reached: u32::from_le_bytes(word(8..STATUS_LEN)?) != 0,
    })
}

/// Everything init needs, made by the runner before the clone.
pub struct InitArgs<'a> {
    /// The sandbox of the attempt.
    pub sandbox: &'a Prepared,
    /// The run's scratch file system.
    pub scratch: &'a Scratch,
    /// Where a failure before exec is told (`code reason`).
    pub why: RawFd,
    /// Where the agent's status goes.
    pub status: OwnedFd,
    /// Starts the agent; runs in the forked agent and never returns.
    pub agent: &'a dyn Fn() -> std::convert::Infallible,
}

/// Writes `code reason` on the failure pipe and exits with `code`.
pub fn fail(why: RawFd, code: i32, reason: &str) -> ! {
    let text = format!("{code} {reason}");
    // SAFETY: writes our own buffer to a pipe we hold open; _exit ends the
    // process without unwinding or running destructors twice.
    unsafe {
        let _ = libc::write(why, text.as_ptr().cast(), text.len());
        libc::_exit(code)
    }
}

/// Runs init; never returns.
pub fn run(a: InitArgs<'_>) -> ! {
    let why = a.why;
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        fail(why, 126, &format!("sandbox: prctl(PR_SET_PDEATHSIG): {e}"));
    }
    // The runner died before the death signal was armed: its end of the
    // failure pipe is closed.
    if runner_gone(why) {
        // SAFETY: _exit ends the process at once.
        unsafe { libc::_exit(1) }
    }
    if let Err(e) = a.sandbox.setup_in_init(a.scratch) {
        fail(why, 126, &format!("sandbox: {e}"));
    }
    // SAFETY: init is single-threaded (a copy of the single-threaded
    // runner), so the agent may run Rust code until it execs.
    let agent = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => match (a.agent)() {},
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
        Err(e) => fail(why, 126, &format!("sandbox: fork the agent: {e}")),
    };
    // Init keeps nothing but its status pipe: the runner sees end of file
    // on the failure pipe once the agent has exec'd, and on the output pipe
    // once the agent's processes have closed it.
    let status = a.status;
    let _ = crate::sys::close_all_except(std::os::fd::AsRawFd::as_raw_fd(&status));
    let _ = a.sandbox.drop_init_privileges();
    let mut watch = a.sandbox.nproc_limit().map(NprocWatch::new);
    let code = reap_until(agent, watch.as_mut());
    let report = Status {
        wait_status: code,
        leftovers: count_others(),
        nproc_reached: watch.is_some_and(|w| w.reached),
    };
    let _ = nix::unistd::write(&status, &encode(report));
    // SAFETY: _exit ends init; the kernel then ends the rest of the run.
    unsafe { libc::_exit(0) }
}

fn runner_gone(why: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd: why,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: poll reads and writes one pollfd we own.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLERR != 0
}

/// Watches the run's task count against RLIMIT_NPROC, which counts no
/// refused forks: a run seen at its limit is reported as having reached it.
pub struct NprocWatch {
    limit: u64,
    reached: bool,
    last: Option<std::time::Instant>,
    every: std::time::Duration,
}

impl NprocWatch {
    fn new(limit: u64) -> NprocWatch {
        NprocWatch {
            limit,
            reached: false,
            last: None,
            every: NPROC_SAMPLE,
        }
    }

    /// Counts the run's tasks, at most once per interval.
    fn sample(&mut self) {
        let now = std::time::Instant::now();
        if self.reached || self.last.is_some_and(|t| now - t < self.every) {
            return;
        }
        self.last = Some(now);
        // The runner, outside the PID namespace, counts in the user
        // namespace too.
        let tasks = 1 + count_tasks();
        self.reached = tasks >= self.limit;
        self.every = if tasks * 2 >= self.limit {
            NPROC_SAMPLE_NEAR
        } else {
            NPROC_SAMPLE
        };
    }

    /// Counts once more when the agent has ended and is not reaped yet:
    /// it and the processes it left still count, as they do for the limit.
    fn sample_at_end(&mut self, agent: Pid) {
        use nix::sys::wait::{waitid, Id};
        let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        if !self.reached
            && !matches!(
                waitid(Id::Pid(agent), peek),
                Ok(WaitStatus::StillAlive) | Err(_)
            )
        {
            self.last = None;
            self.sample();
        }
    }

    /// How long a wait for a signal may block before the next sample.
    fn timeout(&self) -> nix::poll::PollTimeout {
        if self.reached {
            nix::poll::PollTimeout::NONE
        } else {
            nix::poll::PollTimeout::from(self.every.as_millis() as u16)
        }
    }
}

/// Reaps every child until `agent` has ended; returns its raw wait status.
/// A cancel from outside is passed on to the whole run. With `watch`, the
/// run's tasks are counted while it waits.
fn reap_until(agent: Pid, mut watch: Option<&mut NprocWatch>) -> i32 {
    let Ok(sfd) = SignalFd::with_flags(&handled_signals(), SfdFlags::SFD_CLOEXEC) else {
        // Without the signalfd: reap blocking, still ending with the agent.
        return reap_blocking(agent);
    };
    loop {
        if let Some(w) = watch.as_deref_mut() {
            w.sample();
            let mut fds = [nix::poll::PollFd::new(
                std::os::fd::AsFd::as_fd(&sfd),
                nix::poll::PollFlags::POLLIN,
            )];
            if matches!(nix::poll::poll(&mut fds, w.timeout()), Ok(0)) {
                continue;
            }
        }
        match sfd.read_signal() {
            Ok(Some(info)) if info.ssi_signo as i32 == libc::SIGCHLD => {
                if let Some(w) = watch.as_deref_mut() {
                    w.sample_at_end(agent);
                }
                if let Some(code) = reap_ready(agent) {
                    return code;
                }
            }
            // From outside the namespace (the runner): sender pid 0.
            Ok(Some(info)) if info.ssi_pid == 0 => {
                // SAFETY: kill(-1) signals every process of the namespace
                // but init itself.
                unsafe { libc::kill(-1, libc::SIGTERM) };
            }
            _ => {
                if let Some(code) = reap_ready(agent) {
                    return code;
                }
            }
        }
    }
}

fn raw_status(st: WaitStatus) -> Option<i32> {
    match st {
        WaitStatus::Exited(_, code) => Some((code & 0xff) << 8),
        WaitStatus::Signaled(_, sig, core) => Some(sig as i32 | if core { 0x80 } else { 0 }),
        _ => None,
    }
}

fn reap_ready(agent: Pid) -> Option<i32> {
    let mut found = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return found,
            Ok(st) if st.pid() == Some(agent) => found = found.or(raw_status(st)),
            Ok(_) => {}
        }
    }
}

fn reap_blocking(agent: Pid) -> i32 {
    loop {
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(st) if st.pid() == Some(agent) => {
                if let Some(code) = raw_status(st) {
                    return code;
                }
            }
            Ok(_) => {}
            Err(_) => return 0x7f00,
        }
    }
}

/// How many tasks (threads included, as RLIMIT_NPROC counts them) the
/// run's PID namespace holds, init included.
fn count_tasks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .map(|e| std::fs::read_dir(e.path().join("task")).map_or(1, |t| t.count() as u64))
        .sum()
}

/// How many processes of the run other than init are alive.
fn count_others() -> u32 {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&pid| pid != 1)
                .count() as u32
        })
        .unwrap_or(0)
}

/// Blocks the signals init handles, so that none is lost between the
/// clone and its signalfd (the runner's mask is inherited already; this
/// keeps init correct on its own).
pub fn block_signals() {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled_signals()), None);
}

/// Unblocks every signal (for the agent).
pub fn unblock_all() {
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_records_round_trip() {
        for (wait_status, leftovers, nproc_reached) in [
            (0, 0, false),
            (0x0100, 3, true),
            (9, 0, false),
            (0x7f00, u32::MAX, true),
        ] {
            let st = Status {
                wait_status,
                leftovers,
                nproc_reached,
            };
            assert_eq!(decode(&encode(st)), Some(st));
        }
        assert_eq!(decode(&[1, 2, 3]), None);
    }

    #[test]
    fn raw_statuses_read_back_as_the_wait_macros_do() {
        let exited = raw_status(WaitStatus::Exited(Pid::from_raw(2), 3)).unwrap();
        assert!(libc::WIFEXITED(exited) && libc::WEXITSTATUS(exited) == 3);
        let killed = raw_status(WaitStatus::Signaled(
            Pid::from_raw(2),
            Signal::SIGKILL,
            false,
        ))
        .unwrap();
        assert!(libc::WIFSIGNALED(killed) && libc::WTERMSIG(killed) == 9);
    }
}
