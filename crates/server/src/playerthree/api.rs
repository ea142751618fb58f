//! The operator's HTTP API under `/playerthree`:
//!
//! - `POST /matches` (the server's operator credential as `Authorization:
//!   Bearer`, `HOSTWIRE_OPERATOR_TOKEN`) creates a match of the example
//!   game; the answer holds its id and its operator token (durable before
//!   it is answered);
//! - `POST /matches/{id}/tokens` (operator token as `Authorization:
//!   Bearer`) mints a token for a principal given without its match, e.g.
//!   `{"kind":"team","team":"red"}`; durable before it is answered;
//! - `POST /matches/{id}/revoke` (operator) with `{"token":"…"}` revokes a
//!   token and closes its connections;
//! - `PUT /matches/{id}/seats/{role}/card` (operator) with `{"id","name"}`
//!   sets the seat's public card (`playerthree:cards`, and the
//!   `agentCards` of observer keyframes while an agent plays the seat);
//!   `DELETE` clears it; both answered once durable.

use super::actor::{MatchCmd, MatchHandle};
use super::{Find, PlayerThree, GAME};
use crate::http::error::{method_not_allowed, not_found};
use crate::http::origins::{preflight_no_content, require_allowed_origin};
use crate::http::{json_response, ApiError, Presented, Refused};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::Router;
use hostwire_playerthree::protocol::{token_shape_ok, EntrantCard, ServerErrorCode};
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::Principal;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::oneshot;

/// The largest request body the API reads (a principal or a token).
pub const MAX_API_BODY_BYTES: usize = 4096;

const NO_OPERATOR: ApiError = ApiError::new(
    StatusCode::UNAUTHORIZED,
    "Authorization: Bearer <the match's operator token> required",
);
const MATCH_NOT_FOUND: ApiError = ApiError::new(StatusCode::NOT_FOUND, "Match not found");
const MATCH_ELSEWHERE: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "The match is served by another node; try again",
);
const MATCH_UNREADABLE: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "store: the match could not be read; try again",
);
const UNAVAILABLE: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "No match created: the server holds MAX_MATCHES or the store refused it",
);

pub fn router(p3: Arc<PlayerThree>) -> Router {
    let cors = p3
        .origins
        .cors_layer()
        .allow_methods([Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]);
    Router::new()
        .route("/matches", post(create).fallback(method_not_allowed))
        .route(
            "/matches/{id}/tokens",
            post(mint).fallback(method_not_allowed),
        )
        .route(
            "/matches/{id}/revoke",
            post(revoke).fallback(method_not_allowed),
        )
        .route(
            "/matches/{id}/seats/{role}/card",
            put(set_card)
                .delete(clear_card)
                .fallback(method_not_allowed),
        )
        .route_layer(from_fn_with_state(
            Arc::clone(&p3.origins),
            require_allowed_origin,
        ))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_API_BODY_BYTES))
        .with_state(p3)
        .layer(cors)
        .layer(from_fn(preflight_no_content))
}

fn bad_request(message: impl std::fmt::Display) -> Response {
    json_response(
        StatusCode::BAD_REQUEST,
        &json!({ "error": message.to_string() }),
    )
}

async fn create(State(p3): State<Arc<PlayerThree>>, presented: Presented) -> Response {
    if let Err(refused) = presented.operator() {
        return refused.response("operator credential");
    }
    let gate = &presented.gate;
    if let Err(refused) = gate.matches.admit(&presented.ip, gate.now_ms()) {
        return refused.into_response();
    }
    match p3.create_match().await {
        Some((h, operator_token)) => json_response(
            StatusCode::CREATED,
            &json!({
                "match": &*h.id,
                "game": GAME,
                "operatorToken": operator_token.as_str(),
                "teams": hostwire_playerthree::demo::TEAMS,
            }),
        ),
        None => UNAVAILABLE.into_response(),
    }
}

/// The match, if the request carries its operator token.
// The refusal is answered at once: its size does not matter.
#[allow(clippy::result_large_err)]
async fn operated(
    p3: &PlayerThree,
    id: &str,
    presented: &Presented,
) -> Result<MatchHandle, Response> {
    let h = match p3.find(id).await {
        Find::Here(h) => h,
        Find::NotFound => return Err(MATCH_NOT_FOUND.into_response()),
        Find::Elsewhere(_) => return Err(MATCH_ELSEWHERE.into_response()),
        Find::Unavailable => return Err(MATCH_UNREADABLE.into_response()),
    };
    // Only the hash is kept; it is compared in constant time.
    presented
        .check(|given| {
            (token_shape_ok(given) && TokenHash::of(given).matches(&h.operator_token)).then_some(())
        })
        .map_err(|r| match r {
            Refused::Throttled(_) => r.response("operator token"),
            _ => NO_OPERATOR.into_response(),
        })?;
    Ok(h)
}

async fn mint(
    State(p3): State<Arc<PlayerThree>>,
    Path(id): Path<String>,
    presented: Presented,
    body: Bytes,
) -> Response {
    let h = match operated(&p3, &id, &presented).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    let mut v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("body: not JSON: {e}")),
    };
    let Some(obj) = v.as_object_mut() else {
        return bad_request("body: expected a principal object");
    };
    if obj.contains_key("match") {
        return bad_request("match: given by the path, not the body");
    }
    obj.insert("match".into(), Value::String(id.clone()));
    let principal: Principal = match serde_json::from_value(v) {
        Ok(p) => p,
        Err(e) => return bad_request(format!("principal: {e}")),
    };
    let (reply, answer) = oneshot::channel();
    if h.tx
        .send(MatchCmd::Mint { principal, reply })
        .await
        .is_err()
    {
        return MATCH_NOT_FOUND.into_response();
    }
    match answer.await {
        Ok(Ok(token)) => json_response(StatusCode::CREATED, &json!({ "token": token })),
        Ok(Err(e)) => {
            let status = match e.code {
                ServerErrorCode::Busy => StatusCode::SERVICE_UNAVAILABLE,
                ServerErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::BAD_REQUEST,
            };
            json_response(
                status,
                &json!({ "error": e.message, "code": e.code.as_str() }),
            )
        }
        Err(_) => MATCH_NOT_FOUND.into_response(),
    }
}

async fn revoke(
    State(p3): State<Arc<PlayerThree>>,
    Path(id): Path<String>,
    presented: Presented,
    body: Bytes,
) -> Response {
    let h = match operated(&p3, &id, &presented).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Revoke {
        token: String,
    }
    let token = match serde_json::from_slice::<Revoke>(&body) {
        Ok(r) => r.token,
        Err(e) => return bad_request(format!("body: expected {{\"token\":…}}: {e}")),
    };
    let hash = TokenHash::of(&token);
    let (reply, answer) = oneshot::channel();
    if h.tx.send(MatchCmd::Revoke { token, reply }).await.is_err() {
        return MATCH_NOT_FOUND.into_response();
    }
    match answer.await {
        Ok(true) => {
            // Its MCP sessions end now, not at their next request.
            if let Some(mcp) = p3.mcp.get() {
                mcp.end_token(hash).await;
            }
            json_response(StatusCode::OK, &json!({ "revoked": true }))
        }
        Ok(false) => json_response(
            StatusCode::NOT_FOUND,
            &json!({ "error": "token: not a token of this match" }),
        ),
        Err(_) => MATCH_NOT_FOUND.into_response(),
    }
}

/// The longest card `id` and `name`, in bytes: a card is shown to every
/// spectator and observer of the match.
pub const MAX_CARD_FIELD_BYTES: usize = 128;

async fn set_card(
    State(p3): State<Arc<PlayerThree>>,
    Path((id, role)): Path<(String, String)>,
    presented: Presented,
    body: Bytes,
) -> Response {
    let h = match operated(&p3, &id, &presented).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    let card = match serde_json::from_slice::<EntrantCard>(&body) {
        Ok(c) => c,
        Err(e) => return bad_request(format!("body: expected {{\"id\":…,\"name\":…}}: {e}")),
    };
    for (field, v) in [("id", &card.id), ("name", &card.name)] {
        if v.trim().is_empty() || v.len() > MAX_CARD_FIELD_BYTES {
            return bad_request(format!(
                "{field}: 1 to {MAX_CARD_FIELD_BYTES} bytes, not blank ({} given)",
                v.len()
            ));
        }
    }
    card_change(h, role, Some(card)).await
}

async fn clear_card(
    State(p3): State<Arc<PlayerThree>>,
    Path((id, role)): Path<(String, String)>,
    presented: Presented,
) -> Response {
    let h = match operated(&p3, &id, &presented).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    card_change(h, role, None).await
}

async fn card_change(h: MatchHandle, role: String, card: Option<EntrantCard>) -> Response {
    let (reply, answer) = oneshot::channel();
    let cmd = MatchCmd::SetCard {
        role: role.clone(),
        card: card.clone(),
        reply,
    };
    if h.tx.send(cmd).await.is_err() {
        return MATCH_NOT_FOUND.into_response();
    }
    match answer.await {
        Ok(Ok(())) => json_response(StatusCode::OK, &json!({ "role": role, "card": card })),
        Ok(Err(e)) => {
            let status = match e.code {
                ServerErrorCode::NotInMatch => StatusCode::NOT_FOUND,
                ServerErrorCode::Internal => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::BAD_REQUEST,
            };
            json_response(
                status,
                &json!({ "error": e.message, "code": e.code.as_str() }),
            )
        }
        Err(_) => MATCH_NOT_FOUND.into_response(),
    }
}
