//! PlayerThree protocol 1: matches of the example game (Ridge) hosted by
//! the server, around the sans-IO host of `hostwire_playerthree`.
//!
//! - [`api`]: the operator's HTTP API (`/playerthree/matches…`): create a
//!   match, mint and revoke its tokens;
//! - [`ws`]: the WebSocket `/playerthree/ws` where players, owners,
//!   spectators and observers join with a token;
//! - [`mcp`]: the MCP endpoint `/playerthree/mcp` for agents (streamable
//!   HTTP), authenticated by a seat token;
//! - [`actor`]: one task per match, run by the one unit driver
//!   ([`crate::unit`]) over the protocol crate's `DurableMatch` (its
//!   durability rules and timers); here only its outputs are carried out;
//! - [`pace`]: how many bytes a second the socket reads from a match's
//!   tokens;
//! - [`writer`]: the match records written behind the matches.

pub mod actor;
pub mod api;
pub mod mcp;
pub mod pace;
pub mod writer;
pub mod ws;

use crate::cluster::leases::{Leases, Restored, TakeOver, Units, Weakly};
use crate::http::AllowedOrigins;
use crate::metrics::Render;
use actor::{MatchCmd, MatchHandle};
use axum::Router;
use hostwire_core::Clock;
use hostwire_playerthree::demo::Ridge;
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{Match, MatchConfig, Record};
use hostwire_store::lease::UnitKind;
use hostwire_store::playerthree::{PlayerThreeStore, PlayerThreeWrite, StoredMatch};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// The game every match hosted here plays.
pub const GAME: &str = "ridge";
/// The close of a connection whose match this node lost to another node
/// (its lease taken over): the client reconnects, to any node.
pub const CLOSE_MATCH_MOVED: u16 = 1012;
/// Matches one server hosts; creating more is refused (503).
pub const MAX_MATCHES: usize = 1024;
/// Frames waiting for one slow reader before it is closed (1013).
pub const OUTBOUND_QUEUE: usize = 1024;
/// Characters of a match id (random base64url).
pub const MATCH_ID_CHARS: usize = 16;
/// Milliseconds between ticks of a match, unless configured.
pub const DEFAULT_TICK_MS: u64 = 1000;
/// Milliseconds a finished match stays before it is removed with its
/// records, unless configured: long enough to read the report and the
/// last frames, short enough that finished matches do not fill
/// [`MAX_MATCHES`].
pub const DEFAULT_FINISHED_TTL_MS: u64 = 60 * 60 * 1000;
/// Milliseconds a match nobody has joined (since it was created or
/// restored) stays before it is removed with its records, unless
/// configured: hours, so an operator may create matches well ahead, yet
/// abandoned ones do not fill [`MAX_MATCHES`] for good.
pub const DEFAULT_UNJOINED_TTL_MS: u64 = 6 * 60 * 60 * 1000;

#[derive(Debug, Clone)]
pub struct PlayerThreeConfig {
    pub allowed_origins: AllowedOrigins,
    /// Milliseconds between two ticks of a match.
    pub tick_ms: u64,
    /// Frames queued for one connection before it counts as too slow.
    pub outbound_queue: usize,
    /// Milliseconds from a match's finish to its removal (connections
    /// closed 1000, tokens forgotten, records deleted).
    pub finished_ttl_ms: u64,
    /// Milliseconds from a match's creation (or restore) to its removal
    /// while no connection or MCP session has joined it.
    pub unjoined_ttl_ms: u64,
    /// MCP sessions one seat token may hold at once.
    pub mcp_sessions_per_token: usize,
    /// MCP sessions one client IP may hold at once.
    pub mcp_sessions_per_ip: usize,
}

impl PlayerThreeConfig {
    pub fn new(allowed_origins: AllowedOrigins) -> Self {
        Self {
            allowed_origins,
            tick_ms: DEFAULT_TICK_MS,
            outbound_queue: OUTBOUND_QUEUE,
            finished_ttl_ms: DEFAULT_FINISHED_TTL_MS,
            unjoined_ttl_ms: DEFAULT_UNJOINED_TTL_MS,
            mcp_sessions_per_token: mcp::MAX_MCP_SESSIONS_PER_TOKEN,
            mcp_sessions_per_ip: mcp::MAX_MCP_SESSIONS_PER_IP,
        }
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct PlayerThreeMetrics {
    pub matches: AtomicU64,
    pub connections: AtomicU64,
    pub frames_out: AtomicU64,
    pub messages_in: AtomicU64,
    pub slow_consumers_closed: AtomicU64,
    pub oversized: AtomicU64,
    pub guard_violations: AtomicU64,
    pub mcp_sessions: AtomicU64,
    /// Tell pushes in flight: at most one per subscribed MCP session.
    pub mcp_tell_pushes: AtomicU64,
    pub matches_expired: AtomicU64,
}

impl Render for PlayerThreeMetrics {
    fn render(&self, out: &mut String) {
        use std::fmt::Write;
        for (name, help, kind, v) in [
            (
                "hostwire_playerthree_matches",
                "Matches hosted.",
                "gauge",
                &self.matches,
            ),
            (
                "hostwire_playerthree_connections",
                "Open WebSocket connections.",
                "gauge",
                &self.connections,
            ),
            (
                "hostwire_playerthree_frames_out_total",
                "Frames queued for connections.",
                "counter",
                &self.frames_out,
            ),
            (
                "hostwire_playerthree_messages_in_total",
                "Messages received.",
                "counter",
                &self.messages_in,
            ),
            (
                "hostwire_playerthree_slow_consumers_closed_total",
                "Connections closed for a full outbound queue.",
                "counter",
                &self.slow_consumers_closed,
            ),
            (
                "hostwire_playerthree_oversized_total",
                "Messages over twice MAX_MESSAGE_BYTES.",
                "counter",
                &self.oversized,
            ),
            (
                "hostwire_playerthree_guard_violations_total",
                "Outbound game data withheld by the closed-vocabulary guard.",
                "counter",
                &self.guard_violations,
            ),
            (
                "hostwire_playerthree_matches_expired_total",
                "Matches removed after PLAYERTHREE_FINISHED_TTL_MS or PLAYERTHREE_UNJOINED_TTL_MS.",
                "counter",
                &self.matches_expired,
            ),
            (
                "hostwire_playerthree_mcp_sessions",
                "Live MCP agent sessions.",
                "gauge",
                &self.mcp_sessions,
            ),
            (
                "hostwire_playerthree_mcp_tell_pushes",
                "Pushes of tells to MCP sessions in flight (one per subscribed session at most).",
                "gauge",
                &self.mcp_tell_pushes,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                v.load(Relaxed)
            );
        }
    }
}

/// Everything PlayerThree's handlers and match tasks share.
pub struct PlayerThree {
    config: PlayerThreeConfig,
    origins: Arc<AllowedOrigins>,
    clock: Arc<dyn Clock>,
    pub metrics: Arc<PlayerThreeMetrics>,
    writer: writer::Writer,
    matches: Mutex<HashMap<String, MatchHandle>>,
    /// Which match each token belongs to, by the token's hash (a token is
    /// presented without its match). Revoked tokens stay: their match
    /// refuses them.
    tokens: Mutex<HashMap<TokenHash, String>>,
    next_conn: AtomicU64,
    /// The MCP sessions and whose they are (set when the routes are made).
    mcp: std::sync::OnceLock<Arc<mcp::McpGate>>,
    store: Arc<dyn PlayerThreeStore>,
    /// The matches this node owns on a cluster (PostgreSQL); `None`: one
    /// node.
    leases: Option<Arc<Leases>>,
    /// How a client reaches a match another node owns (with NATS).
    tunnels: std::sync::OnceLock<Arc<crate::cluster::tunnel::Tunnels>>,
}

/// What looking a match up on this node found.
pub(crate) type Find = crate::cluster::leases::Find<MatchHandle>;

/// The matches as the leases see them.
impl Units for PlayerThree {
    fn lose_unit(&self, key: &str) {
        self.lose(key);
    }

    async fn restore_unit(self: Arc<Self>, key: &str) -> Restored {
        self.restore_one(key).await
    }
}

impl PlayerThree {
    /// Carries clients of matches owned elsewhere to their owners through
    /// `tunnels`, and serves the clients other nodes carry here.
    pub fn use_tunnels(self: &Arc<Self>, tunnels: Arc<crate::cluster::tunnel::Tunnels>) {
        tunnels.accept(ws::TUNNEL_PROTOCOL, ws::acceptor(self));
        let _ = self.tunnels.set(tunnels);
    }
}

/// The routes: `/playerthree/ws`, `/playerthree/mcp` and the HTTP API.
pub fn router(p3: Arc<PlayerThree>) -> Router {
    Router::new()
        .nest("/playerthree", api::router(Arc::clone(&p3)))
        .merge(ws::router(Arc::clone(&p3)))
        .merge(mcp::router(p3))
}

impl PlayerThree {
    /// Starts PlayerThree with the matches the store holds: each resumes
    /// from its last recorded tick, its tokens as they were.
    pub fn start(
        config: PlayerThreeConfig,
        clock: Arc<dyn Clock>,
        store: Arc<dyn PlayerThreeStore>,
        store_metrics: Arc<crate::metrics::StoreMetrics>,
    ) -> anyhow::Result<Arc<PlayerThree>> {
        Self::start_leased(config, clock, store, store_metrics, None)
    }

    /// [`start`](Self::start) on a cluster: each match is served by the
    /// node holding its lease, and its writes are fenced by it.
    pub fn start_leased(
        config: PlayerThreeConfig,
        clock: Arc<dyn Clock>,
        store: Arc<dyn PlayerThreeStore>,
        store_metrics: Arc<crate::metrics::StoreMetrics>,
        leases: Option<Arc<Leases>>,
    ) -> anyhow::Result<Arc<PlayerThree>> {
        let stored = store.load_matches()?;
        let p3 = Arc::new(PlayerThree {
            origins: Arc::new(config.allowed_origins.clone()),
            config,
            clock,
            metrics: Arc::new(PlayerThreeMetrics::default()),
            writer: writer::Writer::start_fenced(
                Arc::clone(&store) as Arc<dyn hostwire_store::UnitStore<PlayerThreeWrite>>,
                crate::metrics::StoreProtocol::PlayerThree,
                store_metrics,
                leases.as_ref().map(|l| l.fence(UnitKind::PlayerThreeMatch)),
            ),
            matches: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            mcp: std::sync::OnceLock::new(),
            store,
            leases,
            tunnels: std::sync::OnceLock::new(),
        });
        if let Some(leases) = &p3.leases {
            leases.register(
                UnitKind::PlayerThreeMatch,
                Arc::new(Weakly(Arc::downgrade(&p3))),
            );
            // On a cluster a match is served by the node holding its
            // lease: the stored matches nobody holds are taken, the others
            // left to their owners.
            let ids: Vec<String> = stored.into_iter().map(|s| s.id).collect();
            let leases = Arc::clone(leases);
            tokio::spawn(async move {
                for id in ids {
                    leases.take_over(UnitKind::PlayerThreeMatch, &id).await;
                }
            });
            return Ok(p3);
        }
        let now = p3.clock.now_ms();
        for s in stored {
            match Self::restore_match(&s, now) {
                Ok((m, tokens, operator)) => {
                    p3.spawn_match(m, tokens, operator);
                }
                Err(e) => tracing::error!(r#match = %s.id, error = %e, "match not restored"),
            }
        }
        Ok(p3)
    }

    fn restore_match(
        s: &StoredMatch,
        now: u64,
    ) -> anyhow::Result<(Match<Ridge>, Vec<TokenHash>, TokenHash)> {
        if s.game != GAME {
            anyhow::bail!("unknown game {:?}", s.game);
        }
        let operator = TokenHash::from_record(&s.operator_token_hash)
            .ok_or_else(|| anyhow::anyhow!("operator token hash: not 64 hex digits"))?;
        let records = s
            .records
            .iter()
            .map(|r| serde_json::from_str::<Record>(r))
            .collect::<Result<Vec<_>, _>>()?;
        let tokens = records
            .iter()
            .filter_map(|r| match r {
                Record::Token { token_hash, .. } => Some(*token_hash),
                _ => None,
            })
            .collect();
        let m = Match::restore(s.id.clone(), &records, &Ridge::restore, now)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((m, tokens, operator))
    }

    /// Restores a match whose lease this node just took, from the store,
    /// as a restart does.
    async fn restore_one(self: &Arc<Self>, id: &str) -> Restored {
        let store = Arc::clone(&self.store);
        let key = id.to_owned();
        let stored = match crate::blocking::spawn(move || store.load_match(&key)).await {
            Ok(Ok(Some(s))) => s,
            Ok(Ok(None)) => return Restored::Gone,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, r#match = id, "match not restored: the store failed");
                return Restored::Failed;
            }
            Err(_) => return Restored::Failed,
        };
        match Self::restore_match(&stored, self.clock.now_ms()) {
            Ok((m, tokens, operator)) => {
                self.spawn_match(m, tokens, operator);
                tracing::info!(r#match = id, "match taken over");
                Restored::Serving
            }
            Err(e) => {
                tracing::error!(r#match = id, error = %e, "match not restored");
                Restored::Failed
            }
        }
    }

    /// The match was lost to another node: it leaves this node's tables
    /// now (nothing more reaches it) and its task closes its connections
    /// ([`CLOSE_MATCH_MOVED`]).
    fn lose(&self, id: &str) {
        let handle = self.matches.lock().ok().and_then(|mut m| m.remove(id));
        if let Ok(mut t) = self.tokens.lock() {
            t.retain(|_, m| m != id);
        }
        if let Some(h) = handle {
            self.metrics.matches.fetch_sub(1, Relaxed);
            h.lost.notify_one();
        }
    }

    /// A match this node serves, taken over from the store if its lease is
    /// free (a cluster's): what every API call looks up.
    pub(crate) async fn find(&self, id: &str) -> Find {
        if let Some(h) = self.match_handle(id) {
            return Find::Here(h);
        }
        let Some(leases) = &self.leases else {
            return Find::NotFound;
        };
        // Read first: an id guessed must not leave a lease row behind.
        let store = Arc::clone(&self.store);
        let key = id.to_owned();
        match crate::blocking::spawn(move || store.load_match(&key)).await {
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => return Find::NotFound,
            _ => return Find::Unavailable,
        }
        match leases.take_over(UnitKind::PlayerThreeMatch, id).await {
            TakeOver::Serving => self.match_handle(id).map_or(Find::NotFound, Find::Here),
            TakeOver::Gone => Find::NotFound,
            TakeOver::Elsewhere(held) => {
                tracing::debug!(r#match = id, owner = %held.owner, "match served by another node");
                Find::Elsewhere(held.owner)
            }
            TakeOver::Failed => Find::Unavailable,
        }
    }

    /// The match of a token, taken over from the store if this node does
    /// not run it and its lease is free (a cluster's): what a join looks
    /// up. The token's shape is checked by the caller.
    pub(crate) async fn find_by_token(&self, token: &str) -> Find {
        if let Some(h) = self.match_of_token(token) {
            return Find::Here(h);
        }
        if self.leases.is_none() {
            return Find::NotFound;
        }
        let store = Arc::clone(&self.store);
        let hash = TokenHash::of(token).to_hex();
        let id = match crate::blocking::spawn(move || store.match_of_token(&hash)).await {
            Ok(Ok(Some(id))) => id,
            Ok(Ok(None)) => return Find::NotFound,
            _ => return Find::Unavailable,
        };
        match self.find(&id).await {
            Find::Here(_) => self
                .match_of_token(token)
                .map_or(Find::NotFound, Find::Here),
            other => other,
        }
    }

    /// The match ended (expired, or its task stopped): its lease goes too,
    /// after its last writes.
    async fn release(&self, id: &str) {
        if let Some(leases) = &self.leases {
            self.writer.flush().await;
            leases.release(UnitKind::PlayerThreeMatch, id).await;
        }
    }

    fn spawn_match(
        self: &Arc<Self>,
        m: Match<Ridge>,
        tokens: Vec<TokenHash>,
        operator_token: TokenHash,
    ) -> MatchHandle {
        let id = m.id().to_owned();
        if let Ok(mut t) = self.tokens.lock() {
            for tok in tokens {
                t.insert(tok, id.clone());
            }
        }
        let handle = actor::spawn(Arc::clone(self), m, operator_token);
        if let Ok(mut ms) = self.matches.lock() {
            ms.insert(id, handle.clone());
        }
        self.metrics.matches.fetch_add(1, Relaxed);
        handle
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    fn next_conn(&self) -> u64 {
        self.next_conn.fetch_add(1, Relaxed)
    }

    fn match_handle(&self, id: &str) -> Option<MatchHandle> {
        self.matches.lock().ok()?.get(id).cloned()
    }

    /// The match a token belongs to (before any check of the token's state).
    fn match_of_token(&self, token: &str) -> Option<MatchHandle> {
        let id = self
            .tokens
            .lock()
            .ok()?
            .get(&TokenHash::of(token))
            .cloned()?;
        self.match_handle(&id)
    }

    fn note_token(&self, token: TokenHash, match_id: &str) {
        if let Ok(mut t) = self.tokens.lock() {
            t.insert(token, match_id.to_owned());
        }
    }

    /// Forgets an expired match: its handle and its tokens.
    fn forget_match(&self, id: &str) {
        if let Ok(mut ms) = self.matches.lock() {
            if ms.remove(id).is_some() {
                self.metrics.matches.fetch_sub(1, Relaxed);
            }
        }
        if let Ok(mut t) = self.tokens.lock() {
            t.retain(|_, m| m != id);
        }
    }

    fn handles(&self) -> Vec<MatchHandle> {
        self.matches
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Units waiting for PlayerThree's store writer or being written.
    pub fn store_pending(&self) -> usize {
        self.writer.queued() + self.writer.in_batch()
    }

    pub fn match_count(&self) -> usize {
        self.matches.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Creates a match, durable before its id and tokens are handed out:
    /// its handle and its operator token (the only time the text exists;
    /// the store keeps its hash).
    async fn create_match(self: &Arc<Self>) -> Option<(MatchHandle, hostwire_core::Token)> {
        if self.match_count() >= MAX_MATCHES {
            return None;
        }
        let now = self.clock.now_ms();
        let id = hostwire_core::Token::generate().as_str()[..MATCH_ID_CHARS].to_owned();
        let operator_token = hostwire_core::Token::generate();
        let operator_hash = TokenHash::of(operator_token.as_str());
        let mut m = Match::new(id.clone(), Ridge::new(), MatchConfig::default(), now);
        let mut writes = vec![PlayerThreeWrite::Match {
            id: id.clone(),
            game: GAME.to_owned(),
            operator_token_hash: operator_hash.to_hex(),
            created_at_ms: now,
        }];
        writes.extend(writer::persisted(&id, m.take_outputs()));
        // On a cluster the match is this node's (its lease taken) before
        // its creation is written, and its writes carry the generation.
        if let Some(leases) = &self.leases {
            if !matches!(
                leases.acquire(UnitKind::PlayerThreeMatch, &id).await,
                Ok(Ok(_))
            ) {
                return None;
            }
        }
        if !self.writer.write_durable(&id, writes).await {
            if let Some(leases) = &self.leases {
                leases.release(UnitKind::PlayerThreeMatch, &id).await;
            }
            return None;
        }
        Some((
            self.spawn_match(m, Vec::new(), operator_hash),
            operator_token,
        ))
    }

    /// Runs every match's due work at the clock's time now, and returns
    /// once each has (tests advance a manual clock, then call this).
    pub async fn wake(&self) {
        for h in self.handles() {
            let (tx, rx) = oneshot::channel();
            if h.tx.send(MatchCmd::Wake(tx)).await.is_ok() {
                let _ = rx.await;
            }
        }
    }

    /// Closes every connection (1001); matches stay stored. Then flushes.
    pub async fn shutdown(&self) {
        for h in self.handles() {
            let (tx, rx) = oneshot::channel();
            if h.tx.send(MatchCmd::Shutdown(tx)).await.is_ok() {
                let _ = rx.await;
            }
        }
        self.writer.flush().await;
    }
}
