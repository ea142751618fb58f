//! The sending side of one WebSocket connection: a bounded queue of frames
//! that the connection's writer task drains, and the close codes that end
//! it.
//!
//! One small allocation per connection, and nothing more until the first
//! frame (an idle connection should cost little); pushing is a lock that is
//! never contended for long and a wake only when the writer is waiting.

use futures_util::task::AtomicWaker;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

/// A close code and its reason.
pub type Close = (u16, &'static str);

/// What the writer is to do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Work<T> {
    /// Write this frame, then whatever [`Drain::next_frame`] gives, then
    /// flush.
    Frame(T),
    /// Send a WebSocket ping.
    Ping,
    /// Send this close frame after what was written, then stop.
    Close(Close),
    /// Close at once with this code, ahead of anything queued.
    Kill(Close),
    /// Every sender is gone and the queue is empty.
    End,
}

/// A drained queue gives its memory back: most connections are quiet most
/// of the time, and a small allocation per batch costs far less than the
/// write that follows it.
const KEEP_CAPACITY: usize = 0;

struct State<T> {
    frames: VecDeque<T>,
    ping: bool,
    close: Option<Close>,
    kill: Option<Close>,
    senders: usize,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    cap: usize,
    writer: AtomicWaker,
    reader: AtomicWaker,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding this lock cannot leave the queue half
        // updated (every change is one field), so a poisoned lock is used.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn kill(&self, code: Close) -> bool {
        let mut s = self.lock();
        let first = s.kill.is_none();
        if first {
            s.kill = Some(code);
        }
        drop(s);
        self.wake_both();
        first
    }

    fn wake_both(&self) {
        self.writer.wake();
        self.reader.wake();
    }
}

/// Where frames for one connection are queued. Cloned for every holder
/// (the connection's reader, its room); the writer ends when all are gone.
pub struct Outbound<T> {
    shared: Arc<Shared<T>>,
}

/// The writer's end of the queue.
pub struct Drain<T> {
    shared: Arc<Shared<T>>,
}

/// A queue of at most `cap` frames.
pub fn queue<T>(cap: usize) -> (Outbound<T>, Drain<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            ping: false,
            close: None,
            kill: None,
            senders: 1,
        }),
        cap: cap.max(1),
        writer: AtomicWaker::new(),
        reader: AtomicWaker::new(),
    });
    (
        Outbound {
            shared: Arc::clone(&shared),
        },
        Drain { shared },
    )
}

/// Why a frame was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The queue was full: the connection is now being killed with the
    /// code given to [`Outbound::push`]. Only the push that fills it sees
    /// this; later ones see `Closing`.
    Full,
    /// The connection is closing or closed.
    Closing,
}

impl<T> Outbound<T> {
    /// Queues a frame. A full queue kills the connection with `too_slow`.
    pub fn push(&self, frame: T, too_slow: Close) -> Result<(), Refused> {
        let mut s = self.shared.lock();
        if s.kill.is_some() || s.close.is_some() {
            return Err(Refused::Closing);
        }
        if s.frames.len() >= self.shared.cap {
            s.kill = Some(too_slow);
            drop(s);
            self.shared.wake_both();
            return Err(Refused::Full);
        }
        s.frames.push_back(frame);
        drop(s);
        self.shared.writer.wake();
        Ok(())
    }

    /// Asks the writer for a WebSocket ping (the reader keeps the time).
    pub fn ping(&self) {
        self.shared.lock().ping = true;
        self.shared.writer.wake();
    }

    /// Closes the connection after the frames already queued.
    pub fn close(&self, code: Close) {
        let mut s = self.shared.lock();
        if s.close.is_none() && s.kill.is_none() {
            s.close = Some(code);
        }
        drop(s);
        self.shared.wake_both();
    }

    /// The code the connection was killed with, if it was.
    pub fn killed(&self) -> Option<Close> {
        self.shared.lock().kill
    }

    /// Ready once the connection is killed: the reader stops reading then.
    pub fn poll_killed(&self, cx: &mut Context<'_>) -> Poll<Close> {
        let s = self.shared.lock();
        if let Some(k) = s.kill {
            return Poll::Ready(k);
        }
        // Registered under the lock: a kill after it sees this waker.
        self.shared.reader.register(cx.waker());
        Poll::Pending
    }
}

impl<T> Clone for Outbound<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Outbound {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Outbound<T> {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.senders -= 1;
        let last = s.senders == 0;
        drop(s);
        if last {
            self.shared.writer.wake();
        }
    }
}

impl<T> Drain<T> {
    /// Waits for work.
    pub fn poll_work(&self, cx: &mut Context<'_>) -> Poll<Work<T>> {
        let mut s = self.shared.lock();
        if let Some(k) = s.kill {
            return Poll::Ready(Work::Kill(k));
        }
        if let Some(f) = s.frames.pop_front() {
            return Poll::Ready(Work::Frame(f));
        }
        if std::mem::take(&mut s.ping) {
            return Poll::Ready(Work::Ping);
        }
        if let Some(c) = s.close {
            return Poll::Ready(Work::Close(c));
        }
        if s.senders == 0 {
            return Poll::Ready(Work::End);
        }
        // Registered under the lock: a push after it sees this waker.
        self.shared.writer.register(cx.waker());
        Poll::Pending
    }

    /// The next queued frame, without waiting (none once killed). Frames
    /// are taken one at a time so that the queue is the only buffer.
    pub fn next_frame(&self) -> Option<T> {
        let mut s = self.shared.lock();
        if s.kill.is_some() {
            return None;
        }
        let f = s.frames.pop_front();
        if f.is_none() && s.frames.capacity() > KEEP_CAPACITY {
            s.frames.shrink_to(KEEP_CAPACITY); // at zero: freed
        }
        f
    }

    /// Closes the connection at once, from the writer's side, so that the
    /// reader stops too. Returns whether this call was the first kill.
    pub fn kill(&self, code: Close) -> bool {
        self.shared.kill(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    const SLOW: Close = (1013, "too slow");

    fn work<T>(d: &Drain<T>) -> Poll<Work<T>> {
        d.poll_work(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn frames_come_out_in_order() {
        let (out, drain) = queue::<u32>(8);
        assert_eq!(work(&drain), Poll::Pending);
        out.push(1, SLOW).unwrap();
        out.push(2, SLOW).unwrap();
        assert_eq!(work(&drain), Poll::Ready(Work::Frame(1)));
        out.push(3, SLOW).unwrap();
        assert_eq!(drain.next_frame(), Some(2));
        assert_eq!(drain.next_frame(), Some(3));
        assert_eq!(drain.next_frame(), None);
        assert_eq!(work(&drain), Poll::Pending);
    }

    #[test]
    fn a_drained_queue_gives_back_what_a_burst_took() {
        let (out, drain) = queue::<u32>(1024);
        for i in 0..1000 {
            out.push(i, SLOW).unwrap();
        }
        while drain.next_frame().is_some() {}
        assert_eq!(drain.shared.lock().frames.capacity(), KEEP_CAPACITY);
    }

    #[test]
    fn a_ping_goes_after_the_queued_frames() {
        let (out, drain) = queue::<u32>(8);
        out.push(1, SLOW).unwrap();
        out.ping();
        assert_eq!(work(&drain), Poll::Ready(Work::Frame(1)));
        assert_eq!(work(&drain), Poll::Ready(Work::Ping));
        assert_eq!(work(&drain), Poll::Pending);
    }

    #[test]
    fn a_full_queue_kills_the_connection_once() {
        let (out, drain) = queue::<u32>(2);
        out.push(1, SLOW).unwrap();
        out.push(2, SLOW).unwrap();
        assert_eq!(out.push(3, SLOW), Err(Refused::Full));
        assert_eq!(out.push(4, SLOW), Err(Refused::Closing));
        assert_eq!(out.killed(), Some(SLOW));
        // The kill goes ahead of the queued frames.
        assert_eq!(work(&drain), Poll::Ready(Work::Kill(SLOW)));
        assert_eq!(drain.next_frame(), None);
        assert!(!drain.kill((1000, "later")), "only the first kill counts");
        assert_eq!(out.killed(), Some(SLOW));
    }

    #[test]
    fn close_follows_the_queued_frames_and_refuses_later_ones() {
        let (out, drain) = queue::<u32>(8);
        out.push(1, SLOW).unwrap();
        out.close((1008, "policy"));
        assert_eq!(out.push(2, SLOW), Err(Refused::Closing));
        assert_eq!(work(&drain), Poll::Ready(Work::Frame(1)));
        assert_eq!(work(&drain), Poll::Ready(Work::Close((1008, "policy"))));
    }

    #[test]
    fn the_writer_ends_when_every_sender_is_gone() {
        let (out, drain) = queue::<u32>(8);
        let room = out.clone();
        drop(out);
        assert_eq!(work(&drain), Poll::Pending);
        room.push(7, SLOW).unwrap();
        drop(room);
        // What was queued is still written first.
        assert_eq!(work(&drain), Poll::Ready(Work::Frame(7)));
        assert_eq!(work(&drain), Poll::Ready(Work::End));
    }

    #[test]
    fn a_kill_from_the_writer_wakes_the_reader() {
        let (out, drain) = queue::<u32>(8);
        let cx = &mut Context::from_waker(Waker::noop());
        assert_eq!(out.poll_killed(cx), Poll::Pending);
        assert!(drain.kill((1006, "write failed")));
        assert_eq!(out.poll_killed(cx), Poll::Ready((1006, "write failed")));
        // The writer's kill did not count as a sender leaving.
        drop(out);
        assert_eq!(
            work(&drain),
            Poll::Ready(Work::Kill((1006, "write failed")))
        );
    }
}
