//! One task per match: it owns the [`Match`], handles commands in the
//! order they arrive, ticks the game on its timer and releases observer
//! frames when they are due, then performs the host's outputs (frames to
//! connections, closes, records to the writer). A finished match ends its
//! task `finished_ttl_ms` after it finished: its connections are closed
//! (1000), its tokens forgotten and its records deleted. A match nobody
//! joins (no connection, no MCP session) ends the same way
//! `unjoined_ttl_ms` after it was created or restored.

mod commands;
mod handle;
mod mcp;
mod outputs;

pub use commands::{MatchCmd, MatchHandle, SeatBinding};
pub use outputs::shared_frame;

use super::ws::ConnOut;
use super::PlayerThree;
use hostwire_playerthree::demo::Ridge;
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{ConnId, Json, Match};
use hostwire_store::playerthree::PlayerThreeWrite;
use rmcp::service::{Peer, RoleServer};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Commands waiting for one match.
pub const MATCH_QUEUE: usize = 4096;
/// Ticks run at once to catch up after the clock jumped; later ones are
/// skipped.
pub const MAX_CATCH_UP_TICKS: u64 = 64;

/// Close codes of `/playerthree/ws` (the protocol crate's).
pub use hostwire_playerthree::protocol::{
    CLOSE_GOING_AWAY, CLOSE_MATCH_OVER, CLOSE_RATE_LIMITED, CLOSE_REVOKED,
};

struct Subscriber {
    team: String,
    peer: Peer<RoleServer>,
}

/// A session whose seat's tells are pushed to it.
struct InboxSubscriber {
    role: String,
    peer: Peer<RoleServer>,
    /// A push to it is in flight: later tells wait in the seat's bounded
    /// inbox until it is done, so a stream nobody reads holds one task.
    pushing: bool,
}

/// The one host connection of a seat token's MCP sessions: the seat is
/// `live` while it lasts, from the token's first session to
/// [`MCP_LIVE_GRACE_MS`](super::mcp::MCP_LIVE_GRACE_MS) after its last
/// one ended, so an agent that opens a session per request does not flip
/// `live` (and push `seats` to every watcher) on each.
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
    pub(super) fn due(&mut self, now: u64) {
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

    pub(super) fn expired(&self, now: u64) -> bool {
        self.expires_at().is_some_and(|t| now >= t)
    }

    /// Removes the expired match: connections closed, tokens forgotten,
    /// its rows deleted (written behind: a restart before they are gone
    /// restores it finished, and it expires again).
    pub(super) async fn expire(&mut self) {
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
}
