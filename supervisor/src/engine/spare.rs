//! Spare run folders, made ahead of need.
//!
//! On a file system that is slow to allocate inodes (ext4 without a
//! journal skips every inode freed in the last minute or so, reading its
//! inode table block each time, so a create costs 0.1–0.8 ms once files
//! have been deleted nearby), a run folder's ~15 directories and files
//! were most of a spawn's latency. So a background task keeps a few
//! empty run folders ready in `<state>/spare/`: the folders and every
//! file the spawn path writes, created empty and made durable there.
//! Accepting a spawn fills them in place (no new inode), fsyncs what
//! must be durable, and publishes the folder with one rename into
//! `sessions/<session>/runs/<run id>`: a run folder is never seen half
//! made. When no spare is ready, one is made on the spot.
//!
//! Spares left by an earlier daemon are removed when the engine starts.

use crate::paths::RunFiles;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A spare folder could not be made or filled.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct SpareError {
    /// The operation.
    pub op: &'static str,
    /// The path.
    pub path: PathBuf,
    /// The error.
    pub source: std::io::Error,
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SpareError + 'a {
    move |source| SpareError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The folders of a run folder, made empty in a spare.
pub fn spare_dirs(f: &RunFiles) -> [PathBuf; 3] {
    [f.artifacts(), f.context(), f.delta_dir()]
}

/// The files of a run folder that the spawn path writes, made empty in a
/// spare: the daemon's records, the runner's lock and logs, exit.json's
/// reserve, and the context files.
pub fn spare_files(f: &RunFiles) -> Vec<PathBuf> {
    let ctx = f.context();
    let mut v = vec![
        f.record(),
        f.runner_spec(),
        f.compose(),
        f.runner_lock(),
        f.runner_log(),
        f.log(),
    ];
    v.extend(subagent_runner::atomic::reserve_path(&f.exit()));
    v.extend(
        [
            "system.md",
            "first_message.md",
            "tools.json",
            "plan.json",
            "plan-1.json",
        ]
        .iter()
        .map(|n| ctx.join(n)),
    );
    v
}

/// Writes `bytes` into the file at `path` (made if missing), replacing its
/// content in place; with `sync`, fsyncs it. Not atomic: only for files
/// in a folder nobody sees yet.
pub fn fill(path: &Path, bytes: &[u8], sync: bool) -> Result<(), SpareError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err("open", path))?;
    f.write_all(bytes).map_err(err("write", path))?;
    if sync {
        f.sync_all().map_err(err("fsync", path))?;
    }
    Ok(())
}

fn fsync_dir(dir: &Path) -> Result<(), SpareError> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(err("fsync", dir))
}

/// The spare folders.
pub struct SparePool {
    dir: PathBuf,
    want: usize,
    ready: Mutex<Vec<PathBuf>>,
    wake: tokio::sync::Notify,
}

impl SparePool {
    /// Opens `dir` (made 0700 if missing) and removes what an earlier
    /// daemon left there. Blocking.
    pub fn open(dir: PathBuf, want: usize) -> Result<SparePool, SpareError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(err("create", &dir))?;
        for entry in std::fs::read_dir(&dir).map_err(err("list", &dir))? {
            let path = entry.map_err(err("list", &dir))?.path();
            std::fs::remove_dir_all(&path).map_err(err("remove", &path))?;
        }
        Ok(SparePool {
            dir,
            want,
            ready: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
        })
    }

    /// How many spares are ready.
    pub fn ready(&self) -> usize {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Makes one spare folder, durably. Blocking.
    pub fn make(&self) -> Result<PathBuf, SpareError> {
        let (dir, made) = loop {
            let dir = self.dir.join(format!("s{}", crate::ids::random_hex8()));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => break (dir.clone(), self.populate(&dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(err("create", &dir)(e)),
            }
        };
        match made {
            Ok(()) => Ok(dir),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn populate(&self, dir: &Path) -> Result<(), SpareError> {
        let f = RunFiles {
            dir: dir.to_path_buf(),
        };
        for d in spare_dirs(&f) {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&d)
                .map_err(err("create", &d))?;
        }
        for p in spare_files(&f) {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
                .map_err(err("create", &p))?;
        }
        fsync_dir(&f.context())?;
        fsync_dir(dir)?;
        fsync_dir(&self.dir)
    }

    /// A spare folder for a new run: a ready one, else one made now.
    /// Blocking. The pool is refilled only when [`SparePool::refill`] is
    /// called: the engine calls it once the run's runner has started, so
    /// making the next spares never competes with this spawn's own path
    /// for the disk.
    pub fn take(&self) -> Result<PathBuf, SpareError> {
        let got = self.ready.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match got {
            Some(dir) => Ok(dir),
            None => self.make(),
        }
    }

    /// Wakes the task that keeps the pool filled.
    pub fn refill(&self) {
        self.wake.notify_one();
    }

    /// Keeps `want` spares ready, making them on the blocking pool
    /// whenever [`SparePool::refill`] is called. Runs until the runtime
    /// stops.
    pub async fn keep_filled(pool: std::sync::Arc<SparePool>) {
        loop {
            while pool.ready() < pool.want {
                let p = pool.clone();
                match tokio::task::spawn_blocking(move || p.make()).await {
                    Ok(Ok(dir)) => pool
                        .ready
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(dir),
                    Ok(Err(e)) => {
                        tracing::warn!("making a spare run folder: {e}");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("making a spare run folder: {e}");
                        break;
                    }
                }
            }
            pool.wake.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spare_holds_every_file_the_spawn_path_writes_and_leftovers_go() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("spare");
        let pool = SparePool::open(dir.clone(), 2).unwrap();
        let s = pool.take().unwrap();
        assert!(s.starts_with(&dir));
        let f = RunFiles { dir: s.clone() };
        for d in spare_dirs(&f) {
            assert!(d.is_dir(), "{}", d.display());
        }
        for p in spare_files(&f) {
            assert_eq!(std::fs::metadata(&p).unwrap().len(), 0, "{}", p.display());
        }
        fill(&f.record(), b"{}", true).unwrap();
        assert_eq!(std::fs::read(f.record()).unwrap(), b"{}");
        // A new pool on the same dir removes what the old one left.
        let left = pool.make().unwrap();
        drop(pool);
        let _pool = SparePool::open(dir.clone(), 2).unwrap();
        assert!(!s.exists() && !left.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn the_pool_refills_after_a_take() {
        let root = tempfile::tempdir().unwrap();
        let pool = std::sync::Arc::new(SparePool::open(root.path().join("spare"), 2).unwrap());
        tokio::spawn(SparePool::keep_filled(pool.clone()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while pool.ready() < 2 {
            assert!(std::time::Instant::now() < deadline, "pool never filled");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let p = pool.clone();
        let taken = tokio::task::spawn_blocking(move || p.take())
            .await
            .unwrap()
            .unwrap();
        assert!(taken.is_dir());
        assert_eq!(pool.ready(), 1);
        pool.refill();
        while pool.ready() < 2 {
            assert!(std::time::Instant::now() < deadline, "pool never refilled");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}
