//! hostwire-shared-json: immutable JSON values whose strings, arrays and
//! objects are shared.
//!
//! [`Json`] keeps its strings, arrays and objects behind `Arc`: cloning one
//! is a reference-count bump, never a copy. A structural delta
//! (`hostwire_core::delta`) builds a new value by copying only the
//! containers on the paths it touches; [`JsonArray::patched`] and
//! [`JsonMap::patched`] are those copies.
//!
//! The copies manage reference counts by hand (bitwise copies of values
//! that gained an owner first, and long arrays that share their unchanged
//! elements with the array they came from): that is the only unsafe code
//! of the protocol crates, kept here behind a safe API so that Miri can
//! check it on its own (`.ci/run`). Every `unsafe` block says why it is
//! sound in a `// SAFETY:` comment; clippy refuses one without.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod array;
mod map;
mod owners;
mod value;

pub use array::{JsonArray, CHAIN_FROM, MAX_ARRAY_CHAIN};
pub use map::{json_map, JsonMap, JSON_MAP_INDEX_FROM};
pub use owners::{push_with, shared, shared_key};
pub use value::Json;

/// The new values of a container's changed members or elements, by
/// position (sorted, distinct): inline for the few a game state's tick
/// changes.
pub type Patched = smallvec::SmallVec<[(usize, Json); 4]>;

#[cfg(test)]
mod tests;
