//! The counts of a run's egress, as run.json records them.
//! Uses serde only.

use serde::{Deserialize, Serialize};

/// The counts of a run's egress, for its status and result.md.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressSummary {
    /// Attempts allowed and relayed.
    pub allowed: u64,
    /// Attempts refused.
    pub refused: u64,
    /// Attempts allowed that could not reach their destination.
    pub failed: u64,
    /// The refused `host:port`s, each once, at most [`MAX_HOSTS`].
    pub refused_hosts: Vec<String>,
    /// Bytes from the run, over every attempt.
    pub bytes_up: u64,
    /// Bytes to the run.
    pub bytes_down: u64,
}

/// The most refused hosts a summary names.
pub const MAX_HOSTS: usize = 20;
