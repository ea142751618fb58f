//! The socket driver's limits and closes: the close codes it sends, its
//! timers and buffers, and [`Config`], one protocol's choices for its sockets.

use crate::outbound::Close;
use std::time::Duration;

/// 1000: the connection did what it was for.
pub const CLOSE_NORMAL: u16 = 1000;
/// 1001: the server is going away, or the peer went silent.
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// 1002: a frame that breaks RFC 6455's framing rules.
pub const CLOSE_PROTOCOL_ERROR: u16 = 1002;
/// 1007: a text frame that is not UTF-8 (RFC 6455 §7.4.1).
pub const CLOSE_INVALID_DATA: u16 = 1007;
/// 1009: a message over the frame limit.
pub const CLOSE_MESSAGE_TOO_BIG: u16 = 1009;
/// 1013: the peer does not read fast enough (its outbound queue is full).
pub const CLOSE_TOO_SLOW: u16 = 1013;

/// The close every socket gets when the server shuts down.
pub const SHUTTING_DOWN: Close = (CLOSE_GOING_AWAY, "server shutting down");
/// The close of a socket that sent nothing (pings are not activity) for the
/// idle timeout.
pub const IDLE: Close = (CLOSE_GOING_AWAY, "idle timeout");

/// How long a closing connection may take to send what was queued before
/// its Close frame and the Close frame itself; past it the socket is
/// dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// After the server's Close frame is sent, how long the server keeps
/// reading (and discarding) while it waits for the peer's Close: closing
/// TCP with unread input would reset the connection and could destroy the
/// frames still on their way to the peer.
pub const CLOSE_LINGER: Duration = Duration::from_secs(2);
/// Server pings keep idle connections alive behind proxies.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// tungstenite's write buffer: frames are written once this much is
/// buffered (or on flush).
pub const WRITE_BUFFER: usize = 16 * 1024;
/// tungstenite's read buffer, held by every connection for its life (its
/// default, 128 KiB, is zero-filled before every read): what it takes at a
/// time from what one system call read into the thread's buffer
/// ([`SCRATCH_BYTES`](super::SCRATCH_BYTES)), so a larger frame
/// costs copies, not system calls.
pub const READ_BUFFER: usize = 256;

/// One protocol's choices for its sockets.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The largest message (and frame) the WebSocket layer reads; beyond it
    /// the reader reports [`Event::Oversized`](super::Event::Oversized) and the connection closes
    /// with [`Config::oversized`].
    pub max_message_bytes: usize,
    pub read_buffer: usize,
    pub write_buffer: usize,
    /// Bytes the WebSocket layer may hold unsent (must exceed the largest
    /// outbound frame plus [`Config::write_buffer`]): a reply to a ping that
    /// does not fit replaces the one waiting.
    pub max_unsent_bytes: usize,
    /// A socket that sends nothing but pings for this long is closed
    /// ([`IDLE`]).
    pub idle_timeout: Duration,
    pub ping_interval: Duration,
    /// The outbound queue's bound in frames.
    pub outbound_frames: usize,
    /// The outbound queue's bound in bytes.
    pub outbound_bytes: usize,
    pub close_grace: Duration,
    pub close_linger: Duration,
    /// The close of a connection whose outbound queue is full.
    pub too_slow: Close,
    /// The close after an oversized message.
    pub oversized: Close,
    /// Whether a frame for an idle connection is written at once by the
    /// task that sends it ([`Outbound::send`](super::Outbound::send)) rather than by the
    /// connection's writer: right for many small units that each write to
    /// their own few sockets (relay rooms); wrong where one task serves
    /// every connection, whose writes would then all run on it.
    pub direct_write: bool,
}

impl Config {
    /// The defaults every protocol starts from: a protocol sets its frame
    /// limit, queue bounds and unsent-bytes cap.
    pub const fn new(max_message_bytes: usize) -> Config {
        Config {
            max_message_bytes,
            read_buffer: READ_BUFFER,
            write_buffer: WRITE_BUFFER,
            // Twice the largest message plus slack, as the relay has it.
            max_unsent_bytes: 2 * max_message_bytes + 64 * 1024,
            idle_timeout: Duration::from_secs(90),
            ping_interval: PING_INTERVAL,
            outbound_frames: 1024,
            outbound_bytes: 8 * 1024 * 1024,
            close_grace: CLOSE_GRACE,
            close_linger: CLOSE_LINGER,
            too_slow: (CLOSE_TOO_SLOW, "too slow: outbound queue full"),
            oversized: (CLOSE_MESSAGE_TOO_BIG, "frame too large"),
            direct_write: false,
        }
    }
}
