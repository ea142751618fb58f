//! The reading side of a connection: events in (each marks the socket
//! active for the registry's idle sweep), the WebSocket layer's refusals
//! of what the peer sent mapped to close codes (RFC 6455 violations:
//! 1007, 1002).

use super::config::{Config, CLOSE_INVALID_DATA, CLOSE_PROTOCOL_ERROR};
use super::sockets::Sockets;
use super::writer::Outbound;
use crate::outbound::Close;
use bytes::Bytes;
use std::future::poll_fn;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use tungstenite::{Message, Utf8Bytes};

/// What the reader got.
#[derive(Debug)]
pub enum Event {
    Text(Utf8Bytes),
    /// A binary message: each protocol says what it makes of one.
    Binary(Bytes),
    /// A message over [`Config::max_message_bytes`]: the protocol queues its
    /// answer; the connection then closes with [`Config::oversized`].
    Oversized,
    /// The connection is over: the peer closed or went, the connection was
    /// closed (idle, a violation of RFC 6455, its queue overflowed), or the
    /// socket failed. Nothing more is read; call [`Reader::finish`].
    End,
}

/// How the reading side ended, for [`Reader::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    Open,
    /// The server closed it (idle, a violation): what still comes is read
    /// and discarded while the close goes out.
    Closed,
    /// Nothing more can be read (the peer's Close came, or the stream
    /// ended or failed).
    Read,
    /// After an oversized message: close with the protocol's code.
    Oversized,
}

/// The reading side of one connection. It holds no timer: a frame or a
/// pong sets the socket's `active` flag, and the registry's sweep
/// ([`Sockets`], once a second for every socket) closes a socket silent
/// for its idle timeout and sends the pings. The socket it reads is in
/// [`Outbound`]'s allocation, shared with the writer.
pub struct Reader {
    pub(super) out: Outbound,
    pub(super) end: End,
    pub(super) registered: (Sockets, usize),
}

/// How the WebSocket layer's refusal of what the client sent ends the
/// connection.
enum ReadError {
    Oversized,
    /// Not WebSocket as RFC 6455 has it: closed with this code and reason.
    Violation(Close),
    /// The socket failed or ended: nothing can be sent.
    Gone,
}

fn read_error(e: tungstenite::Error) -> ReadError {
    use tungstenite::error::ProtocolError as P;
    match e {
        tungstenite::Error::Capacity(_) => ReadError::Oversized,
        tungstenite::Error::Utf8(_) => {
            ReadError::Violation((CLOSE_INVALID_DATA, "invalid UTF-8 in a text frame"))
        }
        tungstenite::Error::Protocol(p) => ReadError::Violation((
            CLOSE_PROTOCOL_ERROR,
            match p {
                P::UnmaskedFrameFromClient => "unmasked client frame",
                P::NonZeroReservedBits => "reserved bits set",
                P::UnknownDataFrameType(_) | P::UnknownControlFrameType(_) => "unknown opcode",
                P::FragmentedControlFrame => "fragmented control frame",
                P::ControlFrameTooBig => "control frame over 125 bytes",
                P::UnexpectedContinueFrame | P::ExpectedFragment(_) => "continuation out of order",
                P::InvalidCloseSequence => "invalid close frame",
                // The socket ended or the handshake is over: nothing to
                // answer.
                P::ResetWithoutClosingHandshake | P::ReceivedAfterClosing | P::SendAfterClosing => {
                    return ReadError::Gone
                }
                _ => "protocol error",
            },
        )),
        _ => ReadError::Gone,
    }
}

impl Reader {
    /// The next event (see [`Reader::poll_event`]).
    pub async fn next(&mut self) -> Event {
        poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The next text or binary message, or why there is none. Pings and
    /// pongs are answered by the WebSocket layer; a pong (an answer to the
    /// server's ping) counts as activity, a ping does not: a client that
    /// pings and never reads would otherwise be kept for ever.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        if self.end != End::Open || self.out.poll_killed(cx).is_ready() {
            return Poll::Ready(Event::End);
        }
        let parked = self.out.0.parked();
        // Read after `poll_killed` registered the waker the sweep wakes.
        if parked.expired.load(Relaxed) {
            self.end = End::Closed;
            return Poll::Ready(Event::End);
        }
        loop {
            let Poll::Ready(next) = parked.poll_next(cx) else {
                return Poll::Pending;
            };
            let msg = match next {
                Some(Ok(m)) => m,
                None => {
                    self.end = End::Read;
                    return Poll::Ready(Event::End);
                }
                Some(Err(e)) => {
                    return Poll::Ready(match read_error(e) {
                        ReadError::Oversized => {
                            self.end = End::Oversized;
                            Event::Oversized
                        }
                        ReadError::Violation(close) => {
                            self.end = End::Closed;
                            self.out.close(close);
                            Event::End
                        }
                        ReadError::Gone => {
                            self.end = End::Read;
                            Event::End
                        }
                    });
                }
            };
            match msg {
                // tungstenite reads no raw frames: only a writer sends one.
                Message::Ping(_) | Message::Frame(_) => continue,
                Message::Pong(_) => {
                    parked.active.store(true, Relaxed);
                    continue;
                }
                Message::Text(t) => {
                    parked.active.store(true, Relaxed);
                    return Poll::Ready(Event::Text(t));
                }
                Message::Binary(b) => {
                    parked.active.store(true, Relaxed);
                    return Poll::Ready(Event::Binary(b));
                }
                Message::Close(_) => {
                    self.end = End::Read;
                    return Poll::Ready(Event::End);
                }
            }
        }
    }

    /// The protocol's choices for this connection.
    pub fn config(&self) -> &Config {
        &self.out.0.parked().config
    }

    /// The connection's sending side.
    pub fn out(&self) -> &Outbound {
        &self.out
    }
}
