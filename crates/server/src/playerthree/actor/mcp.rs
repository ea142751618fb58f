//! The match's MCP sessions: a seat token's presence (one host
//! connection however many sessions it opens), the sessions' view and
//! inbox subscriptions, and the notifications pushed to them.

use super::{Actor, MatchCmd, McpPresence, SeatBinding};
use hostwire_playerthree::protocol::{ProtocolError, ServerErrorCode};
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{ConnId, ControlMethod, Principal};
// Logging notifications carry pushed tells. rmcp marks them deprecated
// (SEP-2577, with the session-era resources/subscribe this endpoint also
// speaks); they are what MCP clients of the handshake era receive today.
use rmcp::model::ResourceUpdatedNotificationParam;
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use serde_json::Value;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Actor {
    /// When the first idle MCP presence ends.
    pub(super) fn presence_ends_at(&self) -> Option<u64> {
        self.mcp_presence
            .values()
            .filter_map(|p| p.idle_since)
            .min()
            .map(|t| t.saturating_add(crate::playerthree::mcp::MCP_LIVE_GRACE_MS))
    }

    /// Disconnects the MCP presences idle for the grace: their seats are
    /// no longer live.
    pub(super) fn end_idle_presences(&mut self, now: u64) {
        let grace = crate::playerthree::mcp::MCP_LIVE_GRACE_MS;
        let ended: Vec<TokenHash> = self
            .mcp_presence
            .iter()
            .filter(|(_, p)| p.idle_since.is_some_and(|t| now >= t.saturating_add(grace)))
            .map(|(h, _)| *h)
            .collect();
        for h in ended {
            if let Some(p) = self.mcp_presence.remove(&h) {
                self.m.disconnect(p.conn);
            }
        }
    }

    /// The host connection an MCP session acts through (its token's
    /// presence); a session whose presence was closed gets its own id,
    /// which the host no longer knows.
    pub(super) fn host_conn(&self, session: ConnId) -> ConnId {
        self.mcp_token
            .get(&session)
            .and_then(|h| self.mcp_presence.get(h))
            .map_or(session, |p| p.conn)
    }

    /// Forgets an MCP session's subscriptions.
    pub(super) fn forget_session(&mut self, conn: ConnId) {
        self.subscribers.remove(&conn);
        self.inbox_subscribers.remove(&conn);
        self.sessions.remove(&conn);
    }

    pub(super) fn mcp_join(
        &mut self,
        conn: ConnId,
        token: &str,
        now: u64,
    ) -> Result<SeatBinding, ProtocolError> {
        let principal = self.m.principal(token)?.clone();
        let Principal::Seat { role, team, .. } = principal else {
            return Err(ProtocolError::new(
                ServerErrorCode::Forbidden,
                "token: MCP takes a seat token",
            ));
        };
        let hash = TokenHash::of(token);
        match self.mcp_presence.get_mut(&hash) {
            Some(p) => {
                p.sessions += 1;
                p.idle_since = None;
            }
            None => {
                let host = self.p3.next_conn();
                self.m.connect(host, token, now)?;
                self.mcp_presence.insert(
                    hash,
                    McpPresence {
                        conn: host,
                        sessions: 1,
                        idle_since: None,
                    },
                );
            }
        }
        self.mcp_token.insert(conn, hash);
        Ok(SeatBinding {
            match_id: self.m.id().to_owned(),
            methods: self
                .m
                .control_methods(&role)
                .map(<[ControlMethod]>::to_vec)
                .unwrap_or_default(),
            role,
            team,
        })
    }

    /// Pushes the tells waiting for `role` to its subscribed sessions, as
    /// logging notifications, and takes them from the inbox. Without a
    /// subscriber they wait for `inbox`; while a push to one of them is in
    /// flight they wait in the inbox (at most `MAX_INBOX_PER_SEAT`, later
    /// tells are refused) and go together when it is done: one push task
    /// per session, however many tells come.
    #[allow(deprecated)] // logging notifications: see the `use` above
    pub(super) fn push_tells(&mut self, role: &str) {
        let subs: Vec<ConnId> = self
            .inbox_subscribers
            .iter()
            .filter(|(_, s)| s.role == role)
            .map(|(c, _)| *c)
            .collect();
        if subs.is_empty()
            || subs
                .iter()
                .any(|c| self.inbox_subscribers.get(c).is_some_and(|s| s.pushing))
        {
            return;
        }
        let told = self.m.take_inbox(role);
        if told.is_empty() {
            return;
        }
        let data: Arc<[Value]> = told
            .iter()
            .map(crate::playerthree::mcp::told_json)
            .collect();
        for conn in subs {
            let Some(s) = self.inbox_subscribers.get_mut(&conn) else {
                continue;
            };
            s.pushing = true;
            let peer = s.peer.clone();
            let data = Arc::clone(&data);
            let me = self.me.clone();
            let p3 = Arc::clone(&self.p3);
            p3.metrics.mcp_tell_pushes.fetch_add(1, Relaxed);
            // A push never holds the match up.
            tokio::spawn(tracing::Instrument::in_current_span(async move {
                for d in data.iter() {
                    let param = LoggingMessageNotificationParam::new(LoggingLevel::Info, d.clone())
                        .with_logger(crate::playerthree::mcp::TELL_LOGGER);
                    if let Err(e) = peer.notify_logging_message(param).await {
                        tracing::warn!(error = %e, "tell not pushed");
                        break;
                    }
                }
                p3.metrics.mcp_tell_pushes.fetch_sub(1, Relaxed);
                if let Some(tx) = me.upgrade() {
                    let _ = tx.send(MatchCmd::McpPushed { conn }).await;
                }
            }));
        }
    }

    /// Tells the MCP sessions of `role` that their tool list changed (its
    /// controller did: `disclose` is offered to agent-played seats only).
    pub(super) fn tools_changed(&self, role: &str) {
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

    /// Tells MCP subscribers whose team view changed.
    pub(super) fn notify_subscribers(&mut self) {
        if self.subscribers.is_empty() {
            return;
        }
        let teams: Vec<String> = self.m.teams().to_vec();
        for team in teams {
            let Some(v) = self.m.team_view(&team) else {
                continue;
            };
            if self.notified.get(&team) == Some(v) {
                continue;
            }
            self.notified.insert(team.clone(), v.clone());
            let uri = crate::playerthree::mcp::view_uri(self.m.id(), &team);
            for s in self.subscribers.values().filter(|s| s.team == team) {
                let peer = s.peer.clone();
                let uri = uri.clone();
                // A notification never holds the match up.
                tokio::spawn(tracing::Instrument::in_current_span(async move {
                    let _ = peer
                        .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                        .await;
                }));
            }
        }
    }
}
