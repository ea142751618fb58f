//! Untrusted client frames → typed frames.
//!
//! Order of checks, cheapest first: the size cap (64 KiB before subscribe,
//! 1 MiB after), nesting depth, JSON, then the shape of the frame field by
//! field. Every failure carries the protocol's code and a message naming
//! the field; a frame over the size cap also closes the connection (1009).

use serde_json::{Map, Value};

use crate::frames::codes;
use crate::frames::{ActionEnvelope, ReplayPolicy};
use hostwire_core::json::{from_slice_bounded, JsonLimits};
use hostwire_core::JsonError;

/// The WebSocket payload cap of the live channel.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// The cap on frames before a successful subscribe; over it the socket is
/// closed with 1009.
pub const MAX_PRE_SUBSCRIBE_FRAME_BYTES: usize = 64 * 1024;
/// Nesting bound of a frame (objects and arrays).
pub const MAX_FRAME_DEPTH: usize = 64;
/// Bound on ids (`sessionId`, `appId`, `requestId`, channel names), in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Close code for a frame over the size cap ("message too big").
pub const CLOSE_MESSAGE_TOO_BIG: u16 = 1009;

/// A decoded client → server frame.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientFrame {
    Subscribe {
        request_id: Option<String>,
        payload: SubscribeRequest,
    },
    Action {
        request_id: Option<String>,
        envelope: ActionEnvelope,
    },
    Ping {
        request_id: Option<String>,
    },
    HostContextObserved {
        request_id: Option<String>,
        session_id: String,
        host_context: Map<String, Value>,
    },
    ChannelSubscribe {
        request_id: Option<String>,
        session_id: String,
        channel_name: String,
    },
    ChannelUnsubscribe {
        request_id: Option<String>,
        session_id: String,
        channel_name: String,
    },
}

impl ClientFrame {
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Self::Subscribe { request_id, .. }
            | Self::Action { request_id, .. }
            | Self::Ping { request_id }
            | Self::HostContextObserved { request_id, .. }
            | Self::ChannelSubscribe { request_id, .. }
            | Self::ChannelUnsubscribe { request_id, .. } => request_id.as_deref(),
        }
    }

    /// The frame's wire `type`.
    pub fn frame_type(&self) -> &'static str {
        match self {
            Self::Subscribe { .. } => "subscribe",
            Self::Action { .. } => "action",
            Self::Ping { .. } => "ping",
            Self::HostContextObserved { .. } => "host_context_observed",
            Self::ChannelSubscribe { .. } => "channel_subscribe",
            Self::ChannelUnsubscribe { .. } => "channel_unsubscribe",
        }
    }
}

/// The `subscribe` payload, shape-checked. `since_sequence` stays raw: a
/// malformed cursor is answered after the ack with `INVALID_SINCE_SEQUENCE`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubscribeRequest {
    pub session_id: String,
    pub app_id: Option<String>,
    pub role: Option<String>,
    pub from_seq: Option<u64>,
    pub ws_token: Option<String>,
    pub since_sequence: Option<Value>,
    pub supported_versions: Option<Vec<String>>,
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    /// The protocol's error code.
    pub code: &'static str,
    /// Names the field at fault.
    pub message: String,
    /// The frame's `requestId`, when it could be read.
    pub request_id: Option<String>,
    /// Close the connection with this code after the error frame.
    pub close: Option<u16>,
}

impl FrameError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            request_id: None,
            close: None,
        }
    }
}

/// The `requestId` of a frame that is refused before it is decoded (rate
/// limit, frames held behind a validation), so that the refusal names the
/// action it answers. Only that key is read (the rest is skipped, not
/// built); a frame that is not a JSON object, or whose `requestId` is not
/// a string of at most [`MAX_ID_BYTES`], has none.
pub fn peek_request_id(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(rename = "requestId", default)]
        request_id: Option<Value>,
    }
    if bytes.len() > MAX_FRAME_BYTES {
        return None;
    }
    let Value::String(id) = serde_json::from_slice::<Peek>(bytes).ok()?.request_id? else {
        return None;
    };
    (id.len() <= MAX_ID_BYTES).then_some(id)
}

/// Decodes one client frame. `subscribed` selects the size cap.
pub fn decode_client_frame(bytes: &[u8], subscribed: bool) -> Result<ClientFrame, FrameError> {
    let cap = if subscribed {
        MAX_FRAME_BYTES
    } else {
        MAX_PRE_SUBSCRIBE_FRAME_BYTES
    };
    if bytes.len() > cap {
        let when = if subscribed { "" } else { " before subscribe" };
        return Err(FrameError {
            close: Some(CLOSE_MESSAGE_TOO_BIG),
            ..FrameError::new(
                codes::FRAME_TOO_LARGE,
                format!(
                    "frame is {} bytes; the limit{when} is {cap} bytes",
                    bytes.len()
                ),
            )
        });
    }
    let value: Value =
        from_slice_bounded(bytes, JsonLimits::new(cap, MAX_FRAME_DEPTH)).map_err(|e| match e {
            JsonError::TooDeep { limit } => FrameError::new(
                codes::INVALID_MESSAGE,
                format!("frame is nested deeper than {limit} levels"),
            ),
            JsonError::TooLarge { size, limit } => FrameError {
                close: Some(CLOSE_MESSAGE_TOO_BIG),
                ..FrameError::new(
                    codes::FRAME_TOO_LARGE,
                    format!("frame is {size} bytes; the limit is {limit} bytes"),
                )
            },
            // A frame JSON.parse reads (a number out of f64's range) may
            // still name its requestId: the refusal is then its answer.
            JsonError::Invalid { message } => FrameError {
                request_id: peek_request_id(bytes),
                ..FrameError::new(
                    codes::INVALID_JSON,
                    format!("frame is not valid JSON: {message}"),
                )
            },
        })?;
    let Value::Object(mut frame) = value else {
        return Err(FrameError::new(
            codes::INVALID_MESSAGE,
            "frame must be a JSON object",
        ));
    };
    let request_id = match frame.remove("requestId") {
        None => None,
        Some(Value::String(s)) if s.len() <= MAX_ID_BYTES => Some(s),
        Some(Value::String(_)) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                format!("requestId is longer than {MAX_ID_BYTES} bytes"),
            ))
        }
        Some(_) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "requestId must be a string",
            ))
        }
    };
    let with_id = |mut e: FrameError| {
        e.request_id = request_id.clone();
        e
    };
    let frame_type = match frame.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(_) => {
            return Err(with_id(FrameError::new(
                codes::INVALID_MESSAGE,
                "type must be a string",
            )))
        }
        None => {
            return Err(with_id(FrameError::new(
                codes::INVALID_MESSAGE,
                "type is missing",
            )))
        }
    };
    let payload = frame.remove("payload");
    let decoded = match frame_type.as_str() {
        "subscribe" => decode_subscribe(payload).map(|payload| ClientFrame::Subscribe {
            request_id: request_id.clone(),
            payload,
        }),
        "action" => decode_action(payload).map(|envelope| ClientFrame::Action {
            request_id: request_id.clone(),
            envelope,
        }),
        "ping" => match payload {
            None | Some(Value::Object(_)) => Ok(ClientFrame::Ping {
                request_id: request_id.clone(),
            }),
            Some(_) => Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload of ping must be an object",
            )),
        },
        "host_context_observed" => {
            decode_host_context(payload).map(|(session_id, host_context)| {
                ClientFrame::HostContextObserved {
                    request_id: request_id.clone(),
                    session_id,
                    host_context,
                }
            })
        }
        "channel_subscribe" | "channel_unsubscribe" => {
            decode_channel(payload).map(|(session_id, channel_name)| {
                if frame_type == "channel_subscribe" {
                    ClientFrame::ChannelSubscribe {
                        request_id: request_id.clone(),
                        session_id,
                        channel_name,
                    }
                } else {
                    ClientFrame::ChannelUnsubscribe {
                        request_id: request_id.clone(),
                        session_id,
                        channel_name,
                    }
                }
            })
        }
        other => Err(FrameError::new(
            codes::UNSUPPORTED_MESSAGE,
            format!(
                "type '{}' is not a client frame of the live channel",
                clip(other)
            ),
        )),
    };
    decoded.map_err(with_id)
}

fn clip(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn payload_object(payload: Option<Value>, frame: &str) -> Result<Map<String, Value>, FrameError> {
    match payload {
        Some(Value::Object(m)) => Ok(m),
        Some(_) => Err(FrameError::new(
            codes::INVALID_MESSAGE,
            format!("payload of {frame} must be an object"),
        )),
        None => Err(FrameError::new(
            codes::INVALID_MESSAGE,
            format!("payload of {frame} is missing"),
        )),
    }
}

fn id_field(
    m: &Map<String, Value>,
    key: &str,
    required: bool,
) -> Result<Option<String>, FrameError> {
    match m.get(key) {
        None if required => Err(FrameError::new(
            codes::INVALID_MESSAGE,
            format!("payload.{key} is missing"),
        )),
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Err(FrameError::new(
            codes::INVALID_MESSAGE,
            format!("payload.{key} is empty"),
        )),
        Some(Value::String(s)) if s.len() > MAX_ID_BYTES => Err(FrameError::new(
            codes::INVALID_MESSAGE,
            format!("payload.{key} is longer than {MAX_ID_BYTES} bytes"),
        )),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(FrameError::new(
            codes::INVALID_MESSAGE,
            format!("payload.{key} must be a string"),
        )),
    }
}

/// Bound on `supportedVersions` entries a client may list.
pub const MAX_SUPPORTED_VERSIONS: usize = 32;

fn decode_subscribe(payload: Option<Value>) -> Result<SubscribeRequest, FrameError> {
    let m = payload_object(payload, "subscribe")?;
    let session_id = id_field(&m, "sessionId", true)?.unwrap_or_default();
    let app_id = id_field(&m, "appId", false)?;
    let role = match m.get("role") {
        None => None,
        Some(Value::String(r)) if r == "user" || r == "agent" => Some(r.clone()),
        Some(_) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.role must be 'user' or 'agent'",
            ))
        }
    };
    let from_seq = match m.get("fromSeq") {
        None => None,
        Some(v) => Some(non_negative_integer(v).ok_or_else(|| {
            FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.fromSeq must be a non-negative integer",
            )
        })?),
    };
    let ws_token = match m.get("wsToken") {
        None => None,
        Some(Value::String(s)) if s.len() <= 4096 => Some(s.clone()),
        Some(Value::String(_)) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.wsToken is longer than 4096 bytes",
            ))
        }
        Some(_) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.wsToken must be a string",
            ))
        }
    };
    let supported_versions = match m.get("supportedVersions") {
        None => None,
        Some(Value::Array(items)) => {
            if items.len() > MAX_SUPPORTED_VERSIONS {
                return Err(FrameError::new(
                    codes::INVALID_MESSAGE,
                    format!("payload.supportedVersions lists more than {MAX_SUPPORTED_VERSIONS} versions"),
                ));
            }
            let mut out = Vec::with_capacity(items.len());
            for (i, v) in items.iter().enumerate() {
                match v {
                    Value::String(s) if s.len() <= MAX_ID_BYTES => out.push(s.clone()),
                    _ => {
                        return Err(FrameError::new(
                            codes::INVALID_MESSAGE,
                            format!("payload.supportedVersions[{i}] must be a string of at most {MAX_ID_BYTES} bytes"),
                        ))
                    }
                }
            }
            Some(out)
        }
        Some(_) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.supportedVersions must be an array of strings",
            ))
        }
    };
    Ok(SubscribeRequest {
        session_id,
        app_id,
        role,
        from_seq,
        ws_token,
        since_sequence: m.get("sinceSequence").cloned(),
        supported_versions,
    })
}

/// A JSON number that is a non-negative integer (`3.0` counts, as in
/// ECMAScript's `Number.isInteger`), within `u64`.
pub fn non_negative_integer(v: &Value) -> Option<u64> {
    let n = v.as_number()?;
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    let f = n.as_f64()?;
    // 2^53: past it integers are no longer exact in the protocol's numbers.
    (f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_992.0).then_some(f as u64)
}

fn decode_action(payload: Option<Value>) -> Result<ActionEnvelope, FrameError> {
    let mut m = payload_object(payload, "action")?;
    let session_id = id_field(&m, "sessionId", true)?.unwrap_or_default();
    let event_type = match m.get("type") {
        Some(Value::String(t)) if !t.is_empty() && t.len() <= MAX_ID_BYTES => t.clone(),
        Some(Value::String(_)) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                format!("payload.type must be 1 to {MAX_ID_BYTES} bytes"),
            ))
        }
        Some(_) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.type must be a string",
            ))
        }
        None => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.type is missing",
            ))
        }
    };
    let number = |m: &Map<String, Value>, key: &str| match m.get(key) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(Some(n.clone())),
        Some(_) => Err(FrameError::new(
            codes::INVALID_MESSAGE,
            format!("payload.{key} must be a number"),
        )),
    };
    let stack_index = number(&m, "stackIndex")?;
    let client_seq = number(&m, "clientSeq")?;
    let stack_item_id = id_field(&m, "stackItemId", false)?;
    let schema_version = match m.get("schemaVersion") {
        None => None,
        // Advisory: receivers never reject on its value, only on its type.
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.schemaVersion must be a string",
            ))
        }
    };
    Ok(ActionEnvelope {
        session_id,
        event_type,
        payload: m.remove("payload"),
        stack_index,
        stack_item_id,
        client_seq,
        schema_version,
    })
}

fn decode_channel(payload: Option<Value>) -> Result<(String, String), FrameError> {
    let m = payload_object(payload, "channel frame")?;
    let session_id = id_field(&m, "sessionId", true)?.unwrap_or_default();
    let channel_name = id_field(&m, "channelName", true)?.unwrap_or_default();
    Ok((session_id, channel_name))
}

fn decode_host_context(payload: Option<Value>) -> Result<(String, Map<String, Value>), FrameError> {
    let mut m = payload_object(payload, "host_context_observed")?;
    let session_id = id_field(&m, "sessionId", true)?.unwrap_or_default();
    let host_context = match m.remove("hostContext") {
        Some(Value::Object(hc)) => hc,
        Some(_) => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.hostContext must be an object",
            ))
        }
        None => {
            return Err(FrameError::new(
                codes::INVALID_MESSAGE,
                "payload.hostContext is missing",
            ))
        }
    };
    check_host_context_projection(&host_context)?;
    Ok((session_id, host_context))
}

fn is_display_mode(v: &Value) -> bool {
    matches!(v.as_str(), Some("inline" | "fullscreen" | "pip"))
}

/// The `HostContextProjection` vocabulary, checked strictly: every field is
/// optional, a present one must have its shape, and unknown keys refuse
/// the whole frame (nothing half-valid is stored).
fn check_host_context_projection(hc: &Map<String, Value>) -> Result<(), FrameError> {
    let bad = |field: &str, what: &str| {
        Err(FrameError::new(
            codes::INVALID_MESSAGE,
            format!("payload.hostContext.{field} {what}"),
        ))
    };
    for (key, field) in hc {
        match key.as_str() {
            "availableDisplayModes" => match field {
                Value::Array(items) if items.iter().all(is_display_mode) && items.len() <= 3 => {}
                _ => return bad(key, "must be an array of 'inline' | 'fullscreen' | 'pip'"),
            },
            "currentDisplayMode" => {
                if !is_display_mode(field) {
                    return bad(key, "must be 'inline' | 'fullscreen' | 'pip'");
                }
            }
            "containerDimensions" => {
                let Value::Object(dims) = field else {
                    return bad(key, "must be an object");
                };
                for (k, v) in dims {
                    if !matches!(k.as_str(), "width" | "maxWidth" | "height" | "maxHeight") {
                        return bad(
                            &format!("{key}.{}", clip(k)),
                            "is not a field of containerDimensions",
                        );
                    }
                    if !v.is_number() {
                        return bad(&format!("{key}.{k}"), "must be a number");
                    }
                }
            }
            "platform" => {
                if !matches!(field.as_str(), Some("web" | "desktop" | "mobile")) {
                    return bad(key, "must be 'web' | 'desktop' | 'mobile'");
                }
            }
            "deviceCapabilities" => {
                let Value::Object(caps) = field else {
                    return bad(key, "must be an object");
                };
                for (k, v) in caps {
                    if !matches!(k.as_str(), "touch" | "hover") {
                        return bad(
                            &format!("{key}.{}", clip(k)),
                            "is not a field of deviceCapabilities",
                        );
                    }
                    if !v.is_boolean() {
                        return bad(&format!("{key}.{k}"), "must be a boolean");
                    }
                }
            }
            "locale" | "timeZone" => match field {
                Value::String(s) if !s.is_empty() && s.len() <= MAX_ID_BYTES => {}
                _ => return bad(key, "must be a non-empty string"),
            },
            other => return bad(clip(other), "is not a field of the host context projection"),
        }
    }
    Ok(())
}

/// Reads a stream spec `{channel: {replay?: 'none'|'latest'|'all', ...}}`
/// into channel → policy (entries without `replay` get the default).
pub fn parse_stream_spec(spec: &Value) -> Result<Vec<(String, ReplayPolicy)>, String> {
    let Value::Object(m) = spec else {
        return Err("streamSpec must be an object".into());
    };
    let mut out = Vec::with_capacity(m.len());
    for (name, entry) in m {
        if name.is_empty() || name.len() > MAX_ID_BYTES {
            return Err(format!(
                "streamSpec key '{}' must be 1 to {MAX_ID_BYTES} bytes",
                clip(name)
            ));
        }
        let Value::Object(e) = entry else {
            return Err(format!("streamSpec.{name} must be an object"));
        };
        let policy = match e.get("replay") {
            None => ReplayPolicy::default(),
            Some(Value::String(p)) => ReplayPolicy::parse(p).ok_or_else(|| {
                format!("streamSpec.{name}.replay must be 'none' | 'latest' | 'all'")
            })?,
            Some(_) => return Err(format!("streamSpec.{name}.replay must be a string")),
        };
        out.push((name.clone(), policy));
    }
    Ok(out)
}

/// A stored consume entry that may arrive as an object or as a JSON string
/// (stores that keep JSON as text). A string is parsed (bounded); any other
/// value is returned unchanged. The entry's shape is not validated.
pub fn parse_pending_envelope(stored: Value) -> Result<Value, hostwire_core::JsonError> {
    match stored {
        Value::String(text) => hostwire_core::json::from_str_bounded(
            &text,
            hostwire_core::JsonLimits::new(MAX_FRAME_BYTES, MAX_FRAME_DEPTH),
        ),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dec(v: Value, subscribed: bool) -> Result<ClientFrame, FrameError> {
        decode_client_frame(v.to_string().as_bytes(), subscribed)
    }

    #[test]
    fn a_refusal_of_json_names_the_request_id_it_can_read() {
        let frame = br#"{"type":"action","requestId":"q","payload":{"n":1e400}}"#;
        let e = decode_client_frame(frame, true).unwrap_err();
        assert_eq!(
            (e.code, e.request_id.as_deref()),
            (codes::INVALID_JSON, Some("q"))
        );
        assert!(
            e.message.contains("payload.n: number out of range"),
            "{}",
            e.message
        );
        assert_eq!(peek_request_id(br#"{"requestId":7}"#), None);
        assert_eq!(peek_request_id(b"{\"requestId\":\"a\""), None);
    }

    #[test]
    fn size_caps_close_with_1009() {
        let big =
            json!({"type": "ping", "payload": {"pad": "x".repeat(MAX_PRE_SUBSCRIBE_FRAME_BYTES)}});
        let e = dec(big.clone(), false).unwrap_err();
        assert_eq!((e.code, e.close), (codes::FRAME_TOO_LARGE, Some(1009)));
        assert!(e.message.contains("before subscribe"), "{}", e.message);
        // The same frame is fine once subscribed (the cap is then 1 MiB).
        assert!(dec(big, true).is_ok());
        let huge = json!({"type": "ping", "payload": {"pad": "x".repeat(MAX_FRAME_BYTES)}});
        assert_eq!(dec(huge, true).unwrap_err().close, Some(1009));
    }

    #[test]
    fn depth_json_and_type_errors_name_the_problem() {
        let deep = format!(
            "{{\"type\":\"ping\",\"payload\":{}{}}}",
            "[".repeat(70),
            "]".repeat(70)
        );
        let e = decode_client_frame(deep.as_bytes(), true).unwrap_err();
        assert_eq!(e.code, codes::INVALID_MESSAGE);
        assert!(e.message.contains("nested deeper than 64"));
        assert_eq!(
            decode_client_frame(b"{nope", true).unwrap_err().code,
            codes::INVALID_JSON
        );
        assert_eq!(
            decode_client_frame(b"[1]", true).unwrap_err().code,
            codes::INVALID_MESSAGE
        );
        let e = dec(json!({"type": "telepathy", "requestId": "r"}), true).unwrap_err();
        assert_eq!(
            (e.code, e.request_id.as_deref()),
            (codes::UNSUPPORTED_MESSAGE, Some("r"))
        );
        assert!(e.message.contains("telepathy"));
        let e = dec(json!({"payload": {}}), true).unwrap_err();
        assert_eq!(e.message, "type is missing");
        let e = dec(json!({"type": "ping", "requestId": 5}), true).unwrap_err();
        assert_eq!(e.message, "requestId must be a string");
    }

    #[test]
    fn subscribe_fields_are_checked() {
        let ok = dec(
            json!({"type": "subscribe", "requestId": "q", "payload": {"sessionId": "s", "appId": "a", "fromSeq": 3.0, "sinceSequence": -1, "supportedVersions": ["v"]}}),
            false,
        )
        .unwrap();
        let ClientFrame::Subscribe {
            request_id,
            payload,
        } = ok
        else {
            panic!()
        };
        assert_eq!(request_id.as_deref(), Some("q"));
        assert_eq!(payload.from_seq, Some(3));
        assert_eq!(payload.since_sequence, Some(json!(-1)));
        assert_eq!(payload.supported_versions, Some(vec!["v".to_string()]));
        for (p, field) in [
            (json!({}), "payload.sessionId is missing"),
            (
                json!({"sessionId": 1}),
                "payload.sessionId must be a string",
            ),
            (
                json!({"sessionId": "s", "appId": 2}),
                "payload.appId must be a string",
            ),
            (
                json!({"sessionId": "s", "fromSeq": -1}),
                "payload.fromSeq must be a non-negative integer",
            ),
            (
                json!({"sessionId": "s", "fromSeq": 1.5}),
                "payload.fromSeq must be a non-negative integer",
            ),
            (
                json!({"sessionId": "s", "role": "admin"}),
                "payload.role must be 'user' or 'agent'",
            ),
            (
                json!({"sessionId": "s", "supportedVersions": [1]}),
                "payload.supportedVersions[0] must be a string",
            ),
        ] {
            let e = dec(json!({"type": "subscribe", "payload": p}), false).unwrap_err();
            assert_eq!(e.code, codes::INVALID_MESSAGE);
            assert!(e.message.starts_with(field), "{} vs {field}", e.message);
        }
    }

    #[test]
    fn action_keeps_envelope_fields() {
        let f = dec(
            json!({"type": "action", "payload": {"sessionId": "s", "type": "data:submit", "payload": {"action": "a"}, "clientSeq": 4, "stackItemId": "i"}}),
            true,
        )
        .unwrap();
        let ClientFrame::Action { envelope, .. } = f else {
            panic!()
        };
        assert_eq!(envelope.payload, Some(json!({"action": "a"})));
        assert_eq!(envelope.client_seq.map(|n| n.as_u64()), Some(Some(4)));
        assert_eq!(envelope.stack_item_id.as_deref(), Some("i"));
        let e = dec(
            json!({"type": "action", "payload": {"sessionId": "s"}}),
            true,
        )
        .unwrap_err();
        assert_eq!(e.message, "payload.type is missing");
        let e = dec(json!({"type": "action", "payload": {"sessionId": "s", "type": "data:submit", "clientSeq": "4"}}), true)
            .unwrap_err();
        assert_eq!(e.message, "payload.clientSeq must be a number");
    }

    #[test]
    fn host_context_projection_is_strict() {
        let ok = json!({"availableDisplayModes": ["inline", "fullscreen"], "currentDisplayMode": "inline",
            "containerDimensions": {"maxWidth": 480, "height": 320}, "platform": "web",
            "deviceCapabilities": {"touch": false, "hover": true}, "locale": "en-US", "timeZone": "America/Los_Angeles"});
        let f = dec(json!({"type": "host_context_observed", "payload": {"sessionId": "s", "hostContext": ok}}), true).unwrap();
        let ClientFrame::HostContextObserved { host_context, .. } = f else {
            panic!()
        };
        assert_eq!(Value::Object(host_context), ok);
        for (hc, field) in [
            (json!({"theme": "dark"}), "payload.hostContext.theme"),
            (json!({"platform": "tv"}), "payload.hostContext.platform"),
            (
                json!({"containerDimensions": {"depth": 1}}),
                "payload.hostContext.containerDimensions.depth",
            ),
            (
                json!({"deviceCapabilities": {"touch": 1}}),
                "payload.hostContext.deviceCapabilities.touch",
            ),
            (json!({"locale": ""}), "payload.hostContext.locale"),
        ] {
            let e = dec(json!({"type": "host_context_observed", "payload": {"sessionId": "s", "hostContext": hc}}), true)
                .unwrap_err();
            assert!(e.message.starts_with(field), "{}", e.message);
        }
    }

    #[test]
    fn stream_spec_policies() {
        let spec =
            parse_stream_spec(&json!({"a": {"replay": "all"}, "b": {}, "c": {"replay": "latest"}}))
                .unwrap();
        assert_eq!(
            spec,
            vec![
                ("a".into(), ReplayPolicy::All),
                ("b".into(), ReplayPolicy::None),
                ("c".into(), ReplayPolicy::Latest)
            ]
        );
        assert!(parse_stream_spec(&json!({"a": {"replay": "some"}}))
            .unwrap_err()
            .contains("streamSpec.a.replay"));
    }

    #[test]
    fn parse_pending_envelope_accepts_object_or_string() {
        let obj = json!({"type": "action", "intent": "go"});
        assert_eq!(parse_pending_envelope(obj.clone()).unwrap(), obj);
        assert_eq!(
            parse_pending_envelope(Value::String(obj.to_string())).unwrap(),
            obj
        );
        assert!(parse_pending_envelope(Value::String("{nope".into())).is_err());
        // A string holding a JSON string is parsed once, not twice.
        assert_eq!(parse_pending_envelope(json!("\"x\"")).unwrap(), json!("x"));
        // Numbers and arrays pass through unchanged, like any non-string.
        assert_eq!(parse_pending_envelope(json!([1])).unwrap(), json!([1]));
    }
}
