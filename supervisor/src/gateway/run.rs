//! One run's gateway: what it knows (endpoint, key, log, its share of
//! connections), its client to the endpoint, and the bodies that count
//! their bytes and write the request's log line when they end. Uses
//! `gateway::log` and the egress budget; `forward` and the serve loop in
//! `gateway` build on it.

use super::log;
use super::log::Line;
use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::Limited;
use hyper::body::Incoming;
use policy::driver::Upstream;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Connections of one run's agent served at once; more are refused.
pub const MAX_CONNECTIONS: usize = 16;

/// Everything the gateway knows of one run.
pub struct RunGateway {
    /// The run (for the daemon's log only).
    pub run_id: String,
    /// Where every request goes.
    pub upstream: Upstream,
    /// The daemon's key; never logged, never in the run's view.
    pub(super) key: Option<String>,
    /// Its gateway.log.
    pub log: log::GatewayLog,
    pub(super) slots: Arc<tokio::sync::Semaphore>,
    pub(super) global: Arc<tokio::sync::Semaphore>,
    pub(super) client: Client,
}

/// What a run's gateway is made of, decided when the run is accepted.
#[derive(Clone)]
pub struct Setup {
    /// The configured endpoint.
    pub upstream: Upstream,
    /// The key from the daemon's environment, if the config names one.
    pub key: Option<String>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of every log line, a debug print's too.
        f.debug_struct("Setup")
            .field("upstream", &self.upstream)
            .field("key", &self.key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl RunGateway {
    /// The gateway of run `run_id`, logging to `log_path` within
    /// `log_cap` bytes.
    pub fn new(
        run_id: String,
        setup: Setup,
        log_path: std::path::PathBuf,
        log_cap: u64,
    ) -> Result<RunGateway, ClientError> {
        Ok(RunGateway {
            run_id,
            upstream: setup.upstream,
            key: setup.key,
            log: log::GatewayLog::new(log_path, log_cap),
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            global: crate::egress::budget::global(),
            client: client()?,
        })
    }

    /// Writes `line`, its duration from `started`.
    pub(super) fn log_line(&self, mut line: Line, started: Instant) {
        line.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Err(e) = self.log.append(&line) {
            tracing::warn!(run_id = %self.run_id, "gateway.log: {e}");
        }
    }
}

/// A body's error, whichever side it came from.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What goes upstream: the agent's body, bounded.
pub type UpBody = Limited<Counted<Incoming>>;
/// The client of one run's gateway.
pub type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    UpBody,
>;

/// The longest wait for the endpoint to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
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
    pub(super) run: Arc<RunGateway>,
    pub(super) line: Line,
    pub(super) started: Instant,
    pub(super) up: Arc<AtomicU64>,
}

impl<B> Counted<B> {
    pub(super) fn new(inner: B, count: Arc<AtomicU64>, done: Option<Done>) -> Counted<B> {
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
