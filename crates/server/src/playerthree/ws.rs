//! `/playerthree/ws`: one WebSocket connection per principal. The first
//! message presents the token (`{"op":"join","token":"…"}`); after it, each
//! text message goes to the match's task, which decodes it (size cap before
//! parsing, strict shapes, per-connection rate limit) and answers. Frames
//! out go through the connection's bounded outbound queue.

use super::actor::{MatchCmd, CLOSE_GOING_AWAY};
use super::{PlayerThree, PlayerThreeMetrics};
use crate::outbound;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use hostwire_playerthree::protocol::{token_shape_ok, ProtocolError, ServerErrorCode};
use hostwire_playerthree::{ServerMsg, MAX_MESSAGE_BYTES};
use serde::Deserialize;
use std::future::poll_fn;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long a new connection has to present its token.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Server pings keep idle connections (spectators, observers) alive
/// behind proxies.
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a closing connection may take to flush its queue.
const WRITER_GRACE: Duration = Duration::from_secs(5);
/// Messages above `MAX_MESSAGE_BYTES` up to this are read and answered
/// `bad_message`; beyond it the WebSocket layer ends the connection (1009).
pub const MAX_WS_MESSAGE_BYTES: usize = 2 * MAX_MESSAGE_BYTES;

pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_POLICY: u16 = 1008;
pub const CLOSE_TOO_BIG: u16 = 1009;
pub const CLOSE_TOO_SLOW: u16 = 1013;
pub const CLOSE_BAD_TOKEN: u16 = 4001;
pub const CLOSE_JOIN_TIMEOUT: u16 = 4008;

const TOO_SLOW: outbound::Close = (CLOSE_TOO_SLOW, "too slow: outbound queue full");

/// The sending side of one connection.
#[derive(Clone)]
pub struct ConnOut(outbound::Outbound<Utf8Bytes, ()>);

impl ConnOut {
    /// Queues a frame; a full queue closes the connection (1013).
    pub fn frame(&self, frame: Utf8Bytes, metrics: &PlayerThreeMetrics) -> bool {
        match self
            .0
            .push_or_write(frame, TOO_SLOW, outbound::Direct::Declined)
        {
            Ok(()) => true,
            Err(outbound::Refused::Full) => {
                metrics.slow_consumers_closed.fetch_add(1, Relaxed);
                false
            }
            Err(outbound::Refused::Closing) => false,
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

async fn ws_upgrade(
    State(p3): State<Arc<PlayerThree>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if !p3.origins.allows(origin) {
        return (StatusCode::FORBIDDEN, "Origin not allowed").into_response();
    }
    ws.max_message_size(MAX_WS_MESSAGE_BYTES)
        .max_frame_size(MAX_WS_MESSAGE_BYTES)
        .read_buffer_size(4 * 1024)
        .write_buffer_size(16 * 1024)
        .on_upgrade(move |socket| connection(p3, socket))
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

async fn connection(p3: Arc<PlayerThree>, socket: WebSocket) {
    let conn = p3.next_conn();
    p3.metrics.connections.fetch_add(1, Relaxed);
    let (sink, mut stream) = socket.split();
    let (out, drain) = outbound::queue(p3.config.outbound_queue, ());
    let out = ConnOut(out);
    let mut writer = tokio::spawn(write_loop(drain, sink));
    if let Some(tx) = join(&p3, conn, &mut stream, &out).await {
        read_loop(&p3, conn, stream, &out, &tx).await;
        let _ = tx.send(MatchCmd::Leave { conn }).await;
    }
    let too_slow = out
        .0
        .killed()
        .is_some_and(|(code, _)| code == CLOSE_TOO_SLOW);
    drop(out);
    if too_slow {
        // A reader that does not read gets its socket dropped at once.
        writer.abort();
    } else if tokio::time::timeout(WRITER_GRACE, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    p3.metrics.connections.fetch_sub(1, Relaxed);
}

/// Reads the join message and joins the token's match; `None` when the
/// connection is to end (its error and close are queued).
async fn join(
    p3: &Arc<PlayerThree>,
    conn: u64,
    stream: &mut SplitStream<WebSocket>,
    out: &ConnOut,
) -> Option<mpsc::Sender<MatchCmd>> {
    let refuse = |code: ServerErrorCode, message: &str, close: u16| {
        out.frame(error_frame(code, message), &p3.metrics);
        out.close(close, "join refused");
    };
    let first = match tokio::time::timeout(JOIN_TIMEOUT, stream.next()).await {
        Err(_) => {
            out.close(CLOSE_JOIN_TIMEOUT, "no join in time");
            return None;
        }
        Ok(None) | Ok(Some(Ok(Message::Close(_)))) => return None,
        Ok(Some(Err(e))) => {
            if is_oversized(e) {
                p3.metrics.oversized.fetch_add(1, Relaxed);
                refuse(
                    ServerErrorCode::BadMessage,
                    "message: over twice MAX_MESSAGE_BYTES",
                    CLOSE_TOO_BIG,
                );
            }
            return None;
        }
        Ok(Some(Ok(Message::Text(t)))) => t,
        Ok(Some(Ok(_))) => {
            refuse(
                ServerErrorCode::BadMessage,
                "message: the join must be a text message",
                CLOSE_POLICY,
            );
            return None;
        }
    };
    if first.len() > MAX_MESSAGE_BYTES {
        refuse(
            ServerErrorCode::BadMessage,
            "message: over MAX_MESSAGE_BYTES",
            CLOSE_POLICY,
        );
        return None;
    }
    let token = match serde_json::from_str::<Join>(first.as_str()) {
        Ok(j) if j.op == "join" => j.token,
        Ok(_) => {
            refuse(
                ServerErrorCode::BadMessage,
                "op: the first message must be join",
                CLOSE_POLICY,
            );
            return None;
        }
        Err(e) => {
            refuse(
                ServerErrorCode::BadMessage,
                &format!("join: expected {{\"op\":\"join\",\"token\":…}}: {e}"),
                CLOSE_POLICY,
            );
            return None;
        }
    };
    // The shape first: malformed text is never looked up.
    let handle = if token_shape_ok(&token) {
        p3.match_of_token(&token)
    } else {
        None
    };
    let Some(handle) = handle else {
        refuse(
            ServerErrorCode::BadToken,
            "token: not a live token",
            CLOSE_BAD_TOKEN,
        );
        return None;
    };
    let (reply, answer) = oneshot::channel();
    let cmd = MatchCmd::Join {
        conn,
        token,
        out: out.clone(),
        reply,
    };
    if handle.tx.send(cmd).await.is_err() {
        out.close(CLOSE_GOING_AWAY, "match closed");
        return None;
    }
    match answer.await {
        Ok(Ok(())) => Some(handle.tx),
        Ok(Err(e)) => {
            let close = match e.code {
                ServerErrorCode::BadToken => CLOSE_BAD_TOKEN,
                ServerErrorCode::Busy => CLOSE_TOO_SLOW,
                _ => CLOSE_POLICY,
            };
            refuse(e.code, &e.message, close);
            None
        }
        Err(_) => None,
    }
}

/// Whether the WebSocket layer refused a message for its size.
fn is_oversized(e: axum::Error) -> bool {
    e.into_inner()
        .downcast_ref::<tungstenite::Error>()
        .is_some_and(|e| matches!(e, tungstenite::Error::Capacity(_)))
}

async fn read_loop(
    p3: &Arc<PlayerThree>,
    conn: u64,
    mut stream: SplitStream<WebSocket>,
    out: &ConnOut,
    tx: &mpsc::Sender<MatchCmd>,
) {
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.tick().await;
    loop {
        let next = tokio::select! {
            biased;
            _ = poll_fn(|cx| out.0.poll_killed(cx)) => return,
            _ = ping.tick() => { out.0.ping(); continue; }
            n = stream.next() => n,
        };
        let text = match next {
            None | Some(Ok(Message::Close(_))) => return,
            Some(Err(e)) => {
                if is_oversized(e) {
                    p3.metrics.oversized.fetch_add(1, Relaxed);
                    out.frame(
                        error_frame(
                            ServerErrorCode::BadMessage,
                            "message: over twice MAX_MESSAGE_BYTES",
                        ),
                        &p3.metrics,
                    );
                    out.close(CLOSE_TOO_BIG, "message too big");
                }
                return;
            }
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Binary(b))) => match Utf8Bytes::try_from(b) {
                Ok(t) => t,
                Err(_) => {
                    out.frame(
                        error_frame(ServerErrorCode::BadMessage, "message: not UTF-8 text"),
                        &p3.metrics,
                    );
                    continue;
                }
            },
            Some(Ok(_)) => continue,
        };
        // Waits while the match's queue is full: a flood holds up only
        // its own connection's reads.
        if tx.send(MatchCmd::Text { conn, text }).await.is_err() {
            out.close(CLOSE_GOING_AWAY, "match closed");
            return;
        }
    }
}

/// Writes what the queue holds (all that is queued, then one flush).
async fn write_loop(
    drain: outbound::Drain<Utf8Bytes, ()>,
    mut sink: SplitSink<WebSocket, Message>,
) {
    loop {
        let work = poll_fn(|cx| drain.poll_work(cx)).await;
        let go_on = match work {
            outbound::Work::Frame(first) => {
                let mut ok = sink.feed(Message::Text(first)).await.is_ok();
                while ok {
                    match drain.next_frame() {
                        Some(f) => ok = sink.feed(Message::Text(f)).await.is_ok(),
                        None => break,
                    }
                }
                ok && sink.flush().await.is_ok()
            }
            outbound::Work::Flush => sink.flush().await.is_ok(),
            outbound::Work::Ping => sink.send(Message::Ping(Bytes::new())).await.is_ok(),
            outbound::Work::Close((code, reason)) | outbound::Work::Kill((code, reason)) => {
                let _ = sink
                    .send(Message::Close(Some(CloseFrame {
                        code,
                        reason: Utf8Bytes::from_static(reason),
                    })))
                    .await;
                false
            }
            outbound::Work::End => false,
        };
        if !go_on {
            break;
        }
        drain.idle();
    }
    let _ = sink.close().await;
    // Stops the reader, if it still reads.
    let _ = drain.kill((CLOSE_NORMAL, "closed"));
}
