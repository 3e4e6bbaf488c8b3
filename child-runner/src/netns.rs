//! The network namespace the daemon hands a runner for a run without the
//! network: one from its pool (see the daemon's `engine::netns`), empty,
//! with no interface up, and used by no other run while this one lives.
//!
//! The runner joins it (`setns`) before anything else, so the child
//! inherits it and the sandbox does not make one ([`joined`]). A run
//! granted the network leaves it alone. Without a namespace from the daemon
//! (its pool was empty, or it cannot make them) the child makes its own
//! with `unshare`, as before.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Set once this runner sits in the namespace handed over for its run.
static JOINED: AtomicBool = AtomicBool::new(false);

/// How long the `setns` took, in µs.
static JOIN_US: AtomicU64 = AtomicU64::new(0);

/// Joining the handed-over namespace failed.
#[derive(Debug, thiserror::Error)]
#[error("setns(CLONE_NEWNET) into the network namespace from the daemon: {0}")]
pub struct JoinError(#[source] pub nix::errno::Errno);

/// Whether this runner sits in a namespace handed over for its run (so the
/// child need not make one).
pub fn joined() -> bool {
    JOINED.load(Ordering::SeqCst)
}

/// How long joining took, in µs (0 if it did not happen).
pub fn join_us() -> u64 {
    JOIN_US.load(Ordering::SeqCst)
}

/// Joins `ns` for a run without the network (`network` false); for a run
/// granted it, drops `ns` and does nothing.
pub fn join(ns: OwnedFd, network: bool) -> Result<(), JoinError> {
    if network {
        return Ok(());
    }
    let started = std::time::Instant::now();
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(JoinError)?;
    JOIN_US.store(started.elapsed().as_micros() as u64, Ordering::SeqCst);
    JOINED.store(true, Ordering::SeqCst);
    Ok(())
}
