//! The Memizy relay protocol 1: the sans-IO rules of
//! `hostwire_memizy::relay` driven with sockets, tasks and the store.
//!
//! - [`api`]: the HTTP API (`/api/…`), as an axum `Router`;
//! - [`room`]: one task per room owns its state and handles its commands in
//!   order, driven by the server's one unit driver ([`crate::unit`]);
//! - [`conn`]: each WebSocket connection's reader and writer, with a bounded
//!   outbound queue.
//!
//! [`router`] is what the app mounts; [`Relay`] is the state its handlers
//! share.

pub mod api;
pub mod bundles;
pub mod conn;
pub mod limits;
pub mod metrics;
mod outbound;
pub mod room;

use crate::cluster::leases::{Find, Leases, Restored, TakeOver, Units, Weakly};
use crate::http::{AllowedOrigins, PerIpRate};
use crate::store_writer::StoreWriter;
use axum::routing::get;
use axum::Router;
use hostwire_core::Clock;
use hostwire_memizy::limits::RelayLimits;
use hostwire_memizy::relay::{choose_pin, ConnId, Room, RoomChange};
use hostwire_store::lease::UnitKind;
use hostwire_store::{RelayStore, StoredRoom};
pub use limits::{ServerLimits, SERVER_LIMITS};
pub use metrics::RelayMetrics;
use room::{RoomCmd, RoomHandle};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

/// Frames waiting for one slow reader before it is closed (1013).
pub const OUTBOUND_QUEUE: usize = 1024;
/// Commands waiting for one room.
const ROOM_QUEUE: usize = 4096;
/// PINs tried for one room on a cluster, where a PIN free on this node may
/// be leased by another (each try is a round trip to the database).
const CLUSTER_PIN_ATTEMPTS: usize = 8;

/// The close of a client whose room this node lost to another node (its
/// lease was taken over while this node was paused or cut off): 1012
/// "service restart". Memizy's host SDK reconnects on every close that no
/// fatal `error` or `closed` frame came before (its `RelaySocket`), so no
/// frame goes before this one, and the client reconnects, through the
/// load balancer, to a node that serves the room.
pub const CLOSE_ROOM_MOVED: crate::ws::Close = (1012, "room moved to another node");
/// The close of a client that asked for a room another live node owns
/// (carrying its frames there is still to come): 1013 "try again later",
/// again without a fatal frame, so that the client keeps reconnecting
/// until it reaches the owner or the owner's lease runs out.
pub const CLOSE_ROOM_ELSEWHERE: crate::ws::Close = (1013, "room served by another node");

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub allowed_origins: AllowedOrigins,
    pub trust_proxy: bool,
    pub rooms_per_ip_per_hour: u32,
    /// The relay protocol's limits.
    pub limits: RelayLimits,
    /// How this server protects itself while serving the relay.
    pub server_limits: ServerLimits,
    /// Frames queued for one connection before it counts as too slow.
    pub outbound_queue: usize,
    /// The server's credentials and the limits on wrong ones (every
    /// protocol's; relay rooms stay anonymous, as relay protocol 1 has them).
    pub credentials: crate::http::CredentialSettings,
}

/// The relay's routes: the HTTP API under `/api` and the WebSocket `/ws`.
pub fn router(relay: Arc<Relay>) -> Router {
    Router::new()
        .nest("/api", api::router(Arc::clone(&relay)))
        .route("/ws", get(conn::ws_upgrade).with_state(relay))
}

/// Why no room was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CreateError {
    /// The store did not take it.
    NotStored,
    /// Every PIN tried is taken.
    NoPin,
    /// The lease table could not be reached (a cluster's).
    NoLease,
    /// The server holds `max_rooms` rooms already.
    Full,
}

/// Everything the relay's handlers, rooms and connections share.
pub struct Relay {
    config: RelayConfig,
    origins: Arc<AllowedOrigins>,
    clock: Arc<dyn Clock>,
    pub metrics: Arc<RelayMetrics>,
    writer: StoreWriter<RoomChange>,
    store: Arc<dyn RelayStore>,
    /// The rooms this node owns on a cluster (PostgreSQL); `None`: one node.
    leases: Option<Arc<Leases>>,
    /// How a client reaches a room another node owns (with NATS).
    tunnels: std::sync::OnceLock<Arc<crate::cluster::tunnel::Tunnels>>,
    rooms: Mutex<HashMap<String, RoomHandle>>,
    creation_limit: crate::http::CreationLimit,
    next_conn: AtomicU64,
    players: Arc<AtomicU64>,
    /// Bundle uploads being read, checked and written (`concurrent_uploads`).
    uploads: Arc<tokio::sync::Semaphore>,
    /// `GET /api/rooms/:pin` per client IP.
    lookups: PerIpRate,
    /// `join` and `host` frames per client IP.
    pub(crate) joins: PerIpRate,
    /// Bundles, read from the store through a cache bounded in bytes.
    pub bundles: bundles::Bundles,
    /// Its sockets' settings (from `config`).
    socket_config: Arc<crate::ws::Config>,
}

impl Relay {
    /// Starts the relay with the rooms a store held (without their
    /// bundles: those are read from `store` when asked for).
    pub fn start(
        config: RelayConfig,
        clock: Arc<dyn Clock>,
        metrics: Arc<RelayMetrics>,
        writer: StoreWriter<RoomChange>,
        store: Arc<dyn RelayStore>,
        stored: Vec<StoredRoom>,
        leases: Option<Arc<Leases>>,
    ) -> Arc<Relay> {
        let l = config.server_limits;
        let uploads = l.concurrent_uploads.max(1);
        let bundles = bundles::Bundles::new(
            Arc::clone(&store),
            l.bundle_cache_bytes,
            config.limits.bundle_bytes,
        );
        let relay = Arc::new(Relay {
            bundles,
            lookups: PerIpRate::new(
                l.lookups_per_ip_per_second,
                l.lookup_burst_per_ip,
                l.rate_limited_ips,
            ),
            joins: PerIpRate::new(
                l.joins_per_ip_per_second,
                l.join_burst_per_ip,
                l.rate_limited_ips,
            ),
            origins: Arc::new(config.allowed_origins.clone()),
            socket_config: Arc::new(conn::socket_config(&config)),
            creation_limit: crate::http::CreationLimit::new(
                config.rooms_per_ip_per_hour,
                "rooms",
                "ROOMS_PER_IP_PER_HOUR",
            ),
            config,
            clock,
            metrics,
            writer,
            store,
            leases,
            tunnels: std::sync::OnceLock::new(),
            rooms: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            players: Arc::new(AtomicU64::new(0)),
            uploads: Arc::new(tokio::sync::Semaphore::new(uploads)),
        });
        if let Some(leases) = &relay.leases {
            leases.register(
                UnitKind::RelayRoom,
                Arc::new(Weakly(Arc::downgrade(&relay))),
            );
            // On a cluster a room is served by the node holding its lease:
            // the stored rooms nobody holds are taken (restored as below),
            // the others left to their owners.
            let pins: Vec<String> = stored.into_iter().map(|s| s.record.pin).collect();
            let leases = Arc::clone(leases);
            tokio::spawn(async move {
                for pin in pins {
                    leases.take_over(UnitKind::RelayRoom, &pin).await;
                }
            });
            return relay;
        }
        let now = relay.clock.now_ms();
        let mut fix_ups = Vec::new();
        for s in stored {
            let (room, fix_up) = Room::restore(s.record, now, relay.config.limits);
            fix_ups.extend(fix_up);
            relay.spawn_room(room);
        }
        if !relay.writer.try_write_behind("start-up", fix_ups) {
            tracing::error!("start-up fix-ups not queued: the store queue is full");
        }
        relay
    }

    /// Carries clients of rooms owned elsewhere to their owners through
    /// `tunnels`, and serves the clients other nodes carry here.
    pub fn use_tunnels(self: &Arc<Self>, tunnels: Arc<crate::cluster::tunnel::Tunnels>) {
        tunnels.accept(conn::TUNNEL_PROTOCOL, conn::acceptor(self));
        let _ = self.tunnels.set(tunnels);
    }

    fn spawn_room(self: &Arc<Self>, room: Room) {
        let (handle, rx) = RoomHandle::new(ROOM_QUEUE);
        if let Ok(mut rooms) = self.rooms.lock() {
            rooms.insert(room.pin().to_owned(), handle.clone());
        }
        self.run_room(room, handle, rx);
    }

    /// Starts the task of a room whose handle is in `rooms` already.
    fn run_room(self: &Arc<Self>, room: Room, handle: RoomHandle, rx: mpsc::Receiver<RoomCmd>) {
        self.players.fetch_add(room.player_count() as u64, Relaxed);
        self.metrics.rooms.fetch_add(1, Relaxed);
        let relay = Arc::clone(self);
        let span = room_span(room.pin());
        tokio::spawn(room::run(relay, room, handle, rx).instrument(span));
    }

    /// The room was lost to another node: it leaves `rooms` now (nothing
    /// more reaches it) and its task closes its clients
    /// ([`CLOSE_ROOM_MOVED`]).
    fn lose(&self, pin: &str) {
        let handle = self.rooms.lock().ok().and_then(|mut r| r.remove(pin));
        if let Some(h) = handle {
            h.lost.notify_one();
        }
    }

    /// A room this node serves, taken over from the store if its lease is
    /// free (a cluster's): what a join, a host and every room API look up.
    async fn find_room(self: &Arc<Self>, pin: &str) -> Find<RoomHandle> {
        if let Some(h) = self.room(pin) {
            return Find::Here(h);
        }
        let Some(leases) = &self.leases else {
            return Find::NotFound;
        };
        // Read first: a PIN guess must not leave a lease row behind.
        let store = Arc::clone(&self.store);
        let p = pin.to_owned();
        match crate::blocking::spawn(move || store.load_room(&p)).await {
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => return Find::NotFound,
            _ => return Find::Unavailable,
        }
        match leases.take_over(UnitKind::RelayRoom, pin).await {
            TakeOver::Serving => self.room(pin).map_or(Find::NotFound, Find::Here),
            TakeOver::Gone => Find::NotFound,
            TakeOver::Elsewhere(held) => {
                tracing::debug!(pin, owner = %held.owner, "room served by another node");
                Find::Elsewhere(held.owner)
            }
            TakeOver::Failed => Find::Unavailable,
        }
    }

    /// Restores a room whose lease this node just took, from the store, as
    /// a restart does.
    async fn restore_room(self: &Arc<Self>, pin: &str) -> Restored {
        let store = Arc::clone(&self.store);
        let p = pin.to_owned();
        let stored = match crate::blocking::spawn(move || store.load_room(&p)).await {
            Ok(Ok(Some(s))) => s,
            Ok(Ok(None)) => return Restored::Gone,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, pin, "room not restored: the store failed");
                return Restored::Failed;
            }
            Err(_) => return Restored::Failed,
        };
        let (room, fix_up) = Room::restore(stored.record, self.clock.now_ms(), self.config.limits);
        self.bundles.forget(pin);
        self.spawn_room(room);
        self.writer
            .write_behind(pin, fix_up.into_iter().collect())
            .await;
        room_span(pin).in_scope(|| tracing::info!("room taken over"));
        Restored::Serving
    }

    fn room(&self, pin: &str) -> Option<RoomHandle> {
        self.rooms.lock().ok()?.get(pin).cloned()
    }

    /// Every live room (a snapshot; rooms may close meanwhile).
    fn handles(&self) -> Vec<RoomHandle> {
        self.rooms
            .lock()
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Changes waiting for the store writer (a batch being written is not
    /// counted).
    pub fn store_queue_len(&self) -> usize {
        self.writer.queued()
    }

    /// Units in the batch the store writer is writing now.
    pub fn store_batch_len(&self) -> usize {
        self.writer.in_batch()
    }

    pub fn room_count(&self) -> usize {
        self.rooms.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Client IPs with a lookup bucket, and with a join bucket: each at
    /// most `rate_limited_ips`.
    pub fn rate_limited_ips(&self) -> (usize, usize) {
        (self.lookups.tracked_ips(), self.joins.tracked_ips())
    }

    fn next_conn(&self) -> ConnId {
        self.next_conn.fetch_add(1, Relaxed)
    }

    /// Creates a room, durable before its PIN is handed out.
    async fn create_room(self: &Arc<Self>) -> Result<(String, String), CreateError> {
        if self.leases.is_none() {
            return self.create_room_once().await.map_err(|(e, _)| e);
        }
        for _ in 0..CLUSTER_PIN_ATTEMPTS {
            match self.create_room_once().await {
                Err((CreateError::NoPin, true)) => continue,
                r => return r.map_err(|(e, _)| e),
            }
        }
        Err(CreateError::NoPin)
    }

    /// Takes the lease of a new room's PIN (a cluster's): `Err(true)` when
    /// the PIN is another node's, or names a stored room nobody served
    /// (which is restored here instead).
    async fn lease_new_pin(self: &Arc<Self>, pin: &str) -> Result<(), bool> {
        let Some(leases) = &self.leases else {
            return Ok(());
        };
        match leases.acquire(UnitKind::RelayRoom, pin).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return Err(true),
            Err(e) => {
                tracing::warn!(error = %e, "room not created: its lease was not taken");
                return Err(false);
            }
        }
        let store = Arc::clone(&self.store);
        let p = pin.to_owned();
        match crate::blocking::spawn(move || store.load_room(&p)).await {
            Ok(Ok(None)) => Ok(()),
            Ok(Ok(Some(stored))) => {
                // A room left by a node that stopped: this node serves it.
                let (room, fix_up) =
                    Room::restore(stored.record, self.clock.now_ms(), self.config.limits);
                let (handle, rx) = RoomHandle::new(ROOM_QUEUE);
                if let Ok(mut rooms) = self.rooms.lock() {
                    rooms.insert(pin.to_owned(), handle.clone());
                }
                self.run_room(room, handle, rx);
                self.writer
                    .write_behind(pin, fix_up.into_iter().collect())
                    .await;
                Err(true)
            }
            _ => {
                leases.release(UnitKind::RelayRoom, pin).await;
                Err(false)
            }
        }
    }

    /// One try at a room; with the error, whether another PIN may do.
    async fn create_room_once(self: &Arc<Self>) -> Result<(String, String), (CreateError, bool)> {
        let now = self.clock.now_ms();
        let (handle, rx) = RoomHandle::new(ROOM_QUEUE);
        let pin = {
            let mut rooms = self
                .rooms
                .lock()
                .map_err(|_| (CreateError::NotStored, false))?;
            // Capped well below the PIN space, so that the bounded PIN
            // search below (under this lock) almost never misses.
            if rooms.len() >= self.config.server_limits.max_rooms {
                return Err((CreateError::Full, false));
            }
            let pin = choose_pin(
                || u32::from_ne_bytes(hostwire_core::token::random_bytes()),
                |p| rooms.contains_key(p),
            )
            .ok_or((CreateError::NoPin, false))?;
            // Taken from now on: a creation running meanwhile cannot choose
            // it too. Commands wait in the queue until the room's task runs.
            rooms.insert(pin.clone(), handle.clone());
            pin
        };
        let forget = |relay: &Relay| {
            // Dropping the queue's receiver answers whoever waits with 404.
            if let Ok(mut rooms) = relay.rooms.lock() {
                if rooms.get(&pin).is_some_and(|h| h.same(&handle)) {
                    rooms.remove(&pin);
                }
            }
        };
        // On a cluster the room is this node's (its lease taken) before
        // its creation is written, and its writes carry the generation.
        if let Err(other_pin) = self.lease_new_pin(&pin).await {
            forget(self);
            let e = if other_pin {
                CreateError::NoPin
            } else {
                CreateError::NoLease
            };
            return Err((e, other_pin));
        }
        let (room, created) = Room::create(pin.clone(), now, self.config.limits);
        let token = room.host_token().as_str().to_owned();
        if !self.writer.write_durable(&pin, vec![created]).await {
            forget(self);
            if let Some(leases) = &self.leases {
                leases.release(UnitKind::RelayRoom, &pin).await;
            }
            return Err((CreateError::NotStored, false));
        }
        self.run_room(room, handle, rx);
        self.metrics.rooms_created.fetch_add(1, Relaxed);
        room_span(&pin).in_scope(|| tracing::info!("room created"));
        Ok((pin, token))
    }

    /// The client that per-IP limits count (`TRUST_PROXY`,
    /// `TRUSTED_PROXY_HOPS`; an IPv6 address by its /64).
    fn client_ip(&self, headers: &axum::http::HeaderMap, peer: std::net::SocketAddr) -> String {
        crate::http::client_ip::limit_key(&crate::http::client_ip(
            headers,
            peer,
            self.config.trust_proxy,
            self.config.server_limits.trusted_proxy_hops,
        ))
    }

    /// Counts a room creation by `ip`, or answers 429 with when it may.
    fn allow_room_creation(
        &self,
        ip: &str,
    ) -> Result<(), crate::http::credentials::TooManyCreations> {
        self.creation_limit.admit(ip, self.clock.now_ms())
    }

    /// Runs one sweep over every room now (the timer calls it every 30 s).
    pub async fn sweep(&self) {
        for h in self.handles() {
            let _ = h.tx.send(RoomCmd::Sweep).await;
        }
        let now = self.clock.now_ms();
        self.creation_limit.sweep(now);
        self.lookups.sweep(now);
        self.joins.sweep(now);
        // Let the rooms act on the sweep before returning.
        for h in self.handles() {
            let (tx, rx) = oneshot::channel();
            if h.tx.send(RoomCmd::Info(tx)).await.is_ok() {
                let _ = rx.await;
            }
        }
    }

    /// Sweeps every `sweep_interval_ms` until `stop` turns true.
    pub async fn sweep_timer(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick =
            tokio::time::interval(Duration::from_millis(self.config.limits.sweep_interval_ms));
        loop {
            tokio::select! {
                _ = tick.tick() => self.sweep().await,
                r = stop.changed() => if r.is_err() || *stop.borrow() { break },
            }
        }
    }

    /// Closes every connection with 1001 (rooms stay stored) and flushes
    /// the store.
    pub async fn shutdown(&self) {
        for h in self.handles() {
            let (tx, rx) = oneshot::channel();
            if h.tx.send(RoomCmd::Shutdown(tx)).await.is_ok() {
                let _ = rx.await;
            }
        }
        self.writer.flush().await;
    }

    /// `{"ok":true,"rooms":…,"connections":…,"players":…}`
    pub(crate) fn health(&self) -> Value {
        json!({
            "ok": true,
            "rooms": self.room_count(),
            "connections": self.metrics.connections.load(Relaxed),
            "players": self.players.load(Relaxed),
        })
    }
}

/// The relay's rooms as the leases see them.
impl Units for Relay {
    fn lose_unit(&self, key: &str) {
        self.lose(key);
    }

    async fn restore_unit(self: Arc<Self>, key: &str) -> Restored {
        self.restore_room(key).await
    }
}

/// The span of every line of a room's life: its PIN names it. A root span,
/// not the creating request's: the room outlives that connection.
fn room_span(pin: &str) -> tracing::Span {
    tracing::info_span!(parent: None, "room", pin = %pin)
}
