//! Bundles are served from the store, through a cache bounded in bytes: a
//! room keeps only its bundle's version, and a restart loads no bundle
//! bytes at all.
//!
//! The bound is on every bundle byte in memory, cached or being sent: each
//! loaded bundle holds permits of one semaphore (`bundle_cache_bytes` of
//! them) for as long as any response still holds its bytes. A download that
//! finds no room waits up to [`BUDGET_WAIT`] (the least recently used
//! entries are dropped from the cache first), then gets 503. Misses are
//! read one at a time, so that many players asking for a new bundle at once
//! cost one read.

use bytes::Bytes;
use hostwire_store::RelayStore;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a download waits for room in the budget before 503.
pub const BUDGET_WAIT: Duration = Duration::from_secs(10);

/// What a download gets.
pub enum BundleRead {
    Found {
        version: u64,
        text: Bytes,
    },
    /// Not stored (no upload yet, or the room is gone).
    Missing,
    /// The budget stayed full for [`BUDGET_WAIT`].
    Busy,
    /// The store could not be read.
    Failed,
}

struct Entry {
    /// The room's creation time: a later room with the same PIN never
    /// gets an earlier room's bundle.
    created_at_ms: u64,
    version: u64,
    text: Bytes,
    used: u64,
}

/// A bundle's bytes and the budget they take, given back when the last
/// response holding them is done.
struct Held {
    text: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.text
    }
}

pub struct Bundles {
    store: Arc<dyn RelayStore>,
    budget: Arc<Semaphore>,
    total: usize,
    /// The most one read may need (the largest bundle accepted).
    read_bytes: usize,
    cache: Mutex<(HashMap<String, Entry>, u64)>,
    loading: tokio::sync::Mutex<()>,
}

impl Bundles {
    /// `budget_bytes` is raised to `bundle_bytes`: one bundle must fit.
    pub fn new(store: Arc<dyn RelayStore>, budget_bytes: usize, bundle_bytes: usize) -> Bundles {
        let read_bytes = bundle_bytes.min(u32::MAX as usize);
        let total = budget_bytes.max(read_bytes);
        Bundles {
            store,
            budget: Arc::new(Semaphore::new(total)),
            total,
            read_bytes,
            cache: Mutex::new((HashMap::new(), 0)),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    /// The bundle of the room `pin` created at `created_at_ms`, `version`
    /// or newer (the store is written before a room serves a new version,
    /// so it may be ahead by one upload).
    pub async fn get(&self, pin: &str, created_at_ms: u64, version: u64) -> BundleRead {
        if let Some(hit) = self.lookup(pin, created_at_ms, version) {
            return hit;
        }
        let Ok(_one_read) = tokio::time::timeout(BUDGET_WAIT, self.loading.lock()).await else {
            return BundleRead::Busy;
        };
        // Whoever held the lock may have loaded it.
        if let Some(hit) = self.lookup(pin, created_at_ms, version) {
            return hit;
        }
        let Some(permit) = self.reserve().await else {
            return BundleRead::Busy;
        };
        let store = Arc::clone(&self.store);
        let key = pin.to_owned();
        // The reservation goes with the read: a download dropped meanwhile
        // does not free it before the bytes read are.
        let read = crate::blocking::spawn(move || (store.load_bundle(&key), permit)).await;
        let (stored, mut permit) = match read {
            Ok((Ok(Some(b)), permit)) => (b, permit),
            Ok((Ok(None), _)) => return BundleRead::Missing,
            Ok((Err(e), _)) => {
                tracing::error!(pin, error = %e, "bundle read failed");
                return BundleRead::Failed;
            }
            Err(_) => return BundleRead::Failed,
        };
        // Keep what the bytes take; the rest of the reservation goes back.
        let keep = permit
            .split(stored.text.len().min(self.read_bytes))
            .unwrap_or(permit);
        let text = Bytes::from_owner(Held {
            text: stored.text,
            _permit: keep,
        });
        if let Ok(mut c) = self.cache.lock() {
            let (map, tick) = &mut *c;
            *tick += 1;
            map.insert(
                pin.to_owned(),
                Entry {
                    created_at_ms,
                    version: stored.version,
                    text: text.clone(),
                    used: *tick,
                },
            );
        }
        BundleRead::Found {
            version: stored.version,
            text,
        }
    }

    fn lookup(&self, pin: &str, created_at_ms: u64, version: u64) -> Option<BundleRead> {
        let mut c = self.cache.lock().ok()?;
        let (map, tick) = &mut *c;
        *tick += 1;
        let e = map
            .get_mut(pin)
            .filter(|e| e.created_at_ms == created_at_ms && e.version >= version)?;
        e.used = *tick;
        Some(BundleRead::Found {
            version: e.version,
            text: e.text.clone(),
        })
    }

    /// Room in the budget for one read, dropping cached bundles (least
    /// recently used first) while there is not enough.
    async fn reserve(&self) -> Option<OwnedSemaphorePermit> {
        let need = self.read_bytes;
        while self.budget.available_permits() < need {
            let Ok(mut c) = self.cache.lock() else { break };
            let (map, _) = &mut *c;
            let Some(oldest) = map
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            map.remove(&oldest);
        }
        let wait = Arc::clone(&self.budget).acquire_many_owned(need as u32);
        tokio::time::timeout(BUDGET_WAIT, wait).await.ok()?.ok()
    }

    /// Drops a room's cached bundle (a new one was stored, or the room
    /// closed).
    pub fn forget(&self, pin: &str) {
        if let Ok(mut c) = self.cache.lock() {
            c.0.remove(pin);
        }
    }

    /// Bundle bytes in memory now, cached or being sent.
    pub fn bytes_held(&self) -> usize {
        self.total - self.budget.available_permits()
    }
}
