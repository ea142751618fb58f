//! Durable changes are written behind the rooms by one thread, through a
//! queue of [`STORE_QUEUE`] messages: a room waits for the disk only when
//! the queue is full (back-pressure instead of unbounded memory), and
//! everything queued is written before shutdown.

use crate::metrics::StoreMetrics;
use hostwire_memizy::relay::RoomChange;
use hostwire_store::RelayStore;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

enum Msg {
    Changes(Vec<RoomChange>, Option<oneshot::Sender<bool>>),
    Flush(oneshot::Sender<()>),
}

/// A handle to the writer thread.
#[derive(Clone)]
pub struct StoreWriter {
    tx: mpsc::Sender<Msg>,
}

/// Messages (each one command's changes) waiting for the writer; a full
/// queue makes the room that writes wait.
pub const STORE_QUEUE: usize = 1024;

/// The most changes written in one transaction.
const MAX_BATCH: usize = 4096;

impl StoreWriter {
    pub fn start(store: Arc<dyn RelayStore>, metrics: Arc<StoreMetrics>) -> StoreWriter {
        let (tx, mut rx) = mpsc::channel::<Msg>(STORE_QUEUE);
        std::thread::Builder::new()
            .name("hostwire-store".into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    let mut batch = Vec::new();
                    let mut acks = Vec::new();
                    let mut flushes = Vec::new();
                    let mut next = Some(first);
                    while let Some(msg) = next.take() {
                        match msg {
                            Msg::Changes(c, ack) => {
                                batch.extend(c);
                                acks.extend(ack);
                            }
                            Msg::Flush(done) => flushes.push(done),
                        }
                        if batch.len() < MAX_BATCH {
                            next = rx.try_recv().ok();
                        }
                    }
                    let ok = if batch.is_empty() {
                        true
                    } else {
                        let t = Instant::now();
                        let r = store.apply(&batch);
                        metrics.write(t.elapsed().as_micros() as u64);
                        if let Err(e) = &r {
                            metrics.error();
                            tracing::error!(error = %e, changes = batch.len(), "store write failed");
                        }
                        r.is_ok()
                    };
                    for a in acks {
                        let _ = a.send(ok);
                    }
                    for f in flushes {
                        let _ = f.send(());
                    }
                }
            })
            .expect("spawn the store writer thread");
        StoreWriter { tx }
    }

    /// Queues changes; waits only while the queue is full.
    pub async fn write_behind(&self, changes: Vec<RoomChange>) {
        if !changes.is_empty() {
            let _ = self.tx.send(Msg::Changes(changes, None)).await;
        }
    }

    /// Queues changes without waiting (at start-up, when the queue is
    /// empty); `false` if the queue is full.
    pub fn try_write_behind(&self, changes: Vec<RoomChange>) -> bool {
        changes.is_empty() || self.tx.try_send(Msg::Changes(changes, None)).is_ok()
    }

    /// Queues changes and resolves once they are durable (`true`) or failed.
    pub async fn write_durable(&self, changes: Vec<RoomChange>) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Changes(changes, Some(tx))).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
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
        // The writer thread takes one batch and stalls in it; the queue
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
