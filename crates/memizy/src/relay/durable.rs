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
    /// `conn` has left the room: nothing more goes to it from here.
    Detached(ConnId),
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

    /// The host's upload: written beside the room's commands, answered
    /// once written (the room goes on meanwhile).
    fn put_bundle(&mut self, text: Bytes, app_name: Option<String>, tag: T) {
        self.bundle_versions += 1;
        let meta = BundleMeta {
            version: self.bundle_versions,
            app_name,
        };
        let change = self.room.bundle_change(meta.clone(), text);
        self.write(vec![change], Flight::Bundle(meta, tag));
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
                let outcome = attach(room, conn, &msg, already_attached, &mut outputs);
                answer = Answer::Attach(conn, outcome);
                asked = Some((conn, not_stored(&msg)));
                attaching = true;
            }
            RoomCommand::Frame { conn, msg } => {
                room.frame(conn, &msg, now, &mut outputs);
                asked = Some((conn, not_stored(&msg)));
            }
            RoomCommand::Detach { conn } => {
                room.detach(conn, now, &mut outputs);
                answer = Answer::Detached(conn);
            }
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
            } => match room.host_token().matches(&token) {
                true => return self.put_bundle(text, app_name, tag),
                false => answer = Answer::Put(PutOutcome::NotTheHost),
            },
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

/// `host` or `join` with the room's PIN.
fn attach(
    room: &mut Room,
    conn: ConnId,
    msg: &RelayClientMessage,
    already_attached: bool,
    out: &mut Vec<RoomOutput>,
) -> AttachOutcome {
    match msg {
        RelayClientMessage::Host { host_token, .. } => {
            room.attach_host(conn, host_token.as_deref(), already_attached, out)
        }
        RelayClientMessage::Join { name, token, .. } => room.attach_player(
            conn,
            name.as_deref(),
            token.as_deref(),
            already_attached,
            out,
        ),
        _ => AttachOutcome::Refused { fatal: false },
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

#[cfg(test)]
mod tests {
    use super::super::sim::World;
    use super::*;
    use serde_json::json;

    /// The error the server sends when the store refused `what`.
    fn expect_not_stored(w: &mut World, conn: ConnId, what: &str) {
        let e = w.expect_error(conn, RelayErrorCode::InternalError, false);
        let m = e["message"].as_str().unwrap();
        assert!(m.contains(what), "{m}");
    }

    /// A host and two players (Ann, Bob), the host told of both.
    fn room_of_two(w: &mut World) -> (String, ConnId, [(ConnId, String, String); 2]) {
        let (h, pin, _) = w.host();
        let a = w.player(&pin, "Ann");
        let b = w.player(&pin, "Bob");
        w.drain(h);
        (pin, h, [a, b])
    }

    #[test]
    fn a_room_the_store_refuses_is_not_created() {
        let mut w = World::new();
        w.fail_all_writes();
        assert_eq!(w.try_create_room(), None);
        assert!(w.rooms.is_empty() && w.persisted.is_empty());
    }

    #[test]
    fn a_join_the_store_refuses_is_told_closed_1011_and_changes_nothing() {
        let mut w = World::new();
        let (pin, h, [(a, a_id, _), _]) = room_of_two(&mut w);
        let stored = w.persisted.len();
        w.fail_writes(&pin);
        let n = w.connect();
        w.send(
            n,
            json!({"t": "join", "protocol": 1, "pin": pin, "name": "New"}),
        );
        expect_not_stored(&mut w, n, "join");
        // Not a fatal error: the client reconnects and joins again.
        assert_eq!(
            w.closed(n),
            Some((CLOSE_INTERNAL_ERROR, "store unavailable"))
        );
        assert!(!w.is_attached(n));
        assert_eq!(
            w.answers.last(),
            Some(&Answer::Attach(n, AttachOutcome::Refused { fatal: true }))
        );
        assert!(w.drain(h).is_empty(), "no presence for a join not stored");
        assert_eq!(w.rooms[&pin].room().player_count(), 2);
        assert_eq!(w.persisted.len(), stored);
        // The room is as it was: the host still reaches Ann.
        w.send(h, json!({"t": "to", "to": a_id, "data": 1}));
        assert_eq!(w.recv(a)["data"], 1);
        w.heal(&pin);
        w.player(&pin, "New");
        assert_eq!(w.rooms[&pin].room().player_count(), 3);
    }

    #[test]
    fn a_kick_the_store_refuses_leaves_the_player_in_and_only_a_stored_kick_counts() {
        let mut w = World::new();
        let (pin, h, [(a, a_id, a_token), (b, b_id, _)]) = room_of_two(&mut w);
        w.fail_writes(&pin);
        w.send(h, json!({"t": "kick", "playerId": a_id}));
        expect_not_stored(&mut w, h, "kick");
        assert!(w.drain(h).is_empty(), "no leave");
        assert!(w.drain(a).is_empty() && w.closed(a).is_none(), "not kicked");
        w.send(h, json!({"t": "to", "to": a_id, "data": "still here"}));
        assert_eq!(w.recv(a)["data"], "still here");
        assert!(!w
            .persisted
            .iter()
            .any(|c| matches!(c, RoomChange::Kicked { .. })));

        w.heal(&pin);
        w.send(h, json!({"t": "kick", "playerId": b_id}));
        assert_eq!(w.recv(b), json!({"t": "closed", "reason": "kicked"}));
        assert_eq!(w.recv(h)["event"], "leave");
        // Ann's token still joins.
        let again = w.connect();
        w.disconnect(a);
        w.send(
            again,
            json!({"t": "join", "protocol": 1, "pin": pin, "token": a_token}),
        );
        assert_eq!(w.recv(again)["playerId"], json!(a_id));
    }

    #[test]
    fn open_false_close_and_a_rename_the_store_refuses_change_nothing() {
        let mut w = World::new();
        let (pin, h, [(a, _, _), _]) = room_of_two(&mut w);
        w.fail_writes(&pin);
        w.send(h, json!({"t": "open", "open": false}));
        expect_not_stored(&mut w, h, "\"open\"");
        assert!(w.rooms[&pin].room().info().open);
        w.send(h, json!({"t": "close"}));
        expect_not_stored(&mut w, h, "closed");
        assert!(w.rooms.contains_key(&pin), "still open");
        assert!(w.drain(a).is_empty(), "nobody was told it closed");
        assert_eq!(w.closed(a), None);
        w.send(a, json!({"t": "rename", "name": "Anna"}));
        expect_not_stored(&mut w, a, "name");
        assert!(w.drain(h).is_empty(), "no rename told");
        assert_eq!(w.rooms[&pin].room().record().players[0].name, "Ann");

        w.heal(&pin);
        w.send(h, json!({"t": "close"}));
        assert_eq!(w.recv(h), json!({"t": "closed", "reason": "host"}));
        assert!(!w.rooms.contains_key(&pin));
        assert_eq!(w.persisted.last(), Some(&RoomChange::Deleted { pin }));
    }

    #[test]
    fn a_bundle_the_store_refuses_is_not_served_and_its_version_is_never_reused() {
        let mut w = World::new();
        let (pin, token) = w.create_room();
        w.put_bundle(&pin, &token, "One");
        assert_eq!(w.answers.pop(), Some(Answer::Put(PutOutcome::Stored(1))));
        w.put_bundle(&pin, "not-the-token", "Other");
        assert_eq!(w.answers.pop(), Some(Answer::Put(PutOutcome::NotTheHost)));
        w.fail_writes(&pin);
        w.put_bundle(&pin, &token, "Two");
        assert_eq!(w.answers.pop(), Some(Answer::Put(PutOutcome::NotStored)));
        let served = w.rooms[&pin].room().bundle().cloned().unwrap();
        assert_eq!(
            (served.version, served.app_name.as_deref()),
            (1, Some("One"))
        );
        w.heal(&pin);
        w.put_bundle(&pin, &token, "Three");
        assert_eq!(w.answers.pop(), Some(Answer::Put(PutOutcome::Stored(3))));
        w.command(&pin, RoomCommand::GetBundle);
        assert_eq!(
            w.answers.pop(),
            Some(Answer::Bundle(Some((super::super::sim::T0, 3))))
        );
    }

    #[test]
    fn an_expiry_the_store_refuses_keeps_the_room_until_a_sweep_stores_it() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (p, _, _) = w.player(&pin, "Ann");
        w.disconnect(h);
        w.drain(p);
        w.clock
            .advance_ms(crate::limits::RELAY_LIMITS.host_away_ms + 1);
        w.fail_writes(&pin);
        assert!(w.sweep().is_empty());
        assert!(w.drain(p).is_empty() && w.closed(p).is_none());
        w.heal(&pin);
        assert_eq!(w.sweep(), vec![pin]);
        assert_eq!(w.recv(p), json!({"t": "closed", "reason": "expired"}));
    }

    #[test]
    fn a_host_away_time_the_store_refused_is_written_again_at_the_next_sweep() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (p, _, _) = w.player(&pin, "Ann");
        w.fail_writes(&pin);
        w.disconnect(h);
        // Written behind: the players are told at once.
        assert_eq!(w.recv(p)["t"], "host-presence");
        let away = RoomChange::HostAway {
            pin: pin.clone(),
            since_ms: Some(super::super::sim::T0),
        };
        assert_ne!(w.persisted.last(), Some(&away));
        w.heal(&pin);
        assert!(w.sweep().is_empty());
        assert_eq!(w.persisted.last(), Some(&away));
        // Once stored, not again.
        let n = w.persisted.len();
        w.sweep();
        assert_eq!(w.persisted.len(), n);
    }

    #[test]
    fn a_change_is_told_only_once_durable() {
        let mut w = World::new();
        let (pin, h, [(a, a_id, _), _]) = room_of_two(&mut w);
        w.hold_writes();
        w.send(h, json!({"t": "kick", "playerId": a_id}));
        assert_eq!(w.unanswered(), 1);
        assert!(w.drain(h).is_empty() && w.drain(a).is_empty());
        assert_eq!(w.closed(a), None);
        assert_eq!(
            w.rooms[&pin].acknowledged().player_count(),
            2,
            "the store holds two players yet"
        );
        w.answer_writes();
        assert_eq!(w.recv(a), json!({"t": "closed", "reason": "kicked"}));
        assert_eq!(w.recv(h)["event"], "leave");
        assert_eq!(w.rooms[&pin].acknowledged().player_count(), 1);
    }

    #[test]
    fn a_joiner_is_answered_only_once_its_join_is_durable() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        w.hold_writes();
        let n = w.connect();
        w.send(
            n,
            json!({"t": "join", "protocol": 1, "pin": pin, "name": "New"}),
        );
        assert!(w.drain(n).is_empty() && w.drain(h).is_empty());
        assert!(!w.is_attached(n));
        w.answer_writes();
        assert_eq!(w.recv(n)["t"], "joined");
        assert_eq!(w.recv(h)["event"], "join");
        assert!(w.is_attached(n));
    }

    #[test]
    fn others_forwarding_goes_ahead_of_a_pending_change_and_the_rest_waits_in_order() {
        let mut w = World::new();
        let (pin, h, [(a, a_id, _), (b, b_id, _)]) = room_of_two(&mut w);
        w.hold_writes();
        w.send(h, json!({"t": "kick", "playerId": a_id}));
        // Players' frames go ahead, on the state from before the kick: as
        // if sent just before it (Ann is still in the room there).
        w.send(b, json!({"t": "up", "data": "from Bob"}));
        w.send(a, json!({"t": "up", "data": "from Ann"}));
        w.send(a, json!({"t": "ping"}));
        assert_eq!(w.recv(h)["data"], "from Bob");
        assert_eq!(w.recv(h)["data"], "from Ann");
        assert_eq!(w.recv(a)["t"], "pong");
        assert!(w.rooms[&pin].accepts());
        // The host's own next frame waits for its kick; Bob's rename is a
        // change of its own and waits too, and so does all after it, Bob's
        // forwarding included (a sender's frames keep their order).
        w.send(h, json!({"t": "to", "to": b_id, "data": "after the kick"}));
        assert!(!w.rooms[&pin].accepts(), "the driver stops reading");
        w.send(b, json!({"t": "rename", "name": "Robert"}));
        w.send(b, json!({"t": "up", "data": "as Robert"}));
        w.command(&pin, RoomCommand::Info);
        assert!(w.drain(b).is_empty() && w.drain(h).is_empty());
        assert_eq!(w.unanswered(), 1, "one change in flight at a time");
        w.answer_writes();
        assert_eq!(w.recv(a)["reason"], "kicked");
        assert_eq!(w.recv(b)["data"], "after the kick");
        let told: Vec<_> = w.drain(h);
        assert_eq!(
            told.iter()
                .map(|v| v["event"].as_str().or(v["data"].as_str()).unwrap())
                .collect::<Vec<_>>(),
            ["leave", "rename", "as Robert"]
        );
        assert_eq!(told[1]["player"]["name"], "Robert");
        let info = RoomInfo {
            pin,
            open: true,
            app_name: None,
            players: 1,
        };
        assert!(w.answers.contains(&Answer::Info(info)), "{:?}", w.answers);
    }

    #[test]
    fn a_refused_change_lets_the_commands_behind_it_run_on_the_state_from_before() {
        let mut w = World::new();
        let (pin, h, [(a, a_id, _), _]) = room_of_two(&mut w);
        w.hold_writes();
        w.fail_writes(&pin);
        w.send(h, json!({"t": "kick", "playerId": a_id}));
        w.send(h, json!({"t": "to", "to": a_id, "data": "still here"}));
        w.answer_writes();
        expect_not_stored(&mut w, h, "kick");
        assert_eq!(w.recv(a)["data"], "still here");
    }

    #[test]
    fn what_changes_nothing_durable_does_not_wait_for_the_store() {
        let mut w = World::new();
        let (pin, h, [(a, a_id, _), (b, _, _)]) = room_of_two(&mut w);
        w.hold_writes();
        w.send(h, json!({"t": "to", "to": a_id, "data": 1}));
        assert_eq!(w.recv(a)["data"], 1);
        w.send(b, json!({"t": "up", "data": 2}));
        assert_eq!(w.recv(h)["data"], 2);
        // Open unchanged: nothing to store.
        w.send(h, json!({"t": "open", "open": true}));
        w.disconnect(a);
        assert_eq!(w.recv(h)["event"], "disconnect");
        assert_eq!(w.answers.last(), Some(&Answer::Detached(a)));
        // The host going away is written behind: told at once.
        w.disconnect(h);
        assert_eq!(w.recv(b)["t"], "host-presence");
        assert_eq!(w.unanswered(), 1, "the host-away time only");
        assert!(w.rooms[&pin].accepts());
    }

    #[test]
    fn two_rooms_one_failing_the_other_durable() {
        let mut w = World::new();
        let (p1, h1, [(a1, a1_id, _), _]) = room_of_two(&mut w);
        let (p2, h2, [(a2, a2_id, _), _]) = room_of_two(&mut w);
        w.fail_writes(&p1);
        w.hold_writes();
        w.send(h1, json!({"t": "kick", "playerId": a1_id}));
        w.send(h2, json!({"t": "kick", "playerId": a2_id}));
        assert_eq!(w.unanswered(), 2);
        w.answer_writes();
        expect_not_stored(&mut w, h1, "kick");
        assert!(w.drain(a1).is_empty());
        assert_eq!(w.recv(h2)["event"], "leave");
        assert_eq!(w.recv(a2)["reason"], "kicked");
        assert_eq!(
            (
                w.rooms[&p1].room().player_count(),
                w.rooms[&p2].room().player_count()
            ),
            (2, 1)
        );
    }

    #[test]
    fn shutdown_closes_every_connection_going_away_and_keeps_the_room() {
        let mut w = World::new();
        let (pin, h, [(a, _, _), (b, _, _)]) = room_of_two(&mut w);
        w.command(&pin, RoomCommand::Shutdown);
        for c in [h, a, b] {
            assert_eq!(
                w.closed(c),
                Some((CLOSE_GOING_AWAY, "server shutting down"))
            );
        }
        assert!(w.rooms.contains_key(&pin));
    }
}
