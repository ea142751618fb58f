//! Cache keys: `content_hash` of compiled code and `blueprint_key` of a
//! data contract. Both are the first 16 hex characters of a SHA-256.
//!
//! The blueprint key hashes the contract's canonical form: each tool's
//! `agentCapabilities.tools[*].serverInfo.version` dropped, `description`
//! and `usage` keys dropped wherever their value is a string (prose, not
//! identity), every string and key NFC-normalized, array order kept, then
//! RFC 8785 (JCS) serialization: keys sorted by UTF-16 code units, numbers
//! in ECMAScript form.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

/// Hex characters kept of the SHA-256 digest.
pub const HASH_HEX_LEN: usize = 16;

/// Keys dropped when their value is a string.
const PROSE_KEYS: [&str; 2] = ["description", "usage"];

fn short_sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(HASH_HEX_LEN);
    for b in digest.iter().take(HASH_HEX_LEN / 2) {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// SHA-256 of the UTF-8 bytes of `code`, hex, first 16 characters. The
/// text is hashed as given (no normalization).
pub fn content_hash(code: &str) -> String {
    short_sha256(code.as_bytes())
}

/// The canonical value: NFC strings and keys, prose keys stripped when
/// `strip_prose`. Keys that collide after NFC keep the value of the one
/// that comes last in the object, as the protocol's canonicalizer does.
pub fn canonicalize_value(value: &Value, strip_prose: bool) -> Value {
    match value {
        Value::String(s) => Value::String(s.nfc().collect()),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| canonicalize_value(v, strip_prose))
                .collect(),
        ),
        Value::Object(m) => {
            let mut keys: Vec<(String, &Value)> = m
                .iter()
                .filter(|(k, v)| {
                    !(strip_prose && PROSE_KEYS.contains(&k.as_str()) && v.is_string())
                })
                .map(|(k, v)| (k.nfc().collect::<String>(), v))
                .collect();
            keys.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            let mut out = Map::with_capacity(keys.len());
            for (k, v) in keys {
                out.insert(k, canonicalize_value(v, strip_prose));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// Drops `serverInfo.version` of every `agentCapabilities.tools` entry:
/// the server's version is metadata, its name is identity.
fn strip_tool_server_info(contract: &Value) -> Value {
    let mut out = contract.clone();
    if let Some(Value::Object(tools)) = out.pointer_mut("/agentCapabilities/tools") {
        for entry in tools.values_mut() {
            if let Some(Value::Object(info)) = entry.get_mut("serverInfo") {
                info.remove("version");
            }
        }
    }
    out
}

/// The RFC 8785 text the blueprint key hashes (`None` hashes `{}`).
pub fn canonicalize_contract(contract: Option<&Value>) -> String {
    let empty = Value::Object(Map::new());
    let stripped = strip_tool_server_info(contract.unwrap_or(&empty));
    let canonical = canonicalize_value(&stripped, true);
    // A `Value` always serializes; JCS only refuses non-finite numbers,
    // which `Value` cannot hold.
    serde_json_canonicalizer::to_string(&canonical).unwrap_or_else(|_| "{}".to_owned())
}

/// The blueprint cache key of a data contract.
pub fn blueprint_key(contract: Option<&Value>) -> String {
    short_sha256(canonicalize_contract(contract).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_sort_by_utf16_not_utf8() {
        // U+1F600 is a surrogate pair (0xD83D...) and sorts before U+FFFD in
        // UTF-16, after it in UTF-8.
        let c = canonicalize_contract(Some(&json!({"\u{FFFD}": 2, "\u{1F600}": 1})));
        assert_eq!(c, "{\"\u{1F600}\":1,\"\u{FFFD}\":2}");
    }

    #[test]
    fn prose_is_stripped_only_when_a_string() {
        let c = canonicalize_contract(Some(
            &json!({"description": "x", "usage": {"a": 1}, "b": {"description": 3}}),
        ));
        assert_eq!(c, r#"{"b":{"description":3},"usage":{"a":1}}"#);
    }

    #[test]
    fn server_version_is_not_identity() {
        let a = json!({"agentCapabilities": {"tools": {"t": {"serverInfo": {"name": "n", "version": "1"}}}}});
        let b = json!({"agentCapabilities": {"tools": {"t": {"serverInfo": {"name": "n", "version": "2"}}}}});
        let c = json!({"agentCapabilities": {"tools": {"t": {"serverInfo": {"name": "m", "version": "2"}}}}});
        assert_eq!(blueprint_key(Some(&a)), blueprint_key(Some(&b)));
        assert_ne!(blueprint_key(Some(&a)), blueprint_key(Some(&c)));
    }

    #[test]
    fn keys_colliding_after_nfc_keep_the_last() {
        let c = canonicalize_contract(Some(&json!({"cafe\u{301}": 1, "caf\u{e9}": 2})));
        assert_eq!(c, "{\"caf\u{e9}\":2}");
    }

    #[test]
    fn content_hash_is_16_hex() {
        assert_eq!(content_hash(""), "e3b0c44298fc1c14");
        assert_ne!(content_hash("cafe\u{301}"), content_hash("caf\u{e9}"));
    }
}
