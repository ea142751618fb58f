//! The members of a JSON object, and their copy with a few values changed.

use crate::owners::{add_key_owner, add_owner};
use crate::value::str_eq_str;
use crate::{Json, Patched};
use smol_str::SmolStr;

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
        JsonMap {
            entries: copy_entries(&self.entries, Patched::new(), 0),
            index: self.index.clone(),
        }
    }
}

/// `entries` with the `patched` values in place, room for `extra` more:
/// one allocation, every other entry copied whole after gaining an owner.
///
/// # Panics
/// If the patched positions are not increasing and below `entries.len()`.
#[inline(always)]
fn copy_entries(
    entries: &[(SmolStr, Json)],
    patched: Patched,
    extra: usize,
) -> Vec<(SmolStr, Json)> {
    let n = entries.len();
    // The copy below relies on it: checked whatever the build.
    assert!(
        patched.windows(2).all(|w| w[0].0 < w[1].0) && patched.last().is_none_or(|(i, _)| *i < n),
        "patched positions must be increasing and below the member count"
    );
    let mut out: Vec<(SmolStr, Json)> = Vec::with_capacity(n + extra);
    let mut p = patched.iter().map(|(i, _)| *i).peekable();
    for (i, (k, v)) in entries.iter().enumerate() {
        add_key_owner(k);
        if p.next_if_eq(&i).is_none() {
            add_owner(v);
        }
    }
    // SAFETY: the capacity is at least `n`; every key, and every value not
    // at a patched position, gained the owner its bitwise copy becomes. The
    // copies of patched values gained none: they are overwritten (each
    // once, at distinct positions below `n`, asserted above) without being
    // dropped, and only then is the length set.
    unsafe {
        std::ptr::copy_nonoverlapping(entries.as_ptr(), out.as_mut_ptr(), n);
        for (i, v) in patched {
            std::ptr::write(&mut (*out.as_mut_ptr().add(i)).1, v);
        }
        out.set_len(n);
    }
    out
}

impl JsonMap {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The position of member `key`.
    #[inline]
    pub fn get_index_of(&self, key: &str) -> Option<usize> {
        match &self.index {
            Some(ix) => ix.get(key).copied(),
            None => self.entries.iter().position(|(k, _)| str_eq_str(k, key)),
        }
    }

    #[inline]
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.get_index_of(key).map(|i| &self.entries[i].1)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        self.get_index_of(key).map(|i| &mut self.entries[i].1)
    }

    #[inline]
    pub fn contains_key(&self, key: &str) -> bool {
        self.get_index_of(key).is_some()
    }

    /// The member at position `i`.
    #[inline]
    pub fn get_index(&self, i: usize) -> Option<(&SmolStr, &Json)> {
        self.entries.get(i).map(|(k, v)| (k, v))
    }

    /// The first member.
    #[inline]
    pub fn first(&self) -> Option<(&SmolStr, &Json)> {
        self.entries.first().map(|(k, v)| (k, v))
    }

    /// The last member.
    #[inline]
    pub fn last(&self) -> Option<(&SmolStr, &Json)> {
        self.entries.last().map(|(k, v)| (k, v))
    }

    /// Sets a member; an existing one keeps its position. Returns the old value.
    pub fn insert(&mut self, key: SmolStr, value: Json) -> Option<Json> {
        if let Some(i) = self.get_index_of(&key) {
            return Some(std::mem::replace(&mut self.entries[i].1, value));
        }
        self.push_new(key, value);
        None
    }

    /// Appends a member the caller knows is not there yet (a delta's
    /// members, built from distinct names): no search. A name that is
    /// there already would be listed twice.
    pub fn push_new(&mut self, key: SmolStr, value: Json) {
        debug_assert!(!self.contains_key(&key), "{key} is a member already");
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
        let i = self.get_index_of(key)?;
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

    #[inline]
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&SmolStr, &Json)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    #[inline]
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &SmolStr> {
        self.entries.iter().map(|(k, _)| k)
    }

    #[inline]
    pub fn values(&self) -> impl ExactSizeIterator<Item = &Json> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// A copy with the `patched` values (at increasing member positions)
    /// in place and room for `extra` more members: one allocation, the
    /// other members shared with this map.
    ///
    /// # Panics
    /// If the patched positions are not increasing and below [`len`](Self::len).
    pub fn patched(&self, patched: Patched, extra: usize) -> JsonMap {
        JsonMap {
            entries: copy_entries(&self.entries, patched, extra),
            index: self.index.clone(),
        }
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
