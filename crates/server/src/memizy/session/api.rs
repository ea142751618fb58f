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

// Handlers return their error `Response` directly.
#![allow(clippy::result_large_err)]

use super::actor::{self, Admin, Auth, Cmd};
use super::restore::{self, KeptState};
use super::{Sessions, MAX_BUNDLE_BYTES};
use crate::http::error::json_response;
use crate::http::origins::{preflight_no_content, require_allowed_or_same_origin};
use crate::http::{Presented, Refused};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use base64::Engine;
use hostwire_core::token::Token;
use hostwire_memizy::manifest::read_plugin_manifest;
use hostwire_memizy::session::{
    catalog, AssetCatalog, PlayerSpec, SavedGame, SavedPlayer, Session, SessionConfig,
    SessionTiming,
};
use hostwire_memizy::{HostAs, HostConfig, Mode, PluginDataValues};
use hostwire_store::sessions::{SessionWrite, StoredSession};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::sync::oneshot;

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

/// What `POST /memizy/sessions` takes.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSession {
    /// The plugin's HTML file (its manifest island is read).
    pub plugin_html: String,
    pub set: SetSpec,
    pub mode: Mode,
    #[serde(default)]
    pub host_as: Option<HostAs>,
    #[serde(default)]
    pub settings: Map<String, Value>,
    #[serde(default)]
    pub players: Vec<PlayerIn>,
    #[serde(default)]
    pub timing: Option<TimingIn>,
    /// The host configuration the instances get (`InitPayload.config`);
    /// `{"locale":"en","theme":"light"}` when absent.
    #[serde(default)]
    pub config: Option<HostConfig>,
    /// The set's files (`getAsset`), by the path a media object's `value`
    /// names, as base64. Kept in the store beside the session, not in it.
    #[serde(default, skip_serializing)]
    pub assets: BTreeMap<String, String>,
}

/// The set of a creation request, kept as its text (`meta` and each item
/// unparsed): a JSON tree of a set costs tens of times its bytes.
pub type SetSpec = hostwire_memizy::SetText;

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlayerIn {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub is_host: bool,
    /// The account; the player id when absent.
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimingIn {
    pub ready_timeout_ms: Option<u64>,
    pub countdown_ms: Option<u64>,
    pub authority_away_ms: Option<u64>,
    pub finished_close_ms: Option<u64>,
}

/// A session id: 128 random bits, as hex.
fn session_id() -> String {
    let b = hostwire_core::token::random_bytes::<16>();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The session's configuration from its creation request; `files` are the
/// bundle's files and their sizes.
pub(super) fn config(
    sessions: &Sessions,
    id: &str,
    spec: &CreateSession,
    files: &BTreeMap<String, usize>,
) -> Result<(SessionConfig, AssetCatalog), (StatusCode, String)> {
    let manifest = read_plugin_manifest(&spec.plugin_html)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("pluginHtml: {e}")))?;
    let meta = spec
        .set
        .meta_fields()
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("set.meta: {e}")))?;
    let set_id = meta
        .id
        .as_ref()
        .and_then(Value::as_str)
        .ok_or((
            StatusCode::BAD_REQUEST,
            "set.meta.id: a string is required".to_owned(),
        ))?
        .to_owned();
    let set = spec.set.clone();
    let mut c = SessionConfig::new(
        id,
        spec.mode,
        spec.host_as,
        manifest.id,
        manifest.runtime,
        set,
    );
    c.set_id = set_id;
    c.item_types = manifest.types;
    c.settings = spec.settings.clone();
    if let Some(hc) = &spec.config {
        check_locale(&hc.locale).map_err(|m| (StatusCode::BAD_REQUEST, format!("config.{m}")))?;
        c.config = hc.clone();
    }
    c.services = sessions.services().registry();
    let assets = catalog(&c.set, files);
    c.assets = assets.index.clone();
    let d = sessions.config.timing;
    let t = spec.timing.unwrap_or(TimingIn {
        ready_timeout_ms: None,
        countdown_ms: None,
        authority_away_ms: None,
        finished_close_ms: None,
    });
    c.timing = SessionTiming {
        ready_timeout_ms: t.ready_timeout_ms.unwrap_or(d.ready_timeout_ms),
        countdown_ms: t.countdown_ms.unwrap_or(d.countdown_ms),
        authority_away_ms: t.authority_away_ms.unwrap_or(d.authority_away_ms),
        finished_close_ms: t.finished_close_ms.unwrap_or(d.finished_close_ms),
    };
    Ok((c, assets))
}

/// The bundle's files, decoded.
fn decode_assets(spec: &CreateSession) -> Result<BTreeMap<String, Vec<u8>>, String> {
    spec.assets
        .iter()
        .map(|(file, b64)| {
            if file.is_empty() || file.len() > 1024 {
                return Err(format!(
                    "assets: a file name must have 1 to 1024 bytes, {:?} has {}",
                    file.chars().take(64).collect::<String>(),
                    file.len()
                ));
            }
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map(|b| (file.clone(), b))
                .map_err(|e| format!("assets[{file:?}]: not base64: {e}"))
        })
        .collect()
}

/// Mints a token per player, keeping the ones the store already holds.
pub(super) fn player_tokens(
    stored: &[(String, String)],
    players: impl IntoIterator<Item = String>,
) -> HashMap<String, Token> {
    let mut out: HashMap<String, Token> = stored
        .iter()
        .filter_map(|(p, t)| Some((p.clone(), Token::parse(t)?)))
        .collect();
    for p in players {
        out.entry(p).or_insert_with(Token::generate);
    }
    out
}

fn tokens_json(tokens: &HashMap<String, Token>) -> Value {
    let m: BTreeMap<&str, &str> = tokens
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    json!(m)
}

/// A player with the progress and plugin data the store holds for it.
pub(super) async fn player_spec(
    sessions: &Arc<Sessions>,
    p: &PlayerIn,
    plugin_id: &str,
    set_id: &str,
) -> Result<PlayerSpec, (StatusCode, String)> {
    let mut spec = PlayerSpec::new(p.id.clone(), p.name.clone());
    spec.is_host = p.is_host;
    if let Some(u) = &p.user {
        spec.user = u.clone();
    }
    let store = sessions.store();
    let (user, plugin, set) = (spec.user.clone(), plugin_id.to_owned(), set_id.to_owned());
    let loaded = tokio::task::spawn_blocking(move || {
        let data = store.load_plugin_data(&user, &plugin, &set)?;
        let progress = store.load_progress(&user, &set)?;
        Ok::<_, hostwire_store::StoreError>((data, progress))
    })
    .await
    .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?
    .map_err(|e| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store: {}", e.reason()),
        )
    })?;
    let parse = |t: Option<String>| {
        t.and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .unwrap_or(Value::Null)
    };
    spec.data = PluginDataValues {
        plugin: parse(loaded.0.plugin),
        set: parse(loaded.0.set),
    };
    for (item, record) in loaded.1 {
        if let Ok(v) = serde_json::from_str::<Value>(&record) {
            spec.progress.insert(item, v);
        }
    }
    Ok(spec)
}

/// A creation request decoded and checked, before anything is stored.
pub struct Prepared {
    pub spec: CreateSession,
    pub files: BTreeMap<String, Vec<u8>>,
    pub assets: AssetCatalog,
    pub session: Session,
    pub plugin_id: String,
    pub set_id: String,
}

/// Everything a creation request's body goes through before the store: its
/// shape, its files, the session's configuration (manifest, set, timing)
/// and the engine's new session. The fuzz target `memizy_session_create`
/// feeds it any bytes.
pub fn prepare_creation(
    sessions: &Sessions,
    id: &str,
    body: &[u8],
) -> Result<Prepared, (StatusCode, String)> {
    let spec: CreateSession = serde_json::from_slice(body)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("body: {e}")))?;
    let files = decode_assets(&spec).map_err(|m| (StatusCode::BAD_REQUEST, m))?;
    let sizes: BTreeMap<String, usize> = files.iter().map(|(f, b)| (f.clone(), b.len())).collect();
    let (cfg, assets) = config(sessions, id, &spec, &sizes)?;
    let (plugin_id, set_id) = (cfg.plugin_id.clone(), cfg.set_id.clone());
    let session = Session::new(cfg, sessions.clock.now_ms())
        .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(Prepared {
        spec,
        files,
        assets,
        session,
        plugin_id,
        set_id,
    })
}

async fn create(
    State(sessions): State<Arc<Sessions>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    presented: Presented,
    body: axum::body::Body,
) -> Response {
    // The operator's credential first: an anonymous request costs nothing
    // and counts toward no limit.
    if let Err(refused) = presented.operator() {
        return refused.response("operator credential");
    }
    // Held until the answer: what the request's set costs in memory is
    // bounded by CONCURRENT_SESSION_CREATIONS of them.
    let Some(_permit) = sessions.creation_permit() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many sessions being created at once (CONCURRENT_SESSION_CREATIONS); try again",
        );
    };
    if let Err(refused) = sessions.allow_creation(&headers, peer) {
        return refused.into_response();
    }
    // The body is read only now, under the permit: a request waiting for
    // one holds none of its bytes.
    let body = match axum::body::to_bytes(body, MAX_BUNDLE_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body: more than {MAX_BUNDLE_BYTES} bytes, or not read whole: {e}"),
            )
        }
    };
    let id = session_id();
    let Prepared {
        spec,
        files,
        assets,
        session: mut s,
        plugin_id,
        set_id,
    } = match prepare_creation(&sessions, &id, &body) {
        Ok(p) => p,
        Err((status, m)) => return error(status, m),
    };
    let now = sessions.clock.now_ms();
    for p in &spec.players {
        let ps = match player_spec(&sessions, p, &plugin_id, &set_id).await {
            Ok(ps) => ps,
            Err((st, m)) => return error(st, m),
        };
        if let Err(e) = s.add_player(ps, now) {
            return error(StatusCode::BAD_REQUEST, format!("players: {e}"));
        }
    }
    let host_token = Token::generate();
    let players = player_tokens(&[], spec.players.iter().map(|p| p.id.clone()));
    let stored = StoredSession {
        id: id.clone(),
        host_token: host_token.as_str().to_owned(),
        created_at_ms: now,
        spec: serde_json::to_string(&spec).unwrap_or_default(),
    };
    // The session exists only once durable, with its tokens and files: a
    // continue after a restart needs them.
    let mut writes = vec![
        SessionWrite::Session(stored),
        KeptState::of(&s, now).write(&id),
    ];
    writes.extend(players.iter().map(|(p, t)| SessionWrite::PlayerToken {
        session_id: id.clone(),
        player_id: p.clone(),
        token: t.as_str().to_owned(),
    }));
    writes.extend(files.into_iter().map(|(file, bytes)| SessionWrite::Asset {
        session_id: id.clone(),
        file,
        bytes,
    }));
    // Through the sessions' one store writer, in order with the session's
    // later records.
    if !sessions.writer().write_durable(&id, writes).await {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store: the session could not be stored; try again",
        );
    }
    let player_tokens = tokens_json(&players);
    let auth = Auth {
        host: host_token.clone(),
        players,
    };
    if actor::spawn(&sessions, s, auth, assets, Default::default()).is_none() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server holds too many sessions",
        );
    }
    json_response(
        StatusCode::CREATED,
        &json!({"sessionId": id, "hostToken": host_token.as_str(), "playerTokens": player_tokens,
                "pluginId": plugin_id, "setId": set_id}),
    )
}

/// The stored session if the request carries its host token.
async fn authorized(
    sessions: &Arc<Sessions>,
    id: &str,
    presented: &Presented,
) -> Result<StoredSession, Response> {
    let store = sessions.store();
    let key = id.to_owned();
    let stored = tokio::task::spawn_blocking(move || store.load_session(&key))
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

async fn admin(sessions: &Arc<Sessions>, id: &str, op: Admin) -> Response {
    // After a restart the session comes back at its first use.
    let Some(h) = restore::running(sessions, id).await else {
        return error(
            StatusCode::CONFLICT,
            "the session is not running (its game has finished, or it stopped: continue it)",
        );
    };
    let (tx, rx) = oneshot::channel();
    if h.tx.send(Cmd::Admin(Box::new(op), tx)).await.is_err() {
        return error(StatusCode::CONFLICT, "the session has closed");
    }
    match rx.await {
        Ok(Ok(v)) => json_response(StatusCode::OK, &v),
        Ok(Err((status, m))) => error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            m,
        ),
        Err(_) => error(StatusCode::CONFLICT, "the session has closed"),
    }
}

async fn status(
    State(sessions): State<Arc<Sessions>>,
    Path(id): Path<String>,
    presented: Presented,
) -> Response {
    let stored = match authorized(&sessions, &id, &presented).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if restore::running(&sessions, &id).await.is_some() {
        return admin(&sessions, &id, Admin::Status).await;
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
async fn stored_result(sessions: &Sessions, id: &str) -> Option<Value> {
    let store = sessions.store();
    let id = id.to_owned();
    tokio::task::spawn_blocking(move || store.load_result(&id))
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
}

macro_rules! simple {
    ($name:ident, $op:expr) => {
        async fn $name(
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

async fn add_player(
    State(sessions): State<Arc<Sessions>>,
    Path(id): Path<String>,
    presented: Presented,
    body: axum::body::Bytes,
) -> Response {
    let stored = match authorized(&sessions, &id, &presented).await {
        Ok(s) => s,
        Err(r) => return r,
    };
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
    let stored = tokio::task::spawn_blocking(move || store.load_player_tokens(&sid)).await;
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

fn plugin_and_set(spec: &CreateSession) -> Result<(String, String), Response> {
    let m = read_plugin_manifest(&spec.plugin_html).map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("pluginHtml: {e}"),
        )
    })?;
    let set = spec
        .set
        .meta_fields()
        .ok()
        .and_then(|m| m.id?.as_str().map(str::to_owned))
        .unwrap_or_default();
    Ok((m.id, set))
}

/// The longest `locale` (a BCP 47 tag: letters, digits and `-`).
pub const MAX_LOCALE_BYTES: usize = 35;

fn check_locale(locale: &str) -> Result<(), String> {
    let ok = (1..=MAX_LOCALE_BYTES).contains(&locale.len())
        && locale
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "locale: a BCP 47 tag of 1 to {MAX_LOCALE_BYTES} letters, digits and '-', not {:?}",
            locale.chars().take(40).collect::<String>()
        ))
    }
}

/// `PATCH /{id}/players/{player}` with `{"name"}`.
async fn rename(
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

/// `PUT /{id}/config` with `{"locale","theme"}`.
async fn set_config(
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

/// `GET /{id}/recording`: the running session's record, or the one kept.
async fn recording(
    State(sessions): State<Arc<Sessions>>,
    Path(id): Path<String>,
    presented: Presented,
) -> Response {
    if let Err(r) = authorized(&sessions, &id, &presented).await {
        return r;
    }
    if restore::running(&sessions, &id).await.is_some() {
        return admin(&sessions, &id, Admin::Recording).await;
    }
    let store = sessions.store();
    let key = id.clone();
    match tokio::task::spawn_blocking(move || store.load_recording(&key)).await {
        Ok(Ok(Some(text))) => {
            let mut r = text.into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
            r
        }
        Ok(Ok(None)) => error(StatusCode::NOT_FOUND, "recording: none was kept"),
        Ok(Err(e)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store: {}", e.reason()),
        ),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn kick(
    State(sessions): State<Arc<Sessions>>,
    Path((id, player)): Path<(String, String)>,
    presented: Presented,
) -> Response {
    if let Err(r) = authorized(&sessions, &id, &presented).await {
        return r;
    }
    admin(&sessions, &id, Admin::Kick(player)).await
}

/// A saved game as the store holds it (the JSON `SavedGame` writes).
pub(super) fn saved_game(text: &str) -> Option<SavedGame> {
    let v: Value = serde_json::from_str(text).ok()?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let players = v
        .get("players")?
        .as_array()?
        .iter()
        .map(|p| {
            Some(SavedPlayer {
                id: p.get("id")?.as_str()?.to_owned(),
                name: p.get("name")?.as_str()?.to_owned(),
                is_host: p.get("isHost")?.as_bool()?,
                user: p.get("user")?.as_str()?.to_owned(),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(SavedGame {
        session_id: s("sessionId")?,
        plugin_id: s("pluginId")?,
        set_id: s("setId")?,
        mode: serde_json::from_value(v.get("mode")?.clone()).ok()?,
        host_as: serde_json::from_value(v.get("hostAs")?.clone()).ok()?,
        settings: v.get("settings")?.as_object()?.clone(),
        display_seed: s("displaySeed")?,
        players,
        snapshot: s("snapshot"),
        game_time_ms: v.get("gameTimeMs")?.as_f64()?,
    })
}

async fn continue_saved(
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
