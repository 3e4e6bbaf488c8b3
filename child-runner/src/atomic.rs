//! Durable, atomic file replacement: write a temp file in the same folder,
//! fsync it, rename it over the target, fsync the folder; and [`Reserved`],
//! disk room held up front for such a write.

use crate::ioerr::{at, IoAt};
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

impl From<IoAt> for AtomicError {
    fn from(e: IoAt) -> AtomicError {
        AtomicError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

/// fsyncs a directory so that a rename or create inside it is durable.
pub fn fsync_dir(dir: &Path) -> Result<(), AtomicError> {
    let f = File::open(dir).map_err(at("open directory", dir))?;
    f.sync_all()
        .map_err(|e| at("fsync directory", dir)(e).into())
}

/// Replaces `path` with `bytes` atomically and durably; mode 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AtomicError> {
    replace(path, bytes, Sync::FileAndDir)
}

/// Replaces `path` with `bytes` atomically (readers see the old or the new
/// content, never a mix) but without fsync: for files derived from a
/// durable record, which can be made again.
pub fn write_replace(path: &Path, bytes: &[u8]) -> Result<(), AtomicError> {
    replace(path, bytes, Sync::None)
}

/// What a replacement fsyncs.
#[derive(Clone, Copy, PartialEq)]
enum Sync {
    /// Nothing.
    None,
    /// The content before the rename, then the folder after it.
    FileAndDir,
}

fn replace(path: &Path, bytes: &[u8], sync: Sync) -> Result<(), AtomicError> {
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
            .map_err(at("create", &tmp))?;
        f.write_all(bytes).map_err(at("write", &tmp))?;
        if sync == Sync::FileAndDir {
            f.sync_all().map_err(at("fsync", &tmp))?;
        }
        fs::rename(&tmp, path).map_err(at("rename into place", path))?;
        if sync == Sync::FileAndDir {
            fsync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Disk room held for a later atomic write of a file: a temp file made at
/// full size up front, then filled and renamed into place by
/// [`Reserved::commit`]. The final write needs no new blocks (so a full
/// disk cannot stop it) and no new inode.
pub struct Reserved {
    file: fs::File,
    tmp: PathBuf,
    path: PathBuf,
}

/// Where [`Reserved::create`] holds room for `path`: `.<name>.reserve`
/// beside it.
pub fn reserve_path(path: &Path) -> Option<PathBuf> {
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(path.file_name()?);
    tmp_name.push(".reserve");
    Some(path.with_file_name(tmp_name))
}

/// What a reserve is filled with: a static in `.bss` reads as the kernel's shared zero page,
/// so filling a reserve allocates nothing and faults in no page.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

impl Reserved {
    /// Makes `.<name>.reserve` beside `path` (or reuses an existing file
    /// there), `size` bytes long.
    pub fn create(path: &Path, size: usize) -> Result<Reserved, AtomicError> {
        let tmp = reserve_path(path).ok_or_else(|| AtomicError::BadPath(path.to_path_buf()))?;
        let made = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(at("create", &tmp))?;
            // Written, not just sized: a sparse file would hold no blocks.
            let mut left = size;
            while left > 0 {
                let n = left.min(ZEROS.len());
                file.write_all(&ZEROS[..n]).map_err(at("write", &tmp))?;
                left -= n;
            }
            Ok(file)
        })();
        match made {
            Ok(file) => Ok(Reserved {
                file,
                tmp,
                path: path.to_path_buf(),
            }),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Writes `bytes` into the reserved file, cuts it to their length,
    /// fsyncs it and renames it over the target, then fsyncs the folder.
    /// If that fails, the reserve is removed and a plain [`write_atomic`]
    /// is tried.
    pub fn commit(self, bytes: &[u8]) -> Result<(), AtomicError> {
        use std::os::unix::fs::FileExt;
        let Reserved { file, tmp, path } = self;
        let filled = (|| {
            file.write_all_at(bytes, 0).map_err(at("write", &tmp))?;
            file.set_len(bytes.len() as u64)
                .map_err(at("truncate", &tmp))?;
            file.sync_all().map_err(at("fsync", &tmp))?;
            fs::rename(&tmp, &path).map_err(at("rename into place", &path))?;
            let dir = path
                .parent()
                .ok_or_else(|| AtomicError::BadPath(path.clone()))?;
            fsync_dir(dir)
        })();
        drop(file);
        match filled {
            Ok(()) => Ok(()),
            Err(_) => {
                let _ = fs::remove_file(&tmp);
                write_atomic(&path, bytes)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `dir`.
    fn names(dir: &Path) -> Vec<std::ffi::OsString> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    }

    #[test]
    fn replaces_content_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("run.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            names(dir.path()),
            vec![std::ffi::OsString::from("run.json")]
        );
    }

    #[test]
    fn a_reserve_holds_room_and_becomes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("exit.json");
        let r = Reserved::create(&p, 4096).unwrap();
        let tmp = dir.path().join(".exit.json.reserve");
        assert_eq!(fs::metadata(&tmp).unwrap().len(), 4096);
        assert!(!p.exists());
        r.commit(b"{}\n").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"{}\n");
        assert!(!tmp.exists());
    }

    #[test]
    fn a_reserve_larger_than_the_zero_buffer_is_written_whole() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("exit.json");
        let size = 2 * ZEROS.len() + 1234;
        let _r = Reserved::create(&p, size).unwrap();
        let tmp = dir.path().join(".exit.json.reserve");
        let m = fs::metadata(&tmp).unwrap();
        assert_eq!(m.len(), size as u64);
        // Written, not sparse: the blocks are held.
        assert!(m.blocks() * 512 >= size as u64, "{} blocks", m.blocks());
        assert!(fs::read(&tmp).unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn a_reserve_that_cannot_be_renamed_falls_back_and_reports() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("exit.json");
        let r = Reserved::create(&p, 64).unwrap();
        // A directory in the way: rename and the fallback both fail.
        fs::create_dir(&p).unwrap();
        fs::write(p.join("x"), b"x").unwrap();
        let err = r.commit(b"{}").unwrap_err();
        assert!(err.to_string().contains("exit.json"), "{err}");
        assert!(!dir.path().join(".exit.json.reserve").exists());
    }

    #[test]
    fn missing_folder_is_an_error_naming_the_path() {
        let err = write_atomic(Path::new("/nonexistent-dir-xyz/run.json"), b"x").unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir-xyz/"), "{err}");
    }
}
