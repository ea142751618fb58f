//! Relay protocol 1 frames (JSON text over WebSocket `/ws`).
//!
//! Client frames are decoded leniently where the reference is lenient (a
//! missing `to` drops the frame, `open` is true only for `true`) and the
//! opaque `data` of `to` / `up` is kept as a byte range of the received
//! frame, so forwarding copies it once, into the outgoing frame.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
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
/// The server could not do what was asked (its store failed); the client
/// may try again.
pub const CLOSE_INTERNAL_ERROR: u16 = 1011;

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
    // Not in the reference relay (it keeps nothing on disk): a change the
    // server could not make durable, so it did not make it. The Memizy
    // protocol's own word for a host-side failure the caller may retry.
    InternalError => "INTERNAL_ERROR",
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

/// What a client frame was, as counted: its `t`, `other` for a `t` this
/// server does not know, `invalid` for a frame that did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientFrameKind {
    Host,
    Join,
    To,
    Open,
    Kick,
    Close,
    Up,
    Rename,
    Ping,
    Other,
    Invalid,
}

impl ClientFrameKind {
    pub const ALL: &'static [ClientFrameKind] = &[
        ClientFrameKind::Host,
        ClientFrameKind::Join,
        ClientFrameKind::To,
        ClientFrameKind::Open,
        ClientFrameKind::Kick,
        ClientFrameKind::Close,
        ClientFrameKind::Up,
        ClientFrameKind::Rename,
        ClientFrameKind::Ping,
        ClientFrameKind::Other,
        ClientFrameKind::Invalid,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ClientFrameKind::Host => "host",
            ClientFrameKind::Join => "join",
            ClientFrameKind::To => "to",
            ClientFrameKind::Open => "open",
            ClientFrameKind::Kick => "kick",
            ClientFrameKind::Close => "close",
            ClientFrameKind::Up => "up",
            ClientFrameKind::Rename => "rename",
            ClientFrameKind::Ping => "ping",
            ClientFrameKind::Other => "other",
            ClientFrameKind::Invalid => "invalid",
        }
    }
}

impl RelayClientMessage {
    pub fn kind(&self) -> ClientFrameKind {
        match self {
            RelayClientMessage::Host { .. } => ClientFrameKind::Host,
            RelayClientMessage::Join { .. } => ClientFrameKind::Join,
            RelayClientMessage::To { .. } => ClientFrameKind::To,
            RelayClientMessage::Open { .. } => ClientFrameKind::Open,
            RelayClientMessage::Kick { .. } => ClientFrameKind::Kick,
            RelayClientMessage::Close => ClientFrameKind::Close,
            RelayClientMessage::Up { .. } => ClientFrameKind::Up,
            RelayClientMessage::Rename { .. } => ClientFrameKind::Rename,
            RelayClientMessage::Ping => ClientFrameKind::Ping,
            RelayClientMessage::Other { .. } => ClientFrameKind::Other,
        }
    }

    /// The frame's `t`, as a client wrote it.
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

/// A client frame's fields as a struct for one serde pass: the fields
/// given, then the others as raw text over the frame (a field present as
/// `null` is absent, as the reference reads it). Unknown fields are
/// skipped; a known field twice is refused.
macro_rules! wire_fields {
    ($(#[$attr:meta])* struct $name:ident { $($field:tt)* }) => {
        $(#[$attr])*
        #[derive(Deserialize)]
        struct $name<'a> {
            $($field)*
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
            data: Option<&'a RawValue>,
            #[serde(borrow)]
            open: Option<&'a RawValue>,
            #[serde(borrow, rename = "playerId")]
            player_id: Option<&'a RawValue>,
        }
    };
}

wire_fields! {
    /// Every field of every client frame, as raw text.
    struct WireFrame {
        #[serde(borrow)]
        t: Option<&'a RawValue>,
        #[serde(borrow)]
        to: Option<&'a RawValue>,
    }
}

wire_fields! {
    /// The frames a game is made of (`to`, `up`) with `t` and `to` read as
    /// strings in the same pass, without a raw value each; the other
    /// fields are read only so that a duplicate is refused as [`WireFrame`]
    /// refuses it. Any frame it does not take (another `t`, a string with
    /// escapes, a `to` that is not a string) is read again by
    /// [`WireFrame`], which decides.
    #[allow(dead_code)]
    struct GameFrame {
        #[serde(borrow)]
        t: Option<&'a str>,
        #[serde(borrow)]
        to: Option<&'a str>,
    }
}

/// Nesting bound for client frames.
pub const FRAME_MAX_DEPTH: usize = 128;

fn as_string(raw: Option<&RawValue>) -> Option<String> {
    as_str(raw).map(Cow::into_owned)
}

/// A JSON string's value, borrowed where it has no escapes (the frame's
/// `t`, read on every frame, always).
fn as_str(raw: Option<&RawValue>) -> Option<Cow<'_, str>> {
    let raw = raw?.get();
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    // RawValue holds valid JSON: a string without a backslash is its text.
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
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
    check_depth(frame)?;
    if let Ok(game) = serde_json::from_str::<GameFrame<'_>>(frame) {
        match game.t {
            Some("to") => {
                return Ok(RelayClientMessage::To {
                    to: game.to.map(str::to_owned),
                    data: range_in(frame, game.data),
                })
            }
            Some("up") => {
                return Ok(RelayClientMessage::Up {
                    data: range_in(frame, game.data),
                })
            }
            _ => {}
        }
    }
    decode_by_fields(frame)
}

/// [`decode_client_frame`] without its one-pass path for `to` and `up`:
/// the fuzz target and the tests hold both to the same answers.
#[doc(hidden)]
pub fn decode_client_frame_by_fields(frame: &str) -> Result<RelayClientMessage, FrameError> {
    check_depth(frame)?;
    decode_by_fields(frame)
}

/// Nesting first, before any parser recurses.
fn check_depth(frame: &str) -> Result<(), FrameError> {
    if hostwire_core::json::deeper_than(frame.as_bytes(), FRAME_MAX_DEPTH) {
        return Err(FrameError {
            code: RelayErrorCode::BadMessage,
            message: "Invalid JSON: nested too deeply.".into(),
        });
    }
    Ok(())
}

/// Every frame, field by field from raw values.
fn decode_by_fields(frame: &str) -> Result<RelayClientMessage, FrameError> {
    let bad = |m: &str| FrameError {
        code: RelayErrorCode::BadMessage,
        message: m.to_owned(),
    };
    let wire: WireFrame<'_> = match serde_json::from_str(frame) {
        Ok(w) => w,
        Err(e) if e.is_data() => return Err(bad("Expected an object with \"t\".")),
        Err(_) => return Err(bad("Invalid JSON.")),
    };
    let Some(t) = as_str(wire.t) else {
        return Err(bad("Expected an object with \"t\"."));
    };
    let protocol_ok = wire
        .protocol
        .and_then(|p| p.get().parse::<f64>().ok())
        .is_some_and(|p| p == RELAY_PROTOCOL as f64);
    Ok(match &*t {
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
        _ => RelayClientMessage::Other { t: t.into_owned() },
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

/// A server frame, typed until it is written. `from` and `data` carry the
/// forwarded `data` as a byte range of the client frame that is being
/// handled, so that it is copied once, into the written frame: encode them
/// with that frame ([`RelayServerMessage::encode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayServerMessage {
    Hosting {
        pin: String,
        players: Vec<RelayPlayer>,
    },
    Joined {
        pin: String,
        player_id: String,
        token: String,
        name: String,
        host_connected: bool,
    },
    Presence {
        player: RelayPlayer,
        event: PresenceEvent,
    },
    HostPresence {
        connected: bool,
    },
    From {
        from: String,
        data: Option<Range<usize>>,
    },
    Data {
        data: Option<Range<usize>>,
    },
    Error {
        code: RelayErrorCode,
        message: Cow<'static, str>,
        fatal: bool,
    },
    Closed {
        reason: ClosedReason,
    },
    Pong {
        time: u64,
    },
}

/// What a server frame is, as counted: its `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerFrameKind {
    Hosting,
    Joined,
    Presence,
    HostPresence,
    From,
    Data,
    Error,
    Closed,
    Pong,
}

impl ServerFrameKind {
    pub const ALL: &'static [ServerFrameKind] = &[
        ServerFrameKind::Hosting,
        ServerFrameKind::Joined,
        ServerFrameKind::Presence,
        ServerFrameKind::HostPresence,
        ServerFrameKind::From,
        ServerFrameKind::Data,
        ServerFrameKind::Error,
        ServerFrameKind::Closed,
        ServerFrameKind::Pong,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ServerFrameKind::Hosting => "hosting",
            ServerFrameKind::Joined => "joined",
            ServerFrameKind::Presence => "presence",
            ServerFrameKind::HostPresence => "host-presence",
            ServerFrameKind::From => "from",
            ServerFrameKind::Data => "data",
            ServerFrameKind::Error => "error",
            ServerFrameKind::Closed => "closed",
            ServerFrameKind::Pong => "pong",
        }
    }

    /// `from` and `data` forward what a client sent.
    pub const fn is_forwarded(self) -> bool {
        matches!(self, ServerFrameKind::From | ServerFrameKind::Data)
    }
}

impl RelayServerMessage {
    /// `{t:'error', code, message, fatal}`.
    pub fn error(code: RelayErrorCode, message: impl Into<Cow<'static, str>>, fatal: bool) -> Self {
        RelayServerMessage::Error {
            code,
            message: message.into(),
            fatal,
        }
    }

    pub fn kind(&self) -> ServerFrameKind {
        match self {
            RelayServerMessage::Hosting { .. } => ServerFrameKind::Hosting,
            RelayServerMessage::Joined { .. } => ServerFrameKind::Joined,
            RelayServerMessage::Presence { .. } => ServerFrameKind::Presence,
            RelayServerMessage::HostPresence { .. } => ServerFrameKind::HostPresence,
            RelayServerMessage::From { .. } => ServerFrameKind::From,
            RelayServerMessage::Data { .. } => ServerFrameKind::Data,
            RelayServerMessage::Error { .. } => ServerFrameKind::Error,
            RelayServerMessage::Closed { .. } => ServerFrameKind::Closed,
            RelayServerMessage::Pong { .. } => ServerFrameKind::Pong,
        }
    }

    /// The error code of an `error` frame.
    pub fn error_code(&self) -> Option<RelayErrorCode> {
        match self {
            RelayServerMessage::Error { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The frame's JSON text. `source` is the client frame that `from` and
    /// `data` ranges point into (other frames ignore it).
    pub fn encode(&self, source: &str) -> String {
        let slice = |r: &Option<Range<usize>>| r.as_ref().and_then(|r| source.get(r.clone()));
        match self {
            RelayServerMessage::Hosting { pin, players } => frames::hosting(pin, players),
            RelayServerMessage::Joined {
                pin,
                player_id,
                token,
                name,
                host_connected,
            } => frames::joined(pin, player_id, token, name, *host_connected),
            RelayServerMessage::Presence { player, event } => frames::presence(player, *event),
            RelayServerMessage::HostPresence { connected } => frames::host_presence(*connected),
            RelayServerMessage::From { from, data } => frames::from(from, slice(data)),
            RelayServerMessage::Data { data } => frames::data(slice(data)),
            RelayServerMessage::Error {
                code,
                message,
                fatal,
            } => frames::error(*code, message, *fatal),
            RelayServerMessage::Closed { reason } => frames::closed(*reason),
            RelayServerMessage::Pong { time } => frames::pong(*time),
        }
    }
}

/// Server frames as JSON text.
pub mod frames {
    use super::*;
    use serde_json::json;

    pub fn error(code: RelayErrorCode, message: &str, fatal: bool) -> String {
        json!({"t": "error", "code": code.as_str(), "message": message, "fatal": fatal}).to_string()
    }
    pub fn pong(time_ms: u64) -> String {
        json!({"t": "pong", "time": time_ms}).to_string()
    }
    pub fn hosting(pin: &str, players: &[RelayPlayer]) -> String {
        json!({"t": "hosting", "pin": pin, "players": players}).to_string()
    }
    pub fn joined(
        pin: &str,
        player_id: &str,
        token: &str,
        name: &str,
        host_connected: bool,
    ) -> String {
        json!({"t": "joined", "pin": pin, "playerId": player_id, "token": token, "name": name, "hostConnected": host_connected}).to_string()
    }
    pub fn presence(player: &RelayPlayer, event: PresenceEvent) -> String {
        json!({"t": "presence", "player": player, "event": event.as_str()}).to_string()
    }
    pub fn host_presence(connected: bool) -> String {
        json!({"t": "host-presence", "connected": connected}).to_string()
    }
    pub fn closed(reason: ClosedReason) -> String {
        json!({"t": "closed", "reason": reason.as_str()}).to_string()
    }

    // The forwarded frames are built at their exact length: a `String`
    // whose capacity is its length becomes the socket's `Bytes` without
    // another allocation.

    /// `{"t":"from","from":ID,"data":DATA}` with DATA copied as received.
    pub fn from(player_id: &str, data: Option<&str>) -> String {
        // Our ids never need escaping; one that did is escaped all the same.
        let plain = !player_id
            .bytes()
            .any(|c| c == b'"' || c == b'\\' || c < 0x20);
        let escaped;
        let id = if plain {
            player_id
        } else {
            escaped = serde_json::to_string(player_id).unwrap_or_default();
            &escaped[1..escaped.len() - 1]
        };
        let data_len = data.map_or(0, |d| DATA_KEY.len() + d.len());
        let mut b = String::with_capacity(FROM_HEAD.len() + id.len() + 2 + data_len + 1);
        b.push_str(FROM_HEAD);
        b.push('"');
        b.push_str(id);
        b.push('"');
        push_data(&mut b, data);
        b
    }

    /// `{"t":"data","data":DATA}` with DATA copied as received.
    pub fn data(data: Option<&str>) -> String {
        let data_len = data.map_or(0, |d| DATA_KEY.len() + d.len());
        let mut b = String::with_capacity(DATA_HEAD.len() + data_len + 1);
        b.push_str(DATA_HEAD);
        push_data(&mut b, data);
        b
    }

    const FROM_HEAD: &str = "{\"t\":\"from\",\"from\":";
    const DATA_HEAD: &str = "{\"t\":\"data\"";
    const DATA_KEY: &str = ",\"data\":";

    fn push_data(b: &mut String, data: Option<&str>) {
        if let Some(d) = data {
            b.push_str(DATA_KEY);
            b.push_str(d);
        }
        b.push('}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass path for `to` and `up` answers as the field-by-field
    /// one: what it takes, and what it leaves to it.
    #[test]
    fn the_one_pass_path_agrees_with_the_fields() {
        let frames = [
            r#"{"t":"to","to":"p1","data":{"a":[1,2]}}"#,
            r#"{"t":"to","to":"p1"}"#,
            r#"{"t":"to","to":null,"data":1}"#,
            r#"{"t":"to","to":5,"data":1}"#,
            r#"{"t":"to","to":"p\u0031","data":1}"#,
            r#"{"t":"t\u006f","to":"p1","data":1}"#,
            r#"{"t":"to","to":"p1","data":1,"data":2}"#,
            r#"{"t":"to","to":"p1","pin":"1","pin":"2"}"#,
            r#"{"t":"to","to":"p1","to":"p2"}"#,
            r#"{"t":"up","data":"x","extra":{"deep":[1]}}"#,
            r#"{"t":"up","to":7,"data":"x"}"#,
            r#"{"t":"up"}"#,
            r#"{"t":null,"data":1}"#,
            r#"{"t":5}"#,
            r#"{"t":"join","protocol":1,"pin":"123456","name":"A"}"#,
            r#"{"t":"ping"}"#,
            r#"{"t":"to","to":"p1","data":1"#,
            r#"[{"t":"to"}]"#,
            r#"{"data":1}"#,
        ];
        for f in frames {
            assert_eq!(
                decode_client_frame(f),
                decode_client_frame_by_fields(f),
                "{f}"
            );
        }
    }

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
            frames::from("p-1", Some(r#"{"a": 1}"#)),
            r#"{"t":"from","from":"p-1","data":{"a": 1}}"#
        );
        assert_eq!(frames::data(None), r#"{"t":"data"}"#);
        let v: serde_json::Value = serde_json::from_str(&frames::data(Some("[1,2]"))).unwrap();
        assert_eq!(v["data"], serde_json::json!([1, 2]));
        assert!(is_pin("123456") && !is_pin("12345") && !is_pin("12345a"));
    }

    #[test]
    fn forwarded_frames_are_built_at_their_exact_length() {
        for (id, data) in [
            ("p-1", Some(r#"{"a": 1}"#)),
            ("p-1", None),
            ("odd\"id\\\n", Some("[1]")),
        ] {
            let f = frames::from(id, data);
            assert_eq!(f.capacity(), f.len(), "{f}");
            let v: serde_json::Value = serde_json::from_str(&f).unwrap();
            assert_eq!(v["from"], id, "{f}");
            let d = frames::data(data);
            assert_eq!(d.capacity(), d.len(), "{d}");
        }
    }

    #[test]
    fn t_is_read_with_or_without_escapes() {
        assert_eq!(
            decode_client_frame(r#"{"t":"p\u0069ng"}"#).unwrap(),
            RelayClientMessage::Ping
        );
        assert_eq!(
            decode_client_frame(r#"{"t":"a\"b"}"#).unwrap(),
            RelayClientMessage::Other { t: "a\"b".into() }
        );
        assert!(decode_client_frame(r#"{"t":5}"#).is_err());
    }
}
