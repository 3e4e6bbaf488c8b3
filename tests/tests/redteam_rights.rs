//! Red team: a uid listed in `allow_uids` asks a root daemon for runs that
//! would reach what that uid cannot (root's directories and secrets). A run
//! never has more rights than whoever asked for it: each such spawn is
//! refused naming the field, the path and the right, or the run meets the
//! files as the requester would; a directory the requester owns works.
//!
//! Root only (a user is made, files are given to it); as an ordinary user
//! every test prints `SKIPPED`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use subagentd_e2e::{session, wait_until, Daemon, DaemonOpts};

// The ordinary user the attacks are made as is otheruser::USER.
use subagentd_e2e::otheruser;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The test user's uid and gid, made when missing; `None` (after
/// `SKIPPED: …`) when not root or the host cannot enforce the sandbox.
fn user() -> Option<(u32, u32)> {
    otheruser::ids_or_skip("these attacks need root to make a user and root-owned victims")
}

/// A directory under /tmp with `mode`, owned by `owner` (root when None).
fn dir(prefix: &str, mode: u32, owner: Option<(u32, u32)>) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    if let Some((u, g)) = owner {
        std::os::unix::fs::chown(d.path(), Some(u), Some(g)).unwrap();
    }
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    d
}

/// A root-owned file of `mode` holding `text`.
fn root_file(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// One call on the daemon's socket, made by a process of `ids`: the whole
/// response message.
fn call_as(ids: (u32, u32), socket: &Path, method: &str, params: &Value) -> Value {
    let py = "import json, socket, sys\n\
s = socket.socket(socket.AF_UNIX)\n\
s.connect(sys.argv[1])\n\
req = {'jsonrpc': '2.0', 'id': 1, 'method': sys.argv[2], 'params': json.loads(sys.argv[3])}\n\
s.sendall((json.dumps(req) + '\\n').encode())\n\
print(s.makefile().readline())\n";
    let out = Command::new("/usr/bin/python3")
        .args(["-c", py])
        .arg(socket)
        .arg(method)
        .arg(params.to_string())
        .current_dir("/")
        .uid(ids.0)
        .gid(ids.1)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)))
}

/// spawn_agent's params: `sh -c script` in `project`, with `sandbox`.
fn spawn_params(project: &Path, script: &str, sandbox: Value) -> Value {
    json!({
        "session": {"id": session("rights"), "audience": "personal", "project_dir": project},
        "task": "rights",
        "command": ["/bin/sh", "-c", script],
        "sandbox": sandbox,
    })
}

/// Asserts a spawn was refused for `field`, naming `path` and `right`.
fn assert_refused(resp: &Value, field: &str, path: &Path, right: &str) {
    let e = &resp["error"];
    assert_eq!(e["code"], -32602, "{resp}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(field), "names the field {field}: {msg}");
    assert!(
        msg.contains(&path.display().to_string()),
        "names {}: {msg}",
        path.display()
    );
    assert!(msg.contains(right), "names the right {right}: {msg}");
}

/// The run of an accepted spawn, once ended (as root on a connection of
/// its own), so that an attack that got through can be judged.
fn ended(d: &Daemon, resp: &Value) -> Option<Value> {
    let run = resp["result"]["run_id"].as_str()?;
    Some(d.conn().wait(run))
}

// ---------------------------------------------------------------------------
// Attacks
// ---------------------------------------------------------------------------

#[test]
fn a_root_only_project_dir_is_refused_naming_path_and_right() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let victim = dir("sa-rights-root-", 0o700, None);
    root_file(&victim.path().join("secret"), "ROOT-SECRET\n", 0o600);
    let p = spawn_params(victim.path(), "cat secret", json!({}));
    let resp = call_as(ids, &d.socket, "spawn_agent", &p);
    let leaked = ended(&d, &resp);
    assert_refused(&resp, "session.project_dir", victim.path(), "read");
    assert!(leaked.is_none());
}

#[test]
fn a_root_only_secret_under_read_paths_is_refused() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let project = dir("sa-rights-own-", 0o700, Some(ids));
    let holder = dir("sa-rights-ro-", 0o755, None);
    let secret = holder.path().join("secret");
    root_file(&secret, "ROOT-SECRET\n", 0o600);
    let script = format!("cat {} > copied", secret.display());
    let p = spawn_params(
        project.path(),
        &script,
        json!({"read_paths": [secret], "write_project": true}),
    );
    let resp = call_as(ids, &d.socket, "spawn_agent", &p);
    ended(&d, &resp);
    let copied = std::fs::read_to_string(project.path().join("copied")).unwrap_or_default();
    assert!(!copied.contains("ROOT-SECRET"), "the secret was copied out");
    assert_refused(&resp, "sandbox.read_paths[0]", &secret, "read");
}

#[test]
fn a_root_owned_dir_as_write_path_is_refused_and_its_file_unchanged() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let project = dir("sa-rights-own-", 0o700, Some(ids));
    let victim = dir("sa-rights-rw-", 0o755, None);
    let file = victim.path().join("config");
    root_file(&file, "original\n", 0o640);
    let script = format!("echo pwned > {}", file.display());
    let p = spawn_params(
        project.path(),
        &script,
        json!({"write_paths": [victim.path()]}),
    );
    let resp = call_as(ids, &d.socket, "spawn_agent", &p);
    ended(&d, &resp);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "original\n");
    assert_refused(&resp, "sandbox.write_paths[0]", victim.path(), "write");
}

#[test]
fn a_root_owned_project_with_write_project_is_refused_and_its_file_unchanged() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let victim = dir("sa-rights-rw-", 0o755, None);
    let file = victim.path().join("config");
    root_file(&file, "original\n", 0o640);
    let p = spawn_params(
        victim.path(),
        "echo pwned > config",
        json!({"write_project": true}),
    );
    let resp = call_as(ids, &d.socket, "spawn_agent", &p);
    ended(&d, &resp);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "original\n");
    assert_refused(&resp, "session.project_dir", victim.path(), "write");
}

#[test]
fn a_readable_root_project_is_not_bound_as_roots_own() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    // The requester may list and read the project, not its secret: the
    // run must not read the secret through a bind that shows root's files
    // as the run's own.
    let victim = dir("sa-rights-ro-", 0o755, None);
    root_file(&victim.path().join("secret"), "ROOT-SECRET\n", 0o600);
    root_file(&victim.path().join("README"), "public\n", 0o644);
    let run = |script: &str| {
        let resp = call_as(
            ids,
            &d.socket,
            "spawn_agent",
            &spawn_params(victim.path(), script, json!({})),
        );
        ended(&d, &resp).unwrap_or_else(|| panic!("refused: {resp}"))
    };
    let public = run("cat README > /dev/null");
    assert_eq!(
        public["exit_code"], 0,
        "the readable file is read: {public}"
    );
    let secret = run("cat secret > /dev/null");
    assert_ne!(secret["exit_code"], 0, "root's secret was read: {secret}");
}

#[test]
fn a_directory_the_requester_owns_works() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let project = dir("sa-rights-own-", 0o700, Some(ids));
    let extra = dir("sa-rights-extra-", 0o700, Some(ids));
    let script = format!(
        "echo mine > out && echo more > {}/out",
        extra.path().display()
    );
    let p = spawn_params(
        project.path(),
        &script,
        json!({"write_project": true, "write_paths": [extra.path()]}),
    );
    let resp = call_as(ids, &d.socket, "spawn_agent", &p);
    let s = ended(&d, &resp).unwrap_or_else(|| panic!("refused: {resp}"));
    assert_eq!(s["state"], "succeeded", "{s}");
    for (dir, text) in [(project.path(), "mine\n"), (extra.path(), "more\n")] {
        let out = dir.join("out");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
        assert_eq!(
            std::fs::metadata(&out).unwrap().uid(),
            ids.0,
            "the requester's file"
        );
    }
}

#[test]
fn a_queued_run_is_checked_again_before_it_starts() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "max_concurrent = 1\n");
    let project = dir("sa-rights-own-", 0o755, Some(ids));
    let shared = dir("sa-rights-shared-", 0o755, None);
    let go = project.path().join("go");
    // The first run holds the only slot until the test lets it go.
    let hold = format!("while [ ! -e {} ]; do sleep 0.05; done", go.display());
    let first = call_as(
        ids,
        &d.socket,
        "spawn_agent",
        &spawn_params(project.path(), &hold, json!({})),
    );
    let first = first["result"]["run_id"].as_str().unwrap().to_owned();
    wait_until(Duration::from_secs(20), "the first run to start", || {
        d.conn()
            .call("check_agent_run", json!({"run_id": first}))
            .unwrap()["state"]
            == "running"
    });
    let second = call_as(
        ids,
        &d.socket,
        "spawn_agent",
        &spawn_params(
            project.path(),
            "true",
            json!({"read_paths": [shared.path()]}),
        ),
    );
    let second = second["result"]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{second}"))
        .to_owned();
    // While it waits, the requester loses the right it was accepted with.
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(&go, "").unwrap();
    let s = d.conn().wait(&second);
    assert_eq!(s["state"], "failed", "{s}");
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("sandbox.read_paths[0]")
            && reason.contains(&shared.path().display().to_string())
            && reason.contains("read"),
        "names the field, the path and the right: {reason}"
    );
    assert_eq!(d.conn().wait(&first)["state"], "succeeded");
}

#[test]
fn a_root_only_definition_in_the_requesters_project_is_refused() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let project = dir("sa-rights-own-", 0o755, Some(ids));
    let defs = project.path().join(".subagents");
    std::fs::create_dir(&defs).unwrap();
    std::os::unix::fs::chown(&defs, Some(ids.0), Some(ids.1)).unwrap();
    // Root's definition in the requester's project: the daemon would read
    // its body, which the requester cannot, into the run's system prompt.
    let def = defs.join("spy.md");
    root_file(
        &def,
        "---\nname: spy\ndescription: The spy helper.\n---\nROOT-SECRET-DEF\n",
        0o600,
    );
    let mut p = spawn_params(project.path(), "true", json!({}));
    p["agent"] = json!("spy");
    let resp = call_as(ids, &d.socket, "spawn_agent", &p);
    ended(&d, &resp);
    assert_refused(&resp, "agent", &def, "read");
}

#[test]
fn a_root_only_program_is_refused() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let project = dir("sa-rights-own-", 0o700, Some(ids));
    let bin = dir("sa-rights-bin-", 0o700, None);
    let tool = bin.path().join("tool");
    root_file(&tool, "#!/bin/sh\necho ran\n", 0o700);
    let mut p = spawn_params(project.path(), "", json!({}));
    p["command"] = json!([tool]);
    let resp = call_as(ids, &d.socket, "spawn_agent", &p);
    ended(&d, &resp);
    assert_refused(&resp, "command[0]", &tool, "execute");
}

#[test]
fn what_exists_where_the_requester_cannot_look_is_not_told() {
    let Some(ids) = user() else { return };
    let (d, _cfg) = otheruser::daemon_allowing(ids.0, "");
    let project = dir("sa-rights-own-", 0o700, Some(ids));
    let hidden = dir("sa-rights-root-", 0o700, None);
    root_file(&hidden.path().join("there"), "x\n", 0o644);
    let answer = |name: &str| {
        let path = hidden.path().join(name);
        let p = spawn_params(project.path(), "true", json!({"read_paths": [path]}));
        let resp = call_as(ids, &d.socket, "spawn_agent", &p);
        ended(&d, &resp);
        assert_refused(&resp, "sandbox.read_paths[0]", &path, "read");
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .replace(name, "NAME")
    };
    // The same answer for a file that is there and one that is not.
    assert_eq!(answer("there"), answer("missing"));
}

#[test]
fn a_daemon_that_is_not_root_refuses_runs_for_another_uid() {
    let Some(ids) = user() else { return };
    // The daemon runs as the test user; nobody (65534) is allowed on its
    // socket. It cannot take nobody's credentials, so it refuses to run
    // anything for it.
    let base = dir("sa-rights-unpriv-", 0o755, Some(ids));
    let cfg = base.path().join("c.toml");
    std::fs::write(&cfg, "allow_uids = [65534]\n").unwrap();
    let (socket, state) = (base.path().join("d.sock"), base.path().join("state"));
    let opts = DaemonOpts {
        args: vec!["--config".into(), cfg.display().to_string()],
        wrap: vec![
            "setpriv".into(),
            format!("--reuid={}", ids.0),
            format!("--regid={}", ids.1),
            "--clear-groups".into(),
            "--".into(),
        ],
        ..Default::default()
    };
    let child = Daemon::spawn_process(&socket, &state, base.path(), &opts);
    let d = Daemon {
        child,
        dir: base,
        socket,
        state,
    };
    d.wait_ready();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let project = dir("sa-rights-pub-", 0o755, None);
    let p = spawn_params(project.path(), "true", json!({}));
    let resp = call_as((65534, 65534), &d.socket, "spawn_agent", &p);
    ended(&d, &resp);
    assert_eq!(resp["error"]["code"], -32005, "{resp}");
    let msg = resp["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("requester_rights") && msg.contains("not root"),
        "{msg}"
    );
}
