//! What the agent sends its user interface: stream envelopes and props.

use super::body::{body_as, EmitBody, PropsBody};
use super::gate::{owned, AgentApp};
use super::{api_error, error, gone, invalid};
use crate::ggui::Ggui;
use crate::http::json_response;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use hostwire_ggui::StreamChannelMode;
use serde_json::json;
use std::sync::Arc;

/// `POST /ggui/sessions/{id}/emit` `{channel, mode?, payload, complete?}`:
/// the stamped envelope with its `seq`.
pub(super) async fn emit(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body: EmitBody = match body_as(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mode = match body.mode.as_deref() {
        None => StreamChannelMode::Append,
        Some(s) => match StreamChannelMode::parse(s) {
            Some(mode) => mode,
            None => return invalid("mode must be 'append' or 'replace'".into()),
        },
    };
    let EmitBody {
        channel,
        complete,
        payload,
        ..
    } = body;
    // Answered once what it kept (the envelope, per the channel's replay
    // policy) is stored.
    let answer = ggui
        .call_stored(move |core| {
            owned(core, &app, &id)?;
            core.unit
                .channel
                .emit(&id, &channel, mode, payload, complete)
        })
        .await;
    match answer {
        None => gone(),
        Some((Err(e), _)) => api_error(e),
        Some((Ok(_), false)) => super::not_stored("the envelope"),
        Some((Ok(envelope), true)) => json_response(StatusCode::OK, &json!(envelope)),
    }
}

/// `POST /ggui/sessions/{id}/props` `{props, epoch?}`: `props_update` to
/// subscribers, `ui.updated` in the ledger; answers its `sequence`.
pub(super) async fn push_props(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let PropsBody { props, epoch } = match body_as(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    // Answered once the props are durable; nothing changed if they
    // cannot be stored.
    let answer = ggui
        .call_stored(move |core| {
            owned(core, &app, &id)?;
            let now = core.now_ms;
            core.unit.channel.push_props(&id, props, epoch, now)
        })
        .await;
    match answer {
        None => gone(),
        Some((Err(e), _)) => api_error(e),
        Some((Ok(_), false)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "STORE_UNAVAILABLE",
            "props: not stored, nothing changed; try again",
        ),
        Some((Ok(seq), true)) => json_response(StatusCode::OK, &json!({ "sequence": seq })),
    }
}
