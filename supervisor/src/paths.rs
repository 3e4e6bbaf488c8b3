//! Where things live: default socket and state dir, and the state dir's
//! layout.
//!
//! ```text
//! <state_dir>/
//!   daemon.lock                       held by the daemon using this state dir
//!   state.db (-wal, -shm)             the records: runs, sessions, notices
//!   drafts/<run_id>.tmp-<hex>/        a run folder being made
//!   sessions/<session_id>/
//!     runs/<run_id>/
//!       runner.lock   held by the runner while it lives (removed at the end)
//!       runner.log    the runner's own stderr (removed at the end if empty)
//!       exit.json     written by the runner when the run ended
//!       child.log     the child's stdout and stderr (= log_path)
//!       artifacts/    the child's results (= artifact_dir)
//!       context/      what the child is given (first_message.md, ...)
//!       delta/        where the child writes delta.json (removed if empty)
//!       result.md     written when the run ends (= result_path)
//! ```

use crate::ids::RunId;
use std::path::{Path, PathBuf};

/// The effective uid of this process (it lives in `securedir`, whose owner
/// checks need it, so that module needs nothing of this one).
pub use crate::securedir::uid;

/// `/tmp/subagentd-<uid>`: the base of children's temp dirs, and of the
/// socket when XDG_RUNTIME_DIR is unset.
pub fn tmp_base() -> PathBuf {
    PathBuf::from(format!("/tmp/subagentd-{}", uid()))
}

/// The default socket: `$XDG_RUNTIME_DIR/subagentd/subagentd.sock`, else
/// `/tmp/subagentd-<uid>/subagentd.sock`.
pub fn default_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => Path::new(&dir).join("subagentd").join("subagentd.sock"),
        None => tmp_base().join("subagentd.sock"),
    }
}

/// The default state dir: `$XDG_STATE_HOME/subagentd`, else
/// `~/.local/state/subagentd`.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Path::new(&dir).join("subagentd");
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.dir)
        })
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".local").join("state").join("subagentd")
}

/// The default config file: `$XDG_CONFIG_HOME/subagentd/config.toml`, else
/// `~/.config/subagentd/config.toml`.
pub fn default_config() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        return Path::new(&dir).join("subagentd").join("config.toml");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".config").join("subagentd").join("config.toml")
}

/// The config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// Reading it failed.
    #[error("config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// It is not a valid config.
    #[error("config {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        /// Where and why.
        source: policy::config::ConfigError,
    },
}

/// A read or write path of the config that a run cannot be given.
#[derive(Debug, thiserror::Error)]
pub enum ConfigRootError {
    /// It does not exist.
    #[error("config {}: {} does not exist", .config.display(), .path.display())]
    Missing {
        /// The config file.
        config: PathBuf,
        /// The path.
        path: PathBuf,
    },
    /// It passes through a symbolic link.
    #[error("config {}: {} passes through the symbolic link {} -> {}; name the directory it leads to", .config.display(), .path.display(), .at.display(), .to.display())]
    Link {
        /// The config file.
        config: PathBuf,
        /// The path.
        path: PathBuf,
        /// The link.
        at: PathBuf,
        /// Where it leads.
        to: PathBuf,
    },
}

/// Checks the config's read and write paths: each must exist and pass
/// through no symbolic link (a run's roots are bound only as named).
pub fn check_config_roots(
    config: &Path,
    file: &policy::config::Config,
) -> Result<(), ConfigRootError> {
    for p in file.read_paths.iter().chain(&file.write_paths) {
        if !p.exists() {
            return Err(ConfigRootError::Missing {
                config: config.to_path_buf(),
                path: p.clone(),
            });
        }
        if let Some((at, to)) = crate::securedir::link_on_the_way(p) {
            return Err(ConfigRootError::Link {
                config: config.to_path_buf(),
                path: p.clone(),
                at,
                to,
            });
        }
    }
    Ok(())
}

/// Reads and parses the config: `explicit` (from --config or
/// SUBAGENTD_CONFIG) must exist; the default file may be absent.
pub fn load_config(
    explicit: Option<&Path>,
) -> Result<(PathBuf, policy::config::Config), ConfigFileError> {
    let path = explicit.map_or_else(default_config, Path::to_path_buf);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
            return Ok((path, policy::config::Config::default()));
        }
        Err(source) => return Err(ConfigFileError::Read { path, source }),
    };
    match policy::config::parse(&text) {
        Ok(c) => Ok((path, c)),
        Err(source) => Err(ConfigFileError::Parse { path, source }),
    }
}

/// The runner binary: next to the current executable.
pub fn default_runner() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("subagent-runner")))
        .unwrap_or_else(|| PathBuf::from("subagent-runner"))
}

/// The state dir's layout.
#[derive(Debug, Clone)]
pub struct StateLayout {
    /// The state dir.
    pub root: PathBuf,
    /// Where run folders (`sessions/`, `drafts/`) live: the state dir, or
    /// the Slurm backend's `shared_dir`, which the cluster's nodes mount.
    pub runs_root: PathBuf,
}

impl StateLayout {
    /// The layout of the state dir `root`, run folders in it.
    pub fn new(root: PathBuf) -> StateLayout {
        StateLayout {
            runs_root: root.clone(),
            root,
        }
    }
    /// `<runs root>/sessions`.
    pub fn sessions(&self) -> PathBuf {
        self.runs_root.join("sessions")
    }
    /// `<runs root>/drafts`: run folders being made, renamed into their
    /// session's `runs/` once the run is recorded.
    pub fn drafts(&self) -> PathBuf {
        self.runs_root.join("drafts")
    }
    /// `<root>/sessions/<session>`.
    pub fn session_dir(&self, session: &str) -> PathBuf {
        self.sessions().join(session)
    }
    /// `<root>/sessions/<session>/runs`.
    pub fn runs_dir(&self, session: &str) -> PathBuf {
        self.session_dir(session).join("runs")
    }
    /// `<root>/sessions/<session>/runs/<run>`.
    pub fn run_dir(&self, session: &str, run: &RunId) -> PathBuf {
        self.runs_dir(session).join(run.as_str())
    }
    /// The state dir that holds the run folder `dir`
    /// (`<root>/sessions/<session>/runs/<run>`).
    pub fn of_run_dir(dir: &Path) -> Option<StateLayout> {
        let root = dir.ancestors().nth(4)?;
        Some(StateLayout::new(root.to_path_buf()))
    }
    /// `<root>/state.db`: the daemon's records.
    pub fn db(&self) -> PathBuf {
        self.root.join("state.db")
    }
}

/// The files of one run folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFiles {
    /// `<state_dir>/sessions/<session_id>/runs/<run_id>`.
    pub dir: PathBuf,
}

impl RunFiles {
    /// runner.lock: held by the runner while it lives.
    pub fn runner_lock(&self) -> PathBuf {
        self.dir.join("runner.lock")
    }
    /// runner.log: the runner's own stderr.
    pub fn runner_log(&self) -> PathBuf {
        self.dir.join("runner.log")
    }
    /// exit.json: written by the runner when the run ended.
    pub fn exit(&self) -> PathBuf {
        self.dir.join("exit.json")
    }
    /// child.log: the child's stdout and stderr.
    pub fn log(&self) -> PathBuf {
        self.dir.join("child.log")
    }
    /// artifacts/: the child's results.
    pub fn artifacts(&self) -> PathBuf {
        self.dir.join("artifacts")
    }
    /// context/: what the child is given.
    pub fn context(&self) -> PathBuf {
        self.dir.join("context")
    }
    /// delta/: where the child writes delta.json.
    pub fn delta_dir(&self) -> PathBuf {
        self.dir.join("delta")
    }
    /// delta/delta.json.
    pub fn delta(&self) -> PathBuf {
        self.delta_dir().join("delta.json")
    }
    /// egress.log: the proxy's record of the run's connections.
    pub fn egress_log(&self) -> PathBuf {
        self.dir.join("egress.log")
    }
    /// gateway.log: a driver run's requests to its model gateway.
    pub fn gateway_log(&self) -> PathBuf {
        self.dir.join("gateway.log")
    }
    /// observed-before.json: the project's picture at spawn.
    pub fn observed_before(&self) -> PathBuf {
        self.dir.join(crate::observe::BEFORE_FILE)
    }
    /// result.md: written when the run ends.
    pub fn result(&self) -> PathBuf {
        self.dir.join("result.md")
    }
}
