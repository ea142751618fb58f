//! A session's players, as the host changes them: add (late join), rename,
//! kick.

use super::create::player_spec;
use super::error;
use super::host::{admin, authorized};
use super::spec::{plugin_and_set, CreateSession, PlayerIn};
use crate::http::error::json_response;
use crate::http::Presented;
use crate::sessions::actor::Admin;
use crate::sessions::{Sessions, MAX_BUNDLE_BYTES};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use hostwire_core::token::Token;
use hostwire_store::sessions::SessionWrite;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

pub(super) async fn add_player(
    State(sessions): State<Arc<Sessions>>,
    Path(id): Path<String>,
    presented: Presented,
    body: axum::body::Bytes,
) -> Response {
    let stored = match authorized(&sessions, &id, &presented).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    // A session another node serves is answered there: nothing is written
    // here first.
    if let Err((status, m)) = crate::sessions::restore::running(&sessions, &id).await {
        return error(status, m);
    }
    let p: PlayerIn = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    let Ok(spec) = serde_json::from_str::<CreateSession>(&stored.spec) else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the stored session cannot be read",
        );
    };
    let (plugin_id, set_id) = match plugin_and_set(&spec) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ps = match player_spec(&sessions, &p, &plugin_id, &set_id).await {
        Ok(ps) => ps,
        Err((s, m)) => return error(s, m),
    };
    // The token is durable before the player exists; a player id that has
    // one keeps it.
    let fresh = Token::generate();
    let kept = sessions
        .writer()
        .write_durable(
            &id,
            vec![SessionWrite::PlayerToken {
                session_id: id.clone(),
                player_id: p.id.clone(),
                token: fresh.as_str().to_owned(),
            }],
        )
        .await;
    if !kept {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store: the player's token could not be stored; try again",
        );
    }
    let store = sessions.store();
    let sid = id.clone();
    let stored = crate::blocking::spawn(move || store.load_player_tokens(&sid)).await;
    let token = match stored {
        Ok(Ok(all)) => all
            .iter()
            .find(|(pid, _)| *pid == p.id)
            .and_then(|(_, t)| Token::parse(t)),
        Ok(Err(e)) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("store: {}", e.reason()),
            )
        }
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let Some(token) = token else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the player's token cannot be read back",
        );
    };
    let text = token.as_str().to_owned();
    let r = admin(&sessions, &id, Admin::AddPlayer(Box::new(ps), token)).await;
    if r.status() != StatusCode::OK {
        return r;
    }
    // The status, with the new player's token.
    let body = axum::body::to_bytes(r.into_body(), MAX_BUNDLE_BYTES)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let mut v = body.unwrap_or_else(|| json!({}));
    v["playerId"] = json!(p.id);
    v["playerToken"] = json!(text);
    json_response(StatusCode::OK, &v)
}

/// `PATCH /{id}/players/{player}` with `{"name"}`.
pub(super) async fn rename(
    State(sessions): State<Arc<Sessions>>,
    Path((id, player)): Path<(String, String)>,
    presented: Presented,
    body: axum::body::Bytes,
) -> Response {
    if let Err(r) = authorized(&sessions, &id, &presented).await {
        return r;
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rename {
        name: String,
    }
    match serde_json::from_slice::<Rename>(&body) {
        Ok(r) => admin(&sessions, &id, Admin::Rename(player, r.name)).await,
        Err(e) => error(
            StatusCode::BAD_REQUEST,
            format!("body: expected {{\"name\": …}}: {e}"),
        ),
    }
}

pub(super) async fn kick(
    State(sessions): State<Arc<Sessions>>,
    Path((id, player)): Path<(String, String)>,
    presented: Presented,
) -> Response {
    if let Err(r) = authorized(&sessions, &id, &presented).await {
        return r;
    }
    admin(&sessions, &id, Admin::Kick(player)).await
}
