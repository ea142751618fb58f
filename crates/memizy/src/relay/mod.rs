//! The Memizy relay protocol 1, sans-IO: frames, a connection's rules and a
//! room's rules. The server drives them with sockets, timers and a store.

pub mod connection;
pub mod protocol;
pub mod room;

pub use connection::{ConnId, ConnStep, ConnectionState};
pub use protocol::*;
pub use room::{BundleMeta, PlayerRecord, Room, RoomChange, RoomInfo, RoomOutput, RoomRecord};
