//! Decoding calls from a method name and raw JSON arguments (a JSON array):
//! the Host API (SPEC 5) for hosts, the Plugin API (SPEC 7) for a plugin
//! side. Opaque values (`data`, snapshots, plugin data, answers, service
//! payloads) are borrowed from the input text, never copied.

use crate::errors::{ProtocolError, ProtocolErrorCode as Code};
use crate::limits::{Limits, CALL_ENVELOPE_DEPTH, LIMITS, MAX_JSON_DEPTH};
use crate::types::*;
use hostwire_core::json::{check_bounds, raw_within, JsonError, JsonLimits, Structure};
use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;

/// Host API methods (SPEC 5), in the SPEC's order.
pub const HOST_METHODS: &[&str] = &[
    "hello",
    "ready",
    "send",
    "saveSnapshot",
    "recordAnswer",
    "saveData",
    "updateSettings",
    "getAsset",
    "end",
    "reportError",
    "service",
];

/// Plugin API methods (SPEC 7).
pub const PLUGIN_METHODS: &[&str] = &[
    "start",
    "deliver",
    "playersChanged",
    "authorityChanged",
    "configChanged",
    "clockChanged",
    "sessionEnded",
];

/// Names reserved by SPEC 10: not part of 1.0, answered with `UNKNOWN_METHOD`.
pub const RESERVED_METHODS: &[&str] = &["exit", "resize", "setChanged", "saveProgress"];

/// A validated plugin → host call.
#[derive(Debug, Clone)]
pub enum HostCall<'a> {
    Hello(Handshake),
    Ready,
    Send(OutgoingMessage<'a>),
    SaveSnapshot(&'a RawValue),
    RecordAnswer(AnswerRecord<'a>),
    SaveData {
        scope: DataScope,
        value: &'a RawValue,
    },
    UpdateSettings(SettingsUpdate),
    GetAsset {
        key: String,
        item_id: Option<String>,
    },
    End(SessionResult),
    ReportError(ErrorReport),
    Service {
        name: String,
        payload: &'a RawValue,
    },
}

impl HostCall<'_> {
    pub fn method(&self) -> &'static str {
        match self {
            HostCall::Hello(_) => "hello",
            HostCall::Ready => "ready",
            HostCall::Send(_) => "send",
            HostCall::SaveSnapshot(_) => "saveSnapshot",
            HostCall::RecordAnswer(_) => "recordAnswer",
            HostCall::SaveData { .. } => "saveData",
            HostCall::UpdateSettings(_) => "updateSettings",
            HostCall::GetAsset { .. } => "getAsset",
            HostCall::End(_) => "end",
            HostCall::ReportError(_) => "reportError",
            HostCall::Service { .. } => "service",
        }
    }

    /// Methods marked *authority* in SPEC 5.
    pub fn requires_authority(&self) -> bool {
        matches!(self, HostCall::SaveSnapshot(_) | HostCall::End(_))
    }

    /// The views a method is limited to (SPEC 5); `None` = every view.
    pub fn allowed_views(&self) -> Option<&'static [View]> {
        match self {
            HostCall::SaveData { .. } => Some(&[View::Solo, View::Controller]),
            HostCall::UpdateSettings(_) => Some(&[View::Settings]),
            _ => None,
        }
    }
}

/// A validated host → plugin call.
#[derive(Debug, Clone)]
pub enum PluginCall<'a> {
    Start,
    Deliver(IncomingMessage<'a>),
    PlayersChanged(Vec<Player>),
    AuthorityChanged(AuthorityStatus),
    ConfigChanged(HostConfig),
    ClockChanged(SessionClock),
    SessionEnded(SessionEndReason),
}

/// Decodes a Host API call under the guaranteed-minimum limits.
pub fn decode_host_call<'a>(method: &str, args: &'a str) -> Result<HostCall<'a>, ProtocolError> {
    decode_host_call_with(method, args, &LIMITS)
}

/// Decodes a Host API call under a host's own (raised) limits.
pub fn decode_host_call_with<'a>(
    method: &str,
    args: &'a str,
    limits: &Limits,
) -> Result<HostCall<'a>, ProtocolError> {
    if !HOST_METHODS.contains(&method) {
        return Err(unknown_method(method));
    }
    let too_large = match method {
        "send" | "service" => Code::MessageTooLarge,
        "saveSnapshot" => Code::SnapshotTooLarge,
        "saveData" | "recordAnswer" => Code::DataTooLarge,
        _ => Code::InvalidArgument,
    };
    let mut args = Args::parse(method, args, limits.max_call_bytes(), too_large)?;
    let call = match method {
        "hello" => {
            let h: Handshake = args.one("handshake")?;
            validate_handshake(&h)?;
            HostCall::Hello(h)
        }
        "ready" => {
            args.split()?;
            args.arity(0, 0)?;
            HostCall::Ready
        }
        "send" => {
            let m: OutgoingMessage<'a> = args.one("message")?;
            if let Recipients::Addresses(list) = &m.to {
                if list.is_empty() || list.len() > 500 {
                    return Err(args.invalid("message.to", "must list 1 to 500 addresses"));
                }
                for (i, a) in list.iter().enumerate() {
                    check_text(&args, &format!("message.to[{i}]"), a, 1, 128)?;
                }
            }
            args.json_only(m.data, "message.data")?;
            args.size(
                m.data,
                "message.data",
                limits.message_bytes,
                Code::MessageTooLarge,
            )?;
            HostCall::Send(m)
        }
        "saveSnapshot" => {
            let s: &'a RawValue = args.one("snapshot")?;
            args.json_only(s, "snapshot")?;
            args.size(s, "snapshot", limits.snapshot_bytes, Code::SnapshotTooLarge)?;
            HostCall::SaveSnapshot(s)
        }
        "recordAnswer" => {
            let a: AnswerRecord<'a> = args.one("answer")?;
            validate_answer(&args, &a, limits)?;
            HostCall::RecordAnswer(a)
        }
        "saveData" => {
            args.split()?;
            args.arity(2, 2)?;
            let scope: DataScope = args.typed(0, "scope")?;
            let value = args.raw(1);
            args.json_only(value, "value")?;
            args.size(value, "value", limits.data_bytes, Code::DataTooLarge)?;
            HostCall::SaveData { scope, value }
        }
        "updateSettings" => {
            let u: SettingsUpdate = args.one("update")?;
            if let Some(m) = &u.message {
                check_text(&args, "update.message", m, 0, 500)?;
            }
            HostCall::UpdateSettings(u)
        }
        "getAsset" => {
            args.split()?;
            args.arity(1, 2)?;
            let key: String = args.typed(0, "key")?;
            check_text(&args, "key", &key, 1, 200)?;
            let item_id = if args.len() > 1 && args.raw(1).get() != "null" {
                let id: String = args.typed(1, "itemId")?;
                check_text(&args, "itemId", &id, 1, 128)?;
                Some(id)
            } else {
                None
            };
            HostCall::GetAsset { key, item_id }
        }
        "end" => {
            let r: SessionResult = args.one("result")?;
            if let Some(scores) = &r.scores {
                for (k, v) in scores {
                    check_text(&args, "result.scores", k, 1, 128)?;
                    if !v.is_finite() {
                        return Err(
                            args.invalid(&format!("result.scores.{k}"), "must be a finite number")
                        );
                    }
                }
            }
            if let Some(s) = &r.summary {
                check_text(&args, "result.summary", s, 0, 1000)?;
            }
            HostCall::End(r)
        }
        "reportError" => {
            let e: ErrorReport = args.one("error")?;
            check_text(&args, "error.code", &e.code, 1, 100)?;
            check_text(&args, "error.message", &e.message, 0, 2000)?;
            HostCall::ReportError(e)
        }
        "service" => {
            args.split()?;
            args.arity(2, 2)?;
            let name: String = args.typed(0, "name")?;
            if !is_service_name(&name) {
                return Err(args.invalid(
                    "name",
                    "must be lowercase segments joined by dots (e.g. \"chess.puzzles\")",
                ));
            }
            let payload = args.raw(1);
            args.json_only(payload, "payload")?;
            args.size(
                payload,
                "payload",
                limits.service_request_bytes,
                Code::MessageTooLarge,
            )?;
            HostCall::Service { name, payload }
        }
        _ => return Err(unknown_method(method)),
    };
    Ok(call)
}

/// Decodes a Plugin API call (host → plugin), as a Rust plugin side would.
pub fn decode_plugin_call<'a>(
    method: &str,
    args: &'a str,
) -> Result<PluginCall<'a>, ProtocolError> {
    if !PLUGIN_METHODS.contains(&method) {
        return Err(unknown_method(method));
    }
    let too_large = if method == "deliver" {
        Code::MessageTooLarge
    } else {
        Code::InvalidArgument
    };
    let mut args = Args::parse(method, args, LIMITS.max_call_bytes(), too_large)?;
    Ok(match method {
        "start" => {
            args.split()?;
            args.arity(0, 0)?;
            PluginCall::Start
        }
        "deliver" => {
            let m: IncomingMessage<'a> = args.one("message")?;
            check_text(&args, "message.from", &m.from, 1, 128)?;
            if !m.sent_at.is_finite() {
                return Err(args.invalid("message.sentAt", "must be a finite number"));
            }
            args.json_only(m.data, "message.data")?;
            PluginCall::Deliver(m)
        }
        "playersChanged" => PluginCall::PlayersChanged(args.one("players")?),
        "authorityChanged" => PluginCall::AuthorityChanged(args.one("status")?),
        "configChanged" => PluginCall::ConfigChanged(args.one("config")?),
        "clockChanged" => PluginCall::ClockChanged(args.one("clock")?),
        "sessionEnded" => PluginCall::SessionEnded(args.one("reason")?),
        _ => return Err(unknown_method(method)),
    })
}

/// Checks a service result against `serviceResultBytes`.
pub fn check_service_result(result: &RawValue, limits: &Limits) -> Result<usize, ProtocolError> {
    raw_within(result, limits.service_result_bytes).map_err(|size| {
        ProtocolError::new(
            Code::MessageTooLarge,
            format!(
                "service result is {size} bytes; the limit is {} bytes",
                limits.service_result_bytes
            ),
        )
    })
}

/// Checks an asset's size against `assetBytes`.
pub fn check_asset_size(key: &str, bytes: usize, limits: &Limits) -> Result<(), ProtocolError> {
    if bytes > limits.asset_bytes {
        return Err(ProtocolError::new(
            Code::DataTooLarge,
            format!(
                "asset {key:?} is {bytes} bytes; the limit is {} bytes",
                limits.asset_bytes
            ),
        ));
    }
    Ok(())
}

fn unknown_method(method: &str) -> ProtocolError {
    let shown: String = method.chars().take(64).collect();
    if RESERVED_METHODS.contains(&method) {
        ProtocolError::new(
            Code::UnknownMethod,
            format!("{shown:?} is reserved for a later version and not part of protocol 1.0"),
        )
    } else {
        ProtocolError::new(Code::UnknownMethod, format!("no method {shown:?}"))
    }
}

/// `chess.puzzles`: lowercase segments joined by dots.
pub fn is_service_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name.split('.').all(|seg| {
            let mut b = seg.bytes();
            matches!(b.next(), Some(c) if c.is_ascii_lowercase())
                && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_')
        })
}

/// The positional arguments of one call: the text, checked for size and
/// depth, decoded on demand in one serde pass.
struct Args<'a> {
    method: &'static str,
    text: &'a str,
    structure: Structure,
    list: Vec<&'a RawValue>,
}

impl<'a> Args<'a> {
    fn parse(
        method: &str,
        text: &'a str,
        max_bytes: usize,
        too_large: Code,
    ) -> Result<Self, ProtocolError> {
        let method = HOST_METHODS
            .iter()
            .chain(PLUGIN_METHODS)
            .find(|m| **m == method)
            .copied()
            .unwrap_or("call");
        let limits = JsonLimits::new(max_bytes, MAX_JSON_DEPTH + CALL_ENVELOPE_DEPTH);
        let structure = check_bounds(text.as_bytes(), limits).map_err(|e| match e {
            JsonError::TooLarge { size, limit } => ProtocolError::new(
                too_large,
                format!("{method}: arguments are {size} bytes; the limit is {limit} bytes"),
            ),
            JsonError::TooDeep { .. } => ProtocolError::invalid_argument(format!(
                "{method}: arguments are nested deeper than {MAX_JSON_DEPTH} levels"
            )),
            JsonError::Invalid { message } => ProtocolError::invalid_argument(format!(
                "{method}: arguments must be a JSON array: {message}"
            )),
        })?;
        Ok(Args {
            method,
            text,
            structure,
            list: Vec::new(),
        })
    }

    fn not_an_array(&self, message: &str) -> ProtocolError {
        ProtocolError::invalid_argument(format!(
            "{}: arguments must be a JSON array: {}",
            self.method,
            strip_location(message)
        ))
    }

    /// Splits the arguments (for methods that take several).
    fn split(&mut self) -> Result<(), ProtocolError> {
        self.list =
            serde_json::from_str(self.text).map_err(|e| self.not_an_array(&e.to_string()))?;
        Ok(())
    }

    /// How many arguments the text holds (for an error message).
    fn count(&self) -> Option<usize> {
        serde_json::from_str::<Vec<IgnoredAny>>(self.text)
            .ok()
            .map(|v| v.len())
    }

    /// The single argument of a one-argument method, decoded in one pass
    /// over the whole text.
    fn one<T: Deserialize<'a>>(&self, param: &str) -> Result<T, ProtocolError> {
        // Valid calls take the plain pass; only a failed one is decoded
        // again with the path tracked, for the error's field name.
        let mut de = serde_json::Deserializer::from_str(self.text);
        if let Ok((v,)) = <(T,)>::deserialize(&mut de) {
            if de.end().is_ok() {
                return Ok(v);
            }
        }
        let mut de = serde_json::Deserializer::from_str(self.text);
        let result: Result<(T,), _> = serde_path_to_error::deserialize(&mut de);
        let value = match result {
            Ok((v,)) => de
                .end()
                .map(|_| v)
                .map_err(|e| self.not_an_array(&e.to_string()))?,
            Err(e) => {
                let inner = e.inner();
                if inner.is_syntax() || inner.is_eof() {
                    return Err(self.not_an_array(&inner.to_string()));
                }
                let path = e.path().to_string();
                let rest = path.strip_prefix("[0]").map(|r| r.trim_start_matches('.'));
                return Err(match rest {
                    Some(r) => self.field_error(param, r, &inner.to_string()),
                    None => match self.count() {
                        Some(n) => ProtocolError::invalid_argument(format!(
                            "{}: takes 1 argument(s), got {n}",
                            self.method
                        )),
                        None => self.not_an_array(&inner.to_string()),
                    },
                });
            }
        };
        Ok(value)
    }

    fn len(&self) -> usize {
        self.list.len()
    }

    fn raw(&self, i: usize) -> &'a RawValue {
        self.list[i]
    }

    fn invalid(&self, field: &str, problem: &str) -> ProtocolError {
        ProtocolError::invalid_argument(format!("{}: {field} {problem}", self.method))
    }

    fn arity(&self, min: usize, max: usize) -> Result<(), ProtocolError> {
        let n = self.list.len();
        if n < min || n > max {
            let expected = if min == max {
                format!("{min}")
            } else {
                format!("{min} to {max}")
            };
            return Err(ProtocolError::invalid_argument(format!(
                "{}: takes {expected} argument(s), got {n}",
                self.method
            )));
        }
        Ok(())
    }

    /// Deserializes argument `i` (named `param`) of a split call.
    fn typed<T: Deserialize<'a>>(&self, i: usize, param: &str) -> Result<T, ProtocolError> {
        let mut de = serde_json::Deserializer::from_str(self.list[i].get());
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { "" } else { path.as_str() };
            self.field_error(param, path, &e.inner().to_string())
        })
    }

    /// An error in argument `param` at `path` inside it ("" for the
    /// argument itself), named the way the SPEC names fields.
    fn field_error(&self, param: &str, path: &str, message: &str) -> ProtocolError {
        let field = if path.is_empty() {
            param.to_owned()
        } else {
            format!("{param}.{path}").replace(".[", "[")
        };
        ProtocolError::invalid_argument(format!(
            "{}: {field}: {}",
            self.method,
            strip_location(message)
        ))
    }

    /// Values must be plain JSON: numbers finite. Only walked when the
    /// pre-scan saw a number that might not fit a double.
    fn json_only(&self, raw: &RawValue, field: &str) -> Result<(), ProtocolError> {
        if !self.structure.big_numbers {
            return Ok(());
        }
        let mut de = serde_json::Deserializer::from_str(raw.get());
        JsonOnly::deserialize(&mut de).map_err(|e| {
            self.invalid(
                field,
                &format!("must be plain JSON: {}", strip_location(&e.to_string())),
            )
        })?;
        Ok(())
    }

    fn size(
        &self,
        raw: &RawValue,
        field: &str,
        max: usize,
        code: Code,
    ) -> Result<usize, ProtocolError> {
        raw_within(raw, max).map_err(|size| {
            ProtocolError::new(
                code,
                format!(
                    "{}: {field} is {size} bytes; the limit is {max} bytes",
                    self.method
                ),
            )
        })
    }
}

fn strip_location(message: &str) -> &str {
    message.split(" at line ").next().unwrap_or(message)
}

/// UTF-16 length, as the reference's schemas count characters.
fn js_len(s: &str) -> usize {
    s.encode_utf16().count()
}

fn check_text(
    args: &Args<'_>,
    field: &str,
    s: &str,
    min: usize,
    max: usize,
) -> Result<(), ProtocolError> {
    let n = js_len(s);
    if n < min {
        return Err(args.invalid(field, "must not be empty"));
    }
    if n > max {
        return Err(args.invalid(field, &format!("must be at most {max} characters (is {n})")));
    }
    Ok(())
}

fn validate_handshake(h: &Handshake) -> Result<(), ProtocolError> {
    let args = Args {
        method: "hello",
        text: "",
        structure: Structure::default(),
        list: Vec::new(),
    };
    if h.protocol.parse::<hostwire_core::Version>().is_err() {
        return Err(args.invalid(
            "handshake.protocol",
            "must be in MAJOR.MINOR format (e.g. \"1.0\")",
        ));
    }
    check_text(&args, "handshake.sdk.name", &h.sdk.name, 1, 200)?;
    check_text(&args, "handshake.sdk.version", &h.sdk.version, 1, 100)?;
    check_text(&args, "handshake.plugin.id", &h.plugin.id, 1, 500)?;
    check_text(&args, "handshake.plugin.version", &h.plugin.version, 1, 100)?;
    if h.features.len() > 100 {
        return Err(args.invalid("handshake.features", "must list at most 100 features"));
    }
    for (i, f) in h.features.iter().enumerate() {
        check_text(&args, &format!("handshake.features[{i}]"), f, 1, 100)?;
    }
    Ok(())
}

fn validate_answer(
    args: &Args<'_>,
    a: &AnswerRecord<'_>,
    limits: &Limits,
) -> Result<(), ProtocolError> {
    if let Some(p) = &a.player_id {
        check_text(args, "answer.playerId", p, 1, 128)?;
    }
    check_text(args, "answer.itemId", &a.item_id, 1, 128)?;
    if let Some(c) = a.confidence {
        if !(1..=4).contains(&c) {
            return Err(args.invalid("answer.confidence", "must be 1, 2, 3 or 4"));
        }
    }
    for (field, v) in [
        ("answer.timeSpentMs", a.time_spent_ms),
        ("answer.hintsUsed", a.hints_used),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0 && v.fract() == 0.0) {
                return Err(args.invalid(field, "must be a non-negative integer"));
            }
        }
    }
    if let Some(answer) = a.answer {
        args.json_only(answer, "answer.answer")?;
        args.size(
            answer,
            "answer.answer",
            limits.answer_bytes,
            Code::DataTooLarge,
        )?;
    }
    if let Some(item) = a.item {
        #[derive(Deserialize)]
        struct ItemHead {
            id: String,
            #[serde(rename = "type")]
            kind: String,
        }
        args.json_only(item, "answer.item")?;
        let mut de = serde_json::Deserializer::from_str(item.get());
        let head: ItemHead = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "answer.item".to_owned()
            } else {
                format!("answer.item.{path}").replace(".[", "[")
            };
            args.invalid(
                &field,
                &format!(": {}", strip_location(&e.inner().to_string())),
            )
        })?;
        check_text(args, "answer.item.id", &head.id, 1, 128)?;
        check_text(args, "answer.item.type", &head.kind, 1, 64)?;
        if head.id != a.item_id {
            return Err(args.invalid("answer.item.id", "must equal itemId"));
        }
        args.size(
            item,
            "answer.item",
            limits.generated_item_bytes,
            Code::DataTooLarge,
        )?;
    }
    Ok(())
}

/// Walks a value without building it, failing on what is not plain JSON
/// (numbers out of range, invalid escapes).
struct JsonOnly;

impl<'de> Deserialize<'de> for JsonOnly {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonOnlyVisitor)
    }
}

struct JsonOnlyVisitor;

impl<'de> Visitor<'de> for JsonOnlyVisitor {
    type Value = JsonOnly;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<JsonOnly, E> {
        Ok(JsonOnly)
    }
    fn visit_i64<E>(self, _: i64) -> Result<JsonOnly, E> {
        Ok(JsonOnly)
    }
    fn visit_u64<E>(self, _: u64) -> Result<JsonOnly, E> {
        Ok(JsonOnly)
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<JsonOnly, E> {
        if v.is_finite() {
            Ok(JsonOnly)
        } else {
            Err(E::custom("a number is not finite"))
        }
    }
    fn visit_str<E>(self, _: &str) -> Result<JsonOnly, E> {
        Ok(JsonOnly)
    }
    fn visit_unit<E>(self) -> Result<JsonOnly, E> {
        Ok(JsonOnly)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonOnly, A::Error> {
        while seq.next_element::<JsonOnly>()?.is_some() {}
        Ok(JsonOnly)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonOnly, A::Error> {
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value::<JsonOnly>()?;
        }
        Ok(JsonOnly)
    }
}

/// Decodes owned arguments, for callers that keep a call past its input.
pub fn decode_owned<T: DeserializeOwned>(text: &str) -> Result<T, ProtocolError> {
    serde_json::from_str(text)
        .map_err(|e| ProtocolError::invalid_argument(strip_location(&e.to_string())))
}
