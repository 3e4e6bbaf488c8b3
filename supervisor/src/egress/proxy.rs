//! One proxied connection: the request head read within a size and a time
//! bound and parsed with `httparse`, the target checked against the run's
//! list, the name resolved here and every address judged
//! ([`policy::sandbox::network::judge`]), then a CONNECT tunnel or one
//! plain HTTP request relayed, and a line written to egress.log.

use super::log::{self, Entry, Verdict};
use super::{budget, RunProxy};
use policy::sandbox::network::{self, HostPattern, Refusal};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest request head read.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The time a client has to send its whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The time a destination has to accept the connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A relayed connection with no byte either way for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The silence after which TCP keepalive probes a relayed socket's peer.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
/// Headers per request.
const MAX_HEADERS: usize = 128;
/// The relay's buffer each way: with the daemon's connection budget
/// ([`super::budget`]), what all tunnels can hold in the daemon's memory.
const RELAY_BUF: usize = 32 * 1024;
/// Headers that concern one hop only, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// Serves a connection the run's listener accepted on a task of `conns`,
/// within the run's connection cap and the daemon's budget, until it ends
/// or `cancel` (its attempt or its run has ended).
pub fn admit(
    run: &Arc<RunProxy>,
    client: TcpStream,
    cancel: Cancel,
    conns: &mut tokio::task::JoinSet<()>,
) {
    let permits = run.slots.clone().try_acquire_owned().map_err(|_| Full::Run);
    let permits = permits.and_then(|p| {
        let g = run
            .global
            .clone()
            .try_acquire_owned()
            .map_err(|_| Full::Daemon)?;
        Ok((p, g))
    });
    match permits {
        Ok(permits) => {
            let run = run.clone();
            conns.spawn(async move {
                serve_connection(&run, client, cancel).await;
                drop(permits);
            });
        }
        Err(full) => over_cap(run, client, full, conns),
    }
}

/// Turns true (or is dropped) when a connection must end.
pub type Cancel = tokio::sync::watch::Receiver<bool>;

/// Resolves once `cancel` says so.
async fn cancelled(cancel: &mut Cancel) {
    let _ = cancel.wait_for(|end| *end).await;
}

/// Which cap a connection found full.
#[derive(Debug, Clone, Copy)]
enum Full {
    Run,
    Daemon,
}

/// A connection over a cap: answered `503` and logged. Its answer lingers
/// (up to a second, reading what the client sent, so that closing does
/// not reset the connection before the client read the answer) only
/// within [`budget::refusals`]; past that it is closed at once.
fn over_cap(
    run: &Arc<RunProxy>,
    mut client: TcpStream,
    full: Full,
    conns: &mut tokio::task::JoinSet<()>,
) {
    let mut entry = Entry::refused_now();
    let why = match full {
        Full::Run => format!(
            "the run's connection cap ({}) is reached",
            super::MAX_CONNECTIONS
        ),
        Full::Daemon => "the daemon's egress connection budget is used up".to_owned(),
    };
    entry.reason = Some(why.clone());
    write_entry(run, &entry);
    let Ok(permit) = budget::refusals().try_acquire_owned() else {
        let _ = client.try_write(answer(503, "Service Unavailable", &why).as_bytes());
        return;
    };
    conns.spawn(async move {
        let linger = async {
            reply(&mut client, 503, "Service Unavailable", &why).await?;
            let mut sink = [0u8; 4096];
            while client.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), linger).await;
        drop(permit);
    });
}

fn write_entry(run: &RunProxy, entry: &Entry) {
    if let Err(e) = run.log.append(entry) {
        tracing::warn!(run_id = %run.run_id, "egress.log: {e}");
    }
}

/// Serves one connection of the run to its end, or until `cancel`, and
/// logs it.
pub async fn serve_connection(run: &RunProxy, mut client: TcpStream, mut cancel: Cancel) {
    let started = Instant::now();
    let mut entry = Entry::refused_now();
    let _ = client.set_nodelay(true);
    keepalive(&client);
    if !run.log.has_room() {
        // No audit, no egress.
        let why = "egress.log has reached the run's disk budget";
        let _ = reply(&mut client, 503, "Service Unavailable", why).await;
        return;
    }
    let mut relay_cancel = cancel.clone();
    let ended = tokio::select! {
        // A relay sees the same cancel and ends itself, counting its bytes.
        biased;
        _ = handle(run, &mut client, &mut entry, &mut relay_cancel) => false,
        _ = cancelled(&mut cancel) => true,
    };
    if ended && entry.reason.is_none() {
        entry.reason = Some(RUN_ENDED.to_owned());
    }
    entry.duration_ms = started.elapsed().as_millis() as u64;
    write_entry(run, &entry);
}

/// Why a connection was cut when its attempt or run ended.
const RUN_ENDED: &str = "the run ended";

/// TCP keepalive on a relayed socket, so that a peer gone silent without
/// a word is noticed (after [`KEEPALIVE_IDLE`] and a few probes).
fn keepalive(s: &TcpStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    let idle = KEEPALIVE_IDLE.as_secs() as u32;
    let _ = setsockopt(s, sockopt::KeepAlive, &true);
    let _ = setsockopt(s, sockopt::TcpKeepIdle, &idle);
    let _ = setsockopt(s, sockopt::TcpKeepInterval, &10);
    let _ = setsockopt(s, sockopt::TcpKeepCount, &6);
}

/// Why a request head was not read.
#[derive(Debug, thiserror::Error)]
enum HeadError {
    #[error("the request head is over {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("the request head is not complete after {} s", HEAD_TIMEOUT.as_secs())]
    Slow,
    #[error("malformed request: {0}")]
    Malformed(httparse::Error),
    #[error("the client closed the connection before a whole request head")]
    Closed,
    /// The request line names no target the proxy serves.
    #[error("{0}")]
    Target(&'static str),
    #[error("reading the request: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads until `buf` holds a whole request head; returns its length (what
/// follows it in `buf` is the start of the body or the tunnel).
async fn read_head(client: &mut TcpStream, buf: &mut Vec<u8>) -> Result<usize, HeadError> {
    let read = async {
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            match httparse::Request::new(&mut headers).parse(buf) {
                Ok(httparse::Status::Complete(n)) => return Ok(n),
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Err(HeadError::Malformed(e)),
            }
            let room = MAX_HEAD_BYTES.saturating_sub(buf.len());
            if room == 0 {
                return Err(HeadError::TooLarge);
            }
            let want = room.min(chunk.len());
            let n = client.read(&mut chunk[..want]).await?;
            if n == 0 {
                return Err(HeadError::Closed);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(HEAD_TIMEOUT, read)
        .await
        .unwrap_or(Err(HeadError::Slow))
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// CONNECT host:port.
    Tunnel { host: String, port: u16 },
    /// A plain request in absolute form: `http://authority/path`.
    Forward {
        host: String,
        port: u16,
        authority: String,
        path: String,
    },
}

impl Target {
    fn host_port(&self) -> (&str, u16) {
        match self {
            Target::Tunnel { host, port } | Target::Forward { host, port, .. } => (host, *port),
        }
    }
}

/// The host of `a`, when it is no longer than a DNS name may be.
fn host_of(a: &http::uri::Authority) -> Result<String, &'static str> {
    let host = a.host();
    if host.trim_start_matches('[').trim_end_matches(']').len() > log::MAX_HOST_BYTES {
        return Err("the host is over 253 bytes");
    }
    Ok(host.to_owned())
}

/// The port of `a` (`default` when it names none): 1 to 65535 in plain
/// decimal digits, no sign and no leading zero.
fn port_of(a: &http::uri::Authority, default: Option<u16>) -> Result<u16, &'static str> {
    const BAD: &str = "the port is not a number from 1 to 65535";
    let s = a.as_str();
    let hostport = &s[s.rfind('@').map_or(0, |i| i + 1)..];
    let text = match hostport.strip_prefix(a.host()) {
        Some("") => return default.ok_or("CONNECT needs host:port"),
        Some(rest) => rest.strip_prefix(':').ok_or(BAD)?,
        None => return Err(BAD),
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) || text.starts_with('0') {
        return Err(BAD);
    }
    text.parse::<u16>().ok().filter(|&n| n > 0).ok_or(BAD)
}

/// The target of a request, from its method and request target.
fn target(method: &str, uri: &str) -> Result<Target, &'static str> {
    if method == "CONNECT" {
        let a: http::uri::Authority = uri.parse().map_err(|_| "CONNECT needs host:port")?;
        if a.as_str().contains('@') {
            return Err("CONNECT needs host:port");
        }
        let port = port_of(&a, None)?;
        return Ok(Target::Tunnel {
            host: host_of(&a)?,
            port,
        });
    }
    let u: http::Uri = uri.parse().map_err(|_| "malformed request target")?;
    if u.scheme_str() != Some("http") {
        return Err("only http:// URLs are forwarded; use CONNECT for anything else");
    }
    let a = u.authority().ok_or("the URL names no host")?;
    let host = host_of(a)?;
    let port = port_of(a, Some(80))?;
    // The Host header names the host and port, never a user or password.
    let authority = match a.as_str().ends_with(&format!(":{port}")) {
        true => format!("{host}:{port}"),
        false => host.clone(),
    };
    Ok(Target::Forward {
        host,
        port,
        authority,
        path: u
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
    })
}

/// The parsed head: method, target, and the head to send upstream (plain
/// requests only).
struct Parsed {
    method: String,
    target: Target,
    upstream_head: Vec<u8>,
}

fn parse_head(head: &[u8]) -> Result<Parsed, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(head).map_err(HeadError::Malformed)?;
    let method = req.method.unwrap_or_default().to_owned();
    let target = target(&method, req.path.unwrap_or_default()).map_err(HeadError::Target)?;
    let mut upstream_head = Vec::new();
    if let Target::Forward {
        authority, path, ..
    } = &target
    {
        upstream_head = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\n").into_bytes();
        for h in req.headers.iter() {
            if HOP_BY_HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
                continue;
            }
            upstream_head.extend_from_slice(h.name.as_bytes());
            upstream_head.extend_from_slice(b": ");
            upstream_head.extend_from_slice(h.value);
            upstream_head.extend_from_slice(b"\r\n");
        }
        upstream_head.extend_from_slice(b"Connection: close\r\n\r\n");
    }
    Ok(Parsed {
        method,
        target,
        upstream_head,
    })
}

/// A short error response.
fn answer(code: u16, status: &str, why: &str) -> String {
    let body = format!("subagentd egress proxy: {why}\n");
    format!(
        "HTTP/1.1 {code} {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Writes a short error response.
async fn reply(client: &mut TcpStream, code: u16, status: &str, why: &str) -> std::io::Result<()> {
    client
        .write_all(answer(code, status, why).as_bytes())
        .await?;
    client.shutdown().await
}

/// Reads, checks and relays one request; fills `entry` in.
async fn handle(run: &RunProxy, client: &mut TcpStream, entry: &mut Entry, cancel: &mut Cancel) {
    let mut buf = Vec::with_capacity(4096);
    let head_len = match read_head(client, &mut buf).await {
        Ok(n) => n,
        Err(e) => {
            entry.reason = Some(e.to_string());
            let (code, status) = match e {
                HeadError::TooLarge => (431, "Request Header Fields Too Large"),
                HeadError::Malformed(_) => (400, "Bad Request"),
                _ => return,
            };
            let _ = reply(client, code, status, &e.to_string()).await;
            return;
        }
    };
    let parsed = match parse_head(&buf[..head_len]) {
        Ok(p) => p,
        Err(e) => {
            let why = e.to_string();
            let _ = reply(client, 400, "Bad Request", &why).await;
            entry.reason = Some(why);
            return;
        }
    };
    entry.method = log::clip(&parsed.method, 32).to_owned();
    let (host, port) = parsed.target.host_port();
    entry.host = log::shown_host(host);
    entry.port = port;
    let upstream = match connect(run, host, port, entry).await {
        Some(s) => s,
        None => {
            let (code, status) = match entry.verdict {
                Verdict::Refused => (403, "Forbidden"),
                _ => (502, "Bad Gateway"),
            };
            let why = format!("{host}:{port}: {}", entry.reason.as_deref().unwrap_or(""));
            let _ = reply(client, code, status, &why).await;
            return;
        }
    };
    entry.verdict = Verdict::Allowed;
    relay(client, upstream, &parsed, &buf[head_len..], entry, cancel).await;
}

/// Checks `host:port` against the run's list, resolves it and connects to
/// the first address the rules allow. On `None`, `entry` says why.
async fn connect(run: &RunProxy, host: &str, port: u16, entry: &mut Entry) -> Option<TcpStream> {
    let pattern = network::parse_host(host);
    let Some(listed) = pattern
        .as_ref()
        .and_then(|h| network::find(&run.allow, h, port))
    else {
        entry.reason = Some(Refusal::NotListed.to_string());
        return None;
    };
    let addrs = match addresses(run, pattern.as_ref(), host).await {
        Ok(a) => a,
        Err(why) => {
            entry.verdict = Verdict::Failed;
            entry.reason = Some(why);
            return None;
        }
    };
    let mut allowed = Vec::new();
    for ip in &addrs {
        match network::judge(listed, *ip) {
            Ok(()) => allowed.push(*ip),
            Err(r) if allowed.is_empty() && entry.reason.is_none() => {
                entry.address = Some(ip.to_string());
                entry.reason = Some(r.to_string());
            }
            Err(_) => {}
        }
    }
    if allowed.is_empty() {
        return None;
    }
    entry.reason = None;
    let mut last = String::new();
    for ip in allowed {
        entry.address = Some(ip.to_string());
        match tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect(SocketAddr::new(ip, port)),
        )
        .await
        {
            Ok(Ok(s)) => return Some(s),
            Ok(Err(e)) => last = format!("connect to {ip}: {e}"),
            Err(_) => {
                last = format!(
                    "connect to {ip}: no answer in {} s",
                    CONNECT_TIMEOUT.as_secs()
                )
            }
        }
    }
    entry.verdict = Verdict::Failed;
    entry.reason = Some(last);
    None
}

/// The addresses of the request's host: itself when it is an address,
/// else what the run's resolver says (within its bounds, [`resolve`]).
async fn addresses(
    run: &RunProxy,
    pattern: Option<&HostPattern>,
    host: &str,
) -> Result<Vec<IpAddr>, String> {
    if let Some(HostPattern::Ip(ip)) = pattern {
        return Ok(vec![*ip]);
    }
    run.resolver.resolve(host).await.map_err(|e| e.to_string())
}

/// Relays a tunnel (after its 200) or a plain request (its rewritten head
/// first), both ways, until both sides are done, it is idle for
/// [`IDLE_TIMEOUT`], or `cancel`.
async fn relay(
    client: &mut TcpStream,
    mut upstream: TcpStream,
    parsed: &Parsed,
    rest: &[u8],
    entry: &mut Entry,
    cancel: &mut Cancel,
) {
    let _ = upstream.set_nodelay(true);
    keepalive(&upstream);
    let mut up = 0u64;
    let start = async {
        if matches!(parsed.target, Target::Tunnel { .. }) {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
        } else {
            upstream.write_all(&parsed.upstream_head).await?;
            up += parsed.upstream_head.len() as u64;
        }
        upstream.write_all(rest).await?;
        up += rest.len() as u64;
        Ok::<_, std::io::Error>(())
    };
    if let Err(e) = start.await {
        entry.reason = Some(format!("relay: {e}"));
        entry.bytes_up = up;
        return;
    }
    let (a, b, why) = pump(client, &mut upstream, IDLE_TIMEOUT, cancel).await;
    entry.bytes_up = up + a;
    entry.bytes_down = b;
    entry.reason = why;
}

/// Copies `a` to `b` and `b` to `a`, each side's end of file passed on as
/// a half close, until both are done, a side fails, nothing moves for
/// `idle`, or `cancel`. Returns the bytes each way and why it ended early.
async fn pump(
    a: &mut TcpStream,
    b: &mut TcpStream,
    idle: Duration,
    cancel: &mut Cancel,
) -> (u64, u64, Option<String>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let both = async {
        tokio::try_join!(
            copy_half(&mut ar, &mut bw, &up, &last, start),
            copy_half(&mut br, &mut aw, &down, &last, start),
        )
    };
    let watchdog = async {
        loop {
            let quiet = start
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    };
    let why = tokio::select! {
        r = both => r.err().map(|e| format!("relay ended: {e}")),
        _ = watchdog => Some(format!("idle for {} s", idle.as_secs_f32())),
        _ = cancelled(cancel) => Some(RUN_ENDED.to_owned()),
    };
    (up.into_inner(), down.into_inner(), why)
}

/// One direction of [`pump`]: counts the bytes and notes when the last
/// ones moved (in ms since `start`).
async fn copy_half(
    r: &mut tokio::net::tcp::ReadHalf<'_>,
    w: &mut tokio::net::tcp::WriteHalf<'_>,
    count: &std::sync::atomic::AtomicU64,
    last: &std::sync::atomic::AtomicU64,
    start: Instant,
) -> std::io::Result<()> {
    use std::sync::atomic::Ordering;
    let mut buf = vec![0u8; RELAY_BUF];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return w.shutdown().await;
        }
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        w.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn targets_of_connect_and_plain_requests() {
        assert_eq!(
            target("CONNECT", "api.example.com:443").unwrap(),
            Target::Tunnel {
                host: "api.example.com".into(),
                port: 443
            }
        );
        assert!(target("CONNECT", "api.example.com").is_err());
        assert_eq!(
            target("GET", "http://a.com:8080/x?y=1").unwrap(),
            Target::Forward {
                host: "a.com".into(),
                port: 8080,
                authority: "a.com:8080".into(),
                path: "/x?y=1".into()
            }
        );
        assert_eq!(
            target("GET", "http://a.com").unwrap().host_port(),
            ("a.com", 80)
        );
        assert!(target("GET", "/relative").is_err());
        assert!(target("GET", "https://a.com/").is_err());
        let long = "a".repeat(254);
        assert!(target("CONNECT", &format!("{long}:443")).is_err());
        assert!(target("GET", &format!("http://{long}/")).is_err());
        assert!(target("CONNECT", &format!("{}:443", &long[1..])).is_ok());
        for bad in [
            "a.com:83616",
            "a.com:+18080",
            "a.com:018080",
            "a.com:0",
            "a.com:",
        ] {
            assert!(target("CONNECT", bad).is_err(), "{bad}");
            assert!(target("GET", &format!("http://{bad}/")).is_err(), "{bad}");
        }
        assert!(target("CONNECT", "u:p@a.com:443").is_err());
        assert_eq!(
            target("GET", "http://user:pw@a.com:8080/x").unwrap(),
            Target::Forward {
                host: "a.com".into(),
                port: 8080,
                authority: "a.com:8080".into(),
                path: "/x".into()
            }
        );
        assert_eq!(
            target("CONNECT", "[::1]:443").unwrap().host_port(),
            ("[::1]", 443)
        );
    }

    #[test]
    fn a_plain_request_is_rewritten_without_hop_headers() {
        let head = b"GET http://a.com:8080/p HTTP/1.1\r\nHost: evil.com\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n";
        let p = parse_head(head).unwrap();
        let text = String::from_utf8(p.upstream_head).unwrap();
        assert_eq!(
            text,
            "GET /p HTTP/1.1\r\nHost: a.com:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
    }

    fn run(allow: &[&str], table: Vec<(String, Vec<IpAddr>)>) -> RunProxy {
        let dir = std::env::temp_dir().join(format!("egress-test-{}", std::process::id()));
        let mut r = RunProxy::new(
            "r".into(),
            allow
                .iter()
                .map(|e| network::parse_entry(e).unwrap())
                .collect(),
            dir.join("egress.log"),
            1 << 20,
        );
        r.resolver = crate::egress::resolve::Resolver::fixed(table, 16);
        r
    }

    #[tokio::test]
    async fn a_listed_name_resolving_to_metadata_or_loopback_is_refused() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let r = run(
            &["meta.test:80", "rebind.test:80", "mixed.test:80"],
            vec![
                ("meta.test".into(), vec![ip("169.254.169.254")]),
                ("rebind.test".into(), vec![ip("127.0.0.1")]),
                (
                    "mixed.test".into(),
                    vec![ip("10.0.0.1"), ip("169.254.169.254")],
                ),
            ],
        );
        for (host, why) in [
            ("meta.test", "metadata"),
            ("rebind.test", "loopback or private"),
            ("mixed.test", "loopback or private"),
        ] {
            let mut e = Entry::refused_now();
            assert!(connect(&r, host, 80, &mut e).await.is_none());
            assert_eq!(e.verdict, Verdict::Refused, "{host}");
            assert!(e.reason.as_deref().unwrap().contains(why), "{host}: {e:?}");
            assert!(e.address.is_some());
        }
        let mut e = Entry::refused_now();
        assert!(connect(&r, "other.test", 80, &mut e).await.is_none());
        assert_eq!(e.reason.as_deref(), Some("not on the run's list"));
        let mut e = Entry::refused_now();
        assert!(connect(&r, "meta.test", 81, &mut e).await.is_none());
        assert_eq!(e.reason.as_deref(), Some("not on the run's list"));
    }

    /// Two connected TCP sockets on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (a, l.accept().await.unwrap().0)
    }

    #[tokio::test]
    async fn a_relay_ends_when_idle_and_when_cancelled() {
        // The client leaves; the destination stays silent and open.
        let (mut client, run_end) = pair().await;
        let (mut upstream, _far) = pair().await;
        drop(run_end);
        let (_keep, mut cancel) = tokio::sync::watch::channel(false);
        let idle = Duration::from_millis(300);
        let t = Instant::now();
        let (_, _, why) = pump(&mut client, &mut upstream, idle, &mut cancel).await;
        assert!(why.unwrap().starts_with("idle"), "{:?}", t.elapsed());
        assert!(t.elapsed() < Duration::from_secs(5));

        let (mut client, mut run_end) = pair().await;
        let (mut upstream, mut far) = pair().await;
        let (stop, mut cancel) = tokio::sync::watch::channel(false);
        let relay = tokio::spawn(async move {
            pump(&mut client, &mut upstream, IDLE_TIMEOUT, &mut cancel).await
        });
        run_end.write_all(b"abc").await.unwrap();
        let mut got = [0u8; 3];
        far.read_exact(&mut got).await.unwrap();
        stop.send(true).unwrap();
        let (up, down, why) = relay.await.unwrap();
        assert_eq!((up, down), (3, 0));
        assert_eq!(why.as_deref(), Some(RUN_ENDED));
    }

    #[tokio::test]
    async fn a_literal_loopback_entry_connects() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let entry = format!("127.0.0.1:{port}");
        let r = run(&[&entry], Vec::new());
        let mut e = Entry::refused_now();
        assert!(connect(&r, "127.0.0.1", port, &mut e).await.is_some());
        assert_eq!(e.address.as_deref(), Some("127.0.0.1"));
        let mut e = Entry::refused_now();
        assert!(connect(&r, "localhost", port, &mut e).await.is_none());
    }
}
