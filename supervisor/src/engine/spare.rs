//! Spare run folders, made ahead of need.
//!
//! On a file system that is slow to allocate inodes (ext4 without a
//! journal skips every inode freed in the last minute or so, reading its
//! inode table block each time, so a create costs 0.1–0.8 ms once files
//! have been deleted nearby), a run folder's ~15 directories and files
//! were most of a spawn's latency. So a background thread (SCHED_IDLE)
//! keeps a few empty run folders ready in `<state>/spare/`: the folders and every
//! file the spawn path writes, created empty and made durable there.
//! Accepting a spawn fills them in place (no new inode), fsyncs what
//! must be durable, and publishes the folder with one rename into
//! `sessions/<session>/runs/<run id>`: a run folder is never seen half
//! made. When no spare is ready, one is made on the spot.
//!
//! Spares left by an earlier daemon are removed when the engine starts,
//! except those that already hold a record: they are set aside in
//! `<state>/spare/.filled/` (see [`SparePool::open`]).
//!
//! Files a finished run did not use (and run.json's last spare, which
//! holds its previous record) are not deleted but moved into
//! `<state>/spare/.recycled/`, and new spares are made of them first: a
//! deleted file would be a "recently deleted" inode that slows every
//! create nearby for a minute.

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
/// reserve, the context files, and the temp files of the run's later
/// atomic writes (run.json's changes, result.md, the notice).
pub fn spare_files(f: &RunFiles) -> Vec<PathBuf> {
    let ctx = f.context();
    let mut v = vec![
        f.record(),
        f.runner_spec(),
        f.runner_lock(),
        f.runner_log(),
        f.log(),
    ];
    v.extend(subagent_runner::atomic::reserve_path(&f.exit()));
    v.push(f.record_spares()[0].clone());
    v.push(f.result_spare());
    v.push(f.notice_spare());
    v.extend(
        ["system.md", "first_message.md", "tools.json", "plan.json"]
            .iter()
            .map(|n| ctx.join(n)),
    );
    v
}

/// Writes `bytes` into the file at `path` (made if missing), replacing its
/// content in place; with `sync`, fsyncs it. Not atomic: only for files
/// in a folder nobody sees yet.
///
/// A spare's files are empty, so the file is not opened with `O_TRUNC`:
/// on ext4 a truncation to size 0 marks the inode so that its `close`
/// starts writing the new data out at once (`auto_da_alloc`), which cost
/// the daemon about 1.8% of its CPU in the throughput benchmark for files
/// that need no such flush. A longer file (not a spare's) is cut after
/// the write instead.
pub fn fill(path: &Path, bytes: &[u8], sync: bool) -> Result<(), SpareError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(err("open", path))?;
    f.write_all(bytes).map_err(err("write", path))?;
    let len = f.metadata().map_err(err("stat", path))?.len();
    if len > bytes.len() as u64 {
        f.set_len(bytes.len() as u64)
            .map_err(err("truncate", path))?;
    }
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

/// The folder under the pool's dir where files wait to be reused.
const RECYCLED: &str = ".recycled";

/// Where a leftover spare that was filled is set aside, never deleted.
const FILLED: &str = ".filled";

/// Whether a leftover spare folder had a run written into it: a spare's
/// files are made empty, and accepting a spawn writes run.json into it
/// before the folder is renamed into `runs/`. After a power loss on a file
/// system without a journal, such a folder can still be listed here as
/// well as under `runs/` (only `runs/` is fsynced after the rename): the
/// same directory, which deleting its contents would empty.
fn was_filled(spare: &Path) -> bool {
    let f = RunFiles {
        dir: spare.to_path_buf(),
    };
    std::fs::symlink_metadata(f.record()).is_ok_and(|m| m.is_file() && m.len() > 0)
}

/// Makes the private dir `dir` (0700) unless it exists.
fn ensure_dir(dir: &Path) -> Result<(), SpareError> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })
        .map_err(err("create", dir))
}

/// Moves a filled leftover spare into `kept` (a rename moves only this
/// name of it), with a warning.
fn set_aside(spare: &Path, kept: &Path) -> Result<(), SpareError> {
    ensure_dir(kept)?;
    let to = kept.join(format!(
        "{}-{}",
        spare
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("spare"),
        crate::ids::random_hex8()
    ));
    std::fs::rename(spare, &to).map_err(err("set aside", spare))?;
    tracing::warn!(
        from = %spare.display(),
        to = %to.display(),
        "a leftover spare run folder holds a record: set aside, not deleted"
    );
    Ok(())
}

/// The spare folders.
pub struct SparePool {
    dir: PathBuf,
    /// The temp base, where spare temp dirs are made (see
    /// [`crate::securedir::make_spare_temp_dir`]).
    temp_base: Option<PathBuf>,
    want: usize,
    ready: Mutex<Vec<PathBuf>>,
    /// Names of spare temp dirs this pool made.
    ready_temp: Mutex<Vec<String>>,
    /// Files in `.recycled/`, to make spare files of.
    recycled: Mutex<Vec<PathBuf>>,
    /// Wakes the maker thread, once it runs.
    wake: Mutex<Option<std::sync::mpsc::Sender<()>>>,
}

/// Puts the calling thread in the SCHED_IDLE class: it runs only on a CPU
/// nothing else wants.
fn idle_priority() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler with pid 0 changes the calling thread's
    // policy only; `param` is a live value it reads.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl SparePool {
    /// Opens `dir` (made 0700 if missing) and removes what an earlier
    /// daemon left there; a leftover folder that holds a record is moved
    /// into `.filled/` instead (a power loss can leave it listed both here
    /// and under `runs/`). With `temp_base`, spare temp dirs are kept too
    /// (old ones left by others are swept, see
    /// [`crate::securedir::sweep_empty_session_dirs`]). Blocking.
    pub fn open(
        dir: PathBuf,
        temp_base: Option<PathBuf>,
        want: usize,
    ) -> Result<SparePool, SpareError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(err("create", &dir))?;
        let bin = dir.join(RECYCLED);
        let kept = dir.join(FILLED);
        for entry in std::fs::read_dir(&dir).map_err(err("list", &dir))? {
            let path = entry.map_err(err("list", &dir))?.path();
            if path == bin || path == kept {
                continue;
            }
            if was_filled(&path) {
                set_aside(&path, &kept)?;
            } else {
                std::fs::remove_dir_all(&path).map_err(err("remove", &path))?;
            }
        }
        ensure_dir(&bin)?;
        let mut recycled = Vec::new();
        for entry in std::fs::read_dir(&bin).map_err(err("list", &bin))? {
            let e = entry.map_err(err("list", &bin))?;
            if e.file_type().is_ok_and(|t| t.is_file()) {
                recycled.push(e.path());
            }
        }
        Ok(SparePool {
            dir,
            temp_base,
            want,
            ready: Mutex::new(Vec::new()),
            ready_temp: Mutex::new(Vec::new()),
            recycled: Mutex::new(recycled),
            wake: Mutex::new(None),
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
            if !self.reuse(&p) {
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&p)
                    .map_err(err("create", &p))?;
            }
        }
        fsync_dir(&f.context())?;
        fsync_dir(dir)?;
        fsync_dir(&self.dir)
    }

    /// Moves a recycled file to `path`, emptied and 0600; false when none
    /// is left (or it could not be moved).
    fn reuse(&self, path: &Path) -> bool {
        loop {
            let Some(r) = self
                .recycled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop()
            else {
                return false;
            };
            if std::fs::rename(&r, path).is_err() {
                continue;
            }
            let emptied = OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .and_then(|f| {
                    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
                });
            if emptied.is_ok() {
                return true;
            }
            // Not a regular file of ours after all: out of the way.
            let _ = std::fs::remove_file(path);
        }
    }

    /// Keeps the file at `path` (which nothing will use again) as material
    /// for spares, instead of deleting it. Blocking.
    pub fn recycle(&self, path: &Path) {
        let to = self
            .dir
            .join(RECYCLED)
            .join(format!("r{}", crate::ids::random_hex8()));
        match std::fs::rename(path, &to) {
            Ok(()) => self
                .recycled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(to),
            Err(_) => {
                let _ = std::fs::remove_file(path);
            }
        }
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

    /// A spare temp dir's name, when one is ready (for
    /// [`crate::securedir::make_temp_dir`]).
    pub fn take_temp(&self) -> Option<String> {
        self.ready_temp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
    }

    /// Removes the spare temp dirs this pool made and nobody claimed (the
    /// daemon is stopping): they are shared with other daemons of this uid
    /// under `<temp base>/.spare/`, where nobody else would know them as
    /// unclaimed until the hourly sweep. Only empty dirs go (`rmdir`).
    pub fn release_temps(&self) {
        let Some(base) = &self.temp_base else {
            return;
        };
        let names = std::mem::take(&mut *self.ready_temp.lock().unwrap_or_else(|p| p.into_inner()));
        let dir = base.join(crate::securedir::SPARE_TEMP);
        for name in names {
            let _ = std::fs::remove_dir(dir.join(name));
        }
    }

    fn ready_temp(&self) -> usize {
        self.ready_temp
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Wakes the thread that keeps the pool filled.
    pub fn refill(&self) {
        if let Some(tx) = &*self.wake.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = tx.send(());
        }
    }

    fn fill_up(&self) {
        while self.ready() < self.want {
            match self.make() {
                Ok(dir) => self
                    .ready
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(dir),
                Err(e) => {
                    tracing::warn!("making a spare run folder: {e}");
                    break;
                }
            }
        }
        let Some(base) = &self.temp_base else {
            return;
        };
        while self.ready_temp() < self.want {
            match crate::securedir::make_spare_temp_dir(base) {
                Ok(name) => self
                    .ready_temp
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(name),
                Err(e) => {
                    tracing::warn!("making a spare temp dir: {e}");
                    return;
                }
            }
        }
    }

    /// Starts the thread that keeps `want` spares ready: it fills the pool
    /// now and again at each [`SparePool::refill`]. It runs in the
    /// SCHED_IDLE class, so making spares (CPU time in the kernel's inode
    /// allocator) never takes a CPU from a runner or a child that is
    /// starting. It ends when the pool is dropped.
    pub fn start_maker(
        pool: &std::sync::Arc<SparePool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let weak = std::sync::Arc::downgrade(pool);
        let handle = std::thread::Builder::new()
            .name("spare-maker".into())
            .spawn(move || {
                if let Err(e) = idle_priority() {
                    tracing::warn!(
                        "spare-maker: SCHED_IDLE: {e}; making spares at normal priority"
                    );
                }
                loop {
                    match weak.upgrade() {
                        Some(pool) => pool.fill_up(),
                        None => return,
                    }
                    // Ends when the pool (which holds the sender) is gone.
                    if rx.recv().is_err() {
                        return;
                    }
                    while rx.try_recv().is_ok() {}
                }
            })?;
        *pool.wake.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spare_holds_every_file_the_spawn_path_writes_and_leftovers_go() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("spare");
        let pool = SparePool::open(dir.clone(), None, 2).unwrap();
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
        // A longer file is replaced whole, not overwritten in part.
        fill(&f.record(), b"a longer record", false).unwrap();
        fill(&f.record(), b"[]", false).unwrap();
        assert_eq!(std::fs::read(f.record()).unwrap(), b"[]");
        // A new pool on the same dir removes the spare folders the old one
        // left (only the recycling bin stays, and `s`, which holds a record
        // now, is set aside).
        let left = pool.make().unwrap();
        drop(pool);
        let _pool = SparePool::open(dir.clone(), None, 2).unwrap();
        assert!(!s.exists() && !left.exists());
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, [FILLED, RECYCLED]);
    }

    #[test]
    fn a_leftover_spare_holding_a_record_is_set_aside_not_deleted() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("spare");
        let pool = SparePool::open(dir.clone(), None, 2).unwrap();
        let filled = pool.make().unwrap();
        let empty = pool.make().unwrap();
        let f = RunFiles {
            dir: filled.clone(),
        };
        fill(&f.record(), b"{\"run_id\":\"x\"}", true).unwrap();
        fill(&f.log(), b"the child's output", false).unwrap();
        drop(pool);
        let _pool = SparePool::open(dir.clone(), None, 2).unwrap();
        assert!(!filled.exists() && !empty.exists());
        let kept: Vec<_> = std::fs::read_dir(dir.join(FILLED))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        let k = RunFiles {
            dir: kept[0].clone(),
        };
        assert_eq!(std::fs::read(k.log()).unwrap(), b"the child's output");
        // A second start leaves it where it is.
        drop(_pool);
        let _pool = SparePool::open(dir.clone(), None, 2).unwrap();
        assert_eq!(std::fs::read_dir(dir.join(FILLED)).unwrap().count(), 1);
    }

    #[test]
    fn recycled_files_become_spare_files_emptied_and_survive_a_restart() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("spare");
        let pool = SparePool::open(dir.clone(), None, 1).unwrap();
        let old = root.path().join(".run.json.s2");
        std::fs::write(&old, b"a previous record").unwrap();
        let ino = std::fs::metadata(&old).unwrap().ino();
        pool.recycle(&old);
        assert!(!old.exists());
        drop(pool);
        // Kept across a restart of the pool, then used for a new spare.
        let pool = SparePool::open(dir.clone(), None, 1).unwrap();
        let s = pool.make().unwrap();
        let f = RunFiles { dir: s };
        let reused: Vec<_> = spare_files(&f)
            .into_iter()
            .filter(|p| std::fs::metadata(p).unwrap().ino() == ino)
            .collect();
        assert_eq!(reused.len(), 1, "the recycled inode was used once");
        let m = std::fs::metadata(&reused[0]).unwrap();
        assert_eq!((m.len(), m.mode() & 0o777), (0, 0o600));
        assert_eq!(std::fs::read_dir(dir.join(RECYCLED)).unwrap().count(), 0);
    }

    #[test]
    fn the_pool_refills_after_a_take_and_its_thread_ends_with_it() {
        let root = tempfile::tempdir().unwrap();
        let pool = std::sync::Arc::new(
            SparePool::open(root.path().join("spare"), Some(root.path().join("tmp")), 2).unwrap(),
        );
        let maker = SparePool::start_maker(&pool).unwrap();
        let wait_for = |what: &str, ok: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !ok() {
                assert!(std::time::Instant::now() < deadline, "{what}");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        wait_for("the pool never filled", &|| {
            pool.ready() == 2 && pool.ready_temp() == 2
        });
        let leaf = pool.take_temp().unwrap();
        assert!(root
            .path()
            .join("tmp")
            .join(crate::securedir::SPARE_TEMP)
            .join(&leaf)
            .is_dir());
        let taken = pool.take().unwrap();
        assert!(taken.is_dir());
        assert_eq!(pool.ready(), 1);
        pool.refill();
        wait_for("the pool never refilled", &|| {
            pool.ready() == 2 && pool.ready_temp() == 2
        });
        // Released at shutdown: the unclaimed spare temp dirs go, the one
        // taken (now a run's) and a stranger's stay.
        let spares = root.path().join("tmp").join(crate::securedir::SPARE_TEMP);
        let stranger = crate::securedir::make_spare_temp_dir(&root.path().join("tmp")).unwrap();
        assert_eq!(std::fs::read_dir(&spares).unwrap().count(), 4);
        pool.release_temps();
        let mut left: Vec<_> = std::fs::read_dir(&spares)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![leaf, stranger];
        want.sort();
        assert_eq!(left, want);
        drop(pool);
        wait_for("the maker thread outlived its pool", &|| {
            maker.is_finished()
        });
    }
}
