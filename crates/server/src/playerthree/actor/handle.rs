//! The commands of a match's task, handled in the order they arrive.

use super::{Actor, InboxSubscriber, MatchCmd, Subscriber};
use crate::playerthree::ws::ConnOut;
use axum::extract::ws::Utf8Bytes;
use hostwire_playerthree::protocol::{ProtocolError, ServerErrorCode};
use hostwire_playerthree::{ConnId, Json, Principal, ServerMsg};
use rmcp::service::{Peer, RoleServer};
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::oneshot;

impl Actor {
    pub(super) async fn handle(&mut self, cmd: MatchCmd, now: u64) {
        match cmd {
            MatchCmd::Join {
                conn,
                token,
                out,
                reply,
            } => self.join(conn, &token, out, reply, now).await,
            MatchCmd::Text { conn, text } => {
                self.p3.metrics.messages_in.fetch_add(1, Relaxed);
                self.m.handle_message(conn, text.as_str(), now);
            }
            MatchCmd::Leave { conn } => self.leave(conn, now),
            MatchCmd::Mint { principal, reply } => {
                let r = self.m.mint(principal).map(|t| t.as_str().to_owned());
                // Handed out only once durable.
                self.answer_once_stored(r, reply, "store: the token was not stored")
                    .await;
            }
            MatchCmd::Revoke { token, reply } => {
                let _ = reply.send(self.m.revoke(&token));
            }
            MatchCmd::SetCard { role, card, reply } => {
                let r = self.m.set_card(&role, card);
                self.answer_once_stored(r, reply, "store: the card was not stored")
                    .await;
            }
            MatchCmd::McpJoin {
                conn,
                token,
                peer,
                reply,
            } => {
                let r = self.mcp_join(conn, &token, now);
                if let Ok(seat) = &r {
                    self.sessions.insert(conn, (seat.role.clone(), peer));
                    self.joined = true;
                }
                let _ = reply.send(r);
            }
            MatchCmd::McpCheck { token, reply } => {
                let _ = reply.send(self.mcp_check(&token));
            }
            MatchCmd::McpCall { conn, msg, reply } => {
                let r = self.m.handle_client(self.host_conn(conn), msg, now);
                let _ = reply.send(r);
            }
            MatchCmd::McpView { team, reply } => {
                let _ = reply.send(self.m.team_view(&team).cloned());
            }
            MatchCmd::McpSubscribe { conn, team, peer } => self.subscribe_view(conn, team, peer),
            MatchCmd::McpInbox { role, reply } => {
                let _ = reply.send(self.m.take_inbox(&role));
            }
            MatchCmd::McpPeekInbox { role, reply } => {
                let _ = reply.send(self.m.inbox(&role));
            }
            MatchCmd::McpPushed { conn } => {
                if let Some(s) = self.inbox_subscribers.get_mut(&conn) {
                    s.pushing = false;
                    let role = s.role.clone();
                    // What came meanwhile goes now.
                    self.push_tells(&role);
                }
            }
            MatchCmd::McpSubscribeInbox { conn, role, peer } => {
                self.subscribe_inbox(conn, role, peer)
            }
            MatchCmd::McpProposal { id, reply } => {
                let _ = reply.send(self.m.proposal_status(&id));
            }
            MatchCmd::McpIsAgent { role, reply } => {
                let _ = reply.send(self.m.is_agent_seat(&role));
            }
            MatchCmd::McpDisclose {
                conn,
                disclosure,
                reply,
            } => {
                let _ = reply.send(self.m.disclose(self.host_conn(conn), disclosure));
            }
            MatchCmd::Wake(done) => {
                self.due(now);
                self.perform().await;
                if self.expired(now) {
                    self.expire().await;
                }
                let _ = done.send(());
            }
            MatchCmd::Shutdown(done) => {
                let _ = done.send(());
            }
        }
    }

    /// A socket joins with its token.
    async fn join(
        &mut self,
        conn: ConnId,
        token: &str,
        out: ConnOut,
        reply: oneshot::Sender<Result<(), ProtocolError>>,
        now: u64,
    ) {
        let r = self.m.connect(conn, token, now);
        if r.is_ok() {
            // The join's answer: a `result` with seq 0 and the
            // token's principal, before anything else.
            if let Ok(p) = self.m.principal(token) {
                let data = serde_json::to_value(p).unwrap_or_default();
                let text = ServerMsg::ok(0, Json::from(data)).to_text();
                out.frame(Utf8Bytes::from(text), &self.p3.metrics);
            }
            self.conns.insert(conn, out);
            self.joined = true;
        }
        // The join's own frames (seats, cards, keyframes) first.
        self.perform().await;
        let _ = reply.send(r);
    }

    /// A socket or an MCP session is gone.
    fn leave(&mut self, conn: ConnId, now: u64) {
        self.conns.remove(&conn);
        self.forget_session(conn);
        if let Some(h) = self.mcp_token.remove(&conn) {
            // An MCP session: its token's presence outlasts it.
            if let Some(p) = self.mcp_presence.get_mut(&h) {
                p.sessions = p.sessions.saturating_sub(1);
                if p.sessions == 0 {
                    p.idle_since = Some(now);
                }
            }
        } else {
            self.m.disconnect(conn);
        }
    }

    /// Writes the records of an operator's change and answers once they
    /// are stored, without holding the match up meanwhile; if they are
    /// not, the answer is `internal` with `not_stored`.
    async fn answer_once_stored<T: Send + 'static>(
        &mut self,
        r: Result<T, ProtocolError>,
        reply: oneshot::Sender<Result<T, ProtocolError>>,
        not_stored: &'static str,
    ) {
        let outputs = self.m.take_outputs();
        let writes = self.route(outputs);
        let acked = self.p3.writer.queue_acked(self.m.id(), writes).await;
        match r {
            Ok(v) => {
                tokio::spawn(tracing::Instrument::in_current_span(async move {
                    let r = match acked.wait().await {
                        true => Ok(v),
                        _ => Err(ProtocolError::new(ServerErrorCode::Internal, not_stored)),
                    };
                    let _ = reply.send(r);
                }));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// Whether a token is, now, a seat token of this match.
    fn mcp_check(&self, token: &str) -> Result<(), ProtocolError> {
        match self.m.principal(token) {
            Ok(Principal::Seat { .. }) => Ok(()),
            Ok(_) => Err(ProtocolError::new(
                ServerErrorCode::Forbidden,
                "token: MCP takes a seat token",
            )),
            Err(e) => Err(e),
        }
    }

    /// An MCP session subscribes to its team's view (`None`: unsubscribes).
    fn subscribe_view(&mut self, conn: ConnId, team: String, peer: Option<Peer<RoleServer>>) {
        match peer {
            Some(peer) => {
                if let Some(v) = self.m.team_view(&team) {
                    self.notified.insert(team.clone(), v.clone());
                }
                self.subscribers.insert(conn, Subscriber { team, peer });
            }
            None => {
                self.subscribers.remove(&conn);
            }
        }
    }

    /// An MCP session has its seat's tells pushed (`None`: no longer).
    fn subscribe_inbox(&mut self, conn: ConnId, role: String, peer: Option<Peer<RoleServer>>) {
        match peer {
            Some(peer) => {
                // A push in flight stays the session's one.
                let pushing = self.inbox_subscribers.get(&conn).is_some_and(|s| s.pushing);
                self.inbox_subscribers.insert(
                    conn,
                    InboxSubscriber {
                        role: role.clone(),
                        peer,
                        pushing,
                    },
                );
                // What waited before the subscription goes now.
                self.push_tells(&role);
            }
            None => {
                self.inbox_subscribers.remove(&conn);
            }
        }
    }
}
