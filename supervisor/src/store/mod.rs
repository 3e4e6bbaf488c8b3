//! The daemon's records in one SQLite file, `<state>/state.db`: every run
//! (a small `runs` row plus side tables for what is written once), each
//! session's working state, the notices (a column of the run's row) and
//! the store's own marks. One writer thread owns the only read-write
//! connection and commits requests in groups; readers use a small pool of
//! read-only connections, which WAL never makes wait for the writer.
//!
//! Uses the run model, the protocol's `Notice`, the sessions' state,
//! usage's totals and paths; never the engine.

mod backup;
mod error;
mod import_v1;
mod notices;
mod ops;
mod query;
mod retention;
mod runs;
mod schema;
mod sessions;
mod usage;
mod writer;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod usage_tests;

use error::io_err;
pub use error::{Result, StoreError};
pub use ops::{ListQuery, Op, Page, Stored, UsageQuery};
pub use retention::{Candidate, Pruning};
pub use writer::Out;

use crate::ids::RunId;
use crate::paths::StateLayout;
use crate::run::record::RunRecord;
use crate::sessions::SessionState;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

/// The database's file name in the state dir.
pub const DB_FILE: &str = "state.db";

/// Read-only connections kept for reuse.
const READERS: usize = 4;

/// The daemon's records.
pub struct Store {
    path: PathBuf,
    /// Requests to the writer thread; `None` when read-only or closed by
    /// [`Store::close_clean`].
    tx: Mutex<Option<std::sync::mpsc::Sender<writer::Req>>>,
    writer: Option<std::thread::JoinHandle<()>>,
    readers: Mutex<Vec<rusqlite::Connection>>,
    /// Signalled when a reader goes back to the pool.
    returned: Condvar,
    stats: Arc<writer::Stats>,
    /// How long the integrity check took at open; `None` when it was
    /// skipped (the last daemon stopped cleanly) or the store is read-only.
    checked: Option<std::time::Duration>,
    /// This open's number among the file's opens for writing (0: read-only).
    starts: u64,
}

/// A pooled reader, put back in the pool when dropped (also when the read
/// panicked, which would otherwise shrink the pool for good).
struct Lent<'a> {
    store: &'a Store,
    conn: Option<rusqlite::Connection>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            self.store
                .readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(c);
            self.store.returned.notify_one();
        }
    }
}

/// Opens the file read-write, never through a symlink, creating it 0600
/// first (SQLite gives -wal and -shm the mode of the file).
fn open_rw(path: &Path) -> Result<rusqlite::Connection> {
    use rusqlite::OpenFlags as F;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io_err(path, "create", path))?;
    private(path)?;
    let flags = F::SQLITE_OPEN_READ_WRITE | F::SQLITE_OPEN_NOFOLLOW | F::SQLITE_OPEN_NO_MUTEX;
    rusqlite::Connection::open_with_flags(path, flags).map_err(|e| schema::classify(path, e))
}

/// The file and its -wal and -shm made 0600 (when they are files).
fn private(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut all = vec![path.to_path_buf()];
    for ext in ["-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(ext);
        all.push(PathBuf::from(p));
    }
    for p in all {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_file() => {
                if m.permissions().mode() & 0o7777 != 0o600 {
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                        .map_err(io_err(path, "chmod", &p))?;
                }
            }
            Ok(_) => {
                let why = format!("{} is not a regular file", p.display());
                return Err(StoreError::Corrupt {
                    path: path.into(),
                    why,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(path, "stat", &p)(e)),
        }
    }
    Ok(())
}

/// A read-only connection.
fn open_ro(path: &Path) -> Result<rusqlite::Connection> {
    use rusqlite::OpenFlags as F;
    let flags = F::SQLITE_OPEN_READ_ONLY | F::SQLITE_OPEN_NOFOLLOW | F::SQLITE_OPEN_NO_MUTEX;
    let conn = rusqlite::Connection::open_with_flags(path, flags)
        .map_err(|e| schema::classify(path, e))?;
    schema::pragmas(&conn, path)?;
    conn.execute_batch("PRAGMA query_only = 1")
        .map_err(|e| schema::classify(path, e))?;
    Ok(conn)
}

/// Runs the integrity check unless the last daemon stopped cleanly, then
/// clears that mark. Returns how long the check took, `None` when skipped.
fn check_unclean(conn: &rusqlite::Connection, path: &Path) -> Result<Option<std::time::Duration>> {
    let clean = query::meta(conn, path, CLEAN_SHUTDOWN)?;
    let checked = match &clean {
        Some(at) => {
            tracing::info!(
                db = %path.display(),
                stopped_at = %at,
                "the last stop was clean: integrity check skipped"
            );
            None
        }
        None => {
            let t0 = std::time::Instant::now();
            let verdict: String = conn
                .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
                .map_err(|e| schema::classify(path, e))?;
            if verdict != "ok" {
                return Err(StoreError::Corrupt {
                    path: path.into(),
                    why: verdict,
                });
            }
            let took = t0.elapsed();
            tracing::info!(
                db = %path.display(),
                "the last stop was not clean (or the file is new): integrity check ran in {} ms: ok",
                took.as_millis()
            );
            Some(took)
        }
    };
    writer::set_meta(conn, path, CLEAN_SHUTDOWN, None)?;
    Ok(checked)
}

pub use writer::{CLEAN_SHUTDOWN, STARTS};

impl Store {
    /// Opens (or creates) `<state>/state.db`: refuses a corrupt, foreign or
    /// newer file, migrates, imports an old state dir, starts the writer.
    /// Blocking.
    pub fn open(layout: &StateLayout) -> Result<Store> {
        let path = layout.root.join(DB_FILE);
        let mut conn = open_rw(&path)?;
        schema::pragmas(&conn, &path)?;
        let version = schema::identify(&conn, &path)?;
        // An existing file is checked before a migration rewrites it, and
        // copied first: the previous release cannot read the new schema.
        let mut checked = None;
        if version > 0 {
            checked = check_unclean(&conn, &path)?;
        }
        if version > 0 && version < schema::SCHEMA_VERSION {
            let bak = backup::before_migrating(&conn, &path, version)?;
            tracing::info!(
                db = %path.display(),
                backup = %bak.display(),
                "migrating the state database from schema {version} to {}; \
                 the copy is what the previous release can read",
                schema::SCHEMA_VERSION
            );
        }
        schema::migrate_and_check(&mut conn, &path, version)?;
        schema::writer_pragmas(&conn, &path)?;
        private(&path)?;
        if version == 0 {
            checked = check_unclean(&conn, &path)?;
        }
        import_v1::import(&mut conn, &path, layout)?;
        let starts = writer::count_start(&conn, &path)?;
        let stats = Arc::new(writer::Stats::default());
        let pending = query::notices_pending(&conn, &path)?;
        stats
            .notices_pending
            .store(pending, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = writer::spawn(conn, path.clone(), rx, stats.clone()).map_err(io_err(
            &path,
            "start the writer for",
            &path,
        ))?;
        // A fixed pool opened now: the daemon's fds do not grow with load.
        let readers = (0..READERS)
            .map(|_| open_ro(&path))
            .collect::<Result<Vec<_>>>()?;
        Ok(Store {
            path,
            tx: Mutex::new(Some(tx)),
            writer: Some(writer),
            readers: Mutex::new(readers),
            returned: Condvar::new(),
            stats,
            checked,
            starts,
        })
    }

    /// Opens an existing `state.db` to read only (the CLI, with the daemon
    /// down): no writer, no migration, no import. Blocking.
    pub fn open_read_only(path: &Path) -> Result<Store> {
        std::fs::symlink_metadata(path).map_err(io_err(path, "open", path))?;
        let conn = open_ro(path)?;
        schema::check_read_only(&conn, path)?;
        Ok(Store {
            path: path.to_path_buf(),
            tx: Mutex::new(None),
            writer: None,
            readers: Mutex::new(vec![conn]),
            returned: Condvar::new(),
            stats: Arc::new(writer::Stats::default()),
            checked: None,
            starts: 0,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Groups the writer has committed since open.
    pub fn group_commits(&self) -> u64 {
        self.stats
            .commits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How long the integrity check took when the store was opened;
    /// `None` when the last daemon had stopped cleanly and it was skipped.
    pub fn integrity_checked(&self) -> Option<std::time::Duration> {
        self.checked
    }

    fn send(&self, ops: Vec<Op>) -> Result<tokio::sync::oneshot::Receiver<Result<Out>>> {
        self.send_then(ops, false)
    }

    /// Queues `ops`; with `last`, closes the channel behind them, so they
    /// are the writer's last request.
    fn send_then(
        &self,
        ops: Vec<Op>,
        last: bool,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<Out>>> {
        let closed = || StoreError::Closed {
            path: self.path.clone(),
        };
        let mut guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let tx = guard.as_ref().ok_or_else(closed)?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        tx.send(writer::Req { ops, reply }).map_err(|_| closed())?;
        self.stats
            .sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if last {
            *guard = None;
        }
        Ok(rx)
    }

    /// Records that the daemon stops cleanly ([`CLEAN_SHUTDOWN`]) as the
    /// last write: what was queued before is committed first, and any
    /// commit after is refused ([`StoreError::Closed`]). The next open
    /// then skips the integrity check. After an I/O failure or a damaged
    /// file no mark is written (false): the next start checks. Blocking.
    pub fn close_clean(&self) -> Result<bool> {
        let at = crate::timefmt::rfc3339_ms(crate::timefmt::now_ms());
        let rx = self.send_then(vec![Op::MarkClean { at }], true)?;
        let answer = rx.blocking_recv().unwrap_or_else(|_| {
            Err(StoreError::Closed {
                path: self.path.clone(),
            })
        });
        match answer {
            Ok(_) => Ok(true),
            Err(StoreError::Tainted { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Applies `ops` in one savepoint of the writer's next group, and
    /// answers once that group's COMMIT is done.
    pub async fn commit(&self, ops: Vec<Op>) -> Result<Out> {
        let rx = self.send(ops)?;
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Closed {
                path: self.path.clone(),
            })
        })
    }

    /// [`Store::commit`] for code already on a blocking thread (never
    /// from async code: it blocks until the commit).
    pub fn commit_blocking(&self, ops: Vec<Op>) -> Result<Out> {
        let rx = self.send(ops)?;
        rx.blocking_recv().unwrap_or_else(|_| {
            Err(StoreError::Closed {
                path: self.path.clone(),
            })
        })
    }

    /// Runs `f` on a pooled read-only connection, waiting for one when all
    /// are busy: a connection opened and closed beside the pool would leave
    /// its descriptors with SQLite while the writer holds its locks.
    fn read<T>(&self, f: impl FnOnce(&rusqlite::Connection, &Path) -> Result<T>) -> Result<T> {
        let conn = {
            let mut pool = self.readers.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(c) = pool.pop() {
                    break c;
                }
                pool = self.returned.wait(pool).unwrap_or_else(|p| p.into_inner());
            }
        };
        let lent = Lent {
            store: self,
            conn: Some(conn),
        };
        let conn = lent.conn.as_ref().ok_or_else(|| StoreError::Closed {
            path: self.path.clone(),
        })?;
        let out = f(conn, &self.path);
        if out.as_ref().is_err_and(writer::taints) {
            // Damage a read finds counts as the writer's would.
            self.stats
                .tainted
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        out
    }

    /// The run's record, or that it was pruned. Blocking.
    pub fn get(&self, id: &RunId) -> Result<Option<Stored>> {
        self.read(|c, p| query::get(c, p, id.as_str()))
    }

    /// One page of runs, pruned ones left out. Blocking.
    pub fn list(&self, q: &ListQuery) -> Result<Page> {
        self.read(|c, p| query::list(c, p, q))
    }

    /// Per driver, the runs `q` selects (tombstones included) and the
    /// usage they reported, summed. Blocking.
    pub fn usage(&self, q: &UsageQuery) -> Result<Vec<(String, crate::usage::UsageTotals)>> {
        self.read(|c, p| usage::sums(c, p, q))
    }

    /// Every run recovery must look at: not ended, or ended but not
    /// finalized (pruned ones left out); by id. Blocking.
    pub fn live_runs(&self) -> Result<Vec<RunRecord>> {
        self.read(query::live_runs)
    }

    /// The runner spec of a run that has not ended. Blocking.
    pub fn spec(&self, id: &RunId) -> Result<Option<Vec<u8>>> {
        self.read(|c, p| runs::blob(c, p, "run_specs", "spec", id.as_str()))
    }

    /// The first picture of a run that is not finalized. Blocking.
    pub fn before(&self, id: &RunId) -> Result<Option<Vec<u8>>> {
        self.read(|c, p| runs::blob(c, p, "run_before", "before", id.as_str()))
    }

    /// The context files of a finalized run. Blocking.
    pub fn context(&self, id: &RunId) -> Result<Option<BTreeMap<String, String>>> {
        self.read(|c, p| query::context(c, p, id.as_str()))
    }

    /// The session's state (`None`: no such session yet). Blocking.
    pub fn session(&self, id: &str) -> Result<Option<SessionState>> {
        self.read(|c, p| sessions::read(c, p, id))
    }

    /// Refuses `who` when the session is another uid's. Blocking.
    pub fn may_use(&self, session: &str, who: Option<&policy::rights::Requester>) -> Result<()> {
        match self.read(|c, p| sessions::owner(c, p, session))? {
            Some(o) if !policy::rights::may_act_on(who, o) => Err(StoreError::NotOwned {
                path: self.path.clone(),
                session: session.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Refuses a run for `who` in a session that is not `who`'s. Blocking.
    pub fn may_join(&self, session: &str, who: Option<&policy::rights::Requester>) -> Result<()> {
        let owner = self.read(|c, p| sessions::owner(c, p, session))?;
        if policy::rights::may_join(who, crate::paths::uid(), owner) {
            return Ok(());
        }
        Err(StoreError::NotOwned {
            path: self.path.clone(),
            session: session.to_owned(),
        })
    }

    /// Runs marked for pruning whose removal is not done. Blocking.
    pub fn pending_prunes(&self) -> Result<Vec<Pruning>> {
        self.read(retention::pending)
    }

    /// Every ended, finalized run not pruned, oldest end first. Blocking.
    pub fn retention_candidates(&self) -> Result<Vec<Candidate>> {
        self.read(retention::candidates)
    }

    /// Per session, the ended, finalized runs not pruned: their count and
    /// measured bytes. Blocking.
    pub fn retention_tally(&self) -> Result<Vec<(String, u64, u64)>> {
        self.read(retention::tally)
    }

    /// This open's number among the state dir's daemon starts (kept in
    /// the meta table as `starts`); 0 for a read-only store.
    pub fn starts(&self) -> u64 {
        self.starts
    }

    /// Notices pending (not taken, their run not being pruned), as the
    /// writer counts them: no read of the database.
    pub fn notices_pending(&self) -> u64 {
        let n = self
            .stats
            .notices_pending
            .load(std::sync::atomic::Ordering::Relaxed);
        u64::try_from(n).unwrap_or(0)
    }

    /// One of the store's marks. Blocking.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        self.read(|c, p| query::meta(c, p, key))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // The writer ends when its channel closes, after its last group.
        *self.tx.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}
