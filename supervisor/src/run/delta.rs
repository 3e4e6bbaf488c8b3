//! What became of a run's delta (and of any list of files a run claims),
//! as run.json records it.
//! Uses policy and serde only.

use policy::workctx::Verdict;
use serde::{Deserialize, Serialize};

/// What became of a run's delta.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaReport {
    /// Paths merged into the session's recent files, in merge order.
    pub accepted: Vec<Verdict>,
    /// Paths not merged, each with the reason.
    pub rejected: Vec<Verdict>,
    /// Why nothing was merged, when nothing was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}
