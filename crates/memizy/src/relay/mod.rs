//! The Memizy relay protocol 1, sans-IO: frames, a connection's rules and a
//! room's rules. The server drives them with sockets, timers and a store.

pub mod bundle;
mod by_id;
pub mod connection;
pub mod create;
pub mod durable;
pub mod protocol;
pub mod room;
#[cfg(test)]
mod sim;

pub use bundle::{parse_bundle, BundleError, BundleUpload};
pub use connection::{CloseWith, ConnId, ConnStep, ConnectionState};
pub use create::{choose_pin, RoomCreationLimit};
pub use durable::{
    Answer, Done, DurableRoom, Expiry, PendingWrite, PutOutcome, RoomCommand, WriteId,
};
pub use protocol::*;
pub use room::{
    AttachOutcome, BundleMeta, PlayerRecord, Room, RoomChange, RoomInfo, RoomOutput, RoomRecord,
};
