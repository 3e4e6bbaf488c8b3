//! Usage per run and per session: real Claude Code (and Codex) runs
//! against the scripted model server (each answer: 100 input and 20
//! output tokens), their status's `usage` checked against the final
//! events in their child.log, a session's `usage` against the sum of its
//! runs', a live run's figures growing while the model server holds its
//! next answer, none for a plain command, and budgets: Claude Code stopped
//! by `max_turns` and `max_budget_usd`, a budget refused for Codex and for
//! a plain command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use subagentd_e2e::agents::{self, daemon, KEY_VAR};
use subagentd_e2e::modelserver::{ModelServer, Turn};
use subagentd_e2e::{session, wait_until, Daemon};

fn key() -> String {
    format!("sk-test-{}", session("key"))
}

/// A project dir the run's uid can read, with a file to read.
fn project() -> tempfile::TempDir {
    let p = tempfile::Builder::new()
        .prefix("sa-usage-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(p.path().join("a.txt"), "hello\n").unwrap();
    p
}

fn read_a(p: &Path) -> Turn {
    let path = p.canonicalize().unwrap().join("a.txt");
    Turn::tool("Read", json!({ "file_path": path }))
}

/// Starts a run of `driver` in `s` and returns its id.
fn start(d: &Daemon, s: &str, p: &Path, driver: &str, tools: &[&str], extra: Value) -> String {
    let mut params = json!({
        "session": {"id": s, "audience": "personal", "project_dir": p, "tools": tools},
        "task": "Read a.txt and say what it holds.",
        "driver": driver,
    });
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    let r = d
        .conn()
        .call("spawn_agent", params)
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    r["run_id"].as_str().unwrap().to_owned()
}

/// What the agent's final events in child.log say: Claude Code's last
/// `result` line, or Codex's `turn.completed` lines added up.
fn from_log(st: &Value) -> Value {
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    let events: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    match st["driver"]["driver"].as_str().unwrap() {
        "claude-code" => {
            let r = events.iter().rev().find(|e| e["type"] == "result").unwrap();
            json!({"turns": r["num_turns"], "input_tokens": r["usage"]["input_tokens"],
                   "output_tokens": r["usage"]["output_tokens"], "cost_usd": r["total_cost_usd"]})
        }
        _ => {
            let turns: Vec<&Value> = events
                .iter()
                .filter(|e| e["type"] == "turn.completed")
                .collect();
            let sum = |k: &str| {
                turns
                    .iter()
                    .map(|e| e["usage"][k].as_u64().unwrap())
                    .sum::<u64>()
            };
            json!({"turns": turns.len(), "input_tokens": sum("input_tokens"),
                   "output_tokens": sum("output_tokens"), "cost_usd": null})
        }
    }
}

/// Neumaier's sum, in the order given (SQLite's `sum()` of reals).
fn neumaier(xs: impl IntoIterator<Item = f64>) -> f64 {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for x in xs {
        let t = s + x;
        c += if s.abs() >= x.abs() {
            (s - t) + x
        } else {
            (x - t) + s
        };
        s = t;
    }
    s + c
}

/// The figures of `runs` summed as the daemon sums them (null when no run
/// reported the figure).
fn summed(runs: &[&Value]) -> Value {
    let n = |k: &str| {
        let v: Vec<u64> = runs.iter().filter_map(|u| u[k].as_u64()).collect();
        (!v.is_empty()).then(|| v.iter().sum::<u64>())
    };
    let costs: Vec<f64> = runs.iter().filter_map(|u| u["cost_usd"].as_f64()).collect();
    let reported = runs
        .iter()
        .filter(|u| u.as_object().unwrap().values().any(|v| !v.is_null()))
        .count();
    json!({"runs": runs.len(), "reported": reported, "turns": n("turns"),
           "input_tokens": n("input_tokens"), "output_tokens": n("output_tokens"),
           "cost_usd": (!costs.is_empty()).then(|| neumaier(costs))})
}

fn only_totals(v: &Value) -> Value {
    let mut v = v.clone();
    let o = v.as_object_mut().unwrap();
    for k in ["by_driver", "session_id", "since", "until"] {
        o.remove(k);
    }
    v
}

/// The `[drivers.codex]` table for the daemon of [`agents::daemon`], when
/// Codex is installed.
fn codex_table(codex: &Path, base: &str) -> String {
    format!(
        "\n[drivers.codex]\ncommand = {:?}\nbase_url = {base:?}\napi_key_env = {KEY_VAR:?}\nmodel = \"mock-model\"\n",
        codex.display().to_string()
    )
}

/// Three Claude Code runs and a Codex one in one session: each status's
/// `usage` is what its agent's final events say, the session's `usage` is
/// their sum (per driver too), `ls` shows each run's, and the sums stay
/// when the runs are pruned.
#[test]
fn a_sessions_usage_is_the_sum_of_what_each_agent_reported() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let codex = agents::require(agents::codex, "codex");
    let p = project();
    let cc = ModelServer::start(vec![read_a(p.path()), Turn::text("It says hello.")]).unwrap();
    let cx = ModelServer::start(vec![
        Turn::tool("exec_command", json!({"cmd": "cat a.txt"})),
        Turn::text("codex: it says hello"),
    ])
    .unwrap();
    let cx_base = format!("{}/v1", cx.base_url());
    let extra = codex.as_ref().map_or(String::new(), |c| {
        format!("\n[]\n{}", codex_table(c, &cx_base))
    });
    let (d, _home) = daemon("claude-code", &claude, &cc.base_url(), &extra, &key());
    let s = session("usage");
    let mut runs: Vec<String> = (0..3)
        .map(|_| start(&d, &s, p.path(), "claude-code", &["file_read"], json!({})))
        .collect();
    if codex.is_some() {
        runs.push(start(
            &d,
            &s,
            p.path(),
            "codex",
            &["file_read", "shell"],
            json!({}),
        ));
    }
    let statuses: Vec<Value> = runs.iter().map(|r| d.conn().wait(r)).collect();
    for st in &statuses {
        assert_eq!(st["state"], "succeeded", "{st}");
        assert_eq!(st["usage"], from_log(st), "{st}");
    }
    let claude_runs: Vec<&Value> = statuses[..3].iter().map(|s| &s["usage"]).collect();
    // Each model answer was 100 in, 20 out.
    let served = cc.model_requests().len() as u64;
    assert_eq!(summed(&claude_runs)["input_tokens"], json!(100 * served));
    assert_eq!(summed(&claude_runs)["output_tokens"], json!(20 * served));
    assert!(claude_runs
        .iter()
        .all(|u| u["cost_usd"].as_f64().unwrap() > 0.0));

    let got = d.conn().call("usage", json!({"session_id": s})).unwrap();
    assert_eq!(got["session_id"], json!(s));
    let all: Vec<&Value> = statuses.iter().map(|s| &s["usage"]).collect();
    assert_eq!(only_totals(&got), summed(&all), "{got}");
    assert_eq!(
        got["by_driver"]["claude-code"],
        summed(&claude_runs),
        "{got}"
    );
    if codex.is_some() {
        assert_eq!(got["by_driver"]["codex"], summed(&all[3..]), "{got}");
        assert!(
            got["by_driver"]["codex"]["cost_usd"].is_null(),
            "Codex reports no cost"
        );
    }
    // The CLI: the same as JSON, a table, and each run's columns in ls.
    let cli = d.cli(&["usage", "--session", &s, "--json"]);
    assert!(cli.status.success(), "{cli:?}");
    assert_eq!(serde_json::from_slice::<Value>(&cli.stdout).unwrap(), got);
    let text = String::from_utf8(d.cli(&["usage", "--session", &s]).stdout).unwrap();
    assert!(
        text.lines().nth(2).unwrap().starts_with("claude-code"),
        "{text}"
    );
    let ls = String::from_utf8(d.cli(&["ls", "--session", &s]).stdout).unwrap();
    let header = ls.lines().next().unwrap();
    assert!(
        header.contains("TURNS") && header.contains("TOKENS") && header.contains("COST"),
        "{ls}"
    );
    let u = &statuses[0]["usage"];
    let tokens = format!("{}/{}", u["input_tokens"], u["output_tokens"]);
    let row = ls
        .lines()
        .find(|l| l.starts_with(runs[0].as_str()))
        .unwrap();
    assert!(row.contains(&tokens), "{ls}");

    // Pruned runs keep counting: what they spent was spent.
    d.conn()
        .call("take_notices", json!({"session_id": s}))
        .unwrap();
    let pruned = d
        .conn()
        .call("prune_runs", json!({"session_id": s, "older_than": "0s"}))
        .unwrap();
    // All but the session's newest, which retention keeps.
    let removed = pruned["removed"].as_array().unwrap().len();
    assert_eq!(removed, runs.len() - 1, "{pruned}");
    let after = d.conn().call("usage", json!({"session_id": s})).unwrap();
    assert_eq!(after, got);
    // Nothing in a time range before the runs.
    let none = d
        .conn()
        .call(
            "usage",
            json!({"session_id": s, "until": "2001-01-01T00:00:00Z"}),
        )
        .unwrap();
    assert_eq!(
        (none["runs"].as_u64(), none["turns"].as_u64()),
        (Some(0), None),
        "{none}"
    );
}

/// A status's usage while the run goes on: the model server holds its
/// answer to the second, then the third turn, and the figures so far grow
/// with each; once let go, the run ends with its agent's final figures.
#[test]
fn a_live_runs_usage_grows_before_it_ends() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let p = project();
    let server = ModelServer::start(vec![
        read_a(p.path()),
        read_a(p.path()),
        read_a(p.path()),
        Turn::text("Read it three times."),
    ])
    .unwrap();
    server.hold_from(1);
    let (d, _home) = daemon("claude-code", &claude, &server.base_url(), "", &key());
    let s = session("live");
    let run = start(&d, &s, p.path(), "claude-code", &["file_read"], json!({}));
    let status = || {
        d.conn()
            .call("check_agent_run", json!({"run_id": run}))
            .unwrap()
    };
    let so_far = |turns: u64| {
        wait_until(Duration::from_secs(60), "the figures so far", || {
            status()["usage"]["turns"] == turns
        });
        let st = status();
        assert_eq!(st["state"], "running", "{st}");
        let want = json!({"turns": turns, "input_tokens": 100 * turns,
                          "output_tokens": 20 * turns, "cost_usd": null});
        assert_eq!(
            st["usage"], want,
            "only the final event carries a cost: {st}"
        );
        st
    };
    wait_until(Duration::from_secs(60), "the second request", || {
        server.held() == 1
    });
    so_far(1);
    server.hold_from(2);
    wait_until(Duration::from_secs(60), "the third request", || {
        server.held() == 1 && server.model_requests().len() == 2
    });
    so_far(2);
    let listed = d
        .conn()
        .call("list_agent_runs", json!({"session_id": s}))
        .unwrap();
    assert_eq!(listed["runs"][0]["usage"]["turns"], 2, "{listed}");
    let ls = String::from_utf8(d.cli(&["ls", "--session", &s]).stdout).unwrap();
    assert!(ls.contains("200/40"), "{ls}");
    server.release();
    let st = d.conn().wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["usage"], from_log(&st));
    assert_eq!(st["usage"]["input_tokens"], 400, "{st}");
    let sum = d.conn().call("usage", json!({"session_id": s})).unwrap();
    assert_eq!(only_totals(&sum), summed(&[&st["usage"]]));
}

/// A plain command reports no usage: its status has none, and a session's
/// sum counts it among the runs, none reported.
#[test]
fn a_plain_command_has_no_usage() {
    let d = Daemon::start();
    let mut c = d.conn();
    let s = session("plain");
    let run = c.spawn(&s, &["true"], json!({}));
    let st = c.wait(&run);
    assert!(st.get("usage").is_none(), "{st}");
    let sum = c.call("usage", json!({"session_id": s})).unwrap();
    let want = json!({"runs": 1, "reported": 0, "turns": null, "input_tokens": null,
                      "output_tokens": null, "cost_usd": null});
    assert_eq!(only_totals(&sum), want, "{sum}");
    assert_eq!(sum["by_driver"]["command"], want, "{sum}");
    let e = c.call("usage", json!({"since": "yesterday"})).unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert!(e["message"].as_str().unwrap().contains("since"), "{e}");
}

/// Claude Code stops itself at its budget: `max_turns` with a model that
/// asks for a tool forever, and `max_budget_usd`; the budget is in the
/// status and result.md.
#[test]
fn a_budget_stops_claude_code() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let p = project();
    let forever = ModelServer::start(vec![read_a(p.path())]).unwrap();
    let (d, _home) = daemon("claude-code", &claude, &forever.base_url(), "", &key());
    let s = session("budget");
    let run = start(
        &d,
        &s,
        p.path(),
        "claude-code",
        &["file_read"],
        json!({"max_turns": 2}),
    );
    let st = d.conn().wait(&run);
    assert_eq!(st["state"], "failed", "{st}");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains("Reached maximum number of turns (2)"),
        "{reason}"
    );
    assert_eq!(
        forever.model_requests().len(),
        2,
        "two turns, then it stopped"
    );
    assert_eq!(
        st["driver"]["budget"],
        json!({"max_turns": 2, "max_budget_usd": null})
    );
    assert_eq!(st["usage"], from_log(&st));
    let md = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(md.contains("\n- budget: at most 2 turns "), "{md}");

    // Each answer costs the agent about $0.0008: $0.001 is spent in two.
    let before = forever.model_requests().len();
    let run = start(
        &d,
        &s,
        p.path(),
        "claude-code",
        &["file_read"],
        json!({"max_budget_usd": 0.001}),
    );
    let st = d.conn().wait(&run);
    assert_eq!(st["state"], "failed", "{st}");
    assert!(
        st["reason"].as_str().unwrap().contains("maximum budget"),
        "{st}"
    );
    assert_eq!(st["usage"], from_log(&st));
    assert!(st["usage"]["cost_usd"].as_f64().unwrap() >= 0.001, "{st}");
    let asked = forever.model_requests().len() - before;
    assert!(
        (2..=3).contains(&asked),
        "it stopped past $0.001: {asked} turns"
    );
    let check = String::from_utf8(d.cli(&["check", &run]).stdout).unwrap();
    assert!(check.contains("\nbudget       at most $0.001\n"), "{check}");

    // A definition's maxTurns lowers the request's.
    std::fs::create_dir(p.path().join(".subagents")).unwrap();
    std::fs::write(
        p.path().join(".subagents/one.md"),
        "---\nname: one\ndescription: One turn.\nmaxTurns: 1\n---\nYou read.\n",
    )
    .unwrap();
    let before = forever.model_requests().len();
    let extra = json!({"agent": "one", "max_turns": 5});
    let run = start(&d, &s, p.path(), "claude-code", &["file_read"], extra);
    let st = d.conn().wait(&run);
    assert_eq!(st["driver"]["budget"]["max_turns"], 1, "{st}");
    assert_eq!(forever.model_requests().len() - before, 1, "{st}");
}

/// A budget for Codex or a plain command is refused, saying why.
#[test]
fn a_budget_is_refused_where_no_agent_enforces_it() {
    let p = project();
    let (d, _home) = daemon(
        "codex",
        Path::new("/bin/sh"),
        "http://127.0.0.1:9/v1",
        "",
        &key(),
    );
    let refused = |driver: &str, extra: Value| {
        let mut params = json!({
            "session": {"id": session("nobudget"), "audience": "personal", "project_dir": p.path(), "tools": ["file_read"]},
            "task": "t", "driver": driver,
        });
        if driver == "command" {
            params["command"] = json!(["true"]);
        }
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        d.conn().call("spawn_agent", params).unwrap_err()
    };
    let e = refused("codex", json!({"max_turns": 3}));
    assert_eq!(e["code"], -32602, "{e}");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.starts_with("invalid params: max_turns: not with the driver codex"),
        "{m}"
    );
    let e = refused("codex", json!({"max_budget_usd": 1.0}));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("max_budget_usd: not with the driver codex"),
        "{e}"
    );
    let e = refused("command", json!({"max_budget_usd": 1.0}));
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains(
            "max_budget_usd: not with the driver command: a plain command reports no turns or cost"
        ),
        "{m}"
    );
    let e = refused("command", json!({"max_turns": 0}));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("max_turns: must be 1 to"),
        "{e}"
    );
    let out = d.cli(&["spawn", "--task", "t", "--max-turns", "2", "--", "true"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("max_turns: not with the driver command"),
        "{err}"
    );
}
