//! Which browser origins may call: `ALLOWED_ORIGINS`, CORS headers from
//! `tower-http`'s `CorsLayer`, and the two rules of the Memizy reference that
//! `CorsLayer` cannot express, as layers of their own:
//!
//! - a request from an origin that is not allowed gets **403** (`CorsLayer`
//!   only leaves the CORS headers out and serves the request):
//!   [`require_allowed_origin`];
//! - a preflight is answered **204 No Content** (`CorsLayer` answers 200):
//!   [`preflight_no_content`].

use super::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// Which browser origins may use the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedOrigins {
    /// `*`: development only.
    Any,
    List(Vec<String>),
}

impl AllowedOrigins {
    /// Parses `ALLOWED_ORIGINS`: `*` or a comma-separated list, each
    /// entry kept as its [`normalize`]d origin.
    pub fn parse(s: &str) -> Self {
        if s.trim() == "*" {
            AllowedOrigins::Any
        } else {
            AllowedOrigins::List(
                s.split(',')
                    .map(str::trim)
                    .filter(|o| !o.is_empty())
                    .map(normalize)
                    .collect(),
            )
        }
    }

    /// Whether a request with this `Origin` (or none) may go on. Without
    /// `Any`, a missing origin is not allowed: callers that serve
    /// non-browser clients check for `None` first. Both sides are compared
    /// as [`normalize`]d origins, so `https://Play.Example.org:443/`
    /// configured matches the `https://play.example.org` a browser sends.
    pub fn allows(&self, origin: Option<&str>) -> bool {
        let (AllowedOrigins::List(l), Some(o)) = (self, origin) else {
            return matches!(self, AllowedOrigins::Any);
        };
        // Browsers send origins normalized, and `parse` keeps them so:
        // the exact match is the common case and needs no URL parse.
        if l.iter().any(|a| a == o) {
            return true;
        }
        let o = normalize(o);
        l.iter().any(|a| *a == o || normalize(a) == o)
    }

    /// A `CorsLayer` that echoes an allowed origin (also for `*`, as the
    /// reference does) and varies on `Origin`. The protocol adds its
    /// methods and headers.
    pub fn cors_layer(self: &Arc<Self>) -> CorsLayer {
        let allowed = Arc::clone(self);
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(move |o: &HeaderValue, _| {
                allowed.allows(o.to_str().ok())
            }))
            .vary([header::ORIGIN])
    }
}

/// An origin as the URL Standard serializes it: scheme and host in lower
/// case, the scheme's default port left out, no path and so no trailing
/// `/`. What is not a URL with a host (`null`, garbage) is kept as written,
/// so it only ever matches itself.
pub fn normalize(origin: &str) -> String {
    match url::Url::parse(origin) {
        Ok(u) if u.has_host() => u.origin().ascii_serialization(),
        _ => origin.to_owned(),
    }
}

/// Whether the request's `Origin` is this server itself (its host and
/// port are the `Host` the request was sent to): the pages this server
/// serves (the device page) use its API and sockets whatever
/// `ALLOWED_ORIGINS` says. A page of another origin never matches, since
/// the browser sets both headers.
pub fn same_origin(headers: &axum::http::HeaderMap) -> bool {
    let (Some(origin), Some(host)) = (
        headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()),
        headers.get(header::HOST).and_then(|h| h.to_str().ok()),
    ) else {
        return false;
    };
    let Ok(u) = url::Url::parse(origin) else {
        return false;
    };
    let (Some(h), Some(port)) = (u.host_str(), u.port_or_known_default()) else {
        return false;
    };
    let Ok(authority) = host.parse::<axum::http::uri::Authority>() else {
        return false;
    };
    let default = if u.scheme() == "https" { 443 } else { 80 };
    authority.host().eq_ignore_ascii_case(h) && authority.port_u16().unwrap_or(default) == port
}

/// [`require_allowed_origin`], and a request from this server's own pages
/// ([`same_origin`]: the device page) goes on too.
pub async fn require_allowed_or_same_origin(
    State(origins): State<Arc<AllowedOrigins>>,
    req: Request,
    next: Next,
) -> Response {
    let origin = req.headers().get(header::ORIGIN).map(|o| o.to_str().ok());
    match origin {
        Some(o) if !origins.allows(o) && !same_origin(req.headers()) => {
            ApiError::ORIGIN_NOT_ALLOWED.into_response()
        }
        _ => next.run(req).await,
    }
}

/// Refuses a request whose `Origin` is not allowed with 403; a request
/// without `Origin` is not from a browser and is served.
pub async fn require_allowed_origin(
    State(origins): State<Arc<AllowedOrigins>>,
    req: Request,
    next: Next,
) -> Response {
    let origin = req.headers().get(header::ORIGIN).map(|o| o.to_str().ok());
    match origin {
        Some(o) if !origins.allows(o) => ApiError::ORIGIN_NOT_ALLOWED.into_response(),
        _ => next.run(req).await,
    }
}

/// Turns the 200 that `CorsLayer` answers a preflight with into 204. Goes
/// outside the `CorsLayer`.
pub async fn preflight_no_content(req: Request, next: Next) -> Response {
    let preflight = req.method() == Method::OPTIONS;
    let mut r = next.run(req).await;
    if preflight && r.status() == StatusCode::OK {
        *r.status_mut() = StatusCode::NO_CONTENT;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_and_match_as_origins() {
        let o = AllowedOrigins::parse(" https://a.org , ,https://B.org/,HTTP://c.ORG:80");
        assert_eq!(
            o,
            AllowedOrigins::List(vec![
                "https://a.org".into(),
                "https://b.org".into(),
                "http://c.org".into()
            ])
        );
        assert!(o.allows(Some("https://b.org")));
        assert!(o.allows(Some("https://b.org/")));
        assert!(o.allows(Some("https://B.ORG:443")));
        assert!(o.allows(Some("http://c.org")));
        assert!(!o.allows(Some("http://b.org")), "another scheme");
        assert!(!o.allows(Some("https://b.org:8443")), "another port");
        assert!(!o.allows(Some("https://b.org.evil.example")));
        assert!(!o.allows(Some("null")));
        assert!(!o.allows(None));
        assert!(AllowedOrigins::parse("*").allows(None));
        // A list made without `parse` is normalized when compared.
        let raw = AllowedOrigins::List(vec!["https://Play.Example.org/".into()]);
        assert!(raw.allows(Some("https://play.example.org")));
    }

    #[test]
    fn same_origin_is_the_host_the_request_went_to() {
        let h = |origin: &str, host: &str| {
            let mut m = axum::http::HeaderMap::new();
            m.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            m.insert(header::HOST, HeaderValue::from_str(host).unwrap());
            same_origin(&m)
        };
        assert!(h("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(h("http://Play.example.org", "play.example.org"));
        assert!(h("https://play.example.org", "play.example.org:443"));
        assert!(!h("http://127.0.0.1:8081", "127.0.0.1:8080"));
        assert!(!h("http://evil.example", "play.example.org"));
        assert!(!h("null", "play.example.org"));
        assert!(!same_origin(&axum::http::HeaderMap::new()));
    }
}
