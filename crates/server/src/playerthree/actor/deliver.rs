//! The server side of one match ([`Conns`]): its sockets' outbound queues
//! and its MCP sessions' peers. It carries out the match's outputs in
//! order: frames (one text shared by all its readers), closes with the
//! protocol's codes, notifications and tells pushed to MCP sessions (never
//! holding the match up), answers to the requests waiting.

use super::commands::Tag;
use super::{MatchCmd, Unit3, CLOSE_GOING_AWAY, CLOSE_MATCH_OVER};
use crate::playerthree::ws::ConnOut;
use crate::playerthree::{mcp, PlayerThree};
use crate::unit::Deliver;
use crate::ws::Utf8Bytes;
use hostwire_playerthree::durable::{Answer, Done, MatchOutput};
use hostwire_playerthree::host::{Output, Told};
use hostwire_playerthree::ConnId;
// Logging notifications carry pushed tells. rmcp marks them deprecated
// (SEP-2577, with the session-era resources/subscribe this endpoint also
// speaks); they are what MCP clients of the handshake era receive today.
use rmcp::model::ResourceUpdatedNotificationParam;
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{Peer, RoleServer};
use serde_json::Value;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc;

pub(super) struct Conns<'a> {
    p3: &'a Arc<PlayerThree>,
    /// The match's own queue, for a finished push to say so (weak: the
    /// match ends when its handles are gone).
    me: mpsc::WeakSender<MatchCmd>,
    conns: HashMap<ConnId, ConnOut>,
    /// Sessions told when their team's view changes.
    view_peers: HashMap<ConnId, Peer<RoleServer>>,
    /// Sessions their seat's tells are pushed to.
    inbox_peers: HashMap<ConnId, Peer<RoleServer>>,
    /// Every MCP session: its seat's role and its peer, told when the
    /// seat's controller changes (`disclose` comes or goes).
    sessions: HashMap<ConnId, (String, Peer<RoleServer>)>,
}

impl<'a> Conns<'a> {
    pub(super) fn new(p3: &'a Arc<PlayerThree>, me: mpsc::WeakSender<MatchCmd>) -> Self {
        Conns {
            p3,
            me,
            conns: HashMap::new(),
            view_peers: HashMap::new(),
            inbox_peers: HashMap::new(),
            sessions: HashMap::new(),
        }
    }

    /// Forgets a socket or session: nothing more goes to it.
    fn forget(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
        self.view_peers.remove(&conn);
        self.inbox_peers.remove(&conn);
        self.sessions.remove(&conn);
    }

    /// Closes every socket with `code`.
    pub(super) fn close_all(&mut self, code: u16, reason: &'static str) {
        for (_, out) in self.conns.drain() {
            out.close(code, reason);
        }
        self.view_peers.clear();
        self.inbox_peers.clear();
        self.sessions.clear();
    }

    /// What an answer sets up before its command's outputs: a joined
    /// socket's first frame and queue, a session's subscription. What is
    /// left to answer comes back.
    fn set_up(&mut self, answer: &Answer, tag: Option<Tag>) -> Option<Tag> {
        match (answer, tag) {
            (Answer::Joined(conn, r), Some(Tag::Join(out, reply))) => {
                if let Ok(first) = r {
                    out.frame(shared_frame(first), &self.p3.metrics);
                    self.conns.insert(*conn, out);
                }
                Some(Tag::Joined(reply))
            }
            (Answer::Subscribed(conn, _), Some(Tag::ViewPeer(peer))) => {
                match peer {
                    Some(peer) => self.view_peers.insert(*conn, peer),
                    None => self.view_peers.remove(conn),
                };
                None
            }
            (Answer::InboxSubscribed(conn, _), Some(Tag::InboxPeer(peer))) => {
                match peer {
                    Some(peer) => self.inbox_peers.insert(*conn, peer),
                    None => self.inbox_peers.remove(conn),
                };
                None
            }
            (_, tag) => tag,
        }
    }

    /// Carries out the outputs; true once the match expired.
    fn carry_out(&mut self, id: &str, outputs: Vec<MatchOutput>) -> bool {
        let metrics = &self.p3.metrics;
        let mut expired = false;
        // The same text for many readers is converted once.
        let mut last: Option<(Arc<str>, Utf8Bytes)> = None;
        for o in outputs {
            match o {
                MatchOutput::Host(Output::Send { conn, text }) => {
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
                    metrics.frames_out.fetch_add(1, Relaxed);
                    // Too slow (closing now) or closed: its reader sends
                    // Leave.
                    out.frame(frame, metrics);
                }
                MatchOutput::Host(Output::Close { conn, reason }) => {
                    if let Some(out) = self.conns.get(&conn) {
                        let (code, text) = reason.close();
                        out.close(code, text);
                    }
                    self.forget(conn);
                }
                MatchOutput::Host(Output::GuardViolation(v)) => {
                    metrics.guard_violations.fetch_add(1, Relaxed);
                    tracing::warn!(violation = %v, "guard withheld game data");
                }
                // Records are written, tells pushed: never here.
                MatchOutput::Host(_) => {}
                // Every token minted (by the operator or by an owner's
                // `mint`) is found by its text from now on.
                MatchOutput::Minted(hash) => self.p3.note_token(hash, id),
                MatchOutput::ControllerChanged(role) => self.tools_changed(&role),
                MatchOutput::ViewChanged { team, conns } => self.view_changed(id, &team, &conns),
                MatchOutput::PushTells { conns, tells } => self.push_tells(&conns, &tells),
                MatchOutput::SessionEnded(conn) => self.forget(conn),
                MatchOutput::Expired { joined } => {
                    self.close_all(CLOSE_MATCH_OVER, "match over");
                    self.p3.forget_match(id);
                    metrics.matches_expired.fetch_add(1, Relaxed);
                    tracing::info!(joined, "match expired");
                    expired = true;
                }
            }
        }
        expired
    }

    /// Answers the request waiting; `Break` once the match shut down.
    fn answer(&mut self, answer: Answer, tag: Option<Tag>) -> ControlFlow<()> {
        match (answer, tag) {
            (Answer::Left(conn), _) => self.forget(conn),
            (Answer::Joined(_, r), Some(Tag::Joined(reply))) => {
                let _ = reply.send(r.map(|_| ()));
            }
            (Answer::Minted(r), Some(Tag::Mint(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::Revoked(r), Some(Tag::Revoke(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::Card(r), Some(Tag::Card(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::McpJoined(conn, r), Some(Tag::McpJoin(peer, reply))) => {
                if let Ok(seat) = &r {
                    self.sessions.insert(conn, (seat.role.clone(), peer));
                }
                let _ = reply.send(r);
            }
            (Answer::Checked(r), Some(Tag::Check(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::Called(r), Some(Tag::Call(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::View(r), Some(Tag::View(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::Tells(r), Some(Tag::Tells(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::Proposal(r), Some(Tag::Proposal(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::IsAgent(r), Some(Tag::IsAgent(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::Disclosed(r), Some(Tag::Disclose(reply))) => {
                let _ = reply.send(r);
            }
            (Answer::Woken, Some(Tag::Wake(done))) => {
                let _ = done.send(());
            }
            (Answer::Shutdown, Some(Tag::Shutdown(done))) => {
                self.close_all(CLOSE_GOING_AWAY, "server shutting down");
                let _ = done.send(());
                return ControlFlow::Break(());
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    /// Tells the MCP sessions of `role` that their tool list changed (its
    /// controller did: `disclose` is offered to agent-played seats only).
    fn tools_changed(&self, role: &str) {
        for (r, peer) in self.sessions.values() {
            if r != role {
                continue;
            }
            let peer = peer.clone();
            // A notification never holds the match up.
            tokio::spawn(tracing::Instrument::in_current_span(async move {
                if let Err(e) = peer.notify_tool_list_changed().await {
                    tracing::debug!(error = %e, "tools/list_changed not sent");
                }
            }));
        }
    }

    /// Tells the sessions subscribed to `team`'s view that it changed.
    fn view_changed(&self, id: &str, team: &str, conns: &[ConnId]) {
        let uri = mcp::view_uri(id, team);
        for peer in conns.iter().filter_map(|c| self.view_peers.get(c)) {
            let peer = peer.clone();
            let uri = uri.clone();
            // A notification never holds the match up.
            tokio::spawn(tracing::Instrument::in_current_span(async move {
                let _ = peer
                    .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                    .await;
            }));
        }
    }

    /// Pushes tells to sessions, as logging notifications: one task per
    /// session, which tells the match when it is done.
    #[allow(deprecated)] // logging notifications: see the `use` above
    fn push_tells(&self, conns: &[ConnId], tells: &[Told]) {
        let data: Arc<[Value]> = tells.iter().map(mcp::told_json).collect();
        for &conn in conns {
            let peer = self.inbox_peers.get(&conn).cloned();
            let data = Arc::clone(&data);
            let me = self.me.clone();
            let metrics = Arc::clone(&self.p3.metrics);
            metrics.mcp_tell_pushes.fetch_add(1, Relaxed);
            // A push never holds the match up.
            tokio::spawn(tracing::Instrument::in_current_span(async move {
                // Without a peer (its session is gone) nothing is pushed,
                // but the match still hears the push is done.
                for d in data.iter() {
                    let Some(peer) = &peer else { break };
                    let param = LoggingMessageNotificationParam::new(LoggingLevel::Info, d.clone())
                        .with_logger(mcp::TELL_LOGGER);
                    if let Err(e) = peer.notify_logging_message(param).await {
                        tracing::warn!(error = %e, "tell not pushed");
                        break;
                    }
                }
                metrics.mcp_tell_pushes.fetch_sub(1, Relaxed);
                if let Some(tx) = me.upgrade() {
                    let _ = tx.send(MatchCmd::McpPushed { conn }).await;
                }
            }));
        }
    }
}

impl Deliver<Unit3> for Conns<'_> {
    fn deliver(&mut self, unit: &Unit3, done: Done<Tag>) -> ControlFlow<()> {
        let Done {
            tag,
            outputs,
            answer,
        } = done;
        let tag = self.set_up(&answer, tag);
        let expired = self.carry_out(unit.id(), outputs);
        let flow = self.answer(answer, tag);
        if expired {
            return ControlFlow::Break(());
        }
        flow
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
