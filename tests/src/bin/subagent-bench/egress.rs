//! The egress proxy: bulk throughput through a CONNECT tunnel, and the
//! time to a connection's first byte, from inside a run in allowlist
//! mode, against the same Python client connecting straight to the same
//! server on the host.

use crate::pct;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use subagentd_e2e::{session, Daemon};

/// The client: `python3 -c CLIENT MODE PORT BYTES ROUNDS`, MODE `proxy`
/// (CONNECT through 127.0.0.1:3128) or `direct`; prints one JSON line.
const CLIENT: &str = r#"
import json, socket, sys, time
mode, port, size, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def conn():
    if mode == 'direct':
        return socket.create_connection(('127.0.0.1', port))
    s = socket.create_connection(('127.0.0.1', 3128))
    s.sendall(b'CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n' % port)
    head = b''
    while b'\r\n\r\n' not in head:
        head += s.recv(1)
    assert head.startswith(b'HTTP/1.1 200'), head
    return s
first = []
for i in range(rounds):
    t = time.perf_counter()
    s = conn()
    s.sendall(b'GET /ping HTTP/1.1\r\nHost: x\r\n\r\n')
    s.recv(1)
    first.append((time.perf_counter() - t) * 1000)
    s.close()
s = conn()
s.sendall(b'GET /bulk/%d HTTP/1.1\r\nHost: x\r\n\r\n' % size)
buf = bytearray(1 << 20)
view = memoryview(buf)
got = 0
t = time.perf_counter()
while True:
    n = s.recv_into(view)
    if n == 0:
        break
    got += n
secs = time.perf_counter() - t
print(json.dumps({'first_ms': first, 'bytes': got, 'mb_s': got / 1e6 / secs}))
"#;

/// Serves `/ping` (a short answer) and `/bulk/N` (N bytes) on 127.0.0.1.
fn server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || answer(s));
        }
    });
    port
}

fn answer(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split(' ').nth(1).unwrap_or("/");
    let size: usize = path
        .strip_prefix("/bulk/")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if size == 0 {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        return;
    }
    let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n");
    let chunk = vec![b'x'; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len());
        if s.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n;
    }
}

fn parse(out: &str) -> Value {
    out.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or_else(|| panic!("no result in {out:?}"))
}

pub fn bench(quick: bool) -> Value {
    let port = server();
    let size: u64 = if quick { 256 << 20 } else { 2 << 30 };
    let rounds = if quick { 50 } else { 300 };
    let args = [port.to_string(), size.to_string(), rounds.to_string()];
    let direct = std::process::Command::new("python3")
        .args(["-c", CLIENT, "direct"])
        .args(&args)
        .output()
        .unwrap();
    let direct = parse(&String::from_utf8_lossy(&direct.stdout));
    let d = Daemon::start_with(crate::daemon_opts());
    let mut c = d.conn();
    let r = c
        .call(
            "spawn_agent",
            json!({"session": {"id": session("bench-egress"), "audience": "personal", "project_dir": "/tmp"},
                   "task": "t", "command": ["sh", "-c", "exec python3 -c \"$CLIENT\" proxy \"$@\"", "sh", &args[0], &args[1], &args[2]],
                   "env": {"CLIENT": CLIENT},
                   "sandbox": {"network_allow": [format!("127.0.0.1:{port}")]}}),
        )
        .unwrap();
    let st = c.wait(r["run_id"].as_str().unwrap());
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap_or_default();
    assert_eq!(st["state"], "succeeded", "{log}");
    let proxied = parse(&log);
    crate::retire_daemon(d);
    let ms = |v: &Value| -> Vec<f64> {
        v["first_ms"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_f64)
            .collect()
    };
    let (p, q) = (ms(&proxied), ms(&direct));
    json!({
        "bytes": size,
        "rounds": rounds,
        "connect_mb_s": proxied["mb_s"],
        "direct_mb_s": direct["mb_s"],
        "first_byte_ms": {"p50": pct(&p, 50.0), "p90": pct(&p, 90.0)},
        "direct_first_byte_ms": {"p50": pct(&q, 50.0), "p90": pct(&q, 90.0)},
        "added_first_byte_ms": pct(&p, 50.0) - pct(&q, 50.0),
    })
}

/// The egress rows.
pub fn rows(e: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    crate::row(
        &format!(
            "egress proxy: CONNECT throughput on loopback ({} MiB)",
            e["bytes"].as_u64().unwrap_or(0) >> 20
        ),
        format!("{:.0} MB/s", f(e, "connect_mb_s")),
        format!("direct {:.0} MB/s", f(e, "direct_mb_s")),
        format!("{:.2}x", f(e, "connect_mb_s") / f(e, "direct_mb_s")),
        ">= 500 MB/s",
    );
    crate::row(
        &format!(
            "egress proxy: connect → first byte, p50/p90 ({} connections)",
            e["rounds"]
        ),
        format!(
            "{:.3}/{:.3} ms",
            f(&e["first_byte_ms"], "p50"),
            f(&e["first_byte_ms"], "p90")
        ),
        format!(
            "direct {:.3}/{:.3} ms",
            f(&e["direct_first_byte_ms"], "p50"),
            f(&e["direct_first_byte_ms"], "p90")
        ),
        format!("+{:.3} ms (p50)", f(e, "added_first_byte_ms")),
        "<= +1 ms",
    );
}
