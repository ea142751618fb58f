//! Relay protocol 1 frames (JSON text over WebSocket `/ws`).
//!
//! Client frames are decoded leniently where the reference is lenient (a
//! missing `to` drops the frame, `open` is true only for `true`) and the
//! opaque `data` of `to` / `up` is kept as a byte range of the received
//! frame, so forwarding copies it once, into the outgoing frame.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;
use std::ops::Range;

/// The relay protocol version spoken on `/ws`.
pub const RELAY_PROTOCOL: u64 = 1;

/// Close codes.
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// A fatal error, or a connection replaced by a newer one.
pub const CLOSE_POLICY: u16 = 4000;
/// The outbound queue of a consumer that cannot keep up is full.
pub const CLOSE_TOO_SLOW: u16 = 1013;
/// A frame over the WebSocket layer's own cap.
pub const CLOSE_TOO_BIG: u16 = 1009;

macro_rules! error_codes {
    ($($v:ident => $w:literal),* $(,)?) => {
        /// Relay error codes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RelayErrorCode { $($v,)* }
        impl RelayErrorCode {
            pub const ALL: &'static [RelayErrorCode] = &[$(RelayErrorCode::$v,)*];
            pub const fn as_str(self) -> &'static str {
                match self { $(RelayErrorCode::$v => $w,)* }
            }
        }
    };
}

error_codes! {
    BadMessage => "BAD_MESSAGE",
    UnsupportedProtocol => "UNSUPPORTED_PROTOCOL",
    RoomNotFound => "ROOM_NOT_FOUND",
    RoomClosed => "ROOM_CLOSED",
    RoomFull => "ROOM_FULL",
    NotAllowed => "NOT_ALLOWED",
    Kicked => "KICKED",
    RateLimited => "RATE_LIMITED",
    TooLarge => "TOO_LARGE",
}

impl fmt::Display for RelayErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decoded client frame. Strings are owned (they are short); `data` is a
/// range into the frame text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayClientMessage {
    Host {
        protocol_ok: bool,
        pin: Option<String>,
        host_token: Option<String>,
    },
    Join {
        protocol_ok: bool,
        pin: Option<String>,
        name: Option<String>,
        token: Option<String>,
    },
    /// `to` is `None` when it is not a string (the frame is dropped).
    To {
        to: Option<String>,
        data: Option<Range<usize>>,
    },
    Open {
        open: bool,
    },
    Kick {
        player_id: String,
    },
    Close,
    Up {
        data: Option<Range<usize>>,
    },
    Rename {
        name: Option<String>,
    },
    Ping,
    /// A `t` this server does not know.
    Other {
        t: String,
    },
}

impl RelayClientMessage {
    pub fn type_name(&self) -> &str {
        match self {
            RelayClientMessage::Host { .. } => "host",
            RelayClientMessage::Join { .. } => "join",
            RelayClientMessage::To { .. } => "to",
            RelayClientMessage::Open { .. } => "open",
            RelayClientMessage::Kick { .. } => "kick",
            RelayClientMessage::Close => "close",
            RelayClientMessage::Up { .. } => "up",
            RelayClientMessage::Rename { .. } => "rename",
            RelayClientMessage::Ping => "ping",
            RelayClientMessage::Other { t } => t,
        }
    }
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    pub code: RelayErrorCode,
    pub message: String,
}

#[derive(Deserialize)]
struct WireFrame<'a> {
    #[serde(borrow)]
    t: Option<&'a RawValue>,
    #[serde(borrow)]
    protocol: Option<&'a RawValue>,
    #[serde(borrow)]
    pin: Option<&'a RawValue>,
    #[serde(borrow, rename = "hostToken")]
    host_token: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    token: Option<&'a RawValue>,
    #[serde(borrow)]
    to: Option<&'a RawValue>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    #[serde(borrow)]
    open: Option<&'a RawValue>,
    #[serde(borrow, rename = "playerId")]
    player_id: Option<&'a RawValue>,
}

/// Nesting bound for client frames.
pub const FRAME_MAX_DEPTH: usize = 128;

fn as_string(raw: Option<&RawValue>) -> Option<String> {
    let raw = raw?;
    if !raw.get().starts_with('"') {
        return None;
    }
    serde_json::from_str::<String>(raw.get()).ok()
}

/// JavaScript's `String(value)` for the values a `playerId` may hold.
fn js_string(raw: Option<&RawValue>) -> String {
    match raw {
        None => "undefined".into(),
        Some(r) => as_string(Some(r)).unwrap_or_else(|| r.get().to_owned()),
    }
}

fn range_in(frame: &str, raw: Option<&RawValue>) -> Option<Range<usize>> {
    let raw = raw?;
    let start = raw.get().as_ptr() as usize - frame.as_ptr() as usize;
    Some(start..start + raw.get().len())
}

/// Decodes a client frame (already within the frame size cap).
pub fn decode_client_frame(frame: &str) -> Result<RelayClientMessage, FrameError> {
    let bad = |m: &str| FrameError {
        code: RelayErrorCode::BadMessage,
        message: m.to_owned(),
    };
    if hostwire_core::json::nesting_depth(frame.as_bytes(), FRAME_MAX_DEPTH) > FRAME_MAX_DEPTH {
        return Err(bad("Invalid JSON: nested too deeply."));
    }
    let wire: WireFrame<'_> = match serde_json::from_str(frame) {
        Ok(w) => w,
        Err(e) if e.is_data() => return Err(bad("Expected an object with \"t\".")),
        Err(_) => return Err(bad("Invalid JSON.")),
    };
    let Some(t) = as_string(wire.t) else {
        return Err(bad("Expected an object with \"t\"."));
    };
    let protocol_ok = wire
        .protocol
        .and_then(|p| p.get().parse::<f64>().ok())
        .is_some_and(|p| p == RELAY_PROTOCOL as f64);
    Ok(match t.as_str() {
        "host" => RelayClientMessage::Host {
            protocol_ok,
            pin: as_string(wire.pin),
            host_token: as_string(wire.host_token),
        },
        "join" => RelayClientMessage::Join {
            protocol_ok,
            pin: as_string(wire.pin),
            name: as_string(wire.name),
            token: as_string(wire.token),
        },
        "to" => RelayClientMessage::To {
            to: as_string(wire.to),
            data: range_in(frame, wire.data),
        },
        "open" => RelayClientMessage::Open {
            open: wire.open.is_some_and(|o| o.get() == "true"),
        },
        "kick" => RelayClientMessage::Kick {
            player_id: js_string(wire.player_id),
        },
        "close" => RelayClientMessage::Close,
        "up" => RelayClientMessage::Up {
            data: range_in(frame, wire.data),
        },
        "rename" => RelayClientMessage::Rename {
            name: as_string(wire.name),
        },
        "ping" => RelayClientMessage::Ping,
        _ => RelayClientMessage::Other { t },
    })
}

/// A 6-digit PIN.
pub fn is_pin(s: &str) -> bool {
    s.len() == 6 && s.bytes().all(|b| b.is_ascii_digit())
}

/// Whitespace runs collapsed to one space, trimmed, cut to `max` characters
/// (UTF-16 units, as the reference counts).
pub fn normalize_player_name(name: &str, max: usize) -> String {
    let collapsed = name.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::new();
    let mut units = 0;
    for c in collapsed.chars() {
        let n = c.len_utf16();
        if units + n > max {
            break;
        }
        units += n;
        out.push(c);
    }
    // A cut may leave a trailing space.
    out.trim_end().to_owned()
}

/// A player as the host sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RelayPlayer {
    pub id: String,
    pub name: String,
    pub connected: bool,
}

/// Presence events sent to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresenceEvent {
    Join,
    Connect,
    Disconnect,
    Rename,
    Leave,
}

impl PresenceEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            PresenceEvent::Join => "join",
            PresenceEvent::Connect => "connect",
            PresenceEvent::Disconnect => "disconnect",
            PresenceEvent::Rename => "rename",
            PresenceEvent::Leave => "leave",
        }
    }
}

/// Why a room closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedReason {
    Host,
    Expired,
    Kicked,
}

impl ClosedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ClosedReason::Host => "host",
            ClosedReason::Expired => "expired",
            ClosedReason::Kicked => "kicked",
        }
    }
}

/// Server frames, serialized once into shareable bytes.
pub mod frames {
    use super::*;
    use serde_json::json;

    fn to_bytes(v: serde_json::Value) -> Bytes {
        Bytes::from(v.to_string())
    }

    pub fn error(code: RelayErrorCode, message: &str, fatal: bool) -> Bytes {
        to_bytes(json!({"t": "error", "code": code.as_str(), "message": message, "fatal": fatal}))
    }
    pub fn pong(time_ms: u64) -> Bytes {
        to_bytes(json!({"t": "pong", "time": time_ms}))
    }
    pub fn hosting(pin: &str, players: &[RelayPlayer]) -> Bytes {
        to_bytes(json!({"t": "hosting", "pin": pin, "players": players}))
    }
    pub fn joined(
        pin: &str,
        player_id: &str,
        token: &str,
        name: &str,
        host_connected: bool,
    ) -> Bytes {
        to_bytes(
            json!({"t": "joined", "pin": pin, "playerId": player_id, "token": token, "name": name, "hostConnected": host_connected}),
        )
    }
    pub fn presence(player: &RelayPlayer, event: PresenceEvent) -> Bytes {
        to_bytes(json!({"t": "presence", "player": player, "event": event.as_str()}))
    }
    pub fn host_presence(connected: bool) -> Bytes {
        to_bytes(json!({"t": "host-presence", "connected": connected}))
    }
    pub fn closed(reason: ClosedReason) -> Bytes {
        to_bytes(json!({"t": "closed", "reason": reason.as_str()}))
    }

    /// `{"t":"from","from":ID,"data":DATA}` with DATA copied as received.
    pub fn from(player_id: &str, data: Option<&str>) -> Bytes {
        let id = serde_json::to_string(player_id).unwrap_or_default();
        let mut b = BytesMut::with_capacity(32 + id.len() + data.map_or(0, str::len));
        b.put_slice(b"{\"t\":\"from\",\"from\":");
        b.put_slice(id.as_bytes());
        if let Some(d) = data {
            b.put_slice(b",\"data\":");
            b.put_slice(d.as_bytes());
        }
        b.put_u8(b'}');
        b.freeze()
    }

    /// `{"t":"data","data":DATA}` with DATA copied as received.
    pub fn data(data: Option<&str>) -> Bytes {
        let mut b = BytesMut::with_capacity(24 + data.map_or(0, str::len));
        b.put_slice(b"{\"t\":\"data\"");
        if let Some(d) = data {
            b.put_slice(b",\"data\":");
            b.put_slice(d.as_bytes());
        }
        b.put_u8(b'}');
        b.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_client_frame() {
        let f = r#"{"t":"host","protocol":1,"pin":"123456","hostToken":"abc"}"#;
        assert_eq!(
            decode_client_frame(f).unwrap(),
            RelayClientMessage::Host {
                protocol_ok: true,
                pin: Some("123456".into()),
                host_token: Some("abc".into())
            }
        );
        let f = r#"{"t":"join","protocol":2,"pin":"123456","name":"Ann"}"#;
        assert!(matches!(
            decode_client_frame(f).unwrap(),
            RelayClientMessage::Join {
                protocol_ok: false,
                token: None,
                ..
            }
        ));
        let f = r#"{"t":"to","to":"p-1","data":{"x":[1, 2]}}"#;
        let RelayClientMessage::To { to, data } = decode_client_frame(f).unwrap() else {
            panic!()
        };
        assert_eq!(to.as_deref(), Some("p-1"));
        assert_eq!(&f[data.unwrap()], r#"{"x":[1, 2]}"#);
        assert_eq!(
            decode_client_frame(r#"{"t":"open","open":1}"#).unwrap(),
            RelayClientMessage::Open { open: false }
        );
        assert_eq!(
            decode_client_frame(r#"{"t":"open","open":true}"#).unwrap(),
            RelayClientMessage::Open { open: true }
        );
        assert_eq!(
            decode_client_frame(r#"{"t":"kick","playerId":5}"#).unwrap(),
            RelayClientMessage::Kick {
                player_id: "5".into()
            }
        );
        assert_eq!(
            decode_client_frame(r#"{"t":"close"}"#).unwrap(),
            RelayClientMessage::Close
        );
        assert_eq!(
            decode_client_frame(r#"{"t":"up"}"#).unwrap(),
            RelayClientMessage::Up { data: None }
        );
        assert_eq!(
            decode_client_frame(r#"{"t":"rename","name":7}"#).unwrap(),
            RelayClientMessage::Rename { name: None }
        );
        assert_eq!(
            decode_client_frame(r#"{"t":"ping"}"#).unwrap(),
            RelayClientMessage::Ping
        );
        assert_eq!(
            decode_client_frame(r#"{"t":"fly"}"#).unwrap(),
            RelayClientMessage::Other { t: "fly".into() }
        );
    }

    #[test]
    fn bad_frames_are_bad_message() {
        for f in [
            "",
            "{",
            "nope",
            "[1]",
            "1",
            "null",
            r#"{"x":1}"#,
            r#"{"t":5}"#,
        ] {
            let e = decode_client_frame(f).unwrap_err();
            assert_eq!(e.code, RelayErrorCode::BadMessage, "{f}");
        }
        let deep = format!(
            "{{\"t\":\"up\",\"data\":{}{}}}",
            "[".repeat(200),
            "]".repeat(200)
        );
        assert_eq!(
            decode_client_frame(&deep).unwrap_err().code,
            RelayErrorCode::BadMessage
        );
    }

    #[test]
    fn names_are_normalized() {
        assert_eq!(normalize_player_name("  Ann \t\n  Lee  ", 32), "Ann Lee");
        assert_eq!(normalize_player_name("   ", 32), "");
        assert_eq!(normalize_player_name(&"x".repeat(40), 32).len(), 32);
        assert_eq!(normalize_player_name("abc def", 4), "abc");
        assert_eq!(normalize_player_name("🐎🐎🐎", 4), "🐎🐎");
    }

    #[test]
    fn forwarded_frames_copy_data_verbatim() {
        assert_eq!(
            &frames::from("p-1", Some(r#"{"a": 1}"#))[..],
            br#"{"t":"from","from":"p-1","data":{"a": 1}}"#
        );
        assert_eq!(&frames::data(None)[..], br#"{"t":"data"}"#);
        let v: serde_json::Value = serde_json::from_slice(&frames::data(Some("[1,2]"))).unwrap();
        assert_eq!(v["data"], serde_json::json!([1, 2]));
        assert!(is_pin("123456") && !is_pin("12345") && !is_pin("12345a"));
    }
}
