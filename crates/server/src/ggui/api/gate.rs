//! What every agent request passes before its handler: the app's
//! credential, the session owned by that app, the budget of bodies read
//! at once.

use super::{error, API_BODY_BUDGET_BYTES, API_BODY_LIMIT};
use crate::ggui::{Ggui, GguiMetrics};
use crate::http::{same_secret, Presented, Refused};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, RETRY_AFTER, TRANSFER_ENCODING};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use hostwire_ggui::channel::ApiError;
use hostwire_ggui::codes;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The app whose agent made a request (by its credential).
#[derive(Debug, Clone)]
pub struct AgentApp(pub Arc<str>);

/// Every call needs an app's agent credential; the app goes with the
/// request, and each handler sees only that app's sessions.
pub(super) async fn require_app(
    State(ggui): State<Arc<Ggui>>,
    presented: Presented,
    mut req: Request,
    next: Next,
) -> Response {
    let app = presented.check(|given| {
        ggui.config
            .apps
            .iter()
            .find(|a| same_secret(given, &a.credential))
            .map(|a| Arc::<str>::from(a.id.as_str()))
    });
    match app {
        Ok(app) => {
            req.extensions_mut().insert(AgentApp(app));
            next.run(req).await
        }
        Err(r @ Refused::Throttled(_)) => r.response("app credential"),
        Err(r) => {
            let message = if r == Refused::Missing {
                "Authorization: Bearer <the app's agent credential> is required"
            } else {
                "Authorization: not an app's agent credential"
            };
            error(StatusCode::UNAUTHORIZED, codes::UNAUTHENTICATED, message)
        }
    }
}

/// Whether `session_id` is `app`'s: another app's session is answered as
/// one that does not exist (its existence is not another app's to learn).
/// An owned session is used now (it does not expire while its agent calls).
pub(super) fn owned(
    core: &mut crate::ggui::Core,
    app: &str,
    session_id: &str,
) -> Result<(), ApiError> {
    match core.unit.channel.session_app(session_id) {
        Some(a) if a == app => {
            core.touch(session_id);
            Ok(())
        }
        _ => Err(ApiError::SessionNotFound(session_id.to_owned())),
    }
}

/// The agent API's budget of request bodies read at once, and its gauge.
pub(super) struct BodyBudget {
    pub(super) permits: Semaphore,
    pub(super) metrics: Arc<GguiMetrics>,
}

/// A request's share of the budget, counted on the gauge while held
/// (also when the request is dropped unanswered).
struct Held<'a>(&'a GguiMetrics, u64);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0
            .api_body_bytes
            .fetch_sub(self.1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Holds the request's share of [`API_BODY_BUDGET_BYTES`] from before its
/// body is read until it is answered; refuses it at once when the budget
/// is spent (503) or its declared body is over [`API_BODY_LIMIT`] (413).
pub(super) async fn body_budget(
    State(budget): State<Arc<BodyBudget>>,
    req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let charge = match declared {
        Some(n) if n > API_BODY_LIMIT as u64 => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                codes::FRAME_TOO_LARGE,
                format!("request body: {n} bytes is over the limit of {API_BODY_LIMIT}"),
            )
        }
        Some(n) => n as usize,
        None if headers.contains_key(TRANSFER_ENCODING) => API_BODY_LIMIT,
        None => 0,
    };
    if charge == 0 {
        return next.run(req).await;
    }
    // `charge` is at most API_BODY_LIMIT, which fits in u32.
    let Ok(_permits) = budget.permits.try_acquire_many(charge as u32) else {
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::RATE_LIMITED,
            format!(
                "request body: {API_BODY_BUDGET_BYTES} bytes of request bodies are being read (API_BODY_BUDGET_BYTES); try again"
            ),
        );
        r.headers_mut()
            .insert(RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        return r;
    };
    let m = &*budget.metrics;
    m.api_body_bytes
        .fetch_add(charge as u64, std::sync::atomic::Ordering::Relaxed);
    let _counted = Held(m, charge as u64);
    next.run(req).await
}
