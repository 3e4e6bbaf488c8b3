//! A run placed as a cluster job (`subagent-runner --job-dir DIR`): no
//! daemon is there to hand it descriptors, so the runner takes its inputs
//! from its run folder on the shared storage: runner.lock, opened without
//! following a link and locked here (held by another runner: refused), and
//! runner.spec, the spec the daemon wrote there before it submitted the
//! job, accepted only when it is a regular file of this uid that no one
//! else may write, read with a size bound.

use crate::spec::RunnerSpec;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The spec's name in the run folder.
pub const SPEC_FILE: &str = "runner.spec";
/// The lock's name in the run folder.
pub const LOCK_FILE: &str = "runner.lock";
/// The largest spec read (the daemon writes a few tens of KiB).
const MAX_SPEC_BYTES: u64 = 16 << 20;

/// The run folder's inputs could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum JobDirError {
    /// The folder is not an absolute path.
    #[error("--job-dir {0}: not an absolute path")]
    Relative(PathBuf),
    /// runner.lock could not be opened or locked.
    #[error("{op} {path}: {source}")]
    Lock {
        /// The step.
        op: &'static str,
        /// runner.lock.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Another runner holds runner.lock: the run is going elsewhere.
    #[error("{0} is held by another runner")]
    Held(PathBuf),
    /// runner.spec could not be read.
    #[error(transparent)]
    Read(#[from] crate::safefile::SafeFileError),
    /// runner.spec is not the daemon's.
    #[error("{path}: {why}; the spec must be this uid's file that no one else may write")]
    NotOurs {
        /// runner.spec.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// runner.spec is not a valid spec.
    #[error("{path}: {source}")]
    Spec {
        /// runner.spec.
        path: PathBuf,
        /// The error.
        source: crate::spec::SpecError,
    },
}

/// What a job's runner takes from its run folder.
pub struct JobInputs {
    /// runner.lock, open and locked (for [`crate::lockfd::adopt`]).
    pub lock: RawFd,
    /// The run's spec.
    pub spec: RunnerSpec,
}

/// Opens and locks runner.lock in `dir` (creating it 0600 when missing).
fn lock(dir: &Path) -> Result<RawFd, JobDirError> {
    let path = dir.join(LOCK_FILE);
    let err = |op| {
        let path = path.clone();
        move |source| JobDirError::Lock { op, path, source }
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(err("open"))?;
    // SAFETY: flock on a descriptor this function owns; it touches no
    // memory of ours.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Err(JobDirError::Held(path)),
            _ => Err(err("flock")(e)),
        };
    }
    Ok(file.into_raw_fd())
}

/// Reads runner.spec's bytes in `dir`: this uid's regular file, writable
/// by no one else, at most [`MAX_SPEC_BYTES`].
fn spec_bytes(dir: &Path) -> Result<Vec<u8>, JobDirError> {
    let path = dir.join(SPEC_FILE);
    let opened = crate::safefile::open(&path)?;
    let meta = opened.metadata();
    let me = nix::unistd::geteuid().as_raw();
    let why = if meta.uid() != me {
        Some(format!("owned by uid {}, not {me}", meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "mode {:o} lets others write it",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return Err(JobDirError::NotOurs { path, why });
    }
    Ok(opened.read_all(MAX_SPEC_BYTES)?)
}

/// Takes a job's inputs from its run folder `dir`: the spec first, so a
/// folder without one is refused before anything in it changes.
pub fn open(dir: &Path) -> Result<JobInputs, JobDirError> {
    if !dir.is_absolute() {
        return Err(JobDirError::Relative(dir.to_path_buf()));
    }
    let bytes = spec_bytes(dir)?;
    let spec = RunnerSpec::parse(&bytes).map_err(|source| JobDirError::Spec {
        path: dir.join(SPEC_FILE),
        source,
    })?;
    let lock = lock(dir)?;
    Ok(JobInputs { lock, spec })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn folder(spec: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(d.path().join(SPEC_FILE), spec).unwrap_or_else(|e| panic!("{e}"));
        let p = d.path().join(SPEC_FILE);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        d
    }

    const SPEC: &str = "{}";

    #[test]
    fn the_spec_is_read_and_the_lock_held_once() {
        let d = folder(SPEC);
        assert_eq!(spec_bytes(d.path()).unwrap(), b"{}");
        let fd = lock(d.path()).unwrap();
        assert!(matches!(lock(d.path()), Err(JobDirError::Held(_))));
        // SAFETY: the test owns the descriptor lock() returned.
        unsafe { libc::close(fd) };
        let again = lock(d.path()).unwrap();
        // SAFETY: as above.
        unsafe { libc::close(again) };
    }

    #[test]
    fn a_spec_others_may_write_or_a_link_is_refused() {
        let d = folder(SPEC);
        let p = d.path().join(SPEC_FILE);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o622))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(open(d.path()), Err(JobDirError::NotOurs { .. })));
        std::fs::rename(&p, d.path().join("real")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(d.path().join("real"), &p).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(open(d.path()), Err(JobDirError::Read(_))));
        assert!(!d.path().join(LOCK_FILE).exists(), "nothing changed");
    }

    #[test]
    fn a_missing_or_bad_spec_or_a_relative_folder_is_refused() {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(open(d.path()), Err(JobDirError::Read(e)) if e.is_missing()));
        let d = folder("{not json");
        assert!(matches!(open(d.path()), Err(JobDirError::Spec { .. })));
        assert!(!d.path().join(LOCK_FILE).exists(), "nothing changed");
        assert!(matches!(
            open(Path::new("runs/r")),
            Err(JobDirError::Relative(_))
        ));
    }
}
