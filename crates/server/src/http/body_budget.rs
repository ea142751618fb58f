//! One budget of request-body bytes for the whole server, across every
//! protocol's HTTP API: each protocol bounds its own bodies and how many it
//! reads at once, and this bounds them together, so that uploads to
//! several APIs at once cannot add up to more memory than the operator
//! gave. A request is charged its `Content-Length` (a chunked one the
//! largest body any route takes) from its headers until its answer.

use super::json_response;
use super::Gate;
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, RETRY_AFTER, TRANSFER_ENCODING};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum::Extension;
use serde_json::json;
use std::sync::Arc;

/// Bytes of request bodies the server reads and handles at once, by
/// default (`REQUEST_BODY_BUDGET_BYTES`).
pub const REQUEST_BODY_BUDGET_BYTES: usize = 64 * 1024 * 1024;
/// The largest body any route takes (a relay bundle, a hosted session's
/// creation): what a body without `Content-Length` is charged, and the
/// smallest budget that lets every route work.
pub const LARGEST_REQUEST_BODY: usize = 8 * 1024 * 1024;

/// What a request with these headers is charged (at most
/// [`LARGEST_REQUEST_BODY`]).
pub fn charge_of(headers: &axum::http::HeaderMap) -> usize {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        // Over the largest body, its route refuses it (413) unread.
        Some(n) => usize::try_from(n)
            .unwrap_or(usize::MAX)
            .min(LARGEST_REQUEST_BODY),
        None if headers.contains_key(TRANSFER_ENCODING) => LARGEST_REQUEST_BODY,
        None => 0,
    }
}

/// Holds the request's charge of the server-wide budget until it is
/// answered; refuses it at once (503, `Retry-After: 1`) when the budget is
/// spent. The answer carries both the relay's `error` and the
/// `code`/`message` of ggui and PlayerThree, so every client reads it.
pub async fn body_budget(
    Extension(gate): Extension<Arc<Gate>>,
    req: Request,
    next: Next,
) -> Response {
    let n = charge_of(req.headers());
    if n == 0 {
        return next.run(req).await;
    }
    // `n` is at most LARGEST_REQUEST_BODY, which fits in u32.
    let Ok(_held) = Arc::clone(gate.bodies()).try_acquire_many_owned(n as u32) else {
        let message = format!(
            "request body: {} bytes of request bodies are being read over the server (REQUEST_BODY_BUDGET_BYTES); try again",
            gate.body_budget_bytes()
        );
        let mut r = json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"code": "RATE_LIMITED", "message": message, "error": message}),
        );
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    };
    next.run(req).await
}
