//! THE driver of a stateful unit (relay room, hosted session, ggui
//! session, PlayerThree match): one task owns the unit's sans-IO state
//! machine and handles its commands in order, so "in order, at most once"
//! holds by construction with no lock on the hot path.
//!
//! The state machine ([`Unit`]) lives in its protocol crate and knows no
//! socket, task, store or wall time: it takes commands at `now`, hands out
//! the records to persist ([`Unit::poll_write`]) and takes each one's
//! acknowledgement back ([`Unit::ack`]); what it tells connections and
//! requests comes out of [`Unit::poll_output`], released when the unit's
//! own rules say (a change acknowledged only once durable). The driver
//! ([`drive`]) does the I/O: commands from the unit's bounded queue,
//! records through the protocol's one store writer (keyed by the unit, so
//! they are written in the unit's order), the unit's timer, and outputs to
//! the server side of the unit ([`Deliver`]: its connections' outbound
//! queues, the replies of the requests waiting).

mod offer;

pub use offer::{offer, offer_owned, Offer};

use crate::store_writer::StoreWriter;
use hostwire_core::Clock;
use hostwire_store::StoreWrite;
use std::collections::VecDeque;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::mpsc;

/// Records to persist as one unit of the store writer (all or nothing),
/// named by `id` until its acknowledgement comes back.
#[derive(Debug)]
pub struct Write<R> {
    pub id: u64,
    pub records: Vec<R>,
}

/// A stateful unit as a sans-IO state machine (the shape of quinn-proto's
/// `Connection`): input through `handle…` and `ack` with `now`, output
/// pulled with `poll_…`.
pub trait Unit {
    /// What the unit is asked: a connection's frame, an API request, a
    /// sweep.
    type Command;
    /// What the driver carries out: frames and closes for connections,
    /// answers to requests.
    type Output;
    /// One record the store keeps.
    type Record: StoreWrite + Sync;

    /// Handles one command at `now` (ms on the unit's clock).
    fn handle(&mut self, cmd: Self::Command, now: u64);

    /// The next output to carry out, in order.
    fn poll_output(&mut self) -> Option<Self::Output>;

    /// When the unit wants [`Unit::handle_timeout`] called (ms on its
    /// clock); `None`: no timer.
    fn poll_timeout(&self) -> Option<u64>;

    /// The time from [`Unit::poll_timeout`] has come.
    fn handle_timeout(&mut self, now: u64);

    /// The next records to persist, in order; each is answered with
    /// [`Unit::ack`].
    fn poll_write(&mut self) -> Option<Write<Self::Record>>;

    /// The store's answer to write `id`: durable, or refused.
    fn ack(&mut self, id: u64, durable: bool, now: u64);

    /// Whether the unit takes another command now; while it does not, the
    /// commands wait in the bounded queue (and their senders behind it)
    /// until an acknowledgement comes.
    fn accepts(&self) -> bool {
        true
    }

    /// Whether a write waits for room in a full store queue (the default:
    /// the unit is held there, its commands wait in its own queue) or is
    /// answered refused at once (`ack(id, false, now)`), for a unit that
    /// must keep answering its commands and timers while the store is
    /// behind (a hosted session: its devices' calls and deadlines).
    fn waits_for_store(&self) -> bool {
        true
    }

    /// Whether the unit takes another command already in its queue before
    /// its writes are polled (group commit: several commands share one
    /// write and its commit). The driver takes them while this says so,
    /// the unit [`Unit::accepts`] and the queue has one ready; by default
    /// each command's writes are polled at once.
    fn takes_queued(&self) -> bool {
        false
    }

    /// The store writer's key of write `w`, when one task serves several
    /// units each with its own (a write is then ordered with that key's
    /// writes alone); `None`: the driver's key ([`Store::key`]).
    fn write_key<'w>(&self, _w: &'w Write<Self::Record>) -> Option<&'w str> {
        None
    }
}

/// The server side of a unit: where its outputs go.
pub trait Deliver<U: Unit> {
    /// Carries out one output; `Break` ends the unit's task (it closed).
    fn deliver(&mut self, unit: &U, out: U::Output) -> ControlFlow<()>;

    /// Frames that [`Deliver::deliver`] held for their connections leave
    /// now. The driver calls this before it waits, and at least every
    /// [`RELEASE_AFTER_TURNS`] commands: commands waiting in the queue are
    /// handled first, so that the frames of a burst leave a socket in one
    /// write.
    fn release(&mut self) {}
}

/// Commands handled back to back before held frames leave regardless: a
/// bound on what a frame waits for while its unit is busy.
pub const RELEASE_AFTER_TURNS: usize = 32;

/// Where a unit's records go: its protocol's store writer, under the
/// unit's key.
pub struct Store<'a, R> {
    pub writer: &'a StoreWriter<R>,
    pub key: &'a str,
    pub clock: &'a dyn Clock,
}

/// An acknowledgement on its way, oldest first (the writer answers a
/// key's units in the order they were queued).
type Ack = (u64, Pin<Box<dyn Future<Output = bool> + Send>>);

/// Drives `unit` until it closes (an output says `Break`) or its queue's
/// senders are gone and every write is answered.
pub async fn drive<U, D, C>(
    unit: &mut U,
    to: &mut D,
    rx: &mut mpsc::Receiver<C>,
    store: Store<'_, U::Record>,
) where
    U: Unit,
    D: Deliver<U>,
    C: Into<U::Command>,
{
    let Store { writer, key, clock } = store;
    let mut acks: VecDeque<Ack> = VecDeque::new();
    let mut open = true;
    let mut turns = 0;
    // One timer for the unit's life, moved only when its deadline moves:
    // a new one each turn would be put in and taken out of the runtime's
    // timer wheel on every command.
    let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
    let mut armed: Option<u64> = None;
    loop {
        // Records first, in the unit's order: nothing they hold back is
        // carried out before they are queued. A full store queue holds
        // the unit here; its commands wait in its own bounded queue.
        while let Some(w) = unit.poll_write() {
            let own = unit.write_key(&w).map(str::to_owned);
            let key = own.as_deref().unwrap_or(key);
            let durable = if unit.waits_for_store() {
                // Boxed: the wait's state (about 650 bytes) would widen
                // every unit's task for its life.
                Box::pin(writer.queue_acked(key, w.records)).await
            } else if let Some(d) = writer.try_queue_acked(key, w.records) {
                d
            } else {
                unit.ack(w.id, false, clock.now_ms());
                continue;
            };
            acks.push_back((w.id, Box::pin(durable.wait())));
        }
        while let Some(out) = unit.poll_output() {
            if to.deliver(unit, out).is_break() {
                to.release();
                return;
            }
        }
        // Asked once a turn: a unit's earliest deadline can cost a walk of
        // its pending calls (a hosted session's devices).
        let due = unit.poll_timeout();
        // A time that passed while commands kept the unit busy (or on a
        // clock that moved without the timer) is handled before more come.
        // The clock is read only for a unit with a deadline (a relay room
        // has none): a read is about a hundred instructions, per command.
        let now = if due.is_some() { clock.now_ms() } else { 0 };
        if due.is_some_and(|at| at <= now) {
            unit.handle_timeout(now);
            continue;
        }
        // Held frames leave unless a command is ready to be handled now.
        let next_ready = open && unit.accepts() && !rx.is_empty();
        if !next_ready || turns >= RELEASE_AFTER_TURNS {
            to.release();
            turns = 0;
        }
        if !open && acks.is_empty() {
            return;
        }
        if let Some(at) = due.filter(|at| armed != Some(*at)) {
            let wait = Duration::from_millis(at.saturating_sub(now));
            timer.as_mut().reset(tokio::time::Instant::now() + wait);
            armed = Some(at);
        }
        tokio::select! {
            biased;
            durable = async { acks.front_mut().expect("not empty").1.as_mut().await },
                if !acks.is_empty() =>
            {
                let (id, _) = acks.pop_front().expect("not empty");
                unit.ack(id, durable, clock.now_ms());
            }
            cmd = rx.recv(), if open && unit.accepts() => match cmd {
                Some(c) => {
                    unit.handle(c.into(), clock.now_ms());
                    turns += 1;
                    // Group commit: the commands already queued join
                    // before the writes are polled.
                    while unit.takes_queued() && unit.accepts() {
                        match rx.try_recv() {
                            Ok(c) => {
                                unit.handle(c.into(), clock.now_ms());
                                turns += 1;
                            }
                            Err(_) => break,
                        }
                    }
                }
                // The senders are gone; the answers still come.
                None => open = false,
            },
            // The clock may be a manual one in tests: a command then moves
            // the unit, and this only bounds the wait.
            () = timer.as_mut(), if due.is_some() => {
                armed = None;
                unit.handle_timeout(clock.now_ms());
            }
        }
    }
}

#[cfg(test)]
mod tests;
