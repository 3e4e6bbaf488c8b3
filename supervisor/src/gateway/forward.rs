//! One request of a driver's agent: refused, or forwarded to the
//! configured endpoint (TLS for https) with the daemon's key, its answer
//! streamed back frame by frame as it comes (SSE), counted, and logged
//! once it has ended.

use super::log::Line;
use super::rewrite;
use super::run::{BoxError, Counted, Done, RunGateway};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the agent gets back.
pub type AgentBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;
/// The largest request body forwarded.
pub const MAX_REQUEST_BODY: usize = 32 << 20;
/// The longest wait for the endpoint's answer to begin.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(600);

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
