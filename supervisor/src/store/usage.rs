//! Usage summed: the runs a query selects, counted and their figures
//! added in SQL, per driver, from the columns each run's end wrote
//! (schema version 3). With a session, one range of `runs_usage`, an index
//! that holds every figure: the cost is the session's runs. Tombstones
//! count (what a pruned run spent was spent) until they are forgotten.

use super::error::Result;
use super::ops::UsageQuery;
use super::query::{id_prefix, AFTER_EVERY_ID};
use super::runs::sql;
use crate::usage::UsageTotals;
use rusqlite::{Connection, ToSql};
use std::path::Path;

/// The statement summing what `q` selects, per driver, and its arguments.
pub(super) fn sums_sql(q: &UsageQuery) -> (String, Vec<Box<dyn ToSql>>) {
    let mut sql = String::from(
        "SELECT coalesce(driver, 'command'), count(*),
         count(coalesce(turns, input_tokens, output_tokens, cost_usd)),
         sum(turns), sum(input_tokens), sum(output_tokens), sum(cost_usd)
         FROM runs WHERE 1",
    );
    let mut args: Vec<Box<dyn ToSql>> = Vec::new();
    let mut and = |cond: &str, v: Box<dyn ToSql>, args: &mut Vec<Box<dyn ToSql>>| {
        args.push(v);
        sql.push_str(&format!(" AND {cond} ?{}", args.len()));
    };
    if let Some(s) = &q.session {
        and("session_id =", Box::new(s.clone()), &mut args);
    }
    // A unary `+`: the owner filters the range, it never picks the index.
    if let Some(u) = q.owner_uid {
        and("+owner_uid =", Box::new(u), &mut args);
    }
    if let Some(t) = q.since_ms {
        let lo = id_prefix(t).unwrap_or_else(|| AFTER_EVERY_ID.to_owned());
        and("run_id >=", Box::new(lo), &mut args);
    }
    if let Some(hi) = q.until_ms.and_then(|t| id_prefix(t.saturating_add(1))) {
        and("run_id <", Box::new(hi), &mut args);
    }
    sql.push_str(" GROUP BY 1 ORDER BY 1");
    (sql, args)
}

/// Per driver (by name), the runs `q` selects and their figures summed.
pub(super) fn sums(
    conn: &Connection,
    path: &Path,
    q: &UsageQuery,
) -> Result<Vec<(String, UsageTotals)>> {
    let (text, args) = sums_sql(q);
    let refs: Vec<&dyn ToSql> = args.iter().map(|a| a.as_ref()).collect();
    let mut st = conn.prepare_cached(&text).map_err(sql(path))?;
    let rows = st
        .query_map(&refs[..], |r| {
            let n = |i: usize| -> rusqlite::Result<Option<u64>> {
                Ok(r.get::<_, Option<i64>>(i)?
                    .map(|v| u64::try_from(v).unwrap_or(0)))
            };
            let driver: String = r.get(0)?;
            let totals = UsageTotals {
                runs: n(1)?.unwrap_or(0),
                reported: n(2)?.unwrap_or(0),
                turns: n(3)?,
                input_tokens: n(4)?,
                output_tokens: n(5)?,
                cost_usd: r.get(6)?,
            };
            Ok((driver, totals))
        })
        .map_err(sql(path))?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql(path))
}
