//! PlayerThree protocol 1 on the wire: names, limits and message shapes.
//!
//! Inbound messages (client to server) are decoded by [`crate::decode`];
//! the types here serialize outbound messages and let a Rust client read
//! them back.

use hostwire_core::delta::{Json, JsonDelta};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// `PROTOCOL_VERSION`.
pub const PROTOCOL_VERSION: u32 = 1;

/// `MAX_MESSAGE_BYTES`: the inbound message cap, checked before parsing.
/// Policy uploads (`mandate`) are the largest legitimate message; 64 KiB
/// holds a long policy with room to spare.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Nesting bound of an inbound message (arrays and objects), checked by a
/// linear scan before parsing.
pub const MAX_MESSAGE_DEPTH: usize = 32;

/// `TOKEN_RE`: 32 base64url characters (24 random bytes), checked as an
/// opaque format before any lookup.
pub const TOKEN_RE: &str = "^[A-Za-z0-9_-]{32}$";

/// True when `text` has the shape `TOKEN_RE` describes.
pub fn token_shape_ok(text: &str) -> bool {
    hostwire_core::Token::parse(text).is_some()
}

/// `MSG`: message type names on the game transport.
/// Close codes of a PlayerThree socket. The protocol leaves them to the
/// server: these are hostwire's, documented on its PlayerThree page.
pub const CLOSE_MATCH_OVER: u16 = 1000;
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_GOING_AWAY: u16 = 1001;
pub const CLOSE_POLICY: u16 = 1008;
pub const CLOSE_TOO_BIG: u16 = 1009;
pub const CLOSE_TOO_SLOW: u16 = 1013;
pub const CLOSE_BAD_TOKEN: u16 = 4001;
pub const CLOSE_REVOKED: u16 = 4003;
pub const CLOSE_JOIN_TIMEOUT: u16 = 4008;
pub const CLOSE_RATE_LIMITED: u16 = 4029;
/// Milliseconds a socket may send nothing but pings before it is closed
/// 1001 (spectators and observers answer the server's pings, which
/// counts): a peer that vanished must not hold its slot.
pub const IDLE_TIMEOUT_MS: u64 = 90_000;
/// Milliseconds a new socket has to present its token (then 4008).
pub const JOIN_TIMEOUT_MS: u64 = 10_000;

pub mod msg {
    pub const CALL: &str = "playerthree:call";
    pub const OBSERVER: &str = "playerthree:observer";
    pub const STREAM: &str = "playerthree:stream";
    pub const MANDATE: &str = "playerthree:mandate";
    pub const SCOPES: &str = "playerthree:scopes";
    pub const RESOLVE_APPROVAL: &str = "playerthree:resolveApproval";
    pub const CONTROLLER: &str = "playerthree:controller";
    pub const MINT: &str = "playerthree:mint";
    pub const RESULT: &str = "playerthree:result";
    pub const VIEW: &str = "playerthree:view";
    pub const OBS: &str = "playerthree:obs";
    pub const SEATS: &str = "playerthree:seats";
    pub const CARDS: &str = "playerthree:cards";
    pub const REPORT: &str = "playerthree:report";
    pub const WATCH: &str = "playerthree:watch";
    pub const TELL: &str = "playerthree:tell";
    pub const SAID: &str = "playerthree:said";

    /// Every name, with the `op` it carries.
    pub const ALL: [(&str, &str); 17] = [
        ("call", CALL),
        ("observer", OBSERVER),
        ("stream", STREAM),
        ("mandate", MANDATE),
        ("scopes", SCOPES),
        ("resolveApproval", RESOLVE_APPROVAL),
        ("controller", CONTROLLER),
        ("mint", MINT),
        ("result", RESULT),
        ("view", VIEW),
        ("obs", OBS),
        ("seats", SEATS),
        ("cards", CARDS),
        ("report", REPORT),
        ("watch", WATCH),
        ("tell", TELL),
        ("said", SAID),
    ];

    /// The message type name of an `op`.
    pub fn for_op(op: &str) -> Option<&'static str> {
        ALL.iter().find(|(o, _)| *o == op).map(|(_, m)| *m)
    }
}

/// `ServerErrorCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerErrorCode {
    BadMessage,
    BadToken,
    Forbidden,
    OutOfScope,
    ApprovalNotFound,
    ApprovalPending,
    ApprovalFailed,
    ModeUnavailable,
    RateLimited,
    Invalid,
    Busy,
    Internal,
    NotInMatch,
    Paused,
}

impl ServerErrorCode {
    /// The close code of a socket whose join was refused with this error:
    /// a bad token 4001, a full server 1013, anything else 1008.
    pub const fn join_refused_close(self) -> u16 {
        match self {
            Self::BadToken => CLOSE_BAD_TOKEN,
            Self::Busy => CLOSE_TOO_SLOW,
            _ => CLOSE_POLICY,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadMessage => "bad_message",
            Self::BadToken => "bad_token",
            Self::Forbidden => "forbidden",
            Self::OutOfScope => "out_of_scope",
            Self::ApprovalNotFound => "approval_not_found",
            Self::ApprovalPending => "approval_pending",
            Self::ApprovalFailed => "approval_failed",
            Self::ModeUnavailable => "mode_unavailable",
            Self::RateLimited => "rate_limited",
            Self::Invalid => "invalid",
            Self::Busy => "busy",
            Self::Internal => "internal",
            Self::NotInMatch => "not_in_match",
            Self::Paused => "paused",
        }
    }
}

/// An error with the protocol's code and a message that names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {message}", code.as_str())]
pub struct ProtocolError {
    pub code: ServerErrorCode,
    pub message: String,
}

impl ProtocolError {
    pub fn new(code: ServerErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Who plays a seat. hostwire's shape of the seed's `Controller`:
/// `{"kind":"human"}` or `{"kind":"agent","supervised":bool}`. A supervised
/// agent's calls become proposals that an owner resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum Controller {
    Human,
    Agent {
        #[serde(default)]
        supervised: bool,
    },
}

/// `DetailRequest`: observation sections pushed in full besides the role's
/// defaults, or `"all"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetailRequest {
    All,
    Sections(Vec<String>),
}

/// The `roles` of a `tell`: some roles of the owner's team, or `"all"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roles {
    All,
    Some(Vec<String>),
}

/// A `Scope`: the name of a control method a seat's agent may call, or `"*"`
/// for every method of the seat.
pub type Scope = String;

/// The scope that admits every control method.
pub const SCOPE_ALL: &str = "*";

/// `ClientMsg`: the ops a connection with a player token may send.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMsg {
    /// Control-plane RPC for a seat. Omitted args means `{}`.
    Call {
        seq: u64,
        role: String,
        method: String,
        args: Json,
    },
    Stream {
        seq: u64,
        role: String,
        every_ticks: u32,
        detail: Option<DetailRequest>,
    },
    Mandate {
        seq: u64,
        role: String,
        mandate: Json,
    },
    Scopes {
        seq: u64,
        role: String,
        scopes: Vec<Scope>,
    },
    ResolveApproval {
        seq: u64,
        role: String,
        id: String,
        approve: bool,
    },
    Controller {
        seq: u64,
        role: String,
        controller: Controller,
    },
    Mint {
        seq: u64,
        role: String,
    },
    Tell {
        seq: u64,
        roles: Roles,
        text: String,
        ping: Option<Json>,
    },
}

impl ClientMsg {
    pub fn seq(&self) -> u64 {
        match self {
            Self::Call { seq, .. }
            | Self::Stream { seq, .. }
            | Self::Mandate { seq, .. }
            | Self::Scopes { seq, .. }
            | Self::ResolveApproval { seq, .. }
            | Self::Controller { seq, .. }
            | Self::Mint { seq, .. }
            | Self::Tell { seq, .. } => *seq,
        }
    }

    pub fn op(&self) -> &'static str {
        match self {
            Self::Call { .. } => "call",
            Self::Stream { .. } => "stream",
            Self::Mandate { .. } => "mandate",
            Self::Scopes { .. } => "scopes",
            Self::ResolveApproval { .. } => "resolveApproval",
            Self::Controller { .. } => "controller",
            Self::Mint { .. } => "mint",
            Self::Tell { .. } => "tell",
        }
    }
}

/// `WatchMsg`: a spectator chooses which teams' views it receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchMsg {
    pub teams: Vec<String>,
}

/// `ObserverRequest`: the perspective to follow, and where to resume.
/// The server, never the client, chooses projection and release watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObserverRequest {
    pub perspective: String,
    pub after: Option<u64>,
}

/// `ObserverGrant`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum ObserverGrant {
    #[serde(rename_all = "camelCase")]
    Team { team: String, delay_ms: u64 },
    #[serde(rename_all = "camelCase")]
    Omniscient { teams: Vec<String>, delay_ms: u64 },
}

impl ObserverGrant {
    pub fn delay_ms(&self) -> u64 {
        match self {
            Self::Team { delay_ms, .. } | Self::Omniscient { delay_ms, .. } => *delay_ms,
        }
    }
}

/// `Principal`: what a token is. A token encodes exactly one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum Principal {
    /// Trusted private team-root capability (every seat of the team).
    Team { r#match: String, team: String },
    /// Human owner of exactly one seat, with own-side fogged viewing.
    Human {
        r#match: String,
        role: String,
        team: String,
    },
    /// Agent bound to exactly one seat; cannot change controllers or mint.
    Seat {
        r#match: String,
        role: String,
        team: String,
    },
    /// Read-only; receives per-team fogged views (of `team` only, if set).
    Spectator {
        r#match: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        team: Option<String>,
    },
    /// Admitted independently of player, agent and operator authority.
    Observer {
        r#match: String,
        grant: ObserverGrant,
    },
}

impl Principal {
    pub fn match_id(&self) -> &str {
        match self {
            Self::Team { r#match, .. }
            | Self::Human { r#match, .. }
            | Self::Seat { r#match, .. }
            | Self::Spectator { r#match, .. }
            | Self::Observer { r#match, .. } => r#match,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Team { .. } => "team",
            Self::Human { .. } => "human",
            Self::Seat { .. } => "seat",
            Self::Spectator { .. } => "spectator",
            Self::Observer { .. } => "observer",
        }
    }
}

/// `EntrantCard`: a public, series-scoped identity (never a private
/// commander or owner identifier). hostwire's shape: an id and a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntrantCard {
    pub id: String,
    pub name: String,
}

/// `PublicSeatCard` (`playerthree:cards`): who plays a seat, publicly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PublicSeatCard {
    pub team: String,
    pub role: String,
    /// `"human"` or `"agent"`.
    pub controller: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<EntrantCard>,
}

/// `SeatInfo` (`playerthree:seats`): a seat as its team's owners see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SeatInfo {
    pub role: String,
    pub team: String,
    pub controller: Controller,
    /// An agent holds a live connection for the seat.
    pub live: bool,
    /// Bumped by every `mandate` and `scopes`.
    pub policy_version: u64,
    pub scopes: Vec<Scope>,
    /// The id of the proposal waiting for an owner, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_approval: Option<String>,
}

/// `Outcome`: a team's result once decided. hostwire's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Outcome {
    /// `"win"`, `"loss"` or `"draw"`.
    pub result: String,
    pub tick: u64,
}

/// The `category` of an `ObserverCommentary`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommentaryCategory {
    Summary,
    Chat,
}

impl CommentaryCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Summary => "summary",
            Self::Chat => "chat",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "summary" => Some(Self::Summary),
            "chat" => Some(Self::Chat),
            _ => None,
        }
    }
}

/// `ObserverCommentary`: only voluntarily disclosed agent-emitted game chat
/// or summaries, never owner messages or harness logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObserverCommentary {
    pub id: String,
    pub team: String,
    pub role: String,
    /// The game tick when the agent disclosed it.
    pub tick: u64,
    pub category: CommentaryCategory,
    pub text: String,
}

/// What an agent discloses for observers (hostwire's MCP tool `disclose`;
/// the seed leaves the way open and fixes no `ClientMsg` op for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disclosure {
    pub category: CommentaryCategory,
    pub text: String,
}

/// `ObserverAgentCard`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObserverAgentCard {
    pub team: String,
    pub role: String,
    pub card: EntrantCard,
}

/// Distinguishes a member that is absent from one that is `null`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `ObserverFrame`: one released frame; exactly one of `world`, `delta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObserverFrame {
    pub sequence: u64,
    pub tick: u64,
    pub recorded_at: u64,
    pub release_at: u64,
    pub perspective: String,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub world: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<JsonDelta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcomes: Option<BTreeMap<String, Outcome>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commentary: Option<Vec<ObserverCommentary>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_cards: Option<Vec<ObserverAgentCard>>,
}

/// `state` of an `ObserverMessage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObserverState {
    Buffering,
    Ready,
    Closed,
}

/// `ObserverMessage` (its `op` is `"observer"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObserverMessage {
    pub state: ObserverState,
    /// Admission metadata only: never a live tick or completion signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<ObserverGrant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<std::sync::Arc<ObserverFrame>>,
}

/// `ViewMessage`: a keyframe (`view`) or a delta from `version - 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewMessage {
    pub team: String,
    pub version: u64,
    pub body: ViewBody,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ViewBody {
    Keyframe(Json),
    Delta(JsonDelta),
}

impl Serialize for ViewMessage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("ViewMessage", 3)?;
        st.serialize_field("team", &self.team)?;
        st.serialize_field("version", &self.version)?;
        match &self.body {
            ViewBody::Keyframe(v) => st.serialize_field("view", v)?,
            ViewBody::Delta(d) => st.serialize_field("delta", d)?,
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for ViewMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Wire {
            #[serde(default)]
            op: Option<String>,
            team: String,
            version: u64,
            #[serde(default, deserialize_with = "present")]
            view: Option<Json>,
            #[serde(default)]
            delta: Option<JsonDelta>,
        }
        let w = Wire::deserialize(d)?;
        if w.op.as_deref().is_some_and(|op| op != "view") {
            return Err(serde::de::Error::custom("op: expected \"view\""));
        }
        let body = match (w.view, w.delta) {
            (Some(v), None) => ViewBody::Keyframe(v),
            (None, Some(d)) => ViewBody::Delta(d),
            _ => {
                return Err(serde::de::Error::custom(
                    "a view message carries exactly one of view, delta",
                ))
            }
        };
        Ok(ViewMessage {
            team: w.team,
            version: w.version,
            body,
        })
    }
}

/// `ServerMsg`: what the server sends. Serialize once with
/// [`ServerMsg::to_text`] and share the text with every recipient.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum ServerMsg {
    Result(ResultMsg),
    View(ViewMessage),
    Obs {
        role: String,
        data: Json,
    },
    Seats {
        seats: Vec<SeatInfo>,
    },
    Cards {
        cards: Vec<PublicSeatCard>,
    },
    Report {
        team: String,
        data: Json,
    },
    Said {
        role: String,
        text: String,
        tick: u64,
    },
    Observer(ObserverMessage),
}

/// The `result` of one op: `ok` with `data`, or an error `code`. hostwire
/// adds `message` (naming the field or rule) to errors; clients that do not
/// know it ignore it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultMsg {
    pub seq: u64,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ServerErrorCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ServerMsg {
    pub fn ok(seq: u64, data: Json) -> Self {
        ServerMsg::Result(ResultMsg {
            seq,
            ok: true,
            data: Some(data),
            code: None,
            message: None,
        })
    }

    pub fn error(seq: u64, e: &ProtocolError) -> Self {
        ServerMsg::Result(ResultMsg {
            seq,
            ok: false,
            data: None,
            code: Some(e.code),
            message: Some(e.message.clone()),
        })
    }

    /// The compact JSON text of the message.
    pub fn to_text(&self) -> String {
        // Every field is a string, number, map with string keys or `Json`:
        // serialization cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn op(&self) -> &'static str {
        match self {
            Self::Result(_) => "result",
            Self::View(_) => "view",
            Self::Obs { .. } => "obs",
            Self::Seats { .. } => "seats",
            Self::Cards { .. } => "cards",
            Self::Report { .. } => "report",
            Self::Said { .. } => "said",
            Self::Observer(_) => "observer",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_close_has_its_code() {
        use crate::host::CloseReason;
        assert_eq!(CloseReason::Revoked.close(), (4003, "token revoked"));
        assert_eq!(CloseReason::RateLimited.close(), (4029, "rate limited"));
        assert_eq!(ServerErrorCode::BadToken.join_refused_close(), 4001);
        assert_eq!(ServerErrorCode::Busy.join_refused_close(), 1013);
        assert_eq!(ServerErrorCode::Forbidden.join_refused_close(), 1008);
    }

    #[test]
    fn every_msg_name_is_the_op_with_the_prefix() {
        for (op, name) in msg::ALL {
            assert_eq!(name, format!("playerthree:{op}"));
            assert_eq!(msg::for_op(op), Some(name));
        }
        assert_eq!(msg::for_op("nope"), None);
    }

    #[test]
    fn server_messages_have_the_seed_shapes() {
        let e = ProtocolError::new(ServerErrorCode::ApprovalNotFound, "id: no such proposal");
        let v: serde_json::Value =
            serde_json::from_str(&ServerMsg::error(7, &e).to_text()).unwrap();
        assert_eq!(
            v,
            json!({"op":"result","seq":7,"ok":false,"code":"approval_not_found","message":"id: no such proposal"})
        );
        let ok: serde_json::Value =
            serde_json::from_str(&ServerMsg::ok(3, Json::from(json!({"a":1}))).to_text()).unwrap();
        assert_eq!(ok, json!({"op":"result","seq":3,"ok":true,"data":{"a":1}}));
        let view = ServerMsg::View(ViewMessage {
            team: "red".into(),
            version: 4,
            body: ViewBody::Delta(JsonDelta::empty()),
        });
        assert_eq!(
            view.to_text(),
            r#"{"op":"view","team":"red","version":4,"delta":{}}"#
        );
        let said = ServerMsg::Said {
            role: "scout".into(),
            text: "hi".into(),
            tick: 2,
        };
        assert_eq!(
            said.to_text(),
            r#"{"op":"said","role":"scout","text":"hi","tick":2}"#
        );
        let obs = ServerMsg::Observer(ObserverMessage {
            state: ObserverState::Buffering,
            grant: Some(ObserverGrant::Team {
                team: "red".into(),
                delay_ms: 5000,
            }),
            frame: None,
        });
        assert_eq!(
            obs.to_text(),
            r#"{"op":"observer","state":"buffering","grant":{"kind":"team","team":"red","delayMs":5000}}"#
        );
    }

    #[test]
    fn view_messages_read_back_and_need_exactly_one_body() {
        let m: ViewMessage =
            serde_json::from_str(r#"{"op":"view","team":"a","version":1,"view":null}"#).unwrap();
        assert_eq!(m.body, ViewBody::Keyframe(Json::Null));
        assert!(serde_json::from_str::<ViewMessage>(r#"{"team":"a","version":1}"#).is_err());
        assert!(serde_json::from_str::<ViewMessage>(
            r#"{"team":"a","version":1,"view":1,"delta":{}}"#
        )
        .is_err());
        assert!(serde_json::from_str::<ViewMessage>(
            r#"{"op":"obs","team":"a","version":1,"view":1}"#
        )
        .is_err());
    }

    #[test]
    fn principals_have_the_seed_shapes() {
        let p = Principal::Observer {
            r#match: "m1".into(),
            grant: ObserverGrant::Omniscient {
                teams: vec!["a".into(), "b".into()],
                delay_ms: 0,
            },
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v,
            json!({"kind":"observer","match":"m1","grant":{"kind":"omniscient","teams":["a","b"],"delayMs":0}})
        );
        assert_eq!(serde_json::from_value::<Principal>(v).unwrap(), p);
        let s = serde_json::to_value(Principal::Spectator {
            r#match: "m1".into(),
            team: None,
        })
        .unwrap();
        assert_eq!(s, json!({"kind":"spectator","match":"m1"}));
    }

    #[test]
    fn error_codes_spell_as_the_seed() {
        for c in [
            ServerErrorCode::BadMessage,
            ServerErrorCode::OutOfScope,
            ServerErrorCode::NotInMatch,
            ServerErrorCode::Paused,
        ] {
            assert_eq!(serde_json::to_value(c).unwrap(), json!(c.as_str()));
        }
    }

    #[test]
    fn token_shape_is_token_re() {
        assert!(token_shape_ok(&"A_-9".repeat(8)));
        assert!(!token_shape_ok(&"a".repeat(31)));
        assert!(!token_shape_ok(&"a".repeat(33)));
        assert!(!token_shape_ok(&format!("{}+", "a".repeat(31))));
    }
}
