//! Egress by allowlist, through the real daemon: a run with
//! `sandbox.network_allow` reaches exactly the listed `host:port`s of test
//! servers on 127.0.0.1, through the daemon's proxy, from Python's urllib
//! and http.client and from curl; everything else is refused and recorded
//! in its egress.log; bursts, slow and huge requests do not stop the proxy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use subagentd_e2e::{session, wait_until, Daemon, DaemonOpts};

/// An HTTP server on 127.0.0.1 that answers every request with
/// `hello <port> <path>` and counts its connections.
struct Server {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl Server {
    fn start() -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || answer(s, port));
            }
        });
        Server { port, connections }
    }

    fn seen(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn answer(mut s: TcpStream, port: u16) {
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
    let body = format!("hello {port} {path}\n");
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Whether this host can run allowlist runs (the default requirements).
fn host_ok() -> bool {
    for m in subagentd_e2e::missing_mechanisms() {
        if !subagentd_e2e::runnable(false, &m, &format!("this host cannot enforce {m}")) {
            return false;
        }
    }
    true
}

/// Runs `script` under `sh` with `sandbox`; returns the status and log.
fn run(d: &Daemon, script: &str, extra: Value) -> (Value, String) {
    let mut c = d.conn();
    let mut params = json!({
        "session": {"id": session("egress"), "audience": "personal", "project_dir": "/tmp"},
        "task": "reach the network",
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

/// The lines of a run's egress.log, once `n` are there.
fn egress_log(st: &Value, n: usize) -> Vec<Value> {
    let path = PathBuf::from(st["result_path"].as_str().unwrap()).with_file_name("egress.log");
    let read = |p: &Path| -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    wait_until(Duration::from_secs(10), "egress.log lines", || {
        read(&path).len() >= n
    });
    read(&path)
}

/// Python that fetches `url` through the proxy with urllib (plain HTTP)
/// and prints the body or the error.
fn urllib(url: &str) -> String {
    format!(
        "python3 -c \"import os, urllib.request as u\nh = u.ProxyHandler({{'http': os.environ['HTTP_PROXY']}})\ntry:\n print('URLLIB', u.build_opener(h).open('{url}', timeout=20).read().decode().strip())\nexcept Exception as e:\n print('URLLIB-ERR', e)\"\n"
    )
}

/// Python that opens a CONNECT tunnel through the proxy with http.client
/// and fetches `path` on `port` through it.
fn tunnel(port: u16, path: &str) -> String {
    format!(
        "python3 -c \"import http.client as h\nc = h.HTTPConnection('127.0.0.1', 3128, timeout=20)\nc.set_tunnel('127.0.0.1', {port})\ntry:\n c.request('GET', '{path}')\n print('TUNNEL', c.getresponse().read().decode().strip())\nexcept Exception as e:\n print('TUNNEL-ERR', e)\"\n"
    )
}

#[test]
fn a_listed_port_is_reached_through_the_proxy_and_an_unlisted_one_is_not() {
    if !host_ok() {
        return;
    }
    let (listed, unlisted) = (Server::start(), Server::start());
    let d = Daemon::start();
    let (p, q) = (listed.port, unlisted.port);
    // NO_PROXY names the run's own loopback; these servers are the host's.
    let script = format!(
        "unset NO_PROXY no_proxy\n{}{}{}{}\
         curl -s -m 20 http://127.0.0.1:{p}/curl-plain; echo\n\
         curl -s -m 20 -p http://127.0.0.1:{p}/curl-tunnel; echo\n\
         curl -s -m 20 -o /dev/null -w 'CURL-UNLISTED %{{http_code}}\\n' http://127.0.0.1:{q}/no\n\
         curl -s -m 20 -p -o /dev/null -w 'CURL-UNLISTED-TUNNEL %{{http_code}} %{{http_connect}}\\n' http://127.0.0.1:{q}/no\n\
         echo done\n",
        urllib(&format!("http://127.0.0.1:{p}/urllib")),
        tunnel(p, "/http-client-tunnel"),
        urllib(&format!("http://127.0.0.1:{q}/no")),
        tunnel(q, "/no"),
    );
    let allow = format!("127.0.0.1:{p}");
    let (st, log) = run(&d, &script, json!({"sandbox": {"network_allow": [allow]}}));
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    for want in [
        format!("URLLIB hello {p} /urllib"),
        format!("TUNNEL hello {p} /http-client-tunnel"),
        format!("hello {p} /curl-plain"),
        format!("hello {p} /curl-tunnel"),
        "CURL-UNLISTED 403".to_owned(),
        "CURL-UNLISTED-TUNNEL 000 403".to_owned(),
    ] {
        assert!(log.contains(&want), "{want:?} missing from\n{log}");
    }
    assert!(log.contains("URLLIB-ERR HTTP Error 403"), "{log}");
    assert!(
        log.contains("TUNNEL-ERR Tunnel connection failed: 403"),
        "{log}"
    );
    assert_eq!(unlisted.seen(), 0, "the unlisted server was reached");
    assert_eq!(listed.seen(), 4);
    assert_eq!(st["network"], "allowlist", "{st}");
    let iso = &st["isolation"]["network"];
    assert_eq!(iso["enforced"], true, "{st}");
    assert!(
        iso["detail"].as_str().unwrap().contains("allowlist"),
        "{iso}"
    );
    let lines = egress_log(&st, 8);
    assert_eq!(lines.len(), 8, "{lines:?}");
    let allowed: Vec<&Value> = lines.iter().filter(|l| l["verdict"] == "allowed").collect();
    assert_eq!(allowed.len(), 4, "{lines:?}");
    for l in &allowed {
        assert_eq!(l["host"], "127.0.0.1");
        assert_eq!(l["port"], p);
        assert_eq!(l["address"], "127.0.0.1");
        assert!(l["bytes_up"].as_u64().unwrap() > 0, "{l}");
        assert!(l["bytes_down"].as_u64().unwrap() > 0, "{l}");
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
        assert!(l["duration_ms"].is_u64(), "{l}");
    }
    for l in lines.iter().filter(|l| l["verdict"] != "allowed") {
        assert_eq!(l["verdict"], "refused", "{l}");
        assert_eq!(l["port"], q, "{l}");
        assert_eq!(l["reason"], "not on the run's list", "{l}");
    }
    let e = &st["egress"];
    assert_eq!(
        (e["allowed"].as_u64(), e["refused"].as_u64()),
        (Some(4), Some(4)),
        "{st}"
    );
    assert_eq!(e["refused_hosts"], json!([format!("127.0.0.1:{q}")]));
    let md = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(md.contains("## Egress"), "{md}");
    assert!(md.contains("4 allowed, 4 refused"), "{md}");
    assert!(md.contains(&format!("`127.0.0.1:{q}`")), "{md}");
}

#[test]
fn a_run_cannot_go_around_the_proxy() {
    if !host_ok() {
        return;
    }
    let server = Server::start();
    let d = Daemon::start();
    let p = server.port;
    let py = format!(
        "import errno, socket\n\
         def tcp(addr):\n\
         \ts = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n\
         \ts.settimeout(5)\n\
         \ttry:\n\
         \t\ts.connect(addr); return 'OPEN'\n\
         \texcept OSError as e:\n\
         \t\treturn errno.errorcode.get(e.errno, str(e))\n\
         print('direct', tcp(('127.0.0.1', {p})))\n\
         print('lan', tcp(('10.0.0.1', 80)))\n\
         print('internet', tcp(('1.1.1.1', 80)))\n\
         print('proxy', tcp(('127.0.0.1', 3128)).lower())\n\
         b = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n\
         try:\n\
         \tb.bind(('127.0.0.1', 8080)); print('bind OPEN')\n\
         except OSError as e:\n\
         \tprint('bind', errno.errorcode.get(e.errno))\n\
         u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         try:\n\
         \tu.sendto(b'x', ('1.1.1.1', 53)); print('udp OPEN')\n\
         except OSError as e:\n\
         \tprint('udp', errno.errorcode.get(e.errno))\n\
         for name, fam in [('netlink', socket.AF_NETLINK), ('packet', socket.AF_PACKET)]:\n\
         \ttry:\n\
         \t\tsocket.socket(fam, socket.SOCK_RAW); print(name, 'OPEN')\n\
         \texcept OSError as e:\n\
         \t\tprint(name, errno.errorcode.get(e.errno))\n"
    );
    let script = format!(
        "python3 -c \"$PY\"\nunset NO_PROXY no_proxy\n\
         curl -s -m 20 -o /dev/null -w 'META %{{http_code}}\\n' http://169.254.169.254:80/latest\n\
         curl -s -m 20 -o /dev/null -w 'REBIND %{{http_code}}\\n' http://localhost:{p}/\n\
         curl -s -m 20 --noproxy '*' -o /dev/null -w 'NOPROXY %{{http_code}}\\n' http://127.0.0.1:{p}/\n\
         echo done\n"
    );
    let allow = json!(["169.254.169.254:80", format!("localhost:{p}")]);
    let (st, log) = run(
        &d,
        &script,
        json!({"env": {"PY": py}, "sandbox": {"network_allow": allow}}),
    );
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert!(!log.contains("OPEN"), "{log}");
    // Landlock refuses TCP connect to any port but the proxy's, and bind.
    for want in [
        "direct EACCES",
        "lan EACCES",
        "internet EACCES",
        "proxy open",
        "bind EACCES",
        "udp ENETUNREACH",
        "netlink EAFNOSUPPORT",
        "packet EAFNOSUPPORT",
        "META 403",
        "REBIND 403",
        "NOPROXY 000",
    ] {
        assert!(log.contains(want), "{want:?} missing from\n{log}");
    }
    assert_eq!(server.seen(), 0, "the server was reached");
    let lines = egress_log(&st, 3);
    let reasons: Vec<&str> = lines.iter().filter_map(|l| l["reason"].as_str()).collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("169.254.169.254 is a cloud metadata address")),
        "{lines:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("127.0.0.1 is a loopback or private address")),
        "{lines:?}"
    );
}

#[test]
fn a_listed_name_resolving_to_the_metadata_address_is_refused() {
    if !host_ok() {
        return;
    }
    if !subagentd_e2e::is_root() {
        subagentd_e2e::runnable(
            false,
            "namespaces",
            "a hosts file of the daemon's own needs root",
        );
        return;
    }
    let server = Server::start();
    let p = server.port;
    let hosts = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        hosts.path(),
        "127.0.0.1 localhost\n169.254.169.254 metadata.egress.test\n127.0.0.1 rebind.egress.test\n10.0.0.1 lan.egress.test\n",
    )
    .unwrap();
    // The daemon resolves names itself: give it a hosts file of its own.
    let wrap = vec![
        "unshare".into(),
        "-m".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!(
            "mount --bind {} /etc/hosts && exec \"$@\"",
            hosts.path().display()
        ),
        "sh".into(),
    ];
    let d = Daemon::start_with(DaemonOpts {
        wrap,
        ..Default::default()
    });
    let script = format!(
        "unset NO_PROXY no_proxy\n\
         curl -s -m 20 -o /dev/null -w 'META %{{http_code}}\\n' http://metadata.egress.test/latest\n\
         curl -s -m 20 -p -o /dev/null -w 'META-TUNNEL %{{http_connect}}\\n' http://metadata.egress.test/latest\n\
         curl -s -m 20 -o /dev/null -w 'REBIND %{{http_code}}\\n' http://rebind.egress.test:{p}/\n\
         curl -s -m 20 -o /dev/null -w 'LAN %{{http_code}}\\n' http://lan.egress.test/\n\
         echo done\n"
    );
    let allow = json!([
        "metadata.egress.test:80",
        format!("rebind.egress.test:{p}"),
        "*.egress.test:80"
    ]);
    let (st, log) = run(&d, &script, json!({"sandbox": {"network_allow": allow}}));
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    for want in ["META 403", "META-TUNNEL 403", "REBIND 403", "LAN 403"] {
        assert!(log.contains(want), "{want:?} missing from\n{log}");
    }
    assert_eq!(server.seen(), 0);
    let lines = egress_log(&st, 4);
    let of = |host: &str| lines.iter().find(|l| l["host"] == host).unwrap().clone();
    let meta = of("metadata.egress.test");
    assert_eq!(meta["verdict"], "refused");
    assert_eq!(meta["address"], "169.254.169.254");
    assert!(
        meta["reason"].as_str().unwrap().contains("metadata"),
        "{meta}"
    );
    assert_eq!(of("rebind.egress.test")["address"], "127.0.0.1");
    assert_eq!(of("lan.egress.test")["address"], "10.0.0.1");
}

#[test]
fn bursts_slow_and_huge_requests_do_not_stop_the_proxy() {
    if !host_ok() {
        return;
    }
    let server = Server::start();
    let d = Daemon::start();
    let p = server.port;
    let py = format!(
        "import socket, time\n\
         def get(path):\n\
         \ts = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
         \ts.sendall(('GET http://127.0.0.1:{p}' + path + ' HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n').encode())\n\
         \tdata = b''\n\
         \twhile True:\n\
         \t\tb = s.recv(65536)\n\
         \t\tif not b: break\n\
         \t\tdata += b\n\
         \ts.close()\n\
         \treturn data.decode(errors='replace')\n\
         slow = socket.create_connection(('127.0.0.1', 3128), timeout=60)\n\
         slow.sendall(b'GET http://127.0.0.1:{p}/slow HTTP/1.1\\r\\nHost: x\\r\\n')\n\
         big = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
         try:\n\
         \tbig.sendall(b'GET http://127.0.0.1:{p}/big HTTP/1.1\\r\\nX-Big: ' + b'a' * (1 << 20) + b'\\r\\n\\r\\n')\n\
         except OSError as e:\n\
         \tprint('big send cut', e.errno)\n\
         try:\n\
         \tprint('BIG', big.recv(100).split(b'\\r\\n')[0].decode())\n\
         except OSError as e:\n\
         \tprint('BIG reset', e.errno)\n\
         held = []\n\
         for i in range(1000):\n\
         \theld.append(socket.create_connection(('127.0.0.1', 3128), timeout=30))\n\
         refused = 0\n\
         for s in held[300:]:\n\
         \tif s.recv(100).startswith(b'HTTP/1.1 503'): refused += 1\n\
         print('REFUSED-OVER-CAP', refused)\n\
         for s in held: s.close()\n\
         deadline = time.time() + 20\n\
         while 'hello {p} /after' not in get('/after') and time.time() < deadline: time.sleep(0.05)\n\
         print('AFTER', get('/after').splitlines()[-1])\n\
         ok = 0\n\
         for i in range(1000):\n\
         \tif ('hello {p} /n%d' % i) in get('/n%d' % i): ok += 1\n\
         print('SEQUENTIAL-OK', ok)\n\
         t = time.time()\n\
         print('SLOW-CLOSED', slow.recv(100) == b'', int(time.time() - t) < 30)\n"
    );
    let allow = json!([format!("127.0.0.1:{p}")]);
    let (st, log) = run(
        &d,
        "python3 -c \"$PY\"",
        json!({"env": {"PY": py}, "sandbox": {"network_allow": allow}}),
    );
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert!(
        log.contains("BIG HTTP/1.1 431")
            || log.contains("BIG reset")
            || log.contains("big send cut"),
        "{log}"
    );
    assert!(log.contains(&format!("AFTER hello {p} /after")), "{log}");
    assert!(log.contains("SEQUENTIAL-OK 1000"), "{log}");
    assert!(log.contains("SLOW-CLOSED True True"), "{log}");
    let refused: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("REFUSED-OVER-CAP "))
        .unwrap()
        .parse()
        .unwrap();
    // At most the cap (128) of the 1,000 held connections was taken.
    assert!(refused >= 1000 - 300 - 128, "{log}");
    assert!(server.seen() >= 1001, "{}", server.seen());
    let lines = egress_log(&st, 1000);
    let reason = |needle: &str| {
        lines
            .iter()
            .any(|l| l["reason"].as_str().is_some_and(|r| r.contains(needle)))
    };
    assert!(reason("not complete after 10 s"), "no slowloris line");
    assert!(reason("over 65536 bytes"), "no oversized-head line");
    assert!(reason("connection cap (128)"), "no cap line");
    assert!(subagentd_e2e::alive(d.pid()));
}

#[test]
fn without_a_list_nothing_is_reachable() {
    if !host_ok() {
        return;
    }
    let server = Server::start();
    let d = Daemon::start();
    let p = server.port;
    let script = format!(
        "env | grep -i _proxy; curl -s -m 5 -x http://127.0.0.1:3128 -o /dev/null -w 'VIA-PORT %{{http_code}}\\n' http://127.0.0.1:{p}/\n\
         echo done\n"
    );
    let (st, log) = run(&d, &script, json!({}));
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert!(log.contains("VIA-PORT 000"), "{log}");
    assert!(!log.to_ascii_lowercase().contains("_proxy="), "{log}");
    assert_eq!(st["network"], "none");
    assert!(st.get("egress").is_none(), "{st}");
    assert_eq!(server.seen(), 0);
    let md = std::fs::read_to_string(st["result_path"].as_str().unwrap()).unwrap();
    assert!(!md.contains("## Egress"));
    let full = run(&d, "true", json!({"sandbox": {"network": true}})).0;
    assert_eq!(full["network"], "full", "{full}");
    assert!(full["isolation"]["network"]["detail"]
        .as_str()
        .unwrap()
        .starts_with("full"));
}

#[test]
fn the_config_lists_for_every_run_gives_network_tools_the_list_and_caps_audiences() {
    if !host_ok() {
        return;
    }
    let server = Server::start();
    let p = server.port;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "network_allow = [\"127.0.0.1:{p}\"]\nnetwork_tools = \"allowlist\"\n\n[audiences.personal]\nnetwork_allow = [\"*.example.com:443\"]\n"
        ),
    )
    .unwrap();
    let d = Daemon::start_with(DaemonOpts {
        args: vec!["--config".into(), cfg.display().to_string()],
        ..Default::default()
    });
    let script = format!("unset NO_PROXY no_proxy; curl -s -m 20 http://127.0.0.1:{p}/cfg");
    // A network switch gets the allowlist, not the host's network.
    let (st, log) = run(&d, &script, json!({"sandbox": {"network": true}}));
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert!(log.contains(&format!("hello {p} /cfg")), "{log}");
    assert_eq!(st["network"], "allowlist");
    assert_eq!(st["rights"]["network"], false);
    // Within the audience's cap: added to the config's list.
    let (st, _) = run(
        &d,
        "true",
        json!({"sandbox": {"network_allow": ["api.example.com:443"]}}),
    );
    assert_eq!(
        st["network_allow"],
        json!([format!("127.0.0.1:{p}"), "api.example.com:443"])
    );
    // Outside it, or malformed: refused, naming the entry.
    let mut c = d.conn();
    for (entry, field) in [
        ("evil.com:443", "sandbox.network_allow[0]"),
        ("api.example.com:80", "sandbox.network_allow[0]"),
        ("nonsense", "sandbox.network_allow[0]"),
    ] {
        let e = c
            .call(
                "spawn_agent",
                json!({
                    "session": {"id": session("cap"), "audience": "personal", "project_dir": "/tmp"},
                    "task": "t", "command": ["true"],
                    "sandbox": {"network_allow": [entry]},
                }),
            )
            .unwrap_err();
        assert_eq!(e["code"], -32602, "{e}");
        assert!(e["message"].as_str().unwrap().contains(field), "{e}");
    }
    // network: false takes everything away.
    let (st, _) = run(&d, "true", json!({"sandbox": {"network": false}}));
    assert_eq!(st["network"], "none");
}

/// A server on 127.0.0.1 that accepts connections and holds them, never
/// answering or closing one.
struct Silent {
    port: u16,
    held: Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl Silent {
    fn start() -> Silent {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = held.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                h.lock().unwrap().push(s);
            }
        });
        Silent { port, held }
    }

    fn seen(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

/// The descriptors process `pid` holds.
fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Python that opens `n` CONNECT tunnels to `port` through the proxy,
/// sends a little through each one let through, prints `HELD <ok> <503s>
/// <other>`, and holds them until `release` exists (at most 120 s).
fn hold_tunnels(n: usize, port: u16, release: &Path) -> String {
    format!(
        "import os, socket, time\n\
         ok = busy = other = 0\n\
         held = []\n\
         for i in range({n}):\n\
         \ts = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
         \ts.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n\
         \ttry:\n\
         \t\tr = s.recv(100)\n\
         \texcept OSError:\n\
         \t\tr = b''\n\
         \tif r.startswith(b'HTTP/1.1 200'):\n\
         \t\tok += 1\n\
         \t\ts.sendall(b'x' * 1000)\n\
         \telif r.startswith(b'HTTP/1.1 503'): busy += 1\n\
         \telse: other += 1\n\
         \theld.append(s)\n\
         print('HELD', ok, busy, other, flush=True)\n\
         deadline = time.time() + 120\n\
         while not os.path.exists('{release}') and time.time() < deadline: time.sleep(0.05)\n\
         print('RELEASED', flush=True)\n",
        release = release.display()
    )
}

/// The numbers of a run's `HELD ok busy other` line.
fn held_counts(log: &str) -> (usize, usize, usize) {
    let line = log.lines().find_map(|l| l.strip_prefix("HELD ")).unwrap();
    let n: Vec<usize> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    (n[0], n[1], n[2])
}

#[test]
fn runs_holding_tunnels_cannot_exhaust_the_daemons_descriptors() {
    if !host_ok() {
        return;
    }
    let silent = Silent::start();
    // A soft descriptor limit of 512 (hard 4096, what the runs' own
    // limit needs): three runs of 200 tunnels each would need 1200.
    let wrap = [
        "sh",
        "-c",
        "ulimit -Sn 512 && ulimit -Hn 4096 && exec \"$@\"",
        "sh",
    ];
    let d = Daemon::start_with(DaemonOpts {
        wrap: wrap.iter().map(|s| s.to_string()).collect(),
        max_concurrent: Some(3),
        ..Default::default()
    });
    // What the daemon holds before any run (its sockets, its database).
    let idle = fds(d.pid());
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).unwrap();
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        nofile.split_whitespace().nth(3),
        Some("4096"),
        "the soft limit is raised to the hard one: {nofile}"
    );
    let chan = subagentd_e2e::channel();
    let release = chan.path().join("release");
    let py = hold_tunnels(200, silent.port, &release);
    let allow = json!([format!("127.0.0.1:{}", silent.port)]);
    let mut c = d.conn();
    let runs: Vec<String> = (0..3)
        .map(|_| {
            c.spawn(
                &session("fds"),
                &["sh", "-c", "python3 -c \"$PY\""],
                json!({"env": {"PY": py}, "sandbox": {"network_allow": allow}}),
            )
        })
        .collect();
    for r in &runs {
        wait_until(
            Duration::from_secs(90),
            "the runs hold their tunnels",
            || {
                let st = c.call("check_agent_run", json!({"run_id": r})).unwrap();
                let log = std::fs::read_to_string(st["log_path"].as_str().unwrap());
                let log = log.unwrap_or_default();
                assert!(
                    matches!(st["state"].as_str(), Some("accepted" | "running")),
                    "{st} {log}"
                );
                log.contains("HELD")
            },
        );
    }
    let held = fds(d.pid());
    // A host client is served, and not taken for a subagent.
    let mut host = d.conn();
    host.call("list_agent_runs", json!({}))
        .unwrap_or_else(|e| panic!("a host client was refused while runs held tunnels: {e}"));
    std::fs::write(&release, "").unwrap();
    let mut ok = 0;
    for r in &runs {
        let st = c.wait(r);
        let log = std::fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
        assert_eq!(st["state"], "succeeded", "{st} {log}");
        let (o, busy, other) = held_counts(&log);
        assert_eq!(o + busy + other, 200, "{log}");
        assert!(o <= 128, "over the run's cap: {log}");
        ok += o;
    }
    // Each run's cap counts both descriptors of a tunnel: 128 tunnels,
    // beyond what the idle daemon held and the runs' own few.
    assert!(
        held < idle + 2 * 3 * 128 + 100,
        "the daemon held {held} descriptors ({idle} idle)"
    );
    assert!(ok >= 128, "only {ok} tunnels were let through");
    assert!(silent.seen() >= ok);
    assert!(!d.log().contains("Too many open files"), "{}", d.log());
}
#[test]
fn a_runs_tunnels_end_with_it() {
    if !host_ok() {
        return;
    }
    let silent = Silent::start();
    let d = Daemon::start();
    let before = fds(d.pid());
    let chan = subagentd_e2e::channel();
    let release = chan.path().join("release");
    std::fs::write(&release, "").unwrap();
    // The run opens tunnels to a destination that never answers nor
    // closes, and ends.
    let py = hold_tunnels(60, silent.port, &release);
    let allow = json!([format!("127.0.0.1:{}", silent.port)]);
    let (st, log) = run(
        &d,
        "python3 -c \"$PY\"",
        json!({"env": {"PY": py}, "sandbox": {"network_allow": allow}}),
    );
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert_eq!(held_counts(&log), (60, 0, 0), "{log}");
    wait_until(
        Duration::from_secs(20),
        "the daemon to close the run's tunnels",
        || fds(d.pid()) <= before + 2,
    );
    let lines = egress_log(&st, 60);
    assert_eq!(lines.len(), 60, "{lines:?}");
    assert!(lines.iter().all(|l| l["verdict"] == "allowed"), "{lines:?}");
}

#[test]
fn refusals_cannot_fill_the_disk_nor_the_summary() {
    if !host_ok() {
        return;
    }
    let d = Daemon::start();
    // 300 CONNECTs to unlisted names of 250 bytes, then 300 to a
    // 60,000-byte host, as fast as the proxy answers.
    let py = "import socket\n\
         def ask(host):\n\
         \ts = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
         \ts.sendall(('CONNECT ' + host + ':443 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n').encode())\n\
         \tr = s.recv(100)\n\
         \ts.close()\n\
         \treturn r.split(b' ')[1].decode()\n\
         codes = [ask('%03d' % i + 'b' * 247) for i in range(300)]\n\
         codes += [ask('a' * 60000) for i in range(300)]\n\
         print('CODES', sorted(set(codes)))\n";
    let (st, log) = run(
        &d,
        "python3 -c \"$PY\"",
        json!({"env": {"PY": py}, "sandbox": {"network_allow": ["api.example.com:443"]}}),
    );
    assert_eq!(st["state"], "succeeded", "{st} {log}");
    assert!(log.contains("CODES ['400', '403']"), "{log}");
    let path = PathBuf::from(st["result_path"].as_str().unwrap()).with_file_name("egress.log");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.len() < 64 * 1024, "egress.log is {} bytes", text.len());
    assert!(text.lines().all(|l| l.len() < 1024), "a long line");
    let e = &st["egress"];
    assert_eq!(e["refused"], 600, "{e}");
    let hosts = e["refused_hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 20, "{e}");
    assert!(
        hosts.iter().all(|h| h.as_str().unwrap().len() <= 253 + 4),
        "{e}"
    );
}
