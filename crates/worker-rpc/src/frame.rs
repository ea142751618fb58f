//! The ten frame kinds of worker RPC 1.0.0 and their JSON form.
//!
//! Every frame is one JSON object with `v` (the protocol version) and
//! `kind`. `parse_frame` validates all of it and names the field that is
//! wrong; a frame whose `v` has another MAJOR still parses (for logging),
//! and the peer answers it with `VERSION_MISMATCH`.

use hostwire_core::json::{from_str_bounded, JsonError, JsonLimits};
use serde_json::{json, Map, Value};
use std::fmt;

/// The version in every frame this implementation sends.
pub const PROTOCOL_VERSION: &str = "1.0.0";
/// The MAJOR this implementation speaks.
pub const PROTOCOL_MAJOR: u64 = 1;
/// Frames larger than this are refused before parsing.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// JSON nesting bound of a frame (the cause chain is bounded separately).
pub const MAX_FRAME_DEPTH: usize = 128;
/// Ids are JavaScript-safe integers.
pub const MAX_ID: u64 = (1 << 53) - 1;
pub const MAX_METHOD_LEN: usize = 256;

/// A correlation id: a request's or a stream's, unique per connection.
pub type Id = u64;

/// The error envelope carried on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorEnvelope {
    pub code: String,
    pub message: String,
    pub data: Option<Value>,
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

    pub fn to_json(&self) -> Value {
        // Iterative from the innermost cause: no recursion on deep chains.
        let mut chain: Vec<&ErrorEnvelope> = Vec::new();
        let mut cur = Some(self);
        while let Some(e) = cur {
            chain.push(e);
            cur = e.cause.as_deref();
        }
        let mut inner: Option<Value> = None;
        for e in chain.into_iter().rev() {
            let mut m = Map::new();
            m.insert("code".into(), Value::String(e.code.clone()));
            m.insert("message".into(), Value::String(e.message.clone()));
            if let Some(d) = &e.data {
                m.insert("data".into(), d.clone());
            }
            if let Some(c) = inner.take() {
                m.insert("cause".into(), c);
            }
            inner = Some(Value::Object(m));
        }
        inner.unwrap_or(Value::Null)
    }
}

/// A finished call or stream: success with a value, or an error.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ok(Value),
    Err(ErrorEnvelope),
}

/// A decoded frame, for an exhaustive `match`.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Request {
        v: String,
        id: Id,
        method: String,
        params: Option<Value>,
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
        progress: Value,
    },
    StreamOpen {
        v: String,
        id: Id,
        method: String,
        params: Option<Value>,
    },
    StreamChunk {
        v: String,
        id: Id,
        seq: u64,
        data: Value,
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

impl Frame {
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Request { .. } => "request",
            Frame::Response { .. } => "response",
            Frame::Cancel { .. } => "cancel",
            Frame::Progress { .. } => "progress",
            Frame::StreamOpen { .. } => "stream-open",
            Frame::StreamChunk { .. } => "stream-chunk",
            Frame::StreamEnd { .. } => "stream-end",
            Frame::StreamAck { .. } => "stream-ack",
            Frame::Hello { .. } => "hello",
            Frame::Goodbye { .. } => "goodbye",
        }
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
        major_of(self.version()) == Some(PROTOCOL_MAJOR)
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("v".into(), Value::String(self.version().to_owned()));
        m.insert("kind".into(), Value::String(self.kind().to_owned()));
        if let Some(id) = self.id() {
            m.insert("id".into(), json!(id));
        }
        let outcome = |m: &mut Map<String, Value>, o: &Outcome| match o {
            Outcome::Ok(r) => {
                m.insert("ok".into(), Value::Bool(true));
                m.insert("result".into(), r.clone());
            }
            Outcome::Err(e) => {
                m.insert("ok".into(), Value::Bool(false));
                m.insert("error".into(), e.to_json());
            }
        };
        match self {
            Frame::Request { method, params, .. } | Frame::StreamOpen { method, params, .. } => {
                m.insert("method".into(), Value::String(method.clone()));
                if let Some(p) = params {
                    m.insert("params".into(), p.clone());
                }
            }
            Frame::Response { outcome: o, .. } | Frame::StreamEnd { outcome: o, .. } => {
                outcome(&mut m, o)
            }
            Frame::Cancel { reason, .. } => {
                if let Some(r) = reason {
                    m.insert("reason".into(), Value::String(r.clone()));
                }
            }
            Frame::Progress { progress, .. } => {
                m.insert("progress".into(), progress.clone());
            }
            Frame::StreamChunk { seq, data, .. } => {
                m.insert("seq".into(), json!(seq));
                m.insert("data".into(), data.clone());
            }
            Frame::StreamAck { ack, credit, .. } => {
                m.insert("ack".into(), json!(ack));
                m.insert("credit".into(), json!(credit));
            }
            Frame::Hello {
                features, agent, ..
            } => {
                m.insert("features".into(), json!(features));
                if let Some(a) = agent {
                    m.insert("agent".into(), Value::String(a.clone()));
                }
            }
            Frame::Goodbye { reason, error, .. } => {
                if let Some(r) = reason {
                    m.insert("reason".into(), Value::String(r.clone()));
                }
                if let Some(e) = error {
                    m.insert("error".into(), e.to_json());
                }
            }
        }
        Value::Object(m)
    }

    /// The frame as one line of JSON (no newline inside).
    pub fn to_text(&self) -> String {
        self.to_json().to_string()
    }
}

/// The MAJOR of a `MAJOR.MINOR.PATCH` version, if it has one.
pub fn major_of(v: &str) -> Option<u64> {
    let major = v.split('.').next()?;
    if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    major.parse().ok()
}

/// Why a frame was refused: the field and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    pub field: String,
    pub message: String,
    /// The frame's id, when it could be read (so a request can be answered).
    pub id: Option<Id>,
    pub kind: Option<String>,
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

struct Reader<'a> {
    m: &'a Map<String, Value>,
    id: Option<Id>,
    kind: Option<String>,
}

impl<'a> Reader<'a> {
    fn err(&self, field: &str, message: impl Into<String>) -> FrameError {
        FrameError {
            field: field.to_owned(),
            message: message.into(),
            id: self.id,
            kind: self.kind.clone(),
        }
    }

    fn string(&self, field: &str) -> Result<String, FrameError> {
        match self.m.get(field) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(self.err(field, "must be a string")),
            None => Err(self.err(field, "is required")),
        }
    }

    fn opt_string(&self, field: &str) -> Result<Option<String>, FrameError> {
        match self.m.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(field, "must be a string")),
        }
    }

    fn uint(&self, field: &str, max: u64) -> Result<u64, FrameError> {
        match self.m.get(field) {
            None => Err(self.err(field, "is required")),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(x) if x <= max => Ok(x),
                _ => Err(self.err(field, format!("must be an integer from 0 to {max}"))),
            },
            Some(_) => Err(self.err(field, "must be a number")),
        }
    }

    fn method(&self) -> Result<String, FrameError> {
        let m = self.string("method")?;
        if m.is_empty() || m.len() > MAX_METHOD_LEN {
            return Err(self.err("method", format!("must be 1 to {MAX_METHOD_LEN} bytes")));
        }
        Ok(m)
    }

    fn outcome(&self) -> Result<Outcome, FrameError> {
        match self.m.get("ok") {
            Some(Value::Bool(true)) => Ok(Outcome::Ok(
                self.m.get("result").cloned().unwrap_or(Value::Null),
            )),
            Some(Value::Bool(false)) => match self.m.get("error") {
                None => Err(self.err("error", "is required when ok is false")),
                Some(e) => Ok(Outcome::Err(
                    envelope(e, "error").map_err(|(f, msg)| self.err(&f, msg))?,
                )),
            },
            Some(_) => Err(self.err("ok", "must be true or false")),
            None => Err(self.err("ok", "is required")),
        }
    }
}

/// Reads an error envelope of any depth, iteratively.
fn envelope(v: &Value, path: &str) -> Result<ErrorEnvelope, (String, String)> {
    let mut links: Vec<(String, String, Option<Value>)> = Vec::new();
    let mut cur = Some(v);
    let mut p = path.to_owned();
    while let Some(e) = cur {
        let Value::Object(m) = e else {
            return Err((p, "must be an error object {code, message}".into()));
        };
        let code = match m.get("code") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => return Err((format!("{p}.code"), "must be a non-empty string".into())),
            None => return Err((format!("{p}.code"), "is required".into())),
        };
        let message = match m.get("message") {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err((format!("{p}.message"), "must be a string".into())),
            None => return Err((format!("{p}.message"), "is required".into())),
        };
        links.push((code, message, m.get("data").cloned()));
        cur = m.get("cause").filter(|c| !c.is_null());
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
    out.ok_or_else(|| (path.to_owned(), "is required".into()))
}

/// Parses and validates one frame of text.
pub fn parse_frame(text: &str) -> Result<Frame, FrameError> {
    let bare = |field: &str, message: String| FrameError {
        field: field.to_owned(),
        message,
        id: None,
        kind: None,
    };
    let value: Value = from_str_bounded(text, JsonLimits::new(MAX_FRAME_BYTES, MAX_FRAME_DEPTH))
        .map_err(|e| match e {
            JsonError::TooLarge { .. } | JsonError::TooDeep { .. } => bare("", e.to_string()),
            JsonError::Invalid { message } => bare("", format!("not JSON: {message}")),
        })?;
    parse_frame_value(&value)
}

/// Validates a frame already parsed as JSON.
pub fn parse_frame_value(value: &Value) -> Result<Frame, FrameError> {
    let Value::Object(m) = value else {
        return Err(FrameError {
            field: String::new(),
            message: "a frame must be a JSON object".into(),
            id: None,
            kind: None,
        });
    };
    let mut r = Reader {
        m,
        id: None,
        kind: None,
    };
    let kind = r.string("kind")?;
    if !KINDS.contains(&kind.as_str()) {
        return Err(r.err("kind", format!("must be one of {}", KINDS.join(", "))));
    }
    r.kind = Some(kind.clone());
    if let Some(id) = m.get("id").and_then(Value::as_u64).filter(|i| *i <= MAX_ID) {
        r.id = Some(id);
    }
    let v = r.string("v")?;
    let frame = match kind.as_str() {
        "request" => Frame::Request {
            id: r.uint("id", MAX_ID)?,
            method: r.method()?,
            params: m.get("params").cloned(),
            v,
        },
        "response" => Frame::Response {
            id: r.uint("id", MAX_ID)?,
            outcome: r.outcome()?,
            v,
        },
        "cancel" => Frame::Cancel {
            id: r.uint("id", MAX_ID)?,
            reason: r.opt_string("reason")?,
            v,
        },
        "progress" => Frame::Progress {
            id: r.uint("id", MAX_ID)?,
            progress: m
                .get("progress")
                .cloned()
                .ok_or_else(|| r.err("progress", "is required"))?,
            v,
        },
        "stream-open" => Frame::StreamOpen {
            id: r.uint("id", MAX_ID)?,
            method: r.method()?,
            params: m.get("params").cloned(),
            v,
        },
        "stream-chunk" => {
            let seq = r.uint("seq", MAX_ID)?;
            if seq == 0 {
                return Err(r.err("seq", "counts from 1"));
            }
            Frame::StreamChunk {
                id: r.uint("id", MAX_ID)?,
                seq,
                data: m
                    .get("data")
                    .cloned()
                    .ok_or_else(|| r.err("data", "is required"))?,
                v,
            }
        }
        "stream-end" => Frame::StreamEnd {
            id: r.uint("id", MAX_ID)?,
            outcome: r.outcome()?,
            v,
        },
        "stream-ack" => Frame::StreamAck {
            id: r.uint("id", MAX_ID)?,
            ack: r.uint("ack", MAX_ID)?,
            credit: r.uint("credit", MAX_ID)?,
            v,
        },
        "hello" => {
            let features = match m.get("features") {
                None => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .enumerate()
                    .map(|(i, f)| {
                        f.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| r.err(&format!("features[{i}]"), "must be a string"))
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(r.err("features", "must be an array of strings")),
            };
            Frame::Hello {
                features,
                agent: r.opt_string("agent")?,
                v,
            }
        }
        _ => Frame::Goodbye {
            reason: r.opt_string("reason")?,
            error: match m.get("error") {
                None | Some(Value::Null) => None,
                Some(e) => Some(envelope(e, "error").map_err(|(f, msg)| r.err(&f, msg))?),
            },
            v,
        },
    };
    Ok(frame)
}
