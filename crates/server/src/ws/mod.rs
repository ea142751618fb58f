//! THE WebSocket connection driver: every endpoint (`/ws`, `/ggui/ws`,
//! `/playerthree/ws`, `/memizy/session/ws`) runs its sockets through this,
//! with its protocol's choices as data ([`Config`]). It owns:
//!
//! - the upgrade: frame limit, small read and write buffers, and a cap on
//!   unsent bytes (replies to pings included: a client that pings and never
//!   reads cannot grow them without limit);
//! - the reader ([`Reader`]): the idle timeout and the server's pings on one
//!   timer, a client's pings never counted as activity, the WebSocket
//!   layer's refusals mapped (an oversized message is an [`Event`] the
//!   protocol answers; RFC 6455 violations close 1007 / 1002 with a reason);
//! - the writer task, which drains the connection's bounded outbound queue
//!   (frames and bytes), with a direct-write fast path for an idle
//!   connection where the protocol asks for it ([`Config::direct_write`]);
//! - a clean close ([`Reader::finish`]): after the server's Close frame it
//!   keeps reading (and discarding) until the peer's Close or
//!   [`Config::close_linger`], so the frames queued before the close and its
//!   code reach the client instead of a TCP reset;
//! - every socket of a server in one registry ([`Sockets`]), so that a
//!   shutdown closes each of them with 1001, attached to a unit or not.
//!
//! A protocol keeps only its own rules: what a text frame means and what to
//! answer.

use crate::outbound;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::task::JoinHandle;

pub use outbound::{Close, Refused};

/// 1000: the connection did what it was for.
pub const CLOSE_NORMAL: u16 = 1000;
/// 1001: the server is going away, or the peer went silent.
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// 1002: a frame that breaks RFC 6455's framing rules.
pub const CLOSE_PROTOCOL_ERROR: u16 = 1002;
/// 1007: a text frame that is not UTF-8 (RFC 6455 §7.4.1).
pub const CLOSE_INVALID_DATA: u16 = 1007;
/// 1009: a message over the frame limit.
pub const CLOSE_MESSAGE_TOO_BIG: u16 = 1009;
/// 1013: the peer does not read fast enough (its outbound queue is full).
pub const CLOSE_TOO_SLOW: u16 = 1013;

/// The close every socket gets when the server shuts down.
pub const SHUTTING_DOWN: Close = (CLOSE_GOING_AWAY, "server shutting down");
/// The close of a socket that sent nothing (pings are not activity) for the
/// idle timeout.
pub const IDLE: Close = (CLOSE_GOING_AWAY, "idle timeout");

/// How long a closing connection may take to send what was queued before
/// its Close frame and the Close frame itself; past it the socket is
/// dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// After the server's Close frame is sent, how long the server keeps
/// reading (and discarding) while it waits for the peer's Close: closing
/// TCP with unread input would reset the connection and could destroy the
/// frames still on their way to the peer.
pub const CLOSE_LINGER: Duration = Duration::from_secs(2);
/// Server pings keep idle connections alive behind proxies.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// tungstenite's write buffer: frames are written once this much is
/// buffered (or on flush).
pub const WRITE_BUFFER: usize = 16 * 1024;
/// tungstenite's read buffer (its default, 128 KiB, is zero-filled before
/// every read and held by every idle connection).
pub const READ_BUFFER: usize = 4 * 1024;

/// One protocol's choices for its sockets.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The largest message (and frame) the WebSocket layer reads; beyond it
    /// the reader reports [`Event::Oversized`] and the connection closes
    /// with [`Config::oversized`].
    pub max_message_bytes: usize,
    pub read_buffer: usize,
    pub write_buffer: usize,
    /// Bytes the WebSocket layer may hold unsent (must exceed the largest
    /// outbound frame plus [`Config::write_buffer`]): a reply to a ping that
    /// does not fit replaces the one waiting.
    pub max_unsent_bytes: usize,
    /// A socket that sends nothing but pings for this long is closed
    /// ([`IDLE`]).
    pub idle_timeout: Duration,
    pub ping_interval: Duration,
    /// The outbound queue's bound in frames.
    pub outbound_frames: usize,
    /// The outbound queue's bound in bytes.
    pub outbound_bytes: usize,
    pub close_grace: Duration,
    pub close_linger: Duration,
    /// The close of a connection whose outbound queue is full.
    pub too_slow: Close,
    /// The close after an oversized message.
    pub oversized: Close,
    /// Whether a frame for an idle connection is written at once by the
    /// task that sends it ([`Outbound::send`]) rather than by the
    /// connection's writer: right for many small units that each write to
    /// their own few sockets (relay rooms); wrong where one task serves
    /// every connection, whose writes would then all run on it.
    pub direct_write: bool,
}

impl Config {
    /// The defaults every protocol starts from: a protocol sets its frame
    /// limit, queue bounds and unsent-bytes cap.
    pub const fn new(max_message_bytes: usize) -> Config {
        Config {
            max_message_bytes,
            read_buffer: READ_BUFFER,
            write_buffer: WRITE_BUFFER,
            // Twice the largest message plus slack, as the relay has it.
            max_unsent_bytes: 2 * max_message_bytes + 64 * 1024,
            idle_timeout: Duration::from_secs(90),
            ping_interval: PING_INTERVAL,
            outbound_frames: 1024,
            outbound_bytes: 8 * 1024 * 1024,
            close_grace: CLOSE_GRACE,
            close_linger: CLOSE_LINGER,
            too_slow: (CLOSE_TOO_SLOW, "too slow: outbound queue full"),
            oversized: (CLOSE_MESSAGE_TOO_BIG, "frame too large"),
            direct_write: false,
        }
    }
}

/// Every open socket of one server, so that shutdown closes each with
/// 1001 and waits for them (attached to a room, session or match or not).
#[derive(Clone, Default)]
pub struct Sockets(Arc<SocketsInner>);

#[derive(Default)]
struct SocketsInner {
    live: Mutex<HashMap<u64, outbound::Closer<Utf8Bytes, Parked>>>,
    next: AtomicU64,
    closing: AtomicBool,
    gone: tokio::sync::Notify,
}

impl Sockets {
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, outbound::Closer<Utf8Bytes, Parked>>> {
        self.0.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn register(&self, out: &Outbound) -> u64 {
        let id = self.0.next.fetch_add(1, Relaxed);
        self.live().insert(id, out.0.closer());
        // Checked after the insert: a shutdown that began meanwhile either
        // saw this socket or is seen here.
        if self.0.closing.load(Relaxed) {
            out.close(SHUTTING_DOWN);
        }
        id
    }

    fn deregister(&self, id: u64) {
        let mut live = self.live();
        live.remove(&id);
        let empty = live.is_empty();
        drop(live);
        if empty {
            self.0.gone.notify_waiters();
        }
    }

    /// How many sockets are open.
    pub fn len(&self) -> usize {
        self.live().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every socket with 1001 (after what is queued for it), and
    /// every socket opened from now on.
    pub fn close_all(&self) {
        self.0.closing.store(true, Relaxed);
        for c in self.live().values() {
            c.close(SHUTTING_DOWN);
        }
    }

    /// Waits until every socket has ended.
    pub async fn ended(&self) {
        loop {
            let gone = self.0.gone.notified();
            tokio::pin!(gone);
            gone.as_mut().enable();
            if self.is_empty() {
                return;
            }
            gone.await;
        }
    }
}

/// [`WebSocketUpgrade`] and the server's [`Sockets`], which the accept loop
/// puts in every request (none when the router is served otherwise).
pub struct Upgrade {
    ws: WebSocketUpgrade,
    sockets: Option<Sockets>,
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = <WebSocketUpgrade as FromRequestParts<S>>::Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ws = WebSocketUpgrade::from_request_parts(parts, state).await?;
        let sockets = parts.extensions.get::<Sockets>().cloned();
        Ok(Upgrade { ws, sockets })
    }
}

impl Upgrade {
    /// Upgrades with `config`, starts the connection's writer and hands the
    /// connection to `run` (not an `async fn`: the socket is consumed before
    /// `run`'s future exists, so that future, kept for the connection's
    /// whole life, does not hold room for it).
    pub fn on_upgrade<F, Fut>(self, config: Arc<Config>, run: F) -> Response
    where
        F: FnOnce(Connection) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let c = &*config;
        let ws = self
            .ws
            .max_message_size(c.max_message_bytes)
            .max_frame_size(c.max_message_bytes)
            .read_buffer_size(c.read_buffer)
            .write_buffer_size(c.write_buffer)
            .max_write_buffer_size(c.max_unsent_bytes.max(c.write_buffer + 1));
        let sockets = self.sockets;
        // The upgraded socket runs in a task of its own: it keeps the span
        // of the request that upgraded it (its connection's).
        let span = tracing::Span::current();
        ws.on_upgrade(move |socket| {
            let c = span.in_scope(|| Connection::start(socket, config, sockets));
            tracing::Instrument::instrument(run(c), span)
        })
    }
}

type WsSink = SplitSink<WebSocket, Message>;

/// A connection's sending half while its writer is idle. A frame for an
/// idle connection is written from here at once, by the task that made it:
/// no wake of the writer, and under load the frame leaves as soon as it is
/// routed instead of after every task queued ahead of the writer.
pub struct Parked {
    sink: Mutex<Option<WsSink>>,
    too_slow: Close,
    direct_write: bool,
}

impl Parked {
    fn write_now(&self, frame: Utf8Bytes) -> outbound::Direct<Utf8Bytes> {
        use outbound::Direct;
        // Never wait for the writer: if it has the socket, queue.
        let Ok(mut slot) = self.sink.try_lock() else {
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
        self.sink.lock().ok()?.take()
    }

    fn put(&self, sink: WsSink) {
        if let Ok(mut slot) = self.sink.lock() {
            *slot = Some(sink);
        }
    }
}

/// The sending side of one connection: cloned for every holder (the
/// connection's reader, its room, session or match).
#[derive(Clone)]
pub struct Outbound(outbound::Outbound<Utf8Bytes, Parked>);

impl Outbound {
    /// Sends a text frame: at once when the connection is idle, else
    /// queued; a full queue (in frames or bytes) closes the connection with
    /// the protocol's `too_slow` code ([`Refused::Full`], once).
    pub fn send(&self, frame: Utf8Bytes) -> Result<(), Refused> {
        let parked = self.0.parked();
        if !parked.direct_write {
            return self
                .0
                .push_or_write(frame, parked.too_slow, outbound::Direct::Declined);
        }
        self.0
            .push_or_write(frame, parked.too_slow, |f| parked.write_now(f))
    }

    /// Closes the connection after what is queued.
    pub fn close(&self, code: Close) {
        self.0.close(code);
    }

    /// The code the connection was killed with (its queue overflowed, or
    /// its writer ended), if it was.
    pub fn killed(&self) -> Option<Close> {
        self.0.killed()
    }

    /// Ready once the connection is killed.
    pub fn poll_killed(&self, cx: &mut Context<'_>) -> Poll<Close> {
        self.0.poll_killed(cx)
    }
}

/// A connection just upgraded: its reader and its sending side.
pub struct Connection {
    pub reader: Reader,
    pub out: Outbound,
}

impl Connection {
    fn start(socket: WebSocket, config: Arc<Config>, sockets: Option<Sockets>) -> Connection {
        let (sink, stream) = socket.split();
        let (out, drain) = outbound::queue_bounded(
            config.outbound_frames,
            config.outbound_bytes,
            |f: &Utf8Bytes| f.len(),
            Parked {
                sink: Mutex::new(Some(sink)),
                too_slow: config.too_slow,
                direct_write: config.direct_write,
            },
        );
        let out = Outbound(out);
        let writer = tokio::spawn(tracing::Instrument::in_current_span(write_loop(drain)));
        let registered = sockets.map(|s| {
            let id = s.register(&out);
            (s, id)
        });
        let start = tokio::time::Instant::now();
        let reader = Reader {
            stream,
            out: out.clone(),
            writer,
            timer: Box::pin(tokio::time::sleep_until(
                start + config.ping_interval.min(config.idle_timeout),
            )),
            last_frame: start,
            next_ping: start + config.ping_interval,
            end: End::Open,
            registered,
            config,
        };
        Connection { reader, out }
    }
}

/// Writes what the queue holds (all that is queued, then one flush), and
/// finishes frames that were written at once but not flushed. The socket is
/// taken from `parked` for each piece of work and put back after it.
async fn write_loop(drain: outbound::Drain<Utf8Bytes, Parked>) {
    let parked = drain.parked();
    let close_with = |(code, reason): Close| {
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
                // Fails when the peer closed first: the WebSocket layer has
                // queued its echo, which the close below flushes.
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

/// What the reader got.
#[derive(Debug)]
pub enum Event {
    Text(Utf8Bytes),
    /// A binary message: each protocol says what it makes of one.
    Binary(Bytes),
    /// A message over [`Config::max_message_bytes`]: the protocol queues its
    /// answer; the connection then closes with [`Config::oversized`].
    Oversized,
    /// The connection is over: the peer closed or went, the connection was
    /// closed (idle, a violation of RFC 6455, its queue overflowed), or the
    /// socket failed. Nothing more is read; call [`Reader::finish`].
    End,
}

/// How the reading side ended, for [`Reader::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    /// The server closed it (idle, a violation): what still comes is read
    /// and discarded while the close goes out.
    Closed,
    /// Nothing more can be read (the peer's Close came, or the stream
    /// ended or failed).
    Read,
    /// After an oversized message: close with the protocol's code.
    Oversized,
}

/// The reading side of one connection. Between events it holds one timer
/// for both the idle timeout and the pings, moved only when it fires: a
/// frame just notes its time (a timer per frame cost more than the frame).
pub struct Reader {
    stream: SplitStream<WebSocket>,
    out: Outbound,
    writer: JoinHandle<()>,
    timer: Pin<Box<tokio::time::Sleep>>,
    last_frame: tokio::time::Instant,
    next_ping: tokio::time::Instant,
    end: End,
    registered: Option<(Sockets, u64)>,
    config: Arc<Config>,
}

/// How the WebSocket layer's refusal of what the client sent ends the
/// connection.
enum ReadError {
    Oversized,
    /// Not WebSocket as RFC 6455 has it: closed with this code and reason.
    Violation(Close),
    /// The socket failed or ended: nothing can be sent.
    Gone,
}

fn read_error(e: axum::Error) -> ReadError {
    use tungstenite::error::ProtocolError as P;
    let e = e.into_inner();
    let Some(e) = e.downcast_ref::<tungstenite::Error>() else {
        return ReadError::Gone;
    };
    match e {
        tungstenite::Error::Capacity(_) => ReadError::Oversized,
        tungstenite::Error::Utf8(_) => {
            ReadError::Violation((CLOSE_INVALID_DATA, "invalid UTF-8 in a text frame"))
        }
        tungstenite::Error::Protocol(p) => ReadError::Violation((
            CLOSE_PROTOCOL_ERROR,
            match p {
                P::UnmaskedFrameFromClient => "unmasked client frame",
                P::NonZeroReservedBits => "reserved bits set",
                P::UnknownDataFrameType(_) | P::UnknownControlFrameType(_) => "unknown opcode",
                P::FragmentedControlFrame => "fragmented control frame",
                P::ControlFrameTooBig => "control frame over 125 bytes",
                P::UnexpectedContinueFrame | P::ExpectedFragment(_) => "continuation out of order",
                P::InvalidCloseSequence => "invalid close frame",
                // The socket ended or the handshake is over: nothing to
                // answer.
                P::ResetWithoutClosingHandshake | P::ReceivedAfterClosing | P::SendAfterClosing => {
                    return ReadError::Gone
                }
                _ => "protocol error",
            },
        )),
        _ => ReadError::Gone,
    }
}

impl Reader {
    /// The next event (see [`Reader::poll_event`]).
    pub async fn next(&mut self) -> Event {
        poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The next text or binary message, or why there is none. Pings and
    /// pongs are answered by the WebSocket layer; a pong (an answer to the
    /// server's ping) counts as activity, a ping does not: a client that
    /// pings and never reads would otherwise be kept for ever.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        if self.end != End::Open || self.out.poll_killed(cx).is_ready() {
            return Poll::Ready(Event::End);
        }
        loop {
            if self.timer.as_mut().poll(cx).is_ready() {
                let now = tokio::time::Instant::now();
                let idle_at = self.last_frame + self.config.idle_timeout;
                if now >= idle_at {
                    self.out.close(IDLE);
                    self.end = End::Closed;
                    return Poll::Ready(Event::End);
                }
                if now >= self.next_ping {
                    self.out.0.ping();
                    self.next_ping = now + self.config.ping_interval;
                }
                self.timer.as_mut().reset(self.next_ping.min(idle_at));
                continue;
            }
            let Poll::Ready(next) = self.stream.poll_next_unpin(cx) else {
                return Poll::Pending;
            };
            let msg = match next {
                Some(Ok(m)) => m,
                None => {
                    self.end = End::Read;
                    return Poll::Ready(Event::End);
                }
                Some(Err(e)) => {
                    return Poll::Ready(match read_error(e) {
                        ReadError::Oversized => {
                            self.end = End::Oversized;
                            Event::Oversized
                        }
                        ReadError::Violation(close) => {
                            self.end = End::Closed;
                            self.out.close(close);
                            Event::End
                        }
                        ReadError::Gone => {
                            self.end = End::Read;
                            Event::End
                        }
                    });
                }
            };
            match msg {
                Message::Ping(_) => continue,
                Message::Pong(_) => {
                    self.last_frame = tokio::time::Instant::now();
                    continue;
                }
                Message::Text(t) => {
                    self.last_frame = tokio::time::Instant::now();
                    return Poll::Ready(Event::Text(t));
                }
                Message::Binary(b) => {
                    self.last_frame = tokio::time::Instant::now();
                    return Poll::Ready(Event::Binary(b));
                }
                Message::Close(_) => {
                    self.end = End::Read;
                    return Poll::Ready(Event::End);
                }
            }
        }
    }

    /// The connection's sending side.
    pub fn out(&self) -> &Outbound {
        &self.out
    }

    /// Ends the connection cleanly: closes it (after what is queued) unless
    /// it is closing already, waits at most [`Config::close_grace`] for the
    /// Close frame to be sent (else the socket is dropped), then reads and
    /// discards until the peer's Close, at most [`Config::close_linger`]. Call it once the protocol has let go of the connection (it
    /// left its room, session or match).
    pub async fn finish(self) {
        let Reader {
            mut stream,
            out,
            mut writer,
            end,
            registered,
            config,
            ..
        } = self;
        let close = match end {
            End::Oversized => config.oversized,
            _ => (CLOSE_NORMAL, "closed"),
        };
        out.close(close);
        drop(out);
        // Nothing is read before the Close frame is out: a peer's Close
        // read now would be echoed ahead of it, and the peer would get its
        // own code instead of the server's.
        let sent = match tokio::time::timeout(config.close_grace, &mut writer).await {
            Ok(r) => r.is_ok(),
            Err(_) => {
                writer.abort();
                false
            }
        };
        if sent && !matches!(end, End::Read | End::Oversized) {
            let _ = tokio::time::timeout(config.close_linger, async {
                while let Some(Ok(m)) = stream.next().await {
                    if matches!(m, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
        if let Some((sockets, id)) = registered {
            sockets.deregister(id);
        }
    }
}
