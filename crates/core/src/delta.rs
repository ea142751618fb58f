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

use hostwire_shared_json::{push_with, shared, shared_key, Patched};
use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use smallvec::SmallVec;
use smol_str::SmolStr;
use std::fmt;
use std::sync::Arc;

// The value type and its hand-counted copies live in their own crate, with
// all of the unsafe code the delta needs, where Miri checks it on its own.
pub use hostwire_shared_json::{
    json_map, Json, JsonArray, JsonMap, JSON_MAP_INDEX_FROM, MAX_ARRAY_CHAIN,
};

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
            push_with(out, || Node {
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

/// Equality as a plain walk (no delta built on the way): the test run
/// first on every member, since most members of consecutive states are
/// unchanged. Same member order is walked in step; a name is looked up
/// only where the orders differ.
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            Arc::ptr_eq(x, y)
                || (x.len() == y.len()
                    && x.iter().zip(y.iter()).all(|((ka, va), (kb, vb))| {
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
            shared(x.last().map(|e| e.1), y.last().map(|e| e.1))
                || shared(x.first().map(|e| e.1), y.first().map(|e| e.1))
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
    push_with(out, || Node {
        key,
        op: Op::Members {
            children: 0,
            span: 0,
        },
    });
    let mut n = 0u32;
    let mut kept = 0usize;
    for (i, (k, va)) in x.iter().enumerate() {
        let vb = match y.get_index(i) {
            Some((kb, vb)) if str_eq(kb, k) => Some(vb),
            _ => y.get(k),
        };
        let member = || Key::Member {
            name: shared_key(k),
            at: count(i).min(ADDED - 1),
        };
        match vb {
            None => {
                push_with(out, || Node {
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
                push_with(out, || Node {
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
    push_with(out, || Node {
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
        push_with(out, || Node {
            key,
            op: Op::Replace(shared(whole)),
        });
        return true;
    }
    let truncate = (y.len() < x.len()).then_some(y.len());
    for v in &y[common..] {
        push_with(out, || Node {
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
            .get_index(*at as usize)
            .filter(|(k, _)| str_eq(k, name))
            .map(|(_, v)| (*at as usize, v));
        let found = hinted.or_else(|| {
            let i = o.get_index_of(name)?;
            o.get_index(i).map(|(_, v)| (i, v))
        });
        match (found, &nodes[c].op) {
            // A removal shifts the members after it: the general path.
            (_, Op::Remove) => return apply_object(o, members_as_wire(nodes, p, n)),
            (Some((i, base)), _) => {
                let v = apply_node(base, nodes, c).map_err(under(name))?;
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
    let mut out = Arc::new(o.patched(patched, added.len()));
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
    Ok(Json::Array(JsonArray::patched(
        a, truncate, patched, values,
    )))
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
    Ok(Json::Array(JsonArray::patched(
        a,
        truncate,
        patched,
        append.iter(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostwire_shared_json::CHAIN_FROM;
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

    /// The chain of shared arrays past its bound, made by `apply` and
    /// dropped out of order (hostwire-shared-json's own tests, run under
    /// Miri, drive the chain directly).
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
                generations.push(a.generation());
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
            let (mut chained, mut changed) = (false, false);
            for (at, tag, kind) in steps {
                let a = model.as_array_mut().unwrap();
                let i = usize::from(at) % a.len();
                match kind {
                    0 => a[i] = item(i, tag),
                    1 => a[i]["s"] = Value::from(format!("{long}{tag}")),
                    2 if a.len() > 1 => { a.pop(); }
                    _ => a.push(item(a.len(), tag)),
                }
                // A step may set an element to what it was: no copy then.
                changed |= model != versions.last().unwrap().1;
                let prev = &versions.last().unwrap().0;
                let next_json = j(model.clone());
                let d = diff(prev, &next_json);
                let out = apply(prev, &d).unwrap();
                prop_assert_eq!(&out, &next_json);
                if let Json::Array(a) = &out {
                    prop_assert!(a.generation() <= MAX_ARRAY_CHAIN);
                    chained |= a.is_chained();
                }
                versions.push((out, model.clone()));
            }
            prop_assert!(chained || len < 17 || !changed, "no copy was chained");
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
