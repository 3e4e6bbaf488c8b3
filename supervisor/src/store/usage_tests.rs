//! The store's usage: the columns a run's end writes, the version 3
//! migration that fills them from version 2's ended runs, and the sums.

use super::tests::{accept, id_ms, layout, prune_now, rec, succeeded};
use super::*;
use crate::run::driver::{Delivery, DriverRun};
use crate::run::record::RecordV1;
use crate::usage::UsageTotals;
use policy::agentstream::AgentReport;
use policy::driver::Driver;

/// An ended run of `driver` whose agent reported these figures (a report
/// only for a driver that streams).
fn ended(id: &RunId, session: &str, driver: Driver, fig: (u64, u64, u64, f64)) -> RecordV1 {
    let report = driver.streams().then(|| AgentReport {
        driver: Some(driver),
        turns: Some(fig.0),
        input_tokens: Some(fig.1),
        output_tokens: Some(fig.2),
        cost_usd: (driver == Driver::ClaudeCode).then_some(fig.3),
        ..Default::default()
    });
    RecordV1 {
        driver_run: Some(DriverRun {
            driver,
            delivered: Delivery::default(),
            report,
            reported_files: None,
            writes_project: None,
            budget: None,
        }),
        ..succeeded(id, session, 10)
    }
}

fn finalize(store: &Store, w: RecordV1) {
    let id = w.run_id.clone();
    let session = w.session_id.to_string();
    store.commit_blocking(vec![accept(&id, &session)]).unwrap();
    let fin = Op::Finalize {
        rec: rec(w),
        context: None,
    };
    store.commit_blocking(vec![fin]).unwrap();
}

fn sums(store: &Store, q: UsageQuery) -> std::collections::BTreeMap<String, UsageTotals> {
    store.usage(&q).unwrap().into_iter().collect()
}

fn totals(runs: u64, reported: u64, fig: (u64, u64, u64), cost: Option<f64>) -> UsageTotals {
    UsageTotals {
        runs,
        reported,
        turns: Some(fig.0),
        input_tokens: Some(fig.1),
        output_tokens: Some(fig.2),
        cost_usd: cost,
    }
}

/// `n` run ids, each accepted in a later ms than the one before.
fn ids_apart(n: usize) -> Vec<RunId> {
    let mut out: Vec<RunId> = Vec::new();
    while out.len() < n {
        let id = RunId::new();
        if out.last().is_none_or(|last| id_ms(last) < id_ms(&id)) {
            out.push(id);
        }
    }
    out
}

#[test]
fn a_sessions_usage_is_summed_per_driver_and_a_pruned_run_still_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let ids = ids_apart(6);
    finalize(
        &store,
        ended(&ids[0], "s", Driver::ClaudeCode, (3, 300, 60, 0.0024)),
    );
    finalize(
        &store,
        ended(&ids[1], "s", Driver::ClaudeCode, (2, 200, 40, 0.0016)),
    );
    finalize(
        &store,
        ended(&ids[2], "s", Driver::Codex, (1, 300, 60, 0.0)),
    );
    finalize(&store, ended(&ids[3], "s", Driver::Command, (0, 0, 0, 0.0)));
    finalize(
        &store,
        ended(&ids[4], "t", Driver::ClaudeCode, (7, 7, 7, 7.0)),
    );
    // Accepted, not ended: counted, nothing reported.
    let mut open = accept(&ids[5], "s");
    if let Op::Accept { rec, .. } = &mut open {
        rec.driver_run = ended(&ids[5], "s", Driver::ClaudeCode, (0, 0, 0, 0.0)).driver_run;
        if let Some(d) = rec.driver_run.as_mut() {
            d.report = None;
        }
    }
    store.commit_blocking(vec![open]).unwrap();
    let s = || UsageQuery {
        session: Some("s".into()),
        ..Default::default()
    };
    let want_claude = totals(3, 2, (5, 500, 100), Some(0.0024 + 0.0016));
    let got = sums(&store, s());
    assert_eq!(got["claude-code"], want_claude);
    assert_eq!(got["codex"], totals(1, 1, (1, 300, 60), None));
    let plain = UsageTotals {
        runs: 1,
        ..Default::default()
    };
    assert_eq!(got["command"], plain);
    assert_eq!(got.len(), 3);
    // Pruned: its row is a tombstone, and what it spent still counts.
    prune_now(&store, &ids[..2]);
    assert!(matches!(
        store.get(&ids[0]).unwrap(),
        Some(Stored::Pruned { .. })
    ));
    assert_eq!(sums(&store, s()), got);
    // Another owner's runs are not summed for it; a time range bounds the ids.
    let other = UsageQuery {
        owner_uid: Some(crate::paths::uid() + 1),
        ..s()
    };
    assert!(sums(&store, other).is_empty());
    let later = UsageQuery {
        since_ms: Some(id_ms(&ids[1])),
        ..s()
    };
    assert_eq!(
        sums(&store, later)["claude-code"],
        totals(2, 1, (2, 200, 40), Some(0.0016))
    );
    let everyone = sums(&store, UsageQuery::default());
    assert_eq!(everyone["claude-code"].runs, 4);
    assert_eq!(everyone["claude-code"].turns, Some(12));
}

#[test]
fn a_sessions_sum_reads_one_range_of_its_covering_index() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(&layout(dir.path())).unwrap());
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    for q in [
        UsageQuery {
            session: Some("s".into()),
            ..Default::default()
        },
        UsageQuery {
            session: Some("s".into()),
            owner_uid: Some(1000),
            since_ms: Some(1),
            until_ms: Some(crate::timefmt::now_ms()),
        },
    ] {
        let (sql, args) = usage::sums_sql(&q);
        let refs: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a.as_ref()).collect();
        let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let plan: Vec<String> = st
            .query_map(&refs[..], |r| r.get::<_, String>(3))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert!(
            plan.iter()
                .any(|l| l.starts_with("SEARCH runs USING COVERING INDEX runs_usage (session_id=?")),
            "{q:?}: {plan:?}"
        );
    }
}

#[test]
fn a_version_2_file_gets_its_ended_driver_runs_usage_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let ids: Vec<RunId> = (0..5).map(|_| RunId::new()).collect();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA application_id = {}; {}; {}; PRAGMA user_version = 2;",
            schema::APPLICATION_ID,
            schema::MIGRATIONS[0],
            schema::MIGRATIONS[1]
        ))
        .unwrap();
        let rows = [
            ended(
                &ids[0],
                "s",
                Driver::ClaudeCode,
                (3, 300, 60, 0.0024000000000000002),
            ),
            ended(&ids[1], "s", Driver::Codex, (1, 300, 60, 0.0)),
            ended(&ids[2], "s", Driver::Command, (0, 0, 0, 0.0)),
            ended(&ids[3], "s", Driver::ClaudeCode, (1, 1, 1, 1.0)),
            ended(&ids[4], "s", Driver::ClaudeCode, (1, 1, 1, 1.0)),
        ];
        for w in rows {
            let r = rec(w);
            runs::insert(&conn, &path, &r, r.state(), Some("taken"), false).unwrap();
        }
        // What no daemon wrote: a figure out of range, a damaged column.
        conn.execute(
            "UPDATE run_ends SET driver = json_set(driver, '$.report.turns', 1e12,
             '$.report.input_tokens', 'x', '$.report.cost_usd', -1) WHERE run_id = ?1",
            [ids[3].as_str()],
        )
        .unwrap();
        conn.execute(
            "UPDATE run_ends SET driver = '{not json' WHERE run_id = ?1",
            [ids[4].as_str()],
        )
        .unwrap();
    }
    let store = Store::open(&layout(dir.path())).unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 3);
    type Cols = (
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<f64>,
    );
    let cols = |id: &RunId| -> Cols {
        conn.query_row(
            "SELECT driver, turns, input_tokens, output_tokens, cost_usd FROM runs
             WHERE run_id = ?1",
            [id.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap()
    };
    let s = |d: &str| Some(d.to_owned());
    assert_eq!(
        cols(&ids[0]),
        (
            s("claude-code"),
            Some(3),
            Some(300),
            Some(60),
            Some(0.0024000000000000002)
        )
    );
    assert_eq!(
        cols(&ids[1]),
        (s("codex"), Some(1), Some(300), Some(60), None)
    );
    assert_eq!(cols(&ids[2]), (s("command"), None, None, None, None));
    assert_eq!(cols(&ids[3]), (s("claude-code"), None, None, Some(1), None));
    assert_eq!(cols(&ids[4]), (None, None, None, None, None));
    let store = Store::open(&layout(dir.path())).unwrap();
    let got = sums(
        &store,
        UsageQuery {
            session: Some("s".into()),
            ..Default::default()
        },
    );
    assert_eq!(got["claude-code"].runs, 2);
    assert_eq!(
        got["command"].runs, 2,
        "the damaged one counts as a plain run"
    );
}
