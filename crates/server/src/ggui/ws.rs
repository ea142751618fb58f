//! One socket of `/ggui/ws`: the upgrade (origin, token, frame cap), a
//! reader that hands each text message to the channel actor, and a writer
//! that drains the connection's bounded outbound queue.

use super::{Cmd, Ggui};
use crate::outbound;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream::SplitStream;
use futures_util::{SinkExt, StreamExt};
use hostwire_ggui::channel::{CLOSE_POLICY_VIOLATION, CLOSE_UPGRADE_REQUIRED};
use hostwire_ggui::decode::{CLOSE_MESSAGE_TOO_BIG, MAX_FRAME_BYTES};
use hostwire_ggui::{codes, encode_error, make_error_payload, ConnId};
use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Server pings keep idle connections alive behind proxies.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// A socket that sends nothing (not even a pong) for this long is closed
/// (1001): a peer that vanished must not hold its slot.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a closing connection may take to flush its queue.
const WRITER_GRACE: Duration = Duration::from_secs(5);

pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_GOING_AWAY: u16 = 1001;
pub const CLOSE_TOO_SLOW: u16 = 1013;

const TOO_SLOW: outbound::Close = (CLOSE_TOO_SLOW, "too slow: outbound queue full");

/// The reason sent with a close the core asked for.
pub(crate) fn close_reason(code: u16) -> &'static str {
    match code {
        CLOSE_MESSAGE_TOO_BIG => "frame too large",
        CLOSE_POLICY_VIOLATION => "rate limit exceeded",
        CLOSE_UPGRADE_REQUIRED => "upgrade required",
        CLOSE_GOING_AWAY => "going away",
        _ => "closed",
    }
}

/// What became of a frame pushed onto a connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    Queued,
    /// The queue was full: the connection is being closed (1013).
    TooSlow,
    /// The connection is closing.
    Closing,
}

/// The sending side of one connection.
#[derive(Clone)]
pub(crate) struct Outbound(outbound::Outbound<Utf8Bytes>);

impl Outbound {
    pub(crate) fn frame(&self, frame: Utf8Bytes) -> Pushed {
        match self
            .0
            .push_or_write(frame, TOO_SLOW, outbound::Direct::Declined)
        {
            Ok(()) => Pushed::Queued,
            Err(outbound::Refused::Full) => Pushed::TooSlow,
            Err(outbound::Refused::Closing) => Pushed::Closing,
        }
    }

    pub(crate) fn close(&self, code: u16, reason: &'static str) {
        self.0.close((code, reason));
    }
}

pub(crate) async fn ws_upgrade(
    State(ggui): State<Arc<Ggui>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    presented: crate::http::Presented,
    ws: WebSocketUpgrade,
) -> Response {
    // Browsers always send an Origin: check it. Agents and test kits send
    // none; the token (when configured) is what admits them.
    if let Some(origin) = headers.get(header::ORIGIN) {
        if !ggui.config.allowed_origins.allows(origin.to_str().ok()) {
            return (StatusCode::FORBIDDEN, "Origin not allowed").into_response();
        }
    }
    // A UI token minted through the agent API (bearer header, or
    // `?token=` for browsers) admits the socket to its one session.
    let given = presented
        .token
        .clone()
        .or_else(|| query.get("token").cloned());
    let bound = match presented.gate.check(&presented.ip, given.as_deref(), |t| {
        ggui.ui_tokens.lookup(t)
    }) {
        Ok(b) => b,
        Err(r @ crate::http::Refused::Throttled(_)) => return r.response("UI token"),
        Err(_) => {
            return (
                StatusCode::UNAUTHORIZED,
                "a UI token of the session is required (Authorization: Bearer or ?token=)",
            )
                .into_response()
        }
    };
    let authenticated = true;
    ws.max_message_size(MAX_FRAME_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .read_buffer_size(4 * 1024)
        .write_buffer_size(16 * 1024)
        .on_upgrade(move |socket| handle_socket(ggui, socket, authenticated, bound))
}

async fn handle_socket(
    ggui: Arc<Ggui>,
    socket: WebSocket,
    authenticated: bool,
    bound: (String, String),
) {
    let conn = ggui.next_conn();
    ggui.metrics.connections.fetch_add(1, Relaxed);
    let (sink, stream) = socket.split();
    let (out, drain) = outbound::queue(ggui.config.outbound_queue, ());
    let out = Outbound(out);
    let mut writer = tokio::spawn(write_loop(drain, sink));
    let opened = ggui
        .tx
        .send(Cmd::Open {
            conn,
            out: out.clone(),
            authenticated,
            bound: Some(bound),
        })
        .await
        .is_ok();
    if opened {
        read_loop(&ggui, conn, stream, &out).await;
        let _ = ggui.tx.send(Cmd::Closed { conn }).await;
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
    ggui.metrics.connections.fetch_sub(1, Relaxed);
}

/// Whether the WebSocket layer refused a message for its size.
fn is_oversized(e: axum::Error) -> bool {
    e.into_inner()
        .downcast_ref::<tungstenite::Error>()
        .is_some_and(|e| matches!(e, tungstenite::Error::Capacity(_)))
}

async fn read_loop(ggui: &Ggui, conn: ConnId, mut stream: SplitStream<WebSocket>, out: &Outbound) {
    let start = tokio::time::Instant::now();
    let mut last_frame = start;
    let mut next_ping = start + PING_INTERVAL;
    let timer = tokio::time::sleep_until(next_ping.min(start + IDLE_TIMEOUT));
    tokio::pin!(timer);
    loop {
        let next = tokio::select! {
            biased;
            _ = poll_fn(|cx| out.0.poll_killed(cx)) => return,
            () = &mut timer => {
                let now = tokio::time::Instant::now();
                if now >= last_frame + IDLE_TIMEOUT {
                    out.close(CLOSE_GOING_AWAY, "idle timeout");
                    return;
                }
                if now >= next_ping {
                    out.0.ping();
                    next_ping = now + PING_INTERVAL;
                }
                timer.as_mut().reset(next_ping.min(last_frame + IDLE_TIMEOUT));
                continue;
            }
            n = stream.next() => n,
        };
        last_frame = tokio::time::Instant::now();
        let text = match next {
            None | Some(Ok(Message::Close(_))) => return,
            Some(Err(e)) => {
                if is_oversized(e) {
                    ggui.metrics.oversized_frames.fetch_add(1, Relaxed);
                    let message = format!("frame exceeds the {MAX_FRAME_BYTES}-byte limit");
                    let payload = make_error_payload(codes::FRAME_TOO_LARGE, message, None);
                    out.frame(super::to_text(encode_error(&payload, None)));
                    out.close(CLOSE_MESSAGE_TOO_BIG, close_reason(CLOSE_MESSAGE_TOO_BIG));
                }
                return;
            }
            Some(Ok(Message::Text(t))) => t,
            // The core answers a frame that is not JSON text itself.
            Some(Ok(Message::Binary(b))) => match Utf8Bytes::try_from(b) {
                Ok(t) => t,
                Err(_) => Utf8Bytes::from_static("\u{fffd}"),
            },
            Some(Ok(_)) => continue,
        };
        if ggui.tx.send(Cmd::Frame { conn, text }).await.is_err() {
            return;
        }
    }
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;

/// Writes what the queue holds (all that is queued, then one flush).
async fn write_loop(drain: outbound::Drain<Utf8Bytes>, mut sink: Sink) {
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
                let frame = CloseFrame {
                    code,
                    reason: Utf8Bytes::from_static(reason),
                };
                let _ = sink.send(Message::Close(Some(frame))).await;
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
