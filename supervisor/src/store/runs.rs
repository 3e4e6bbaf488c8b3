//! A run's record as rows: the small `runs` row, the accept-time details
//! and the end's reports, and back.
//!
//! The record's flat wire form ([`RecordV1`]) is the go-between, so a row
//! is checked as a run.json is (a running row without its pid fails).

use super::error::{Result, StoreError};
use crate::ids::{RunId, SessionId};
use crate::run::record::{RecordV1, RunRecord, RunState};
use policy::{Audience, Limits};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The accept-time part of a record (`run_details.accepted`), written once.
#[derive(Serialize, Deserialize)]
struct Details {
    format: u32,
    audience: Audience,
    project_dir: PathBuf,
    task: String,
    context: Option<String>,
    command: Vec<String>,
    env: BTreeMap<String, String>,
    limits: Limits,
    #[serde(default)]
    sandbox: policy::sandbox::SandboxRequest,
    agent: Option<String>,
    tools: Option<Vec<String>>,
    rights: Option<policy::sandbox::Grants>,
    git: Option<policy::workctx::GitSnapshot>,
    worktree: Option<crate::run::worktree::Worktree>,
    max_attempts: u32,
    on_behalf: Option<policy::rights::OnBehalf>,
    network: Option<policy::sandbox::network::NetworkMode>,
    #[serde(default)]
    network_allow: Vec<String>,
}

/// What changes after accept and is large (`run_ends.end`): the end's
/// reports and the notes.
#[derive(Default, Serialize, Deserialize)]
struct EndJson {
    isolation: Option<subagent_runner::sandbox::report::IsolationReport>,
    resources: Option<subagent_runner::exit_record::Resources>,
    kept: Option<subagent_runner::exit_record::Kept>,
    attempts: Option<u32>,
    egress: Option<crate::run::egress::EgressSummary>,
    delta: Option<crate::run::delta::DeltaReport>,
    observed: Option<policy::observed::ObservedReport>,
    #[serde(default)]
    notes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backend: Option<crate::run::placement::Placement>,
}

/// The columns a record is read from, in [`from_row`]'s order.
pub(super) const SELECT: &str = "SELECT r.run_id, r.session_id, r.state, r.end_state,
    r.created_at_ms, r.started_at_ms, r.ended_at_ms, r.runner_pid, r.runner_start_ticks,
    r.exit_code, r.signal, r.reason, r.cancel_requested, r.log_truncated, r.finalized,
    r.finalize_error, r.uid, r.run_dir, r.temp_dir, r.keep_temp, d.accepted, e.end, e.driver,
    r.prune_state, r.pruned_at_ms, r.prune_reason, r.owner_uid
    FROM runs r LEFT JOIN run_details d ON d.run_id = r.run_id
    LEFT JOIN run_ends e ON e.run_id = r.run_id";

/// The owner a run's row records: the requester it ran for, else the
/// daemon's uid.
pub(super) fn owner_uid(rec: &RunRecord) -> u32 {
    let recorded = rec.on_behalf.as_ref().map(|ob| ob.requester.uid);
    policy::rights::recorded_owner(recorded, crate::paths::uid())
}

fn text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn json<T: Serialize>(path: &Path, id: &str, what: &'static str, v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|source| StoreError::Json {
        path: path.into(),
        run_id: id.into(),
        what,
        source,
    })
}

pub(super) fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Sql {
        path: path.into(),
        source,
    }
}

/// The record split into its parts (`details` only when asked for: it is
/// written once, at accept).
struct Parts {
    w: RecordV1,
    details: Option<String>,
    end: String,
    driver: Option<String>,
}

fn details_of(w: &RecordV1) -> Details {
    Details {
        format: w.format,
        audience: w.audience,
        project_dir: w.project_dir.clone(),
        task: w.task.clone(),
        context: w.context.clone(),
        command: w.command.clone(),
        env: w.env.clone(),
        limits: w.limits,
        sandbox: w.sandbox.clone(),
        agent: w.agent.clone(),
        tools: w.tools.clone(),
        rights: w.rights,
        git: w.git.clone(),
        worktree: w.worktree.clone(),
        max_attempts: w.max_attempts,
        on_behalf: w.on_behalf.clone(),
        network: w.network,
        network_allow: w.network_allow.clone(),
    }
}

fn parts(path: &Path, rec: &RunRecord, with_details: bool) -> Result<Parts> {
    let w = RecordV1::from(rec.clone());
    let id = w.run_id.to_string();
    let end = EndJson {
        isolation: w.isolation.clone(),
        resources: w.resources.clone(),
        kept: w.kept.clone(),
        attempts: w.attempts,
        egress: w.egress.clone(),
        delta: w.delta.clone(),
        observed: w.observed.clone(),
        notes: w.notes.clone(),
        backend: w.backend,
    };
    let details = match with_details {
        true => Some(json(path, &id, "details", &details_of(&w))?),
        false => None,
    };
    let end = json(path, &id, "end", &end)?;
    let driver = match &w.driver_run {
        Some(d) => Some(json(path, &id, "driver", d)?),
        None => None,
    };
    Ok(Parts {
        w,
        details,
        end,
        driver,
    })
}

/// Inserts a run's row, details and end (`or_ignore`: a row already there
/// is kept, for the import). `published` is the `state` column; `notice`
/// its notice column. Returns whether the row was new.
pub(super) fn insert(
    conn: &Connection,
    path: &Path,
    rec: &RunRecord,
    published: RunState,
    notice: Option<&str>,
    or_ignore: bool,
) -> Result<bool> {
    let p = parts(path, rec, true)?;
    let w = &p.w;
    let verb = if or_ignore {
        "INSERT OR IGNORE"
    } else {
        "INSERT"
    };
    let end_state = w.state.is_terminal().then(|| w.state.as_str());
    let n = conn
        .execute(
            &format!(
                "{verb} INTO runs (run_id, session_id, owner_uid, state, end_state,
                 created_at_ms, started_at_ms, ended_at_ms, runner_pid, runner_start_ticks,
                 exit_code, signal, reason, cancel_requested, log_truncated, finalized,
                 finalize_error, uid, run_dir, temp_dir, keep_temp, worktree_dir, notice)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
                 ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)"
            ),
            params![
                w.run_id.as_str(),
                w.session_id.as_str(),
                owner_uid(rec),
                published.as_str(),
                end_state,
                w.created_at_ms,
                w.started_at_ms,
                w.ended_at_ms,
                w.runner_pid,
                w.runner_start_ticks,
                w.exit_code,
                w.signal,
                w.reason,
                w.cancel_requested,
                w.log_truncated,
                w.finalized,
                w.finalize_error,
                w.uid,
                text(&w.run_dir),
                text(&w.temp_dir),
                w.keep_temp,
                w.worktree.as_ref().map(|t| text(&t.dir)),
                notice,
            ],
        )
        .map_err(sql(path))?;
    if n == 0 {
        return Ok(false);
    }
    let id = w.run_id.as_str();
    conn.execute(
        "INSERT INTO run_details (run_id, accepted) VALUES (?1, ?2)",
        params![id, p.details],
    )
    .map_err(sql(path))?;
    conn.execute(
        "INSERT INTO run_ends (run_id, end, driver) VALUES (?1, ?2, ?3)",
        params![id, p.end, p.driver],
    )
    .map_err(sql(path))?;
    Ok(true)
}

/// A run's driver and the usage its agent reported, as `runs` keeps them
/// (schema version 3) to be summed without reading JSON.
struct UsageCols {
    driver: Option<&'static str>,
    turns: Option<i64>,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    cost_usd: Option<f64>,
}

impl UsageCols {
    fn of(rec: &RunRecord) -> UsageCols {
        let d = rec.driver_run.as_ref();
        let u = d
            .and_then(|d| d.report.as_ref())
            .map(|r| r.usage())
            .unwrap_or_default();
        // Figures are at most 2^40 (policy::usage::MAX_COUNT).
        let n = |v: Option<u64>| v.and_then(|v| i64::try_from(v).ok());
        UsageCols {
            driver: d.map(|d| d.driver.as_str()),
            turns: n(u.turns),
            input_tokens: n(u.input_tokens),
            output_tokens: n(u.output_tokens),
            cost_usd: u.cost_usd,
        }
    }
}

/// Writes a new row's driver and usage columns (after [`insert`], which
/// writes a version-1 row's columns only).
pub(super) fn set_usage(conn: &Connection, path: &Path, rec: &RunRecord) -> Result<()> {
    let u = UsageCols::of(rec);
    conn.execute(
        "UPDATE runs SET driver = ?2, turns = ?3, input_tokens = ?4, output_tokens = ?5,
         cost_usd = ?6 WHERE run_id = ?1",
        params![
            rec.run_id.as_str(),
            u.driver,
            u.turns,
            u.input_tokens,
            u.output_tokens,
            u.cost_usd
        ],
    )
    .map_err(sql(path))?;
    Ok(())
}

/// Rewrites what may change of a run: its scalars and its end. An ended
/// record goes to `end_state`; `state` is set only when `publish`, or while
/// the record has not ended.
pub(super) fn update(conn: &Connection, path: &Path, rec: &RunRecord, publish: bool) -> Result<()> {
    let p = parts(path, rec, false)?;
    let w = &p.w;
    let u = UsageCols::of(rec);
    let ended = w.state.is_terminal();
    let published = (publish || !ended).then(|| w.state.as_str());
    let n = conn
        .execute(
            "UPDATE runs SET state = coalesce(?2, state), end_state = ?3,
             started_at_ms = ?4, ended_at_ms = ?5, runner_pid = ?6, runner_start_ticks = ?7,
             exit_code = ?8, signal = ?9, reason = ?10, cancel_requested = ?11,
             log_truncated = ?12, finalized = ?13, finalize_error = ?14, uid = ?15,
             keep_temp = ?16, worktree_dir = ?17, driver = ?18, turns = ?19,
             input_tokens = ?20, output_tokens = ?21, cost_usd = ?22
             WHERE run_id = ?1 AND prune_state IS NULL",
            params![
                w.run_id.as_str(),
                published,
                ended.then(|| w.state.as_str()),
                w.started_at_ms,
                w.ended_at_ms,
                w.runner_pid,
                w.runner_start_ticks,
                w.exit_code,
                w.signal,
                w.reason,
                w.cancel_requested,
                w.log_truncated,
                w.finalized,
                w.finalize_error,
                w.uid,
                w.keep_temp,
                w.worktree.as_ref().map(|t| text(&t.dir)),
                u.driver,
                u.turns,
                u.input_tokens,
                u.output_tokens,
                u.cost_usd,
            ],
        )
        .map_err(sql(path))?;
    if n == 0 {
        return Err(StoreError::NoRun {
            path: path.into(),
            run_id: w.run_id.to_string(),
        });
    }
    conn.execute(
        "INSERT OR REPLACE INTO run_ends (run_id, end, driver) VALUES (?1, ?2, ?3)",
        params![w.run_id.as_str(), p.end, p.driver],
    )
    .map_err(sql(path))?;
    Ok(())
}

/// What a row holds: a record, or that it was pruned.
pub(super) enum RowOf {
    Live(Box<RunRecord>),
    Pruned {
        at_ms: u64,
        reason: String,
        owner_uid: u32,
    },
}

fn parse<'a, T: Deserialize<'a>>(
    path: &Path,
    id: &str,
    what: &'static str,
    s: &'a str,
) -> Result<T> {
    serde_json::from_str(s).map_err(|source| StoreError::Json {
        path: path.into(),
        run_id: id.into(),
        what,
        source,
    })
}

/// The raw columns of [`SELECT`].
struct Cols {
    run_id: String,
    session_id: String,
    state: String,
    end_state: Option<String>,
    times: (u64, Option<u64>, Option<u64>),
    runner: (Option<i32>, Option<u64>),
    exit: (Option<i32>, Option<i32>),
    reason: Option<String>,
    flags: (bool, bool, bool, bool),
    finalize_error: Option<String>,
    uid: Option<u32>,
    dirs: (String, String),
    details: Option<String>,
    end: Option<String>,
    driver: Option<String>,
    prune: (Option<String>, Option<u64>, Option<String>),
    owner_uid: u32,
}

fn cols(r: &Row<'_>) -> rusqlite::Result<Cols> {
    Ok(Cols {
        run_id: r.get(0)?,
        session_id: r.get(1)?,
        state: r.get(2)?,
        end_state: r.get(3)?,
        times: (r.get(4)?, r.get(5)?, r.get(6)?),
        runner: (r.get(7)?, r.get(8)?),
        exit: (r.get(9)?, r.get(10)?),
        reason: r.get(11)?,
        flags: (r.get(12)?, r.get(13)?, r.get(14)?, r.get(19)?),
        finalize_error: r.get(15)?,
        uid: r.get(16)?,
        dirs: (r.get(17)?, r.get(18)?),
        details: r.get(20)?,
        end: r.get(21)?,
        driver: r.get(22)?,
        prune: (r.get(23)?, r.get(24)?, r.get(25)?),
        owner_uid: r.get(26)?,
    })
}

/// A row of [`SELECT`] as what it holds.
pub(super) fn from_row(path: &Path, r: &Row<'_>) -> Result<RowOf> {
    let c = cols(r).map_err(sql(path))?;
    if let (Some(_), at_ms, reason) = &c.prune {
        return Ok(RowOf::Pruned {
            at_ms: at_ms.unwrap_or(0),
            reason: reason.clone().unwrap_or_default(),
            owner_uid: c.owner_uid,
        });
    }
    let id = c.run_id.as_str();
    let bad = |why: String| StoreError::Corrupt {
        path: path.into(),
        why: format!("run {id}: {why}"),
    };
    let details: Details = parse(path, id, "details", c.details.as_deref().unwrap_or("null"))?;
    let end: EndJson = match c.end.as_deref() {
        Some(s) => parse(path, id, "end", s)?,
        None => EndJson::default(),
    };
    let driver_run = match c.driver.as_deref() {
        Some(s) => Some(parse(path, id, "driver", s)?),
        None => None,
    };
    let state_name = c.end_state.as_deref().unwrap_or(&c.state);
    let state = RunState::parse(state_name).ok_or_else(|| bad(format!("state {state_name:?}")))?;
    let w = RecordV1 {
        format: details.format,
        run_id: RunId::parse(id).ok_or_else(|| bad("malformed run id".into()))?,
        session_id: SessionId::parse(&c.session_id).map_err(|e| bad(format!("session id: {e}")))?,
        audience: details.audience,
        project_dir: details.project_dir,
        task: details.task,
        context: details.context,
        command: details.command,
        env: details.env,
        limits: details.limits,
        keep_temp: c.flags.3,
        state,
        exit_code: c.exit.0,
        signal: c.exit.1,
        reason: c.reason,
        cancel_requested: c.flags.0,
        created_at_ms: c.times.0,
        started_at_ms: c.times.1,
        ended_at_ms: c.times.2,
        temp_dir: c.dirs.1.into(),
        run_dir: c.dirs.0.into(),
        runner_pid: c.runner.0,
        runner_start_ticks: c.runner.1,
        log_truncated: c.flags.1,
        finalized: c.flags.2,
        finalize_error: c.finalize_error,
        sandbox: details.sandbox,
        isolation: end.isolation,
        resources: end.resources,
        agent: details.agent,
        tools: details.tools,
        rights: details.rights,
        git: details.git,
        worktree: details.worktree,
        delta: end.delta,
        observed: end.observed,
        max_attempts: details.max_attempts,
        attempts: end.attempts,
        kept: end.kept,
        uid: c.uid,
        on_behalf: details.on_behalf,
        network: details.network,
        network_allow: details.network_allow,
        egress: end.egress,
        notes: end.notes,
        driver_run,
        backend: end.backend,
    };
    let rec = RunRecord::try_from(w).map_err(|source| StoreError::Record {
        path: path.into(),
        run_id: c.run_id.clone(),
        source,
    })?;
    Ok(RowOf::Live(Box::new(rec)))
}

/// The run with this id, as its row holds it.
pub(super) fn load(conn: &Connection, path: &Path, id: &str) -> Result<Option<RowOf>> {
    let mut st = conn
        .prepare_cached(&format!("{SELECT} WHERE r.run_id = ?1"))
        .map_err(sql(path))?;
    let mut rows = st.query([id]).map_err(sql(path))?;
    match rows.next().map_err(sql(path))? {
        Some(r) => from_row(path, r).map(Some),
        None => Ok(None),
    }
}

/// The records of every row `sql_tail` (after [`SELECT`]) selects with
/// `args`, pruned ones left out.
pub(super) fn records(
    conn: &Connection,
    path: &Path,
    sql_tail: &str,
    args: &[&dyn rusqlite::ToSql],
) -> Result<Vec<RunRecord>> {
    let mut st = conn
        .prepare_cached(&format!("{SELECT} {sql_tail}"))
        .map_err(sql(path))?;
    let mut rows = st.query(args).map_err(sql(path))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(sql(path))? {
        if let RowOf::Live(rec) = from_row(path, r)? {
            out.push(*rec);
        }
    }
    Ok(out)
}

/// One blob column of a side table, by run id.
pub(super) fn blob(
    conn: &Connection,
    path: &Path,
    table: &'static str,
    col: &'static str,
    id: &str,
) -> Result<Option<Vec<u8>>> {
    conn.query_row(
        &format!("SELECT {col} FROM {table} WHERE run_id = ?1"),
        [id],
        |r| r.get(0),
    )
    .optional()
    .map_err(sql(path))
}
