//! `/memizy/session/ws?session=…&view=…&address=…&token=…`: one plugin
//! instance of one device, which proves with its token that it may be that
//! instance (the host token for the board and the settings screen, the
//! player's token for a player's instance; `Authorization: Bearer` works
//! too). Frames are worker RPC 1.0.0 text frames: the device's
//! `request`s are Host API calls (answered by `response`s), the server's
//! `request`s are Plugin API calls (the device's `response`s to them are
//! read and dropped). The server says worker RPC `hello` first; a
//! device's `cancel` stops its pending `service` call (answered
//! `CANCELLED`); a frame of another MAJOR is answered `VERSION_MISMATCH`.

use super::actor::{
    response_text, AttachRefused, Cmd, DeviceOut, CLOSE_TOO_SLOW, CLOSE_UNAUTHORIZED,
};
use super::{Sessions, DEVICE_OUTBOUND_BYTES, DEVICE_OUTBOUND_QUEUE, MAX_DEVICE_FRAME_BYTES};
use crate::http::error::json_response;
use crate::ws;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use hostwire_memizy::View;
use hostwire_worker_rpc::codes;
use hostwire_worker_rpc::frame::{parse_frame_bytes, ErrorEnvelope, Frame, Kind, PROTOCOL_VERSION};
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::sync::oneshot;

/// A device that sends nothing but pings for this long is closed (1001);
/// the server pings it every [`ws::PING_INTERVAL`].
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// 1009: a frame over [`MAX_DEVICE_FRAME_BYTES`].
const CLOSE_MESSAGE_TOO_BIG: ws::Close = (ws::CLOSE_MESSAGE_TOO_BIG, "frame too large");

/// The device socket's settings.
static SOCKET_CONFIG: LazyLock<Arc<ws::Config>> = LazyLock::new(|| {
    Arc::new(ws::Config {
        idle_timeout: IDLE_TIMEOUT,
        outbound_frames: DEVICE_OUTBOUND_QUEUE,
        outbound_bytes: DEVICE_OUTBOUND_BYTES,
        too_slow: CLOSE_TOO_SLOW,
        oversized: CLOSE_MESSAGE_TOO_BIG,
        ..ws::Config::new(MAX_DEVICE_FRAME_BYTES)
    })
});

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
    ws: ws::Upgrade,
) -> Response {
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    if origin.is_some()
        && !sessions.config.allowed_origins.allows(origin)
        && !crate::http::origins::same_origin(&headers)
    {
        return json_response(
            StatusCode::FORBIDDEN,
            &json!({"error": "Origin not allowed: a browser's page must be of an allowed origin (devices that are not browsers send no Origin)"}),
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
    let token = crate::http::bearer(&headers).map(str::to_owned).or(q.token);
    // After a restart the session comes back at its first use.
    let Some(handle) = super::restore::running(&sessions, &q.session).await else {
        return json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": "session: no such session"}),
        );
    };
    ws.on_upgrade(Arc::clone(&SOCKET_CONFIG), move |c| {
        handle_socket(sessions, handle.tx, view, q.address, token, c)
    })
}

async fn handle_socket(
    sessions: Arc<Sessions>,
    tx: tokio::sync::mpsc::Sender<Cmd>,
    view: View,
    address: String,
    token: Option<String>,
    c: ws::Connection,
) {
    let ws::Connection { mut reader, out } = c;
    let instance = sessions.next_instance();
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
            read_loop(&sessions, instance, &tx, &mut reader, &out).await;
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
            let _ = out.send(bye.to_text().into());
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
            let _ = out.send(bye.to_text().into());
            out.close((1008, "attach refused"));
        }
    }
    drop(out);
    reader.finish().await;
}

async fn read_loop(
    sessions: &Sessions,
    instance: u64,
    tx: &tokio::sync::mpsc::Sender<Cmd>,
    reader: &mut ws::Reader,
    out: &DeviceOut,
) {
    loop {
        let bytes: Bytes = match reader.next().await {
            ws::Event::End => return,
            ws::Event::Oversized => {
                sessions.metrics.oversized_frames.fetch_add(1, Relaxed);
                let bye = Frame::Goodbye {
                    v: PROTOCOL_VERSION.to_owned(),
                    reason: Some("frame too large".into()),
                    error: Some(ErrorEnvelope::new(
                        codes::FRAME_TOO_LARGE,
                        format!("frame: over the {MAX_DEVICE_FRAME_BYTES}-byte limit"),
                    )),
                };
                let _ = out.send(bye.to_text().into());
                return;
            }
            ws::Event::Text(t) => Bytes::from(t),
            ws::Event::Binary(b) => b,
        };
        match parse_frame_bytes(&bytes) {
            // Worker RPC: a frame of another MAJOR is not executed; a
            // request is answered VERSION_MISMATCH under its id.
            Ok(frame) if !frame.is_compatible() => {
                sessions.metrics.malformed_frames.fetch_add(1, Relaxed);
                if let (Kind::Request | Kind::StreamOpen, Some(id)) = (frame.kind_of(), frame.id())
                {
                    let text = response_text(
                        id,
                        Err(ErrorEnvelope::new(
                            codes::VERSION_MISMATCH,
                            format!(
                                "v: the device speaks {}; this server speaks {PROTOCOL_VERSION}",
                                frame.version()
                            ),
                        )),
                    );
                    if out.send(text.into()).is_err() {
                        return;
                    }
                }
            }
            Ok(Frame::Cancel { id, .. }) => {
                if tx.send(Cmd::Cancel { instance, call: id }).await.is_err() {
                    return;
                }
            }
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
                    if out.send(text.into()).is_err() {
                        return;
                    }
                }
            }
        }
    }
}
