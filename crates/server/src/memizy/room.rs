//! One task per room: it owns the room's state (`hostwire_memizy::relay::Room`)
//! and handles its commands in order, so "in order, at most once" holds by
//! construction with no lock on the forwarding path. The room's outputs are
//! typed frames; each is encoded once here, however many connections it
//! goes to, and counted by its type.
//!
//! A change the store keeps (a join, a kick, `open`, a rename, the room's
//! close or expiry) is acknowledged only once it is durable: the room waits
//! for the store before it sends the change's frames or takes its next
//! command, and if the store fails it goes back to the state from before the
//! command and tells whoever asked (`INTERNAL_ERROR`). Forwarding never
//! waits for the store: while a change is being stored, other connections'
//! `to`, `up` and `ping` are handled on the state from before it. The
//! host-away time is written behind (it only moves expiry after a restart)
//! and written again at the next sweep if it failed. Bundles are written
//! beside the room's commands, and served once stored.

use super::conn::Outbound;
use super::metrics::RelayMetrics;
use super::Relay;
use crate::store_writer::Durable;
use axum::extract::ws::Utf8Bytes;
use bytes::Bytes;
use hostwire_memizy::relay::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

pub(super) enum RoomCmd {
    Attach {
        conn: ConnId,
        out: Outbound,
        msg: RelayClientMessage,
        already_attached: bool,
        reply: oneshot::Sender<AttachOutcome>,
    },
    Frame {
        conn: ConnId,
        msg: RelayClientMessage,
        /// The client frame: `msg`'s data ranges point into it.
        text: Utf8Bytes,
    },
    Detach {
        conn: ConnId,
    },
    Sweep,
    Info(oneshot::Sender<RoomInfo>),
    /// Whether a bearer token is the room's host token.
    IsHost {
        token: String,
        reply: oneshot::Sender<bool>,
    },
    /// The room's creation time and the version of the bundle it serves
    /// (its bytes are in the store).
    GetBundle(oneshot::Sender<Option<(u64, u64)>>),
    PutBundle {
        token: String,
        text: Bytes,
        app_name: Option<String>,
        reply: oneshot::Sender<PutOutcome>,
    },
    /// A bundle write has ended (sent by the task that waited for it).
    BundleWritten {
        meta: BundleMeta,
        durable: bool,
        reply: oneshot::Sender<PutOutcome>,
    },
    Shutdown(oneshot::Sender<()>),
}

/// How a bundle upload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PutOutcome {
    /// Durable, and served from now on as this version.
    Stored(u64),
    NotTheHost,
    /// The store failed: the room serves the bundle it served before.
    NotStored,
}

#[derive(Clone)]
pub(super) struct RoomHandle {
    pub(super) tx: mpsc::Sender<RoomCmd>,
}

/// A frame encoded for writing, and counted as queued for `copies`
/// connections.
fn encode(
    metrics: &RelayMetrics,
    frame: &RelayServerMessage,
    source: &str,
    copies: usize,
) -> Utf8Bytes {
    // A `String` is UTF-8 already: no check on the way to the socket.
    let text = Utf8Bytes::from(frame.encode(source));
    metrics.frame_out(frame, text.len(), copies);
    text
}

/// The connection being attached, until the room has answered it.
type Attaching = Option<(ConnId, Outbound, oneshot::Sender<AttachOutcome>)>;

/// Where a frame for `conn` goes: a connection of the room, or the one
/// being attached (a refused connection is not the room's, but its answer
/// goes to it).
fn target<'a>(
    conns: &'a HashMap<ConnId, Outbound>,
    attaching: &'a Attaching,
    conn: ConnId,
) -> Option<&'a Outbound> {
    conns.get(&conn).or_else(|| {
        attaching
            .as_ref()
            .filter(|(c, ..)| *c == conn)
            .map(|(_, o, _)| o)
    })
}

/// Whether a command may make a change that is acknowledged only once
/// durable (so the state from before it is kept, to go back to).
fn may_change_durably(cmd: &RoomCmd, room: &Room, now: u64) -> bool {
    match cmd {
        RoomCmd::Attach { msg, .. } => matches!(msg, RelayClientMessage::Join { .. }),
        RoomCmd::Frame { msg, .. } => matches!(
            msg,
            RelayClientMessage::Open { .. }
                | RelayClientMessage::Kick { .. }
                | RelayClientMessage::Close
                | RelayClientMessage::Rename { .. }
        ),
        RoomCmd::Sweep => now > room.expires_at_ms(),
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

/// The room's task: handles commands until the room closes.
pub(super) async fn run(
    relay: Arc<Relay>,
    mut room: Room,
    mut rx: mpsc::Receiver<RoomCmd>,
    itself: mpsc::WeakSender<RoomCmd>,
) {
    let pin = room.pin().to_owned();
    let metrics = &relay.metrics;
    let mut conns: HashMap<ConnId, Outbound> = HashMap::new();
    let mut out: Vec<RoomOutput> = Vec::new();
    let mut closed = false;
    let mut players_before = room.player_count();
    // The last host-away write, and whether one failed since the last
    // sweep (the sweep writes the current value again).
    let mut host_away: Option<Durable> = None;
    let mut host_away_unsaved = false;
    // Every bundle version tried, stored or not: a failed upload's number
    // is never given to other content.
    let mut bundle_versions = room.bundle().map_or(0, |b| b.version);
    // A command that came while a change was being stored and could not
    // go ahead of it: the next one handled.
    let mut held: Option<RoomCmd> = None;
    loop {
        let cmd = match held.take() {
            Some(c) => c,
            None => match rx.recv().await {
                Some(c) => c,
                None => break,
            },
        };
        let now = relay.clock.now_ms();
        if let Some(ok) = host_away.as_mut().and_then(Durable::poll_now) {
            host_away_unsaved |= !ok;
            host_away = None;
        }
        let mut before = may_change_durably(&cmd, &room, now).then(|| room.clone());
        let mut attaching: Attaching = None;
        let mut outcome = AttachOutcome::Refused { fatal: false };
        // Who asked for the change, and what they asked.
        let mut asked: Option<(ConnId, RelayClientMessage)> = None;
        let mut sweep = false;
        // The client frame that `data` ranges of this command's outputs
        // point into.
        let mut source = Utf8Bytes::from_static("");
        match cmd {
            RoomCmd::Attach {
                conn,
                out: o,
                msg,
                already_attached,
                reply,
            } => {
                outcome = match &msg {
                    RelayClientMessage::Host { host_token, .. } => {
                        room.attach_host(conn, host_token.as_deref(), already_attached, &mut out)
                    }
                    RelayClientMessage::Join { name, token, .. } => room.attach_player(
                        conn,
                        name.as_deref(),
                        token.as_deref(),
                        already_attached,
                        &mut out,
                    ),
                    _ => AttachOutcome::Refused { fatal: false },
                };
                if matches!(outcome, AttachOutcome::Attached { .. }) {
                    conns.insert(conn, o.clone());
                }
                attaching = Some((conn, o, reply));
                asked = Some((conn, msg));
            }
            RoomCmd::Frame { conn, msg, text } => {
                room.frame(conn, &msg, now, &mut out);
                source = text;
                if before.is_some() {
                    asked = Some((conn, msg));
                }
            }
            RoomCmd::Detach { conn } => {
                room.detach(conn, now, &mut out);
                conns.remove(&conn);
            }
            RoomCmd::Sweep => {
                sweep = room.sweep(now, &mut out);
                if !sweep && host_away_unsaved {
                    host_away_unsaved = false;
                    out.push(RoomOutput::Persist(RoomChange::HostAway {
                        pin: pin.clone(),
                        since_ms: room.host_away_since_ms(),
                    }));
                }
            }
            RoomCmd::Info(reply) => {
                let _ = reply.send(room.info());
            }
            RoomCmd::IsHost { token, reply } => {
                let _ = reply.send(room.host_token().matches(&token));
            }
            RoomCmd::GetBundle(reply) => {
                let _ = reply.send(room.bundle().map(|m| (room.created_at_ms(), m.version)));
            }
            RoomCmd::PutBundle {
                token,
                text,
                app_name,
                reply,
            } => {
                if !room.host_token().matches(&token) {
                    let _ = reply.send(PutOutcome::NotTheHost);
                    continue;
                }
                bundle_versions += 1;
                let meta = BundleMeta {
                    version: bundle_versions,
                    app_name,
                };
                let change = room.bundle_change(meta.clone(), text);
                // Queued in the room's order; its answer is awaited beside
                // the room, which goes on forwarding meanwhile.
                let durable = relay.writer.queue_acked(&pin, vec![change]).await;
                let itself = itself.clone();
                tokio::spawn(
                    async move {
                        let durable = durable.wait().await;
                        let cmd = RoomCmd::BundleWritten {
                            meta,
                            durable,
                            reply,
                        };
                        // A room gone meanwhile drops the reply: 404.
                        if let Some(tx) = itself.upgrade() {
                            let _ = tx.send(cmd).await;
                        }
                    }
                    .in_current_span(),
                );
                continue;
            }
            RoomCmd::BundleWritten {
                meta,
                durable,
                reply,
            } => {
                let answer = if durable {
                    let version = meta.version;
                    room.bundle_stored(meta);
                    relay.bundles.forget(&pin);
                    PutOutcome::Stored(version)
                } else {
                    PutOutcome::NotStored
                };
                let _ = reply.send(answer);
                continue;
            }
            RoomCmd::Shutdown(done) => {
                for o in conns.values() {
                    o.close(CLOSE_GOING_AWAY, "server shutting down");
                }
                conns.clear();
                let _ = done.send(());
                continue;
            }
        }
        // The durable changes first: nothing of this command is sent
        // before they are stored.
        let mut changes = Vec::new();
        if out.iter().any(|o| matches!(o, RoomOutput::Persist(_))) {
            for o in std::mem::take(&mut out) {
                match o {
                    RoomOutput::Persist(c) => changes.push(c),
                    o => out.push(o),
                }
            }
        }
        let acked = changes
            .iter()
            .any(|c| !matches!(c, RoomChange::HostAway { .. }));
        if acked {
            // A full store queue holds this room here: its commands wait
            // in its own bounded queue, its senders behind that.
            let stored = relay.writer.queue_acked(&pin, changes).await.wait();
            tokio::pin!(stored);
            // Meanwhile other connections' `to`, `up` and `ping` go ahead,
            // on the state from before the change, as if they had come just
            // before it: they change nothing, and the change is not theirs.
            // Anything else waits, and so does everything after it.
            let by = asked.as_ref().map(|(c, _)| *c);
            let durable = loop {
                tokio::select! {
                    biased;
                    ok = &mut stored => break ok,
                    cmd = rx.recv(), if held.is_none() => match cmd {
                        Some(RoomCmd::Frame { conn, msg, text })
                            if before.is_some() && goes_ahead(conn, &msg, by) =>
                        {
                            let mut ahead = Vec::new();
                            if let Some(b) = before.as_mut() {
                                b.frame(conn, &msg, relay.clock.now_ms(), &mut ahead);
                            }
                            for o in ahead {
                                if let RoomOutput::Send { conn, frame } = o {
                                    if let Some(t) = conns.get(&conn) {
                                        t.frame(encode(metrics, &frame, &text, 1), metrics);
                                    }
                                }
                            }
                        }
                        Some(cmd) => held = Some(cmd),
                        // Closing: the senders are gone; the answer still
                        // comes.
                        None => break (&mut stored).await,
                    },
                }
            };
            if !durable {
                match before {
                    Some(b) => room = b,
                    None => tracing::error!("a change failed that cannot be undone"),
                }
                out.clear();
                if sweep {
                    // Tried again at the next sweep.
                    tracing::warn!("expired room not deleted: the store failed");
                    sweep = false;
                }
                if let Some((conn, msg)) = &asked {
                    let frame = RelayServerMessage::error(
                        RelayErrorCode::InternalError,
                        not_stored(msg),
                        false,
                    );
                    out.push(RoomOutput::Send { conn: *conn, frame });
                    if attaching.is_some() {
                        // Not joined: the client reconnects and joins
                        // again, as after any dropped connection.
                        conns.remove(conn);
                        outcome = AttachOutcome::Refused { fatal: true };
                        out.push(RoomOutput::Close {
                            conn: *conn,
                            code: CLOSE_INTERNAL_ERROR,
                            reason: "store unavailable",
                        });
                    }
                }
            }
        } else if !changes.is_empty() {
            host_away = Some(relay.writer.queue_acked(&pin, changes).await);
        }
        if sweep {
            metrics.rooms_expired.fetch_add(1, Relaxed);
            tracing::info!("room expired");
        }
        for o in out.drain(..) {
            match o {
                RoomOutput::Send { conn, frame } => {
                    if let Some(t) = target(&conns, &attaching, conn) {
                        t.frame(encode(metrics, &frame, &source, 1), metrics);
                    }
                }
                RoomOutput::Broadcast { conns: to, frame } => {
                    let targets: Vec<&Outbound> = to.iter().filter_map(|c| conns.get(c)).collect();
                    if !targets.is_empty() {
                        let text = encode(metrics, &frame, &source, targets.len());
                        for t in targets {
                            t.frame(text.clone(), metrics);
                        }
                    }
                }
                RoomOutput::Close { conn, code, reason } => {
                    if let Some(t) = conns.remove(&conn) {
                        t.close(code, reason);
                    } else if let Some(t) = target(&conns, &attaching, conn) {
                        t.close(code, reason);
                    }
                }
                RoomOutput::Persist(_) => {}
                RoomOutput::RoomClosed => closed = true,
            }
        }
        // Answered once its frames are queued: the reader's next frames
        // come after them.
        if let Some((_, _, reply)) = attaching.take() {
            let _ = reply.send(outcome);
        }
        let players_now = room.player_count();
        if players_now != players_before {
            if players_now > players_before {
                relay
                    .players
                    .fetch_add((players_now - players_before) as u64, Relaxed);
            } else {
                relay
                    .players
                    .fetch_sub((players_before - players_now) as u64, Relaxed);
            }
            players_before = players_now;
        }
        if closed {
            break;
        }
    }
    if let Ok(mut rooms) = relay.rooms.lock() {
        rooms.remove(&pin);
    }
    relay.bundles.forget(&pin);
    relay.players.fetch_sub(room.player_count() as u64, Relaxed);
    metrics.rooms.fetch_sub(1, Relaxed);
    tracing::info!("room closed");
}
