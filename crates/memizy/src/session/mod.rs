//! A Memizy session hosted by a server (SPEC sections 3 to 8), sans-IO.
//!
//! The server feeds events in (an instance attaches, a Host API call
//! arrives, a record became durable, a service answered, time passed) with
//! the current time, and polls outputs out: replies to calls, Plugin API
//! calls for instances, records to persist, service calls to run, events
//! for the host's own UI. Nothing here touches a socket, a task, a file or
//! the wall clock.
//!
//! ```text
//! server                               Session
//!   attach / detach / handle_call  ->  rules of SPEC 3-8
//!   record_durable / service_done  ->
//!   handle_timeout(now)            ->
//!   poll_output()                  <-  Reply, Call, Persist, Service, Close, Event
//!   poll_timeout()                 <-  when to call handle_timeout next
//! ```
//!
//! A server drives it through [`DurableSession`] (`durable.rs`): the
//! records become writes answered by acknowledgement, and the answers
//! that wait for one (a kept change, a saved game) are held until then.

pub mod assets;
pub mod durable;
mod engine;
pub mod leitner;
pub mod services;

pub use assets::{catalog, AssetCatalog, BundledFile};
pub use durable::{DurableSession, Expiry, PendingWrite, SessionOutput, SessionRecord, WriteId};
pub use engine::{PlayerStats, Session};
pub use leitner::{Leitner, ProgressRecord, Scheduler};
pub use services::{ServiceRegistry, ServiceSpec};

use crate::errors::ProtocolError;
use crate::limits::{Limits, LIMITS};
use crate::manifest::PluginRuntime;
use crate::types::*;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The server's id of one plugin instance (one iframe on one device).
pub type InstanceId = u64;
/// The server's id of one Host API call of an instance (its RPC id).
pub type CallId = u64;
/// The id of a record handed to the server to persist.
pub type RecordId = u64;
/// The id of a service call handed to the server to run.
pub type ServiceCallId = u64;

/// `countdown` of SPEC 3.3 when none is configured.
pub const DEFAULT_COUNTDOWN_MS: u64 = 3_000;
/// The host-defined readiness timeout of SPEC 3.3 ("e.g. 15 s").
pub const DEFAULT_READY_TIMEOUT_MS: u64 = 15_000;
/// How long the authority may be away before `sessionEnded('host-left')`
/// (SPEC 6.1 leaves it to the host).
pub const DEFAULT_AUTHORITY_AWAY_MS: u64 = 5 * 60 * 1000;
/// How long the instances stay open after `end(result)` before the host
/// closes them with `sessionEnded('finished')`.
pub const DEFAULT_FINISHED_CLOSE_MS: u64 = 10_000;

/// Calls of one instance waiting for an answer (a durable write, a
/// service); one more is `RATE_LIMITED`.
pub const MAX_PENDING_CALLS_PER_INSTANCE: usize = 64;
/// Plugin API calls queued for one instance and not yet polled; one more
/// closes the instance as a slow consumer.
pub const MAX_QUEUED_CALLS_PER_INSTANCE: usize = 1_024;
/// Outputs of a session not yet polled; a call that would queue more is
/// refused with `INTERNAL_ERROR` (the plugin may retry).
pub const MAX_QUEUED_OUTPUTS_PER_SESSION: usize = 65_536;
/// Records handed to the store and not yet reported durable or failed; a
/// write beyond it is refused with `INTERNAL_ERROR`.
pub const MAX_RECORDS_IN_FLIGHT: usize = 1_024;
/// Instances attached to one session at once (the SPEC's 200 players, a
/// board, a settings screen, and room for reconnects).
pub const MAX_INSTANCES_PER_SESSION: usize = 256;
/// Players on one roster: the manifest's `players.max` is at most 200.
pub const MAX_PLAYERS_PER_SESSION: usize = 200;
/// A player's display name, in UTF-16 units (as the relay's).
pub const MAX_PLAYER_NAME_LENGTH: usize = 32;

/// The host's times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTiming {
    pub ready_timeout_ms: u64,
    pub countdown_ms: u64,
    pub authority_away_ms: u64,
    pub finished_close_ms: u64,
}

impl Default for SessionTiming {
    fn default() -> Self {
        Self {
            ready_timeout_ms: DEFAULT_READY_TIMEOUT_MS,
            countdown_ms: DEFAULT_COUNTDOWN_MS,
            authority_away_ms: DEFAULT_AUTHORITY_AWAY_MS,
            finished_close_ms: DEFAULT_FINISHED_CLOSE_MS,
        }
    }
}

/// The bounds of a session's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBounds {
    pub pending_calls_per_instance: usize,
    pub queued_calls_per_instance: usize,
    pub queued_outputs_per_session: usize,
    pub records_in_flight: usize,
}

impl Default for QueueBounds {
    fn default() -> Self {
        Self {
            pending_calls_per_instance: MAX_PENDING_CALLS_PER_INSTANCE,
            queued_calls_per_instance: MAX_QUEUED_CALLS_PER_INSTANCE,
            queued_outputs_per_session: MAX_QUEUED_OUTPUTS_PER_SESSION,
            records_in_flight: MAX_RECORDS_IN_FLIGHT,
        }
    }
}

/// The assets `getAsset` resolves: item assets first, then set assets
/// (SPEC 5), each key (lowercase) with its size in bytes. [`catalog`]
/// builds it from a set and the bundle's files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssetIndex {
    pub set: BTreeMap<String, usize>,
    pub items: BTreeMap<String, BTreeMap<String, usize>>,
}

/// Everything a session is made from.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub id: String,
    pub mode: Mode,
    /// Required in multiplayer, `None` in solo.
    pub host_as: Option<HostAs>,
    /// The manifest `id`: plugin data belongs to a user and this id.
    pub plugin_id: String,
    pub runtime: PluginRuntime,
    /// The set as its text: the session keeps it prepared, never as a tree.
    pub set: SetText,
    /// The manifest's `capabilities.types` (`"*"` declares all): only items
    /// of these types reach the plugin (SPEC 4.2). `None` when the manifest
    /// declares none: every item is kept.
    pub item_types: Option<Vec<String>>,
    /// The set's id, the key of plugin data in scope `set` and of progress.
    pub set_id: String,
    /// The display-order seed (SPEC 4.4); the session id when `None`.
    pub display_seed: Option<String>,
    pub assets: AssetIndex,
    /// Setting values chosen before the session (a form); defaults fill the rest.
    pub settings: Map<String, Value>,
    pub config: HostConfig,
    pub services: ServiceRegistry,
    pub limits: Limits,
    pub timing: SessionTiming,
    pub bounds: QueueBounds,
    pub host: NameVersion,
    /// `Date.now() + offsetMs = session time`: what the server adds to its
    /// own clock.
    pub clock_offset_ms: f64,
    pub scheduler: Arc<dyn Scheduler>,
}

impl SessionConfig {
    /// A configuration with the SPEC's minimums and the default times.
    pub fn new(
        id: impl Into<String>,
        mode: Mode,
        host_as: Option<HostAs>,
        plugin_id: impl Into<String>,
        runtime: PluginRuntime,
        set: impl Into<SetText>,
    ) -> Self {
        Self {
            id: id.into(),
            mode,
            host_as,
            plugin_id: plugin_id.into(),
            runtime,
            set: set.into(),
            item_types: None,
            set_id: String::new(),
            display_seed: None,
            assets: AssetIndex::default(),
            settings: Map::new(),
            config: HostConfig {
                locale: "en".into(),
                theme: Theme::Light,
            },
            services: ServiceRegistry::new(),
            limits: LIMITS,
            timing: SessionTiming::default(),
            bounds: QueueBounds::default(),
            host: NameVersion {
                name: "hostwire".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
            clock_offset_ms: 0.0,
            scheduler: Arc::new(Leitner),
        }
    }
}

/// A player as the server adds it, with what the store holds for it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlayerSpec {
    pub id: String,
    pub name: String,
    pub is_host: bool,
    /// The account the player's plugin data and progress belong to.
    pub user: String,
    /// Learning progress of the user for this set, by item id.
    pub progress: Map<String, Value>,
    /// Plugin data of the user for this plugin (`null` = nothing saved).
    pub data: PluginDataValues,
}

impl PlayerSpec {
    pub fn new(id: impl Into<String>, name: impl Into<String>) -> Self {
        let id = id.into();
        Self {
            user: id.clone(),
            id,
            name: name.into(),
            is_host: false,
            progress: Map::new(),
            data: PluginDataValues {
                plugin: Value::Null,
                set: Value::Null,
            },
        }
    }

    pub fn host(mut self) -> Self {
        self.is_host = true;
        self
    }
}

/// A game that has not ended, saved to be continued (SPEC 3.3).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedGame {
    pub session_id: String,
    pub plugin_id: String,
    pub set_id: String,
    pub mode: Mode,
    pub host_as: Option<HostAs>,
    pub settings: Map<String, Value>,
    pub display_seed: String,
    pub players: Vec<SavedPlayer>,
    /// The authority's last snapshot (JSON text).
    pub snapshot: Option<String>,
    /// Game time when saved; the continued session resumes from it.
    pub game_time_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedPlayer {
    pub id: String,
    pub name: String,
    pub is_host: bool,
    pub user: String,
}

/// Where a session is in SPEC 3.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Lobby,
    Loading,
    Countdown {
        ends_at_ms: u64,
    },
    Running,
    /// `end(result)` was called; the instances are still open.
    Finished,
    /// Every instance got `sessionEnded`.
    Closed,
}

/// What a reply to a Host API call carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `hello`.
    Init(Box<InitPayload>),
    /// A `void` method.
    Done,
    /// `getAsset`: send the bytes of this asset (resolved and within the
    /// limit): the key (lowercase) of the item's assets, or of the set's
    /// when `item_id` is `None`.
    Asset {
        key: String,
        item_id: Option<String>,
    },
    /// `service`: the service's result (JSON text).
    Service(Arc<str>),
}

/// A Plugin API call (SPEC 7) for one instance: the method and its
/// arguments as a JSON array, shared between the instances that get the
/// same one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginCallOut {
    pub method: &'static str,
    pub args: Arc<str>,
}

/// Why the server closes an instance's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// It got `sessionEnded(reason)`.
    SessionEnded(SessionEndReason),
    /// It did not call `hello` in time (SPEC 4: the host shows an error).
    HelloTimeout,
    /// It did not take its calls fast enough (its queue was full).
    SlowConsumer,
    /// A new instance took its address (a reconnect).
    Replaced,
}

/// Learning progress and statistics of one answer, to persist.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnswerWrite {
    pub session_id: String,
    pub plugin_id: String,
    pub set_id: String,
    pub player_id: String,
    pub user: String,
    pub item_id: String,
    pub is_correct: bool,
    pub is_skipped: bool,
    /// Generated items count in statistics, not in the schedule.
    pub generated: bool,
    /// The OQSE `skills` and `tags` of the item (from the content).
    pub skills: Vec<String>,
    pub tags: Vec<String>,
    /// What the player answered (JSON text).
    pub answer: Option<String>,
    pub answered_at_ms: u64,
    /// The new progress record of a set item; `None` for a generated one.
    pub progress: Option<ProgressRecord>,
}

/// A record the server persists and then reports durable or failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Snapshot {
        session_id: String,
        snapshot: Arc<str>,
    },
    /// After `end(result)`: a finished game is not resumed.
    SnapshotDiscarded {
        session_id: String,
    },
    PluginData {
        user: String,
        plugin_id: String,
        scope: DataScope,
        /// The set of scope `set`; `None` for scope `plugin`.
        set_id: Option<String>,
        value: Arc<str>,
    },
    Answer(Box<AnswerWrite>),
    Result {
        session_id: String,
        result: SessionResult,
        at_ms: u64,
    },
    SavedGame(Box<SavedGame>),
}

/// A service call for the server to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceRequest {
    pub id: ServiceCallId,
    pub instance: InstanceId,
    pub player: Option<String>,
    pub name: String,
    pub payload: Box<str>,
    /// When the engine fails it on its own if no answer came.
    pub deadline_ms: u64,
}

/// What the host's own UI (lobby, teacher's screen, logs) learns.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    Phase(Phase),
    Countdown {
        ends_at_ms: u64,
    },
    SettingsChanged {
        values: Map<String, Value>,
        valid: bool,
        message: Option<String>,
    },
    AuthorityAway,
    AuthorityBack,
    Ended {
        result: SessionResult,
    },
    ErrorReport {
        instance: InstanceId,
        address: Address,
        report: ErrorReport,
    },
}

/// What the server does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Reply {
        instance: InstanceId,
        call: CallId,
        result: Result<Reply, ProtocolError>,
    },
    Call {
        instance: InstanceId,
        call: PluginCallOut,
    },
    Close {
        instance: InstanceId,
        reason: CloseReason,
    },
    Persist {
        id: RecordId,
        record: Record,
    },
    Service(ServiceRequest),
    /// A service call that no longer has a caller; stop it.
    CancelService {
        id: ServiceCallId,
    },
    Event(SessionEvent),
}

/// A server's misuse of a session (not a plugin's: those get a
/// [`ProtocolError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("invalid session configuration: {0}")]
    Config(String),
    #[error("{0} is not possible in this phase")]
    WrongPhase(&'static str),
    #[error("no player {0:?} in this session")]
    UnknownPlayer(String),
    #[error("player {0:?} is already in this session")]
    DuplicatePlayer(String),
    #[error("the roster is full ({0} players)")]
    RosterFull(usize),
    #[error("this game does not allow late joining")]
    LateJoinNotAllowed,
    #[error("player name: {0}")]
    InvalidName(String),
    #[error("the settings are not valid: {0}")]
    SettingsInvalid(String),
    #[error("{0} players needed, {1} present")]
    NotEnoughPlayers(u32, usize),
    #[error("instance {0} is already attached")]
    DuplicateInstance(InstanceId),
    #[error("too many instances ({0})")]
    TooManyInstances(usize),
    #[error("view {view} at address {address:?}: {problem}")]
    BadAttach {
        view: &'static str,
        address: String,
        problem: &'static str,
    },
}
