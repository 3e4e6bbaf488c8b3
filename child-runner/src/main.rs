//! `subagent-runner --lock-fd 3 --spec-fd 4 [--uid-lock-fd 5] [--gate-fd 6] [--egress-fd 7] [--gateway-fd 9]`:
//! runs one subagent; see the library docs. Every input is a descriptor
//! the daemon hands over, so the runner opens no path of the state dir
//! before it knows its run is recorded:
//!
//! - `--lock-fd`: runner.lock, opened and flock'ed by the daemon. The
//!   runner writes its pid into it and holds it until it dies, so a
//!   restarted daemon can tell a live runner from a dead one.
//! - `--spec-fd`: the runner spec, a sealed memfd, read once.
//! - `--uid-lock-fd`: the lease on the run's own uid, held the same way.
//! - `--gate-fd`: the read end of a pipe. The runner prepares the first
//!   attempt's sandbox, then waits for one byte on it, which the daemon
//!   writes once the run is on disk; only then does the agent start. End
//!   of file instead: the run was never recorded, so the runner undoes what
//!   it made, clears its pid from runner.lock and exits 3.
//! - `--egress-fd`: a run in allowlist mode: a Unix socket to the daemon's
//!   proxy, over which each attempt's init sends the listener of the
//!   run's proxy port (see `sandbox::egress`).
//!
//! - `--gateway-fd`: a driver run: a Unix socket to the daemon's model
//!   gateway, over which each attempt's init sends the listener of the
//!   gateway's address in the run's own network namespace (the agent holds
//!   no API key; the daemon adds it upstream).
//!
//! `subagent-runner --job-dir DIR`: the same for a run placed as a cluster
//! job (Slurm), which no daemon starts: runner.lock and the spec
//! (runner.spec) are taken from the run folder DIR (see `jobdir`), the
//! run's cgroups are planned on this node, and there is no gate (the job
//! exists only once the run is recorded) and no uid lease (the daemon
//! holds it); a run that needs the daemon's egress proxy or model gateway
//! reaches them through a bridge process over TCP (see `jobbridge`).
//!
//! Exit status: 0 when exit.json was written, 2 when the runner could not
//! do its job (the reason is on stderr, which the daemon keeps as
//! runner.log), 3 when the run was called off at the gate.

use std::os::fd::RawFd;
use std::process::ExitCode;
use subagent_runner::spec::RunnerSpec;
use subagent_runner::{gate, lockfd, supervise};

const USAGE: &str = "usage: subagent-runner --lock-fd N --spec-fd N [--uid-lock-fd N] [--gate-fd N] [--egress-fd N] [--gateway-fd N]
       subagent-runner --job-dir DIR";

/// Writes a line to stderr (runner.log), ignoring failure: a full disk must
/// not turn into a panic.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "subagent-runner: {msg}");
}

/// The room held for exit.json.
const EXIT_RESERVE_BYTES: usize = 64 * 1024;

/// The descriptors named on the command line.
struct Fds {
    lock: RawFd,
    spec: RawFd,
    uid_lock: Option<RawFd>,
    gate: Option<RawFd>,
    egress: Option<RawFd>,
    gateway: Option<RawFd>,
}

/// Parses `--name N` pairs; each name once, numbers above 2.
fn parse(args: &[String]) -> Option<Fds> {
    let (mut lock, mut spec, mut uid_lock, mut gate, mut egress) = (None, None, None, None, None);
    let mut gateway = None;
    for pair in args.chunks(2) {
        let [name, n] = pair else { return None };
        let fd: RawFd = n.parse().ok().filter(|&fd| fd > 2)?;
        let slot = match name.as_str() {
            "--lock-fd" => &mut lock,
            "--spec-fd" => &mut spec,
            "--uid-lock-fd" => &mut uid_lock,
            "--gate-fd" => &mut gate,
            "--egress-fd" => &mut egress,
            "--gateway-fd" => &mut gateway,
            _ => return None,
        };
        if slot.replace(fd).is_some() {
            return None;
        }
    }
    Some(Fds {
        lock: lock?,
        spec: spec?,
        uid_lock,
        gate,
        egress,
        gateway,
    })
}

/// A run placed as a cluster job: its inputs from its run folder `dir`.
fn job(dir: &std::path::Path) -> ExitCode {
    let inputs = match subagent_runner::jobdir::open(dir) {
        Ok(i) => i,
        Err(e) => {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    };
    if let Err(e) = lockfd::adopt(inputs.lock) {
        say(&format!("{e}"));
        return ExitCode::from(2);
    }
    let mut spec = inputs.spec;
    // The daemon's host may mount its cgroups elsewhere than this node.
    spec.cgroup_plan = subagent_runner::sandbox::cgroup::host_plan();
    // First, before any thread: the bridge to the daemon's services forks.
    let bridged = match subagent_runner::jobbridge::start(&spec) {
        Ok(b) => b,
        Err(e) => {
            say(&format!("run {}: {e}", spec.run_id));
            return ExitCode::from(2);
        }
    };
    let channels = supervise::Channels {
        egress: bridged.egress,
        gateway: bridged.gateway,
    };
    let ready = supervise::Ready::prepare(&spec, channels);
    run(&spec, ready)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, dir] = args.as_slice() {
        if flag == "--job-dir" {
            return job(std::path::Path::new(dir));
        }
    }
    let Some(fds) = parse(&args) else {
        say(USAGE);
        return ExitCode::from(2);
    };
    let lock = match lockfd::adopt(fds.lock) {
        Ok(lock) => lock,
        Err(e) => {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    };
    if let Some(fd) = fds.uid_lock {
        if let Err(e) = lockfd::hold(fd) {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    }
    let spec = match RunnerSpec::read_fd(fds.spec) {
        Ok(spec) => spec,
        Err(e) => {
            say(&format!("{e}"));
            return ExitCode::from(2);
        }
    };
    // The agent never gets a channel: each is closed at its exec.
    let cloexec = |fd: &RawFd| {
        // SAFETY: fcntl(F_SETFD) takes an int and touches no memory; a bad
        // descriptor only makes it fail, and the channel is then unused.
        unsafe { libc::fcntl(*fd, libc::F_SETFD, libc::FD_CLOEXEC) == 0 }
    };
    let channels = supervise::Channels {
        egress: fds.egress.filter(cloexec),
        gateway: fds.gateway.filter(cloexec),
    };
    let ready = supervise::Ready::prepare(&spec, channels);
    if let Some(fd) = fds.gate {
        if !gate::wait(fd) {
            ready.abandon();
            lock.clear();
            return ExitCode::from(gate::CALLED_OFF);
        }
    }
    run(&spec, ready)
}

/// Runs the run of `spec`, its first attempt made `ready`.
fn run(spec: &RunnerSpec, ready: supervise::Ready) -> ExitCode {
    // Room for exit.json, kept from the start: if the child fills the disk,
    // the record is still written, into the reserved file.
    let reserve = subagent_runner::atomic::Reserved::create(&spec.exit_path, EXIT_RESERVE_BYTES);
    if let Err(e) = &reserve {
        say(&format!(
            "run {}: reserving room for exit.json: {e}",
            spec.run_id
        ));
    }
    let record = match supervise::run(spec, ready) {
        Ok(record) => record,
        Err(e) => {
            say(&format!("run {}: {e}", spec.run_id));
            return ExitCode::from(2);
        }
    };
    let saved = match reserve {
        Ok(r) => record.save_into(r),
        Err(_) => record.save(&spec.exit_path),
    };
    if let Err(e) = saved {
        say(&format!("run {}: {e}", spec.run_id));
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn descriptors_are_named_once_each() {
        let f = parse(&args("--lock-fd 3 --spec-fd 4 --gate-fd 6")).unwrap();
        assert_eq!((f.lock, f.spec, f.uid_lock, f.gate), (3, 4, None, Some(6)));
        let f = parse(&args("--lock-fd 3 --spec-fd 4 --egress-fd 7")).unwrap();
        assert_eq!(f.egress, Some(7));
        let f = parse(&args("--lock-fd 3 --spec-fd 4 --gateway-fd 9")).unwrap();
        assert_eq!(f.gateway, Some(9));
        assert!(parse(&args("--lock-fd 3 --spec-fd 4 --key-env-fd 8")).is_none());
        for bad in [
            "",
            "--lock-fd 3",
            "--lock-fd 3 --spec-fd",
            "--lock-fd 3 --spec-fd 1",
            "--lock-fd 3 --spec-fd 4 --lock-fd 5",
            "--lock-fd 3 --spec-fd 4 --other 5",
            "--lock-fd x --spec-fd 4",
        ] {
            assert!(parse(&args(bad)).is_none(), "{bad}");
        }
    }
}
