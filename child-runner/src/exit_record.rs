//! exit.json: how a run ended, as the runner saw it.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The largest exit.json read back (it holds a few hundred bytes).
pub const EXIT_MAX_BYTES: u64 = 1 << 20;

/// exit.json could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ExitRecordError {
    /// Reading the file failed (a link, not a regular file, too large).
    #[error("read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: crate::safefile::SafeFileError,
    },
    /// It is not an exit record.
    #[error("parse {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
}

/// How the agent process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It exited by itself; `exit_code` is set.
    Exited,
    /// A signal the runner did not send killed it; `signal` is set.
    Signaled,
    /// The wall-clock limit passed and the runner killed the tree.
    TimedOut,
    /// The runner was asked to cancel (SIGTERM) and ended the tree.
    Cancelled,
    /// The program could not be started; `exit_code` is 126 or 127.
    SpawnFailed,
}

/// The runner's output, written atomically before it exits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    /// How the agent process ended.
    pub outcome: Outcome,
    /// Its exit code, when it exited (or 126/127 when it never started).
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// A sentence saying what happened.
    pub reason: String,
    /// The agent process's pid (0 when it never started).
    pub child_pid: i32,
    /// When the agent process was started, in ms since the epoch.
    pub started_at_ms: u64,
    /// When the whole tree was gone, in ms since the epoch.
    pub ended_at_ms: u64,
    /// Bytes written to child.log by this attempt, marker included.
    pub log_bytes: u64,
    /// Whether output was cut at the output cap.
    pub log_truncated: bool,
    /// A failure writing child.log, if any (the child kept running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_error: Option<String>,
    /// Processes the child left behind that the runner had to kill.
    pub leftover_killed: u32,
    /// What the sandbox enforced (absent when the child never started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::sandbox::report::IsolationReport>,
    /// What the run's process tree used.
    #[serde(default)]
    pub resources: Resources,
    /// Attempts made (restarts after exit 75 included).
    #[serde(default = "one")]
    pub attempts: u32,
    /// What was copied from the run's scratch file system to the run
    /// folder (artifacts and delta), and what was left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<Kept>,
    /// How long the last attempt's start took, in µs: `fork_to_exec`, from
    /// the clone of its init to the agent's exec.
    #[serde(default)]
    pub setup_us: std::collections::BTreeMap<String, u64>,
    /// When the first attempt's agent exec'd, in µs since the epoch
    /// (absent when no attempt's agent did): the end of the daemon's
    /// spawn → exec time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_at_us: Option<u64>,
}

/// What the runner copied out of the run's scratch file system.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    /// Regular files copied.
    pub files: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Entries left out (links, FIFOs, sockets, devices, past a bound),
    /// the first 20 named with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
    /// How many were left out in all.
    #[serde(default)]
    pub skipped_count: u64,
    /// A copy that failed part-way, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An entry of the run's scratch file system that was not copied out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The scratch dir it was in (`artifacts`, `temp`).
    pub dir: String,
    /// Its path in that dir (lossy UTF-8).
    pub path: String,
    /// Why it was left out.
    pub why: String,
}

fn one() -> u32 {
    1
}

/// What the run's process tree used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// User CPU time of the whole tree, in ms.
    pub cpu_user_ms: u64,
    /// System CPU time of the whole tree, in ms.
    pub cpu_system_ms: u64,
    /// Peak memory of the run's cgroup, in bytes, when known.
    pub peak_memory_bytes: Option<u64>,
    /// Whether the OOM killer ended a process of the run.
    pub oom_killed: bool,
    /// Forks the process limit refused, when a pids cgroup counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_refused: Option<u64>,
    /// The run was seen at its process limit where RLIMIT_NPROC holds it
    /// (sampled every 100 ms; it counts no refused forks).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pids_limit_reached: bool,
}

impl ExitRecord {
    /// exit.json's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Writes exit.json atomically.
    pub fn save(&self, path: &Path) -> Result<(), crate::atomic::AtomicError> {
        crate::atomic::write_atomic(path, &self.to_bytes())
    }

    /// Writes exit.json atomically into the room reserved for it.
    pub fn save_into(
        &self,
        reserve: crate::atomic::Reserved,
    ) -> Result<(), crate::atomic::AtomicError> {
        reserve.commit(&self.to_bytes())
    }

    /// Reads exit.json (a regular file, no link, at most
    /// [`EXIT_MAX_BYTES`]); `Ok(None)` when it does not exist.
    pub fn load(path: &Path) -> Result<Option<Self>, ExitRecordError> {
        match crate::safefile::read(path, EXIT_MAX_BYTES) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|source| ExitRecordError::Parse {
                        path: path.to_path_buf(),
                        source,
                    })
            }
            Err(e) if e.is_missing() => Ok(None),
            Err(source) => Err(ExitRecordError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_names_the_file_and_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exit.json");
        assert!(ExitRecord::load(&path).unwrap().is_none());
        std::fs::write(&path, b"{").unwrap();
        let e = ExitRecord::load(&path).unwrap_err();
        assert!(matches!(e, ExitRecordError::Parse { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&format!("parse {}: ", path.display())),
            "{e}"
        );
        let e = ExitRecord::load(dir.path()).unwrap_err();
        assert!(matches!(e, ExitRecordError::Read { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&format!("read {}: ", dir.path().display())),
            "{e}"
        );
    }
}
