//! hostwire-core: what every hostwire protocol needs.
//!
//! Nothing here does I/O or reads the wall clock directly: time comes in
//! through [`clock::Clock`], so every rule is testable with [`clock::ManualClock`].
//!
//! No unsafe code outside the JSON scan's SIMD: the delta's hand-counted
//! copies live in hostwire-shared-json, where Miri checks them.

#![deny(unsafe_code)]

pub mod clock;
pub mod delta;
pub mod json;
pub mod rate;
pub mod token;
pub mod version;

pub use clock::{Clock, ManualClock, SystemClock};
pub use delta::{Json, JsonDelta};
pub use json::{JsonError, JsonLimits};
pub use rate::{Coalescer, TokenBucket};
pub use token::Token;
pub use version::Version;
