//! What a connection reads and writes: a client's WebSocket, or a pipe of
//! two bounded channels standing in for one (a client of another node
//! whose frames that node carries here over NATS; see
//! `crate::cluster::tunnel`). The driver treats both alike, so a protocol
//! serves a client of another node with its own code, unchanged.

use super::stream::WebSocket;
use futures_util::{Sink, SinkExt, Stream};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::sync::mpsc;
use tungstenite::{Error, Message};

/// A connection's socket. The WebSocket, by far the common one, is kept
/// inline: boxing it would cost every connection an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Socket {
    Ws(WebSocket),
    Pipe(Pipe),
}

/// A socket made of a channel and a sink: what the peer sent (a message,
/// or an error such as [`oversized`]) comes in on `from_peer`, bounded by
/// the channel, and what the connection sends goes to `to_peer`, which
/// says when it has room ([`Sink::poll_ready`]).
pub struct Pipe {
    pub from_peer: mpsc::Receiver<Result<Message, Error>>,
    pub to_peer: Box<dyn ToPeer>,
}

/// Where a pipe's connection sends.
pub trait ToPeer: Sink<Message, Error = Error> + Send + Unpin {
    /// Told the bytes of each text or binary message the connection takes
    /// from `from_peer` (the tunnel grants its sender that much more).
    fn taken(&mut self, bytes: usize);
}

/// The error the WebSocket layer reports for a message over the frame
/// limit, for a pipe whose peer refused one: the reader maps both alike.
pub fn oversized(size: usize, max_size: usize) -> Error {
    Error::Capacity(tungstenite::error::CapacityError::MessageTooLong { size, max_size })
}

/// The error of a pipe whose peer is gone.
pub fn closed() -> Error {
    Error::ConnectionClosed
}

impl Socket {
    /// [`Sink::poll_ready`] without registering a waker: for a frame
    /// written at once by a task that is not the connection's, which hands
    /// what it cannot finish to the connection's writer.
    pub(super) fn try_ready(&mut self) -> Result<bool, Error> {
        match self {
            Socket::Ws(ws) => ws.try_ready(),
            Socket::Pipe(p) => match p.to_peer.poll_ready_unpin(&mut noop()) {
                Poll::Ready(r) => r.map(|()| true),
                Poll::Pending => Ok(false),
            },
        }
    }

    /// [`Sink::poll_flush`] without registering a waker (see
    /// [`Socket::try_ready`]): false if some is left to write.
    pub(super) fn try_flush(&mut self) -> Result<bool, Error> {
        match self {
            Socket::Ws(ws) => ws.try_flush(),
            Socket::Pipe(p) => match p.to_peer.poll_flush_unpin(&mut noop()) {
                Poll::Ready(r) => r.map(|()| true),
                Poll::Pending => Ok(false),
            },
        }
    }
}

fn noop() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

impl Stream for Socket {
    type Item = Result<Message, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.poll_next(cx),
            Socket::Pipe(p) => {
                let next = p.from_peer.poll_recv(cx);
                if let Poll::Ready(Some(Ok(Message::Text(t)))) = &next {
                    p.to_peer.taken(t.len());
                } else if let Poll::Ready(Some(Ok(Message::Binary(b)))) = &next {
                    p.to_peer.taken(b.len());
                }
                next
            }
        }
    }
}

impl Sink<Message> for Socket {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.poll_ready(cx),
            Socket::Pipe(p) => p.to_peer.poll_ready_unpin(cx),
        }
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.start_send(item),
            Socket::Pipe(p) => p.to_peer.start_send_unpin(item),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.poll_flush(cx),
            Socket::Pipe(p) => p.to_peer.poll_flush_unpin(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.poll_close(cx),
            Socket::Pipe(p) => p.to_peer.poll_close_unpin(cx),
        }
    }
}
