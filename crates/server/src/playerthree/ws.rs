//! `/playerthree/ws`: one WebSocket connection per principal. The first
//! message presents the token (`{"op":"join","token":"…"}`); after it, each
//! text message goes to the match's task, which decodes it (size cap before
//! parsing, strict shapes, per-connection rate limit) and answers; what is
//! read is paced by its token's and its match's byte budgets
//! ([`super::pace`]). Frames out go through the connection's bounded
//! outbound queue.

use super::actor::{MatchCmd, MatchHandle, CLOSE_GOING_AWAY};
use super::pace;
use super::{Find, PlayerThree, PlayerThreeMetrics};
use crate::unit;
use crate::ws;
use crate::ws::Utf8Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hostwire_playerthree::protocol::{token_shape_ok, ProtocolError, ServerErrorCode};
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{ServerMsg, MAX_MESSAGE_BYTES};
use serde::Deserialize;
use std::future::{poll_fn, Future};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a new connection has to present its token.
pub const JOIN_TIMEOUT: Duration =
    Duration::from_millis(hostwire_playerthree::protocol::JOIN_TIMEOUT_MS);
/// A connection that sends nothing but pings for this long is closed
/// (1001).
pub const IDLE_TIMEOUT: Duration =
    Duration::from_millis(hostwire_playerthree::protocol::IDLE_TIMEOUT_MS);
// The protocol's codes are the socket driver's where they mean the same.
const _: () = assert!(CLOSE_TOO_SLOW == ws::CLOSE_TOO_SLOW);
const _: () = assert!(CLOSE_TOO_BIG == ws::CLOSE_MESSAGE_TOO_BIG);
const _: () = assert!(CLOSE_NORMAL == ws::CLOSE_NORMAL);
/// Messages above `MAX_MESSAGE_BYTES` up to this are read and answered
/// `bad_message`; beyond it the connection is closed (1009).
pub const MAX_WS_MESSAGE_BYTES: usize = 2 * MAX_MESSAGE_BYTES;
/// The outbound queue's bound in bytes (views and observer frames).
pub const OUTBOUND_BYTES: usize = 8 * 1024 * 1024;
/// Bytes the WebSocket layer may hold unsent: a view or observer frame out
/// can be far larger than a message in.
pub const MAX_UNSENT_BYTES: usize = 4 * 1024 * 1024 + 64 * 1024;

pub use hostwire_playerthree::protocol::{
    CLOSE_BAD_TOKEN, CLOSE_JOIN_TIMEOUT, CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TOO_BIG, CLOSE_TOO_SLOW,
};

/// The socket settings of `/playerthree/ws` (its bound in frames from the
/// configuration).
fn socket_config(outbound_frames: usize) -> ws::Config {
    ws::Config {
        max_unsent_bytes: MAX_UNSENT_BYTES,
        idle_timeout: IDLE_TIMEOUT,
        outbound_frames,
        outbound_bytes: OUTBOUND_BYTES,
        oversized: (CLOSE_TOO_BIG, "message too big"),
        // A match writes each view and each released observer frame to
        // its idle sockets at once, as a relay room does: no wake of 1,000
        // writers per tick. A socket that stops taking bytes gets the rest
        // through its queue, whose bound then counts them.
        direct_write: true,
        ..ws::Config::new(MAX_WS_MESSAGE_BYTES)
    }
}

/// The sending side of one connection.
#[derive(Clone)]
pub struct ConnOut(ws::Outbound);

impl ConnOut {
    /// Queues a frame; a full queue closes the connection (1013).
    pub fn frame(&self, frame: Utf8Bytes, metrics: &PlayerThreeMetrics) -> bool {
        match self.0.send(frame) {
            Ok(()) => true,
            Err(ws::Refused::Full) => {
                metrics.slow_consumers_closed.fetch_add(1, Relaxed);
                false
            }
            Err(ws::Refused::Closing) => false,
        }
    }

    /// Closes after what is queued.
    pub fn close(&self, code: u16, reason: &'static str) {
        self.0.close((code, reason));
    }
}

pub fn router(p3: Arc<PlayerThree>) -> Router {
    Router::new().route("/playerthree/ws", get(ws_upgrade).with_state(p3))
}

/// Bots, game servers and agents connect too, and send no `Origin`: the
/// token in the join message is what admits a connection. A browser always
/// sends one, and it must be of an allowed origin.
async fn ws_upgrade(
    State(p3): State<Arc<PlayerThree>>,
    headers: HeaderMap,
    ws: ws::Upgrade,
) -> Response {
    if let Some(origin) = headers.get(header::ORIGIN) {
        if !p3.origins.allows(origin.to_str().ok()) {
            return (
                StatusCode::FORBIDDEN,
                "Origin not allowed: a browser's page must be of an allowed origin \
                 (clients that are not browsers send no Origin)",
            )
                .into_response();
        }
    }
    let config = Arc::new(socket_config(p3.config.outbound_queue));
    ws.on_upgrade(config, move |c| connection(p3, c))
}

/// PlayerThree's name on a tunnel between nodes.
pub(super) const TUNNEL_PROTOCOL: &str = "playerthree";

/// How this node serves a PlayerThree client another node carries here.
pub(super) fn acceptor(p3: &Arc<PlayerThree>) -> crate::cluster::tunnel::Acceptor {
    let p3 = Arc::clone(p3);
    crate::cluster::tunnel::Acceptor {
        config: Arc::new(socket_config(p3.config.outbound_queue)),
        run: Box::new(move |c, _client| Box::pin(connection(Arc::clone(&p3), c))),
    }
}

/// What the join came to.
enum Joined {
    Match(MatchHandle, TokenHash),
    /// Another node owns the token's match: carry the connection there,
    /// starting with the join.
    Elsewhere(String, Utf8Bytes),
    /// The connection ends (its error and close are queued).
    No,
}

/// The join message.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Join {
    op: String,
    token: String,
}

fn error_frame(code: ServerErrorCode, message: &str) -> Utf8Bytes {
    Utf8Bytes::from(ServerMsg::error(0, &ProtocolError::new(code, message)).to_text())
}

/// One connection: its join, then its messages to the match. Not an
/// `async fn`: its arguments would be kept twice in the future, which every
/// spectator holds for its life. The join's future (about 1 KB, a lookup
/// and a wait for the match's answer) is boxed, and so are the rare waits
/// of the read loop (a full match queue, a pace): a joined connection's
/// future keeps only its reader, its handle and what it reads.
fn connection(p3: Arc<PlayerThree>, c: ws::Connection) -> impl Future<Output = ()> + Send {
    let ws::Connection { mut reader, out } = c;
    let conn = p3.next_conn();
    p3.metrics.connections.fetch_add(1, Relaxed);
    let out = ConnOut(out);
    async move {
        let joined = Box::pin(join(&p3, conn, &mut reader, &out)).await;
        // Bound by reference: a handle and token moved out of `joined`
        // would be kept beside it.
        match joined {
            Joined::Match(ref handle, ref token) => {
                // The read loop, inline: an `async fn` of it would keep
                // its six arguments twice.
                loop {
                    let event = poll_fn(|cx| reader.poll_event(cx)).await;
                    let text = match read_text(&p3, &out, event) {
                        Read::Text(t) => t,
                        Read::Skip => continue,
                        Read::Stop => break,
                    };
                    let bytes = text.len();
                    // Waits while the match's queue is full: a flood holds
                    // up only its own connection's reads.
                    if !unit::offer(&handle.tx, MatchCmd::Text { conn, text }).await {
                        out.close(CLOSE_GOING_AWAY, "match closed");
                        break;
                    }
                    // Past its token's or its match's byte rate, the
                    // connection reads nothing until that is repaid: the
                    // flood waits in its own TCP window, not on the
                    // server's workers.
                    let now = tokio::time::Instant::now();
                    let wait = handle.inbound.charge(token, bytes, now);
                    if !wait.is_zero() {
                        Box::pin(pace::wait(wait, &out.0)).await;
                    }
                }
                unit::offer(&handle.tx, MatchCmd::Leave { conn }).await;
            }
            Joined::Elsewhere(owner, first) => {
                drop(out);
                Box::pin(carry(&p3, reader, owner, first)).await;
                p3.metrics.connections.fetch_sub(1, Relaxed);
                return;
            }
            Joined::No => {}
        }
        drop(out);
        Box::pin(reader.finish()).await;
        p3.metrics.connections.fetch_sub(1, Relaxed);
    }
}

/// The join's refusal of a match served by another node (the client
/// reconnects).
fn refuse_elsewhere(out: &ws::Outbound) {
    let code = ServerErrorCode::Busy;
    let _ = out.send(error_frame(
        code,
        "token: its match is served by another node; try again",
    ));
    out.close((code.join_refused_close(), "join refused"));
}

/// Carries a connection whose match another node owns to that node.
async fn carry(p3: &PlayerThree, reader: ws::Reader, owner: String, first: Utf8Bytes) {
    let Some(t) = p3.tunnels.get() else {
        refuse_elsewhere(reader.out());
        return reader.finish().await;
    };
    let route = crate::cluster::tunnel::Route {
        owner: &owner,
        protocol: TUNNEL_PROTOCOL,
        ip: "",
        handshake: "",
    };
    Arc::clone(t)
        .bridge(route, vec![first], reader, refuse_elsewhere)
        .await;
}

/// Reads the join message and joins the token's match; `None` when the
/// connection is to end (its error and close are queued).
async fn join(p3: &Arc<PlayerThree>, conn: u64, reader: &mut ws::Reader, out: &ConnOut) -> Joined {
    let refuse = |code: ServerErrorCode, message: &str, close: u16| {
        out.frame(error_frame(code, message), &p3.metrics);
        out.close(close, "join refused");
    };
    let first = match tokio::time::timeout(JOIN_TIMEOUT, reader.next()).await {
        Err(_) => {
            out.close(CLOSE_JOIN_TIMEOUT, "no join in time");
            return Joined::No;
        }
        Ok(ws::Event::End) => return Joined::No,
        Ok(ws::Event::Oversized) => {
            refuse_oversized(p3, out);
            return Joined::No;
        }
        Ok(ws::Event::Text(t)) => t,
        Ok(ws::Event::Binary(_)) => {
            refuse(
                ServerErrorCode::BadMessage,
                "message: the join must be a text message",
                CLOSE_POLICY,
            );
            return Joined::No;
        }
    };
    if first.len() > MAX_MESSAGE_BYTES {
        refuse(
            ServerErrorCode::BadMessage,
            "message: over MAX_MESSAGE_BYTES",
            CLOSE_POLICY,
        );
        return Joined::No;
    }
    let token = match serde_json::from_str::<Join>(first.as_str()) {
        Ok(j) if j.op == "join" => j.token,
        Ok(_) => {
            refuse(
                ServerErrorCode::BadMessage,
                "op: the first message must be join",
                CLOSE_POLICY,
            );
            return Joined::No;
        }
        Err(e) => {
            refuse(
                ServerErrorCode::BadMessage,
                &format!("join: expected {{\"op\":\"join\",\"token\":…}}: {e}"),
                CLOSE_POLICY,
            );
            return Joined::No;
        }
    };
    // The shape first: malformed text is never looked up.
    let handle = if token_shape_ok(&token) {
        match p3.find_by_token(&token).await {
            Find::Here(h) => Some(h),
            Find::NotFound => None,
            Find::Elsewhere(owner) if !out.0.is_piped() && p3.tunnels.get().is_some() => {
                return Joined::Elsewhere(owner, first);
            }
            Find::Elsewhere(_) | Find::Unavailable => {
                refuse(
                    ServerErrorCode::Busy,
                    "token: its match is served by another node; try again",
                    ServerErrorCode::Busy.join_refused_close(),
                );
                return Joined::No;
            }
        }
    } else {
        None
    };
    let Some(handle) = handle else {
        refuse(
            ServerErrorCode::BadToken,
            "token: not a live token",
            CLOSE_BAD_TOKEN,
        );
        return Joined::No;
    };
    let (reply, answer) = oneshot::channel();
    let hash = TokenHash::of(&token);
    let cmd = MatchCmd::Join {
        conn,
        token,
        out: out.clone(),
        reply,
    };
    if handle.tx.send(cmd).await.is_err() {
        out.close(CLOSE_GOING_AWAY, "match closed");
        return Joined::No;
    }
    match answer.await {
        Ok(Ok(())) => Joined::Match(handle, hash),
        Ok(Err(e)) => {
            refuse(e.code, &e.message, e.code.join_refused_close());
            Joined::No
        }
        Err(_) => Joined::No,
    }
}

/// What one event read from a joined connection comes to.
enum Read {
    Text(Utf8Bytes),
    /// Answered here (a binary message that is not UTF-8): read on.
    Skip,
    /// The connection ends.
    Stop,
}

/// A message over twice `MAX_MESSAGE_BYTES` was not read: the connection
/// is told, and ends.
fn refuse_oversized(p3: &PlayerThree, out: &ConnOut) {
    p3.metrics.oversized.fetch_add(1, Relaxed);
    out.frame(
        error_frame(
            ServerErrorCode::BadMessage,
            "message: over twice MAX_MESSAGE_BYTES",
        ),
        &p3.metrics,
    );
}

fn read_text(p3: &PlayerThree, out: &ConnOut, event: ws::Event) -> Read {
    match event {
        ws::Event::End => Read::Stop,
        ws::Event::Oversized => {
            refuse_oversized(p3, out);
            Read::Stop
        }
        ws::Event::Text(t) => Read::Text(t),
        ws::Event::Binary(b) => match Utf8Bytes::try_from(b) {
            Ok(t) => Read::Text(t),
            Err(_) => {
                out.frame(
                    error_frame(ServerErrorCode::BadMessage, "message: not UTF-8 text"),
                    &p3.metrics,
                );
                Read::Skip
            }
        },
    }
}
