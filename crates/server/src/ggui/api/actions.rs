//! What the user interface sent the agent: actions consumed (long
//! polled) and drained.

use super::body::{body_as, ActionId, DrainBody};
use super::gate::{owned, AgentApp};
use super::{api_error, error, gone, invalid, DEFAULT_CONSUME_MAX, MAX_CONSUME};
use crate::ggui::Ggui;
use crate::http::json_response;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use hostwire_ggui::channel::{clamp_long_poll_ms, ApiError};
use hostwire_ggui::codes;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// `GET /ggui/sessions/{id}/actions?max=&waitMs=`: the undrained actions,
/// oldest first; when there are none, waits for one up to `waitMs`
/// (at most 25 s) and answers `[]` when none came.
pub(super) async fn consume_actions(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let max = match q.get("max").map(|s| s.parse::<usize>()) {
        None => DEFAULT_CONSUME_MAX,
        Some(Ok(n)) if (1..=MAX_CONSUME).contains(&n) => n,
        Some(_) => return invalid(format!("max must be an integer from 1 to {MAX_CONSUME}")),
    };
    let wait_ms = match q.get("waitMs").map(|s| s.parse::<u64>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => return invalid("waitMs must be a non-negative integer".into()),
    };
    let wait = Duration::from_millis(clamp_long_poll_ms(wait_ms.or(Some(0))));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let sid = id.clone();
        let app = Arc::clone(&app);
        let may_wait = tokio::time::Instant::now() < deadline;
        let answer = ggui
            .call(move |core| {
                owned(core, &app, &sid)?;
                let entries = core.unit.channel.pending_actions(&sid, max)?;
                let waiter = if entries.is_empty() && may_wait && !core.closing {
                    Some(core.wait_for_actions(&sid))
                } else {
                    None
                };
                Ok::<_, ApiError>((entries, waiter))
            })
            .await;
        let (entries, waiter) = match answer {
            None => return gone(),
            Some(Err(e)) => return api_error(e),
            Some(Ok(x)) => x,
        };
        match waiter {
            None => return json_response(StatusCode::OK, &json!({ "actions": entries })),
            Some(None) => {
                return error(
                    StatusCode::TOO_MANY_REQUESTS,
                    codes::RATE_LIMITED,
                    format!(
                        "at most {} long polls may wait on one session",
                        crate::ggui::MAX_LONG_POLLS_PER_SESSION
                    ),
                )
            }
            Some(Some(rx)) => {
                if tokio::time::timeout_at(deadline, rx).await.is_err() {
                    return json_response(StatusCode::OK, &json!({ "actions": [] }));
                }
            }
        }
    }
}

/// `POST /ggui/sessions/{id}/actions/drain` `{upTo}`: removes the actions
/// up to that `actionId` and sends `drain_ack` to subscribers.
pub(super) async fn drain_actions(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body: DrainBody = match body_as(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    // `actionId`s are strings of the ledger `seq`: both forms are taken.
    let up_to = match body.up_to {
        ActionId::Number(n) => Some(n),
        ActionId::Text(s) => s.parse::<u64>().ok(),
    };
    let Some(up_to) = up_to else {
        return invalid("upTo must be an actionId (a non-negative integer)".into());
    };
    let answer = ggui
        .call_stored(move |core| {
            owned(core, &app, &id)?;
            let now = core.now_ms;
            core.unit.channel.drain_actions(&id, up_to, now)
        })
        .await;
    match answer {
        None => gone(),
        Some((Err(e), _)) => api_error(e),
        Some((Ok(_), false)) => super::not_stored("the drain"),
        Some((Ok(n), true)) => json_response(StatusCode::OK, &json!({ "drained": n })),
    }
}
