//! Hostile children: each attack is a small program run as a real child
//! through the real daemon, one run per attack. Each test asserts that the
//! attack failed and that the daemon and the host are unaffected.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use subagentd_e2e::{alive, session, Daemon};

struct Env {
    d: Daemon,
    project: tempfile::TempDir,
}

/// A daemon for one attack; `None` (after `SKIPPED: …`) when the host
/// cannot enforce the default requirements.
fn env() -> Option<Env> {
    let missing = subagentd_e2e::missing_mechanisms();
    for m in &missing {
        if !subagentd_e2e::runnable(false, m, &format!("this host cannot enforce {m}")) {
            return None;
        }
    }
    let d = Daemon::start();
    let project = tempfile::Builder::new()
        .prefix("sa-proj-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(project.path().join("README"), "project file\n").unwrap();
    Some(Env { d, project })
}

impl Env {
    /// Runs `script` as a child; returns its final status and its log.
    fn attack(&self, script: &str, extra: Value) -> (Value, String) {
        let mut c = self.d.conn();
        let mut params = json!({
            "session": {"id": session("evil"), "audience": "personal", "project_dir": self.project.path()},
            "task": "attack",
            "command": ["sh", "-c", script],
        });
        if let Value::Object(m) = extra {
            for (k, v) in m {
                params[k] = v;
            }
        }
        let r = c.call("spawn_agent", params).unwrap();
        let st = c.wait(r["run_id"].as_str().unwrap());
        let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap_or_default();
        (st, log)
    }

    fn healthy(&self) {
        assert!(alive(self.d.pid()), "the daemon is alive");
        let mut c = self.d.conn();
        assert!(c.call("ping", json!({})).is_ok());
    }
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display())
}

#[test]
fn writes_outside_the_allowed_roots_fail() {
    let Some(e) = env() else { return };
    // A victim run whose folder and artifacts the attacker targets.
    let (victim, _) = e.attack("echo ok > \"$SUBAGENT_ARTIFACT_DIR/mine\"", json!({}));
    let victim_art = PathBuf::from(victim["artifact_dir"].as_str().unwrap());
    let victim_run = victim_art.parent().unwrap().to_path_buf();
    let outside = tempfile::Builder::new()
        .prefix("sa-outside-")
        .tempdir_in("/tmp")
        .unwrap();
    let db = e.d.state.join("state.db");
    // The victim's own record in its folder, the database, and a runner
    // spec planted beside them (the daemon keeps specs in state.db only).
    let targets = [
        victim_run.join("exit.json"),
        db.clone(),
        victim_run.join("runner.json"),
        victim_art.join("planted"),
        e.d.state.join("planted"),
        PathBuf::from("/root/sa-planted"),
        outside.path().join("planted"),
        e.project.path().join("planted"),
        e.project.path().join("README"),
    ];
    let before = std::fs::read(victim_run.join("exit.json")).unwrap();
    let script: String = targets
        .iter()
        .map(|t| {
            format!(
                "echo pwned > {} && echo WROTE {};",
                sh_quote(t),
                t.display()
            )
        })
        .collect();
    let (st, log) = e.attack(&format!("{script} echo done"), json!({}));
    assert_eq!(st["state"], "succeeded", "{st}");
    assert!(!log.contains("WROTE"), "a write got through:\n{log}");
    assert_eq!(std::fs::read(victim_run.join("exit.json")).unwrap(), before);
    // The records are whole: the database is still one, with the victim.
    assert!(std::fs::read(&db)
        .unwrap()
        .starts_with(b"SQLite format 3\0"));
    let rec = subagentd_e2e::stored_run(&victim_run).expect("the victim is recorded");
    assert_eq!(rec["state"], "succeeded", "{rec}");
    for t in &targets[2..8] {
        assert!(!t.exists(), "{} was created", t.display());
    }
    assert_eq!(
        std::fs::read_to_string(e.project.path().join("README")).unwrap(),
        "project file\n"
    );
    e.healthy();
}

#[test]
fn write_project_grants_exactly_the_project() {
    let Some(e) = env() else { return };
    let (st, log) = e.attack(
        "echo new > ./made-by-child && echo MADE",
        json!({"sandbox": {"write_project": true}}),
    );
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert!(log.contains("MADE"));
    assert!(e.project.path().join("made-by-child").exists());
}

#[test]
fn reads_outside_the_allowed_roots_fail() {
    let Some(e) = env() else { return };
    let home = tempfile::Builder::new()
        .prefix("sa-home-")
        .tempdir_in("/tmp")
        .unwrap();
    let secret = home.path().join("secret.txt");
    std::fs::write(&secret, "TOPSECRET-1\n").unwrap();
    let (victim, _) = e.attack("true", json!({}));
    let script = format!(
        "cat {} ; cat {}/state.db {}/state.db-wal ; cat /proc/{}/environ ; ls {} ; echo end",
        sh_quote(&secret),
        sh_quote(&e.d.state),
        sh_quote(&e.d.state),
        e.d.pid(),
        sh_quote(&e.d.state)
    );
    let (st, log) = e.attack(&script, json!({}));
    assert_eq!(st["state"], "succeeded");
    assert!(!log.contains("TOPSECRET"), "{log}");
    let victim_id = victim["run_id"].as_str().unwrap();
    assert!(
        !log.contains("SQLite format 3") && !log.contains(victim_id),
        "the state database leaked:\n{log}"
    );
    assert!(
        !log.contains("SUBAGENTD") && !log.contains("RUST_LOG"),
        "the daemon's environ leaked:\n{log}"
    );
    assert!(
        !log.lines().any(|l| l == "sessions" || l == "daemon.lock"),
        "the state dir was listed:\n{log}"
    );
    // Each of the five reads failed: refused, or not there at all in the
    // run's own root.
    let failed = log.matches("Permission denied").count() + log.matches("No such file").count();
    assert_eq!(failed, 5, "{log}");
}

#[test]
fn the_network_is_closed_without_the_grant() {
    let Some(e) = env() else { return };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let py = format!(
        "import socket\n\
         for fam, kind, what in [(socket.AF_INET, socket.SOCK_STREAM, 'tcp'), (socket.AF_INET, socket.SOCK_DGRAM, 'udp'), (socket.AF_INET6, socket.SOCK_STREAM, 'tcp6'), (socket.AF_PACKET, socket.SOCK_RAW, 'packet')]:\n\
         \ttry:\n\
         \t\ts = socket.socket(fam, kind)\n\
         \t\tif what == 'tcp': s.connect(('127.0.0.1', {port}))\n\
         \t\tif what == 'udp': s.sendto(b'x', ('127.0.0.1', {port}))\n\
         \t\tprint('OPEN', what)\n\
         \texcept OSError as e:\n\
         \t\tprint('closed', what, e.errno)\n"
    );
    let script = format!(
        "python3 -c \"$PY\"; bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo OPEN devtcp; curl -s -m 5 http://127.0.0.1:{port}/ >/dev/null 2>&1 && echo OPEN curl; echo end"
    );
    let (st, log) = e.attack(&script, json!({"env": {"PY": py}}));
    assert_eq!(st["state"], "succeeded", "{st}");
    assert!(!log.contains("OPEN"), "{log}");
    assert_eq!(log.matches("closed").count(), 4, "{log}");
    assert!(log.contains("end"), "{log}");
    assert!(listener.accept().is_err(), "the listener saw a connection");
    let iso = &st["isolation"]["network"];
    assert_eq!(iso["enforced"], true, "{st}");
}

#[test]
fn the_network_is_open_with_the_grant() {
    let Some(e) = env() else { return };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!("python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port})); print('CONNECTED')\"");
    let (st, log) = e.attack(&script, json!({"sandbox": {"network": true}}));
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert!(log.contains("CONNECTED"));
}

#[test]
fn the_control_socket_refuses_children() {
    let Some(e) = env() else { return };
    // Each request on a fresh connection: a refused connection is answered
    // once and closed.
    let py = "import socket, os, json\n\
        def call(req):\n\
        \ts = socket.socket(socket.AF_UNIX)\n\
        \ttry:\n\
        \t\ts.connect(os.environ['SOCK'])\n\
        \texcept OSError as e:\n\
        \t\tprint('NOCONNECT', e.errno); return\n\
        \ttry:\n\
        \t\ts.sendall((json.dumps(req) + '\\n').encode())\n\
        \texcept OSError:\n\
        \t\tpass\n\
        \tprint(s.makefile().readline())\n\
        call({'jsonrpc': '2.0', 'id': 1, 'method': 'spawn_agent', 'params': {'session': {'id': 'x', 'audience': 'personal', 'project_dir': '/'}, 'task': 't', 'command': ['true']}})\n\
        call({'jsonrpc': '2.0', 'id': 2, 'method': 'cancel_agent_run', 'params': {'run_id': os.environ['SUBAGENT_RUN_ID']}})\n";
    let (st, log) = e.attack(
        "python3 -c \"$PY\"",
        json!({"env": {"PY": py, "SOCK": e.d.socket}}),
    );
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert!(
        log.contains("NOCONNECT") || log.matches("not permitted from a subagent").count() == 2,
        "{log}"
    );
    let mut c = e.d.conn();
    let runs = c.call("list_agent_runs", json!({})).unwrap();
    assert_eq!(
        runs["runs"].as_array().unwrap().len(),
        1,
        "the child spawned nothing"
    );
    e.healthy();
}

#[test]
fn processes_outside_the_run_are_out_of_reach() {
    let Some(e) = env() else { return };
    let owned = tempfile::NamedTempFile::new_in("/tmp").unwrap();
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(owned.path()).unwrap());
    let script = format!(
        "kill -9 {daemon} || echo refused-daemon; kill -9 $PPID || echo refused-runner; \
         unshare -U true || echo refused-unshare; chown 1:1 {file} || echo refused-chown; \
         python3 -c 'import ctypes; print(\"ptrace\", ctypes.CDLL(None).ptrace(16, 1, 0, 0))'",
        daemon = e.d.pid(),
        file = sh_quote(owned.path())
    );
    let (st, log) = e.attack(&script, json!({}));
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    // (chmod is covered by system_files_keep_their_modes.)
    for want in [
        "refused-daemon",
        "refused-runner",
        "refused-unshare",
        "refused-chown",
        "ptrace -1",
    ] {
        assert!(log.contains(want), "{want} missing:\n{log}");
    }
    let meta = std::fs::metadata(owned.path()).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        owner,
        "still its owner's"
    );
    e.healthy();
}

#[test]
fn a_memory_balloon_fails_with_the_memory_reason() {
    let Some(e) = env() else { return };
    let (st, log) = e.attack(
        "python3 -c 'x = bytearray(256 << 20); print(len(x))'",
        json!({"limits": {"memory_mb": 64}}),
    );
    assert_eq!(st["state"], "failed", "{st} {log}");
    assert!(!log.contains(&(256u64 << 20).to_string()), "{log}");
    // A memory cgroup kills and says so; without one (an unprivileged
    // daemon, see security.md) RLIMIT_AS makes the allocation fail.
    if subagentd_e2e::is_root() {
        assert_eq!(st["reason"], "memory limit (64 MiB) exceeded", "{st}");
        assert_eq!(st["resources"]["oom_killed"], true);
    } else {
        assert!(log.contains("MemoryError"), "{log}");
    }
    e.healthy();
}

#[test]
fn a_fork_bomb_is_contained_and_the_daemon_keeps_answering() {
    let Some(e) = env() else { return };
    let mut c = e.d.conn();
    let r = c
        .call(
            "spawn_agent",
            json!({
                "session": {"id": session("bomb"), "audience": "personal", "project_dir": e.project.path()},
                "task": "bomb",
                "command": ["sh", "-c", "b() { b | b & }; b"],
                "limits": {"pids": 64, "wall_time_s": 5},
            }),
        )
        .unwrap();
    let run = r["run_id"].as_str().unwrap().to_owned();
    // While it rages, the daemon answers. (The latency is printed for
    // the record; timing is the benchmark harness's job, not a test's.)
    let mut other = e.d.conn();
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        assert!(other.call("ping", json!({})).is_ok());
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("fork bomb: slowest ping {worst:?}");
    let st = c.wait(&run);
    assert!(
        matches!(
            st["state"].as_str(),
            Some("timed_out" | "failed" | "succeeded")
        ),
        "{st}"
    );
    e.healthy();
}

/// A fork bomb whose parent stays alive: held at the process limit while
/// it rages (the refusals counted where a pids cgroup holds it), nothing
/// of it left once the run ends, and the next run starts.
#[test]
fn a_fork_bomb_with_a_living_parent_is_held_and_ended() {
    let Some(e) = env() else { return };
    let marker = subagentd_e2e::sleep_marker();
    let (st, _) = e.attack(
        &format!("b() {{ b | b & }}; b; sleep 2; echo {marker} >/dev/null"),
        json!({"limits": {"pids": 64, "wall_time_s": 20}}),
    );
    assert_eq!(st["state"], "succeeded", "{st}");
    // RLIMIT_NPROC (an unprivileged daemon) holds the bomb too, but counts
    // no refusals, and a bomb's refused shells die at once: init's sampling
    // may not catch it at the limit (security.md).
    if subagentd_e2e::is_root() {
        assert!(
            st["resources"]["pids_refused"].as_u64().unwrap() > 0,
            "{st}"
        );
    }
    assert!(
        subagentd_e2e::pids_with(&marker).is_empty(),
        "a process of the bomb outlived the run"
    );
    let (next, _) = e.attack("true", json!({}));
    assert_eq!(next["state"], "succeeded", "{next}");
    e.healthy();
}

/// A child that forks past its process limit: the forks fail, the run's
/// status says the limit refused them (where a pids cgroup counts them)
/// or that the run reached it (RLIMIT_NPROC under an unprivileged daemon,
/// sampled: the child stays at the limit a while, see security.md), and
/// nothing of it is left once the run has ended.
#[test]
fn a_run_at_its_process_limit_says_so_and_leaves_nothing() {
    let Some(e) = env() else { return };
    let marker = subagentd_e2e::sleep_marker();
    let py = format!(
        "import os\nkids = 0\nfor i in range(100):\n\ttry:\n\t\tif os.fork() == 0:\n\t\t\tos.execvp('sleep', ['sleep', '{marker}'])\n\t\tkids += 1\n\texcept OSError:\n\t\tpass\nprint('forked', kids)\nimport time\ntime.sleep(0.5)\nraise SystemExit(3)\n"
    );
    let (st, log) = e.attack(
        "python3 -c \"$PY\"",
        json!({"limits": {"pids": 16}, "env": {"PY": py}}),
    );
    assert_eq!(st["state"], "failed", "{st} {log}");
    assert!(log.contains("forked"), "{log}");
    if subagentd_e2e::is_root() {
        let reason = st["reason"].as_str().unwrap();
        assert!(
            reason.contains("the process limit (16) refused"),
            "{reason}"
        );
        assert!(
            st["resources"]["pids_refused"].as_u64().unwrap() > 0,
            "{st}"
        );
    } else {
        // RLIMIT_NPROC counts no refusals; init sees the run at the limit.
        let reason = st["reason"].as_str().unwrap();
        assert!(
            reason.contains("the run reached its process limit (16)"),
            "{reason}"
        );
        assert_eq!(st["resources"]["pids_limit_reached"], true, "{st}");
    }
    assert!(
        subagentd_e2e::sleeping(&marker).is_empty(),
        "a process of the run outlived it"
    );
    e.healthy();
}

#[test]
fn every_run_records_what_was_enforced() {
    let Some(e) = env() else { return };
    let (st, _) = e.attack("true", json!({}));
    let iso = &st["isolation"];
    for m in [
        "landlock",
        "seccomp",
        "network",
        "capabilities",
        "namespaces",
        "root",
        "disk",
    ] {
        assert_eq!(iso[m]["enforced"], true, "{m}: {iso}");
    }
    // Without root the cgroups are not the daemon's to make (unless
    // delegated): the process limit is RLIMIT_NPROC in the run's user
    // namespace, the memory limit RLIMIT_AS (security.md).
    if subagentd_e2e::is_root() {
        assert_eq!(iso["cgroup"]["enforced"], true, "{iso}");
    } else {
        let detail = iso["cgroup"]["detail"].as_str().unwrap();
        assert!(detail.contains("pids 512 via RLIMIT_NPROC"), "{detail}");
    }
    assert_eq!(iso["no_new_privs"], true);
    assert!(iso["landlock"]["detail"]
        .as_str()
        .unwrap()
        .contains("fully enforced"));
    let result = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(result.contains("## Isolation"), "{result}");
    assert!(result.contains("- landlock: enforced: ABI"), "{result}");
    assert!(result.contains("- capabilities: enforced"), "{result}");
    assert!(
        result.contains("- namespaces: enforced: pid, mount, ipc"),
        "{result}"
    );
    assert!(result.contains("## Resources"), "{result}");
}

#[test]
fn subagentd_check_reports_the_host() {
    let out = std::process::Command::new(subagentd_e2e::bin("subagentd"))
        .arg("--check")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // First the runner it found, then the host's facts.
    let mut lines = text.lines();
    let runner = lines.next().unwrap_or_default();
    let runner = runner
        .strip_prefix("runner: ")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(std::path::Path::new(runner).is_absolute(), "{text}");
    assert!(runner.ends_with("/subagent-runner"), "{text}");
    assert!(
        lines.next().unwrap_or_default().starts_with("landlock "),
        "{text}"
    );
    // On this project's machines (root, Landlock, seccomp) every default
    // requirement holds; elsewhere the exit code says which does not.
    let missing = text.lines().filter(|l| l.starts_with("MISSING")).count();
    assert_eq!(out.status.success(), missing == 0, "{text}");
    for m in [
        "landlock",
        "seccomp",
        "capability_drop",
        "network_isolation",
    ] {
        assert!(text.lines().any(|l| l.ends_with(m)), "{m}: {text}");
    }
}

#[test]
fn set_user_id_bits_cannot_be_set() {
    let Some(e) = env() else { return };
    let py = "import os\n\
        p = os.environ['SUBAGENT_TEMP_DIR'] + '/f'\n\
        open(p, 'w').close()\n\
        try:\n\
        \tos.chmod(p, 0o755); print('plain chmod ok')\n\
        except PermissionError:\n\
        \tprint('plain chmod refused')\n\
        for mode in (0o4755, 0o2755):\n\
        \ttry:\n\
        \t\tos.chmod(p, mode); print('SETID', oct(mode))\n\
        \texcept PermissionError:\n\
        \t\tprint('refused', oct(mode))\n\
        try:\n\
        \tos.close(os.open(p + '2', os.O_CREAT | os.O_WRONLY, 0o4755)); print('SETID create')\n\
        except PermissionError:\n\
        \tprint('refused create')\n\
        print(oct(os.stat(p).st_mode))\n";
    let (st, log) = e.attack("python3 -c \"$PY\"", json!({"env": {"PY": py}}));
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    // A child may chmod its own files (its root holds none of the daemon's
    // or the system's it could write), never to setuid.
    assert!(log.contains("plain chmod ok"), "{log}");
    assert!(!log.contains("SETID"), "{log}");
    assert_eq!(log.matches("refused").count(), 3, "{log}");
}

/// Runs as root on this project's machines: the victim is root's, as system
/// files are, and the uid-0 child must not change its mode.
#[test]
fn system_files_keep_their_modes() {
    let Some(e) = env() else { return };
    let victim = tempfile::NamedTempFile::new_in("/tmp").unwrap();
    let before = std::fs::metadata(victim.path()).unwrap();
    let script = format!(
        "chmod 777 {} && echo CHMODDED; echo end",
        sh_quote(victim.path())
    );
    let (st, log) = e.attack(&script, json!({}));
    assert_eq!(st["state"], "succeeded", "{st}");
    assert!(!log.contains("CHMODDED"), "{log}");
    let after = std::fs::metadata(victim.path()).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&before.permissions()),
        std::os::unix::fs::PermissionsExt::mode(&after.permissions())
    );
}

#[test]
fn a_10_gib_file_write_is_stopped_at_the_file_size_limit() {
    let Some(e) = env() else { return };
    let (st, log) = e.attack(
        "exec dd if=/dev/zero of=\"$TMPDIR/big\" bs=1M count=10240 status=none",
        json!({}),
    );
    assert_eq!(st["state"], "failed", "{st} {log}");
    assert_eq!(st["signal"], libc::SIGXFSZ, "{st}");
    assert!(st["isolation"]["rlimits"]
        .as_array()
        .unwrap()
        .contains(&json!("fsize=1073741824")));
    assert!(
        !std::path::Path::new(st["temp_dir"].as_str().unwrap()).exists(),
        "the temp dir and the file are gone"
    );
}

#[test]
fn a_flood_of_output_is_cut_at_the_log_cap_and_the_run_goes_on() {
    let Some(e) = env() else { return };
    let (st, log) = e.attack(
        "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo still running > \"$SUBAGENT_ARTIFACT_DIR/after\"",
        json!({"limits": {"output_mb": 1}}),
    );
    assert_eq!(st["state"], "succeeded", "{st}");
    assert_eq!(st["log_truncated"], true);
    assert!(log.len() < 1_100_000, "{} bytes", log.len());
    assert!(log.contains(
        "[subagentd: log cut at 1048576 bytes (output_mb limit); further output discarded]"
    ));
    let art = PathBuf::from(st["artifact_dir"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(art.join("after")).unwrap(),
        "still running\n"
    );
}

#[test]
fn a_child_holding_connections_does_not_lock_the_parent_out() {
    let Some(e) = env() else { return };
    let py = "import socket, os, time\n\
        held = []\n\
        for i in range(300):\n\
        \ts = socket.socket(socket.AF_UNIX)\n\
        \ttry:\n\
        \t\ts.connect(os.environ['SOCK']); held.append(s)\n\
        \texcept OSError:\n\
        \t\tpass\n\
        print('holding', len(held), flush=True)\n\
        time.sleep(60)\n";
    let mut c = e.d.conn();
    let r = c
        .call(
            "spawn_agent",
            json!({
                "session": {"id": session("hold"), "audience": "personal", "project_dir": e.project.path()},
                "task": "hold", "command": ["/usr/bin/python3", "-c", py], "env": {"SOCK": e.d.socket},
            }),
        )
        .unwrap();
    let run = r["run_id"].as_str().unwrap().to_owned();
    let st = c.call("check_agent_run", json!({"run_id": run})).unwrap();
    let log = PathBuf::from(st["log_path"].as_str().unwrap());
    subagentd_e2e::wait_for_text(&log, "holding", "the child to open its connections");
    let text = std::fs::read_to_string(&log).unwrap();
    let held: usize = text
        .trim()
        .strip_prefix("holding ")
        .unwrap_or_else(|| panic!("{text}"))
        .parse()
        .unwrap();
    // A child of its own uid, in its own root, cannot even reach the
    // socket; one that could would be refused before taking a slot.
    assert_eq!(held, 0, "the child reached the control socket");
    // A fresh connection from outside the run is still served.
    let mut fresh = e.d.conn();
    assert!(fresh.call("ping", json!({})).is_ok());
    c.call("cancel_agent_run", json!({"run_id": run})).unwrap();
    assert_eq!(c.wait(&run)["state"], "cancelled");
}
