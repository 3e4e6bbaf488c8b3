//! One request of a driver's agent: refused, or forwarded to the
//! configured endpoint (TLS for https) with the daemon's key, its answer
//! streamed back frame by frame as it comes (SSE), counted, and logged
//! once it has ended.

use super::log::Line;
use super::rewrite;
use super::RunGateway;
use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A body's error, whichever side it came from.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What the agent gets back.
pub type AgentBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;
/// What goes upstream: the agent's body, bounded.
pub type UpBody = Limited<Counted<Incoming>>;
/// The client of one run's gateway.
pub type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    UpBody,
>;

/// The largest request body forwarded.
pub const MAX_REQUEST_BODY: usize = 32 << 20;
/// The longest wait for the endpoint to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest wait for the endpoint's answer to begin.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest a body may stay silent (either way) before it is cut.
pub const BODY_IDLE: Duration = Duration::from_secs(300);
/// Idle upstream connections kept per run.
const POOL_IDLE: usize = 4;

/// The gateway's client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// rustls refused the ring provider's settings.
    #[error("TLS for the model gateway: {0}")]
    Tls(#[from] rustls::Error),
}

/// The roots an endpoint's certificate may chain to: the Web PKI's, and
/// the host's own store (the daemon's `SSL_CERT_FILE`/`SSL_CERT_DIR`, else
/// the system's), for an operator's private CA or TLS-inspecting proxy.
fn roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let native = rustls_native_certs::load_native_certs();
    if let Some(e) = native.errors.first() {
        tracing::debug!("model gateway: the host's certificate store: {e}");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!("model gateway: {added} roots of the host's store ({ignored} unparsable)");
    roots
}

/// The TLS settings, made once (reading the host's store) and shared.
fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    static TLS: std::sync::OnceLock<Result<rustls::ClientConfig, rustls::Error>> =
        std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots())
            .with_no_client_auth())
    })
    .clone()
}

/// A client for the configured endpoint: TLS by rustls (ring; the Web PKI
/// and the host's roots) when it is https, plain HTTP/1.1 otherwise.
pub fn client() -> Result<Client, ClientError> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config()?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .pool_max_idle_per_host(POOL_IDLE)
            .pool_idle_timeout(Duration::from_secs(60))
            .build(https),
    )
}

/// A body passed through, its bytes counted into `count`, cut after
/// [`BODY_IDLE`] without a frame; on drop, `done` (the log line) is
/// written.
pub struct Counted<B> {
    inner: B,
    count: Arc<AtomicU64>,
    idle: Pin<Box<tokio::time::Sleep>>,
    done: Option<Done>,
}

/// The line a response body writes when it ends.
pub struct Done {
    run: Arc<RunGateway>,
    line: Line,
    started: Instant,
    up: Arc<AtomicU64>,
}

impl<B> Counted<B> {
    fn new(inner: B, count: Arc<AtomicU64>, done: Option<Done>) -> Counted<B> {
        Counted {
            inner,
            count,
            idle: Box::pin(tokio::time::sleep(BODY_IDLE)),
            done,
        }
    }
}

/// The body fell silent for longer than [`BODY_IDLE`].
#[derive(Debug, thiserror::Error)]
#[error("no data for {0:?}: the gateway cut the body")]
pub struct Idle(Duration);

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    this.count.fetch_add(d.len() as u64, Ordering::Relaxed);
                }
                let next = tokio::time::Instant::now() + BODY_IDLE;
                this.idle.as_mut().reset(next);
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(Idle(BODY_IDLE))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        if let Some(mut d) = self.done.take() {
            d.line.bytes_down = self.count.load(Ordering::Relaxed);
            d.line.bytes_up = d.up.load(Ordering::Relaxed);
            d.run.log_line(d.line, d.started);
        }
    }
}

/// The gateway's own answer: `status`, and `why` as text.
fn answer(status: http::StatusCode, why: &str) -> http::Response<AgentBody> {
    let body = Full::new(Bytes::from(format!("subagentd gateway: {why}\n")))
        .map_err(|never| match never {})
        .boxed();
    let mut r = http::Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Serves one request of the run's agent.
pub async fn handle(
    run: Arc<RunGateway>,
    req: http::Request<Incoming>,
) -> http::Response<AgentBody> {
    let started = Instant::now();
    let mut line = Line::new(req.method().as_str(), &req.uri().to_string());
    let (parts, body) = req.into_parts();
    let key = run.key.as_deref();
    let head = rewrite::upstream_request(
        &parts.method,
        &parts.uri,
        &parts.headers,
        &run.upstream,
        key,
    );
    let (uri, headers) = match head {
        Ok(h) => h,
        Err(why) => {
            let status = match why {
                rewrite::Refusal::BadKey | rewrite::Refusal::BadUri => {
                    http::StatusCode::BAD_GATEWAY
                }
                _ => http::StatusCode::FORBIDDEN,
            };
            line.status = status.as_u16();
            line.reason = Some(why.to_string());
            run.log_line(line, started);
            return answer(status, &why.to_string());
        }
    };
    line.upstream = run.upstream.authority();
    let up = Arc::new(AtomicU64::new(0));
    let mut out = http::Request::new(Limited::new(
        Counted::new(body, up.clone(), None),
        MAX_REQUEST_BODY,
    ));
    *out.method_mut() = parts.method;
    *out.uri_mut() = uri;
    *out.headers_mut() = headers;
    let failed = |mut line: Line, status: http::StatusCode, why: String| {
        line.status = status.as_u16();
        line.bytes_up = up.load(Ordering::Relaxed);
        line.reason = Some(why.clone());
        run.log_line(line, started);
        answer(status, &why)
    };
    match tokio::time::timeout(RESPONSE_TIMEOUT, run.client.request(out)).await {
        Ok(Ok(resp)) => {
            let (mut p, b) = resp.into_parts();
            rewrite::response_headers(&mut p.headers);
            line.status = p.status.as_u16();
            let done = Done {
                run: run.clone(),
                line,
                started,
                up,
            };
            let body = Counted::new(b, Arc::new(AtomicU64::new(0)), Some(done)).boxed();
            http::Response::from_parts(p, body)
        }
        Ok(Err(e)) => failed(
            line,
            http::StatusCode::BAD_GATEWAY,
            format!("the endpoint could not be reached: {}", error_chain(&e)),
        ),
        Err(_) => failed(
            line,
            http::StatusCode::GATEWAY_TIMEOUT,
            format!("the endpoint did not answer within {RESPONSE_TIMEOUT:?}"),
        ),
    }
}

/// An error and its sources, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}
