//! Red team: the operator's model API key and a driver run. The key must
//! never enter the run: not its environment (`/proc/self/environ`, a
//! shell child's), not a file the run folder or the state dir holds, not
//! child.log; the daemon's model gateway adds it upstream, and forwards to
//! the configured endpoint only, whatever host the agent asks for. A
//! parent cannot steer the agent by a variable the driver does not allow
//! (`BUN_OPTIONS` ran a parent's JavaScript inside Claude Code).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use subagentd_e2e::agents;
use subagentd_e2e::modelserver::{ModelServer, Turn};
use subagentd_e2e::{session, Daemon};

/// A key no file, environment or log of the run may hold.
fn key() -> String {
    format!("sk-redteam-{}", session("gwkey"))
}

/// A daemon whose `[drivers.claude-code]` runs `program` against
/// `base_url` with the key in its environment; `extra` goes into the
/// table.
fn daemon(program: &Path, base_url: &str, extra: &str, key: &str) -> (Daemon, tempfile::TempDir) {
    daemon_for("claude-code", program, base_url, extra, key)
}

// `daemon` for any driver.
use subagentd_e2e::agents::daemon as daemon_for;

fn project() -> tempfile::TempDir {
    let p = tempfile::Builder::new()
        .prefix("sa-gw-")
        .tempdir_in("/tmp")
        .unwrap();
    // The run's uid (an unprivileged daemon's own) may read it.
    std::fs::set_permissions(p.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn params(s: &str, project: &Path, tools: &[&str], env: Value) -> Value {
    json!({
        "session": {"id": s, "audience": "personal", "project_dir": project, "tools": tools},
        "task": "Say what your environment holds.",
        "driver": "claude-code",
        "env": env,
    })
}

fn spawn_and_wait(d: &Daemon, p: Value) -> Value {
    let mut c = d.conn();
    let r = c
        .call("spawn_agent", p)
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    c.wait(r["run_id"].as_str().unwrap())
}

fn run_dir(d: &Daemon, st: &Value) -> PathBuf {
    d.state
        .join("sessions")
        .join(st["session_id"].as_str().unwrap())
        .join("runs")
        .join(st["run_id"].as_str().unwrap())
}

/// Every file under `dir`, recursively (links not followed).
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            files_under(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}

fn holds(bytes: &[u8], secret: &str) -> bool {
    bytes.windows(secret.len()).any(|w| w == secret.as_bytes())
}

/// No file under the state dir (child.log included), the project, or the
/// daemon's log holds `secret`.
fn assert_nowhere(d: &Daemon, project: &Path, secret: &str) {
    let mut files = Vec::new();
    files_under(&d.state, &mut files);
    files_under(project, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("child.log")),
        "the state dir holds the run: {files:?}"
    );
    for f in files {
        let bytes = std::fs::read(&f).unwrap_or_default();
        assert!(!holds(&bytes, secret), "the API key is in {}", f.display());
    }
    assert!(
        !d.log().contains(secret),
        "the API key is in the daemon's log"
    );
}

/// A spawn request's `BUN_OPTIONS` (Claude Code is a Bun executable: it
/// would preload the parent's JavaScript) and any other variable the
/// driver's `env_allow` does not name are refused; a named one is taken.
#[test]
fn a_drivers_env_is_an_allowlist() {
    let p = project();
    let pre = p.path().join("pre.js");
    std::fs::write(&pre, "console.log(process.env)\n").unwrap();
    let (d, _home) = daemon(Path::new("/bin/true"), "http://127.0.0.1:9", "", &key());
    let preload = format!("--preload {}", pre.display());
    for (name, value) in [
        ("BUN_OPTIONS", preload.as_str()),
        ("SOME_OTHER_VAR", "x"),
        ("NODE_OPTIONS", "--require /project/pre.js"),
        ("ANTHROPIC_BASE_URL", "http://evil.example"),
    ] {
        let e = d
            .conn()
            .call(
                "spawn_agent",
                params(
                    &session("gwenv"),
                    p.path(),
                    &["file_read"],
                    json!({ name: value }),
                ),
            )
            .unwrap_err();
        assert_eq!(e["code"], -32602, "{name}: {e}");
        let m = e["message"].as_str().unwrap();
        assert!(
            m.contains(&format!("env.{name}")) && m.contains("env_allow"),
            "{name}: {e}"
        );
    }
    let (d, _home) = daemon(
        Path::new("/bin/true"),
        "http://127.0.0.1:9",
        "env_allow = [\"MY_HARMLESS_VAR\"]\n",
        &key(),
    );
    let r = d
        .conn()
        .call(
            "spawn_agent",
            params(
                &session("gwenv"),
                p.path(),
                &["file_read"],
                json!({"MY_HARMLESS_VAR": "1"}),
            ),
        )
        .unwrap();
    assert!(r["run_id"].is_string(), "an allowed variable is taken: {r}");
}

/// Claude Code with a shell: the model has it print its own environment
/// and its parent's (`/proc/self/environ`, `/proc/$PPID/environ`) and
/// keep a copy in the project. The model server saw the real key; the
/// tool's output, child.log, every file of the state dir and the project
/// hold only the placeholder.
#[test]
fn a_drivers_agent_holds_no_key_in_its_environment() {
    let Some(claude) = agents::require(agents::claude, "claude-code") else {
        return;
    };
    let p = project();
    let copy = p.path().canonicalize().unwrap().join("environ.txt");
    let cmd = format!(
        "{{ tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/$PPID/environ; env; }} > {0}; cat {0}",
        copy.display()
    );
    let server = ModelServer::start(vec![
        Turn::tool("Bash", json!({"command": cmd, "description": "env"})),
        Turn::text("Done."),
    ])
    .unwrap();
    let secret = key();
    let (d, _home) = daemon(&claude, &server.base_url(), "", &secret);
    let st = spawn_and_wait(
        &d,
        params(
            &session("gwproc"),
            p.path(),
            &["file_read", "file_write", "shell"],
            json!({}),
        ),
    );
    let reqs = server.model_requests();
    assert!(
        reqs.len() >= 2,
        "a tool turn and a final turn: {st}\n{reqs:?}"
    );
    for r in &reqs {
        assert_eq!(
            r.header("x-api-key"),
            Some(secret.as_str()),
            "the model server sees the real key"
        );
    }
    let seen = std::fs::read_to_string(&copy).unwrap_or_default();
    assert!(
        seen.contains("ANTHROPIC_API_KEY=subagentd-gateway-placeholder"),
        "the command ran and read the agent's environment: {seen}"
    );
    assert!(
        !seen.contains(&secret),
        "the agent's environment holds the key"
    );
    let results = reqs.last().unwrap().body.to_string();
    assert!(
        results.contains("subagentd-gateway-placeholder"),
        "the tool's output went back to the model: {results}"
    );
    assert!(
        !results.contains(&secret),
        "the tool's output sent to the model holds the key"
    );
    assert!(run_dir(&d, &st).join("child.log").is_file());
    assert_nowhere(&d, p.path(), &secret);
}

/// Codex with a shell: the model has it print its environment and its
/// parent's; the model server saw the real key as a Bearer token, the
/// agent only the placeholder.
#[test]
fn a_codex_agent_holds_no_key_in_its_environment() {
    let Some(codex) = agents::require(agents::codex, "codex") else {
        return;
    };
    let p = project();
    let copy = p.path().canonicalize().unwrap().join("environ.txt");
    let cmd = format!(
        "{{ tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/$PPID/environ; env; }} > {0}; cat {0}",
        copy.display()
    );
    let server = ModelServer::start(vec![
        Turn::tool("exec_command", json!({ "cmd": cmd })),
        Turn::text("Done."),
    ])
    .unwrap();
    let secret = key();
    let base = format!("{}/v1", server.base_url());
    let (d, _home) = daemon_for("codex", &codex, &base, "model = \"mock-model\"\n", &secret);
    let mut req = params(
        &session("gwcodex"),
        p.path(),
        &["file_read", "file_write", "shell"],
        json!({}),
    );
    req["driver"] = json!("codex");
    let st = spawn_and_wait(&d, req);
    let reqs = server.model_requests();
    assert!(
        reqs.len() >= 2,
        "a tool turn and a final turn: {st}\n{reqs:?}"
    );
    let bearer = format!("Bearer {secret}");
    for r in &reqs {
        assert_eq!(r.header("authorization"), Some(bearer.as_str()));
    }
    let seen = std::fs::read_to_string(&copy).unwrap_or_default();
    assert!(
        seen.contains("OPENAI_API_KEY=subagentd-gateway-placeholder"),
        "the command ran and read the agent's environment: {seen}\n{st}"
    );
    assert!(
        !seen.contains(&secret),
        "the agent's environment holds the key"
    );
    let results = reqs.last().unwrap().body.to_string();
    assert!(
        !results.contains(&secret),
        "the tool's output holds the key"
    );
    assert_nowhere(&d, p.path(), &secret);
}

/// A hostile agent talks to its gateway by hand: an absolute-form request
/// for another server, a `Host` of another server, CONNECT. The other
/// server never hears from it, nor does a path outside the endpoint's
/// base path go on; the configured endpoint gets the one origin-form
/// request under it, with its own `Host` and the daemon's key in place
/// of the agent's.
#[test]
fn the_gateway_forwards_to_its_endpoint_only() {
    let server = ModelServer::start(vec![Turn::text("ok")]).unwrap();
    let other = ModelServer::start(vec![Turn::text("exfiltrated")]).unwrap();
    let secret = key();
    let bin = tempfile::Builder::new()
        .prefix("sa-gw-bin-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = bin.path().join("agent");
    let o = other.port;
    let ask = |head: &str| {
        format!(
            "exec 3<>/dev/tcp/127.0.0.2/3129 && printf '{head}' >&3 && timeout 10 cat <&3; exec 3>&-; echo\n"
        )
    };
    let script = [
        "#!/bin/bash\n".to_owned(),
        ask(&format!(
            "GET http://127.0.0.1:{o}/v1/messages HTTP/1.1\\r\\nHost: 127.0.0.1:{o}\\r\\nConnection: close\\r\\n\\r\\n"
        )),
        ask("CONNECT 127.0.0.1:1 HTTP/1.1\\r\\nHost: 127.0.0.1:1\\r\\nConnection: close\\r\\n\\r\\n"),
        ask("GET /admin HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n"),
        ask(&format!(
            "POST /v1/messages HTTP/1.1\\r\\nHost: 127.0.0.1:{o}\\r\\nx-api-key: agent-chosen\\r\\nAuthorization: Bearer agent-chosen\\r\\nContent-Type: application/json\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\n{{}}"
        )),
    ]
    .concat();
    std::fs::write(&agent, script).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let base = format!("{}/v1", server.base_url());
    let (d, _home) = daemon(&agent, &base, "", &secret);
    let p = project();
    let st = spawn_and_wait(
        &d,
        params(
            &session("gwhost"),
            p.path(),
            &["file_read", "shell"],
            json!({}),
        ),
    );
    let log = std::fs::read_to_string(run_dir(&d, &st).join("child.log")).unwrap_or_default();
    assert!(
        other.requests().is_empty(),
        "another server was reached through the gateway: {:?}\n{log}",
        other.requests()
    );
    let reqs = server.requests();
    assert_eq!(
        reqs.len(),
        1,
        "only the origin-form request goes on: {reqs:?}\n{log}"
    );
    let r = &reqs[0];
    assert_eq!(r.path, "/v1/messages");
    assert_eq!(
        r.header("host"),
        Some(format!("127.0.0.1:{}", server.port).as_str())
    );
    assert_eq!(r.header("x-api-key"), Some(secret.as_str()));
    assert_eq!(
        r.header("authorization"),
        None,
        "the agent's auth is dropped"
    );
    assert_eq!(log.matches("HTTP/1.1 403").count(), 3, "{log}");
    let gw = std::fs::read_to_string(run_dir(&d, &st).join("gateway.log")).unwrap();
    assert_eq!(gw.lines().count(), 4, "{gw}");
    assert!(
        gw.contains("absolute-form") && gw.contains("CONNECT is refused"),
        "{gw}"
    );
    assert_nowhere(&d, p.path(), &secret);
}

/// A driver run whose tools would give it the host's network is refused:
/// its gateway's listener needs the run's own network namespace, and one
/// on the host's loopback would lend the key to every local user.
#[test]
fn a_driver_run_never_gets_the_hosts_network() {
    let p = project();
    let (d, _home) = daemon(Path::new("/bin/true"), "http://127.0.0.1:9", "", &key());
    let e = d
        .conn()
        .call(
            "spawn_agent",
            params(
                &session("gwfull"),
                p.path(),
                &["file_read", "web_fetch"],
                json!({}),
            ),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("driver") && m.contains("network none or allowlist"),
        "{e}"
    );
}

/// A server that answers the first request with one server-sent event and
/// holds the stream open until a second request comes (at most 20 s),
/// then ends it; says whether the second came while the first was open.
fn held_stream_server() -> (u16, std::sync::mpsc::Receiver<bool>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let read_head = |s: &mut std::net::TcpStream, body: &[u8]| {
            let mut buf = Vec::new();
            let mut b = [0u8; 4096];
            while !(buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.ends_with(body)) {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                }
            }
        };
        let Ok((mut first, _)) = l.accept() else {
            return;
        };
        read_head(&mut first, b"{}");
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
        let _ = first.write_all(format!("{head}{}", chunk("data: first\n\n")).as_bytes());
        l.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut came = false;
        while std::time::Instant::now() < deadline {
            if let Ok((mut second, _)) = l.accept() {
                second.set_nonblocking(false).unwrap();
                read_head(&mut second, b"");
                let _ = second.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
                came = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = first.write_all(format!("{}0\r\n\r\n", chunk("data: second\n\n")).as_bytes());
        let _ = tx.send(came);
    });
    (port, rx)
}

/// The gateway passes an answer on as it comes (server-sent events): the
/// agent reads the first event while the endpoint still holds the stream
/// open, and answers it with a second request before the stream ends.
#[test]
fn the_gateway_streams_an_answer_as_it_comes() {
    let (port, came) = held_stream_server();
    let bin = tempfile::Builder::new()
        .prefix("sa-gw-bin-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = bin.path().join("agent");
    let script = r#"#!/bin/bash
exec 3<>/dev/tcp/127.0.0.2/3129 || exit 1
printf 'POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}' >&3
while IFS= read -r -t 30 line <&3; do
  echo "got: $line"
  case "$line" in
    "data: first"*)
      exec 4<>/dev/tcp/127.0.0.2/3129
      printf 'GET /v1/saw-first HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&4
      timeout 10 cat <&4
      exec 4>&-
      echo;;
  esac
done
"#;
    std::fs::write(&agent, script).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (d, _home) = daemon(&agent, &format!("http://127.0.0.1:{port}"), "", &key());
    let p = project();
    let st = spawn_and_wait(
        &d,
        params(
            &session("gwsse"),
            p.path(),
            &["file_read", "shell"],
            json!({}),
        ),
    );
    let log = std::fs::read_to_string(run_dir(&d, &st).join("child.log")).unwrap_or_default();
    let came = came
        .recv_timeout(std::time::Duration::from_secs(60))
        .unwrap_or(false);
    assert!(
        came,
        "the agent never read the first event while the stream was open: {log}"
    );
    assert!(
        log.contains("got: data: second"),
        "the stream ends whole: {log}"
    );
}

/// The gateway's bounds hold against its own agent: a 17th connection
/// while 16 are open is closed unanswered, and a request head over 64 KiB
/// is never forwarded.
#[test]
fn the_gateway_bounds_connections_and_heads() {
    let server = ModelServer::start(vec![Turn::text("ok")]).unwrap();
    let bin = tempfile::Builder::new()
        .prefix("sa-gw-bin-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = bin.path().join("agent");
    let script = r#"#!/bin/bash
trap '' PIPE
fds=()
for i in $(seq 1 16); do exec {fd}<>/dev/tcp/127.0.0.2/3129; fds+=($fd); done
exec 9<>/dev/tcp/127.0.0.2/3129
printf 'GET /v1/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&9 2>/dev/null
echo "17th: [$(timeout 10 cat <&9 2>/dev/null)]"
exec 9>&-
for fd in "${fds[@]}"; do exec {fd}>&-; done
exec 9<>/dev/tcp/127.0.0.2/3129
{ printf 'GET /v1/big HTTP/1.1\r\nHost: x\r\nX-Big: '; head -c 70000 /dev/zero | tr '\0' a; printf '\r\n\r\n'; } >&9 2>/dev/null
timeout 10 cat <&9 >/dev/null 2>&1
echo done
"#;
    std::fs::write(&agent, script).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (d, _home) = daemon(&agent, &server.base_url(), "", &key());
    let p = project();
    let st = spawn_and_wait(
        &d,
        params(
            &session("gwcap"),
            p.path(),
            &["file_read", "shell"],
            json!({}),
        ),
    );
    let log = std::fs::read_to_string(run_dir(&d, &st).join("child.log")).unwrap_or_default();
    assert!(log.contains("17th: []") && log.contains("done"), "{log}");
    assert!(
        server.requests().is_empty(),
        "nothing reached the endpoint: {:?}",
        server.requests()
    );
    let gw = std::fs::read_to_string(run_dir(&d, &st).join("gateway.log")).unwrap_or_default();
    assert!(
        gw.contains("connection refused: the run has 16 open"),
        "{gw}"
    );
}
