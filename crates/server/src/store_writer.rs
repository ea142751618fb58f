//! Durable changes are written by one task, one batch at a time in the
//! blocking pool, through a queue of [`STORE_QUEUE`] messages: a full queue
//! makes the room that writes wait (back-pressure instead of unbounded
//! memory), and everything queued is written before shutdown.
//!
//! Each message is one unit: the changes of one room command, all or
//! nothing. The task writes what is queued as one transaction with a
//! savepoint per unit, so one room's failed write fails that room's units
//! only (and its later units in the batch, so that a room's changes never
//! land out of order), and answers each unit that asked whether it is
//! durable.

use crate::metrics::StoreMetrics;
use hostwire_memizy::relay::RoomChange;
use hostwire_store::RelayStore;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

enum Msg {
    Changes(Vec<RoomChange>, Option<oneshot::Sender<bool>>),
    Flush(oneshot::Sender<()>),
}

/// Whether queued changes became durable, once the writer has tried.
pub struct Durable(Option<oneshot::Receiver<bool>>);

impl Durable {
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

/// A handle to the store writer.
#[derive(Clone)]
pub struct StoreWriter {
    tx: mpsc::Sender<Msg>,
    /// Units in the batch being written now (0 while idle).
    in_batch: Arc<AtomicUsize>,
}

/// Messages (each one command's changes) waiting for the writer; a full
/// queue makes the room that writes wait.
pub const STORE_QUEUE: usize = 1024;

/// The most changes written in one transaction (a batch may pass it by
/// one unit).
const MAX_BATCH: usize = 4096;

impl StoreWriter {
    pub fn start(store: Arc<dyn RelayStore>, metrics: Arc<StoreMetrics>) -> StoreWriter {
        let (tx, mut rx) = mpsc::channel::<Msg>(STORE_QUEUE);
        let in_batch = Arc::new(AtomicUsize::new(0));
        let batch_len = Arc::clone(&in_batch);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut units = Vec::new();
                let mut acks = Vec::new();
                let mut flushes = Vec::new();
                let mut changes = 0;
                let mut next = Some(first);
                while let Some(msg) = next.take() {
                    match msg {
                        Msg::Changes(c, ack) => {
                            changes += c.len();
                            units.push(c);
                            acks.push(ack);
                        }
                        Msg::Flush(done) => flushes.push(done),
                    }
                    if changes < MAX_BATCH {
                        next = rx.try_recv().ok();
                    }
                }
                if !units.is_empty() {
                    batch_len.store(units.len(), Relaxed);
                    let store = Arc::clone(&store);
                    // SQLite blocks: one batch at a time in the blocking
                    // pool (where a test's paused clock does not jump
                    // while a write runs).
                    let written = tokio::task::spawn_blocking(move || {
                        let t = Instant::now();
                        let refs: Vec<&[RoomChange]> = units.iter().map(Vec::as_slice).collect();
                        let results = store.apply_units(&refs);
                        (units, results, t.elapsed())
                    })
                    .await;
                    match written {
                        Ok((units, results, took)) => {
                            metrics.write(took.as_micros() as u64);
                            for ((unit, ack), r) in units.iter().zip(acks).zip(results) {
                                if let Err(e) = &r {
                                    metrics.error();
                                    tracing::error!(
                                        error = %e,
                                        pin = unit.first().map_or("", RoomChange::pin),
                                        changes = unit.len(),
                                        "store write failed"
                                    );
                                }
                                if let Some(a) = ack {
                                    let _ = a.send(r.is_ok());
                                }
                            }
                        }
                        Err(e) => {
                            // The write panicked: nothing of it is known
                            // to be stored. Dropped acks answer `false`.
                            metrics.error();
                            tracing::error!(error = %e, "store write failed");
                        }
                    }
                    batch_len.store(0, Relaxed);
                }
                for f in flushes {
                    let _ = f.send(());
                }
            }
        });
        StoreWriter { tx, in_batch }
    }

    /// Queues changes; waits only while the queue is full.
    pub async fn write_behind(&self, changes: Vec<RoomChange>) {
        if !changes.is_empty() {
            let _ = self.tx.send(Msg::Changes(changes, None)).await;
        }
    }

    /// Queues changes as one unit without waiting (at start-up, when the
    /// queue is empty); `false` if the queue is full.
    pub fn try_write_behind(&self, changes: Vec<RoomChange>) -> bool {
        changes.is_empty() || self.tx.try_send(Msg::Changes(changes, None)).is_ok()
    }

    /// Queues changes and resolves once they are durable (`true`) or failed.
    pub async fn write_durable(&self, changes: Vec<RoomChange>) -> bool {
        self.queue_acked(changes).await.wait().await
    }

    /// Queues changes (waiting only while the queue is full) and returns
    /// their answer, to wait for now or later: what a room queues is
    /// written in the order it queued it.
    pub async fn queue_acked(&self, changes: Vec<RoomChange>) -> Durable {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Changes(changes, Some(tx))).await.is_err() {
            return Durable(None);
        }
        Durable(Some(rx))
    }

    /// Messages waiting for the writer (not yet taken into a batch).
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
mod tests {
    use super::*;
    use hostwire_store::{StoreError, StoredRoom};
    use std::sync::{Condvar, Mutex};

    /// A store whose writes wait until it is opened (a stalled disk).
    #[derive(Default)]
    struct Stalled {
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl RelayStore for Stalled {
        fn load_rooms(&self) -> Result<Vec<StoredRoom>, StoreError> {
            Ok(Vec::new())
        }
        fn load_bundle(&self, _: &str) -> Result<Option<hostwire_store::StoredBundle>, StoreError> {
            Ok(None)
        }
        fn apply(&self, _: &[RoomChange]) -> Result<(), StoreError> {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
            Ok(())
        }
    }

    fn change(i: u64) -> Vec<RoomChange> {
        vec![RoomChange::HostAway {
            pin: format!("{}", 100_000 + i),
            since_ms: Some(i),
        }]
    }

    #[tokio::test]
    async fn a_stalled_store_holds_writers_back_instead_of_queueing_without_bound() {
        let store = Arc::new(Stalled::default());
        let writer = StoreWriter::start(
            Arc::clone(&store) as Arc<dyn RelayStore>,
            Arc::new(StoreMetrics::default()),
        );
        // The writer takes one batch and stalls in it; the queue
        // then fills.
        let mut queued = 0u64;
        loop {
            let w = writer.write_behind(change(queued));
            match tokio::time::timeout(std::time::Duration::from_millis(200), w).await {
                Ok(()) => queued += 1,
                Err(_) => break,
            }
            assert!(
                queued <= 2 * STORE_QUEUE as u64 + MAX_BATCH as u64,
                "never held back"
            );
        }
        assert!(queued >= STORE_QUEUE as u64, "held back early: {queued}");
        // Once the disk moves again, the held writer goes on.
        *store.open.lock().unwrap() = true;
        store.opened.notify_all();
        tokio::time::timeout(std::time::Duration::from_secs(10), writer.flush())
            .await
            .expect("the queue did not drain");
    }
}
