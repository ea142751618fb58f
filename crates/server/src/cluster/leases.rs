//! The node's side of unit leases (PostgreSQL only): which units this
//! node owns and under which generation, one task renewing them, taking
//! over the units whose owner let its lease run out, and dropping a unit
//! the moment the store says another node holds it ([`Fenced`]).
//!
//! It knows no protocol: each kind of unit ([`UnitKind`]) registers a
//! [`Holder`] that restores a unit it is given and drops one it lost. The
//! relay room is the first; a hosted session, a ggui session or a
//! PlayerThree match plugs in the same way (docs/cluster.md says how).
//!
//! [`Fenced`]: hostwire_store::StoreError::Fenced

use crate::metrics::{write_counter, write_gauge, Render};
use crate::store_writer::Fence;
use hostwire_store::lease::{Acquired, LeaseHeld, LeaseRef, LeaseStore, UnitKind};
use hostwire_store::StoreError;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub use hostwire_store::lease::DEFAULT_LEASE_TTL;

/// The option (and its environment variable) setting the lease length.
pub const LEASE_TTL_OPTION: &str = "--lease-ttl / HOSTWIRE_LEASE_TTL";

/// The shortest lease `--lease-ttl` takes: a renewal is a database round
/// trip, and a third of the lease must hold several.
pub const MIN_LEASE_TTL: Duration = Duration::from_millis(300);

/// The renewal task wakes this many times per lease length: a lease is
/// renewed when a third of it has passed, so a pass that is late or slow
/// still leaves it two thirds.
pub const RENEWALS_PER_TTL: u32 = 3;

/// The most leases renewed in one pass: a pass must end well within a
/// third of the lease. The oldest renewals go first; the rest wait for the
/// next pass.
pub const MAX_RENEWALS_PER_PASS: usize = 65_536;

/// Leases renewed in one statement (one round trip): a pass over 1,000
/// units is one call, not 1,000 (see docs/BENCHMARKS.md, "Cluster").
pub const RENEWALS_PER_CALL: usize = 1024;

/// The most expired units one pass takes over nobody asked for (restoring
/// one reads it from the database); the rest wait for the next pass.
pub const MAX_TAKEOVERS_PER_PASS: usize = 64;

/// Units listed by name in `/api/health`, at most (the count is whole).
pub const MAX_HEALTH_UNITS: usize = 100;

/// What restoring a unit whose lease this node just took came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// It runs on this node now.
    Serving,
    /// The store has no such unit (it ended): the lease is let go.
    Gone,
    /// The store could not be read: the lease is let go, and the unit is
    /// tried again when asked for or at the next pass.
    Failed,
}

/// One kind of unit as the leases see it.
pub trait Holder: Send + Sync + 'static {
    /// This node lost the unit `key` (another took it over): drop it from
    /// memory at once and close its clients so that they reconnect.
    fn lost(&self, key: &str);
    /// This node holds `key`'s lease now: restore the unit from the store,
    /// as a restart does, and serve it.
    fn restore<'a>(&'a self, key: &'a str) -> Pin<Box<dyn Future<Output = Restored> + Send + 'a>>;
}

/// A protocol's table of units, as its [`Holder`] reaches it.
pub trait Units: Send + Sync + 'static {
    /// See [`Holder::lost`].
    fn lose_unit(&self, key: &str);
    /// See [`Holder::restore`].
    fn restore_unit<'a>(
        self: Arc<Self>,
        key: &'a str,
    ) -> impl Future<Output = Restored> + Send + 'a;
}

/// A protocol's units held weakly: the leases must not keep the protocol
/// alive, and once it is gone a restore fails and a loss is nothing.
pub struct Weakly<T>(pub std::sync::Weak<T>);

impl<T: Units> Holder for Weakly<T> {
    fn lost(&self, key: &str) {
        if let Some(units) = self.0.upgrade() {
            units.lose_unit(key);
        }
    }

    fn restore<'a>(&'a self, key: &'a str) -> Pin<Box<dyn Future<Output = Restored> + Send + 'a>> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(units) => units.restore_unit(key).await,
                None => Restored::Failed,
            }
        })
    }
}

/// What looking a unit up on this node found.
pub enum Find<H> {
    Here(H),
    NotFound,
    /// Another live node owns it: this one (its node id).
    Elsewhere(String),
    /// The store could not say (a cluster's).
    Unavailable,
}

/// What asking for a unit this node does not hold came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeOver {
    /// This node serves it now (taken, or it was already).
    Serving,
    /// No such unit.
    Gone,
    /// A live lease of another node holds it.
    Elsewhere(LeaseHeld),
    /// The store could not say.
    Failed,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    generation: u64,
    /// When the last grant was asked for (a lease is counted from before
    /// its request, which only makes this node's view of it shorter).
    renewed: Instant,
}

/// The lease counters of `/metrics`.
#[derive(Default)]
pub struct LeaseMetrics {
    pub acquired: AtomicU64,
    pub taken_over: AtomicU64,
    pub renewed: AtomicU64,
    pub lost: AtomicU64,
    pub renew_failures: AtomicU64,
}

/// This node's leases.
pub struct Leases {
    store: Arc<dyn LeaseStore>,
    node: String,
    ttl: Duration,
    held: Mutex<HashMap<(UnitKind, String), Held>>,
    holders: Mutex<HashMap<UnitKind, Arc<dyn Holder>>>,
    /// One takeover at a time on a node: two requests for the same unit
    /// must not both acquire it (the second would find this node's own
    /// lease and release it).
    taking: tokio::sync::Mutex<()>,
    pub metrics: LeaseMetrics,
}

/// Runs a lease call off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    crate::blocking::spawn(f)
        .await
        .unwrap_or_else(|e| Err(StoreError::Commit(format!("lease call panicked: {e}"))))
}

impl Leases {
    pub fn new(store: Arc<dyn LeaseStore>, node: String, ttl: Duration) -> Arc<Leases> {
        Arc::new(Leases {
            store,
            node,
            ttl,
            held: Mutex::default(),
            holders: Mutex::default(),
            taking: tokio::sync::Mutex::new(()),
            metrics: LeaseMetrics::default(),
        })
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Registers what restores and drops the units of `kind`.
    pub fn register(&self, kind: UnitKind, holder: Arc<dyn Holder>) {
        self.holders.lock().expect("holders").insert(kind, holder);
    }

    fn holder(&self, kind: UnitKind) -> Option<Arc<dyn Holder>> {
        self.holders.lock().expect("holders").get(&kind).cloned()
    }

    /// The fence of `kind`'s store writer: its writes carry this node's
    /// generations, and a refused one drops the unit.
    pub fn fence(self: &Arc<Self>, kind: UnitKind) -> Arc<dyn Fence> {
        Arc::new(KindFence {
            leases: Arc::clone(self),
            kind,
        })
    }

    /// The generation this node holds for the unit.
    pub fn generation(&self, kind: UnitKind, key: &str) -> Option<u64> {
        let held = self.held.lock().expect("leases");
        held.get(&(kind, key.to_owned())).map(|h| h.generation)
    }

    /// Units this node holds.
    pub fn owned(&self) -> usize {
        self.held.lock().expect("leases").len()
    }

    /// Takes the unit for this node: `Ok(generation)`, or the live lease
    /// that holds it. A lease of this node's own id that this process does
    /// not know (a node restarted under the same id within the lease) is
    /// released and taken again, so the generation still grows.
    pub async fn acquire(
        &self,
        kind: UnitKind,
        key: &str,
    ) -> Result<Result<u64, LeaseHeld>, StoreError> {
        for _ in 0..2 {
            let asked = Instant::now();
            let (store, k, node, ttl) = (
                Arc::clone(&self.store),
                key.to_owned(),
                self.node.clone(),
                self.ttl,
            );
            match blocking(move || store.acquire(kind, &k, &node, ttl)).await? {
                Acquired::Owned(lease) => {
                    self.held.lock().expect("leases").insert(
                        (kind, key.to_owned()),
                        Held {
                            generation: lease.generation,
                            renewed: asked,
                        },
                    );
                    self.metrics.acquired.fetch_add(1, Relaxed);
                    return Ok(Ok(lease.generation));
                }
                Acquired::Held(h)
                    if h.owner == self.node && self.generation(kind, key).is_none() =>
                {
                    let (store, k, node) =
                        (Arc::clone(&self.store), key.to_owned(), self.node.clone());
                    let _ = blocking(move || store.release(kind, &k, &node, h.generation)).await;
                }
                Acquired::Held(h) => return Ok(Err(h)),
            }
        }
        Err(StoreError::Commit(format!(
            "the lease of {kind} {key} could not be taken"
        )))
    }

    /// Lets the unit go (it ended, or the node stops): another node takes
    /// it at once.
    pub async fn release(&self, kind: UnitKind, key: &str) {
        let Some(h) = self
            .held
            .lock()
            .expect("leases")
            .remove(&(kind, key.to_owned()))
        else {
            return;
        };
        let (store, k, node) = (Arc::clone(&self.store), key.to_owned(), self.node.clone());
        if let Err(e) = blocking(move || store.release(kind, &k, &node, h.generation)).await {
            tracing::warn!(error = %e, %kind, key, "lease not released: it runs out instead");
        }
    }

    /// Every lease this node holds handed over (SIGTERM: the units' writes
    /// are flushed before): each runs out now, so another node takes the
    /// unit the moment a client asks, or at its next sweep if none does.
    pub async fn release_all(&self) {
        let all: Vec<((UnitKind, String), Held)> =
            self.held.lock().expect("leases").drain().collect();
        for ((kind, key), h) in &all {
            let (store, k, node, g, kd) = (
                Arc::clone(&self.store),
                key.clone(),
                self.node.clone(),
                h.generation,
                *kind,
            );
            if let Err(e) = blocking(move || store.hand_over(kd, &k, &node, g)).await {
                tracing::warn!(error = %e, %kind, key = %key, "lease not handed over: it runs out instead");
            }
        }
        if !all.is_empty() {
            tracing::info!(units = all.len(), "leases handed over");
        }
    }

    /// The unit was lost under `generation` (a renewal or a write was
    /// fenced): dropped here and by its holder, unless this node has taken
    /// it again since under a newer generation.
    pub fn lose(&self, kind: UnitKind, key: &str, generation: u64) {
        {
            let mut held = self.held.lock().expect("leases");
            let k = (kind, key.to_owned());
            match held.get(&k) {
                Some(h) if h.generation == generation => {
                    held.remove(&k);
                }
                _ => return,
            }
        }
        self.metrics.lost.fetch_add(1, Relaxed);
        tracing::warn!(%kind, key, generation, "lease lost: another node took the unit over; dropping it");
        if let Some(h) = self.holder(kind) {
            h.lost(key);
        }
    }

    /// Takes over a unit this node does not hold and restores it, or says
    /// who holds it.
    pub async fn take_over(&self, kind: UnitKind, key: &str) -> TakeOver {
        let _one = self.taking.lock().await;
        if self.generation(kind, key).is_some() {
            return TakeOver::Serving;
        }
        let Some(holder) = self.holder(kind) else {
            return TakeOver::Failed;
        };
        match self.acquire(kind, key).await {
            Err(e) => {
                tracing::warn!(error = %e, %kind, key, "lease not acquired");
                TakeOver::Failed
            }
            Ok(Err(held)) => {
                // An HTTP request asking for it is carried to its owner.
                super::tunnel::http::note_owner(&held.owner);
                TakeOver::Elsewhere(held)
            }
            Ok(Ok(generation)) => match holder.restore(key).await {
                Restored::Serving => {
                    self.metrics.taken_over.fetch_add(1, Relaxed);
                    tracing::info!(%kind, key, generation, "unit taken over");
                    TakeOver::Serving
                }
                r => {
                    self.release(kind, key).await;
                    if r == Restored::Gone {
                        TakeOver::Gone
                    } else {
                        TakeOver::Failed
                    }
                }
            },
        }
    }

    /// One renewal pass: every lease renewed a sixth of its length ago or
    /// more, oldest first, at most [`MAX_RENEWALS_PER_PASS`], in
    /// statements of [`RENEWALS_PER_CALL`] (one database round trip each,
    /// however many units the node owns).
    pub async fn renew_due(&self) {
        let due_after = self.ttl / (2 * RENEWALS_PER_TTL);
        let mut due: Vec<(Instant, LeaseRef)> = {
            let held = self.held.lock().expect("leases");
            held.iter()
                .filter(|(_, h)| h.renewed.elapsed() >= due_after)
                .map(|((kind, key), h)| {
                    let lease = LeaseRef {
                        kind: *kind,
                        key: key.clone(),
                        generation: h.generation,
                    };
                    (h.renewed, lease)
                })
                .collect()
        };
        due.sort_by_key(|(renewed, _)| *renewed);
        due.truncate(MAX_RENEWALS_PER_PASS);
        let mut due: Vec<LeaseRef> = due.into_iter().map(|(_, l)| l).collect();
        while !due.is_empty() {
            let call: Vec<LeaseRef> = due.drain(..due.len().min(RENEWALS_PER_CALL)).collect();
            self.renew_call(call).await;
        }
    }

    /// Renews `leases` in one call and acts on each answer.
    async fn renew_call(&self, leases: Vec<LeaseRef>) {
        let asked = Instant::now();
        let (store, node, ttl) = (Arc::clone(&self.store), self.node.clone(), self.ttl);
        let (leases, answers) = match blocking(move || {
            let answers = store.renew_all(&node, &leases, ttl);
            Ok((leases, answers))
        })
        .await
        {
            Ok((leases, Ok(answers))) => (leases, answers),
            Ok((leases, Err(e))) => {
                // The database is away: the fence keeps every write safe
                // meanwhile; the next pass tries again.
                self.metrics
                    .renew_failures
                    .fetch_add(leases.len() as u64, Relaxed);
                tracing::warn!(error = %e, leases = leases.len(), "leases not renewed");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "leases not renewed");
                return;
            }
        };
        for (l, answer) in leases.into_iter().zip(answers) {
            match answer {
                Ok(_) => {
                    self.metrics.renewed.fetch_add(1, Relaxed);
                    let mut held = self.held.lock().expect("leases");
                    if let Some(now) = held.get_mut(&(l.kind, l.key)) {
                        if now.generation == l.generation {
                            now.renewed = asked;
                        }
                    }
                }
                Err(StoreError::Fenced { .. }) => self.lose(l.kind, &l.key, l.generation),
                Err(e) => {
                    self.metrics.renew_failures.fetch_add(1, Relaxed);
                    tracing::warn!(error = %e, kind = %l.kind, key = l.key, "lease not renewed");
                }
            }
        }
    }

    /// One takeover pass: the units whose owner let the lease run out,
    /// restored here (so that their timers run) even if nobody asks.
    pub async fn take_over_expired(&self) {
        let store = Arc::clone(&self.store);
        let expired = match blocking(move || store.expired()).await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "expired leases not listed");
                return;
            }
        };
        let mine = |e: &hostwire_store::lease::LeaseEntry| {
            self.generation(e.kind, &e.key) == Some(e.generation)
        };
        let todo: Vec<_> = expired
            .into_iter()
            .filter(|e| !mine(e) && self.holder(e.kind).is_some())
            .take(MAX_TAKEOVERS_PER_PASS)
            .collect();
        for e in todo {
            self.take_over(e.kind, &e.key).await;
        }
    }

    /// Renews and takes over every `ttl / RENEWALS_PER_TTL` until `stop`
    /// turns true.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut every = tokio::time::interval(self.ttl / RENEWALS_PER_TTL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {},
                _ = stop.wait_for(|s| *s) => return,
            }
            self.renew_due().await;
            self.take_over_expired().await;
        }
    }

    /// `/api/health`'s part: how many units this node owns and which (at
    /// most [`MAX_HEALTH_UNITS`]).
    pub fn health(&self) -> Value {
        let held = self.held.lock().expect("leases");
        let mut units: Vec<Value> = held
            .iter()
            .map(|((kind, key), h)| json!({"kind": kind.as_str(), "key": key, "generation": h.generation}))
            .collect();
        units.sort_by(|a, b| a["key"].as_str().cmp(&b["key"].as_str()));
        units.truncate(MAX_HEALTH_UNITS);
        json!({"owned": held.len(), "leaseTtlMs": self.ttl.as_millis() as u64, "list": units})
    }
}

/// A store writer's fence over one kind of unit.
struct KindFence {
    leases: Arc<Leases>,
    kind: UnitKind,
}

impl Fence for KindFence {
    fn generation(&self, key: &str) -> Option<u64> {
        self.leases.generation(self.kind, key)
    }
    fn fenced(&self, key: &str, generation: u64) {
        self.leases.lose(self.kind, key, generation);
    }
}

impl Render for Leases {
    fn render(&self, out: &mut String) {
        let m = &self.metrics;
        write_gauge(
            out,
            "hostwire_cluster_units_owned",
            "Units (relay rooms, ...) whose lease this node holds.",
            self.owned() as i64,
        );
        for (name, help, v) in [
            ("hostwire_cluster_leases_acquired_total", "Leases this node took (units created or taken over).", &m.acquired),
            ("hostwire_cluster_leases_taken_over_total", "Units this node took over from the store after their lease ran out or was released.", &m.taken_over),
            ("hostwire_cluster_leases_renewed_total", "Lease renewals.", &m.renewed),
            ("hostwire_cluster_leases_lost_total", "Units dropped because the store fenced them (another node holds them).", &m.lost),
            ("hostwire_cluster_lease_renew_failures_total", "Renewals the database did not answer (tried again at the next pass).", &m.renew_failures),
        ] {
            write_counter(out, name, help, v.load(Relaxed));
        }
    }
}
