//! What the API reads: a creation request's body and the session
//! configuration made from it, a locale, a saved game as the store holds it.

// Handlers return their error `Response` directly.
#![allow(clippy::result_large_err)]

use super::error;
use crate::sessions::Sessions;
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine;
use hostwire_memizy::manifest::read_plugin_manifest;
use hostwire_memizy::session::{
    catalog, AssetCatalog, SavedGame, SavedPlayer, SessionConfig, SessionTiming,
};
use hostwire_memizy::{HostAs, HostConfig, Mode};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

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

/// The session's configuration from its creation request; `files` are the
/// bundle's files and their sizes.
pub(in crate::sessions) fn config(
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
pub(super) fn decode_assets(spec: &CreateSession) -> Result<BTreeMap<String, Vec<u8>>, String> {
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

pub(super) fn plugin_and_set(spec: &CreateSession) -> Result<(String, String), Response> {
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

pub(super) fn check_locale(locale: &str) -> Result<(), String> {
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

/// A saved game as the store holds it (the JSON `SavedGame` writes).
pub(in crate::sessions) fn saved_game(text: &str) -> Option<SavedGame> {
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
