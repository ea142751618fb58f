//! The match host: a sans-IO state machine around one [`Game`].
//!
//! The server feeds it events (a connection presents a token, a text
//! message arrives, a tick is due at time T, an observer frame is due) and
//! drains [`Output`]s: text for connections (shared `Arc<str>`, serialized
//! once however many readers it has), connections to close, records to
//! persist, tells for agents. It never reads a clock: every event carries
//! `now` in milliseconds.
//!
//! How a server drives one match (one task owns it):
//!
//! - create: [`Match::new`]; after a restart: [`Match::restore`] with the
//!   stored [`Record`]s and the game's restore function;
//! - operator HTTP API: [`Match::mint`] any principal, [`Match::revoke`],
//!   [`Match::set_card`], [`Match::set_paused`];
//! - a socket joins: [`Match::connect`] with the token text (an error is
//!   the protocol's `bad_token`, `not_in_match` or `busy`: close the socket);
//!   every text frame: [`Match::handle_message`]; gone: [`Match::disconnect`];
//! - MCP: [`Match::connect`] a session with the agent's seat token, then
//!   [`Match::handle_client`] for tool calls, [`Match::control_methods`] for
//!   the tool list and schemas, [`Match::team_view`] for the resource,
//!   [`Match::take_inbox`] for tells, [`Match::proposal_status`],
//!   [`Match::disclose`] for commentary to observers;
//! - time: [`Match::tick`] at the game's rate, and
//!   [`Match::poll_observers`] at [`Match::next_timeout`];
//! - after each call: [`Match::take_outputs`] and perform them in order
//!   (`Send` the shared text, `Close`, `Persist` the record, `Durable`
//!   once the records before it are stored, hand `Told` to the agent's
//!   session, log `GuardViolation`).

use crate::decode::{check_commentary_text, decode_inbound, Inbound};
use crate::game::{
    ControlMethod, Game, GameError, GameFactory, GuardViolation, Perspective, Vocabulary,
};
use crate::observer::{ObserverCursor, ObserverFeed, MAX_OBSERVER_DELAY_MS, OMNISCIENT};
use crate::protocol::{
    ClientMsg, CommentaryCategory, Controller, DetailRequest, Disclosure, EntrantCard,
    ObserverAgentCard, ObserverCommentary, ObserverGrant, Outcome, Principal, ProtocolError,
    PublicSeatCard, ResultMsg, Roles, SeatInfo, ServerErrorCode as Code, ServerMsg, WatchMsg,
    SCOPE_ALL,
};
use crate::tokens::{TokenHash, TokenTable};
use crate::view::ViewStream;
use hostwire_core::delta::{Json, JsonMap};
use hostwire_core::{Token, TokenBucket};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// A connection, as the server numbers them.
pub type ConnId = u64;

/// Inbound messages a connection may send per second, and in a burst.
pub const MESSAGES_PER_SECOND: f64 = 20.0;
pub const MESSAGE_BURST: u32 = 40;
/// Rate-limited messages in a row after which the connection is closed.
pub const RATE_LIMIT_STRIKES: u32 = 50;
/// Connections one match holds; more are refused with `busy`.
pub const MAX_CONNECTIONS_PER_MATCH: usize = 4096;
/// Tells waiting for one agent; when full, a tell is `busy`.
pub const MAX_INBOX_PER_SEAT: usize = 64;
/// Resolved proposals remembered for [`Match::proposal_status`].
pub const MAX_RESOLVED_PROPOSALS: usize = 256;
/// Disclosures one seat may make per game tick; more are `rate_limited`.
/// With the text bound this caps what commentary adds to a frame.
pub const MAX_COMMENTARY_PER_TICK: u32 = 2;

/// How a match runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MatchConfig {
    /// Chat mode: owners `tell` their agents, agents answer with `said`.
    pub chat: bool,
    /// Record (persist the game state, record observer frames) every N ticks.
    pub record_every_ticks: u64,
}

impl Default for MatchConfig {
    fn default() -> Self {
        Self {
            chat: true,
            record_every_ticks: 1,
        }
    }
}

/// Why the host closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Its token was revoked.
    Revoked,
    /// It kept sending past its rate limit.
    RateLimited,
}

impl CloseReason {
    /// The close code and reason the connection is closed with.
    pub const fn close(self) -> (u16, &'static str) {
        match self {
            CloseReason::Revoked => (crate::protocol::CLOSE_REVOKED, "token revoked"),
            CloseReason::RateLimited => (crate::protocol::CLOSE_RATE_LIMITED, "rate limited"),
        }
    }
}

/// Who wrote a chat line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChatFrom {
    Owner,
    Agent,
}

/// What must survive a restart, in the order it happened. The server
/// stores these; [`Match::restore`] reads them back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "camelCase")]
pub enum Record {
    #[serde(rename_all = "camelCase")]
    Config { config: MatchConfig },
    /// A token, by its hash only (`tokenHash`; records of earlier
    /// versions held the text as `token`, read as its hash).
    #[serde(rename_all = "camelCase")]
    Token {
        #[serde(alias = "token")]
        token_hash: TokenHash,
        principal: Principal,
    },
    #[serde(rename_all = "camelCase")]
    Revoked {
        #[serde(alias = "token")]
        token_hash: TokenHash,
    },
    #[serde(rename_all = "camelCase")]
    Controller {
        role: String,
        controller: Controller,
    },
    #[serde(rename_all = "camelCase")]
    Policy {
        role: String,
        policy_version: u64,
        scopes: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mandate: Option<Json>,
    },
    #[serde(rename_all = "camelCase")]
    Card {
        role: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        card: Option<EntrantCard>,
    },
    /// A supervised seat's call, waiting for its owner.
    #[serde(rename_all = "camelCase")]
    Proposal {
        id: String,
        role: String,
        method: String,
        args: Json,
    },
    /// A proposal no longer pending (applied, rejected, failed or dropped),
    /// with its seat (records of earlier versions have none).
    #[serde(rename_all = "camelCase")]
    Resolved {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<String>,
    },
    /// The game's saved state, the match's `recording`-th recording
    /// (records of earlier versions have none: their count is used), so a
    /// store may keep the latest state alone.
    #[serde(rename_all = "camelCase")]
    State {
        tick: u64,
        recorded_at: u64,
        state: Json,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recording: Option<u64>,
    },
    #[serde(rename_all = "camelCase")]
    Chat {
        team: String,
        role: String,
        from: ChatFrom,
        text: String,
        tick: u64,
    },
    /// Commentary an agent disclosed for observers (`ObserverCommentary`).
    #[serde(rename_all = "camelCase")]
    Commentary {
        id: String,
        team: String,
        role: String,
        tick: u64,
        category: CommentaryCategory,
        text: String,
    },
}

/// A tell for an agent (the MCP side hands it to the agent).
#[derive(Debug, Clone, PartialEq)]
pub struct Told {
    pub role: String,
    pub text: String,
    pub ping: Option<Json>,
    pub tick: u64,
}

/// What the server does next.
#[derive(Debug, Clone)]
pub enum Output {
    Send {
        conn: ConnId,
        text: Arc<str>,
    },
    Close {
        conn: ConnId,
        reason: CloseReason,
    },
    Persist(Record),
    /// A reply that acknowledges a durable change (`mint` hands out a
    /// token; `mandate` and `scopes` change a seat's policy, `controller`
    /// who plays it): send `text`,
    /// and the frames before it, only once every `Persist` before it is
    /// durable. If they cannot be stored, send `otherwise` (an `internal`
    /// error) instead, drop the frames before it, and give `undo` to
    /// [`Match::not_stored`]: nothing changed.
    Durable {
        conn: ConnId,
        text: Arc<str>,
        otherwise: Arc<str>,
        undo: Undo,
    },
    Told(Told),
    /// Game data that broke the closed vocabulary was withheld.
    GuardViolation(GuardViolation),
}

/// What [`Match::not_stored`] takes back when a change was not stored.
#[derive(Debug, Clone, PartialEq)]
pub enum Undo {
    /// A minted token, never handed out: refused from now on.
    Token(TokenHash),
    /// A seat's policy as it was before.
    Policy {
        role: String,
        policy_version: u64,
        scopes: Vec<String>,
        mandate: Option<Json>,
    },
    /// A seat's controller as it was before, with the proposal the change
    /// dropped (pending again).
    Controller {
        role: String,
        controller: Controller,
        pending: Option<PendingProposal>,
    },
}

/// A supervised seat's proposal waiting for its owner, as
/// [`Undo::Controller`] gives it back.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingProposal {
    pub id: String,
    pub method: String,
    pub args: Json,
}

/// Where a supervised proposal stands.
#[derive(Debug, Clone, PartialEq)]
pub enum ProposalStatus {
    Pending,
    Applied(Json),
    Rejected,
    Failed(String),
}

#[derive(Debug, Clone)]
struct Proposal {
    role: String,
    method: String,
    args: Json,
}

#[derive(Debug, Clone)]
struct Seat {
    team: String,
    controller: Controller,
    scopes: Vec<String>,
    mandate: Option<Json>,
    policy_version: u64,
    card: Option<EntrantCard>,
    pending: Option<String>,
    inbox: VecDeque<Told>,
    /// Disclosures at a tick: (tick, how many).
    disclosed: (u64, u32),
}

#[derive(Debug, Clone)]
struct Stream {
    every_ticks: u64,
    detail: Option<DetailRequest>,
}

#[derive(Debug)]
struct Conn {
    principal: Principal,
    token: TokenHash,
    bucket: TokenBucket,
    strikes: u32,
    watching: Watching,
    streams: BTreeMap<String, Stream>,
    /// Boxed: only an observer has one, and every connection's entry in
    /// the match's map would otherwise hold its 88 bytes.
    observer: Option<Box<ObserverCursor>>,
}

/// The teams a connection reads, sorted and without repeats: a list, not a
/// `BTreeSet`, whose first node takes about 280 bytes for the one team
/// that nearly every connection (every spectator among them) watches.
#[derive(Clone, Debug, Default)]
struct Watching(Vec<String>);

impl Watching {
    fn insert(&mut self, team: String) {
        if let Err(at) = self.0.binary_search(&team) {
            // One more slot, not the list's doubling: a connection watches
            // one team or a few.
            self.0.reserve_exact(1);
            self.0.insert(at, team);
        }
    }

    fn contains(&self, team: &str) -> bool {
        self.0.iter().any(|t| t == team)
    }

    fn iter(&self) -> std::slice::Iter<'_, String> {
        self.0.iter()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<String> for Watching {
    fn from_iter<I: IntoIterator<Item = String>>(teams: I) -> Self {
        let mut w = Watching::default();
        for t in teams {
            w.insert(t);
        }
        w
    }
}

/// Which owner authority an op needs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Act for the seat (`call`, `stream`): its owners and its own agent.
    Play,
    /// Owner only (`mandate`, `scopes`, `resolveApproval`, `controller`, `mint`).
    Own(&'static str),
}

/// One hosted match.
pub struct Match<G: Game> {
    id: String,
    config: MatchConfig,
    game: G,
    teams: Vec<String>,
    methods: BTreeMap<String, Vec<ControlMethod>>,
    sections: Vec<String>,
    vocabulary: Vocabulary,
    seats: BTreeMap<String, Seat>,
    tokens: TokenTable,
    conns: BTreeMap<ConnId, Conn>,
    views: BTreeMap<String, ViewStream>,
    feed: ObserverFeed,
    proposals: BTreeMap<String, Proposal>,
    resolved: VecDeque<(String, ProposalStatus)>,
    next_proposal: u64,
    reported: BTreeSet<String>,
    outcomes: Arc<BTreeMap<String, Outcome>>,
    /// Disclosed since the last recording; goes with the next frames.
    commentary: Vec<Arc<ObserverCommentary>>,
    next_commentary: u64,
    paused: bool,
    finished: bool,
    /// When the last tick recorded the match as finished.
    finished_at: Option<u64>,
    /// Recordings made (the observer frames' sequences go on after them).
    recordings: u64,
    outputs: Vec<Output>,
}

fn err(code: Code, message: impl Into<String>) -> ProtocolError {
    ProtocolError::new(code, message)
}

/// Whether observers of `perspective` see this commentary: the omniscient
/// perspective every team's, a team's perspective its own team's only (a
/// team grant never sees another team's data).
fn sees(perspective: &str, c: &ObserverCommentary) -> bool {
    perspective == OMNISCIENT || c.team == perspective
}

fn obj<const N: usize>(members: [(&str, Json); N]) -> Json {
    Json::object(members.into_iter().collect::<JsonMap>())
}

impl<G: Game> Match<G> {
    /// A new match at the game's current state, recorded at `now`.
    pub fn new(id: impl Into<String>, game: G, config: MatchConfig, now: u64) -> Self {
        let mut m = Self::build(id.into(), game, config);
        m.outputs.push(Output::Persist(Record::Config {
            config: m.config.clone(),
        }));
        m.record(now);
        m.publish_views();
        m
    }

    /// A match rebuilt from its records: the game from the last recorded
    /// state, then tokens, revocations, controllers, policies and cards.
    /// Observers resume with a keyframe; pending proposals wait again.
    pub fn restore(
        id: impl Into<String>,
        records: &[Record],
        factory: &impl GameFactory<G>,
        now: u64,
    ) -> Result<Self, GameError> {
        let (state, recorded_at, recording) = records
            .iter()
            .rev()
            .find_map(|r| match r {
                Record::State {
                    state,
                    recorded_at,
                    recording,
                    ..
                } => Some((state, *recorded_at, *recording)),
                _ => None,
            })
            .ok_or_else(|| GameError("no recorded game state".into()))?;
        let config = records
            .iter()
            .find_map(|r| match r {
                Record::Config { config } => Some(config.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let game = factory.restore(state)?;
        let mut m = Self::build(id.into(), game, config);
        let last_state = records
            .iter()
            .rposition(|r| matches!(r, Record::State { .. }))
            .unwrap_or(0);
        // Commentary already in a frame before the restart: the next
        // keyframes carry the newest of it.
        let mut carried = Vec::new();
        for (i, r) in records.iter().enumerate() {
            match r {
                Record::Commentary {
                    id,
                    team,
                    role,
                    tick,
                    category,
                    text,
                } => {
                    // Ids continue past every id handed out before.
                    if let Some(n) = id.strip_prefix('c').and_then(|n| n.parse::<u64>().ok()) {
                        m.next_commentary = m.next_commentary.max(n);
                    }
                    if let Some(s) = m.seats.get_mut(role) {
                        s.disclosed = match s.disclosed {
                            (t, n) if t == *tick => (t, n + 1),
                            _ => (*tick, 1),
                        };
                    }
                    let c = Arc::new(ObserverCommentary {
                        id: id.clone(),
                        team: team.clone(),
                        role: role.clone(),
                        tick: *tick,
                        category: *category,
                        text: text.clone(),
                    });
                    if i < last_state {
                        carried.push(c);
                    } else {
                        m.commentary.push(c);
                    }
                }
                Record::Token {
                    token_hash,
                    principal,
                } => {
                    m.tokens.restore(*token_hash, principal.clone(), false);
                    if let Principal::Observer { grant, .. } = principal {
                        m.feed.note_delay(grant.delay_ms());
                    }
                }
                Record::Revoked { token_hash } => {
                    m.tokens.revoke(token_hash);
                }
                Record::Proposal {
                    id,
                    role,
                    method,
                    args,
                } => {
                    // Ids continue past every id handed out before.
                    if let Some(n) = id.strip_prefix('p').and_then(|n| n.parse::<u64>().ok()) {
                        m.next_proposal = m.next_proposal.max(n);
                    }
                    if let Some(s) = m.seats.get_mut(role) {
                        s.pending = Some(id.clone());
                        m.proposals.insert(
                            id.clone(),
                            Proposal {
                                role: role.clone(),
                                method: method.clone(),
                                args: args.clone(),
                            },
                        );
                    }
                }
                Record::Resolved { id, .. } => {
                    // Ids continue past every id handed out before (a
                    // store may keep the end of a proposal alone).
                    if let Some(n) = id.strip_prefix('p').and_then(|n| n.parse::<u64>().ok()) {
                        m.next_proposal = m.next_proposal.max(n);
                    }
                    if let Some(p) = m.proposals.remove(id) {
                        if let Some(s) = m.seats.get_mut(&p.role) {
                            if s.pending.as_deref() == Some(id.as_str()) {
                                s.pending = None;
                            }
                        }
                    }
                }
                Record::Controller { role, controller } => {
                    if let Some(s) = m.seats.get_mut(role) {
                        s.controller = *controller;
                    }
                }
                Record::Policy {
                    role,
                    policy_version,
                    scopes,
                    mandate,
                } => {
                    if let Some(s) = m.seats.get_mut(role) {
                        s.policy_version = *policy_version;
                        s.scopes = scopes.clone();
                        s.mandate = mandate.clone();
                    }
                }
                Record::Card { role, card } => {
                    if let Some(s) = m.seats.get_mut(role) {
                        s.card = card.clone();
                    }
                }
                Record::Config { .. } | Record::State { .. } | Record::Chat { .. } => {}
            }
        }
        m.refresh_agent_cards();
        m.recordings = recording.unwrap_or_else(|| {
            records
                .iter()
                .filter(|r| matches!(r, Record::State { .. }))
                .count() as u64
        });
        m.feed.continue_after(m.recordings);
        for p in m.perspectives() {
            let seen = carried.iter().filter(|c| sees(&p, c)).cloned().collect();
            m.feed.carry_commentary(&p, seen);
        }
        m.record_frames(now);
        m.publish_views();
        m.check_outcomes();
        if m.finished {
            m.finished_at = Some(recorded_at);
        }
        Ok(m)
    }

    fn build(id: String, game: G, config: MatchConfig) -> Self {
        let teams = game.teams();
        let sections = game.sections();
        let mut vocabulary = game.vocabulary();
        let mut methods = BTreeMap::new();
        let mut seats = BTreeMap::new();
        for s in game.seats() {
            let ms = game.control_methods(&s.role);
            vocabulary.extend(ms.iter().map(|m| m.name.as_str()));
            vocabulary.extend([s.role.as_str()]);
            methods.insert(s.role.clone(), ms);
            seats.insert(
                s.role,
                Seat {
                    team: s.team,
                    controller: Controller::Human,
                    scopes: vec![SCOPE_ALL.to_owned()],
                    mandate: None,
                    policy_version: 0,
                    card: None,
                    pending: None,
                    inbox: VecDeque::new(),
                    disclosed: (0, 0),
                },
            );
        }
        vocabulary.extend(teams.iter());
        vocabulary.extend(sections.iter());
        let views = teams
            .iter()
            .map(|t| (t.clone(), ViewStream::new(t.clone())))
            .collect();
        Self {
            id,
            config: MatchConfig {
                record_every_ticks: config.record_every_ticks.max(1),
                ..config
            },
            game,
            teams,
            methods,
            sections,
            vocabulary,
            seats,
            tokens: TokenTable::new(),
            conns: BTreeMap::new(),
            views,
            feed: ObserverFeed::new(),
            proposals: BTreeMap::new(),
            resolved: VecDeque::new(),
            next_proposal: 0,
            reported: BTreeSet::new(),
            outcomes: Arc::new(BTreeMap::new()),
            commentary: Vec::new(),
            next_commentary: 0,
            paused: false,
            finished: false,
            finished_at: None,
            recordings: 0,
            outputs: Vec::new(),
        }
    }

    // ----- operator API (the server's HTTP side) -----

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn game(&self) -> &G {
        &self.game
    }

    pub fn teams(&self) -> &[String] {
        &self.teams
    }

    /// Issues a token for `principal`, which must name this match and
    /// existing teams and seats.
    pub fn mint(&mut self, principal: Principal) -> Result<Token, ProtocolError> {
        self.check_principal(&principal)?;
        if let Principal::Observer { grant, .. } = &principal {
            self.feed.note_delay(grant.delay_ms());
        }
        let (token, token_hash) = self.tokens.mint(principal.clone())?;
        self.outputs.push(Output::Persist(Record::Token {
            token_hash,
            principal,
        }));
        Ok(token)
    }

    fn check_principal(&self, p: &Principal) -> Result<(), ProtocolError> {
        if p.match_id() != self.id {
            return Err(err(Code::NotInMatch, "match: not this match"));
        }
        let team_ok = |t: &str| self.teams.iter().any(|x| x == t);
        let seat_ok = |r: &str, t: &str| self.seats.get(r).is_some_and(|s| s.team == t);
        let ok = match p {
            Principal::Team { team, .. } => team_ok(team),
            Principal::Human { role, team, .. } | Principal::Seat { role, team, .. } => {
                seat_ok(role, team)
            }
            Principal::Spectator { team, .. } => team.as_deref().is_none_or(team_ok),
            Principal::Observer { grant, .. } => {
                if grant.delay_ms() > MAX_OBSERVER_DELAY_MS {
                    return Err(err(
                        Code::Invalid,
                        format!(
                            "grant.delayMs: above MAX_OBSERVER_DELAY_MS ({MAX_OBSERVER_DELAY_MS})"
                        ),
                    ));
                }
                match grant {
                    ObserverGrant::Team { team, .. } => team_ok(team),
                    ObserverGrant::Omniscient { teams, .. } => teams.iter().all(|t| team_ok(t)),
                }
            }
        };
        if ok {
            Ok(())
        } else {
            Err(err(
                Code::NotInMatch,
                "principal: names a team or seat this match does not have",
            ))
        }
    }

    /// Refuses `token` from now on and closes its connections.
    pub fn revoke(&mut self, token: &str) -> bool {
        self.revoke_hash(TokenHash::of(token))
    }

    /// [`Match::revoke`] by the token's hash.
    /// The records before an [`Output::Durable`] were not stored: its
    /// change is taken back.
    pub fn not_stored(&mut self, undo: Undo) {
        match undo {
            Undo::Token(hash) => {
                self.revoke_hash(hash);
            }
            Undo::Policy {
                role,
                policy_version,
                scopes,
                mandate,
            } => {
                if let Some(s) = self.seats.get_mut(&role) {
                    s.policy_version = policy_version;
                    s.scopes = scopes;
                    s.mandate = mandate;
                }
            }
            Undo::Controller {
                role,
                controller,
                pending,
            } => {
                let Some(s) = self.seats.get_mut(&role) else {
                    return;
                };
                s.controller = controller;
                if let Some(p) = pending {
                    s.pending = Some(p.id.clone());
                    self.resolved.retain(|(id, _)| *id != p.id);
                    self.proposals.insert(
                        p.id,
                        Proposal {
                            role: role.clone(),
                            method: p.method,
                            args: p.args,
                        },
                    );
                }
                self.refresh_agent_cards();
            }
        }
    }

    pub fn revoke_hash(&mut self, token_hash: TokenHash) -> bool {
        if !self.tokens.revoke(&token_hash) {
            return false;
        }
        self.outputs
            .push(Output::Persist(Record::Revoked { token_hash }));
        let gone: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.token.matches(&token_hash))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.disconnect(id);
            self.outputs.push(Output::Close {
                conn: id,
                reason: CloseReason::Revoked,
            });
        }
        true
    }

    /// Sets a seat's public card.
    pub fn set_card(&mut self, role: &str, card: Option<EntrantCard>) -> Result<(), ProtocolError> {
        let seat = self
            .seats
            .get_mut(role)
            .ok_or_else(|| err(Code::NotInMatch, format!("role: no seat {role:?}")))?;
        seat.card = card.clone();
        self.outputs.push(Output::Persist(Record::Card {
            role: role.to_owned(),
            card,
        }));
        self.refresh_agent_cards();
        self.broadcast_cards();
        Ok(())
    }

    /// Pauses or resumes: while paused, ticks do nothing and calls are `paused`.
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// When the match was recorded as finished (the time of its last tick).
    pub fn finished_at(&self) -> Option<u64> {
        self.finished_at
    }

    /// The control methods a seat may call (for MCP tools).
    pub fn control_methods(&self, role: &str) -> Option<&[ControlMethod]> {
        self.methods.get(role).map(Vec::as_slice)
    }

    /// The current view of a team (for an MCP resource).
    pub fn team_view(&self, team: &str) -> Option<&Json> {
        self.views.get(team).and_then(|v| v.current())
    }

    /// The principal of presented token text.
    pub fn principal(&self, token: &str) -> Result<&Principal, ProtocolError> {
        self.tokens.lookup(token)
    }

    pub fn proposal_status(&self, id: &str) -> Option<ProposalStatus> {
        if self.proposals.contains_key(id) {
            return Some(ProposalStatus::Pending);
        }
        self.resolved
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, s)| s.clone())
    }

    /// Tells waiting for the agent of `role` (left waiting).
    pub fn inbox(&self, role: &str) -> Vec<Told> {
        self.seats
            .get(role)
            .map(|s| s.inbox.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Tells waiting for the agent of `role` (taken).
    pub fn take_inbox(&mut self, role: &str) -> Vec<Told> {
        self.seats
            .get_mut(role)
            .map(|s| s.inbox.drain(..).collect())
            .unwrap_or_default()
    }

    /// An agent discloses commentary for observers (the MCP tool
    /// `disclose`). Only a seat token whose seat an agent plays may; the
    /// entry goes with the next frame recorded (released at its
    /// `releaseAt`, so the observer delay covers it). Result:
    /// `{"id","tick"}`.
    pub fn disclose(&mut self, conn: ConnId, d: Disclosure) -> Result<Json, ProtocolError> {
        let principal = self
            .conns
            .get(&conn)
            .map(|c| c.principal.clone())
            .ok_or_else(|| err(Code::NotInMatch, "connection: not joined"))?;
        let Principal::Seat { role, team, .. } = principal else {
            return Err(err(
                Code::Forbidden,
                "disclose: agents only (a seat token); owners, spectators and observers never disclose",
            ));
        };
        let seat = self
            .seats
            .get(&role)
            .ok_or_else(|| err(Code::NotInMatch, format!("role: no seat {role:?}")))?;
        if seat.controller == Controller::Human {
            return Err(err(
                Code::Forbidden,
                "role: this seat is played by a human, not an agent",
            ));
        }
        if self.finished {
            return Err(err(Code::Paused, "match: over"));
        }
        if self.paused {
            return Err(err(Code::Paused, "match: paused"));
        }
        check_commentary_text(&d.text).map_err(|m| err(Code::BadMessage, m))?;
        let tick = self.game.tick();
        let count = match seat.disclosed {
            (t, n) if t == tick => n,
            _ => 0,
        };
        if count >= MAX_COMMENTARY_PER_TICK {
            return Err(err(
                Code::RateLimited,
                format!(
                    "disclose: MAX_COMMENTARY_PER_TICK ({MAX_COMMENTARY_PER_TICK}) at tick {tick}"
                ),
            ));
        }
        self.seats.get_mut(&role).expect("found above").disclosed = (tick, count + 1);
        self.next_commentary += 1;
        let id = format!("c{}", self.next_commentary);
        self.outputs.push(Output::Persist(Record::Commentary {
            id: id.clone(),
            team: team.clone(),
            role: role.clone(),
            tick,
            category: d.category,
            text: d.text.clone(),
        }));
        self.commentary.push(Arc::new(ObserverCommentary {
            id: id.clone(),
            team,
            role,
            tick,
            category: d.category,
            text: d.text,
        }));
        Ok(obj([
            ("id", Json::string(&id)),
            ("tick", Json::Number(tick.into())),
        ]))
    }

    /// Whether the seat `role` is played by an agent (who may disclose).
    pub fn is_agent_seat(&self, role: &str) -> bool {
        self.seats
            .get(role)
            .is_some_and(|s| matches!(s.controller, Controller::Agent { .. }))
    }

    /// Everything to do since the last call.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outputs)
    }

    // ----- connections -----

    /// A connection presents its token (once, when joining).
    pub fn connect(&mut self, conn: ConnId, token: &str, now: u64) -> Result<(), ProtocolError> {
        let principal = self.tokens.lookup(token)?.clone();
        if principal.match_id() != self.id {
            return Err(err(Code::NotInMatch, "token: not a token of this match"));
        }
        if self.conns.len() >= MAX_CONNECTIONS_PER_MATCH && !self.conns.contains_key(&conn) {
            return Err(err(Code::Busy, "match: MAX_CONNECTIONS_PER_MATCH reached"));
        }
        let mut c = Conn {
            principal: principal.clone(),
            token: TokenHash::of(token),
            bucket: TokenBucket::new(MESSAGES_PER_SECOND, MESSAGE_BURST, now),
            strikes: 0,
            watching: Watching::default(),
            streams: BTreeMap::new(),
            observer: None,
        };
        match &principal {
            Principal::Team { team, .. } | Principal::Human { team, .. } => {
                c.watching.insert(team.clone());
            }
            Principal::Spectator { team: Some(t), .. } => {
                c.watching.insert(t.clone());
            }
            Principal::Observer { grant, .. } => {
                c.observer = Some(Box::new(ObserverCursor::new(grant.clone())));
            }
            _ => {}
        }
        self.conns.insert(conn, c);
        match &principal {
            Principal::Observer { .. } => {
                let text = self.conns[&conn]
                    .observer
                    .as_ref()
                    .map(|o| o.admission().to_text())
                    .unwrap_or_default();
                self.send(conn, text.into());
            }
            Principal::Seat { .. } => self.broadcast_seats(),
            _ => {
                self.send_seats_to(conn);
                self.send_cards_to(conn);
                let teams: Vec<String> = self.conns[&conn].watching.iter().cloned().collect();
                for t in teams {
                    self.send_keyframe(conn, &t);
                }
            }
        }
        Ok(())
    }

    pub fn disconnect(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.remove(&conn) {
            if matches!(c.principal, Principal::Seat { .. }) {
                self.broadcast_seats();
            }
        }
    }

    /// One inbound text message from a connection.
    pub fn handle_message(&mut self, conn: ConnId, text: &str, now: u64) {
        if !self.conns.contains_key(&conn) {
            return;
        }
        let decoded = decode_inbound(text);
        let seq = match &decoded {
            Ok(Inbound::Client(m)) => m.seq(),
            Ok(_) => 0,
            Err(e) => e.seq.unwrap_or(0),
        };
        let c = self.conns.get_mut(&conn).expect("checked above");
        if !c.bucket.try_take(now) {
            c.strikes += 1;
            if c.strikes > RATE_LIMIT_STRIKES {
                self.disconnect(conn);
                self.outputs.push(Output::Close {
                    conn,
                    reason: CloseReason::RateLimited,
                });
                return;
            }
            let e = err(Code::RateLimited, "connection: over its message rate");
            self.send(conn, ServerMsg::error(seq, &e).to_text().into());
            return;
        }
        c.strikes = 0;
        match decoded {
            Err(e) => self.send(conn, ServerMsg::error(seq, &e.error).to_text().into()),
            Ok(Inbound::Client(m)) => {
                self.handle_client(conn, m, now);
            }
            Ok(Inbound::Watch(w)) => {
                if let Err(e) = self.watch(conn, w) {
                    self.send(conn, ServerMsg::error(0, &e).to_text().into());
                }
            }
            Ok(Inbound::Observer(r)) => {
                let result = match self.conns.get_mut(&conn).and_then(|c| c.observer.as_mut()) {
                    None => Err(err(
                        Code::Forbidden,
                        "op: observer requests need an observer token",
                    )),
                    Some(cursor) => cursor.request(&r),
                };
                match result {
                    Err(e) => self.send(conn, ServerMsg::error(0, &e).to_text().into()),
                    Ok(()) => self.poll_observer(conn, now),
                }
            }
        }
    }

    /// One decoded client op; its `result` is sent and returned.
    pub fn handle_client(&mut self, conn: ConnId, msg: ClientMsg, now: u64) -> ServerMsg {
        let seq = msg.seq();
        let mint = matches!(msg, ClientMsg::Mint { .. });
        // A policy or controller change is acknowledged once durable; what
        // it replaced comes back if it is not.
        let policy_before = match &msg {
            ClientMsg::Mandate { role, .. } | ClientMsg::Scopes { role, .. } => {
                self.seats.get(role).map(|s| Undo::Policy {
                    role: role.clone(),
                    policy_version: s.policy_version,
                    scopes: s.scopes.clone(),
                    mandate: s.mandate.clone(),
                })
            }
            ClientMsg::Controller { role, .. } => self.seats.get(role).map(|s| Undo::Controller {
                role: role.clone(),
                controller: s.controller,
                pending: s.pending.as_ref().and_then(|id| {
                    self.proposals.get(id).map(|p| PendingProposal {
                        id: id.clone(),
                        method: p.method.clone(),
                        args: p.args.clone(),
                    })
                }),
            }),
            _ => None,
        };
        let reply = match self.dispatch(conn, msg, now) {
            Ok(data) => ServerMsg::ok(seq, data),
            Err(e) => ServerMsg::error(seq, &e),
        };
        let ok = matches!(&reply, ServerMsg::Result(ResultMsg { ok: true, .. }));
        let undo = match &reply {
            ServerMsg::Result(ResultMsg {
                ok: true,
                data: Some(d),
                ..
            }) if mint => d.get("token").and_then(Json::as_str).map(|t| {
                (
                    Undo::Token(TokenHash::of(t)),
                    "store: the token was not stored",
                )
            }),
            _ if ok => policy_before.map(|u| {
                let why = match u {
                    Undo::Controller { .. } => "store: the controller change was not stored",
                    _ => "store: the policy change was not stored",
                };
                (u, why)
            }),
            _ => None,
        };
        match undo {
            // Acknowledged only once its record is durable.
            Some((undo, why)) => {
                let e = err(Code::Internal, why);
                self.outputs.push(Output::Durable {
                    conn,
                    text: reply.to_text().into(),
                    otherwise: ServerMsg::error(seq, &e).to_text().into(),
                    undo,
                });
            }
            None => self.send(conn, reply.to_text().into()),
        }
        reply
    }

    fn dispatch(&mut self, conn: ConnId, msg: ClientMsg, _now: u64) -> Result<Json, ProtocolError> {
        let principal = self
            .conns
            .get(&conn)
            .map(|c| c.principal.clone())
            .ok_or_else(|| err(Code::NotInMatch, "connection: not joined"))?;
        match msg {
            ClientMsg::Call {
                role, method, args, ..
            } => self.call(&principal, &role, &method, args),
            ClientMsg::Stream {
                role,
                every_ticks,
                detail,
                ..
            } => {
                self.authorize(&principal, &role, Need::Play)?;
                if let Some(DetailRequest::Sections(names)) = &detail {
                    if let Some((i, n)) = names
                        .iter()
                        .enumerate()
                        .find(|(_, n)| !self.sections.contains(n))
                    {
                        return Err(err(
                            Code::Invalid,
                            format!("detail[{i}]: unknown section {n:?}"),
                        ));
                    }
                }
                let c = self.conns.get_mut(&conn).expect("joined");
                if every_ticks == 0 {
                    c.streams.remove(&role);
                } else {
                    c.streams.insert(
                        role,
                        Stream {
                            every_ticks: u64::from(every_ticks),
                            detail,
                        },
                    );
                }
                Ok(obj([("everyTicks", Json::Number(every_ticks.into()))]))
            }
            ClientMsg::Mandate { role, mandate, .. } => {
                self.authorize(&principal, &role, Need::Own("mandate"))?;
                let seat = self.seats.get_mut(&role).expect("authorized");
                seat.mandate = Some(mandate);
                seat.policy_version += 1;
                let v = seat.policy_version;
                self.persist_policy(&role);
                self.broadcast_seats();
                Ok(obj([("policyVersion", Json::Number(v.into()))]))
            }
            ClientMsg::Scopes { role, scopes, .. } => {
                self.authorize(&principal, &role, Need::Own("scopes"))?;
                let methods = &self.methods[&role];
                if let Some((i, s)) = scopes
                    .iter()
                    .enumerate()
                    .find(|(_, s)| *s != SCOPE_ALL && !methods.iter().any(|m| &m.name == *s))
                {
                    return Err(err(
                        Code::Invalid,
                        format!("scopes[{i}]: {s:?} is not a control method of this seat"),
                    ));
                }
                let seat = self.seats.get_mut(&role).expect("authorized");
                seat.scopes = scopes;
                seat.policy_version += 1;
                let v = seat.policy_version;
                self.persist_policy(&role);
                self.broadcast_seats();
                Ok(obj([("policyVersion", Json::Number(v.into()))]))
            }
            ClientMsg::ResolveApproval {
                role, id, approve, ..
            } => {
                self.authorize(&principal, &role, Need::Own("resolveApproval"))?;
                self.resolve(&role, &id, approve)
            }
            ClientMsg::Controller {
                role, controller, ..
            } => {
                self.authorize(&principal, &role, Need::Own("controller"))?;
                let seat = self.seats.get_mut(&role).expect("authorized");
                seat.controller = controller;
                if controller != (Controller::Agent { supervised: true }) {
                    if let Some(id) = seat.pending.take() {
                        self.proposals.remove(&id);
                        self.outputs.push(Output::Persist(Record::Resolved {
                            id: id.clone(),
                            role: Some(role.clone()),
                        }));
                        self.remember(id, ProposalStatus::Rejected);
                    }
                }
                self.outputs.push(Output::Persist(Record::Controller {
                    role: role.clone(),
                    controller,
                }));
                self.refresh_agent_cards();
                self.broadcast_seats();
                self.broadcast_cards();
                Ok(obj([]))
            }
            ClientMsg::Mint { role, .. } => {
                self.authorize(&principal, &role, Need::Own("mint"))?;
                let team = self.seats[&role].team.clone();
                let token = self.mint(Principal::Seat {
                    r#match: self.id.clone(),
                    role,
                    team,
                })?;
                Ok(obj([("token", Json::string(token.as_str()))]))
            }
            ClientMsg::Tell {
                roles, text, ping, ..
            } => self.tell(&principal, roles, text, ping),
        }
    }

    /// Checks that `principal` may do an op needing `need` on seat `role`.
    fn authorize(
        &self,
        principal: &Principal,
        role: &str,
        need: Need,
    ) -> Result<(), ProtocolError> {
        // A finished match keeps what it recorded: no owner writes more.
        if let (Need::Own(op), true) = (need, self.finished) {
            return Err(err(Code::Paused, format!("{op}: the match is over")));
        }
        let seat = self.seats.get(role).ok_or_else(|| {
            err(
                Code::NotInMatch,
                format!("role: no seat {role:?} in this match"),
            )
        })?;
        match principal {
            Principal::Team { team, .. } if *team == seat.team => Ok(()),
            Principal::Team { .. } => Err(err(Code::Forbidden, "role: a seat of another team")),
            Principal::Human { role: own, .. } if own == role => Ok(()),
            Principal::Human { .. } => Err(err(Code::Forbidden, "role: a human token acts for its own seat only")),
            Principal::Seat { role: own, .. } => match need {
                Need::Own(op) => Err(err(
                    Code::Forbidden,
                    format!("{op}: owner only; a seat token cannot change controllers, mint or set policy"),
                )),
                Need::Play if own == role => Ok(()),
                Need::Play => Err(err(Code::Forbidden, "role: a seat token acts for its own seat only")),
            },
            Principal::Spectator { .. } => Err(err(Code::Forbidden, "op: spectators are read-only")),
            Principal::Observer { .. } => Err(err(Code::Forbidden, "op: observers are read-only")),
        }
    }

    fn call(
        &mut self,
        principal: &Principal,
        role: &str,
        method: &str,
        args: Json,
    ) -> Result<Json, ProtocolError> {
        self.authorize(principal, role, Need::Play)?;
        if self.finished {
            return Err(err(Code::Paused, "match: over"));
        }
        if self.paused {
            return Err(err(Code::Paused, "match: paused"));
        }
        if !self.methods[role].iter().any(|m| m.name == method) {
            return Err(err(
                Code::Invalid,
                format!("method: {method:?} is not a control method of this seat"),
            ));
        }
        let seat = &self.seats[role];
        if let Principal::Seat { .. } = principal {
            let supervised = match seat.controller {
                Controller::Human => {
                    return Err(err(
                        Code::Forbidden,
                        "role: this seat is played by a human, not an agent",
                    ))
                }
                Controller::Agent { supervised } => supervised,
            };
            if !seat.scopes.iter().any(|s| s == SCOPE_ALL || s == method) {
                return Err(err(
                    Code::OutOfScope,
                    format!("method: {method:?} is outside this seat's scopes"),
                ));
            }
            if supervised {
                if seat.pending.is_some() {
                    return Err(err(
                        Code::ApprovalPending,
                        "role: a proposal of this seat waits for its owner",
                    ));
                }
                self.next_proposal += 1;
                let id = format!("p{}", self.next_proposal);
                self.outputs.push(Output::Persist(Record::Proposal {
                    id: id.clone(),
                    role: role.to_owned(),
                    method: method.to_owned(),
                    args: args.clone(),
                }));
                self.proposals.insert(
                    id.clone(),
                    Proposal {
                        role: role.to_owned(),
                        method: method.to_owned(),
                        args,
                    },
                );
                self.seats.get_mut(role).expect("exists").pending = Some(id.clone());
                self.broadcast_seats();
                return Ok(obj([
                    ("proposal", Json::string(&id)),
                    ("status", Json::string("pending")),
                ]));
            }
        }
        let result = self
            .game
            .call(role, method, &args)
            .map_err(|e| err(Code::Invalid, format!("args: {e}")))?;
        self.guarded(result)
    }

    fn resolve(&mut self, role: &str, id: &str, approve: bool) -> Result<Json, ProtocolError> {
        let matches = self.proposals.get(id).is_some_and(|p| p.role == role);
        if !matches {
            return Err(err(
                Code::ApprovalNotFound,
                format!("id: no pending proposal {id:?} for this seat"),
            ));
        }
        if approve && (self.paused || self.finished) {
            return Err(err(
                Code::Paused,
                "match: not running; the proposal stays pending",
            ));
        }
        let p = self.proposals.remove(id).expect("checked");
        self.seats.get_mut(role).expect("exists").pending = None;
        self.outputs.push(Output::Persist(Record::Resolved {
            id: id.to_owned(),
            role: Some(role.to_owned()),
        }));
        self.broadcast_seats();
        if !approve {
            self.remember(id.to_owned(), ProposalStatus::Rejected);
            return Ok(obj([("status", Json::string("rejected"))]));
        }
        match self.game.call(&p.role, &p.method, &p.args) {
            Err(e) => {
                self.remember(id.to_owned(), ProposalStatus::Failed(e.0.clone()));
                Err(err(
                    Code::ApprovalFailed,
                    format!("id: the game refused the proposal: {e}"),
                ))
            }
            Ok(result) => {
                let result = self.guarded(result)?;
                self.remember(id.to_owned(), ProposalStatus::Applied(result.clone()));
                Ok(obj([
                    ("status", Json::string("applied")),
                    ("result", result),
                ]))
            }
        }
    }

    fn remember(&mut self, id: String, status: ProposalStatus) {
        if self.resolved.len() >= MAX_RESOLVED_PROPOSALS {
            self.resolved.pop_front();
        }
        self.resolved.push_back((id, status));
    }

    fn tell(
        &mut self,
        principal: &Principal,
        roles: Roles,
        text: String,
        ping: Option<Json>,
    ) -> Result<Json, ProtocolError> {
        if !self.config.chat {
            return Err(err(
                Code::ModeUnavailable,
                "tell: this match is not in chat mode",
            ));
        }
        let tick = self.game.tick();
        match principal {
            // An agent's reply goes to its team's owners only, as plain text.
            Principal::Seat { role, team, .. } => {
                let said: Arc<str> = ServerMsg::Said {
                    role: role.clone(),
                    text: text.clone(),
                    tick,
                }
                .to_text()
                .into();
                let owners: Vec<ConnId> = self.owners_of(team).collect();
                for c in owners {
                    self.send(c, said.clone());
                }
                self.outputs.push(Output::Persist(Record::Chat {
                    team: team.clone(),
                    role: role.clone(),
                    from: ChatFrom::Agent,
                    text,
                    tick,
                }));
                Ok(obj([]))
            }
            Principal::Team { team, .. } | Principal::Human { team, .. } => {
                let targets: Vec<String> = match (&roles, principal) {
                    (Roles::All, Principal::Human { role, .. }) => vec![role.clone()],
                    // "all" means every seat of the team an agent plays.
                    (Roles::All, _) => self
                        .seats
                        .iter()
                        .filter(|(_, s)| s.team == *team && s.controller != Controller::Human)
                        .map(|(r, _)| r.clone())
                        .collect(),
                    (Roles::Some(list), _) => list.clone(),
                };
                if targets.is_empty() {
                    return Err(err(
                        Code::ModeUnavailable,
                        "roles: no seat of this team is played by an agent",
                    ));
                }
                for (i, r) in targets.iter().enumerate() {
                    self.authorize(principal, r, Need::Play)
                        .map_err(|e| err(e.code, format!("roles[{i}]: {}", e.message)))?;
                    let s = &self.seats[r];
                    if s.controller == Controller::Human {
                        return Err(err(
                            Code::ModeUnavailable,
                            format!("roles[{i}]: {r:?} is not played by an agent"),
                        ));
                    }
                    if s.inbox.len() >= MAX_INBOX_PER_SEAT {
                        return Err(err(
                            Code::Busy,
                            format!("roles[{i}]: {r:?} has MAX_INBOX_PER_SEAT tells waiting"),
                        ));
                    }
                }
                for r in &targets {
                    let told = Told {
                        role: r.clone(),
                        text: text.clone(),
                        ping: ping.clone(),
                        tick,
                    };
                    self.seats
                        .get_mut(r)
                        .expect("authorized")
                        .inbox
                        .push_back(told.clone());
                    self.outputs.push(Output::Told(told));
                    self.outputs.push(Output::Persist(Record::Chat {
                        team: team.clone(),
                        role: r.clone(),
                        from: ChatFrom::Owner,
                        text: text.clone(),
                        tick,
                    }));
                }
                Ok(obj([("delivered", Json::Number(targets.len().into()))]))
            }
            _ => Err(err(Code::Forbidden, "tell: owners and agents only")),
        }
    }

    fn watch(&mut self, conn: ConnId, w: WatchMsg) -> Result<(), ProtocolError> {
        let c = &self.conns[&conn];
        let Principal::Spectator { team: only, .. } = &c.principal else {
            return Err(err(Code::Forbidden, "op: watch is for spectator tokens"));
        };
        for (i, t) in w.teams.iter().enumerate() {
            if !self.teams.contains(t) {
                return Err(err(Code::NotInMatch, format!("teams[{i}]: no team {t:?}")));
            }
            if only.as_ref().is_some_and(|o| o != t) {
                return Err(err(
                    Code::Forbidden,
                    format!("teams[{i}]: this spectator may watch its own team only"),
                ));
            }
        }
        let before = c.watching.clone();
        let now: Watching = w.teams.into_iter().collect();
        self.conns.get_mut(&conn).expect("joined").watching = now.clone();
        for t in now.iter().filter(|t| !before.contains(t)) {
            self.send_keyframe(conn, t);
        }
        self.send_seats_to(conn);
        Ok(())
    }

    fn guarded(&mut self, data: Json) -> Result<Json, ProtocolError> {
        match self.vocabulary.guard(&data) {
            Ok(()) => Ok(data),
            Err(v) => {
                self.outputs.push(Output::GuardViolation(v));
                Err(err(
                    Code::Internal,
                    "result: withheld by the closed-vocabulary guard",
                ))
            }
        }
    }

    // ----- time -----

    /// Advances the game one tick at `now`: views, stream pushes, records,
    /// outcomes and reports, then observer frames that are due.
    pub fn tick(&mut self, now: u64) {
        if self.paused || self.finished {
            self.poll_observers(now);
            return;
        }
        self.game.advance();
        let tick = self.game.tick();
        self.publish_views();
        self.push_streams(tick);
        self.check_outcomes();
        if tick.is_multiple_of(self.config.record_every_ticks) || self.finished {
            self.record(now);
        }
        if self.finished {
            self.finished_at = Some(now);
            self.feed.close();
        }
        self.poll_observers(now);
    }

    /// Sends every observer frame released by `now`.
    pub fn poll_observers(&mut self, now: u64) {
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.observer.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.poll_observer(id, now);
        }
    }

    fn poll_observer(&mut self, conn: ConnId, now: u64) {
        let Some(cursor) = self.conns.get_mut(&conn).and_then(|c| c.observer.as_mut()) else {
            return;
        };
        let sends = cursor.poll(&mut self.feed, now);
        for s in sends {
            self.outputs.push(Output::Send {
                conn,
                text: s.text().clone(),
            });
        }
    }

    /// When an observer frame is next due: call [`Match::poll_observers`] then.
    pub fn next_timeout(&self) -> Option<u64> {
        self.conns
            .values()
            .filter_map(|c| c.observer.as_ref())
            .filter_map(|o| o.next_release_at(&self.feed))
            .min()
    }

    fn record(&mut self, now: u64) {
        self.recordings += 1;
        self.outputs.push(Output::Persist(Record::State {
            tick: self.game.tick(),
            recorded_at: now,
            state: self.game.save(),
            recording: Some(self.recordings),
        }));
        self.record_frames(now);
    }

    /// Every team's perspective, then the omniscient one.
    fn perspectives(&self) -> Vec<String> {
        self.teams
            .iter()
            .cloned()
            .chain([OMNISCIENT.to_owned()])
            .collect()
    }

    fn record_frames(&mut self, now: u64) {
        let tick = self.game.tick();
        let outcomes = (!self.outcomes.is_empty()).then(|| self.outcomes.clone());
        // Each frame carries what its perspective may see; a perspective
        // whose world is withheld this time loses its share.
        let commentary = std::mem::take(&mut self.commentary);
        for p in self.perspectives() {
            let world = self.game.project_observer(if p == OMNISCIENT {
                Perspective::Omniscient
            } else {
                Perspective::Team(&p)
            });
            match self.vocabulary.guard(&world) {
                Ok(()) => {
                    let seen = commentary.iter().filter(|c| sees(&p, c)).cloned().collect();
                    self.feed
                        .record(&p, tick, now, world, outcomes.clone(), seen)
                }
                Err(v) => self.outputs.push(Output::GuardViolation(v)),
            }
        }
    }

    fn publish_views(&mut self) {
        for t in self.teams.clone() {
            let view = self.game.project_team(&t);
            if let Err(v) = self.vocabulary.guard(&view) {
                self.outputs.push(Output::GuardViolation(v));
                continue;
            }
            let Some(frame) = self.views.get_mut(&t).and_then(|s| s.publish(view)) else {
                continue;
            };
            let readers: Vec<ConnId> = self.readers_of(&t).collect();
            for c in readers {
                self.send(c, frame.text.clone());
            }
        }
    }

    fn push_streams(&mut self, tick: u64) {
        let mut due = Vec::new();
        for (id, c) in &self.conns {
            for (role, s) in &c.streams {
                if tick.is_multiple_of(s.every_ticks) {
                    due.push((*id, role.clone(), s.detail.clone()));
                }
            }
        }
        for (conn, role, detail) in due {
            let data = self.game.observe(&role, detail.as_ref());
            match self.vocabulary.guard(&data) {
                Ok(()) => self.send(conn, ServerMsg::Obs { role, data }.to_text().into()),
                Err(v) => self.outputs.push(Output::GuardViolation(v)),
            }
        }
    }

    fn check_outcomes(&mut self) {
        let outcomes = self.game.outcomes();
        if outcomes.is_empty() {
            return;
        }
        if *self.outcomes != outcomes {
            self.outcomes = Arc::new(outcomes.clone());
        }
        for team in outcomes.keys() {
            if !self.reported.insert(team.clone()) {
                continue;
            }
            let data = self.game.report(team);
            match self.vocabulary.guard(&data) {
                Ok(()) => {
                    let text: Arc<str> = ServerMsg::Report {
                        team: team.clone(),
                        data,
                    }
                    .to_text()
                    .into();
                    let readers: Vec<ConnId> = self.readers_of(team).collect();
                    for c in readers {
                        self.send(c, text.clone());
                    }
                }
                Err(v) => self.outputs.push(Output::GuardViolation(v)),
            }
        }
        if self.teams.iter().all(|t| outcomes.contains_key(t)) {
            self.finished = true;
        }
    }

    // ----- recipients and messages -----

    fn send(&mut self, conn: ConnId, text: Arc<str>) {
        self.outputs.push(Output::Send { conn, text });
    }

    /// Owners of `team` and spectators watching it.
    fn readers_of<'a>(&'a self, team: &'a str) -> impl Iterator<Item = ConnId> + 'a {
        self.conns.iter().filter_map(move |(id, c)| {
            let reads = match &c.principal {
                Principal::Team { .. } | Principal::Human { .. } | Principal::Spectator { .. } => {
                    c.watching.contains(team)
                }
                _ => false,
            };
            reads.then_some(*id)
        })
    }

    fn owners_of<'a>(&'a self, team: &'a str) -> impl Iterator<Item = ConnId> + 'a {
        self.conns
            .iter()
            .filter_map(move |(id, c)| match &c.principal {
                Principal::Team { team: t, .. } | Principal::Human { team: t, .. } if t == team => {
                    Some(*id)
                }
                _ => None,
            })
    }

    fn send_keyframe(&mut self, conn: ConnId, team: &str) {
        if let Some(k) = self.views.get_mut(team).and_then(ViewStream::keyframe) {
            self.send(conn, k.text.clone());
        }
    }

    fn seat_info(&self, role: &str, s: &Seat) -> SeatInfo {
        let live = self
            .conns
            .values()
            .any(|c| matches!(&c.principal, Principal::Seat { role: r, .. } if r == role));
        SeatInfo {
            role: role.to_owned(),
            team: s.team.clone(),
            controller: s.controller,
            live,
            policy_version: s.policy_version,
            scopes: s.scopes.clone(),
            pending_approval: s.pending.clone(),
        }
    }

    fn send_seats_to(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let seats: Vec<SeatInfo> = self
            .seats
            .iter()
            .filter(|(_, s)| c.watching.contains(&s.team))
            .map(|(r, s)| self.seat_info(r, s))
            .collect();
        self.send(conn, ServerMsg::Seats { seats }.to_text().into());
    }

    fn broadcast_seats(&mut self) {
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.watching.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.send_seats_to(id);
        }
    }

    fn cards(&self) -> Vec<PublicSeatCard> {
        self.seats
            .iter()
            .map(|(r, s)| PublicSeatCard {
                team: s.team.clone(),
                role: r.clone(),
                controller: match s.controller {
                    Controller::Human => "human".into(),
                    Controller::Agent { .. } => "agent".into(),
                },
                card: s.card.clone(),
            })
            .collect()
    }

    fn send_cards_to(&mut self, conn: ConnId) {
        let text = ServerMsg::Cards {
            cards: self.cards(),
        }
        .to_text();
        self.send(conn, text.into());
    }

    fn broadcast_cards(&mut self) {
        let text: Arc<str> = ServerMsg::Cards {
            cards: self.cards(),
        }
        .to_text()
        .into();
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                matches!(
                    c.principal,
                    Principal::Team { .. } | Principal::Human { .. } | Principal::Spectator { .. }
                )
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.send(id, text.clone());
        }
    }

    fn refresh_agent_cards(&mut self) {
        let cards = self
            .seats
            .iter()
            .filter(|(_, s)| matches!(s.controller, Controller::Agent { .. }))
            .filter_map(|(r, s)| {
                s.card.clone().map(|card| ObserverAgentCard {
                    team: s.team.clone(),
                    role: r.clone(),
                    card,
                })
            })
            .collect();
        self.feed.set_agent_cards(cards);
    }

    fn persist_policy(&mut self, role: &str) {
        let s = &self.seats[role];
        self.outputs.push(Output::Persist(Record::Policy {
            role: role.to_owned(),
            policy_version: s.policy_version,
            scopes: s.scopes.clone(),
            mandate: s.mandate.clone(),
        }));
    }
}

#[cfg(test)]
mod watching_tests {
    use super::Watching;

    #[test]
    fn a_connection_watches_each_team_once_in_order_in_one_slot_each() {
        let w: Watching = ["red", "blue", "red"]
            .map(String::from)
            .into_iter()
            .collect();
        let teams: Vec<&str> = w.iter().map(String::as_str).collect();
        assert_eq!(teams, ["blue", "red"]);
        assert!(w.contains("red") && w.contains("blue") && !w.contains("green"));
        assert!(!w.is_empty() && Watching::default().is_empty());
        let mut one = Watching::default();
        one.insert("red".into());
        assert_eq!(one.0.capacity(), 1, "a spectator's one team is one slot");
    }

    /// The match holds one per connection (every spectator): its observer
    /// cursor boxed, its teams a list.
    #[test]
    fn a_connection_entry_stays_within_208_bytes() {
        let size = std::mem::size_of::<super::Conn>();
        assert!(size <= 208, "Conn is {size} bytes");
    }
}
