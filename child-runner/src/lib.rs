//! `subagent-runner`: the per-child process of subagentd.
//!
//! The daemon starts one runner per run. The runner starts the agent
//! command as its own child in a new session, stays its parent until it
//! exits, copies its stdout and stderr into child.log (up to a cap),
//! enforces the wall-clock limit, turns a SIGTERM into a cancel (SIGTERM to
//! the whole tree, SIGKILL after a grace), kills every process the child
//! left behind, and writes how the run ended to exit.json, atomically,
//! before it exits. It never needs the daemon once started.
//!
//! Layout:
//! - [`spec`]: what the daemon asks for (runner.json), the runner's input.
//! - [`exit_record`]: how the run ended (exit.json), the runner's output.
//! - [`atomic`]: write-temp, fsync, rename, fsync-directory.
//! - [`sys`]: thin wrappers over the syscalls used here, each with a typed error.
//! - [`tree`]: finding and killing every descendant of the runner.
//! - [`logsink`]: child.log with its size cap.
//! - [`sandbox`]: applying the sandbox spec (Landlock, seccomp,
//!   capabilities, rlimits, cgroups, namespaces) and reporting it.
//! - [`launch`]: starting the agent command inside it.
//! - [`warm`]: a runner started before its run, waiting for it on a socket.
//! - [`restart`]: restarting a child that exits 75, with its handoff note.
//! - [`lockfd`]: runner.lock, held for the runner's whole life.
//! - [`supervise`]: the runner's event loop.
//! - [`testsupport`]: how the workspace's tests skip what a host lacks.

pub mod atomic;
pub mod exit_record;
pub mod launch;
pub mod lockfd;
pub mod logsink;
pub mod restart;
pub mod sandbox;
pub mod spec;
pub mod supervise;
pub mod sys;
pub mod testsupport;
pub mod tree;
pub mod warm;

/// Milliseconds since the Unix epoch, as recorded in exit.json.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
