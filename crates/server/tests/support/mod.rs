//! What every integration test of the server shares: one way to start a
//! server on 127.0.0.1:0 (manual clock, real SQLite file in a temporary
//! directory), one WebSocket client, one HTTP helper, and each protocol's
//! own vocabulary on top of them.
//!
//! Both test binaries (`it` and `memory`) include this module, so each
//! uses only part of it.
#![allow(dead_code, unused_imports)]

pub mod ggui;
pub mod http;
pub mod playerthree;
pub mod process;
pub mod relay;
pub mod server;
pub mod session;
pub mod sockets;
pub mod ws;
