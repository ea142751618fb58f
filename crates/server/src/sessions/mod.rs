//! Memizy sessions hosted by the server: the sans-IO engine of
//! `hostwire_memizy::session` driven with sockets, tasks and the store.
//!
//! - [`api`]: the HTTP API under `/memizy/sessions` (create from a bundle,
//!   players, kick, start, pause, resume, save, continue);
//! - [`conn`]: `/memizy/session/ws`, one device's plugin instance: its Host
//!   API calls arrive as worker RPC `request` frames, the Plugin API calls go
//!   out the same way, through the bounded outbound queue;
//! - [`actor`]: one task per session, on THE unit driver, owns the engine
//!   with its durability rules (`hostwire_memizy::session::DurableSession`),
//!   feeds it commands in order and arms its timer at `poll_timeout`
//!   (`admin.rs`: the HTTP API's operations; `outputs.rs`: what it makes of
//!   the session's outputs; `deliver.rs`: the devices' sockets and the
//!   requests waiting);
//! - [`rpc`]: the device side of worker RPC, one
//!   `hostwire_worker_rpc::PeerState` per attached instance;
//! - [`services`]: the services offered (SPEC 5.3), each a worker process
//!   spoken to with worker RPC;
//! - [`restore`]: what a restart brings a session back as, and bringing
//!   it back at its first use;
//! - [`play`]: the device page a person plays with in a browser, and
//!   the plugin document it embeds;
//! - [`recording`]: what a replay needs (SPEC 10), kept with the session;
//! - [`device`]: a headless device that plays a plugin instance (tests and
//!   benchmarks).

pub mod actor;
mod admin;
pub mod api;
pub mod conn;
mod deliver;
pub mod device;
mod hosted;
mod kept;
mod metrics;
mod outputs;
pub mod play;
pub mod recording;
pub mod restore;
pub mod rpc;
pub mod services;

pub use metrics::SessionMetrics;

use crate::cluster::leases::{Leases, Restored, Units, Weakly};
use crate::http::AllowedOrigins;
use crate::metrics::{StoreMetrics, StoreProtocol};
use crate::store_writer::StoreWriter;
use actor::{Cmd, SessionHandle};
use axum::routing::get;
use axum::Router;
use hostwire_core::Clock;
use hostwire_memizy::limits::{CALL_ENVELOPE_BYTES, LIMITS};
use hostwire_memizy::session::{InstanceId, SessionTiming};
use hostwire_store::lease::UnitKind;
use hostwire_store::sessions::{SessionStore, SessionWrite};
use services::{ServiceCommand, ServiceHost};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Commands waiting for one session's task (calls of its devices, the HTTP
/// API, store acknowledgements); a device's reader waits when it is full.
pub const SESSION_QUEUE: usize = 4096;
/// Frames queued for one device before it is closed as too slow (1013).
pub const DEVICE_OUTBOUND_QUEUE: usize = 1024;
/// Bytes queued for one device before it is closed as too slow (1013): a
/// device that does not read costs at most this much (one frame is always
/// taken into an empty queue, whatever its size).
pub const DEVICE_OUTBOUND_BYTES: usize = 4 * 1024 * 1024;
/// The largest frame a device may send: twice the largest Host API call
/// (`saveSnapshot`'s 1 MiB) and its envelope. A call within it but over its
/// SPEC size is answered with the SPEC's code (`MESSAGE_TOO_LARGE`,
/// `SNAPSHOT_TOO_LARGE`, `DATA_TOO_LARGE`) and the connection stays; a
/// larger frame is refused from its header, before its payload is read,
/// and closes the connection with 1009 after a `goodbye` naming the limit.
pub const MAX_DEVICE_FRAME_BYTES: usize = 2 * LIMITS.snapshot_bytes + CALL_ENVELOPE_BYTES;
/// Records handed to one session's store writer and not yet durable: the
/// engine's own bound (`MAX_RECORDS_IN_FLIGHT`); a full store queue
/// refuses a record at once (the engine answers `INTERNAL_ERROR`).
pub const STORE_QUEUE: usize = hostwire_memizy::session::MAX_RECORDS_IN_FLIGHT;
/// The close of a device whose session this node lost to another node
/// (its lease taken over): the device reconnects, to any node.
pub const CLOSE_SESSION_MOVED: crate::ws::Close = (1012, "session moved to another node");
/// Sessions live at once on this server.
pub const MAX_SESSIONS: usize = 10_000;
/// The largest creation request (plugin HTML and set).
pub const MAX_BUNDLE_BYTES: usize = 8 * 1024 * 1024;
/// Creation requests handled at once, over the server: a request's set is
/// parsed into JSON trees (tens of times its text for small items), so
/// this bounds what creations can hold in memory together; beyond it 503.
pub const CONCURRENT_SESSION_CREATIONS: usize = 4;
/// Milliseconds a session may stay in its lobby (never started) after it
/// was created or continued, unless configured: a day, so a teacher may
/// prepare a lesson well ahead, yet a lobby nobody starts does not hold
/// [`MAX_SESSIONS`] and its store rows for good.
pub const DEFAULT_LOBBY_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Milliseconds a session with no device attached and no API call stays,
/// unless configured.
pub const DEFAULT_IDLE_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Milliseconds between two passes over the stored sessions no task runs
/// (stopped by a restart, or ended) for ones unused for the idle time.
pub const EXPIRY_SWEEP_MS: u64 = 60 * 1000;

#[derive(Debug, Clone)]
pub struct SessionsConfig {
    pub allowed_origins: AllowedOrigins,
    /// The host's times when a creation request does not set them.
    pub timing: SessionTiming,
    /// Sessions one client IP may create per hour (`POST /memizy/sessions`
    /// needs no credentials, and each session may keep up to 8 MB in the
    /// store): the relay's `ROOMS_PER_IP_PER_HOUR`, counted apart.
    pub sessions_per_ip_per_hour: u32,
    /// The client IP behind trusted proxies, as the relay counts it.
    pub trust_proxy: bool,
    pub trusted_proxy_hops: usize,
    /// The services offered to plugins (`MEMIZY_SERVICES`), and the
    /// milliseconds a call may take.
    pub services: Vec<ServiceCommand>,
    pub service_timeout_ms: u64,
    /// Milliseconds a session may stay in its lobby, and a stopped one
    /// unused, before it is removed.
    pub lobby_ttl_ms: u64,
    pub idle_ttl_ms: u64,
    /// The operator's copy of the plugin SDK (`--plugin-sdk`), if any.
    pub plugin_sdk: Option<play::PluginSdk>,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            allowed_origins: AllowedOrigins::parse("*"),
            timing: SessionTiming::default(),
            sessions_per_ip_per_hour: hostwire_memizy::limits::RELAY_LIMITS.rooms_per_ip_per_hour,
            trust_proxy: false,
            trusted_proxy_hops: 1,
            services: Vec::new(),
            service_timeout_ms: services::DEFAULT_SERVICE_TIMEOUT_MS,
            lobby_ttl_ms: DEFAULT_LOBBY_TTL_MS,
            idle_ttl_ms: DEFAULT_IDLE_TTL_MS,
            plugin_sdk: None,
        }
    }
}

/// Everything the session handlers, tasks and connections share.
pub struct Sessions {
    pub config: SessionsConfig,
    pub clock: Arc<dyn Clock>,
    store: Arc<dyn SessionStore>,
    /// The writer of `store`, started at its first use (in the runtime).
    writer: Mutex<Option<StoreWriter<SessionWrite>>>,
    store_metrics: Arc<StoreMetrics>,
    services: std::sync::RwLock<Arc<ServiceHost>>,
    pub metrics: Arc<SessionMetrics>,
    live: Mutex<HashMap<String, SessionHandle>>,
    next_instance: AtomicU64,
    /// Creations per client IP in the last hour; swept on each creation,
    /// so it holds only IPs that created a session within the hour.
    creations: crate::http::CreationLimit,
    /// [`CONCURRENT_SESSION_CREATIONS`] permits.
    creating: Arc<tokio::sync::Semaphore>,
    /// Milliseconds a session may stay in its lobby.
    lobby_ttl_ms: AtomicU64,
    /// Milliseconds a session with no device and no API call stays.
    idle_ttl_ms: AtomicU64,
    /// Stored sessions no task runs: when each was last used (first seen
    /// stopped by this server, or an API call since).
    stopped_since: Mutex<HashMap<String, u64>>,
    /// Held while a session is brought back from the store, so that two
    /// first uses bring it back once.
    pub(crate) restoring: tokio::sync::Mutex<()>,
    /// The operator's plugin SDK (`--plugin-sdk`), if any.
    plugin_sdk: Option<Arc<play::PluginSdk>>,
    /// The sessions this node owns on a cluster (PostgreSQL); unset: one
    /// node.
    leases: std::sync::OnceLock<Arc<Leases>>,
    /// How a device reaches a session another node owns (with NATS).
    tunnels: std::sync::OnceLock<Arc<crate::cluster::tunnel::Tunnels>>,
}

impl Sessions {
    /// The sessions of `store`, with everything `config` says (its
    /// services, times to live and plugin SDK) in force before the first
    /// request.
    pub fn new(
        mut config: SessionsConfig,
        clock: Arc<dyn Clock>,
        store: Arc<dyn SessionStore>,
        store_metrics: Arc<StoreMetrics>,
    ) -> Arc<Sessions> {
        let creations = crate::http::CreationLimit::new(
            config.sessions_per_ip_per_hour,
            "sessions",
            "ROOMS_PER_IP_PER_HOUR",
        );
        let metrics = Arc::new(SessionMetrics::default());
        let commands = std::mem::take(&mut config.services);
        let services = if commands.is_empty() {
            ServiceHost::none()
        } else {
            ServiceHost::new(
                commands,
                config.service_timeout_ms.max(1),
                Arc::clone(&clock),
                Arc::clone(&metrics.services),
            )
        };
        let plugin_sdk = config.plugin_sdk.take().map(Arc::new);
        Arc::new(Sessions {
            creations,
            creating: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_SESSION_CREATIONS)),
            store,
            writer: Mutex::new(None),
            store_metrics,
            services: std::sync::RwLock::new(Arc::new(services)),
            metrics,
            live: Mutex::new(HashMap::new()),
            next_instance: AtomicU64::new(1),
            lobby_ttl_ms: AtomicU64::new(config.lobby_ttl_ms),
            idle_ttl_ms: AtomicU64::new(config.idle_ttl_ms),
            stopped_since: Mutex::new(HashMap::new()),
            restoring: tokio::sync::Mutex::new(()),
            plugin_sdk,
            leases: std::sync::OnceLock::new(),
            tunnels: std::sync::OnceLock::new(),
            config,
            clock,
        })
    }

    /// On a cluster: each session is served by the node holding its lease,
    /// and its writes are fenced by it. Called before the store writer's
    /// first use (at start-up).
    pub fn use_leases(self: &Arc<Self>, leases: Arc<Leases>) {
        leases.register(
            UnitKind::HostedSession,
            Arc::new(Weakly(Arc::downgrade(self))),
        );
        let _ = self.leases.set(leases);
    }

    /// The node's leases, on a cluster.
    pub(crate) fn leases(&self) -> Option<&Arc<Leases>> {
        self.leases.get()
    }

    /// Carries devices of sessions owned elsewhere to their owners through
    /// `tunnels`, and serves the devices other nodes carry here.
    pub fn use_tunnels(self: &Arc<Self>, tunnels: Arc<crate::cluster::tunnel::Tunnels>) {
        tunnels.accept(conn::TUNNEL_PROTOCOL, conn::acceptor(self));
        let _ = self.tunnels.set(tunnels);
    }

    pub(crate) fn tunnels(&self) -> Option<&Arc<crate::cluster::tunnel::Tunnels>> {
        self.tunnels.get()
    }

    /// The session was lost to another node: it leaves `live` now (nothing
    /// more reaches it) and its task closes its devices
    /// ([`CLOSE_SESSION_MOVED`]).
    fn lose(&self, id: &str) {
        let handle = self.live.lock().ok().and_then(|mut l| l.remove(id));
        if let Some(h) = handle {
            h.lost.notify_one();
        }
    }

    /// The host used `id` now (an API call): a stopped session's idle
    /// time starts again.
    pub(crate) fn touch(&self, id: &str) {
        let now = self.clock.now_ms();
        if let Ok(mut m) = self.stopped_since.lock() {
            if let Some(t) = m.get_mut(id) {
                *t = now;
            }
        }
    }

    /// Removes the stored sessions no task runs that nobody used for the
    /// idle time (a restart starts their time again); returns how many.
    pub async fn expire_stopped(&self) -> usize {
        // No session is brought back while the stopped ones are removed.
        let _no_restore = self.restoring.lock().await;
        let store = self.store();
        let Ok(Ok(ids)) = crate::blocking::spawn(move || store.list_session_ids()).await else {
            return 0;
        };
        let now = self.clock.now_ms();
        let ttl = self.idle_ttl_ms();
        let expired: Vec<String> = {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            let mut since = self.stopped_since.lock().unwrap_or_else(|p| p.into_inner());
            since.retain(|id, _| !live.contains_key(id));
            let mut expired = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for id in ids.into_iter().filter(|id| !live.contains_key(id)) {
                let t = *since.entry(id.clone()).or_insert(now);
                if now.saturating_sub(t) >= ttl {
                    since.remove(&id);
                } else {
                    seen.insert(id.clone());
                    continue;
                }
                expired.push(id);
            }
            since.retain(|id, _| seen.contains(id));
            expired
        };
        let writer = self.writer();
        let mut removed_count = 0;
        for id in &expired {
            // On a cluster a session no task runs here may run on another
            // node: it is removed only under its lease.
            if let Some(leases) = self.leases() {
                match leases.acquire(UnitKind::HostedSession, id).await {
                    Ok(Ok(_)) => {}
                    _ => continue,
                }
            }
            let removed = writer
                .write_durable(
                    id,
                    vec![SessionWrite::Removed {
                        session_id: id.clone(),
                    }],
                )
                .await;
            if let Some(leases) = self.leases() {
                leases.release(UnitKind::HostedSession, id).await;
            }
            removed_count += 1;
            tracing::info!(session = %id, removed, "stopped hosted session expired");
        }
        removed_count
    }

    /// Sweeps the stopped sessions every [`EXPIRY_SWEEP_MS`] while the
    /// sessions are in use.
    pub fn start_expiry_sweep(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(EXPIRY_SWEEP_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(sessions) = weak.upgrade() else {
                    return;
                };
                sessions.expire_stopped().await;
            }
        });
    }

    /// Sessions expire (devices closed, rows removed) `lobby_ttl_ms` after
    /// they were created or continued if never started, and `idle_ttl_ms`
    /// after their last use while no device is attached.
    pub fn use_expiry(&self, lobby_ttl_ms: u64, idle_ttl_ms: u64) {
        self.lobby_ttl_ms.store(lobby_ttl_ms, Relaxed);
        self.idle_ttl_ms.store(idle_ttl_ms, Relaxed);
    }

    pub(crate) fn lobby_ttl_ms(&self) -> u64 {
        self.lobby_ttl_ms.load(Relaxed)
    }

    pub(crate) fn idle_ttl_ms(&self) -> u64 {
        self.idle_ttl_ms.load(Relaxed)
    }

    /// Lets every session do what is due now (after a manual clock moved).
    pub async fn wake(&self) {
        let handles: Vec<SessionHandle> = self
            .live
            .lock()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default();
        for h in handles {
            let (tx, rx) = tokio::sync::oneshot::channel();
            if h.tx.send(Cmd::Wake(tx)).await.is_ok() {
                let _ = rx.await;
            }
        }
    }

    /// Counts a creation by the client at `peer` (behind `headers`' trusted
    /// proxies), or answers 429 with when it may create one.
    pub fn allow_creation(
        &self,
        headers: &axum::http::HeaderMap,
        peer: std::net::SocketAddr,
    ) -> Result<(), crate::http::credentials::TooManyCreations> {
        let ip = crate::http::client_ip::limit_key(&crate::http::client_ip(
            headers,
            peer,
            self.config.trust_proxy,
            self.config.trusted_proxy_hops,
        ));
        self.creations.admit(&ip, self.clock.now_ms())
    }

    /// A permit to handle one creation request, if fewer than
    /// [`CONCURRENT_SESSION_CREATIONS`] are being handled.
    pub fn creation_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.creating).try_acquire_owned().ok()
    }

    /// The plugin SDK served, if any.
    pub fn plugin_sdk(&self) -> Option<Arc<play::PluginSdk>> {
        self.plugin_sdk.clone()
    }

    /// The store sessions are kept in.
    pub fn store(&self) -> Arc<dyn SessionStore> {
        Arc::clone(&self.store)
    }

    /// The store writer of the sessions' store.
    pub fn writer(&self) -> StoreWriter<SessionWrite> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        w.get_or_insert_with(|| {
            StoreWriter::start_fenced(
                self.store() as Arc<dyn hostwire_store::UnitStore<SessionWrite>>,
                StoreProtocol::Sessions,
                Arc::clone(&self.store_metrics),
                self.leases().map(|l| l.fence(UnitKind::HostedSession)),
            )
        })
        .clone()
    }

    /// The services offered to sessions created from now on.
    pub fn services(&self) -> Arc<ServiceHost> {
        match self.services.read() {
            Ok(s) => Arc::clone(&s),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    /// Offers these services (each a worker command) to the sessions
    /// created or continued from now on; a call times out after
    /// `timeout_ms`.
    pub fn use_services(&self, commands: Vec<ServiceCommand>, timeout_ms: u64) {
        let host = Arc::new(ServiceHost::new(
            commands,
            timeout_ms,
            Arc::clone(&self.clock),
            Arc::clone(&self.metrics.services),
        ));
        let old = match self.services.write() {
            Ok(mut s) => std::mem::replace(&mut *s, host),
            Err(p) => std::mem::replace(&mut *p.into_inner(), host),
        };
        old.shutdown();
    }

    fn next_instance(&self) -> InstanceId {
        self.next_instance.fetch_add(1, Relaxed)
    }

    pub(crate) fn handle(&self, id: &str) -> Option<SessionHandle> {
        self.live.lock().ok()?.get(id).cloned()
    }

    pub(crate) fn insert(&self, id: String, h: SessionHandle) -> bool {
        let Ok(mut live) = self.live.lock() else {
            return false;
        };
        if live.len() >= MAX_SESSIONS || live.contains_key(&id) {
            return false;
        }
        live.insert(id, h);
        true
    }

    /// Removes `id`'s task from `live`, unless another has taken its place
    /// (the session was lost and taken again meanwhile).
    pub(crate) fn remove(&self, id: &str, handle: &SessionHandle) {
        if let Ok(mut live) = self.live.lock() {
            if live.get(id).is_some_and(|h| h.tx.same_channel(&handle.tx)) {
                live.remove(id);
            }
        }
    }

    /// Closes every session's devices (server shutdown).
    pub async fn shutdown(&self) {
        let handles: Vec<SessionHandle> = self
            .live
            .lock()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default();
        for h in handles {
            let _ = h.tx.send(Cmd::Shutdown).await;
        }
        self.services().shutdown();
    }
}

/// The hosted sessions as the leases see them.
impl Units for Sessions {
    fn lose_unit(&self, key: &str) {
        self.lose(key);
    }

    async fn restore_unit(self: Arc<Self>, key: &str) -> Restored {
        match restore::restore_here(&self, key, false).await {
            Ok(Some(_)) => Restored::Serving,
            Ok(None) => Restored::Gone,
            Err((_, why)) => {
                tracing::warn!(session = %key, %why, "hosted session not taken over");
                Restored::Failed
            }
        }
    }
}

/// The routes: the HTTP API under `/memizy/sessions` and the WebSocket
/// `/memizy/session/ws`.
pub fn router(sessions: Arc<Sessions>) -> Router {
    Router::new()
        .nest("/memizy/sessions", api::router(Arc::clone(&sessions)))
        .route(
            "/memizy/session/ws",
            get(conn::ws_upgrade).with_state(Arc::clone(&sessions)),
        )
        .merge(play::router(sessions))
}

#[cfg(test)]
mod creation_tests;
