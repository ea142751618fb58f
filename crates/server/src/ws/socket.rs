//! What a connection reads and writes: a client's WebSocket, or a pipe of
//! two bounded channels standing in for one (a client of another node
//! whose frames that node carries here over NATS; see
//! `crate::cluster::tunnel`). The driver treats both alike, so a protocol
//! serves a client of another node with its own code, unchanged.

use axum::extract::ws::{Message, WebSocket};
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

/// A connection's socket. The WebSocket, by far the common one, is kept
/// inline: boxing it would cost every connection an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Socket {
    Ws(WebSocket),
    Pipe(Pipe),
}

/// A socket made of two channels: what the peer sent (a message, or an
/// error such as [`oversized`]) comes in on `from_peer`, and what the
/// connection sends goes out on `to_peer`, each bounded by its channel.
pub struct Pipe {
    pub from_peer: mpsc::Receiver<Result<Message, axum::Error>>,
    pub to_peer: PollSender<Message>,
    /// Told the bytes of each text or binary message the connection takes
    /// (the tunnel grants its sender that much more).
    pub taken: Box<dyn FnMut(usize) + Send>,
}

/// The error the WebSocket layer reports for a message over the frame
/// limit, for a pipe whose peer refused one: the reader maps both alike.
pub fn oversized(size: usize, max_size: usize) -> axum::Error {
    axum::Error::new(tungstenite::Error::Capacity(
        tungstenite::error::CapacityError::MessageTooLong { size, max_size },
    ))
}

fn closed() -> axum::Error {
    axum::Error::new(tungstenite::Error::ConnectionClosed)
}

impl Stream for Socket {
    type Item = Result<Message, axum::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.poll_next_unpin(cx),
            Socket::Pipe(p) => {
                let next = p.from_peer.poll_recv(cx);
                if let Poll::Ready(Some(Ok(Message::Text(t)))) = &next {
                    (p.taken)(t.len());
                } else if let Poll::Ready(Some(Ok(Message::Binary(b)))) = &next {
                    (p.taken)(b.len());
                }
                next
            }
        }
    }
}

impl Sink<Message> for Socket {
    type Error = axum::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.poll_ready_unpin(cx),
            Socket::Pipe(p) => p.to_peer.poll_ready_unpin(cx).map_err(|_| closed()),
        }
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.start_send_unpin(item),
            Socket::Pipe(p) => p.to_peer.start_send_unpin(item).map_err(|_| closed()),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.poll_flush_unpin(cx),
            Socket::Pipe(p) => p.to_peer.poll_flush_unpin(cx).map_err(|_| closed()),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.get_mut() {
            Socket::Ws(ws) => ws.poll_close_unpin(cx),
            Socket::Pipe(p) => p.to_peer.poll_close_unpin(cx).map_err(|_| closed()),
        }
    }
}
