//! The JSON value: its constructors, readers, equality and serde.

use crate::{json_map, JsonArray, JsonMap};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Number;
use smol_str::SmolStr;
use std::fmt;
use std::sync::Arc;

/// An immutable JSON value whose strings, arrays and objects are shared.
///
/// Strings and member names of up to 23 bytes are held inline (no
/// allocation, no reference count); longer ones behind an `Arc`.
///
/// Equality is JSON equality (object member order does not matter; numbers
/// compare as `serde_json::Number` does). Values nest only as deep as the
/// text they were decoded from: decode untrusted text with a bound on its
/// depth first (`hostwire_core::json::from_str_bounded`).
#[derive(Clone, Default)]
pub enum Json {
    #[default]
    Null,
    Bool(bool),
    Number(Number),
    String(SmolStr),
    Array(Arc<JsonArray>),
    Object(Arc<JsonMap>),
}

impl Json {
    /// True when both are the same allocation (or equal scalars): the test
    /// of structural sharing.
    #[inline]
    pub fn ptr_eq(&self, other: &Json) -> bool {
        match (self, other) {
            (Json::Null, Json::Null) => true,
            (Json::Bool(a), Json::Bool(b)) => a == b,
            (Json::Number(a), Json::Number(b)) => a == b,
            (Json::String(a), Json::String(b)) => str_shared(a, b),
            (Json::Array(a), Json::Array(b)) => Arc::ptr_eq(a, b),
            (Json::Object(a), Json::Object(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    pub fn string(s: &str) -> Json {
        Json::String(SmolStr::new(s))
    }

    pub fn array(items: Vec<Json>) -> Json {
        Json::Array(Arc::new(JsonArray::from_vec(items)))
    }

    pub fn object(map: JsonMap) -> Json {
        Json::Object(Arc::new(map))
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&JsonMap> {
        match self {
            Json::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.as_object().and_then(|m| m.get(key))
    }

    /// The compact JSON text.
    pub fn to_json_string(&self) -> String {
        // Serializing a tree of strings, numbers and maps with string keys
        // cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The byte size of the compact JSON text.
    pub fn json_len(&self) -> usize {
        let mut c = Count(0);
        let _ = serde_json::to_writer(&mut c, self);
        c.0
    }

    /// Converts to a `serde_json::Value` (a deep copy).
    pub fn to_value(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => Value::Number(n.clone()),
            Json::String(s) => Value::String(s.to_string()),
            Json::Array(a) => Value::Array(a.iter().map(Json::to_value).collect()),
            Json::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (k.to_string(), v.to_value()))
                    .collect(),
            ),
        }
    }
}

/// Counts the bytes written.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl From<&serde_json::Value> for Json {
    fn from(v: &serde_json::Value) -> Self {
        use serde_json::Value;
        match v {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => Json::Number(n.clone()),
            Value::String(s) => Json::string(s),
            Value::Array(a) => Json::array(a.iter().map(Json::from).collect()),
            Value::Object(m) => Json::object(
                m.iter()
                    .map(|(k, v)| (SmolStr::new(k), Json::from(v)))
                    .collect(),
            ),
        }
    }
}

impl From<serde_json::Value> for Json {
    fn from(v: serde_json::Value) -> Self {
        Json::from(&v)
    }
}

impl PartialEq for Json {
    fn eq(&self, other: &Json) -> bool {
        match (self, other) {
            (Json::Null, Json::Null) => true,
            (Json::Bool(a), Json::Bool(b)) => a == b,
            (Json::Number(a), Json::Number(b)) => a == b,
            (Json::String(a), Json::String(b)) => a == b,
            (Json::Array(a), Json::Array(b)) => Arc::ptr_eq(a, b) || a[..] == b[..],
            (Json::Object(a), Json::Object(b)) => Arc::ptr_eq(a, b) || maps_equal(a, b),
            _ => false,
        }
    }
}

fn maps_equal(a: &JsonMap, b: &JsonMap) -> bool {
    if a.len() != b.len() {
        return false;
    }
    // Same member order is the common case: walk both in step and look a
    // member up by name only where the orders differ.
    a.iter().enumerate().all(|(i, (k, va))| {
        let vb = match b.get_index(i) {
            Some((kb, vb)) if k == kb => Some(vb),
            _ => b.get(k),
        };
        vb.is_some_and(|vb| va == vb)
    })
}

/// A member name against a plain `&str`.
#[inline(always)]
pub(crate) fn str_eq_str(a: &SmolStr, b: &str) -> bool {
    a.len() == b.len() && a.as_bytes() == b.as_bytes()
}

/// The same heap allocation, or equal inline strings (which have none).
fn str_shared(a: &SmolStr, b: &SmolStr) -> bool {
    if a.is_heap_allocated() || b.is_heap_allocated() {
        std::ptr::eq(a.as_str(), b.as_str())
    } else {
        a == b
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json_string())
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json_string())
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Number(n) => n.serialize(s),
            Json::String(v) => s.serialize_str(v),
            Json::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a.iter() {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Json::Object(m) => {
                let mut map = s.serialize_map(Some(m.len()))?;
                for (k, v) in m.iter() {
                    map.serialize_entry(k.as_str(), v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        Number::from_f64(v)
            .map(Json::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::string(v))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(SmolStr::from(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        // The size hint comes from the input: never trust it for capacity.
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(Json::array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut members = json_map();
        while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let v: Json = map.next_value()?;
            // A repeated name keeps its first position and its last value,
            // as serde_json's own map does.
            members.insert(SmolStr::new(&*k), v);
        }
        Ok(Json::object(members))
    }
}
