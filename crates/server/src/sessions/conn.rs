//! `/memizy/session/ws?session=…&view=…&address=…&token=…`: one plugin
//! instance of one device, which proves with its token that it may be that
//! instance (the host token for the board and the settings screen, the
//! player's token for a player's instance; `Authorization: Bearer` works
//! too). Frames are worker RPC 1.0.0 text frames: the device's
//! `request`s are Host API calls (answered by `response`s), the server's
//! `request`s are Plugin API calls. This reader only parses them and hands
//! them to the session's task, which keeps the device's worker RPC state
//! (`rpc.rs`): the server's `hello` first, `cancel`, `VERSION_MISMATCH`,
//! errors naming the field.

use super::actor::{AttachRefused, Cmd, DeviceOut, CLOSE_TOO_SLOW, CLOSE_UNAUTHORIZED};
use super::{Sessions, DEVICE_OUTBOUND_BYTES, DEVICE_OUTBOUND_QUEUE, MAX_DEVICE_FRAME_BYTES};
use crate::http::error::json_response;
use crate::unit;
use crate::ws;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use hostwire_memizy::View;
use hostwire_worker_rpc::codes;
use hostwire_worker_rpc::frame::{
    parse_frame, parse_frame_bytes, ErrorEnvelope, Frame, PROTOCOL_VERSION,
};
use serde::{Deserialize, Serialize};
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
        // One task per session writes to its own few devices: a routed
        // call's frames leave from it at once, without a wake of each
        // device's writer (as a relay room's do).
        direct_write: true,
        ..ws::Config::new(MAX_DEVICE_FRAME_BYTES)
    })
});

#[derive(Debug, Deserialize, Serialize)]
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
    let q = Attach {
        token: crate::http::bearer(&headers).map(str::to_owned).or(q.token),
        ..q
    };
    // After a restart the session comes back at its first use.
    let (found, owner) =
        crate::cluster::tunnel::http::owner_of(super::restore::running(&sessions, &q.session))
            .await;
    let handle = match found {
        Ok(Some(h)) => h,
        // Another node owns it: the device is carried there.
        Err(_) if owner.is_some() && sessions.tunnels().is_some() => {
            let (owner, sessions) = (owner.unwrap_or_default(), Arc::clone(&sessions));
            return ws.on_upgrade(Arc::clone(&SOCKET_CONFIG), move |c| {
                carry(sessions, owner, q, c)
            });
        }
        Err((status, m)) => return json_response(status, &json!({ "error": m })),
        Ok(None) => {
            return json_response(
                StatusCode::NOT_FOUND,
                &json!({"error": "session: no such session"}),
            )
        }
    };
    ws.on_upgrade(Arc::clone(&SOCKET_CONFIG), move |c| {
        handle_socket(sessions, handle.tx, view, q.address, q.token, c)
    })
}

/// The hosted sessions' name on a tunnel between nodes.
pub(super) const TUNNEL_PROTOCOL: &str = "memizy-session";

/// The close of a device whose session is served by a node that could
/// not be reached: no goodbye (that would be final), so that it
/// reconnects, as when its session moves (1012).
fn refuse_elsewhere(out: &ws::Outbound) {
    out.close((
        ws::CLOSE_TOO_SLOW,
        "session served by another node; try again",
    ));
}

/// Carries a device whose session another node owns to that node, with
/// its handshake (the session, view, address and token it attached with).
async fn carry(sessions: Arc<Sessions>, owner: String, q: Attach, c: ws::Connection) {
    let Some(t) = sessions.tunnels() else { return };
    let handshake = serde_json::to_string(&q).unwrap_or_default();
    let route = crate::cluster::tunnel::Route {
        owner: &owner,
        protocol: TUNNEL_PROTOCOL,
        ip: "",
        handshake: &handshake,
    };
    Arc::clone(t)
        .bridge(route, Vec::new(), c.reader, refuse_elsewhere)
        .await;
}

/// How this node serves a device another node carries here: its
/// handshake is checked again, and the session must be this node's.
pub(super) fn acceptor(sessions: &Arc<Sessions>) -> crate::cluster::tunnel::Acceptor {
    let sessions = Arc::clone(sessions);
    crate::cluster::tunnel::Acceptor {
        config: Arc::clone(&SOCKET_CONFIG),
        run: Box::new(move |c, client| {
            Box::pin(carried(Arc::clone(&sessions), c, client.handshake))
        }),
    }
}

async fn carried(sessions: Arc<Sessions>, c: ws::Connection, handshake: String) {
    let q = serde_json::from_str::<Attach>(&handshake).ok();
    let view = q
        .as_ref()
        .and_then(|q| serde_json::from_value::<View>(json!(q.view)).ok());
    let (Some(q), Some(view)) = (q, view) else {
        c.out.close((1008, "malformed handshake"));
        return c.reader.finish().await;
    };
    match super::restore::running(&sessions, &q.session).await {
        Ok(Some(h)) => handle_socket(sessions, h.tx, view, q.address, q.token, c).await,
        _ => {
            refuse_elsewhere(&c.out);
            c.reader.finish().await;
        }
    }
}

/// Attaches the device, reads its frames until it ends, then detaches it.
/// Not an `async fn`: the future every device holds for its life keeps
/// only what it uses across its waits (an `async fn` would keep its
/// arguments beside their moved copies), and the rare waits (the attach,
/// the detach, the close) are boxed, so that they do not size it.
fn handle_socket(
    sessions: Arc<Sessions>,
    tx: tokio::sync::mpsc::Sender<Cmd>,
    view: View,
    address: String,
    token: Option<String>,
    c: ws::Connection,
) -> impl std::future::Future<Output = ()> + Send {
    let ws::Connection { mut reader, out } = c;
    let instance = sessions.next_instance();
    let (done, attached) = oneshot::channel();
    let attach = Box::new(Cmd::Attach {
        instance,
        view,
        address,
        out: out.clone(),
        token,
        done,
    });
    async move {
        let sent = Box::pin(tx.send(*attach)).await.is_ok();
        let attached = if sent { attached.await.ok() } else { None };
        match attached {
            Some(Ok(())) => {
                sessions.metrics.devices.fetch_add(1, Relaxed);
                read_loop(&sessions, instance, &tx, &mut reader, &out).await;
                let _ = Box::pin(tx.send(Cmd::Detach { instance })).await;
                sessions.metrics.devices.fetch_sub(1, Relaxed);
            }
            refused => refuse(&sessions, refused, &out),
        }
        drop(out);
        Box::pin(reader.finish()).await;
    }
}

/// Says goodbye to a device whose attach was refused (or whose session
/// closed), and closes it.
fn refuse(sessions: &Sessions, attached: Option<Result<(), AttachRefused>>, out: &DeviceOut) {
    match attached {
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
}

async fn read_loop(
    sessions: &Sessions,
    instance: u64,
    tx: &tokio::sync::mpsc::Sender<Cmd>,
    reader: &mut ws::Reader,
    out: &DeviceOut,
) {
    loop {
        // The frame and its bytes are gone before the rare wait for room
        // in the session's queue (`unit::offer`): kept across it, they
        // would widen every device's state for its life
        // (docs/BENCHMARKS.md, "An idle connection's queue, writer and
        // room entry made smaller").
        let (sent, bye) = {
            let frame = match reader.next().await {
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
                // A text message is UTF-8 already (tungstenite checked it).
                ws::Event::Text(t) => parse_frame(t.as_str()),
                ws::Event::Binary(b) => parse_frame_bytes(&b),
            };
            if frame.as_ref().map_or(true, |f| !f.is_compatible()) {
                sessions.metrics.malformed_frames.fetch_add(1, Relaxed);
            }
            // Nothing is read after the device's goodbye.
            let bye = matches!(frame, Ok(Frame::Goodbye { .. }));
            // A full session queue holds this reader (and only it) back.
            (unit::offer(tx, Cmd::Frame { instance, frame }), bye)
        };
        if !sent.await || bye {
            return;
        }
    }
}
