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
pub mod room;

use crate::http::{AllowedOrigins, PerIpRate};
use crate::store_writer::StoreWriter;
use axum::routing::get;
use axum::Router;
use hostwire_core::Clock;
use hostwire_memizy::limits::RelayLimits;
use hostwire_memizy::relay::{choose_pin, ConnId, Room, RoomChange};
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
    ) -> Arc<Relay> {
        let l = config.server_limits;
        let uploads = l.concurrent_uploads.max(1);
        let bundles =
            bundles::Bundles::new(store, l.bundle_cache_bytes, config.limits.bundle_bytes);
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
            rooms: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            players: Arc::new(AtomicU64::new(0)),
            uploads: Arc::new(tokio::sync::Semaphore::new(uploads)),
        });
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

    fn spawn_room(self: &Arc<Self>, room: Room) {
        let (tx, rx) = mpsc::channel(ROOM_QUEUE);
        if let Ok(mut rooms) = self.rooms.lock() {
            rooms.insert(room.pin().to_owned(), RoomHandle { tx });
        }
        self.run_room(room, rx);
    }

    /// Starts the task of a room whose handle is in `rooms` already.
    fn run_room(self: &Arc<Self>, room: Room, rx: mpsc::Receiver<RoomCmd>) {
        self.players.fetch_add(room.player_count() as u64, Relaxed);
        self.metrics.rooms.fetch_add(1, Relaxed);
        let relay = Arc::clone(self);
        let span = room_span(room.pin());
        tokio::spawn(async move { room::run(relay, room, rx).await }.instrument(span));
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
        let now = self.clock.now_ms();
        let (tx, rx) = mpsc::channel(ROOM_QUEUE);
        let pin = {
            let mut rooms = self.rooms.lock().map_err(|_| CreateError::NotStored)?;
            // Capped well below the PIN space, so that the bounded PIN
            // search below (under this lock) almost never misses.
            if rooms.len() >= self.config.server_limits.max_rooms {
                return Err(CreateError::Full);
            }
            let pin = choose_pin(
                || u32::from_ne_bytes(hostwire_core::token::random_bytes()),
                |p| rooms.contains_key(p),
            )
            .ok_or(CreateError::NoPin)?;
            // Taken from now on: a creation running meanwhile cannot choose
            // it too. Commands wait in the queue until the room's task runs.
            rooms.insert(pin.clone(), RoomHandle { tx });
            pin
        };
        let (room, created) = Room::create(pin.clone(), now, self.config.limits);
        let token = room.host_token().as_str().to_owned();
        if !self.writer.write_durable(&pin, vec![created]).await {
            // Dropping the queue's receiver answers whoever waits with 404.
            if let Ok(mut rooms) = self.rooms.lock() {
                rooms.remove(&pin);
            }
            return Err(CreateError::NotStored);
        }
        self.run_room(room, rx);
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

/// The span of every line of a room's life: its PIN names it. A root span,
/// not the creating request's: the room outlives that connection.
fn room_span(pin: &str) -> tracing::Span {
    tracing::info_span!(parent: None, "room", pin = %pin)
}
