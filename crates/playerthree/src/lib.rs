//! hostwire-playerthree: PlayerThree protocol 1, sans-IO.
//!
//! - [`protocol`]: `PROTOCOL_VERSION`, `MSG`, `MAX_MESSAGE_BYTES`,
//!   `TOKEN_RE`, and every message shape (`ClientMsg`, `ServerMsg`,
//!   `ViewMessage`, `ObserverFrame`, `Principal`, …).
//! - [`decode`]: the strict decoder of untrusted inbound messages.
//! - [`tokens`]: tokens and the principal each one encodes.
//! - [`view`]: team view streams and [`apply_view`].
//! - [`observer`]: delayed observer frames.
//! - [`game`]: the [`Game`] trait and the closed-vocabulary guard.
//! - [`host`]: [`Match`], the match host state machine.
//! - [`durable`]: [`durable::DurableMatch`], a match with its durability
//!   rules and timers, as a server drives it.
//! - [`demo`]: Ridge, a small two-team game with fog of war.
//!
//! Nothing here opens a socket, spawns a task or reads a clock: the server
//! passes `now` in milliseconds and performs the [`host::Output`]s.

// No unsafe code here: what needs it lives in hostwire-core, where Miri
// checks it.
#![forbid(unsafe_code)]

pub mod decode;
pub mod demo;
pub mod durable;
pub mod game;
pub mod host;
pub mod observer;
pub mod protocol;
pub mod tokens;
pub mod view;

pub use decode::{decode_inbound, DecodeError, Inbound};
pub use game::{ControlMethod, Game, GameError, GameFactory, Perspective, SeatSpec, Vocabulary};
pub use host::{ConnId, Match, MatchConfig, Output, Record};
/// The structural JSON delta (`playerthree/delta`), from hostwire-core.
pub use hostwire_core::delta::{Json, JsonDelta};
pub use protocol::{
    ClientMsg, ObserverFrame, ObserverGrant, ObserverRequest, Principal, ServerErrorCode,
    ServerMsg, ViewMessage, WatchMsg, MAX_MESSAGE_BYTES, PROTOCOL_VERSION, TOKEN_RE,
};
pub use view::{apply_view, ViewState};
