//! The store's tests: records through rows and back, the writer's groups,
//! the faults at open, notices, lists and pruning.

use super::*;
use crate::run::record::{RecordV1, RunState};
use std::sync::atomic::Ordering;

pub(super) fn layout(dir: &Path) -> StateLayout {
    StateLayout::new(dir.into())
}

/// A record as today's daemon writes a freshly accepted run.
pub(super) fn accepted(id: &RunId, session: &str) -> RecordV1 {
    serde_json::from_value(serde_json::json!({
        "format": 1, "run_id": id.as_str(), "session_id": session,
        "audience": "team", "project_dir": "/p", "task": "t", "context": null,
        "command": ["sh", "-c", "true"], "env": {"A": "1"}, "limits": {},
        "keep_temp": false, "state": "accepted", "exit_code": null, "signal": null,
        "reason": null, "cancel_requested": false, "created_at_ms": 1,
        "started_at_ms": null, "ended_at_ms": null, "temp_dir": "/tmp/x",
        "run_dir": format!("/state/{session}/{id}"), "runner_pid": null,
        "runner_start_ticks": null, "log_truncated": false, "finalized": false,
        "max_attempts": 2, "network": "allowlist", "network_allow": ["example.com"],
        "uid": 70001, "tools": ["Read"], "notes": ["a note"]
    }))
    .unwrap()
}

fn running(id: &RunId, session: &str) -> RecordV1 {
    RecordV1 {
        state: RunState::Running,
        started_at_ms: Some(2),
        runner_pid: Some(4242),
        runner_start_ticks: Some(99),
        ..accepted(id, session)
    }
}

pub(super) fn succeeded(id: &RunId, session: &str, ended: u64) -> RecordV1 {
    use policy::workctx::{Outcome, Verdict};
    use subagent_runner::sandbox::report::{Enforcement, IsolationReport};
    let verdict = |o| Verdict {
        path: "a.txt".into(),
        outcome: o,
    };
    RecordV1 {
        state: RunState::Succeeded,
        exit_code: Some(0),
        reason: Some("exited with code 0".into()),
        ended_at_ms: Some(ended),
        finalized: true,
        isolation: Some(IsolationReport {
            landlock: Enforcement::on("abi 6"),
            seccomp: Enforcement::off("not asked for"),
            rlimits: vec!["nofile=1024".into()],
            ..Default::default()
        }),
        resources: Some(subagent_runner::exit_record::Resources {
            cpu_user_ms: 5,
            peak_memory_bytes: Some(1 << 20),
            ..Default::default()
        }),
        kept: Some(Default::default()),
        attempts: Some(1),
        delta: Some(crate::run::delta::DeltaReport {
            accepted: vec![verdict(Outcome::Accepted("/p/a.txt".into()))],
            rejected: vec![verdict(Outcome::Rejected("outside".into()))],
            note: None,
        }),
        observed: Some(Default::default()),
        egress: Some(Default::default()),
        ..running(id, session)
    }
}

/// A run whose runner died without an exit.json, its finalizing failed.
fn lost(id: &RunId, session: &str) -> RecordV1 {
    RecordV1 {
        state: RunState::Lost,
        reason: Some("the runner was killed by signal 9 and left no exit.json".into()),
        ended_at_ms: Some(7),
        finalize_error: Some("writing result.md: disk full".into()),
        ..running(id, session)
    }
}

pub(super) fn rec(w: RecordV1) -> Box<RunRecord> {
    Box::new(RunRecord::try_from(w).unwrap())
}

pub(super) fn accept(id: &RunId, session: &str) -> Op {
    Op::Accept {
        rec: rec(accepted(id, session)),
        spec: b"{\"spec\":1}".to_vec(),
        before: Some(b"before".to_vec()),
        session: SessionState {
            owner_uid: Some(crate::paths::uid()),
            project_dir: Some("/p".into()),
            recent_files: vec!["/p/seed".into()],
        },
    }
}

fn live(store: &Store, id: &RunId) -> RunRecord {
    match store.get(id).unwrap() {
        Some(Stored::Live(r)) => *r,
        other => panic!("{id}: {other:?}"),
    }
}

fn all(store: &Store) -> Vec<RunRecord> {
    let q = ListQuery {
        limit: 1000,
        ..Default::default()
    };
    store.list(&q).unwrap().runs
}

#[test]
fn the_four_records_come_back_as_they_went_in() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let ids: Vec<RunId> = (0..4).map(|_| RunId::new()).collect();
    let fixtures = [
        accepted(&ids[0], "s"),
        running(&ids[1], "s"),
        succeeded(&ids[2], "s", 3),
        lost(&ids[3], "s"),
    ];
    for (id, w) in ids.iter().zip(&fixtures) {
        store.commit_blocking(vec![accept(id, "s")]).unwrap();
        let r = rec(w.clone());
        let op = if r.end().is_some() {
            Op::Finalize {
                rec: r,
                context: None,
            }
        } else {
            Op::Update(r)
        };
        store.commit_blocking(vec![op]).unwrap();
    }
    let check = |store: &Store| {
        for (id, w) in ids.iter().zip(&fixtures) {
            assert_eq!(RecordV1::from(live(store, id)), *w);
        }
        let states: Vec<RunState> = all(store).iter().map(|r| r.state()).collect();
        assert_eq!(
            states,
            [
                RunState::Accepted,
                RunState::Running,
                RunState::Succeeded,
                RunState::Lost
            ]
        );
    };
    check(&store);
    drop(store);
    check(&Store::open(&layout(dir.path())).unwrap());
}

#[test]
fn an_end_is_published_only_by_its_finalize() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let id = RunId::new();
    store.commit_blocking(vec![accept(&id, "s")]).unwrap();
    let started = Op::Started {
        id: id.clone(),
        pid: 4242,
        ticks: 99,
        at_ms: 2,
    };
    store.commit_blocking(vec![started]).unwrap();
    let mut ended = succeeded(&id, "s", 3);
    ended.finalized = false;
    store
        .commit_blocking(vec![Op::Update(rec(ended.clone()))])
        .unwrap();
    // The record is the ended one (recovery reads it), lists still say running.
    assert_eq!(live(&store, &id).state(), RunState::Succeeded);
    let running = ListQuery {
        state: Some(RunState::Running),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(store.list(&running).unwrap().runs.len(), 1);
    assert_eq!(store.live_runs().unwrap().len(), 1);
    assert!(store.spec(&id).unwrap().is_some() && store.before(&id).unwrap().is_some());
    ended.finalized = true;
    let context = BTreeMap::from([("system.md".to_string(), "be brief".to_string())]);
    let fin = Op::Finalize {
        rec: rec(ended),
        context: Some(context.clone()),
    };
    store.commit_blocking(vec![fin]).unwrap();
    assert!(store.list(&running).unwrap().runs.is_empty());
    assert!(store.live_runs().unwrap().is_empty());
    assert_eq!(store.spec(&id).unwrap(), None);
    assert_eq!(store.before(&id).unwrap(), None);
    assert_eq!(store.context(&id).unwrap(), Some(context));
}

/// Waits until `n` requests past `from` are queued.
fn wait_sent(store: &Store, from: u64, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store.stats.sent.load(Ordering::SeqCst) < from + n {
        assert!(std::time::Instant::now() < deadline, "requests not sent");
        std::thread::yield_now();
    }
}

#[test]
fn many_commits_at_once_share_their_commits_and_answer_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let before = store.group_commits();
    let store = &store;
    let ids: Vec<RunId> = (0..64).map(|_| RunId::new()).collect();
    let sent = store.stats.sent.load(Ordering::SeqCst);
    std::thread::scope(|scope| {
        // The writer is held before its next group until all 64 are queued.
        let gate = store.stats.gate.lock().unwrap();
        for id in &ids {
            scope.spawn(move || {
                store.commit_blocking(vec![accept(id, "s")]).unwrap();
                // Answered only once committed: a fresh reader sees it.
                assert!(matches!(store.get(id).unwrap(), Some(Stored::Live(_))));
            });
        }
        wait_sent(store, sent, 64);
        drop(gate);
    });
    let groups = store.group_commits() - before;
    assert!(groups <= 2, "64 commits took {groups} groups");
    assert_eq!(all(store).len(), 64);
}

#[test]
fn a_failing_request_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let store = &store;
    let ids: Vec<RunId> = (0..3).map(|_| RunId::new()).collect();
    let missing = RunId::new();
    let start = |id: &RunId| Op::Started {
        id: id.clone(),
        pid: 1,
        ticks: 1,
        at_ms: 1,
    };
    let before = store.group_commits();
    let requests = vec![
        vec![accept(&ids[0], "s")],
        vec![start(&missing)],
        vec![accept(&ids[1], "s")],
        // Its first op is undone with its failing second.
        vec![accept(&ids[2], "s"), start(&missing)],
        // A duplicate run id.
        vec![accept(&ids[0], "s")],
    ];
    let sent = store.stats.sent.load(Ordering::SeqCst);
    let answers: Vec<_> = std::thread::scope(|scope| {
        let gate = store.stats.gate.lock().unwrap();
        let handles: Vec<_> = requests
            .into_iter()
            .enumerate()
            .map(|(i, ops)| {
                let h = scope.spawn(move || store.commit_blocking(ops));
                // Queued in this order.
                wait_sent(store, sent, i as u64 + 1);
                h
            })
            .collect();
        wait_sent(store, sent, 5);
        drop(gate);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(store.group_commits() - before, 1, "one group");
    assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
    assert!(
        matches!(answers[1], Err(StoreError::NoRun { .. })),
        "{:?}",
        answers[1]
    );
    assert!(matches!(answers[3], Err(StoreError::NoRun { .. })));
    assert!(matches!(answers[4], Err(StoreError::Sql { .. })));
    assert!(store.get(&ids[1]).unwrap().is_some());
    assert!(store.get(&ids[2]).unwrap().is_none());
    assert_eq!(all(store).len(), 2);
}

#[test]
fn a_version_0_file_is_migrated_and_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    drop(rusqlite::Connection::open(&path).unwrap());
    let store = Store::open(&layout(dir.path())).unwrap();
    store
        .commit_blocking(vec![accept(&RunId::new(), "s")])
        .unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let get = |p: &str| -> i64 { conn.query_row(p, [], |r| r.get(0)).unwrap() };
    assert_eq!(get("PRAGMA user_version"), schema::SCHEMA_VERSION);
    assert_eq!(get("PRAGMA application_id"), schema::APPLICATION_ID);
    for ext in ["", "-wal", "-shm"] {
        let p = dir.path().join(format!("{DB_FILE}{ext}"));
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", p.display());
    }
}

/// Opening refuses the file with a message naming it, and leaves it as it
/// was.
fn refused(dir: &Path, want: &str) -> StoreError {
    let path = dir.join(DB_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let err = Store::open(&layout(dir)).err().unwrap();
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains(want), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the file was changed");
    err
}

#[test]
fn a_newer_foreign_or_random_file_is_refused() {
    let newer = tempfile::tempdir().unwrap();
    drop(Store::open(&layout(newer.path())).unwrap());
    let conn = rusqlite::Connection::open(newer.path().join(DB_FILE)).unwrap();
    conn.execute_batch("PRAGMA user_version = 9").unwrap();
    drop(conn);
    let e = refused(newer.path(), "newer");
    assert!(matches!(e, StoreError::Newer { found: 9, .. }), "{e:?}");
    assert!(matches!(
        Store::open_read_only(&newer.path().join(DB_FILE)),
        Err(StoreError::Newer { .. })
    ));

    let foreign = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(foreign.path().join(DB_FILE)).unwrap();
    conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    drop(conn);
    let e = refused(foreign.path(), "another program");
    assert!(matches!(e, StoreError::Foreign { .. }), "{e:?}");

    let random = tempfile::tempdir().unwrap();
    let mut bytes = vec![0u8; 8192];
    let mut x: u32 = 0x9e37_79b9;
    for b in bytes.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    std::fs::write(random.path().join(DB_FILE), &bytes).unwrap();
    let e = refused(random.path(), "is corrupt");
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}");
    assert!(e.to_string().contains("will not start over it"));
}

#[test]
fn a_damaged_page_is_found_at_an_unclean_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let ops = (0..200).map(|_| accept(&RunId::new(), "s")).collect();
    store.commit_blocking(ops).unwrap();
    drop(store);
    // Checkpointed into the main file, then a page in the middle scribbled.
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    drop(conn);
    let path = dir.path().join(DB_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 8 * 4096, "{}", bytes.len());
    for b in &mut bytes[4 * 4096..6 * 4096] {
        *b = 0x5a;
    }
    std::fs::write(&path, &bytes).unwrap();
    let e = refused(dir.path(), "is corrupt");
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}");
}

fn finalize(store: &Store, id: &RunId, session: &str, ended: u64) {
    store.commit_blocking(vec![accept(id, session)]).unwrap();
    let fin = Op::Finalize {
        rec: rec(succeeded(id, session, ended)),
        context: None,
    };
    store.commit_blocking(vec![fin]).unwrap();
}

fn take(store: &Store, session: &str) -> Vec<String> {
    let op = Op::TakeNotices {
        session: session.into(),
    };
    let out = store.commit_blocking(vec![op]).unwrap();
    out.notices.into_iter().map(|n| n.run_id).collect()
}

#[test]
fn each_notice_is_taken_once_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let ids: Vec<RunId> = (0..4).map(|_| RunId::new()).collect();
    finalize(&store, &ids[0], "s", 30);
    finalize(&store, &ids[1], "s", 10);
    finalize(&store, &ids[2], "s", 20);
    finalize(&store, &ids[3], "t", 5);
    let got = take(&store, "s");
    assert_eq!(got, [&ids[1], &ids[2], &ids[0]].map(|i| i.to_string()));
    assert!(take(&store, "s").is_empty());
    // Finalized again (a restart): the notice does not come back.
    let again = Op::Finalize {
        rec: rec(succeeded(&ids[0], "s", 31)),
        context: None,
    };
    store.commit_blocking(vec![again]).unwrap();
    assert!(take(&store, "s").is_empty());
    let n = store
        .commit_blocking(vec![Op::TakeNotices {
            session: "t".into(),
        }])
        .unwrap()
        .notices;
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].state, RunState::Succeeded);
    assert_eq!(
        n[0].result_path,
        PathBuf::from(format!("/state/t/{}/result.md", ids[3]))
    );
    assert_eq!(n[0].ended_at, crate::timefmt::rfc3339_ms(5));
}

#[test]
fn pending_notices_are_counted_without_a_read_and_the_starts_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    assert_eq!((store.starts(), store.notices_pending()), (1, 0));
    let ids: Vec<RunId> = (0..4).map(|_| RunId::new()).collect();
    for (i, id) in ids.iter().enumerate() {
        finalize(&store, id, if i < 3 { "s" } else { "t" }, i as u64 + 1);
    }
    assert_eq!(store.notices_pending(), 4);
    let again = Op::Finalize {
        rec: rec(succeeded(&ids[0], "s", 9)),
        context: None,
    };
    store.commit_blocking(vec![again]).unwrap();
    assert_eq!(store.notices_pending(), 4, "a notice is made pending once");
    assert_eq!(take(&store, "t").len(), 1);
    assert_eq!(store.notices_pending(), 3);
    let mark = Op::PruneMark {
        ids: vec![ids[0].clone()],
        reason: "max_runs".into(),
    };
    store.commit_blocking(vec![mark]).unwrap();
    assert_eq!(
        store.notices_pending(),
        2,
        "a run being pruned takes its notice"
    );
    // A request that fails is undone, and so is its count.
    let failing = vec![
        Op::TakeNotices {
            session: "s".into(),
        },
        Op::DirBytes {
            id: RunId::new(),
            bytes: 1,
        },
    ];
    assert!(store.commit_blocking(failing).is_err());
    assert_eq!(store.notices_pending(), 2);
    drop(store);
    let store = Store::open(&layout(dir.path())).unwrap();
    assert_eq!(store.starts(), 2);
    assert_eq!(store.meta(STARTS).unwrap().as_deref(), Some("2"));
    assert_eq!(store.notices_pending(), 2, "counted again at open");
}

#[test]
fn concurrent_takes_hand_each_notice_out_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    for i in 0..20 {
        finalize(&store, &RunId::new(), "s", i);
    }
    let store = &store;
    let got: Vec<String> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..8).map(|_| scope.spawn(|| take(store, "s"))).collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let unique: std::collections::HashSet<&String> = got.iter().collect();
    assert_eq!((got.len(), unique.len()), (20, 20));
}

#[test]
fn sessions_keep_their_owner_and_lose_no_touch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    store
        .commit_blocking(vec![accept(&RunId::new(), "s")])
        .unwrap();
    let store = &store;
    std::thread::scope(|scope| {
        for i in 0..8 {
            scope.spawn(move || {
                let op = Op::Touch {
                    session: "s".into(),
                    files: vec![format!("f{i}").into()],
                    owner_uid: 1,
                    requester: None,
                };
                store.commit_blocking(vec![op]).unwrap();
            });
        }
    });
    let s = store.session("s").unwrap().unwrap();
    assert_eq!(s.recent_files.len(), 9);
    assert_eq!(s.recent_files[8], PathBuf::from("/p/seed"));
    assert_eq!(s.owner_uid, Some(crate::paths::uid()));
    // A second accept sets the project dir only.
    let mut op = accept(&RunId::new(), "s");
    if let Op::Accept { session, .. } = &mut op {
        *session = SessionState {
            owner_uid: Some(7),
            project_dir: Some("/q".into()),
            recent_files: vec![],
        };
    }
    store.commit_blocking(vec![op]).unwrap();
    let s2 = store.session("s").unwrap().unwrap();
    assert_eq!(s2.project_dir, Some(PathBuf::from("/q")));
    assert_eq!(
        (s2.owner_uid, s2.recent_files),
        (s.owner_uid, s.recent_files)
    );
    let other = policy::rights::Requester {
        uid: crate::paths::uid().wrapping_add(4242).max(1),
        gid: 1,
        groups: vec![],
    };
    assert!(matches!(
        store.may_use("s", Some(&other)),
        Err(StoreError::NotOwned { .. })
    ));
    assert!(store.may_join("s", Some(&other)).is_err());
    assert!(store.may_use("s", None).is_ok() && store.may_join("new", Some(&other)).is_ok());
    assert_eq!(store.session("new").unwrap(), None);
}

#[test]
fn lists_page_by_cursor_in_either_order_and_filter() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let ids: Vec<RunId> = (0..10).map(|_| RunId::new()).collect();
    for (i, id) in ids.iter().enumerate() {
        let session = if i % 2 == 0 { "even" } else { "odd" };
        store.commit_blocking(vec![accept(id, session)]).unwrap();
    }
    for desc in [false, true] {
        let mut q = ListQuery {
            desc,
            limit: 3,
            ..Default::default()
        };
        let mut seen = Vec::new();
        loop {
            let page = store.list(&q).unwrap();
            assert!(page.runs.len() <= 3);
            seen.extend(page.runs.into_iter().map(|r| r.run_id));
            match page.next {
                Some(next) => q.after = Some(next),
                None => break,
            }
        }
        let mut want = ids.clone();
        if desc {
            want.reverse();
        }
        assert_eq!(seen, want, "desc {desc}");
    }
    let odd = ListQuery {
        session: Some("odd".into()),
        state: Some(RunState::Accepted),
        owner_uid: Some(crate::paths::uid()),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(store.list(&odd).unwrap().runs.len(), 5);
    let none = ListQuery {
        owner_uid: Some(crate::paths::uid().wrapping_add(1)),
        limit: 100,
        ..Default::default()
    };
    assert!(store.list(&none).unwrap().runs.is_empty());
    let window = ListQuery {
        since_ms: Some(crate::timefmt::now_ms() + 3_600_000),
        limit: 100,
        ..Default::default()
    };
    assert!(store.list(&window).unwrap().runs.is_empty());
}

/// The ms of the accept time a run id starts with.
pub(super) fn id_ms(id: &RunId) -> u64 {
    id.created_ms()
}

#[test]
fn since_and_until_bound_the_runs_by_the_time_in_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let mut ids = Vec::new();
    for i in 0..6 {
        if i > 0 {
            // Each id in a later ms than the one before.
            let last = id_ms(&ids[i - 1]);
            while crate::timefmt::now_ms() <= last {
                std::thread::yield_now();
            }
        }
        let id = RunId::new();
        store.commit_blocking(vec![accept(&id, "s")]).unwrap();
        ids.push(id);
    }
    let got = |since: Option<u64>, until: Option<u64>, desc: bool| -> Vec<RunId> {
        let q = ListQuery {
            since_ms: since,
            until_ms: until,
            desc,
            limit: 100,
            ..Default::default()
        };
        store
            .list(&q)
            .unwrap()
            .runs
            .into_iter()
            .map(|r| r.run_id)
            .collect()
    };
    let (t1, t4) = (id_ms(&ids[1]), id_ms(&ids[4]));
    assert_eq!(got(Some(t1), None, false), ids[1..]);
    assert_eq!(got(None, Some(t4), false), ids[..=4]);
    assert_eq!(got(Some(t1), Some(t4), false), ids[1..=4]);
    let mut back = ids[1..=4].to_vec();
    back.reverse();
    assert_eq!(got(Some(t1), Some(t4), true), back);
    assert_eq!(got(Some(t1 + 1), Some(t4 - 1), false), ids[2..=3]);
    assert!(got(Some(t4 + 1), Some(t1), false).is_empty());
    // The ends of the ids' four-digit years.
    assert_eq!(got(Some(0), Some(u64::MAX), false), ids);
    assert!(got(Some(u64::MAX), None, false).is_empty());
    assert_eq!(query::id_prefix(0).as_deref(), Some("19700101T000000.000"));
    assert_eq!(query::id_prefix(u64::MAX), None);
}

/// Every line of the plan of the page query `q`.
fn page_plan(conn: &rusqlite::Connection, q: &ListQuery) -> Vec<String> {
    let (tail, args) = query::list_sql(q);
    let refs: Vec<&dyn rusqlite::ToSql> = args.iter().map(|a| a.as_ref()).collect();
    let mut st = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {} {tail}", runs::SELECT))
        .unwrap();
    let rows = st.query_map(&refs[..], |r| r.get::<_, String>(3)).unwrap();
    rows.map(|r| r.unwrap()).collect()
}

#[test]
fn every_list_shape_is_one_range_of_a_partial_index() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(&layout(dir.path())).unwrap());
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let now = crate::timefmt::now_ms();
    let in_session = |state: Option<RunState>, owner_uid: Option<u32>| ListQuery {
        session: Some("s".into()),
        state,
        owner_uid,
        ..Default::default()
    };
    let shapes: [(&str, ListQuery); 7] = [
        ("runs_listed", ListQuery::default()),
        ("runs_session", in_session(Some(RunState::Failed), None)),
        ("runs_session", in_session(None, Some(1000))),
        (
            "runs_session",
            in_session(Some(RunState::Failed), Some(1000)),
        ),
        (
            "runs_session",
            ListQuery {
                session: Some("s".into()),
                ..Default::default()
            },
        ),
        (
            "runs_state",
            ListQuery {
                state: Some(RunState::Succeeded),
                ..Default::default()
            },
        ),
        (
            "runs_owner",
            ListQuery {
                owner_uid: Some(1000),
                ..Default::default()
            },
        ),
    ];
    let windows = [
        (None, None),
        (Some(now), None),
        (None, Some(now)),
        (Some(now - 1000), Some(now)),
    ];
    for (index, shape) in &shapes {
        for (since_ms, until_ms) in windows {
            for after in [None, Some(RunId::new())] {
                for desc in [false, true] {
                    let q = ListQuery {
                        since_ms,
                        until_ms,
                        after: after.clone(),
                        desc,
                        limit: 10,
                        ..shape.clone()
                    };
                    let plan = page_plan(&conn, &q);
                    let runs_line: Vec<&String> = plan
                        .iter()
                        .filter(|l| l.contains(" r ") || l.ends_with(" r"))
                        .collect();
                    assert_eq!(runs_line.len(), 1, "{q:?}: {plan:?}");
                    let line = runs_line[0];
                    assert!(line.contains(&format!("INDEX {index}")), "{q:?}: {plan:?}");
                    assert!(
                        !plan.iter().any(|l| l.contains("TEMP B-TREE")),
                        "{q:?}: {plan:?}"
                    );
                    let bounded = since_ms.is_some() || until_ms.is_some() || after.is_some();
                    if bounded || *index != "runs_listed" {
                        assert!(line.starts_with("SEARCH r USING"), "{q:?}: {plan:?}");
                    }
                    for side in ["SEARCH d", "SEARCH e"] {
                        assert!(plan.iter().any(|l| l.starts_with(side)), "{q:?}: {plan:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_version_1_file_is_migrated_and_lists_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DB_FILE);
    let (kept, gone) = (RunId::new(), RunId::new());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA application_id = {}; {}; PRAGMA user_version = 1;",
            schema::APPLICATION_ID,
            schema::MIGRATIONS[0]
        ))
        .unwrap();
        for id in [&kept, &gone] {
            let r = rec(succeeded(id, "s", 10));
            runs::insert(&conn, &path, &r, r.state(), Some("taken"), false).unwrap();
        }
        conn.execute(
            "UPDATE runs SET prune_state = 'pruned', pruned_at_ms = 5, prune_reason = 'max_runs'
             WHERE run_id = ?1",
            [gone.as_str()],
        )
        .unwrap();
    }
    let store = Store::open(&layout(dir.path())).unwrap();
    assert_eq!(
        all(&store).iter().map(|r| &r.run_id).collect::<Vec<_>>(),
        [&kept]
    );
    assert!(matches!(
        store.get(&gone).unwrap(),
        Some(Stored::Pruned { at_ms: 5, .. })
    ));
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::SCHEMA_VERSION);
    // The copy made before the migration is the version 1 file, whole.
    let bak = rusqlite::Connection::open(dir.path().join("state.db.v1.bak")).unwrap();
    let (version, runs): (i64, i64) = bak
        .query_row(
            "SELECT (SELECT user_version FROM pragma_user_version), count(*) FROM runs",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((version, runs), (1, 2));
    let mut st = conn
        .prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL")
        .unwrap();
    let indexes: BTreeMap<String, String> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert!(!indexes.contains_key("runs_session_created"), "{indexes:?}");
    for name in ["runs_listed", "runs_session", "runs_state", "runs_owner"] {
        let sql = &indexes[name];
        assert!(sql.ends_with("WHERE prune_state IS NULL"), "{name}: {sql}");
    }
    assert!(indexes["runs_tombstones"].contains("prune_state = 'pruned'"));
    let q = ListQuery {
        session: Some("s".into()),
        limit: 5,
        ..Default::default()
    };
    let plan = page_plan(&conn, &q).join("; ");
    assert!(plan.contains("runs_session"), "{plan}");
}

#[test]
fn recovery_and_lists_read_through_their_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let plan = |sql: &str| -> String {
        let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = st.query_map([], |r| r.get::<_, String>(3)).unwrap();
        rows.map(|r| r.unwrap()).collect::<Vec<_>>().join("; ")
    };
    let live = plan(&format!(
        "{} WHERE (r.state IN ('accepted', 'running') OR r.finalized = 0
         OR r.prune_state = 'pruning') AND r.prune_state IS NULL ORDER BY r.run_id",
        runs::SELECT
    ));
    assert!(live.contains("runs_live"), "{live}");
    let take =
        plan("UPDATE runs SET notice = 'taken' WHERE session_id = 's' AND notice = 'pending'");
    assert!(take.contains("runs_notice_pending"), "{take}");
    let page = plan(&format!(
        "{} WHERE r.prune_state IS NULL AND r.session_id = 's' ORDER BY r.run_id LIMIT 5",
        runs::SELECT
    ));
    assert!(page.contains("runs_session"), "{page}");
}

#[test]
fn a_pruned_run_leaves_lists_and_then_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let (old, kept, open) = (RunId::new(), RunId::new(), RunId::new());
    finalize(&store, &old, "s", 10);
    finalize(&store, &kept, "s", 20);
    store.commit_blocking(vec![accept(&open, "s")]).unwrap();
    store
        .commit_blocking(vec![Op::DirBytes {
            id: old.clone(),
            bytes: 12288,
        }])
        .unwrap();
    let c = store.retention_candidates().unwrap();
    let got: Vec<(&RunId, u64, bool)> = c
        .iter()
        .map(|c| (&c.run_id, c.dir_bytes, c.notice_pending))
        .collect();
    assert_eq!(got, [(&old, 12288, true), (&kept, 0, true)]);
    let mark = Op::PruneMark {
        ids: vec![old.clone(), open.clone()],
        reason: "max_runs".into(),
    };
    store.commit_blocking(vec![mark]).unwrap();
    // A run not ended is never marked.
    assert!(matches!(store.get(&open).unwrap(), Some(Stored::Live(_))));
    assert!(matches!(
        store.get(&old).unwrap(),
        Some(Stored::Pruned { ref reason, .. }) if reason == "max_runs"
    ));
    assert_eq!(all(&store).len(), 2);
    let pending: Vec<RunId> = store
        .pending_prunes()
        .unwrap()
        .into_iter()
        .map(|p| p.run_id)
        .collect();
    assert_eq!(pending, std::slice::from_ref(&old));
    assert_eq!(take(&store, "s"), [kept.to_string()]);
    store
        .commit_blocking(vec![Op::PruneDone {
            ids: vec![old.clone()],
        }])
        .unwrap();
    assert!(store.pending_prunes().unwrap().is_empty());
    assert!(matches!(
        store.get(&old).unwrap(),
        Some(Stored::Pruned { .. })
    ));
    let forget = Op::ForgetPruned {
        before_ms: u64::MAX >> 1,
        keep: u64::MAX,
    };
    store.commit_blocking(vec![forget]).unwrap();
    assert_eq!(store.get(&old).unwrap(), None);
}

#[test]
fn a_read_only_store_reads_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let id = RunId::new();
    let store = Store::open(&layout(dir.path())).unwrap();
    store.commit_blocking(vec![accept(&id, "s")]).unwrap();
    let meta = Op::SetMeta {
        key: "k".into(),
        value: Some("v".into()),
    };
    store.commit_blocking(vec![meta]).unwrap();
    drop(store);
    let ro = Store::open_read_only(&dir.path().join(DB_FILE)).unwrap();
    assert_eq!(live(&ro, &id).run_id, id);
    assert_eq!(ro.meta("k").unwrap().as_deref(), Some("v"));
    assert!(matches!(
        ro.commit_blocking(vec![Op::TakeNotices {
            session: "s".into()
        }]),
        Err(StoreError::Closed { .. })
    ));
    assert!(Store::open_read_only(&dir.path().join("missing.db")).is_err());
}

#[test]
fn a_failed_commit_fails_its_whole_group_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let owned = Store::open(&layout(dir.path())).unwrap();
    let store = &owned;
    let ids: Vec<RunId> = (0..3).map(|_| RunId::new()).collect();
    store.stats.fail_commit.store(true, Ordering::SeqCst);
    let sent = store.stats.sent.load(Ordering::SeqCst);
    let answers: Vec<_> = std::thread::scope(|scope| {
        let gate = store.stats.gate.lock().unwrap();
        let hs: Vec<_> = ids
            .iter()
            .map(|id| scope.spawn(move || store.commit_blocking(vec![accept(id, "s")])))
            .collect();
        wait_sent(store, sent, 3);
        drop(gate);
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for a in &answers {
        let e = a.as_ref().err().unwrap();
        assert!(matches!(e, StoreError::Commit { .. }), "{e:?}");
        assert!(e.to_string().contains(DB_FILE), "{e}");
    }
    assert!(all(store).is_empty());
    // The writer goes on.
    store.commit_blocking(vec![accept(&ids[0], "s")]).unwrap();
    assert_eq!(all(store).len(), 1);
    // But a stop after the failure leaves no clean mark.
    assert!(!store.close_clean().unwrap());
    assert_eq!(store.meta(CLEAN_SHUTDOWN).unwrap(), None);
    drop(owned);
    let store = Store::open(&layout(dir.path())).unwrap();
    assert!(store.integrity_checked().is_some());
    assert_eq!(all(&store).len(), 1);
}

#[test]
fn a_clean_close_is_the_last_write_and_skips_the_next_check() {
    let dir = tempfile::tempdir().unwrap();
    let id = RunId::new();
    let store = Store::open(&layout(dir.path())).unwrap();
    assert!(store.integrity_checked().is_some(), "a new file is checked");
    store.commit_blocking(vec![accept(&id, "s")]).unwrap();
    assert!(store.close_clean().unwrap());
    assert!(store.meta(CLEAN_SHUTDOWN).unwrap().is_some());
    assert!(matches!(
        store.commit_blocking(vec![accept(&RunId::new(), "s")]),
        Err(StoreError::Closed { .. })
    ));
    assert!(matches!(
        store.close_clean(),
        Err(StoreError::Closed { .. })
    ));
    drop(store);
    let store = Store::open(&layout(dir.path())).unwrap();
    assert_eq!(store.integrity_checked(), None, "the stop was clean");
    // The mark is cleared at open: a stop without it is checked.
    assert_eq!(store.meta(CLEAN_SHUTDOWN).unwrap(), None);
    assert_eq!(live(&store, &id).run_id, id);
    drop(store);
    let store = Store::open(&layout(dir.path())).unwrap();
    assert!(
        store.integrity_checked().is_some(),
        "an unclean stop is checked"
    );
}

#[test]
fn a_read_that_panics_gives_its_reader_back() {
    let dir = tempfile::tempdir().unwrap();
    let id = RunId::new();
    let store = Arc::new(Store::open(&layout(dir.path())).unwrap());
    store.commit_blocking(vec![accept(&id, "s")]).unwrap();
    for _ in 0..READERS {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.read(|_, _| -> Result<()> { panic!("a reader's closure panics") })
        }));
        assert!(r.is_err());
    }
    assert_eq!(store.readers.lock().unwrap().len(), READERS);
    // With the readers lost these would wait for ever: bounded here.
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..8 {
        let (store, tx, id) = (store.clone(), tx.clone(), id.clone());
        std::thread::spawn(move || tx.send(store.get(&id)).unwrap());
    }
    for _ in 0..8 {
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a read is answered");
        assert!(matches!(r, Ok(Some(Stored::Live(_)))), "{r:?}");
    }
}

/// Prunes `ids` (marked and done) now.
pub(super) fn prune_now(store: &Store, ids: &[RunId]) {
    let mark = Op::PruneMark {
        ids: ids.to_vec(),
        reason: "max_runs".into(),
    };
    let done = Op::PruneDone { ids: ids.to_vec() };
    store.commit_blocking(vec![mark, done]).unwrap();
}

fn pruned_at(store: &Store, id: &RunId) -> Option<u64> {
    match store.get(id).unwrap() {
        Some(Stored::Pruned { at_ms, .. }) => Some(at_ms),
        Some(Stored::Live(_)) => panic!("{id} is live"),
        None => None,
    }
}

#[test]
fn tombstones_are_forgotten_by_age_and_beyond_a_count_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let ids: Vec<RunId> = (0..6).map(|_| RunId::new()).collect();
    for id in &ids {
        finalize(&store, id, "s", 10);
    }
    let kept = RunId::new();
    finalize(&store, &kept, "s", 10);
    // Pruned one after another: ids[0] is the oldest tombstone.
    let mut times = Vec::new();
    for id in &ids {
        let before = times.last().copied().unwrap_or(0);
        while crate::timefmt::now_ms() <= before {
            std::thread::yield_now();
        }
        prune_now(&store, std::slice::from_ref(id));
        times.push(pruned_at(&store, id).unwrap());
    }
    // By age: the tombstones pruned before ids[2]'s are forgotten.
    let by_age = Op::ForgetPruned {
        before_ms: times[2],
        keep: u64::MAX,
    };
    store.commit_blocking(vec![by_age]).unwrap();
    let left: Vec<bool> = ids
        .iter()
        .map(|id| pruned_at(&store, id).is_some())
        .collect();
    assert_eq!(left, [false, false, true, true, true, true]);
    // By count: the newest two stay.
    let by_count = Op::ForgetPruned {
        before_ms: 0,
        keep: 2,
    };
    store.commit_blocking(vec![by_count]).unwrap();
    let left: Vec<bool> = ids
        .iter()
        .map(|id| pruned_at(&store, id).is_some())
        .collect();
    assert_eq!(left, [false, false, false, false, true, true]);
    // A live run is never forgotten, whatever the bounds.
    let all_gone = Op::ForgetPruned {
        before_ms: u64::MAX >> 1,
        keep: 0,
    };
    store.commit_blocking(vec![all_gone]).unwrap();
    assert!(ids.iter().all(|id| store.get(id).unwrap().is_none()));
    assert_eq!(live(&store, &kept).run_id, kept);
    assert_eq!(all(&store).len(), 1);
    // Forgetting reads the tombstones' index, not the runs.
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let plan = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> Vec<String> {
        let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = st.query_map(args, |r| r.get::<_, String>(3)).unwrap();
        rows.map(|r| r.unwrap()).collect()
    };
    let by_age = "DELETE FROM runs WHERE prune_state = 'pruned' AND pruned_at_ms < ?1";
    let by_count = format!(
        "DELETE FROM runs WHERE run_id IN ({})",
        retention::OVER_KEEP
    );
    for (sql, plan) in [
        (by_age, plan(by_age, &[&5])),
        (&by_count, plan(&by_count, &[&2])),
    ] {
        assert!(
            plan.iter().any(|l| l.contains("runs_tombstones")),
            "{sql}: {plan:?}"
        );
        for l in plan.iter().filter(|l| l.starts_with("SCAN")) {
            assert!(l.contains("runs_tombstones"), "{sql}: {plan:?}");
        }
    }
}

/// An Accept into `session` of a run made for `uid`, as its spawn would
/// send it after a pre-check that found the session new.
fn accept_for(id: &RunId, session: &str, uid: u32) -> Op {
    let mut r = rec(accepted(id, session));
    r.on_behalf = Some(policy::rights::OnBehalf {
        requester: policy::rights::Requester {
            uid,
            gid: uid,
            groups: vec![],
        },
        needs: vec![],
    });
    Op::Accept {
        rec: r,
        spec: b"{}".to_vec(),
        before: None,
        session: SessionState {
            owner_uid: Some(uid),
            project_dir: Some(format!("/home/{uid}").into()),
            recent_files: vec![],
        },
    }
}

#[test]
fn two_owners_racing_into_one_new_session_the_second_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&layout(dir.path())).unwrap();
    let (a, b) = (70_001, 70_002);
    let (first, second) = (RunId::new(), RunId::new());
    // Both passed the pre-check (the session was new); both commit in one
    // group, one after the other.
    let store = &store;
    let sent = store.stats.sent.load(Ordering::SeqCst);
    let answers = std::thread::scope(|scope| {
        let gate = store.stats.gate.lock().unwrap();
        let h1 = scope.spawn(|| store.commit_blocking(vec![accept_for(&first, "new", a)]));
        wait_sent(store, sent, 1);
        let h2 = scope.spawn(|| store.commit_blocking(vec![accept_for(&second, "new", b)]));
        wait_sent(store, sent, 2);
        drop(gate);
        [h1.join().unwrap(), h2.join().unwrap()]
    });
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    let e = answers[1].as_ref().err().unwrap();
    assert!(
        matches!(e, StoreError::NotOwned { session, .. } if session == "new"),
        "{e:?}"
    );
    // The same refusal, word for word, as the check before the commit.
    let other = policy::rights::Requester {
        uid: b,
        gid: b,
        groups: vec![],
    };
    let pre = store.may_join("new", Some(&other)).unwrap_err();
    assert_eq!(e.to_string(), pre.to_string());
    let s = store.session("new").unwrap().unwrap();
    assert_eq!(s.owner_uid, Some(a));
    assert_eq!(s.project_dir, Some(PathBuf::from(format!("/home/{a}"))));
    assert_eq!(live(store, &first).run_id, first);
    assert_eq!(
        store.get(&second).unwrap(),
        None,
        "the refused run left no row"
    );
    // A touch for the other uid is refused too, and takes nothing over;
    // the owner's goes through.
    let touch = |uid: u32| Op::Touch {
        session: "new".into(),
        files: vec!["f".into()],
        owner_uid: uid,
        requester: Some(uid),
    };
    let e = store.commit_blocking(vec![touch(b)]).unwrap_err();
    assert!(matches!(e, StoreError::NotOwned { .. }), "{e:?}");
    assert_eq!(store.session("new").unwrap().unwrap().owner_uid, Some(a));
    let out = store.commit_blocking(vec![touch(a)]).unwrap();
    assert_eq!(out.session.unwrap().owner_uid, Some(a));
    // Two touches racing into another new session: the first makes it.
    let sent = store.stats.sent.load(Ordering::SeqCst);
    let fresh = |uid: u32| Op::Touch {
        session: "fresh".into(),
        files: vec![],
        owner_uid: uid,
        requester: Some(uid),
    };
    let answers = std::thread::scope(|scope| {
        let gate = store.stats.gate.lock().unwrap();
        let h1 = scope.spawn(|| store.commit_blocking(vec![fresh(a)]));
        wait_sent(store, sent, 1);
        let h2 = scope.spawn(|| store.commit_blocking(vec![fresh(b)]));
        wait_sent(store, sent, 2);
        drop(gate);
        [h1.join().unwrap(), h2.join().unwrap()]
    });
    assert!(answers[0].is_ok() && answers[1].is_err(), "{answers:?}");
    assert_eq!(store.session("fresh").unwrap().unwrap().owner_uid, Some(a));
}
