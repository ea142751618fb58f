//! Sessions: create, read, and override the version one advertises.

use super::body::{body_as, CreateBody, VersionBody};
use super::gate::{owned, AgentApp};
use super::{api_error, error, gone};
use crate::ggui::Ggui;
use crate::http::{json_response, Presented};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use hostwire_ggui::channel::{ApiError, CreateSession};
use hostwire_ggui::codes;
use serde_json::{json, Value};
use std::sync::Arc;

/// `PUT /ggui/sessions/{id}` `{appId?, actionSpec?, streamSpec?, versionOverride?}`:
/// 201 created, 200 when it existed (idempotent).
pub(super) async fn create_session(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
    presented: Presented,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body: CreateBody = match body_as(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    // A new session counts toward the client IP's creations.
    let sid = id.clone();
    match ggui
        .call(move |core| core.unit.channel.session_app(&sid).is_some())
        .await
    {
        None => return gone(),
        Some(true) => {}
        Some(false) => {
            let gate = &presented.gate;
            if let Err(r) = gate.ggui_sessions.admit(&presented.ip, gate.now_ms()) {
                return axum::response::IntoResponse::into_response(r);
            }
        }
    }
    // The agent creates for its own app: naming another is refused.
    if let Some(named) = &body.app_id {
        if **named != *app {
            return error(
                StatusCode::FORBIDDEN,
                codes::APP_MISMATCH,
                format!("appId: this credential is app '{app}'s, not '{named}'"),
            );
        }
    }
    let req = CreateSession {
        session_id: id.clone(),
        app_id: Some(app.to_string()),
        version_override: body.version_override,
        action_spec: body.action_spec.map(Value::Object),
        stream_spec: body.stream_spec.map(Value::Object),
    };
    let sid_again = id.clone();
    // Answered once the new session is stored: another node (or this one
    // after a restart) must find what was acknowledged.
    let answer = ggui
        .call_stored(move |core| {
            let now = core.now_ms;
            core.touch(&id);
            core.unit
                .channel
                .create_session(req, now)
                .map(|created| (created, core.unit.channel.read_session(&id)))
        })
        .await;
    match answer {
        None => gone(),
        Some((Err(e), _)) => api_error(e),
        Some((Ok((created, _)), false)) => {
            // A session just made and not stored is not kept: it would
            // answer as existing and be gone after a restart.
            if created {
                let _ = ggui
                    .call(move |core| core.unit.channel.remove_session(&sid_again))
                    .await;
            }
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::APPEND_FAILED,
                "the session could not be stored; try again",
            )
        }
        Some((Ok((created, view)), true)) => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json_response(status, &json!({ "created": created, "session": view }))
        }
    }
}

/// `GET /ggui/sessions/{id}`: app, host context, props, sequence,
/// streamSeq, version.
pub(super) async fn read_session(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
) -> Response {
    let missing = id.clone();
    let answer = ggui
        .call(move |core| {
            owned(core, &app, &id)
                .ok()
                .and_then(|()| core.unit.channel.read_session(&id))
        })
        .await;
    match answer {
        None => gone(),
        Some(None) => api_error(ApiError::SessionNotFound(missing)),
        Some(Some(view)) => json_response(StatusCode::OK, &json!(view)),
    }
}

/// `PUT /ggui/sessions/{id}/version` `{version}` (`null` clears): the
/// version this session advertises instead of the server's.
pub(super) async fn set_version(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let VersionBody { version } = match body_as(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let answer = ggui
        .call_stored(move |core| {
            owned(core, &app, &id)?;
            core.unit
                .channel
                .set_version_override(&id, version)
                .map(|()| core.unit.channel.read_session(&id))
        })
        .await;
    match answer {
        None => gone(),
        Some((Err(e), _)) => api_error(e),
        Some((Ok(_), false)) => super::not_stored("the version"),
        Some((Ok(view), true)) => json_response(StatusCode::OK, &json!(view)),
    }
}
