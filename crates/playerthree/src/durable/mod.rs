//! A match with its durability rules and its timers, sans-IO:
//! [`DurableMatch`] wraps a [`Match`] the way a server drives it, so that
//! what the store must keep before it is told is told only once durable.
//!
//! - A command's records are handed out as writes ([`DurableMatch::poll_write`])
//!   and each write is answered ([`DurableMatch::ack`]).
//! - At a [`Output::Durable`] (an owner's `mint`, `mandate`, `scopes`,
//!   `controller`) the records before it are one write, and the frames
//!   before it, its reply and everything after it are held until that write
//!   is answered; meanwhile the match takes no command and keeps no time
//!   (its commands wait in the driver's bounded queue). Durable: they are
//!   released. Refused: the frames that told of the change are dropped
//!   (closes still happen), the change is taken back ([`Match::not_stored`])
//!   and the asker gets `internal`.
//! - The operator's `mint` and card answer once their records are durable,
//!   without holding the match up meanwhile: several such writes may be in
//!   flight. A refused one is answered `internal`.
//! - Every other record is written behind: what it told goes out at once.
//! - Time: ticks at the configured rate (catching up at most
//!   [`MAX_CATCH_UP_TICKS`]), delayed observer frames when due, the end of
//!   an idle MCP presence, and the match's expiry (`finished_ttl_ms` after
//!   it finished, or `unjoined_ttl_ms` after it started here while nobody
//!   joined), through [`DurableMatch::poll_timeout`] and
//!   [`DurableMatch::handle_timeout`].
//!
//! The MCP side keeps its sessions here too ([`sessions`]): one host
//! connection per seat token however many sessions it opens, the view and
//! inbox subscriptions, and one push of tells in flight per session.

mod sessions;
#[cfg(test)]
mod tests;

use crate::game::{ControlMethod, Game};
use crate::host::{Match, Output, ProposalStatus, Record, Told, Undo};
use crate::protocol::{
    Disclosure, EntrantCard, Principal, ProtocolError, ResultMsg, ServerErrorCode, ServerMsg,
};
use crate::tokens::TokenHash;
use crate::{ClientMsg, ConnId, Json};
use sessions::Sessions;
use std::collections::VecDeque;
use std::sync::Arc;

/// Ticks run at once to catch up after the clock jumped; later ones are
/// skipped.
pub const MAX_CATCH_UP_TICKS: u64 = 64;

/// Milliseconds a seat token's MCP presence outlasts its last session, so
/// an agent that opens a session per request does not flip the seat's
/// `live` (and push `seats` to every watcher) on each.
pub const MCP_LIVE_GRACE_MS: u64 = 30_000;

/// The match's times, as the server configures them (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchTimes {
    /// Between two ticks.
    pub tick_ms: u64,
    /// From the match's finish to its removal.
    pub finished_ttl_ms: u64,
    /// From its creation (or restore) to its removal while nobody joined.
    pub unjoined_ttl_ms: u64,
    /// How long an MCP presence outlasts its last session.
    pub mcp_live_grace_ms: u64,
}

/// An MCP agent's seat, as its session is bound to it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeatBinding {
    pub match_id: String,
    pub role: String,
    pub team: String,
    pub methods: Vec<ControlMethod>,
}

/// What the driver asks of a match. `S` is the text of a socket's message
/// (the server's frame, not copied).
#[derive(Debug, Clone)]
pub enum MatchCommand<S = String> {
    /// A socket joins with its token.
    Join {
        conn: ConnId,
        token: String,
    },
    /// A socket's text message.
    Text {
        conn: ConnId,
        text: S,
    },
    /// A socket or an MCP session is gone.
    Leave {
        conn: ConnId,
    },
    /// The operator mints a token: answered once durable.
    Mint {
        principal: Principal,
    },
    /// The operator revokes a token.
    Revoke {
        token: String,
    },
    /// The operator sets (or, with `None`, clears) a seat's card: answered
    /// once durable.
    SetCard {
        role: String,
        card: Option<EntrantCard>,
    },
    /// An MCP session joins with a seat token. `conn` names the session;
    /// the first session of a token also names the token's presence (the
    /// host connection all its sessions act through).
    McpJoin {
        conn: ConnId,
        token: String,
    },
    /// Whether a token is, now, a seat token of this match.
    McpCheck {
        token: String,
    },
    McpCall {
        conn: ConnId,
        msg: ClientMsg,
    },
    McpView {
        team: String,
    },
    /// A session is told (or, `on: false`, no longer) when its team's
    /// view changes.
    McpSubscribe {
        conn: ConnId,
        team: String,
        on: bool,
    },
    McpInbox {
        role: String,
    },
    McpPeekInbox {
        role: String,
    },
    /// A push of tells to this session is done.
    McpPushed {
        conn: ConnId,
    },
    /// A session has its seat's tells pushed (or, `on: false`, no longer).
    McpSubscribeInbox {
        conn: ConnId,
        role: String,
        on: bool,
    },
    McpProposal {
        id: String,
    },
    McpIsAgent {
        role: String,
    },
    McpDisclose {
        conn: ConnId,
        disclosure: Disclosure,
    },
    /// Runs the due work at `now` (after a manual clock moved).
    Wake,
    /// The server is going away: the driver closes every socket (1001);
    /// the match stays stored.
    Shutdown,
}

/// The answer to a command, beside its outputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    None,
    /// A socket's join: its first frame (a `result` with seq 0 and the
    /// token's principal), to go before the join's own frames.
    Joined(ConnId, Result<Arc<str>, ProtocolError>),
    /// `conn` is gone: nothing more goes to it from here.
    Left(ConnId),
    Minted(Result<String, ProtocolError>),
    Revoked(bool),
    Card(Result<(), ProtocolError>),
    McpJoined(ConnId, Result<SeatBinding, ProtocolError>),
    Checked(Result<(), ProtocolError>),
    Called(ServerMsg),
    View(Option<Json>),
    /// A session's view subscription is set (`true`) or gone.
    Subscribed(ConnId, bool),
    Tells(Vec<Told>),
    /// A session's inbox subscription is set (`true`) or gone.
    InboxSubscribed(ConnId, bool),
    Proposal(Option<ProposalStatus>),
    IsAgent(bool),
    Disclosed(Result<Json, ProtocolError>),
    Woken,
    Shutdown,
}

/// What the driver carries out, in order.
#[derive(Debug, Clone)]
pub enum MatchOutput {
    /// A host output: `Send`, `Close` or `GuardViolation` (records come
    /// out as writes, tells as [`MatchOutput::PushTells`]).
    Host(Output),
    /// A token was minted: found by its text from now on.
    Minted(TokenHash),
    /// A seat's controller changed: its sessions' tool list did.
    ControllerChanged(String),
    /// A team's view changed: tell these sessions.
    ViewChanged { team: String, conns: Vec<ConnId> },
    /// Push these tells to these sessions; each answers
    /// [`MatchCommand::McpPushed`] when done.
    PushTells {
        conns: Vec<ConnId>,
        tells: Arc<[Told]>,
    },
    /// An MCP session acts no more (its token's presence was closed).
    SessionEnded(ConnId),
    /// The match expired: close every connection (1000) and forget it;
    /// its removal is the last write.
    Expired { joined: bool },
}

/// One command's (or timer's) outputs, released once what they told of is
/// durable.
#[derive(Debug)]
pub struct Done<T> {
    /// What the driver gave with the command (`None`: the timer's).
    pub tag: Option<T>,
    pub outputs: Vec<MatchOutput>,
    pub answer: Answer,
}

/// One change the store keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Record(Record),
    /// The expired match's rows are deleted.
    RemoveMatch,
}

/// Names a write until its acknowledgement comes back.
pub type WriteId = u64;

/// Changes to persist as one unit (all or nothing), in the match's order.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingWrite {
    pub id: WriteId,
    pub changes: Vec<Change>,
}

/// What a write in flight was for.
enum Flight<T> {
    /// Written behind: nothing waits for it.
    Behind,
    /// Held the match's outputs: the pending change.
    Durable,
    /// An operator's change: its answer, or the refusal's.
    Answer {
        tag: Option<T>,
        ok: Box<Answer>,
        refused: Box<Answer>,
    },
}

/// The change whose records are being written, and what waits for it.
struct Pending<T> {
    write: WriteId,
    /// Released once the write is answered; its outputs are those before
    /// the change's segment.
    done: Done<T>,
    /// The segment's frames and closes: sent if durable, closes only if not.
    held: Vec<Output>,
    conn: ConnId,
    text: Arc<str>,
    otherwise: Arc<str>,
    undo: Undo,
}

/// A [`Match`] driven so that what must be durable first is told only
/// once stored. `T` is whatever the driver carries with a command, given
/// back with its outputs.
pub struct DurableMatch<G: Game, T> {
    m: Match<G>,
    times: MatchTimes,
    next_tick: u64,
    /// When this match started here (created or restored).
    started_at: u64,
    /// Whether a socket or an MCP session has joined since.
    joined: bool,
    expired: bool,
    /// The last time the timer was handled: the next is later, however
    /// the match's own times stand.
    timer_at: Option<u64>,
    sessions: Sessions,
    /// Host outputs behind a pending change, not yet looked at.
    rest: Vec<Output>,
    pending: Option<Pending<T>>,
    /// Commands that came while a change was pending (a driver that asks
    /// [`DurableMatch::accepts`] sends none).
    held: VecDeque<(MatchCommand<String>, Option<T>)>,
    ready: VecDeque<Done<T>>,
    writes: VecDeque<PendingWrite>,
    in_flight: Vec<(WriteId, Flight<T>)>,
    next_write: WriteId,
}

impl<G: Game, T> DurableMatch<G, T> {
    /// Drives `m` from `now`; what it has to do already (a restore's
    /// records) is handed out at once.
    pub fn new(m: Match<G>, times: MatchTimes, now: u64) -> Self {
        let mut d = DurableMatch {
            m,
            next_tick: now.saturating_add(times.tick_ms),
            times,
            started_at: now,
            joined: false,
            expired: false,
            timer_at: None,
            sessions: Sessions::default(),
            rest: Vec::new(),
            pending: None,
            held: VecDeque::new(),
            ready: VecDeque::new(),
            writes: VecDeque::new(),
            in_flight: Vec::new(),
            next_write: 1,
        };
        d.finish(Done {
            tag: None,
            outputs: Vec::new(),
            answer: Answer::None,
        });
        d
    }

    /// The match, with a pending change applied.
    pub fn game_match(&self) -> &Match<G> {
        &self.m
    }

    pub fn id(&self) -> &str {
        self.m.id()
    }

    /// Whether the match takes another command now: not while a change
    /// is pending.
    pub fn accepts(&self) -> bool {
        self.pending.is_none() && !self.expired
    }

    pub fn is_expired(&self) -> bool {
        self.expired
    }

    /// The next changes to persist, in order; each is answered with
    /// [`DurableMatch::ack`].
    pub fn poll_write(&mut self) -> Option<PendingWrite> {
        self.writes.pop_front()
    }

    /// The next command's outputs, in order.
    pub fn poll_output(&mut self) -> Option<Done<T>> {
        self.ready.pop_front()
    }

    /// When [`DurableMatch::handle_timeout`] is due: the next tick, the
    /// next observer release, the end of an idle MCP presence or the
    /// match's expiry. None while a change is pending (time waits for the
    /// store) or once expired.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.pending.is_some() || self.expired {
            return None;
        }
        let at = [
            Some(self.next_tick),
            self.m.next_timeout(),
            self.expires_at(),
            self.sessions.presence_ends_at(self.times.mcp_live_grace_ms),
        ]
        .into_iter()
        .flatten()
        .min()?;
        // Never twice at one time: what is due then was done.
        Some(self.timer_at.map_or(at, |t| at.max(t + 1)))
    }

    /// Does what is due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.pending.is_some() || self.expired {
            return;
        }
        self.timer_at = Some(now);
        let mut done = Done {
            tag: None,
            outputs: Vec::new(),
            answer: Answer::None,
        };
        self.due(now, &mut done);
        self.finish(done);
    }

    /// Handles a command at `now`; `tag` comes back with its outputs.
    pub fn handle<S: std::ops::Deref<Target = str>>(
        &mut self,
        cmd: MatchCommand<S>,
        tag: Option<T>,
        now: u64,
    ) {
        if self.expired {
            // Gone: nothing changes; whoever asked hears nothing more.
            return;
        }
        if self.pending.is_some() {
            let cmd = owned(cmd);
            return self.held.push_back((cmd, tag));
        }
        self.run(cmd, tag, now);
    }

    /// The store's answer to write `id`: `durable`, or refused.
    pub fn ack(&mut self, id: WriteId, durable: bool, now: u64) {
        let Some(i) = self.in_flight.iter().position(|(w, _)| *w == id) else {
            return;
        };
        match self.in_flight.remove(i).1 {
            // A record written behind is the store writer's to count.
            Flight::Behind => {}
            Flight::Answer { tag, ok, refused } => self.ready.push_back(Done {
                tag,
                outputs: Vec::new(),
                answer: *if durable { ok } else { refused },
            }),
            Flight::Durable => {
                let Some(p) = self.pending.take() else { return };
                debug_assert_eq!(p.write, id, "one change is pending at a time");
                let mut done = p.done;
                if durable {
                    self.release(p.held, &mut done.outputs);
                    done.outputs.push(MatchOutput::Host(Output::Send {
                        conn: p.conn,
                        text: p.text,
                    }));
                } else {
                    // Closes still happen; what told of the change does not.
                    let closes = p
                        .held
                        .into_iter()
                        .filter(|o| matches!(o, Output::Close { .. }))
                        .collect();
                    self.release(closes, &mut done.outputs);
                    self.m.not_stored(p.undo);
                    done.outputs.push(MatchOutput::Host(Output::Send {
                        conn: p.conn,
                        text: p.otherwise,
                    }));
                    if let Answer::Called(ServerMsg::Result(r)) = &mut done.answer {
                        *r = refused_result(r.seq);
                    }
                }
                self.finish(done);
                while self.pending.is_none() && !self.expired {
                    let Some((cmd, tag)) = self.held.pop_front() else {
                        break;
                    };
                    self.run(cmd, tag, now);
                }
            }
        }
    }

    /// Handles a command on the match as it is (nothing pending).
    fn run<S: std::ops::Deref<Target = str>>(
        &mut self,
        cmd: MatchCommand<S>,
        tag: Option<T>,
        now: u64,
    ) {
        let mut done = Done {
            tag,
            outputs: Vec::new(),
            answer: Answer::None,
        };
        done.answer = match cmd {
            MatchCommand::Join { conn, token } => self.join(conn, &token, now),
            MatchCommand::Text { conn, text } => {
                self.m.handle_message(conn, &text, now);
                Answer::None
            }
            MatchCommand::Leave { conn } => {
                self.leave(conn, now);
                Answer::Left(conn)
            }
            MatchCommand::Mint { principal } => {
                let r = self.m.mint(principal).map(|t| t.as_str().to_owned());
                let refused = "store: the token was not stored";
                return self.answer_once_stored(done, r, Answer::Minted, refused);
            }
            MatchCommand::Revoke { token } => Answer::Revoked(self.m.revoke(&token)),
            MatchCommand::SetCard { role, card } => {
                let r = self.m.set_card(&role, card);
                let refused = "store: the card was not stored";
                return self.answer_once_stored(done, r, Answer::Card, refused);
            }
            MatchCommand::Wake => {
                self.due(now, &mut done);
                Answer::Woken
            }
            MatchCommand::Shutdown => Answer::Shutdown,
            cmd => self.mcp(cmd, &mut done, now),
        };
        self.finish(done);
    }

    /// A socket joins with its token.
    fn join(&mut self, conn: ConnId, token: &str, now: u64) -> Answer {
        let r = self.m.connect(conn, token, now).and_then(|()| {
            let p = self.m.principal(token)?;
            let data = serde_json::to_value(p).unwrap_or_default();
            Ok(Arc::from(ServerMsg::ok(0, Json::from(data)).to_text()))
        });
        self.joined |= r.is_ok();
        Answer::Joined(conn, r)
    }

    /// A socket or an MCP session is gone.
    fn leave(&mut self, conn: ConnId, now: u64) {
        self.sessions.forget(conn);
        if !self.sessions.leave(conn, now) {
            self.m.disconnect(conn);
        }
    }

    /// An operator's change: what it told goes now; its answer waits for
    /// its records, without holding the match up meanwhile.
    fn answer_once_stored<V>(
        &mut self,
        mut done: Done<T>,
        r: Result<V, ProtocolError>,
        answer: fn(Result<V, ProtocolError>) -> Answer,
        refused: &'static str,
    ) {
        let Ok(v) = r else {
            done.answer = answer(r);
            return self.finish(done);
        };
        let tag = done.tag.take();
        let records = self.drain(&mut done);
        let refused = answer(Err(ProtocolError::new(ServerErrorCode::Internal, refused)));
        self.write(
            records,
            Flight::Answer {
                tag,
                ok: Box::new(answer(Ok(v))),
                refused: Box::new(refused),
            },
        );
        self.ready.push_back(done);
    }

    /// Ticks that are due (catching up at most [`MAX_CATCH_UP_TICKS`]),
    /// observer frames released by `now`, MCP presences idle for their
    /// grace, and the match's expiry.
    fn due(&mut self, now: u64, done: &mut Done<T>) {
        let tick_ms = self.times.tick_ms.max(1);
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
            self.sessions.views_changed(&self.m, &mut done.outputs);
        }
        for conn in self.sessions.end_idle(now, self.times.mcp_live_grace_ms) {
            self.m.disconnect(conn);
        }
        if self.expires_at().is_some_and(|t| now >= t) {
            self.expire(done);
        }
    }

    /// When the match is removed: `finished_ttl_ms` after it finished,
    /// or `unjoined_ttl_ms` after it started here while nobody joined.
    fn expires_at(&self) -> Option<u64> {
        let finished = self
            .m
            .finished_at()
            .map(|t| t.saturating_add(self.times.finished_ttl_ms));
        let unjoined =
            (!self.joined).then(|| self.started_at.saturating_add(self.times.unjoined_ttl_ms));
        finished.into_iter().chain(unjoined).min()
    }

    /// The expired match: what it still had to say goes (its records
    /// written behind), then its removal; nothing more after.
    fn expire(&mut self, done: &mut Done<T>) {
        let records = self.drain(done);
        self.write(records, Flight::Behind);
        self.write(vec![Change::RemoveMatch], Flight::Behind);
        self.sessions = Sessions::default();
        self.expired = true;
        done.outputs.push(MatchOutput::Expired {
            joined: self.joined,
        });
    }

    /// Looks at the host's outputs: records written (behind, or as one
    /// write at a change that waits for them), the rest released in order.
    /// `done` is released once nothing in it waits.
    fn finish(&mut self, mut done: Done<T>) {
        if self.expired {
            return self.ready.push_back(done);
        }
        loop {
            self.rest.extend(self.m.take_outputs());
            if self.rest.is_empty() {
                break;
            }
            let mut records = Vec::new();
            let mut segment = Vec::new();
            let mut outputs = std::mem::take(&mut self.rest).into_iter();
            while let Some(o) = outputs.next() {
                match o {
                    Output::Persist(r) => {
                        note(&r, &mut done.outputs);
                        records.push(Change::Record(r));
                    }
                    Output::Durable {
                        conn,
                        text,
                        otherwise,
                        undo,
                    } => {
                        let write = self.write(records, Flight::Durable);
                        self.rest = outputs.collect();
                        self.pending = Some(Pending {
                            write,
                            done,
                            held: segment,
                            conn,
                            text,
                            otherwise,
                            undo,
                        });
                        return;
                    }
                    o => segment.push(o),
                }
            }
            self.release(segment, &mut done.outputs);
            self.write(records, Flight::Behind);
        }
        self.ready.push_back(done);
    }

    /// Every output the host has now, released, and its records (for a
    /// write the caller makes): for what holds nothing back.
    fn drain(&mut self, done: &mut Done<T>) -> Vec<Change> {
        let mut records = Vec::new();
        loop {
            let outputs = self.m.take_outputs();
            if outputs.is_empty() {
                return records;
            }
            let mut segment = Vec::new();
            for o in outputs {
                match o {
                    Output::Persist(r) => {
                        note(&r, &mut done.outputs);
                        records.push(Change::Record(r));
                    }
                    // Only an owner's op makes one; none is drained.
                    Output::Durable { conn, text, .. } => {
                        segment.push(Output::Send { conn, text });
                    }
                    o => segment.push(o),
                }
            }
            self.release(segment, &mut done.outputs);
        }
    }

    /// Releases frames and closes: a close ends the MCP sessions acting
    /// through it; tells go to the subscribed sessions.
    fn release(&mut self, outputs: Vec<Output>, out: &mut Vec<MatchOutput>) {
        let mut told: Vec<String> = Vec::new();
        for o in outputs {
            match o {
                Output::Told(t) => told.push(t.role),
                Output::Close { conn, .. } => {
                    self.sessions.closed(conn, out);
                    out.push(MatchOutput::Host(o));
                }
                o => out.push(MatchOutput::Host(o)),
            }
        }
        told.dedup();
        for role in told {
            self.sessions.push_tells(&mut self.m, &role, out);
        }
    }

    fn write(&mut self, changes: Vec<Change>, flight: Flight<T>) -> WriteId {
        let id = self.next_write;
        if changes.is_empty() && matches!(flight, Flight::Behind) {
            return id;
        }
        self.next_write += 1;
        self.writes.push_back(PendingWrite { id, changes });
        self.in_flight.push((id, flight));
        id
    }
}

/// What the driver is told of a record beside writing it.
fn note(r: &Record, out: &mut Vec<MatchOutput>) {
    match r {
        Record::Token { token_hash, .. } => out.push(MatchOutput::Minted(*token_hash)),
        Record::Controller { role, .. } => out.push(MatchOutput::ControllerChanged(role.clone())),
        _ => {}
    }
}

/// An MCP call's result when its change was not stored.
fn refused_result(seq: u64) -> ResultMsg {
    let e = ProtocolError::new(
        ServerErrorCode::Internal,
        "store: the change was not stored",
    );
    match ServerMsg::error(seq, &e) {
        ServerMsg::Result(r) => r,
        _ => unreachable!("an error is a result"),
    }
}

/// A command kept while a change is pending (its text copied).
fn owned<S: std::ops::Deref<Target = str>>(cmd: MatchCommand<S>) -> MatchCommand<String> {
    use MatchCommand as C;
    match cmd {
        C::Text { conn, text } => C::Text {
            conn,
            text: (*text).to_owned(),
        },
        C::Join { conn, token } => C::Join { conn, token },
        C::Leave { conn } => C::Leave { conn },
        C::Mint { principal } => C::Mint { principal },
        C::Revoke { token } => C::Revoke { token },
        C::SetCard { role, card } => C::SetCard { role, card },
        C::McpJoin { conn, token } => C::McpJoin { conn, token },
        C::McpCheck { token } => C::McpCheck { token },
        C::McpCall { conn, msg } => C::McpCall { conn, msg },
        C::McpView { team } => C::McpView { team },
        C::McpSubscribe { conn, team, on } => C::McpSubscribe { conn, team, on },
        C::McpInbox { role } => C::McpInbox { role },
        C::McpPeekInbox { role } => C::McpPeekInbox { role },
        C::McpPushed { conn } => C::McpPushed { conn },
        C::McpSubscribeInbox { conn, role, on } => C::McpSubscribeInbox { conn, role, on },
        C::McpProposal { id } => C::McpProposal { id },
        C::McpIsAgent { role } => C::McpIsAgent { role },
        C::McpDisclose { conn, disclosure } => C::McpDisclose { conn, disclosure },
        C::Wake => C::Wake,
        C::Shutdown => C::Shutdown,
    }
}
