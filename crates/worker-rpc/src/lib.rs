//! hostwire-worker-rpc: worker RPC frames 1.0.0 between a host and an
//! isolated plugin worker: the codec (`parse_frame`, decoded borrowed, with
//! a lenient pass that still reads the id of a refused frame), error
//! envelopes with bounded cause chains, the rules of a connection as a
//! sans-IO [`PeerState`] (cancel, progress, credit-based streams, hello and
//! goodbye, timeouts on the caller's clock), and an async [`Peer`] that
//! drives it over any transport, where every call ends and every queue is
//! bounded.

// No unsafe code here: what needs it lives in hostwire-core, where Miri
// checks it.
#![forbid(unsafe_code)]

pub mod error;
pub mod frame;
pub mod peer;
pub mod state;
pub mod transport;

pub use error::{codes, RpcError};
pub use frame::{
    parse_frame, parse_frame_bytes, read_head, ErrorEnvelope, Frame, Kind, Outcome, Payload,
    PROTOCOL_VERSION,
};
pub use peer::{Call, CancelToken, Context, Peer, StreamReceiver, StreamSender};
pub use state::{Event, PeerConfig, PeerState, PeerStats, Side, Transmit};
pub use transport::{Inbound, Transport};
