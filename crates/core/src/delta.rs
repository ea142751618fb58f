//! Structural JSON delta over immutable, shared JSON trees.
//!
//! [`Json`] is a JSON value whose strings, arrays and objects sit behind
//! `Arc`: cloning one is a reference-count bump, never a copy. [`apply`]
//! builds the new value by copying only the containers on the paths the
//! delta touches; every other subtree of the result *is* the base's subtree
//! (same allocation). Views built this way are immutable by construction.
//!
//! # Wire format of a delta
//!
//! A delta is JSON, read against the value it applies to:
//!
//! | delta | meaning |
//! | --- | --- |
//! | `[v]` | replace the value with `v` (any JSON, including arrays and objects) |
//! | `[]` | remove this member (only as the delta of an object member) |
//! | `{}` | no change (for any value) |
//! | `{"k": d, …}` on an object | apply `d` to member `k`; an absent member may only be added with `[v]` |
//! | `{"3": d, "-": n, "+": [v, …]}` on an array | apply `d` to element 3 (canonical decimal index), then truncate to length `n`, then append `v, …` |
//!
//! On an array, the index keys address the array as it was before the
//! delta, and must be below the truncated length when `"-"` is present.
//! Any other shape is an error naming the path where it was found. Object
//! member names never need escaping: a member named `"+"` on an object is
//! just a member.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Number;
use smallvec::SmallVec;
use smol_str::SmolStr;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// The new values of a container's changed members or elements, by
/// position: inline for the few a game state's tick changes.
type Patched = SmallVec<[(usize, Json); 4]>;

/// Objects with more members than this also keep a hash index; smaller
/// ones are searched in place (faster, and one allocation fewer to copy).
pub const JSON_MAP_INDEX_FROM: usize = 16;

type Index = std::collections::HashMap<SmolStr, usize, foldhash::fast::RandomState>;

/// The members of a [`Json`] object, in insertion order. A repeated name
/// keeps its first position and its last value. Large objects are indexed
/// by a hash map (foldhash, randomly seeded per process).
#[derive(Default)]
pub struct JsonMap {
    entries: Vec<(SmolStr, Json)>,
    index: Option<Index>,
}

impl Clone for JsonMap {
    fn clone(&self) -> Self {
        let n = self.entries.len();
        let mut entries: Vec<(SmolStr, Json)> = Vec::with_capacity(n);
        for (k, v) in &self.entries {
            add_key_owner(k);
            add_owner(v);
        }
        // SAFETY: every entry's shared parts have just gained the owner its
        // bitwise copy becomes (`add_owner`), so the copies are clones; the
        // capacity is `n` and all `n` are written before the length is set.
        unsafe {
            std::ptr::copy_nonoverlapping(self.entries.as_ptr(), entries.as_mut_ptr(), n);
            entries.set_len(n);
        }
        JsonMap {
            entries,
            index: self.index.clone(),
        }
    }
}

// A bitwise copy of a `Json` whose shared parts gained an owner is a clone
// (see `add_owner`): that needs every other payload to be plain data.
const _: () = assert!(!std::mem::needs_drop::<Number>());

/// Adds one owner to what `v` shares (its `Arc`, a heap string's `Arc`),
/// so that a bitwise copy of `v` is a clone. Copies made so (arrays and
/// member lists copied whole) avoid the derived clone, which moves each
/// value field by field through the stack: at the odd offsets of the
/// inline-string and bool payloads that stalls on every element (store
/// forwarding), about 30 ns an element of an array of objects.
#[inline(always)]
fn add_owner(v: &Json) {
    match v {
        Json::Object(m) => std::mem::forget(Arc::clone(m)),
        Json::Array(a) => std::mem::forget(Arc::clone(a)),
        Json::String(s) => add_key_owner(s),
        Json::Null | Json::Bool(_) | Json::Number(_) => {}
    }
}

/// [`add_owner`] for a string (an inline or static one owns nothing).
#[inline(always)]
fn add_key_owner(s: &SmolStr) {
    if s.is_heap_allocated() {
        std::mem::forget(s.clone());
    }
}

/// Arrays at least this long, copied by [`apply`] with changes, share the
/// unchanged elements with the array they came from instead of taking an
/// owner of each (see [`JsonArray`]); shorter ones are copied outright.
const CHAIN_FROM: usize = 16;

/// How many arrays may be chained so, each keeping the one before alive:
/// the next copy owns all its elements again, so a chain keeps at most
/// this many earlier versions (and what only they hold) in memory.
pub const MAX_ARRAY_CHAIN: u8 = 8;

/// The elements of a [`Json`] array, read as a slice.
///
/// An array made by [`apply`] from a long one keeps that one alive and
/// holds bitwise copies of its unchanged elements, owned by it (or by the
/// arrays before it): copying them changes no reference count, and
/// neither does dropping them. Taking an owner of every element is most
/// of what an immutable apply of a few changes to a long array costs (an
/// atomic increment each, and a decrement each when it is dropped).
pub struct JsonArray {
    items: Box<[ManuallyDrop<Json>]>,
    /// Owns what the elements not owned here refer to; `None`: all are owned.
    parent: Option<Arc<JsonArray>>,
    /// With a parent: the (sorted) positions below `owned_from` owned here.
    owned: Box<[u32]>,
    /// With a parent: every position from here on is owned here.
    owned_from: usize,
    /// Arrays before this one in its chain.
    generation: u8,
}

impl JsonArray {
    fn from_vec(v: Vec<Json>) -> Self {
        let items: Box<[Json]> = v.into_boxed_slice();
        // SAFETY: `ManuallyDrop<Json>` has the layout of `Json`; every
        // element is owned here (`parent` is `None`) and dropped by `drop`.
        let items = unsafe { Box::from_raw(Box::into_raw(items) as *mut [ManuallyDrop<Json>]) };
        JsonArray {
            items,
            parent: None,
            owned: Box::default(),
            owned_from: 0,
            generation: 0,
        }
    }
}

impl std::ops::Deref for JsonArray {
    type Target = [Json];
    fn deref(&self) -> &[Json] {
        // SAFETY: `ManuallyDrop<Json>` is `repr(transparent)` over `Json`.
        unsafe { &*(&*self.items as *const [ManuallyDrop<Json>] as *const [Json]) }
    }
}

impl Drop for JsonArray {
    fn drop(&mut self) {
        let items = &mut self.items;
        // SAFETY: each element is dropped at most once, and only where
        // this array owns it; the others belong to `parent`'s chain.
        unsafe {
            if self.parent.is_none() {
                for v in items.iter_mut() {
                    ManuallyDrop::drop(v);
                }
            } else {
                for &i in self.owned.iter() {
                    ManuallyDrop::drop(&mut items[i as usize]);
                }
                for v in items[self.owned_from..].iter_mut() {
                    ManuallyDrop::drop(v);
                }
            }
        }
    }
}

/// A clone of `v` as a bitwise copy once its shared parts gained an owner.
#[inline(always)]
fn share(v: &Json) -> ManuallyDrop<Json> {
    add_owner(v);
    // SAFETY: `v` gained the owner this copy becomes.
    ManuallyDrop::new(unsafe { std::ptr::read(v) })
}

/// [`share`] as a plain value: a clone read and written whole, never field
/// by field (a value written in pieces and then moved whole stalls the
/// load that moves it, store forwarding failing at the piece boundaries).
#[inline(always)]
fn shared(v: &Json) -> Json {
    ManuallyDrop::into_inner(share(v))
}

/// [`shared`] for a member name.
#[inline(always)]
fn shared_key(k: &SmolStr) -> SmolStr {
    add_key_owner(k);
    // SAFETY: `k` gained the owner this copy becomes.
    unsafe { std::ptr::read(k) }
}

/// `a[..truncate]` with the `patched` elements (sorted, distinct, each
/// below `truncate`) replaced, then `append`: one copy of the elements.
/// From a long array, the unchanged elements are shared with it (the new
/// array keeps it alive); otherwise each gains an owner.
fn build_array<'v>(
    a: &Arc<JsonArray>,
    truncate: usize,
    patched: Patched,
    append: impl ExactSizeIterator<Item = &'v Json>,
) -> Arc<JsonArray> {
    let n = truncate + append.len();
    let chain = truncate >= CHAIN_FROM && a.generation < MAX_ARRAY_CHAIN;
    let mut items: Vec<ManuallyDrop<Json>> = Vec::with_capacity(n);
    if !chain {
        let mut p = patched.iter().map(|(i, _)| *i).peekable();
        for (i, v) in a[..truncate].iter().enumerate() {
            if p.next_if_eq(&i).is_none() {
                add_owner(v);
            }
        }
    }
    // SAFETY: the capacity is at least `truncate`. Each copy is either
    // owned (it gained its owner above) or, in a chain, owned by `a`,
    // which the new array keeps alive; copies at patched positions are
    // overwritten below (a `ManuallyDrop` is never dropped on assignment).
    unsafe {
        std::ptr::copy_nonoverlapping(a.items.as_ptr(), items.as_mut_ptr(), truncate);
        items.set_len(truncate);
    }
    let mut owned = Vec::with_capacity(if chain { patched.len() } else { 0 });
    for (i, v) in patched {
        items[i] = ManuallyDrop::new(v);
        if chain {
            // Positions are below `truncate`, itself a length in memory.
            owned.push(i as u32);
        }
    }
    items.extend(append.map(share));
    let items = items.into_boxed_slice();
    Arc::new(if chain {
        JsonArray {
            items,
            parent: Some(Arc::clone(a)),
            owned: owned.into_boxed_slice(),
            owned_from: truncate,
            generation: a.generation + 1,
        }
    } else {
        JsonArray {
            items,
            parent: None,
            owned: Box::default(),
            owned_from: 0,
            generation: 0,
        }
    })
}

impl JsonMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, key: &str) -> Option<usize> {
        match &self.index {
            Some(ix) => ix.get(key).copied(),
            None => self.entries.iter().position(|(k, _)| str_eq_str(k, key)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Json> {
        self.position(key).map(|i| &self.entries[i].1)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        self.position(key).map(|i| &mut self.entries[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// The member at position `i`.
    pub fn get_index(&self, i: usize) -> Option<(&SmolStr, &Json)> {
        self.entries.get(i).map(|(k, v)| (k, v))
    }

    /// Sets a member; an existing one keeps its position. Returns the old value.
    pub fn insert(&mut self, key: SmolStr, value: Json) -> Option<Json> {
        if let Some(i) = self.position(&key) {
            return Some(std::mem::replace(&mut self.entries[i].1, value));
        }
        if let Some(ix) = &mut self.index {
            ix.insert(key.clone(), self.entries.len());
        }
        self.entries.push((key, value));
        if self.index.is_none() && self.entries.len() > JSON_MAP_INDEX_FROM {
            self.reindex();
        }
        None
    }

    /// Appends a member the caller knows is not there yet (a delta's
    /// members, built from distinct names): no search.
    fn push_new(&mut self, key: SmolStr, value: Json) {
        if let Some(ix) = &mut self.index {
            ix.insert(key.clone(), self.entries.len());
        }
        self.entries.push((key, value));
        if self.index.is_none() && self.entries.len() > JSON_MAP_INDEX_FROM {
            self.reindex();
        }
    }

    /// Removes a member, keeping the order of the others.
    pub fn shift_remove(&mut self, key: &str) -> Option<Json> {
        let i = self.position(key)?;
        let (_, v) = self.entries.remove(i);
        if self.index.is_some() {
            self.reindex();
        }
        Some(v)
    }

    fn reindex(&mut self) {
        let mut ix = Index::with_capacity_and_hasher(self.entries.len(), Default::default());
        for (i, (k, _)) in self.entries.iter().enumerate() {
            ix.insert(k.clone(), i);
        }
        self.index = Some(ix);
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&SmolStr, &Json)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl ExactSizeIterator<Item = &SmolStr> {
        self.entries.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl ExactSizeIterator<Item = &Json> {
        self.entries.iter().map(|(_, v)| v)
    }
}

impl<K: Into<SmolStr>> FromIterator<(K, Json)> for JsonMap {
    fn from_iter<I: IntoIterator<Item = (K, Json)>>(iter: I) -> Self {
        let mut m = JsonMap::new();
        for (k, v) in iter {
            m.insert(k.into(), v);
        }
        m
    }
}

/// An empty [`JsonMap`].
pub fn json_map() -> JsonMap {
    JsonMap::new()
}

/// An immutable JSON value whose strings, arrays and objects are shared.
///
/// Strings and member names of up to 23 bytes are held inline (no
/// allocation, no reference count); longer ones behind an `Arc`.
///
/// Equality is JSON equality (object member order does not matter; numbers
/// compare as `serde_json::Number` does). Values nest only as deep as the
/// text they were decoded from: decode untrusted text with
/// [`crate::json::from_str_bounded`] so that depth is bounded first.
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
            Some((kb, vb)) if key_eq(k, kb) => Some(vb),
            _ => b.get(k),
        };
        vb.is_some_and(|vb| va == vb)
    })
}

fn key_eq(a: &SmolStr, b: &SmolStr) -> bool {
    a == b
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

/// A structural delta (see the module documentation for its format).
///
/// One made by [`diff`] is held typed, as one list of nodes in pre-order
/// (member positions and array indices as numbers, a replacement without
/// the `[…]` around it): building it allocates that one list, not one per
/// changed container. One decoded from text is held as the JSON it was and
/// read against the base when applied. Both mean what their text means:
/// equality, `Debug` and the wire form are the text's.
#[derive(Clone)]
pub struct JsonDelta(Repr);

#[derive(Clone)]
enum Repr {
    /// Made by `diff`: the root node first; none at all is `{}`.
    Built(Vec<Node>),
    /// As decoded from text.
    Wire(Json),
}

/// One node of a built delta: how its parent addresses it, and what it
/// does. A container node is followed by its children's subtrees.
#[derive(Clone)]
struct Node {
    key: Key,
    op: Op,
}

#[derive(Clone)]
enum Key {
    Root,
    /// A member, with where it was in the object the delta was made
    /// against (`ADDED` for a new one): a hint, checked before it is used.
    Member {
        name: SmolStr,
        at: u32,
    },
    /// An element of the array as it was.
    Index(usize),
    /// An appended element (its node is a `Replace` of the value).
    Append,
}

#[derive(Clone)]
enum Op {
    /// `[v]`.
    Replace(Json),
    /// `[]` (as an object member's delta only).
    Remove,
    /// `{…}` made against an object: `children` member subtrees follow,
    /// `span` nodes in all.
    Members { children: u32, span: u32 },
    /// `{…}` made against an array: `patched` element subtrees (increasing
    /// indices), then `append` appended values; `span` nodes in all.
    Elements {
        patched: u32,
        append: u32,
        span: u32,
        truncate: Option<usize>,
    },
}

const ADDED: u32 = u32::MAX;

/// Node counts and positions are bounded by memory: a delta of more than
/// `u32::MAX` nodes would take hundreds of gigabytes.
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The nodes of the subtree at `p`, beyond `p` itself.
fn span(nodes: &[Node], p: usize) -> usize {
    match nodes[p].op {
        Op::Members { span, .. } | Op::Elements { span, .. } => span as usize,
        _ => 0,
    }
}

/// The positions of the `n` children of the container node at `p`.
fn children(nodes: &[Node], p: usize, n: u32) -> impl Iterator<Item = usize> + '_ {
    let mut c = p + 1;
    (0..n).map(move |_| {
        let at = c;
        c += 1 + span(nodes, at);
        at
    })
}

/// The values of the `n` appended-element nodes from `c`.
fn appended(nodes: &[Node], c: usize, n: u32) -> impl ExactSizeIterator<Item = &Json> {
    nodes[c..c + n as usize].iter().map(|node| match &node.op {
        Op::Replace(v) => v,
        // `diff` makes every appended node a `Replace`.
        _ => &Json::Null,
    })
}

impl Default for JsonDelta {
    fn default() -> Self {
        Self::empty()
    }
}

impl JsonDelta {
    /// The delta that changes nothing: `{}`.
    pub fn empty() -> Self {
        JsonDelta(Repr::Built(Vec::new()))
    }

    /// A delta as JSON (as decoded from its text); its shape is checked
    /// when it is applied.
    pub fn from_json(json: Json) -> Self {
        JsonDelta(Repr::Wire(json))
    }

    pub fn is_empty(&self) -> bool {
        match &self.0 {
            Repr::Built(nodes) => {
                nodes.is_empty() || matches!(nodes[0].op, Op::Members { children: 0, .. })
            }
            Repr::Wire(Json::Object(m)) => m.is_empty(),
            Repr::Wire(_) => false,
        }
    }

    /// The delta as JSON (its wire form).
    pub fn to_json(&self) -> Json {
        match &self.0 {
            Repr::Built(nodes) if nodes.is_empty() => Json::object(json_map()),
            Repr::Built(nodes) => node_json(nodes, 0),
            Repr::Wire(j) => j.clone(),
        }
    }

    /// The compact JSON text.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The byte size of the delta on the wire (compact JSON).
    pub fn json_len(&self) -> usize {
        let mut c = Count(0);
        let _ = serde_json::to_writer(&mut c, self);
        c.0
    }
}

impl PartialEq for JsonDelta {
    fn eq(&self, other: &Self) -> bool {
        self.to_json() == other.to_json()
    }
}

impl fmt::Debug for JsonDelta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json_string())
    }
}

impl Serialize for JsonDelta {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Repr::Built(nodes) if nodes.is_empty() => s.serialize_map(Some(0))?.end(),
            Repr::Built(nodes) => Sub(nodes, 0).serialize(s),
            Repr::Wire(j) => j.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for JsonDelta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<JsonDelta, D::Error> {
        Json::deserialize(d).map(JsonDelta::from_json)
    }
}

/// The subtree at a node, serialized as its text.
struct Sub<'a>(&'a [Node], usize);

/// The appended values of an array node, as the `+` list.
struct Appended<'a>(&'a [Node], usize, u32);

impl Serialize for Appended<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.2 as usize))?;
        for v in appended(self.0, self.1, self.2) {
            seq.serialize_element(v)?;
        }
        seq.end()
    }
}

impl Serialize for Sub<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Sub(nodes, p) = *self;
        match &nodes[p].op {
            Op::Replace(v) => {
                let mut seq = s.serialize_seq(Some(1))?;
                seq.serialize_element(v)?;
                seq.end()
            }
            Op::Remove => s.serialize_seq(Some(0))?.end(),
            Op::Members { children: n, .. } => {
                let mut map = s.serialize_map(Some(*n as usize))?;
                for c in children(nodes, p, *n) {
                    if let Key::Member { name, .. } = &nodes[c].key {
                        map.serialize_entry(name.as_str(), &Sub(nodes, c))?;
                    }
                }
                map.end()
            }
            Op::Elements {
                patched,
                append,
                truncate,
                ..
            } => {
                let n =
                    *patched as usize + usize::from(truncate.is_some()) + usize::from(*append > 0);
                let mut map = s.serialize_map(Some(n))?;
                let mut next = p + 1;
                for c in children(nodes, p, *patched) {
                    if let Key::Index(i) = nodes[c].key {
                        map.serialize_entry(index_key(i).as_str(), &Sub(nodes, c))?;
                    }
                    next = c + 1 + span(nodes, c);
                }
                if let Some(n) = truncate {
                    map.serialize_entry("-", n)?;
                }
                if *append > 0 {
                    map.serialize_entry("+", &Appended(nodes, next, *append))?;
                }
                map.end()
            }
        }
    }
}

/// The subtree at `p` as JSON (its text's tree).
fn node_json(nodes: &[Node], p: usize) -> Json {
    match &nodes[p].op {
        Op::Replace(v) => replace(v),
        Op::Remove => Json::array(Vec::new()),
        Op::Members { children: n, .. } => {
            let mut m = json_map();
            for c in children(nodes, p, *n) {
                if let Key::Member { name, .. } = &nodes[c].key {
                    m.push_new(name.clone(), node_json(nodes, c));
                }
            }
            Json::object(m)
        }
        Op::Elements {
            patched,
            append,
            truncate,
            ..
        } => {
            let mut m = json_map();
            let mut next = p + 1;
            for c in children(nodes, p, *patched) {
                if let Key::Index(i) = nodes[c].key {
                    m.push_new(index_key(i), node_json(nodes, c));
                }
                next = c + 1 + span(nodes, c);
            }
            if let Some(n) = truncate {
                m.push_new(SmolStr::new_static("-"), Json::Number((*n).into()));
            }
            if *append > 0 {
                let values = appended(nodes, next, *append).cloned().collect();
                m.push_new(SmolStr::new_static("+"), Json::array(values));
            }
            Json::object(m)
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

/// Why a delta does not apply to a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("delta at {path}: {reason}")]
pub struct DeltaError {
    /// Where in the base value, as a JSON Pointer (`""` is the root).
    pub path: String,
    pub reason: &'static str,
}

/// The delta that turns `a` into `b`. Subtrees that are the same
/// allocation in both are skipped without being looked at.
pub fn diff(a: &Json, b: &Json) -> JsonDelta {
    let mut nodes = Vec::new();
    diff_into(a, b, || Key::Root, &mut nodes);
    JsonDelta(Repr::Built(nodes))
}

fn replace(v: &Json) -> Json {
    Json::array(vec![v.clone()])
}

/// Appends the node `make` builds, built in its place: a node assembled
/// first and then moved stalls on the loads that move it (store
/// forwarding fails where the pieces it was written in meet), and a plain
/// `push` builds it before its capacity check.
#[inline(always)]
fn push_node(out: &mut Vec<Node>, make: impl FnOnce() -> Node) {
    out.reserve(1);
    let len = out.len();
    // SAFETY: there is room for one more (reserved above).
    unsafe {
        out.as_mut_ptr().add(len).write(make());
        out.set_len(len + 1);
    }
}

/// Appends the delta of `a` to `b` under `key` to `out`; false (nothing
/// appended) when they are equal. Scalars are settled here, inlined into
/// the loops that walk containers: most members of a game state are
/// scalars, and a call per member costs more than comparing it.
#[inline(always)]
fn diff_into(a: &Json, b: &Json, key: impl FnOnce() -> Key, out: &mut Vec<Node>) -> bool {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => !Arc::ptr_eq(x, y) && diff_object(x, y, key(), out),
        (Json::Array(x), Json::Array(y)) => !Arc::ptr_eq(x, y) && diff_array(x, y, b, key(), out),
        _ if scalar_eq(a, b) => false,
        _ => {
            push_node(out, || Node {
                key: key(),
                op: Op::Replace(shared(b)),
            });
            true
        }
    }
}

/// Equality of two values of which at most one is a container (a container
/// never equals a scalar). Strings compare their bytes (a shared heap
/// string has equal bytes too); no allocation.
#[inline(always)]
fn scalar_eq(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::String(x), Json::String(y)) => str_eq(x, y),
        (Json::Number(x), Json::Number(y)) => x == y,
        (Json::Bool(x), Json::Bool(y)) => x == y,
        (Json::Null, Json::Null) => true,
        _ => false,
    }
}

/// String equality without a call to `memcmp` for the short strings that
/// fill game states (names, ids, keys): the call costs more than the
/// comparison. Longer strings fall back to the slice comparison.
#[inline(always)]
fn str_eq(a: &SmolStr, b: &SmolStr) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let w8 = |s: &[u8], i: usize| u64::from_le_bytes(s[i..i + 8].try_into().unwrap_or_default());
    let w4 = |s: &[u8], i: usize| u32::from_le_bytes(s[i..i + 4].try_into().unwrap_or_default());
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=8 => w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4),
        9..=16 => w8(a, 0) == w8(b, 0) && w8(a, n - 8) == w8(b, n - 8),
        17..=24 => w8(a, 0) == w8(b, 0) && w8(a, 8) == w8(b, 8) && w8(a, n - 8) == w8(b, n - 8),
        _ => a == b,
    }
}

/// [`str_eq`] against a plain `&str`.
#[inline(always)]
fn str_eq_str(a: &SmolStr, b: &str) -> bool {
    a.len() == b.len() && a.as_bytes() == b.as_bytes()
}

/// Equality as a plain walk (no delta built on the way): the test run
/// first on every member, since most members of consecutive states are
/// unchanged. Same member order is walked in step; a name is looked up
/// only where the orders differ.
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            Arc::ptr_eq(x, y)
                || (x.len() == y.len()
                    && x.entries
                        .iter()
                        .zip(y.entries.iter())
                        .all(|((ka, va), (kb, vb))| {
                            if str_eq(ka, kb) {
                                same_member(va, vb)
                            } else {
                                y.get(ka).is_some_and(|vb| same(va, vb))
                            }
                        }))
        }
        (Json::Array(x), Json::Array(y)) => {
            Arc::ptr_eq(x, y)
                || (x.len() == y.len()
                    && x.iter().zip(y.iter()).all(|(va, vb)| same_member(va, vb)))
        }
        _ => scalar_eq(a, b),
    }
}

/// Equal scalars and shared subtrees, settled inline by one comparison;
/// any other pair of containers is walked once, by the diff itself (no
/// equality pre-walk: a delta is only allocated where a change is found).
#[inline(always)]
fn settled(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => Arc::ptr_eq(x, y),
        (Json::Array(x), Json::Array(y)) => Arc::ptr_eq(x, y),
        _ => scalar_eq(a, b),
    }
}

/// [`same`] with scalars and shared subtrees settled inline: a subtree
/// that is the same allocation on both sides costs one comparison.
#[inline(always)]
fn same_member(a: &Json, b: &Json) -> bool {
    settled(a, b) || same(a, b)
}

/// Whether two containers share their first or last child's allocation:
/// a state derived from the other by an edit (as a match builds it),
/// whose unchanged parts the diff skips unread, so an equality pre-walk
/// would only read the changed path twice. Two separately built states
/// share nothing; there a plain equality walk first is cheaper than the
/// diff's own on the (mostly equal) members.
#[inline(always)]
fn shares_a_child(a: &Json, b: &Json) -> bool {
    let shared = |x: Option<&Json>, y: Option<&Json>| match (x, y) {
        (Some(x @ (Json::Object(_) | Json::Array(_))), Some(y)) => settled(x, y),
        _ => false,
    };
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            shared(
                x.entries.last().map(|e| &e.1),
                y.entries.last().map(|e| &e.1),
            ) || shared(
                x.entries.first().map(|e| &e.1),
                y.entries.first().map(|e| &e.1),
            )
        }
        (Json::Array(x), Json::Array(y)) => {
            shared(x.first(), y.first()) || shared(x.last(), y.last())
        }
        _ => false,
    }
}

#[inline(never)]
fn diff_object(x: &JsonMap, y: &JsonMap, key: Key, out: &mut Vec<Node>) -> bool {
    let at_node = out.len();
    push_node(out, || Node {
        key,
        op: Op::Members {
            children: 0,
            span: 0,
        },
    });
    let mut n = 0u32;
    let mut kept = 0usize;
    for (i, (k, va)) in x.entries.iter().enumerate() {
        let vb = match y.entries.get(i) {
            Some((kb, vb)) if str_eq(kb, k) => Some(vb),
            _ => y.get(k),
        };
        let member = || Key::Member {
            name: shared_key(k),
            at: count(i).min(ADDED - 1),
        };
        match vb {
            None => {
                push_node(out, || Node {
                    key: member(),
                    op: Op::Remove,
                });
                n += 1;
            }
            Some(vb) => {
                kept += 1;
                if settled(va, vb) || (!shares_a_child(va, vb) && same(va, vb)) {
                    continue;
                }
                n += u32::from(diff_into(va, vb, member, out));
            }
        }
    }
    if kept < y.len() {
        for (k, vb) in y.iter() {
            if !x.contains_key(k) {
                push_node(out, || Node {
                    key: Key::Member {
                        name: shared_key(k),
                        at: ADDED,
                    },
                    op: Op::Replace(shared(vb)),
                });
                n += 1;
            }
        }
    }
    if n == 0 {
        out.truncate(at_node);
        return false;
    }
    out[at_node].op = Op::Members {
        children: n,
        span: count(out.len() - at_node - 1),
    };
    true
}

#[inline(never)]
fn diff_array(x: &[Json], y: &[Json], whole: &Json, key: Key, out: &mut Vec<Node>) -> bool {
    let at_node = out.len();
    push_node(out, || Node {
        key,
        op: Op::Elements {
            patched: 0,
            append: 0,
            span: 0,
            truncate: None,
        },
    });
    let common = x.len().min(y.len());
    let mut patched = 0usize;
    for i in 0..common {
        let (a, b) = (&x[i], &y[i]);
        if settled(a, b) || (!shares_a_child(a, b) && same(a, b)) {
            continue;
        }
        patched += usize::from(diff_into(a, b, || Key::Index(i), out));
    }
    // An insertion or removal near the front shifts every later element:
    // past half the elements changed, the whole array is the smaller delta.
    if patched > 1 && patched * 2 > y.len() {
        let key = std::mem::replace(&mut out[at_node].key, Key::Root);
        out.truncate(at_node);
        push_node(out, || Node {
            key,
            op: Op::Replace(shared(whole)),
        });
        return true;
    }
    let truncate = (y.len() < x.len()).then_some(y.len());
    for v in &y[common..] {
        push_node(out, || Node {
            key: Key::Append,
            op: Op::Replace(shared(v)),
        });
    }
    let append = y.len() - common;
    if patched == 0 && truncate.is_none() && append == 0 {
        out.truncate(at_node);
        return false;
    }
    out[at_node].op = Op::Elements {
        patched: count(patched),
        append: count(append),
        span: count(out.len() - at_node - 1),
        truncate,
    };
    true
}

/// An array index as a member name: its decimal digits, inline (no
/// allocation, no formatting machinery).
fn index_key(mut i: usize) -> SmolStr {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (i % 10) as u8;
        i /= 10;
        if i == 0 {
            break;
        }
    }
    // At most 20 ASCII digits: inline, without the length dispatch of `new`.
    SmolStr::new_inline(std::str::from_utf8(&buf[at..]).unwrap_or_default())
}

/// `a` with `delta` applied. Unchanged subtrees of the result are `a`'s own
/// (shared, not copied); `a` itself is untouched. The work is bounded by the
/// delta's size times the width of the containers it touches.
pub fn apply(a: &Json, delta: &JsonDelta) -> Result<Json, DeltaError> {
    match &delta.0 {
        Repr::Built(nodes) if nodes.is_empty() => Ok(a.clone()),
        Repr::Built(nodes) => apply_node(a, nodes, 0),
        Repr::Wire(j) => apply_value(a, j),
    }
}

/// An error at the value being applied to; the path is filled in by the
/// callers on the way out (no path is built while applying succeeds).
fn err(reason: &'static str) -> DeltaError {
    DeltaError {
        path: String::new(),
        reason,
    }
}

/// Puts `seg` (JSON Pointer escaped) in front of the error's path.
fn under(seg: &str) -> impl FnOnce(DeltaError) -> DeltaError + '_ {
    move |mut e| {
        let mut path = String::with_capacity(seg.len() + 1 + e.path.len());
        path.push('/');
        for c in seg.chars() {
            match c {
                '~' => path.push_str("~0"),
                '/' => path.push_str("~1"),
                c => path.push(c),
            }
        }
        path.push_str(&e.path);
        e.path = path;
        e
    }
}

/// A built delta on the kind of value it was made against takes the fast
/// paths; on any other value it is read as its text would be, so both
/// forms always mean the same.
fn apply_node(base: &Json, nodes: &[Node], p: usize) -> Result<Json, DeltaError> {
    match (&nodes[p].op, base) {
        (Op::Replace(v), _) => Ok(shared(v)),
        (Op::Members { children: 0, .. }, _) => Ok(base.clone()),
        (Op::Members { children: n, .. }, Json::Object(o)) => apply_members(o, nodes, p, *n),
        (
            Op::Elements {
                patched,
                append,
                truncate,
                ..
            },
            Json::Array(a),
        ) => apply_elements(a, nodes, p, *patched, *append, *truncate),
        _ => apply_value(base, &node_json(nodes, p)),
    }
}

/// Members made against an object: positions from the hints (a name
/// looked up only where the hint misses), one copy of the member list.
fn apply_members(o: &JsonMap, nodes: &[Node], p: usize, n: u32) -> Result<Json, DeltaError> {
    let mut patched = Patched::new();
    let mut added: SmallVec<[(&SmolStr, &Json); 2]> = SmallVec::new();
    for c in children(nodes, p, n) {
        // `diff` gives every child of a members node a member key.
        let Key::Member { name, at } = &nodes[c].key else {
            continue;
        };
        let hinted = o
            .entries
            .get(*at as usize)
            .filter(|(k, _)| str_eq(k, name))
            .map(|_| *at as usize);
        match (hinted.or_else(|| o.position(name)), &nodes[c].op) {
            // A removal shifts the members after it: the general path.
            (_, Op::Remove) => return apply_object(o, members_as_wire(nodes, p, n)),
            (Some(i), _) => {
                let v = apply_node(&o.entries[i].1, nodes, c).map_err(under(name))?;
                patched.push((i, v));
            }
            (None, Op::Replace(v)) => added.push((name, v)),
            (None, _) => return Err(under(name)(err("patches a member that does not exist"))),
        }
    }
    patched.sort_unstable_by_key(|(i, _)| *i);
    if patched.windows(2).any(|w| w[0].0 == w[1].0) {
        // One member named twice: not made by `diff`; read as text.
        return apply_object(o, members_as_wire(nodes, p, n));
    }
    let mut out = Arc::new(JsonMap {
        entries: copy_entries(&o.entries, patched, added.len()),
        index: o.index.clone(),
    });
    if !added.is_empty() {
        // A fresh `Arc` is unique: `get_mut` always gives it.
        if let Some(m) = Arc::get_mut(&mut out) {
            for (k, v) in added {
                m.insert(shared_key(k), shared(v));
            }
        }
    }
    Ok(Json::Object(out))
}

/// The children of a built members node as (name, delta) pairs of its text.
fn members_as_wire(nodes: &[Node], p: usize, n: u32) -> Vec<(SmolStr, Json)> {
    children(nodes, p, n)
        .filter_map(|c| match &nodes[c].key {
            Key::Member { name, .. } => Some((name.clone(), node_json(nodes, c))),
            _ => None,
        })
        .collect()
}

/// Elements made against an array: indices as numbers, already in order.
fn apply_elements(
    a: &Arc<JsonArray>,
    nodes: &[Node],
    p: usize,
    n: u32,
    append: u32,
    truncate: Option<usize>,
) -> Result<Json, DeltaError> {
    let truncate = match truncate {
        Some(t) if t > a.len() => {
            return Err(err("`-` must be a length no larger than the array's"))
        }
        Some(t) => t,
        None => a.len(),
    };
    let mut patched = Patched::new();
    let mut next = p + 1;
    for c in children(nodes, p, n) {
        next = c + 1 + span(nodes, c);
        // `diff` gives every patched child of an elements node an index.
        let Key::Index(i) = nodes[c].key else {
            continue;
        };
        if i >= truncate {
            return Err(under(&index_key(i))(err(
                "an index past the end of the array",
            )));
        }
        if matches!(nodes[c].op, Op::Remove) {
            return Err(under(&index_key(i))(err(
                "`[]` removes object members only; truncate with `-`",
            )));
        }
        let v = apply_node(&a[i], nodes, c).map_err(|e| under(&index_key(i))(e))?;
        patched.push((i, v));
    }
    let values = appended(nodes, next, append);
    Ok(Json::Array(build_array(a, truncate, patched, values)))
}

/// `entries` with the `patched` values (sorted, distinct positions) in
/// place, room for `extra` more: one allocation, every other entry copied
/// whole after gaining an owner.
#[inline(always)]
fn copy_entries(
    entries: &[(SmolStr, Json)],
    patched: Patched,
    extra: usize,
) -> Vec<(SmolStr, Json)> {
    let n = entries.len();
    let mut out: Vec<(SmolStr, Json)> = Vec::with_capacity(n + extra);
    let mut p = patched.iter().map(|(i, _)| *i).peekable();
    for (i, (k, v)) in entries.iter().enumerate() {
        add_key_owner(k);
        if p.next_if_eq(&i).is_none() {
            add_owner(v);
        }
    }
    // SAFETY: the capacity is at least `n`; every key, and every value
    // not at a patched position, gained the owner its bitwise copy
    // becomes. The copies of patched values gained none: they are
    // overwritten below without being dropped.
    unsafe {
        std::ptr::copy_nonoverlapping(entries.as_ptr(), out.as_mut_ptr(), n);
        for (i, v) in patched {
            std::ptr::write(&mut (*out.as_mut_ptr().add(i)).1, v);
        }
        out.set_len(n);
    }
    out
}

fn apply_value(base: &Json, d: &Json) -> Result<Json, DeltaError> {
    match d {
        Json::Array(v) if v.len() == 1 => Ok(v[0].clone()),
        Json::Array(v) if v.is_empty() => Err(err("a removal `[]` outside an object member")),
        Json::Array(_) => Err(err("a replacement must be `[value]` with one element")),
        Json::Object(p) if p.is_empty() => Ok(base.clone()),
        Json::Object(p) => match base {
            Json::Object(m) => apply_object(m, p.iter().map(|(k, v)| (k.clone(), v.clone()))),
            Json::Array(a) => apply_array(a, p),
            _ => Err(err(
                "a patch `{…}` on a value that is neither object nor array",
            )),
        },
        _ => Err(err("a delta must be `[value]`, `[]` or a patch object")),
    }
}

fn apply_object(
    m: &JsonMap,
    p: impl IntoIterator<Item = (SmolStr, Json)>,
) -> Result<Json, DeltaError> {
    let mut out = m.clone();
    for (k, sub) in p {
        match &sub {
            Json::Array(v) if v.is_empty() => {
                if out.shift_remove(&k).is_none() {
                    return Err(under(&k)(err("removes a member that does not exist")));
                }
            }
            _ => match out.get_mut(&k) {
                Some(slot) => {
                    *slot = apply_value(slot, &sub).map_err(under(&k))?;
                }
                None => match &sub {
                    Json::Array(v) if v.len() == 1 => {
                        let v = v[0].clone();
                        out.insert(k, v);
                    }
                    _ => return Err(under(&k)(err("patches a member that does not exist"))),
                },
            },
        }
    }
    Ok(Json::object(out))
}

/// A canonical decimal index: no sign, no leading zero (except "0").
fn parse_index(k: &str) -> Option<usize> {
    if k.is_empty() || k.len() > 19 || (k.len() > 1 && k.starts_with('0')) {
        return None;
    }
    if !k.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    k.parse().ok()
}

fn apply_array(a: &Arc<JsonArray>, p: &JsonMap) -> Result<Json, DeltaError> {
    let mut truncate = a.len();
    let mut append: &[Json] = &[];
    let mut patched = Patched::new();
    for (k, sub) in p.iter() {
        match &**k {
            "-" => {
                truncate = match sub {
                    Json::Number(n) => n
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|&n| n <= a.len())
                        .ok_or_else(|| err("`-` must be a length no larger than the array's"))?,
                    _ => return Err(err("`-` must be a number")),
                };
            }
            "+" => {
                append = sub
                    .as_array()
                    .ok_or_else(|| err("`+` must be an array of elements"))?;
            }
            _ => {}
        }
    }
    for (k, sub) in p.iter() {
        if &**k == "-" || &**k == "+" {
            continue;
        }
        let i = parse_index(k)
            .ok_or_else(|| under(k)(err("an array patch key must be an index, `-` or `+`")))?;
        if i >= truncate {
            return Err(under(k)(err("an index past the end of the array")));
        }
        if matches!(sub, Json::Array(v) if v.is_empty()) {
            return Err(under(k)(err(
                "`[]` removes object members only; truncate with `-`",
            )));
        }
        patched.push((i, apply_value(&a[i], sub).map_err(under(k))?));
    }
    // Canonical indices of one object are distinct; a peer may list them
    // in any order.
    patched.sort_unstable_by_key(|(i, _)| *i);
    // Untouched elements are the base's own, each a reference-count bump.
    Ok(Json::Array(build_array(
        a,
        truncate,
        patched,
        append.iter(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn j(v: serde_json::Value) -> Json {
        Json::from(v)
    }

    #[test]
    fn a_changed_field_and_an_appended_element_make_a_compact_delta() {
        let a = j(json!({"players":[{"id":"a","score":1},{"id":"b","score":2}],"log":["x"]}));
        let b = j(json!({"players":[{"id":"a","score":1},{"id":"b","score":5}],"log":["x","y"]}));
        let d = diff(&a, &b);
        assert_eq!(
            d.to_json_string(),
            r#"{"players":{"1":{"score":[5]}},"log":{"+":["y"]}}"#
        );
        let c = apply(&a, &d).unwrap();
        assert_eq!(c, b);
        // Untouched subtrees are the base's own allocations.
        let pa = a.get("players").unwrap().as_array().unwrap();
        let pc = c.get("players").unwrap().as_array().unwrap();
        assert!(pa[0].ptr_eq(&pc[0]));
        assert!(!pa[1].ptr_eq(&pc[1]));
        assert!(pa[1].get("id").unwrap().ptr_eq(pc[1].get("id").unwrap()));
    }

    #[test]
    fn removal_truncation_and_type_change() {
        let a = j(json!({"a":1,"b":[1,2,3],"c":{"x":1}}));
        let b = j(json!({"b":[1],"c":"now a string","d":null}));
        let d = diff(&a, &b);
        assert_eq!(
            d.to_json_string(),
            r#"{"a":[],"b":{"-":1},"c":["now a string"],"d":[null]}"#
        );
        assert_eq!(apply(&a, &d).unwrap(), b);
    }

    #[test]
    fn equal_values_give_the_empty_delta_and_apply_shares_everything() {
        let a = j(json!({"a":[1,{"b":2}]}));
        let b = j(json!({"a":[1,{"b":2}]}));
        let d = diff(&a, &b);
        assert!(d.is_empty());
        assert!(apply(&a, &d).unwrap().ptr_eq(&a));
    }

    #[test]
    fn bad_deltas_are_errors_that_name_the_path() {
        let a = j(json!({"a":[1,2],"b":{"c":3},"s":"x"}));
        let cases = [
            (json!({"a":{"2":[9]}}), "/a/2"),
            (json!({"a":{"01":[9]}}), "/a/01"),
            (json!({"a":{"x":[9]}}), "/a/x"),
            (json!({"a":{"-":3}}), "/a"),
            (json!({"a":{"+":1}}), "/a"),
            (json!({"a":{"0":[]}}), "/a/0"),
            (json!({"b":{"z":[]}}), "/b/z"),
            (json!({"b":{"z":{"q":[1]}}}), "/b/z"),
            (json!({"s":{"q":[1]}}), "/s"),
            (json!({"b":[1,2]}), "/b"),
            (json!({"b":7}), "/b"),
            (json!([]), ""),
        ];
        for (delta, path) in cases {
            let e = apply(&a, &JsonDelta::from_json(j(delta.clone()))).unwrap_err();
            assert_eq!(e.path, path, "{delta}");
        }
        // Truncating and patching past the new length is refused too.
        let e = apply(&a, &JsonDelta::from_json(j(json!({"a":{"-":1,"1":[0]}})))).unwrap_err();
        assert_eq!(e.path, "/a/1");
    }

    #[test]
    fn deltas_round_trip_as_text() {
        let a = j(json!({"k":[1,2,3],"m":{"x":"y"}}));
        let b = j(json!({"k":[1,2,4,5],"m":{}}));
        let d = diff(&a, &b);
        let text = serde_json::to_string(&d).unwrap();
        let back: JsonDelta = serde_json::from_str(&text).unwrap();
        assert_eq!(apply(&a, &back).unwrap(), b);
    }

    #[test]
    fn index_keys_are_canonical_decimal() {
        for i in [0usize, 7, 10, 99, 100, 12345, 1 << 40] {
            assert_eq!(index_key(i), i.to_string());
            assert_eq!(parse_index(&index_key(i)), Some(i));
        }
    }

    #[test]
    fn array_patches_apply_in_any_key_order() {
        let a = j(json!([1, 2, 3, 4]));
        let d = JsonDelta::from_json(j(json!({"3": [40], "+": [5], "0": [10]})));
        assert_eq!(apply(&a, &d).unwrap(), j(json!([10, 2, 3, 40, 5])));
    }

    #[test]
    fn a_value_is_32_bytes_so_decoded_text_costs_at_most_16_times_its_size() {
        // The densest JSON, `[0,0,…]`, spends 2 bytes of text per value.
        assert!(std::mem::size_of::<Json>() <= 32);
    }

    /// The chain of shared arrays past its bound, dropped out of order:
    /// small and deterministic, so Miri (in `.ci/run`) checks the unsafe
    /// ownership of chained elements on every run.
    #[test]
    fn a_chain_past_its_bound_drops_soundly_in_any_order() {
        use serde_json::{json, Value};
        let long = "a heap string, too long to be stored inline";
        let mut model: Value = (0..CHAIN_FROM + 2)
            .map(|i| json!({"i": i, "s": format!("{long} {i}")}))
            .collect();
        let mut versions: Vec<(Json, Value)> = vec![(j(model.clone()), model.clone())];
        let mut generations = Vec::new();
        for step in 0..usize::from(MAX_ARRAY_CHAIN) + 3 {
            model[step % (CHAIN_FROM + 2)]["s"] = Value::from(format!("{long} step {step}"));
            if step % 4 == 3 {
                model.as_array_mut().unwrap().push(json!(step));
            }
            let prev = &versions.last().unwrap().0;
            let out = apply(prev, &diff(prev, &j(model.clone()))).unwrap();
            if let Json::Array(a) = &out {
                generations.push(a.generation);
            }
            versions.push((out, model.clone()));
        }
        // Chained up to the bound, then owned again.
        assert!(generations.contains(&MAX_ARRAY_CHAIN), "{generations:?}");
        assert!(
            generations.windows(2).any(|w| w[1] < w[0]),
            "{generations:?}"
        );
        for ix in [5usize, 0, 7, 2, 2, 0, 3, 1] {
            if ix < versions.len() {
                versions.remove(ix);
            }
            for (v, m) in &versions {
                assert_eq!(&v.to_value(), m);
            }
        }
    }

    #[test]
    fn equality_ignores_member_order() {
        let a: Json = serde_json::from_str(r#"{"a":1,"b":[true,null]}"#).unwrap();
        let b: Json = serde_json::from_str(r#"{"b":[true,null],"a":1}"#).unwrap();
        assert_eq!(a, b);
        assert!(diff(&a, &b).is_empty());
        let c: Json = serde_json::from_str(r#"{"b":[true,null],"a":1.0}"#).unwrap();
        assert_ne!(a, c);
    }

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            (-5i64..5).prop_map(serde_json::Value::from),
            (-1e3f64..1e3).prop_map(serde_json::Value::from),
            "[a-c+\\-0-9/~]{0,3}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-d+\\-0-9]{1,2}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// `b` from `a` by a few local edits, so that the pair shares structure
    /// the way consecutive game states do.
    fn mutate(v: &serde_json::Value, choices: &mut impl Iterator<Item = u8>) -> serde_json::Value {
        use serde_json::Value;
        let c = choices.next().unwrap_or(0);
        match v {
            Value::Object(m) if !c.is_multiple_of(4) => {
                let mut m = m.clone();
                let keys: Vec<String> = m.keys().cloned().collect();
                if let Some(k) = keys.get(usize::from(c) % keys.len().max(1)) {
                    let nv = mutate(&m[k], choices);
                    m[k] = nv;
                }
                if c.is_multiple_of(7) {
                    m.insert(format!("n{c}"), Value::from(c));
                }
                if c.is_multiple_of(11) {
                    if let Some(k) = keys.first() {
                        m.shift_remove(k);
                    }
                }
                Value::Object(m)
            }
            Value::Array(a) if !c.is_multiple_of(4) => {
                let mut a = a.clone();
                if !a.is_empty() {
                    let i = usize::from(c) % a.len();
                    a[i] = mutate(&a[i], choices);
                }
                match c % 5 {
                    0 => a.push(Value::from(c)),
                    1 => {
                        a.pop();
                    }
                    _ => {}
                }
                Value::Array(a)
            }
            _ => Value::from(u64::from(c)),
        }
    }

    /// Every subtree the delta does not reach is the base's own allocation.
    fn assert_shared(base: &Json, delta: &Json, out: &Json) -> Result<(), TestCaseError> {
        match (delta, base, out) {
            (Json::Object(p), _, _) if p.is_empty() => prop_assert!(base.ptr_eq(out)),
            (Json::Object(p), Json::Object(bm), Json::Object(om)) => {
                for (k, bv) in bm.iter() {
                    match (p.get(k), om.get(k)) {
                        (None, Some(ov)) => prop_assert!(bv.ptr_eq(ov), "member {k} copied"),
                        (Some(sub), Some(ov)) => assert_shared(bv, sub, ov)?,
                        (_, None) => {}
                    }
                }
            }
            (Json::Object(p), Json::Array(ba), Json::Array(oa)) => {
                for (i, (bv, ov)) in ba.iter().zip(oa.iter()).enumerate() {
                    match p.get(i.to_string().as_str()) {
                        None => prop_assert!(bv.ptr_eq(ov), "element {i} copied"),
                        Some(sub) => assert_shared(bv, sub, ov)?,
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The word-wise short-string comparison agrees with byte
        /// equality at every length, including strings that differ in
        /// one byte only (in the middle, where the overlapping words meet).
        #[test]
        fn str_eq_is_byte_equality(a in "[ab]{0,40}", flip in any::<prop::sample::Index>()) {
            let x = SmolStr::new(&a);
            prop_assert!(str_eq(&x, &SmolStr::new(&a)));
            if !a.is_empty() {
                let i = flip.index(a.len());
                let mut bytes = a.clone().into_bytes();
                bytes[i] = if bytes[i] == b'a' { b'b' } else { b'a' };
                let y = SmolStr::new(String::from_utf8(bytes).unwrap());
                prop_assert!(!str_eq(&x, &y));
            }
            let shorter = SmolStr::new(&a[..a.len().saturating_sub(1)]);
            prop_assert_eq!(str_eq(&x, &shorter), a.is_empty());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn apply_of_diff_gives_b_for_random_json(a in arb_json(), b in arb_json()) {
            let (ja, jb) = (j(a), j(b));
            let d = diff(&ja, &jb);
            let out = apply(&ja, &d).unwrap();
            prop_assert_eq!(&out, &jb);
            prop_assert_eq!(out.to_value(), jb.to_value());
            assert_shared(&ja, &d.to_json(), &out)?;
        }

        #[test]
        fn apply_of_diff_gives_b_for_nearby_states_and_shares_the_rest(
            a in arb_json(), edits in prop::collection::vec(any::<u8>(), 1..12),
        ) {
            let b = mutate(&a, &mut edits.into_iter());
            let (ja, jb) = (j(a), j(b));
            let d = diff(&ja, &jb);
            // Through the wire: text and back.
            let text = serde_json::to_string(&d).unwrap();
            let d2: JsonDelta = serde_json::from_str(&text).unwrap();
            let out = apply(&ja, &d2).unwrap();
            prop_assert_eq!(&out, &jb);
            assert_shared(&ja, &d2.to_json(), &out)?;
            // The base is untouched.
            prop_assert_eq!(diff(&ja, &out).is_empty(), ja == jb);
        }

        #[test]
        fn a_json_map_behaves_as_an_ordered_map_small_or_indexed(
            ops in prop::collection::vec((any::<bool>(), 0u8..40, any::<i8>()), 0..200),
        ) {
            let mut m = JsonMap::new();
            let mut model: Vec<(String, i8)> = Vec::new();
            for (insert, k, v) in ops {
                let key = format!("k{k}");
                if insert {
                    let old = m.insert(SmolStr::new(&key), Json::Number(v.into()));
                    match model.iter_mut().find(|(mk, _)| *mk == key) {
                        Some(e) => { prop_assert_eq!(old, Some(Json::Number(e.1.into()))); e.1 = v; }
                        None => { prop_assert!(old.is_none()); model.push((key, v)); }
                    }
                } else {
                    let old = m.shift_remove(&key);
                    let at = model.iter().position(|(mk, _)| *mk == key);
                    prop_assert_eq!(old.is_some(), at.is_some());
                    if let Some(i) = at { model.remove(i); }
                }
                prop_assert_eq!(m.len(), model.len());
            }
            let keys: Vec<&str> = m.keys().map(|k| k.as_str()).collect();
            let want: Vec<&str> = model.iter().map(|(k, _)| k.as_str()).collect();
            prop_assert_eq!(keys, want);
            for (k, v) in &model {
                prop_assert_eq!(m.get(k), Some(&Json::Number((*v).into())));
            }
            prop_assert!(m.get("absent").is_none());
        }

        #[test]
        fn apply_of_diff_gives_b_for_wide_objects(
            a in prop::collection::btree_map("[a-z]{1,2}", any::<i8>(), 0..60),
            b in prop::collection::btree_map("[a-z]{1,2}", any::<i8>(), 0..60),
        ) {
            let to = |m: std::collections::BTreeMap<String, i8>| {
                Json::from(serde_json::Value::Object(m.into_iter().map(|(k, v)| (k, v.into())).collect()))
            };
            let (ja, jb) = (to(a), to(b));
            let d = diff(&ja, &jb);
            let out = apply(&ja, &d).unwrap();
            prop_assert_eq!(&out, &jb);
            assert_shared(&ja, &d.to_json(), &out)?;
        }

        /// Long (heap) strings and nested containers, copied by apply and
        /// by map clones and dropped again: every owner counted right.
        #[test]
        fn copies_share_heap_strings_and_containers_soundly(
            a in arb_json(),
            long in "[a-z]{24,40}",
            edits in prop::collection::vec(any::<u8>(), 1..8),
        ) {
            let wrap = |v: serde_json::Value| serde_json::json!({
                "long": long.clone(), "list": [long.clone(), v.clone(), {"k": long.clone()}], "v": v,
            });
            let b = mutate(&wrap(a.clone()), &mut edits.into_iter());
            let (ja, jb) = (j(wrap(a)), j(b));
            let copy = ja.as_object().unwrap().clone();
            let d = diff(&ja, &jb);
            let out = apply(&ja, &d).unwrap();
            drop(copy);
            prop_assert_eq!(&out, &jb);
            prop_assert_eq!(ja.get("long").unwrap().as_str(), Some(long.as_str()));
            drop(out);
            let back = ja.to_value();
            prop_assert_eq!(back["list"][0].as_str(), Some(long.as_str()));
        }

        /// A delta made by `diff` (held typed) and the same delta read
        /// back from its text mean the same on any value, not only on the
        /// one it was made against: the same result or the same error.
        #[test]
        fn a_made_delta_and_its_text_agree_on_any_base(
            a in arb_json(), edits in prop::collection::vec(any::<u8>(), 1..12), c in arb_json(),
        ) {
            let b = mutate(&a, &mut edits.clone().into_iter());
            let (ja, jb, jc) = (j(a), j(b), j(c));
            let d = diff(&ja, &jb);
            let wire = JsonDelta::from_json(d.to_json());
            prop_assert_eq!(&wire, &d);
            prop_assert_eq!(apply(&jc, &d), apply(&jc, &wire));
            // A near neighbour of the base: mostly the fast paths, with
            // hints that miss.
            let jn = j(mutate(&ja.to_value(), &mut edits.into_iter().rev()));
            prop_assert_eq!(apply(&jn, &d), apply(&jn, &wire));
        }

        /// Long arrays changed again and again: each copy shares its
        /// unchanged elements with the one before (a chain, cut every
        /// `MAX_ARRAY_CHAIN` copies); versions dropped in any order leave
        /// every other version whole.
        #[test]
        fn chained_arrays_stay_whole_whatever_is_dropped(
            len in 16usize..40,
            long in "[a-z]{24,30}",
            steps in prop::collection::vec((any::<u8>(), any::<u8>(), 0u8..4), 1..24),
            drops in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
        ) {
            use serde_json::{json, Value};
            let item = |i: usize, tag: u8| json!({"i": i, "s": format!("{long}{tag}"), "l": [tag, long.clone()]});
            let mut model = Value::Array((0..len).map(|i| item(i, 0)).collect());
            let mut versions: Vec<(Json, Value)> = vec![(j(model.clone()), model.clone())];
            let mut chained = false;
            for (at, tag, kind) in steps {
                let a = model.as_array_mut().unwrap();
                let i = usize::from(at) % a.len();
                match kind {
                    0 => a[i] = item(i, tag),
                    1 => a[i]["s"] = Value::from(format!("{long}{tag}")),
                    2 if a.len() > 1 => { a.pop(); }
                    _ => a.push(item(a.len(), tag)),
                }
                let prev = &versions.last().unwrap().0;
                let next_json = j(model.clone());
                let d = diff(prev, &next_json);
                let out = apply(prev, &d).unwrap();
                prop_assert_eq!(&out, &next_json);
                if let Json::Array(a) = &out {
                    prop_assert!(a.generation <= MAX_ARRAY_CHAIN);
                    chained |= a.parent.is_some();
                }
                versions.push((out, model.clone()));
            }
            prop_assert!(chained || len < 17, "no copy was chained");
            for ix in drops {
                if versions.len() > 1 {
                    versions.remove(ix.index(versions.len()));
                }
                for (v, m) in &versions {
                    prop_assert_eq!(&v.to_value(), m);
                }
            }
        }

        #[test]
        fn apply_never_panics_on_any_delta(a in arb_json(), d in arb_json()) {
            let _ = apply(&j(a), &JsonDelta::from_json(j(d)));
        }
    }
}
