//! Durable, atomic file replacement: write a temp file in the same folder,
//! fsync it, rename it over the target, fsync the folder.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A failed step of an atomic write, with the path it was working on.
#[derive(Debug, thiserror::Error)]
pub enum AtomicError {
    /// The target path has no parent folder or no file name.
    #[error("{0}: not a file path inside a folder")]
    BadPath(PathBuf),
    /// An I/O step failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> AtomicError + 'a {
    move |source| AtomicError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// fsyncs a directory so that a rename or create inside it is durable.
pub fn fsync_dir(dir: &Path) -> Result<(), AtomicError> {
    let f = File::open(dir).map_err(io("open directory", dir))?;
    f.sync_all().map_err(io("fsync directory", dir))
}

/// Replaces `path` with `bytes` atomically and durably; mode 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AtomicError> {
    replace(path, bytes, true)
}

/// Replaces `path` with `bytes` atomically (readers see the old or the new
/// content, never a mix) but without fsync: for files derived from a
/// durable record, which can be made again.
pub fn write_replace(path: &Path, bytes: &[u8]) -> Result<(), AtomicError> {
    replace(path, bytes, false)
}

fn replace(path: &Path, bytes: &[u8], durable: bool) -> Result<(), AtomicError> {
    let dir = path
        .parent()
        .ok_or_else(|| AtomicError::BadPath(path.to_path_buf()))?;
    let name = path
        .file_name()
        .ok_or_else(|| AtomicError::BadPath(path.to_path_buf()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        f.write_all(bytes).map_err(io("write", &tmp))?;
        if durable {
            f.sync_all().map_err(io("fsync", &tmp))?;
        }
        fs::rename(&tmp, path).map_err(io("rename into place", path))?;
        if durable {
            fsync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("run.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("run.json")]);
    }

    #[test]
    fn missing_folder_is_an_error_naming_the_path() {
        let err = write_atomic(Path::new("/nonexistent-dir-xyz/run.json"), b"x").unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir-xyz/"), "{err}");
    }
}
