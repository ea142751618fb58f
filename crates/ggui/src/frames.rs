//! The wire: every WebSocket message is `{type, payload, requestId?}`.
//!
//! Struct fields are declared in the order the protocol's builders write
//! keys, and optional fields that are absent are omitted (never `null`),
//! so `serde_json` output is byte-identical to the reference builders'
//! `JSON.stringify` output.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;

use crate::PROTOCOL_SCHEMA_VERSION;

/// The reserved channel prefix: server-owned channels no agent may declare.
pub const RESERVED_CHANNEL_PREFIX: &str = "_ggui:";
/// Where `ContractErrorPayload`s are delivered.
pub const CONTRACT_ERROR_CHANNEL: &str = "_ggui:contract-error";
/// Generation-progress lifecycle envelopes.
pub const LIFECYCLE_CHANNEL: &str = "_ggui:lifecycle";
/// Preview envelopes.
pub const PREVIEW_CHANNEL: &str = "_ggui:preview";

/// The only `ActionEnvelope.type` the protocol defines.
pub const EVENT_TYPE_DATA_SUBMIT: &str = "data:submit";
/// The ledger event type of an accepted user action.
pub const LEDGER_USER_SUBMITTED: &str = "user.submitted";
/// The ledger event type of a props push.
pub const LEDGER_UI_UPDATED: &str = "ui.updated";

/// Error codes the live channel sends in `error` frames.
pub mod codes {
    pub const INVALID_JSON: &str = "INVALID_JSON";
    pub const INVALID_MESSAGE: &str = "INVALID_MESSAGE";
    pub const UNSUPPORTED_MESSAGE: &str = "UNSUPPORTED_MESSAGE";
    pub const NOT_SUBSCRIBED: &str = "NOT_SUBSCRIBED";
    pub const SESSION_NOT_FOUND: &str = "SESSION_NOT_FOUND";
    pub const SESSION_MISMATCH: &str = "SESSION_MISMATCH";
    pub const SESSION_CREATE_FAILED: &str = "SESSION_CREATE_FAILED";
    pub const APP_MISMATCH: &str = "APP_MISMATCH";
    pub const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
    pub const UPGRADE_REQUIRED: &str = "UPGRADE_REQUIRED";
    pub const CONTRACT_VIOLATION: &str = "CONTRACT_VIOLATION";
    pub const APPEND_FAILED: &str = "APPEND_FAILED";
    pub const REPLAY_HORIZON_PASSED: &str = "REPLAY_HORIZON_PASSED";
    pub const INVALID_SINCE_SEQUENCE: &str = "INVALID_SINCE_SEQUENCE";
    pub const CHANNEL_UNKNOWN: &str = "CHANNEL_UNKNOWN";
    /// hostwire's own: a frame over the size cap.
    pub const FRAME_TOO_LARGE: &str = "FRAME_TOO_LARGE";
    /// hostwire's own: the per-connection rate limit.
    pub const RATE_LIMITED: &str = "RATE_LIMITED";
    /// hostwire's own: the bound on subscribers of one session.
    pub const TOO_MANY_SUBSCRIBERS: &str = "TOO_MANY_SUBSCRIBERS";
}

/// Contract-error codes of `ContractErrorPayload.error.code` (the set is
/// open: any string is allowed on the wire).
pub mod contract_error_codes {
    pub const SCHEMA_VIOLATION: &str = "SCHEMA_VIOLATION";
    pub const SCHEMA_MISMATCH_ERROR: &str = "SCHEMA_MISMATCH_ERROR";
    pub const SESSION_NOT_FOUND: &str = "SESSION_NOT_FOUND";
    pub const AUTH_REJECTED: &str = "AUTH_REJECTED";
    pub const INVALID_ACTION_KIND: &str = "INVALID_ACTION_KIND";
    pub const PIPE_NOT_FOUND: &str = "PIPE_NOT_FOUND";
    pub const CONTEXT_TOO_LARGE: &str = "CONTEXT_TOO_LARGE";
}

/// How a builder treats `schemaVersion`: the three paths of the
/// protocol's builders (key omitted, a string given, explicit undefined).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SchemaVersionStamp {
    /// Key omitted: stamp [`PROTOCOL_SCHEMA_VERSION`].
    #[default]
    Default,
    /// A string given: used as is.
    Given(String),
    /// Explicit `undefined`: no `schemaVersion` key at all.
    Omit,
}

impl SchemaVersionStamp {
    fn resolve(&self) -> Option<String> {
        match self {
            Self::Default => Some(PROTOCOL_SCHEMA_VERSION.to_owned()),
            Self::Given(s) => Some(s.clone()),
            Self::Omit => None,
        }
    }
}

/// `StreamEnvelope.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StreamChannelMode {
    #[default]
    Append,
    Replace,
}

impl StreamChannelMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "append" => Some(Self::Append),
            "replace" => Some(Self::Replace),
            _ => None,
        }
    }
}

/// A channel's replay policy: what a reconnecting subscriber gets back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReplayPolicy {
    /// Nothing is kept (the protocol's default).
    #[default]
    None,
    /// One slot per channel: the latest envelope.
    Latest,
    /// Every envelope, up to the session's buffer bound, oldest evicted.
    All,
}

impl ReplayPolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(Self::None),
            "latest" => Some(Self::Latest),
            "all" => Some(Self::All),
            _ => None,
        }
    }
}

/// `ActionEnvelope`: what a UI sends when the user acts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionEnvelope {
    pub session_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_index: Option<serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_item_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_seq: Option<serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<String>,
}

impl ActionEnvelope {
    /// The envelope as a JSON value, moving its fields: the same value
    /// `serde_json::to_value` gives (keys in declaration order, absent
    /// options omitted) without copying the payload.
    pub fn into_value(self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("sessionId".into(), Value::String(self.session_id));
        m.insert("type".into(), Value::String(self.event_type));
        if let Some(p) = self.payload {
            m.insert("payload".into(), p);
        }
        if let Some(n) = self.stack_index {
            m.insert("stackIndex".into(), Value::Number(n));
        }
        if let Some(id) = self.stack_item_id {
            m.insert("stackItemId".into(), Value::String(id));
        }
        if let Some(n) = self.client_seq {
            m.insert("clientSeq".into(), Value::Number(n));
        }
        if let Some(v) = self.schema_version {
            m.insert("schemaVersion".into(), Value::String(v));
        }
        Value::Object(m)
    }
}

/// Input of [`make_action_envelope`].
#[derive(Debug, Clone, Default)]
pub struct MakeActionEnvelope {
    pub session_id: String,
    pub event_type: String,
    pub payload: Option<Value>,
    pub stack_index: Option<serde_json::Number>,
    pub stack_item_id: Option<String>,
    pub client_seq: Option<serde_json::Number>,
    pub schema_version: SchemaVersionStamp,
}

/// Builds an [`ActionEnvelope`], stamping `schemaVersion` per `parts`.
pub fn make_action_envelope(parts: MakeActionEnvelope) -> ActionEnvelope {
    ActionEnvelope {
        schema_version: parts.schema_version.resolve(),
        session_id: parts.session_id,
        event_type: parts.event_type,
        payload: parts.payload,
        stack_index: parts.stack_index,
        stack_item_id: parts.stack_item_id,
        client_seq: parts.client_seq,
    }
}

/// `StreamEnvelope`: what the agent pushes to the UI on a channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamEnvelope {
    pub session_id: String,
    pub channel: String,
    pub mode: StreamChannelMode,
    pub payload: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub complete: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<String>,
}

/// Input of [`make_stream_envelope`].
#[derive(Debug, Clone, Default)]
pub struct MakeStreamEnvelope {
    pub session_id: String,
    pub channel: String,
    pub mode: StreamChannelMode,
    pub payload: Value,
    pub complete: Option<bool>,
    pub seq: Option<u64>,
    pub schema_version: SchemaVersionStamp,
}

/// Builds a [`StreamEnvelope`], stamping `schemaVersion` per `parts`.
pub fn make_stream_envelope(parts: MakeStreamEnvelope) -> StreamEnvelope {
    StreamEnvelope {
        schema_version: parts.schema_version.resolve(),
        session_id: parts.session_id,
        channel: parts.channel,
        mode: parts.mode,
        payload: parts.payload,
        complete: parts.complete,
        seq: parts.seq,
    }
}

/// `ErrorPayload` of an `error` frame. Never stamped with `schemaVersion`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorPayload {
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// Only on `UPGRADE_REQUIRED`: the version this server advertises
    /// (also in `details`), where ggui's reference server puts it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
}

/// Builds an [`ErrorPayload`] (`details` omitted when `None`).
pub fn make_error_payload(
    code: impl Into<String>,
    message: impl Into<String>,
    details: Option<Value>,
) -> ErrorPayload {
    ErrorPayload {
        code: code.into(),
        message: message.into(),
        details,
        server_version: None,
    }
}

/// `ContractErrorPayload.error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContractError {
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<String>,
}

/// `ContractErrorPayload.sourceAction`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceAction {
    /// `wired-action`, `refresh-stream`, or any other string.
    #[serde(rename = "type")]
    pub action_type: String,
    pub dispatched_at: String,
}

/// `ContractErrorPayload`: a tool failed its contract at runtime; delivered
/// on [`CONTRACT_ERROR_CHANNEL`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContractErrorPayload {
    pub tool_name: String,
    pub error: ContractError,
    pub timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_action: Option<SourceAction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<String>,
}

/// Input of [`make_contract_error_payload`].
#[derive(Debug, Clone)]
pub struct MakeContractErrorPayload {
    pub tool_name: String,
    pub action_name: Option<String>,
    pub source_action: Option<SourceAction>,
    pub error: ContractError,
    pub timestamp: String,
    pub schema_version: SchemaVersionStamp,
}

/// Builds a [`ContractErrorPayload`], stamping `schemaVersion` per `parts`.
pub fn make_contract_error_payload(parts: MakeContractErrorPayload) -> ContractErrorPayload {
    ContractErrorPayload {
        schema_version: parts.schema_version.resolve(),
        tool_name: parts.tool_name,
        error: parts.error,
        timestamp: parts.timestamp,
        action_name: parts.action_name,
        source_action: parts.source_action,
    }
}

/// The subscribe ack (`AckPayload`) and an action's ack (`{sequence, timestamp}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AckPayload {
    pub sequence: u64,
    pub timestamp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_truncated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
}

/// One entry of a session's event ledger, sent as a `render_event` frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GguiSessionEvent {
    pub seq: u64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub timestamp: String,
    pub data: Value,
}

/// `props_update` payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PropsUpdatePayload {
    pub session_id: String,
    pub props: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

/// `drain_ack` payload: the agent consumed an action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainAckPayload {
    pub app_id: String,
    pub session_id: String,
    pub event_id: String,
    pub drained_at: String,
}

/// `channel_error` payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelErrorPayload {
    pub session_id: String,
    pub channel_name: String,
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// One drained action as the agent sees it (`ConsumeEventEntry`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumeEventEntry {
    /// Always `action`.
    #[serde(rename = "type")]
    pub entry_type: String,
    pub stack_item_id: String,
    /// The action name.
    pub intent: String,
    /// The action's `data` as JSON text: a pending action keeps its text,
    /// not a tree many times its size.
    pub action_data: Box<serde_json::value::RawValue>,
    pub ui_context: Map<String, Value>,
    /// The ledger sequence of the action, as a string.
    pub action_id: String,
    pub fired_at: String,
}

/// Server → client frame types.
pub mod frame_types {
    pub const ACK: &str = "ack";
    pub const ERROR: &str = "error";
    pub const PONG: &str = "pong";
    pub const RENDER: &str = "render";
    pub const DATA: &str = "data";
    pub const PROPS_UPDATE: &str = "props_update";
    pub const CHANNEL_PAYLOAD: &str = "channel_payload";
    pub const CHANNEL_ERROR: &str = "channel_error";
    pub const DRAIN_ACK: &str = "drain_ack";
    pub const RENDER_EVENT: &str = "render_event";
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FrameRef<'a, P: Serialize> {
    #[serde(rename = "type")]
    frame_type: &'a str,
    payload: &'a P,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
}

/// Serializes `{type, payload, requestId?}` once, for every reader.
pub fn encode_frame<P: Serialize>(
    frame_type: &str,
    payload: &P,
    request_id: Option<&str>,
) -> Arc<str> {
    let frame = FrameRef {
        frame_type,
        payload,
        request_id,
    };
    // Serializing typed values and `Value`s into a string cannot fail.
    Arc::from(serde_json::to_string(&frame).unwrap_or_default())
}

/// An `error` frame.
pub fn encode_error(payload: &ErrorPayload, request_id: Option<&str>) -> Arc<str> {
    encode_frame(frame_types::ERROR, payload, request_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn an_action_envelope_moved_into_a_value_is_what_serde_gives() {
        let full = ActionEnvelope {
            session_id: "s".into(),
            event_type: "data:submit".into(),
            payload: Some(json!({"action": "a", "data": {"z": 1, "a": [true]}})),
            stack_index: Some(2.into()),
            stack_item_id: Some("item".into()),
            client_seq: Some(7.into()),
            schema_version: Some("v".into()),
        };
        let bare = ActionEnvelope {
            payload: None,
            stack_index: None,
            stack_item_id: None,
            client_seq: None,
            schema_version: None,
            ..full.clone()
        };
        for e in [full, bare] {
            let expected = serde_json::to_value(&e).unwrap();
            let moved = e.into_value();
            assert_eq!(s(&moved), s(&expected));
        }
    }

    #[test]
    fn stamp_rules() {
        let base = || MakeStreamEnvelope {
            session_id: "s".into(),
            channel: "c".into(),
            payload: json!(1),
            ..Default::default()
        };
        assert_eq!(
            make_stream_envelope(base()).schema_version.as_deref(),
            Some(PROTOCOL_SCHEMA_VERSION)
        );
        let given = make_stream_envelope(MakeStreamEnvelope {
            schema_version: SchemaVersionStamp::Given("x".into()),
            ..base()
        });
        assert_eq!(given.schema_version.as_deref(), Some("x"));
        let omitted = make_stream_envelope(MakeStreamEnvelope {
            schema_version: SchemaVersionStamp::Omit,
            ..base()
        });
        assert!(!s(&omitted).contains("schemaVersion"));
    }

    #[test]
    fn error_payload_omits_details_and_frame_omits_request_id() {
        let e = make_error_payload("X", "m", None);
        assert_eq!(
            &*encode_error(&e, None),
            r#"{"type":"error","payload":{"code":"X","message":"m"}}"#
        );
        assert_eq!(
            &*encode_error(&e, Some("r1")),
            r#"{"type":"error","payload":{"code":"X","message":"m"},"requestId":"r1"}"#
        );
    }

    #[test]
    fn iso_timestamps_have_milliseconds() {
        assert_eq!(crate::iso_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            crate::iso_timestamp(1_796_022_000_123),
            "2026-11-30T07:00:00.123Z"
        );
    }
}
