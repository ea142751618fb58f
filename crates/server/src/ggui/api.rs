//! The agent side's HTTP API under `/ggui/sessions`: create a session,
//! emit a stream envelope, push props, consume and drain actions, read a
//! session, override the advertised version. Every answer is JSON; errors
//! are `{code, message}` with the protocol's code.

// A ready answer is the error of the parsing helpers: it is returned once
// per request, so its size does not matter.
#![allow(clippy::result_large_err)]

use super::Ggui;
use crate::http::{json_response, same_secret, Presented, Refused};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, Request, State};
use axum::http::header::{CONTENT_LENGTH, RETRY_AFTER, TRANSFER_ENCODING};
use axum::http::StatusCode;
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;
use hostwire_ggui::channel::{clamp_long_poll_ms, ApiError, CreateSession};
use hostwire_ggui::decode::{MAX_FRAME_BYTES, MAX_FRAME_DEPTH};
use hostwire_ggui::{codes, StreamChannelMode};
use hostwire_playerthree::tokens::TokenHash;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// UI tokens kept per session; minting past it forgets the oldest.
pub const MAX_UI_TOKENS_PER_SESSION: usize = 64;

/// The UI tokens minted through the agent API, by the hash of their text:
/// each admits a `/ggui/ws` socket to one session of one app. Kept in
/// memory: after a restart the agent mints new ones.
#[derive(Default)]
pub struct UiTokens {
    by_hash: std::sync::Mutex<HashMap<TokenHash, (String, String)>>,
}

impl UiTokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenHash, (String, String)>> {
        self.by_hash.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new token for `session` of `app`.
    fn mint(&self, session: &str, app: &str) -> hostwire_core::Token {
        let token = hostwire_core::Token::generate();
        let mut t = self.lock();
        let of_session: Vec<TokenHash> = t
            .iter()
            .filter(|(_, (s, _))| s == session)
            .map(|(h, _)| *h)
            .collect();
        // Oldest first is not known from a map: any one goes (each is
        // equally a credential of the session).
        if of_session.len() >= MAX_UI_TOKENS_PER_SESSION {
            t.remove(&of_session[0]);
        }
        t.insert(
            TokenHash::of(token.as_str()),
            (session.to_owned(), app.to_owned()),
        );
        token
    }

    /// The session and app a presented UI token is for.
    pub(crate) fn lookup(&self, token: &str) -> Option<(String, String)> {
        self.lock().get(&TokenHash::of(token)).cloned()
    }
}

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
        .route_layer(from_fn_with_state(
            Arc::new(Semaphore::new(API_BODY_BUDGET_BYTES)),
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

/// The app whose agent made a request (by its credential).
#[derive(Debug, Clone)]
pub struct AgentApp(pub Arc<str>);

/// Every call needs an app's agent credential; the app goes with the
/// request, and each handler sees only that app's sessions.
async fn require_app(
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
fn owned(core: &mut super::Core, app: &str, session_id: &str) -> Result<(), ApiError> {
    match core.channel.session_app(session_id) {
        Some(a) if a == app => {
            core.touch(session_id);
            Ok(())
        }
        _ => Err(ApiError::SessionNotFound(session_id.to_owned())),
    }
}

/// Holds the request's share of [`API_BODY_BUDGET_BYTES`] from before its
/// body is read until it is answered; refuses it at once when the budget
/// is spent (503) or its declared body is over [`API_BODY_LIMIT`] (413).
async fn body_budget(State(budget): State<Arc<Semaphore>>, req: Request, next: Next) -> Response {
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
    let Ok(_held) = budget.try_acquire_many_owned(charge as u32) else {
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
    next.run(req).await
}

/// The body as `T` (see [`decode`]); a body the server could not read is
/// answered with its status.
fn body_as<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, Response> {
    let body = body.map_err(|r| {
        let status = r.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            codes::FRAME_TOO_LARGE
        } else {
            codes::INVALID_MESSAGE
        };
        error(status, code, format!("request body: {}", r.body_text()))
    })?;
    decode(&body).map_err(|(code, message)| error(StatusCode::BAD_REQUEST, code, message))
}

/// `bytes` as `T` (an empty body is `{}`), with the protocol's nesting
/// bound checked before parsing: text that is not JSON is `INVALID_JSON`,
/// JSON of another shape `INVALID_MESSAGE` naming the field at fault.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, (&'static str, String)> {
    // JSON text is UTF-8; checked whole, since fields a body type skips
    // would otherwise be skipped unchecked.
    let text = std::str::from_utf8(bytes).map_err(|e| {
        (
            codes::INVALID_JSON,
            format!(
                "request body is not JSON: not UTF-8 at byte {}",
                e.valid_up_to()
            ),
        )
    })?;
    let text = if text.trim_ascii().is_empty() {
        "{}"
    } else {
        text
    };
    if hostwire_core::json::nesting_depth(text.as_bytes(), MAX_FRAME_DEPTH) > MAX_FRAME_DEPTH {
        return Err((
            codes::INVALID_MESSAGE,
            format!("request body nests deeper than {MAX_FRAME_DEPTH} levels"),
        ));
    }
    let not_json = |e: &dyn std::fmt::Display| {
        (
            codes::INVALID_JSON,
            format!("request body is not JSON: {e}"),
        )
    };
    // A struct also reads from an array (by position): only an object is
    // a body.
    if !text.trim_ascii_start().starts_with('{') {
        return Err(match serde_json::from_str::<Value>(text) {
            Ok(_) => (
                codes::INVALID_MESSAGE,
                "request body must be a JSON object".into(),
            ),
            Err(e) => not_json(&e),
        });
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        if e.classify() != serde_json::error::Category::Data {
            return not_json(&e);
        }
        // A shape error found before the end of text that is not JSON at
        // all (`{}}`): the text is what is wrong. Only refused bodies pay
        // for this second pass.
        if let Err(syntax) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
            return not_json(&syntax);
        }
        let at = if path == "." {
            "request body".to_owned()
        } else {
            path
        };
        (codes::INVALID_MESSAGE, format!("{at}: {e}"))
    })?;
    de.end().map_err(|e| not_json(&e))?;
    Ok(value)
}

/// Decodes `bytes` as the body of the agent API's `route` (`create`,
/// `emit`, `props`, `drain` or `version`): `Err` is the refusal's code and
/// message. For fuzzing; the handlers decode the same way.
#[doc(hidden)]
pub fn decode_body(route: &str, bytes: &[u8]) -> Result<(), (&'static str, String)> {
    match route {
        "create" => decode::<CreateBody>(bytes).map(drop),
        "emit" => decode::<EmitBody>(bytes).map(drop),
        "props" => decode::<PropsBody>(bytes).map(drop),
        "drain" => decode::<DrainBody>(bytes).map(drop),
        _ => decode::<VersionBody>(bytes).map(drop),
    }
}

fn invalid(message: String) -> Response {
    error(StatusCode::BAD_REQUEST, codes::INVALID_MESSAGE, message)
}

/// `PUT /ggui/sessions/{id}`'s body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    #[serde(default)]
    app_id: Option<String>,
    #[serde(default)]
    version_override: Option<String>,
    #[serde(default)]
    action_spec: Option<Map<String, Value>>,
    #[serde(default)]
    stream_spec: Option<Map<String, Value>>,
}

/// `POST /ggui/sessions/{id}/emit`'s body.
#[derive(Deserialize)]
struct EmitBody {
    channel: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    complete: Option<bool>,
    payload: Value,
}

/// `POST /ggui/sessions/{id}/props`'s body.
#[derive(Deserialize)]
struct PropsBody {
    props: Map<String, Value>,
    #[serde(default)]
    epoch: Option<u64>,
}

/// An `actionId`: the ledger `seq`, as a number or as its string.
#[derive(Deserialize)]
#[serde(untagged)]
enum ActionId {
    Number(u64),
    Text(String),
}

/// `POST /ggui/sessions/{id}/actions/drain`'s body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DrainBody {
    up_to: ActionId,
}

/// `PUT /ggui/sessions/{id}/version`'s body (`null` clears).
#[derive(Deserialize)]
struct VersionBody {
    #[serde(default)]
    version: Option<String>,
}

/// `PUT /ggui/sessions/{id}` `{appId?, actionSpec?, streamSpec?, versionOverride?}`:
/// 201 created, 200 when it existed (idempotent).
async fn create_session(
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
        .call(move |core| core.channel.session_app(&sid).is_some())
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
    let answer = ggui
        .call(move |core| {
            let now = core.now_ms;
            core.touch(&id);
            core.channel
                .create_session(req, now)
                .map(|created| (created, core.channel.read_session(&id)))
        })
        .await;
    match answer {
        None => gone(),
        Some(Err(e)) => api_error(e),
        Some(Ok((created, view))) => {
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
async fn read_session(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
) -> Response {
    let missing = id.clone();
    let answer = ggui
        .call(move |core| {
            owned(core, &app, &id)
                .ok()
                .and_then(|()| core.channel.read_session(&id))
        })
        .await;
    match answer {
        None => gone(),
        Some(None) => api_error(ApiError::SessionNotFound(missing)),
        Some(Some(view)) => json_response(StatusCode::OK, &json!(view)),
    }
}

/// `POST /ggui/sessions/{id}/emit` `{channel, mode?, payload, complete?}`:
/// the stamped envelope with its `seq`.
async fn emit(
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
    let answer = ggui
        .call(move |core| {
            owned(core, &app, &id)?;
            core.channel.emit(&id, &channel, mode, payload, complete)
        })
        .await;
    match answer {
        None => gone(),
        Some(Err(e)) => api_error(e),
        Some(Ok(envelope)) => json_response(StatusCode::OK, &json!(envelope)),
    }
}

/// `POST /ggui/sessions/{id}/props` `{props, epoch?}`: `props_update` to
/// subscribers, `ui.updated` in the ledger; answers its `sequence`.
async fn push_props(
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
            core.channel.push_props(&id, props, epoch, now)
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

/// `GET /ggui/sessions/{id}/actions?max=&waitMs=`: the undrained actions,
/// oldest first; when there are none, waits for one up to `waitMs`
/// (at most 25 s) and answers `[]` when none came.
async fn consume_actions(
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
                let entries = core.channel.pending_actions(&sid, max)?;
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
                        super::MAX_LONG_POLLS_PER_SESSION
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
async fn drain_actions(
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
        .call(move |core| {
            owned(core, &app, &id)?;
            let now = core.now_ms;
            core.channel.drain_actions(&id, up_to, now)
        })
        .await;
    match answer {
        None => gone(),
        Some(Err(e)) => api_error(e),
        Some(Ok(n)) => json_response(StatusCode::OK, &json!({ "drained": n })),
    }
}

/// `PUT /ggui/sessions/{id}/version` `{version}` (`null` clears): the
/// version this session advertises instead of the server's.
async fn set_version(
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
        .call(move |core| {
            owned(core, &app, &id)?;
            core.channel
                .set_version_override(&id, version)
                .map(|()| core.channel.read_session(&id))
        })
        .await;
    match answer {
        None => gone(),
        Some(Err(e)) => api_error(e),
        Some(Ok(view)) => json_response(StatusCode::OK, &json!(view)),
    }
}

/// `POST /ggui/sessions/{id}/ui-tokens`: a token for the session's user
/// interface, bound to this session and app: what a `/ggui/ws` socket
/// presents (`Authorization: Bearer` or `?token=`).
async fn mint_ui_token(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
) -> Response {
    let sid = id.clone();
    let owner = Arc::clone(&app);
    match ggui.call(move |core| owned(core, &owner, &sid)).await {
        None => gone(),
        Some(Err(e)) => api_error(e),
        Some(Ok(())) => {
            let token = ggui.ui_tokens.mint(&id, &app);
            json_response(
                StatusCode::CREATED,
                &json!({ "token": token.as_str(), "sessionId": id }),
            )
        }
    }
}
