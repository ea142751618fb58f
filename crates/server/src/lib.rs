//! The hostwire server: HTTP + WebSocket around the sans-IO protocol crates.

pub mod check;
pub mod metrics;
mod outbound;
pub mod relay;
pub mod server;
pub mod store_writer;
