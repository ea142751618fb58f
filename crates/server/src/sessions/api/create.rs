//! `POST /memizy/sessions`: a creation request decoded and checked, its
//! players' tokens and stored data, the session stored durably and started.

use super::error;
use super::spec::{config, decode_assets, CreateSession, PlayerIn};
use crate::http::error::json_response;
use crate::http::Presented;
use crate::sessions::actor::{self, Auth};
use crate::sessions::restore::KeptState;
use crate::sessions::{Sessions, MAX_BUNDLE_BYTES};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hostwire_core::token::Token;
use hostwire_memizy::session::{AssetCatalog, PlayerSpec, Session};
use hostwire_memizy::PluginDataValues;
use hostwire_store::sessions::{SessionWrite, StoredSession};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A session id: 128 random bits, as hex.
pub(super) fn session_id() -> String {
    let b = hostwire_core::token::random_bytes::<16>();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Mints a token per player, keeping the ones the store already holds.
pub(in crate::sessions) fn player_tokens(
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

pub(super) fn tokens_json(tokens: &HashMap<String, Token>) -> Value {
    let m: BTreeMap<&str, &str> = tokens
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    json!(m)
}

/// A player with the progress and plugin data the store holds for it.
pub(in crate::sessions) async fn player_spec(
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
    let loaded = crate::blocking::spawn(move || {
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

pub(super) async fn create(
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
    // The session exists only once durable, with its tokens and files: a
    // continue after a restart needs them.
    let writes = creation_writes(&id, &spec, &host_token, &s, now, &players, files);
    // On a cluster the session is this node's (its lease taken) before its
    // creation is written, and its writes carry the generation.
    let kind = hostwire_store::lease::UnitKind::HostedSession;
    if let Some(leases) = sessions.leases() {
        if !matches!(leases.acquire(kind, &id).await, Ok(Ok(_))) {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the session's lease could not be taken; try again",
            );
        }
    }
    // Through the sessions' one store writer, in order with the session's
    // later records.
    if !sessions.writer().write_durable(&id, writes).await {
        if let Some(leases) = sessions.leases() {
            leases.release(kind, &id).await;
        }
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
        if let Some(leases) = sessions.leases() {
            leases.release(kind, &id).await;
        }
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

/// What a new session's creation writes, as one unit: the session with its
/// host token, its kept state, each player's token and the bundle's files.
fn creation_writes(
    id: &str,
    spec: &CreateSession,
    host_token: &Token,
    s: &Session,
    now: u64,
    players: &HashMap<String, Token>,
    files: std::collections::BTreeMap<String, Vec<u8>>,
) -> Vec<SessionWrite> {
    let stored = StoredSession {
        id: id.to_owned(),
        host_token: host_token.as_str().to_owned(),
        created_at_ms: now,
        spec: serde_json::to_string(spec).unwrap_or_default(),
    };
    let mut writes = vec![
        SessionWrite::Session(stored),
        KeptState::of(s, now).write(id),
    ];
    writes.extend(players.iter().map(|(p, t)| SessionWrite::PlayerToken {
        session_id: id.to_owned(),
        player_id: p.clone(),
        token: t.as_str().to_owned(),
    }));
    writes.extend(files.into_iter().map(|(file, bytes)| SessionWrite::Asset {
        session_id: id.to_owned(),
        file,
        bytes,
    }));
    writes
}
