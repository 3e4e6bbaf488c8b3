//! Finished-run notices as a column of the run's row: taken once, oldest
//! first.
//!
//! A run's notice is the `notice` column of its row: NULL until its end is
//! handled, then `pending` (set once, by the finalize commit), then
//! `taken`. The notice itself is made from the row.

use super::error::Result;
use super::runs::sql;
use crate::protocol::Notice;
use crate::run::record::RunState;
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};

/// Takes every pending notice of `session`, oldest end first: each is
/// marked taken in the same statement that returns it, so no other take
/// returns it again once this one's group commits. A run being pruned
/// gives none: its result.md is going.
pub(super) fn take(conn: &Connection, path: &Path, session: &str, now: u64) -> Result<Vec<Notice>> {
    let mut st = conn
        .prepare_cached(
            "UPDATE runs SET notice = 'taken', notice_taken_at_ms = ?2
             WHERE session_id = ?1 AND notice = 'pending' AND prune_state IS NULL
             RETURNING run_id, session_id, state, run_dir, ended_at_ms",
        )
        .map_err(sql(path))?;
    let rows = st
        .query_map(params![session, now], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<u64>>(4)?,
            ))
        })
        .map_err(sql(path))?;
    let mut taken = Vec::new();
    for row in rows {
        let (run_id, session_id, state, dir, ended) = row.map_err(sql(path))?;
        let ended = ended.unwrap_or(0);
        let notice = Notice {
            run_id,
            session_id,
            state: RunState::parse(&state).unwrap_or(RunState::Lost),
            result_path: crate::paths::RunFiles {
                dir: PathBuf::from(dir),
            }
            .result(),
            ended_at: crate::timefmt::rfc3339_ms(ended),
        };
        taken.push((ended, notice));
    }
    // RETURNING has no order of its own.
    taken.sort_by(|a, b| (a.0, &a.1.run_id).cmp(&(b.0, &b.1.run_id)));
    Ok(taken.into_iter().map(|(_, n)| n).collect())
}
