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
}

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
    loop {
        // Records first, in the unit's order: nothing they hold back is
        // carried out before they are queued. A full store queue holds
        // the unit here; its commands wait in its own bounded queue.
        while let Some(w) = unit.poll_write() {
            let own = unit.write_key(&w).map(str::to_owned);
            let key = own.as_deref().unwrap_or(key);
            let durable = if unit.waits_for_store() {
                writer.queue_acked(key, w.records).await
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
                return;
            }
        }
        // A time that passed while commands kept the unit busy (or on a
        // clock that moved without the timer) is handled before more come.
        let now = clock.now_ms();
        // Asked once a turn: a unit's earliest deadline can cost a walk of
        // its pending calls (a hosted session's devices).
        let due = unit.poll_timeout();
        if due.is_some_and(|at| at <= now) {
            unit.handle_timeout(now);
            continue;
        }
        if !open && acks.is_empty() {
            return;
        }
        let timer = due.map(|at| Duration::from_millis(at.saturating_sub(now)));
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
                    // Group commit: the commands already queued join
                    // before the writes are polled.
                    while unit.takes_queued() && unit.accepts() {
                        match rx.try_recv() {
                            Ok(c) => unit.handle(c.into(), clock.now_ms()),
                            Err(_) => break,
                        }
                    }
                }
                // The senders are gone; the answers still come.
                None => open = false,
            },
            () = sleep(timer) => unit.handle_timeout(clock.now_ms()),
        }
    }
}

/// Sleeps for `d`, or forever without one. The clock may be a manual one
/// in tests: a command then moves the unit, and this only bounds the wait.
async fn sleep(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{StoreMetrics, StoreProtocol};
    use hostwire_core::ManualClock;
    use hostwire_store::{StoreError, UnitResults, UnitStore};
    use std::sync::Arc;

    #[derive(Debug)]
    struct Rec(u32);

    impl StoreWrite for Rec {
        fn bytes(&self) -> usize {
            4
        }
    }

    /// Refuses the record 4.
    struct Refuses4;

    impl UnitStore<Rec> for Refuses4 {
        fn apply_units(&self, units: &[hostwire_store::Unit<'_, Rec>]) -> UnitResults {
            hostwire_store::apply_each(units, |ws| match ws.iter().any(|r| r.0 == 4) {
                true => Err(StoreError::Commit("refused".into())),
                false => Ok(()),
            })
        }
    }

    /// A toy unit: an even command is stored and told (with whether it
    /// was durable) once answered, and holds every command behind it; an
    /// odd one is told at once; 9 asks for its timer.
    #[derive(Default)]
    struct Toy {
        out: VecDeque<(u32, bool)>,
        writes: VecDeque<Write<Rec>>,
        pending: Option<u32>,
        timer: Option<u64>,
    }

    impl Unit for Toy {
        type Command = u32;
        type Output = (u32, bool);
        type Record = Rec;
        fn handle(&mut self, n: u32, now: u64) {
            match n {
                9 => self.timer = Some(now),
                n if n % 2 == 0 => {
                    self.pending = Some(n);
                    self.writes.push_back(Write {
                        id: n.into(),
                        records: vec![Rec(n)],
                    });
                }
                n => self.out.push_back((n, true)),
            }
        }
        fn poll_output(&mut self) -> Option<(u32, bool)> {
            self.out.pop_front()
        }
        fn poll_timeout(&self) -> Option<u64> {
            self.timer
        }
        fn handle_timeout(&mut self, _now: u64) {
            self.timer = None;
            self.out.push_back((99, true));
        }
        fn poll_write(&mut self) -> Option<Write<Rec>> {
            self.writes.pop_front()
        }
        fn ack(&mut self, id: u64, durable: bool, _now: u64) {
            assert_eq!(self.pending.take().map(u64::from), Some(id));
            self.out.push_back((id as u32, durable));
        }
        fn accepts(&self) -> bool {
            self.pending.is_none()
        }
    }

    #[derive(Default)]
    struct Told(Vec<(u32, bool)>);

    impl Deliver<Toy> for Told {
        fn deliver(&mut self, _: &Toy, out: (u32, bool)) -> ControlFlow<()> {
            self.0.push(out);
            ControlFlow::Continue(())
        }
    }

    #[tokio::test]
    async fn outputs_wait_for_their_acknowledgement_and_commands_behind_them_wait_in_the_queue() {
        let writer = StoreWriter::start(
            Arc::new(Refuses4) as Arc<dyn UnitStore<Rec>>,
            StoreProtocol::Relay,
            Arc::new(StoreMetrics::default()),
        );
        let clock = ManualClock::new(1_000);
        let (tx, mut rx) = mpsc::channel::<u32>(8);
        for n in [1, 2, 3, 4, 5, 9] {
            tx.send(n).await.unwrap();
        }
        drop(tx);
        let (mut toy, mut told) = (Toy::default(), Told::default());
        let store = Store {
            writer: &writer,
            key: "toy",
            clock: &clock,
        };
        drive(&mut toy, &mut told, &mut rx, store).await;
        assert_eq!(
            told.0,
            [
                (1, true),
                (2, true),
                (3, true),
                (4, false),
                (5, true),
                (99, true)
            ]
        );
    }

    /// A record as large as the whole store queue: one fills it.
    #[derive(Debug)]
    struct Big;

    impl StoreWrite for Big {
        fn bytes(&self) -> usize {
            crate::store_writer::STORE_QUEUE_BYTES
        }
    }

    /// A store that holds every write until it is opened.
    #[derive(Default)]
    struct Gate {
        open: std::sync::Mutex<bool>,
        opened: std::sync::Condvar,
    }

    impl UnitStore<Big> for Gate {
        fn apply_units(&self, units: &[hostwire_store::Unit<'_, Big>]) -> UnitResults {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
            hostwire_store::apply_each(units, |_| Ok(()))
        }
    }

    /// Every command is one write; told each write's answer; does not wait
    /// for room in the store queue.
    #[derive(Default)]
    struct Eager {
        writes: VecDeque<Write<Big>>,
        out: VecDeque<(u64, bool)>,
    }

    impl Unit for Eager {
        type Command = u64;
        type Output = (u64, bool);
        type Record = Big;
        fn handle(&mut self, n: u64, _now: u64) {
            self.writes.push_back(Write {
                id: n,
                records: vec![Big],
            });
        }
        fn poll_output(&mut self) -> Option<(u64, bool)> {
            self.out.pop_front()
        }
        fn poll_timeout(&self) -> Option<u64> {
            None
        }
        fn handle_timeout(&mut self, _now: u64) {}
        fn poll_write(&mut self) -> Option<Write<Big>> {
            self.writes.pop_front()
        }
        fn ack(&mut self, id: u64, durable: bool, _now: u64) {
            self.out.push_back((id, durable));
        }
        fn waits_for_store(&self) -> bool {
            false
        }
    }

    /// Opens the gate once the refused write is told.
    struct Opens(Arc<Gate>, Vec<(u64, bool)>);

    impl Deliver<Eager> for Opens {
        fn deliver(&mut self, _: &Eager, out: (u64, bool)) -> ControlFlow<()> {
            if out == (2, false) {
                *self.0.open.lock().unwrap() = true;
                self.0.opened.notify_all();
            }
            self.1.push(out);
            ControlFlow::Continue(())
        }
    }

    #[tokio::test]
    async fn a_unit_that_does_not_wait_for_the_store_has_a_write_refused_at_once_on_a_full_queue() {
        let gate = Arc::new(Gate::default());
        let writer = StoreWriter::start(
            Arc::clone(&gate) as Arc<dyn UnitStore<Big>>,
            StoreProtocol::Relay,
            Arc::new(StoreMetrics::default()),
        );
        let clock = ManualClock::new(1_000);
        let (tx, mut rx) = mpsc::channel::<u64>(8);
        tx.send(1).await.unwrap();
        tx.send(2).await.unwrap();
        drop(tx);
        let mut to = Opens(Arc::clone(&gate), Vec::new());
        let store = Store {
            writer: &writer,
            key: "eager",
            clock: &clock,
        };
        let mut eager = Eager::default();
        let driven = drive(&mut eager, &mut to, &mut rx, store);
        let ended = tokio::time::timeout(Duration::from_secs(10), driven).await;
        // Opened in any case: the runtime ends only once the store's
        // blocking write does.
        *gate.open.lock().unwrap() = true;
        gate.opened.notify_all();
        ended.expect("the second write waited for the first");
        // The second is refused while the first still fills the queue.
        assert_eq!(to.1, [(2, false), (1, true)]);
    }

    /// Keeps the key and records of every unit it is given.
    #[derive(Default)]
    struct Keys(std::sync::Mutex<Vec<(String, Vec<u32>)>>);

    impl UnitStore<Rec> for Keys {
        fn apply_units(&self, units: &[hostwire_store::Unit<'_, Rec>]) -> UnitResults {
            let mut seen = self.0.lock().unwrap();
            for u in units {
                seen.push((u.key.to_owned(), u.writes.iter().map(|r| r.0).collect()));
            }
            hostwire_store::apply_each(units, |_| Ok(()))
        }
    }

    /// A unit that takes every queued command into one write, keyed by
    /// the parity of its first record.
    #[derive(Default)]
    struct Grouped {
        records: Vec<Rec>,
        acked: Vec<u64>,
    }

    impl Unit for Grouped {
        type Command = u32;
        type Output = ();
        type Record = Rec;
        fn handle(&mut self, n: u32, _now: u64) {
            self.records.push(Rec(n));
        }
        fn poll_output(&mut self) -> Option<()> {
            None
        }
        fn poll_timeout(&self) -> Option<u64> {
            None
        }
        fn handle_timeout(&mut self, _now: u64) {}
        fn poll_write(&mut self) -> Option<Write<Rec>> {
            if self.records.is_empty() {
                return None;
            }
            let id = self.records[0].0.into();
            Some(Write {
                id,
                records: std::mem::take(&mut self.records),
            })
        }
        fn ack(&mut self, id: u64, durable: bool, _now: u64) {
            assert!(durable);
            self.acked.push(id);
        }
        fn takes_queued(&self) -> bool {
            self.records.len() < 3
        }
        fn write_key<'w>(&self, w: &'w Write<Rec>) -> Option<&'w str> {
            Some(if w.records[0].0.is_multiple_of(2) {
                "even"
            } else {
                "odd"
            })
        }
    }

    impl Deliver<Grouped> for Told {
        fn deliver(&mut self, _: &Grouped, _: ()) -> ControlFlow<()> {
            ControlFlow::Continue(())
        }
    }

    #[tokio::test]
    async fn queued_commands_join_one_write_under_the_key_the_unit_names() {
        let keys = Arc::new(Keys::default());
        let writer = StoreWriter::start(
            Arc::clone(&keys) as Arc<dyn UnitStore<Rec>>,
            StoreProtocol::Relay,
            Arc::new(StoreMetrics::default()),
        );
        let clock = ManualClock::new(1_000);
        let (tx, mut rx) = mpsc::channel::<u32>(8);
        for n in [1, 2, 3, 4, 5] {
            tx.send(n).await.unwrap();
        }
        drop(tx);
        let mut unit = Grouped::default();
        let store = Store {
            writer: &writer,
            key: "unit",
            clock: &clock,
        };
        drive(&mut unit, &mut Told::default(), &mut rx, store).await;
        assert_eq!(unit.acked, [1, 4]);
        assert_eq!(
            *keys.0.lock().unwrap(),
            [
                ("odd".to_owned(), vec![1, 2, 3]),
                ("even".to_owned(), vec![4, 5])
            ]
        );
    }
}
