//! A match's MCP sessions: a seat token's presence (one host connection
//! however many sessions it opens), the sessions' view and inbox
//! subscriptions, and which tells and view changes go to them.

use super::{Answer, Done, DurableMatch, MatchCommand, MatchOutput, SeatBinding};
use crate::game::{ControlMethod, Game};
use crate::host::Match;
use crate::protocol::{Principal, ProtocolError, ServerErrorCode};
use crate::tokens::TokenHash;
use crate::{ConnId, Json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The one host connection of a seat token's MCP sessions: the seat is
/// `live` while it lasts, from the token's first session to the grace
/// after its last one ended.
struct Presence {
    conn: ConnId,
    sessions: usize,
    /// When its last session ended (`None` while it has one).
    idle_since: Option<u64>,
}

/// A session whose seat's tells are pushed to it.
struct InboxSubscription {
    role: String,
    /// A push to it is in flight: later tells wait in the seat's bounded
    /// inbox until it is done, so a session nobody reads holds one push.
    pushing: bool,
}

#[derive(Default)]
pub(super) struct Sessions {
    /// Each seat token's presence, by the token's hash.
    presence: HashMap<TokenHash, Presence>,
    /// The token of each session.
    token_of: BTreeMap<ConnId, TokenHash>,
    /// Sessions told when their team's view changes: the team.
    views: BTreeMap<ConnId, String>,
    /// The view each team's sessions were last told about.
    notified: BTreeMap<String, Json>,
    inboxes: BTreeMap<ConnId, InboxSubscription>,
}

impl Sessions {
    /// When the first idle presence ends.
    pub(super) fn presence_ends_at(&self, grace: u64) -> Option<u64> {
        self.presence
            .values()
            .filter_map(|p| p.idle_since)
            .min()
            .map(|t| t.saturating_add(grace))
    }

    /// Ends the presences idle for the grace: their host connections,
    /// which the match disconnects (their seats are no longer live).
    pub(super) fn end_idle(&mut self, now: u64, grace: u64) -> Vec<ConnId> {
        let mut ended = Vec::new();
        self.presence.retain(|_, p| {
            let idle = p.idle_since.is_some_and(|t| now >= t.saturating_add(grace));
            if idle {
                ended.push(p.conn);
            }
            !idle
        });
        ended.sort_unstable();
        ended
    }

    /// The host connection a session acts through (its token's presence);
    /// a session whose presence was closed gets its own id, which the
    /// match no longer knows.
    pub(super) fn host_conn(&self, session: ConnId) -> ConnId {
        self.token_of
            .get(&session)
            .and_then(|h| self.presence.get(h))
            .map_or(session, |p| p.conn)
    }

    /// A session is gone; whether it was one (else a socket).
    pub(super) fn leave(&mut self, conn: ConnId, now: u64) -> bool {
        let Some(h) = self.token_of.remove(&conn) else {
            return false;
        };
        // Its token's presence outlasts it.
        if let Some(p) = self.presence.get_mut(&h) {
            p.sessions = p.sessions.saturating_sub(1);
            if p.sessions == 0 {
                p.idle_since = Some(now);
            }
        }
        true
    }

    /// Forgets a session's subscriptions.
    pub(super) fn forget(&mut self, conn: ConnId) {
        self.views.remove(&conn);
        self.inboxes.remove(&conn);
    }

    /// `conn` was closed: if it was a presence (revoked, rate limited),
    /// its sessions act through it no more.
    pub(super) fn closed(&mut self, conn: ConnId, out: &mut Vec<MatchOutput>) {
        self.forget(conn);
        let closed: Vec<TokenHash> = self
            .presence
            .iter()
            .filter(|(_, p)| p.conn == conn)
            .map(|(h, _)| *h)
            .collect();
        for h in closed {
            self.presence.remove(&h);
            let ended: Vec<ConnId> = self
                .token_of
                .iter()
                .filter(|(_, t)| **t == h)
                .map(|(c, _)| *c)
                .collect();
            for c in ended {
                self.token_of.remove(&c);
                self.forget(c);
                out.push(MatchOutput::SessionEnded(c));
            }
        }
    }

    /// Hands the tells waiting for `role` to its subscribed sessions and
    /// takes them from the inbox. Without a subscriber they wait for
    /// `inbox`; while a push to one of them is in flight they wait in the
    /// inbox (at most `MAX_INBOX_PER_SEAT`, later tells are refused) and
    /// go together when it is done.
    pub(super) fn push_tells<G: Game>(
        &mut self,
        m: &mut Match<G>,
        role: &str,
        out: &mut Vec<MatchOutput>,
    ) {
        let conns: Vec<ConnId> = self
            .inboxes
            .iter()
            .filter(|(_, s)| s.role == role)
            .map(|(c, _)| *c)
            .collect();
        if conns.is_empty() || conns.iter().any(|c| self.inboxes[c].pushing) {
            return;
        }
        let tells = m.take_inbox(role);
        if tells.is_empty() {
            return;
        }
        for c in &conns {
            if let Some(s) = self.inboxes.get_mut(c) {
                s.pushing = true;
            }
        }
        out.push(MatchOutput::PushTells {
            conns,
            tells: Arc::from(tells),
        });
    }

    /// The teams whose view changed since their sessions were last told.
    pub(super) fn views_changed<G: Game>(&mut self, m: &Match<G>, out: &mut Vec<MatchOutput>) {
        if self.views.is_empty() {
            return;
        }
        for team in m.teams() {
            let Some(v) = m.team_view(team) else {
                continue;
            };
            if self.notified.get(team) == Some(v) {
                continue;
            }
            self.notified.insert(team.clone(), v.clone());
            let conns: Vec<ConnId> = self
                .views
                .iter()
                .filter(|(_, t)| *t == team)
                .map(|(c, _)| *c)
                .collect();
            if !conns.is_empty() {
                out.push(MatchOutput::ViewChanged {
                    team: team.clone(),
                    conns,
                });
            }
        }
    }
}

impl<G: Game, T> DurableMatch<G, T> {
    /// An MCP session's command.
    pub(super) fn mcp<S>(&mut self, cmd: MatchCommand<S>, done: &mut Done<T>, now: u64) -> Answer {
        use MatchCommand as C;
        let m = &mut self.m;
        match cmd {
            C::McpJoin { conn, token } => {
                let r = self.mcp_join(conn, &token, now);
                self.joined |= r.is_ok();
                Answer::McpJoined(conn, r)
            }
            C::McpCheck { token } => Answer::Checked(match m.principal(&token) {
                Ok(Principal::Seat { .. }) => Ok(()),
                Ok(_) => Err(seat_token_only()),
                Err(e) => Err(e),
            }),
            C::McpCall { conn, msg } => {
                Answer::Called(m.handle_client(self.sessions.host_conn(conn), msg, now))
            }
            C::McpView { team } => Answer::View(m.team_view(&team).cloned()),
            C::McpSubscribe { conn, team, on } => {
                if on {
                    if let Some(v) = m.team_view(&team) {
                        self.sessions.notified.insert(team.clone(), v.clone());
                    }
                    self.sessions.views.insert(conn, team);
                } else {
                    self.sessions.views.remove(&conn);
                }
                Answer::Subscribed(conn, on)
            }
            C::McpInbox { role } => Answer::Tells(m.take_inbox(&role)),
            C::McpPeekInbox { role } => Answer::Tells(m.inbox(&role)),
            C::McpPushed { conn } => {
                if let Some(s) = self.sessions.inboxes.get_mut(&conn) {
                    s.pushing = false;
                    let role = s.role.clone();
                    // What came meanwhile goes now.
                    self.sessions.push_tells(m, &role, &mut done.outputs);
                }
                Answer::None
            }
            C::McpSubscribeInbox { conn, role, on } => {
                if on {
                    // A push in flight stays the session's one.
                    let pushing = self.sessions.inboxes.get(&conn).is_some_and(|s| s.pushing);
                    let sub = InboxSubscription {
                        role: role.clone(),
                        pushing,
                    };
                    self.sessions.inboxes.insert(conn, sub);
                    // What waited before the subscription goes now.
                    self.sessions.push_tells(m, &role, &mut done.outputs);
                } else {
                    self.sessions.inboxes.remove(&conn);
                }
                Answer::InboxSubscribed(conn, on)
            }
            C::McpProposal { id } => Answer::Proposal(m.proposal_status(&id)),
            C::McpIsAgent { role } => Answer::IsAgent(m.is_agent_seat(&role)),
            C::McpDisclose { conn, disclosure } => {
                Answer::Disclosed(m.disclose(self.sessions.host_conn(conn), disclosure))
            }
            // The match's own commands are handled before.
            _ => Answer::None,
        }
    }

    /// A session joins with a seat token: through its token's presence,
    /// which its first session opens (and names).
    fn mcp_join(
        &mut self,
        conn: ConnId,
        token: &str,
        now: u64,
    ) -> Result<SeatBinding, ProtocolError> {
        let Principal::Seat { role, team, .. } = self.m.principal(token)?.clone() else {
            return Err(seat_token_only());
        };
        let hash = TokenHash::of(token);
        match self.sessions.presence.get_mut(&hash) {
            Some(p) => {
                p.sessions += 1;
                p.idle_since = None;
            }
            None => {
                // Session ids are unique for the server's life: the first
                // session's names the presence for good.
                self.m.connect(conn, token, now)?;
                let p = Presence {
                    conn,
                    sessions: 1,
                    idle_since: None,
                };
                self.sessions.presence.insert(hash, p);
            }
        }
        self.sessions.token_of.insert(conn, hash);
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
}

fn seat_token_only() -> ProtocolError {
    ProtocolError::new(ServerErrorCode::Forbidden, "token: MCP takes a seat token")
}
