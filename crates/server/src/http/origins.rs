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
    /// Parses `ALLOWED_ORIGINS`: `*` or a comma-separated list.
    pub fn parse(s: &str) -> Self {
        if s.trim() == "*" {
            AllowedOrigins::Any
        } else {
            AllowedOrigins::List(
                s.split(',')
                    .map(|o| o.trim().to_owned())
                    .filter(|o| !o.is_empty())
                    .collect(),
            )
        }
    }

    /// Whether a request with this `Origin` (or none) may go on. Without
    /// `Any`, a missing origin is not allowed: callers that serve
    /// non-browser clients check for `None` first.
    pub fn allows(&self, origin: Option<&str>) -> bool {
        match self {
            AllowedOrigins::Any => true,
            AllowedOrigins::List(l) => origin.is_some_and(|o| l.iter().any(|a| a == o)),
        }
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
    fn origins_parse_and_match_exactly() {
        let o = AllowedOrigins::parse(" https://a.org , ,https://b.org");
        assert_eq!(
            o,
            AllowedOrigins::List(vec!["https://a.org".into(), "https://b.org".into()])
        );
        assert!(o.allows(Some("https://b.org")));
        assert!(!o.allows(Some("https://b.org/")));
        assert!(!o.allows(None));
        assert!(AllowedOrigins::parse("*").allows(None));
    }
}
