//! One relay room as a sans-IO state machine: events in (attach, frame,
//! detach, sweep at time T), outputs out (frames for connections, closes,
//! durable changes to persist).

use super::connection::ConnId;
use super::protocol::*;
use crate::limits::RelayLimits;
use bytes::Bytes;
use hostwire_core::token::random_base64url;
use hostwire_core::Token;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// A player as it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlayerRecord {
    pub id: String,
    pub name: String,
    pub token: String,
}

/// The uploaded bundle's metadata (the text itself is stored beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleMeta {
    pub version: u64,
    pub app_name: Option<String>,
}

/// Everything a room needs to go on after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomRecord {
    pub pin: String,
    pub host_token: String,
    pub created_at_ms: u64,
    pub host_away_since_ms: Option<u64>,
    pub open: bool,
    pub players: Vec<PlayerRecord>,
    pub kicked_tokens: Vec<String>,
    pub bundle: Option<BundleMeta>,
}

/// A durable change of a room, written behind forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoomChange {
    Created(RoomRecord),
    HostAway {
        pin: String,
        since_ms: Option<u64>,
    },
    Open {
        pin: String,
        open: bool,
    },
    Player {
        pin: String,
        player: PlayerRecord,
    },
    Kicked {
        pin: String,
        player_id: String,
        token: String,
    },
    Bundle {
        pin: String,
        meta: BundleMeta,
        text: Bytes,
    },
    Deleted {
        pin: String,
    },
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoomOutput {
    Send {
        conn: ConnId,
        frame: Bytes,
    },
    Close {
        conn: ConnId,
        code: u16,
        reason: &'static str,
    },
    /// The connection is now attached (the driver switches its rate limit).
    Attached {
        conn: ConnId,
        host: bool,
    },
    Persist(RoomChange),
    /// The room is gone; the driver forgets it.
    RoomClosed,
}

#[derive(Debug, Clone)]
struct Player {
    id: String,
    name: String,
    token: Token,
    conn: Option<ConnId>,
}

impl Player {
    fn public(&self) -> RelayPlayer {
        RelayPlayer {
            id: self.id.clone(),
            name: self.name.clone(),
            connected: self.conn.is_some(),
        }
    }
    fn record(&self) -> PlayerRecord {
        PlayerRecord {
            id: self.id.clone(),
            name: self.name.clone(),
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

pub struct Room {
    pin: String,
    host_token: Token,
    created_at_ms: u64,
    host: Option<ConnId>,
    host_away_since_ms: Option<u64>,
    open: bool,
    /// Players in join order; a kicked player's slot is removed.
    players: Vec<Player>,
    by_id: HashMap<String, usize>,
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
        (
            Room::restore(record.clone(), now_ms, limits),
            RoomChange::Created(record),
        )
    }

    /// A room as it was stored. Nobody is connected after a restart: a host
    /// that was attached counts as away from `now_ms`.
    pub fn restore(r: RoomRecord, now_ms: u64, limits: RelayLimits) -> Room {
        let players: Vec<Player> = r
            .players
            .into_iter()
            .filter_map(|p| {
                Some(Player {
                    token: Token::parse(&p.token)?,
                    id: p.id,
                    name: p.name,
                    conn: None,
                })
            })
            .collect();
        let by_id = players
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id.clone(), i))
            .collect();
        Room {
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
        }
    }

    pub fn pin(&self) -> &str {
        &self.pin
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

    /// Records an uploaded bundle; returns its version.
    pub fn set_bundle(
        &mut self,
        text: Bytes,
        app_name: Option<String>,
        out: &mut Vec<RoomOutput>,
    ) -> u64 {
        let version = self.bundle.as_ref().map_or(0, |b| b.version) + 1;
        let meta = BundleMeta { version, app_name };
        self.bundle = Some(meta.clone());
        out.push(RoomOutput::Persist(RoomChange::Bundle {
            pin: self.pin.clone(),
            meta,
            text,
        }));
        version
    }

    fn send(out: &mut Vec<RoomOutput>, conn: ConnId, frame: Bytes) {
        out.push(RoomOutput::Send { conn, frame });
    }

    fn fail(
        out: &mut Vec<RoomOutput>,
        conn: ConnId,
        code: RelayErrorCode,
        message: &str,
        fatal: bool,
    ) {
        Self::send(out, conn, frames::error(code, message, fatal));
        if fatal {
            out.push(RoomOutput::Close {
                conn,
                code: CLOSE_POLICY,
                reason: code.as_str(),
            });
        }
    }

    fn to_host(&self, out: &mut Vec<RoomOutput>, frame: Bytes) {
        if let Some(h) = self.host {
            Self::send(out, h, frame);
        }
    }

    /// One frame, serialized once, to every connected player.
    fn to_players(&self, out: &mut Vec<RoomOutput>, frame: Bytes) {
        for p in &self.players {
            if let Some(c) = p.conn {
                Self::send(out, c, frame.clone());
            }
        }
    }

    fn roster(&self) -> Vec<RelayPlayer> {
        self.players.iter().map(Player::public).collect()
    }

    /// Whether `conn` is attached to this room.
    pub fn is_attached(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// `{t:'host'}` with the room's PIN.
    pub fn attach_host(
        &mut self,
        conn: ConnId,
        host_token: Option<&str>,
        out: &mut Vec<RoomOutput>,
    ) {
        if !host_token.is_some_and(|t| self.host_token.matches(t)) {
            return Self::fail(
                out,
                conn,
                RelayErrorCode::NotAllowed,
                "Wrong host token.",
                true,
            );
        }
        if self.conns.contains_key(&conn) {
            return Self::fail(
                out,
                conn,
                RelayErrorCode::NotAllowed,
                "This connection is already attached.",
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
        out.push(RoomOutput::Attached { conn, host: true });
        Self::send(out, conn, frames::hosting(&self.pin, &self.roster()));
        self.to_players(out, frames::host_presence(true));
    }

    /// `{t:'join'}` with the room's PIN.
    pub fn attach_player(
        &mut self,
        conn: ConnId,
        name: Option<&str>,
        token: Option<&str>,
        out: &mut Vec<RoomOutput>,
    ) {
        if self.conns.contains_key(&conn) {
            return Self::fail(
                out,
                conn,
                RelayErrorCode::NotAllowed,
                "This connection is already attached.",
                false,
            );
        }
        if let Some(t) = token {
            if self.kicked.contains(t) {
                return Self::fail(
                    out,
                    conn,
                    RelayErrorCode::Kicked,
                    "You were removed from this game.",
                    true,
                );
            }
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
                    if !self.by_id.contains_key(&id) {
                        break id;
                    }
                };
                let name = normalize_player_name(name.unwrap_or(""), self.limits.name_length);
                let player = Player {
                    id: id.clone(),
                    name: if name.is_empty() {
                        "Player".into()
                    } else {
                        name
                    },
                    token: Token::generate(),
                    conn: None,
                };
                out.push(RoomOutput::Persist(RoomChange::Player {
                    pin: self.pin.clone(),
                    player: player.record(),
                }));
                self.players.push(player);
                self.by_id.insert(id, self.players.len() - 1);
                (self.players.len() - 1, PresenceEvent::Join)
            }
        };
        self.players[index].conn = Some(conn);
        self.conns.insert(conn, Role::Player(index));
        out.push(RoomOutput::Attached { conn, host: false });
        let p = &self.players[index];
        Self::send(
            out,
            conn,
            frames::joined(
                &self.pin,
                &p.id,
                p.token.as_str(),
                &p.name,
                self.host.is_some(),
            ),
        );
        self.to_host(out, frames::presence(&p.public(), event));
    }

    /// A frame from an attached connection; `text` is the frame, `msg` its
    /// decoded form (whose data ranges point into `text`).
    pub fn frame(
        &mut self,
        conn: ConnId,
        msg: &RelayClientMessage,
        text: &str,
        now_ms: u64,
        out: &mut Vec<RoomOutput>,
    ) {
        let slice = |r: &Option<Range<usize>>| r.as_ref().and_then(|r| text.get(r.clone()));
        match (self.conns.get(&conn).copied(), msg) {
            (None, _) => Self::fail(
                out,
                conn,
                RelayErrorCode::NotAllowed,
                "Send \"host\" or \"join\" first.",
                false,
            ),
            (Some(Role::Host), RelayClientMessage::To { to, data }) => {
                // Unknown or disconnected players: dropped silently.
                if let Some(c) = to
                    .as_ref()
                    .and_then(|id| self.by_id.get(id))
                    .and_then(|&i| self.players[i].conn)
                {
                    Self::send(out, c, frames::data(slice(data)));
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
                let frame = frames::from(&self.players[i].id, slice(data));
                self.to_host(out, frame);
            }
            (Some(Role::Player(i)), RelayClientMessage::Rename { name }) => {
                let name =
                    normalize_player_name(name.as_deref().unwrap_or(""), self.limits.name_length);
                if name.is_empty() {
                    return;
                }
                let p = &mut self.players[i];
                p.name = name;
                let (public, record) = (p.public(), p.record());
                out.push(RoomOutput::Persist(RoomChange::Player {
                    pin: self.pin.clone(),
                    player: record,
                }));
                self.to_host(out, frames::presence(&public, PresenceEvent::Rename));
            }
            (Some(_), RelayClientMessage::Ping) => Self::send(out, conn, frames::pong(now_ms)),
            (Some(_), m) => Self::fail(
                out,
                conn,
                RelayErrorCode::NotAllowed,
                &format!("{:?} is not allowed here.", m.type_name()),
                false,
            ),
        }
    }

    fn kick(&mut self, player_id: &str, out: &mut Vec<RoomOutput>) {
        let Some(index) = self.by_id.get(player_id).copied() else {
            return;
        };
        let player = self.players.remove(index);
        self.by_id.remove(&player.id);
        // Indices after the removed slot move down by one.
        for i in self.by_id.values_mut() {
            if *i > index {
                *i -= 1;
            }
        }
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
            player_id: player.id.clone(),
            token: player.token.as_str().to_owned(),
        }));
        if let Some(c) = player.conn {
            self.conns.remove(&c);
            Self::send(out, c, frames::closed(ClosedReason::Kicked));
            out.push(RoomOutput::Close {
                conn: c,
                code: CLOSE_NORMAL,
                reason: "kicked",
            });
        }
        let mut public = player.public();
        public.connected = false;
        self.to_host(out, frames::presence(&public, PresenceEvent::Leave));
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
                self.to_players(out, frames::host_presence(false));
            }
            Some(Role::Player(i)) => {
                self.players[i].conn = None;
                let public = self.players[i].public();
                self.to_host(out, frames::presence(&public, PresenceEvent::Disconnect));
            }
            None => {}
        }
    }

    /// Closes the room for everyone.
    pub fn close(&mut self, reason: ClosedReason, out: &mut Vec<RoomOutput>) {
        let frame = frames::closed(reason);
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        for c in conns {
            Self::send(out, c, frame.clone());
            out.push(RoomOutput::Close {
                conn: c,
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
