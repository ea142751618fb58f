//! The sending side of one WebSocket connection: a bounded queue of frames
//! that the connection's writer task drains, and the close codes that end
//! it. A frame for an idle connection (nothing queued, writer not at work)
//! may instead be written at once by whoever sends it ([`Direct`]).
//!
//! One small allocation per connection, and nothing more until the first
//! frame (an idle connection should cost little); pushing is a lock that is
//! never contended for long and a wake only when the writer is needed.

use futures_util::task::AtomicWaker;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};

/// A close code and its reason.
pub type Close = (u16, &'static str);

/// What the writer is to do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Work<T> {
    /// Write this frame, then whatever [`Drain::next_frame`] gives, then
    /// flush.
    Frame(T),
    /// Finish writing a frame that was written directly but not flushed.
    Flush,
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
    /// The weight of `frames`, in bytes.
    bytes: usize,
    /// The writer is at work (from handing it work until it says it is
    /// idle): no frame may be written around it.
    busy: bool,
    flush: bool,
    ping: bool,
    close: Option<Close>,
    kill: Option<Close>,
    senders: usize,
    /// The writer has finished (its close sent, or the socket gone).
    ended: bool,
}

struct Shared<T, P> {
    state: Mutex<State<T>>,
    cap: usize,
    /// The most bytes queued (one frame is always taken into an empty
    /// queue, whatever its size).
    max_bytes: usize,
    weigh: fn(&T) -> usize,
    writer: AtomicWaker,
    reader: AtomicWaker,
    /// Whatever else the connection's ends share (the server keeps the
    /// idle socket here), in the same allocation.
    parked: P,
}

impl<T, P> Shared<T, P> {
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
        // Nothing queued is written after a kill: its memory goes now.
        Self::discard(&mut s);
        drop(s);
        self.wake_both();
        first
    }

    fn discard(s: &mut State<T>) {
        s.frames = VecDeque::new();
        s.bytes = 0;
    }

    fn pop(&self, s: &mut State<T>) -> Option<T> {
        let f = s.frames.pop_front()?;
        s.bytes = s.bytes.saturating_sub((self.weigh)(&f));
        Some(f)
    }

    fn wake_both(&self) {
        self.writer.wake();
        self.reader.wake();
    }
}

/// Where frames for one connection are queued. Cloned for every holder
/// (the connection's reader, its room); the writer ends when all are gone.
pub struct Outbound<T, P = ()> {
    shared: Arc<Shared<T, P>>,
}

/// The writer's end of the queue.
pub struct Drain<T, P = ()> {
    shared: Arc<Shared<T, P>>,
}

/// A queue of at most `cap` frames, and `parked` shared by both ends.
#[cfg(test)]
pub fn queue<T, P>(cap: usize, parked: P) -> (Outbound<T, P>, Drain<T, P>) {
    queue_bounded(cap, usize::MAX, |_| 0, parked)
}

/// A queue of at most `cap` frames weighing at most `max_bytes` together
/// (by `weigh`), and `parked` shared by both ends.
pub fn queue_bounded<T, P>(
    cap: usize,
    max_bytes: usize,
    weigh: fn(&T) -> usize,
    parked: P,
) -> (Outbound<T, P>, Drain<T, P>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            bytes: 0,
            busy: false,
            flush: false,
            ping: false,
            close: None,
            kill: None,
            senders: 1,
            ended: false,
        }),
        cap: cap.max(1),
        max_bytes,
        weigh,
        writer: AtomicWaker::new(),
        reader: AtomicWaker::new(),
        parked,
    });
    (
        Outbound {
            shared: Arc::clone(&shared),
        },
        Drain { shared },
    )
}

/// What became of a frame offered for writing at once.
pub enum Direct<T> {
    /// On its way: handed to the socket.
    Written,
    /// Accepted, but the socket took only part of it: the writer must
    /// finish it.
    Unflushed,
    /// Not written (the socket is busy or its writer holds it): queue it.
    Declined(T),
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

impl<T, P> Outbound<T, P> {
    /// What the ends share besides the queue.
    pub fn parked(&self) -> &P {
        &self.shared.parked
    }

    /// Queues a frame. A full queue kills the connection with `too_slow`.
    #[cfg(test)]
    pub fn push(&self, frame: T, too_slow: Close) -> Result<(), Refused> {
        self.push_or_write(frame, too_slow, Direct::Declined)
    }

    /// Queues a frame (a full queue kills the connection with `too_slow`),
    /// but when nothing is queued and the writer is idle it is first
    /// offered to `write_now`, which may write it at once: a frame for
    /// an idle connection then goes out without waking its writer. Under the
    /// queue's lock, so no frame queued meanwhile can overtake it.
    pub fn push_or_write(
        &self,
        frame: T,
        too_slow: Close,
        write_now: impl FnOnce(T) -> Direct<T>,
    ) -> Result<(), Refused> {
        let mut s = self.shared.lock();
        if s.kill.is_some() || s.close.is_some() {
            return Err(Refused::Closing);
        }
        let frame = if s.frames.is_empty() && !s.busy {
            match write_now(frame) {
                Direct::Written => return Ok(()),
                Direct::Unflushed => {
                    s.flush = true;
                    drop(s);
                    self.shared.writer.wake();
                    return Ok(());
                }
                Direct::Declined(f) => f,
            }
        } else {
            frame
        };
        let weight = (self.shared.weigh)(&frame);
        let over_bytes =
            !s.frames.is_empty() && s.bytes.saturating_add(weight) > self.shared.max_bytes;
        if s.frames.len() >= self.shared.cap || over_bytes {
            s.kill = Some(too_slow);
            Shared::<T, P>::discard(&mut s);
            drop(s);
            self.shared.wake_both();
            return Err(Refused::Full);
        }
        s.bytes += weight;
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

    /// Ready once the writer has said it ended ([`Drain::end`]).
    pub fn poll_writer_ended(&self, cx: &mut Context<'_>) -> Poll<()> {
        let s = self.shared.lock();
        if s.ended {
            return Poll::Ready(());
        }
        // Registered under the lock: an end after it sees this waker.
        self.shared.reader.register(cx.waker());
        Poll::Pending
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

/// A handle that can only close a connection, and keeps nothing alive: a
/// registry of every socket holds these, so that its connections still end
/// when their own holders let go.
pub struct Closer<T, P = ()> {
    shared: Weak<Shared<T, P>>,
}

impl<T, P> Closer<T, P> {
    /// [`Outbound::close`], if the connection still exists.
    pub fn close(&self, code: Close) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut s = shared.lock();
        if s.close.is_none() && s.kill.is_none() {
            s.close = Some(code);
        }
        drop(s);
        shared.wake_both();
    }
}

impl<T, P> Outbound<T, P> {
    /// A handle that closes this connection without keeping it alive.
    pub fn closer(&self) -> Closer<T, P> {
        Closer {
            shared: Arc::downgrade(&self.shared),
        }
    }
}

impl<T, P> Clone for Outbound<T, P> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Outbound {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T, P> Drop for Outbound<T, P> {
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

impl<T, P> Drain<T, P> {
    /// What the ends share besides the queue.
    pub fn parked(&self) -> &P {
        &self.shared.parked
    }

    /// Waits for work. From then on the writer counts as busy until it
    /// calls [`Drain::idle`].
    pub fn poll_work(&self, cx: &mut Context<'_>) -> Poll<Work<T>> {
        let mut s = self.shared.lock();
        match self.next_work(&mut s) {
            Some(work) => {
                s.busy = true;
                Poll::Ready(work)
            }
            None => {
                // Registered under the lock: a push after it sees this waker.
                self.shared.writer.register(cx.waker());
                Poll::Pending
            }
        }
    }

    /// The writer has finished its work and let go of the socket: frames
    /// may be written at once again.
    pub fn idle(&self) {
        self.shared.lock().busy = false;
    }

    fn next_work(&self, s: &mut State<T>) -> Option<Work<T>> {
        if let Some(k) = s.kill {
            return Some(Work::Kill(k));
        }
        if let Some(f) = self.shared.pop(s) {
            return Some(Work::Frame(f));
        }
        if std::mem::take(&mut s.flush) {
            return Some(Work::Flush);
        }
        if std::mem::take(&mut s.ping) {
            return Some(Work::Ping);
        }
        if let Some(c) = s.close {
            return Some(Work::Close(c));
        }
        (s.senders == 0).then_some(Work::End)
    }

    /// The next queued frame, without waiting (none once killed). Frames
    /// are taken one at a time so that the queue is the only buffer.
    pub fn next_frame(&self) -> Option<T> {
        let mut s = self.shared.lock();
        if s.kill.is_some() {
            return None;
        }
        let f = self.shared.pop(&mut s);
        if f.is_none() && s.frames.capacity() > KEEP_CAPACITY {
            s.frames.shrink_to(KEEP_CAPACITY); // at zero: freed
        }
        f
    }

    /// The writer is done: whoever waits in [`Outbound::poll_writer_ended`]
    /// goes on.
    pub fn end(&self) {
        self.shared.lock().ended = true;
        self.shared.reader.wake();
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
        let (out, drain) = queue::<u32, ()>(8, ());
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
        let (out, drain) = queue::<u32, ()>(1024, ());
        for i in 0..1000 {
            out.push(i, SLOW).unwrap();
        }
        while drain.next_frame().is_some() {}
        assert_eq!(drain.shared.lock().frames.capacity(), KEEP_CAPACITY);
    }

    #[test]
    fn a_ping_goes_after_the_queued_frames() {
        let (out, drain) = queue::<u32, ()>(8, ());
        out.push(1, SLOW).unwrap();
        out.ping();
        assert_eq!(work(&drain), Poll::Ready(Work::Frame(1)));
        assert_eq!(work(&drain), Poll::Ready(Work::Ping));
        assert_eq!(work(&drain), Poll::Pending);
    }

    #[test]
    fn a_full_queue_kills_the_connection_once() {
        let (out, drain) = queue::<u32, ()>(2, ());
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
    fn a_queue_over_its_bytes_kills_the_connection_and_frees_them() {
        let (out, drain) = queue_bounded::<Vec<u8>, ()>(1024, 100, |f| f.len(), ());
        // An empty queue takes one frame whatever its size.
        out.push(vec![0; 150], SLOW).unwrap();
        assert_eq!(work(&drain), Poll::Ready(Work::Frame(vec![0; 150])));
        drain.idle();
        out.push(vec![0; 60], SLOW).unwrap();
        out.push(vec![0; 40], SLOW).unwrap();
        assert_eq!(drain.shared.lock().bytes, 100);
        assert_eq!(out.push(vec![0; 1], SLOW), Err(Refused::Full));
        let s = drain.shared.lock();
        assert_eq!((s.frames.len(), s.frames.capacity(), s.bytes), (0, 0, 0));
        drop(s);
        assert_eq!(work(&drain), Poll::Ready(Work::Kill(SLOW)));
    }

    #[test]
    fn taking_frames_gives_back_their_bytes() {
        let (out, drain) = queue_bounded::<Vec<u8>, ()>(1024, 100, |f| f.len(), ());
        drain.shared.lock().busy = true;
        for _ in 0..10 {
            out.push(vec![0; 50], SLOW).unwrap();
            out.push(vec![0; 50], SLOW).unwrap();
            assert!(drain.next_frame().is_some());
            assert!(drain.next_frame().is_some());
        }
        assert_eq!(drain.shared.lock().bytes, 0);
    }

    #[test]
    fn close_follows_the_queued_frames_and_refuses_later_ones() {
        let (out, drain) = queue::<u32, ()>(8, ());
        out.push(1, SLOW).unwrap();
        out.close((1008, "policy"));
        assert_eq!(out.push(2, SLOW), Err(Refused::Closing));
        assert_eq!(work(&drain), Poll::Ready(Work::Frame(1)));
        assert_eq!(work(&drain), Poll::Ready(Work::Close((1008, "policy"))));
    }

    #[test]
    fn the_writer_ends_when_every_sender_is_gone() {
        let (out, drain) = queue::<u32, ()>(8, ());
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
    fn only_an_idle_queue_offers_a_frame_for_writing_at_once() {
        let (out, drain) = queue::<u32, ()>(8, ());
        // Written at once: nothing for the writer.
        out.push_or_write(1, SLOW, |_| Direct::Written).unwrap();
        assert_eq!(work(&drain), Poll::Pending);
        // Declined: queued as usual.
        out.push_or_write(2, SLOW, Direct::Declined).unwrap();
        // With a frame queued, the next is not offered: it cannot overtake.
        out.push_or_write(3, SLOW, |_| panic!("offered past a queued frame"))
            .unwrap();
        assert_eq!(work(&drain), Poll::Ready(Work::Frame(2)));
        assert_eq!(drain.next_frame(), Some(3));
        // Nor while the writer is at work, though the queue is empty: a
        // frame written now would overtake the ones it took.
        out.push_or_write(33, SLOW, |_| panic!("offered while the writer works"))
            .unwrap();
        assert_eq!(drain.next_frame(), Some(33));
        drain.idle();
        // Half written: the writer is asked to finish it.
        out.push_or_write(4, SLOW, |_| Direct::Unflushed).unwrap();
        assert_eq!(work(&drain), Poll::Ready(Work::Flush));
        assert_eq!(work(&drain), Poll::Pending);
        // A closing connection takes nothing, not even at once.
        out.close((1000, "bye"));
        assert_eq!(
            out.push_or_write(5, SLOW, |_| panic!("offered while closing")),
            Err(Refused::Closing)
        );
    }

    #[test]
    fn a_kill_from_the_writer_wakes_the_reader() {
        let (out, drain) = queue::<u32, ()>(8, ());
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
