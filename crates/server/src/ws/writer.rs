//! The sending side of a connection: its bounded outbound queue, the
//! direct write to an idle socket, and the writer that drains it. The
//! writer is no task of its own: it runs beside the protocol's reader in
//! the connection's one task (see [`super::Upgrade::on_upgrade`]).

use super::config::CLOSE_NORMAL;
use super::socket::Socket;
use crate::outbound;
use crate::outbound::{Close, Refused};
use bytes::Bytes;
use futures_util::SinkExt;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use tungstenite::protocol::CloseFrame;
use tungstenite::{Message, Utf8Bytes};

/// A connection's socket, unsplit, in the same allocation as its outbound
/// queue: the reader and the writer take it in turns for one poll each (a
/// lock held for no longer than one non-blocking read or write), and a
/// frame for an idle connection is written from here at once by the task
/// that made it: no wake of the writer, and under load the frame leaves as
/// soon as it is routed instead of after every task queued ahead of the
/// connection's.
pub struct Parked {
    /// `None` once the connection has let go of it.
    pub(super) socket: Mutex<Option<Socket>>,
    /// Whether the socket is a pipe from another node's client.
    pub(super) piped: bool,
    /// The protocol's choices (its `too_slow` close, `direct_write`).
    pub(super) config: std::sync::Arc<super::Config>,
    /// A frame or a pong came since the registry's last sweep (which
    /// clears it): the reader sets it, no clock read per frame.
    pub(super) active: std::sync::atomic::AtomicBool,
    /// The sweep found the socket silent for its idle timeout and closed
    /// it: the reader ends.
    pub(super) expired: std::sync::atomic::AtomicBool,
}

/// The protocol's queue bounds, read where they are set.
impl outbound::Bounds<Utf8Bytes> for Parked {
    fn cap(&self) -> usize {
        self.config.outbound_frames
    }

    fn max_bytes(&self) -> usize {
        self.config.outbound_bytes
    }

    fn weigh(frame: &Utf8Bytes) -> usize {
        frame.len()
    }
}

impl Parked {
    pub(super) fn socket(&self) -> MutexGuard<'_, Option<Socket>> {
        // A panic while polling the socket leaves it as tungstenite left
        // it; its next read or write reports what became of it.
        self.socket.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the TCP connection now (the socket is dropped); reads and
    /// writes after it find the connection gone.
    pub(super) fn drop_socket(&self) {
        let socket = self.socket().take();
        drop(socket);
    }

    /// Lets go of an idle WebSocket's protocol state and read buffer
    /// ([`WebSocket::shed`](super::WebSocket::shed)), unless the
    /// connection's task or a direct write is using the socket.
    pub(super) fn shed(&self) {
        if let Ok(mut slot) = self.socket.try_lock() {
            if let Some(Socket::Ws(ws)) = slot.as_mut() {
                ws.shed();
            }
        }
    }

    pub(super) fn write_now(&self, frame: Utf8Bytes) -> outbound::Direct<Utf8Bytes> {
        use outbound::Direct;
        // Never wait for the connection's task: if it is polling the
        // socket, queue.
        let Ok(mut slot) = self.socket.try_lock() else {
            return Direct::Declined(frame);
        };
        let Some(sink) = slot.as_mut() else {
            return Direct::Declined(frame);
        };
        // No waker of ours to register (it would take the place of the
        // writer's): what cannot finish now is handed to the writer, which
        // registers its own.
        if !matches!(sink.try_ready(), Ok(true)) {
            return Direct::Declined(frame);
        }
        if sink.start_send_unpin(Message::Text(frame)).is_err() {
            // A broken socket: the writer's flush finds out and ends it.
            return Direct::Unflushed;
        }
        match sink.try_flush() {
            Ok(true) => Direct::Written,
            _ => Direct::Unflushed,
        }
    }

    /// Writes frames from the front of `frames` for as long as the socket
    /// takes them, then flushes once: a turn's frames for this connection
    /// leave in one write. `false`: the writer must finish (a flush left
    /// over, or a broken socket its flush finds out about).
    pub(super) fn write_all_now(&self, frames: &mut std::collections::VecDeque<Utf8Bytes>) -> bool {
        // Never wait for the connection's task: the writer takes the rest.
        let Ok(mut slot) = self.socket.try_lock() else {
            return true;
        };
        let Some(sink) = slot.as_mut() else {
            return true;
        };
        let mut sent = false;
        while !frames.is_empty() {
            if !matches!(sink.try_ready(), Ok(true)) {
                break;
            }
            let Some(f) = frames.pop_front() else {
                break;
            };
            if sink.start_send_unpin(Message::Text(f)).is_err() {
                return false;
            }
            sent = true;
        }
        !sent || matches!(sink.try_flush(), Ok(true))
    }

    /// Hands the message that `take` gives to the socket once it can take
    /// one; false if the socket failed or is gone (or `take` gave none).
    fn poll_feed(
        &self,
        cx: &mut Context<'_>,
        take: impl FnOnce() -> Option<Message>,
    ) -> Poll<bool> {
        let mut slot = self.socket();
        let Some(ws) = slot.as_mut() else {
            return Poll::Ready(false);
        };
        match ws.poll_ready_unpin(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => return Poll::Ready(false),
            Poll::Pending => return Poll::Pending,
        }
        let Some(m) = take() else {
            return Poll::Ready(false);
        };
        Poll::Ready(ws.start_send_unpin(m).is_ok())
    }

    /// Writes out what the socket holds; false if it failed or is gone.
    fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<bool> {
        match self.socket().as_mut() {
            Some(ws) => ws.poll_flush_unpin(cx).map(|r| r.is_ok()),
            None => Poll::Ready(false),
        }
    }

    /// Sends the close frame (if not sent) and flushes the socket.
    fn poll_close(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self.socket().as_mut() {
            Some(ws) => ws.poll_close_unpin(cx).map(|_| ()),
            None => Poll::Ready(()),
        }
    }

    /// The next message read from the socket (`None` once it is gone).
    pub(super) fn poll_next(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Message, tungstenite::Error>>> {
        match self.socket().as_mut() {
            Some(ws) => futures_util::StreamExt::poll_next_unpin(ws, cx),
            None => Poll::Ready(None),
        }
    }
}

/// The sending side of one connection: cloned for every holder (the
/// connection's reader, its room, session or match).
#[derive(Clone)]
pub struct Outbound(pub(super) outbound::Outbound<Utf8Bytes, Parked>);

impl Outbound {
    /// Sends a text frame: at once when the connection is idle, else
    /// queued; a full queue (in frames or bytes) closes the connection with
    /// the protocol's `too_slow` code ([`Refused::Full`], once).
    pub fn send(&self, frame: Utf8Bytes) -> Result<(), Refused> {
        let parked = self.0.parked();
        if !parked.config.direct_write {
            return self
                .0
                .push_or_write(frame, parked.config.too_slow, outbound::Direct::Declined);
        }
        self.0
            .push_or_write(frame, parked.config.too_slow, |f| parked.write_now(f))
    }

    /// Queues a frame to leave with the others of the sender's turn, at
    /// [`Outbound::release`]; a full queue closes the connection as
    /// [`Outbound::send`] does.
    pub fn send_held(&self, frame: Utf8Bytes) -> Result<(), Refused> {
        self.0.push_held(frame, self.0.parked().config.too_slow)
    }

    /// What [`Outbound::send_held`] queued leaves, in one write: at once
    /// from the caller's task when the connection is idle and takes direct
    /// writes, else by its writer.
    pub fn release(&self) {
        let parked = self.0.parked();
        if parked.config.direct_write {
            self.0.release(|frames| parked.write_all_now(frames));
        } else {
            self.0.release(|_| true);
        }
    }

    /// Whether this connection is a client of another node, carried here
    /// over a pipe (see `crate::cluster::tunnel`): such a connection is
    /// never carried on to a third node.
    pub fn is_piped(&self) -> bool {
        self.0.parked().piped
    }

    /// Closes the connection after what is queued.
    pub fn close(&self, code: Close) {
        self.0.close(code);
    }

    /// The code the connection was killed with (its queue overflowed, or
    /// its writer ended), if it was.
    pub fn killed(&self) -> Option<Close> {
        self.0.killed()
    }

    /// Ready once the connection is killed.
    pub fn poll_killed(&self, cx: &mut Context<'_>) -> Poll<Close> {
        self.0.poll_killed(cx)
    }
}

/// Writes what the queue holds (all that is queued, then one flush), and
/// finishes frames that were written at once but not flushed. The socket is
/// taken for one poll at a time: the reader uses it in between.
///
/// A future written by hand, not an `async fn`: it lives in every
/// connection's task for the connection's life, and the compiler's state
/// machine kept room for each awaited call's future (232 bytes against
/// this one's 48; see docs/BENCHMARKS.md, "Idle connections").
pub(super) struct WriteLoop {
    drain: outbound::Drain<Utf8Bytes, Parked>,
    step: Step,
}

/// Each message kind is a step of its own, holding only what its message
/// is made from (made when the socket can take it): tungstenite's
/// `Message` is 56 bytes, and the step lives in every connection.
enum Step {
    /// Waiting for work.
    Idle,
    /// Handing a frame to the socket (`None` once handed), then the next
    /// queued frame, or a flush once there is none.
    Feed(Option<Utf8Bytes>),
    /// Handing a ping to the socket (`false` once handed), then a flush.
    Ping(bool),
    /// Handing this close frame to the socket (`None` once handed), then
    /// a flush and the close.
    CloseFrame(Option<Close>),
    /// Flushing the socket; `last`: then close it, whatever the flush did.
    Flush {
        last: bool,
    },
    /// Closing the socket, then the writer ends.
    Close,
    Done,
}

fn close_frame((code, reason): Close) -> Message {
    Message::Close(Some(CloseFrame {
        code: code.into(),
        reason: Utf8Bytes::from_static(reason),
    }))
}

pub(super) fn write_loop(drain: outbound::Drain<Utf8Bytes, Parked>) -> WriteLoop {
    WriteLoop {
        drain,
        step: Step::Idle,
    }
}

impl std::future::Future for WriteLoop {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            let parked = this.drain.parked();
            this.step = match &mut this.step {
                Step::Idle => match std::task::ready!(this.drain.poll_work(cx)) {
                    outbound::Work::Frame(f) => Step::Feed(Some(f)),
                    outbound::Work::Flush => Step::Flush { last: false },
                    outbound::Work::Ping => Step::Ping(true),
                    // Fails when the peer closed first: the WebSocket layer
                    // has queued its echo, which the close below flushes.
                    outbound::Work::Close(c) | outbound::Work::Kill(c) => Step::CloseFrame(Some(c)),
                    outbound::Work::End => Step::Close,
                },
                Step::Feed(f) => {
                    if !std::task::ready!(parked.poll_feed(cx, || f.take().map(Message::Text))) {
                        Step::Close
                    } else if let Some(f) = this.drain.next_frame() {
                        Step::Feed(Some(f))
                    } else {
                        Step::Flush { last: false }
                    }
                }
                Step::Ping(pending) => {
                    let ping = || std::mem::take(pending).then(|| Message::Ping(Bytes::new()));
                    match std::task::ready!(parked.poll_feed(cx, ping)) {
                        true => Step::Flush { last: false },
                        false => Step::Close,
                    }
                }
                Step::CloseFrame(c) => {
                    match std::task::ready!(parked.poll_feed(cx, || c.take().map(close_frame))) {
                        true => Step::Flush { last: true },
                        false => Step::Close,
                    }
                }
                Step::Flush { last } => {
                    let ok = std::task::ready!(parked.poll_flush(cx));
                    if ok && !*last {
                        this.drain.idle();
                        Step::Idle
                    } else {
                        Step::Close
                    }
                }
                Step::Close => {
                    std::task::ready!(parked.poll_close(cx));
                    // Stops the reader, if it still reads.
                    let _ = this.drain.kill((CLOSE_NORMAL, "closed"));
                    this.drain.end();
                    Step::Done
                }
                Step::Done => return Poll::Ready(()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle connection keeps its queue (with the socket) and its writer
    /// for its life: each is held within the jemalloc size class it was
    /// brought into (320 and, with the relay's read loop, 256 bytes), so
    /// that a field added in passing shows here and not as 64 more bytes
    /// per connection (docs/BENCHMARKS.md, "An idle connection's queue,
    /// writer and room entry made smaller"). The layout is the compiler's:
    /// another toolchain may need these looked at again. tokio's stream is
    /// counted as in the server's build (32 bytes): the tests' build
    /// widens it with tokio's test features.
    #[test]
    fn an_idle_connections_queue_and_writer_keep_their_size_classes() {
        const STREAM_IN_THE_SERVER: usize = 32;
        let queue = outbound::allocation_bytes::<Utf8Bytes, Parked>()
            - std::mem::size_of::<tokio::net::TcpStream>()
            + STREAM_IN_THE_SERVER;
        assert!(queue <= 320, "queue with its socket: {queue} bytes");
        assert!(
            std::mem::size_of::<WriteLoop>() <= 48,
            "writer: {} bytes",
            std::mem::size_of::<WriteLoop>()
        );
    }
}
