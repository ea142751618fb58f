//! One relay room as a sans-IO state machine: events in (attach, frame,
//! detach, sweep at time T), outputs out (frames for connections, closes,
//! durable changes to persist).

use super::by_id::ById;
use super::connection::ConnId;
use super::protocol::*;
use crate::limits::RelayLimits;
use bytes::Bytes;
use foldhash::{HashMap, HashMapExt, HashSet};
use hostwire_core::token::random_base64url;
use hostwire_core::Token;
pub use hostwire_relay_records::{BundleMeta, PlayerRecord, RoomChange, RoomRecord};

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoomOutput {
    Send {
        conn: ConnId,
        frame: RelayServerMessage,
    },
    /// One frame for several connections: encode it once.
    Broadcast {
        conns: Vec<ConnId>,
        frame: RelayServerMessage,
    },
    Close {
        conn: ConnId,
        code: u16,
        reason: &'static str,
    },
    Persist(RoomChange),
    /// The room is gone; the driver forgets it.
    RoomClosed,
}

/// How an attach ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachOutcome {
    /// Attached, as the host or as a player.
    Attached { host: bool },
    /// Refused (the error frame, and for a fatal one the close, are in the
    /// outputs). A connection refused without a fatal error stays as it
    /// was: attached elsewhere, or free to try again.
    Refused { fatal: bool },
}

#[derive(Debug, Clone)]
struct Player {
    /// Boxed, not `String`s: never grown, and held for the player's life
    /// in a list that grows by doubling.
    id: Box<str>,
    name: Box<str>,
    token: Token,
    conn: Option<ConnId>,
}

fn id_of(p: &Player) -> &str {
    &p.id
}

impl Player {
    fn public(&self) -> RelayPlayer {
        RelayPlayer {
            id: self.id.to_string(),
            name: self.name.to_string(),
            connected: self.conn.is_some(),
        }
    }
    fn record(&self) -> PlayerRecord {
        PlayerRecord {
            id: self.id.to_string(),
            name: self.name.to_string(),
            token: self.token.as_str().to_owned(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Host,
    Player(usize),
}

/// The public summary of `GET /api/rooms/:pin`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoomInfo {
    pub pin: String,
    pub open: bool,
    pub app_name: Option<String>,
    pub players: usize,
}

/// What a second `host` / `join` on an attached connection is told.
const ALREADY_ATTACHED: &str = "This connection is already attached.";

/// `Clone`: a driver keeps the state from before a change until the
/// change is durable, and goes back to it if the store fails.
#[derive(Clone)]
pub struct Room {
    pin: String,
    host_token: Token,
    created_at_ms: u64,
    host: Option<ConnId>,
    host_away_since_ms: Option<u64>,
    open: bool,
    /// Players in join order; a kicked player's slot is removed.
    players: Vec<Player>,
    by_id: ById,
    conns: HashMap<ConnId, Role>,
    kicked: HashSet<String>,
    bundle: Option<BundleMeta>,
    limits: RelayLimits,
}

impl Room {
    /// A new room; the caller persists the returned `Created` change before
    /// handing out the PIN.
    pub fn create(pin: String, now_ms: u64, limits: RelayLimits) -> (Room, RoomChange) {
        let record = RoomRecord {
            pin,
            host_token: Token::generate().as_str().to_owned(),
            created_at_ms: now_ms,
            host_away_since_ms: Some(now_ms),
            open: true,
            players: Vec::new(),
            kicked_tokens: Vec::new(),
            bundle: None,
        };
        let (room, _) = Room::restore(record.clone(), now_ms, limits);
        (room, RoomChange::Created(record))
    }

    /// A room as it was stored. Nobody is connected after a restart: a host
    /// that was attached when the server stopped counts as away from
    /// `now_ms`, and the change that stores this is returned.
    pub fn restore(r: RoomRecord, now_ms: u64, limits: RelayLimits) -> (Room, Option<RoomChange>) {
        let players: Vec<Player> = r
            .players
            .into_iter()
            .filter_map(|p| {
                Some(Player {
                    token: Token::parse(&p.token)?,
                    id: p.id.into(),
                    name: p.name.into(),
                    conn: None,
                })
            })
            .collect();
        let mut by_id = ById::default();
        for i in 0..players.len() {
            by_id.insert(&players, id_of, i);
        }
        let fix_up = r
            .host_away_since_ms
            .is_none()
            .then(|| RoomChange::HostAway {
                pin: r.pin.clone(),
                since_ms: Some(now_ms),
            });
        let room = Room {
            host_token: Token::parse(&r.host_token).unwrap_or_else(Token::generate),
            pin: r.pin,
            created_at_ms: r.created_at_ms,
            host: None,
            host_away_since_ms: Some(r.host_away_since_ms.unwrap_or(now_ms)),
            open: r.open,
            players,
            by_id,
            conns: HashMap::new(),
            kicked: r.kicked_tokens.into_iter().collect(),
            bundle: r.bundle,
            limits,
        };
        (room, fix_up)
    }

    pub fn pin(&self) -> &str {
        &self.pin
    }

    pub fn created_at_ms(&self) -> u64 {
        self.created_at_ms
    }

    pub fn host_token(&self) -> &Token {
        &self.host_token
    }

    pub fn info(&self) -> RoomInfo {
        RoomInfo {
            pin: self.pin.clone(),
            open: self.open,
            app_name: self.bundle.as_ref().and_then(|b| b.app_name.clone()),
            players: self.players.len(),
        }
    }

    pub fn bundle(&self) -> Option<&BundleMeta> {
        self.bundle.as_ref()
    }

    pub fn player_count(&self) -> usize {
        self.players.len()
    }

    pub fn host_away_since_ms(&self) -> Option<u64> {
        self.host_away_since_ms
    }

    /// The record a fresh store needs to hold this room as it is now.
    pub fn record(&self) -> RoomRecord {
        RoomRecord {
            pin: self.pin.clone(),
            host_token: self.host_token.as_str().to_owned(),
            created_at_ms: self.created_at_ms,
            host_away_since_ms: self.host_away_since_ms,
            open: self.open,
            players: self.players.iter().map(Player::record).collect(),
            kicked_tokens: self.kicked.iter().cloned().collect(),
            bundle: self.bundle.clone(),
        }
    }

    /// The change that stores an uploaded bundle (the driver chooses its
    /// version above every version it has tried, stored or not). The room
    /// serves it only once the driver reports it stored
    /// ([`Room::bundle_stored`]).
    pub fn bundle_change(&self, meta: BundleMeta, text: Bytes) -> RoomChange {
        RoomChange::Bundle {
            pin: self.pin.clone(),
            meta,
            text,
        }
    }

    /// A bundle is durable: the room serves it, unless a newer one is
    /// stored already.
    pub fn bundle_stored(&mut self, meta: BundleMeta) {
        if self
            .bundle
            .as_ref()
            .is_none_or(|b| b.version < meta.version)
        {
            self.bundle = Some(meta);
        }
    }

    fn send(out: &mut Vec<RoomOutput>, conn: ConnId, frame: RelayServerMessage) {
        out.push(RoomOutput::Send { conn, frame });
    }

    fn fail(
        out: &mut Vec<RoomOutput>,
        conn: ConnId,
        code: RelayErrorCode,
        message: &'static str,
        fatal: bool,
    ) -> AttachOutcome {
        Self::send(out, conn, RelayServerMessage::error(code, message, fatal));
        if fatal {
            out.push(RoomOutput::Close {
                conn,
                code: CLOSE_POLICY,
                reason: code.as_str(),
            });
        }
        AttachOutcome::Refused { fatal }
    }

    fn to_host(&self, out: &mut Vec<RoomOutput>, frame: RelayServerMessage) {
        if let Some(h) = self.host {
            Self::send(out, h, frame);
        }
    }

    /// One frame, encoded once, to every connected player.
    fn to_players(&self, out: &mut Vec<RoomOutput>, frame: RelayServerMessage) {
        let conns: Vec<ConnId> = self.players.iter().filter_map(|p| p.conn).collect();
        if !conns.is_empty() {
            out.push(RoomOutput::Broadcast { conns, frame });
        }
    }

    fn roster(&self) -> Vec<RelayPlayer> {
        self.players.iter().map(Player::public).collect()
    }

    /// The connections attached to this room.
    pub fn conns(&self) -> Vec<ConnId> {
        self.conns.keys().copied().collect()
    }

    /// Whether `conn` is attached to this room.
    pub fn is_attached(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// `{t:'host'}` with the room's PIN. `already_attached`: the
    /// connection is attached to a room (this or another) already.
    pub fn attach_host(
        &mut self,
        conn: ConnId,
        host_token: Option<&str>,
        already_attached: bool,
        out: &mut Vec<RoomOutput>,
    ) -> AttachOutcome {
        if !host_token.is_some_and(|t| self.host_token.matches(t)) {
            return Self::fail(
                out,
                conn,
                RelayErrorCode::NotAllowed,
                "Wrong host token.",
                true,
            );
        }
        if already_attached {
            return Self::fail(
                out,
                conn,
                RelayErrorCode::NotAllowed,
                ALREADY_ATTACHED,
                false,
            );
        }
        if let Some(old) = self.host.take() {
            self.conns.remove(&old);
            out.push(RoomOutput::Close {
                conn: old,
                code: CLOSE_POLICY,
                reason: "replaced by a new host connection",
            });
        }
        self.host = Some(conn);
        self.conns.insert(conn, Role::Host);
        if self.host_away_since_ms.take().is_some() {
            out.push(RoomOutput::Persist(RoomChange::HostAway {
                pin: self.pin.clone(),
                since_ms: None,
            }));
        }
        Self::send(
            out,
            conn,
            RelayServerMessage::Hosting {
                pin: self.pin.clone(),
                players: self.roster(),
            },
        );
        self.to_players(out, RelayServerMessage::HostPresence { connected: true });
        AttachOutcome::Attached { host: true }
    }

    /// `{t:'join'}` with the room's PIN. `already_attached`: the
    /// connection is attached to a room (this or another) already.
    pub fn attach_player(
        &mut self,
        conn: ConnId,
        name: Option<&str>,
        token: Option<&str>,
        already_attached: bool,
        out: &mut Vec<RoomOutput>,
    ) -> AttachOutcome {
        if already_attached {
            return Self::fail(
                out,
                conn,
                RelayErrorCode::NotAllowed,
                ALREADY_ATTACHED,
                false,
            );
        }
        if token.is_some_and(|t| self.kicked.contains(t)) {
            return Self::fail(
                out,
                conn,
                RelayErrorCode::Kicked,
                "You were removed from this game.",
                true,
            );
        }
        let known = token.and_then(|t| self.players.iter().position(|p| p.token.matches(t)));
        let (index, event) = match known {
            Some(i) => {
                if let Some(old) = self.players[i].conn.take() {
                    self.conns.remove(&old);
                    out.push(RoomOutput::Close {
                        conn: old,
                        code: CLOSE_POLICY,
                        reason: "replaced by a new connection",
                    });
                }
                (i, PresenceEvent::Connect)
            }
            None => {
                if !self.open {
                    return Self::fail(
                        out,
                        conn,
                        RelayErrorCode::RoomClosed,
                        "The game is not accepting new players.",
                        true,
                    );
                }
                if self.players.len() >= self.limits.players_per_room {
                    return Self::fail(
                        out,
                        conn,
                        RelayErrorCode::RoomFull,
                        "The game is full.",
                        true,
                    );
                }
                let id = loop {
                    let id = format!("p-{}", random_base64url(6));
                    if self.by_id.get(&self.players, id_of, &id).is_none() {
                        break id;
                    }
                };
                let name = normalize_player_name(name.unwrap_or(""), self.limits.name_length);
                let player = Player {
                    id: id.into(),
                    name: if name.is_empty() {
                        "Player".into()
                    } else {
                        name.into()
                    },
                    token: Token::generate(),
                    conn: None,
                };
                out.push(RoomOutput::Persist(RoomChange::Player {
                    pin: self.pin.clone(),
                    player: player.record(),
                }));
                self.players.push(player);
                self.by_id
                    .insert(&self.players, id_of, self.players.len() - 1);
                (self.players.len() - 1, PresenceEvent::Join)
            }
        };
        self.players[index].conn = Some(conn);
        self.conns.insert(conn, Role::Player(index));
        let p = &self.players[index];
        Self::send(
            out,
            conn,
            RelayServerMessage::Joined {
                pin: self.pin.clone(),
                player_id: p.id.to_string(),
                token: p.token.as_str().to_owned(),
                name: p.name.to_string(),
                host_connected: self.host.is_some(),
            },
        );
        let presence = RelayServerMessage::Presence {
            player: p.public(),
            event,
        };
        self.to_host(out, presence);
        AttachOutcome::Attached { host: false }
    }

    /// A frame from an attached connection. `msg` was decoded from the
    /// client frame whose text the driver keeps: the `data` ranges of
    /// forwarded frames point into it.
    pub fn frame(
        &mut self,
        conn: ConnId,
        msg: &RelayClientMessage,
        now_ms: u64,
        out: &mut Vec<RoomOutput>,
    ) {
        match (self.conns.get(&conn).copied(), msg) {
            (None, _) => {
                Self::fail(
                    out,
                    conn,
                    RelayErrorCode::NotAllowed,
                    "Send \"host\" or \"join\" first.",
                    false,
                );
            }
            (Some(Role::Host), RelayClientMessage::To { to, data }) => {
                // Unknown or disconnected players: dropped silently.
                if let Some(c) = to
                    .as_ref()
                    .and_then(|id| self.by_id.get(&self.players, id_of, id))
                    .and_then(|i| self.players[i].conn)
                {
                    Self::send(out, c, RelayServerMessage::Data { data: data.clone() });
                }
            }
            (Some(Role::Host), RelayClientMessage::Open { open }) => {
                if self.open != *open {
                    self.open = *open;
                    out.push(RoomOutput::Persist(RoomChange::Open {
                        pin: self.pin.clone(),
                        open: *open,
                    }));
                }
            }
            (Some(Role::Host), RelayClientMessage::Kick { player_id }) => self.kick(player_id, out),
            (Some(Role::Host), RelayClientMessage::Close) => self.close(ClosedReason::Host, out),
            (Some(Role::Player(i)), RelayClientMessage::Up { data }) => {
                let frame = RelayServerMessage::From {
                    from: self.players[i].id.to_string(),
                    data: data.clone(),
                };
                self.to_host(out, frame);
            }
            (Some(Role::Player(i)), RelayClientMessage::Rename { name }) => {
                let name =
                    normalize_player_name(name.as_deref().unwrap_or(""), self.limits.name_length);
                if name.is_empty() {
                    return;
                }
                let p = &mut self.players[i];
                // An unchanged name is not written again (a rename flood
                // at the allowed rate must not load the store).
                let changed = *p.name != *name;
                p.name = name.into();
                let (public, record) = (p.public(), p.record());
                if changed {
                    out.push(RoomOutput::Persist(RoomChange::Player {
                        pin: self.pin.clone(),
                        player: record,
                    }));
                }
                self.to_host(
                    out,
                    RelayServerMessage::Presence {
                        player: public,
                        event: PresenceEvent::Rename,
                    },
                );
            }
            (Some(_), RelayClientMessage::Ping) => {
                Self::send(out, conn, RelayServerMessage::Pong { time: now_ms })
            }
            (Some(_), m) => Self::send(
                out,
                conn,
                RelayServerMessage::error(
                    RelayErrorCode::NotAllowed,
                    format!("{:?} is not allowed here.", m.type_name()),
                    false,
                ),
            ),
        }
    }

    fn kick(&mut self, player_id: &str, out: &mut Vec<RoomOutput>) {
        let Some(index) = self.by_id.get(&self.players, id_of, player_id) else {
            return;
        };
        // Indices after the removed slot move down by one.
        self.by_id.remove(&self.players, id_of, index);
        let player = self.players.remove(index);
        for role in self.conns.values_mut() {
            if let Role::Player(i) = role {
                if *i > index {
                    *i -= 1;
                }
            }
        }
        self.kicked.insert(player.token.as_str().to_owned());
        out.push(RoomOutput::Persist(RoomChange::Kicked {
            pin: self.pin.clone(),
            player_id: player.id.to_string(),
            token: player.token.as_str().to_owned(),
        }));
        if let Some(c) = player.conn {
            self.conns.remove(&c);
            Self::send(
                out,
                c,
                RelayServerMessage::Closed {
                    reason: ClosedReason::Kicked,
                },
            );
            out.push(RoomOutput::Close {
                conn: c,
                code: CLOSE_NORMAL,
                reason: "kicked",
            });
        }
        let mut public = player.public();
        public.connected = false;
        self.to_host(
            out,
            RelayServerMessage::Presence {
                player: public,
                event: PresenceEvent::Leave,
            },
        );
    }

    /// A connection went away.
    pub fn detach(&mut self, conn: ConnId, now_ms: u64, out: &mut Vec<RoomOutput>) {
        match self.conns.remove(&conn) {
            Some(Role::Host) => {
                self.host = None;
                self.host_away_since_ms = Some(now_ms);
                out.push(RoomOutput::Persist(RoomChange::HostAway {
                    pin: self.pin.clone(),
                    since_ms: Some(now_ms),
                }));
                self.to_players(out, RelayServerMessage::HostPresence { connected: false });
            }
            Some(Role::Player(i)) => {
                self.players[i].conn = None;
                let player = self.players[i].public();
                self.to_host(
                    out,
                    RelayServerMessage::Presence {
                        player,
                        event: PresenceEvent::Disconnect,
                    },
                );
            }
            None => {}
        }
    }

    /// Closes the room for everyone.
    pub fn close(&mut self, reason: ClosedReason, out: &mut Vec<RoomOutput>) {
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        if !conns.is_empty() {
            out.push(RoomOutput::Broadcast {
                conns: conns.clone(),
                frame: RelayServerMessage::Closed { reason },
            });
        }
        for conn in conns {
            out.push(RoomOutput::Close {
                conn,
                code: CLOSE_NORMAL,
                reason: "room closed",
            });
        }
        self.conns.clear();
        self.host = None;
        for p in &mut self.players {
            p.conn = None;
        }
        out.push(RoomOutput::Persist(RoomChange::Deleted {
            pin: self.pin.clone(),
        }));
        out.push(RoomOutput::RoomClosed);
    }

    /// When this room expires if nothing changes.
    pub fn expires_at_ms(&self) -> u64 {
        let by_age = self
            .created_at_ms
            .saturating_add(self.limits.room_max_age_ms);
        match self.host_away_since_ms {
            Some(t) => by_age.min(t.saturating_add(self.limits.host_away_ms)),
            None => by_age,
        }
    }

    /// Closes the room if its host has been away too long or it is too old.
    pub fn sweep(&mut self, now_ms: u64, out: &mut Vec<RoomOutput>) -> bool {
        if now_ms > self.expires_at_ms() {
            self.close(ClosedReason::Expired, out);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim::{World, T0};
    use super::*;
    use crate::limits::RELAY_LIMITS;

    /// A room keeps an entry per player for its life, in a list grown by
    /// doubling: its texts are boxed (never grown), not `String`s
    /// (docs/BENCHMARKS.md, "An idle connection's queue, writer and room
    /// entry made smaller").
    #[test]
    fn a_players_entry_is_64_bytes() {
        assert_eq!(std::mem::size_of::<Player>(), 64);
    }
    use serde_json::json;

    fn host_frame(pin: &str, token: &str) -> serde_json::Value {
        json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token})
    }

    #[test]
    fn a_wrong_host_token_is_fatal() {
        let mut w = World::new();
        let (pin, _) = w.create_room();
        let h = w.connect();
        w.send(h, host_frame(&pin, "not-the-token"));
        w.expect_error(h, RelayErrorCode::NotAllowed, true);
        assert_eq!(w.closed(h), Some((CLOSE_POLICY, "NOT_ALLOWED")));
        assert!(!w.is_attached(h));
    }

    #[test]
    fn an_attached_connection_cannot_attach_again_and_stays_where_it_is() {
        let mut w = World::new();
        let (h, pin, token) = w.host();
        let (other_pin, other_token) = w.create_room();
        // The wrong token is checked first: fatal, even when attached.
        // (Checked on a second host, so that `h` stays for the rest.)
        let (h2, _, _) = w.host();
        w.send(h2, host_frame(&other_pin, "wrong"));
        w.expect_error(h2, RelayErrorCode::NotAllowed, true);
        // The right token of another room: refused, not fatal.
        w.send(h, host_frame(&other_pin, &other_token));
        let e = w.expect_error(h, RelayErrorCode::NotAllowed, false);
        assert_eq!(e["message"], "This connection is already attached.");
        assert_eq!(w.closed(h), None);
        // Still the host of its room; the other room has no host.
        let (p, id, _) = w.player(&pin, "Ann");
        assert_eq!(w.recv(h)["event"], "join");
        w.send(h, json!({"t": "to", "to": id, "data": 1}));
        assert_eq!(w.recv(p)["data"], 1);
        let q = w.connect();
        w.send(q, json!({"t": "join", "protocol": 1, "pin": other_pin}));
        assert_eq!(w.recv(q)["hostConnected"], false);
        // A player's second join, even to its own room: refused, not fatal.
        w.send(
            p,
            json!({"t": "join", "protocol": 1, "pin": pin, "name": "Bob"}),
        );
        w.expect_error(p, RelayErrorCode::NotAllowed, false);
        assert_eq!(w.closed(p), None);
        assert!(w.drain(h).is_empty(), "no presence for a refused join");
        let _ = token;
    }

    #[test]
    fn a_newer_host_connection_replaces_the_older() {
        let mut w = World::new();
        let (h1, pin, token) = w.host();
        let (p, _, _) = w.player(&pin, "Ann");
        assert_eq!(w.recv(h1)["event"], "join");
        let h2 = w.connect();
        w.send(h2, host_frame(&pin, &token));
        assert_eq!(
            w.closed(h1),
            Some((CLOSE_POLICY, "replaced by a new host connection"))
        );
        let hosting = w.recv(h2);
        assert_eq!(hosting["t"], "hosting");
        assert_eq!(hosting["players"][0]["name"], "Ann");
        assert_eq!(hosting["players"][0]["connected"], true);
        assert_eq!(
            w.drain(p),
            vec![json!({"t": "host-presence", "connected": true})]
        );
        w.send(p, json!({"t": "up", "data": "hi"}));
        assert_eq!(w.recv(h2)["t"], "from");
    }

    #[test]
    fn a_player_rejoins_by_token_keeping_its_name_and_replacing_its_old_connection() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (p1, id, token) = w.player(&pin, "  Ann \t Lee ");
        let join = w.recv(h);
        assert_eq!(
            join,
            json!({"t": "presence", "player": {"id": id, "name": "Ann Lee", "connected": true}, "event": "join"})
        );
        let p2 = w.connect();
        w.send(
            p2,
            json!({"t": "join", "protocol": 1, "pin": pin, "name": "Zed", "token": token}),
        );
        let joined = w.recv(p2);
        assert_eq!(
            (&joined["playerId"], &joined["name"], &joined["token"]),
            (&json!(id), &json!("Ann Lee"), &json!(token))
        );
        assert_eq!(
            w.closed(p1),
            Some((CLOSE_POLICY, "replaced by a new connection"))
        );
        assert_eq!(w.recv(h)["event"], "connect");
        assert_eq!(w.rooms[&pin].room().player_count(), 1);
    }

    #[test]
    fn names_are_normalized_and_an_empty_one_is_player() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (_, _, _) = w.player(&pin, "   ");
        assert_eq!(w.recv(h)["player"]["name"], "Player");
        let (p, _, _) = w.player(&pin, &"x".repeat(40));
        assert_eq!(w.recv(h)["player"]["name"], "x".repeat(32));
        w.send(p, json!({"t": "rename", "name": "  "}));
        w.send(p, json!({"t": "rename", "name": " New   name "}));
        let r = w.recv(h);
        assert_eq!(
            (&r["event"], &r["player"]["name"]),
            (&json!("rename"), &json!("New name"))
        );
        assert!(w.drain(h).is_empty(), "the empty rename was ignored");
        assert!(matches!(
            w.persisted.last(),
            Some(RoomChange::Player { player, .. }) if player.name == "New name"
        ));
        // The same name again: told to the host, not written again.
        let before = w.persisted.len();
        w.send(p, json!({"t": "rename", "name": "New name"}));
        assert_eq!(w.recv(h)["event"], "rename");
        assert_eq!(w.persisted.len(), before, "an unchanged name was written");
    }

    #[test]
    fn a_room_that_is_not_open_takes_known_tokens_only() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (p, _, token) = w.player(&pin, "Ann");
        w.send(h, json!({"t": "open", "open": false}));
        let q = w.connect();
        w.send(
            q,
            json!({"t": "join", "protocol": 1, "pin": pin, "name": "Bob"}),
        );
        w.expect_error(q, RelayErrorCode::RoomClosed, true);
        assert_eq!(w.closed(q), Some((CLOSE_POLICY, "ROOM_CLOSED")));
        w.disconnect(p);
        let p2 = w.connect();
        w.send(
            p2,
            json!({"t": "join", "protocol": 1, "pin": pin, "token": token}),
        );
        assert_eq!(w.recv(p2)["t"], "joined");
    }

    #[test]
    fn a_full_room_refuses_new_players() {
        let mut w = World::with_limits(RelayLimits {
            players_per_room: 2,
            ..RELAY_LIMITS
        });
        let (_, pin, _) = w.host();
        w.player(&pin, "A");
        w.player(&pin, "B");
        let c = w.connect();
        w.send(c, json!({"t": "join", "protocol": 1, "pin": pin}));
        w.expect_error(c, RelayErrorCode::RoomFull, true);
        assert_eq!(w.rooms[&pin].room().player_count(), 2);
    }

    #[test]
    fn to_reaches_one_connected_player_with_its_data_as_sent() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (a, a_id, _) = w.player(&pin, "A");
        let (b, b_id, _) = w.player(&pin, "B");
        w.drain(h);
        w.send_text(
            h,
            &format!(r#"{{"t":"to","to":"{a_id}","data":{{"k": [1, 2.50]}}}}"#),
        );
        assert_eq!(w.recv(a), json!({"t": "data", "data": {"k": [1, 2.5]}}));
        assert!(w.drain(b).is_empty(), "one player only");
        // Unknown and disconnected players: dropped silently.
        w.disconnect(b);
        w.send(h, json!({"t": "to", "to": b_id, "data": 1}));
        w.send(h, json!({"t": "to", "to": "p-nobody", "data": 1}));
        w.send(h, json!({"t": "to", "to": 5, "data": 1}));
        assert!(w.drain(a).is_empty());
        let h_frames = w.drain(h);
        assert_eq!(h_frames.len(), 1, "only the disconnect: {h_frames:?}");
        assert_eq!(h_frames[0]["event"], "disconnect");
    }

    #[test]
    fn up_reaches_the_host_as_from() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (p, id, _) = w.player(&pin, "A");
        w.drain(h);
        w.send_text(p, r#"{"t":"up","data":"answer"}"#);
        w.send_text(p, r#"{"t":"up"}"#);
        assert_eq!(
            w.drain(h),
            vec![
                json!({"t": "from", "from": id, "data": "answer"}),
                json!({"t": "from", "from": id}),
            ]
        );
    }

    #[test]
    fn frames_of_the_other_role_are_not_allowed() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (p, id, _) = w.player(&pin, "A");
        w.drain(h);
        for (conn, t) in [
            (h, "up"),
            (h, "rename"),
            (p, "to"),
            (p, "kick"),
            (p, "close"),
            (p, "fly"),
        ] {
            w.send(conn, json!({"t": t, "playerId": id, "to": id}));
            let e = w.expect_error(conn, RelayErrorCode::NotAllowed, false);
            assert_eq!(e["message"], format!("\"{t}\" is not allowed here."));
        }
        assert!(
            w.rooms.contains_key(&pin),
            "a player's close closed nothing"
        );
        assert_eq!(
            w.rooms[&pin].room().player_count(),
            1,
            "a player's kick kicked nobody"
        );
    }

    #[test]
    fn a_kick_closes_the_player_refuses_its_token_and_keeps_the_others_reachable() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (a, a_id, a_token) = w.player(&pin, "A");
        let (b, b_id, _) = w.player(&pin, "B");
        let (c, c_id, _) = w.player(&pin, "C");
        w.drain(h);
        w.send(h, json!({"t": "kick", "playerId": a_id}));
        assert_eq!(w.recv(a), json!({"t": "closed", "reason": "kicked"}));
        assert_eq!(w.closed(a), Some((CLOSE_NORMAL, "kicked")));
        assert_eq!(
            w.recv(h),
            json!({"t": "presence", "player": {"id": a_id, "name": "A", "connected": false}, "event": "leave"})
        );
        assert!(w.persisted.contains(&RoomChange::Kicked {
            pin: pin.clone(),
            player_id: a_id.clone(),
            token: a_token.clone()
        }));
        // The players after the kicked one are still who they were.
        w.send(h, json!({"t": "to", "to": c_id, "data": "c"}));
        w.send(h, json!({"t": "to", "to": b_id, "data": "b"}));
        assert_eq!(w.recv(c)["data"], "c");
        assert_eq!(w.recv(b)["data"], "b");
        w.send(c, json!({"t": "up", "data": 3}));
        assert_eq!(w.recv(h)["from"], json!(c_id));
        // The kicked token is refused.
        let again = w.connect();
        w.send(
            again,
            json!({"t": "join", "protocol": 1, "pin": pin, "token": a_token}),
        );
        w.expect_error(again, RelayErrorCode::Kicked, true);
        assert_eq!(w.rooms[&pin].room().player_count(), 2);
    }

    #[test]
    fn the_host_going_away_is_told_to_players_and_stored() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (p, _, _) = w.player(&pin, "A");
        w.clock.advance_ms(5_000);
        w.disconnect(h);
        assert_eq!(
            w.drain(p),
            vec![json!({"t": "host-presence", "connected": false})]
        );
        assert_eq!(
            w.persisted.last(),
            Some(&RoomChange::HostAway {
                pin: pin.clone(),
                since_ms: Some(T0 + 5_000)
            })
        );
        assert_eq!(w.rooms[&pin].room().host_away_since_ms(), Some(T0 + 5_000));
    }

    #[test]
    fn a_room_expires_when_its_host_is_away_too_long() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (p, _, _) = w.player(&pin, "A");
        // Attached hosts keep a room: only age counts.
        w.clock.advance_ms(RELAY_LIMITS.host_away_ms * 2);
        assert!(w.sweep().is_empty());
        w.disconnect(h);
        w.drain(p);
        w.clock.advance_ms(RELAY_LIMITS.host_away_ms);
        assert!(w.sweep().is_empty(), "exactly the limit is not past it");
        w.clock.advance_ms(1);
        assert_eq!(w.sweep(), vec![pin.clone()]);
        assert_eq!(w.recv(p), json!({"t": "closed", "reason": "expired"}));
        assert_eq!(w.closed(p), Some((CLOSE_NORMAL, "room closed")));
        assert_eq!(
            w.persisted.last(),
            Some(&RoomChange::Deleted { pin: pin.clone() })
        );
        assert!(!w.rooms.contains_key(&pin));
    }

    #[test]
    fn a_room_expires_at_its_maximum_age_even_with_its_host() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        w.clock.advance_ms(RELAY_LIMITS.room_max_age_ms);
        assert!(w.sweep().is_empty());
        w.clock.advance_ms(1);
        assert_eq!(w.sweep(), vec![pin]);
        assert_eq!(w.recv(h), json!({"t": "closed", "reason": "expired"}));
    }

    #[test]
    fn a_restored_room_counts_an_attached_host_as_away_from_the_restart() {
        let mut w = World::new();
        let (pin, token) = w.create_room();
        let record = |away: Option<u64>| RoomRecord {
            pin: pin.clone(),
            host_token: token.clone(),
            created_at_ms: T0,
            host_away_since_ms: away,
            open: true,
            players: vec![],
            kicked_tokens: vec![],
            bundle: None,
        };
        w.rooms.clear();
        w.persisted.clear();
        w.clock.advance_ms(60_000);
        // The host was attached when the server stopped.
        w.restore(record(None));
        assert_eq!(
            w.persisted,
            vec![RoomChange::HostAway {
                pin: pin.clone(),
                since_ms: Some(T0 + 60_000)
            }]
        );
        w.clock.advance_ms(RELAY_LIMITS.host_away_ms);
        assert!(w.sweep().is_empty(), "away counts from the restart");
        w.clock.advance_ms(1);
        assert_eq!(w.sweep(), vec![pin.clone()]);
        // A host that was away already: its stored time counts, and
        // nothing needs fixing.
        let mut w2 = World::new();
        w2.clock.advance_ms(60_000);
        w2.restore(record(Some(T0)));
        assert!(w2.persisted.is_empty());
        w2.clock.advance_ms(RELAY_LIMITS.host_away_ms - 60_000 + 1);
        assert_eq!(w2.sweep(), vec![pin.clone()]);
        // The restored host token still opens the room.
        let mut w3 = World::new();
        w3.restore(record(Some(T0)));
        let h = w3.connect();
        w3.send(h, host_frame(&pin, &token));
        assert_eq!(w3.recv(h)["t"], "hosting");
    }

    #[test]
    fn the_host_closes_the_room_for_everyone() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (a, _, _) = w.player(&pin, "A");
        let (b, _, _) = w.player(&pin, "B");
        w.drain(h);
        w.send(h, json!({"t": "close"}));
        for c in [h, a, b] {
            assert_eq!(w.recv(c), json!({"t": "closed", "reason": "host"}));
            assert_eq!(w.closed(c), Some((CLOSE_NORMAL, "room closed")));
        }
        assert!(!w.rooms.contains_key(&pin));
    }

    #[test]
    fn open_is_stored_only_when_it_changes() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let before = w.persisted.len();
        w.send(h, json!({"t": "open", "open": true}));
        assert_eq!(w.persisted.len(), before);
        w.send(h, json!({"t": "open", "open": "yes"}));
        assert_eq!(
            w.persisted[before..],
            [RoomChange::Open {
                pin: pin.clone(),
                open: false
            }]
        );
        assert!(!w.rooms[&pin].room().info().open);
    }

    #[test]
    fn a_frame_for_many_is_one_output() {
        let mut w = World::new();
        let (h, pin, _) = w.host();
        let (a, _, _) = w.player(&pin, "A");
        let (b, _, _) = w.player(&pin, "B");
        let mut out = Vec::new();
        let mut room = w.rooms[&pin].room().clone();
        room.detach(h, T0, &mut out);
        let broadcasts: Vec<_> = out
            .iter()
            .filter_map(|o| match o {
                RoomOutput::Broadcast { conns, frame } => Some((conns.clone(), frame.clone())),
                _ => None,
            })
            .collect();
        let mut to = broadcasts[0].0.clone();
        to.sort();
        assert_eq!(broadcasts.len(), 1);
        assert_eq!(to, vec![a, b]);
        assert_eq!(
            broadcasts[0].1,
            RelayServerMessage::HostPresence { connected: false }
        );
    }
}
