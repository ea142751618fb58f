//! Copies that are clones: a value's shared parts gain an owner, then the
//! value is copied bitwise (read and written whole).

use crate::Json;
use serde_json::Number;
use smol_str::SmolStr;
use std::mem::ManuallyDrop;
use std::sync::Arc;

// A bitwise copy of a `Json` whose shared parts gained an owner is a clone
// (see `add_owner`): that needs every other payload to be plain data.
const _: () = assert!(!std::mem::needs_drop::<Number>());

/// Adds one owner to what `v` shares (its `Arc`, a heap string's `Arc`),
/// so that a bitwise copy of `v` is a clone. Copies made so (arrays and
/// member lists copied whole) avoid the derived clone, which moves each
/// value field by field through the stack: at the odd offsets of the
/// inline-string and bool payloads that stalls on every element (store
/// forwarding), about 30 ns an element of an array of objects.
///
/// On its own this only leaks; it is sound to copy `v` bitwise once per
/// call, and each such copy must be dropped at most once.
#[inline(always)]
pub(crate) fn add_owner(v: &Json) {
    match v {
        Json::Object(m) => std::mem::forget(Arc::clone(m)),
        Json::Array(a) => std::mem::forget(Arc::clone(a)),
        Json::String(s) => add_key_owner(s),
        Json::Null | Json::Bool(_) | Json::Number(_) => {}
    }
}

/// [`add_owner`] for a string: a heap string's clone is a clone of its
/// `Arc<str>`; an inline or static one owns nothing.
#[inline(always)]
pub(crate) fn add_key_owner(s: &SmolStr) {
    if s.is_heap_allocated() {
        std::mem::forget(s.clone());
    }
}

/// A clone of `v` as a bitwise copy once its shared parts gained an owner.
#[inline(always)]
pub(crate) fn share(v: &Json) -> ManuallyDrop<Json> {
    add_owner(v);
    // SAFETY: `v` gained the owner this copy becomes (`add_owner`), and
    // every other payload of a `Json` is plain data, so the copy is a clone.
    ManuallyDrop::new(unsafe { std::ptr::read(v) })
}

/// A clone of `v`, read and written whole, never field by field (a value
/// written in pieces and then moved whole stalls the load that moves it,
/// store forwarding failing at the piece boundaries).
#[inline(always)]
pub fn shared(v: &Json) -> Json {
    ManuallyDrop::into_inner(share(v))
}

/// [`shared`] for a member name.
#[inline(always)]
pub fn shared_key(k: &SmolStr) -> SmolStr {
    add_key_owner(k);
    // SAFETY: `k` gained the owner this copy becomes: a heap string's
    // `Arc` was cloned and forgotten; an inline or static one owns nothing.
    unsafe { std::ptr::read(k) }
}

/// Appends the value `make` builds, built in its place: a value assembled
/// first and then moved stalls on the loads that move it (store forwarding
/// fails where the pieces it was written in meet), and a plain `push`
/// builds it before its capacity check.
#[inline(always)]
pub fn push_with<T>(out: &mut Vec<T>, make: impl FnOnce() -> T) {
    out.reserve(1);
    let len = out.len();
    // SAFETY: there is room for one more (reserved above), and `make`
    // cannot reach `out` (borrowed here); the slot past the length is
    // written once, then counted. Should `make` panic, nothing was written
    // and the length is unchanged.
    unsafe {
        out.as_mut_ptr().add(len).write(make());
        out.set_len(len + 1);
    }
}
