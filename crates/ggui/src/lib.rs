//! hostwire-ggui: the ggui live channel (`draft-2026-08-19`), sans-IO.
//!
//! - [`frames`]: the wire types (envelopes, payloads, frames) and the
//!   builders that stamp `schemaVersion` exactly as the protocol's own.
//! - [`decode`]: untrusted client frames → typed frames or the protocol's
//!   error code with a message naming the field.
//! - [`validate`]: declared actions and their JSON Schemas, with
//!   `CONTRACT_VIOLATION` details.
//! - [`channel`]: the live-channel state machine: sessions, the event
//!   ledger, stream buffers, subscribe / ack / replay, the version
//!   handshake, tenancy, limits. It takes events and returns outputs; the
//!   server owns sockets, timers and the store.
//! - [`durable`]: the channel with its durability rules as one unit:
//!   writes handed out and answered, what waits for them held, group
//!   commit, refused writes taken back, idle sessions removed.
//! - [`hash`]: `content_hash` and `blueprint_key`.
//! - [`bridge`]: the agent bridge client as a request builder and a
//!   response parser.

// No unsafe code here: what needs it lives in hostwire-core, where Miri
// checks it.
#![forbid(unsafe_code)]

pub mod bridge;
pub mod buffer;
pub mod channel;
pub mod decode;
pub mod durable;
pub mod frames;
pub mod hash;
pub mod validate;

pub use channel::{
    Channel, ChannelConfig, ConnId, Output, Record, ValidatedAction, ValidationJob, VersionPolicy,
};
pub use decode::{decode_client_frame, parse_pending_envelope, ClientFrame, FrameError};
pub use frames::*;
pub use hash::{blueprint_key, canonicalize_contract, content_hash};
pub use validate::{ActionSpec, ContractViolation, ValidationResult};

/// The protocol version this crate speaks, advertised in subscribe acks.
pub const PROTOCOL_VERSION: &str = "draft-2026-08-19";
/// The forward-compatibility stamp builders put on envelopes.
pub const PROTOCOL_SCHEMA_VERSION: &str = PROTOCOL_VERSION;

/// ISO 8601 UTC with milliseconds (`2026-11-30T07:00:00.000Z`), the form
/// the protocol's timestamps take, from the caller's clock.
pub fn iso_timestamp(now_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(now_ms);
    humantime::format_rfc3339_millis(t).to_string()
}
