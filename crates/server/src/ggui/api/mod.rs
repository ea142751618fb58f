//! The agent side's HTTP API under `/ggui/sessions`: create a session,
//! emit a stream envelope, push props, consume and drain actions, read a
//! session, override the advertised version. Every answer is JSON; errors
//! are `{code, message}` with the protocol's code.

mod actions;
mod body;
mod emit;
mod gate;
mod sessions;
mod ui_tokens;

pub use body::decode_body;
pub use gate::AgentApp;
pub use ui_tokens::{UiTokens, MAX_UI_TOKENS_PER_SESSION};

use actions::{consume_actions, drain_actions};
use emit::{emit, push_props};
use gate::{body_budget, require_app, BodyBudget};
use sessions::{create_session, read_session, set_version};
use ui_tokens::mint_ui_token;

use super::Ggui;
use crate::http::json_response;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;
use hostwire_ggui::channel::ApiError;
use hostwire_ggui::codes;
use hostwire_ggui::decode::MAX_FRAME_BYTES;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The largest request body: one frame's payload and its wrapper.
pub const API_BODY_LIMIT: usize = 2 * MAX_FRAME_BYTES;
/// Bytes of request bodies the agent API reads and parses at once (each
/// request is charged its `Content-Length`, or [`API_BODY_LIMIT`] when it
/// has none), so that many concurrent bodies cannot multiply into
/// gigabytes of parsed JSON; past it: 503 `RATE_LIMITED`.
pub const API_BODY_BUDGET_BYTES: usize = 8 * API_BODY_LIMIT;
/// Actions returned by one consume when `max` is not given.
pub const DEFAULT_CONSUME_MAX: usize = 100;
/// The most actions one consume returns.
pub const MAX_CONSUME: usize = 1024;

pub fn router(ggui: Arc<Ggui>) -> Router {
    Router::new()
        .route("/{id}", put(create_session).get(read_session))
        .route("/{id}/emit", post(emit))
        .route("/{id}/props", post(push_props))
        .route("/{id}/actions", get(consume_actions))
        .route("/{id}/actions/drain", post(drain_actions))
        .route("/{id}/version", put(set_version))
        .route("/{id}/ui-tokens", post(mint_ui_token))
        .layer(DefaultBodyLimit::max(API_BODY_LIMIT))
        // Inside the credential check: nobody unknown reads the store or
        // leases a session.
        .route_layer(from_fn_with_state(
            Arc::clone(&ggui),
            super::leased::find_session,
        ))
        .route_layer(from_fn_with_state(
            Arc::new(BodyBudget {
                permits: Semaphore::new(API_BODY_BUDGET_BYTES),
                metrics: Arc::clone(&ggui.metrics),
            }),
            body_budget,
        ))
        .route_layer(from_fn_with_state(Arc::clone(&ggui), require_app))
        .with_state(ggui)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    json_response(status, &json!({ "code": code, "message": message.into() }))
}

fn api_error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    error(status, e.code(), e.to_string())
}

fn gone() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "SHUTTING_DOWN",
        "the server is shutting down",
    )
}

/// 503 `APPEND_FAILED`: `what` could not be stored, and is not
/// acknowledged; the agent tries again.
fn not_stored(what: &str) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::APPEND_FAILED,
        format!("{what} could not be stored; try again"),
    )
}

/// 503 `UNAVAILABLE`: the session cannot be served here now (another
/// node serves it, or the store could not say); the agent tries again.
pub(super) fn unavailable(message: &str) -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message)
}

fn invalid(message: String) -> Response {
    error(StatusCode::BAD_REQUEST, codes::INVALID_MESSAGE, message)
}
