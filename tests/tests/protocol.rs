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
