//! Match records are written behind the matches by one thread: a match
//! never waits for the disk, except to hand out what must be durable first
//! (a new match, a token minted by the operator or by an owner's `mint`). The queue is bounded: a
//! match whose records arrive faster than the disk takes them waits.

use hostwire_playerthree::host::Output;
use hostwire_playerthree::Record;
use hostwire_store::playerthree::{PlayerThreeStore, PlayerThreeWrite};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Batches of writes waiting for the writer thread.
pub const WRITE_QUEUE: usize = 4096;
/// The most writes in one transaction.
const MAX_BATCH: usize = 4096;

enum Msg {
    Writes(Vec<PlayerThreeWrite>, Option<oneshot::Sender<bool>>),
    Flush(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Msg>,
}

/// The store writes for the `Persist` outputs among `outputs`.
pub fn persisted(match_id: &str, outputs: Vec<Output>) -> Vec<PlayerThreeWrite> {
    outputs
        .into_iter()
        .filter_map(|o| match o {
            Output::Persist(r) => Some(write_of(match_id, &r)),
            _ => None,
        })
        .collect()
}

/// One record as a store write.
pub fn write_of(match_id: &str, r: &Record) -> PlayerThreeWrite {
    let (kind, tick) = match r {
        Record::Config { .. } => ("config", None),
        Record::Token { .. } => ("token", None),
        Record::Revoked { .. } => ("revoked", None),
        Record::Controller { .. } => ("controller", None),
        Record::Policy { .. } => ("policy", None),
        Record::Card { .. } => ("card", None),
        Record::Proposal { .. } => ("proposal", None),
        Record::Resolved { .. } => ("resolved", None),
        Record::State { tick, .. } => ("state", Some(*tick)),
        Record::Chat { tick, .. } => ("chat", Some(*tick)),
        Record::Commentary { tick, .. } => ("commentary", Some(*tick)),
    };
    PlayerThreeWrite::Record {
        match_id: match_id.to_owned(),
        kind: kind.to_owned(),
        tick,
        // A record is plain data: serializing it cannot fail.
        body: serde_json::to_string(r).unwrap_or_default(),
    }
}

impl Writer {
    pub fn start(store: Arc<dyn PlayerThreeStore>) -> Writer {
        let (tx, mut rx) = mpsc::channel::<Msg>(WRITE_QUEUE);
        std::thread::Builder::new()
            .name("hostwire-playerthree-store".into())
            .spawn(move || {
                while let Some(first) = rx.blocking_recv() {
                    let mut batch = Vec::new();
                    let mut acks = Vec::new();
                    let mut flushes = Vec::new();
                    let mut next = Some(first);
                    while let Some(msg) = next.take() {
                        match msg {
                            Msg::Writes(w, ack) => {
                                batch.extend(w);
                                acks.extend(ack);
                            }
                            Msg::Flush(done) => flushes.push(done),
                        }
                        if batch.len() < MAX_BATCH {
                            next = rx.try_recv().ok();
                        }
                    }
                    let ok = batch.is_empty() || {
                        let r = store.apply_playerthree(&batch);
                        if let Err(e) = &r {
                            tracing::error!(error = %e, writes = batch.len(), "playerthree store write failed");
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
            .expect("spawn the playerthree store thread");
        Writer { tx }
    }

    /// Queues writes (waiting while the queue is full).
    pub async fn write_behind(&self, writes: Vec<PlayerThreeWrite>) {
        if !writes.is_empty() {
            let _ = self.tx.send(Msg::Writes(writes, None)).await;
        }
    }

    /// Queues writes; the receiver resolves once they are durable (`true`)
    /// or failed.
    pub async fn write_acked(&self, writes: Vec<PlayerThreeWrite>) -> oneshot::Receiver<bool> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Msg::Writes(writes, Some(tx))).await;
        rx
    }

    /// Queues writes and resolves once they are durable (`true`) or failed.
    pub async fn write_durable(&self, writes: Vec<PlayerThreeWrite>) -> bool {
        self.write_acked(writes).await.await.unwrap_or(false)
    }

    /// Resolves once everything queued before it is written.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}
