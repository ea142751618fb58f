//! A client's frames carried to the node that owns its unit, over NATS,
//! so that any node serves any client. The node the client reached (its
//! *client node*) keeps the client's WebSocket and runs [`Tunnels::bridge`];
//! the owner runs the protocol's own connection code over a
//! [`ws::Pipe`](crate::ws::Pipe), as for a client of its own: the protocol
//! does not know the difference, and its rules, limits and closes hold.
//!
//! - Opening: a NATS request to the owner's [`open_subject`] naming the
//!   tunnel, the protocol and the client's IP (what per-IP limits count),
//!   answered `ok` once the owner's side is ready, within [`OPEN_TIMEOUT`];
//!   otherwise the client is refused as before (1013, and it reconnects).
//! - Frames: each node subscribes once to its [`frame_subject`] prefix and
//!   hands each message to its tunnel's queue, bounded at
//!   [`TUNNEL_FRAMES`] frames (each within the protocol's message limit,
//!   checked by the client node's WebSocket layer); a full queue ends the
//!   tunnel (1013 to the client, as a full outbound queue does). Every
//!   message carries its sender's sequence number: a gap (NATS lost one)
//!   ends the tunnel with [`CLOSE_LOST`] and the client reconnects.
//! - Liveness: both sides beat ([`wire::Wire::Keepalive`]) at the
//!   protocol's ping interval, which the owner's idle timeout counts; a
//!   peer dropped from the heartbeat table ends its tunnels at once
//!   ([`Tunnels::peer_gone`]), so a dead owner's clients reconnect within
//!   the peer expiry (3 s) and find the unit on its new owner.
//! - A tunnel is never carried on: a piped connection whose unit moved
//!   again is refused as a client would be.

mod bridge;
pub mod http;
mod owner;
pub mod wire;

use crate::metrics::{write_counter, write_gauge, Render};
use crate::ws;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use wire::{Wire, OUT_OF_BAND};

/// How long the owner may take to answer an opening.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// Frames a tunnel's receiving side holds, not yet taken by its
/// connection; one more ends the tunnel as too slow. A client's frames
/// never fill it: its node sends at most [`WINDOW_FRAMES`] ahead of the
/// owner's credit.
pub const TUNNEL_FRAMES: usize = 256;

/// Frames a client's node sends to the owner ahead of the owner's credit
/// (then it reads no more of the client, whose TCP window fills: the
/// backpressure of a direct connection).
pub const WINDOW_FRAMES: u64 = 128;

/// Bytes a client's node sends to the owner ahead of the owner's credit
/// (past it, after the frame that passed it, it reads no more of the
/// client): what one carried client can hold in flight is at most this
/// plus one message of its protocol.
pub const WINDOW_BYTES: u64 = 1024 * 1024;

/// The owner grants credit after this many frames taken, or
/// [`CREDIT_BYTES`], whichever comes first.
const CREDIT_FRAMES: u64 = 16;
const CREDIT_BYTES: u64 = 128 * 1024;

/// The largest frame put back together from fragments; a longer one ends
/// the tunnel (every protocol's message limit is below it).
pub const MAX_CARRIED_FRAME: usize = 16 * 1024 * 1024;

/// Tunnels one node holds open, as client node and as owner together;
/// past it an opening is refused (the client reconnects).
pub const MAX_TUNNELS: usize = 50_000;

/// The largest opening request read (a tunnel id, a protocol name, an IP
/// and a node id).
pub const MAX_OPEN_BYTES: usize = 1024;

/// The close of a client whose tunnel lost a frame or its other node:
/// 1012 "service restart", so that it reconnects.
pub const CLOSE_LOST: ws::Close = (1012, "connection lost between nodes: reconnect");

/// The close of a tunnel whose receiving queue was full.
pub const CLOSE_TOO_SLOW: ws::Close = (1013, "too slow: frames between nodes piled up");

/// Random bytes of a tunnel id (base64url: a NATS subject token).
const TUNNEL_ID_BYTES: usize = 12;

/// The subject a node takes openings on. Node ids may hold '.', which
/// NATS reads as a token separator: they go in hex.
pub fn open_subject(node: &str) -> String {
    format!("hostwire.tunnel.open.{}", hex(node))
}

/// The subject of the frames for `node`'s side of `tunnel`.
pub fn frame_subject(node: &str, tunnel: &str) -> String {
    format!("hostwire.tunnel.frames.{}.{tunnel}", hex(node))
}

/// `s`'s bytes in lowercase hex (a node id in a subject or a token).
pub fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// What a protocol runs a piped connection with: its socket settings and
/// its connection code, given the connection and what the client node
/// knew of the client.
pub struct Acceptor {
    pub config: Arc<ws::Config>,
    #[allow(clippy::type_complexity)]
    pub run: Box<
        dyn Fn(ws::Connection, Client) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync,
    >,
}

/// What the client node knew of a carried client.
pub struct Client {
    /// Its IP, as the client node's per-IP limits count it.
    pub ip: Box<str>,
    /// What its protocol read before the first frame (a device's
    /// handshake query, say), as the protocol wrote it; empty for most.
    pub handshake: String,
}

/// An opening, as the client node asks it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Open {
    tunnel: String,
    protocol: String,
    ip: String,
    from: String,
    #[serde(default)]
    handshake: String,
}

/// One open tunnel on this node: where its frames go in.
struct Entry {
    peer: String,
    tx: mpsc::Sender<Result<Message, axum::Error>>,
    next_seq: u64,
    /// The fragments of the frame being put back together.
    partial: Option<bytes::BytesMut>,
    /// Where the peer's credits go when this side's sender is not the
    /// one reading `tx` (the owner's: its publisher); `None`: into `tx`.
    /// Unbounded, and bounded by the window: the peer grants one credit per
    /// `CREDIT_FRAMES` frames it took, and it took at most `WINDOW_FRAMES`
    /// more than were credited, so few are ever waiting.
    credits: Option<mpsc::UnboundedSender<(u64, u64)>>,
}

/// Counters of the tunnels.
#[derive(Default)]
pub struct TunnelMetrics {
    pub opened_out: AtomicU64,
    pub opened_in: AtomicU64,
    pub refused: AtomicU64,
    pub frames_out: AtomicU64,
    pub frames_in: AtomicU64,
    pub lost: AtomicU64,
    pub too_slow: AtomicU64,
}

/// A node's tunnels, both ways.
pub struct Tunnels {
    node: String,
    client: async_nats::Client,
    acceptors: Mutex<HashMap<&'static str, Arc<Acceptor>>>,
    open: Mutex<HashMap<String, Entry>>,
    sockets: OnceLock<ws::Sockets>,
    /// The node's router, for the HTTP requests other nodes carry here.
    router: OnceLock<axum::Router>,
    pub metrics: TunnelMetrics,
}

impl Tunnels {
    pub fn new(node: String, client: async_nats::Client) -> Arc<Tunnels> {
        Arc::new(Tunnels {
            node,
            client,
            acceptors: Mutex::default(),
            open: Mutex::default(),
            sockets: OnceLock::new(),
            router: OnceLock::new(),
            metrics: TunnelMetrics::default(),
        })
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// How `protocol`'s piped connections are run on this node.
    pub fn accept(&self, protocol: &'static str, acceptor: Acceptor) {
        self.acceptors
            .lock()
            .expect("acceptors")
            .insert(protocol, Arc::new(acceptor));
    }

    /// The server's socket registry: piped connections are closed at
    /// shutdown with the others (their clients get the 1001).
    pub fn set_sockets(&self, sockets: ws::Sockets) {
        let _ = self.sockets.set(sockets);
    }

    /// The router carried HTTP requests are served by (the node's whole
    /// API).
    pub fn set_router(&self, router: axum::Router) {
        let _ = self.router.set(router);
    }

    fn open_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a tunnel's receiving queue; false past [`MAX_TUNNELS`].
    fn register(
        &self,
        id: &str,
        peer: &str,
        tx: mpsc::Sender<Result<Message, axum::Error>>,
    ) -> bool {
        let mut open = self.open_map();
        if open.len() >= MAX_TUNNELS {
            return false;
        }
        open.insert(
            id.to_owned(),
            Entry {
                peer: peer.to_owned(),
                tx,
                next_seq: 0,
                partial: None,
                credits: None,
            },
        );
        true
    }

    /// Sends the peer's credits of tunnel `id` to `to` (see [`Entry`]).
    fn route_credits(&self, id: &str, to: mpsc::UnboundedSender<(u64, u64)>) {
        if let Some(e) = self.open_map().get_mut(id) {
            e.credits = Some(to);
        }
    }

    fn remove(&self, id: &str) {
        self.open_map().remove(id);
    }

    /// How many tunnels are open on this node.
    pub fn len(&self) -> usize {
        self.open_map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a tunnel to or from `peer` is open.
    pub fn has_peer(&self, peer: &str) -> bool {
        self.open_map().values().any(|e| e.peer == peer)
    }

    /// Ends every tunnel to `peer` (it missed its heartbeats): their
    /// queues close, so each side ends as if the other went.
    pub fn peer_gone(&self, peer: &str) {
        let mut open = self.open_map();
        let before = open.len();
        open.retain(|_, e| e.peer != peer);
        let ended = (before - open.len()) as u64;
        self.metrics.lost.fetch_add(ended, Relaxed);
    }

    /// Takes openings and frames until `stop` turns true.
    pub fn start(self: &Arc<Self>, stop: watch::Receiver<bool>) {
        tokio::spawn(Arc::clone(self).take_frames(stop.clone()));
        tokio::spawn(Arc::clone(self).take_openings(stop));
    }

    async fn take_frames(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let subject = format!("hostwire.tunnel.frames.{}.*", hex(&self.node));
        let mut sub = match self.client.subscribe(subject).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot take frames between nodes: clients of units owned elsewhere will be refused");
                return;
            }
        };
        loop {
            tokio::select! {
                m = sub.next() => match m {
                    Some(m) => self.take_frame(&m.subject, &m.payload),
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Hands one message to its tunnel's queue.
    fn take_frame(&self, subject: &str, payload: &Bytes) {
        let Some(id) = subject.rsplit('.').next() else {
            return;
        };
        let decoded = Wire::decode(payload);
        let mut open = self.open_map();
        let Some(entry) = open.get_mut(id) else {
            // Its tunnel ended: what was on the way is dropped.
            return;
        };
        let (seq, wire) = match decoded {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(tunnel = id, error = ?e, "malformed message between nodes: tunnel ended");
                open.remove(id);
                self.metrics.lost.fetch_add(1, Relaxed);
                return;
            }
        };
        if seq != OUT_OF_BAND {
            if seq != entry.next_seq {
                tracing::warn!(
                    tunnel = id,
                    expected = entry.next_seq,
                    got = seq,
                    "a frame between nodes was lost: tunnel ended"
                );
                open.remove(id);
                self.metrics.lost.fetch_add(1, Relaxed);
                return;
            }
            entry.next_seq += 1;
        }
        self.metrics.frames_in.fetch_add(1, Relaxed);
        let joined = |entry: &mut Entry, last: Bytes| match entry.partial.take() {
            None => last,
            Some(mut p) => {
                p.extend_from_slice(&last);
                p.freeze()
            }
        };
        let item = match wire {
            Wire::Fragment(b) => {
                let p = entry.partial.get_or_insert_with(bytes::BytesMut::new);
                if p.len() + b.len() > MAX_CARRIED_FRAME {
                    open.remove(id);
                    self.metrics.lost.fetch_add(1, Relaxed);
                } else {
                    p.extend_from_slice(&b);
                }
                return;
            }
            Wire::Text(b) => match Utf8Bytes::try_from(joined(entry, b)) {
                Ok(t) => Ok(Message::Text(t)),
                Err(_) => {
                    open.remove(id);
                    self.metrics.lost.fetch_add(1, Relaxed);
                    return;
                }
            },
            Wire::Binary(b) => Ok(Message::Binary(joined(entry, b))),
            Wire::Oversized(n) => Err(ws::oversized(n as usize, 0)),
            // A pong is what the driver counts as the peer's sign of life.
            Wire::Keepalive => Ok(Message::Pong(Bytes::new())),
            Wire::Credit { frames, bytes } if entry.credits.is_some() => {
                if let Some(c) = &entry.credits {
                    let _ = c.send((frames, bytes));
                }
                return;
            }
            // A credit reaches the bridge as a pong of its 16 bytes.
            Wire::Credit { frames, bytes } => {
                let mut b = Vec::with_capacity(16);
                b.extend_from_slice(&frames.to_be_bytes());
                b.extend_from_slice(&bytes.to_be_bytes());
                Ok(Message::Pong(b.into()))
            }
            Wire::Close(code, reason) => Ok(Message::Close(Some(CloseFrame {
                code,
                reason: Utf8Bytes::from(reason),
            }))),
            Wire::End => {
                open.remove(id);
                return;
            }
        };
        match entry.tx.try_send(item) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let peer = entry.peer.clone();
                open.remove(id);
                drop(open);
                self.metrics.too_slow.fetch_add(1, Relaxed);
                let (code, reason) = CLOSE_TOO_SLOW;
                self.publish_detached(
                    &peer,
                    id,
                    Wire::Close(code, reason.to_owned()).encode(OUT_OF_BAND),
                );
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                open.remove(id);
            }
        }
    }

    fn publish_detached(&self, peer: &str, tunnel: &str, payload: Bytes) {
        let client = self.client.clone();
        let subject = frame_subject(peer, tunnel);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(OPEN_TIMEOUT, client.publish(subject, payload)).await;
        });
    }

    fn new_id() -> String {
        hostwire_core::token::random_base64url(TUNNEL_ID_BYTES)
    }
}

/// Where a tunnel goes and what it says of its client, for the opening.
pub struct Route<'a> {
    pub owner: &'a str,
    pub protocol: &'static str,
    pub ip: &'a str,
    /// See [`Client::handshake`].
    pub handshake: &'a str,
}

/// Close reasons that came over a tunnel, as the `'static` strings the
/// driver's closes carry: each distinct reason is kept once, at most
/// [`MAX_REASONS`] of them (then a generic one), so that no peer can grow
/// this without bound.
pub fn intern_reason(reason: &str) -> &'static str {
    static KEPT: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = kept.iter().find(|r| **r == reason) {
        return r;
    }
    if kept.len() >= MAX_REASONS || reason.len() > 123 {
        return "closed by the node serving it";
    }
    let r: &'static str = Box::leak(reason.to_owned().into_boxed_str());
    kept.push(r);
    r
}

/// Distinct close reasons kept by [`intern_reason`].
pub const MAX_REASONS: usize = 256;

impl Render for Tunnels {
    fn render(&self, out: &mut String) {
        let m = &self.metrics;
        write_gauge(
            out,
            "hostwire_cluster_tunnels",
            "Tunnels open on this node (clients carried to or from another node).",
            self.len() as i64,
        );
        for (name, help, v) in [
            (
                "hostwire_cluster_tunnels_opened_total",
                "Tunnels this node opened to an owner for a client of its own.",
                &m.opened_out,
            ),
            (
                "hostwire_cluster_tunnels_accepted_total",
                "Tunnels other nodes opened to this node's units.",
                &m.opened_in,
            ),
            (
                "hostwire_cluster_tunnels_refused_total",
                "Tunnels not opened (no answer, refused, or past the cap).",
                &m.refused,
            ),
            (
                "hostwire_cluster_frames_sent_total",
                "Frames this node sent over tunnels (cross-node frames).",
                &m.frames_out,
            ),
            (
                "hostwire_cluster_frames_received_total",
                "Frames this node took from tunnels (cross-node frames).",
                &m.frames_in,
            ),
            (
                "hostwire_cluster_tunnels_lost_total",
                "Tunnels ended by a lost frame, a malformed one or a peer gone.",
                &m.lost,
            ),
            (
                "hostwire_cluster_tunnels_too_slow_total",
                "Tunnels ended because their receiving queue was full.",
                &m.too_slow,
            ),
        ] {
            write_counter(out, name, help, v.load(Relaxed));
        }
    }
}
