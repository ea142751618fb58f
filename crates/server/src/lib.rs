//! The hostwire server: HTTP + WebSocket around the sans-IO protocol crates.
//!
//! One module per protocol mounts its routes ([`relay`] for the Memizy
//! relay, [`sessions`] for hosted Memizy sessions, [`ggui`],
//! [`playerthree`]); shared
//! infrastructure sits beside them and knows no protocol ([`http`],
//! [`metrics`], the outbound queue, [`store_writer`]); [`app`] puts them
//! together and [`cli`] is the command line.

// No unsafe code here: what needs it lives in hostwire-core, where Miri
// checks it, or in well-kept crates (`rlimit` for the open-file limit).
#![forbid(unsafe_code)]

pub mod app;
pub mod backup;
pub mod blocking;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod docs;
pub mod ggui;
pub mod http;
pub mod metrics;
mod outbound;
pub mod playerthree;
pub mod relay;
pub mod sessions;
pub mod store_writer;
pub mod unit;
pub mod ws;
