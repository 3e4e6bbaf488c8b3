//! The store's one writer: a thread that owns the read-write connection,
//! takes requests from a channel, applies each in a savepoint of one
//! transaction per group and answers only after that group's COMMIT.

use super::error::{Result, StoreError};
use super::ops::Op;
use super::runs::{self, sql};
use crate::protocol::Notice;
use crate::sessions::SessionState;
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

/// Requests taken into one group at most.
const GROUP_MAX: usize = 256;

/// What a request's ops gave back.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Out {
    /// The notices [`Op::TakeNotices`] took, oldest first.
    pub notices: Vec<Notice>,
    /// The session's state after [`Op::Touch`].
    pub session: Option<SessionState>,
    /// How the count of pending notices changed (applied once the group
    /// commits).
    pub(super) pending: i64,
}

/// One request: its ops and where its answer goes.
pub(super) struct Req {
    pub(super) ops: Vec<Op>,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Out>>,
}

/// What the writer has done (read by the tests).
#[derive(Debug, Default)]
pub(super) struct Stats {
    /// Groups committed.
    pub(super) commits: std::sync::atomic::AtomicU64,
    /// Requests answered.
    pub(super) requests: std::sync::atomic::AtomicU64,
    /// Requests sent.
    pub(super) sent: std::sync::atomic::AtomicU64,
    /// Notices pending now (not taken, their run not being pruned): counted
    /// at open, then moved by each committed group, so that reading it
    /// costs nothing whatever the history.
    pub(super) notices_pending: std::sync::atomic::AtomicI64,
    /// Set once a group met an I/O failure or a damaged file: a stop after
    /// that leaves no clean mark, so the next start checks the file.
    pub(super) tainted: std::sync::atomic::AtomicBool,
    /// Held by a test to keep the writer from starting its next group.
    #[cfg(test)]
    pub(super) gate: std::sync::Mutex<()>,
    /// Set by a test: the next group's transaction is gone before its
    /// COMMIT, which then fails.
    #[cfg(test)]
    pub(super) fail_commit: std::sync::atomic::AtomicBool,
}

/// Starts the writer thread over `conn`.
pub(super) fn spawn(
    conn: Connection,
    path: PathBuf,
    rx: Receiver<Req>,
    stats: Arc<Stats>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("store-writer".into())
        .spawn(move || run(&conn, &path, &rx, &stats))
}

/// The loop: a group per wake-up, until every sender is gone.
fn run(conn: &Connection, path: &Path, rx: &Receiver<Req>, stats: &Stats) {
    while let Ok(first) = rx.recv() {
        #[cfg(test)]
        drop(stats.gate.lock().unwrap_or_else(|p| p.into_inner()));
        let mut group = vec![first];
        // What is queued by now joins the group: one COMMIT for all.
        while group.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(r) => group.push(r),
                Err(_) => break,
            }
        }
        let answers = commit_group(conn, path, &mut group, stats);
        if answers.iter().any(|a| a.as_ref().is_err_and(taints)) {
            stats.tainted.store(true, Ordering::SeqCst);
        }
        stats.commits.fetch_add(1, Ordering::Relaxed);
        stats
            .requests
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        for (req, answer) in group.into_iter().zip(answers) {
            // The asker may have gone; its work is committed all the same.
            let _ = req.reply.send(answer);
        }
    }
}

/// The mark a daemon sets when it stops cleanly (`Op::MarkClean`), so that
/// the next start skips the integrity check.
pub const CLEAN_SHUTDOWN: &str = "clean_shutdown";

/// Whether `e` says the file or its disk failed (not a refused request).
pub(super) fn taints(e: &StoreError) -> bool {
    use rusqlite::ErrorCode as C;
    match e {
        StoreError::Commit { .. } | StoreError::Corrupt { .. } | StoreError::Io { .. } => true,
        StoreError::Sql { source, .. } => matches!(
            source.sqlite_error_code(),
            Some(C::SystemIoFailure | C::DatabaseCorrupt | C::NotADatabase | C::DiskFull)
        ),
        _ => false,
    }
}

/// The OS error behind `e`, an I/O failure on `conn` (read-only file
/// system, disk full), read before anything else runs on `conn`.
fn os_errno(conn: &Connection, e: &rusqlite::Error) -> Option<i32> {
    use rusqlite::ErrorCode as C;
    // SQLite keeps the errno of its last I/O failure only: stale otherwise.
    if !matches!(
        e.sqlite_error_code(),
        Some(C::SystemIoFailure | C::CannotOpen | C::DiskFull)
    ) {
        return None;
    }
    // SAFETY: the handle is `conn`'s, open for the whole call, and used on
    // the writer's thread only; sqlite3_system_errno reads one field.
    let n = unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) };
    (n != 0).then_some(n)
}

/// A copy of a commit's error for each request of the group.
fn commit_error(path: &Path, e: &rusqlite::Error, errno: Option<i32>) -> StoreError {
    let source = match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    };
    StoreError::Commit {
        path: path.into(),
        source,
        errno,
    }
}

/// Applies each request in its savepoint of one transaction, commits, and
/// gives each its answer. A request that fails is undone alone; a failed
/// COMMIT (or a statement that rolled the whole transaction back) fails
/// them all.
fn commit_group(
    conn: &Connection,
    path: &Path,
    group: &mut [Req],
    stats: &Stats,
) -> Vec<Result<Out>> {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let errno = os_errno(conn, &e);
        return group
            .iter()
            .map(|_| Err(commit_error(path, &e, errno)))
            .collect();
    }
    let mut answers = Vec::with_capacity(group.len());
    for req in group.iter_mut() {
        let ops = std::mem::take(&mut req.ops);
        // The clean mark is refused after any failure before it, this
        // group's included.
        if matches!(ops.as_slice(), [Op::MarkClean { .. }])
            && (stats.tainted.load(Ordering::SeqCst)
                || answers
                    .iter()
                    .any(|a: &Result<Out>| a.as_ref().is_err_and(taints)))
        {
            answers.push(Err(StoreError::Tainted { path: path.into() }));
            continue;
        }
        let answer = in_savepoint(conn, path, ops);
        if answer.is_err() && conn.is_autocommit() {
            // SQLite rolled the transaction back (disk full, I/O): the
            // group's earlier work is gone too.
            let errno = match &answer {
                Err(StoreError::Sql { source, .. }) => os_errno(conn, source),
                _ => None,
            };
            let lost = rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                Some("the transaction was rolled back".into()),
            );
            // The request's own failure says what the OS said, as a commit's.
            let answer = match answer {
                Err(StoreError::Sql { path, source }) if errno.is_some() => {
                    Err(StoreError::Commit {
                        path,
                        source,
                        errno,
                    })
                }
                a => a,
            };
            let mut out: Vec<Result<Out>> = (0..answers.len())
                .map(|_| Err(commit_error(path, &lost, errno)))
                .collect();
            out.push(answer);
            out.extend((out.len()..group.len()).map(|_| Err(commit_error(path, &lost, errno))));
            return out;
        }
        answers.push(answer);
    }
    #[cfg(test)]
    if stats.fail_commit.swap(false, Ordering::SeqCst) {
        let _ = conn.execute_batch("ROLLBACK");
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        let errno = os_errno(conn, &e);
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        return group
            .iter()
            .map(|_| Err(commit_error(path, &e, errno)))
            .collect();
    }
    let moved: i64 = answers.iter().flatten().map(|o| o.pending).sum();
    stats.notices_pending.fetch_add(moved, Ordering::Relaxed);
    answers
}

/// One request's ops, undone together when one fails.
fn in_savepoint(conn: &Connection, path: &Path, ops: Vec<Op>) -> Result<Out> {
    conn.execute_batch("SAVEPOINT req").map_err(sql(path))?;
    let mut out = Out::default();
    let done = ops
        .into_iter()
        .try_for_each(|op| apply(conn, path, op, &mut out));
    match done {
        Ok(()) => {
            conn.execute_batch("RELEASE req").map_err(sql(path))?;
            Ok(out)
        }
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK TO req; RELEASE req");
            }
            Err(e)
        }
    }
}

fn no_run(path: &Path, id: &str) -> StoreError {
    StoreError::NoRun {
        path: path.into(),
        run_id: id.into(),
    }
}

/// Does one op.
fn apply(conn: &Connection, path: &Path, op: Op, out: &mut Out) -> Result<()> {
    let now = crate::timefmt::now_ms();
    match op {
        Op::Accept {
            rec,
            spec,
            before,
            session,
        } => {
            runs::insert(conn, path, &rec, rec.state(), None, false)?;
            runs::set_usage(conn, path, &rec)?;
            let id = rec.run_id.as_str();
            put_blob(conn, path, "run_specs", "spec", id, &spec)?;
            if let Some(before) = before {
                put_blob(conn, path, "run_before", "before", id, &before)?;
            }
            let owner = runs::owner_uid(&rec);
            let session_id = rec.session_id.as_str();
            super::sessions::on_accept(conn, path, session_id, &session, owner, now)?;
        }
        Op::Started {
            id,
            pid,
            ticks,
            at_ms,
        } => {
            let n = conn
                .execute(
                    "UPDATE runs SET state = 'running', started_at_ms = ?2, runner_pid = ?3,
                     runner_start_ticks = ?4
                     WHERE run_id = ?1 AND end_state IS NULL AND prune_state IS NULL",
                    params![id.as_str(), at_ms, pid, ticks],
                )
                .map_err(sql(path))?;
            if n == 0 {
                return Err(no_run(path, id.as_str()));
            }
        }
        Op::Update(rec) | Op::Reported(rec) => runs::update(conn, path, &rec, false)?,
        Op::Finalize { rec, context } => out.pending += finalize(conn, path, &rec, context)?,
        Op::DirBytes { id, bytes } => {
            let n = conn
                .execute(
                    "UPDATE runs SET dir_bytes = ?2 WHERE run_id = ?1",
                    params![id.as_str(), bytes],
                )
                .map_err(sql(path))?;
            if n == 0 {
                return Err(no_run(path, id.as_str()));
            }
        }
        Op::Reuid { id, uid, spec } => {
            let n = conn
                .execute(
                    "UPDATE runs SET uid = ?2 WHERE run_id = ?1 AND prune_state IS NULL",
                    params![id.as_str(), uid],
                )
                .map_err(sql(path))?;
            if n == 0 {
                return Err(no_run(path, id.as_str()));
            }
            put_blob(conn, path, "run_specs", "spec", id.as_str(), &spec)?;
        }
        Op::TakeNotices { session } => {
            let taken = super::notices::take(conn, path, &session, now)?;
            out.pending -= taken.len() as i64;
            out.notices.extend(taken);
        }
        Op::Touch {
            session,
            files,
            owner_uid,
            requester,
        } => {
            let s =
                super::sessions::touch(conn, path, &session, &files, owner_uid, requester, now)?;
            out.session = Some(s);
        }
        Op::PruneMark { ids, reason } => {
            let gone = super::retention::mark(conn, path, &ids, &reason, now)?;
            out.pending -= gone as i64;
        }
        Op::PruneDone { ids } => super::retention::done(conn, path, &ids, now)?,
        Op::ForgetPruned { before_ms, keep } => {
            super::retention::forget(conn, path, before_ms, keep)?;
        }
        Op::SetMeta { key, value } => set_meta(conn, path, &key, value.as_deref())?,
        Op::MarkClean { at } => set_meta(conn, path, CLEAN_SHUTDOWN, Some(&at))?,
    }
    Ok(())
}

/// The end handled: its state published, its notice made pending once (when
/// finalized), what a live run needed dropped, its context kept. Returns
/// how many notices it made pending (0 or 1).
fn finalize(
    conn: &Connection,
    path: &Path,
    rec: &crate::run::record::RunRecord,
    context: Option<std::collections::BTreeMap<String, String>>,
) -> Result<i64> {
    runs::update(conn, path, rec, true)?;
    let id = rec.run_id.as_str();
    if !rec.finalized() {
        return Ok(0);
    }
    let made = conn
        .execute(
            "UPDATE runs SET notice = 'pending' WHERE run_id = ?1 AND notice IS NULL",
            [id],
        )
        .map_err(sql(path))?;
    for table in ["run_specs", "run_before"] {
        conn.execute(&format!("DELETE FROM {table} WHERE run_id = ?1"), [id])
            .map_err(sql(path))?;
    }
    if let Some(files) = context {
        let text = serde_json::to_string(&files).map_err(|source| StoreError::Json {
            path: path.into(),
            run_id: id.into(),
            what: "context",
            source,
        })?;
        conn.execute(
            "INSERT OR REPLACE INTO run_context (run_id, files) VALUES (?1, ?2)",
            params![id, text],
        )
        .map_err(sql(path))?;
    }
    Ok(made as i64)
}

/// Writes one side table's blob.
pub(super) fn put_blob(
    conn: &Connection,
    path: &Path,
    table: &'static str,
    col: &'static str,
    id: &str,
    bytes: &[u8],
) -> Result<()> {
    conn.execute(
        &format!("INSERT OR REPLACE INTO {table} (run_id, {col}) VALUES (?1, ?2)"),
        params![id, bytes],
    )
    .map_err(sql(path))?;
    Ok(())
}

/// The meta key counting the store's opens for writing: the daemon's
/// starts on this state dir.
pub const STARTS: &str = "starts";

/// Counts one more start in the meta table; returns the count.
pub(super) fn count_start(conn: &Connection, path: &Path) -> Result<u64> {
    let before = super::query::meta(conn, path, STARTS)?;
    let starts = before.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + 1;
    set_meta(conn, path, STARTS, Some(&starts.to_string()))?;
    Ok(starts)
}

/// Sets or removes a mark.
pub(super) fn set_meta(
    conn: &Connection,
    path: &Path,
    key: &str,
    value: Option<&str>,
) -> Result<()> {
    match value {
        Some(v) => conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
            params![key, v],
        ),
        None => conn.execute("DELETE FROM meta WHERE key = ?1", [key]),
    }
    .map_err(sql(path))?;
    Ok(())
}
