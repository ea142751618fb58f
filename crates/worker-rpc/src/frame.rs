//! The ten frame kinds of worker RPC 1.0.0 and their JSON form.
//!
//! Every frame is one JSON object with `v` (the protocol version) and
//! `kind`. [`parse_frame`] validates all of it and names the field that is
//! wrong. It decodes borrowed: the frames calls are made of (a `request`,
//! a successful `response`) in one typed pass, any other frame or refusal
//! as a shell of raw fields over the input text, and only the payloads
//! (`params`, `result`, `data`, `progress`, error `data`) are copied, as
//! raw JSON text ([`Payload`]). So a frame costs about twice its size to
//! decode, and payloads pass through unchanged, lone surrogate escapes
//! included. [`Frame::to_text`] writes a frame back with its payloads as
//! they are, without reading them again.
//!
//! When a frame is refused (too large, too deep, not UTF-8, not JSON, a bad
//! field), [`read_head`] still reads its `kind`, `id` and `v` with a bounded,
//! lenient pass, so that the call the frame belongs to can be answered.

use hostwire_core::json::deeper_than;
use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// The version in every frame this implementation sends.
pub const PROTOCOL_VERSION: &str = "1.0.0";
/// The MAJOR this implementation speaks.
pub const PROTOCOL_MAJOR: u64 = 1;
/// Frames larger than this (in bytes, without the transport's delimiter)
/// are refused before parsing, and never sent.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// JSON nesting bound of a frame: the frame object itself is level 1, so a
/// payload may nest 127 levels below it. Deeper frames are refused before
/// parsing, and never sent.
pub const MAX_FRAME_DEPTH: usize = 128;
/// Ids, `seq`, `ack` and `credit` are JavaScript-safe integers.
pub const MAX_ID: u64 = (1 << 53) - 1;
/// `method` is 1 to this many bytes.
pub const MAX_METHOD_LEN: usize = 256;
/// How much of a refused frame the lenient pass reads: `kind`, `id` and `v`
/// must start within this many bytes for the frame to be answered.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A correlation id: a request's or a stream's.
pub type Id = u64;

/// Any JSON value, kept as the raw text it arrived as (or was written as).
///
/// Payloads are never parsed into a tree by the codec: they pass through
/// byte for byte, lone surrogate escapes (which `JSON.stringify` writes for
/// a JavaScript string holding one) included.
#[derive(Clone)]
pub struct Payload(Box<str>);

impl Payload {
    pub fn null() -> Payload {
        Payload("null".into())
    }

    /// Any serializable value as a payload.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Payload, serde_json::Error> {
        serde_json::to_string(value).map(|t| Payload(t.into()))
    }

    /// Raw JSON text as a payload (validated, kept as written; whitespace
    /// around the value is dropped).
    pub fn from_text(text: String) -> Result<Payload, serde_json::Error> {
        let value: &RawValue = serde_json::from_str(&text)?;
        if value.get().len() == text.len() {
            Ok(Payload(text.into()))
        } else {
            Ok(Payload(value.get().into()))
        }
    }

    /// JSON text that this program wrote itself (with serde_json, or from
    /// parts that were each validated), kept without a second walk over
    /// it: a frame's payload is checked where it comes in, not each time
    /// it is passed on. Checked in debug builds.
    pub fn from_valid_text(text: String) -> Payload {
        debug_assert!(
            serde_json::from_str::<&RawValue>(&text).is_ok_and(|v| v.get().len() == text.len()),
            "not one JSON value: {text}"
        );
        Payload(text.into())
    }

    pub fn from_raw(raw: Box<RawValue>) -> Payload {
        Payload(raw.into())
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        &self.0
    }

    pub fn is_null(&self) -> bool {
        self.get() == "null"
    }

    /// The payload as a tree. Fails on what a tree cannot hold: lone
    /// surrogates, numbers out of range, nesting past serde_json's bound.
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.get())
    }

    /// Deserializes the payload into `T`.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.get())
    }
}

impl From<Value> for Payload {
    fn from(v: Value) -> Payload {
        Payload::from(&v)
    }
}

impl From<&Value> for Payload {
    fn from(v: &Value) -> Payload {
        // Serializing a Value cannot fail.
        Payload::json(v).unwrap_or_else(|_| Payload::null())
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl PartialEq<Value> for Payload {
    fn eq(&self, other: &Value) -> bool {
        self.to_value().is_ok_and(|v| v == *other)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for Payload {
    /// Written as raw JSON through serde_json's `RawValue`, which reads the
    /// text once more; frames are written by [`Frame::to_text`] without it.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue = serde_json::from_str(self.get()).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

/// The error envelope carried on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorEnvelope {
    pub code: String,
    pub message: String,
    pub data: Option<Payload>,
    pub cause: Option<Box<ErrorEnvelope>>,
}

impl ErrorEnvelope {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            data: None,
            cause: None,
        }
    }

    /// The links of the chain, outermost first.
    pub fn links(&self) -> impl Iterator<Item = &ErrorEnvelope> {
        std::iter::successors(Some(self), |e| e.cause.as_deref())
    }

    pub fn to_json(&self) -> Value {
        serde_json::from_str(&serde_json::to_string(self).unwrap_or_default())
            .unwrap_or(Value::Null)
    }
}

impl Serialize for ErrorEnvelope {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // A chain is written as nested maps; each link serializes its cause,
        // so the recursion is as deep as the chain. Chains this crate sends
        // are cut to `PeerConfig::max_cause_depth` first.
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("code", &self.code)?;
        m.serialize_entry("message", &self.message)?;
        if let Some(d) = &self.data {
            m.serialize_entry("data", d)?;
        }
        if let Some(c) = &self.cause {
            m.serialize_entry("cause", c)?;
        }
        m.end()
    }
}

/// A finished call or stream: success with a value, or an error.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ok(Payload),
    Err(ErrorEnvelope),
}

/// The ten kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Request,
    Response,
    Cancel,
    Progress,
    StreamOpen,
    StreamChunk,
    StreamEnd,
    StreamAck,
    Hello,
    Goodbye,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Request,
        Kind::Response,
        Kind::Cancel,
        Kind::Progress,
        Kind::StreamOpen,
        Kind::StreamChunk,
        Kind::StreamEnd,
        Kind::StreamAck,
        Kind::Hello,
        Kind::Goodbye,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Request => "request",
            Kind::Response => "response",
            Kind::Cancel => "cancel",
            Kind::Progress => "progress",
            Kind::StreamOpen => "stream-open",
            Kind::StreamChunk => "stream-chunk",
            Kind::StreamEnd => "stream-end",
            Kind::StreamAck => "stream-ack",
            Kind::Hello => "hello",
            Kind::Goodbye => "goodbye",
        }
    }

    pub fn from_wire(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether frames of this kind carry an `id`.
    pub fn has_id(self) -> bool {
        !matches!(self, Kind::Hello | Kind::Goodbye)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds, as written on the wire.
pub const KINDS: &[&str] = &[
    "request",
    "response",
    "cancel",
    "progress",
    "stream-open",
    "stream-chunk",
    "stream-end",
    "stream-ack",
    "hello",
    "goodbye",
];

/// A decoded frame, for an exhaustive `match`.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Request {
        v: String,
        id: Id,
        method: String,
        params: Option<Payload>,
    },
    Response {
        v: String,
        id: Id,
        outcome: Outcome,
    },
    Cancel {
        v: String,
        id: Id,
        reason: Option<String>,
    },
    Progress {
        v: String,
        id: Id,
        progress: Payload,
    },
    StreamOpen {
        v: String,
        id: Id,
        method: String,
        params: Option<Payload>,
    },
    StreamChunk {
        v: String,
        id: Id,
        seq: u64,
        data: Payload,
    },
    StreamEnd {
        v: String,
        id: Id,
        outcome: Outcome,
    },
    StreamAck {
        v: String,
        id: Id,
        ack: u64,
        credit: u64,
    },
    Hello {
        v: String,
        features: Vec<String>,
        agent: Option<String>,
    },
    Goodbye {
        v: String,
        reason: Option<String>,
        error: Option<ErrorEnvelope>,
    },
}

impl Frame {
    pub fn kind_of(&self) -> Kind {
        match self {
            Frame::Request { .. } => Kind::Request,
            Frame::Response { .. } => Kind::Response,
            Frame::Cancel { .. } => Kind::Cancel,
            Frame::Progress { .. } => Kind::Progress,
            Frame::StreamOpen { .. } => Kind::StreamOpen,
            Frame::StreamChunk { .. } => Kind::StreamChunk,
            Frame::StreamEnd { .. } => Kind::StreamEnd,
            Frame::StreamAck { .. } => Kind::StreamAck,
            Frame::Hello { .. } => Kind::Hello,
            Frame::Goodbye { .. } => Kind::Goodbye,
        }
    }

    pub fn kind(&self) -> &'static str {
        self.kind_of().as_str()
    }

    pub fn version(&self) -> &str {
        match self {
            Frame::Request { v, .. }
            | Frame::Response { v, .. }
            | Frame::Cancel { v, .. }
            | Frame::Progress { v, .. }
            | Frame::StreamOpen { v, .. }
            | Frame::StreamChunk { v, .. }
            | Frame::StreamEnd { v, .. }
            | Frame::StreamAck { v, .. }
            | Frame::Hello { v, .. }
            | Frame::Goodbye { v, .. } => v,
        }
    }

    /// The correlation id, for the kinds that have one.
    pub fn id(&self) -> Option<Id> {
        match self {
            Frame::Request { id, .. }
            | Frame::Response { id, .. }
            | Frame::Cancel { id, .. }
            | Frame::Progress { id, .. }
            | Frame::StreamOpen { id, .. }
            | Frame::StreamChunk { id, .. }
            | Frame::StreamEnd { id, .. }
            | Frame::StreamAck { id, .. } => Some(*id),
            Frame::Hello { .. } | Frame::Goodbye { .. } => None,
        }
    }

    /// Whether `v` has the MAJOR this implementation speaks.
    pub fn is_compatible(&self) -> bool {
        // Our own version, as nearly every peer writes it, without reading
        // its parts (asked twice for every frame that comes in).
        self.version() == PROTOCOL_VERSION || major_of(self.version()) == Some(PROTOCOL_MAJOR)
    }

    pub fn to_json(&self) -> Value {
        serde_json::from_str(&self.to_text()).unwrap_or(Value::Null)
    }

    /// The frame as one line of JSON (no newline inside): the same text as
    /// serializing the frame with serde_json, written without serde's
    /// walk over each payload (a payload is valid JSON already).
    pub fn to_text(&self) -> String {
        // Sized from the frame's own texts, so that a frame carrying a
        // payload is written without growing its buffer on the way.
        let mut out = String::with_capacity(self.text_len_hint());
        out.push_str("{\"v\":");
        push_json_str(&mut out, self.version());
        out.push_str(",\"kind\":\"");
        out.push_str(self.kind());
        out.push('"');
        if let Some(id) = self.id() {
            push_u64(&mut out, ",\"id\":", id);
        }
        match self {
            Frame::Request { method, params, .. } | Frame::StreamOpen { method, params, .. } => {
                out.push_str(",\"method\":");
                push_json_str(&mut out, method);
                if let Some(p) = params {
                    out.push_str(",\"params\":");
                    out.push_str(p.get());
                }
            }
            Frame::Response { outcome, .. } | Frame::StreamEnd { outcome, .. } => match outcome {
                Outcome::Ok(r) => {
                    out.push_str(",\"ok\":true,\"result\":");
                    out.push_str(r.get());
                }
                Outcome::Err(e) => {
                    out.push_str(",\"ok\":false,\"error\":");
                    push_envelope(&mut out, e);
                }
            },
            Frame::Cancel { reason, .. } => push_opt_str(&mut out, ",\"reason\":", reason),
            Frame::Progress { progress, .. } => {
                out.push_str(",\"progress\":");
                out.push_str(progress.get());
            }
            Frame::StreamChunk { seq, data, .. } => {
                push_u64(&mut out, ",\"seq\":", *seq);
                out.push_str(",\"data\":");
                out.push_str(data.get());
            }
            Frame::StreamAck { ack, credit, .. } => {
                push_u64(&mut out, ",\"ack\":", *ack);
                push_u64(&mut out, ",\"credit\":", *credit);
            }
            Frame::Hello {
                features, agent, ..
            } => {
                out.push_str(",\"features\":[");
                for (i, f) in features.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_json_str(&mut out, f);
                }
                out.push(']');
                push_opt_str(&mut out, ",\"agent\":", agent);
            }
            Frame::Goodbye { reason, error, .. } => {
                push_opt_str(&mut out, ",\"reason\":", reason);
                if let Some(e) = error {
                    out.push_str(",\"error\":");
                    push_envelope(&mut out, e);
                }
            }
        }
        out.push('}');
        out
    }

    /// About the length of [`Frame::to_text`]: the texts the frame carries
    /// plus room for its keys and numbers (escapes may need more).
    fn text_len_hint(&self) -> usize {
        const KEYS: usize = 96;
        let payload = |p: &Option<Payload>| p.as_ref().map_or(0, |p| p.get().len());
        let error = |e: &ErrorEnvelope| {
            e.code.len()
                + e.message.len()
                + payload(&e.data)
                + if e.cause.is_some() { KEYS } else { 0 }
        };
        KEYS + self.version().len()
            + match self {
                Frame::Request { method, params, .. }
                | Frame::StreamOpen { method, params, .. } => method.len() + payload(params),
                Frame::Response { outcome, .. } | Frame::StreamEnd { outcome, .. } => match outcome
                {
                    Outcome::Ok(r) => r.get().len(),
                    Outcome::Err(e) => error(e),
                },
                Frame::Cancel { reason, .. } => reason.as_ref().map_or(0, String::len),
                Frame::Progress { progress, .. } => progress.get().len(),
                Frame::StreamChunk { data, .. } => data.get().len(),
                Frame::StreamAck { .. } => 0,
                Frame::Hello {
                    features, agent, ..
                } => {
                    features.iter().map(|f| f.len() + 3).sum::<usize>()
                        + agent.as_ref().map_or(0, String::len)
                }
                Frame::Goodbye {
                    reason, error: e, ..
                } => reason.as_ref().map_or(0, String::len) + e.as_ref().map_or(0, error),
            }
    }
}

impl Serialize for Frame {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("v", self.version())?;
        m.serialize_entry("kind", self.kind())?;
        if let Some(id) = self.id() {
            m.serialize_entry("id", &id)?;
        }
        match self {
            Frame::Request { method, params, .. } | Frame::StreamOpen { method, params, .. } => {
                m.serialize_entry("method", method)?;
                if let Some(p) = params {
                    m.serialize_entry("params", p)?;
                }
            }
            Frame::Response { outcome, .. } | Frame::StreamEnd { outcome, .. } => match outcome {
                Outcome::Ok(r) => {
                    m.serialize_entry("ok", &true)?;
                    m.serialize_entry("result", r)?;
                }
                Outcome::Err(e) => {
                    m.serialize_entry("ok", &false)?;
                    m.serialize_entry("error", e)?;
                }
            },
            Frame::Cancel { reason, .. } => {
                if let Some(r) = reason {
                    m.serialize_entry("reason", r)?;
                }
            }
            Frame::Progress { progress, .. } => m.serialize_entry("progress", progress)?,
            Frame::StreamChunk { seq, data, .. } => {
                m.serialize_entry("seq", seq)?;
                m.serialize_entry("data", data)?;
            }
            Frame::StreamAck { ack, credit, .. } => {
                m.serialize_entry("ack", ack)?;
                m.serialize_entry("credit", credit)?;
            }
            Frame::Hello {
                features, agent, ..
            } => {
                m.serialize_entry("features", features)?;
                if let Some(a) = agent {
                    m.serialize_entry("agent", a)?;
                }
            }
            Frame::Goodbye { reason, error, .. } => {
                if let Some(r) = reason {
                    m.serialize_entry("reason", r)?;
                }
                if let Some(e) = error {
                    m.serialize_entry("error", e)?;
                }
            }
        }
        m.end()
    }
}

/// `s` as a JSON string: as it is when nothing in it needs an escape (a
/// version, a method name), else escaped by serde_json.
fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        // Serializing a string cannot fail.
        out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
    }
}

fn push_opt_str(out: &mut String, key: &str, s: &Option<String>) {
    if let Some(s) = s {
        out.push_str(key);
        push_json_str(out, s);
    }
}

fn push_u64(out: &mut String, key: &str, n: u64) {
    out.push_str(key);
    out.push_str(itoa::Buffer::new().format(n));
}

/// An error envelope, its causes nested as the wire has them (a chain this
/// crate sends is cut to `PeerConfig::max_cause_depth` first).
fn push_envelope(out: &mut String, e: &ErrorEnvelope) {
    out.push_str("{\"code\":");
    push_json_str(out, &e.code);
    out.push_str(",\"message\":");
    push_json_str(out, &e.message);
    if let Some(d) = &e.data {
        out.push_str(",\"data\":");
        out.push_str(d.get());
    }
    if let Some(c) = &e.cause {
        out.push_str(",\"cause\":");
        push_envelope(out, c);
    }
    out.push('}');
}

/// The MAJOR of a `MAJOR.MINOR.PATCH` version, if it has one.
pub fn major_of(v: &str) -> Option<u64> {
    let major = v.split('.').next()?;
    if major.is_empty() || major.len() > 15 || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    major.parse().ok()
}

/// The value of a JSON number token if it is an integer in `0..=max`,
/// read as JavaScript reads it: `5`, `5.0`, `5e0`, `0.5e1` and `-0` are all
/// integers; `5.5`, `1e400` and `-1` are not. Exact (no float rounding).
pub fn exact_integer(token: &str, max: u64) -> Option<u64> {
    // Plain digits, as every id and version is written: read in place.
    // (Up to 16 digits, below 10^16, as the general way below reads them.)
    if !token.is_empty() && token.len() <= 16 && token.bytes().all(|b| b.is_ascii_digit()) {
        return token.parse::<u64>().ok().filter(|v| *v <= max);
    }
    let t = token.strip_prefix('-').unwrap_or(token);
    let negative = t.len() != token.len();
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    if int_part.is_empty()
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
        || (mantissa.contains('.') && frac_part.is_empty())
    {
        return None;
    }
    let exp: i64 = match exp {
        None => 0,
        Some(e) => {
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Any exponent past 10^5 of a non-zero mantissa is out of range;
            // a zero mantissa stays zero whatever the exponent.
            let mag: i64 = if digits.len() > 6 {
                1_000_000
            } else {
                digits.parse().ok()?
            };
            if e.starts_with('-') {
                -mag
            } else {
                mag
            }
        }
    };
    // All significant digits, and where the decimal point sits among them.
    let digits: Vec<u8> = int_part.bytes().chain(frac_part.bytes()).collect();
    let first = digits.iter().position(|&d| d != b'0');
    let Some(first) = first else {
        return Some(0); // zero, -0, 0.0e99
    };
    if negative {
        return None;
    }
    let point = int_part.len() as i64 + exp; // digits before the point
    let last = digits.iter().rposition(|&d| d != b'0').unwrap_or(first);
    if (last as i64) >= point {
        return None; // a non-zero digit after the point
    }
    if point - first as i64 > 16 {
        return None; // at least 10^16: beyond any max we use
    }
    let mut value: u64 = 0;
    for i in first as i64..point {
        let d = digits.get(i as usize).map_or(0, |d| u64::from(d - b'0'));
        value = value.checked_mul(10)?.checked_add(d)?;
    }
    (value <= max).then_some(value)
}

/// Why a frame was refused: the field and the problem, and what could be
/// read of it (strictly or by the lenient pass) so it can be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    /// The field, as a path (`error.cause.code`); empty for the frame as a
    /// whole.
    pub field: String,
    pub message: String,
    pub kind: Option<Kind>,
    pub id: Option<Id>,
    /// `v`, when it could be read as a string.
    pub v: Option<String>,
}

impl FrameError {
    /// Whether the frame names another MAJOR (what else is wrong with it
    /// may be that version's shape).
    pub fn other_major(&self) -> bool {
        self.v
            .as_deref()
            .is_some_and(|v| major_of(v) != Some(PROTOCOL_MAJOR))
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for FrameError {}

/// What the lenient pass read of a frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    pub kind: Option<Kind>,
    pub id: Option<Id>,
    pub v: Option<String>,
}

/// The bounded, lenient pass: reads the top-level `kind`, `id` and `v` of a
/// frame that may be truncated, not UTF-8, too deep, or not JSON at all.
///
/// It walks at most [`MAX_HEAD_BYTES`] bytes once, with a nesting counter
/// instead of a stack (constant memory), and stops at the first byte it
/// cannot make sense of, keeping what it had read. Only string values of
/// `kind` and `v` (without escapes) and number values of `id` are taken; a
/// key seen twice keeps its first value.
pub fn read_head(bytes: &[u8]) -> Head {
    let b = &bytes[..bytes.len().min(MAX_HEAD_BYTES)];
    let mut head = Head::default();
    let mut i = 0usize;
    let ws = |i: &mut usize| {
        while *i < b.len() && matches!(b[*i], b' ' | b'\t' | b'\n' | b'\r') {
            *i += 1;
        }
    };
    // A string starting at b[i] == '"': returns its raw content and moves
    // past the closing quote; None if it does not end within the input.
    let string = |i: &mut usize| -> Option<&[u8]> {
        let start = *i + 1;
        let mut j = start;
        while j < b.len() {
            match b[j] {
                b'\\' => j += 2,
                b'"' => {
                    *i = j + 1;
                    return Some(&b[start..j]);
                }
                _ => j += 1,
            }
        }
        None
    };
    ws(&mut i);
    if b.get(i) != Some(&b'{') {
        return head;
    }
    i += 1;
    loop {
        ws(&mut i);
        match b.get(i) {
            Some(b'"') => {}
            _ => return head,
        }
        let Some(key) = string(&mut i) else {
            return head;
        };
        ws(&mut i);
        if b.get(i) != Some(&b':') {
            return head;
        }
        i += 1;
        ws(&mut i);
        let Some(&first) = b.get(i) else {
            return head;
        };
        match first {
            b'"' => {
                let Some(s) = string(&mut i) else {
                    return head;
                };
                let s = std::str::from_utf8(s).ok().filter(|s| !s.contains('\\'));
                match (key, s) {
                    (b"kind", Some(s)) if head.kind.is_none() => head.kind = Kind::from_wire(s),
                    (b"v", Some(s)) if head.v.is_none() && s.len() <= 64 => {
                        head.v = Some(s.to_owned())
                    }
                    _ => {}
                }
            }
            b'{' | b'[' => {
                // Skip a nested value with a counter: strings are stepped
                // over, brackets of either kind counted.
                let mut depth = 0u64;
                loop {
                    match b.get(i) {
                        None => return head,
                        Some(b'"') => {
                            if string(&mut i).is_none() {
                                return head;
                            }
                            continue;
                        }
                        Some(b'{' | b'[') => depth += 1,
                        Some(b'}' | b']') => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        Some(_) => {}
                    }
                    i += 1;
                }
            }
            _ => {
                // A scalar: up to the next delimiter.
                let start = i;
                while i < b.len() && !matches!(b[i], b',' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
                    i += 1;
                }
                if i == b.len() {
                    return head; // may be cut short
                }
                if key == b"id" && head.id.is_none() {
                    head.id = std::str::from_utf8(&b[start..i])
                        .ok()
                        .and_then(|t| exact_integer(t, MAX_ID));
                }
            }
        }
        ws(&mut i);
        match b.get(i) {
            Some(b',') => i += 1,
            _ => return head,
        }
    }
}

/// Deserializes a present field as its raw text, `null` included (serde's
/// `Option` would read `null` as absent).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// A frame's fields as a struct for one serde pass: the fields given, then
/// the fields of the other kinds as raw text over the input (a field
/// present as `null` is present). Unknown fields are skipped (without being
/// checked); a known field twice is refused.
macro_rules! frame_fields {
    ($(#[$attr:meta])* struct $name:ident { $($field:tt)* }) => {
        $(#[$attr])*
        #[derive(serde::Deserialize)]
        struct $name<'a> {
            $($field)*
            #[serde(borrow, default, deserialize_with = "present")]
            params: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            result: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            error: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            reason: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            progress: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            seq: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            data: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            ack: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            credit: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            features: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            agent: Option<&'a RawValue>,
        }
    };
}

frame_fields! {
    /// Every field a frame of any kind may have, as raw text over the input.
    struct Shell {
        #[serde(borrow, default, deserialize_with = "present")]
        v: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        kind: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        id: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        method: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "present")]
        ok: Option<&'a RawValue>,
    }
}

frame_fields! {
    /// The fields of the frames every call is made of (`request`,
    /// `stream-open`, and a `response` or `stream-end` with `ok: true`) read
    /// as what they must be, in the same one pass but without a raw value
    /// for each small field; the other kinds' fields are read only so that a
    /// duplicate is refused as [`Shell`] refuses it. A frame it does not take
    /// (another kind, a string with escapes, an id that is not plain digits,
    /// any field of the wrong type) is read again by [`Shell`], which
    /// decides, and names the field when it refuses.
    #[allow(dead_code)]
    struct Typed {
        #[serde(borrow)]
        v: Option<&'a str>,
        #[serde(borrow)]
        kind: Option<&'a str>,
        id: Option<u64>,
        #[serde(borrow)]
        method: Option<&'a str>,
        ok: Option<bool>,
    }
}

impl Typed<'_> {
    /// The frame, if it is one this pass decides alone.
    fn frame(&self) -> Option<Frame> {
        let v = self.v?.to_owned();
        let id = self.id.filter(|id| *id <= MAX_ID)?;
        let payload = |raw: Option<&RawValue>| raw.map(|r| Payload(r.get().into()));
        let method = || {
            self.method
                .filter(|m| !m.is_empty() && m.len() <= MAX_METHOD_LEN)
                .map(str::to_owned)
        };
        let ok = || {
            self.ok?
                .then(|| Outcome::Ok(payload(self.result).unwrap_or_else(Payload::null)))
        };
        Some(match Kind::from_wire(self.kind?)? {
            Kind::Request => Frame::Request {
                v,
                id,
                method: method()?,
                params: payload(self.params),
            },
            Kind::StreamOpen => Frame::StreamOpen {
                v,
                id,
                method: method()?,
                params: payload(self.params),
            },
            Kind::Response => Frame::Response {
                v,
                id,
                outcome: ok()?,
            },
            Kind::StreamEnd => Frame::StreamEnd {
                v,
                id,
                outcome: ok()?,
            },
            _ => return None,
        })
    }
}

/// One link of an error envelope, as raw fields; the chain nests through
/// `cause` (at most as deep as the frame, which is bounded before parsing).
#[derive(serde::Deserialize)]
struct EnvelopeShell<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    code: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    message: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cause: Option<Box<EnvelopeShell<'a>>>,
}

fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

struct Reader<'a> {
    shell: Shell<'a>,
    kind: Kind,
    id: Option<Id>,
    v: Option<String>,
}

impl<'a> Reader<'a> {
    fn err(&self, field: &str, message: impl Into<String>) -> FrameError {
        FrameError {
            field: field.to_owned(),
            message: message.into(),
            kind: Some(self.kind),
            id: self.id,
            v: self.v.clone(),
        }
    }

    fn string_of(
        &self,
        field: &str,
        raw: Option<&'a RawValue>,
    ) -> Result<Option<String>, FrameError> {
        match raw {
            None => Ok(None),
            Some(r) => match plain_str(r).map_or_else(
                || serde_json::from_str::<Cow<'a, str>>(r.get()),
                |s| Ok(Cow::Borrowed(s)),
            ) {
                Ok(s) => Ok(Some(s.into_owned())),
                Err(_) if r.get().starts_with('"') => Err(self.err(
                    field,
                    "must be a string of Unicode text (it holds a lone surrogate)",
                )),
                Err(_) => Err(self.err(field, "must be a string")),
            },
        }
    }

    fn required_string(
        &self,
        field: &str,
        raw: Option<&'a RawValue>,
    ) -> Result<String, FrameError> {
        self.string_of(field, raw)?
            .ok_or_else(|| self.err(field, "is required"))
    }

    fn uint(&self, field: &str, raw: Option<&'a RawValue>) -> Result<u64, FrameError> {
        let raw = raw.ok_or_else(|| self.err(field, "is required"))?;
        let t = raw.get();
        if !t.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
            return Err(self.err(field, "must be a number"));
        }
        exact_integer(t, MAX_ID)
            .ok_or_else(|| self.err(field, format!("must be an integer from 0 to {MAX_ID}")))
    }

    fn method(&self) -> Result<String, FrameError> {
        let m = self.required_string("method", self.shell.method)?;
        if m.is_empty() || m.len() > MAX_METHOD_LEN {
            return Err(self.err("method", format!("must be 1 to {MAX_METHOD_LEN} bytes")));
        }
        Ok(m)
    }

    fn payload(raw: Option<&'a RawValue>) -> Option<Payload> {
        raw.map(|r| Payload(r.get().into()))
    }

    fn outcome(&self) -> Result<Outcome, FrameError> {
        let ok = self.shell.ok.ok_or_else(|| self.err("ok", "is required"))?;
        match ok.get() {
            "true" => Ok(Outcome::Ok(
                Self::payload(self.shell.result).unwrap_or_else(Payload::null),
            )),
            "false" => match self.shell.error {
                None => Err(self.err("error", "is required when ok is false")),
                Some(e) => Ok(Outcome::Err(self.envelope(e, "error")?)),
            },
            _ => Err(self.err("ok", "must be true or false")),
        }
    }

    /// Reads an error envelope: one parse of its text, then its links
    /// outermost first, without recursion.
    fn envelope(&self, raw: &'a RawValue, path: &str) -> Result<ErrorEnvelope, FrameError> {
        if !raw.get().starts_with('{') {
            return Err(self.err(path, "must be an error object {code, message}"));
        }
        let shell: EnvelopeShell<'a> = serde_json::from_str(raw.get()).map_err(|e| {
            self.err(
                path,
                format!("must be an error object {{code, message, data?, cause?}}: {e}"),
            )
        })?;
        let mut links: Vec<(String, String, Option<Payload>)> = Vec::new();
        let mut cur = Some(&shell);
        let mut p = path.to_owned();
        while let Some(e) = cur {
            let code = self.required_string(&format!("{p}.code"), e.code)?;
            if code.is_empty() {
                return Err(self.err(&format!("{p}.code"), "must be a non-empty string"));
            }
            let message = self.required_string(&format!("{p}.message"), e.message)?;
            links.push((code, message, Self::payload(e.data)));
            cur = e.cause.as_deref();
            p.push_str(".cause");
        }
        let mut out: Option<ErrorEnvelope> = None;
        for (code, message, data) in links.into_iter().rev() {
            out = Some(ErrorEnvelope {
                code,
                message,
                data,
                cause: out.map(Box::new),
            });
        }
        out.ok_or_else(|| self.err(path, "is required"))
    }
}

/// Parses and validates one frame of text.
pub fn parse_frame(text: &str) -> Result<Frame, FrameError> {
    check_size(text.as_bytes())?;
    parse_text(text)
}

/// Parses and validates one frame of bytes (which may not be UTF-8).
///
/// Order, cheapest first: size, UTF-8, nesting depth, the shell parse, then
/// each field. A frame refused before its fields are read gets its `kind`,
/// `id` and `v` from [`read_head`].
pub fn parse_frame_bytes(bytes: &[u8]) -> Result<Frame, FrameError> {
    check_size(bytes)?;
    let text = std::str::from_utf8(bytes)
        .map_err(|e| refused(bytes, format!("not UTF-8 at byte {}", e.valid_up_to())))?;
    parse_text(text)
}

fn refused(bytes: &[u8], message: String) -> FrameError {
    let head = read_head(bytes);
    FrameError {
        field: String::new(),
        message,
        kind: head.kind,
        id: head.id,
        v: head.v,
    }
}

/// A JSON string without escapes, as the text between its quotes; `None`
/// for any other value (or a string with escapes, which serde_json reads).
/// A raw value was validated as it was read, so a string's last byte is
/// its closing quote and nothing inside needs checking but backslashes.
fn plain_str(raw: &RawValue) -> Option<&str> {
    let inner = raw.get().strip_prefix('"')?.strip_suffix('"')?;
    memchr::memchr(b'\\', inner.as_bytes())
        .is_none()
        .then_some(inner)
}

fn check_size(bytes: &[u8]) -> Result<(), FrameError> {
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(refused(
            bytes,
            format!(
                "the frame is {} bytes; the limit is {MAX_FRAME_BYTES}",
                bytes.len()
            ),
        ));
    }
    Ok(())
}

/// The checks after size and UTF-8: nesting depth, the shell parse, then
/// each field.
fn parse_text(text: &str) -> Result<Frame, FrameError> {
    check_shape(text)?;
    if let Some(frame) = serde_json::from_str::<Typed<'_>>(text)
        .ok()
        .and_then(|t| t.frame())
    {
        return Ok(frame);
    }
    decode_shell(text)
}

/// Nesting depth first (before any parser recurses), then an object.
fn check_shape(text: &str) -> Result<(), FrameError> {
    let bytes = text.as_bytes();
    if deeper_than(bytes, MAX_FRAME_DEPTH) {
        return Err(refused(
            bytes,
            format!("the frame is nested deeper than {MAX_FRAME_DEPTH} levels"),
        ));
    }
    if !text.trim_start().starts_with('{') {
        return Err(refused(bytes, "a frame must be a JSON object".into()));
    }
    Ok(())
}

/// The frame read field by field from raw values: every kind, and every
/// refusal with the field it names.
fn decode_shell(text: &str) -> Result<Frame, FrameError> {
    let shell: Shell<'_> = serde_json::from_str(text)
        .map_err(|e| refused(text.as_bytes(), format!("not a JSON frame: {e}")))?;
    decode(shell, text.as_bytes())
}

/// [`parse_frame`] without its one-pass path for the common frames: the
/// fuzz target and the tests hold both to the same answers.
#[doc(hidden)]
pub fn parse_frame_by_fields(text: &str) -> Result<Frame, FrameError> {
    check_size(text.as_bytes())?;
    check_shape(text)?;
    decode_shell(text)
}

fn decode<'a>(shell: Shell<'a>, bytes: &[u8]) -> Result<Frame, FrameError> {
    let head = || read_head(bytes);
    // kind first: it says which fields the frame has.
    let kind = match shell.kind {
        None => {
            let h = head();
            return Err(FrameError {
                field: "kind".into(),
                message: "is required".into(),
                kind: None,
                id: h.id,
                v: h.v,
            });
        }
        Some(raw) => match plain_str(raw)
            .map(Cow::Borrowed)
            .or_else(|| serde_json::from_str::<Cow<'_, str>>(raw.get()).ok())
            .and_then(|k| Kind::from_wire(&k))
        {
            Some(k) => k,
            None => {
                let h = head();
                return Err(FrameError {
                    field: "kind".into(),
                    message: format!("must be one of {}", KINDS.join(", ")),
                    kind: None,
                    id: h.id,
                    v: h.v,
                });
            }
        },
    };
    let mut r = Reader {
        shell,
        kind,
        id: None,
        v: None,
    };
    // v and id next, so every later error can be answered.
    let v_raw = r.shell.v;
    let v = r.string_of("v", v_raw);
    if let Ok(Some(v)) = &v {
        r.v = Some(v.clone());
    }
    if kind.has_id() {
        if let Some(raw) = r.shell.id {
            r.id = exact_integer(raw.get(), MAX_ID);
        }
    }
    // Any string: a `v` without our MAJOR is a version mismatch, not a
    // malformed frame (the seed keeps `v` free-form for logging).
    let v = v?.ok_or_else(|| r.err("v", "is required"))?;
    let id = |r: &Reader<'a>| r.uint("id", r.shell.id);
    let s = &r.shell;
    let frame = match kind {
        Kind::Request => Frame::Request {
            id: id(&r)?,
            method: r.method()?,
            params: Reader::payload(s.params),
            v,
        },
        Kind::StreamOpen => Frame::StreamOpen {
            id: id(&r)?,
            method: r.method()?,
            params: Reader::payload(s.params),
            v,
        },
        Kind::Response => Frame::Response {
            id: id(&r)?,
            outcome: r.outcome()?,
            v,
        },
        Kind::StreamEnd => Frame::StreamEnd {
            id: id(&r)?,
            outcome: r.outcome()?,
            v,
        },
        Kind::Cancel => Frame::Cancel {
            id: id(&r)?,
            reason: r.string_of("reason", s.reason)?,
            v,
        },
        Kind::Progress => Frame::Progress {
            id: id(&r)?,
            progress: Reader::payload(s.progress)
                .ok_or_else(|| r.err("progress", "is required"))?,
            v,
        },
        Kind::StreamChunk => {
            let id = id(&r)?;
            let seq = r.uint("seq", s.seq)?;
            if seq == 0 {
                return Err(r.err("seq", "counts from 1"));
            }
            Frame::StreamChunk {
                id,
                seq,
                data: Reader::payload(s.data).ok_or_else(|| r.err("data", "is required"))?,
                v,
            }
        }
        Kind::StreamAck => Frame::StreamAck {
            id: id(&r)?,
            ack: r.uint("ack", s.ack)?,
            credit: r.uint("credit", s.credit)?,
            v,
        },
        Kind::Hello => {
            let features = match s.features {
                None => Vec::new(),
                Some(raw) if is_null(raw) => Vec::new(),
                Some(raw) => {
                    let items: Vec<&RawValue> = serde_json::from_str(raw.get())
                        .map_err(|_| r.err("features", "must be an array of strings"))?;
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, f)| r.required_string(&format!("features[{i}]"), Some(*f)))
                        .collect::<Result<_, _>>()?
                }
            };
            Frame::Hello {
                features,
                agent: r.string_of("agent", s.agent)?,
                v,
            }
        }
        Kind::Goodbye => Frame::Goodbye {
            reason: r.string_of("reason", s.reason)?,
            error: match s.error {
                None => None,
                Some(raw) if is_null(raw) => None,
                Some(raw) => Some(r.envelope(raw, "error")?),
            },
            v,
        },
    };
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    mod text {
        use super::*;
        use proptest::prelude::*;

        fn payload() -> impl Strategy<Value = Payload> {
            prop_oneof![
                Just(Payload::null()),
                any::<String>().prop_map(|s| Payload::json(&s).unwrap()),
                (any::<i64>(), any::<bool>())
                    .prop_map(|(n, b)| Payload::json(&serde_json::json!([n, {"b": b}])).unwrap()),
                // Kept as written: whitespace and a lone surrogate escape.
                Just(
                    Payload::from_text("{ \"a\" : [1, 2.50e3] , \"s\": \"\\ud800\" }".into())
                        .unwrap()
                ),
            ]
        }

        fn envelope() -> impl Strategy<Value = ErrorEnvelope> {
            let link = (
                "(?s).{1,30}",
                any::<String>(),
                proptest::option::of(payload()),
            );
            proptest::collection::vec(link, 1..4).prop_map(|links| {
                let mut out: Option<ErrorEnvelope> = None;
                for (code, message, data) in links {
                    out = Some(ErrorEnvelope {
                        code,
                        message,
                        data,
                        cause: out.map(Box::new),
                    });
                }
                out.unwrap()
            })
        }

        fn outcome() -> impl Strategy<Value = Outcome> {
            prop_oneof![
                payload().prop_map(Outcome::Ok),
                envelope().prop_map(Outcome::Err)
            ]
        }

        fn frame() -> impl Strategy<Value = Frame> {
            let v = any::<String>();
            let id = 0..=MAX_ID;
            let s = proptest::option::of(any::<String>());
            prop_oneof![
                (
                    v,
                    id.clone(),
                    "(?s).{1,60}",
                    proptest::option::of(payload())
                )
                    .prop_map(|(v, id, method, params)| Frame::Request {
                        v,
                        id,
                        method,
                        params
                    }),
                (
                    v,
                    id.clone(),
                    "(?s).{1,60}",
                    proptest::option::of(payload())
                )
                    .prop_map(|(v, id, method, params)| Frame::StreamOpen {
                        v,
                        id,
                        method,
                        params
                    }),
                (v, id.clone(), outcome()).prop_map(|(v, id, outcome)| Frame::Response {
                    v,
                    id,
                    outcome
                }),
                (v, id.clone(), outcome()).prop_map(|(v, id, outcome)| Frame::StreamEnd {
                    v,
                    id,
                    outcome
                }),
                (v, id.clone(), s.clone()).prop_map(|(v, id, reason)| Frame::Cancel {
                    v,
                    id,
                    reason
                }),
                (v, id.clone(), payload()).prop_map(|(v, id, progress)| Frame::Progress {
                    v,
                    id,
                    progress
                }),
                (v, id.clone(), 1..=MAX_ID, payload())
                    .prop_map(|(v, id, seq, data)| Frame::StreamChunk { v, id, seq, data }),
                (v, id.clone(), 0..=MAX_ID, 0..=MAX_ID)
                    .prop_map(|(v, id, ack, credit)| Frame::StreamAck { v, id, ack, credit }),
                (
                    v,
                    proptest::collection::vec(any::<String>(), 0..4),
                    s.clone()
                )
                    .prop_map(|(v, features, agent)| Frame::Hello {
                        v,
                        features,
                        agent
                    }),
                (v, s, proptest::option::of(envelope()))
                    .prop_map(|(v, reason, error)| Frame::Goodbye { v, reason, error }),
            ]
        }

        proptest! {
            /// The hand-written text is exactly serde_json's serialization
            /// of the frame (control characters, quotes and non-ASCII text
            /// included), and reads back as the same frame.
            #[test]
            fn a_frames_text_is_serde_jsons(f in frame()) {
                let text = f.to_text();
                prop_assert_eq!(&text, &serde_json::to_string(&f).unwrap());
                prop_assert_eq!(parse_frame(&text).ok(), Some(f));
                prop_assert_eq!(parse_frame(&text), parse_frame_by_fields(&text));
            }
        }
    }

    /// The one-pass path for the common frames answers as the field by
    /// field one does: what it takes, and what it leaves to it.
    #[test]
    fn the_one_pass_path_agrees_with_the_fields() {
        let texts = [
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"send","params":[1]}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"send","params":null}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"stream-open","id":7,"method":"m","params":{}}"#,
            r#"{"v":"1.0.0","kind":"response","id":7,"ok":true,"result":{"a":1}}"#,
            r#"{"v":"1.0.0","kind":"response","id":7,"ok":true}"#,
            r#"{"v":"1.0.0","kind":"stream-end","id":7,"ok":true,"result":null}"#,
            r#"{"v":"1.0.0","kind":"response","id":7,"ok":false,"error":{"code":"X","message":"m"}}"#,
            r#"{"v":"1.0\u002e0","kind":"request","id":7,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"req\u0075est","id":7,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"se\nd"}"#,
            r#"{"v":null,"kind":"request","id":7,"method":"send"}"#,
            r#"{"v":1,"kind":"request","id":7,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":7.0,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":-0,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":1e2,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":9007199254740992,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":18446744073709551616,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":null,"method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":""}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":null}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"send","method":"send"}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"send","error":1,"error":2}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"send","extra":[1,{"x":2}]}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"send","ok":"yes"}"#,
            r#"{"v":"1.0.0","kind":"response","id":7,"ok":"true","result":1}"#,
            r#"{"v":"1.0.0","kind":"response","id":7,"ok":null,"result":1}"#,
            r#"{"v":"1.0.0","kind":"response","id":7,"result":1}"#,
            r#"{"v":"1.0.0","kind":"hello","features":["cancel"]}"#,
            r#"{"v":"1.0.0","kind":"cancel","id":7}"#,
            r#"{"v":"1.0.0","kind":"nope","id":7}"#,
            r#"{"v":"1.0.0","kind":"request","id":7,"method":"send","params":[1]"#,
            r#"{"v":"2.0.0","kind":"request","id":7,"method":"send"}"#,
        ];
        let long = format!(
            r#"{{"v":"1.0.0","kind":"request","id":7,"method":"{}"}}"#,
            "m".repeat(MAX_METHOD_LEN + 1)
        );
        for text in texts.iter().copied().chain([long.as_str()]) {
            assert_eq!(parse_frame(text), parse_frame_by_fields(text), "{text}");
        }
    }

    /// A frame's text fits the buffer it is written into, so that it is
    /// not grown on the way (one allocation per outgoing frame).
    #[test]
    fn a_frames_text_fits_its_size_hint() {
        let big = Payload::from_text(format!("[{}]", vec!["\"x\""; 400].join(","))).unwrap();
        let frames = [
            Frame::Request {
                v: PROTOCOL_VERSION.into(),
                id: 9_007_199_254_740_991,
                method: "memizy.deliver".into(),
                params: Some(big.clone()),
            },
            Frame::Response {
                v: PROTOCOL_VERSION.into(),
                id: 1,
                outcome: Outcome::Ok(big.clone()),
            },
            Frame::Response {
                v: PROTOCOL_VERSION.into(),
                id: 1,
                outcome: Outcome::Err(ErrorEnvelope::new("INVALID_ARGUMENT", "x".repeat(300))),
            },
            Frame::StreamChunk {
                v: PROTOCOL_VERSION.into(),
                id: 2,
                seq: MAX_ID,
                data: big,
            },
            Frame::StreamAck {
                v: PROTOCOL_VERSION.into(),
                id: 2,
                ack: MAX_ID,
                credit: MAX_ID,
            },
            Frame::Hello {
                v: PROTOCOL_VERSION.into(),
                features: vec!["cancel".into(), "progress".into(), "streams".into()],
                agent: Some("hostwire".into()),
            },
        ];
        for f in frames {
            let text = f.to_text();
            assert!(
                text.len() <= f.text_len_hint(),
                "{} bytes against a hint of {}: {text}",
                text.len(),
                f.text_len_hint()
            );
            assert_eq!(parse_frame(&text).unwrap(), f);
        }
    }

    #[test]
    fn exact_integers_as_javascript_reads_them() {
        for (t, want) in [
            ("0", Some(0)),
            ("-0", Some(0)),
            ("5", Some(5)),
            ("5.0", Some(5)),
            ("5.000", Some(5)),
            ("1e3", Some(1000)),
            ("1E+3", Some(1000)),
            ("0.5e1", Some(5)),
            ("150e-1", Some(15)),
            ("9007199254740991", Some(MAX_ID)),
            ("9007199254740992", None),
            ("5.5", None),
            ("1e400", None),
            ("1e-400", None),
            ("0e999999999", Some(0)),
            ("-1", None),
            ("01", Some(1)),
            ("", None),
            ("5.", None),
            (".5", None),
            ("1e", None),
            ("abc", None),
            ("99999999999999999999999", None),
        ] {
            assert_eq!(exact_integer(t, MAX_ID), want, "{t}");
        }
        // Plain digits against a smaller bound, read in place, as the
        // general way reads their other spellings.
        for (t, max, want) in [
            ("100", 100, Some(100)),
            ("100", 99, None),
            ("1e2", 99, None),
            ("1000000000000000", u64::MAX, Some(1_000_000_000_000_000)),
            ("10000000000000000", u64::MAX, None),
        ] {
            assert_eq!(exact_integer(t, max), want, "{t} ≤ {max}");
        }
    }

    #[test]
    fn the_lenient_pass_reads_the_head_of_anything() {
        let h = read_head(br#"{"v":"2.0.0","kind":"request","id":7,"params":[[[[["#);
        assert_eq!(
            h,
            Head {
                kind: Some(Kind::Request),
                id: Some(7),
                v: Some("2.0.0".into())
            }
        );
        let h = read_head(b"{\"params\":\"a\xff\\\"}\",\"id\":5.0,\"kind\":\"response\"}");
        assert_eq!((h.kind, h.id), (Some(Kind::Response), Some(5)));
        // Nested ids are not the frame's.
        let h = read_head(br#"{"params":{"id":3},"kind":"cancel"}"#);
        assert_eq!((h.kind, h.id), (Some(Kind::Cancel), None));
        // A number cut short is not read.
        assert_eq!(read_head(br#"{"id":12"#).id, None);
        assert_eq!(read_head(b"").kind, None);
    }
}
