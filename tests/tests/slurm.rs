//! The Slurm backend against a real single-node cluster
//! (`scripts/slurm-cluster`, which scripts/test starts and names in
//! `SUBAGENT_SLURM_CONF`): runs placed as jobs end with their logs,
//! notices and result.md; a pending job shows as `accepted` with Slurm's
//! reason; a cancel reaches scancel, a cancel from outside and Slurm's time
//! limit end the run so; a daemon killed and started again follows its
//! jobs; a node lost ends its run `lost`; 50 runs through a 4-job limit.
//! The tests take the cluster one at a time (one of them stops slurmd).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;
use subagentd_e2e::{runnable, session, wait_until, Conn, Daemon, DaemonOpts};

/// One test at a time on the cluster.
static CLUSTER: Mutex<()> = Mutex::new(());

/// The cluster's slurm.conf, when scripts/test started one.
fn cluster() -> Option<PathBuf> {
    let conf = std::env::var_os("SUBAGENT_SLURM_CONF").map(PathBuf::from);
    let up = conf.as_ref().is_some_and(|c| {
        Command::new("sinfo")
            .env("SLURM_CONF", c)
            .arg("-h")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    runnable(
        up,
        "slurm",
        "no Slurm cluster answers (scripts/test starts one with scripts/slurm-cluster and names its slurm.conf in SUBAGENT_SLURM_CONF)",
    )
    .then(|| conf.unwrap_or_default())
}

/// A daemon whose runs are jobs of the cluster at `conf`, their folders
/// under a shared dir of its own; `extra` goes into `[backend]`.
fn daemon(conf: &Path, max: usize, extra: &str) -> (Daemon, tempfile::TempDir) {
    let (opts, dir) = options(conf, max, extra);
    (Daemon::start_with(opts), dir)
}

/// How [`daemon`] starts one, and the dir of its config and shared dir.
fn options(conf: &Path, max: usize, extra: &str) -> (DaemonOpts, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix("sa-slurm-")
        .tempdir()
        .unwrap();
    let shared = dir.path().join("shared");
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[backend]\nkind = \"slurm\"\nshared_dir = {:?}\npoll_interval_ms = 250\n{extra}\n",
            shared.display().to_string()
        ),
    )
    .unwrap();
    let opts = DaemonOpts {
        max_concurrent: Some(max),
        args: vec!["--config".into(), cfg.display().to_string()],
        env: vec![("SLURM_CONF".into(), conf.display().to_string())],
        ..Default::default()
    };
    (opts, dir)
}

/// `squeue`'s word on job `id`: its state, reason and name.
fn job(conf: &Path, id: u64) -> Option<(String, String, String)> {
    let out = Command::new("squeue")
        .env("SLURM_CONF", conf)
        .args(["-h", "-t", "all", "-j", &id.to_string(), "-o", "%T|%r|%j"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut f = text.trim().splitn(3, '|').map(str::to_owned);
    Some((f.next()?, f.next()?, f.next()?))
}

fn job_id(st: &Value) -> u64 {
    assert_eq!(st["backend"]["kind"], "slurm", "{st}");
    st["backend"]["job_id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no job id: {st}"))
}

/// `method`'s result, which must not be an error.
fn call(c: &mut Conn, method: &str, params: Value) -> Value {
    c.call(method, params)
        .unwrap_or_else(|e| panic!("{method}: {e}"))
}

/// Waits until the run's state is `want`.
fn wait_state(c: &mut Conn, run: &str, want: &str, limit: Duration) -> Value {
    let mut last = Value::Null;
    wait_until(limit, &format!("run {run} to be {want}"), || {
        last = call(c, "check_agent_run", json!({ "run_id": run }));
        last["state"] == want
    });
    last
}

#[test]
fn runs_placed_as_jobs_end_with_their_logs_notices_and_result_md() {
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let (d, _dir) = daemon(&conf, 4, "");
    let mut c = d.conn();
    let s = session("slurm");
    let run = c.spawn(
        &s,
        &["sh", "-c", "echo hello from a job; exit 3"],
        json!({}),
    );
    // The job id is recorded before the spawn is answered.
    let first = call(&mut c, "check_agent_run", json!({ "run_id": run }));
    let id = job_id(&first);
    let st = c.wait(&run);
    assert_eq!(st["state"], "failed", "{st}");
    assert_eq!(st["exit_code"], 3, "{st}");
    assert_eq!(job_id(&st), id);
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(log, "hello from a job\n");
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(
        result.contains(&format!("- backend: slurm job {id}")),
        "{result}"
    );
    assert!(result.contains("- exit code: 3"), "{result}");
    // Slurm ran it as the job the run named.
    let (state, _, name) = job(&conf, id).unwrap();
    assert_eq!((state.as_str(), name.as_str()), ("COMPLETED", run.as_str()));
    let notices = call(&mut c, "take_notices", json!({ "session_id": s }));
    assert_eq!(notices["notices"][0]["run_id"], run, "{notices}");
    let ls = d.cli(&["ls", "--session", &s]);
    let text = String::from_utf8_lossy(&ls.stdout);
    assert!(text.contains(&format!("slurm job {id}")), "{text}");
    // The isolation of a job's run is the runner's, as on this host.
    assert_eq!(st["isolation"]["landlock"]["enforced"], true, "{st}");
}

#[test]
fn a_pending_job_is_accepted_with_slurms_reason_and_its_cancel_ends_it() {
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let (d, _dir) = daemon(&conf, 4, "extra_args = [\"--begin=now+1hour\"]");
    let mut c = d.conn();
    let run = c.spawn(&session("slurm"), &["echo", "never"], json!({}));
    let mut st = Value::Null;
    wait_until(Duration::from_secs(30), "Slurm's pending reason", || {
        st = call(&mut c, "check_agent_run", json!({ "run_id": run }));
        st["reason"]
            .as_str()
            .is_some_and(|r| r.contains("BeginTime"))
    });
    assert_eq!(st["state"], "accepted", "{st}");
    let id = job_id(&st);
    call(&mut c, "cancel_agent_run", json!({ "run_id": run }));
    let st = c.wait(&run);
    assert_eq!(st["state"], "cancelled", "{st}");
    assert_eq!(job(&conf, id).unwrap().0, "CANCELLED");
}

#[test]
fn a_cancel_reaches_scancel_and_an_outside_scancel_ends_the_run_cancelled() {
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let (d, _dir) = daemon(&conf, 4, "");
    let mut c = d.conn();
    let s = session("slurm");
    let ours = c.spawn(&s, &["sleep", "300"], json!({}));
    let theirs = c.spawn(&s, &["sleep", "300"], json!({}));
    for r in [&ours, &theirs] {
        wait_state(&mut c, r, "running", Duration::from_secs(60));
    }
    let st = call(&mut c, "cancel_agent_run", json!({ "run_id": ours }));
    let ours_job = job_id(&st);
    let st = c.wait(&ours);
    assert_eq!(st["state"], "cancelled", "{st}");
    assert_eq!(job(&conf, ours_job).unwrap().0, "CANCELLED");
    let theirs_job = job_id(&call(
        &mut c,
        "check_agent_run",
        json!({ "run_id": theirs }),
    ));
    let out = Command::new("scancel")
        .env("SLURM_CONF", &conf)
        .arg(theirs_job.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let st = c.wait(&theirs);
    assert_eq!(st["state"], "cancelled", "{st}");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!(
            "Slurm job {theirs_job} was cancelled outside subagentd"
        )),
        "{reason}"
    );
}

#[test]
fn a_job_past_its_time_limit_ends_timed_out() {
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    // A one-minute job: the run's 60 s and no margin.
    let (d, _dir) = daemon(&conf, 4, "time_margin_s = 0");
    let mut c = d.conn();
    let run = c.spawn(
        &session("slurm"),
        &["sleep", "600"],
        json!({"limits": {"wall_time_s": 60}}),
    );
    let st = wait_state(&mut c, &run, "running", Duration::from_secs(60));
    let id = job_id(&st);
    // The runner is stopped, so Slurm's limit ends the run (Slurm sends
    // SIGCONT with its SIGTERM: the runner may then say its own time was
    // up too, and the reason gives both).
    let lock = Path::new(st["log_path"].as_str().unwrap()).with_file_name("runner.lock");
    let mut pid = 0;
    wait_until(Duration::from_secs(20), "the runner's pid", || {
        pid = std::fs::read_to_string(&lock)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    assert!(subagentd_e2e::unsafe_kill(pid, libc::SIGSTOP));
    let st = wait_state(&mut c, &run, "timed_out", Duration::from_secs(180));
    assert_eq!(job(&conf, id).unwrap().0, "TIMEOUT");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("Slurm job {id} reached its time limit")),
        "{reason}"
    );
}

#[test]
fn a_restarted_daemon_follows_its_jobs_again() {
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let (opts, _dir) = options(&conf, 4, "");
    let mut d = Daemon::start_with(opts.clone());
    let gate = subagentd_e2e::channel();
    let go = gate.path().join("go");
    let mut c = d.conn();
    let s = session("slurm");
    let script = format!(
        "echo before; while [ ! -e {} ]; do sleep 0.1; done; echo after",
        go.display()
    );
    let run = c.spawn(
        &s,
        &["sh", "-c", &script],
        json!({"sandbox": {"read_paths": [gate.path()]}}),
    );
    let st = wait_state(&mut c, &run, "running", Duration::from_secs(60));
    let id = job_id(&st);
    drop(c);
    assert!(subagentd_e2e::unsafe_kill(d.pid(), libc::SIGKILL));
    d.restart_with(&opts);
    let mut c = d.conn();
    let st = call(&mut c, "check_agent_run", json!({ "run_id": run }));
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(job_id(&st), id);
    std::fs::write(&go, "").unwrap();
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(log, "before\nafter\n");
}

/// A daemon killed between sbatch and the commit of the job id (made
/// here by taking the id out of the stopped daemon's record): the restart
/// finds the job by its name, the run's id, and follows it; nothing is
/// submitted twice.
#[test]
fn a_run_whose_job_id_was_not_recorded_is_found_by_its_name() {
    let Some(conf) = cluster() else { return };
    let sqlite = Command::new("sqlite3").arg("-version").output();
    if !runnable(
        sqlite.is_ok_and(|o| o.status.success()),
        "sqlite3",
        "the test edits a stopped daemon's record with the sqlite3 shell",
    ) {
        return;
    }
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let (opts, _dir) = options(&conf, 4, "");
    let mut d = Daemon::start_with(opts.clone());
    let gate = subagentd_e2e::channel();
    let go = gate.path().join("go");
    let mut c = d.conn();
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.1; done; echo found",
        go.display()
    );
    let run = c.spawn(
        &session("slurm"),
        &["sh", "-c", &script],
        json!({"sandbox": {"read_paths": [gate.path()]}}),
    );
    let id = job_id(&wait_state(
        &mut c,
        &run,
        "running",
        Duration::from_secs(60),
    ));
    drop(c);
    assert!(subagentd_e2e::unsafe_kill(d.pid(), libc::SIGKILL));
    wait_until(Duration::from_secs(10), "the daemon to die", || {
        d.child.try_wait().ok().flatten().is_some()
    });
    let out = Command::new("sqlite3")
        .arg(d.state.join("state.db"))
        .arg(format!(
            "UPDATE run_ends SET end = json_remove(end, '$.backend.job_id') WHERE run_id = '{run}';"
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    d.restart_with(&opts);
    let mut c = d.conn();
    let mut st = Value::Null;
    wait_until(Duration::from_secs(30), "the job found by its name", || {
        st = call(&mut c, "check_agent_run", json!({ "run_id": run }));
        st["backend"]["job_id"].is_u64()
    });
    assert_eq!(job_id(&st), id, "{st}");
    std::fs::write(&go, "").unwrap();
    let st = c.wait(&run);
    assert_eq!(st["state"], "succeeded", "{st}");
    let named = Command::new("squeue")
        .env("SLURM_CONF", &conf)
        .args(["-h", "-t", "all", "-n", &run, "-o", "%i"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&named.stdout).trim(),
        id.to_string()
    );
}

#[test]
fn a_job_whose_node_is_lost_ends_its_run_lost() {
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let cluster_dir = conf.parent().unwrap().to_path_buf();
    let (d, _dir) = daemon(&conf, 4, "");
    let mut c = d.conn();
    let run = c.spawn(&session("slurm"), &["sleep", "600"], json!({}));
    let st = wait_state(&mut c, &run, "running", Duration::from_secs(60));
    let id = job_id(&st);
    let slurmd_pid: i32 = std::fs::read_to_string(cluster_dir.join("run").join("slurmd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let back = SlurmdBack(cluster_dir);
    assert!(subagentd_e2e::unsafe_kill(slurmd_pid, libc::SIGTERM));
    // The node is declared down after SlurmdTimeout and a ping cycle.
    let st = wait_state(&mut c, &run, "lost", Duration::from_secs(180));
    drop(back);
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("the Slurm job {id} ended NODE_FAIL")),
        "{reason}"
    );
}

/// Starts the cluster's slurmd again when dropped, however the test ends:
/// the tests after it need the node.
struct SlurmdBack(PathBuf);

impl Drop for SlurmdBack {
    fn drop(&mut self) {
        let out = Command::new(cluster_script())
            .arg("start")
            .arg(&self.0)
            .output();
        assert!(
            std::thread::panicking() || out.as_ref().is_ok_and(|o| o.status.success()),
            "restarting slurmd: {out:?}"
        );
    }
}

fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/slurm-cluster")
}

#[test]
fn fifty_runs_through_a_four_job_limit_all_succeed() {
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let (d, _dir) = daemon(&conf, 4, "");
    let mut c = d.conn();
    let s = session("slurm");
    let runs: Vec<String> = (0..50)
        .map(|i| c.spawn(&s, &["sh", "-c", &format!("echo run {i}")], json!({})))
        .collect();
    let ours: std::collections::HashSet<&str> = runs.iter().map(String::as_str).collect();
    let (mut most, mut seen) = (0, 0);
    wait_until(Duration::from_secs(600), "the 50 runs to end", || {
        // Slurm's own count of the runs' jobs not ended yet.
        let out = Command::new("squeue")
            .env("SLURM_CONF", &conf)
            .args(["-h", "-t", "PD,CF,R,CG,S", "-o", "%j"])
            .output()
            .unwrap();
        let live = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|n| ours.contains(n.trim()))
            .count();
        most = most.max(live);
        seen += usize::from(live > 0);
        let all = c.list_all(json!({"session_id": s}));
        all.len() == 50 && all.iter().all(|r| r["state"] == "succeeded")
    });
    assert!(seen > 0, "no live job was ever seen");
    assert!(
        most <= 4,
        "{most} jobs were submitted and not ended at once"
    );
    for (i, r) in runs.iter().enumerate() {
        let st = call(&mut c, "check_agent_run", json!({ "run_id": r }));
        let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
        assert_eq!(log, format!("run {i}\n"));
    }
}

/// A port on 127.0.0.1 no one listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP answer, `hello <path>`, per connection, on 127.0.0.1.
fn hello_server() -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&b[..n]),
                }
            }
            let text = String::from_utf8_lossy(&head).into_owned();
            let body = format!("hello {}\n", text.split(' ').nth(1).unwrap_or("?"));
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// An allowlist run as a job reaches its listed destination through the
/// daemon's egress proxy, relayed by its runner to the job services port;
/// an unlisted one is refused there; a connection to the port without the
/// run's token is closed unanswered.
#[test]
fn an_allowlist_job_reaches_the_proxy_through_the_job_services_port() {
    use std::io::{Read, Write};
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let services = free_port();
    let (d, _dir) = daemon(
        &conf,
        4,
        &format!("services_listen = \"127.0.0.1:{services}\""),
    );
    let (listed, unlisted) = (hello_server(), hello_server());
    let mut c = d.conn();
    let script = format!(
        "unset NO_PROXY no_proxy\n\
         curl -s -m 20 http://127.0.0.1:{listed}/through-the-port; echo\n\
         curl -s -m 20 -o /dev/null -w 'UNLISTED %{{http_code}}\\n' http://127.0.0.1:{unlisted}/no\n"
    );
    let run = c.spawn(
        &session("slurm"),
        &["sh", "-c", &script],
        json!({"sandbox": {"network_allow": [format!("127.0.0.1:{listed}")]}}),
    );
    let st = c.wait(&run);
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    assert!(log.contains("hello /through-the-port"), "{log}");
    assert!(log.contains("UNLISTED 403"), "{log}");
    assert_eq!(st["egress"]["allowed"], 1, "{st}");
    // Without the run's token, nothing is served.
    let mut probe = std::net::TcpStream::connect(("127.0.0.1", services)).unwrap();
    probe
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    writeln!(probe, "SUBAGENT/1 egress {run} {}", "00".repeat(32)).unwrap();
    probe
        .write_all(
            format!("GET http://127.0.0.1:{listed}/stolen HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .unwrap();
    let mut answer = Vec::new();
    let _ = probe.read_to_end(&mut answer);
    assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));
}

/// Claude Code as a job: its model requests reach the daemon's model
/// gateway through the job services port and get the daemon's key there;
/// the key is in no file of the run, the shared dir or the state dir.
#[test]
fn a_driver_job_reaches_its_gateway_and_the_key_stays_with_the_daemon() {
    use subagentd_e2e::agents;
    use subagentd_e2e::modelserver::{ModelServer, Turn};
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let Some(conf) = cluster() else { return };
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let project = tempfile::Builder::new()
        .prefix("sa-slurm-drv-")
        .tempdir_in("/tmp")
        .unwrap();
    let target = project.path().canonicalize().unwrap().join("hello.txt");
    let server = ModelServer::start(vec![
        Turn::tool(
            "Write",
            json!({"file_path": target, "content": "hi from a job\n"}),
        ),
        Turn::text("Wrote hello.txt."),
    ])
    .unwrap();
    let secret = format!("sk-test-{}", session("key"));
    let (mut opts, dir) = options(
        &conf,
        4,
        &format!("services_listen = \"127.0.0.1:{}\"", free_port()),
    );
    let cfg = dir.path().join("config.toml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[drivers.claude-code]\ncommand = {:?}\nbase_url = {:?}\napi_key_env = {:?}\n",
        claude.display().to_string(),
        server.base_url(),
        agents::KEY_VAR
    ));
    std::fs::write(&cfg, text).unwrap();
    opts.env.push((agents::KEY_VAR.to_owned(), secret.clone()));
    let d = Daemon::start_with(opts);
    let mut c = d.conn();
    let r = call(
        &mut c,
        "spawn_agent",
        json!({"session": {"id": session("slurm"), "audience": "personal",
                           "project_dir": project.path(), "tools": ["file_read", "file_write"]},
               "task": "Write hello.txt saying hi.", "driver": "claude-code"}),
    );
    let st = c.wait(r["run_id"].as_str().unwrap());
    assert_eq!(st["state"], "succeeded", "{st}");
    assert!(st["backend"]["job_id"].is_u64(), "{st}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hi from a job\n");
    let reqs = server.model_requests();
    assert!(reqs.len() >= 2, "{reqs:?}");
    assert_eq!(reqs[0].header("x-api-key"), Some(secret.as_str()));
    for root in [dir.path(), d.state.as_path()] {
        let mut stack = vec![root.to_path_buf()];
        while let Some(p) = stack.pop() {
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                let t = e.file_type().unwrap();
                if t.is_dir() {
                    stack.push(e.path());
                } else if t.is_file() {
                    let bytes = std::fs::read(e.path()).unwrap_or_default();
                    let hit = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
                    assert!(!hit, "the key is in {}", e.path().display());
                }
            }
        }
    }
    assert!(!d.log().contains(&secret), "the key is in the daemon's log");
}

#[test]
fn an_allowlist_run_is_refused_naming_the_proxy_a_job_cannot_reach() {
    // No cluster needed: the refusal comes before any job.
    let dir = tempfile::tempdir().unwrap();
    let (d, _d2) = daemon(&dir.path().join("none.conf"), 4, "");
    let mut c = d.conn();
    let e = c
        .call(
            "spawn_agent",
            json!({"session": {"id": session("slurm"), "audience": "personal", "project_dir": "/tmp"},
                   "task": "t", "command": ["true"],
                   "sandbox": {"network_allow": ["example.com:443"]}}),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32005, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("egress_proxy"),
        "{e}"
    );
}
