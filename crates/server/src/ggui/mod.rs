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
//! Frames and validated actions waiting in the queue are handled one after
//! another as one [`Batch`], stored with one commit (one unit per session):
//! what the batch acknowledges waits for the commit, and frames arriving
//! meanwhile share the next one. One commit per action held a client that
//! pipelines its actions to the disk's commit rate.

pub mod api;
pub mod ws;

use crate::http::AllowedOrigins;
use crate::metrics::{write_counter, write_gauge, Render};
use crate::metrics::{StoreMetrics, StoreProtocol};
use crate::store_writer::StoreWriter;
use axum::extract::ws::Utf8Bytes;
use axum::Router;
use bytes::Bytes;
use hostwire_core::Clock;
use hostwire_ggui::channel::Undo;
use hostwire_ggui::channel::{RestoredSession, SessionRecord};
use hostwire_ggui::{Channel, ChannelConfig, ConnId, GguiSessionEvent, Output, Record};
use hostwire_ggui::{ReplayPolicy, StreamEnvelope};
use hostwire_ggui::{ValidatedAction, ValidationJob};
use hostwire_store::ggui::{GguiChange, GguiStore, GguiStoredSession};
use hostwire_store::UnitStore;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Frames waiting for one slow reader before it is closed (1013). A
/// resubscribe replays up to a whole ledger (10,000 entries) and stream
/// buffer (256) at once, so the bound leaves room for that; queued frames
/// share the ledger's and buffer's own bytes (no copy per subscriber), so
/// a full queue costs little beyond what the session already holds.
pub const OUTBOUND_QUEUE: usize = 16 * 1024;
/// Commands waiting for the channel actor; a full queue makes readers and
/// API calls wait (backpressure), never grow memory.
pub const COMMAND_QUEUE: usize = 4096;
/// Commands the actor handles at most while a session's host context
/// waits to be written (keep-latest: a flood of `host_context_observed`
/// writes one small row per session now and then, never the props).
pub const HOST_CONTEXT_COALESCE_COMMANDS: u32 = 256;
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

/// Milliseconds between two passes over the sessions for idle ones.
pub const EXPIRY_SWEEP_MS: u64 = 60 * 1000;

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
    /// Remove the sessions idle for `idle_ttl_ms`; answers how many.
    ExpireIdle(oneshot::Sender<usize>),
    /// An action validated off the actor.
    Validated(Box<ValidatedAction>),
}

/// The actor's state: the core, each connection's outbound queue, and the
/// long polls waiting for actions.
pub(crate) struct Core {
    pub channel: Channel,
    conns: HashMap<ConnId, ws::Outbound>,
    waiters: HashMap<String, Vec<oneshot::Sender<()>>>,
    pub now_ms: u64,
    /// An API call's question whether its change was stored, answered
    /// once the command's records are (see [`Ggui::call_stored`]).
    stored_answer: Option<oneshot::Sender<bool>>,
    /// Shutting down: long polls are answered at once, none waits.
    pub(crate) closing: bool,
    /// When each session was last used (created, restored, an agent call,
    /// a subscriber or a long poll seen).
    last_used: HashMap<String, u64>,
}

impl Core {
    /// The agent used `session_id` now.
    pub(crate) fn touch(&mut self, session_id: &str) {
        self.last_used.insert(session_id.to_owned(), self.now_ms);
    }

    /// Removes the sessions nobody used for `idle_ttl_ms` (a subscriber or
    /// a waiting long poll counts as use now); returns their ids.
    fn expire_idle(&mut self, idle_ttl_ms: u64) -> Vec<String> {
        let now = self.now_ms;
        let ids = self.channel.session_ids();
        self.last_used.retain(|id, _| ids.contains(id));
        let mut expired = Vec::new();
        for id in ids {
            let polled = self
                .waiters
                .get(&id)
                .is_some_and(|l| l.iter().any(|w| !w.is_closed()));
            if polled || self.channel.subscriber_count(&id) > 0 {
                self.last_used.insert(id, now);
                continue;
            }
            let last = *self.last_used.entry(id.clone()).or_insert(now);
            if now.saturating_sub(last) >= idle_ttl_ms {
                self.channel.remove_session(&id);
                self.last_used.remove(&id);
                self.waiters.remove(&id);
                expired.push(id);
            }
        }
        expired
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
        Record::HostContext {
            session_id,
            host_context,
        } => GguiChange::HostContext {
            session_id,
            host_context: json(&host_context)?,
        },
    })
}

/// Serializes a record part (never fails for these types).
fn json<T: Serialize>(v: &T) -> Option<String> {
    serde_json::to_string(v).ok()
}

/// A stored session back into the core's input; `Err` names what is wrong.
fn restored(s: GguiStoredSession) -> Result<RestoredSession, String> {
    let mut record: SessionRecord =
        serde_json::from_str(&s.record).map_err(|e| format!("session row: {e}"))?;
    if let Some(ctx) = &s.host_context {
        record.host_context =
            Some(serde_json::from_str(ctx).map_err(|e| format!("host context: {e}"))?);
    }
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
        store_metrics: Arc<StoreMetrics>,
    ) -> anyhow::Result<Arc<Ggui>> {
        let metrics = Arc::new(GguiMetrics::default());
        let mut channel_config = config.channel.clone();
        channel_config.defer_validation = true;
        let mut channel = Channel::new(channel_config);
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
        let writer = store.map(|store| {
            StoreWriter::start(
                store as Arc<dyn UnitStore<GguiChange>>,
                StoreProtocol::Ggui,
                store_metrics,
            )
        });
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let core = Core {
            channel,
            conns: HashMap::new(),
            waiters: HashMap::new(),
            closing: false,
            now_ms: clock.now_ms(),
            stored_answer: None,
            last_used: HashMap::new(),
        };
        // Bounded by the sessions: each has at most one validation under way.
        let (validated_tx, validated_rx) = mpsc::unbounded_channel();
        let validations = Validations {
            permits: Arc::new(Semaphore::new(config.validation_workers.max(1))),
            done: validated_tx,
        };
        tokio::spawn(run_actor(
            core,
            rx,
            (validations, validated_rx),
            config.idle_ttl_ms,
            clock,
            writer.clone(),
            Arc::clone(&metrics),
        ));
        Ok(Arc::new(Ggui {
            config,
            tx,
            metrics,
            writer,
            next_conn: AtomicU64::new(1),
            ui_tokens: api::UiTokens::default(),
        }))
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

/// What the actor writes: through the store writer (none without a
/// store), with host contexts coalesced per session.
struct Persistence {
    writer: Option<StoreWriter<GguiChange>>,
    metrics: Arc<GguiMetrics>,
    /// The latest host context of each session not written yet.
    host_contexts: HashMap<String, String>,
    /// Commands handled since the first of them was kept.
    held_for: u32,
}

impl Persistence {
    /// Queues `records` behind the actor, one unit per session.
    async fn write_behind(&mut self, records: Vec<Record>) {
        for (session, changes) in self.units(records) {
            if let Some(w) = &self.writer {
                w.write_behind(&session, changes).await;
            }
        }
    }

    /// Writes `records` and waits: `true` once every unit is durable.
    async fn write_durable(&mut self, records: Vec<Record>) -> bool {
        let mut answers = Vec::new();
        for (session, changes) in self.units(records) {
            if let Some(w) = &self.writer {
                answers.push(w.queue_acked(&session, changes).await);
            }
        }
        let mut ok = true;
        for a in answers {
            ok &= a.wait().await;
        }
        if !ok {
            self.metrics.store_errors.fetch_add(1, Relaxed);
        }
        ok
    }

    /// Writes `records` as one unit per session (all or nothing each) and
    /// waits: the sessions whose unit failed.
    async fn write_units(&mut self, records: Vec<Record>) -> HashSet<String> {
        let mut merged: Vec<(String, Vec<GguiChange>)> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for (session, changes) in self.units(records) {
            match at.get(&session) {
                Some(&i) => merged[i].1.extend(changes),
                None => {
                    at.insert(session.clone(), merged.len());
                    merged.push((session, changes));
                }
            }
        }
        let mut answers = Vec::new();
        for (session, changes) in merged {
            if let Some(w) = &self.writer {
                let durable = w.queue_acked(&session, changes).await;
                answers.push((session, durable));
            }
        }
        let mut failed = HashSet::new();
        for (session, a) in answers {
            if !a.wait().await {
                failed.insert(session);
            }
        }
        if !failed.is_empty() {
            self.metrics.store_errors.fetch_add(1, Relaxed);
        }
        failed
    }

    /// The records as store changes, one unit per session, in order; host
    /// contexts are kept aside (a session row written now carries its
    /// own).
    fn units(&mut self, records: Vec<Record>) -> Vec<(String, Vec<GguiChange>)> {
        let mut units: Vec<(String, Vec<GguiChange>)> = Vec::new();
        for r in records {
            let Some(c) = to_change(r) else { continue };
            if let GguiChange::HostContext {
                session_id,
                host_context,
            } = c
            {
                if self.host_contexts.is_empty() {
                    self.held_for = 0;
                }
                self.host_contexts.insert(session_id, host_context);
                continue;
            }
            if matches!(c, GguiChange::PutSession { .. }) {
                self.host_contexts.remove(c.session_id());
            }
            match units.last_mut() {
                Some((s, changes)) if s == c.session_id() => changes.push(c),
                _ => units.push((c.session_id().to_owned(), vec![c])),
            }
        }
        units
    }

    /// Removes what the store keeps of an expired session (its host
    /// context kept aside is dropped: it would outlive the row).
    async fn remove_session(&mut self, session_id: &str) {
        self.host_contexts.remove(session_id);
        if let Some(w) = &self.writer {
            let change = GguiChange::RemoveSession {
                session_id: session_id.to_owned(),
            };
            w.write_behind(session_id, vec![change]).await;
        }
    }

    /// Writes the host contexts kept aside when the actor is idle, or once
    /// they waited [`HOST_CONTEXT_COALESCE_COMMANDS`] commands.
    async fn after_command(&mut self, idle: bool) {
        if self.host_contexts.is_empty() {
            return;
        }
        self.held_for += 1;
        if !idle && self.held_for < HOST_CONTEXT_COALESCE_COMMANDS {
            return;
        }
        for (session_id, host_context) in std::mem::take(&mut self.host_contexts) {
            if let Some(w) = &self.writer {
                let change = GguiChange::HostContext {
                    session_id: session_id.clone(),
                    host_context,
                };
                w.write_behind(&session_id, vec![change]).await;
            }
        }
    }
}

/// Where the actor sends actions to validate: a bounded number run at once
/// on blocking threads, and each comes back on `done`. At most one per
/// session is under way, so `done` holds at most one per session.
struct Validations {
    permits: Arc<Semaphore>,
    done: mpsc::UnboundedSender<ValidatedAction>,
}

impl Validations {
    fn start(&self, job: ValidationJob) {
        let permits = Arc::clone(&self.permits);
        let done = self.done.clone();
        tokio::spawn(async move {
            // The semaphore is never closed.
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            // `run` catches a panic of the validator itself.
            if let Ok(v) = tokio::task::spawn_blocking(move || job.run()).await {
                let _ = done.send(v);
            }
        });
    }
}

async fn run_actor(
    mut core: Core,
    mut rx: mpsc::Receiver<Cmd>,
    (validations, mut validated): (Validations, mpsc::UnboundedReceiver<ValidatedAction>),
    idle_ttl_ms: u64,
    clock: Arc<dyn Clock>,
    writer: Option<StoreWriter<GguiChange>>,
    metrics: Arc<GguiMetrics>,
) {
    let mut persistence = Persistence {
        writer,
        metrics: Arc::clone(&metrics),
        host_contexts: HashMap::new(),
        held_for: 0,
    };
    let mut sweep = tokio::time::interval(std::time::Duration::from_millis(EXPIRY_SWEEP_MS));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A command taken from the queue while a batch was open, which does
    // not join it: handled once the batch is stored.
    let mut next: Option<Cmd> = None;
    loop {
        let cmd = match next.take() {
            Some(cmd) => Some(cmd),
            None => tokio::select! {
                cmd = rx.recv() => cmd,
                Some(v) = validated.recv() => Some(Cmd::Validated(Box::new(v))),
                _ = sweep.tick() => Some(Cmd::ExpireIdle(oneshot::channel().0)),
            },
        };
        let Some(cmd) = cmd else { break };
        core.now_ms = clock.now_ms();
        let now = core.now_ms;
        match cmd {
            Cmd::Frame { .. } | Cmd::Validated(_) => {
                // Frames and validated actions queued one after another
                // are handled as one batch, stored with one commit: what
                // the batch acknowledges waits for it (group commit).
                let mut batch = Batch::default();
                let mut cmd = cmd;
                loop {
                    core.now_ms = clock.now_ms();
                    let now = core.now_ms;
                    match cmd {
                        Cmd::Frame { conn, text } => {
                            metrics.frames_in.fetch_add(1, Relaxed);
                            batch.bytes += text.len();
                            core.channel.frame_received(conn, text.as_bytes(), now);
                        }
                        Cmd::Validated(v) => core.channel.action_validated(*v, now),
                        _ => unreachable!("only frames and validated actions join a batch"),
                    }
                    batch.commands += 1;
                    batch.collect(&mut core, &metrics, &validations);
                    // Nothing waits for a commit yet: the outputs went
                    // out, the batch need not grow.
                    if !batch.waits() || batch.is_full() {
                        break;
                    }
                    let more = match rx.try_recv() {
                        Ok(cmd) => Some(cmd),
                        Err(_) => validated
                            .try_recv()
                            .ok()
                            .map(|v| Cmd::Validated(Box::new(v))),
                    };
                    match more {
                        Some(c @ (Cmd::Frame { .. } | Cmd::Validated(_))) => cmd = c,
                        other => {
                            next = other;
                            break;
                        }
                    }
                }
                batch.store(&mut core, &metrics, &mut persistence).await;
            }
            other => {
                match other {
                    Cmd::ExpireIdle(answer) => {
                        let expired = core.expire_idle(idle_ttl_ms);
                        for id in &expired {
                            persistence.remove_session(id).await;
                            tracing::info!(session = %id, "idle ggui session expired");
                        }
                        let _ = answer.send(expired.len());
                    }
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
                    Cmd::Closed { conn } => {
                        core.channel.connection_closed(conn);
                        core.conns.remove(&conn);
                    }
                    Cmd::Call(f) => {
                        f(&mut core);
                        let waiting: usize = core.waiters.values().map(Vec::len).sum();
                        metrics.long_polls.store(waiting as u64, Relaxed);
                    }
                    Cmd::Frame { .. } | Cmd::Validated(_) => {
                        unreachable!("handled as a batch above")
                    }
                }
                let stored = dispatch(&mut core, &metrics, &mut persistence, &validations).await;
                if let Some(answer) = core.stored_answer.take() {
                    let _ = answer.send(stored);
                }
            }
        }
        metrics
            .sessions
            .store(core.channel.session_count() as u64, Relaxed);
        persistence
            .after_command(rx.is_empty() && next.is_none())
            .await;
    }
}

/// The most commands one batch takes before it is stored.
pub const MAX_BATCH_COMMANDS: usize = 256;
/// The most bytes of frames one batch takes before it is stored (a batch
/// may pass it by one frame).
pub const MAX_BATCH_FRAME_BYTES: usize = 1024 * 1024;

/// What a batch of frames and validated actions produced after its first
/// change that waits for a commit, held until the commit.
enum Held {
    /// A frame for a connection, and the session the connection was
    /// subscribed to when the frame was made.
    Send {
        conn: ConnId,
        frame: Arc<str>,
        session: Option<String>,
    },
    Close {
        conn: ConnId,
        code: u16,
    },
    Durable {
        conn: ConnId,
        frame: Arc<str>,
        otherwise: Arc<str>,
        undo: Undo,
    },
    Commit {
        undo: Undo,
    },
    Wake {
        session_id: String,
    },
}

/// Frames and validated actions handled one after another and stored
/// with one commit: what waits for the commit is held, the rest went out.
#[derive(Default)]
struct Batch {
    records: Vec<Record>,
    held: Vec<Held>,
    commands: usize,
    bytes: usize,
}

impl Batch {
    /// Whether something of the batch waits for its commit.
    fn waits(&self) -> bool {
        !self.held.is_empty()
    }

    fn is_full(&self) -> bool {
        self.commands >= MAX_BATCH_COMMANDS || self.bytes >= MAX_BATCH_FRAME_BYTES
    }

    /// Takes the core's outputs: records are kept for the commit; once a
    /// change waits for it, everything after it is held, in order.
    fn collect(&mut self, core: &mut Core, metrics: &GguiMetrics, validations: &Validations) {
        while let Some(o) = core.channel.poll_output() {
            let waits = self.waits();
            match o {
                Output::Persist(r) => self.records.push(*r),
                Output::Validate(job) => validations.start(*job),
                Output::Durable {
                    conn,
                    frame,
                    otherwise,
                    undo,
                } => self.held.push(Held::Durable {
                    conn,
                    frame,
                    otherwise,
                    undo,
                }),
                Output::Commit { undo } => self.held.push(Held::Commit { undo }),
                Output::Send { conn, frame } if !waits => send(core, metrics, conn, frame),
                Output::Send { conn, frame } => {
                    let session = core.channel.subscription(conn).map(str::to_owned);
                    self.held.push(Held::Send {
                        conn,
                        frame,
                        session,
                    });
                }
                Output::Close { conn, code, .. } if !waits => close(core, conn, code),
                Output::Close { conn, code, .. } => self.held.push(Held::Close { conn, code }),
                Output::ActionsAvailable { session_id } if !waits => wake(core, &session_id),
                Output::ActionsAvailable { session_id } => {
                    self.held.push(Held::Wake { session_id })
                }
            }
        }
    }

    /// Stores the batch's records (one unit per session) and lets out what
    /// was held. A session whose unit failed has its changes taken back,
    /// latest first; its actions are answered with the protocol's error,
    /// and a connection that was sent anything else about that session in
    /// the batch (a replay that may show what was taken back) is closed
    /// with 1011, to subscribe again.
    async fn store(self, core: &mut Core, metrics: &GguiMetrics, persistence: &mut Persistence) {
        if !self.waits() {
            persistence.write_behind(self.records).await;
            return;
        }
        let failed = persistence.write_units(self.records).await;
        if !failed.is_empty() {
            for h in self.held.iter().rev() {
                if let Held::Durable { undo, .. } | Held::Commit { undo } = h {
                    if failed.contains(undo.session_id()) {
                        core.channel.not_stored(undo.clone());
                    }
                }
            }
        }
        let mut closing: Vec<ConnId> = Vec::new();
        for h in &self.held {
            if let Held::Send {
                conn,
                session: Some(s),
                ..
            } = h
            {
                if failed.contains(s) && !closing.contains(conn) {
                    closing.push(*conn);
                }
            }
        }
        for h in self.held {
            match h {
                Held::Durable {
                    conn,
                    frame,
                    otherwise,
                    undo,
                } => {
                    if failed.contains(undo.session_id()) {
                        send(core, metrics, conn, otherwise);
                    } else {
                        send(core, metrics, conn, frame);
                    }
                }
                Held::Commit { .. } => {}
                Held::Send { conn, .. } if closing.contains(&conn) => {}
                Held::Send { conn, frame, .. } => send(core, metrics, conn, frame),
                Held::Close { conn, code } => close(core, conn, code),
                Held::Wake { session_id } if failed.contains(&session_id) => {}
                Held::Wake { session_id } => wake(core, &session_id),
            }
        }
        for conn in closing {
            if let Some(out) = core.conns.get(&conn) {
                out.close(
                    CLOSE_STORE_FAILED,
                    "the session's changes could not be stored; subscribe again",
                );
            }
        }
    }
}

/// Close code for a connection that was told of changes the store then
/// refused (1011, the server's own error): it subscribes again and is
/// replayed what was stored.
pub const CLOSE_STORE_FAILED: u16 = 1011;

fn close(core: &Core, conn: ConnId, code: u16) {
    if let Some(out) = core.conns.get(&conn) {
        out.close(code, ws::close_reason(code));
    }
}

fn wake(core: &mut Core, session_id: &str) {
    for w in core.waiters.remove(session_id).unwrap_or_default() {
        let _ = w.send(());
    }
}

/// Carries out what the core asked for, in its order. Records are written
/// behind, except those before a `Durable` output: the actor waits for
/// them before it acknowledges (and goes on with the next command).
/// Returns `false` if a change had to be taken back.
async fn dispatch(
    core: &mut Core,
    metrics: &GguiMetrics,
    persistence: &mut Persistence,
    validations: &Validations,
) -> bool {
    let mut records = Vec::new();
    // The session whose change was just taken back: its wake-up goes too.
    let mut taken_back: Option<String> = None;
    // A props update that was not stored: what told of it is dropped.
    let mut dropping = false;
    let mut stored = true;
    while let Some(o) = core.channel.poll_output() {
        match o {
            Output::Send { .. } | Output::ActionsAvailable { .. } if dropping => {}
            Output::Send { conn, frame } => send(core, metrics, conn, frame),
            Output::Close { conn, code, .. } => close(core, conn, code),
            Output::Persist(r) => records.push(*r),
            Output::Validate(job) => validations.start(*job),
            Output::Durable {
                conn,
                frame,
                otherwise,
                undo,
            } => {
                if persistence
                    .write_durable(std::mem::take(&mut records))
                    .await
                {
                    send(core, metrics, conn, frame);
                } else {
                    stored = false;
                    taken_back = Some(undo.session_id().to_owned());
                    core.channel.not_stored(undo);
                    send(core, metrics, conn, otherwise);
                }
            }
            Output::Commit { undo } => {
                if !persistence
                    .write_durable(std::mem::take(&mut records))
                    .await
                {
                    stored = false;
                    dropping = true;
                    core.channel.not_stored(undo);
                }
            }
            Output::ActionsAvailable { session_id } => {
                if taken_back.as_ref() == Some(&session_id) {
                    taken_back = None;
                    continue;
                }
                wake(core, &session_id);
            }
        }
    }
    if !records.is_empty() {
        persistence.write_behind(records).await;
    }
    stored
}

fn send(core: &Core, metrics: &GguiMetrics, conn: ConnId, frame: Arc<str>) {
    if let Some(out) = core.conns.get(&conn) {
        metrics.frames_out.fetch_add(1, Relaxed);
        if out.frame(to_text(frame)) == ws::Pushed::TooSlow {
            metrics.slow_consumers_closed.fetch_add(1, Relaxed);
        }
    }
}
