//! An in-memory relay for tests: connections ([`ConnectionState`]) and
//! rooms ([`DurableRoom`]) driven together on a manual clock, with every
//! output carried out as the server would (frames encoded and read back as
//! JSON, closes, durable changes through a store that can refuse a room's
//! writes or hold them unanswered), and no socket, task or wall time.

use super::*;
use crate::limits::{RelayLimits, RELAY_LIMITS};
use hostwire_core::{Clock, ManualClock};
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};

pub const T0: u64 = 1_800_000_000_000;

/// The client frame a command came in (its outputs' `data` ranges point
/// into it).
type Source = String;

pub struct World {
    pub clock: ManualClock,
    pub limits: RelayLimits,
    pub rooms: HashMap<String, DurableRoom<Source>>,
    conns: HashMap<ConnId, ConnectionState<String>>,
    inbox: HashMap<ConnId, VecDeque<Value>>,
    closes: HashMap<ConnId, (u16, &'static str)>,
    /// What the store holds, in the order it became durable.
    pub persisted: Vec<RoomChange>,
    /// Rooms whose writes the store refuses (as a full disk would).
    failing: HashSet<String>,
    /// Every write fails, room creations included.
    all_failing: bool,
    /// Writes wait here, unanswered, while `holding`.
    holding: bool,
    unanswered: VecDeque<(String, PendingWrite)>,
    /// Rooms whose outputs are being carried out: a command that comes
    /// meanwhile (a closed connection's detach) queues behind them.
    pumping: HashSet<String>,
    /// Every answer the rooms gave (attaches, queries, uploads), in order.
    pub answers: Vec<Answer>,
    next_conn: ConnId,
    next_random: u32,
}
impl World {
    pub fn new() -> Self {
        Self::with_limits(RELAY_LIMITS)
    }

    pub fn with_limits(limits: RelayLimits) -> Self {
        Self {
            clock: ManualClock::new(T0),
            limits,
            rooms: HashMap::new(),
            conns: HashMap::new(),
            inbox: HashMap::new(),
            closes: HashMap::new(),
            persisted: Vec::new(),
            failing: HashSet::new(),
            all_failing: false,
            holding: false,
            unanswered: VecDeque::new(),
            answers: Vec::new(),
            pumping: HashSet::new(),
            next_conn: 1,
            next_random: 0,
        }
    }

    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// A new room, as `POST /api/rooms` makes it: (PIN, host token).
    pub fn create_room(&mut self) -> (String, String) {
        self.try_create_room().expect("the store refused the room")
    }

    /// A new room, durable before its PIN is handed out; `None` if the
    /// store refused it (the PIN is free again, nothing is kept).
    pub fn try_create_room(&mut self) -> Option<(String, String)> {
        let rooms = &self.rooms;
        let mut n = self.next_random;
        let pin = choose_pin(
            || {
                n += 1;
                n
            },
            |p| rooms.contains_key(p),
        )
        .unwrap();
        self.next_random = n;
        let (room, created) = Room::create(pin.clone(), self.now(), self.limits);
        if self.all_failing || self.failing.contains(&pin) {
            return None;
        }
        let token = room.host_token().as_str().to_owned();
        self.persisted.push(created);
        self.rooms.insert(pin.clone(), DurableRoom::new(room));
        Some((pin, token))
    }

    /// A room as a store held it, after a restart.
    pub fn restore(&mut self, record: RoomRecord) {
        let (room, fix_up) = Room::restore(record, self.now(), self.limits);
        self.persisted.extend(fix_up);
        self.rooms
            .insert(room.pin().to_owned(), DurableRoom::new(room));
    }

    pub fn connect(&mut self) -> ConnId {
        let c = self.next_conn;
        self.next_conn += 1;
        self.conns
            .insert(c, ConnectionState::new(self.now(), self.limits));
        c
    }

    /// A host attached to a new room: (connection, PIN, host token).
    pub fn host(&mut self) -> (ConnId, String, String) {
        let (pin, token) = self.create_room();
        let h = self.connect();
        self.send(
            h,
            serde_json::json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}),
        );
        assert_eq!(self.recv(h)["t"], "hosting");
        (h, pin, token)
    }

    /// A player joined to `pin`: (connection, player id, token).
    pub fn player(&mut self, pin: &str, name: &str) -> (ConnId, String, String) {
        let p = self.connect();
        self.send(
            p,
            serde_json::json!({"t": "join", "protocol": 1, "pin": pin, "name": name}),
        );
        let j = self.recv(p);
        assert_eq!(j["t"], "joined", "{j}");
        (
            p,
            j["playerId"].as_str().unwrap().to_owned(),
            j["token"].as_str().unwrap().to_owned(),
        )
    }

    pub fn send(&mut self, conn: ConnId, v: Value) {
        self.send_text(conn, &v.to_string());
    }

    /// A text frame from `conn`, as the connection's reader hands it on.
    pub fn send_text(&mut self, conn: ConnId, text: &str) {
        assert!(!self.closes.contains_key(&conn), "{conn} is closed");
        let now = self.now();
        let state = self.conns.get_mut(&conn).expect("a connection");
        match state.on_frame(text, now) {
            ConnStep::Reply { frame, .. } | ConnStep::RateLimited(frame) => {
                self.deliver(conn, &frame, "")
            }
            ConnStep::Fatal { frame, close, .. } => {
                self.deliver(conn, &frame, "");
                self.close(conn, close);
            }
            ConnStep::Attach {
                pin,
                msg,
                already_attached,
            } => {
                let Some(room) = self.rooms.get_mut(&pin) else {
                    let step = state.room_not_found(&msg);
                    let ConnStep::Fatal { frame, close, .. } = step else {
                        panic!("{step:?}")
                    };
                    self.deliver(conn, &frame, "");
                    return self.close(conn, close);
                };
                let cmd = RoomCommand::Attach {
                    conn,
                    msg,
                    already_attached,
                };
                room.handle(cmd, Source::new(), now);
                self.pump(&pin);
            }
            ConnStep::Forward(msg) => {
                let pin = state.room().cloned().expect("attached");
                if let Some(room) = self.rooms.get_mut(&pin) {
                    room.handle(RoomCommand::Frame { conn, msg }, text.to_owned(), now);
                }
                self.pump(&pin);
            }
        }
    }

    /// The connection went away (its socket closed).
    pub fn disconnect(&mut self, conn: ConnId) {
        let pin = self.conns.get_mut(&conn).and_then(|s| s.detach());
        if let Some(pin) = pin {
            self.command(&pin, RoomCommand::Detach { conn });
        }
    }

    /// A command from the server's side (not a connection's frame).
    pub fn command(&mut self, pin: &str, cmd: RoomCommand) {
        let now = self.now();
        if let Some(room) = self.rooms.get_mut(pin) {
            room.handle(cmd, Source::new(), now);
        }
        self.pump(pin);
    }

    /// A bundle upload, as `PUT /api/rooms/:pin/bundle` hands it on; its
    /// answer lands in `answers` once the store has answered.
    pub fn put_bundle(&mut self, pin: &str, token: &str, app_name: &str) {
        let cmd = RoomCommand::PutBundle {
            token: token.to_owned(),
            text: bytes::Bytes::from(format!("<p>{app_name}</p>")),
            app_name: Some(app_name.to_owned()),
        };
        self.command(pin, cmd);
    }

    /// One sweep of every room; the PINs of the rooms it closed.
    pub fn sweep(&mut self) -> Vec<String> {
        let pins: Vec<String> = self.rooms.keys().cloned().collect();
        for pin in &pins {
            self.command(pin, RoomCommand::Sweep);
        }
        pins.into_iter()
            .filter(|p| !self.rooms.contains_key(p))
            .collect()
    }

    /// The store refuses every write of room `pin` from now on.
    pub fn fail_writes(&mut self, pin: &str) {
        self.failing.insert(pin.to_owned());
    }

    /// The store refuses every write, room creations included.
    pub fn fail_all_writes(&mut self) {
        self.all_failing = true;
    }

    /// The store takes room `pin`'s writes again.
    pub fn heal(&mut self, pin: &str) {
        self.failing.remove(pin);
    }

    /// The store holds the writes that come from now on unanswered (a
    /// slow disk), until [`World::answer_writes`].
    pub fn hold_writes(&mut self) {
        self.holding = true;
    }

    /// Writes queued and not answered yet.
    pub fn unanswered(&self) -> usize {
        self.unanswered.len()
    }

    /// Answers the held writes in order (each durable unless its room
    /// fails) and stops holding.
    pub fn answer_writes(&mut self) {
        self.holding = false;
        while let Some((pin, w)) = self.unanswered.pop_front() {
            self.answer(&pin, w);
            self.pump(&pin);
        }
    }

    /// The store's answer to one write.
    fn answer(&mut self, pin: &str, w: PendingWrite) {
        let durable = !self.all_failing && !self.failing.contains(pin);
        if durable {
            self.persisted.extend(w.changes);
        }
        let now = self.now();
        if let Some(room) = self.rooms.get_mut(pin) {
            room.ack(w.id, durable, now);
        }
    }

    /// Carries out what room `pin` has for the store and for connections.
    fn pump(&mut self, pin: &str) {
        if !self.pumping.insert(pin.to_owned()) {
            return;
        }
        self.pump_now(pin);
        self.pumping.remove(pin);
    }

    fn pump_now(&mut self, pin: &str) {
        loop {
            let Some(room) = self.rooms.get_mut(pin) else {
                return;
            };
            if let Some(w) = room.poll_write() {
                if self.holding {
                    self.unanswered.push_back((pin.to_owned(), w));
                } else {
                    self.answer(pin, w);
                }
                continue;
            }
            match room.poll_output() {
                Some(done) => self.carry_out(pin, done),
                None => return,
            }
        }
    }

    fn carry_out(&mut self, pin: &str, done: Done<Source>) {
        let now = self.now();
        self.apply(pin, done.outputs, &done.tag);
        if let Answer::Attach(conn, AttachOutcome::Attached { host }) = done.answer {
            if let Some(state) = self.conns.get_mut(&conn) {
                state.on_attached(pin.to_owned(), host, now);
            }
        }
        if done.answer != Answer::None {
            self.answers.push(done.answer);
        }
    }

    fn deliver(&mut self, conn: ConnId, frame: &RelayServerMessage, source: &str) {
        if self.closes.contains_key(&conn) {
            return;
        }
        let text = frame.encode(source);
        let v: Value = serde_json::from_str(&text).expect("a server frame is JSON");
        assert_eq!(v["t"], frame.kind().as_str(), "typed as it is encoded");
        self.inbox.entry(conn).or_default().push_back(v);
    }

    fn close(&mut self, conn: ConnId, close: CloseWith) {
        if self.closes.insert(conn, close).is_none() {
            // Its reader stops and leaves the room.
            self.disconnect(conn);
        }
    }

    fn apply(&mut self, pin: &str, out: Vec<RoomOutput>, source: &str) {
        for o in out {
            match o {
                RoomOutput::Send { conn, frame } => self.deliver(conn, &frame, source),
                RoomOutput::Broadcast { conns, frame } => {
                    for c in conns {
                        self.deliver(c, &frame, source);
                    }
                }
                RoomOutput::Close { conn, code, reason } => self.close(conn, (code, reason)),
                RoomOutput::Persist(_) => unreachable!("held by the room for the store"),
                RoomOutput::RoomClosed => {
                    self.rooms.remove(pin);
                }
            }
        }
    }

    /// The next frame `conn` got.
    pub fn recv(&mut self, conn: ConnId) -> Value {
        self.inbox
            .get_mut(&conn)
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| panic!("no frame for {conn}"))
    }

    /// Every frame `conn` got since the last look.
    pub fn drain(&mut self, conn: ConnId) -> Vec<Value> {
        self.inbox
            .get_mut(&conn)
            .map(|q| q.drain(..).collect())
            .unwrap_or_default()
    }

    /// How `conn` was closed, if it was.
    pub fn closed(&self, conn: ConnId) -> Option<(u16, &'static str)> {
        self.closes.get(&conn).copied()
    }

    /// The next frame is this error.
    pub fn expect_error(&mut self, conn: ConnId, code: RelayErrorCode, fatal: bool) -> Value {
        let v = self.recv(conn);
        assert_eq!(
            (v["t"].as_str(), v["code"].as_str(), v["fatal"].as_bool()),
            (Some("error"), Some(code.as_str()), Some(fatal)),
            "{v}"
        );
        v
    }

    pub fn is_attached(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|s| s.room().is_some())
    }
}
