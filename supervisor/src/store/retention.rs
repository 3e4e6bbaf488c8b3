//! What retention reads from the store: the runs it may prune, and the
//! runs whose pruning a crash interrupted.

use super::error::Result;
use super::runs::sql;
use crate::ids::RunId;
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};

/// An ended, finalized run that is not pruned: what retention weighs.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub run_id: RunId,
    pub session_id: String,
    pub owner_uid: u32,
    pub ended_at_ms: u64,
    /// The run folder's size after its cleanup (0 when not measured).
    pub dir_bytes: u64,
    /// Its notice has not been taken.
    pub notice_pending: bool,
    /// Its worktree, when it had one.
    pub worktree_dir: Option<PathBuf>,
}

/// A run marked for pruning whose folder may still be there.
#[derive(Debug, Clone, PartialEq)]
pub struct Pruning {
    pub run_id: RunId,
    pub session_id: String,
    pub run_dir: PathBuf,
}

/// Every ended, finalized run not pruned, oldest end first.
pub(super) fn candidates(conn: &Connection, path: &Path) -> Result<Vec<Candidate>> {
    let mut st = conn
        .prepare_cached(
            "SELECT run_id, session_id, owner_uid, ended_at_ms, coalesce(dir_bytes, 0),
             notice = 'pending', worktree_dir FROM runs
             WHERE ended_at_ms IS NOT NULL AND prune_state IS NULL AND finalized = 1
             ORDER BY ended_at_ms, run_id",
        )
        .map_err(sql(path))?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, u32>(2)?,
                r.get::<_, u64>(3)?,
                r.get::<_, u64>(4)?,
                r.get::<_, Option<bool>>(5)?,
                r.get::<_, Option<String>>(6)?,
            ))
        })
        .map_err(sql(path))?;
    let mut out = Vec::new();
    for row in rows {
        let (id, session_id, owner_uid, ended_at_ms, dir_bytes, pending, wt) =
            row.map_err(sql(path))?;
        let Some(run_id) = RunId::parse(&id) else {
            continue;
        };
        out.push(Candidate {
            run_id,
            session_id,
            owner_uid,
            ended_at_ms,
            dir_bytes,
            notice_pending: pending.unwrap_or(false),
            worktree_dir: wt.map(PathBuf::from),
        });
    }
    Ok(out)
}

/// Per session: how many ended, finalized runs are not pruned, and their
/// folders' measured bytes (what retention's limits count).
pub(super) fn tally(conn: &Connection, path: &Path) -> Result<Vec<(String, u64, u64)>> {
    let mut st = conn
        .prepare_cached(
            "SELECT session_id, count(*), coalesce(sum(dir_bytes), 0) FROM runs
             WHERE ended_at_ms IS NOT NULL AND prune_state IS NULL AND finalized = 1
             GROUP BY session_id",
        )
        .map_err(sql(path))?;
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .map_err(sql(path))?;
    rows.map(|r| r.map_err(sql(path))).collect()
}

/// Runs marked for pruning whose removal is not done, by id.
pub(super) fn pending(conn: &Connection, path: &Path) -> Result<Vec<Pruning>> {
    let mut st = conn
        .prepare_cached(
            "SELECT run_id, session_id, run_dir FROM runs
             WHERE (state IN ('accepted', 'running') OR finalized = 0
                    OR prune_state = 'pruning')
             AND prune_state = 'pruning' ORDER BY run_id",
        )
        .map_err(sql(path))?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .map_err(sql(path))?;
    let mut out = Vec::new();
    for row in rows {
        let (id, session_id, dir) = row.map_err(sql(path))?;
        if let Some(run_id) = RunId::parse(&id) {
            out.push(Pruning {
                run_id,
                session_id,
                run_dir: dir.into(),
            });
        }
    }
    Ok(out)
}

/// Marks `ids` as being pruned for `reason`; a run that is not ended and
/// finalized is never marked. Returns how many of those marked had a
/// pending notice (gone with them).
pub(super) fn mark(
    conn: &Connection,
    path: &Path,
    ids: &[RunId],
    reason: &str,
    now: u64,
) -> Result<u64> {
    let mut st = conn
        .prepare_cached(
            "UPDATE runs SET prune_state = 'pruning', prune_reason = ?2, pruned_at_ms = ?3
             WHERE run_id = ?1 AND prune_state IS NULL AND finalized = 1
             AND state NOT IN ('accepted', 'running')
             RETURNING notice = 'pending'",
        )
        .map_err(sql(path))?;
    let mut pending = 0;
    for id in ids {
        let mut rows = st
            .query(params![id.as_str(), reason, now])
            .map_err(sql(path))?;
        if let Some(row) = rows.next().map_err(sql(path))? {
            if row.get::<_, Option<bool>>(0).map_err(sql(path))? == Some(true) {
                pending += 1;
            }
        }
    }
    Ok(pending)
}

/// `ids`' folders are gone: each row becomes a tombstone.
pub(super) fn done(conn: &Connection, path: &Path, ids: &[RunId], now: u64) -> Result<()> {
    for id in ids {
        let n = conn
            .execute(
                "UPDATE runs SET prune_state = 'pruned', pruned_at_ms = ?2
                 WHERE run_id = ?1 AND prune_state = 'pruning'",
                params![id.as_str(), now],
            )
            .map_err(sql(path))?;
        if n == 0 {
            continue;
        }
        for table in [
            "run_details",
            "run_ends",
            "run_specs",
            "run_context",
            "run_before",
        ] {
            conn.execute(
                &format!("DELETE FROM {table} WHERE run_id = ?1"),
                [id.as_str()],
            )
            .map_err(sql(path))?;
        }
    }
    Ok(())
}

/// Forgets tombstones pruned before `before_ms`, then all but the newest
/// `keep`; both read the tombstones' own index, so the cost is the
/// tombstones', never the live runs'.
pub(super) fn forget(conn: &Connection, path: &Path, before_ms: u64, keep: u64) -> Result<()> {
    conn.execute(
        "DELETE FROM runs WHERE prune_state = 'pruned' AND pruned_at_ms < ?1",
        [before_ms],
    )
    .map_err(sql(path))?;
    conn.execute(
        &format!("DELETE FROM runs WHERE run_id IN ({OVER_KEEP})"),
        [i64::try_from(keep).unwrap_or(i64::MAX)],
    )
    .map_err(sql(path))?;
    Ok(())
}

/// The tombstones beyond the newest `?1`.
pub(super) const OVER_KEEP: &str = "SELECT run_id FROM runs WHERE prune_state = 'pruned'
    ORDER BY pruned_at_ms DESC, run_id DESC LIMIT -1 OFFSET ?1";
