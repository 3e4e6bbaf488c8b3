//! `subagentd --check`: what runs on this host get, found by doing one.
//!
//! The check starts the engine on a state dir of its own, runs `/bin/true`
//! through it with the default sandbox (no network, the project read-only)
//! and reads the run's isolation report: the same code, the same runner,
//! the same kernel calls as every run, so what it prints is what runs get.
//! A run that cannot start says why.

use crate::engine::error::{InternalError, StorageError};
use crate::engine::{Config, EngineError, Supervisor};
use crate::run::record::RunState;
use crate::status::RunStatus;
use policy::sandbox::Mechanism;
use std::path::PathBuf;

/// What the probe run showed.
#[derive(Debug)]
pub struct CheckOutcome {
    /// The probe run's status (its `isolation` says what was enforced).
    pub status: RunStatus,
}

/// Whether `m` held for the probe run; the reason when it did not.
pub fn missing(status: &RunStatus, m: Mechanism) -> Option<String> {
    let Some(iso) = &status.isolation else {
        let why = status.reason.clone().unwrap_or_default();
        return Some(format!("a run could not start: {why}"));
    };
    let e = match m {
        Mechanism::Landlock => &iso.landlock,
        Mechanism::Seccomp => &iso.seccomp,
        Mechanism::CapabilityDrop => &iso.capabilities,
        Mechanism::NetworkIsolation => &iso.network,
        Mechanism::Cgroup => &iso.cgroup,
        Mechanism::Namespaces => &iso.namespaces,
    };
    (!e.enforced).then(|| e.detail.clone())
}

/// How long the probe run may take.
const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs the probe: `/bin/true` through an engine on a temporary state dir,
/// with `runner` and the config's `settings` (its `require` list aside: the
/// check reports what is missing instead of refusing).
pub async fn probe_run(
    runner: Option<PathBuf>,
    settings: policy::config::Config,
) -> Result<CheckOutcome, EngineError> {
    let storage = |e| EngineError::StateDir(StorageError::Check(e));
    let dir = tempfile::Builder::new()
        .prefix("subagentd-check-")
        .tempdir()
        .map_err(storage)?;
    let project = dir.path().join("project");
    std::fs::create_dir(&project).map_err(storage)?;
    let mut cfg = Config::new(dir.path().join("state"));
    if let Some(r) = runner {
        cfg.runner = r;
    }
    cfg.settings = policy::config::Config {
        require: Some(Vec::new()),
        ..settings
    };
    let sup = Supervisor::start(cfg).await?;
    let params = serde_json::from_value(serde_json::json!({
        "session": {"id": "check", "audience": "personal", "project_dir": project},
        "task": "check what a run gets",
        "command": ["/bin/true"],
    }))
    .map_err(|e| EngineError::Unexpected(InternalError::CheckParams(e)))?;
    let id = sup.spawn(params).await?;
    let status = sup.wait(&id, Some(WAIT)).await?;
    if matches!(status.state, RunState::Accepted | RunState::Running) {
        return Err(EngineError::Unexpected(InternalError::CheckTimedOut {
            secs: WAIT.as_secs(),
        }));
    }
    Ok(CheckOutcome { status })
}
