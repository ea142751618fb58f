//! Decoding of untrusted inbound messages.
//!
//! Order: the byte cap (`MAX_MESSAGE_BYTES`) before anything is parsed,
//! then the nesting bound (a linear scan), then the parse, then the shape:
//! an object with a known `op` and exactly that op's fields, each of the
//! right type and within its limit. Anything else is `bad_message` with a
//! message naming the field.

use crate::protocol::{
    ClientMsg, CommentaryCategory, Controller, DetailRequest, Disclosure, ObserverRequest,
    ProtocolError, Roles, ServerErrorCode, WatchMsg, MAX_MESSAGE_BYTES, MAX_MESSAGE_DEPTH,
};
use hostwire_core::delta::{Json, JsonMap};
use hostwire_core::json::{from_str_bounded, JsonError, JsonLimits};

/// Longest role, team, perspective, method, scope or proposal id, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Longest `tell` text, in bytes.
pub const MAX_TELL_TEXT_BYTES: usize = 4096;
/// Longest commentary `text` an agent discloses, in bytes (UTF-8): a few
/// sentences, so that a frame with every seat's commentary stays small.
pub const MAX_COMMENTARY_TEXT_BYTES: usize = 500;
/// Most entries in `scopes`, `roles`, `teams` or `detail`.
pub const MAX_LIST_ITEMS: usize = 64;
/// Largest `everyTicks` (0 stops the stream).
pub const MAX_EVERY_TICKS: u64 = 100_000;
/// Largest `seq` and `after`: the integers a JavaScript number holds exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// One decoded inbound message.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    Client(ClientMsg),
    Watch(WatchMsg),
    Observer(ObserverRequest),
}

/// Why a message was refused, and its `seq` when one could be read (so the
/// error can be the `result` of that request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub seq: Option<u64>,
    pub error: ProtocolError,
}

/// The limits the decoder applies before parsing.
pub const MESSAGE_LIMITS: JsonLimits = JsonLimits::new(MAX_MESSAGE_BYTES, MAX_MESSAGE_DEPTH);

fn bad(seq: Option<u64>, message: impl Into<String>) -> DecodeError {
    DecodeError {
        seq,
        error: ProtocolError::new(ServerErrorCode::BadMessage, message),
    }
}

/// Decodes one inbound text message.
pub fn decode_inbound(text: &str) -> Result<Inbound, DecodeError> {
    // `from_str_bounded` checks the size before it scans or parses.
    let value: Json = from_str_bounded(text, MESSAGE_LIMITS).map_err(|e| match e {
        JsonError::TooLarge { size, limit } => bad(
            None,
            format!("message is {size} bytes; MAX_MESSAGE_BYTES is {limit}"),
        ),
        JsonError::TooDeep { limit } => {
            bad(None, format!("message nests deeper than {limit} levels"))
        }
        JsonError::Invalid { message } => bad(None, format!("message is not JSON: {message}")),
    })?;
    let Json::Object(map) = &value else {
        return Err(bad(None, "message: expected an object"));
    };
    let seq = map.get("seq").and_then(safe_integer);
    let op = match map.get("op") {
        Some(Json::String(op)) => op.clone(),
        Some(_) => return Err(bad(seq, "op: expected a string")),
        None => return Err(bad(seq, "op: missing")),
    };
    let f = Fields { op: &op, map, seq };
    f.decode().map_err(|message| bad(seq, message))
}

/// Decodes the arguments of a disclosure (the MCP tool `disclose`):
/// exactly `{"category": "summary"|"chat", "text": …}`, the text not blank
/// and at most [`MAX_COMMENTARY_TEXT_BYTES`]. Anything else is
/// `bad_message` naming the field.
pub fn decode_disclosure(args: &Json) -> Result<Disclosure, ProtocolError> {
    let bad = |m: String| ProtocolError::new(ServerErrorCode::BadMessage, m);
    let Json::Object(map) = args else {
        return Err(bad("arguments: expected an object".into()));
    };
    if let Some(k) = map.keys().find(|k| !["category", "text"].contains(&&***k)) {
        let mut shown: String = k.chars().take(MAX_NAME_BYTES).collect();
        if shown.len() < k.len() {
            shown.push('…');
        }
        return Err(bad(format!("{shown}: unknown field of disclose")));
    }
    let category = match map.get("category") {
        None => return Err(bad("category: missing".into())),
        Some(Json::String(s)) => CommentaryCategory::parse(s)
            .ok_or_else(|| bad("category: expected \"summary\" or \"chat\"".into()))?,
        Some(_) => return Err(bad("category: expected \"summary\" or \"chat\"".into())),
    };
    let text = match map.get("text") {
        None => return Err(bad("text: missing".into())),
        Some(Json::String(s)) => s.to_string(),
        Some(_) => return Err(bad("text: expected a string".into())),
    };
    check_commentary_text(&text).map_err(bad)?;
    Ok(Disclosure { category, text })
}

/// A commentary text is not blank and at most [`MAX_COMMENTARY_TEXT_BYTES`].
pub fn check_commentary_text(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("text: empty".into());
    }
    if text.len() > MAX_COMMENTARY_TEXT_BYTES {
        return Err(format!(
            "text: longer than MAX_COMMENTARY_TEXT_BYTES ({MAX_COMMENTARY_TEXT_BYTES} bytes)"
        ));
    }
    Ok(())
}

fn safe_integer(v: &Json) -> Option<u64> {
    match v {
        Json::Number(n) => n.as_u64().filter(|&n| n <= MAX_SAFE_INTEGER),
        _ => None,
    }
}

struct Fields<'a> {
    op: &'a str,
    map: &'a JsonMap,
    seq: Option<u64>,
}

type R<T> = Result<T, String>;

impl Fields<'_> {
    fn decode(&self) -> R<Inbound> {
        let msg = match self.op {
            "call" => {
                self.only(&["op", "seq", "role", "method", "args"])?;
                ClientMsg::Call {
                    seq: self.seq()?,
                    role: self.name("role")?,
                    method: self.name("method")?,
                    args: self
                        .map
                        .get("args")
                        .cloned()
                        .unwrap_or_else(|| Json::object(JsonMap::new())),
                }
            }
            "stream" => {
                self.only(&["op", "seq", "role", "everyTicks", "detail"])?;
                let every = self.integer("everyTicks", MAX_EVERY_TICKS)?;
                ClientMsg::Stream {
                    seq: self.seq()?,
                    role: self.name("role")?,
                    every_ticks: u32::try_from(every).map_err(|_| "everyTicks: too large")?,
                    detail: match self.map.get("detail") {
                        None => None,
                        Some(Json::String(s)) if &**s == "all" => Some(DetailRequest::All),
                        Some(Json::Array(_)) => {
                            Some(DetailRequest::Sections(self.names("detail")?))
                        }
                        Some(_) => {
                            return Err(
                                "detail: expected \"all\" or an array of section names".into()
                            )
                        }
                    },
                }
            }
            "mandate" => {
                self.only(&["op", "seq", "role", "mandate"])?;
                ClientMsg::Mandate {
                    seq: self.seq()?,
                    role: self.name("role")?,
                    mandate: self.map.get("mandate").cloned().ok_or("mandate: missing")?,
                }
            }
            "scopes" => {
                self.only(&["op", "seq", "role", "scopes"])?;
                ClientMsg::Scopes {
                    seq: self.seq()?,
                    role: self.name("role")?,
                    scopes: self.names("scopes")?,
                }
            }
            "resolveApproval" => {
                self.only(&["op", "seq", "role", "id", "approve"])?;
                ClientMsg::ResolveApproval {
                    seq: self.seq()?,
                    role: self.name("role")?,
                    id: self.name("id")?,
                    approve: match self.map.get("approve") {
                        Some(Json::Bool(b)) => *b,
                        Some(_) => return Err("approve: expected a boolean".into()),
                        None => return Err("approve: missing".into()),
                    },
                }
            }
            "controller" => {
                self.only(&["op", "seq", "role", "controller"])?;
                let controller = self.controller()?;
                ClientMsg::Controller {
                    seq: self.seq()?,
                    role: self.name("role")?,
                    controller,
                }
            }
            "mint" => {
                self.only(&["op", "seq", "role"])?;
                ClientMsg::Mint {
                    seq: self.seq()?,
                    role: self.name("role")?,
                }
            }
            "tell" => {
                self.only(&["op", "seq", "roles", "text", "ping"])?;
                let roles = match self.map.get("roles") {
                    Some(Json::String(s)) if &**s == "all" => Roles::All,
                    Some(Json::Array(_)) => Roles::Some(self.names("roles")?),
                    Some(_) => return Err("roles: expected \"all\" or an array of roles".into()),
                    None => return Err("roles: missing".into()),
                };
                let text = self.string("text", MAX_TELL_TEXT_BYTES)?;
                ClientMsg::Tell {
                    seq: self.seq()?,
                    roles,
                    text,
                    ping: self.map.get("ping").cloned(),
                }
            }
            "watch" => {
                self.only(&["op", "teams"])?;
                return Ok(Inbound::Watch(WatchMsg {
                    teams: self.names("teams")?,
                }));
            }
            "observer" => {
                self.only(&["op", "perspective", "after"])?;
                return Ok(Inbound::Observer(ObserverRequest {
                    perspective: self.name("perspective")?,
                    after: match self.map.get("after") {
                        None => None,
                        Some(_) => Some(self.integer("after", MAX_SAFE_INTEGER)?),
                    },
                }));
            }
            other => {
                let mut shown: String = other.chars().take(MAX_NAME_BYTES).collect();
                if shown.len() < other.len() {
                    shown.push('…');
                }
                return Err(format!("op: unknown op {shown:?}"));
            }
        };
        Ok(Inbound::Client(msg))
    }

    /// `{"kind":"human"}` or `{"kind":"agent","supervised"?:bool}`, nothing else.
    fn controller(&self) -> R<Controller> {
        let Some(Json::Object(c)) = self.map.get("controller") else {
            return Err("controller: expected an object".into());
        };
        let kind = c.get("kind").and_then(Json::as_str);
        let allowed: &[&str] = match kind {
            Some("human") => &["kind"],
            Some("agent") => &["kind", "supervised"],
            _ => return Err("controller.kind: expected \"human\" or \"agent\"".into()),
        };
        if let Some(k) = c.keys().find(|k| !allowed.contains(&&***k)) {
            let shown: String = k.chars().take(MAX_NAME_BYTES).collect();
            return Err(format!("controller.{shown}: unknown field"));
        }
        Ok(match (kind, c.get("supervised")) {
            (Some("human"), _) => Controller::Human,
            (_, None) => Controller::Agent { supervised: false },
            (_, Some(Json::Bool(b))) => Controller::Agent { supervised: *b },
            (_, Some(_)) => return Err("controller.supervised: expected a boolean".into()),
        })
    }

    /// Strict shape: every member must be one the op defines.
    fn only(&self, allowed: &[&str]) -> R<()> {
        for k in self.map.keys() {
            if !allowed.contains(&&**k) {
                let mut shown: String = k.chars().take(MAX_NAME_BYTES).collect();
                if shown.len() < k.len() {
                    shown.push('…');
                }
                return Err(format!("{shown}: unknown field of op {}", self.op));
            }
        }
        Ok(())
    }

    fn seq(&self) -> R<u64> {
        self.seq.ok_or_else(|| match self.map.get("seq") {
            None => "seq: missing".to_string(),
            Some(_) => format!("seq: expected an integer from 0 to {MAX_SAFE_INTEGER}"),
        })
    }

    fn integer(&self, field: &str, max: u64) -> R<u64> {
        match self.map.get(field) {
            None => Err(format!("{field}: missing")),
            Some(v) => safe_integer(v)
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{field}: expected an integer from 0 to {max}")),
        }
    }

    fn string(&self, field: &str, max_bytes: usize) -> R<String> {
        match self.map.get(field) {
            None => Err(format!("{field}: missing")),
            Some(Json::String(s)) if s.len() <= max_bytes => Ok(s.to_string()),
            Some(Json::String(_)) => Err(format!("{field}: longer than {max_bytes} bytes")),
            Some(_) => Err(format!("{field}: expected a string")),
        }
    }

    /// A non-empty name of at most `MAX_NAME_BYTES` bytes.
    fn name(&self, field: &str) -> R<String> {
        let s = self.string(field, MAX_NAME_BYTES)?;
        if s.is_empty() {
            return Err(format!("{field}: empty"));
        }
        Ok(s)
    }

    fn names(&self, field: &str) -> R<Vec<String>> {
        let items = match self.map.get(field) {
            None => return Err(format!("{field}: missing")),
            Some(Json::Array(a)) => a,
            Some(_) => return Err(format!("{field}: expected an array of strings")),
        };
        if items.len() > MAX_LIST_ITEMS {
            return Err(format!("{field}: more than {MAX_LIST_ITEMS} entries"));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Json::String(s) if !s.is_empty() && s.len() <= MAX_NAME_BYTES => Ok(s.to_string()),
                Json::String(_) => Err(format!(
                    "{field}[{i}]: expected 1 to {MAX_NAME_BYTES} bytes"
                )),
                _ => Err(format!("{field}[{i}]: expected a string")),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> DecodeError {
        decode_inbound(text).unwrap_err()
    }

    #[test]
    fn decodes_every_op() {
        let cases = [
            r#"{"op":"call","seq":1,"role":"scout","method":"move","args":{"dir":"n"}}"#,
            r#"{"op":"call","seq":1,"role":"scout","method":"hold"}"#,
            r#"{"op":"stream","seq":2,"role":"scout","everyTicks":5,"detail":"all"}"#,
            r#"{"op":"stream","seq":2,"role":"scout","everyTicks":0,"detail":["map"]}"#,
            r#"{"op":"mandate","seq":3,"role":"scout","mandate":{"style":"careful"}}"#,
            r#"{"op":"scopes","seq":4,"role":"scout","scopes":["move","*"]}"#,
            r#"{"op":"resolveApproval","seq":5,"role":"scout","id":"p1","approve":true}"#,
            r#"{"op":"controller","seq":6,"role":"scout","controller":{"kind":"agent","supervised":true}}"#,
            r#"{"op":"mint","seq":7,"role":"scout"}"#,
            r#"{"op":"tell","seq":8,"roles":"all","text":"hold the ridge"}"#,
            r#"{"op":"tell","seq":8,"roles":["scout"],"text":"go","ping":1}"#,
            r#"{"op":"watch","teams":["red","blue"]}"#,
            r#"{"op":"observer","perspective":"red","after":12}"#,
            r#"{"op":"observer","perspective":"omniscient"}"#,
        ];
        for c in cases {
            decode_inbound(c).unwrap_or_else(|e| panic!("{c}: {e:?}"));
        }
        match decode_inbound(cases[1]).unwrap() {
            Inbound::Client(ClientMsg::Call { args, .. }) => {
                assert_eq!(args.to_json_string(), "{}")
            }
            other => panic!("{other:?}"),
        }
        match decode_inbound(cases[7]).unwrap() {
            Inbound::Client(ClientMsg::Controller { controller, .. }) => {
                assert_eq!(controller, Controller::Agent { supervised: true })
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_ops_and_fields_are_bad_message_naming_them() {
        let e = err(r#"{"op":"launch","seq":1}"#);
        assert_eq!(e.error.code, ServerErrorCode::BadMessage);
        assert!(e.error.message.contains("launch"), "{e:?}");
        assert_eq!(e.seq, Some(1));
        let e = err(r#"{"op":"mint","seq":1,"role":"a","extra":true}"#);
        assert!(e.error.message.starts_with("extra:"), "{e:?}");
        let e = err(r#"{"op":"watch","teams":["a"],"seq":3}"#);
        assert!(e.error.message.starts_with("seq:"), "{e:?}");
    }

    #[test]
    fn wrong_types_and_limits_name_the_field() {
        let cases = [
            (r#"{"op":"call","seq":1,"role":"a"}"#, "method:"),
            (r#"{"op":"call","seq":-1,"role":"a","method":"m"}"#, "seq:"),
            (r#"{"op":"call","seq":1.5,"role":"a","method":"m"}"#, "seq:"),
            (
                r#"{"op":"call","seq":9007199254740992,"role":"a","method":"m"}"#,
                "seq:",
            ),
            (r#"{"op":"call","role":"a","method":"m"}"#, "seq:"),
            (r#"{"op":"call","seq":1,"role":"","method":"m"}"#, "role:"),
            (r#"{"op":"call","seq":1,"role":7,"method":"m"}"#, "role:"),
            (
                r#"{"op":"stream","seq":1,"role":"a","everyTicks":100001}"#,
                "everyTicks:",
            ),
            (
                r#"{"op":"stream","seq":1,"role":"a","everyTicks":1,"detail":"some"}"#,
                "detail:",
            ),
            (
                r#"{"op":"stream","seq":1,"role":"a","everyTicks":1,"detail":[1]}"#,
                "detail[0]:",
            ),
            (r#"{"op":"mandate","seq":1,"role":"a"}"#, "mandate:"),
            (
                r#"{"op":"resolveApproval","seq":1,"role":"a","id":"x","approve":"yes"}"#,
                "approve:",
            ),
            (
                r#"{"op":"controller","seq":1,"role":"a","controller":{"kind":"robot"}}"#,
                "controller.kind:",
            ),
            (
                r#"{"op":"controller","seq":1,"role":"a","controller":{"kind":"human","x":1}}"#,
                "controller.x:",
            ),
            (
                r#"{"op":"tell","seq":1,"roles":"some","text":"x"}"#,
                "roles:",
            ),
            (r#"{"op":"tell","seq":1,"roles":"all"}"#, "text:"),
            (
                r#"{"op":"observer","perspective":"a","after":"3"}"#,
                "after:",
            ),
            (r#"{"op":1}"#, "op:"),
            (r#"{"seq":1}"#, "op:"),
        ];
        for (text, field) in cases {
            let e = err(text);
            assert_eq!(e.error.code, ServerErrorCode::BadMessage);
            assert!(
                e.error.message.starts_with(field),
                "{text}: {:?}",
                e.error.message
            );
        }
        let long = format!(
            r#"{{"op":"tell","seq":1,"roles":"all","text":"{}"}}"#,
            "x".repeat(4097)
        );
        assert!(err(&long).error.message.starts_with("text:"));
        let many = format!(
            r#"{{"op":"watch","teams":[{}]}}"#,
            vec![r#""t""#; 65].join(",")
        );
        assert!(err(&many).error.message.starts_with("teams:"));
    }

    #[test]
    fn disclosures_are_strictly_shaped_and_bounded() {
        let j = |v: serde_json::Value| Json::from(v);
        let d = decode_disclosure(&j(serde_json::json!({"category":"chat","text":"gg"}))).unwrap();
        assert_eq!(d.category, CommentaryCategory::Chat);
        assert_eq!(d.text, "gg");
        let exact = "é".repeat(MAX_COMMENTARY_TEXT_BYTES / 2);
        decode_disclosure(&j(serde_json::json!({"category":"summary","text":exact}))).unwrap();
        let cases = [
            (serde_json::json!([]), "arguments:"),
            (serde_json::json!({"text":"x"}), "category:"),
            (
                serde_json::json!({"category":"log","text":"x"}),
                "category:",
            ),
            (serde_json::json!({"category":1,"text":"x"}), "category:"),
            (serde_json::json!({"category":"chat"}), "text:"),
            (serde_json::json!({"category":"chat","text":7}), "text:"),
            (serde_json::json!({"category":"chat","text":" \n"}), "text:"),
            (
                serde_json::json!({"category":"chat","text":"x".repeat(MAX_COMMENTARY_TEXT_BYTES + 1)}),
                "text:",
            ),
            (
                serde_json::json!({"category":"chat","text":"x","team":"blue"}),
                "team:",
            ),
        ];
        for (args, field) in cases {
            let e = decode_disclosure(&j(args.clone())).unwrap_err();
            assert_eq!(e.code, ServerErrorCode::BadMessage);
            assert!(e.message.starts_with(field), "{args}: {}", e.message);
        }
    }

    #[test]
    fn oversized_deep_and_malformed_input_is_refused_before_parsing() {
        let big = format!(
            r#"{{"op":"mandate","seq":1,"role":"a","mandate":"{}"}}"#,
            "x".repeat(MAX_MESSAGE_BYTES)
        );
        let e = err(&big);
        assert!(e.error.message.contains("MAX_MESSAGE_BYTES"), "{e:?}");
        assert_eq!(e.seq, None);
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(err(&deep).error.message.contains("deeper"));
        assert!(err("{").error.message.contains("not JSON"));
        assert!(err("[]").error.message.starts_with("message:"));
        // A legitimate mandate just under the cap is accepted.
        let fits = format!(
            r#"{{"op":"mandate","seq":1,"role":"a","mandate":"{}"}}"#,
            "x".repeat(MAX_MESSAGE_BYTES - 60)
        );
        assert!(fits.len() <= MAX_MESSAGE_BYTES);
        decode_inbound(&fits).unwrap();
    }
}
