//! One task per room: it owns the room's state (`hostwire_memizy::relay::Room`)
//! and handles its commands in order, so "in order, at most once" holds by
//! construction with no lock on the forwarding path. The room's outputs are
//! typed frames; each is encoded once here, however many connections it
//! goes to, and counted by its type.

use super::conn::Outbound;
use super::metrics::RelayMetrics;
use super::Relay;
use axum::extract::ws::Utf8Bytes;
use bytes::Bytes;
use hostwire_memizy::relay::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

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
    GetBundle(oneshot::Sender<Option<(u64, Bytes)>>),
    PutBundle {
        token: String,
        text: Bytes,
        app_name: Option<String>,
        reply: oneshot::Sender<Option<u64>>,
    },
    Shutdown(oneshot::Sender<()>),
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

/// The room's task: handles commands until the room closes.
pub(super) async fn run(
    relay: Arc<Relay>,
    mut room: Room,
    mut bundle: Option<Bytes>,
    mut rx: mpsc::Receiver<RoomCmd>,
) {
    let pin = room.pin().to_owned();
    let metrics = &relay.metrics;
    let mut conns: HashMap<ConnId, Outbound> = HashMap::new();
    let mut out: Vec<RoomOutput> = Vec::new();
    let mut closed = false;
    let mut players_before = room.player_count();
    while let Some(cmd) = rx.recv().await {
        let now = relay.clock.now_ms();
        let mut durable_ack: Option<(oneshot::Sender<Option<u64>>, u64)> = None;
        let mut attaching: Attaching = None;
        let mut outcome = AttachOutcome::Refused { fatal: false };
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
            }
            RoomCmd::Frame { conn, msg, text } => {
                room.frame(conn, &msg, now, &mut out);
                source = text;
            }
            RoomCmd::Detach { conn } => {
                room.detach(conn, now, &mut out);
                conns.remove(&conn);
            }
            RoomCmd::Sweep => {
                if room.sweep(now, &mut out) {
                    metrics.rooms_expired.fetch_add(1, Relaxed);
                    tracing::info!(pin = %pin, "room expired");
                }
            }
            RoomCmd::Info(reply) => {
                let _ = reply.send(room.info());
            }
            RoomCmd::IsHost { token, reply } => {
                let _ = reply.send(room.host_token().matches(&token));
            }
            RoomCmd::GetBundle(reply) => {
                let _ = reply.send(room.bundle().map(|m| m.version).zip(bundle.clone()));
            }
            RoomCmd::PutBundle {
                token,
                text,
                app_name,
                reply,
            } => {
                if room.host_token().matches(&token) {
                    bundle = Some(text.clone());
                    let version = room.set_bundle(text, app_name, &mut out);
                    durable_ack = Some((reply, version));
                } else {
                    let _ = reply.send(None);
                }
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
        let mut changes = Vec::new();
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
                RoomOutput::Persist(c) => changes.push(c),
                RoomOutput::RoomClosed => closed = true,
            }
        }
        // Answered once its frames are queued: the reader's next frames
        // come after them.
        if let Some((_, _, reply)) = attaching.take() {
            let _ = reply.send(outcome);
        }
        match durable_ack {
            Some((reply, version)) => {
                let writer = relay.writer.clone();
                tokio::spawn(async move {
                    let ok = writer.write_durable(changes).await;
                    let _ = reply.send(ok.then_some(version));
                });
            }
            // A full store queue holds this room here: its commands wait
            // in its own bounded queue, its senders behind that.
            None => relay.writer.write_behind(changes).await,
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
    relay.players.fetch_sub(room.player_count() as u64, Relaxed);
    metrics.rooms.fetch_sub(1, Relaxed);
    tracing::info!(pin = %pin, "room closed");
}
