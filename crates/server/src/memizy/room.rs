//! One task per room: it owns the room's state (`hostwire_memizy::relay::Room`)
//! and handles its commands in order, so "in order, at most once" holds by
//! construction with no lock on the forwarding path.

use super::conn::Outbound;
use super::Relay;
use crate::metrics::Metrics;
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
        reply: oneshot::Sender<Option<bool>>,
    },
    Frame {
        conn: ConnId,
        msg: RelayClientMessage,
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

/// The room's task: handles commands until the room closes.
pub(super) async fn run(
    relay: Arc<Relay>,
    mut room: Room,
    mut bundle: Option<Bytes>,
    mut rx: mpsc::Receiver<RoomCmd>,
) {
    let pin = room.pin().to_owned();
    let mut conns: HashMap<ConnId, Outbound> = HashMap::new();
    let mut out: Vec<RoomOutput> = Vec::new();
    let mut pending_attach: Option<(ConnId, oneshot::Sender<Option<bool>>)> = None;
    let mut closed = false;
    let mut players_before = room.player_count();
    while let Some(cmd) = rx.recv().await {
        let now = relay.clock.now_ms();
        let mut durable_ack: Option<oneshot::Sender<Option<u64>>> = None;
        let mut bundle_version = None;
        match cmd {
            RoomCmd::Attach {
                conn,
                out: o,
                msg,
                reply,
            } => {
                conns.insert(conn, o);
                pending_attach = Some((conn, reply));
                match &msg {
                    RelayClientMessage::Host { host_token, .. } => {
                        room.attach_host(conn, host_token.as_deref(), &mut out)
                    }
                    RelayClientMessage::Join { name, token, .. } => {
                        room.attach_player(conn, name.as_deref(), token.as_deref(), &mut out)
                    }
                    _ => {}
                }
            }
            RoomCmd::Frame { conn, msg, text } => room.frame(conn, &msg, &text, now, &mut out),
            RoomCmd::Detach { conn } => {
                room.detach(conn, now, &mut out);
                conns.remove(&conn);
            }
            RoomCmd::Sweep => {
                if room.sweep(now, &mut out) {
                    relay.metrics.rooms_expired.fetch_add(1, Relaxed);
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
                    bundle_version = Some(room.set_bundle(text, app_name, &mut out));
                    durable_ack = Some(reply);
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
        let mut last: Option<(Bytes, Utf8Bytes)> = None;
        for o in out.drain(..) {
            match o {
                RoomOutput::Send { conn, frame } => {
                    let Some(target) = conns.get(&conn) else {
                        continue;
                    };
                    // A frame shared by many connections is converted once.
                    let text = match &last {
                        Some((b, u)) if b.as_ptr() == frame.as_ptr() && b.len() == frame.len() => {
                            u.clone()
                        }
                        _ => match Utf8Bytes::try_from(frame.clone()) {
                            Ok(u) => {
                                last = Some((frame.clone(), u.clone()));
                                u
                            }
                            Err(_) => continue,
                        },
                    };
                    count_out(&relay.metrics, &text);
                    target.frame(text, &relay.metrics);
                }
                RoomOutput::Close { conn, code, reason } => {
                    if let Some(target) = conns.remove(&conn) {
                        target.close(code, reason);
                    }
                }
                RoomOutput::Attached { conn, host } => {
                    if let Some((c, reply)) = pending_attach.take() {
                        if c == conn {
                            let _ = reply.send(Some(host));
                        }
                    }
                }
                RoomOutput::Persist(c) => changes.push(c),
                RoomOutput::RoomClosed => closed = true,
            }
        }
        if let Some((_, reply)) = pending_attach.take() {
            // The room refused the connection (the error is queued).
            let _ = reply.send(None);
        }
        match (durable_ack, bundle_version) {
            (Some(reply), Some(version)) => {
                let writer = relay.writer.clone();
                tokio::spawn(async move {
                    let ok = writer.write_durable(changes).await;
                    let _ = reply.send(ok.then_some(version));
                });
            }
            _ => relay.writer.write_behind(changes),
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
    relay.metrics.rooms.fetch_sub(1, Relaxed);
    tracing::info!(pin = %pin, "room closed");
}

pub(super) fn count_out(metrics: &Metrics, text: &str) {
    if text.starts_with("{\"t\":\"data\"") {
        metrics.frame_out("data");
        metrics
            .bytes_forwarded
            .fetch_add(text.len() as u64, Relaxed);
    } else if text.starts_with("{\"t\":\"from\"") {
        metrics.frame_out("from");
        metrics
            .bytes_forwarded
            .fetch_add(text.len() as u64, Relaxed);
    } else {
        // Error frames are ours (`frames::error`): the code is the first
        // `"code":"…"`, read without parsing the frame again.
        if let Some(rest) = text.strip_prefix("{\"t\":\"error\",\"code\":\"") {
            if let Some(end) = rest.find('"') {
                metrics.error(&rest[..end]);
            }
        }
        metrics.frame_out("control");
    }
}
