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
use std::sync::atomic::{AtomicBool, Ordering::Acquire, Ordering::Release};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};

/// A close code and its reason.
pub type Close = (u16, &'static str);

/// A queue's bounds and a frame's weight. They come from what the ends
/// share (the protocol's configuration), not from fields of every queue:
/// an idle connection's queue is then within one allocator size class.
pub trait Bounds<T> {
    /// The most frames queued.
    fn cap(&self) -> usize;
    /// The most bytes queued (one frame is always taken into an empty
    /// queue, whatever its size).
    fn max_bytes(&self) -> usize;
    /// A frame's weight in bytes.
    fn weigh(frame: &T) -> usize;
}

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
    /// The socket holds bytes that a write did not get out (or a flush
    /// is asked for): the writer owes a flush, and nothing is written
    /// around it until then.
    flush: bool,
    ping: bool,
    /// Closing after the queue (`killing` false), or killed, the queue
    /// dropped: one code, since a kill replaces a close.
    ending: Option<Close>,
    killing: bool,
    /// Its holders (the reader, a room): at most a few per connection.
    senders: u32,
    /// The writer has finished (its close sent, or the socket gone).
    ended: bool,
}

impl<T> State<T> {
    fn kill_code(&self) -> Option<Close> {
        self.ending.filter(|_| self.killing)
    }

    fn close_code(&self) -> Option<Close> {
        self.ending.filter(|_| !self.killing)
    }

    fn set_kill(&mut self, code: Close) {
        self.ending = Some(code);
        self.killing = true;
    }

    /// Closes after the queue, unless closing or killed already.
    fn set_close(&mut self, code: Close) {
        if self.ending.is_none() {
            self.ending = Some(code);
        }
    }
}

struct Shared<T, P> {
    state: Mutex<State<T>>,
    writer: AtomicWaker,
    reader: AtomicWaker,
    /// `State::kill` is set: the reader checks this on every poll without
    /// taking the lock.
    killed: AtomicBool,
    /// Whatever else the connection's ends share (the server keeps the
    /// idle socket here), in the same allocation; it gives the bounds.
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
        let first = s.kill_code().is_none();
        if first {
            s.set_kill(code);
            self.killed.store(true, Release);
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

    fn wake_both(&self) {
        self.writer.wake();
        self.reader.wake();
    }
}

impl<T, P: Bounds<T>> Shared<T, P> {
    fn pop(&self, s: &mut State<T>) -> Option<T> {
        let f = s.frames.pop_front()?;
        s.bytes = s.bytes.saturating_sub(P::weigh(&f));
        Some(f)
    }
}

/// Where frames for one connection are queued. Cloned for every holder
/// (the connection's reader, its room); the writer ends when all are gone.
pub struct Outbound<T, P> {
    shared: Arc<Shared<T, P>>,
}

/// The writer's end of the queue.
pub struct Drain<T, P> {
    shared: Arc<Shared<T, P>>,
}

/// A queue within the bounds that `parked` gives, and `parked` shared by
/// both ends.
pub fn queue<T, P: Bounds<T>>(parked: P) -> (Outbound<T, P>, Drain<T, P>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            bytes: 0,
            busy: false,
            flush: false,
            ping: false,
            ending: None,
            killing: false,
            senders: 1,
            ended: false,
        }),
        writer: AtomicWaker::new(),
        reader: AtomicWaker::new(),
        killed: AtomicBool::new(false),
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

impl<T, P: Bounds<T>> Outbound<T, P> {
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
        self.push_with(frame, too_slow, write_now, true)
    }

    /// Queues a frame without waking the writer: a sender with more frames
    /// for this connection in the same turn queues them all, then calls
    /// [`Outbound::release`] once, so that they leave in one write.
    pub fn push_held(&self, frame: T, too_slow: Close) -> Result<(), Refused> {
        self.push_with(frame, too_slow, Direct::Declined, false)
    }

    /// What is queued leaves: when the writer is idle, `write_now` writes
    /// it at once (taking frames from the front for as long as the socket
    /// takes them, then one flush; `false`: not all flushed); what it
    /// leaves, or all of it while the writer is at work, goes to the
    /// writer, woken here.
    pub fn release(&self, write_now: impl FnOnce(&mut VecDeque<T>) -> bool) {
        let mut s = self.shared.lock();
        if s.frames.is_empty() {
            return;
        }
        if !s.busy && !s.flush && s.kill_code().is_none() {
            // Under the queue's lock: nothing is queued meanwhile.
            let mut frames = std::mem::take(&mut s.frames);
            let flushed = write_now(&mut frames);
            s.bytes = frames.iter().map(P::weigh).sum();
            s.flush |= !flushed;
            if !frames.is_empty() {
                s.frames = frames;
            } else if flushed {
                return;
            }
        }
        drop(s);
        self.shared.writer.wake();
    }

    fn push_with(
        &self,
        frame: T,
        too_slow: Close,
        write_now: impl FnOnce(T) -> Direct<T>,
        wake: bool,
    ) -> Result<(), Refused> {
        let mut s = self.shared.lock();
        if s.ending.is_some() {
            return Err(Refused::Closing);
        }
        // Not while a flush is owed: the socket did not take the last
        // frame whole, and what follows must wait in this queue, where its
        // bound counts it, not in the socket's own unsent bytes.
        let frame = if s.frames.is_empty() && !s.busy && !s.flush {
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
        let parked = &self.shared.parked;
        let weight = P::weigh(&frame);
        let over_bytes =
            !s.frames.is_empty() && s.bytes.saturating_add(weight) > parked.max_bytes();
        if s.frames.len() >= parked.cap().max(1) || over_bytes {
            s.set_kill(too_slow);
            self.shared.killed.store(true, Release);
            Shared::<T, P>::discard(&mut s);
            drop(s);
            self.shared.wake_both();
            return Err(Refused::Full);
        }
        s.bytes += weight;
        s.frames.push_back(frame);
        drop(s);
        if wake {
            self.shared.writer.wake();
        }
        Ok(())
    }

    /// Closes the connection after the frames already queued.
    pub fn close(&self, code: Close) {
        let mut s = self.shared.lock();
        s.set_close(code);
        drop(s);
        self.shared.wake_both();
    }

    /// The code the connection was killed with, if it was.
    pub fn killed(&self) -> Option<Close> {
        self.shared.lock().kill_code()
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
        // Registered before the flag is read: a kill that sets it after
        // the read wakes this waker.
        self.shared.reader.register(cx.waker());
        if !self.shared.killed.load(Acquire) {
            return Poll::Pending;
        }
        match self.shared.lock().kill_code() {
            Some(k) => Poll::Ready(k),
            None => Poll::Pending,
        }
    }
}

/// A handle that can only close a connection, and keeps nothing alive: a
/// registry of every socket holds these, so that its connections still end
/// when their own holders let go.
pub struct Closer<T, P> {
    shared: Weak<Shared<T, P>>,
}

impl<T, P> Closer<T, P> {
    /// `f` of what the ends share besides the queue, if the connection
    /// still exists.
    pub fn with_parked<R>(&self, f: impl FnOnce(&P) -> R) -> Option<R> {
        self.shared.upgrade().map(|s| f(&s.parked))
    }

    /// Asks the writer for a WebSocket ping after the frames queued, if
    /// the connection still exists.
    pub fn ping(&self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.lock().ping = true;
            shared.writer.wake();
        }
    }

    /// [`Outbound::close`], if the connection still exists.
    pub fn close(&self, code: Close) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut s = shared.lock();
        s.set_close(code);
        drop(s);
        shared.wake_both();
    }
}

impl<T, P: Bounds<T>> Outbound<T, P> {
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

impl<T, P: Bounds<T>> Drain<T, P> {
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
        if let Some(k) = s.kill_code() {
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
        if let Some(c) = s.close_code() {
            return Some(Work::Close(c));
        }
        (s.senders == 0).then_some(Work::End)
    }

    /// The next queued frame, without waiting (none once killed). Frames
    /// are taken one at a time so that the queue is the only buffer.
    pub fn next_frame(&self) -> Option<T> {
        let mut s = self.shared.lock();
        if s.kill_code().is_some() {
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

/// The bytes of one queue's allocation (its `Arc`'s counts and the
/// queue with what its ends share), for tests that keep it within an
/// allocator size class.
#[cfg(test)]
pub(crate) const fn allocation_bytes<T, P>() -> usize {
    2 * std::mem::size_of::<usize>() + std::mem::size_of::<Shared<T, P>>()
}

#[cfg(test)]
mod tests;
