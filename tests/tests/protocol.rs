//! Bad input over the real socket: each answered with its documented error
//! code, while the daemon keeps serving everyone else.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use subagentd_e2e::{session, Conn, Daemon};

fn error_of(msg: &Value) -> (i64, String) {
    let e = msg
        .get("error")
        .unwrap_or_else(|| panic!("expected an error: {msg}"));
    (
        e["code"].as_i64().unwrap(),
        e["message"].as_str().unwrap().to_owned(),
    )
}

fn spawn_params(s: &str) -> Value {
    json!({
        "session": {"id": s, "audience": "team", "project_dir": "/tmp"},
        "task": "t",
        "command": ["true"],
    })
}

fn assert_alive(d: &Daemon) {
    let mut other = d.conn();
    assert!(other.call("ping", json!({})).is_ok());
}

#[test]
fn invalid_json_is_a_parse_error_and_the_connection_stays_open() {
    let d = Daemon::start();
    let mut c = d.conn();
    for bad in ["{not json\n", "\u{0}\u{1}\n", "{\"jsonrpc\":\"2.0\",\n"] {
        c.send_raw(bad.as_bytes()).unwrap();
        let msg = c.read_msg().unwrap();
        assert_eq!(msg["id"], Value::Null);
        assert_eq!(error_of(&msg).0, -32700, "{bad:?}: {msg}");
    }
    c.send_raw(&[0xff, 0xfe, b'\n']).unwrap();
    assert_eq!(error_of(&c.read_msg().unwrap()).0, -32700);
    assert!(c.call("ping", json!({})).is_ok());
}

#[test]
fn invalid_requests_and_unknown_methods() {
    let d = Daemon::start();
    let mut c = d.conn();
    c.send_raw(b"[1,2]\n").unwrap();
    assert_eq!(error_of(&c.read_msg().unwrap()).0, -32600);
    c.send_raw(b"{\"id\":1,\"method\":\"ping\"}\n").unwrap();
    let m = c.read_msg().unwrap();
    assert_eq!((m["id"].clone(), error_of(&m).0), (json!(1), -32600));
    let m = c.request("no_such_method", json!({}));
    let (code, msg) = error_of(&m);
    assert_eq!(code, -32601);
    assert!(msg.contains("no_such_method"), "{msg}");
}

#[test]
fn missing_and_ill_typed_fields_are_named() {
    let d = Daemon::start();
    let mut c = d.conn();
    let s = session("params");
    let cases: Vec<(Value, &str)> = vec![
        (
            {
                let mut p = spawn_params(&s);
                p.as_object_mut().unwrap().remove("task");
                p
            },
            "task",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["command"] = json!("true");
                p
            },
            "command",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["command"] = json!([]);
                p
            },
            "command",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["task"] = json!("");
                p
            },
            "task",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["limits"] = json!({"wall_time_s": "soon"});
                p
            },
            "limits.wall_time_s",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["session"]["id"] = json!("../evil");
                p
            },
            "session.id",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["session"]["audience"] = json!("admin");
                p
            },
            "session.audience",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["session"]["project_dir"] = json!("relative/dir");
                p
            },
            "session.project_dir",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["session"]["project_dir"] = json!("/nonexistent/xyz");
                p
            },
            "session.project_dir",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["env"] = json!({"SUBAGENT_RUN_ID": "x"});
                p
            },
            "env.SUBAGENT_RUN_ID",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["surprise"] = json!(1);
                p
            },
            "surprise",
        ),
        (
            {
                let mut p = spawn_params(&s);
                p["task"] = json!("x".repeat(64 * 1024 + 1));
                p
            },
            "task",
        ),
    ];
    for (params, field) in cases {
        let m = c.request("spawn_agent", params);
        let (code, msg) = error_of(&m);
        assert_eq!(code, -32602, "{field}: {msg}");
        assert!(msg.contains(field), "{msg:?} does not name {field}");
    }
    // Nothing was recorded for any of them.
    assert!(!d.state.join("sessions").join(&s).exists());
}

/// A writable path that holds one of the daemon's places (its folder holds
/// the state dir and the socket), or lies in the state dir, is refused
/// naming the field; the same paths as read paths are not.
#[test]
fn writable_paths_holding_or_inside_the_daemons_places_are_refused() {
    let d = Daemon::start();
    let mut c = d.conn();
    let s = session("places");
    let folder = d.dir.path().to_str().unwrap().to_owned();
    std::fs::create_dir_all(d.state.join("sessions")).unwrap();
    let inside = d.state.join("sessions").to_str().unwrap().to_owned();
    let cases = [
        (
            json!({"sandbox": {"write_paths": ["/tmp", &folder]}}),
            "sandbox.write_paths[0]",
            "holds",
        ),
        (
            json!({"sandbox": {"write_paths": [&folder]}}),
            "sandbox.write_paths[0]",
            "holds the daemon's state dir",
        ),
        (
            json!({"sandbox": {"write_paths": [&inside]}}),
            "sandbox.write_paths[0]",
            "lies inside the daemon's state dir",
        ),
        (
            json!({"session": {"id": s, "audience": "team", "project_dir": &folder}, "sandbox": {"write_project": true}}),
            "session.project_dir",
            "holds",
        ),
    ];
    for (extra, field, why) in cases {
        let mut p = spawn_params(&s);
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        let (code, msg) = error_of(&c.request("spawn_agent", p));
        assert_eq!(code, -32602, "{field}: {msg}");
        assert!(msg.contains(field) && msg.contains(why), "{msg:?}");
    }
    assert!(!d.state.join("sessions").join(&s).exists());
    let mut p = spawn_params(&s);
    p["sandbox"] = json!({"read_paths": [&folder, &inside]});
    let run = c.call("spawn_agent", p).unwrap();
    assert_eq!(
        c.wait(run["run_id"].as_str().unwrap())["state"],
        "succeeded"
    );
}

#[test]
fn public_sessions_get_no_subagents() {
    let d = Daemon::start();
    let mut c = d.conn();
    let mut p = spawn_params(&session("pub"));
    p["session"]["audience"] = json!("public");
    let (code, msg) = error_of(&c.request("spawn_agent", p));
    assert_eq!(code, -32001);
    assert_eq!(msg, "subagents are not available to Public sessions");
}

#[test]
fn run_ids_that_are_not_run_ids_never_reach_the_file_system() {
    let d = Daemon::start();
    let mut c = d.conn();
    for bad in [
        "../../etc",
        "../../../tmp",
        "/etc/passwd",
        "",
        "20261130T055552.123456Z-a1b2c3d4/../x",
    ] {
        for method in ["check_agent_run", "wait_agent_run", "cancel_agent_run"] {
            let (code, msg) = error_of(&c.request(method, json!({"run_id": bad})));
            assert_eq!(code, -32602, "{method} {bad:?}: {msg}");
            assert!(msg.contains("run_id"), "{msg}");
        }
    }
    let (code, _) = error_of(&c.request(
        "check_agent_run",
        json!({"run_id": "20261130T055552.123456Z-a1b2c3d4"}),
    ));
    assert_eq!(code, -32000, "a well-formed id that does not exist");
    let (code, msg) = error_of(&c.request("take_notices", json!({"session_id": "../x"})));
    assert_eq!(code, -32602, "{msg}");
}

#[test]
fn an_oversized_line_closes_only_that_connection() {
    let d = Daemon::start();
    let mut big = d.conn();
    let mut bystander = d.conn();
    let mut line = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":""#.to_vec();
    line.extend(std::iter::repeat_n(b'a', 1024 * 1024));
    line.extend(b"\"}}\n");
    // The daemon may close before reading all of it; a write error is fine.
    let _ = big.send_raw(&line);
    let msg = big.read_msg().expect("an error before the close");
    let (code, text) = error_of(&msg);
    assert_eq!(code, -32600);
    assert!(text.contains("1 MiB"), "{text}");
    assert!(big.read_msg().is_none(), "the connection is closed");
    assert!(bystander.call("ping", json!({})).is_ok());
    assert_alive(&d);
}

#[test]
fn pipelined_requests_are_answered_by_id_and_notifications_get_no_answer() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(&session("pipe"), &["sh", "-c", "sleep 1"], json!({}));
    let batch = format!(
        "{}\n{}\n{}\n",
        json!({"jsonrpc":"2.0","id":"slow","method":"wait_agent_run","params":{"run_id": run}}),
        json!({"jsonrpc":"2.0","method":"ping"}),
        json!({"jsonrpc":"2.0","id":"fast","method":"ping"}),
    );
    c.send_raw(batch.as_bytes()).unwrap();
    let first = c.read_msg().unwrap();
    assert_eq!(
        first["id"], "fast",
        "ping does not wait behind wait_agent_run: {first}"
    );
    let second = c.read_msg().unwrap();
    assert_eq!(second["id"], "slow");
    assert_eq!(second["result"]["state"], "succeeded");
    // The notification got no response: the next message answers this.
    let m = c.request("ping", json!({}));
    assert!(m["result"]["pid"].as_u64().is_some());
}

#[test]
fn wait_with_a_timeout_returns_the_current_status() {
    let d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(&session("wt"), &["sh", "-c", "sleep 300"], json!({}));
    let st = c
        .call("wait_agent_run", json!({"run_id": run, "timeout_ms": 100}))
        .unwrap();
    assert!(
        matches!(st["state"].as_str(), Some("accepted" | "running")),
        "{st}"
    );
    c.call("cancel_agent_run", json!({"run_id": run})).unwrap();
    assert_eq!(c.wait(&run)["state"], "cancelled");
}

#[test]
fn many_bad_clients_do_not_disturb_a_good_one() {
    let d = Daemon::start();
    let socket = d.socket.clone();
    let noise: Vec<_> = (0..8)
        .map(|i| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Conn::connect(&socket);
                for j in 0..50 {
                    let junk = match (i + j) % 5 {
                        0 => "{\n".to_owned(),
                        1 => "null\n".to_owned(),
                        2 => "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"spawn_agent\",\"params\":{\"session\":5}}\n".to_owned(),
                        3 => "{\"jsonrpc\":\"2.0\",\"id\":[],\"method\":\"ping\"}\n".to_owned(),
                        _ => format!("{}\n", "[".repeat(1000)),
                    };
                    c.send_raw(junk.as_bytes()).unwrap();
                    assert!(c.read_msg().unwrap().get("error").is_some());
                }
            })
        })
        .collect();
    let mut good = d.conn();
    let s = session("good");
    for _ in 0..5 {
        let run = good.spawn(&s, &["true"], json!({}));
        assert_eq!(good.wait(&run)["state"], "succeeded");
    }
    for t in noise {
        t.join().unwrap();
    }
    assert_alive(&d);
}

#[test]
fn bad_notifications_and_blank_lines_get_no_answer() {
    let d = Daemon::start();
    let mut c = d.conn();
    c.send_raw(b"\n   \n{\"jsonrpc\":\"2.0\",\"method\":\"no_such\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"check_agent_run\",\"params\":{\"run_id\":5}}\n")
        .unwrap();
    // The first message back answers this request: nothing before it.
    let m = c.request("ping", json!({}));
    assert!(m.get("result").is_some(), "{m}");
    assert!(c.notifications.is_empty());
}

#[test]
fn limits_out_of_range_are_refused_and_the_rest_enforced() {
    let d = Daemon::start();
    let mut c = d.conn();
    for (field, value) in [
        ("wall_time_s", json!(u64::MAX)),
        ("memory_mb", json!(0)),
        ("pids", json!(0)),
        ("output_mb", json!(1u64 << 40)),
    ] {
        let mut p = spawn_params(&session("lim"));
        p["limits"] = json!({ field: value });
        let (code, msg) = error_of(&c.request("spawn_agent", p));
        assert_eq!(code, -32602);
        assert!(msg.contains(&format!("limits.{field}")), "{msg}");
    }
    // memory_mb and pids are enforced (by cgroups): accepted, and reported.
    let run = c.spawn(
        &session("lim"),
        &["true"],
        json!({"limits": {"memory_mb": 128, "pids": 16}}),
    );
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    let cg = st["isolation"]["cgroup"]["detail"].as_str().unwrap();
    assert!(
        cg.contains("memory 128 MiB") && cg.contains("pids 16"),
        "{cg}"
    );
}

#[test]
fn a_second_subscribe_replaces_the_first() {
    let d = Daemon::start();
    let s = session("resub");
    let mut sub = d.conn();
    sub.call("subscribe", json!({})).unwrap();
    sub.call("subscribe", json!({"session_id": s})).unwrap();
    let mut c = d.conn();
    let run = c.spawn(&s, &["true"], json!({}));
    c.wait(&run);
    let n = sub.read_msg().unwrap();
    assert_eq!(n["params"]["run_id"], run.as_str());
    let m = sub.request("ping", json!({}));
    assert!(m.get("result").is_some());
    assert!(
        sub.notifications.is_empty(),
        "delivered twice: {:?}",
        sub.notifications
    );
}

#[test]
fn shutdown_answers_a_pending_wait() {
    let mut d = Daemon::start();
    let mut c = d.conn();
    let run = c.spawn(&session("shut"), &["sleep", "300"], json!({}));
    subagentd_e2e::wait_until(
        std::time::Duration::from_secs(20),
        "the run to start",
        || c.call("check_agent_run", json!({"run_id": run})).unwrap()["state"] == "running",
    );
    c.send_raw(
        format!(
            "{}\n",
            json!({"jsonrpc":"2.0","id":9,"method":"wait_agent_run","params":{"run_id": run}})
        )
        .as_bytes(),
    )
    .unwrap();
    // The wait is in flight once a later ping on the same connection is answered.
    let m = c.request("ping", json!({}));
    assert!(m.get("result").is_some());
    subagentd_e2e::unsafe_kill(d.pid(), libc::SIGTERM);
    let m = c.read_msg().expect("an answer before the close");
    assert_eq!(m["id"], 9);
    assert_eq!(error_of(&m).0, -32004, "{m}");
    assert!(d.child.wait().unwrap().success());
    // The run is still going without the daemon; end it by hand.
    let rec = subagentd_e2e::stored_run(
        &d.state
            .join("sessions")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("runs")
            .join(&run),
    )
    .expect("the run is in state.db");
    subagentd_e2e::unsafe_kill(rec["runner_pid"].as_i64().unwrap() as i32, libc::SIGTERM);
}

/// Every page of `list_agent_runs` from `params` on, following next_cursor:
/// the run ids in the order given, and how many pages it took.
fn walk(c: &mut Conn, params: Value) -> (Vec<String>, usize) {
    let (mut ids, mut pages, mut p) = (Vec::new(), 0, params);
    loop {
        let v = c.call("list_agent_runs", p.clone()).unwrap();
        pages += 1;
        for r in v["runs"].as_array().unwrap() {
            ids.push(r["run_id"].as_str().unwrap().to_owned());
        }
        match v["next_cursor"].as_str() {
            Some(cur) => p["cursor"] = json!(cur),
            None => return (ids, pages),
        }
        assert!(pages < 1000, "the cursor never ends");
    }
}

/// Spawns `n` runs of `command` in `s`, waits for each; their ids in order.
fn runs(c: &mut Conn, s: &str, n: usize, command: &[&str]) -> Vec<String> {
    (0..n)
        .map(|_| {
            let id = c.spawn(s, command, json!({}));
            c.wait(&id);
            id
        })
        .collect()
}

#[test]
fn list_pages_are_bounded_and_bad_params_named() {
    let d = Daemon::start();
    let mut c = d.conn();
    for (params, field, says) in [
        (json!({"limit": 0}), "limit", "1000"),
        (json!({"limit": 1001}), "limit", "1000"),
        (json!({"limit": -1}), "limit", ""),
        (json!({"cursor": "not-a-cursor"}), "cursor", "next_cursor"),
        (json!({"cursor": 7}), "cursor", ""),
        (json!({"since": "yesterday"}), "since", "RFC 3339"),
        (json!({"until": "2026-01-01"}), "until", "RFC 3339"),
        (json!({"order": "sideways"}), "order", ""),
    ] {
        let (code, msg) = error_of(&c.request("list_agent_runs", params.clone()));
        assert_eq!(code, -32602, "{params}: {msg}");
        assert!(msg.contains(field) && msg.contains(says), "{params}: {msg}");
    }
    // A run id where a cursor belongs is not one either.
    let s = session("pg-bound");
    let ids = runs(&mut c, &s, 101, &["true"]);
    let (_, msg) = error_of(&c.request("list_agent_runs", json!({"cursor": ids[0]})));
    assert!(msg.contains("cursor"), "{msg}");

    // The default page is 100 runs, and the next one holds the 101st.
    let v = c.call("list_agent_runs", json!({"session_id": s})).unwrap();
    let page: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        page,
        ids[..100].iter().map(String::as_str).collect::<Vec<_>>()
    );
    let cursor = v["next_cursor"].as_str().expect("a next page");
    let v = c
        .call(
            "list_agent_runs",
            json!({"session_id": s, "cursor": cursor}),
        )
        .unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 1);
    assert_eq!(v["runs"][0]["run_id"], ids[100].as_str());
    assert!(v["next_cursor"].is_null(), "{v}");
    // 1000 is allowed, and then all 101 fit in one page.
    let v = c
        .call("list_agent_runs", json!({"session_id": s, "limit": 1000}))
        .unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 101);
    assert!(v["next_cursor"].is_null());
}

#[test]
fn a_cursor_walks_every_run_once_in_either_order() {
    let d = Daemon::start();
    let mut c = d.conn();
    let s = session("pg-walk");
    let ids = runs(&mut c, &s, 25, &["true"]);
    let (asc, pages) = walk(&mut c, json!({"session_id": s, "limit": 10}));
    assert_eq!((asc.as_slice(), pages), (ids.as_slice(), 3));
    let (desc, pages) = walk(
        &mut c,
        json!({"session_id": s, "limit": 10, "order": "desc"}),
    );
    let reversed: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!((desc, pages), (reversed, 3));
    // An exact multiple of the limit ends with next_cursor null, no empty page.
    let (all, pages) = walk(&mut c, json!({"session_id": s, "limit": 5}));
    assert_eq!((all.len(), pages), (25, 5));
    // An old client's params: every run, and the new member is null.
    let v = c.call("list_agent_runs", json!({"session_id": s})).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 25);
    assert!(v.get("next_cursor").is_some_and(Value::is_null), "{v}");
}

#[test]
fn runs_spawned_between_pages_are_neither_doubled_nor_skipped() {
    let d = Daemon::start();
    let mut c = d.conn();
    let s = session("pg-live");
    let mut ids = runs(&mut c, &s, 9, &["true"]);
    let mut p = json!({"session_id": s, "limit": 3});
    let mut seen = Vec::new();
    let mut spawner = d.conn();
    loop {
        let v = c.call("list_agent_runs", p.clone()).unwrap();
        seen.extend(
            v["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["run_id"].as_str().unwrap().to_owned()),
        );
        match v["next_cursor"].as_str() {
            Some(cur) => p["cursor"] = json!(cur),
            None => break,
        }
        // A new run, still going, between every two pages for a while.
        if ids.len() < 15 {
            ids.push(spawner.spawn(&s, &["sleep", "30"], json!({})));
        }
    }
    assert_eq!(
        seen, ids,
        "oldest first, each once, the new ones at the end"
    );
    // Newest first from a cursor, the runs spawned since are not in it.
    let v = c
        .call(
            "list_agent_runs",
            json!({"session_id": s, "limit": 4, "order": "desc"}),
        )
        .unwrap();
    let first: Vec<String> = ids.iter().rev().take(4).cloned().collect();
    let got: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(got, first);
    let later = spawner.spawn(&s, &["true"], json!({}));
    let (rest, _) = walk(
        &mut c,
        json!({"session_id": s, "limit": 4, "order": "desc",
               "cursor": v["next_cursor"].as_str().unwrap()}),
    );
    assert!(!rest.contains(&later));
    let older: Vec<String> = ids.iter().rev().skip(4).cloned().collect();
    assert_eq!(rest, older);
    for id in &ids[9..] {
        spawner
            .call("cancel_agent_run", json!({"run_id": id}))
            .unwrap();
    }
}

#[test]
fn lists_filter_by_session_state_and_creation_time() {
    let d = Daemon::start();
    let mut c = d.conn();
    let (a, b) = (session("pg-fa"), session("pg-fb"));
    let ok = runs(&mut c, &a, 3, &["true"]);
    let failed = runs(&mut c, &b, 1, &["false"]);
    let later = runs(&mut c, &b, 1, &["true"]);
    let ids = |v: &Value| -> Vec<String> {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let v = c
        .call(
            "list_agent_runs",
            json!({"session_id": b, "state": "failed"}),
        )
        .unwrap();
    assert_eq!(ids(&v), failed);
    let v = c
        .call(
            "list_agent_runs",
            json!({"session_id": a, "state": "failed"}),
        )
        .unwrap();
    assert!(ids(&v).is_empty() && v["next_cursor"].is_null(), "{v}");

    let created = |id: &str, c: &mut Conn| -> String {
        let st = c.call("check_agent_run", json!({"run_id": id})).unwrap();
        st["created_at"].as_str().unwrap().to_owned()
    };
    let (t1, t2) = (created(&ok[1], &mut c), created(&failed[0], &mut c));
    // Both ends are inclusive, and filters combine with the cursor's pages.
    let mine = |v: &Value| -> Vec<String> {
        let all = [ok.clone(), failed.clone(), later.clone()].concat();
        ids(v).into_iter().filter(|i| all.contains(i)).collect()
    };
    let v = c
        .call("list_agent_runs", json!({"since": t1, "until": t2}))
        .unwrap();
    assert_eq!(
        mine(&v),
        vec![ok[1].clone(), ok[2].clone(), failed[0].clone()]
    );
    let (paged, _) = walk(&mut c, json!({"since": t1, "until": t2, "limit": 1}));
    let paged: Vec<String> = paged
        .into_iter()
        .filter(|i| ok.contains(i) || failed.contains(i))
        .collect();
    assert_eq!(paged, vec![ok[1].clone(), ok[2].clone(), failed[0].clone()]);
    let v = c
        .call("list_agent_runs", json!({"session_id": b, "since": t2}))
        .unwrap();
    assert_eq!(ids(&v), [failed.clone(), later.clone()].concat());
    let v = c
        .call(
            "list_agent_runs",
            json!({"session_id": a, "until": "2000-01-01T00:00:00Z"}),
        )
        .unwrap();
    assert!(ids(&v).is_empty());
    // An offset names the same instant.
    let v = c
        .call(
            "list_agent_runs",
            json!({"session_id": a, "since": "2000-01-01T01:00:00+01:00"}),
        )
        .unwrap();
    assert_eq!(ids(&v), ok);
}
