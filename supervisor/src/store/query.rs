//! The store's reads: a run by id, a page of a list, the runs recovery
//! looks at.
//!
//! A list is one SQL statement over the indexes: its cost depends on the
//! page, not on how many runs the store holds.

use super::error::Result;
use super::ops::{ListQuery, Page, Stored};
use super::runs::{self, RowOf};
use crate::run::record::RunRecord;
use rusqlite::{Connection, OptionalExtension, ToSql};
use std::collections::BTreeMap;
use std::path::Path;

/// The run's record, or that it was pruned.
pub(super) fn get(conn: &Connection, path: &Path, id: &str) -> Result<Option<Stored>> {
    Ok(runs::load(conn, path, id)?.map(|row| match row {
        RowOf::Live(rec) => Stored::Live(rec),
        RowOf::Pruned {
            at_ms,
            reason,
            owner_uid,
        } => Stored::Pruned {
            at_ms,
            reason,
            owner_uid,
        },
    }))
}

/// Sorts after every run id (whose first byte is a digit).
pub(super) const AFTER_EVERY_ID: &str = ":";

/// The start of the ids of runs accepted at `ms` (ms since the epoch):
/// every id accepted at or after it sorts at or after this text. `None`
/// past the year 9999, where the ids' four-digit years end.
pub(super) fn id_prefix(ms: u64) -> Option<String> {
    let ((y, mo, d), (h, mi, s)) = crate::timefmt::civil(ms / 1000);
    (0..=9999)
        .contains(&y)
        .then(|| format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}.{:03}", ms % 1000))
}

/// The SQL after the columns, and its arguments, for `q` (one more row
/// than the page, to tell whether there is a next).
pub(super) fn list_sql(q: &ListQuery) -> (String, Vec<Box<dyn ToSql>>) {
    let mut sql = String::from("WHERE r.prune_state IS NULL");
    let mut args: Vec<Box<dyn ToSql>> = Vec::new();
    let mut and = |cond: &str, v: Box<dyn ToSql>, args: &mut Vec<Box<dyn ToSql>>| {
        args.push(v);
        sql.push_str(&format!(" AND {cond} ?{}", args.len()));
    };
    // With a session, its index must lead: a unary `+` keeps the planner
    // off runs_state and runs_owner, whose ranges grow with all history.
    let plus = if q.session.is_some() { "+" } else { "" };
    if let Some(s) = &q.session {
        and("r.session_id =", Box::new(s.clone()), &mut args);
    }
    if let Some(s) = q.state {
        and(&format!("{plus}r.state ="), Box::new(s.as_str()), &mut args);
    }
    if let Some(u) = q.owner_uid {
        and(&format!("{plus}r.owner_uid ="), Box::new(u), &mut args);
    }
    // Run ids begin with their accept time: a time range is an id range,
    // read from the same index as the rest of the list.
    if let Some(t) = q.since_ms {
        let lo = id_prefix(t).unwrap_or_else(|| AFTER_EVERY_ID.to_owned());
        and("r.run_id >=", Box::new(lo), &mut args);
    }
    if let Some(hi) = q.until_ms.and_then(|t| id_prefix(t.saturating_add(1))) {
        and("r.run_id <", Box::new(hi), &mut args);
    }
    if let Some(after) = &q.after {
        let cmp = if q.desc { "r.run_id <" } else { "r.run_id >" };
        and(cmp, Box::new(after.to_string()), &mut args);
    }
    let order = if q.desc { "DESC" } else { "ASC" };
    args.push(Box::new(q.limit.saturating_add(1) as i64));
    sql.push_str(&format!(" ORDER BY r.run_id {order} LIMIT ?{}", args.len()));
    (sql, args)
}

/// One page of runs, in run id order.
pub(super) fn list(conn: &Connection, path: &Path, q: &ListQuery) -> Result<Page> {
    if q.limit == 0 {
        return Ok(Page {
            runs: Vec::new(),
            next: None,
        });
    }
    let (tail, args) = list_sql(q);
    let refs: Vec<&dyn ToSql> = args.iter().map(|a| a.as_ref()).collect();
    let mut got = runs::records(conn, path, &tail, &refs)?;
    let next = if got.len() > q.limit {
        got.truncate(q.limit);
        got.last().map(|r| r.run_id.clone())
    } else {
        None
    };
    Ok(Page { runs: got, next })
}

/// The runs recovery looks at (not ended, or not finalized), by id; read
/// through the partial index of exactly that set.
pub(super) fn live_runs(conn: &Connection, path: &Path) -> Result<Vec<RunRecord>> {
    runs::records(
        conn,
        path,
        "WHERE (r.state IN ('accepted', 'running') OR r.finalized = 0
                OR r.prune_state = 'pruning')
         AND r.prune_state IS NULL ORDER BY r.run_id",
        &[],
    )
}

/// The notices a take could return, of every session: read once, at
/// open (the writer keeps the count from then on).
pub(super) fn notices_pending(conn: &Connection, path: &Path) -> Result<i64> {
    conn.query_row(
        "SELECT count(*) FROM runs WHERE notice = 'pending' AND prune_state IS NULL",
        [],
        |r| r.get(0),
    )
    .map_err(runs::sql(path))
}

/// One of the store's marks.
pub(super) fn meta(conn: &Connection, path: &Path, key: &str) -> Result<Option<String>> {
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
        .map_err(runs::sql(path))
}

/// A finalized run's context files.
pub(super) fn context(
    conn: &Connection,
    path: &Path,
    id: &str,
) -> Result<Option<BTreeMap<String, String>>> {
    let text: Option<String> = conn
        .query_row(
            "SELECT files FROM run_context WHERE run_id = ?1",
            [id],
            |r| r.get(0),
        )
        .optional()
        .map_err(runs::sql(path))?;
    let Some(text) = text else { return Ok(None) };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| super::error::StoreError::Json {
            path: path.into(),
            run_id: id.into(),
            what: "context",
            source,
        })
}
