//! THE store writer: every protocol's durable writes go through one of
//! these (one per protocol, each with its own queue, so one protocol's
//! flood waits in its own queue, not in another's).
//!
//! Each message is one unit: the records of one command of one relay
//! room, ggui session, PlayerThree match or hosted session (its key), all
//! or nothing. The writer takes what is queued as one batch and writes it
//! in the blocking pool as one transaction with a savepoint per unit, so
//! one unit's failed write fails that unit only, and the later units of
//! the same key in the batch (a unit's records never land out of order).
//! Each unit that asked is answered once it is durable or failed
//! ([`Durable`]); failures are counted per protocol in `/metrics`.
//!
//! A lone small unit asked for while the writer has nothing unanswered is
//! committed by its caller at once, on the caller's task (see
//! `StoreWriter::write_now`): no wake of the writer's task there, none of
//! the caller's for the answer. It keeps the order of a key's units, as
//! it never runs while an earlier unit is still with the writer.
//!
//! The queue is bounded twice: [`STORE_QUEUE`] units and
//! [`STORE_QUEUE_BYTES`] bytes of records waiting. A full queue makes the
//! unit that writes wait (back-pressure instead of unbounded memory), and
//! everything queued is written before shutdown ([`StoreWriter::flush`]).
//!
//! On a cluster (PostgreSQL), a writer started with a [`Fence`] writes each
//! unit under the lease generation its node holds for the unit's key when
//! the unit is queued; a unit the store refuses as
//! [`Fenced`](hostwire_store::StoreError::Fenced) is reported to the fence,
//! whose node then drops the unit (another node took it over).

use crate::metrics::{StoreMetrics, StoreProtocol};
use hostwire_store::{StoreError, StoreWrite, Unit, UnitStore};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// Units waiting for one protocol's writer; a full queue makes the unit
/// that writes wait.
pub const STORE_QUEUE: usize = 1024;
/// Bytes of records waiting for one protocol's writer (64 MiB); a unit
/// larger than this waits until the queue is empty and then takes all of
/// it.
pub const STORE_QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// The most units written in one transaction.
const MAX_BATCH: usize = 4096;
/// The most bytes of records written in one transaction (a batch may pass
/// it by one unit): a batch holds the database for a short while only, so
/// the other protocols' writers get their turn.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// A batch of at most this many units ([`INLINE_BATCH_BYTES`] bytes) is
/// committed on the writer's own task when the store's connection is free:
/// a small WAL commit without fsync costs tens of microseconds, and the
/// hop to a blocking thread and back costs more (two thread wakes, which
/// made a lone ggui action cost twice what it costs in a burst). The
/// store refuses the inline path while another writer holds its
/// connection or a checkpoint is due, so the task never waits on a lock
/// or an fsync.
///
/// Only small: the commit runs on an async worker thread, and under a flood
/// batches grow past these bounds and go the blocking way again (where one
/// hop is shared by the whole batch). With 64 KiB, a flood of 64 KiB
/// PlayerThree mandates committed on the workers slowed relay room
/// creation twice as much (`store_fairness`).
pub const INLINE_BATCH_UNITS: usize = 4;
/// See [`INLINE_BATCH_UNITS`] (16 KiB of records).
pub const INLINE_BATCH_BYTES: usize = 16 * 1024;

/// What the writer's task and the units that commit on their own task
/// share.
struct Shared<W> {
    store: Arc<dyn UnitStore<W>>,
    protocol: StoreProtocol,
    metrics: Arc<StoreMetrics>,
    /// The leases its units are written under (a cluster's).
    fence: Option<Arc<dyn Fence>>,
    /// Units handed to the writer's task and not answered yet (queued or
    /// in its batch): a unit commits on its caller's task only while this
    /// is 0, so it never overtakes an earlier unit of its key.
    pending: AtomicUsize,
    /// Held by the writer's task while it writes a batch, and by a caller
    /// committing a lone unit: one of them writes at a time.
    turn: tokio::sync::Mutex<()>,
}

impl<W: StoreWrite> Shared<W> {
    /// Counts a written batch and its failures, reports the fenced units,
    /// and answers each unit that asked.
    fn answer(&self, units: Vec<Queued<W>>, results: hostwire_store::UnitResults) {
        for (unit, r) in units.into_iter().zip(results) {
            self.report(&unit.key, unit.writes.len(), &r);
            if let Some(a) = unit.ack {
                let _ = a.send(r.is_ok());
            }
        }
    }

    fn report(&self, key: &str, writes: usize, r: &Result<(), StoreError>) {
        let protocol = self.protocol;
        if let (Err(StoreError::Fenced { held, .. }), Some(f)) = (r, &self.fence) {
            // Not a failure of the store: the unit is another node's now.
            f.fenced(key, *held);
        } else if let Err(e) = r {
            self.metrics.error(protocol);
            tracing::error!(
                error = %e,
                protocol = crate::metrics::Label::name(protocol),
                unit = %key,
                writes,
                "store write failed"
            );
        }
    }
}

type Written<W> = (
    Vec<Queued<W>>,
    hostwire_store::UnitResults,
    std::time::Duration,
);

/// The batch committed on this task, if it is small and the store can
/// start at once.
fn write_inline<W: StoreWrite>(
    store: &dyn UnitStore<W>,
    units: &[Queued<W>],
    bytes: usize,
) -> Option<(hostwire_store::UnitResults, std::time::Duration)> {
    if units.len() > INLINE_BATCH_UNITS || bytes > INLINE_BATCH_BYTES {
        return None;
    }
    let t = Instant::now();
    let results = store.try_apply_units_now(&refs(units))?;
    Some((results, t.elapsed()))
}

/// The batch committed in the blocking pool (where a test's paused clock
/// does not jump while a write runs).
async fn write_blocking<W: StoreWrite + Sync>(
    store: Arc<dyn UnitStore<W>>,
    units: Vec<Queued<W>>,
) -> Result<Written<W>, tokio::task::JoinError> {
    crate::blocking::spawn(move || {
        let t = Instant::now();
        let results = store.apply_units(&refs(&units));
        (units, results, t.elapsed())
    })
    .await
}

fn refs<W>(units: &[Queued<W>]) -> Vec<Unit<'_, W>> {
    units
        .iter()
        .map(|u| Unit {
            key: &u.key,
            writes: &u.writes,
            fence: u.fence,
        })
        .collect()
}

/// The generation of the lease this node holds on each unit, for a writer
/// whose units are leased (a cluster on PostgreSQL).
pub trait Fence: Send + Sync + 'static {
    /// The generation this node holds for the unit `key`; `None` when it
    /// holds none (the unit was lost or never taken): its writes are then
    /// refused, never written unchecked.
    fn generation(&self, key: &str) -> Option<u64>;
    /// The store refused a write of `key` made under `generation`: another
    /// node holds the unit now.
    fn fenced(&self, key: &str, generation: u64);
}

/// The fence of a unit this node holds no lease for: no lease has
/// generation 0 (they start at 1), so the store refuses it.
const NO_GENERATION: u64 = 0;

struct Queued<W> {
    key: String,
    writes: Vec<W>,
    /// The lease generation the unit is written under (`None`: one node).
    fence: Option<u64>,
    ack: Option<oneshot::Sender<bool>>,
    _bytes: OwnedSemaphorePermit,
}

enum Msg<W> {
    Unit(Queued<W>),
    Flush(oneshot::Sender<()>),
}

/// Whether a queued unit became durable, once the writer has tried.
pub struct Durable(Option<oneshot::Receiver<bool>>);

impl Durable {
    /// The answer of a unit already written.
    fn answered(durable: bool) -> Durable {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(durable);
        Durable(Some(rx))
    }

    /// `true` once durable; `false` if the write failed (or the writer is
    /// gone). The writer answers every unit it takes.
    pub async fn wait(self) -> bool {
        match self.0 {
            Some(rx) => rx.await.unwrap_or(false),
            None => false,
        }
    }

    /// The answer if it has come: `Some(durable)`, or `None` while the
    /// write is pending.
    pub fn poll_now(&mut self) -> Option<bool> {
        match &mut self.0 {
            None => Some(false),
            Some(rx) => match rx.try_recv() {
                Ok(ok) => Some(ok),
                Err(oneshot::error::TryRecvError::Empty) => None,
                Err(oneshot::error::TryRecvError::Closed) => Some(false),
            },
        }
    }
}

/// A handle to one protocol's store writer.
pub struct StoreWriter<W> {
    tx: mpsc::Sender<Msg<W>>,
    bytes: Arc<Semaphore>,
    /// Units in the batch being written now (0 while idle).
    in_batch: Arc<AtomicUsize>,
    shared: Arc<Shared<W>>,
}

impl<W> Clone for StoreWriter<W> {
    fn clone(&self) -> Self {
        StoreWriter {
            tx: self.tx.clone(),
            bytes: Arc::clone(&self.bytes),
            in_batch: Arc::clone(&self.in_batch),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<W: StoreWrite + Sync> StoreWriter<W> {
    /// Starts the writer of `protocol`'s records into `store`.
    pub fn start(
        store: Arc<dyn UnitStore<W>>,
        protocol: StoreProtocol,
        metrics: Arc<StoreMetrics>,
    ) -> StoreWriter<W> {
        Self::start_fenced(store, protocol, metrics, None)
    }

    /// [`StoreWriter::start`] whose units are written under the lease
    /// generations of `fence` (none: unchecked, one node).
    pub fn start_fenced(
        store: Arc<dyn UnitStore<W>>,
        protocol: StoreProtocol,
        metrics: Arc<StoreMetrics>,
        fence: Option<Arc<dyn Fence>>,
    ) -> StoreWriter<W> {
        let (tx, mut rx) = mpsc::channel::<Msg<W>>(STORE_QUEUE);
        let in_batch = Arc::new(AtomicUsize::new(0));
        let batch_len = Arc::clone(&in_batch);
        let shared = Arc::new(Shared {
            store,
            protocol,
            metrics,
            fence,
            pending: AtomicUsize::new(0),
            turn: tokio::sync::Mutex::new(()),
        });
        let task = Arc::clone(&shared);
        tokio::spawn(async move {
            let shared = task;
            while let Some(first) = rx.recv().await {
                // A lone unit committing on its caller's task finishes
                // first (a short wait: a small commit).
                let turn = shared.turn.lock().await;
                let mut units = Vec::new();
                let mut flushes = Vec::new();
                let mut bytes = 0;
                let mut next = Some(first);
                while let Some(msg) = next.take() {
                    match msg {
                        Msg::Unit(u) => {
                            bytes += u.writes.iter().map(StoreWrite::bytes).sum::<usize>();
                            units.push(u);
                        }
                        Msg::Flush(done) => flushes.push(done),
                    }
                    if units.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                        next = rx.try_recv().ok();
                    }
                }
                let taken = units.len();
                if !units.is_empty() {
                    batch_len.store(units.len(), Relaxed);
                    let written = match write_inline(&*shared.store, &units, bytes) {
                        Some((results, took)) => Ok((units, results, took)),
                        None => write_blocking(Arc::clone(&shared.store), units).await,
                    };
                    match written {
                        Ok((units, results, took)) => {
                            shared.metrics.write(took.as_micros() as u64);
                            shared.answer(units, results);
                        }
                        Err(e) => {
                            // The write panicked: nothing of it is known
                            // to be stored. Dropped acks answer `false`.
                            shared.metrics.error(protocol);
                            tracing::error!(error = %e, protocol = crate::metrics::Label::name(protocol), "store write failed");
                        }
                    }
                    batch_len.store(0, Relaxed);
                }
                shared.pending.fetch_sub(taken, SeqCst);
                drop(turn);
                for f in flushes {
                    let _ = f.send(());
                }
            }
        });
        StoreWriter {
            tx,
            bytes: Arc::new(Semaphore::new(STORE_QUEUE_BYTES)),
            in_batch,
            shared,
        }
    }

    /// Commits one small unit on the caller's task when the writer is
    /// idle (nothing handed to it unanswered) and the store can start at
    /// once: a lone unit then costs no wake of the writer's task and none
    /// of the caller's for the answer (a spaced ggui action paid both).
    /// `Err` gives the writes back, to be queued.
    fn write_now(&self, key: &str, writes: Vec<W>) -> Result<bool, Vec<W>> {
        let bytes: usize = writes.iter().map(StoreWrite::bytes).sum();
        if bytes > INLINE_BATCH_BYTES || writes.is_empty() {
            return Err(writes);
        }
        let Ok(_turn) = self.shared.turn.try_lock() else {
            return Err(writes);
        };
        // Under the turn: a unit handed over before this is still counted
        // (the count falls only once it is answered), so this one never
        // overtakes an earlier unit of its key.
        if self.shared.pending.load(SeqCst) != 0 {
            return Err(writes);
        }
        let unit = Unit {
            key,
            writes: &writes,
            fence: self.fence_of(key),
        };
        let t = Instant::now();
        let Some(results) = self.shared.store.try_apply_units_now(&[unit]) else {
            return Err(writes);
        };
        self.shared.metrics.write(t.elapsed().as_micros() as u64);
        let r = results
            .into_iter()
            .next()
            .unwrap_or(Err(StoreError::Commit("no result".into())));
        self.shared.report(key, writes.len(), &r);
        Ok(r.is_ok())
    }

    /// The generation `key`'s writes carry now.
    fn fence_of(&self, key: &str) -> Option<u64> {
        self.shared
            .fence
            .as_ref()
            .map(|f| f.generation(key).unwrap_or(NO_GENERATION))
    }

    fn permits(writes: &[W]) -> u32 {
        let n: usize = writes.iter().map(StoreWrite::bytes).sum();
        n.clamp(1, STORE_QUEUE_BYTES) as u32
    }

    async fn send(&self, key: &str, writes: Vec<W>, ack: Option<oneshot::Sender<bool>>) -> bool {
        let Ok(permit) = Arc::clone(&self.bytes)
            .acquire_many_owned(Self::permits(&writes))
            .await
        else {
            return false;
        };
        let unit = Queued {
            fence: self.fence_of(key),
            key: key.to_owned(),
            writes,
            ack,
            _bytes: permit,
        };
        self.hand_over(unit).await
    }

    /// Queues `unit` for the writer's task, counted as pending from before
    /// it is in the queue until it is answered.
    async fn hand_over(&self, unit: Queued<W>) -> bool {
        self.shared.pending.fetch_add(1, SeqCst);
        let sent = self.tx.send(Msg::Unit(unit)).await.is_ok();
        if !sent {
            self.shared.pending.fetch_sub(1, SeqCst);
        }
        sent
    }

    /// [`StoreWriter::hand_over`] without waiting; `false` if the queue is
    /// full.
    fn try_hand_over(&self, unit: Queued<W>) -> bool {
        self.shared.pending.fetch_add(1, SeqCst);
        let sent = self.tx.try_send(Msg::Unit(unit)).is_ok();
        if !sent {
            self.shared.pending.fetch_sub(1, SeqCst);
        }
        sent
    }

    /// Queues one unit's writes; waits only while the queue is full.
    pub async fn write_behind(&self, key: &str, writes: Vec<W>) {
        if !writes.is_empty() {
            self.send(key, writes, None).await;
        }
    }

    /// Queues one unit without waiting (at start-up, when the queue is
    /// empty); `false` if the queue is full.
    pub fn try_write_behind(&self, key: &str, writes: Vec<W>) -> bool {
        if writes.is_empty() {
            return true;
        }
        let Ok(permit) = Arc::clone(&self.bytes).try_acquire_many_owned(Self::permits(&writes))
        else {
            return false;
        };
        let unit = Queued {
            fence: self.fence_of(key),
            key: key.to_owned(),
            writes,
            ack: None,
            _bytes: permit,
        };
        self.try_hand_over(unit)
    }

    /// Queues one unit without waiting and returns its answer; `None` if
    /// the queue is full.
    pub fn try_queue_acked(&self, key: &str, writes: Vec<W>) -> Option<Durable> {
        let writes = match self.write_now(key, writes) {
            Ok(durable) => return Some(Durable::answered(durable)),
            Err(writes) => writes,
        };
        let permit = Arc::clone(&self.bytes)
            .try_acquire_many_owned(Self::permits(&writes))
            .ok()?;
        let (tx, rx) = oneshot::channel();
        let unit = Queued {
            fence: self.fence_of(key),
            key: key.to_owned(),
            writes,
            ack: Some(tx),
            _bytes: permit,
        };
        if !self.try_hand_over(unit) {
            return None;
        }
        Some(Durable(Some(rx)))
    }

    /// Queues one unit and resolves once it is durable (`true`) or failed.
    pub async fn write_durable(&self, key: &str, writes: Vec<W>) -> bool {
        self.queue_acked(key, writes).await.wait().await
    }

    /// Queues one unit (waiting only while the queue is full) and returns
    /// its answer, to wait for now or later: what a unit queues is
    /// written in the order it queued it.
    pub async fn queue_acked(&self, key: &str, writes: Vec<W>) -> Durable {
        let writes = match self.write_now(key, writes) {
            Ok(durable) => return Durable::answered(durable),
            Err(writes) => writes,
        };
        let (tx, rx) = oneshot::channel();
        if !self.send(key, writes, Some(tx)).await {
            return Durable(None);
        }
        Durable(Some(rx))
    }

    /// Units waiting for the writer (not yet taken into a batch).
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Units in the batch being written now.
    pub fn in_batch(&self) -> usize {
        self.in_batch.load(Relaxed)
    }

    /// Resolves once everything queued before it is written.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

#[cfg(test)]
mod tests;
