//! The channel actor: the one task that owns the [`Channel`], handles
//! connections' frames and API calls in order, and stores what they
//! change (in batches, see [`Batch`]).
mod batch;
mod dispatch;
mod persistence;
mod validations;

pub use batch::{MAX_BATCH_COMMANDS, MAX_BATCH_FRAME_BYTES};
pub(super) use validations::Validations;

use batch::Batch;
use dispatch::dispatch;
use persistence::Persistence;

use crate::ggui::{Cmd, Core, GguiMetrics, EXPIRY_SWEEP_MS};
use crate::store_writer::StoreWriter;
use hostwire_core::Clock;
use hostwire_ggui::ValidatedAction;
use hostwire_store::ggui::GguiChange;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

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
