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
//! the only await in the actor is on the bounded persistence queue, which
//! is how a slow disk slows intake instead of growing memory.

pub mod api;
pub mod ws;

use crate::http::AllowedOrigins;
use crate::metrics::{write_counter, write_gauge, Render};
use axum::extract::ws::Utf8Bytes;
use axum::Router;
use bytes::Bytes;
use hostwire_core::Clock;
use hostwire_ggui::channel::{RestoredSession, SessionRecord};
use hostwire_ggui::{Channel, ChannelConfig, ConnId, GguiSessionEvent, Output, Record};
use hostwire_ggui::{ReplayPolicy, StreamEnvelope};
use hostwire_store::ggui::{GguiChange, GguiStore, GguiStoredSession};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
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
/// Batches of records waiting for the disk; a full queue makes the actor
/// wait for it.
pub const PERSIST_QUEUE: usize = 1024;
/// Long polls waiting on one session at once (`429` past it).
pub const MAX_LONG_POLLS_PER_SESSION: usize = 16;

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
}

impl Default for GguiConfig {
    fn default() -> Self {
        GguiConfig {
            channel: ChannelConfig::default(),
            allowed_origins: AllowedOrigins::Any,
            apps: Vec::new(),
            outbound_queue: OUTBOUND_QUEUE,
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
}

/// The actor's state: the core, each connection's outbound queue, and the
/// long polls waiting for actions.
pub(crate) struct Core {
    pub channel: Channel,
    conns: HashMap<ConnId, ws::Outbound>,
    waiters: HashMap<String, Vec<oneshot::Sender<()>>>,
    pub now_ms: u64,
}

impl Core {
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

enum Persist {
    Records(Vec<Record>),
    Flush(oneshot::Sender<()>),
}

/// Everything the live channel's handlers share.
pub struct Ggui {
    pub(crate) config: GguiConfig,
    pub(crate) tx: mpsc::Sender<Cmd>,
    pub metrics: Arc<GguiMetrics>,
    persist: mpsc::Sender<Persist>,
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

/// A stored stream entry.
#[derive(Serialize, Deserialize)]
struct StoredStreamEntry {
    envelope: StreamEnvelope,
    policy: ReplayPolicy,
}

fn to_change(r: Record) -> Option<GguiChange> {
    Some(match r {
        Record::Session(rec) => GguiChange::PutSession {
            session_id: rec.session_id.clone(),
            record: json(&rec)?,
        },
        Record::LedgerEvent { session_id, event } => GguiChange::PutLedger {
            session_id,
            seq: event.seq,
            event: json(&event)?,
        },
        Record::LedgerTrimmed {
            session_id,
            horizon,
        } => GguiChange::TrimLedger {
            session_id,
            horizon,
        },
        Record::StreamEntry {
            session_id,
            envelope,
            policy,
        } => GguiChange::PutStream {
            session_id,
            seq: envelope.seq.unwrap_or(0),
            entry: json(&StoredStreamEntry { envelope, policy })?,
        },
        Record::StreamSeq { session_id, seq } => GguiChange::StreamSeq { session_id, seq },
        Record::StreamEntriesDropped { session_id, seqs } => {
            GguiChange::DropStream { session_id, seqs }
        }
        Record::ActionsDrained { session_id, up_to } => GguiChange::Drained { session_id, up_to },
    })
}

/// Serializes a record part (never fails for these types).
fn json<T: Serialize>(v: &T) -> Option<String> {
    serde_json::to_string(v).ok()
}

/// A stored session back into the core's input; `Err` names what is wrong.
fn restored(s: GguiStoredSession) -> Result<RestoredSession, String> {
    let record: SessionRecord =
        serde_json::from_str(&s.record).map_err(|e| format!("session row: {e}"))?;
    let ledger = s
        .ledger
        .iter()
        .map(|e| serde_json::from_str::<GguiSessionEvent>(e))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("ledger entry: {e}"))?;
    let stream = s
        .stream
        .iter()
        .map(|e| serde_json::from_str::<StoredStreamEntry>(e).map(|x| (x.envelope, x.policy)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("stream entry: {e}"))?;
    Ok(RestoredSession {
        record: Some(record),
        ledger,
        ledger_last_sequence: s.ledger_last,
        stream,
        stream_seq: s.stream_seq,
        drained_up_to: s.drained_up_to,
    })
}

impl Ggui {
    /// Starts the channel actor and the persistence thread, with the
    /// sessions `store` holds (none without a store).
    pub fn start(
        config: GguiConfig,
        clock: Arc<dyn Clock>,
        store: Option<Arc<dyn GguiStore>>,
    ) -> anyhow::Result<Arc<Ggui>> {
        let metrics = Arc::new(GguiMetrics::default());
        let mut channel = Channel::new(config.channel.clone());
        if let Some(store) = &store {
            for s in store.ggui_load()? {
                let id = s.session_id.clone();
                match restored(s)
                    .and_then(|r| channel.restore_session(r).map_err(|e| e.to_string()))
                {
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(session = %id, error = %e, "ggui session not restored")
                    }
                }
            }
            tracing::info!(sessions = channel.session_count(), "ggui sessions restored");
        }
        metrics
            .sessions
            .store(channel.session_count() as u64, Relaxed);
        let (persist, persist_rx) = mpsc::channel(PERSIST_QUEUE);
        spawn_persistence(store, persist_rx, Arc::clone(&metrics));
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let core = Core {
            channel,
            conns: HashMap::new(),
            waiters: HashMap::new(),
            now_ms: clock.now_ms(),
        };
        tokio::spawn(run_actor(
            core,
            rx,
            clock,
            persist.clone(),
            Arc::clone(&metrics),
        ));
        Ok(Arc::new(Ggui {
            config,
            tx,
            metrics,
            persist,
            next_conn: AtomicU64::new(1),
            ui_tokens: api::UiTokens::default(),
        }))
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

    /// Closes every socket with 1001 and waits until every record queued
    /// so far is on disk.
    pub async fn shutdown(&self) {
        let _ = self
            .call(|core| {
                for out in core.conns.values() {
                    out.close(ws::CLOSE_GOING_AWAY, "server shutting down");
                }
            })
            .await;
        // Records the actor queued before the call above are ahead of this.
        let (tx, rx) = oneshot::channel();
        if self.persist.send(Persist::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

async fn run_actor(
    mut core: Core,
    mut rx: mpsc::Receiver<Cmd>,
    clock: Arc<dyn Clock>,
    persist: mpsc::Sender<Persist>,
    metrics: Arc<GguiMetrics>,
) {
    while let Some(cmd) = rx.recv().await {
        core.now_ms = clock.now_ms();
        let now = core.now_ms;
        match cmd {
            Cmd::Open {
                conn,
                out,
                authenticated,
                bound,
            } => {
                core.channel.connection_opened(conn, now, authenticated);
                if let Some((session, app)) = bound {
                    core.channel.bind_connection(conn, session, app);
                }
                core.conns.insert(conn, out);
            }
            Cmd::Frame { conn, text } => {
                metrics.frames_in.fetch_add(1, Relaxed);
                core.channel.frame_received(conn, text.as_bytes(), now);
            }
            Cmd::Closed { conn } => {
                core.channel.connection_closed(conn);
                core.conns.remove(&conn);
            }
            Cmd::Call(f) => {
                f(&mut core);
                let waiting: usize = core.waiters.values().map(Vec::len).sum();
                metrics.long_polls.store(waiting as u64, Relaxed);
            }
        }
        let records = dispatch(&mut core, &metrics);
        metrics
            .sessions
            .store(core.channel.session_count() as u64, Relaxed);
        if !records.is_empty() && persist.send(Persist::Records(records)).await.is_err() {
            tracing::error!("ggui persistence stopped: records are no longer kept");
        }
    }
}

/// Carries out what the core asked for, in its order; returns the records
/// to persist.
fn dispatch(core: &mut Core, metrics: &GguiMetrics) -> Vec<Record> {
    let mut records = Vec::new();
    while let Some(o) = core.channel.poll_output() {
        match o {
            Output::Send { conn, frame } => {
                if let Some(out) = core.conns.get(&conn) {
                    metrics.frames_out.fetch_add(1, Relaxed);
                    if out.frame(to_text(frame)) == ws::Pushed::TooSlow {
                        metrics.slow_consumers_closed.fetch_add(1, Relaxed);
                    }
                }
            }
            Output::Close { conn, code, .. } => {
                if let Some(out) = core.conns.get(&conn) {
                    out.close(code, ws::close_reason(code));
                }
            }
            Output::Persist(r) => records.push(*r),
            Output::ActionsAvailable { session_id } => {
                for w in core.waiters.remove(&session_id).unwrap_or_default() {
                    let _ = w.send(());
                }
            }
        }
    }
    records
}

/// Writes records behind the actor, in order, batched into transactions.
fn spawn_persistence(
    store: Option<Arc<dyn GguiStore>>,
    mut rx: mpsc::Receiver<Persist>,
    metrics: Arc<GguiMetrics>,
) {
    std::thread::Builder::new()
        .name("hostwire-ggui-store".into())
        .spawn(move || {
            while let Some(first) = rx.blocking_recv() {
                let mut changes = Vec::new();
                let mut flushes = Vec::new();
                let mut next = Some(first);
                while let Some(msg) = next.take() {
                    match msg {
                        Persist::Records(rs) => changes.extend(rs.into_iter().filter_map(to_change)),
                        Persist::Flush(done) => flushes.push(done),
                    }
                    if changes.len() < 4096 {
                        next = rx.try_recv().ok();
                    }
                }
                if let (Some(store), false) = (&store, changes.is_empty()) {
                    let t = Instant::now();
                    if let Err(e) = store.ggui_apply(&changes) {
                        metrics.store_errors.fetch_add(1, Relaxed);
                        tracing::error!(error = %e, changes = changes.len(), "ggui store write failed");
                    }
                    tracing::trace!(us = t.elapsed().as_micros() as u64, "ggui store write");
                }
                for f in flushes {
                    let _ = f.send(());
                }
            }
        })
        .expect("spawn the ggui store thread");
}
