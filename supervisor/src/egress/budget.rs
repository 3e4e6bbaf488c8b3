//! The daemon's descriptors shared out to the proxy: the soft
//! RLIMIT_NOFILE raised to the hard one at start, and one budget of
//! proxied connections across every run, a fraction of that limit, so
//! that the control socket, run folders and runners always find one;
//! and a small budget for answering connections over those caps.

use std::sync::{Arc, OnceLock};
use tokio::sync::Semaphore;

/// The most connections the proxy serves at once, across runs, however
/// high the descriptor limit (each holds two descriptors and its buffers).
pub const MAX_GLOBAL_CONNECTIONS: usize = 2048;
/// The share of the descriptor limit the proxy may use: a quarter of it in
/// connections is half of it in descriptors.
const LIMIT_SHARE: u64 = 4;

/// Raises the soft descriptor limit of this process to its hard limit;
/// returns the soft limit it ends with.
pub fn raise_nofile() -> nix::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        // An unlimited hard limit is above what the kernel takes (nr_open):
        // the soft limit then stays.
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?.0)
}

/// The connections the proxy may hold at once under a descriptor limit of
/// `nofile`.
pub fn connections_for(nofile: u64) -> usize {
    let share = (nofile / LIMIT_SHARE).saturating_sub(LINGERING_REFUSALS as u64);
    let share = usize::try_from(share).unwrap_or(usize::MAX);
    share.clamp(1, MAX_GLOBAL_CONNECTIONS)
}

/// The budget every run's proxy draws from, sized at its first use from
/// the soft limit then in force.
pub fn global() -> Arc<Semaphore> {
    static BUDGET: OnceLock<Arc<Semaphore>> = OnceLock::new();
    BUDGET
        .get_or_init(|| {
            let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map_or(1024, |(soft, _)| soft);
            let n = connections_for(nofile);
            tracing::info!(connections = n, nofile, "egress proxy connection budget");
            Arc::new(Semaphore::new(n))
        })
        .clone()
}

/// Refusals over a cap whose `503` may linger a moment, across runs.
const LINGERING_REFUSALS: usize = 64;

/// The budget of lingering refusals, across runs.
pub fn refusals() -> Arc<Semaphore> {
    static BUDGET: OnceLock<Arc<Semaphore>> = OnceLock::new();
    BUDGET
        .get_or_init(|| Arc::new(Semaphore::new(LINGERING_REFUSALS)))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_a_quarter_of_the_limit_within_bounds() {
        assert_eq!(connections_for(1024), 256 - 64);
        assert_eq!(connections_for(20_000), MAX_GLOBAL_CONNECTIONS);
        assert_eq!(connections_for(u64::MAX), MAX_GLOBAL_CONNECTIONS);
        assert_eq!(connections_for(0), 1);
    }
}
