//! What a Memizy relay room keeps across a restart: the records the relay's
//! rules (`hostwire_memizy::relay`) produce and a store
//! (`hostwire_store`) holds. A crate of its own so that a store needs
//! neither the protocol crate nor what it depends on (an HTML parser).

// No unsafe code here: what needs it lives in hostwire-core, where Miri
// checks it.
#![forbid(unsafe_code)]

use bytes::Bytes;

/// A player as it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlayerRecord {
    pub id: String,
    pub name: String,
    pub token: String,
}

/// The uploaded bundle's metadata (the text itself is stored beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleMeta {
    pub version: u64,
    pub app_name: Option<String>,
}

/// Everything a room needs to go on after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomRecord {
    pub pin: String,
    pub host_token: String,
    pub created_at_ms: u64,
    pub host_away_since_ms: Option<u64>,
    pub open: bool,
    pub players: Vec<PlayerRecord>,
    pub kicked_tokens: Vec<String>,
    pub bundle: Option<BundleMeta>,
}

/// A durable change of a room. A room's changes are written in the order
/// they were made; a change a client is told about is durable first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoomChange {
    Created(RoomRecord),
    HostAway {
        pin: String,
        since_ms: Option<u64>,
    },
    Open {
        pin: String,
        open: bool,
    },
    Player {
        pin: String,
        player: PlayerRecord,
    },
    Kicked {
        pin: String,
        player_id: String,
        token: String,
    },
    Bundle {
        pin: String,
        meta: BundleMeta,
        text: Bytes,
    },
    Deleted {
        pin: String,
    },
}

impl RoomChange {
    /// The room the change is of.
    pub fn pin(&self) -> &str {
        match self {
            RoomChange::Created(r) => &r.pin,
            RoomChange::HostAway { pin, .. }
            | RoomChange::Open { pin, .. }
            | RoomChange::Player { pin, .. }
            | RoomChange::Kicked { pin, .. }
            | RoomChange::Bundle { pin, .. }
            | RoomChange::Deleted { pin } => pin,
        }
    }
}
