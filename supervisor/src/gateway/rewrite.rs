//! The pure part of the gateway: which of the agent's requests go on,
//! and the head each gets upstream (the configured endpoint, its `Host`,
//! the real key in the vendor's header, whatever auth the agent sent
//! removed) and the head of the answer it gets back.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri};
use policy::driver::{KeyHeader, Upstream};

/// Why the gateway answers a request itself, forwarding nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// CONNECT: the gateway is no proxy.
    #[error("CONNECT is refused: the gateway forwards to its configured endpoint only")]
    Connect,
    /// An absolute-form target names a host of the agent's choosing.
    #[error("an absolute-form request target is refused: the gateway forwards to its configured endpoint only")]
    Absolute,
    /// The path falls outside the endpoint's base path.
    #[error("the path is outside the endpoint's base path {0:?}")]
    Path(String),
    /// The daemon's key cannot be a header value.
    #[error("the driver's key is not a valid HTTP header value")]
    BadKey,
    /// The upstream URI cannot be built.
    #[error("the upstream URI cannot be built from the request's path")]
    BadUri,
}

/// Hop-by-hop headers (RFC 9110 7.6.1), never passed on either way.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The headers that carry a key: the agent's are dropped, ours added.
const AUTH: &[&str] = &["authorization", "x-api-key", "api-key"];

/// `headers` without hop-by-hop headers, including those its
/// `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(*n);
    }
}

/// The `Host` of `up`: the port left out when it is the scheme's.
fn host_of(up: &Upstream) -> String {
    let default = if up.https { 443 } else { 80 };
    match up.port == default {
        true => up.host.clone(),
        false => up.authority(),
    }
}

/// The upstream URI and headers for an agent's request, or why it is
/// refused. `key` is the daemon's (none when the config names none).
pub fn upstream_request(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    up: &Upstream,
    key: Option<&str>,
) -> Result<(Uri, HeaderMap), Refusal> {
    if method == Method::CONNECT {
        return Err(Refusal::Connect);
    }
    if uri.scheme().is_some() || uri.authority().is_some() {
        return Err(Refusal::Absolute);
    }
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    if !up.admits(target) {
        return Err(Refusal::Path(up.base_path.clone()));
    }
    let scheme = if up.https { "https" } else { "http" };
    let upstream: Uri = format!("{scheme}://{}{target}", up.authority())
        .parse()
        .map_err(|_| Refusal::BadUri)?;
    let mut out = headers.clone();
    strip_hop_by_hop(&mut out);
    for n in AUTH {
        out.remove(*n);
    }
    let host = HeaderValue::from_str(&host_of(up)).map_err(|_| Refusal::BadUri)?;
    out.insert(http::header::HOST, host);
    if let Some(k) = key {
        let (name, value) = match up.key_header {
            KeyHeader::XApiKey => (HeaderName::from_static("x-api-key"), k.to_owned()),
            KeyHeader::Bearer => (http::header::AUTHORIZATION, format!("Bearer {k}")),
        };
        let mut v = HeaderValue::from_str(&value).map_err(|_| Refusal::BadKey)?;
        v.set_sensitive(true);
        out.insert(name, v);
    }
    Ok((upstream, out))
}

/// The answer's headers as the agent gets them: hop-by-hop ones removed
/// (the gateway frames the body itself).
pub fn response_headers(headers: &mut HeaderMap) {
    strip_hop_by_hop(headers);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn up(https: bool, port: u16, base: &str, key_header: KeyHeader) -> Upstream {
        Upstream {
            https,
            host: "models.example".into(),
            port,
            base_path: base.into(),
            key_header,
        }
    }

    fn headers(list: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in list {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_agents_auth_is_replaced_by_the_daemons_key() {
        let h = headers(&[
            ("host", "evil.example"),
            ("x-api-key", "subagentd-gateway-placeholder"),
            ("authorization", "Bearer stolen"),
            ("content-type", "application/json"),
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("anthropic-version", "2023-06-01"),
        ]);
        let u = up(true, 443, "", KeyHeader::XApiKey);
        let uri: Uri = "/v1/messages?beta=true".parse().unwrap();
        let (to, out) = upstream_request(&Method::POST, &uri, &h, &u, Some("sk-real")).unwrap();
        assert_eq!(to, "https://models.example:443/v1/messages?beta=true");
        assert_eq!(out["host"], "models.example");
        assert_eq!(out["x-api-key"], "sk-real");
        assert!(out["x-api-key"].is_sensitive());
        assert!(out.get("authorization").is_none());
        assert_eq!(out.get_all("x-api-key").iter().count(), 1);
        for gone in ["connection", "x-secret-hop", "transfer-encoding"] {
            assert!(out.get(gone).is_none(), "{gone}");
        }
        assert_eq!(out["anthropic-version"], "2023-06-01");
        assert_eq!(out["content-type"], "application/json");
    }

    #[test]
    fn openai_gets_a_bearer_and_no_key_means_no_auth_at_all() {
        let h = headers(&[("authorization", "Bearer subagentd-gateway-placeholder")]);
        let u = up(false, 8080, "/v1", KeyHeader::Bearer);
        let uri: Uri = "/v1/responses".parse().unwrap();
        let (to, out) = upstream_request(&Method::POST, &uri, &h, &u, Some("sk-o")).unwrap();
        assert_eq!(to, "http://models.example:8080/v1/responses");
        assert_eq!(out["host"], "models.example:8080");
        assert_eq!(out["authorization"], "Bearer sk-o");
        let (_, out) = upstream_request(&Method::POST, &uri, &h, &u, None).unwrap();
        assert!(out.get("authorization").is_none());
        assert!(matches!(
            upstream_request(&Method::POST, &uri, &h, &u, Some("bad\nkey")),
            Err(Refusal::BadKey)
        ));
    }

    #[test]
    fn the_agent_never_chooses_the_host_or_leaves_the_base_path() {
        let h = HeaderMap::new();
        let u = up(true, 443, "/v1", KeyHeader::Bearer);
        let go = |m: Method, t: &str| {
            let uri: Uri = t.parse().unwrap();
            upstream_request(&m, &uri, &h, &u, Some("k")).map(|(to, _)| to.to_string())
        };
        assert_eq!(
            go(Method::CONNECT, "evil.example:443"),
            Err(Refusal::Connect)
        );
        assert_eq!(
            go(Method::GET, "http://evil.example/v1/x"),
            Err(Refusal::Absolute)
        );
        assert_eq!(go(Method::GET, "/admin"), Err(Refusal::Path("/v1".into())));
        assert_eq!(
            go(Method::GET, "/v1/../admin"),
            Err(Refusal::Path("/v1".into()))
        );
        assert_eq!(
            go(Method::GET, "/v1/models").as_deref(),
            Ok("https://models.example:443/v1/models")
        );
    }

    #[test]
    fn an_answers_hop_by_hop_headers_go() {
        let mut h = headers(&[
            ("content-type", "text/event-stream"),
            ("transfer-encoding", "chunked"),
            ("connection", "close"),
        ]);
        response_headers(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["content-type"], "text/event-stream");
    }
}
