//! The live channel with its durability rules, as one unit (the shape the
//! server's unit driver takes): commands change the [`Channel`] at `now`,
//! the records they produce are handed out as writes ([`poll_write`]: one
//! per session, all or nothing each) whose answers come back through
//! [`ack`], and what must wait for durability is held until then (an
//! action's `ack` goes out only once its ledger entry is stored).
//!
//! Group commit: commands handled one after another before the writes are
//! polled share them ([`takes_queued`] says whether another one may join);
//! once a batch holds something back, the unit takes no command until its
//! writes are answered ([`accepts`]). A session whose write is refused has
//! that batch's changes taken back, latest first: its actions are answered
//! with the protocol's error (`APPEND_FAILED`), what told of a refused
//! props update is dropped, and a connection that was sent anything else
//! about the session in the batch (a replay that may show what was taken
//! back) is closed with [`CLOSE_STORE_FAILED`], to subscribe again.
//!
//! The sessions nobody uses are removed on the unit's timer
//! ([`poll_timeout`] / [`handle_timeout`]), their rows with them.
//!
//! [`poll_write`]: DurableChannel::poll_write
//! [`ack`]: DurableChannel::ack
//! [`takes_queued`]: DurableChannel::takes_queued
//! [`accepts`]: DurableChannel::accepts
//! [`poll_timeout`]: DurableChannel::poll_timeout
//! [`handle_timeout`]: DurableChannel::handle_timeout

use crate::channel::{Channel, ConnId, Output, Record, Undo, ValidatedAction, CLOSE_STORE_FAILED};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// The most commands one batch takes before it is stored.
pub const MAX_BATCH_COMMANDS: usize = 256;
/// The most bytes of frames one batch takes before it is stored (a batch
/// may pass it by one frame).
pub const MAX_BATCH_FRAME_BYTES: usize = 1024 * 1024;
/// Commands handled at most while a session's host context waits to be
/// written (keep-latest: a flood of `host_context_observed` writes one
/// small row per session now and then, never the props).
pub const HOST_CONTEXT_COALESCE_COMMANDS: u32 = 256;
/// Milliseconds between two passes over the sessions for idle ones.
pub const EXPIRY_SWEEP_MS: u64 = 60 * 1000;

/// The reason of the close ([`CLOSE_STORE_FAILED`]) of a connection told
/// of changes the store then refused.
pub const STORE_FAILED_REASON: &str = "the session's changes could not be stored; subscribe again";

/// Records of one session to store, all or nothing, named by `id` until
/// [`DurableChannel::ack`] answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub id: u64,
    pub session_id: String,
    pub records: Vec<Record>,
}

/// What the server carries out, in order.
#[derive(Debug, PartialEq)]
pub enum Step<T> {
    /// A channel output: `Send`, `Close`, `ActionsAvailable` or `Validate`
    /// (records come out as writes, durable answers as the frame they
    /// resolved to).
    Out(Output),
    /// The answer to a caller's request ([`DurableChannel::answer`]):
    /// `stored` is false if a change it made was refused (taken back).
    Answer { tag: T, stored: bool },
}

/// An output held behind a change that waits for its write.
enum Held<T> {
    /// A frame, the session its connection was subscribed to when it was
    /// made, and the refusable change (props update) it tells of.
    Send {
        conn: ConnId,
        frame: Arc<str>,
        session: Option<String>,
        part_of: Option<String>,
    },
    Close {
        conn: ConnId,
        code: u16,
        reason: String,
    },
    Durable {
        conn: ConnId,
        frame: Arc<str>,
        otherwise: Arc<str>,
        undo: Undo,
    },
    Commit {
        undo: Undo,
    },
    Wake {
        session_id: String,
        part_of: Option<String>,
    },
    Answer {
        tag: T,
        sessions: Vec<String>,
    },
}

/// The commands handled since the last writes were polled.
struct Batch<T> {
    records: Vec<Record>,
    held: Vec<Held<T>>,
    commands: usize,
    bytes: usize,
}

impl<T> Default for Batch<T> {
    fn default() -> Self {
        Batch {
            records: Vec::new(),
            held: Vec::new(),
            commands: 0,
            bytes: 0,
        }
    }
}

impl<T> Batch<T> {
    fn waits(&self) -> bool {
        !self.held.is_empty()
    }

    fn is_full(&self) -> bool {
        self.commands >= MAX_BATCH_COMMANDS || self.bytes >= MAX_BATCH_FRAME_BYTES
    }
}

/// A batch's writes on their way, and what they hold back.
struct Flight<T> {
    waiting: HashSet<u64>,
    sessions: HashMap<u64, String>,
    failed: HashSet<String>,
    held: Vec<Held<T>>,
}

/// The live channel and its durability rules; `T` names a caller's
/// request answered once what it changed is settled.
pub struct DurableChannel<T> {
    /// The state machine itself: change it between [`DurableChannel::begin`]
    /// and [`DurableChannel::collect`] (or through the methods that do).
    pub channel: Channel,
    /// Whether there is a store: without one nothing waits.
    stores: bool,
    idle_ttl_ms: u64,
    batch: Batch<T>,
    flight: Option<Flight<T>>,
    writes: VecDeque<Write>,
    ready: VecDeque<Step<T>>,
    next_write: u64,
    /// The latest host context of each session not written yet, in the
    /// order they were first kept.
    host_contexts: Vec<(String, Map<String, Value>)>,
    /// Commands handled since the first of them was kept.
    held_for: u32,
    /// The sessions of the refusable changes of the command being handled.
    changes: Vec<String>,
    /// The sessions the command being handled wrote records of: its
    /// answer waits for them (nothing is acknowledged before it is
    /// stored).
    recorded: Vec<String>,
    /// The session of the command's props update (the outputs after it
    /// tell of it).
    commit: Option<String>,
    /// When each session was last used.
    last_used: HashMap<String, u64>,
    next_sweep: u64,
}

impl<T> DurableChannel<T> {
    /// `stores`: whether writes go to a store (without one, nothing
    /// waits and no write is handed out). Sessions nobody uses for
    /// `idle_ttl_ms` are removed.
    pub fn new(channel: Channel, stores: bool, idle_ttl_ms: u64, now: u64) -> Self {
        DurableChannel {
            channel,
            stores,
            idle_ttl_ms,
            batch: Batch::default(),
            flight: None,
            writes: VecDeque::new(),
            ready: VecDeque::new(),
            next_write: 1,
            host_contexts: Vec::new(),
            held_for: 0,
            changes: Vec::new(),
            recorded: Vec::new(),
            commit: None,
            last_used: HashMap::new(),
            next_sweep: now + EXPIRY_SWEEP_MS,
        }
    }

    /// Whether it takes a command now: not while a batch's writes hold
    /// its outputs back.
    pub fn accepts(&self) -> bool {
        self.flight.is_none()
    }

    /// Whether another command already queued may join the batch before
    /// its writes are polled (group commit).
    pub fn takes_queued(&self) -> bool {
        self.flight.is_none() && !self.batch.is_full()
    }

    /// Whether something waits for a write (in the open batch or on its
    /// way): a request that must see only what is stored waits for it.
    pub fn holds(&self) -> bool {
        self.batch.waits() || self.flight.is_some()
    }

    /// A command begins (`frame_bytes`: the bytes of its frame, if one).
    pub fn begin(&mut self, frame_bytes: usize) {
        self.batch.commands += 1;
        self.batch.bytes += frame_bytes;
        self.changes.clear();
        self.recorded.clear();
        self.commit = None;
    }

    /// One frame from a connection.
    pub fn frame_received(&mut self, conn: ConnId, bytes: &[u8], now: u64) {
        self.begin(bytes.len());
        self.channel.frame_received(conn, bytes, now);
        self.collect();
    }

    /// An action validated off the unit.
    pub fn action_validated(&mut self, done: ValidatedAction, now: u64) {
        self.begin(0);
        self.channel.action_validated(done, now);
        self.collect();
    }

    /// Any other change of the channel (a connection, an agent call).
    pub fn apply<R>(&mut self, f: impl FnOnce(&mut Channel) -> R) -> R {
        self.begin(0);
        let r = f(&mut self.channel);
        self.collect();
        r
    }

    /// Answers `tag` once what the command just handled changed is
    /// settled (its refusable changes and the records it wrote, such as a
    /// new session's): at once if nothing waits.
    pub fn answer(&mut self, tag: T) {
        let wrote = self.stores && !self.recorded.is_empty();
        if self.batch.waits() || wrote {
            let mut sessions = std::mem::take(&mut self.changes);
            sessions.append(&mut self.recorded);
            self.batch.held.push(Held::Answer { tag, sessions });
        } else {
            self.ready.push_back(Step::Answer { tag, stored: true });
        }
    }

    /// Sorts the channel's outputs: records into the batch, outputs out
    /// at once or, after the batch's first change that waits, held.
    pub fn collect(&mut self) {
        while let Some(o) = self.channel.poll_output() {
            let waits = self.batch.waits();
            match o {
                Output::Persist(r) => self.keep(*r),
                Output::Validate(job) => self.ready.push_back(Step::Out(Output::Validate(job))),
                Output::Durable {
                    conn,
                    frame,
                    otherwise,
                    undo,
                } => {
                    self.changes.push(undo.session_id().to_owned());
                    self.batch.held.push(Held::Durable {
                        conn,
                        frame,
                        otherwise,
                        undo,
                    });
                }
                Output::Commit { undo } => {
                    self.changes.push(undo.session_id().to_owned());
                    self.commit = Some(undo.session_id().to_owned());
                    self.batch.held.push(Held::Commit { undo });
                }
                o @ (Output::Send { .. }
                | Output::Close { .. }
                | Output::ActionsAvailable { .. })
                    if !waits =>
                {
                    self.ready.push_back(Step::Out(o))
                }
                Output::Send { conn, frame } => {
                    let session = self.channel.subscription(conn).map(str::to_owned);
                    self.batch.held.push(Held::Send {
                        conn,
                        frame,
                        session,
                        part_of: self.commit.clone(),
                    });
                }
                Output::Close { conn, code, reason } => {
                    self.batch.held.push(Held::Close { conn, code, reason })
                }
                Output::ActionsAvailable { session_id } => self.batch.held.push(Held::Wake {
                    session_id,
                    part_of: self.commit.clone(),
                }),
            }
        }
    }

    /// A record into the batch; a host context alone is kept aside
    /// (keep-latest), and a session row written now carries its own.
    fn keep(&mut self, r: Record) {
        match r {
            Record::HostContext {
                session_id,
                host_context,
            } => {
                if self.host_contexts.is_empty() {
                    self.held_for = 0;
                }
                match self
                    .host_contexts
                    .iter_mut()
                    .find(|(s, _)| *s == session_id)
                {
                    Some((_, c)) => *c = host_context,
                    None => self.host_contexts.push((session_id, host_context)),
                }
            }
            Record::Session(rec) => {
                self.host_contexts.retain(|(s, _)| *s != rec.session_id);
                self.recorded.push(rec.session_id.clone());
                self.batch.records.push(Record::Session(rec));
            }
            r => {
                self.recorded.push(r.session_id().to_owned());
                self.batch.records.push(r)
            }
        }
    }

    /// The next records to store, one write per session; the first call
    /// after commands closes their batch.
    pub fn poll_write(&mut self) -> Option<Write> {
        if self.writes.is_empty() && self.flight.is_none() {
            self.close_batch();
        }
        self.writes.pop_front()
    }

    fn close_batch(&mut self) {
        let batch = std::mem::take(&mut self.batch);
        let full = batch.is_full();
        let mut records = batch.records;
        if !self.host_contexts.is_empty() {
            self.held_for = self.held_for.saturating_add(batch.commands as u32);
            // The queue ran dry (the unit is idle) or they waited long
            // enough.
            if !full || self.held_for >= HOST_CONTEXT_COALESCE_COMMANDS {
                for (session_id, host_context) in std::mem::take(&mut self.host_contexts) {
                    records.push(Record::HostContext {
                        session_id,
                        host_context,
                    });
                }
            }
        }
        let mut flight = Flight {
            waiting: HashSet::new(),
            sessions: HashMap::new(),
            failed: HashSet::new(),
            held: batch.held,
        };
        if self.stores {
            for (session_id, records) in by_session(records) {
                let id = self.next_write;
                self.next_write += 1;
                if !flight.held.is_empty() {
                    flight.waiting.insert(id);
                    flight.sessions.insert(id, session_id.clone());
                }
                self.writes.push_back(Write {
                    id,
                    session_id,
                    records,
                });
            }
        }
        if flight.waiting.is_empty() {
            self.settle(flight);
        } else {
            self.flight = Some(flight);
        }
    }

    /// The store's answer to write `id`. Returns true when it settled a
    /// batch some of whose changes were refused (and taken back).
    pub fn ack(&mut self, id: u64, durable: bool) -> bool {
        let Some(flight) = self.flight.as_mut() else {
            // A write nothing waited for: its failure is the writer's to
            // report.
            return false;
        };
        if !flight.waiting.remove(&id) {
            return false;
        }
        if !durable {
            if let Some(s) = flight.sessions.get(&id) {
                flight.failed.insert(s.clone());
            }
        }
        if !flight.waiting.is_empty() {
            return false;
        }
        let flight = self.flight.take().expect("a flight");
        let refused = !flight.failed.is_empty();
        self.settle(flight);
        refused
    }

    /// Lets out what `flight` held: what a refused session changed is
    /// taken back first, latest first.
    fn settle(&mut self, flight: Flight<T>) {
        let Flight { failed, held, .. } = flight;
        for h in held.iter().rev() {
            if let Held::Durable { undo, .. } | Held::Commit { undo } = h {
                if failed.contains(undo.session_id()) {
                    self.channel.not_stored(undo.clone());
                }
            }
        }
        let refused = |s: &Option<String>| s.as_ref().is_some_and(|s| failed.contains(s));
        let mut closing: Vec<ConnId> = Vec::new();
        for h in &held {
            if let Held::Send {
                conn,
                session,
                part_of,
                ..
            } = h
            {
                if refused(session) && !refused(part_of) && !closing.contains(conn) {
                    closing.push(*conn);
                }
            }
        }
        for h in held {
            let out = match h {
                Held::Durable {
                    conn,
                    frame,
                    otherwise,
                    undo,
                } => {
                    let frame = match failed.contains(undo.session_id()) {
                        true => otherwise,
                        false => frame,
                    };
                    Output::Send { conn, frame }
                }
                Held::Commit { .. } => continue,
                Held::Send { part_of, .. } if refused(&part_of) => continue,
                Held::Send { conn, .. } if closing.contains(&conn) => continue,
                Held::Send { conn, frame, .. } => Output::Send { conn, frame },
                Held::Close { conn, code, reason } => Output::Close { conn, code, reason },
                Held::Wake { session_id, .. } if failed.contains(&session_id) => continue,
                Held::Wake { part_of, .. } if refused(&part_of) => continue,
                Held::Wake { session_id, .. } => Output::ActionsAvailable { session_id },
                Held::Answer { tag, sessions } => {
                    let stored = !sessions.iter().any(|s| failed.contains(s));
                    self.ready.push_back(Step::Answer { tag, stored });
                    continue;
                }
            };
            self.ready.push_back(Step::Out(out));
        }
        for conn in closing {
            self.ready.push_back(Step::Out(Output::Close {
                conn,
                code: CLOSE_STORE_FAILED,
                reason: STORE_FAILED_REASON.to_owned(),
            }));
        }
    }

    /// The next thing to carry out, in order.
    pub fn poll_output(&mut self) -> Option<Step<T>> {
        self.ready.pop_front()
    }

    /// The agent used `session_id` at `now`.
    pub fn touch(&mut self, session_id: &str, now: u64) {
        self.last_used.insert(session_id.to_owned(), now);
    }

    /// When the sessions are next looked over for idle ones; none while a
    /// batch's writes are on their way (the pass waits for them).
    pub fn poll_timeout(&self) -> Option<u64> {
        self.flight.is_none().then_some(self.next_sweep)
    }

    /// The sweep's time has come: removes the sessions nobody used for
    /// the idle time (`in_use`: whether the server still serves one, a
    /// long poll waiting on it); returns their ids.
    pub fn handle_timeout(&mut self, now: u64, in_use: impl Fn(&str) -> bool) -> Vec<String> {
        self.next_sweep = now + EXPIRY_SWEEP_MS;
        self.expire_idle(now, in_use)
    }

    /// Removes the sessions nobody used for the idle time now (a
    /// subscriber, or `in_use`, counts as use now), and their rows.
    pub fn expire_idle(&mut self, now: u64, in_use: impl Fn(&str) -> bool) -> Vec<String> {
        self.begin(0);
        let ids = self.channel.session_ids();
        self.last_used.retain(|id, _| ids.contains(id));
        let mut expired = Vec::new();
        for id in ids {
            if in_use(&id) || self.channel.subscriber_count(&id) > 0 {
                self.last_used.insert(id, now);
                continue;
            }
            let last = *self.last_used.entry(id.clone()).or_insert(now);
            if now.saturating_sub(last) >= self.idle_ttl_ms {
                self.channel.remove_session(&id);
                self.last_used.remove(&id);
                // Its host context kept aside would outlive the row.
                self.host_contexts.retain(|(s, _)| *s != id);
                self.batch.records.push(Record::SessionRemoved {
                    session_id: id.clone(),
                });
                expired.push(id);
            }
        }
        self.collect();
        expired
    }
}

/// Records as one list per session, each in its order, sessions in the
/// order they first appear.
fn by_session(records: Vec<Record>) -> Vec<(String, Vec<Record>)> {
    let mut out: Vec<(String, Vec<Record>)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for r in records {
        let s = r.session_id();
        match at.get(s) {
            Some(&i) => out[i].1.push(r),
            None => {
                at.insert(s.to_owned(), out.len());
                out.push((s.to_owned(), vec![r]));
            }
        }
    }
    out
}
