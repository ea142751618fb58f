//! The types of SPEC 1.0, named as the SPEC names them. Receivers ignore
//! fields they do not know (serde's default) and enforce the ones they know.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The protocol version this library speaks.
pub const PROTOCOL_VERSION: &str = "1.0";
/// The OQSE version of the sets this library prepares.
pub const OQSE_VERSION: &str = "1.0";

/// The envelope address of an instance (SPEC 3.1): a player id, `"board"`,
/// `"settings"`; `"server"` is reserved.
pub type Address = String;
pub const BOARD_ADDRESS: &str = "board";
pub const SETTINGS_ADDRESS: &str = "settings";
pub const SERVER_ADDRESS: &str = "server";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameVersion {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginRef {
    pub id: String,
    pub version: String,
}

/// `hello(handshake)`: plugin → host (SPEC 4.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handshake {
    pub protocol: String,
    pub sdk: NameVersion,
    pub plugin: PluginRef,
    pub features: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Solo,
    Multiplayer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostAs {
    Presenter,
    Player,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum View {
    Solo,
    Board,
    Controller,
    Settings,
}

impl View {
    pub fn as_str(self) -> &'static str {
        match self {
            View::Solo => "solo",
            View::Board => "board",
            View::Controller => "controller",
            View::Settings => "settings",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    pub id: String,
    pub mode: Mode,
    /// `null` in solo; always present on the wire.
    pub host_as: Option<HostAs>,
    pub view: View,
    #[serde(rename = "self")]
    pub self_address: Address,
    pub authority: Address,
    pub late_join: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Player {
    pub id: String,
    pub name: String,
    pub is_host: bool,
    pub connected: bool,
}

/// The session clock (SPEC 4.2); every field is always present.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionClock {
    pub offset_ms: f64,
    pub paused_ms: f64,
    /// `null` while running; always present on the wire.
    #[serde(deserialize_with = "required_nullable")]
    pub paused_at: Option<f64>,
}

impl SessionClock {
    /// Game time at wall time `now_ms`: `(pausedAt ?? session time) - pausedMs`.
    pub fn game_time(&self, now_ms: f64) -> f64 {
        self.paused_at.unwrap_or(now_ms + self.offset_ms) - self.paused_ms
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Theme {
    Light,
    Dark,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostConfig {
    pub locale: String,
    pub theme: Theme,
}

/// A set as instances receive it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DisplaySet {
    pub meta: Value,
    pub items: Vec<Value>,
}

/// A set as the text it came in: its `meta` and each item unparsed. A host
/// keeps a set in this form because a JSON tree of small values costs tens
/// of times its text; an item is parsed only while it is worked on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetText {
    pub meta: Box<RawValue>,
    pub items: Vec<Box<RawValue>>,
}

impl SetText {
    /// The text of a parsed set (tests, and hosts that build sets in code).
    pub fn from_display(set: &DisplaySet) -> Self {
        let raw = |v: &Value| RawValue::from_string(v.to_string()).expect("a Value is JSON");
        Self {
            meta: raw(&set.meta),
            items: set.items.iter().map(raw).collect(),
        }
    }

    /// The set's `meta.id` and `meta.assets`, read without building a tree
    /// of the rest of `meta`.
    pub fn meta_fields(&self) -> Result<SetMetaFields, serde_json::Error> {
        serde_json::from_str(self.meta.get())
    }
}

impl From<DisplaySet> for SetText {
    fn from(set: DisplaySet) -> Self {
        Self::from_display(&set)
    }
}

/// What a host reads from a set's `meta`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SetMetaFields {
    #[serde(default)]
    pub id: Option<Value>,
    #[serde(default)]
    pub assets: Option<Value>,
}

/// A [`DisplaySet`] as JSON text, shared by every `InitPayload` that
/// carries it: an instance's `hello` copies no set and builds no tree.
#[derive(Clone)]
pub struct SetJson(std::sync::Arc<RawValue>);

impl SetJson {
    pub fn new(text: Box<RawValue>) -> Self {
        Self(std::sync::Arc::from(text))
    }

    pub fn of(set: &DisplaySet) -> Self {
        Self::new(serde_json::value::to_raw_value(set).expect("a DisplaySet is JSON"))
    }

    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// The set as a tree (tests, and a client that reads it).
    pub fn parse(&self) -> Result<DisplaySet, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

impl std::fmt::Debug for SetJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SetJson({} bytes)", self.0.get().len())
    }
}

impl PartialEq for SetJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Serialize for SetJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (*self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for SetJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(Self::new)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginDataValues {
    pub plugin: Value,
    pub set: Value,
}

/// The host's answer to `hello` (SPEC 4.2). Every field is always present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitPayload {
    pub protocol: String,
    pub host: NameVersion,
    pub oqse_version: String,
    pub features: Vec<String>,
    pub session: SessionInfo,
    pub players: Vec<Player>,
    pub set: SetJson,
    pub settings: Map<String, Value>,
    pub config: HostConfig,
    pub clock: SessionClock,
    pub services: Vec<String>,
    pub progress: Map<String, Value>,
    pub data: PluginDataValues,
    pub snapshot: Value,
}

/// `to` of an [`OutgoingMessage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recipients {
    Authority,
    All,
    Addresses(Vec<Address>),
}

impl Serialize for Recipients {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Recipients::Authority => s.serialize_str("authority"),
            Recipients::All => s.serialize_str("all"),
            Recipients::Addresses(list) => list.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Recipients {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Recipients;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"authority\", \"all\" or a list of addresses")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Recipients, E> {
                match v {
                    "authority" => Ok(Recipients::Authority),
                    "all" => Ok(Recipients::All),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Recipients, A::Error> {
                let mut list = Vec::new();
                while let Some(a) = seq.next_element::<String>()? {
                    list.push(a);
                }
                Ok(Recipients::Addresses(list))
            }
        }
        d.deserialize_any(V)
    }
}

/// `send(message)`. `data` borrows the caller's text: it is never copied.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutgoingMessage<'a> {
    pub to: Recipients,
    #[serde(borrow)]
    pub data: &'a RawValue,
}

/// `deliver(message)`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IncomingMessage<'a> {
    pub from: Address,
    #[serde(borrow)]
    pub data: &'a RawValue,
    pub sent_at: f64,
}

/// `recordAnswer(answer)` (SPEC 5).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnswerRecord<'a> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub player_id: Option<String>,
    pub item_id: String,
    pub is_correct: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_spent_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints_used: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_skipped: Option<bool>,
    /// What the player answered; `null` is a value here, not "absent".
    #[serde(
        default,
        borrow,
        deserialize_with = "present_raw",
        skip_serializing_if = "Option::is_none"
    )]
    pub answer: Option<&'a RawValue>,
    /// A generated item (at least `id` and `type`).
    #[serde(
        default,
        borrow,
        deserialize_with = "present_raw",
        skip_serializing_if = "Option::is_none"
    )]
    pub item: Option<&'a RawValue>,
}

/// `end(result)`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scores: Option<BTreeMap<String, f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// `saveData(scope, value)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataScope {
    Plugin,
    Set,
}

/// `updateSettings(update)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingsUpdate {
    pub values: Map<String, Value>,
    pub valid: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `reportError(error)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReport {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Map<String, Value>>,
}

/// `authorityChanged(status)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityStatus {
    pub connected: bool,
}

/// `sessionEnded(reason)`. Unknown reasons are kept, not rejected: SPEC 9
/// lets later minors add values the receiver must ignore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEndReason {
    Finished,
    HostLeft,
    Kicked,
    Closed,
    Error,
    Other(String),
}

impl SessionEndReason {
    pub fn as_str(&self) -> &str {
        match self {
            SessionEndReason::Finished => "finished",
            SessionEndReason::HostLeft => "host-left",
            SessionEndReason::Kicked => "kicked",
            SessionEndReason::Closed => "closed",
            SessionEndReason::Error => "error",
            SessionEndReason::Other(s) => s,
        }
    }

    pub fn from_wire(s: &str) -> Self {
        match s {
            "finished" => SessionEndReason::Finished,
            "host-left" => SessionEndReason::HostLeft,
            "kicked" => SessionEndReason::Kicked,
            "closed" => SessionEndReason::Closed,
            "error" => SessionEndReason::Error,
            other => SessionEndReason::Other(other.to_owned()),
        }
    }
}

impl Serialize for SessionEndReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SessionEndReason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(SessionEndReason::from_wire(&s))
    }
}

/// A field that must be present but may be `null`.
fn required_nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::<f64>::deserialize(d)
}

/// An optional raw field whose `null` counts as present.
fn present_raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn session_clock_fields_are_always_present() {
        let c = SessionClock {
            offset_ms: 5.0,
            paused_ms: 0.0,
            paused_at: None,
        };
        assert_eq!(
            serde_json::to_value(c).unwrap(),
            json!({"offsetMs": 5.0, "pausedMs": 0.0, "pausedAt": null})
        );
        assert!(
            serde_json::from_value::<SessionClock>(json!({"offsetMs": 1, "pausedMs": 0})).is_err()
        );
        let paused = SessionClock {
            offset_ms: 0.0,
            paused_ms: 100.0,
            paused_at: Some(1_000.0),
        };
        assert_eq!(paused.game_time(123_456.0), 900.0);
        assert_eq!(c.game_time(10.0), 15.0);
    }

    #[test]
    fn recipients_wire_forms() {
        for (text, expect) in [
            (r#""authority""#, Recipients::Authority),
            (r#""all""#, Recipients::All),
            (
                r#"["p1","board"]"#,
                Recipients::Addresses(vec!["p1".into(), "board".into()]),
            ),
        ] {
            let r: Recipients = serde_json::from_str(text).unwrap();
            assert_eq!(r, expect);
            assert_eq!(serde_json::to_string(&r).unwrap(), text);
        }
        assert!(serde_json::from_str::<Recipients>(r#""everyone""#).is_err());
        assert!(serde_json::from_str::<Recipients>("5").is_err());
    }

    #[test]
    fn session_end_reasons_keep_unknown_values() {
        let r: SessionEndReason = serde_json::from_str(r#""host-left""#).unwrap();
        assert_eq!(r, SessionEndReason::HostLeft);
        let r: SessionEndReason = serde_json::from_str(r#""migrated""#).unwrap();
        assert_eq!(r.as_str(), "migrated");
    }

    #[test]
    fn answer_null_is_present() {
        let a: AnswerRecord =
            serde_json::from_str(r#"{"itemId":"i","isCorrect":true,"answer":null}"#).unwrap();
        assert_eq!(a.answer.map(|r| r.get()), Some("null"));
        let a: AnswerRecord = serde_json::from_str(r#"{"itemId":"i","isCorrect":true}"#).unwrap();
        assert!(a.answer.is_none());
    }

    #[test]
    fn init_payload_round_trips_with_nulls_present() {
        let v = json!({
            "protocol": "1.0", "host": {"name": "hostwire", "version": "0.1.0"},
            "oqseVersion": "1.0", "features": [],
            "session": {"id": "s1", "mode": "solo", "hostAs": null, "view": "solo",
                        "self": "p1", "authority": "p1", "lateJoin": false},
            "players": [{"id": "p1", "name": "Ann", "isHost": true, "connected": true}],
            "set": {"meta": {"title": "x"}, "items": []},
            "settings": {"rounds": 3}, "config": {"locale": "en", "theme": "dark"},
            "clock": {"offsetMs": 0.0, "pausedMs": 0.0, "pausedAt": null},
            "services": [], "progress": {}, "data": {"plugin": null, "set": null},
            "snapshot": null
        });
        let p: InitPayload = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&p).unwrap(), v);
    }
}
