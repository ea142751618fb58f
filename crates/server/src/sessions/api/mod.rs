//! The HTTP API of hosted sessions, under `/memizy/sessions`:
//!
//! | method and path | what |
//! | --- | --- |
//! | `POST /` | a session from a bundle (plugin HTML + set) and settings |
//! | `GET /{id}` | phase, players, settings, clock, result |
//! | `POST /{id}/players` | a player joins (lobby, or late join) |
//! | `DELETE /{id}/players/{player}` | kick |
//! | `PATCH /{id}/players/{player}` | rename (`{"name"}`: `playersChanged`) |
//! | `PUT /{id}/config` | locale and theme (`{"locale","theme"}`: `configChanged`) |
//! | `POST /{id}/start`, `/pause`, `/resume` | the host's buttons |
//! | `POST /{id}/save` | save the game (answered once durable) |
//! | `POST /{id}/end` | the host ends the session (`sessionEnded('closed')`) |
//! | `GET /{id}/recording` | what a replay needs (SPEC 10), one bounded JSON document |
//! | `POST /{id}/continue` | continue the saved game (after a restart too) |
//!
//! `POST /` needs the operator credential (`HOSTWIRE_OPERATOR_TOKEN`),
//! everything else `Authorization: Bearer <hostToken>`. The
//! creation answers the host token and a token per player (and adding a
//! player that player's): devices attach with them.

mod create;
mod host;
mod players;
mod spec;

pub(super) use create::{player_spec, player_tokens};
pub use create::{prepare_creation, Prepared};
pub(super) use spec::{config, saved_game};
pub use spec::{CreateSession, PlayerIn, SetSpec, TimingIn, MAX_LOCALE_BYTES};

use create::create;
use host::{continue_saved, end, pause, recording, resume, save, set_config, start, status};
use players::{add_player, kick, rename};

use crate::http::error::json_response;
use crate::http::origins::{preflight_no_content, require_allowed_or_same_origin};
use crate::sessions::{Sessions, MAX_BUNDLE_BYTES};
use axum::extract::DefaultBodyLimit;
use axum::http::{header, Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::Response;
use axum::routing::{delete, get, post, put};
use axum::Router;
use serde_json::json;
use std::sync::Arc;

pub fn router(sessions: Arc<Sessions>) -> Router {
    // A lobby page on another allowed origin drives a session from the
    // browser: CORS for the origins the operator allows, 403 for others.
    let origins = Arc::new(sessions.config.allowed_origins.clone());
    let cors = origins
        .cors_layer()
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .max_age(std::time::Duration::from_secs(600));
    Router::new()
        .route("/", post(create))
        .route("/{id}", get(status))
        .route("/{id}/players", post(add_player))
        .route("/{id}/players/{player}", delete(kick).patch(rename))
        .route("/{id}/config", put(set_config))
        .route("/{id}/start", post(start))
        .route("/{id}/pause", post(pause))
        .route("/{id}/resume", post(resume))
        .route("/{id}/save", post(save))
        .route("/{id}/end", post(end))
        .route("/{id}/recording", get(recording))
        .route("/{id}/continue", post(continue_saved))
        .route_layer(from_fn_with_state(origins, require_allowed_or_same_origin))
        .layer(DefaultBodyLimit::max(MAX_BUNDLE_BYTES))
        .with_state(sessions)
        .layer(cors)
        .layer(from_fn(preflight_no_content))
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json_response(status, &json!({"error": message.into()}))
}
