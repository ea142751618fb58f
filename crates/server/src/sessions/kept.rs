//! What is kept of a hosted session's phase, roster and settings at each
//! acknowledged change (a [`KeptState`] row), and what a restart reads
//! back (`restore.rs`).

use super::api::CreateSession;
use hostwire_memizy::session::{Phase, SavedGame, Session};
use hostwire_memizy::HostConfig;
use hostwire_store::sessions::SessionWrite;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Where a kept session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeptPhase {
    Lobby,
    /// Started (loading, counting down, running or finished without a
    /// result yet): it comes back running, paused.
    Started,
    /// Its task stopped before the restart (the authority stayed away):
    /// it comes back on `continue` only.
    Closed,
}

/// A player as kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptPlayer {
    pub id: String,
    pub name: String,
    pub is_host: bool,
    pub user: String,
}

/// What a restart brings a session back as (the store's `State` row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptState {
    pub phase: KeptPhase,
    pub players: Vec<KeptPlayer>,
    pub settings: Map<String, Value>,
    #[serde(default = "valid")]
    pub settings_valid: bool,
    #[serde(default)]
    pub settings_message: Option<String>,
    /// Game time when the row was written.
    pub game_time_ms: f64,
    /// The host configuration (locale, theme), when it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<HostConfig>,
}

fn valid() -> bool {
    true
}

impl KeptState {
    /// The session as it is now.
    pub fn of(s: &Session, now_ms: u64) -> KeptState {
        let game = s.current_game(now_ms);
        let (_, valid, message) = s.settings();
        KeptState {
            phase: match s.phase() {
                Phase::Lobby => KeptPhase::Lobby,
                Phase::Closed => KeptPhase::Closed,
                _ => KeptPhase::Started,
            },
            players: game
                .players
                .into_iter()
                .map(|p| KeptPlayer {
                    id: p.id,
                    name: p.name,
                    is_host: p.is_host,
                    user: p.user,
                })
                .collect(),
            settings: game.settings,
            settings_valid: valid,
            settings_message: message.map(str::to_owned),
            game_time_ms: game.game_time_ms,
            config: Some(s.host_config().clone()),
        }
    }

    /// The store's write of this state.
    pub fn write(&self, session_id: &str) -> SessionWrite {
        SessionWrite::State {
            session_id: session_id.to_owned(),
            state: serde_json::to_string(self).unwrap_or_default(),
        }
    }

    /// A session from before states were kept: a saved game's, else the
    /// lobby its creation made.
    pub(super) fn of_old(spec: &CreateSession, saved: Option<&SavedGame>) -> KeptState {
        match saved {
            Some(g) => KeptState {
                phase: KeptPhase::Closed,
                players: g
                    .players
                    .iter()
                    .map(|p| KeptPlayer {
                        id: p.id.clone(),
                        name: p.name.clone(),
                        is_host: p.is_host,
                        user: p.user.clone(),
                    })
                    .collect(),
                settings: g.settings.clone(),
                settings_valid: true,
                settings_message: None,
                game_time_ms: g.game_time_ms,
                config: None,
            },
            None => KeptState {
                phase: KeptPhase::Lobby,
                players: spec
                    .players
                    .iter()
                    .map(|p| KeptPlayer {
                        id: p.id.clone(),
                        name: p.name.clone(),
                        is_host: p.is_host,
                        user: p.user.clone().unwrap_or_else(|| p.id.clone()),
                    })
                    .collect(),
                settings: spec.settings.clone(),
                settings_valid: true,
                settings_message: None,
                game_time_ms: 0.0,
                config: None,
            },
        }
    }
}
