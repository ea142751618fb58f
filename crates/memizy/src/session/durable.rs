//! A hosted session with its durability rules, sans-IO: [`DurableSession`]
//! wraps the engine ([`Session`]) so that the server drives it the way it
//! drives every stateful unit: records handed out as writes
//! ([`DurableSession::poll_write`]), each answered with
//! [`DurableSession::ack`], and whatever waits for one held until then.
//!
//! The rules:
//! - every engine record (`Output::Persist`) is one write; its
//!   acknowledgement is the engine's `record_durable` (a refused write
//!   answers the calls waiting for it `INTERNAL_ERROR`, as the engine says);
//! - a change the host's API (or `updateSettings`) makes is answered only
//!   once the session's state after it is kept ([`SessionRecord::Kept`]):
//!   [`DurableSession::keep_then`] holds the answer's tag until then;
//! - a saved game is answered once its record is durable
//!   ([`DurableSession::save`]);
//! - the recording is written behind: nothing waits for it;
//! - the session expires `lobby_ttl_ms` after it started here while in its
//!   lobby, and `idle_ttl_ms` after its last use while no instance is
//!   attached, never while a save waits; its removal is written and the
//!   session takes no more commands until it is answered
//!   ([`SessionOutput::Expiring`], then [`SessionOutput::Expired`]).

use super::engine::Session;
use super::{Output, Phase, Record, RecordId, SavedGame};
use std::collections::{HashMap, VecDeque};

/// Names a write until its acknowledgement comes back.
pub type WriteId = u64;

/// One record the store keeps for a hosted session.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionRecord {
    /// A record of the engine; `game_time_ms` is the game time it was
    /// handed out at (a snapshot brought back by a restart resumes there).
    Engine { record: Record, game_time_ms: u64 },
    /// The session's state as a restart brings it back (roster, settings,
    /// phase, clock), as it stands when this write is handed out.
    Kept { at_ms: u64 },
    /// The recording (SPEC 10), written behind: its head when it changed
    /// (the `InitPayload`, the seed, whether it was truncated, as JSON
    /// text) and its entries from `first_seq` on.
    Recording {
        head: Option<String>,
        first_seq: u64,
        entries: Vec<String>,
        at_ms: u64,
    },
    /// The session expired: every row keyed by it goes.
    Removed,
}

/// Records to persist as one unit (all or nothing), in the session's order.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingWrite {
    pub id: WriteId,
    pub records: Vec<SessionRecord>,
}

/// What the server carries out, in order.
#[derive(Debug)]
pub enum SessionOutput<T> {
    /// An engine output; never `Persist` (its records are writes).
    Engine(Output),
    /// The state after a change is kept (`durable`) or could not be: the
    /// answer `tag` stands for may go now.
    Kept { tag: T, durable: bool },
    /// A saved game's record is durable (`Ok`) or why not.
    Saved {
        tag: T,
        saved: Box<SavedGame>,
        outcome: Result<(), String>,
    },
    /// The session expired: its instances close; its removal is written.
    Expiring,
    /// The removal's answer: the session is gone.
    Expired { durable: bool },
}

/// How long a session lives without use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// While in its lobby, after it started on this server.
    pub lobby_ttl_ms: u64,
    /// While no instance is attached, after its last use.
    pub idle_ttl_ms: u64,
}

/// What a write in flight was for.
enum Flight<T> {
    Engine(RecordId),
    Kept(T),
    Behind,
    Removed,
}

/// A [`Session`] whose records go through writes with acknowledgements.
/// `T` is whatever the server carries with an answer that waits.
pub struct DurableSession<T> {
    s: Session,
    expiry: Expiry,
    started_at: u64,
    last_used: u64,
    writes: VecDeque<PendingWrite>,
    in_flight: HashMap<WriteId, Flight<T>>,
    next_write: WriteId,
    /// Saved games waiting for their record: who asked, and the game.
    saves: HashMap<RecordId, (T, Box<SavedGame>)>,
    out: VecDeque<SessionOutput<T>>,
    /// Its removal is written: nothing more is kept, no command is taken.
    removed: bool,
}

impl<T> DurableSession<T> {
    /// Drives `s`, which started (was created or continued) here at `now`.
    pub fn new(s: Session, expiry: Expiry, now: u64) -> Self {
        let mut d = DurableSession {
            s,
            expiry,
            started_at: now,
            last_used: now,
            writes: VecDeque::new(),
            in_flight: HashMap::new(),
            next_write: 0,
            saves: HashMap::new(),
            out: VecDeque::new(),
            removed: false,
        };
        d.pump(now);
        d
    }

    pub fn session(&self) -> &Session {
        &self.s
    }

    /// Acts on the engine at `now`; its records become writes.
    pub fn act<R>(&mut self, now: u64, f: impl FnOnce(&mut Session) -> R) -> R {
        let r = f(&mut self.s);
        self.pump(now);
        r
    }

    /// An attach, a Host API call or an HTTP API operation: the idle
    /// expiry counts from here.
    pub fn used(&mut self, now: u64) {
        self.last_used = now;
    }

    /// Keeps the session's state as it stands; `tag` comes back in
    /// [`SessionOutput::Kept`] once the store answered.
    pub fn keep_then(&mut self, tag: T, now: u64) {
        if self.removed {
            self.out.push_back(SessionOutput::Kept {
                tag,
                durable: false,
            });
            return;
        }
        self.push_write(SessionRecord::Kept { at_ms: now }, Flight::Kept(tag));
    }

    /// Saves the running game; `tag` comes back in
    /// [`SessionOutput::Saved`] once its record is answered. `Err(tag)`:
    /// this game cannot be saved (not started, or ended).
    pub fn save(&mut self, tag: T, now: u64) -> Result<(), T> {
        if self.removed {
            return Err(tag);
        }
        let Some((id, saved)) = self.s.save_game(now) else {
            return Err(tag);
        };
        self.saves.insert(id, (tag, Box::new(saved)));
        self.pump(now);
        Ok(())
    }

    /// Writes `record` behind: nothing waits for it.
    pub fn write_behind(&mut self, record: SessionRecord) {
        if !self.removed {
            self.push_write(record, Flight::Behind);
        }
    }

    /// Whether its removal is written (or being written).
    pub fn is_removed(&self) -> bool {
        self.removed
    }

    /// Whether the session has nothing left to do: closed, no instance
    /// attached, no answer waiting for the store.
    pub fn is_done(&self) -> bool {
        self.s.phase() == Phase::Closed && self.s.instance_count() == 0 && !self.holds_answers()
    }

    /// Whether it takes commands: not while its removal is being written.
    pub fn accepts(&self) -> bool {
        !self.removed
    }

    fn holds_answers(&self) -> bool {
        !self.saves.is_empty()
            || self
                .in_flight
                .values()
                .any(|f| matches!(f, Flight::Kept(_)))
    }

    /// When the session expires, if it may.
    pub fn expires_at(&self) -> Option<u64> {
        if self.removed || !self.saves.is_empty() {
            return None;
        }
        let lobby = (self.s.phase() == Phase::Lobby)
            .then(|| self.started_at.saturating_add(self.expiry.lobby_ttl_ms));
        let idle = (self.s.instance_count() == 0)
            .then(|| self.last_used.saturating_add(self.expiry.idle_ttl_ms));
        match (lobby, idle) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When [`DurableSession::handle_timeout`] must next run: the engine's
    /// deadline or the expiry.
    pub fn poll_timeout(&self) -> Option<u64> {
        let engine = if self.removed {
            None
        } else {
            self.s.poll_timeout()
        };
        engine.into_iter().chain(self.expires_at()).min()
    }

    /// Does what is due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.removed {
            return;
        }
        if self.expires_at().is_some_and(|t| now >= t) {
            self.removed = true;
            self.out.push_back(SessionOutput::Expiring);
            self.push_write(SessionRecord::Removed, Flight::Removed);
            return;
        }
        if self.s.poll_timeout().is_some_and(|t| t <= now) {
            self.s.handle_timeout(now);
            self.pump(now);
        }
    }

    /// The next output to carry out.
    pub fn poll_output(&mut self) -> Option<SessionOutput<T>> {
        self.out.pop_front()
    }

    /// The next records to persist, in order.
    pub fn poll_write(&mut self) -> Option<PendingWrite> {
        self.writes.pop_front()
    }

    /// The store's answer to write `id`.
    pub fn ack(&mut self, id: WriteId, durable: bool, now: u64) {
        match self.in_flight.remove(&id) {
            Some(Flight::Engine(record)) => {
                let outcome = match durable {
                    true => Ok(()),
                    false => Err("the store did not take the record".to_owned()),
                };
                if let Some((tag, saved)) = self.saves.remove(&record) {
                    self.out.push_back(SessionOutput::Saved {
                        tag,
                        saved,
                        outcome: outcome.clone(),
                    });
                }
                self.s.record_durable(record, outcome, now);
                self.pump(now);
            }
            Some(Flight::Kept(tag)) => self.out.push_back(SessionOutput::Kept { tag, durable }),
            Some(Flight::Removed) => self.out.push_back(SessionOutput::Expired { durable }),
            Some(Flight::Behind) | None => {}
        }
    }

    fn push_write(&mut self, record: SessionRecord, flight: Flight<T>) {
        let id = self.next_write;
        self.next_write += 1;
        self.in_flight.insert(id, flight);
        self.writes.push_back(PendingWrite {
            id,
            records: vec![record],
        });
    }

    /// Moves the engine's outputs out: its records become writes.
    fn pump(&mut self, now: u64) {
        while let Some(o) = self.s.poll_output() {
            match o {
                Output::Persist { id, record } => {
                    if self.removed {
                        // Nothing more is kept once the rows are gone.
                        self.s
                            .record_durable(id, Err("the session expired".into()), now);
                        continue;
                    }
                    let t = self.s.clock().game_time(now as f64);
                    let record = SessionRecord::Engine {
                        record,
                        game_time_ms: t.max(0.0) as u64,
                    };
                    self.push_write(record, Flight::Engine(id));
                }
                o => self.out.push_back(SessionOutput::Engine(o)),
            }
        }
    }
}
