//! The relay server: axum + tokio around the sans-IO rules of
//! `hostwire_memizy::relay`. One task per room owns its state; each
//! connection has a reader task and a writer task with a bounded queue.

use crate::metrics::Metrics;
use crate::outbound;
use crate::store_writer::StoreWriter;
use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use hostwire_core::Clock;
use hostwire_memizy::limits::RelayLimits;
use hostwire_memizy::manifest::extract_manifest_text;
use hostwire_memizy::relay::*;
use hostwire_store::StoredRoom;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Frames waiting for one slow reader before it is closed (1013).
pub const OUTBOUND_QUEUE: usize = 1024;
/// Commands waiting for one room.
const ROOM_QUEUE: usize = 4096;
/// Server pings keep idle connections alive behind proxies.
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a closing connection may take to flush its queue.
/// tungstenite's read buffer per connection: a player's frame fits in one
/// read; a host's burst of 40 takes about 18 (9 with 1 KiB, for 512 more
/// bytes on every idle connection). It stays reusable only because small
/// frames are copied out of it (see `on_message`).
const READ_BUFFER: usize = 512;

const WRITER_GRACE: Duration = Duration::from_secs(5);

/// Which browser origins may use the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedOrigins {
    /// Development only.
    Any,
    List(Vec<String>),
}

impl AllowedOrigins {
    /// Parses `ALLOWED_ORIGINS`: `*` or a comma-separated list.
    pub fn parse(s: &str) -> Self {
        if s.trim() == "*" {
            AllowedOrigins::Any
        } else {
            AllowedOrigins::List(
                s.split(',')
                    .map(|o| o.trim().to_owned())
                    .filter(|o| !o.is_empty())
                    .collect(),
            )
        }
    }

    pub fn allows(&self, origin: Option<&str>) -> bool {
        match self {
            AllowedOrigins::Any => true,
            AllowedOrigins::List(l) => origin.is_some_and(|o| l.iter().any(|a| a == o)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub allowed_origins: AllowedOrigins,
    pub trust_proxy: bool,
    pub rooms_per_ip_per_hour: u32,
    pub limits: RelayLimits,
    /// Frames queued for one connection before it counts as too slow.
    pub outbound_queue: usize,
}

type WsSink = SplitSink<WebSocket, Message>;

/// A connection's sending half while its writer is idle. A frame for an
/// idle connection is written from here at once, by the task that made it:
/// no wake of the writer, and under load the frame leaves as soon as it is
/// routed instead of after every task queued ahead of the writer.
struct Parked(Mutex<Option<WsSink>>);

impl Parked {
    fn write_now(&self, frame: Utf8Bytes) -> outbound::Direct<Utf8Bytes> {
        use outbound::Direct;
        // Never wait for the writer: if it has the socket, queue.
        let Ok(mut slot) = self.0.try_lock() else {
            return Direct::Declined(frame);
        };
        let Some(sink) = slot.as_mut() else {
            return Direct::Declined(frame);
        };
        // No waker of ours to register: what cannot finish now is handed to
        // the writer, which registers its own.
        let mut cx = Context::from_waker(Waker::noop());
        if !matches!(sink.poll_ready_unpin(&mut cx), Poll::Ready(Ok(()))) {
            return Direct::Declined(frame);
        }
        if sink.start_send_unpin(Message::Text(frame)).is_err() {
            // A broken socket: the writer's flush finds out and ends it.
            return Direct::Unflushed;
        }
        match sink.poll_flush_unpin(&mut cx) {
            Poll::Ready(Ok(())) => Direct::Written,
            _ => Direct::Unflushed,
        }
    }

    fn take(&self) -> Option<WsSink> {
        self.0.lock().ok()?.take()
    }

    fn put(&self, sink: WsSink) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(sink);
        }
    }
}

/// The sending side of one connection.
#[derive(Clone)]
struct Outbound(outbound::Outbound<Utf8Bytes, Parked>);

const TOO_SLOW: outbound::Close = (CLOSE_TOO_SLOW, "too slow: outbound queue full");

impl Outbound {
    /// Sends a frame: at once when the connection is idle, else queued; a
    /// full queue closes the connection (1013).
    fn frame(&self, frame: Utf8Bytes, metrics: &Metrics) -> bool {
        match self
            .0
            .push_or_write(frame, TOO_SLOW, |f| self.0.parked().write_now(f))
        {
            Ok(()) => true,
            Err(outbound::Refused::Full) => {
                metrics.slow_consumers_closed.fetch_add(1, Relaxed);
                false
            }
            Err(outbound::Refused::Closing) => false,
        }
    }
    /// Closes the connection after what is queued.
    fn close(&self, code: u16, reason: &'static str) {
        self.0.close((code, reason));
    }
}

enum RoomCmd {
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
struct RoomHandle {
    tx: mpsc::Sender<RoomCmd>,
}

/// Everything the handlers share.
pub struct Relay {
    config: RelayConfig,
    clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    writer: StoreWriter,
    rooms: Mutex<HashMap<String, RoomHandle>>,
    rooms_by_ip: Mutex<HashMap<String, VecDeque<u64>>>,
    next_conn: AtomicU64,
    players: Arc<AtomicU64>,
}

impl Relay {
    /// Starts the relay with the rooms a store held.
    pub fn start(
        config: RelayConfig,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        writer: StoreWriter,
        stored: Vec<StoredRoom>,
    ) -> Arc<Relay> {
        let relay = Arc::new(Relay {
            config,
            clock,
            metrics,
            writer,
            rooms: Mutex::new(HashMap::new()),
            rooms_by_ip: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            players: Arc::new(AtomicU64::new(0)),
        });
        let now = relay.clock.now_ms();
        for s in stored {
            let pin = s.record.pin.clone();
            let away_missing = s.record.host_away_since_ms.is_none();
            let room = Room::restore(s.record, now, relay.config.limits);
            if away_missing {
                // The host was attached when the server stopped: away from now.
                relay.writer.write_behind(vec![RoomChange::HostAway {
                    pin: pin.clone(),
                    since_ms: Some(now),
                }]);
            }
            relay.spawn_room(room, s.bundle_text);
        }
        relay
    }

    fn spawn_room(self: &Arc<Self>, room: Room, bundle: Option<Bytes>) {
        let (tx, rx) = mpsc::channel(ROOM_QUEUE);
        let pin = room.pin().to_owned();
        self.players.fetch_add(room.player_count() as u64, Relaxed);
        if let Ok(mut rooms) = self.rooms.lock() {
            rooms.insert(pin, RoomHandle { tx });
        }
        self.metrics.rooms.fetch_add(1, Relaxed);
        let relay = Arc::clone(self);
        tokio::spawn(async move { relay.run_room(room, bundle, rx).await });
    }

    fn room(&self, pin: &str) -> Option<RoomHandle> {
        self.rooms.lock().ok()?.get(pin).cloned()
    }

    /// Every live room (a snapshot; rooms may close meanwhile).
    fn handles(&self) -> Vec<RoomHandle> {
        self.rooms
            .lock()
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn room_count(&self) -> usize {
        self.rooms.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Creates a room, durable before its PIN is handed out.
    async fn create_room(self: &Arc<Self>) -> Option<(String, String)> {
        let now = self.clock.now_ms();
        let pin = {
            let rooms = self.rooms.lock().ok()?;
            loop {
                let pin = rand::random::<u32>() % 900_000 + 100_000;
                let pin = pin.to_string();
                if !rooms.contains_key(&pin) {
                    break pin;
                }
            }
        };
        let (room, created) = Room::create(pin.clone(), now, self.config.limits);
        let token = room.host_token().as_str().to_owned();
        if !self.writer.write_durable(vec![created]).await {
            return None;
        }
        self.spawn_room(room, None);
        self.metrics.rooms_created.fetch_add(1, Relaxed);
        tracing::info!(pin = %pin, "room created");
        Some((pin, token))
    }

    fn allow_room_creation(&self, ip: &str) -> bool {
        let now = self.clock.now_ms();
        let Ok(mut map) = self.rooms_by_ip.lock() else {
            return false;
        };
        let times = map.entry(ip.to_owned()).or_default();
        while times.front().is_some_and(|t| *t + 3_600_000 <= now) {
            times.pop_front();
        }
        if times.len() >= self.config.rooms_per_ip_per_hour as usize {
            return false;
        }
        times.push_back(now);
        true
    }

    /// Runs one sweep over every room now (the timer calls it every 30 s).
    pub async fn sweep(&self) {
        for h in self.handles() {
            let _ = h.tx.send(RoomCmd::Sweep).await;
        }
        let now = self.clock.now_ms();
        if let Ok(mut map) = self.rooms_by_ip.lock() {
            map.retain(|_, times| {
                while times.front().is_some_and(|t| *t + 3_600_000 <= now) {
                    times.pop_front();
                }
                !times.is_empty()
            });
        }
        // Let the rooms act on the sweep before returning.
        for h in self.handles() {
            let (tx, rx) = oneshot::channel();
            if h.tx.send(RoomCmd::Info(tx)).await.is_ok() {
                let _ = rx.await;
            }
        }
    }

    /// Closes every connection with 1001 (rooms stay stored) and flushes
    /// the store.
    pub async fn shutdown(&self) {
        for h in self.handles() {
            let (tx, rx) = oneshot::channel();
            if h.tx.send(RoomCmd::Shutdown(tx)).await.is_ok() {
                let _ = rx.await;
            }
        }
        self.writer.flush().await;
    }

    async fn run_room(
        self: Arc<Self>,
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
            let now = self.clock.now_ms();
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
                        self.metrics.rooms_expired.fetch_add(1, Relaxed);
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
                            Some((b, u))
                                if b.as_ptr() == frame.as_ptr() && b.len() == frame.len() =>
                            {
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
                        count_out(&self.metrics, &text);
                        target.frame(text, &self.metrics);
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
                    let writer = self.writer.clone();
                    tokio::spawn(async move {
                        let ok = writer.write_durable(changes).await;
                        let _ = reply.send(ok.then_some(version));
                    });
                }
                _ => self.writer.write_behind(changes),
            }
            let players_now = room.player_count();
            if players_now != players_before {
                if players_now > players_before {
                    self.players
                        .fetch_add((players_now - players_before) as u64, Relaxed);
                } else {
                    self.players
                        .fetch_sub((players_before - players_now) as u64, Relaxed);
                }
                players_before = players_now;
            }
            if closed {
                break;
            }
        }
        if let Ok(mut rooms) = self.rooms.lock() {
            rooms.remove(&pin);
        }
        self.players.fetch_sub(room.player_count() as u64, Relaxed);
        self.metrics.rooms.fetch_sub(1, Relaxed);
        tracing::info!(pin = %pin, "room closed");
    }

    fn client_ip(&self, headers: &HeaderMap, peer: SocketAddr) -> String {
        if self.config.trust_proxy {
            if let Some(f) = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
                if let Some(first) = f.split(',').next() {
                    return first.trim().to_owned();
                }
            }
        }
        peer.ip().to_string()
    }

    fn cors(&self, origin: Option<&str>) -> Vec<(header::HeaderName, HeaderValue)> {
        let Some(o) = origin.filter(|o| self.config.allowed_origins.allows(Some(o))) else {
            return Vec::new();
        };
        let Ok(o) = HeaderValue::from_str(o) else {
            return Vec::new();
        };
        vec![
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, o),
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, PUT, OPTIONS"),
            ),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("Authorization, Content-Type"),
            ),
            (
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("X-Bundle-Version"),
            ),
            (
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            ),
            (header::VARY, HeaderValue::from_static("Origin")),
        ]
    }

    /// `{"ok":true,"rooms":…,"connections":…,"players":…}`
    fn health(&self) -> Value {
        json!({
            "ok": true,
            "rooms": self.room_count(),
            "connections": self.metrics.connections.load(Relaxed),
            "players": self.players.load(Relaxed),
        })
    }
}

fn count_out(metrics: &Metrics, text: &str) {
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

fn json_response(
    status: StatusCode,
    body: Value,
    headers: Vec<(header::HeaderName, HeaderValue)>,
) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    for (k, v) in headers {
        r.headers_mut().insert(k, v);
    }
    r
}

fn error(
    status: StatusCode,
    message: &str,
    headers: Vec<(header::HeaderName, HeaderValue)>,
) -> Response {
    json_response(status, json!({"error": message}), headers)
}

/// The relay's routes: `/api/*`, `/ws` and `/metrics`.
pub fn router(relay: Arc<Relay>) -> Router {
    Router::new()
        .route("/ws", get(ws_upgrade))
        .route("/metrics", get(metrics_handler))
        .fallback(api)
        .with_state(relay)
}

async fn metrics_handler(State(relay): State<Arc<Relay>>) -> Response {
    let mut r = relay.metrics.render().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

async fn api(
    State(relay): State<Arc<Relay>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request<Body>,
) -> Response {
    let path = req.uri().path().to_owned();
    if !path.starts_with("/api/") {
        return (StatusCode::NOT_FOUND, "hostwire relay").into_response();
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let cors = relay.cors(origin.as_deref());
    if req.method() == Method::OPTIONS {
        let mut r = StatusCode::NO_CONTENT.into_response();
        for (k, v) in cors {
            r.headers_mut().insert(k, v);
        }
        return r;
    }
    if path == "/api/health" {
        return json_response(StatusCode::OK, relay.health(), cors);
    }
    if origin.is_some() && !relay.config.allowed_origins.allows(origin.as_deref()) {
        return error(StatusCode::FORBIDDEN, "Origin not allowed", Vec::new());
    }
    if path == "/api/rooms" && req.method() == Method::POST {
        let ip = relay.client_ip(req.headers(), peer);
        if !relay.allow_room_creation(&ip) {
            return error(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many rooms from this network, try again later.",
                cors,
            );
        }
        return match relay.create_room().await {
            Some((pin, token)) => json_response(
                StatusCode::CREATED,
                json!({"pin": pin, "hostToken": token}),
                cors,
            ),
            None => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "The room could not be stored; try again.",
                cors,
            ),
        };
    }
    let Some(rest) = path.strip_prefix("/api/rooms/") else {
        return error(StatusCode::NOT_FOUND, "Not found", cors);
    };
    let (pin, bundle) = match rest.split_once('/') {
        None => (rest, false),
        Some((pin, "bundle")) => (pin, true),
        Some(_) => return error(StatusCode::NOT_FOUND, "Not found", cors),
    };
    let Some(room) = is_pin(pin).then(|| relay.room(pin)).flatten() else {
        return error(StatusCode::NOT_FOUND, "Room not found", cors);
    };
    let method = req.method().clone();
    match (bundle, method) {
        (false, Method::GET) => {
            let (tx, rx) = oneshot::channel();
            let _ = room.tx.send(RoomCmd::Info(tx)).await;
            match rx.await {
                Ok(info) => json_response(
                    StatusCode::OK,
                    serde_json::to_value(info).unwrap_or_default(),
                    cors,
                ),
                Err(_) => error(StatusCode::NOT_FOUND, "Room not found", cors),
            }
        }
        (true, Method::GET) => {
            let (tx, rx) = oneshot::channel();
            let _ = room.tx.send(RoomCmd::GetBundle(tx)).await;
            match rx.await {
                Ok(Some((version, text))) => {
                    let mut r = Response::new(Body::from(text));
                    let h = r.headers_mut();
                    h.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json; charset=utf-8"),
                    );
                    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                    h.insert("x-bundle-version", HeaderValue::from(version));
                    for (k, v) in cors {
                        h.insert(k, v);
                    }
                    r
                }
                Ok(None) => error(
                    StatusCode::NOT_FOUND,
                    "The host has not chosen a game yet",
                    cors,
                ),
                Err(_) => error(StatusCode::NOT_FOUND, "Room not found", cors),
            }
        }
        (true, Method::PUT) => put_bundle(&relay, room, req, cors).await,
        _ => error(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed", cors),
    }
}

async fn put_bundle(
    relay: &Relay,
    room: RoomHandle,
    req: Request<Body>,
    cors: Vec<(header::HeaderName, HeaderValue)>,
) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_owned();
    // The token is checked first: a caller who is not the host never gets
    // its body read.
    let (tx, rx) = oneshot::channel();
    let _ = room
        .tx
        .send(RoomCmd::IsHost {
            token: token.clone(),
            reply: tx,
        })
        .await;
    match rx.await {
        Err(_) => return error(StatusCode::NOT_FOUND, "Room not found", cors),
        Ok(false) => return error(StatusCode::FORBIDDEN, "Not the host", cors),
        Ok(true) => {}
    }
    let limit = relay.config.limits.bundle_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return error(StatusCode::PAYLOAD_TOO_LARGE, "Bundle too large", cors);
    }
    let body = match axum::body::to_bytes(req.into_body(), limit).await {
        Ok(b) => b,
        Err(_) => return error(StatusCode::PAYLOAD_TOO_LARGE, "Bundle too large", cors),
    };
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => return error(StatusCode::BAD_REQUEST, "Invalid JSON", cors),
    };
    if !parsed.get("pluginHtml").is_some_and(Value::is_string)
        || !parsed.get("set").is_some_and(Value::is_object)
    {
        return error(
            StatusCode::BAD_REQUEST,
            "Expected { pluginHtml: string, set: object }",
            cors,
        );
    }
    let html = parsed["pluginHtml"].as_str().unwrap_or("");
    // appName is read from the manifest data island, without validating the rest.
    let app_name = extract_manifest_text(html)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|m| match m.get("appName") {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(Value::Bool(b)) => Some(b.to_string()),
            _ => None,
        });
    let (tx, rx) = oneshot::channel();
    let _ = room
        .tx
        .send(RoomCmd::PutBundle {
            token,
            text: body,
            app_name,
            reply: tx,
        })
        .await;
    match rx.await {
        Ok(Some(version)) => json_response(StatusCode::OK, json!({"version": version}), cors),
        Ok(None) => error(StatusCode::FORBIDDEN, "Not the host", cors),
        Err(_) => error(StatusCode::NOT_FOUND, "Room not found", cors),
    }
}

async fn ws_upgrade(
    State(relay): State<Arc<Relay>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if !relay.config.allowed_origins.allows(origin) {
        return (StatusCode::FORBIDDEN, "Origin not allowed").into_response();
    }
    let limits = relay.config.limits;
    // Frames above the protocol cap but within twice it get TOO_LARGE and
    // the connection lives; beyond that the WebSocket layer closes it (1009).
    ws.max_message_size(limits.frame_bytes.saturating_mul(2))
        .max_frame_size(limits.frame_bytes.saturating_mul(2))
        // Small buffers: an idle connection should cost little memory;
        // big frames are read in more, smaller reads.
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(16 * 1024)
        .on_upgrade(move |socket| handle_socket(relay, socket))
}

/// Splits the socket and starts its writer; the returned future is the
/// reader. Not an `async fn`: the socket is consumed here, so the reader's
/// future (kept for the connection's whole life) does not hold room for it.
fn handle_socket(relay: Arc<Relay>, socket: WebSocket) -> impl Future<Output = ()> + Send {
    let conn: ConnId = relay.next_conn.fetch_add(1, Relaxed);
    relay.metrics.connections.fetch_add(1, Relaxed);
    let (sink, stream) = socket.split();
    let (out, drain) = outbound::queue(relay.config.outbound_queue, Parked(Mutex::new(Some(sink))));
    let writer = tokio::spawn(write_loop(drain));
    read_loop(relay, conn, stream, Outbound(out), writer)
}

/// Writes what the queue holds (all that is queued, then one flush), and
/// finishes frames that were written at once but not flushed. The socket is
/// taken from `parked` for each piece of work and put back after it.
async fn write_loop(drain: outbound::Drain<Utf8Bytes, Parked>) {
    let parked = drain.parked();
    let close_with = |(code, reason): outbound::Close| {
        Message::Close(Some(CloseFrame {
            code,
            reason: Utf8Bytes::from_static(reason),
        }))
    };
    let mut sink = loop {
        let work = poll_fn(|cx| drain.poll_work(cx)).await;
        let Some(mut sink) = parked.take() else {
            break None;
        };
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
            outbound::Work::Close(c) | outbound::Work::Kill(c) => {
                let _ = sink.send(close_with(c)).await;
                false
            }
            outbound::Work::End => false,
        };
        if !go_on {
            break Some(sink);
        }
        // Back first, then idle: a frame sent in between is queued, and the
        // writer comes back for it.
        parked.put(sink);
        drain.idle();
    };
    if let Some(s) = sink.as_mut() {
        let _ = s.close().await;
    }
    // Stops the reader, if it still reads.
    let _ = drain.kill((CLOSE_NORMAL, "closed"));
}

/// Reads the connection's frames until it ends, then waits for its writer.
fn read_loop(
    relay: Arc<Relay>,
    conn: ConnId,
    mut stream: SplitStream<WebSocket>,
    out: Outbound,
    writer: JoinHandle<()>,
) -> impl Future<Output = ()> + Send {
    let mut reader = Reader {
        state: ConnectionState::new(relay.clock.now_ms(), relay.config.limits),
        relay,
        conn,
        out,
        room: None,
    };
    // An async block, not an async fn: what it captures is used in place,
    // where an async fn would keep its arguments twice in its state.
    async move {
        let idle = Duration::from_millis(reader.relay.config.limits.idle_timeout_ms);
        // One timer per connection for both the idle timeout and the pings,
        // moved only when it fires: a frame just notes its time (a timer per
        // frame cost more than the frame).
        let start = tokio::time::Instant::now();
        let mut last_frame = start;
        let mut next_ping = start + PING_INTERVAL;
        let timer = tokio::time::sleep_until(next_ping.min(start + idle));
        tokio::pin!(timer);
        loop {
            let next = tokio::select! {
                biased;
                _ = poll_fn(|cx| reader.out.0.poll_killed(cx)) => break,
                () = &mut timer => {
                    let now = tokio::time::Instant::now();
                    if now >= last_frame + idle {
                        reader.out.close(CLOSE_GOING_AWAY, "idle timeout");
                        break;
                    }
                    if now >= next_ping {
                        reader.out.0.ping();
                        next_ping = now + PING_INTERVAL;
                    }
                    timer.as_mut().reset(next_ping.min(last_frame + idle));
                    continue;
                }
                n = stream.next() => n,
            };
            last_frame = tokio::time::Instant::now();
            // The rare waits are boxed: their futures (and what they carry)
            // would otherwise widen every connection's reader for its life.
            match reader.on_message(next) {
                Flow::Go => {}
                Flow::Stop => break,
                Flow::Attach(job) => {
                    if !Box::pin(reader.attach(*job)).await {
                        break;
                    }
                }
                Flow::RoomBusy(cmd) => {
                    let Some(r) = &reader.room else { break };
                    if Box::pin(r.tx.send(*cmd)).await.is_err() {
                        break;
                    }
                }
            }
        }
        Box::pin(finish(reader, writer)).await;
    }
}

/// Leaves the room and gives the writer time to send what is queued.
async fn finish(reader: Reader, mut writer: JoinHandle<()>) {
    let Reader {
        relay,
        out,
        room,
        conn,
        ..
    } = reader;
    if let Some(r) = room {
        let _ = r.tx.send(RoomCmd::Detach { conn }).await;
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
    relay.metrics.connections.fetch_sub(1, Relaxed);
}

/// One connection's reading side, between frames.
struct Reader {
    relay: Arc<Relay>,
    conn: ConnId,
    out: Outbound,
    state: ConnectionState,
    room: Option<RoomHandle>,
}

/// What the reader does after a message (rare cases boxed, to keep this
/// small: it lives in the reader's state across the wait).
enum Flow {
    Go,
    Stop,
    Attach(Box<AttachJob>),
    /// The room's queue is full: wait to hand it this.
    RoomBusy(Box<RoomCmd>),
}

struct AttachJob {
    target: RoomHandle,
    pin: String,
    msg: RelayClientMessage,
}

impl Reader {
    fn error(&self, code: RelayErrorCode, message: &str, fatal: bool) {
        send_now(
            &self.out,
            &self.relay.metrics,
            frames::error(code, message, fatal),
        );
    }

    fn on_message(&mut self, next: Option<Result<Message, axum::Error>>) -> Flow {
        let relay = &self.relay;
        let out = &self.out;
        let text = match next {
            Some(Err(e)) => {
                // tungstenite's capacity error: a frame over twice the cap.
                if e.to_string().contains("Space limit exceeded") {
                    self.error(RelayErrorCode::TooLarge, "Frame too large.", true);
                    out.close(CLOSE_TOO_BIG, "frame too large");
                }
                return Flow::Stop;
            }
            None => return Flow::Stop,
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Binary(b))) => match Utf8Bytes::try_from(b) {
                Ok(t) => t,
                Err(_) => {
                    relay.metrics.frame_in("invalid");
                    self.error(RelayErrorCode::BadMessage, "Invalid JSON.", false);
                    return Flow::Go;
                }
            },
            Some(Ok(Message::Close(_))) => return Flow::Stop,
            Some(Ok(_)) => return Flow::Go,
        };
        let now = relay.clock.now_ms();
        match self.state.on_frame(&text, now) {
            ConnStep::Reply(f) => {
                relay
                    .metrics
                    .frame_in(if f.starts_with(b"{\"t\":\"pong\"") {
                        "ping"
                    } else {
                        "invalid"
                    });
                send_now(out, &relay.metrics, f);
                Flow::Go
            }
            ConnStep::RateLimited(f) => {
                relay.metrics.rate_limited.fetch_add(1, Relaxed);
                send_now(out, &relay.metrics, f);
                Flow::Go
            }
            ConnStep::Fatal(f, code) => {
                relay.metrics.frame_in("invalid");
                send_now(out, &relay.metrics, f);
                out.close(CLOSE_POLICY, code.as_str());
                Flow::Stop
            }
            ConnStep::Attach { pin, msg } => {
                relay.metrics.frame_in(msg.type_name());
                let Some(target) = relay.room(&pin) else {
                    let m = if matches!(msg, RelayClientMessage::Host { .. }) {
                        "The room does not exist (anymore)."
                    } else {
                        "No game with this PIN."
                    };
                    self.error(RelayErrorCode::RoomNotFound, m, true);
                    out.close(CLOSE_POLICY, RelayErrorCode::RoomNotFound.as_str());
                    return Flow::Stop;
                };
                if self.room.is_some() {
                    self.error(
                        RelayErrorCode::NotAllowed,
                        "This connection is already attached.",
                        false,
                    );
                    return Flow::Go;
                }
                Flow::Attach(Box::new(AttachJob { target, pin, msg }))
            }
            ConnStep::Forward(msg) => {
                relay.metrics.frame_in(match msg {
                    RelayClientMessage::Other { .. } => "other",
                    ref m => m.type_name(),
                });
                let Some(r) = &self.room else {
                    return Flow::Go;
                };
                // A small frame shares tungstenite's read buffer, which
                // cannot be reused while the frame waits for the room: the
                // next reads would get ever smaller (a third more read
                // calls in the classroom benchmark). A copy frees it.
                let text = if text.len() <= READ_BUFFER {
                    Utf8Bytes::from(text.as_str().to_owned())
                } else {
                    text
                };
                // The room's queue is rarely full: no send future (and its
                // waiter) per frame.
                let conn = self.conn;
                match r.tx.try_send(RoomCmd::Frame { conn, msg, text }) {
                    Ok(()) => Flow::Go,
                    Err(mpsc::error::TrySendError::Full(cmd)) => Flow::RoomBusy(Box::new(cmd)),
                    Err(mpsc::error::TrySendError::Closed(_)) => Flow::Stop,
                }
            }
        }
    }

    /// Attaches the connection to its room; false when refused (the error
    /// and the close are queued).
    async fn attach(&mut self, job: AttachJob) -> bool {
        let AttachJob { target, pin, msg } = job;
        let (reply, answer) = oneshot::channel();
        let cmd = RoomCmd::Attach {
            conn: self.conn,
            out: self.out.clone(),
            msg,
            reply,
        };
        if target.tx.send(cmd).await.is_err() {
            self.error(RelayErrorCode::RoomNotFound, "No game with this PIN.", true);
            self.out
                .close(CLOSE_POLICY, RelayErrorCode::RoomNotFound.as_str());
            return false;
        }
        match answer.await {
            Ok(Some(host)) => {
                self.state
                    .on_attached(&pin, host, self.relay.clock.now_ms());
                self.room = Some(target);
                true
            }
            _ => false,
        }
    }
}

fn send_now(out: &Outbound, metrics: &Metrics, frame: Bytes) {
    if let Ok(t) = Utf8Bytes::try_from(frame) {
        count_out(metrics, &t);
        out.frame(t, metrics);
    }
}
