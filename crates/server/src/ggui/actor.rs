//! The channel actor: the one task that owns the [`Channel`], handles
//! connections' frames and API calls in order, and stores what they
//! change (in batches, see [`Batch`]).

use super::records::to_change;
use super::{to_text, ws, Cmd, Core, GguiMetrics, EXPIRY_SWEEP_MS, HOST_CONTEXT_COALESCE_COMMANDS};
use crate::store_writer::StoreWriter;
use hostwire_core::Clock;
use hostwire_ggui::channel::Undo;
use hostwire_ggui::{ConnId, Output, Record};
use hostwire_ggui::{ValidatedAction, ValidationJob};
use hostwire_store::ggui::GguiChange;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Semaphore};

/// What the actor writes: through the store writer (none without a
/// store), with host contexts coalesced per session.
pub(super) struct Persistence {
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
pub(super) struct Validations {
    permits: Arc<Semaphore>,
    done: mpsc::UnboundedSender<ValidatedAction>,
}

impl Validations {
    /// At most `workers` validations at once; what they give back comes
    /// on the receiver (bounded by the sessions: each has at most one
    /// validation under way).
    pub(super) fn new(workers: usize) -> (Validations, mpsc::UnboundedReceiver<ValidatedAction>) {
        let (done, validated) = mpsc::unbounded_channel();
        let v = Validations {
            permits: Arc::new(Semaphore::new(workers.max(1))),
            done,
        };
        (v, validated)
    }

    fn start(&self, job: ValidationJob) {
        let permits = Arc::clone(&self.permits);
        let done = self.done.clone();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            // The semaphore is never closed.
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            // `run` catches a panic of the validator itself.
            if let Ok(v) = tokio::task::spawn_blocking(move || job.run()).await {
                let _ = done.send(v);
            }
        }));
    }
}

pub(super) async fn run_actor(
    core: Core,
    rx: mpsc::Receiver<Cmd>,
    (validations, validated): (Validations, mpsc::UnboundedReceiver<ValidatedAction>),
    idle_ttl_ms: u64,
    clock: Arc<dyn Clock>,
    writer: Option<StoreWriter<GguiChange>>,
    metrics: Arc<GguiMetrics>,
) {
    let persistence = Persistence {
        writer,
        metrics: Arc::clone(&metrics),
        host_contexts: HashMap::new(),
        held_for: 0,
    };
    let mut actor = Actor {
        core,
        rx,
        validated,
        validations,
        idle_ttl_ms,
        clock,
        metrics,
        persistence,
    };
    actor.run().await;
}

/// The actor's state and what it reads from.
struct Actor {
    core: Core,
    rx: mpsc::Receiver<Cmd>,
    validated: mpsc::UnboundedReceiver<ValidatedAction>,
    validations: Validations,
    idle_ttl_ms: u64,
    clock: Arc<dyn Clock>,
    metrics: Arc<GguiMetrics>,
    persistence: Persistence,
}

impl Actor {
    async fn run(&mut self) {
        let mut sweep = tokio::time::interval(std::time::Duration::from_millis(EXPIRY_SWEEP_MS));
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A command taken from the queue while a batch was open, which
        // does not join it: handled once the batch is stored.
        let mut next: Option<Cmd> = None;
        loop {
            let cmd = match next.take() {
                Some(cmd) => Some(cmd),
                None => tokio::select! {
                    cmd = self.rx.recv() => cmd,
                    Some(v) = self.validated.recv() => Some(Cmd::Validated(Box::new(v))),
                    _ = sweep.tick() => Some(Cmd::ExpireIdle(oneshot::channel().0)),
                },
            };
            let Some(cmd) = cmd else { break };
            match cmd {
                Cmd::Frame { .. } | Cmd::Validated(_) => next = self.batch(cmd).await,
                other => self.command(other).await,
            }
            self.metrics
                .sessions
                .store(self.core.channel.session_count() as u64, Relaxed);
            let idle = self.rx.is_empty() && next.is_none();
            self.persistence.after_command(idle).await;
        }
    }

    /// Handles `first` and the frames and validated actions queued after
    /// it as one batch, stored with one commit: what the batch
    /// acknowledges waits for it (group commit). Returns the command that
    /// ended the batch without joining it.
    async fn batch(&mut self, first: Cmd) -> Option<Cmd> {
        let mut batch = Batch::default();
        let mut cmd = first;
        let mut next = None;
        loop {
            let now = self.clock.now_ms();
            self.core.now_ms = now;
            match cmd {
                Cmd::Frame { conn, text } => {
                    self.metrics.frames_in.fetch_add(1, Relaxed);
                    batch.bytes += text.len();
                    self.core.channel.frame_received(conn, text.as_bytes(), now);
                }
                Cmd::Validated(v) => self.core.channel.action_validated(*v, now),
                other => {
                    // Only frames and validated actions are passed in.
                    next = Some(other);
                    break;
                }
            }
            batch.commands += 1;
            batch.collect(&mut self.core, &self.metrics, &self.validations);
            // Nothing waits for a commit yet: the outputs went out, the
            // batch need not grow.
            if !batch.waits() || batch.is_full() {
                break;
            }
            let more = match self.rx.try_recv() {
                Ok(cmd) => Some(cmd),
                Err(_) => self
                    .validated
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
        batch
            .store(&mut self.core, &self.metrics, &mut self.persistence)
            .await;
        next
    }

    /// A command that is not a frame: handled, and what it changed stored
    /// before the next one.
    async fn command(&mut self, cmd: Cmd) {
        let core = &mut self.core;
        core.now_ms = self.clock.now_ms();
        let now = core.now_ms;
        match cmd {
            Cmd::ExpireIdle(answer) => {
                let expired = core.expire_idle(self.idle_ttl_ms);
                for id in &expired {
                    self.persistence.remove_session(id).await;
                    super::session_span(id)
                        .in_scope(|| tracing::info!("idle ggui session expired"));
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
                f(core);
                let waiting: usize = core.waiters.values().map(Vec::len).sum();
                self.metrics.long_polls.store(waiting as u64, Relaxed);
            }
            Cmd::Frame { conn, text } => {
                self.metrics.frames_in.fetch_add(1, Relaxed);
                core.channel.frame_received(conn, text.as_bytes(), now);
            }
            Cmd::Validated(v) => core.channel.action_validated(*v, now),
        }
        let stored = dispatch(
            core,
            &self.metrics,
            &mut self.persistence,
            &self.validations,
        )
        .await;
        if let Some(answer) = core.stored_answer.take() {
            let _ = answer.send(stored);
        }
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
