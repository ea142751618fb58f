//! What the host's token may do to a session: its status, its buttons
//! (start, pause, resume, save, end), its configuration, its recording,
//! continuing a saved game.

// Handlers return their error `Response` directly.
#![allow(clippy::result_large_err)]

use super::error;
use super::spec::check_locale;
use crate::http::error::json_response;
use crate::http::{Presented, Refused};
use crate::sessions::actor::{Admin, Cmd};
use crate::sessions::Sessions;
use crate::sessions::{recording, restore};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use hostwire_core::token::Token;
use hostwire_memizy::HostConfig;
use hostwire_store::sessions::StoredSession;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::oneshot;

/// The stored session if the request carries its host token.
pub(super) async fn authorized(
    sessions: &Arc<Sessions>,
    id: &str,
    presented: &Presented,
) -> Result<StoredSession, Response> {
    let store = sessions.store();
    let key = id.to_owned();
    let stored = crate::blocking::spawn(move || store.load_session(&key))
        .await
        .map_err(|e| error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?
        .map_err(|e| {
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("store: {}", e.reason()),
            )
        })?
        .ok_or_else(|| error(StatusCode::NOT_FOUND, "no such session"))?;
    let host = Token::parse(&stored.host_token);
    presented
        .check(|given| host.filter(|t| t.matches(given)))
        .inspect(|_| sessions.touch(id))
        .map_err(|r| match r {
            Refused::Throttled(_) => r.response("host token"),
            _ => error(
                StatusCode::UNAUTHORIZED,
                "Authorization: the session's host token is required",
            ),
        })?;
    Ok(stored)
}

pub(super) async fn admin(sessions: &Arc<Sessions>, id: &str, op: Admin) -> Response {
    match admin_value(sessions, id, op).await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(r) => r,
    }
}

/// Carries `op` out on the running session and gives its answer.
async fn admin_value(sessions: &Arc<Sessions>, id: &str, op: Admin) -> Result<Value, Response> {
    // After a restart the session comes back at its first use.
    let h =
        match restore::running(sessions, id).await {
            Ok(Some(h)) => h,
            Err((status, m)) => return Err(error(status, m)),
            Ok(None) => return Err(error(
                StatusCode::CONFLICT,
                "the session is not running (its game has finished, or it stopped: continue it)",
            )),
        };
    let (tx, rx) = oneshot::channel();
    if h.tx.send(Cmd::Admin(Box::new(op), tx)).await.is_err() {
        return Err(error(StatusCode::CONFLICT, "the session has closed"));
    }
    match rx.await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err((status, m))) => Err(error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            m,
        )),
        Err(_) => Err(error(StatusCode::CONFLICT, "the session has closed")),
    }
}

pub(super) async fn status(
    State(sessions): State<Arc<Sessions>>,
    Path(id): Path<String>,
    presented: Presented,
) -> Response {
    let stored = match authorized(&sessions, &id, &presented).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match restore::running(&sessions, &id).await {
        Ok(Some(_)) => return admin(&sessions, &id, Admin::Status).await,
        Err((status, m)) => return error(status, m),
        Ok(None) => {}
    }
    let result = stored_result(&sessions, &stored.id).await;
    // A game that ended stays finished; one stopped waits for `continue`.
    let phase = if result.is_some() {
        "finished"
    } else {
        "stopped"
    };
    json_response(
        StatusCode::OK,
        &json!({"sessionId": id, "phase": phase, "result": result}),
    )
}

/// The result stored for a session whose game ended.
pub(super) async fn stored_result(sessions: &Sessions, id: &str) -> Option<Value> {
    let store = sessions.store();
    let id = id.to_owned();
    crate::blocking::spawn(move || store.load_result(&id))
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
}

macro_rules! simple {
    ($name:ident, $op:expr) => {
        pub(super) async fn $name(
            State(sessions): State<Arc<Sessions>>,
            Path(id): Path<String>,
            presented: Presented,
        ) -> Response {
            if let Err(r) = authorized(&sessions, &id, &presented).await {
                return r;
            }
            admin(&sessions, &id, $op).await
        }
    };
}

simple!(start, Admin::Start);
simple!(pause, Admin::Pause);
simple!(resume, Admin::Resume);
simple!(save, Admin::Save);
simple!(end, Admin::End);

/// `PUT /{id}/config` with `{"locale","theme"}`.
pub(super) async fn set_config(
    State(sessions): State<Arc<Sessions>>,
    Path(id): Path<String>,
    presented: Presented,
    body: axum::body::Bytes,
) -> Response {
    if let Err(r) = authorized(&sessions, &id, &presented).await {
        return r;
    }
    let c = match serde_json::from_slice::<HostConfig>(&body) {
        Ok(c) => c,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("body: expected {{\"locale\": …, \"theme\": \"light\" or \"dark\"}}: {e}"),
            )
        }
    };
    if let Err(m) = check_locale(&c.locale) {
        return error(StatusCode::BAD_REQUEST, m);
    }
    admin(&sessions, &id, Admin::Config(c)).await
}

/// `GET /{id}/recording`: the record the store keeps. A running session
/// first writes what it holds of it and answers once that is kept, so the
/// record answered holds every entry recorded before the request.
pub(super) async fn recording(
    State(sessions): State<Arc<Sessions>>,
    Path(id): Path<String>,
    presented: Presented,
) -> Response {
    if let Err(r) = authorized(&sessions, &id, &presented).await {
        return r;
    }
    // A running session's count of entries recorded: the store holds at
    // least these once it answered.
    let recorded = match restore::running(&sessions, &id).await {
        Ok(Some(_)) => match admin_value(&sessions, &id, Admin::Recording).await {
            Ok(v) => Some(v["entries"].as_u64().unwrap_or(0) as usize),
            Err(r) => return r,
        },
        Err((status, m)) => return error(status, m),
        Ok(None) => None,
    };
    let store = sessions.store();
    let key = id.clone();
    let read = crate::blocking::spawn(move || {
        store.load_recording(&key).map(|kept| {
            // A running session with nothing kept yet has an empty record.
            let kept = kept.or_else(|| recorded.map(|_| Default::default()))?;
            Some(recording::document(&key, &kept))
        })
    });
    let recorded = recorded.unwrap_or(0);
    match read.await {
        Ok(Ok(Some(Ok(doc)))) if doc.entries >= recorded => {
            let mut r = doc.text.into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
            r
        }
        Ok(Ok(Some(Ok(doc)))) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "recording: the store holds {} of its {recorded} entries: try again",
                doc.entries
            ),
        ),
        Ok(Ok(Some(Err(why)))) => error(StatusCode::INTERNAL_SERVER_ERROR, why),
        Ok(Ok(None)) => error(StatusCode::NOT_FOUND, "recording: none was kept"),
        Ok(Err(e)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store: {}", e.reason()),
        ),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

pub(super) async fn continue_saved(
    State(sessions): State<Arc<Sessions>>,
    Path(id): Path<String>,
    presented: Presented,
) -> Response {
    if let Err(r) = authorized(&sessions, &id, &presented).await {
        return r;
    }
    if sessions.handle(&id).is_none() && stored_result(&sessions, &id).await.is_some() {
        return error(
            StatusCode::CONFLICT,
            "the game has finished; it cannot be continued",
        );
    }
    // Running, or brought back as its last acknowledged state: a stopped
    // game comes back from its latest snapshot, paused.
    match restore::restore(&sessions, &id, true).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                "this session has no game to continue",
            )
        }
        Err((status, m)) => return error(status, m),
    }
    // The status, with every player's token: each device takes the place
    // of one earlier player.
    admin(&sessions, &id, Admin::Continue).await
}
