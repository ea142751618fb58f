//! `/memizy/session/ws?session=…&view=…&address=…&token=…`: one plugin
//! instance of one device, which proves with its token that it may be that
//! instance (the host token for the board and the settings screen, the
//! player's token for a player's instance; `Authorization: Bearer` works
//! too). Frames are worker RPC 1.0.0 text frames: the device's
//! `request`s are Host API calls (answered by `response`s), the server's
//! `request`s are Plugin API calls (the device's `response`s to them are
//! read and dropped).

use super::actor::{
    response_text, AttachRefused, Cmd, DeviceOut, CLOSE_TOO_SLOW, CLOSE_UNAUTHORIZED,
};
use super::{Sessions, DEVICE_OUTBOUND_BYTES, DEVICE_OUTBOUND_QUEUE, MAX_DEVICE_FRAME_BYTES};
use crate::http::error::json_response;
use crate::outbound::{self, Direct};
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hostwire_memizy::View;
use hostwire_worker_rpc::codes;
use hostwire_worker_rpc::frame::{parse_frame_bytes, ErrorEnvelope, Frame, Kind, PROTOCOL_VERSION};
use serde::Deserialize;
use serde_json::json;
use std::future::poll_fn;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a socket may stay silent (the writer pings every half of it).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// tungstenite's read buffer per device.
const READ_BUFFER: usize = 4 * 1024;
/// tungstenite's write buffer: frames are written once this much is
/// buffered (or on flush).
const WRITE_BUFFER: usize = 16 * 1024;
/// 1009: a frame over [`MAX_DEVICE_FRAME_BYTES`].
const CLOSE_MESSAGE_TOO_BIG: outbound::Close = (1009, "frame too large");

#[derive(Debug, Deserialize)]
pub struct Attach {
    session: String,
    view: String,
    address: String,
    #[serde(default)]
    token: Option<String>,
}

pub async fn ws_upgrade(
    State(sessions): State<Arc<Sessions>>,
    headers: HeaderMap,
    Query(q): Query<Attach>,
    ws: WebSocketUpgrade,
) -> Response {
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    if origin.is_some() && !sessions.config.allowed_origins.allows(origin) {
        return json_response(
            StatusCode::FORBIDDEN,
            &json!({"error": "Origin not allowed"}),
        );
    }
    let view: View = match serde_json::from_value(json!(q.view)) {
        Ok(v) => v,
        Err(_) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({"error": "view: one of solo, board, controller, settings"}),
            )
        }
    };
    // A bearer header (non-browser clients) wins over the query.
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .map(|_| v[7..].trim().to_owned())
        })
        .or(q.token);
    let Some(handle) = sessions.handle(&q.session) else {
        return json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": "session: no such session"}),
        );
    };
    ws.max_message_size(MAX_DEVICE_FRAME_BYTES)
        .max_frame_size(MAX_DEVICE_FRAME_BYTES)
        // tungstenite zero-fills the free part of its read buffer before
        // every read: at its default 128 KiB that was a quarter of the
        // server's CPU under load, and 128 KiB of memory per device. A
        // call is one small read; a large snapshot takes more of them.
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .on_upgrade(move |socket| {
            handle_socket(sessions, handle.tx, view, q.address, token, socket)
        })
        .into_response()
}

async fn handle_socket(
    sessions: Arc<Sessions>,
    tx: tokio::sync::mpsc::Sender<Cmd>,
    view: View,
    address: String,
    token: Option<String>,
    socket: WebSocket,
) {
    let instance = sessions.next_instance();
    let (sink, stream) = socket.split();
    let (out, drain) = outbound::queue_bounded(
        DEVICE_OUTBOUND_QUEUE,
        DEVICE_OUTBOUND_BYTES,
        |t: &Utf8Bytes| t.len(),
        (),
    );
    let mut writer = tokio::spawn(write_loop(drain, sink));
    let (done, attached) = oneshot::channel();
    let sent = tx
        .send(Cmd::Attach {
            instance,
            view,
            address,
            out: out.clone(),
            token,
            done,
        })
        .await
        .is_ok();
    let attached = if sent { attached.await.ok() } else { None };
    match attached {
        Some(Ok(())) => {
            sessions.metrics.devices.fetch_add(1, Relaxed);
            read_loop(&sessions, instance, &tx, stream, &out).await;
            let _ = tx.send(Cmd::Detach { instance }).await;
            sessions.metrics.devices.fetch_sub(1, Relaxed);
        }
        Some(Err(AttachRefused::Unauthorized(why))) => {
            sessions.metrics.unauthorized.fetch_add(1, Relaxed);
            let bye = Frame::Goodbye {
                v: PROTOCOL_VERSION.to_owned(),
                reason: Some("unauthorized".into()),
                error: Some(ErrorEnvelope::new("UNAUTHORIZED", why)),
            };
            let _ = out.push_or_write(bye.to_text().into(), CLOSE_TOO_SLOW, Direct::Declined);
            out.close(CLOSE_UNAUTHORIZED);
        }
        other => {
            let why = match other {
                Some(Err(AttachRefused::Refused(why))) => why,
                _ => "the session has closed".to_owned(),
            };
            let bye = Frame::Goodbye {
                v: PROTOCOL_VERSION.to_owned(),
                reason: Some("attach refused".into()),
                error: Some(ErrorEnvelope::new("INVALID_ARGUMENT", why)),
            };
            let _ = out.push_or_write(bye.to_text().into(), CLOSE_TOO_SLOW, Direct::Declined);
            out.close((1008, "attach refused"));
        }
    }
    let too_slow = out.killed().is_some_and(|(c, _)| c == CLOSE_TOO_SLOW.0);
    drop(out);
    // A reader that does not read gets its socket dropped at once; others
    // get a moment to take their last frames.
    let finished = !too_slow
        && tokio::time::timeout(Duration::from_secs(5), &mut writer)
            .await
            .is_ok();
    if !finished {
        writer.abort();
    }
}

fn is_oversized(e: axum::Error) -> bool {
    e.into_inner()
        .downcast_ref::<tungstenite::Error>()
        .is_some_and(|e| matches!(e, tungstenite::Error::Capacity(_)))
}

async fn read_loop(
    sessions: &Sessions,
    instance: u64,
    tx: &tokio::sync::mpsc::Sender<Cmd>,
    mut stream: futures_util::stream::SplitStream<WebSocket>,
    out: &DeviceOut,
) {
    let mut next_ping = tokio::time::Instant::now() + PING_INTERVAL;
    let mut last = tokio::time::Instant::now();
    loop {
        let msg = tokio::select! {
            biased;
            _ = poll_fn(|cx| out.poll_killed(cx)) => return,
            () = tokio::time::sleep_until(next_ping.min(last + IDLE_TIMEOUT)) => {
                let now = tokio::time::Instant::now();
                if now >= last + IDLE_TIMEOUT {
                    out.close((1001, "idle timeout"));
                    return;
                }
                out.ping();
                next_ping = now + PING_INTERVAL;
                continue;
            }
            m = stream.next() => m,
        };
        last = tokio::time::Instant::now();
        let bytes: Bytes = match msg {
            None | Some(Ok(Message::Close(_))) => return,
            Some(Err(e)) => {
                if is_oversized(e) {
                    sessions.metrics.oversized_frames.fetch_add(1, Relaxed);
                    let bye = Frame::Goodbye {
                        v: PROTOCOL_VERSION.to_owned(),
                        reason: Some("frame too large".into()),
                        error: Some(ErrorEnvelope::new(
                            codes::FRAME_TOO_LARGE,
                            format!("frame: over the {MAX_DEVICE_FRAME_BYTES}-byte limit"),
                        )),
                    };
                    let _ =
                        out.push_or_write(bye.to_text().into(), CLOSE_TOO_SLOW, Direct::Declined);
                    out.close(CLOSE_MESSAGE_TOO_BIG);
                }
                return;
            }
            Some(Ok(Message::Text(t))) => Bytes::from(t),
            Some(Ok(Message::Binary(b))) => b,
            Some(Ok(_)) => continue,
        };
        match parse_frame_bytes(&bytes) {
            Ok(Frame::Request {
                id, method, params, ..
            }) => {
                let params = params.map_or_else(|| "[]".to_owned(), |p| p.get().to_owned());
                let cmd = Cmd::Call {
                    instance,
                    call: id,
                    method,
                    params,
                };
                // A full session queue holds this reader (and only it) back.
                if tx.send(cmd).await.is_err() {
                    return;
                }
            }
            Ok(Frame::Goodbye { .. }) => return,
            // Answers to Plugin API calls, hello and the rest: nothing to do.
            Ok(_) => {}
            Err(e) => {
                sessions.metrics.malformed_frames.fetch_add(1, Relaxed);
                // A request whose id could be read is answered; anything
                // else cannot be and is only counted.
                if let (Some(Kind::Request), Some(id)) = (e.kind, e.id) {
                    let text = response_text(
                        id,
                        Err(ErrorEnvelope::new(codes::PROTOCOL_ERROR, e.to_string())),
                    );
                    if out
                        .push_or_write(text.into(), CLOSE_TOO_SLOW, Direct::Declined)
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    }
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;

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
    let _ = drain.kill((1000, "closed"));
}
