//! The ggui live channel (`draft-2026-08-19`): the sans-IO
//! [`hostwire_ggui::Channel`] driven with sockets, one task and the store.
//!
//! - [`ws`]: each WebSocket connection of `/ggui/ws` (a reader, a writer and
//!   the connection's bounded outbound queue);
//! - [`api`]: the agent side's HTTP API under `/ggui/sessions`.
//!
//! Every session lives in one [`Channel`], owned by one task (the channel
//! actor): connections and API calls send it commands through a bounded
//! queue, and it answers by pushing frames onto connections' outbound
//! queues (never waiting on a socket) and records onto the persistence
//! queue, in the order the core produced them. No lock is held across I/O:
//! the actor awaits only the bounded persistence queue and the commits its
//! acknowledgements wait for, which is how a slow disk slows intake
//! instead of growing memory.
//!
//! An action's JSON Schema validation does not run on the actor: the core
//! hands it out ([`Output::Validate`]) with the session's compiled spec
//! (shared), it runs on tokio's blocking threads, at most
//! [`validation_workers`] at once, and comes back to the actor as an event.
//! A session has one validation under way at a time and its later frames
//! wait in the core, so its actions and acks keep their order while other
//! sessions go on. A cheap action is validated in the core at once (see
//! [`hostwire_ggui::channel::INLINE_VALIDATION_MAX_COST`]).
//!
//! The task is THE unit driver ([`crate::unit::drive`]) running the
//! protocol crate's [`DurableChannel`], which holds the durability rules:
//! commands waiting in the queue are handled one after another as one
//! batch, stored with one commit (one write per session): what the batch
//! acknowledges waits for the commit, and frames arriving meanwhile share
//! the next one. One commit per action held a client that pipelines its
//! actions to the disk's commit rate.

mod actor;
pub mod api;
mod leased;
mod records;
use actor::{run_actor, Validations};
use records::restored;
pub mod ws;

/// The live channel's close after a refused store (the protocol crate's).
pub use hostwire_ggui::channel::CLOSE_STORE_FAILED;
pub use hostwire_ggui::durable::{
    EXPIRY_SWEEP_MS, HOST_CONTEXT_COALESCE_COMMANDS, MAX_BATCH_COMMANDS, MAX_BATCH_FRAME_BYTES,
};

use crate::cluster::leases::{Leases, Weakly};
use crate::http::AllowedOrigins;
use crate::metrics::{write_counter, write_gauge, Render};
use crate::metrics::{StoreMetrics, StoreProtocol};
use crate::store_writer::StoreWriter;
use crate::ws::Utf8Bytes;
use axum::Router;
use bytes::Bytes;
use hostwire_core::Clock;
use hostwire_ggui::durable::DurableChannel;
use hostwire_ggui::ValidatedAction;
use hostwire_ggui::{Channel, ChannelConfig, ConnId};
use hostwire_store::ggui::{GguiChange, GguiStore};
use hostwire_store::lease::UnitKind;
use hostwire_store::{UnitResults, UnitStore};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Frames waiting for one slow reader before it is closed (1013). A
/// resubscribe replays up to a whole ledger (10,000 entries) and stream
/// buffer (256) at once, so the bound leaves room for that; queued frames
/// share the ledger's and buffer's own bytes (no copy per subscriber), so
/// a full queue costs little beyond what the session already holds.
pub const OUTBOUND_QUEUE: usize = 16 * 1024;
/// Commands waiting for the channel actor; a full queue makes readers and
/// API calls wait (backpressure), never grow memory.
pub const COMMAND_QUEUE: usize = 4096;
/// Long polls waiting on one session at once (`429` past it).
pub const MAX_LONG_POLLS_PER_SESSION: usize = 16;
/// Milliseconds a session nobody uses (no subscriber, no agent call, no
/// long poll) stays before it is removed with its rows, unless
/// configured: a day, so an agent may prepare a session well ahead.
pub const DEFAULT_IDLE_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Action validations run at once, on tokio's blocking threads, when not
/// configured: the machine's cores (one session has one under way at a
/// time, so one session's costly actions take at most one of them).
pub fn validation_workers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Settings of the live channel and its API.
#[derive(Debug, Clone)]
pub struct GguiConfig {
    /// The core's settings (default app, advertised version, version
    /// policy, bounds).
    pub channel: ChannelConfig,
    /// Browser origins allowed to open `/ggui/ws` (a request without an
    /// `Origin`, from an agent or a test kit, is not a browser's).
    pub allowed_origins: AllowedOrigins,
    /// The apps whose agents may use the API, each with its own agent
    /// credential (`Authorization: Bearer`): an agent sees only its own
    /// app's sessions. None: the agent API is closed.
    pub apps: Vec<GguiApp>,
    /// Frames queued for one connection before it counts as too slow.
    pub outbound_queue: usize,
    /// Milliseconds from a session's last use (a subscriber, an agent
    /// call, a long poll) to its removal with its rows.
    pub idle_ttl_ms: u64,
    /// Action validations run at once, off the channel actor.
    pub validation_workers: usize,
}

impl Default for GguiConfig {
    fn default() -> Self {
        GguiConfig {
            channel: ChannelConfig::default(),
            allowed_origins: AllowedOrigins::Any,
            apps: Vec::new(),
            outbound_queue: OUTBOUND_QUEUE,
            idle_ttl_ms: DEFAULT_IDLE_TTL_MS,
            validation_workers: validation_workers(),
        }
    }
}

/// An app and its agent's credential.
#[derive(Clone)]
pub struct GguiApp {
    pub id: String,
    pub credential: String,
}

impl std::fmt::Debug for GguiApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credential is a secret: never in logs.
        f.debug_struct("GguiApp").field("id", &self.id).finish()
    }
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct GguiMetrics {
    pub connections: AtomicU64,
    pub sessions: AtomicU64,
    pub long_polls: AtomicU64,
    /// Bytes of request bodies the agent API is reading now (at most
    /// `API_BODY_BUDGET_BYTES`).
    pub api_body_bytes: AtomicU64,
    pub frames_in: AtomicU64,
    pub frames_out: AtomicU64,
    pub slow_consumers_closed: AtomicU64,
    pub oversized_frames: AtomicU64,
    pub store_errors: AtomicU64,
}

impl Render for GguiMetrics {
    fn render(&self, out: &mut String) {
        write_gauge(
            out,
            "hostwire_ggui_connections",
            "Open ggui live-channel sockets.",
            self.connections.load(Relaxed) as i64,
        );
        write_gauge(
            out,
            "hostwire_ggui_sessions",
            "ggui sessions held.",
            self.sessions.load(Relaxed) as i64,
        );
        write_gauge(
            out,
            "hostwire_ggui_long_polls",
            "Agent long polls waiting for actions.",
            self.long_polls.load(Relaxed) as i64,
        );
        write_gauge(
            out,
            "hostwire_ggui_api_body_bytes",
            "Bytes of request bodies the agent API is reading (bound: API_BODY_BUDGET_BYTES).",
            self.api_body_bytes.load(Relaxed) as i64,
        );
        write_counter(
            out,
            "hostwire_ggui_frames_in_total",
            "Frames received on the ggui live channel.",
            self.frames_in.load(Relaxed),
        );
        write_counter(
            out,
            "hostwire_ggui_frames_out_total",
            "Frames queued for ggui subscribers.",
            self.frames_out.load(Relaxed),
        );
        write_counter(
            out,
            "hostwire_ggui_slow_consumers_closed_total",
            "ggui sockets closed because their outbound queue was full.",
            self.slow_consumers_closed.load(Relaxed),
        );
        write_counter(
            out,
            "hostwire_ggui_oversized_frames_total",
            "ggui frames over the 1 MiB limit (closed with 1009).",
            self.oversized_frames.load(Relaxed),
        );
        write_counter(
            out,
            "hostwire_ggui_store_errors_total",
            "Failed writes of ggui records.",
            self.store_errors.load(Relaxed),
        );
    }
}

/// A frame shared by every subscriber it goes to: serialized once by the
/// core, handed to each socket without a copy.
struct SharedFrame(Arc<str>);

impl AsRef<[u8]> for SharedFrame {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

fn to_text(frame: Arc<str>) -> Utf8Bytes {
    let bytes = Bytes::from_owner(SharedFrame(frame));
    // The bytes came from a `str`: the check cannot fail.
    Utf8Bytes::try_from(bytes).unwrap_or_else(|_| Utf8Bytes::from_static(""))
}

/// What the actor is asked to do.
pub(crate) enum Cmd {
    Open {
        conn: ConnId,
        out: ws::Outbound,
        authenticated: bool,
        /// The session and app of the connection's UI token.
        bound: Option<(String, String)>,
    },
    Frame {
        conn: ConnId,
        text: Utf8Bytes,
    },
    Closed {
        conn: ConnId,
    },
    /// An API call: runs on the actor's state, answers through its own
    /// oneshot.
    Call(Box<dyn FnOnce(&mut Core) + Send>),
    /// Remove the sessions idle for `idle_ttl_ms`; answers how many.
    ExpireIdle(oneshot::Sender<usize>),
    /// An action validated off the actor.
    Validated(Box<ValidatedAction>),
}

/// The task's state: the channel with its durability rules, each
/// connection's outbound queue, and the long polls waiting for actions.
pub(crate) struct Core {
    pub unit: DurableChannel<oneshot::Sender<bool>>,
    conns: HashMap<ConnId, ws::Outbound>,
    waiters: HashMap<String, Vec<oneshot::Sender<()>>>,
    pub now_ms: u64,
    /// An API call's question whether its change was stored, answered
    /// once the command's records are (see [`Ggui::call_stored`]).
    stored_answer: Option<oneshot::Sender<bool>>,
    /// Shutting down: long polls are answered at once, none waits.
    pub(crate) closing: bool,
    /// A command that waits for the writes under way (see `Core::defers`).
    deferred: Option<Cmd>,
    metrics: Arc<GguiMetrics>,
    /// The node's leases on a cluster: an expired session lets its go.
    leases: Option<Arc<Leases>>,
}

impl Core {
    /// The agent used `session_id` now.
    pub(crate) fn touch(&mut self, session_id: &str) {
        self.unit.touch(session_id, self.now_ms);
    }

    /// Registers a long poll on `session_id`; `None` past the bound.
    pub(crate) fn wait_for_actions(&mut self, session_id: &str) -> Option<oneshot::Receiver<()>> {
        let list = self.waiters.entry(session_id.to_owned()).or_default();
        list.retain(|w| !w.is_closed());
        if list.len() >= MAX_LONG_POLLS_PER_SESSION {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        list.push(tx);
        Some(rx)
    }
}

/// Everything the live channel's handlers share.
pub struct Ggui {
    pub(crate) config: GguiConfig,
    pub(crate) tx: mpsc::Sender<Cmd>,
    pub metrics: Arc<GguiMetrics>,
    writer: Option<StoreWriter<GguiChange>>,
    /// The store, for a session taken over alone (a cluster's).
    store: Option<Arc<dyn GguiStore>>,
    /// The sessions this node owns on a cluster (PostgreSQL); `None`: one
    /// node.
    leases: Option<Arc<Leases>>,
    /// How a UI socket reaches the node that minted its token (with NATS).
    tunnels: std::sync::OnceLock<Arc<crate::cluster::tunnel::Tunnels>>,
    next_conn: AtomicU64,
    /// The UI tokens minted through the agent API.
    pub(crate) ui_tokens: api::UiTokens,
}

/// The live channel's routes: `/ggui/ws` and the API under `/ggui/sessions`.
pub fn router(ggui: Arc<Ggui>) -> Router {
    Router::new()
        .route(
            "/ggui/ws",
            axum::routing::get(ws::ws_upgrade).with_state(Arc::clone(&ggui)),
        )
        .nest("/ggui/sessions", api::router(ggui))
}

impl Ggui {
    /// Starts the channel actor and the persistence thread, with the
    /// sessions `store` holds (none without a store).
    pub fn start(
        config: GguiConfig,
        clock: Arc<dyn Clock>,
        store: Option<Arc<dyn GguiStore>>,
        store_metrics: Arc<StoreMetrics>,
    ) -> anyhow::Result<Arc<Ggui>> {
        Self::start_leased(config, clock, store, store_metrics, None)
    }

    /// [`start`](Self::start) on a cluster: each session is served by the
    /// node holding its lease, and its writes are fenced by it (see
    /// `leased.rs`).
    pub fn start_leased(
        config: GguiConfig,
        clock: Arc<dyn Clock>,
        store: Option<Arc<dyn GguiStore>>,
        store_metrics: Arc<StoreMetrics>,
        leases: Option<Arc<Leases>>,
    ) -> anyhow::Result<Arc<Ggui>> {
        let metrics = Arc::new(GguiMetrics::default());
        let mut channel_config = config.channel.clone();
        channel_config.defer_validation = true;
        let mut channel = Channel::new(channel_config);
        let mut unowned = Vec::new();
        if let Some(store) = &store {
            let stored = store.ggui_load()?;
            // On a cluster the stored sessions nobody holds are taken
            // (below, once the channel runs); the others left to their
            // owners.
            let stored = match &leases {
                Some(_) => {
                    unowned = stored.into_iter().map(|s| s.session_id).collect();
                    Vec::new()
                }
                None => stored,
            };
            for s in stored {
                let id = s.session_id.clone();
                match restored(s)
                    .and_then(|r| channel.restore_session(r).map_err(|e| e.to_string()))
                {
                    Ok(()) => {}
                    Err(e) => session_span(&id)
                        .in_scope(|| tracing::warn!(error = %e, "ggui session not restored")),
                }
            }
            tracing::info!(sessions = channel.session_count(), "ggui sessions restored");
        }
        metrics
            .sessions
            .store(channel.session_count() as u64, Relaxed);
        let stores = store.is_some();
        // Without a store nothing is written: the unit hands out no write.
        let kept = store.clone();
        let store = store.map_or_else(
            || Arc::new(NoStore) as Arc<dyn UnitStore<GguiChange>>,
            |s| s as Arc<dyn UnitStore<GguiChange>>,
        );
        let unit_writer = StoreWriter::start_fenced(
            store,
            StoreProtocol::Ggui,
            store_metrics,
            leases.as_ref().map(|l| l.fence(UnitKind::GguiSession)),
        );
        let writer = stores.then(|| unit_writer.clone());
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let now = clock.now_ms();
        let core = Core {
            unit: DurableChannel::new(channel, stores, config.idle_ttl_ms, now),
            conns: HashMap::new(),
            waiters: HashMap::new(),
            closing: false,
            now_ms: now,
            stored_answer: None,
            deferred: None,
            metrics: Arc::clone(&metrics),
            leases: leases.clone(),
        };
        let validations = Validations::new(config.validation_workers, tx.downgrade());
        // One task serves every ggui session: its lines about one session
        // are in that session's span too (`session_span`).
        tokio::spawn(tracing::Instrument::instrument(
            run_actor(core, rx, validations, clock, unit_writer),
            tracing::info_span!(parent: None, "ggui"),
        ));
        let ggui = Arc::new(Ggui {
            config,
            tx,
            metrics,
            writer,
            store: kept,
            leases,
            tunnels: std::sync::OnceLock::new(),
            next_conn: AtomicU64::new(1),
            ui_tokens: api::UiTokens::default(),
        });
        if let Some(l) = &ggui.leases {
            l.register(
                UnitKind::GguiSession,
                Arc::new(Weakly(Arc::downgrade(&ggui))),
            );
        }
        leased::take_over_stored(&ggui, unowned);
        Ok(ggui)
    }

    /// Removes the sessions nobody used for `idle_ttl_ms` now (the actor
    /// does it every [`EXPIRY_SWEEP_MS`]); returns how many.
    pub async fn expire_idle(&self) -> usize {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::ExpireIdle(tx)).await.is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
    }

    pub(crate) fn next_conn(&self) -> ConnId {
        ConnId(self.next_conn.fetch_add(1, Relaxed))
    }

    /// Runs `f` on the actor's state and returns its answer; `None` when
    /// the actor is gone (shutting down).
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Core) -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        let cmd = Cmd::Call(Box::new(move |core| {
            let _ = tx.send(f(core));
        }));
        self.tx.send(cmd).await.ok()?;
        rx.await.ok()
    }

    /// Runs `f` on the actor's state and returns its answer once what it
    /// changed durably is stored: `(answer, false)` if the store failed
    /// (the change was taken back). `None` when the actor is gone.
    pub(crate) async fn call_stored<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Core) -> T + Send + 'static,
    ) -> Option<(T, bool)> {
        let (stored_tx, stored_rx) = oneshot::channel();
        let answer = self
            .call(move |core| {
                core.stored_answer = Some(stored_tx);
                f(core)
            })
            .await?;
        let stored = stored_rx.await.ok()?;
        Some((answer, stored))
    }

    /// Closes every socket with 1001 and waits until every record queued
    /// so far is on disk.
    pub async fn shutdown(&self) {
        let _ = self
            .call(|core| {
                for out in core.conns.values() {
                    out.close(ws::CLOSE_GOING_AWAY, "server shutting down");
                }
                // Waiting long polls answer with what they have.
                core.closing = true;
                for (_, list) in core.waiters.drain() {
                    for w in list {
                        let _ = w.send(());
                    }
                }
            })
            .await;
        // Records the actor queued before the call above (host contexts
        // waiting included: the actor writes them when it is idle) are
        // ahead of this.
        let _ = self.call(|_| ()).await;
        if let Some(w) = &self.writer {
            w.flush().await;
        }
    }
}

/// The store of a channel without one: never written to (the unit hands
/// out no write), there because the driver takes a writer.
struct NoStore;

impl UnitStore<GguiChange> for NoStore {
    fn apply_units(&self, units: &[hostwire_store::Unit<'_, GguiChange>]) -> UnitResults {
        hostwire_store::apply_each(units, |_| Ok(()))
    }
}

/// The span of a line about one ggui session: its id names it.
pub(crate) fn session_span(id: &str) -> tracing::Span {
    tracing::info_span!("ggui_session", id = %id)
}
