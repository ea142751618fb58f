//! The live channel as a state machine (the quinn-proto shape): events go
//! in through `connection_opened`, `frame_received`, `connection_closed`
//! and the agent-side calls; what to do comes out of [`Channel::poll_output`]:
//! frames for connections (serialized once, shared when fanned out),
//! closes with codes, records to persist, and wake-ups for long polls.
//! Time is the caller's `now_ms`; nothing here touches a socket or a clock.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use hostwire_core::TokenBucket;

use crate::buffer::{is_reserved_channel, Ledger, StreamBuffer};
use crate::decode::{
    decode_client_frame, non_negative_integer, parse_stream_spec, peek_request_id, ClientFrame,
    SubscribeRequest, MAX_FRAME_BYTES, MAX_ID_BYTES,
};
use crate::frames::{
    codes, encode_error, encode_frame, frame_types, make_error_payload, AckPayload, ActionEnvelope,
    ChannelErrorPayload, ConsumeEventEntry, ContractErrorPayload, DrainAckPayload, ErrorPayload,
    GguiSessionEvent, PropsUpdatePayload, ReplayPolicy, StreamChannelMode, StreamEnvelope,
    CONTRACT_ERROR_CHANNEL, EVENT_TYPE_DATA_SUBMIT, LEDGER_UI_UPDATED, LEDGER_USER_SUBMITTED,
};
use crate::validate::{
    contract_violation, ActionSpec, ContractViolation, ValidationResult, EVENT_HINT, EVENT_TOOL,
};
use crate::{iso_timestamp, PROTOCOL_SCHEMA_VERSION};

/// The app a session belongs to when nobody names one.
pub const DEFAULT_APP_ID: &str = "conformance";
/// Bound on live sessions.
pub const MAX_SESSIONS: usize = 10_000;
/// Bound on subscribers of one session, unless configured: a class's
/// projector plus a hundred pupils' screens (each with a spare tab or a
/// reconnect under way) fits twice over, while one emit still fans out to
/// a bounded number of queues (the frame is shared, not copied).
pub const MAX_SUBSCRIBERS_PER_SESSION: usize = 256;
/// Frames per second a connection may send, sustained, unless configured:
/// a person's UI sends a few a second, at most one per display refresh
/// (60 a second) while dragging or typing; one socket is one screen, so a
/// class of screens does not share it.
pub const RATE_LIMIT_PER_SECOND: u32 = 100;
/// Frames a connection may send in a burst, unless configured: two
/// seconds of the rate, room for a UI that resends what it queued while
/// it was reconnecting.
pub const RATE_LIMIT_BURST: u32 = 200;
/// Frames dropped in a row for the rate limit before the connection is closed (1008).
pub const RATE_LIMITED_FRAMES_BEFORE_CLOSE: u32 = 1_000;
/// Ledger entries retained per session (older ones pass the replay horizon).
pub const LEDGER_MAX_EVENTS: usize = 10_000;
/// Bytes of ledger frames retained per session.
pub const LEDGER_MAX_BYTES: usize = 16 * 1024 * 1024;
/// Envelopes of `all` channels kept per session.
pub const STREAM_BUFFER_MAX: usize = 256;
/// Bytes of buffered envelopes per session.
pub const STREAM_BUFFER_MAX_BYTES: usize = 16 * 1024 * 1024;
/// Actions submitted and not yet drained by the agent, per session.
pub const MAX_PENDING_ACTIONS: usize = 1_024;
/// Bytes of action data (as JSON text) submitted and not yet drained, per
/// session; an action past it is refused with `APPEND_FAILED`.
pub const MAX_PENDING_ACTION_BYTES: usize = 16 * 1024 * 1024;
/// Ledger entries per replay page.
pub const REPLAY_PAGE_SIZE: usize = 100;
/// The longest an agent's consume may wait for actions.
pub const LONG_POLL_MAX_MS: u64 = 25_000;
/// Channels a stream spec may declare.
pub const MAX_STREAM_CHANNELS: usize = 256;
/// Frames of a session's subscribers held while one of its actions is
/// validated off the channel (see [`ChannelConfig::defer_validation`]);
/// past it (or past [`MAX_HELD_FRAME_BYTES_PER_SESSION`]) a frame is
/// refused with `RATE_LIMITED`. Five full bursts of one connection (the
/// default burst is 200), so a burst within the rate limit is held and
/// answered, not refused; the bytes bound is what bounds memory.
pub const MAX_HELD_FRAMES_PER_SESSION: usize = 1_024;
/// Bytes of frames held per session while one of its actions is validated.
pub const MAX_HELD_FRAME_BYTES_PER_SESSION: usize = 4 * MAX_FRAME_BYTES;
/// An action whose validation costs at most this (its frame's bytes times
/// the most schemas one place of its spec is checked against, see
/// [`ActionSpec::validation_cost`]) is validated inline even when
/// [`ChannelConfig::defer_validation`] is on: handing it to a thread costs
/// more than checking it. A unit costs about 15 ns in a release build, so
/// the budget is about 60 microseconds at worst: 2 KiB of action against a
/// plain schema, 256 bytes against the worst fan-out admitted.
pub const INLINE_VALIDATION_MAX_COST: u64 = 4 * 1024;
/// Milliseconds between the server's pings, which keep idle sockets alive
/// behind proxies.
pub const PING_INTERVAL_MS: u64 = 30_000;
/// Milliseconds a socket may send nothing but pings before it is closed
/// (1001): a peer that vanished must not hold its subscriber slot.
pub const IDLE_TIMEOUT_MS: u64 = 90_000;
/// Close code for a policy violation (auth-free flood, strict version).
pub const CLOSE_POLICY_VIOLATION: u16 = 1008;
/// Close code after `UPGRADE_REQUIRED` under the strict policy.
pub const CLOSE_UPGRADE_REQUIRED: u16 = 1000;
/// Close code of a socket idle for [`IDLE_TIMEOUT_MS`], or when the server
/// goes away.
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// Close code for a connection that was told of changes the store then
/// refused (1011, the server's own error): it subscribes again and is
/// replayed what was stored.
pub const CLOSE_STORE_FAILED: u16 = 1011;
/// Close code for a connection whose session another node of a cluster
/// now serves (1012, "service restart"): it reconnects, and finds the
/// session there.
pub const CLOSE_SESSION_MOVED: u16 = 1012;

/// The reason sent with a close the channel asks for ([`Output::Close`]):
/// a fixed text per code, whatever the message that came with it.
pub fn close_reason(code: u16) -> &'static str {
    match code {
        crate::decode::CLOSE_MESSAGE_TOO_BIG => "frame too large",
        CLOSE_POLICY_VIOLATION => "rate limit exceeded",
        CLOSE_UPGRADE_REQUIRED => "upgrade required",
        CLOSE_GOING_AWAY => "going away",
        CLOSE_SESSION_MOVED => "session moved to another node",
        _ => "closed",
    }
}

/// A long poll's wait: the requested time, at most [`LONG_POLL_MAX_MS`].
pub fn clamp_long_poll_ms(requested_ms: Option<u64>) -> u64 {
    requested_ms
        .unwrap_or(LONG_POLL_MAX_MS)
        .min(LONG_POLL_MAX_MS)
}

/// A connection, named by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConnId(pub u64);

/// What a version mismatch does to the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionPolicy {
    /// `UPGRADE_REQUIRED`, then close.
    Strict,
    /// `UPGRADE_REQUIRED`; the connection stays open.
    Advisory,
}

/// Settings of a channel. Every bound has a default named above.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    pub default_app_id: String,
    /// The version acks advertise (an operator may override it).
    pub advertised_version: String,
    pub version_policy: VersionPolicy,
    /// When set, a connection the server did not authenticate (bearer
    /// header or `?token=`) must present it as the subscribe's `wsToken`.
    pub ws_token: Option<String>,
    pub max_sessions: usize,
    pub max_subscribers_per_session: usize,
    pub rate_per_second: f64,
    pub rate_burst: u32,
    pub ledger_max_events: usize,
    pub ledger_max_bytes: usize,
    pub stream_buffer_max: usize,
    pub stream_buffer_max_bytes: usize,
    pub max_pending_actions: usize,
    pub max_pending_action_bytes: usize,
    /// Validate actions off the channel: an action with a schema becomes
    /// an [`Output::Validate`] whose job the caller runs where it likes (a
    /// thread pool) and hands back to [`Channel::action_validated`];
    /// meanwhile the session's later frames wait, in order. Off: actions
    /// are validated inline, in `frame_received`.
    pub defer_validation: bool,
    /// With `defer_validation`, actions that cost at most this are still
    /// validated inline (see [`INLINE_VALIDATION_MAX_COST`]).
    pub inline_validation_max_cost: u64,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            default_app_id: DEFAULT_APP_ID.to_owned(),
            advertised_version: PROTOCOL_SCHEMA_VERSION.to_owned(),
            version_policy: VersionPolicy::Strict,
            ws_token: None,
            max_sessions: MAX_SESSIONS,
            max_subscribers_per_session: MAX_SUBSCRIBERS_PER_SESSION,
            rate_per_second: f64::from(RATE_LIMIT_PER_SECOND),
            rate_burst: RATE_LIMIT_BURST,
            ledger_max_events: LEDGER_MAX_EVENTS,
            ledger_max_bytes: LEDGER_MAX_BYTES,
            stream_buffer_max: STREAM_BUFFER_MAX,
            stream_buffer_max_bytes: STREAM_BUFFER_MAX_BYTES,
            max_pending_actions: MAX_PENDING_ACTIONS,
            max_pending_action_bytes: MAX_PENDING_ACTION_BYTES,
            defer_validation: false,
            inline_validation_max_cost: INLINE_VALIDATION_MAX_COST,
        }
    }
}

/// What the server does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Write this frame to the connection.
    Send { conn: ConnId, frame: Arc<str> },
    /// Close the connection with this code (after the frames before it).
    Close {
        conn: ConnId,
        code: u16,
        reason: String,
    },
    /// Store this record (ledgers and stream buffers survive a restart).
    Persist(Box<Record>),
    /// Actions arrived: wake the agent's long polls on this session.
    ActionsAvailable { session_id: String },
    /// An acknowledgement of a durable change (an action's `ack`): send
    /// `frame`, and the outputs after it, only once every `Persist` before
    /// it is durable. If they cannot be stored, send `otherwise` (the
    /// protocol's error) instead, drop the outputs after it that belong to
    /// the change, and give `undo` to [`Channel::not_stored`]: nothing
    /// changed.
    Durable {
        conn: ConnId,
        frame: Arc<str>,
        otherwise: Arc<str>,
        undo: Undo,
    },
    /// Validate an action (deferred validation): run the job, anywhere,
    /// and give what it returns to [`Channel::action_validated`]. The
    /// session's later frames wait for it.
    Validate(Box<ValidationJob>),
    /// A durable change answered by the caller (a props update): the
    /// outputs after this wait until every `Persist` before it is durable.
    /// If they cannot be stored, drop them, give `undo` to
    /// [`Channel::not_stored`] and answer that nothing changed.
    Commit { undo: Undo },
}

/// An action to check against its session's declared actions, off the
/// channel: it carries the compiled spec (shared, not copied) and the
/// decoded action.
#[derive(Clone)]
pub struct ValidationJob {
    conn: ConnId,
    session_id: String,
    request_id: Option<String>,
    envelope: ActionEnvelope,
    spec: Arc<ActionSpec>,
}

impl std::fmt::Debug for ValidationJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidationJob")
            .field("conn", &self.conn)
            .field("session_id", &self.session_id)
            .finish()
    }
}

impl PartialEq for ValidationJob {
    fn eq(&self, other: &Self) -> bool {
        self.conn == other.conn
            && self.session_id == other.session_id
            && self.request_id == other.request_id
            && Arc::ptr_eq(&self.spec, &other.spec)
    }
}

impl ValidationJob {
    /// The session the action is for.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Validates the action (the costly part: call it off the channel).
    pub fn run(self) -> ValidatedAction {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.spec
                .validate_action_data(self.envelope.payload.as_ref())
        }))
        .unwrap_or_else(|_| ValidationResult {
            violations: vec![ContractViolation {
                field: "value".into(),
                message: "the action could not be validated".into(),
                expected: None,
                received: None,
                keyword: None,
            }],
        });
        ValidatedAction { job: self, result }
    }
}

/// A [`ValidationJob`] done, for [`Channel::action_validated`].
pub struct ValidatedAction {
    job: ValidationJob,
    result: ValidationResult,
}

/// A frame of a connection whose session validates an action, held in
/// arrival order (its rate limit already charged).
struct HeldFrame {
    conn: ConnId,
    bytes: Box<[u8]>,
}

/// What [`Channel::not_stored`] takes back.
#[derive(Debug, Clone, PartialEq)]
pub enum Undo {
    /// A submitted action (ledger `seq`), never acknowledged.
    Action { session_id: String, seq: u64 },
    /// A props update (ledger `seq`) and the props it replaced.
    Props {
        session_id: String,
        seq: u64,
        previous: Option<Map<String, Value>>,
    },
}

impl Undo {
    /// The session whose change it takes back.
    pub fn session_id(&self) -> &str {
        match self {
            Undo::Action { session_id, .. } | Undo::Props { session_id, .. } => session_id,
        }
    }
}

/// What a session is, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    pub session_id: String,
    pub app_id: String,
    pub action_spec: Option<Value>,
    pub stream_spec: Option<Value>,
    pub host_context: Option<Map<String, Value>>,
    pub props: Option<Map<String, Value>>,
    pub version_override: Option<String>,
    pub created_at_ms: u64,
}

/// A record to persist. Applying them in order rebuilds what
/// [`Channel::restore_session`] needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// Insert or replace the session row.
    Session(SessionRecord),
    /// Append to the session's ledger.
    LedgerEvent {
        session_id: String,
        event: GguiSessionEvent,
    },
    /// Ledger entries up to this `seq` were evicted: they may be deleted.
    LedgerTrimmed { session_id: String, horizon: u64 },
    /// Append to the session's stream buffer.
    StreamEntry {
        session_id: String,
        envelope: StreamEnvelope,
        policy: ReplayPolicy,
    },
    /// The stream `seq` advanced without a buffered entry (policy `none`).
    StreamSeq { session_id: String, seq: u64 },
    /// These buffered entries left the buffer: they may be deleted.
    StreamEntriesDropped { session_id: String, seqs: Vec<u64> },
    /// The agent drained the actions up to this ledger `seq`.
    ActionsDrained { session_id: String, up_to: u64 },
    /// The session's host context alone changed (`host_context_observed`):
    /// the row with its props need not be written again. Keep-latest.
    HostContext {
        session_id: String,
        host_context: Map<String, Value>,
    },
    /// The session expired: it and everything stored of it go.
    SessionRemoved { session_id: String },
}

impl Record {
    /// The session the record is about.
    pub fn session_id(&self) -> &str {
        match self {
            Record::Session(rec) => &rec.session_id,
            Record::LedgerEvent { session_id, .. }
            | Record::LedgerTrimmed { session_id, .. }
            | Record::StreamEntry { session_id, .. }
            | Record::StreamSeq { session_id, .. }
            | Record::StreamEntriesDropped { session_id, .. }
            | Record::ActionsDrained { session_id, .. }
            | Record::HostContext { session_id, .. }
            | Record::SessionRemoved { session_id } => session_id,
        }
    }
}

/// Everything persisted about one session, to rebuild it after a restart.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RestoredSession {
    pub record: Option<SessionRecord>,
    /// Retained ledger entries, ascending `seq`.
    pub ledger: Vec<GguiSessionEvent>,
    /// The ledger's high-water mark (covers entries no longer stored).
    pub ledger_last_sequence: u64,
    /// Buffered stream entries, ascending `seq`.
    pub stream: Vec<(StreamEnvelope, ReplayPolicy)>,
    /// The last assigned stream `seq`.
    pub stream_seq: u64,
    /// Actions drained up to this ledger `seq`.
    pub drained_up_to: u64,
}

/// Errors of the agent-side calls; each maps to an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidField(String),
    #[error("session '{0}' does not exist")]
    SessionNotFound(String),
    #[error("session '{session_id}' belongs to a different app than '{app_id}'")]
    AppMismatch { session_id: String, app_id: String },
    #[error("the server holds its limit of {0} sessions")]
    SessionLimit(usize),
    #[error("the frame would be {size} bytes; the limit is {limit}")]
    PayloadTooLarge { size: usize, limit: usize },
}

impl ApiError {
    /// The protocol's error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidField(_) => codes::INVALID_MESSAGE,
            Self::SessionNotFound(_) => codes::SESSION_NOT_FOUND,
            Self::AppMismatch { .. } => codes::APP_MISMATCH,
            Self::SessionLimit(_) => codes::SESSION_CREATE_FAILED,
            Self::PayloadTooLarge { .. } => codes::FRAME_TOO_LARGE,
        }
    }

    /// The HTTP status an API answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::InvalidField(_) => 400,
            Self::SessionNotFound(_) => 404,
            Self::AppMismatch { .. } => 409,
            Self::SessionLimit(_) => 503,
            Self::PayloadTooLarge { .. } => 413,
        }
    }
}

/// `create_session`'s input: a caller-chosen id; the rest optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateSession {
    pub session_id: String,
    pub app_id: Option<String>,
    /// Action name → `{schema?, nextStep?}`.
    pub action_spec: Option<Value>,
    /// Channel name → `{replay?}`.
    pub stream_spec: Option<Value>,
    /// The version this session advertises instead of the server's.
    pub version_override: Option<String>,
}

/// A session as the agent reads it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    pub session_id: String,
    pub app_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_context: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub props: Option<Map<String, Value>>,
    /// The ledger's last `seq`.
    pub sequence: u64,
    /// The stream buffer's last `seq`.
    pub stream_seq: u64,
    /// The version subscribers are told.
    pub server_version: String,
    pub subscribers: usize,
    pub pending_actions: usize,
}

struct PendingAction {
    seq: u64,
    entry: ConsumeEventEntry,
}

struct Session {
    id: String,
    app_id: String,
    /// Shared with the validations of its actions under way.
    action_spec: Option<Arc<ActionSpec>>,
    stream_spec_source: Option<Value>,
    stream_spec: HashMap<String, ReplayPolicy>,
    host_context: Option<Map<String, Value>>,
    props: Option<Map<String, Value>>,
    version_override: Option<String>,
    created_at_ms: u64,
    ledger: Ledger,
    stream: StreamBuffer,
    subscribers: Vec<ConnId>,
    pending: VecDeque<PendingAction>,
    /// Bytes of `action_data` text in `pending`.
    pending_bytes: usize,
    drained_up_to: u64,
    /// One of its actions is being validated off the channel: its
    /// subscribers' frames wait in `held` (so actions and acks keep their
    /// order).
    validating: bool,
    held: VecDeque<HeldFrame>,
    held_bytes: usize,
}

impl Session {
    fn record(&self) -> SessionRecord {
        SessionRecord {
            session_id: self.id.clone(),
            app_id: self.app_id.clone(),
            action_spec: self.action_spec.as_ref().map(|s| s.source().clone()),
            stream_spec: self.stream_spec_source.clone(),
            host_context: self.host_context.clone(),
            props: self.props.clone(),
            version_override: self.version_override.clone(),
            created_at_ms: self.created_at_ms,
        }
    }

    fn policy_of(&self, channel: &str) -> ReplayPolicy {
        if is_reserved_channel(channel) {
            return ReplayPolicy::All;
        }
        self.stream_spec.get(channel).copied().unwrap_or_default()
    }
}

struct Conn {
    subscribed: Option<String>,
    authenticated: bool,
    /// The session and app the connection's UI token is for: it may
    /// subscribe to that session alone, and never creates one.
    bound: Option<(String, String)>,
    bucket: TokenBucket,
    limited_in_row: u32,
    closing: bool,
}

/// The live channel: every session and connection of one server.
pub struct Channel {
    config: ChannelConfig,
    sessions: HashMap<String, Session>,
    conns: HashMap<ConnId, Conn>,
    outputs: VecDeque<Output>,
    /// Bytes of the frame being handled (`None` for a frame handed in
    /// decoded): what an action's validation cost is reckoned from.
    frame_bytes: Option<usize>,
}

/// An action's `data` (`null` when absent) as JSON text.
fn raw_data(data: Option<&Value>) -> Box<serde_json::value::RawValue> {
    let null = Value::Null;
    // Serializing a `Value` cannot fail.
    serde_json::value::to_raw_value(data.unwrap_or(&null)).unwrap_or_else(|_| {
        serde_json::value::RawValue::from_string("null".into()).expect("null is JSON")
    })
}

fn parse_action_spec(spec: Option<&Value>) -> Result<Option<Arc<ActionSpec>>, ApiError> {
    spec.map(|s| ActionSpec::from_json(s).map(Arc::new))
        .transpose()
        .map_err(ApiError::InvalidField)
}

fn parse_stream_policies(spec: Option<&Value>) -> Result<HashMap<String, ReplayPolicy>, ApiError> {
    let Some(spec) = spec else {
        return Ok(HashMap::new());
    };
    let parsed = parse_stream_spec(spec).map_err(ApiError::InvalidField)?;
    if parsed.len() > MAX_STREAM_CHANNELS {
        return Err(ApiError::InvalidField(format!(
            "streamSpec declares more than {MAX_STREAM_CHANNELS} channels"
        )));
    }
    Ok(parsed.into_iter().collect())
}

fn check_id(field: &str, id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(ApiError::InvalidField(format!(
            "{field} must be 1 to {MAX_ID_BYTES} bytes"
        )));
    }
    Ok(())
}

impl Channel {
    pub fn new(config: ChannelConfig) -> Self {
        Self {
            config,
            sessions: HashMap::new(),
            conns: HashMap::new(),
            outputs: VecDeque::new(),
            frame_bytes: None,
        }
    }

    pub fn config(&self) -> &ChannelConfig {
        &self.config
    }

    /// The next thing to do, in order.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// Outputs waiting to be polled.
    pub fn pending_outputs(&self) -> usize {
        self.outputs.len()
    }

    /// The session a connection is subscribed to.
    pub fn subscription(&self, conn: ConnId) -> Option<&str> {
        self.conns.get(&conn)?.subscribed.as_deref()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    fn send(&mut self, conn: ConnId, frame: Arc<str>) {
        self.outputs.push_back(Output::Send { conn, frame });
    }

    fn send_error(&mut self, conn: ConnId, payload: ErrorPayload, request_id: Option<&str>) {
        let frame = encode_error(&payload, request_id);
        self.send(conn, frame);
    }

    fn error(
        &mut self,
        conn: ConnId,
        code: &str,
        message: impl Into<String>,
        request_id: Option<&str>,
    ) {
        self.send_error(conn, make_error_payload(code, message, None), request_id);
    }

    fn close(&mut self, conn: ConnId, code: u16, reason: &str) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.closing = true;
        }
        self.outputs.push_back(Output::Close {
            conn,
            code,
            reason: reason.to_owned(),
        });
    }

    fn persist(&mut self, record: Record) {
        self.outputs.push_back(Output::Persist(Box::new(record)));
    }

    fn advertised(&self, session: Option<&Session>) -> String {
        session
            .and_then(|s| s.version_override.clone())
            .unwrap_or_else(|| self.config.advertised_version.clone())
    }

    // ----- connections ---------------------------------------------------

    /// A WebSocket was accepted. `authenticated`: the server verified a
    /// bearer token (or none is configured).
    pub fn connection_opened(&mut self, conn: ConnId, now_ms: u64, authenticated: bool) {
        self.conns.insert(
            conn,
            Conn {
                subscribed: None,
                authenticated: authenticated || self.config.ws_token.is_none(),
                bucket: TokenBucket::new(
                    self.config.rate_per_second,
                    self.config.rate_burst,
                    now_ms,
                ),
                limited_in_row: 0,
                closing: false,
                bound: None,
            },
        );
    }

    /// Binds a connection to the session (and its app) of the UI token it
    /// presented: it may subscribe to that session alone.
    pub fn bind_connection(&mut self, conn: ConnId, session_id: String, app_id: String) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.bound = Some((session_id, app_id));
        }
    }

    /// The connection is gone.
    pub fn connection_closed(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.remove(&conn) {
            if let Some(sid) = c.subscribed {
                if let Some(s) = self.sessions.get_mut(&sid) {
                    s.subscribers.retain(|&c| c != conn);
                }
            }
        }
    }

    /// One frame (text message) from a connection.
    pub fn frame_received(&mut self, conn: ConnId, bytes: &[u8], now_ms: u64) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.closing {
            return;
        }
        if !c.bucket.try_take(now_ms) {
            c.limited_in_row += 1;
            let n = c.limited_in_row;
            // Every refused frame is answered, with its `requestId`, so a
            // client knows which of its actions were not taken.
            let message = format!(
                "more than {} frames per second (burst {}); frame dropped, send it again later",
                self.config.rate_per_second, self.config.rate_burst
            );
            let request_id = peek_request_id(bytes);
            self.error(conn, codes::RATE_LIMITED, message, request_id.as_deref());
            if n >= RATE_LIMITED_FRAMES_BEFORE_CLOSE {
                self.close(conn, CLOSE_POLICY_VIOLATION, "rate limit exceeded");
            }
            return;
        }
        c.limited_in_row = 0;
        if let Some(s) = c
            .subscribed
            .as_ref()
            .and_then(|id| self.sessions.get_mut(id))
        {
            if s.validating {
                if s.held.len() >= MAX_HELD_FRAMES_PER_SESSION
                    || s.held_bytes + bytes.len() > MAX_HELD_FRAME_BYTES_PER_SESSION
                {
                    let message = format!(
                        "session {} has {MAX_HELD_FRAMES_PER_SESSION} frames or {MAX_HELD_FRAME_BYTES_PER_SESSION} bytes waiting for an action's validation; frame dropped, send it again later",
                        s.id
                    );
                    let request_id = peek_request_id(bytes);
                    self.error(conn, codes::RATE_LIMITED, message, request_id.as_deref());
                    return;
                }
                s.held_bytes += bytes.len();
                s.held.push_back(HeldFrame {
                    conn,
                    bytes: bytes.into(),
                });
                return;
            }
        }
        self.decode_and_handle(conn, bytes, now_ms);
    }

    /// A frame whose rate limit is charged: decoded and handled.
    fn decode_and_handle(&mut self, conn: ConnId, bytes: &[u8], now_ms: u64) {
        let subscribed = self
            .conns
            .get(&conn)
            .is_some_and(|c| c.subscribed.is_some());
        let frame = match decode_client_frame(bytes, subscribed) {
            Ok(f) => f,
            Err(e) => {
                self.error(conn, e.code, e.message, e.request_id.as_deref());
                if let Some(code) = e.close {
                    self.close(conn, code, e.code);
                }
                return;
            }
        };
        self.frame_bytes = Some(bytes.len());
        self.handle_frame(conn, frame, now_ms);
        self.frame_bytes = None;
    }

    /// A frame already decoded (tests and fuzzing drive this too).
    pub fn handle_frame(&mut self, conn: ConnId, frame: ClientFrame, now_ms: u64) {
        match frame {
            ClientFrame::Subscribe {
                request_id,
                payload,
            } => self.on_subscribe(conn, payload, request_id.as_deref(), now_ms),
            ClientFrame::Ping { request_id } => {
                let frame = encode_frame(frame_types::PONG, &json!({}), request_id.as_deref());
                self.send(conn, frame);
            }
            ClientFrame::Action {
                request_id,
                envelope,
            } => self.on_action(conn, envelope, request_id.as_deref(), now_ms),
            ClientFrame::HostContextObserved {
                request_id,
                session_id,
                host_context,
            } => {
                let Some(sid) = self.subscribed_to(
                    conn,
                    &session_id,
                    "host_context_observed",
                    request_id.as_deref(),
                ) else {
                    return;
                };
                if let Some(s) = self.sessions.get_mut(&sid) {
                    // Idempotent overwrite, no merge; only it is written.
                    s.host_context = Some(host_context.clone());
                    self.persist(Record::HostContext {
                        session_id: sid,
                        host_context,
                    });
                }
            }
            ClientFrame::ChannelSubscribe {
                request_id,
                session_id,
                channel_name,
            } => {
                let Some(sid) = self.subscribed_to(
                    conn,
                    &session_id,
                    "channel_subscribe",
                    request_id.as_deref(),
                ) else {
                    return;
                };
                let payload = ChannelErrorPayload {
                    session_id: sid,
                    message: format!("channel '{channel_name}' has no source tool on this server"),
                    channel_name,
                    code: codes::CHANNEL_UNKNOWN.to_owned(),
                    details: None,
                };
                let frame =
                    encode_frame(frame_types::CHANNEL_ERROR, &payload, request_id.as_deref());
                self.send(conn, frame);
            }
            // Idempotent; nothing is polled, so nothing to stop.
            ClientFrame::ChannelUnsubscribe { .. } => {}
        }
    }

    /// The session a connection is subscribed to, if it is `session_id`;
    /// otherwise answers `NOT_SUBSCRIBED` / `SESSION_MISMATCH`.
    fn subscribed_to(
        &mut self,
        conn: ConnId,
        session_id: &str,
        what: &str,
        request_id: Option<&str>,
    ) -> Option<String> {
        let subscribed = self.conns.get(&conn).and_then(|c| c.subscribed.clone());
        match subscribed {
            None => {
                self.error(
                    conn,
                    codes::NOT_SUBSCRIBED,
                    format!("subscribe before sending {what}"),
                    request_id,
                );
                None
            }
            Some(sid) if sid != session_id => {
                self.error(
                    conn,
                    codes::SESSION_MISMATCH,
                    format!(
                        "payload.sessionId '{session_id}' is not the subscribed session '{sid}'"
                    ),
                    request_id,
                );
                None
            }
            Some(sid) => {
                if self.sessions.contains_key(&sid) {
                    Some(sid)
                } else {
                    self.error(
                        conn,
                        codes::SESSION_NOT_FOUND,
                        format!("session '{sid}' no longer exists"),
                        request_id,
                    );
                    None
                }
            }
        }
    }

    fn on_subscribe(
        &mut self,
        conn: ConnId,
        p: SubscribeRequest,
        request_id: Option<&str>,
        now_ms: u64,
    ) {
        // 1. Version handshake.
        let advertised = self.advertised(self.sessions.get(&p.session_id));
        if let Some(versions) = &p.supported_versions {
            if !versions.contains(&advertised) {
                let policy = match self.config.version_policy {
                    VersionPolicy::Strict => "reject",
                    VersionPolicy::Advisory => "advisory",
                };
                let mut payload = make_error_payload(
                    codes::UPGRADE_REQUIRED,
                    format!(
                        "server advertises '{advertised}'; client supports [{}]",
                        versions.join(", ")
                    ),
                    Some(json!({
                        "serverVersion": advertised,
                        "clientSupportedVersions": versions,
                        "policy": policy,
                    })),
                );
                payload.server_version = Some(advertised);
                self.send_error(conn, payload, request_id);
                if self.config.version_policy == VersionPolicy::Strict {
                    self.close(conn, CLOSE_UPGRADE_REQUIRED, codes::UPGRADE_REQUIRED);
                }
                return;
            }
        }
        // 2. Authentication.
        let authenticated = self.conns.get(&conn).is_some_and(|c| c.authenticated);
        if !authenticated {
            let ok = match (&self.config.ws_token, &p.ws_token) {
                (Some(expected), Some(given)) => bool::from(subtle::ConstantTimeEq::ct_eq(
                    expected.as_bytes(),
                    given.as_bytes(),
                )),
                _ => false,
            };
            if !ok {
                let message = if p.ws_token.is_some() {
                    "payload.wsToken is not valid"
                } else {
                    "this server needs a bearer token or payload.wsToken"
                };
                self.error(conn, codes::UNAUTHENTICATED, message, request_id);
                return;
            }
            if let Some(c) = self.conns.get_mut(&conn) {
                c.authenticated = true;
            }
        }
        // 3. Tenancy: a connection bound by its UI token subscribes to its
        // own session only, which must exist; otherwise an existing session
        // must belong to the app named (or to the default app), and an
        // unknown one is provisioned for it.
        let bound = self.conns.get(&conn).and_then(|c| c.bound.clone());
        if let Some((session, app)) = &bound {
            if *session != p.session_id {
                let message =
                    "payload.sessionId: this connection's token is for another session".to_owned();
                self.error(conn, codes::UNAUTHENTICATED, message, request_id);
                return;
            }
            if p.app_id.as_ref().is_some_and(|a| a != app) {
                let message = format!("GguiSession {} belongs to a different app", p.session_id);
                self.error(conn, codes::APP_MISMATCH, message, request_id);
                return;
            }
            if !self.sessions.contains_key(session) {
                let message = format!("payload.sessionId: no session {session}");
                self.error(conn, codes::SESSION_NOT_FOUND, message, request_id);
                return;
            }
        }
        let app_id = match &bound {
            Some((_, app)) => app.clone(),
            None => p
                .app_id
                .clone()
                .unwrap_or_else(|| self.config.default_app_id.clone()),
        };
        match self.sessions.get(&p.session_id) {
            Some(s) if s.app_id != app_id => {
                let message = format!("GguiSession {} belongs to a different app", p.session_id);
                self.error(conn, codes::APP_MISMATCH, message, request_id);
                return;
            }
            Some(_) => {}
            None => {
                if let Err(e) = self.insert_session(
                    &p.session_id,
                    &app_id,
                    None,
                    HashMap::new(),
                    None,
                    None,
                    now_ms,
                ) {
                    self.error(
                        conn,
                        codes::SESSION_CREATE_FAILED,
                        e.to_string(),
                        request_id,
                    );
                    return;
                }
            }
        }
        // 4. The subscriber bound.
        let previous = self.conns.get(&conn).and_then(|c| c.subscribed.clone());
        let max_subscribers = self.config.max_subscribers_per_session;
        let Some(session) = self.sessions.get_mut(&p.session_id) else {
            return;
        };
        if !session.subscribers.contains(&conn) {
            if session.subscribers.len() >= max_subscribers {
                let message = format!(
                    "session {} has its limit of {max_subscribers} subscribers",
                    p.session_id
                );
                self.error(conn, codes::TOO_MANY_SUBSCRIBERS, message, request_id);
                return;
            }
            session.subscribers.push(conn);
        }
        // 5. Ack, then ledger replay, then stream replay; the live tail follows.
        let (stream_frames, truncated) =
            session.stream.replay(p.from_seq, |c| session.policy_of(c));
        let ack = AckPayload {
            sequence: session.ledger.last_sequence(),
            timestamp: now_ms,
            session: None,
            stream_seq: Some(session.stream.current_seq()),
            server_version: Some(advertised.clone()),
            replay_truncated: truncated.then_some(true),
            session_token: None,
        };
        let mut frames = vec![encode_frame(frame_types::ACK, &ack, request_id)];
        let mut trailing_error = None;
        if let Some(raw) = &p.since_sequence {
            match non_negative_integer(raw) {
                None => {
                    trailing_error = Some(make_error_payload(
                        codes::INVALID_SINCE_SEQUENCE,
                        "payload.sinceSequence must be a non-negative integer",
                        None,
                    ));
                }
                Some(since) => {
                    let (last, horizon) =
                        (session.ledger.last_sequence(), session.ledger.horizon());
                    if since > last || since < horizon {
                        trailing_error = Some(make_error_payload(
                            codes::REPLAY_HORIZON_PASSED,
                            format!(
                                "cursor {since} is outside replayable range [{horizon}, {last}]"
                            ),
                            Some(json!({ "currentSequence": last })),
                        ));
                    } else {
                        // Pages of REPLAY_PAGE_SIZE, in seq order.
                        let mut cursor = since;
                        loop {
                            let before = frames.len();
                            for e in session.ledger.page(cursor, REPLAY_PAGE_SIZE) {
                                frames.push(e.frame.clone());
                                cursor = e.seq;
                            }
                            if frames.len() - before < REPLAY_PAGE_SIZE {
                                break;
                            }
                        }
                    }
                }
            }
        }
        for f in frames {
            self.send(conn, f);
        }
        if let Some(e) = trailing_error {
            self.send_error(conn, e, request_id);
        }
        for f in stream_frames {
            self.send(conn, f);
        }
        if let Some(prev) = previous.filter(|prev| *prev != p.session_id) {
            if let Some(s) = self.sessions.get_mut(&prev) {
                s.subscribers.retain(|&c| c != conn);
            }
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.subscribed = Some(p.session_id);
        }
    }

    fn on_action(
        &mut self,
        conn: ConnId,
        envelope: ActionEnvelope,
        request_id: Option<&str>,
        now_ms: u64,
    ) {
        let Some(sid) =
            self.subscribed_to(conn, &envelope.session_id.clone(), "action", request_id)
        else {
            return;
        };
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        if envelope.event_type == EVENT_TYPE_DATA_SUBMIT {
            if let Some(spec) = &session.action_spec {
                let job = ValidationJob {
                    conn,
                    session_id: sid,
                    request_id: request_id.map(str::to_owned),
                    envelope,
                    spec: Arc::clone(spec),
                };
                let cheap = self.frame_bytes.is_some_and(|b| {
                    spec.validation_cost(b) <= self.config.inline_validation_max_cost
                });
                if self.config.defer_validation && !cheap {
                    session.validating = true;
                    self.outputs.push_back(Output::Validate(Box::new(job)));
                } else {
                    self.validated(job.run(), now_ms);
                }
                return;
            }
        }
        self.append_action(conn, sid, envelope, request_id, now_ms);
    }

    /// An action validated off the channel (an [`Output::Validate`]'s job,
    /// run): it is appended and acknowledged, or refused, and the frames
    /// its session held meanwhile are handled, in order.
    pub fn action_validated(&mut self, done: ValidatedAction, now_ms: u64) {
        let sid = done.job.session_id.clone();
        if let Some(s) = self.sessions.get_mut(&sid) {
            s.validating = false;
        }
        self.validated(done, now_ms);
        loop {
            let Some(s) = self.sessions.get_mut(&sid) else {
                return;
            };
            if s.validating {
                return;
            }
            let Some(held) = s.held.pop_front() else {
                return;
            };
            s.held_bytes -= held.bytes.len();
            // A connection closed meanwhile has no one to answer.
            if self.conns.get(&held.conn).is_some_and(|c| !c.closing) {
                self.decode_and_handle(held.conn, &held.bytes, now_ms);
            }
        }
    }

    fn validated(&mut self, done: ValidatedAction, now_ms: u64) {
        let ValidatedAction { job, result } = done;
        let ValidationJob {
            conn,
            session_id,
            request_id,
            mut envelope,
            spec,
        } = job;
        let request_id = request_id.as_deref();
        if !result.valid() {
            let (message, details) = contract_violation(EVENT_TOOL, &result.violations, EVENT_HINT);
            let payload = make_error_payload(codes::CONTRACT_VIOLATION, message, Some(details));
            self.send_error(conn, payload, request_id);
            return;
        }
        // The server, not the client, names the tool an action routes to.
        if let Some(Value::Object(p)) = envelope.payload.as_mut() {
            let action = p
                .get("action")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if let Some(tool) = spec.next_step(&action) {
                p.insert("tool".into(), Value::String(tool.to_owned()));
            }
        }
        self.append_action(conn, session_id, envelope, request_id, now_ms);
    }

    /// Appends a valid action to its session's ledger and pending actions,
    /// acknowledged once durable.
    fn append_action(
        &mut self,
        conn: ConnId,
        sid: String,
        envelope: ActionEnvelope,
        request_id: Option<&str>,
        now_ms: u64,
    ) {
        let max_pending = self.config.max_pending_actions;
        // The session may have gone while its action was validated.
        let Some(session) = self.sessions.get_mut(&sid) else {
            let message = format!("session '{sid}' no longer exists");
            self.error(conn, codes::SESSION_NOT_FOUND, message, request_id);
            return;
        };
        if session.pending.len() >= max_pending {
            let message = format!("session {sid} has {max_pending} actions the agent has not drained; action not appended");
            self.error(conn, codes::APPEND_FAILED, message, request_id);
            return;
        }
        let timestamp = iso_timestamp(now_ms);
        // What the agent consumes is read before the envelope moves into
        // the ledger entry (no second copy of the envelope is made).
        let payload = envelope.payload.as_ref();
        let intent = payload
            .and_then(|p| p.get("action"))
            .and_then(Value::as_str)
            .unwrap_or(&envelope.event_type)
            .to_owned();
        let mut ui_context = Map::new();
        if let Some(tool) = payload.and_then(|p| p.get("tool")) {
            ui_context.insert("tool".into(), tool.clone());
        }
        let action_data = raw_data(payload.and_then(|p| p.get("data")));
        let max_bytes = self.config.max_pending_action_bytes;
        if session.pending_bytes + action_data.get().len() > max_bytes {
            let message = format!("session {sid} has {max_bytes} bytes of actions the agent has not drained; action not appended");
            self.error(conn, codes::APPEND_FAILED, message, request_id);
            return;
        }
        session.pending_bytes += action_data.get().len();
        let stack_item_id = envelope.stack_item_id.clone().unwrap_or_default();
        let appended = session.ledger.append(
            LEDGER_USER_SUBMITTED,
            timestamp.clone(),
            envelope.into_value(),
        );
        let (event, trimmed) = (appended.event, appended.evicted);
        let seq = event.seq;
        session.pending.push_back(PendingAction {
            seq,
            entry: ConsumeEventEntry {
                entry_type: "action".into(),
                stack_item_id,
                intent,
                action_data,
                ui_context,
                action_id: seq.to_string(),
                fired_at: timestamp,
            },
        });
        let horizon = session.ledger.horizon();
        self.persist(Record::LedgerEvent {
            session_id: sid.clone(),
            event,
        });
        if trimmed {
            self.persist(Record::LedgerTrimmed {
                session_id: sid.clone(),
                horizon,
            });
        }
        let ack = AckPayload {
            sequence: seq,
            timestamp: now_ms,
            session: None,
            stream_seq: None,
            server_version: None,
            replay_truncated: None,
            session_token: None,
        };
        let frame = encode_frame(frame_types::ACK, &ack, request_id);
        // Acknowledged only once its ledger entry is durable.
        let otherwise = encode_error(
            &make_error_payload(
                codes::APPEND_FAILED,
                format!("session {sid}: the action was not stored; send it again"),
                None,
            ),
            request_id,
        );
        self.outputs.push_back(Output::Durable {
            conn,
            frame,
            otherwise,
            undo: Undo::Action {
                session_id: sid.clone(),
                seq,
            },
        });
        self.outputs
            .push_back(Output::ActionsAvailable { session_id: sid });
    }

    /// The records before an [`Output::Durable`] were not stored: its
    /// change is taken back (an action leaves the ledger and the pending
    /// actions, and its `seq` is given again).
    pub fn not_stored(&mut self, undo: Undo) {
        match undo {
            Undo::Action { session_id, seq } => {
                if let Some(s) = self.sessions.get_mut(&session_id) {
                    s.ledger.take_back(seq);
                    if s.pending.back().is_some_and(|p| p.seq == seq) {
                        s.pending.pop_back();
                    }
                }
            }
            Undo::Props {
                session_id,
                seq,
                previous,
            } => {
                if let Some(s) = self.sessions.get_mut(&session_id) {
                    s.ledger.take_back(seq);
                    s.props = previous;
                }
            }
        }
    }

    // ----- the agent's side ----------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn insert_session(
        &mut self,
        id: &str,
        app_id: &str,
        action_spec: Option<Arc<ActionSpec>>,
        stream_spec: HashMap<String, ReplayPolicy>,
        stream_spec_source: Option<Value>,
        version_override: Option<String>,
        now_ms: u64,
    ) -> Result<(), ApiError> {
        if self.sessions.len() >= self.config.max_sessions {
            return Err(ApiError::SessionLimit(self.config.max_sessions));
        }
        let session = Session {
            id: id.to_owned(),
            app_id: app_id.to_owned(),
            action_spec,
            stream_spec_source,
            stream_spec,
            host_context: None,
            props: None,
            version_override,
            created_at_ms: now_ms,
            ledger: Ledger::new(self.config.ledger_max_events, self.config.ledger_max_bytes),
            stream: StreamBuffer::new(
                self.config.stream_buffer_max,
                self.config.stream_buffer_max_bytes,
            ),
            subscribers: Vec::new(),
            pending: VecDeque::new(),
            pending_bytes: 0,
            drained_up_to: 0,
            validating: false,
            held: VecDeque::new(),
            held_bytes: 0,
        };
        let record = session.record();
        self.sessions.insert(id.to_owned(), session);
        self.persist(Record::Session(record));
        Ok(())
    }

    /// Creates a session with a caller-chosen id, or updates it: the call
    /// is idempotent. Returns whether it was created. A session belongs to
    /// `app_id` or, when none is given, to the default app; naming another
    /// app than an existing session's is `APP_MISMATCH`.
    pub fn create_session(&mut self, req: CreateSession, now_ms: u64) -> Result<bool, ApiError> {
        check_id("sessionId", &req.session_id)?;
        if let Some(app) = &req.app_id {
            check_id("appId", app)?;
        }
        if let Some(v) = &req.version_override {
            check_id("versionOverride", v)?;
        }
        let spec = parse_action_spec(req.action_spec.as_ref())?;
        let streams = parse_stream_policies(req.stream_spec.as_ref())?;
        let app_id = req
            .app_id
            .clone()
            .unwrap_or_else(|| self.config.default_app_id.clone());
        if let Some(s) = self.sessions.get_mut(&req.session_id) {
            if s.app_id != app_id {
                return Err(ApiError::AppMismatch {
                    session_id: req.session_id,
                    app_id,
                });
            }
            if spec.is_some() {
                s.action_spec = spec;
            }
            if req.stream_spec.is_some() {
                s.stream_spec = streams;
                s.stream_spec_source = req.stream_spec;
            }
            if req.version_override.is_some() {
                s.version_override = req.version_override;
            }
            let record = s.record();
            self.persist(Record::Session(record));
            return Ok(false);
        }
        self.insert_session(
            &req.session_id,
            &app_id,
            spec,
            streams,
            req.stream_spec,
            req.version_override,
            now_ms,
        )?;
        Ok(true)
    }

    /// Sets (or clears) the version a session advertises.
    pub fn set_version_override(
        &mut self,
        session_id: &str,
        version: Option<String>,
    ) -> Result<(), ApiError> {
        if let Some(v) = &version {
            check_id("versionOverride", v)?;
        }
        let s = self
            .sessions
            .get_mut(session_id)
            .ok_or_else(|| ApiError::SessionNotFound(session_id.to_owned()))?;
        s.version_override = version;
        let record = s.record();
        self.persist(Record::Session(record));
        Ok(())
    }

    /// Emits a stream envelope on a channel: assigns the session's next
    /// `seq`, keeps it per the channel's replay policy, and fans the frame
    /// (serialized once) out to every subscriber.
    pub fn emit(
        &mut self,
        session_id: &str,
        channel: &str,
        mode: StreamChannelMode,
        payload: Value,
        complete: Option<bool>,
    ) -> Result<StreamEnvelope, ApiError> {
        check_id("channel", channel)?;
        let advertised = self.advertised(self.sessions.get(session_id));
        let s = self
            .sessions
            .get_mut(session_id)
            .ok_or_else(|| ApiError::SessionNotFound(session_id.to_owned()))?;
        let envelope = StreamEnvelope {
            session_id: session_id.to_owned(),
            channel: channel.to_owned(),
            mode,
            payload,
            complete,
            seq: Some(s.stream.next_seq()),
            schema_version: Some(advertised),
        };
        let size = hostwire_core::json::json_size(&envelope.payload);
        if size > MAX_FRAME_BYTES {
            return Err(ApiError::PayloadTooLarge {
                size,
                limit: MAX_FRAME_BYTES,
            });
        }
        let policy = s.policy_of(channel);
        let recorded = s.stream.record(envelope, policy);
        let subscribers = s.subscribers.clone();
        let seq = recorded.seq;
        for conn in subscribers {
            self.send(conn, Arc::clone(&recorded.frame));
        }
        let sid = session_id.to_owned();
        if recorded.buffered {
            self.persist(Record::StreamEntry {
                session_id: sid.clone(),
                envelope: recorded.envelope.clone(),
                policy: recorded.policy,
            });
        } else {
            self.persist(Record::StreamSeq {
                session_id: sid.clone(),
                seq,
            });
        }
        if !recorded.dropped.is_empty() {
            self.persist(Record::StreamEntriesDropped {
                session_id: sid,
                seqs: recorded.dropped,
            });
        }
        Ok(recorded.envelope)
    }

    /// Delivers a `ContractErrorPayload` on `_ggui:contract-error`.
    pub fn emit_contract_error(
        &mut self,
        session_id: &str,
        payload: &ContractErrorPayload,
    ) -> Result<StreamEnvelope, ApiError> {
        let value = serde_json::to_value(payload).unwrap_or(Value::Null);
        self.emit(
            session_id,
            CONTRACT_ERROR_CHANNEL,
            StreamChannelMode::Append,
            value,
            None,
        )
    }

    /// Replaces the session's props: a `props_update` frame to every
    /// subscriber and a `ui.updated` ledger entry. Returns its `seq`.
    pub fn push_props(
        &mut self,
        session_id: &str,
        props: Map<String, Value>,
        epoch: Option<u64>,
        now_ms: u64,
    ) -> Result<u64, ApiError> {
        let s = self
            .sessions
            .get_mut(session_id)
            .ok_or_else(|| ApiError::SessionNotFound(session_id.to_owned()))?;
        let payload = PropsUpdatePayload {
            session_id: session_id.to_owned(),
            props,
            epoch,
        };
        let frame = encode_frame(frame_types::PROPS_UPDATE, &payload, None);
        if frame.len() > MAX_FRAME_BYTES {
            return Err(ApiError::PayloadTooLarge {
                size: frame.len(),
                limit: MAX_FRAME_BYTES,
            });
        }
        let data = serde_json::to_value(&payload).unwrap_or(Value::Null);
        let appended = s
            .ledger
            .append(LEDGER_UI_UPDATED, iso_timestamp(now_ms), data);
        let (event, trimmed) = (appended.event, appended.evicted);
        let previous = s.props.replace(payload.props);
        let subscribers = s.subscribers.clone();
        let record = s.record();
        let horizon = s.ledger.horizon();
        let seq = event.seq;
        self.persist(Record::Session(record));
        self.persist(Record::LedgerEvent {
            session_id: session_id.to_owned(),
            event,
        });
        if trimmed {
            self.persist(Record::LedgerTrimmed {
                session_id: session_id.to_owned(),
                horizon,
            });
        }
        // Subscribers are told once it is durable.
        self.outputs.push_back(Output::Commit {
            undo: Undo::Props {
                session_id: session_id.to_owned(),
                seq,
                previous,
            },
        });
        for conn in subscribers {
            self.send(conn, frame.clone());
        }
        Ok(seq)
    }

    /// Actions submitted and not yet drained, oldest first, at most `max`.
    /// Nothing is removed: the agent drains what it handled with
    /// [`Channel::drain_actions`], so a crash between the two loses nothing.
    pub fn pending_actions(
        &self,
        session_id: &str,
        max: usize,
    ) -> Result<Vec<ConsumeEventEntry>, ApiError> {
        let s = self
            .sessions
            .get(session_id)
            .ok_or_else(|| ApiError::SessionNotFound(session_id.to_owned()))?;
        Ok(s.pending
            .iter()
            .take(max)
            .map(|p| p.entry.clone())
            .collect())
    }

    /// Removes the pending actions up to ledger `seq` `up_to` (the last
    /// `actionId` handled) and tells subscribers with one `drain_ack`
    /// each. Returns how many were drained.
    pub fn drain_actions(
        &mut self,
        session_id: &str,
        up_to: u64,
        now_ms: u64,
    ) -> Result<usize, ApiError> {
        let s = self
            .sessions
            .get_mut(session_id)
            .ok_or_else(|| ApiError::SessionNotFound(session_id.to_owned()))?;
        let mut frames = Vec::new();
        let drained_at = iso_timestamp(now_ms);
        while s.pending.front().is_some_and(|p| p.seq <= up_to) {
            if let Some(p) = s.pending.pop_front() {
                s.pending_bytes -= p.entry.action_data.get().len();
                let ack = DrainAckPayload {
                    app_id: s.app_id.clone(),
                    session_id: s.id.clone(),
                    event_id: p.entry.action_id,
                    drained_at: drained_at.clone(),
                };
                frames.push(encode_frame(frame_types::DRAIN_ACK, &ack, None));
            }
        }
        let n = frames.len();
        if n == 0 {
            return Ok(0);
        }
        s.drained_up_to = s.drained_up_to.max(up_to);
        let drained = s.drained_up_to;
        let subscribers = s.subscribers.clone();
        for f in frames {
            for &conn in &subscribers {
                self.send(conn, f.clone());
            }
        }
        self.persist(Record::ActionsDrained {
            session_id: session_id.to_owned(),
            up_to: drained,
        });
        Ok(n)
    }

    /// [`Channel::pending_actions`] then [`Channel::drain_actions`] of what was returned.
    pub fn consume_actions(
        &mut self,
        session_id: &str,
        max: usize,
        now_ms: u64,
    ) -> Result<Vec<ConsumeEventEntry>, ApiError> {
        let entries = self.pending_actions(session_id, max)?;
        if let Some(last) = entries.last().and_then(|e| e.action_id.parse::<u64>().ok()) {
            self.drain_actions(session_id, last, now_ms)?;
        }
        Ok(entries)
    }

    /// A session as the agent reads it.
    /// The app a session belongs to (the server's tenancy check, without
    /// copying the session).
    pub fn session_app(&self, session_id: &str) -> Option<&str> {
        self.sessions.get(session_id).map(|s| s.app_id.as_str())
    }

    pub fn read_session(&self, session_id: &str) -> Option<SessionView> {
        let s = self.sessions.get(session_id)?;
        Some(SessionView {
            session_id: s.id.clone(),
            app_id: s.app_id.clone(),
            host_context: s.host_context.clone(),
            props: s.props.clone(),
            sequence: s.ledger.last_sequence(),
            stream_seq: s.stream.current_seq(),
            server_version: self.advertised(Some(s)),
            subscribers: s.subscribers.len(),
            pending_actions: s.pending.len(),
        })
    }

    /// Rebuilds a session from its persisted records (after a restart),
    /// before any connection is accepted. Pending actions are the retained
    /// `user.submitted` entries after the drained cursor.
    pub fn restore_session(&mut self, restored: RestoredSession) -> Result<(), ApiError> {
        let Some(record) = restored.record else {
            return Err(ApiError::InvalidField(
                "restored session has no session record".into(),
            ));
        };
        check_id("sessionId", &record.session_id)?;
        let spec = parse_action_spec(record.action_spec.as_ref())?;
        let streams = parse_stream_policies(record.stream_spec.as_ref())?;
        let mut ledger = Ledger::new(self.config.ledger_max_events, self.config.ledger_max_bytes);
        let mut pending = VecDeque::new();
        for event in restored.ledger {
            if event.event_type == LEDGER_USER_SUBMITTED && event.seq > restored.drained_up_to {
                let env: Option<ActionEnvelope> = serde_json::from_value(event.data.clone()).ok();
                if let Some(env) = env {
                    let payload = env.payload.as_ref();
                    let mut ui_context = Map::new();
                    if let Some(tool) = payload.and_then(|p| p.get("tool")) {
                        ui_context.insert("tool".into(), tool.clone());
                    }
                    pending.push_back(PendingAction {
                        seq: event.seq,
                        entry: ConsumeEventEntry {
                            entry_type: "action".into(),
                            stack_item_id: env.stack_item_id.clone().unwrap_or_default(),
                            intent: payload
                                .and_then(|p| p.get("action"))
                                .and_then(Value::as_str)
                                .unwrap_or(&env.event_type)
                                .to_owned(),
                            action_data: raw_data(payload.and_then(|p| p.get("data"))),
                            ui_context,
                            action_id: event.seq.to_string(),
                            fired_at: event.timestamp.clone(),
                        },
                    });
                }
            }
            ledger.restore(event).map_err(ApiError::InvalidField)?;
        }
        ledger.restore_last_sequence(restored.ledger_last_sequence);
        let mut stream = StreamBuffer::new(
            self.config.stream_buffer_max,
            self.config.stream_buffer_max_bytes,
        );
        for (envelope, policy) in restored.stream {
            stream
                .restore(envelope, policy)
                .map_err(ApiError::InvalidField)?;
        }
        stream.restore_seq(restored.stream_seq);
        let mut pending_bytes: usize = pending
            .iter()
            .map(|p| p.entry.action_data.get().len())
            .sum();
        while pending.len() > self.config.max_pending_actions
            || pending_bytes > self.config.max_pending_action_bytes
        {
            if let Some(p) = pending.pop_front() {
                pending_bytes -= p.entry.action_data.get().len();
            }
        }
        if !self.sessions.contains_key(&record.session_id)
            && self.sessions.len() >= self.config.max_sessions
        {
            return Err(ApiError::SessionLimit(self.config.max_sessions));
        }
        let session = Session {
            id: record.session_id.clone(),
            app_id: record.app_id,
            action_spec: spec,
            stream_spec_source: record.stream_spec,
            stream_spec: streams,
            host_context: record.host_context,
            props: record.props,
            version_override: record.version_override,
            created_at_ms: record.created_at_ms,
            ledger,
            stream,
            subscribers: Vec::new(),
            pending,
            pending_bytes,
            drained_up_to: restored.drained_up_to,
            validating: false,
            held: VecDeque::new(),
            held_bytes: 0,
        };
        self.sessions.insert(record.session_id, session);
        Ok(())
    }

    /// Folds persisted records (in the order they were output) into the
    /// per-session input of [`Channel::restore_session`]. A store may
    /// instead keep rows and build [`RestoredSession`] itself.
    pub fn fold_records(records: impl IntoIterator<Item = Record>) -> Vec<RestoredSession> {
        let mut by_id: HashMap<String, RestoredSession> = HashMap::new();
        let mut order: Vec<String> = Vec::new();
        fn slot<'a>(
            by_id: &'a mut HashMap<String, RestoredSession>,
            order: &mut Vec<String>,
            id: &str,
        ) -> &'a mut RestoredSession {
            if !by_id.contains_key(id) {
                order.push(id.to_owned());
            }
            by_id.entry(id.to_owned()).or_default()
        }
        for r in records {
            match r {
                Record::Session(rec) => {
                    let id = rec.session_id.clone();
                    slot(&mut by_id, &mut order, &id).record = Some(rec);
                }
                Record::HostContext {
                    session_id,
                    host_context,
                } => {
                    let s = slot(&mut by_id, &mut order, &session_id);
                    if let Some(rec) = s.record.as_mut() {
                        rec.host_context = Some(host_context);
                    }
                }
                Record::LedgerEvent { session_id, event } => {
                    let s = slot(&mut by_id, &mut order, &session_id);
                    s.ledger_last_sequence = s.ledger_last_sequence.max(event.seq);
                    s.ledger.push(event);
                }
                Record::LedgerTrimmed {
                    session_id,
                    horizon,
                } => {
                    slot(&mut by_id, &mut order, &session_id)
                        .ledger
                        .retain(|e| e.seq > horizon);
                }
                Record::StreamEntry {
                    session_id,
                    envelope,
                    policy,
                } => {
                    let s = slot(&mut by_id, &mut order, &session_id);
                    s.stream_seq = s.stream_seq.max(envelope.seq.unwrap_or(0));
                    s.stream.push((envelope, policy));
                }
                Record::StreamSeq { session_id, seq } => {
                    let s = slot(&mut by_id, &mut order, &session_id);
                    s.stream_seq = s.stream_seq.max(seq);
                }
                Record::StreamEntriesDropped { session_id, seqs } => {
                    slot(&mut by_id, &mut order, &session_id)
                        .stream
                        .retain(|(e, _)| !seqs.contains(&e.seq.unwrap_or(0)));
                }
                Record::ActionsDrained { session_id, up_to } => {
                    let s = slot(&mut by_id, &mut order, &session_id);
                    s.drained_up_to = s.drained_up_to.max(up_to);
                }
                Record::SessionRemoved { session_id } => {
                    by_id.remove(&session_id);
                    order.retain(|id| *id != session_id);
                }
            }
        }
        order
            .into_iter()
            .filter_map(|id| by_id.remove(&id))
            .collect()
    }

    /// The ids of every session held.
    pub fn session_ids(&self) -> Vec<String> {
        self.sessions.keys().cloned().collect()
    }

    /// Forgets a session (it expired); its subscribers, if any, are
    /// subscribed to nothing from now on. `false`: no such session. The
    /// caller removes what the store keeps of it.
    pub fn remove_session(&mut self, session_id: &str) -> bool {
        let Some(s) = self.sessions.remove(session_id) else {
            return false;
        };
        for conn in s.subscribers {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.subscribed = None;
            }
        }
        true
    }

    /// Lets go of a session another node now serves (nothing is recorded:
    /// the store keeps it for that node): the connections subscribed or
    /// bound to it are closed with [`CLOSE_SESSION_MOVED`]. `false`: no
    /// such session.
    pub fn drop_session(&mut self, session_id: &str) -> bool {
        if self.sessions.remove(session_id).is_none() {
            return false;
        }
        let mut conns: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.subscribed.as_deref() == Some(session_id)
                    || c.bound.as_ref().is_some_and(|(s, _)| s == session_id)
            })
            .map(|(id, _)| *id)
            .collect();
        conns.sort_by_key(|c| c.0);
        for conn in conns {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.subscribed = None;
            }
            self.close(conn, CLOSE_SESSION_MOVED, close_reason(CLOSE_SESSION_MOVED));
        }
        true
    }

    /// Subscribers of a session (for metrics and tests).
    pub fn subscriber_count(&self, session_id: &str) -> usize {
        self.sessions
            .get(session_id)
            .map_or(0, |s| s.subscribers.len())
    }
}
