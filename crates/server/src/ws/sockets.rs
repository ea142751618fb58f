//! Every open socket of one server in one registry, so that a shutdown
//! closes each with 1001 and waits for them.

use super::config::SHUTTING_DOWN;
use super::writer::{Outbound, Parked};
use crate::outbound;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tungstenite::Utf8Bytes;

/// Every open socket of one server, so that shutdown closes each with
/// 1001 and waits for them (attached to a room, session or match or not).
#[derive(Clone, Default)]
pub struct Sockets(Arc<SocketsInner>);

#[derive(Default)]
pub(super) struct SocketsInner {
    pub(super) live: Mutex<HashMap<u64, outbound::Closer<Utf8Bytes, Parked>>>,
    pub(super) next: AtomicU64,
    pub(super) closing: AtomicBool,
    pub(super) gone: tokio::sync::Notify,
}

impl Sockets {
    pub(super) fn live(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, outbound::Closer<Utf8Bytes, Parked>>> {
        self.0.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn register(&self, out: &Outbound) -> u64 {
        let id = self.0.next.fetch_add(1, Relaxed);
        self.live().insert(id, out.0.closer());
        // Checked after the insert: a shutdown that began meanwhile either
        // saw this socket or is seen here.
        if self.0.closing.load(Relaxed) {
            out.close(SHUTTING_DOWN);
        }
        id
    }

    pub(super) fn deregister(&self, id: u64) {
        let mut live = self.live();
        live.remove(&id);
        let empty = live.is_empty();
        drop(live);
        if empty {
            self.0.gone.notify_waiters();
        }
    }

    /// How many sockets are open.
    pub fn len(&self) -> usize {
        self.live().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every socket with 1001 (after what is queued for it), and
    /// every socket opened from now on.
    pub fn close_all(&self) {
        self.0.closing.store(true, Relaxed);
        for c in self.live().values() {
            c.close(SHUTTING_DOWN);
        }
    }

    /// Waits until every socket has ended.
    pub async fn ended(&self) {
        loop {
            let gone = self.0.gone.notified();
            tokio::pin!(gone);
            gone.as_mut().enable();
            if self.is_empty() {
                return;
            }
            gone.await;
        }
    }
}
