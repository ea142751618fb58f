//! Frames and validated actions handled one after another and stored
//! with one commit; what waits for the commit is held until it.

use super::dispatch::{close, send, wake};
use super::persistence::Persistence;
use super::validations::Validations;
use crate::ggui::{Core, GguiMetrics};
use hostwire_ggui::channel::{Undo, CLOSE_STORE_FAILED};
use hostwire_ggui::{ConnId, Output, Record};
use std::sync::Arc;

/// The most commands one batch takes before it is stored.
pub const MAX_BATCH_COMMANDS: usize = 256;
/// The most bytes of frames one batch takes before it is stored (a batch
/// may pass it by one frame).
pub const MAX_BATCH_FRAME_BYTES: usize = 1024 * 1024;

/// What a batch of frames and validated actions produced after its first
/// change that waits for a commit, held until the commit.
pub(super) enum Held {
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
pub(super) struct Batch {
    records: Vec<Record>,
    held: Vec<Held>,
    pub(super) commands: usize,
    pub(super) bytes: usize,
}

impl Batch {
    /// Whether something of the batch waits for its commit.
    pub(super) fn waits(&self) -> bool {
        !self.held.is_empty()
    }

    pub(super) fn is_full(&self) -> bool {
        self.commands >= MAX_BATCH_COMMANDS || self.bytes >= MAX_BATCH_FRAME_BYTES
    }

    /// Takes the core's outputs: records are kept for the commit; once a
    /// change waits for it, everything after it is held, in order.
    pub(super) fn collect(
        &mut self,
        core: &mut Core,
        metrics: &GguiMetrics,
        validations: &Validations,
    ) {
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
    pub(super) async fn store(
        self,
        core: &mut Core,
        metrics: &GguiMetrics,
        persistence: &mut Persistence,
    ) {
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
