//! A relay room with its durability rules, sans-IO: [`DurableRoom`] wraps
//! a [`Room`] so that a change the store keeps (a join, a kick, `open`, a
//! rename, the room's close or expiry) is acknowledged only once it is
//! durable.
//!
//! For each command the room decides whether it may change durable state;
//! if it did, the records are handed out as one pending write
//! ([`DurableRoom::poll_write`]) and the command's outputs are held until
//! the driver reports the write's fate ([`DurableRoom::ack`]). Durable: the
//! outputs are released. Refused: the room goes back to the state from
//! before the command (a clone of [`Room`], kept while the write is
//! pending) and whoever asked is told `INTERNAL_ERROR`; a join refused so
//! is closed (1011) and joins again like after any dropped connection.
//!
//! Forwarding never waits for the store: while a change is pending, other
//! connections' `to`, `up` and `ping` are handled on the state from before
//! it, as if they had come just before it (they change nothing stored and
//! are not changed by it). Every other command waits behind the change, in
//! order. The host-away time is written behind (it only moves expiry after
//! a restart) and written again at the next sweep if it failed. A bundle
//! upload is written beside the room's commands and served once stored.

use super::connection::ConnId;
use super::protocol::*;
use super::room::{AttachOutcome, BundleMeta, Room, RoomChange, RoomInfo, RoomOutput};
use bytes::Bytes;
use std::collections::VecDeque;

/// What the driver asks of a room.
#[derive(Debug, Clone)]
pub enum RoomCommand {
    /// `host` or `join` with the room's PIN; `already_attached`: the
    /// connection is attached to a room (this or another) already.
    Attach {
        conn: ConnId,
        msg: RelayClientMessage,
        already_attached: bool,
    },
    /// A frame from a connection of the room.
    Frame {
        conn: ConnId,
        msg: RelayClientMessage,
    },
    /// A connection went away.
    Detach { conn: ConnId },
    /// Closes the room if it has expired.
    Sweep,
    /// The public summary (`GET /api/rooms/:pin`).
    Info,
    /// Whether a bearer token is the room's host token.
    IsHost { token: String },
    /// The room's creation time and the version of the bundle it serves.
    GetBundle,
    /// A bundle upload by the bearer of `token`.
    PutBundle {
        token: String,
        text: Bytes,
        app_name: Option<String>,
    },
    /// The server is going away: every connection is closed (1001); the
    /// room stays stored.
    Shutdown,
}

/// How a bundle upload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Durable, and served from now on as this version.
    Stored(u64),
    NotTheHost,
    /// The store failed: the room serves the bundle it served before.
    NotStored,
}

/// The answer to the command, beside its outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    None,
    /// How `conn`'s attach ended (once its frames are out).
    Attach(ConnId, AttachOutcome),
    Info(RoomInfo),
    IsHost(bool),
    /// The room's creation time and the version of the bundle it serves.
    Bundle(Option<(u64, u64)>),
    Put(PutOutcome),
}

/// What a sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Nothing (or not a sweep).
    None,
    /// The room expired and its deletion is durable.
    Expired,
    /// The room expired but the store did not take its deletion: it stays,
    /// and the next sweep tries again.
    NotStored,
}

/// One command's outputs, released once what it changed is durable.
#[derive(Debug)]
pub struct Done<T> {
    /// What the driver gave with the command (the client frame the `data`
    /// ranges of the outputs point into, where to answer).
    pub tag: T,
    /// Frames and closes, in order; never a `Persist`.
    pub outputs: Vec<RoomOutput>,
    pub answer: Answer,
    pub expiry: Expiry,
}

/// Names a write until its acknowledgement comes back.
pub type WriteId = u64;

/// Records to persist as one unit (all or nothing), in the room's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingWrite {
    pub id: WriteId,
    pub changes: Vec<RoomChange>,
}

/// What a write in flight was for.
enum Flight<T> {
    /// The change of the pending command.
    Change,
    /// The host-away time, written behind.
    HostAway,
    /// A bundle upload, answered once written.
    Bundle(BundleMeta, T),
}

/// A command waiting behind a pending change.
enum Held<T> {
    Command(RoomCommand, T),
    BundleWritten {
        meta: BundleMeta,
        durable: bool,
        tag: T,
    },
}

/// The command whose change is being written.
struct Pending<T> {
    write: WriteId,
    /// The state to go back to if the store refuses.
    before: Room,
    done: Done<T>,
    /// Who asked for the change, and what they are told if it fails.
    asked: Option<(ConnId, &'static str)>,
    /// Whether it is `asked`'s attach (refused: the connection closes).
    attaching: bool,
}

/// A [`Room`] driven so that its durable changes are acknowledged only
/// once stored. `T` is whatever the driver carries with a command, given
/// back with its outputs.
pub struct DurableRoom<T> {
    room: Room,
    pending: Option<Pending<T>>,
    held: VecDeque<Held<T>>,
    ready: VecDeque<Done<T>>,
    writes: VecDeque<PendingWrite>,
    in_flight: Vec<(WriteId, Flight<T>)>,
    next_write: WriteId,
    /// A host-away write failed since the last sweep (the sweep writes
    /// the current value again).
    host_away_unsaved: bool,
    /// Every bundle version tried, stored or not: a failed upload's number
    /// is never given to other content.
    bundle_versions: u64,
}

/// Whether a command may make a change that is acknowledged only once
/// durable (so the state from before it is kept, to go back to).
fn may_change_durably(cmd: &RoomCommand, room: &Room, now: u64) -> bool {
    match cmd {
        RoomCommand::Attach { msg, .. } => matches!(msg, RelayClientMessage::Join { .. }),
        RoomCommand::Frame { msg, .. } => matches!(
            msg,
            RelayClientMessage::Open { .. }
                | RelayClientMessage::Kick { .. }
                | RelayClientMessage::Close
                | RelayClientMessage::Rename { .. }
        ),
        RoomCommand::Sweep => now > room.expires_at_ms(),
        _ => false,
    }
}

/// Whether a frame may be handled while another connection's change is
/// being stored: forwarding and `ping` only, which change nothing stored
/// and are not changed by it.
fn goes_ahead(conn: ConnId, msg: &RelayClientMessage, by: Option<ConnId>) -> bool {
    by != Some(conn)
        && matches!(
            msg,
            RelayClientMessage::To { .. }
                | RelayClientMessage::Up { .. }
                | RelayClientMessage::Ping
        )
}

/// What the client that asked for a change is told when the store failed.
fn not_stored(msg: &RelayClientMessage) -> &'static str {
    match msg {
        RelayClientMessage::Join { .. } => {
            "The server could not store this join; nothing changed. Try again."
        }
        RelayClientMessage::Kick { .. } => {
            "The kick could not be stored; the player is still in the room. Try again."
        }
        RelayClientMessage::Open { .. } => {
            "\"open\" could not be stored; the room is as it was. Try again."
        }
        RelayClientMessage::Close => {
            "The room could not be closed: the store failed; it is still open. Try again."
        }
        RelayClientMessage::Rename { .. } => {
            "The new name could not be stored; the name is as it was. Try again."
        }
        _ => "The change could not be stored; nothing changed. Try again.",
    }
}

impl<T> DurableRoom<T> {
    pub fn new(room: Room) -> Self {
        DurableRoom {
            bundle_versions: room.bundle().map_or(0, |b| b.version),
            room,
            pending: None,
            held: VecDeque::new(),
            ready: VecDeque::new(),
            writes: VecDeque::new(),
            in_flight: Vec::new(),
            next_write: 1,
            host_away_unsaved: false,
        }
    }

    /// The room as it is now, with a pending change applied.
    pub fn room(&self) -> &Room {
        &self.room
    }

    /// The room as the store holds it: without a pending change.
    pub fn acknowledged(&self) -> &Room {
        self.pending.as_ref().map_or(&self.room, |p| &p.before)
    }

    /// Whether the room takes another command now. False while a command
    /// waits behind a pending change: the driver leaves the next ones in
    /// its bounded queue (their senders wait behind it), and a sender's
    /// frames cannot overtake its own waiting one.
    pub fn accepts(&self) -> bool {
        self.held.is_empty()
    }

    /// The next records to persist, in order; each is answered with
    /// [`DurableRoom::ack`].
    pub fn poll_write(&mut self) -> Option<PendingWrite> {
        self.writes.pop_front()
    }

    /// The next command's outputs, in order.
    pub fn poll_output(&mut self) -> Option<Done<T>> {
        self.ready.pop_front()
    }

    /// The room keeps no timer of its own: the driver sweeps it.
    pub fn poll_timeout(&self) -> Option<u64> {
        None
    }

    /// Handles a command at `now`; `tag` comes back with its outputs.
    pub fn handle(&mut self, cmd: RoomCommand, tag: T, now: u64) {
        let Some(p) = &mut self.pending else {
            return self.run(cmd, tag, now);
        };
        if self.held.is_empty() {
            if let RoomCommand::Frame { conn, msg } = &cmd {
                if goes_ahead(*conn, msg, p.asked.map(|(c, _)| c)) {
                    let mut outputs = Vec::new();
                    p.before.frame(*conn, msg, now, &mut outputs);
                    return self.ready.push_back(Done {
                        tag,
                        outputs,
                        answer: Answer::None,
                        expiry: Expiry::None,
                    });
                }
            }
        }
        self.held.push_back(Held::Command(cmd, tag));
    }

    /// The store's answer to write `id`: `durable`, or refused.
    pub fn ack(&mut self, id: WriteId, durable: bool, now: u64) {
        let Some(i) = self.in_flight.iter().position(|(w, _)| *w == id) else {
            return;
        };
        match self.in_flight.remove(i).1 {
            Flight::HostAway => self.host_away_unsaved |= !durable,
            Flight::Bundle(meta, tag) => {
                if self.pending.is_some() {
                    // After the pending change, which a refusal would undo.
                    self.held
                        .push_back(Held::BundleWritten { meta, durable, tag });
                } else {
                    self.bundle_written(meta, durable, tag);
                }
            }
            Flight::Change => {
                let Some(p) = self.pending.take() else { return };
                debug_assert_eq!(p.write, id, "writes are answered in order");
                if durable {
                    self.ready.push_back(p.done);
                } else {
                    self.refused(p);
                }
                self.run_held(now);
            }
        }
    }

    fn write(&mut self, changes: Vec<RoomChange>, flight: Flight<T>) {
        let id = self.next_write;
        self.next_write += 1;
        self.writes.push_back(PendingWrite { id, changes });
        self.in_flight.push((id, flight));
    }

    /// The commands that waited, until one of them is pending in turn.
    fn run_held(&mut self, now: u64) {
        while self.pending.is_none() {
            match self.held.pop_front() {
                None => break,
                Some(Held::Command(cmd, tag)) => self.run(cmd, tag, now),
                Some(Held::BundleWritten { meta, durable, tag }) => {
                    self.bundle_written(meta, durable, tag)
                }
            }
        }
    }

    fn bundle_written(&mut self, meta: BundleMeta, durable: bool, tag: T) {
        let answer = if durable {
            let version = meta.version;
            self.room.bundle_stored(meta);
            PutOutcome::Stored(version)
        } else {
            PutOutcome::NotStored
        };
        self.ready.push_back(Done {
            tag,
            outputs: Vec::new(),
            answer: Answer::Put(answer),
            expiry: Expiry::None,
        });
    }

    /// The store refused the pending change: back to the state from before
    /// it, and whoever asked is told.
    fn refused(&mut self, p: Pending<T>) {
        self.room = p.before;
        let mut done = p.done;
        done.outputs.clear();
        if done.expiry == Expiry::Expired {
            // Tried again at the next sweep.
            done.expiry = Expiry::NotStored;
        }
        if let Some((conn, message)) = p.asked {
            let frame = RelayServerMessage::error(RelayErrorCode::InternalError, message, false);
            done.outputs.push(RoomOutput::Send { conn, frame });
            if p.attaching {
                // Not joined: the client reconnects and joins again, as
                // after any dropped connection.
                done.answer = Answer::Attach(conn, AttachOutcome::Refused { fatal: true });
                done.outputs.push(RoomOutput::Close {
                    conn,
                    code: CLOSE_INTERNAL_ERROR,
                    reason: "store unavailable",
                });
            }
        }
        self.ready.push_back(done);
    }

    /// Handles a command on the room as it is (nothing pending).
    fn run(&mut self, cmd: RoomCommand, tag: T, now: u64) {
        let before = may_change_durably(&cmd, &self.room, now).then(|| self.room.clone());
        let mut outputs = Vec::new();
        let mut answer = Answer::None;
        let mut expiry = Expiry::None;
        let mut asked = None;
        let mut attaching = false;
        let room = &mut self.room;
        match cmd {
            RoomCommand::Attach {
                conn,
                msg,
                already_attached,
            } => {
                let outcome = match &msg {
                    RelayClientMessage::Host { host_token, .. } => room.attach_host(
                        conn,
                        host_token.as_deref(),
                        already_attached,
                        &mut outputs,
                    ),
                    RelayClientMessage::Join { name, token, .. } => room.attach_player(
                        conn,
                        name.as_deref(),
                        token.as_deref(),
                        already_attached,
                        &mut outputs,
                    ),
                    _ => AttachOutcome::Refused { fatal: false },
                };
                answer = Answer::Attach(conn, outcome);
                asked = Some((conn, not_stored(&msg)));
                attaching = true;
            }
            RoomCommand::Frame { conn, msg } => {
                room.frame(conn, &msg, now, &mut outputs);
                asked = Some((conn, not_stored(&msg)));
            }
            RoomCommand::Detach { conn } => room.detach(conn, now, &mut outputs),
            RoomCommand::Sweep => {
                if room.sweep(now, &mut outputs) {
                    expiry = Expiry::Expired;
                } else if self.host_away_unsaved {
                    self.host_away_unsaved = false;
                    outputs.push(RoomOutput::Persist(RoomChange::HostAway {
                        pin: room.pin().to_owned(),
                        since_ms: room.host_away_since_ms(),
                    }));
                }
            }
            RoomCommand::Info => answer = Answer::Info(room.info()),
            RoomCommand::IsHost { token } => {
                answer = Answer::IsHost(room.host_token().matches(&token))
            }
            RoomCommand::GetBundle => {
                answer = Answer::Bundle(room.bundle().map(|m| (room.created_at_ms(), m.version)))
            }
            RoomCommand::PutBundle {
                token,
                text,
                app_name,
            } => {
                if room.host_token().matches(&token) {
                    self.bundle_versions += 1;
                    let meta = BundleMeta {
                        version: self.bundle_versions,
                        app_name,
                    };
                    let change = room.bundle_change(meta.clone(), text);
                    // Answered once written; the room goes on meanwhile.
                    return self.write(vec![change], Flight::Bundle(meta, tag));
                }
                answer = Answer::Put(PutOutcome::NotTheHost);
            }
            RoomCommand::Shutdown => {
                for conn in room.conns() {
                    outputs.push(RoomOutput::Close {
                        conn,
                        code: CLOSE_GOING_AWAY,
                        reason: "server shutting down",
                    });
                }
            }
        }
        let changes = take_changes(&mut outputs);
        let done = Done {
            tag,
            outputs,
            answer,
            expiry,
        };
        let acked = changes
            .iter()
            .any(|c| !matches!(c, RoomChange::HostAway { .. }));
        match before {
            Some(before) if acked => {
                self.write(changes, Flight::Change);
                self.pending = Some(Pending {
                    write: self.next_write - 1,
                    before,
                    done,
                    asked,
                    attaching,
                });
            }
            _ => {
                debug_assert!(!acked, "a durable change with nothing to go back to");
                if !changes.is_empty() {
                    self.write(changes, Flight::HostAway);
                }
                self.ready.push_back(done);
            }
        }
    }
}

/// The `Persist` outputs, taken out of `outputs` in order.
fn take_changes(outputs: &mut Vec<RoomOutput>) -> Vec<RoomChange> {
    let mut changes = Vec::new();
    if outputs.iter().any(|o| matches!(o, RoomOutput::Persist(_))) {
        for o in std::mem::take(outputs) {
            match o {
                RoomOutput::Persist(c) => changes.push(c),
                o => outputs.push(o),
            }
        }
    }
    changes
}
