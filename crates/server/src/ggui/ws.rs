//! One socket of `/ggui/ws`: the upgrade (origin, token, frame cap), a
//! reader that hands each text message to the channel actor, and a writer
//! that drains the connection's bounded outbound queue.

use super::{Cmd, Ggui};
use crate::unit;
use crate::ws;
use crate::ws::Utf8Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hostwire_ggui::decode::{CLOSE_MESSAGE_TOO_BIG, MAX_FRAME_BYTES};
use hostwire_ggui::{codes, encode_error, make_error_payload};
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Server pings keep idle connections alive behind proxies (the socket
/// driver's interval, which is the live channel's).
pub const PING_INTERVAL: Duration = ws::PING_INTERVAL;
const _: () =
    assert!(PING_INTERVAL.as_millis() == hostwire_ggui::channel::PING_INTERVAL_MS as u128);
/// A socket that sends nothing but pings for this long is closed (1001).
pub const IDLE_TIMEOUT: Duration = Duration::from_millis(hostwire_ggui::channel::IDLE_TIMEOUT_MS);
/// The outbound queue's bound in bytes: a subscriber that does not read
/// is closed (1013) before its envelopes pile up.
pub const OUTBOUND_BYTES: usize = 16 * 1024 * 1024;

pub const CLOSE_NORMAL: u16 = ws::CLOSE_NORMAL;
pub const CLOSE_GOING_AWAY: u16 = ws::CLOSE_GOING_AWAY;
// The channel's going-away code is the socket driver's.
const _: () = assert!(CLOSE_GOING_AWAY == hostwire_ggui::channel::CLOSE_GOING_AWAY);
pub const CLOSE_TOO_SLOW: u16 = ws::CLOSE_TOO_SLOW;

/// The live channel's socket settings (its frame bound in frames from the
/// configuration).
pub(super) fn socket_config(outbound_frames: usize) -> ws::Config {
    ws::Config {
        // Envelopes out may carry props the agent API took (bodies up to
        // `API_BODY_LIMIT`): unsent bytes must hold two of them.
        max_unsent_bytes: 2 * super::api::API_BODY_LIMIT + 64 * 1024,
        idle_timeout: IDLE_TIMEOUT,
        outbound_frames,
        outbound_bytes: OUTBOUND_BYTES,
        oversized: (CLOSE_MESSAGE_TOO_BIG, "frame too large"),
        ..ws::Config::new(MAX_FRAME_BYTES)
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
pub(crate) struct Outbound(ws::Outbound);

impl Outbound {
    pub(crate) fn frame(&self, frame: Utf8Bytes) -> Pushed {
        match self.0.send(frame) {
            Ok(()) => Pushed::Queued,
            Err(ws::Refused::Full) => Pushed::TooSlow,
            Err(ws::Refused::Closing) => Pushed::Closing,
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
    ws: ws::Upgrade,
) -> Response {
    // Browsers always send an Origin: check it. Agents and test kits send
    // none; the token (when configured) is what admits them.
    if let Some(origin) = headers.get(header::ORIGIN) {
        if !ggui.config.allowed_origins.allows(origin.to_str().ok()) {
            return (
                StatusCode::FORBIDDEN,
                "Origin not allowed: a browser's page must be of an allowed origin",
            )
                .into_response();
        }
    }
    // A UI token minted through the agent API (bearer header, or
    // `?token=` for browsers) admits the socket to its one session.
    let given = presented
        .token
        .clone()
        .or_else(|| query.get("token").cloned());
    // A token another node minted: the socket is carried there, which
    // checks it.
    if let Some(t) = given.as_deref() {
        if ggui.ui_tokens.lookup(t).is_none() {
            if let Some(node) = ggui.minted_elsewhere(t) {
                let (token, config) = (
                    t.to_owned(),
                    Arc::new(socket_config(ggui.config.outbound_queue)),
                );
                return ws.on_upgrade(config, move |c| ggui.carry_ui(node, token, c));
            }
        }
    }
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
    let config = Arc::new(socket_config(ggui.config.outbound_queue));
    ws.on_upgrade(config, move |c| handle_socket(ggui, c, bound))
}

pub(super) fn handle_socket(
    ggui: Arc<Ggui>,
    c: ws::Connection,
    bound: (String, String),
) -> impl Future<Output = ()> + Send {
    // Not an `async fn`: its arguments (the bound pair among them) would be
    // kept in the future for the socket's life beside what is made of them.
    let ws::Connection { mut reader, out } = c;
    // The UI token admitted it (checked at the upgrade).
    let authenticated = true;
    let conn = ggui.next_conn();
    ggui.metrics.connections.fetch_add(1, Relaxed);
    let out = Outbound(out);
    // Offered before the future exists: the future keeps no room for the
    // command (a full queue's boxed wait only).
    let opened = unit::offer_owned(
        ggui.tx.clone(),
        Cmd::Open {
            conn,
            out: out.clone(),
            authenticated,
            bound: Some(bound),
        },
    );
    async move {
        if opened.await {
            // The read loop, inline: an `async fn` of it would keep its
            // arguments twice.
            loop {
                let event = poll_fn(|cx| reader.poll_event(cx)).await;
                let Some(text) = read_text(&ggui, &out, event) else {
                    break;
                };
                if !unit::offer(&ggui.tx, Cmd::Frame { conn, text }).await {
                    break;
                }
            }
            unit::offer(&ggui.tx, Cmd::Closed { conn }).await;
        }
        drop(out);
        Box::pin(reader.finish()).await;
        ggui.metrics.connections.fetch_sub(1, Relaxed);
    }
}

/// The text of one event read from a socket; `None` when it ends.
fn read_text(ggui: &Ggui, out: &Outbound, event: ws::Event) -> Option<Utf8Bytes> {
    match event {
        ws::Event::End => None,
        ws::Event::Oversized => {
            ggui.metrics.oversized_frames.fetch_add(1, Relaxed);
            let message = format!("frame exceeds the {MAX_FRAME_BYTES}-byte limit");
            let payload = make_error_payload(codes::FRAME_TOO_LARGE, message, None);
            out.frame(super::to_text(encode_error(&payload, None)));
            None
        }
        ws::Event::Text(t) => Some(t),
        // The core answers a frame that is not JSON text itself.
        ws::Event::Binary(b) => Some(match Utf8Bytes::try_from(b) {
            Ok(t) => t,
            Err(_) => Utf8Bytes::from_static("\u{fffd}"),
        }),
    }
}
