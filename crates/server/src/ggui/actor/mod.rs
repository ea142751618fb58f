//! The channel's task, driven by THE unit driver ([`crate::unit::drive`]):
//! it owns every ggui session ([`Core`]) and handles connections' frames
//! and API calls in order. The durability rules (what waits for the
//! store, group commit, going back when the store refuses, idle sessions
//! on the unit's timer) are the protocol crate's [`DurableChannel`]; here
//! its outputs are carried out: frames onto connections' outbound queues,
//! closes, long polls woken, validations started, API calls answered.
mod validations;

pub(super) use validations::Validations;

use crate::ggui::records::to_change;
use crate::ggui::{session_span, to_text, ws, Cmd, Core, GguiMetrics};
use crate::store_writer::StoreWriter;
use crate::unit::{self, Deliver, Store, Unit, Write};
use hostwire_core::Clock;
use hostwire_ggui::channel::{close_reason, CLOSE_STORE_FAILED};
use hostwire_ggui::durable::{Step, STORE_FAILED_REASON};
use hostwire_ggui::{ConnId, Output, ValidationJob};
use hostwire_store::ggui::GguiChange;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// What the channel's task carries out.
pub(crate) enum Out {
    Send {
        conn: ConnId,
        frame: Arc<str>,
    },
    Close {
        conn: ConnId,
        code: u16,
    },
    /// The long polls waiting on a session that has actions now.
    Wake(Vec<oneshot::Sender<()>>),
    Validate(Box<ValidationJob>),
    /// Whether an API call's change was stored.
    Stored(oneshot::Sender<bool>, bool),
}

impl Core {
    /// Whether `cmd` waits for the writes under way: everything but a
    /// frame or a validated action (those join the batch) sees only what
    /// is stored, as its answer goes out at once.
    fn defers(&self, cmd: &Cmd) -> bool {
        self.deferred.is_some()
            || (self.unit.holds() && !matches!(cmd, Cmd::Frame { .. } | Cmd::Validated(_)))
    }

    fn record_sessions(&self) {
        let count = self.unit.channel.session_count() as u64;
        self.metrics.sessions.store(count, Relaxed);
    }

    /// Only calls and expiries change the long polls: counted then, not
    /// on every frame.
    fn record_long_polls(&self) {
        let waiting: usize = self.waiters.values().map(Vec::len).sum();
        self.metrics.long_polls.store(waiting as u64, Relaxed);
    }

    /// Removes the sessions idle for the idle time; their rows go with the
    /// next write.
    fn expire(&mut self, now: u64, by_timer: bool) -> usize {
        let waiters = &self.waiters;
        let in_use = |id: &str| {
            waiters
                .get(id)
                .is_some_and(|l| l.iter().any(|w| !w.is_closed()))
        };
        let expired = match by_timer {
            true => self.unit.handle_timeout(now, in_use),
            false => self.unit.expire_idle(now, in_use),
        };
        for id in &expired {
            self.waiters.remove(id);
            session_span(id).in_scope(|| tracing::info!("idle ggui session expired"));
        }
        crate::ggui::leased::release_expired(&self.leases, &expired);
        expired.len()
    }
}

impl Unit for Core {
    type Command = Cmd;
    type Output = Out;
    type Record = GguiChange;

    fn handle(&mut self, cmd: Cmd, now: u64) {
        if self.defers(&cmd) {
            self.deferred = Some(cmd);
            return;
        }
        self.now_ms = now;
        match cmd {
            Cmd::Frame { conn, text } => {
                self.metrics.frames_in.fetch_add(1, Relaxed);
                self.unit.frame_received(conn, text.as_bytes(), now);
            }
            Cmd::Validated(v) => self.unit.action_validated(*v, now),
            Cmd::Open {
                conn,
                out,
                authenticated,
                bound,
            } => {
                self.unit.apply(|ch| {
                    ch.connection_opened(conn, now, authenticated);
                    if let Some((session, app)) = bound {
                        ch.bind_connection(conn, session, app);
                    }
                });
                self.conns.insert(conn, out);
            }
            Cmd::Closed { conn } => {
                self.unit.apply(|ch| ch.connection_closed(conn));
                self.conns.remove(&conn);
            }
            Cmd::Call(f) => {
                self.unit.begin(0);
                f(self);
                self.unit.collect();
                if let Some(answer) = self.stored_answer.take() {
                    self.unit.answer(answer);
                }
                self.record_long_polls();
            }
            Cmd::ExpireIdle(answer) => {
                let _ = answer.send(self.expire(now, false));
                self.record_long_polls();
            }
        }
        self.record_sessions();
    }

    fn poll_output(&mut self) -> Option<Out> {
        Some(match self.unit.poll_output()? {
            Step::Out(Output::Send { conn, frame }) => Out::Send { conn, frame },
            Step::Out(Output::Close { conn, code, .. }) => Out::Close { conn, code },
            Step::Out(Output::ActionsAvailable { session_id }) => {
                Out::Wake(self.waiters.remove(&session_id).unwrap_or_default())
            }
            Step::Out(Output::Validate(job)) => Out::Validate(job),
            // Records come out as writes, durable answers as frames:
            // nothing else is left.
            Step::Out(_) => return self.poll_output(),
            Step::Answer { tag, stored } => Out::Stored(tag, stored),
        })
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.unit.poll_timeout()
    }

    fn handle_timeout(&mut self, now: u64) {
        self.now_ms = now;
        self.expire(now, true);
        self.record_sessions();
        self.record_long_polls();
    }

    fn poll_write(&mut self) -> Option<Write<GguiChange>> {
        let w = self.unit.poll_write()?;
        Some(Write {
            id: w.id,
            records: w.records.into_iter().filter_map(to_change).collect(),
        })
    }

    fn ack(&mut self, id: u64, durable: bool, now: u64) {
        if self.unit.ack(id, durable) {
            self.metrics.store_errors.fetch_add(1, Relaxed);
        }
        // The command that waited for the batch's writes comes next.
        if !self.unit.holds() {
            if let Some(cmd) = self.deferred.take() {
                self.handle(cmd, now);
            }
        }
    }

    fn accepts(&self) -> bool {
        self.deferred.is_none() && self.unit.accepts()
    }

    fn takes_queued(&self) -> bool {
        self.deferred.is_none() && self.unit.takes_queued()
    }

    fn write_key<'w>(&self, w: &'w Write<GguiChange>) -> Option<&'w str> {
        // One task serves every session: each is a unit of the writer.
        w.records.first().map(GguiChange::session_id)
    }
}

/// The server side of the channel: where its outputs go.
struct Carry {
    metrics: Arc<GguiMetrics>,
    validations: Validations,
}

impl Deliver<Core> for Carry {
    fn deliver(&mut self, core: &Core, out: Out) -> ControlFlow<()> {
        match out {
            Out::Send { conn, frame } => {
                if let Some(o) = core.conns.get(&conn) {
                    self.metrics.frames_out.fetch_add(1, Relaxed);
                    if o.frame(to_text(frame)) == ws::Pushed::TooSlow {
                        self.metrics.slow_consumers_closed.fetch_add(1, Relaxed);
                    }
                }
            }
            Out::Close { conn, code } => {
                if let Some(o) = core.conns.get(&conn) {
                    let reason = match code {
                        CLOSE_STORE_FAILED => STORE_FAILED_REASON,
                        code => close_reason(code),
                    };
                    o.close(code, reason);
                }
            }
            Out::Wake(waiters) => {
                for w in waiters {
                    let _ = w.send(());
                }
            }
            Out::Validate(job) => self.validations.start(*job),
            Out::Stored(answer, stored) => {
                let _ = answer.send(stored);
            }
        }
        ControlFlow::Continue(())
    }
}

/// The channel's task: handles commands until every sender is gone.
pub(super) async fn run_actor(
    mut core: Core,
    mut rx: mpsc::Receiver<Cmd>,
    validations: Validations,
    clock: Arc<dyn Clock>,
    writer: StoreWriter<GguiChange>,
) {
    let mut carry = Carry {
        metrics: Arc::clone(&core.metrics),
        validations,
    };
    let store = Store {
        writer: &writer,
        // Each write names its session (`write_key`).
        key: "ggui",
        clock: &*clock,
    };
    unit::drive(&mut core, &mut carry, &mut rx, store).await;
}
