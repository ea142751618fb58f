//! The host's outputs performed: frames to connections (one text shared
//! by all its readers), closes with the protocol's codes, records to the
//! writer, a durable reply held until its records are committed.

use super::Actor;
use axum::extract::ws::Utf8Bytes;
use hostwire_playerthree::host::Output;
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{ConnId, Record};
use hostwire_store::playerthree::PlayerThreeWrite;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Actor {
    /// Performs the host's outputs in order. At a `Durable` reply (a
    /// minted token, a policy change) the records before it are written
    /// and committed first, and the frames before it wait for that: the
    /// match waits for that one transaction. If it fails, those frames
    /// are dropped, the change is taken back and the asker gets
    /// `internal`.
    pub(super) async fn perform(&mut self) {
        let mut rest = self.m.take_outputs();
        while !rest.is_empty() {
            let Some(at) = rest
                .iter()
                .position(|o| matches!(o, Output::Durable { .. }))
            else {
                let writes = self.route(rest);
                self.p3.writer.write_behind(self.m.id(), writes).await;
                return;
            };
            let tail = rest.split_off(at + 1);
            let durable = rest.pop();
            let (records, held): (Vec<Output>, Vec<Output>) = rest
                .into_iter()
                .partition(|o| matches!(o, Output::Persist(_)));
            let writes = self.route(records);
            let stored = self.p3.writer.write_durable(self.m.id(), writes).await;
            if let Some(Output::Durable {
                conn,
                text,
                otherwise,
                undo,
            }) = durable
            {
                let reply = if stored {
                    self.route(held);
                    text
                } else {
                    // Closes still happen; what told of the change does not.
                    let closes = held
                        .into_iter()
                        .filter(|o| matches!(o, Output::Close { .. }))
                        .collect();
                    self.route(closes);
                    self.m.not_stored(undo);
                    otherwise
                };
                if let Some(out) = self.conns.get(&conn) {
                    self.p3.metrics.frames_out.fetch_add(1, Relaxed);
                    out.frame(shared_frame(&reply), &self.p3.metrics);
                }
            }
            rest = tail;
            rest.extend(self.m.take_outputs());
        }
    }

    /// Sends and closes what `outputs` say; returns the records to write.
    pub(super) fn route(&mut self, outputs: Vec<Output>) -> Vec<PlayerThreeWrite> {
        let mut writes = Vec::new();
        let mut told: Vec<String> = Vec::new();
        let mut controlled: Vec<String> = Vec::new();
        // The same text for many readers is converted once.
        let mut last: Option<(Arc<str>, Utf8Bytes)> = None;
        for o in outputs {
            match o {
                Output::Send { conn, text } => {
                    let Some(out) = self.conns.get(&conn) else {
                        continue;
                    };
                    let frame = match &last {
                        Some((t, f)) if Arc::ptr_eq(t, &text) => f.clone(),
                        _ => {
                            let f = shared_frame(&text);
                            last = Some((text, f.clone()));
                            f
                        }
                    };
                    self.p3.metrics.frames_out.fetch_add(1, Relaxed);
                    if !out.frame(frame, &self.p3.metrics) {
                        // Too slow (closing now) or closed: its reader
                        // sends Leave.
                    }
                }
                Output::Close { conn, reason } => {
                    if let Some(out) = self.conns.remove(&conn) {
                        let (code, text) = reason.close();
                        out.close(code, text);
                    }
                    self.forget_session(conn);
                    // An MCP presence closed (revoked, rate limited): its
                    // sessions act through it no more.
                    let closed: Vec<TokenHash> = self
                        .mcp_presence
                        .iter()
                        .filter(|(_, p)| p.conn == conn)
                        .map(|(h, _)| *h)
                        .collect();
                    for h in closed {
                        self.mcp_presence.remove(&h);
                        let ended: Vec<ConnId> = self
                            .mcp_token
                            .iter()
                            .filter(|(_, t)| **t == h)
                            .map(|(c, _)| *c)
                            .collect();
                        for c in ended {
                            self.mcp_token.remove(&c);
                            self.forget_session(c);
                        }
                    }
                }
                Output::Persist(r) => {
                    if let Record::Controller { role, .. } = &r {
                        controlled.push(role.clone());
                    }
                    // Every token minted (by the operator or by an owner's
                    // `mint`) is found by its text from now on.
                    if let Record::Token { token_hash, .. } = &r {
                        self.p3.note_token(*token_hash, self.m.id());
                    }
                    writes.push(crate::playerthree::writer::write_of(self.m.id(), &r));
                }
                Output::Told(t) => told.push(t.role),
                // `perform` splits the outputs at each of these.
                Output::Durable { .. } => {}
                Output::GuardViolation(v) => {
                    self.p3.metrics.guard_violations.fetch_add(1, Relaxed);
                    tracing::warn!(violation = %v, "guard withheld game data");
                }
            }
        }
        told.dedup();
        for role in told {
            self.push_tells(&role);
        }
        for role in controlled {
            self.tools_changed(&role);
        }
        writes
    }
}

/// A frame that shares the host's text instead of copying it.
pub fn shared_frame(text: &Arc<str>) -> Utf8Bytes {
    struct Owner(Arc<str>);
    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            self.0.as_bytes()
        }
    }
    let bytes = bytes::Bytes::from_owner(Owner(Arc::clone(text)));
    // Valid UTF-8 by construction (it was a `str`).
    Utf8Bytes::try_from(bytes).unwrap_or_else(|_| Utf8Bytes::from_static(""))
}
