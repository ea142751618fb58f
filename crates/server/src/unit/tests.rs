//! The unit driver tested with toy units on a manual clock and a store
//! writer over in-memory stores.

use super::*;
use crate::metrics::{StoreMetrics, StoreProtocol};
use hostwire_core::ManualClock;
use hostwire_store::{StoreError, UnitResults, UnitStore};
use std::sync::Arc;

/// A store writer over `store`, as a protocol's is started.
fn writer_on<R: StoreWrite + Send + Sync + 'static>(
    store: Arc<dyn UnitStore<R>>,
) -> StoreWriter<R> {
    StoreWriter::start(
        store,
        StoreProtocol::Relay,
        Arc::new(StoreMetrics::default()),
    )
}

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

/// What was told, and how many outputs each release let go.
#[derive(Default)]
struct Told(Vec<(u32, bool)>, Vec<usize>, usize);

impl Deliver<Toy> for Told {
    fn deliver(&mut self, _: &Toy, out: (u32, bool)) -> ControlFlow<()> {
        self.0.push(out);
        self.2 += 1;
        ControlFlow::Continue(())
    }
    fn release(&mut self) {
        if self.2 > 0 {
            self.1.push(std::mem::take(&mut self.2));
        }
    }
}

#[tokio::test]
async fn commands_already_queued_are_handled_before_held_frames_leave_and_at_most_a_bound_of_them()
{
    let writer = writer_on(Arc::new(Refuses4));
    let clock = ManualClock::new(1_000);
    let n = RELEASE_AFTER_TURNS as u32 + 8;
    let (tx, mut rx) = mpsc::channel::<u32>(n as usize);
    for i in 0..n {
        tx.send(2 * i + 1).await.unwrap();
    }
    let (mut toy, mut told) = (Toy::default(), Told::default());
    let store = Store {
        writer: &writer,
        key: "toy",
        clock: &clock,
    };
    let driven = async {
        drive(&mut toy, &mut told, &mut rx, store).await;
        told
    };
    let later = async {
        tokio::task::yield_now().await;
        drop(tx);
    };
    let (told, ()) = tokio::join!(driven, later);
    assert_eq!(told.0.len(), n as usize);
    // One release for the first bound of commands, one for the rest;
    // without holding, each output would be released on its own.
    assert_eq!(told.1, vec![RELEASE_AFTER_TURNS, 8]);
}

#[tokio::test]
async fn outputs_wait_for_their_acknowledgement_and_commands_behind_them_wait_in_the_queue() {
    let writer = writer_on(Arc::new(Refuses4));
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
    let writer = writer_on(Arc::clone(&gate) as Arc<dyn UnitStore<Big>>);
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
    let writer = writer_on(Arc::clone(&keys) as Arc<dyn UnitStore<Rec>>);
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

/// A unit whose deadline is its last command (ms on its clock); records
/// when, on the runtime's clock, its timer came.
struct Timed {
    due: Option<u64>,
    fired: Vec<std::time::Duration>,
    start: tokio::time::Instant,
}

impl Unit for Timed {
    type Command = u64;
    type Output = ();
    type Record = Rec;
    fn handle(&mut self, at: u64, _now: u64) {
        self.due = Some(at);
    }
    fn poll_output(&mut self) -> Option<()> {
        None
    }
    fn poll_timeout(&self) -> Option<u64> {
        self.due
    }
    fn handle_timeout(&mut self, _now: u64) {
        self.due = None;
        self.fired.push(self.start.elapsed());
    }
    fn poll_write(&mut self) -> Option<Write<Rec>> {
        None
    }
    fn ack(&mut self, _id: u64, _durable: bool, _now: u64) {}
}

impl Deliver<Timed> for () {
    fn deliver(&mut self, _: &Timed, _: ()) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_timer_follows_a_deadline_that_moves_and_fires_once_at_it() {
    let writer = writer_on(Arc::new(Refuses4));
    // The unit's clock stands still: only the runtime's time passes.
    let clock = ManualClock::new(0);
    let (tx, mut rx) = mpsc::channel::<u64>(8);
    let start = tokio::time::Instant::now();
    let mut unit = Timed {
        due: None,
        fired: Vec::new(),
        start,
    };
    let store = Store {
        writer: &writer,
        key: "timed",
        clock: &clock,
    };
    let steps = async {
        tx.send(500).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Moved earlier while armed for 500 ms: it comes at 100.
        tx.send(100).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Set again after it fired: it comes again, 50 ms later.
        tx.send(50).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        drop(tx);
    };
    let mut to = ();
    tokio::join!(drive(&mut unit, &mut to, &mut rx, store), steps);
    let ms: Vec<u128> = unit.fired.iter().map(|d| d.as_millis()).collect();
    assert_eq!(ms, vec![110, 360]);
}
