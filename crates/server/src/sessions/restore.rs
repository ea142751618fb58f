//! What a restart brings a hosted session back as, and bringing it back.
//!
//! Each acknowledged change of a session's phase, roster or settings is
//! kept as a [`KeptState`] row (written before the change is answered);
//! the authority's latest snapshot is kept on its own, with the game time
//! it was written at. After a restart a session comes back lazily, at its
//! first use (an HTTP API call or a device attaching): a lobby as a lobby,
//! a started game from its latest snapshot (paused, as a continued game),
//! a game that ended (a result is stored) not at all: it answers as
//! finished. A session whose task had stopped before the restart (its
//! authority away too long) stays stopped until `continue`.

use super::actor::{self, Auth, SessionHandle};
use super::api::{config, player_spec, player_tokens, saved_game, CreateSession, PlayerIn};
use super::recording::Recorder;
use super::Sessions;
use crate::cluster::leases::TakeOver;
use axum::http::StatusCode;
use hostwire_core::token::Token;
use hostwire_memizy::session::{AssetCatalog, SavedGame, SavedPlayer, Session};
use hostwire_store::lease::UnitKind;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use super::kept::{KeptPhase, KeptPlayer, KeptState};

/// The running task of session `id`, brought back from the store if it is
/// not running and was not stopped (`Ok(None)`: no such session, its game
/// has finished, it was stopped, or it could not be brought back). On a
/// cluster it is taken over if its lease is free; `Err` (503) while
/// another live node holds it, or when the store cannot say.
pub async fn running(sessions: &Arc<Sessions>, id: &str) -> Result<Option<SessionHandle>, Failed> {
    if let Some(h) = sessions.handle(id) {
        return Ok(Some(h));
    }
    if let Some(leases) = sessions.leases() {
        // Read first: an id guessed must not leave a lease row behind.
        if !stored(sessions, id).await? {
            return Ok(None);
        }
        return match leases.take_over(UnitKind::HostedSession, id).await {
            TakeOver::Serving => Ok(sessions.handle(id)),
            TakeOver::Gone => Ok(None),
            TakeOver::Elsewhere(held) => {
                tracing::debug!(session = %id, owner = %held.owner, "hosted session served by another node");
                Err(elsewhere())
            }
            TakeOver::Failed => Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "store: the session could not be taken over; try again".to_owned(),
            )),
        };
    }
    match restore_here(sessions, id, false).await {
        Ok(h) => Ok(h),
        Err((_, why)) => {
            tracing::warn!(session = %id, %why, "hosted session not brought back");
            Ok(None)
        }
    }
}

/// The answer for a session another live node serves.
fn elsewhere() -> Failed {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the session is served by another node; try again".to_owned(),
    )
}

/// Whether the store has session `id`.
async fn stored(sessions: &Sessions, id: &str) -> Result<bool, Failed> {
    let store = sessions.store();
    let key = id.to_owned();
    crate::blocking::spawn(move || store.load_session(&key))
        .await
        .map_err(store_failed)?
        .map(|s| s.is_some())
        .map_err(|e| store_failed(e.reason()))
}

type Failed = (StatusCode, String);

fn store_failed(e: impl std::fmt::Display) -> Failed {
    (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}"))
}

/// What the store keeps of one session, read in one go.
struct Loaded {
    stored: hostwire_store::sessions::StoredSession,
    state: Option<String>,
    saved: Option<String>,
    snapshot: Option<(String, Option<u64>)>,
    files: Vec<(String, usize)>,
    tokens: Vec<(String, String)>,
    recording: Option<hostwire_store::sessions::StoredRecording>,
}

/// Reads session `id` from the store on a blocking thread. `Ok(None)`: no
/// such session, or its game has finished (a result is stored).
async fn load(sessions: &Sessions, id: &str) -> Result<Option<Loaded>, Failed> {
    let store = sessions.store();
    let key = id.to_owned();
    crate::blocking::spawn(move || {
        let Some(stored) = store.load_session(&key)? else {
            return Ok(None);
        };
        if store.load_result(&key)?.is_some() {
            return Ok(None);
        }
        let state = store.load_state(&key)?;
        let saved = match state {
            Some(_) => None,
            None => store.load_saved_game(&key)?,
        };
        Ok::<_, hostwire_store::StoreError>(Some(Loaded {
            stored,
            state,
            saved,
            snapshot: store.load_snapshot_at(&key)?,
            files: store.list_assets(&key)?,
            tokens: store.load_player_tokens(&key)?,
            recording: store.load_recording(&key)?,
        }))
    })
    .await
    .map_err(store_failed)?
    .map_err(|e| store_failed(e.reason()))
}

fn unreadable(what: &str) -> Failed {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{what} cannot be read"),
    )
}

/// Brings session `id` back from the store as its last acknowledged state
/// and starts its task; a stopped one too when `stopped_too` (`continue`).
/// `Ok(None)`: no such session, or its game has finished. On a cluster
/// under its lease, taken first (503 while another live node holds it).
pub async fn restore(
    sessions: &Arc<Sessions>,
    id: &str,
    stopped_too: bool,
) -> Result<Option<SessionHandle>, Failed> {
    let Some(leases) = sessions.leases() else {
        return restore_here(sessions, id, stopped_too).await;
    };
    if let Some(h) = sessions.handle(id) {
        return Ok(Some(h));
    }
    let kind = UnitKind::HostedSession;
    if leases.generation(kind, id).is_none() {
        match leases.acquire(kind, id).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return Err(elsewhere()),
            Err(e) => return Err(store_failed(e.reason())),
        }
    }
    let r = restore_here(sessions, id, stopped_too).await;
    if !matches!(r, Ok(Some(_))) {
        leases.release(kind, id).await;
    }
    r
}

/// [`restore`] on this node, whose lease (on a cluster) is held already.
pub(super) async fn restore_here(
    sessions: &Arc<Sessions>,
    id: &str,
    stopped_too: bool,
) -> Result<Option<SessionHandle>, Failed> {
    // One at a time: two first uses of a session bring it back once.
    let _one = sessions.restoring.lock().await;
    if let Some(h) = sessions.handle(id) {
        return Ok(Some(h));
    }
    let Some(loaded) = load(sessions, id).await? else {
        return Ok(None);
    };
    let spec: CreateSession =
        serde_json::from_str(&loaded.stored.spec).map_err(|_| unreadable("the stored session"))?;
    let saved = match &loaded.saved {
        Some(t) => Some(saved_game(t).ok_or_else(|| unreadable("the saved game"))?),
        None => None,
    };
    let state = match &loaded.state {
        Some(t) => serde_json::from_str::<KeptState>(t)
            .map_err(|_| unreadable("the session's kept state"))?,
        None => KeptState::of_old(&spec, saved.as_ref()),
    };
    if state.phase == KeptPhase::Closed && !stopped_too {
        return Ok(None);
    }
    let s = rebuild(sessions, id, &spec, &state, saved, &loaded).await?;
    let auth = kept_auth(&loaded, &state)?;
    // The recording goes on from what was kept (SPEC 10: one record of
    // the whole game), never replaced by what follows the restart.
    let rec = match loaded.recording.as_ref().map(Recorder::restored) {
        Some(Some(r)) => r,
        Some(None) => {
            tracing::warn!(session = %id, "the kept recording cannot be read: a new one starts");
            Recorder::default()
        }
        None => Recorder::default(),
    };
    tracing::info!(session = %id, phase = ?state.phase, "hosted session brought back");
    let (s, assets) = s;
    actor::spawn(sessions, s, auth, assets, rec)
        .map(Some)
        .ok_or((
            StatusCode::SERVICE_UNAVAILABLE,
            "the server holds too many sessions".to_owned(),
        ))
}

/// The host's token and the kept players' tokens (a kicked player's opens
/// nothing).
fn kept_auth(loaded: &Loaded, state: &KeptState) -> Result<Auth, Failed> {
    let host = Token::parse(&loaded.stored.host_token)
        .ok_or_else(|| unreadable("the stored host token"))?;
    let mut tokens = player_tokens(&loaded.tokens, std::iter::empty());
    tokens.retain(|p, _| state.players.iter().any(|k| k.id == *p));
    Ok(Auth {
        host,
        players: tokens,
    })
}

/// The session as it was last acknowledged: a lobby as a lobby, a started
/// game from its latest snapshot (paused), or started afresh when none was
/// kept; with its assets.
async fn rebuild(
    sessions: &Arc<Sessions>,
    id: &str,
    spec: &CreateSession,
    state: &KeptState,
    saved: Option<SavedGame>,
    loaded: &Loaded,
) -> Result<(Session, AssetCatalog), Failed> {
    let sizes: BTreeMap<String, usize> = loaded.files.iter().cloned().collect();
    let (mut cfg, assets) = config(sessions, id, spec, &sizes)?;
    cfg.settings = state.settings.clone();
    if let Some(c) = &state.config {
        cfg.config = c.clone();
    }
    let (plugin_id, set_id) = (cfg.plugin_id.clone(), cfg.set_id.clone());
    let mut players = Vec::new();
    for p in &state.players {
        let pin = PlayerIn {
            id: p.id.clone(),
            name: p.name.clone(),
            is_host: p.is_host,
            user: Some(p.user.clone()),
        };
        players.push(player_spec(sessions, &pin, &plugin_id, &set_id).await?);
    }
    let now = sessions.clock.now_ms();
    let bad = |e: hostwire_memizy::session::SessionError| (StatusCode::BAD_REQUEST, e.to_string());
    // The latest snapshot (an old file's saved game's when none is kept).
    let (snapshot, snapshot_time) = match &loaded.snapshot {
        Some((text, at)) => (Some(text.clone()), *at),
        None => (saved.as_ref().and_then(|g| g.snapshot.clone()), None),
    };
    let lobby = |cfg, players: Vec<_>| -> Result<Session, Failed> {
        let mut s = Session::new(cfg, now).map_err(bad)?;
        for p in players {
            s.add_player(p, now).map_err(bad)?;
        }
        s.restore_settings_report(state.settings_valid, state.settings_message.clone());
        Ok(s)
    };
    let s = match (state.phase, snapshot) {
        (KeptPhase::Lobby, _) => lobby(cfg, players)?,
        // Started, no snapshot acknowledged: the game starts again (the
        // authority gets `start()` once ready), as nothing of it was kept.
        (_, None) => {
            let mut s = lobby(cfg, players)?;
            if let Err(e) = s.start_game(now) {
                tracing::warn!(session = %id, %e, "a started session came back to its lobby");
            }
            s
        }
        (_, Some(snapshot)) => {
            let game = SavedGame {
                session_id: id.to_owned(),
                plugin_id: plugin_id.clone(),
                set_id: set_id.clone(),
                mode: spec.mode,
                host_as: spec.host_as,
                settings: state.settings.clone(),
                display_seed: saved
                    .as_ref()
                    .map(|g| g.display_seed.clone())
                    .or_else(|| cfg.display_seed.clone())
                    .unwrap_or_else(|| id.to_owned()),
                players: state
                    .players
                    .iter()
                    .map(|p| SavedPlayer {
                        id: p.id.clone(),
                        name: p.name.clone(),
                        is_host: p.is_host,
                        user: p.user.clone(),
                    })
                    .collect(),
                snapshot: Some(snapshot),
                // Game time only goes forward: the later of the two rows.
                game_time_ms: state
                    .game_time_ms
                    .max(snapshot_time.map_or(0.0, |t| t as f64)),
            };
            Session::continue_saved(cfg, &game, players, now).map_err(bad)?
        }
    };
    Ok((s, assets))
}
