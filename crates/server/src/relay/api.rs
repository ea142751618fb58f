//! The relay's HTTP API (`/api/…`): each handler reads the request, asks the
//! relay or the room's task, and turns the answer into a response.

use super::bundles::BundleRead;
use super::room::{PutBundleCmd, PutOutcome, RoomCmd};
use super::{CreateError, Relay};
use crate::http::error::{method_not_allowed, not_found, JSON_UTF8};
use crate::http::origins::{preflight_no_content, require_allowed_origin};
use crate::http::{json_response, ApiError, RetryAfter};
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use hostwire_memizy::relay::{is_pin, parse_bundle};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// The header that carries a bundle's version.
const X_BUNDLE_VERSION: HeaderName = HeaderName::from_static("x-bundle-version");
/// How long a browser may keep a preflight's answer, in seconds.
const CORS_MAX_AGE_S: u64 = 600;

const ROOM_NOT_FOUND: ApiError = ApiError::new(StatusCode::NOT_FOUND, "Room not found");
/// A room another live node owns (its lease): carrying requests to it is
/// still to come, so the client is told to try again (through the load
/// balancer, or once the owner's lease has run out).
const ROOM_ELSEWHERE: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "The room is served by another node; try again.",
);
const ROOM_NOT_READ: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "The room could not be read from the store; try again.",
);
const NOT_THE_HOST: ApiError = ApiError::new(StatusCode::FORBIDDEN, "Not the host");
const BODY_TIMEOUT: ApiError = ApiError::new(
    StatusCode::REQUEST_TIMEOUT,
    "The body was not received in time (BODY_READ_TIMEOUT)",
);
const TOO_MANY_UPLOADS: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "Too many bundle uploads at once (CONCURRENT_UPLOADS); try again.",
);
const CHECK_TIMEOUT: ApiError = ApiError::new(
    StatusCode::UNPROCESSABLE_ENTITY,
    "The bundle took too long to check (BUNDLE_CHECK_TIMEOUT)",
);
const BUNDLE_TOO_LARGE: ApiError = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "Bundle too large");
const BODY_NOT_READ: ApiError = ApiError::new(
    StatusCode::BAD_REQUEST,
    "The request body could not be read",
);
const BUNDLE_NOT_STORED: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "The bundle could not be stored; the room serves the bundle it had. Try again.",
);
const BUNDLES_BUSY: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "Too many bundles being sent at once (BUNDLE_CACHE_BYTES); try again.",
);
const BUNDLE_NOT_READ: ApiError = ApiError::new(
    StatusCode::SERVICE_UNAVAILABLE,
    "The bundle could not be read from the store; try again.",
);
const NO_GAME_YET: ApiError =
    ApiError::new(StatusCode::NOT_FOUND, "The host has not chosen a game yet");

/// The routes under `/api`. Every route but `/health` refuses an origin
/// that is not allowed (403); a known path with another method is 405,
/// an unknown path 404; CORS headers go on every answer.
pub fn router(relay: Arc<Relay>) -> Router {
    let cors = relay
        .origins
        .cors_layer()
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::OPTIONS])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .expose_headers([X_BUNDLE_VERSION])
        .max_age(Duration::from_secs(CORS_MAX_AGE_S));
    Router::new()
        .route("/rooms", post(create_room).fallback(method_not_allowed))
        .route("/rooms/{pin}", get(room_info).fallback(method_not_allowed))
        .route(
            "/rooms/{pin}/bundle",
            get(get_bundle).put(put_bundle).fallback(method_not_allowed),
        )
        .route_layer(from_fn_with_state(
            Arc::clone(&relay.origins),
            require_allowed_origin,
        ))
        .route("/health", get(health).fallback(method_not_allowed))
        .fallback(not_found)
        .with_state(relay)
        .layer(cors)
        .layer(from_fn(preflight_no_content))
}

async fn health(
    State(relay): State<Arc<Relay>>,
    cluster: Option<axum::Extension<Arc<crate::cluster::Cluster>>>,
) -> Response {
    let mut v = relay.health();
    // A node of a cluster adds its id, its NATS link and its peers beside
    // the relay's figures; a single node answers exactly the reference
    // relay's body, which Memizy host apps and conformance suites read.
    if let (Some(axum::Extension(c)), Some(o)) = (cluster, v.as_object_mut()) {
        if c.is_clustered() {
            if let serde_json::Value::Object(node) = c.health() {
                o.extend(node);
            }
        }
    }
    json_response(StatusCode::OK, &v)
}

async fn create_room(
    State(relay): State<Arc<Relay>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let ip = relay.client_ip(&headers, peer);
    if let Err(refused) = relay.allow_room_creation(&ip) {
        return refused.into_response();
    }
    match relay.create_room().await {
        Ok((pin, token)) => json_response(
            StatusCode::CREATED,
            &json!({"pin": pin, "hostToken": token}),
        ),
        Err(CreateError::NotStored) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The room could not be stored; try again.",
        )
        .into_response(),
        Err(CreateError::Full) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The server holds as many rooms as it may (MAX_ROOMS); try again later.",
        )
        .into_response(),
        Err(CreateError::NoLease) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The room could not be leased to this node; try again.",
        )
        .into_response(),
        Err(CreateError::NoPin) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "No free PIN right now; try again.",
        )
        .into_response(),
    }
}

async fn room_by_pin(relay: &Arc<Relay>, pin: &str) -> Result<super::room::RoomHandle, ApiError> {
    if !is_pin(pin) {
        return Err(ROOM_NOT_FOUND);
    }
    match relay.find_room(pin).await {
        super::Find::Here(h) => Ok(h),
        super::Find::NotFound => Err(ROOM_NOT_FOUND),
        super::Find::Elsewhere(_) => Err(ROOM_ELSEWHERE),
        super::Find::Unavailable => Err(ROOM_NOT_READ),
    }
}

/// 429 with `Retry-After`, in the reference's error shape.
fn too_many(what: &str, setting: &str, retry: RetryAfter) -> Response {
    let message = format!(
        "Too many {what} from this network ({setting}); try again in {} s.",
        retry.seconds
    );
    let mut r = json_response(StatusCode::TOO_MANY_REQUESTS, &json!({ "error": message }));
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry.seconds));
    r
}

async fn room_info(
    State(relay): State<Arc<Relay>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(pin): Path<String>,
) -> Response {
    // Every lookup counts, found or not: a PIN guess is a lookup.
    let ip = relay.client_ip(&headers, peer);
    if let Err(retry) = relay.lookups.try_take(&ip, relay.clock.now_ms()) {
        relay.metrics.lookups_rate_limited.fetch_add(1, Relaxed);
        return too_many("room lookups", "LOOKUPS_PER_IP_PER_SECOND", retry);
    }
    let room = match room_by_pin(&relay, &pin).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = oneshot::channel();
    let _ = room.tx.send(RoomCmd::Info(tx)).await;
    match rx.await {
        Ok(info) => json_response(
            StatusCode::OK,
            &serde_json::to_value(info).unwrap_or_default(),
        ),
        Err(_) => ROOM_NOT_FOUND.into_response(),
    }
}

async fn get_bundle(State(relay): State<Arc<Relay>>, Path(pin): Path<String>) -> Response {
    let room = match room_by_pin(&relay, &pin).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = oneshot::channel();
    let _ = room.tx.send(RoomCmd::GetBundle(tx)).await;
    let (created_at_ms, version) = match rx.await {
        Ok(Some(v)) => v,
        Ok(None) => return NO_GAME_YET.into_response(),
        Err(_) => return ROOM_NOT_FOUND.into_response(),
    };
    match relay.bundles.get(&pin, created_at_ms, version).await {
        BundleRead::Found { version, text } => {
            let mut r = Response::new(Body::from(text));
            let h = r.headers_mut();
            h.insert(header::CONTENT_TYPE, JSON_UTF8);
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            h.insert(X_BUNDLE_VERSION, HeaderValue::from(version));
            r
        }
        // Closed meanwhile.
        BundleRead::Missing => ROOM_NOT_FOUND.into_response(),
        BundleRead::Busy => BUNDLES_BUSY.into_response(),
        BundleRead::Failed => BUNDLE_NOT_READ.into_response(),
    }
}

/// Reads a body of at most `limit` bytes into one buffer, sized from its
/// declared length up front: collecting its chunks and then joining them
/// would hold it twice.
async fn read_body(body: Body, declared: Option<usize>, limit: usize) -> Result<Bytes, ApiError> {
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            if crate::http::serve::is_body_timeout(&e) {
                BODY_TIMEOUT
            } else {
                BODY_NOT_READ
            }
        })?;
        if buf.len() + chunk.len() > limit {
            return Err(BUNDLE_TOO_LARGE);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

async fn put_bundle(
    State(relay): State<Arc<Relay>>,
    Path(pin): Path<String>,
    req: Request,
) -> Response {
    let room = match room_by_pin(&relay, &pin).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let token = crate::http::bearer(req.headers()).unwrap_or("").to_owned();
    // The token is checked first: a caller who is not the host never gets
    // its body read.
    let (tx, rx) = oneshot::channel();
    let _ = room
        .tx
        .send(RoomCmd::IsHost(Box::new((token.clone(), tx))))
        .await;
    match rx.await {
        Err(_) => return ROOM_NOT_FOUND.into_response(),
        Ok(false) => return NOT_THE_HOST.into_response(),
        Ok(true) => {}
    }
    let limit = relay.config.limits.bundle_bytes;
    let check_timeout = Duration::from_millis(relay.config.server_limits.bundle_check_timeout_ms);
    // Held from reading the body until it is stored (or until its check
    // ends, in the blocking pool, where a check that timed out may still
    // run): what uploads hold in memory is bounded by this count.
    let Ok(permit) = Arc::clone(&relay.uploads).try_acquire_owned() else {
        return TOO_MANY_UPLOADS.into_response();
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return BUNDLE_TOO_LARGE.into_response();
    }
    let body = match read_body(req.into_body(), declared, limit).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    // The check is CPU work over up to `bundle_bytes`: off the async
    // workers, and bounded in time.
    let checked = body.clone();
    let check = crate::blocking::spawn(move || (parse_bundle(&checked), permit));
    let (app_name, _permit) = match tokio::time::timeout(check_timeout, check).await {
        Ok(Ok((Ok(b), permit))) => (b.app_name, permit),
        Ok(Ok((Err(e), _))) => {
            return ApiError::new(StatusCode::BAD_REQUEST, e.message()).into_response()
        }
        Ok(Err(_)) | Err(_) => return CHECK_TIMEOUT.into_response(),
    };
    let (tx, rx) = oneshot::channel();
    let _ = room
        .tx
        .send(RoomCmd::PutBundle(Box::new(PutBundleCmd {
            token,
            text: body,
            app_name,
            reply: tx,
        })))
        .await;
    match rx.await {
        Ok(PutOutcome::Stored(version)) => {
            json_response(StatusCode::OK, &json!({"version": version}))
        }
        Ok(PutOutcome::NotTheHost) => NOT_THE_HOST.into_response(),
        Ok(PutOutcome::NotStored) => BUNDLE_NOT_STORED.into_response(),
        Err(_) => ROOM_NOT_FOUND.into_response(),
    }
}
