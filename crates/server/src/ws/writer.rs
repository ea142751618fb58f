//! The sending side of a connection: its bounded outbound queue, the
//! direct write to an idle socket, and the writer task that drains it.

use super::config::CLOSE_NORMAL;
use crate::outbound;
use crate::outbound::{Close, Refused};
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::Bytes;
use futures_util::stream::SplitSink;
use futures_util::SinkExt;
use std::future::poll_fn;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

pub(super) type WsSink = SplitSink<WebSocket, Message>;

/// A connection's sending half while its writer is idle. A frame for an
/// idle connection is written from here at once, by the task that made it:
/// no wake of the writer, and under load the frame leaves as soon as it is
/// routed instead of after every task queued ahead of the writer.
pub struct Parked {
    pub(super) sink: Mutex<Option<WsSink>>,
    pub(super) too_slow: Close,
    pub(super) direct_write: bool,
}

impl Parked {
    pub(super) fn write_now(&self, frame: Utf8Bytes) -> outbound::Direct<Utf8Bytes> {
        use outbound::Direct;
        // Never wait for the writer: if it has the socket, queue.
        let Ok(mut slot) = self.sink.try_lock() else {
            return Direct::Declined(frame);
        };
        let Some(sink) = slot.as_mut() else {
            return Direct::Declined(frame);
        };
        // No waker of ours to register: what cannot finish now is handed to
        // the writer, which registers its own.
        let mut cx = Context::from_waker(Waker::noop());
        if !matches!(sink.poll_ready_unpin(&mut cx), Poll::Ready(Ok(()))) {
            return Direct::Declined(frame);
        }
        if sink.start_send_unpin(Message::Text(frame)).is_err() {
            // A broken socket: the writer's flush finds out and ends it.
            return Direct::Unflushed;
        }
        match sink.poll_flush_unpin(&mut cx) {
            Poll::Ready(Ok(())) => Direct::Written,
            _ => Direct::Unflushed,
        }
    }

    pub(super) fn take(&self) -> Option<WsSink> {
        self.sink.lock().ok()?.take()
    }

    pub(super) fn put(&self, sink: WsSink) {
        if let Ok(mut slot) = self.sink.lock() {
            *slot = Some(sink);
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
        if !parked.direct_write {
            return self
                .0
                .push_or_write(frame, parked.too_slow, outbound::Direct::Declined);
        }
        self.0
            .push_or_write(frame, parked.too_slow, |f| parked.write_now(f))
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
/// taken from `parked` for each piece of work and put back after it.
pub(super) async fn write_loop(drain: outbound::Drain<Utf8Bytes, Parked>) {
    let parked = drain.parked();
    let close_with = |(code, reason): Close| {
        Message::Close(Some(CloseFrame {
            code,
            reason: Utf8Bytes::from_static(reason),
        }))
    };
    let mut sink = loop {
        let work = poll_fn(|cx| drain.poll_work(cx)).await;
        let Some(mut sink) = parked.take() else {
            break None;
        };
        let go_on = match work {
            outbound::Work::Frame(first) => {
                let mut ok = sink.feed(Message::Text(first)).await.is_ok();
                while ok {
                    match drain.next_frame() {
                        Some(f) => ok = sink.feed(Message::Text(f)).await.is_ok(),
                        None => break,
                    }
                }
                ok && sink.flush().await.is_ok()
            }
            outbound::Work::Flush => sink.flush().await.is_ok(),
            outbound::Work::Ping => sink.send(Message::Ping(Bytes::new())).await.is_ok(),
            outbound::Work::Close(c) | outbound::Work::Kill(c) => {
                // Fails when the peer closed first: the WebSocket layer has
                // queued its echo, which the close below flushes.
                let _ = sink.send(close_with(c)).await;
                false
            }
            outbound::Work::End => false,
        };
        if !go_on {
            break Some(sink);
        }
        // Back first, then idle: a frame sent in between is queued, and the
        // writer comes back for it.
        parked.put(sink);
        drain.idle();
    };
    if let Some(s) = sink.as_mut() {
        let _ = s.close().await;
    }
    // Stops the reader, if it still reads.
    let _ = drain.kill((CLOSE_NORMAL, "closed"));
}
