//! Where a run was placed: its backend, and for a Slurm run its job, once
//! the job was submitted (recorded before the spawn is answered when the
//! run starts at once).

use policy::backend::BackendKind;
use serde::{Deserialize, Serialize};

/// A run's backend and its job there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// `local` or `slurm`.
    pub kind: BackendKind,
    /// The Slurm job's id, once submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<u64>,
}

impl Placement {
    /// A run placed on `kind`, not submitted yet.
    pub fn new(kind: BackendKind) -> Placement {
        Placement { kind, job_id: None }
    }

    /// The job id of a Slurm run that has one.
    pub fn slurm_job(&self) -> Option<u64> {
        match self.kind {
            BackendKind::Slurm => self.job_id,
            BackendKind::Local => None,
        }
    }

    /// One line: `local`, `slurm`, or `slurm job N`.
    pub fn describe(&self) -> String {
        match self.job_id {
            Some(id) => format!("{} job {id}", self.kind.as_str()),
            None => self.kind.as_str().to_owned(),
        }
    }
}
