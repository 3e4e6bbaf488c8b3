//! How the engine is set up: the daemon's [`Config`], resolved once at
//! start, and what follows from it alone. May use paths, uids, runas,
//! gitsnap, observe, policy and the engine's errors; nothing of the engine's state.

use super::error::{EngineError, StorageError};
use std::path::{Path, PathBuf};
use subagent_runner::ioerr::at;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// The state dir.
    pub state_dir: PathBuf,
    /// The base of children's temp dirs (`/tmp/subagentd-<uid>`).
    pub temp_base: PathBuf,
    /// The `subagent-runner` binary.
    pub runner: PathBuf,
    /// At most this many runs at once.
    pub max_concurrent: usize,
    /// Milliseconds between SIGTERM and SIGKILL on cancel.
    pub kill_grace_ms: u64,
    /// Run every child as this one user (root daemons only); without it a
    /// root daemon gives each run a uid of its own from the config's
    /// `uid_range`.
    pub run_as: Option<crate::runas::RunAs>,
    /// Where per-run uids are leased (shared by every supervisor on the
    /// host).
    pub uid_lock_dir: PathBuf,
    /// The control socket's directory, hidden from children like the
    /// state dir (none for an engine without a socket, `subagent run`).
    pub socket_dir: Option<PathBuf>,
    /// The config file's settings (require, tools, audiences, limits, ...).
    pub settings: policy::config::Config,
    /// The git snapshot's time budget (2 s; zero simulates a slow repo).
    pub git_budget: std::time::Duration,
}

impl Config {
    /// The mechanisms a run with or without network must have.
    pub fn required(&self, network: bool) -> Vec<policy::sandbox::Mechanism> {
        self.settings.required(network)
    }

    /// Where runs are placed (`[backend]`).
    pub fn backend(&self) -> &policy::backend::Backend {
        &self.settings.backend
    }

    /// The state dir's layout: run folders in it, or in the Slurm
    /// backend's shared dir.
    pub fn layout(&self) -> crate::paths::StateLayout {
        let mut l = crate::paths::StateLayout::new(self.state_dir.clone());
        if let Some(shared) = self.slurm_shared_dir() {
            l.runs_root = shared.to_path_buf();
        }
        l
    }

    /// The shared dir, when runs are Slurm jobs.
    fn slurm_shared_dir(&self) -> Option<&Path> {
        let b = self.backend();
        (b.kind == policy::backend::BackendKind::Slurm)
            .then_some(b.shared_dir.as_deref())
            .flatten()
    }
}

impl Config {
    /// Defaults for everything but the state dir.
    pub fn new(state_dir: PathBuf) -> Config {
        Config {
            state_dir,
            temp_base: crate::paths::tmp_base(),
            runner: crate::paths::default_runner(),
            max_concurrent: default_max_concurrent(),
            kill_grace_ms: subagent_runner::spec::DEFAULT_KILL_GRACE_MS,
            run_as: None,
            uid_lock_dir: PathBuf::from(crate::uids::LOCK_DIR),
            socket_dir: None,
            settings: Default::default(),
            git_budget: crate::gitsnap::BUDGET,
        }
    }
}

/// `cfg` with the state dir and the temp base's parent resolved: runs'
/// files are bound from there, and a run's bind never follows a link.
pub(super) fn resolved(mut cfg: Config) -> Result<Config, EngineError> {
    cfg.state_dir = cfg
        .state_dir
        .canonicalize()
        .map_err(at("resolve", &cfg.state_dir))
        .map_err(StorageError::from)?;
    if let (Some(parent), Some(name)) = (cfg.temp_base.parent(), cfg.temp_base.file_name()) {
        if let Ok(p) = parent.canonicalize() {
            cfg.temp_base = p.join(name);
        }
    }
    if let Some(shared) = cfg.slurm_shared_dir().map(Path::to_path_buf) {
        // Runs' folders, temp dirs and worktrees must be where the nodes
        // see them, at the same paths.
        let shared = shared
            .canonicalize()
            .map_err(at("resolve", &shared))
            .map_err(StorageError::from)?;
        cfg.temp_base = shared.join("tmp");
        cfg.settings.backend.shared_dir = Some(shared);
    }
    Ok(cfg)
}

/// 2 × the number of CPUs.
pub fn default_max_concurrent() -> usize {
    2 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What a run's observation leaves out beneath `root`: the daemon's own
/// state dir and temp base.
pub(crate) fn daemon_skip(cfg: &Config, root: &Path) -> crate::observe::Skip {
    crate::observe::Skip::within(root, &[&cfg.state_dir, &cfg.temp_base])
}
