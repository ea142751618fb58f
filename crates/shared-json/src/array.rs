//! The elements of a JSON array, and the copy of a long one that shares
//! its unchanged elements with it.

use crate::owners::{add_owner, share};
use crate::{Json, Patched};
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// Arrays at least this long, copied by [`JsonArray::patched`], share the
/// unchanged elements with the array they came from instead of taking an
/// owner of each (see [`JsonArray`]); shorter ones are copied outright.
pub const CHAIN_FROM: usize = 16;

/// How many arrays may be chained so, each keeping the one before alive:
/// the next copy owns all its elements again, so a chain keeps at most
/// this many earlier versions (and what only they hold) in memory.
pub const MAX_ARRAY_CHAIN: u8 = 8;

/// The elements of a [`Json`] array, read as a slice.
///
/// An array made by [`JsonArray::patched`] from a long one keeps that one
/// alive and holds bitwise copies of its unchanged elements, owned by it
/// (or by the arrays before it): copying them changes no reference count,
/// and neither does dropping them. Taking an owner of every element is
/// most of what an immutable apply of a few changes to a long array costs
/// (an atomic increment each, and a decrement each when it is dropped).
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
    pub(crate) fn from_vec(v: Vec<Json>) -> Self {
        // Collected in place (the list's own allocation, no cast needed).
        let items: Box<[ManuallyDrop<Json>]> = v.into_iter().map(ManuallyDrop::new).collect();
        JsonArray {
            items,
            parent: None,
            owned: Box::default(),
            owned_from: 0,
            generation: 0,
        }
    }

    /// Arrays before this one in its chain (0: it owns every element).
    #[inline]
    pub fn generation(&self) -> u8 {
        self.generation
    }

    /// Whether it shares unchanged elements with the array it was made
    /// from (and keeps that one alive).
    #[inline]
    pub fn is_chained(&self) -> bool {
        self.parent.is_some()
    }

    /// `a[..truncate]` with the `patched` elements replaced, then `append`:
    /// one copy of the elements. From a long array, the unchanged elements
    /// are shared with it (the new array keeps it alive); otherwise each
    /// gains an owner.
    ///
    /// # Panics
    /// If `truncate` is past `a`'s end, or the patched positions are not
    /// increasing and below `truncate` (a caller's mistake: a delta's
    /// positions are checked against the array before they get here).
    pub fn patched<'v>(
        a: &Arc<JsonArray>,
        truncate: usize,
        patched: Patched,
        append: impl ExactSizeIterator<Item = &'v Json>,
    ) -> Arc<JsonArray> {
        // The copy below relies on both: checked whatever the build.
        assert!(truncate <= a.len(), "truncated past the array's end");
        assert!(
            patched.windows(2).all(|w| w[0].0 < w[1].0)
                && patched.last().is_none_or(|(i, _)| *i < truncate),
            "patched positions must be increasing and below the new length"
        );
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
        // SAFETY: `truncate <= a.len()` (asserted above) and the capacity is
        // at least `truncate`. Each copy is either owned (it gained its
        // owner above) or, in a chain, owned by `a`, which the new array
        // keeps alive; the copies at patched positions (which gained no
        // owner) are overwritten below, and assigning to a `ManuallyDrop`
        // drops nothing.
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
}

impl std::ops::Deref for JsonArray {
    type Target = [Json];
    #[inline]
    fn deref(&self) -> &[Json] {
        // SAFETY: `ManuallyDrop<Json>` is `repr(transparent)` over `Json`,
        // so the slices have the same layout; the borrow is shared.
        unsafe { &*(&*self.items as *const [ManuallyDrop<Json>] as *const [Json]) }
    }
}

impl Drop for JsonArray {
    fn drop(&mut self) {
        let items = &mut self.items;
        if self.parent.is_none() {
            for v in items.iter_mut() {
                // SAFETY: without a parent every element is owned here, and
                // each is dropped once, here.
                unsafe { ManuallyDrop::drop(v) };
            }
        } else {
            // `owned` holds distinct positions below `owned_from` (sorted,
            // from `patched`'s checked positions).
            for &i in self.owned.iter() {
                // SAFETY: position `i` was written with a value of this
                // array's own; the others below `owned_from` belong to the
                // parent's chain, which drops them.
                unsafe { ManuallyDrop::drop(&mut items[i as usize]) };
            }
            for v in items[self.owned_from..].iter_mut() {
                // SAFETY: the appended elements gained their owner (`share`)
                // and are owned here alone.
                unsafe { ManuallyDrop::drop(v) };
            }
        }
    }
}
