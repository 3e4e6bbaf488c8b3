//! Attacks on the egress proxy's share of the daemon: runs that make the
//! proxy resolve names a resolver never answers must not slow the control
//! socket (ping, spawn_agent) nor pile up the daemon's threads; and a run
//! listed for a host loopback server reaches it through the proxy with
//! the proxy variables it is given (its NO_PROXY never names a listed
//! host), by plain HTTP and by CONNECT.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use subagentd_e2e::{is_root, runnable, session, wait_until, Conn, Daemon, DaemonOpts};

/// Whether this host can run allowlist runs (the default requirements).
fn host_ok() -> bool {
    for m in subagentd_e2e::missing_mechanisms() {
        if !runnable(false, &m, &format!("this host cannot enforce {m}")) {
            return false;
        }
    }
    true
}

/// An HTTP server on 127.0.0.1 that answers every request with
/// `hello <path>`.
fn http_server() -> u16 {
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
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split(' ').nth(1).unwrap_or("?").to_owned();
    let body = format!("hello {path}\n");
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The lines of a run's egress.log, once `n` are there.
fn egress_log(st: &Value, n: usize) -> Vec<Value> {
    let path = PathBuf::from(st["result_path"].as_str().unwrap()).with_file_name("egress.log");
    let read = || -> Vec<Value> {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    wait_until(Duration::from_secs(10), "egress.log lines", || {
        read().len() >= n
    });
    read()
}

#[test]
fn a_listed_loopback_server_is_reached_through_the_proxy_as_the_run_is_set_up() {
    if !host_ok() {
        return;
    }
    let p = http_server();
    let d = Daemon::start();
    // NO_PROXY stays as the run gets it: a listed host is never in it.
    let script = format!(
        "echo \"NO_PROXY=$NO_PROXY\"\n\
         curl -s -m 20 http://127.0.0.1:{p}/curl-plain; echo\n\
         curl -s -m 20 -p http://127.0.0.1:{p}/curl-tunnel; echo\n\
         python3 -c \"import urllib.request as u\n\
         try: print('URLLIB', u.urlopen('http://127.0.0.1:{p}/py-plain', timeout=20).read().decode().strip())\n\
         except Exception as e: print('URLLIB-ERR', e)\"\n"
    );
    let allow = json!([format!("127.0.0.1:{p}")]);
    let mut c = d.conn();
    let run = c.spawn(
        &session("loopback"),
        &["sh", "-c", &script],
        json!({"sandbox": {"network_allow": allow}}),
    );
    let st = c.wait(&run);
    let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert_eq!(st["state"], "succeeded", "{st}\n{log}");
    assert!(log.contains("NO_PROXY=localhost,::1\n"), "{log}");
    for want in [
        "hello /curl-plain",
        "hello /curl-tunnel",
        "URLLIB hello /py-plain",
    ] {
        assert!(log.contains(want), "{want} missing:\n{log}");
    }
    let lines = egress_log(&st, 3);
    let allowed = |method: &str| {
        lines
            .iter()
            .filter(|l| l["verdict"] == "allowed" && l["method"] == method && l["port"] == p)
            .count()
    };
    assert_eq!(allowed("GET"), 2, "{lines:?}");
    assert_eq!(allowed("CONNECT"), 1, "{lines:?}");
}

/// Python that keeps `n` requests for random names beneath
/// `blackhole.test` in flight through the proxy until `release` exists
/// (or two minutes pass), printing `STARTED` once the first are sent.
fn flood(n: usize, release: &std::path::Path) -> String {
    format!(
        "import asyncio, os, random, time\n\
         end = time.time() + 120\n\
         async def one():\n \
         while time.time() < end and not os.path.exists('{release}'):\n  \
         try:\n   \
         r, w = await asyncio.open_connection('127.0.0.1', 3128)\n   \
         name = 'r%016x.blackhole.test' % random.getrandbits(64)\n   \
         w.write(('GET http://%s/ HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % (name, name)).encode())\n   \
         await w.drain()\n   \
         await asyncio.wait_for(r.read(), 60)\n   \
         w.close()\n  \
         except Exception:\n   \
         await asyncio.sleep(0.05)\n\
         async def main():\n \
         tasks = [asyncio.ensure_future(one()) for _ in range({n})]\n \
         await asyncio.sleep(0.5)\n \
         print('STARTED', flush=True)\n \
         await asyncio.gather(*tasks)\n\
         asyncio.run(main())\n",
        release = release.display()
    )
}

/// The daemon's thread count.
fn threads(pid: i32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// One ping on a new connection (the accept path included); its time.
fn ping(d: &Daemon) -> Duration {
    let t = Instant::now();
    let mut c = Conn::connect(&d.socket);
    c.call("ping", json!({})).unwrap();
    t.elapsed()
}

/// A UDP socket on loopback port 53 that never answers, and a
/// resolv.conf naming it (a long timeout, as a slow resolver has).
fn black_hole(dir: &std::path::Path) -> (UdpSocket, PathBuf) {
    let mut last = None;
    for b in 1..=250u8 {
        let addr = format!("127.53.{}.{b}:53", std::process::id() % 250);
        match UdpSocket::bind(&addr) {
            Ok(s) => {
                let conf = dir.join("resolv.conf");
                let ip = addr.trim_end_matches(":53");
                let text = format!("nameserver {ip}\noptions timeout:30 attempts:1\n");
                std::fs::write(&conf, text).unwrap();
                return (s, conf);
            }
            Err(e) => last = Some(e),
        }
    }
    panic!("no loopback port 53 to bind: {last:?}");
}

#[test]
fn a_resolver_that_never_answers_does_not_stall_the_control_socket() {
    if !runnable(
        is_root(),
        "root",
        "giving the daemon a resolver that never answers takes a mount namespace of its own",
    ) || !host_ok()
    {
        return;
    }
    let chan = subagentd_e2e::channel();
    let (_hole, conf) = black_hole(chan.path());
    let wrap = [
        "unshare",
        "-m",
        "sh",
        "-c",
        "mount --bind \"$RESOLV\" /etc/resolv.conf && exec \"$@\"",
        "sh",
    ];
    let d = Daemon::start_with(DaemonOpts {
        wrap: wrap.iter().map(|s| s.to_string()).collect(),
        env: vec![("RESOLV".into(), conf.display().to_string())],
        max_concurrent: Some(5),
        ..Default::default()
    });
    let release = chan.path().join("release");
    let py = flood(100, &release);
    let mut c = d.conn();
    let runs: Vec<String> = (0..4)
        .map(|_| {
            c.spawn(
                &session("blackhole"),
                &["sh", "-c", "python3 -c \"$PY\""],
                json!({"env": {"PY": py}, "sandbox": {"network_allow": ["*.blackhole.test:80"]}}),
            )
        })
        .collect();
    for r in &runs {
        wait_until(Duration::from_secs(60), "the runs flood the proxy", || {
            let st = c.call("check_agent_run", json!({"run_id": r})).unwrap();
            let log = std::fs::read_to_string(st["log_path"].as_str().unwrap());
            assert!(
                matches!(st["state"].as_str(), Some("accepted" | "running")),
                "{st}"
            );
            log.unwrap_or_default().contains("STARTED")
        });
    }
    let (mut pings, mut most) = (Vec::new(), 0);
    let watch_until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < watch_until {
        let took = ping(&d);
        pings.push(took);
        most = most.max(threads(d.pid()));
        // A liveness bound: the stall made pings take tens of seconds.
        assert!(
            took < Duration::from_secs(1),
            "a ping took {took:?}: {pings:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A spawn is served too (it needs the daemon's blocking pool).
    let t = Instant::now();
    let quick = c.spawn(&session("blackhole"), &["true"], json!({}));
    let spawned = t.elapsed();
    let st = c.wait(&quick);
    let finished = t.elapsed();
    pings.sort();
    eprintln!(
        "pings: {}, median {:?}, 90th {:?}, worst {:?}; threads at most {most}; spawn answered in {spawned:?}, finished in {finished:?}",
        pings.len(),
        pings[pings.len() / 2],
        pings[pings.len() * 9 / 10],
        pings[pings.len() - 1],
    );
    assert_eq!(st["state"], "succeeded", "{st}");
    assert!(spawned < Duration::from_secs(2), "spawn took {spawned:?}");
    assert!(most < 100, "the daemon ran {most} threads");
    std::fs::write(&release, "").unwrap();
    let mut busy = 0;
    for r in &runs {
        let st = c.wait(r);
        assert_eq!(st["state"], "succeeded", "{st}");
        let lines = egress_log(&st, 1);
        assert!(lines.iter().all(|l| l["verdict"] != "allowed"), "{lines:?}");
        busy += lines
            .iter()
            .filter(|l| {
                l["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("lookups of the run were already in flight"))
            })
            .count();
    }
    // More lookups than a run's share wait, then are refused, saying why.
    assert!(busy > 0, "no lookup waited for a slot");
}
