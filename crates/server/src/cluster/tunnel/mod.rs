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
//! - Frames: all the tunnels from one node to another share one
//!   [`link::Link`], which publishes their messages in batches, one NATS
//!   message per batch, on the receiving node's [`frame_subject`]; each
//!   node subscribes to its own once and hands each message of a batch to
//!   its tunnel: on the owner, to the queue its pipe reads, bounded at
//!   [`TUNNEL_FRAMES`] frames (each within the protocol's message limit,
//!   checked by the client node's WebSocket layer), a full queue ending the
//!   tunnel (1013 to the client, as a full outbound queue does); on the
//!   client's node, straight to the client's outbound queue. Every
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
mod dispatch;
pub mod http;
pub mod link;
mod owner;
pub mod wire;

use crate::metrics::{write_counter, write_gauge, Render};
use crate::ws;
use crate::ws::{CloseFrame, Message, Utf8Bytes};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

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

/// The subject of the batches of frames for `node`.
pub fn frame_subject(node: &str) -> String {
    format!("hostwire.tunnel.frames.{}", hex(node))
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
    to: dispatch::To,
    next_seq: u64,
    /// The fragments of the frame being put back together.
    partial: Option<bytes::BytesMut>,
    /// Where the peer's credits go when this side's sender is not the
    /// one reading its queue (the owner's: its pipe's sink; the client's
    /// node: the bridge reading its client).
    window: Option<Arc<Window>>,
}

/// What one side of a tunnel has sent that the other has not credited
/// yet: past [`WINDOW_FRAMES`] or [`WINDOW_BYTES`] it sends no more.
#[derive(Default)]
pub(super) struct Window {
    state: Mutex<(u64, u64, Option<Waker>)>,
}

impl Window {
    fn state(&self) -> std::sync::MutexGuard<'_, (u64, u64, Option<Waker>)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ready while the window is open; otherwise woken by the next credit.
    pub(super) fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.state();
        if s.0 < WINDOW_FRAMES && s.1 < WINDOW_BYTES {
            return Poll::Ready(());
        }
        s.2 = Some(cx.waker().clone());
        Poll::Pending
    }

    pub(super) fn sent(&self, bytes: u64) {
        let mut s = self.state();
        s.0 += 1;
        s.1 += bytes;
    }

    pub(super) fn credit(&self, frames: u64, bytes: u64) {
        let mut s = self.state();
        s.0 = s.0.saturating_sub(frames);
        s.1 = s.1.saturating_sub(bytes);
        if let Some(w) = s.2.take() {
            w.wake();
        }
    }
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
    /// NATS messages of frames (batches: see [`link`]) sent and taken.
    pub batches_out: AtomicU64,
    pub batches_in: AtomicU64,
}

/// A node's tunnels, both ways.
pub struct Tunnels {
    node: String,
    client: async_nats::Client,
    acceptors: Mutex<HashMap<&'static str, Arc<Acceptor>>>,
    open: Mutex<HashMap<String, Entry>>,
    /// The links to other nodes, each while a tunnel holds it.
    links: Mutex<HashMap<String, Weak<link::Link>>>,
    sockets: OnceLock<ws::Sockets>,
    /// The node's router, for the HTTP requests other nodes carry here.
    router: OnceLock<axum::Router>,
    pub metrics: Arc<TunnelMetrics>,
}

impl Tunnels {
    pub fn new(node: String, client: async_nats::Client) -> Arc<Tunnels> {
        Arc::new(Tunnels {
            node,
            client,
            acceptors: Mutex::default(),
            open: Mutex::default(),
            links: Mutex::default(),
            sockets: OnceLock::new(),
            router: OnceLock::new(),
            metrics: Arc::default(),
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
    fn register(&self, id: &str, peer: &str, to: dispatch::To) -> bool {
        let mut open = self.open_map();
        if open.len() >= MAX_TUNNELS {
            return false;
        }
        open.insert(
            id.to_owned(),
            Entry {
                peer: peer.to_owned(),
                to,
                next_seq: 0,
                partial: None,
                window: None,
            },
        );
        true
    }

    /// Sends the peer's credits of tunnel `id` to `window` (see [`Entry`]).
    fn route_credits(&self, id: &str, window: Arc<Window>) {
        if let Some(e) = self.open_map().get_mut(id) {
            e.window = Some(window);
        }
    }

    /// The link to `peer`, started if no tunnel holds one.
    pub(super) fn link(&self, peer: &str) -> Arc<link::Link> {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = links.get(peer).and_then(Weak::upgrade) {
            return l;
        }
        // Links of peers no tunnel holds any more go (peer names come
        // from openings: they must not pile up).
        links.retain(|_, l| l.strong_count() > 0);
        let l = link::Link::start(
            self.client.clone(),
            frame_subject(peer),
            Arc::clone(&self.metrics),
        );
        links.insert(peer.to_owned(), Arc::downgrade(&l));
        l
    }

    /// How a tunnel to `peer` sends.
    pub(super) fn sender(&self, peer: &str, tunnel: &str) -> link::Sender {
        link::Sender::new(self.link(peer), tunnel.to_owned())
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
        let (mut gone, mut ended) = (Vec::new(), 0);
        self.open_map().retain(|_, e| {
            if e.peer != peer {
                return true;
            }
            ended += 1;
            if let dispatch::To::Client { end, .. } = &e.to {
                gone.push(Arc::clone(end));
            }
            false
        });
        self.metrics.lost.fetch_add(ended, Relaxed);
        for end in gone {
            end.lost();
        }
    }

    /// Takes openings and frames until `stop` turns true.
    pub fn start(self: &Arc<Self>, stop: watch::Receiver<bool>) {
        tokio::spawn(Arc::clone(self).take_frames(stop.clone()));
        tokio::spawn(Arc::clone(self).take_openings(stop));
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
                "hostwire_cluster_batches_sent_total",
                "NATS messages of frames this node sent (each a batch of one or more).",
                &m.batches_out,
            ),
            (
                "hostwire_cluster_batches_received_total",
                "NATS messages of frames this node took (each a batch of one or more).",
                &m.batches_in,
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
