//! One task per match: it owns the [`Match`], handles commands in the
//! order they arrive, ticks the game on its timer and releases observer
//! frames when they are due, then performs the host's outputs (frames to
//! connections, closes, records to the writer). A finished match ends its
//! task `finished_ttl_ms` after it finished: its connections are closed
//! (1000), its tokens forgotten and its records deleted. A match nobody
//! joins (no connection, no MCP session) ends the same way
//! `unjoined_ttl_ms` after it was created or restored.

use super::ws::ConnOut;
use super::PlayerThree;
use axum::extract::ws::Utf8Bytes;
use hostwire_playerthree::demo::Ridge;
use hostwire_playerthree::host::{CloseReason, Output, ProposalStatus, Told};
use hostwire_playerthree::protocol::{Disclosure, ProtocolError, ServerErrorCode};
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{
    ClientMsg, ConnId, ControlMethod, Json, Match, Principal, Record, ServerMsg,
};
use hostwire_store::playerthree::PlayerThreeWrite;
// Logging notifications carry pushed tells. rmcp marks them deprecated
// (SEP-2577, with the session-era resources/subscribe this endpoint also
// speaks); they are what MCP clients of the handshake era receive today.
use rmcp::model::ResourceUpdatedNotificationParam;
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{Peer, RoleServer};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Commands waiting for one match.
pub const MATCH_QUEUE: usize = 4096;
/// Ticks run at once to catch up after the clock jumped; later ones are
/// skipped.
pub const MAX_CATCH_UP_TICKS: u64 = 64;

/// Close codes of `/playerthree/ws` (the protocol crate's).
pub use hostwire_playerthree::protocol::{
    CLOSE_GOING_AWAY, CLOSE_MATCH_OVER, CLOSE_RATE_LIMITED, CLOSE_REVOKED,
};

/// An MCP agent's seat, as its session is bound to it.
#[derive(Debug, Clone)]
pub struct SeatBinding {
    pub match_id: String,
    pub role: String,
    pub team: String,
    pub methods: Vec<ControlMethod>,
}

pub enum MatchCmd {
    Join {
        conn: ConnId,
        token: String,
        out: ConnOut,
        reply: oneshot::Sender<Result<(), ProtocolError>>,
    },
    Text {
        conn: ConnId,
        text: Utf8Bytes,
    },
    Leave {
        conn: ConnId,
    },
    Mint {
        principal: Principal,
        reply: oneshot::Sender<Result<String, ProtocolError>>,
    },
    Revoke {
        token: String,
        reply: oneshot::Sender<bool>,
    },
    /// The operator sets (or, with `None`, clears) a seat's card.
    SetCard {
        role: String,
        card: Option<hostwire_playerthree::protocol::EntrantCard>,
        reply: oneshot::Sender<Result<(), ProtocolError>>,
    },
    McpJoin {
        conn: ConnId,
        token: String,
        /// The session, told when its tool list changes.
        peer: Peer<RoleServer>,
        reply: oneshot::Sender<Result<SeatBinding, ProtocolError>>,
    },
    /// Whether a token is, now, a seat token of this match (MCP checks it
    /// on every request: a revoked seat's session ends at once).
    McpCheck {
        token: String,
        reply: oneshot::Sender<Result<(), ProtocolError>>,
    },
    McpCall {
        conn: ConnId,
        msg: ClientMsg,
        reply: oneshot::Sender<ServerMsg>,
    },
    McpView {
        team: String,
        reply: oneshot::Sender<Option<Json>>,
    },
    McpSubscribe {
        conn: ConnId,
        team: String,
        peer: Option<Peer<RoleServer>>,
    },
    McpInbox {
        role: String,
        reply: oneshot::Sender<Vec<Told>>,
    },
    McpPeekInbox {
        role: String,
        reply: oneshot::Sender<Vec<Told>>,
    },
    /// A push of tells to this session is done.
    McpPushed {
        conn: ConnId,
    },
    /// Push the seat's tells to this session as they arrive (`None`: stop).
    McpSubscribeInbox {
        conn: ConnId,
        role: String,
        peer: Option<Peer<RoleServer>>,
    },
    McpProposal {
        id: String,
        reply: oneshot::Sender<Option<ProposalStatus>>,
    },
    /// Whether the seat is played by an agent (and so offered `disclose`).
    McpIsAgent {
        role: String,
        reply: oneshot::Sender<bool>,
    },
    McpDisclose {
        conn: ConnId,
        disclosure: Disclosure,
        reply: oneshot::Sender<Result<Json, ProtocolError>>,
    },
    /// Runs the due work now (after a manual clock moved).
    Wake(oneshot::Sender<()>),
    /// Closes every connection with 1001.
    Shutdown(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct MatchHandle {
    pub id: Arc<str>,
    /// The operator token's hash (the text is never kept).
    pub operator_token: TokenHash,
    pub tx: mpsc::Sender<MatchCmd>,
    /// What its connections may send, in bytes ([`super::pace`]).
    pub inbound: Arc<super::pace::InboundPace>,
}

struct Subscriber {
    team: String,
    peer: Peer<RoleServer>,
}

/// The one host connection of a seat token's MCP sessions: the seat is
/// `live` while it lasts, from the token's first session to
/// [`MCP_LIVE_GRACE_MS`](super::mcp::MCP_LIVE_GRACE_MS) after its last
/// one ended, so an agent that opens a session per request does not flip
/// `live` (and push `seats` to every watcher) on each.
/// A session whose seat's tells are pushed to it.
struct InboxSubscriber {
    role: String,
    peer: Peer<RoleServer>,
    /// A push to it is in flight: later tells wait in the seat's bounded
    /// inbox until it is done, so a stream nobody reads holds one task.
    pushing: bool,
}

struct McpPresence {
    conn: ConnId,
    sessions: usize,
    /// When its last session ended (`None` while it has one).
    idle_since: Option<u64>,
}

struct Actor {
    p3: Arc<PlayerThree>,
    /// The match's own queue, for a finished push to say so (weak: the
    /// match ends when its handles are gone).
    me: mpsc::WeakSender<MatchCmd>,
    m: Match<Ridge>,
    conns: HashMap<ConnId, ConnOut>,
    subscribers: HashMap<ConnId, Subscriber>,
    /// Sessions whose seat's tells are pushed, by connection: (role, peer).
    inbox_subscribers: HashMap<ConnId, InboxSubscriber>,
    /// Every MCP session, by connection: (role, peer), told when its
    /// seat's controller changes (`disclose` comes or goes).
    sessions: HashMap<ConnId, (String, Peer<RoleServer>)>,
    /// Each seat token's MCP presence, by the token's hash.
    mcp_presence: HashMap<TokenHash, McpPresence>,
    /// The token of each MCP session, by the session's connection.
    mcp_token: HashMap<ConnId, TokenHash>,
    /// The view each team's subscribers were last told about.
    notified: HashMap<String, Json>,
    next_tick: u64,
    /// When this task started (the match was created or restored).
    started_at: u64,
    /// Whether a connection or MCP session has joined since.
    joined: bool,
}

pub fn spawn(p3: Arc<PlayerThree>, m: Match<Ridge>, operator_token: TokenHash) -> MatchHandle {
    let (tx, rx) = mpsc::channel(MATCH_QUEUE);
    let handle = MatchHandle {
        id: Arc::from(m.id()),
        operator_token,
        tx,
        inbound: Arc::new(super::pace::InboundPace::new()),
    };
    let now = p3.clock.now_ms();
    let actor = Actor {
        me: handle.tx.downgrade(),
        next_tick: now + p3.config.tick_ms,
        p3,
        m,
        conns: HashMap::new(),
        subscribers: HashMap::new(),
        inbox_subscribers: HashMap::new(),
        sessions: HashMap::new(),
        mcp_presence: HashMap::new(),
        mcp_token: HashMap::new(),
        notified: HashMap::new(),
        started_at: now,
        joined: false,
    };
    // A root span: the match outlives the request that created it.
    let span = tracing::info_span!(parent: None, "match", id = %handle.id);
    tokio::spawn(tracing::Instrument::instrument(actor.run(rx), span));
    handle
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::Receiver<MatchCmd>) {
        // Records of the restore itself (none for a new match: its
        // creator wrote them).
        self.perform().await;
        loop {
            let now = self.p3.clock.now_ms();
            self.due(now);
            self.perform().await;
            if self.expired(now) {
                self.expire().await;
                break;
            }
            let wake_at = self
                .m
                .next_timeout()
                .map_or(self.next_tick, |t| t.min(self.next_tick))
                .min(self.expires_at().unwrap_or(u64::MAX))
                .min(self.presence_ends_at().unwrap_or(u64::MAX));
            // The clock may be a manual one in tests: `Wake` commands move
            // the match then, and this sleep only bounds the wait.
            let sleep = Duration::from_millis(wake_at.saturating_sub(now).max(1));
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    None => break,
                    Some(MatchCmd::Shutdown(done)) => {
                        for out in self.conns.values() {
                            out.close(CLOSE_GOING_AWAY, "server shutting down");
                        }
                        self.perform().await;
                        let _ = done.send(());
                        break;
                    }
                    Some(cmd) => {
                        let now = self.p3.clock.now_ms();
                        self.handle(cmd, now).await;
                    }
                },
                () = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// Ticks that are due (catching up at most [`MAX_CATCH_UP_TICKS`]),
    /// then observer frames released by `now`.
    fn due(&mut self, now: u64) {
        let tick_ms = self.p3.config.tick_ms.max(1);
        let mut n = 0;
        while now >= self.next_tick && n < MAX_CATCH_UP_TICKS {
            self.m.tick(self.next_tick);
            self.next_tick += tick_ms;
            n += 1;
        }
        if now >= self.next_tick {
            self.next_tick = now + tick_ms;
        }
        if self.m.next_timeout().is_some_and(|t| t <= now) {
            self.m.poll_observers(now);
        }
        if n > 0 {
            self.notify_subscribers();
        }
        self.end_idle_presences(now);
    }

    /// When the first idle MCP presence ends.
    fn presence_ends_at(&self) -> Option<u64> {
        self.mcp_presence
            .values()
            .filter_map(|p| p.idle_since)
            .min()
            .map(|t| t.saturating_add(super::mcp::MCP_LIVE_GRACE_MS))
    }

    /// Disconnects the MCP presences idle for the grace: their seats are
    /// no longer live.
    fn end_idle_presences(&mut self, now: u64) {
        let grace = super::mcp::MCP_LIVE_GRACE_MS;
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
    fn host_conn(&self, session: ConnId) -> ConnId {
        self.mcp_token
            .get(&session)
            .and_then(|h| self.mcp_presence.get(h))
            .map_or(session, |p| p.conn)
    }

    /// Forgets an MCP session's subscriptions.
    fn forget_session(&mut self, conn: ConnId) {
        self.subscribers.remove(&conn);
        self.inbox_subscribers.remove(&conn);
        self.sessions.remove(&conn);
    }

    async fn handle(&mut self, cmd: MatchCmd, now: u64) {
        match cmd {
            MatchCmd::Join {
                conn,
                token,
                out,
                reply,
            } => {
                let r = self.m.connect(conn, &token, now);
                if r.is_ok() {
                    // The join's answer: a `result` with seq 0 and the
                    // token's principal, before anything else.
                    if let Ok(p) = self.m.principal(&token) {
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
            MatchCmd::Text { conn, text } => {
                self.p3.metrics.messages_in.fetch_add(1, Relaxed);
                self.m.handle_message(conn, text.as_str(), now);
            }
            MatchCmd::Leave { conn } => {
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
            MatchCmd::Mint { principal, reply } => {
                let r = self.m.mint(principal);
                let outputs = self.m.take_outputs();
                let writes = self.route(outputs);
                let acked = self.p3.writer.queue_acked(self.m.id(), writes).await;
                match r {
                    Ok(token) => {
                        let token = token.as_str().to_owned();
                        // Handed out only once durable, without holding
                        // the match up meanwhile.
                        tokio::spawn(tracing::Instrument::in_current_span(async move {
                            let r = match acked.wait().await {
                                true => Ok(token),
                                _ => Err(ProtocolError::new(
                                    ServerErrorCode::Internal,
                                    "store: the token was not stored",
                                )),
                            };
                            let _ = reply.send(r);
                        }));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            MatchCmd::Revoke { token, reply } => {
                let _ = reply.send(self.m.revoke(&token));
            }
            MatchCmd::SetCard { role, card, reply } => {
                let r = self.m.set_card(&role, card);
                let outputs = self.m.take_outputs();
                let writes = self.route(outputs);
                let acked = self.p3.writer.queue_acked(self.m.id(), writes).await;
                match r {
                    // Answered only once durable, without holding the
                    // match up meanwhile.
                    Ok(()) => {
                        tokio::spawn(tracing::Instrument::in_current_span(async move {
                            let r = match acked.wait().await {
                                true => Ok(()),
                                _ => Err(ProtocolError::new(
                                    ServerErrorCode::Internal,
                                    "store: the card was not stored",
                                )),
                            };
                            let _ = reply.send(r);
                        }));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
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
                let r = match self.m.principal(&token) {
                    Ok(Principal::Seat { .. }) => Ok(()),
                    Ok(_) => Err(ProtocolError::new(
                        ServerErrorCode::Forbidden,
                        "token: MCP takes a seat token",
                    )),
                    Err(e) => Err(e),
                };
                let _ = reply.send(r);
            }
            MatchCmd::McpCall { conn, msg, reply } => {
                let r = self.m.handle_client(self.host_conn(conn), msg, now);
                let _ = reply.send(r);
            }
            MatchCmd::McpView { team, reply } => {
                let _ = reply.send(self.m.team_view(&team).cloned());
            }
            MatchCmd::McpSubscribe { conn, team, peer } => match peer {
                Some(peer) => {
                    if let Some(v) = self.m.team_view(&team) {
                        self.notified.insert(team.clone(), v.clone());
                    }
                    self.subscribers.insert(conn, Subscriber { team, peer });
                }
                None => {
                    self.subscribers.remove(&conn);
                }
            },
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
            MatchCmd::McpSubscribeInbox { conn, role, peer } => match peer {
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
            },
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

    fn mcp_join(
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

    /// When the match is removed: `finished_ttl_ms` after it finished,
    /// or `unjoined_ttl_ms` after it started here while nobody joined.
    fn expires_at(&self) -> Option<u64> {
        let finished = self
            .m
            .finished_at()
            .map(|t| t.saturating_add(self.p3.config.finished_ttl_ms));
        let unjoined = (!self.joined).then(|| {
            self.started_at
                .saturating_add(self.p3.config.unjoined_ttl_ms)
        });
        match (finished, unjoined) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn expired(&self, now: u64) -> bool {
        self.expires_at().is_some_and(|t| now >= t)
    }

    /// Removes the expired match: connections closed, tokens forgotten,
    /// its rows deleted (written behind: a restart before they are gone
    /// restores it finished, and it expires again).
    async fn expire(&mut self) {
        for (_, out) in self.conns.drain() {
            out.close(CLOSE_MATCH_OVER, "match over");
        }
        self.subscribers.clear();
        self.sessions.clear();
        self.mcp_presence.clear();
        self.mcp_token.clear();
        self.p3.forget_match(self.m.id());
        self.p3.metrics.matches_expired.fetch_add(1, Relaxed);
        self.p3
            .writer
            .write_behind(
                self.m.id(),
                vec![PlayerThreeWrite::RemoveMatch {
                    id: self.m.id().to_owned(),
                }],
            )
            .await;
        tracing::info!(joined = self.joined, "match expired");
    }

    /// Pushes the tells waiting for `role` to its subscribed sessions, as
    /// logging notifications, and takes them from the inbox. Without a
    /// subscriber they wait for `inbox`; while a push to one of them is in
    /// flight they wait in the inbox (at most `MAX_INBOX_PER_SEAT`, later
    /// tells are refused) and go together when it is done: one push task
    /// per session, however many tells come.
    #[allow(deprecated)] // logging notifications: see the `use` above
    fn push_tells(&mut self, role: &str) {
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
        let data: Arc<[Value]> = told.iter().map(super::mcp::told_json).collect();
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
                        .with_logger(super::mcp::TELL_LOGGER);
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

    /// Tells MCP subscribers whose team view changed.
    fn notify_subscribers(&mut self) {
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
            let uri = super::mcp::view_uri(self.m.id(), &team);
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

    /// Performs the host's outputs in order. At a `Durable` reply (a
    /// minted token, a policy change) the records before it are written
    /// and committed first, and the frames before it wait for that: the
    /// match waits for that one transaction. If it fails, those frames
    /// are dropped, the change is taken back and the asker gets
    /// `internal`.
    async fn perform(&mut self) {
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
    fn route(&mut self, outputs: Vec<Output>) -> Vec<PlayerThreeWrite> {
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
                        match reason {
                            CloseReason::Revoked => out.close(CLOSE_REVOKED, "token revoked"),
                            CloseReason::RateLimited => {
                                out.close(CLOSE_RATE_LIMITED, "rate limited")
                            }
                        }
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
                    writes.push(super::writer::write_of(self.m.id(), &r));
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
