//! The floor: a bare WebSocket forwarder that speaks just enough of relay
//! protocol 1 for the load generator (create a room, attach, `to`, `up`),
//! with no validation, no limits, no presence and no store. Same stack as
//! hostwire (axum, tokio). Two ways to drive a socket, to measure against
//! each other: a reader task and a writer task (that batches) over the
//! split socket, or one task over the unsplit socket that selects between
//! its next frame and its outbound queue (`--one-task`).
//!
//! The same forwarder also runs over two other WebSocket crates
//! (`--ws tokio-websockets|fastwebsockets`), to measure the crates against
//! each other: the same axum routes and HTTP side (hyper 1 underneath, its
//! upgrade handing over the socket), the same room logic ([`on_text`]),
//! and one task per connection in the shape of `--one-task`.

use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// The WebSocket crate the forwarder runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WsCrate {
    /// axum's WebSocket (tokio-tungstenite): a reader and a writer task, or
    /// one task with `--one-task`.
    #[default]
    Tungstenite,
    /// tokio-tungstenite over the TCP stream itself (hyper's upgraded socket
    /// taken apart), one task per connection: tungstenite without axum's
    /// wrapper and hyper's boxed, rewinding stream in between.
    TungsteniteRaw,
    /// The server's own socket layer (`hostwire::ws::WebSocket`: tungstenite
    /// over the `TcpStream` with the stream's readiness), one task per
    /// connection.
    Hostwire,
    /// tokio-websockets, one task per connection.
    TokioWebsockets,
    /// fastwebsockets, one task per connection.
    Fastwebsockets,
}

/// A frame queued for a connection, in the type its crate writes without
/// another copy: axum's `Utf8Bytes`, tokio-websockets' `Payload`, or the
/// `Vec<u8>` of a fastwebsockets `Payload::Owned`.
pub trait Outbound: From<String> + From<&'static str> + Send + 'static {}
impl<T: From<String> + From<&'static str> + Send + 'static> Outbound for T {}

type Tx<M> = mpsc::UnboundedSender<M>;

struct RoomConns<M> {
    host: Option<Tx<M>>,
    players: HashMap<String, Tx<M>>,
}

impl<M> Default for RoomConns<M> {
    fn default() -> Self {
        RoomConns {
            host: None,
            players: HashMap::new(),
        }
    }
}

struct Forwarder<M> {
    rooms: Mutex<HashMap<String, Arc<Mutex<RoomConns<M>>>>>,
    next: AtomicU64,
    one_task: bool,
}

impl<M> Forwarder<M> {
    fn new(one_task: bool) -> Self {
        Forwarder {
            rooms: Mutex::default(),
            next: AtomicU64::new(0),
            one_task,
        }
    }
}

#[derive(Deserialize)]
struct Frame<'a> {
    t: &'a str,
    #[serde(default)]
    pin: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

pub fn router() -> Router {
    router_with(false)
}

/// The forwarder, its sockets each driven by one task when `one_task`.
pub fn router_with(one_task: bool) -> Router {
    router_for(WsCrate::Tungstenite, one_task)
}

/// The forwarder over `ws`; `one_task` chooses for tungstenite only (the
/// other crates always drive a socket from one task).
pub fn router_for(ws: WsCrate, one_task: bool) -> Router {
    match ws {
        WsCrate::Tungstenite => routes(get(upgrade), Forwarder::<Utf8Bytes>::new(one_task)),
        WsCrate::TungsteniteRaw => routes(
            get(upgrade_tungstenite_raw),
            Forwarder::<tokio_tungstenite::tungstenite::Utf8Bytes>::new(true),
        ),
        WsCrate::Hostwire => routes(
            get(upgrade_hostwire),
            Forwarder::<hostwire::ws::Utf8Bytes>::new(true),
        ),
        WsCrate::TokioWebsockets => routes(
            get(upgrade_tokio_websockets),
            Forwarder::<tokio_websockets::Payload>::new(true),
        ),
        WsCrate::Fastwebsockets => {
            routes(get(upgrade_fastwebsockets), Forwarder::<Vec<u8>>::new(true))
        }
    }
}

/// Serves `router` on `listener` as hostwire's accept loop does, whatever
/// the crate: HTTP/1.1 from hyper on each accepted `TcpStream` (with
/// TCP_NODELAY), so that an upgraded socket can be taken back as that
/// stream (`Upgraded::downcast`).
pub async fn serve(listener: tokio::net::TcpListener, router: Router) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            tower_service::Service::call(&mut router.clone(), req.map(axum::body::Body::new))
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .with_upgrades()
                .await;
        });
    }
}

/// The same HTTP side for every crate: rooms, and `/ws` upgraded by `ws`.
fn routes<M: Outbound>(ws: MethodRouter<Arc<Forwarder<M>>>, f: Forwarder<M>) -> Router {
    Router::new()
        .route("/api/rooms", post(create::<M>))
        .route("/ws", ws)
        .with_state(Arc::new(f))
}

async fn create<M: Outbound>(State(f): State<Arc<Forwarder<M>>>) -> impl IntoResponse {
    let pin = format!("{:06}", 100_000 + f.next.fetch_add(1, Relaxed) % 900_000);
    f.rooms.lock().unwrap().insert(pin.clone(), Arc::default());
    (
        axum::http::StatusCode::CREATED,
        Json(json!({"pin": pin, "hostToken": "bare"})),
    )
}

async fn upgrade(
    State(f): State<Arc<Forwarder<Utf8Bytes>>>,
    ws: WebSocketUpgrade,
) -> impl IntoResponse {
    // Per idle connection, tungstenite holds a read buffer of the size set
    // here (1 KiB, allocated up front) and a write buffer, a `Vec` that
    // starts empty and grows as frames are fed (written out once it holds
    // 16 KiB, or on flush), keeping its capacity.
    ws.read_buffer_size(1024)
        .write_buffer_size(16 * 1024)
        .on_upgrade(move |s| async move {
            if f.one_task {
                conn_one_task(f, s).await
            } else {
                conn(f, s).await
            }
        })
}

/// What a connection is attached to.
struct Attached<M> {
    room: Option<Arc<Mutex<RoomConns<M>>>>,
    me: String,
}

impl<M> Default for Attached<M> {
    fn default() -> Self {
        Attached {
            room: None,
            me: String::new(),
        }
    }
}

impl<M> Attached<M> {
    /// The connection is gone: out of its room's players.
    fn leave(self) {
        if let Some(r) = self.room {
            r.lock().unwrap().players.remove(&self.me);
        }
    }
}

/// One task for the connection: the socket is not split, and frames for it
/// are written by the task that reads it, between reads.
async fn conn_one_task(f: Arc<Forwarder<Utf8Bytes>>, socket: WebSocket) {
    one_task(f, socket, Message::Text, |m| match m {
        Message::Text(t) => Some(t.as_str()),
        _ => None,
    })
    .await
}

/// The one-task loop over any crate's socket (a stream of messages and a
/// sink of them): `message` makes a text message of a queued frame,
/// `text` reads one. The crate's `next` must be cancel-safe (a frame read
/// in part stays in its buffer), so that the select can drop it for a
/// write.
async fn one_task<S, M, Q, E>(
    f: Arc<Forwarder<Q>>,
    mut socket: S,
    message: fn(Q) -> M,
    text: fn(&M) -> Option<&str>,
) where
    S: futures_util::Stream<Item = Result<M, E>> + futures_util::Sink<M> + Unpin,
    Q: Outbound,
{
    // Unbounded, as in `conn`: the bare forwarder is the benchmark's floor
    // (no limits), driven only by the load generator, which reads.
    let (tx, mut rx) = mpsc::unbounded_channel::<Q>();
    let mut at = Attached::default();
    loop {
        tokio::select! {
            Some(m) = rx.recv() => {
                let mut ok = socket.feed(message(m)).await.is_ok();
                while ok {
                    match rx.try_recv() {
                        Ok(m) => ok = socket.feed(message(m)).await.is_ok(),
                        Err(_) => break,
                    }
                }
                if !ok || socket.flush().await.is_err() {
                    break;
                }
            }
            msg = socket.next() => {
                let Some(Ok(msg)) = msg else { break };
                if let Some(t) = text(&msg) {
                    on_text(&f, &tx, &mut at, t);
                }
            }
        }
    }
    at.leave();
}

async fn conn(f: Arc<Forwarder<Utf8Bytes>>, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    // Unbounded: the bare forwarder is the benchmark's floor, with no
    // limits, driven only by the load generator, which reads.
    let (tx, mut rx) = mpsc::unbounded_channel::<Utf8Bytes>();
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if sink.feed(Message::Text(m)).await.is_err() {
                return;
            }
            while let Ok(m) = rx.try_recv() {
                if sink.feed(Message::Text(m)).await.is_err() {
                    return;
                }
            }
            if sink.flush().await.is_err() {
                return;
            }
        }
    });
    let mut at = Attached::default();
    while let Some(Ok(msg)) = stream.next().await {
        let Message::Text(text) = msg else { continue };
        on_text(&f, &tx, &mut at, &text);
    }
    at.leave();
    drop(tx);
    let _ = writer.await;
}

/// The `Sec-WebSocket-Accept` of an upgrade request, if it is one (a GET,
/// by the route): the server's own check.
fn accept_key(headers: &HeaderMap) -> Option<HeaderValue> {
    hostwire::ws::accept_key(headers).ok()
}

/// 101 Switching Protocols with the given `Sec-WebSocket-Accept`.
fn switching(accept: HeaderValue) -> Response {
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::UPGRADE, HeaderValue::from_static("websocket")),
            (header::CONNECTION, HeaderValue::from_static("upgrade")),
            (header::SEC_WEBSOCKET_ACCEPT, accept),
        ],
    )
        .into_response()
}

/// Answers an upgrade request with its 101 and hands the socket hyper
/// upgrades to `run`, in a task of its own.
fn upgrade_then<F, Fut>(mut req: Request, run: F) -> Response
where
    F: FnOnce(hyper::upgrade::Upgraded) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let Some(accept) = accept_key(req.headers()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            run(upgraded).await;
        }
    });
    switching(accept)
}

/// tokio-tungstenite over the TCP stream: hyper's upgraded socket is taken
/// apart (`Upgraded::downcast`, which [`serve`]'s stream allows), else
/// used as it is.
async fn upgrade_tungstenite_raw(
    State(f): State<Arc<Forwarder<tokio_tungstenite::tungstenite::Utf8Bytes>>>,
    req: Request,
) -> Response {
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
    upgrade_then(req, |upgraded| async move {
        // The same buffers as `upgrade`'s.
        let config = WebSocketConfig::default()
            .read_buffer_size(1024)
            .write_buffer_size(16 * 1024);
        match upgraded.downcast::<TokioIo<tokio::net::TcpStream>>() {
            Ok(parts) => {
                // hyper's read buffer (8 KiB) stays alive for as long as a
                // slice of it does, even an empty one.
                let pre = match parts.read_buf.is_empty() {
                    true => bytes::Bytes::new(),
                    false => bytes::Bytes::copy_from_slice(&parts.read_buf),
                };
                drop(parts.read_buf);
                let io = Prefixed {
                    pre,
                    io: parts.io.into_inner(),
                };
                let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                    io,
                    Role::Server,
                    Some(config),
                )
                .await;
                conn_tungstenite_raw(f, ws).await;
            }
            Err(upgraded) => {
                let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                conn_tungstenite_raw(f, ws).await;
            }
        }
    })
}

/// The server's socket layer over the TCP stream hyper upgraded.
async fn upgrade_hostwire(
    State(f): State<Arc<Forwarder<hostwire::ws::Utf8Bytes>>>,
    req: Request,
) -> Response {
    use hostwire::ws::{Message, Socket, Tcp, WebSocket};
    upgrade_then(req, |upgraded| async move {
        let Ok(parts) = upgraded.downcast::<TokioIo<tokio::net::TcpStream>>() else {
            return;
        };
        // The same buffers as `upgrade`'s, one `Config` for every socket.
        static CONFIG: std::sync::OnceLock<Arc<hostwire::ws::Config>> = std::sync::OnceLock::new();
        let config = Arc::clone(CONFIG.get_or_init(|| {
            Arc::new(hostwire::ws::Config {
                read_buffer: 1024,
                write_buffer: 16 * 1024,
                ..hostwire::ws::Config::new(64 << 20)
            })
        }));
        // Copied (hyper's whole read buffer, 8 KiB, stays alive for as
        // long as a slice of it does) and let go with `parts`.
        let ws = WebSocket::new(Tcp::new(parts.io.into_inner()), &parts.read_buf, config);
        one_task(f, Socket::Ws(ws), Message::Text, |m| match m {
            Message::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .await
    })
}

/// A TCP stream and what hyper read of it past the request, read first.
struct Prefixed {
    pre: bytes::Bytes,
    io: tokio::net::TcpStream,
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre.split_to(n));
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Prefixed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// One task for a tokio-tungstenite connection, as `conn_one_task`.
async fn conn_tungstenite_raw<S>(
    f: Arc<Forwarder<tokio_tungstenite::tungstenite::Utf8Bytes>>,
    socket: tokio_tungstenite::WebSocketStream<S>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::Message;
    one_task(f, socket, Message::Text, |m| match m {
        Message::Text(t) => Some(t.as_str()),
        _ => None,
    })
    .await
}

/// tokio-websockets over hyper's upgrade: axum answers 101 and the crate
/// takes the upgraded socket over (`ServerBuilder::serve`).
async fn upgrade_tokio_websockets(
    State(f): State<Arc<Forwarder<tokio_websockets::Payload>>>,
    req: Request,
) -> Response {
    upgrade_then(req, |upgraded| async move {
        // Per idle connection, the crate holds: a read buffer of 8 KiB
        // (tokio-util's `FramedRead` default, allocated up front; the crate
        // has no setting for it), no write buffer (outgoing frames are
        // queued as their header and a reference to the payload, written
        // with writev once `flush_threshold` bytes are queued or on flush;
        // the queue is a `VecDeque` of capacity 1), and an empty buffer for
        // fragmented messages. The flush threshold is tungstenite's write
        // buffer size (16 KiB): how much goes out in one write either way.
        let config = tokio_websockets::Config::default().flush_threshold(16 * 1024);
        let ws = tokio_websockets::ServerBuilder::new()
            .config(config)
            .serve(TokioIo::new(upgraded));
        conn_tokio_websockets(f, ws).await;
    })
}

/// One task for a tokio-websockets connection, as `conn_one_task` (its
/// `Stream::next` is cancel-safe; pings are answered and closes
/// acknowledged by the crate).
async fn conn_tokio_websockets<S>(
    f: Arc<Forwarder<tokio_websockets::Payload>>,
    socket: tokio_websockets::WebSocketStream<S>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    one_task(f, socket, tokio_websockets::Message::text, |m| m.as_text()).await
}

/// fastwebsockets over hyper's upgrade (the crate's `upgrade` feature):
/// axum answers with its 101 and the crate takes the upgraded socket over.
async fn upgrade_fastwebsockets(
    State(f): State<Arc<Forwarder<Vec<u8>>>>,
    mut req: Request,
) -> Response {
    let Ok((response, upgrade)) = fastwebsockets::upgrade::upgrade(&mut req) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    tokio::spawn(async move {
        let Ok(ws) = upgrade.await else {
            return;
        };
        conn_fastwebsockets(f, ws).await;
    });
    response.map(axum::body::Body::new)
}

/// One task for a fastwebsockets connection, in the shape of
/// `conn_one_task`. The crate's `read_frame` is not cancel-safe (a frame
/// read in part is lost when its future is dropped: denoland/fastwebsockets
/// issues 64 and 113), so the socket is split (`tokio::io::split`, the
/// crate's `unstable-split`) and one read future lives across the writes
/// it races with, dropped only once it has returned a whole message.
///
/// Per idle connection, the crate holds: a read buffer of 8 KiB (allocated
/// up front; the crate has no setting for it) and a write buffer, a `Vec`
/// that starts empty and grows to the largest frame written (header and
/// payload are copied into it and written with one `write_all`; payloads
/// over 1 KiB go out with writev instead). There is no write buffering
/// across frames: each frame is one write to the socket, so the flush
/// after the queue is drained writes nothing more. Beside the crate, the
/// split adds an `Arc` and a lock around the socket.
async fn conn_fastwebsockets<S>(f: Arc<Forwarder<Vec<u8>>>, mut ws: fastwebsockets::WebSocket<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use fastwebsockets::{Frame, OpCode, Payload, WebSocketError};
    // Pings and closes come back to this task, which answers them on the
    // write half: the read half cannot write while a write is in progress.
    ws.set_auto_pong(false);
    ws.set_auto_close(false);
    let (read, mut write) = ws.split(tokio::io::split);
    // Whole messages, fragments collected.
    let mut read = fastwebsockets::FragmentCollectorRead::new(read);
    // With automatic pongs and closes off the read half owes no writes.
    let mut obligated = |_| std::future::ready(Ok::<(), WebSocketError>(()));
    // Unbounded, as in `conn`.
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let mut at = Attached::default();
    'conn: loop {
        let frame = {
            let next = read.read_frame(&mut obligated);
            tokio::pin!(next);
            loop {
                tokio::select! {
                    frame = &mut next => break frame,
                    Some(m) = rx.recv() => {
                        let mut ok = write.write_frame(Frame::text(Payload::Owned(m))).await.is_ok();
                        while ok {
                            match rx.try_recv() {
                                Ok(m) => {
                                    ok = write
                                        .write_frame(Frame::text(Payload::Owned(m)))
                                        .await
                                        .is_ok();
                                }
                                Err(_) => break,
                            }
                        }
                        if !ok || write.flush().await.is_err() {
                            break 'conn;
                        }
                    }
                }
            }
        };
        let Ok(frame) = frame else { break };
        match frame.opcode {
            // Validated as UTF-8 by the crate; checked again here, safely.
            OpCode::Text => {
                if let Ok(text) = std::str::from_utf8(&frame.payload) {
                    on_text(&f, &tx, &mut at, text);
                }
            }
            OpCode::Ping => {
                let pong = write.write_frame(Frame::pong(frame.payload)).await;
                if pong.is_err() || write.flush().await.is_err() {
                    break;
                }
            }
            OpCode::Close => {
                let _ = write.write_frame(Frame::close_raw(frame.payload)).await;
                let _ = write.flush().await;
                break;
            }
            _ => {}
        }
    }
    at.leave();
}

/// One text frame from a connection: what the forwarder does with it,
/// whatever the crate (`M` is the type its connections' queues carry).
fn on_text<M: Outbound>(f: &Forwarder<M>, tx: &Tx<M>, at: &mut Attached<M>, text: &str) {
    let Ok(frame) = serde_json::from_str::<Frame>(text) else {
        return;
    };
    match frame.t {
        "host" | "join" => {
            let Some(r) = frame
                .pin
                .and_then(|p| f.rooms.lock().unwrap().get(&p).cloned())
            else {
                return;
            };
            if frame.t == "host" {
                r.lock().unwrap().host = Some(tx.clone());
                let _ = tx.send(M::from(r#"{"t":"hosting","players":[]}"#));
            } else {
                at.me = format!("p-{}", f.next.fetch_add(1, Relaxed));
                r.lock().unwrap().players.insert(at.me.clone(), tx.clone());
                let _ = tx.send(M::from(
                    json!({"t": "joined", "playerId": at.me, "token": "bare"}).to_string(),
                ));
                let presence =
                    json!({"t": "presence", "player": {"id": at.me}, "event": "join"}).to_string();
                if let Some(h) = &r.lock().unwrap().host {
                    let _ = h.send(M::from(presence));
                }
            }
            at.room = Some(r);
        }
        "to" => {
            if let (Some(r), Some(to)) = (&at.room, frame.to) {
                let out = format!(
                    "{{\"t\":\"data\",\"data\":{}}}",
                    frame.data.map_or("null", |d| d.get())
                );
                if let Some(p) = r.lock().unwrap().players.get(&to) {
                    let _ = p.send(M::from(out));
                }
            }
        }
        "up" => {
            if let Some(r) = &at.room {
                let out = format!(
                    "{{\"t\":\"from\",\"from\":\"{}\",\"data\":{}}}",
                    at.me,
                    frame.data.map_or("null", |d| d.get())
                );
                if let Some(h) = &r.lock().unwrap().host {
                    let _ = h.send(M::from(out));
                }
            }
        }
        "ping" => {
            let _ = tx.send(M::from(r#"{"t":"pong","time":0}"#));
        }
        _ => {}
    }
}
