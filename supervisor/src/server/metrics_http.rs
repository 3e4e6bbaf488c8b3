//! The daemon's metrics over HTTP, when asked for (`--metrics-listen`,
//! the config's `metrics_listen`): `GET /metrics` and nothing else, on a
//! loopback address unless the operator names another, with a bound on
//! connections, on a request head's size and on a connection's time. It
//! serves only the counts of [`crate::metrics`]: no run id, session,
//! path or secret.

use crate::engine::Supervisor;
use crate::metrics::Format;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The one path served.
pub const PATH: &str = "/metrics";
/// Connections served at once; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 16;
/// The most a request head may take (hyper's least buffer).
pub const MAX_HEAD_BYTES: usize = 8192;
/// The longest a client may take to send its request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection is kept, whatever it does.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// The metrics listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The address is neither a port nor `HOST:PORT` with an IP address.
    #[error(
        "metrics listen address {given:?}: give a port (served on 127.0.0.1), or HOST:PORT \
         with an IP address or localhost (e.g. 127.0.0.1:9464, [::1]:9464)"
    )]
    Address {
        /// What was given.
        given: String,
    },
    /// The socket could not be bound.
    #[error("binding the metrics listener on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS's error.
        source: std::io::Error,
    },
}

/// Parses `PORT` (loopback: 127.0.0.1) or `HOST:PORT`, the host an IP
/// address (`[v6]` in brackets) or `localhost`. A host other than a
/// loopback one is taken only when written out so.
pub fn parse_listen(given: &str) -> Result<SocketAddr, ListenError> {
    let bad = || ListenError::Address {
        given: given.to_owned(),
    };
    let given = given.trim();
    if !given.is_empty() && given.bytes().all(|b| b.is_ascii_digit()) {
        let port: u16 = given.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = given.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    given.parse().map_err(|_| bad())
}

/// Binds `addr` (the port 0: one the kernel picks).
pub fn bind(addr: SocketAddr) -> Result<TcpListener, ListenError> {
    let bound = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(TcpListener::from_std);
    bound.map_err(|source| ListenError::Bind { addr, source })
}

/// Serves `listener` until the task is dropped.
pub async fn serve(sup: Supervisor, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors, say: let some go before trying again.
                tracing::warn!("metrics listener: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // At the cap: closed unread.
            continue;
        };
        let sup = sup.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc = hyper::service::service_fn(move |req| {
                let sup = sup.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&sup, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            // A connection past its time is dropped, and so closed.
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                tracing::debug!("metrics connection: {e}");
            }
        });
    }
}

/// The answer to one request: the metrics at [`PATH`] for GET and HEAD,
/// 405 for another method there, 404 anywhere else.
fn answer<B>(sup: &Supervisor, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.uri().path() != PATH {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let format = negotiate(req.headers().get(ACCEPT));
    match sup.metrics(format) {
        Ok(text) => {
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            r
        }
        Err(e) => {
            tracing::error!("metrics: {e}");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the metrics could not be encoded\n",
            )
        }
    }
}

/// OpenMetrics when the client accepts it (Prometheus does), else the
/// Prometheus text format.
fn negotiate(accept: Option<&HeaderValue>) -> Format {
    let om = accept
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    if om {
        Format::OpenMetrics
    } else {
        Format::Prometheus
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_port_alone_is_loopback_and_a_host_must_be_an_address() {
        assert_eq!(parse_listen("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(
            parse_listen("localhost:9464").unwrap().to_string(),
            "127.0.0.1:9464"
        );
        assert_eq!(parse_listen("[::1]:9").unwrap().to_string(), "[::1]:9");
        let all = parse_listen("0.0.0.0:9464").unwrap();
        assert!(!all.ip().is_loopback(), "only when written out");
        for bad in [
            "",
            "x",
            "70000",
            "example.com:9464",
            "9464:",
            ":9464",
            "127.0.0.1",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prometheus_gets_openmetrics_and_others_the_text_format() {
        let prom = HeaderValue::from_static(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        );
        assert_eq!(negotiate(Some(&prom)), Format::OpenMetrics);
        assert_eq!(negotiate(None), Format::Prometheus);
        let curl = HeaderValue::from_static("*/*");
        assert_eq!(negotiate(Some(&curl)), Format::Prometheus);
    }
}
