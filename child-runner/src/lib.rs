//! `subagent-runner`: the per-child process of subagentd.
//!
//! The daemon starts one runner per run. For each attempt the runner
//! clones the run's init into new PID, mount, IPC, cgroup (and network)
//! namespaces; init builds the run's own root file system and starts the
//! agent command, which the sandbox then confines. The runner stays init's
//! parent until it exits, copies the agent's stdout and stderr into
//! child.log (up to a cap), enforces the wall-clock limit, turns a SIGTERM
//! into a cancel (SIGTERM to the whole run, SIGKILL after a grace), keeps
//! what the run leaves in its artifact dir, and writes how the run ended
//! to exit.json, atomically, before it exits. When init ends, the kernel
//! ends every process of the run. It never needs the daemon once started.
//!
//! Layout:
//! - [`spec`]: what the daemon asks for (the runner spec, handed over in a
//!   sealed memfd), the runner's input.
//! - [`exit_record`]: how the run ended (exit.json), the runner's output.
//! - [`ioerr`]: an I/O error naming its step and path ([`ioerr::IoAt`]).
//! - [`atomic`]: write-temp, fsync, rename, fsync-directory.
//! - [`sys`]: thin wrappers over the syscalls used here, each with a typed error.
//! - [`procstat`]: a process as /proc/PID/stat shows it.
//! - [`logsink`]: child.log with its size cap.
//! - [`logtimes`]: child.log.times, when the log's lines were captured.
//! - [`sandbox`]: applying the sandbox spec (Landlock, seccomp,
//!   capabilities, rlimits, cgroups, namespaces) and reporting it.
//! - [`launch`]: starting an attempt: the run's init and the agent command.
//! - [`init`]: pid 1 of the run's PID namespace: builds the root, reaps.
//! - [`gate`]: waiting for the daemon's word that the run is recorded.
//! - [`jobdir`]: a run placed as a cluster job takes its lock and spec
//!   from its run folder instead; [`jobbridge`]: its way to the daemon's
//!   egress proxy and model gateway, over TCP.
//! - [`restart`]: restarting a child that exits 75, with its handoff note.
//! - [`safefile`]: reading a file a child controls (no links, no FIFOs,
//!   a size bound).
//! - [`lockfd`]: runner.lock and the run's uid lease, held for the
//!   runner's whole life.
//! - [`supervise`]: the runner's event loop.
//! - [`testsupport`]: how the workspace's tests skip what a host lacks.

pub mod atomic;
pub mod exit_record;
pub mod gate;
pub mod init;
pub mod ioerr;
pub mod jobbridge;
pub mod jobdir;
pub mod launch;
pub mod lockfd;
pub mod logsink;
pub mod logtimes;
pub mod procstat;
pub mod restart;
pub mod safefile;
pub mod sandbox;
pub mod spec;
pub mod supervise;
pub mod sys;
pub mod testsupport;

/// Milliseconds since the Unix epoch, as recorded in exit.json.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Microseconds since the Unix epoch.
pub fn now_unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
