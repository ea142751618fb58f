//! One WebSocket connection of the relay: the upgrade (origin, frame caps,
//! buffer sizes), a reader that decodes frames and hands them to the room,
//! and a writer that drains the connection's bounded outbound queue.

use super::metrics::RelayMetrics;
use super::room::{RoomCmd, RoomHandle};
use super::Relay;
use crate::outbound;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use hostwire_memizy::relay::*;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Server pings keep idle connections alive behind proxies.
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a closing connection may take to flush its queue.
/// tungstenite's read buffer per connection: a player's frame fits in one
/// read; a host's burst of 40 takes about 18 (9 with 1 KiB, for 512 more
/// bytes on every idle connection). It stays reusable only because small
/// frames are copied out of it (see `on_message`).
const READ_BUFFER: usize = 512;

/// tungstenite's write buffer: frames are written once this much is
/// buffered (or on flush).
const WRITE_BUFFER: usize = 16 * 1024;

const WRITER_GRACE: Duration = Duration::from_secs(5);

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
pub(super) struct Outbound(outbound::Outbound<Utf8Bytes, Parked>);

const TOO_SLOW: outbound::Close = (CLOSE_TOO_SLOW, "too slow: outbound queue full");

impl Outbound {
    /// Sends a frame: at once when the connection is idle, else queued; a
    /// full queue closes the connection (1013).
    pub(super) fn frame(&self, frame: Utf8Bytes, metrics: &RelayMetrics) -> bool {
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
    pub(super) fn close(&self, code: u16, reason: &'static str) {
        self.0.close((code, reason));
    }
}

pub(super) async fn ws_upgrade(
    State(relay): State<Arc<Relay>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if !relay.origins.allows(origin) {
        return (StatusCode::FORBIDDEN, "Origin not allowed").into_response();
    }
    // What the per-IP join rate counts this connection's attaches as.
    let ip: Box<str> = relay.client_ip(&headers, peer).into();
    let limits = relay.config.limits;
    // Frames above the protocol cap but within twice it get TOO_LARGE and
    // the connection lives; beyond that the WebSocket layer closes it (1009).
    ws.max_message_size(limits.frame_bytes.saturating_mul(2))
        .max_frame_size(limits.frame_bytes.saturating_mul(2))
        // Small buffers: an idle connection should cost little memory;
        // big frames are read in more, smaller reads.
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        // Unsent bytes, replies to pings included, are bounded: a client
        // that pings and never reads cannot grow them without limit (a
        // reply that does not fit replaces the one waiting).
        .max_write_buffer_size(limits.ws_write_buffer_bytes.max(WRITE_BUFFER + 1))
        .on_upgrade(move |socket| handle_socket(relay, socket, ip))
}

/// Splits the socket and starts its writer; the returned future is the
/// reader. Not an `async fn`: the socket is consumed here, so the reader's
/// future (kept for the connection's whole life) does not hold room for it.
fn handle_socket(
    relay: Arc<Relay>,
    socket: WebSocket,
    ip: Box<str>,
) -> impl Future<Output = ()> + Send {
    let conn: ConnId = relay.next_conn();
    relay.metrics.connections.fetch_add(1, Relaxed);
    let (sink, stream) = socket.split();
    let (out, drain) = outbound::queue_bounded(
        relay.config.outbound_queue,
        relay.config.limits.outbound_queue_bytes,
        |f: &Utf8Bytes| f.len(),
        Parked(Mutex::new(Some(sink))),
    );
    let writer = tokio::spawn(write_loop(drain));
    read_loop(relay, conn, ip, stream, Outbound(out), writer)
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
    ip: Box<str>,
    mut stream: SplitStream<WebSocket>,
    out: Outbound,
    writer: JoinHandle<()>,
) -> impl Future<Output = ()> + Send {
    let mut reader = Reader {
        state: ConnectionState::new(relay.clock.now_ms(), relay.config.limits),
        relay,
        conn,
        ip,
        out,
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
            // A client's ping is not activity: a client that pings and
            // never reads would otherwise be kept for ever. Its frames and
            // its pongs (answers to the server's pings) are.
            if !matches!(next, Some(Ok(Message::Ping(_)))) {
                last_frame = tokio::time::Instant::now();
            }
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
                    let Some(r) = reader.state.room() else { break };
                    let closes_room = reader.state.is_host()
                        && matches!(
                            &*cmd,
                            RoomCmd::Frame {
                                msg: RelayClientMessage::Close,
                                ..
                            }
                        );
                    if Box::pin(r.tx.send(*cmd)).await.is_err() {
                        break;
                    }
                    if closes_room && Box::pin(reader.room_closed()).await {
                        break;
                    }
                }
                Flow::AwaitRoomClose => {
                    if Box::pin(reader.room_closed()).await {
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
        mut state,
        conn,
        ..
    } = reader;
    if let Some(r) = state.detach() {
        let _ = r.tx.send(RoomCmd::Detach { conn }).await;
    }
    drop(out);
    // A reader that fell behind has nothing more queued (the kill dropped
    // it); the writer finishes the frame it holds and sends 1013 if the
    // reader reads within the grace time, else the socket is dropped.
    if tokio::time::timeout(WRITER_GRACE, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    relay.metrics.connections.fetch_sub(1, Relaxed);
}

/// One connection's reading side, between frames. The connection's rules
/// and the room it is attached to are in `state`.
struct Reader {
    relay: Arc<Relay>,
    conn: ConnId,
    /// The client IP its attaches count against.
    ip: Box<str>,
    out: Outbound,
    state: ConnectionState<RoomHandle>,
}

/// What the reader does after a message (rare cases boxed, to keep this
/// small: it lives in the reader's state across the wait).
enum Flow {
    Go,
    Stop,
    Attach(Box<AttachJob>),
    /// The room's queue is full: wait to hand it this.
    RoomBusy(Box<RoomCmd>),
    /// The host closed the room: read nothing more until the room has
    /// closed this connection too (see [`Reader::room_closed`]).
    AwaitRoomClose,
}

struct AttachJob {
    target: RoomHandle,
    msg: RelayClientMessage,
    already_attached: bool,
}

/// How the WebSocket layer's refusal of what the client sent ends the
/// connection.
enum ReadError {
    /// Over twice the protocol's cap: `TOO_LARGE`, then 1009.
    Oversized,
    /// Not WebSocket as RFC 6455 has it: closed with this code and reason.
    Violation(u16, &'static str),
    /// The socket failed or ended: nothing can be sent.
    Gone,
}

/// Close 1007: a text frame that is not UTF-8 (RFC 6455 §7.4.1).
const CLOSE_INVALID_DATA: u16 = 1007;
/// Close 1002: a frame that breaks the framing rules.
const CLOSE_PROTOCOL_ERROR: u16 = 1002;

fn read_error(e: axum::Error) -> ReadError {
    use tungstenite::error::ProtocolError as P;
    let e = e.into_inner();
    let Some(e) = e.downcast_ref::<tungstenite::Error>() else {
        return ReadError::Gone;
    };
    match e {
        tungstenite::Error::Capacity(_) => ReadError::Oversized,
        tungstenite::Error::Utf8(_) => {
            ReadError::Violation(CLOSE_INVALID_DATA, "invalid UTF-8 in a text frame")
        }
        tungstenite::Error::Protocol(p) => ReadError::Violation(
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
        ),
        _ => ReadError::Gone,
    }
}

impl Reader {
    /// Queues a frame of the connection's own (never a forwarded one).
    fn send(&self, frame: &RelayServerMessage) {
        let text = Utf8Bytes::from(frame.encode(""));
        self.relay.metrics.frame_out(frame, text.len(), 1);
        self.out.frame(text, &self.relay.metrics);
    }

    /// Carries out an answer of the connection's rules.
    fn act(&self, step: ConnStep) -> Flow {
        let metrics = &self.relay.metrics;
        match step {
            ConnStep::Reply { received, frame } => {
                metrics.frame_in(received);
                self.send(&frame);
                Flow::Go
            }
            ConnStep::Fatal {
                received,
                frame,
                close: (code, reason),
            } => {
                metrics.frame_in(received);
                self.send(&frame);
                self.out.close(code, reason);
                Flow::Stop
            }
            ConnStep::RateLimited(frame) => {
                metrics.rate_limited.fetch_add(1, Relaxed);
                self.send(&frame);
                Flow::Go
            }
            // Frames only: `on_message` routes these.
            ConnStep::Attach { .. } | ConnStep::Forward(_) => Flow::Go,
        }
    }

    fn on_message(&mut self, next: Option<Result<Message, axum::Error>>) -> Flow {
        let text = match next {
            Some(Err(e)) => {
                match read_error(e) {
                    ReadError::Oversized => {
                        self.act(self.state.on_oversized());
                    }
                    ReadError::Violation(code, reason) => self.out.close(code, reason),
                    ReadError::Gone => {}
                }
                return Flow::Stop;
            }
            None => return Flow::Stop,
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Binary(b))) => match Utf8Bytes::try_from(b) {
                Ok(t) => t,
                Err(_) => return self.act(self.state.on_not_text()),
            },
            Some(Ok(Message::Close(_))) => return Flow::Stop,
            Some(Ok(_)) => return Flow::Go,
        };
        let now = self.relay.clock.now_ms();
        match self.state.on_frame(&text, now) {
            ConnStep::Attach {
                pin,
                msg,
                already_attached,
            } => {
                // Counted per client IP over all its connections, before
                // the PIN is looked up: a guess costs a token too.
                if let Err(retry) = self.relay.joins.try_take(&self.ip, now) {
                    self.relay.metrics.rate_limited.fetch_add(1, Relaxed);
                    return self.act(self.state.attach_rate_limited(&msg, retry.seconds));
                }
                match self.relay.room(&pin) {
                    None => self.act(self.state.room_not_found(&msg)),
                    Some(target) => {
                        self.relay.metrics.frame_in(msg.kind());
                        Flow::Attach(Box::new(AttachJob {
                            target,
                            msg,
                            already_attached,
                        }))
                    }
                }
            }
            ConnStep::Forward(msg) => {
                self.relay.metrics.frame_in(msg.kind());
                let Some(r) = self.state.room() else {
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
                let closes_room = self.state.is_host() && matches!(msg, RelayClientMessage::Close);
                match r.tx.try_send(RoomCmd::Frame { conn, msg, text }) {
                    Ok(()) if closes_room => Flow::AwaitRoomClose,
                    Ok(()) => Flow::Go,
                    Err(mpsc::error::TrySendError::Full(cmd)) => Flow::RoomBusy(Box::new(cmd)),
                    Err(mpsc::error::TrySendError::Closed(_)) => Flow::Stop,
                }
            }
            step => self.act(step),
        }
    }

    /// After the host's `close`: waits (at most [`WRITER_GRACE`]) for the
    /// room to close this connection, which it does after `closed`; true
    /// once it has. Reading on would let the WebSocket layer answer a close
    /// frame the host sent right behind its `close` with an echo of it,
    /// ahead of `closed` and the room's 1000 "room closed", which could
    /// then never be sent (about 1 run in 10).
    async fn room_closed(&self) -> bool {
        tokio::time::timeout(WRITER_GRACE, poll_fn(|cx| self.out.0.poll_killed(cx)))
            .await
            .is_ok()
    }

    /// Attaches the connection to its room; false when the connection is
    /// to stop (a fatal refusal: the error and the close are queued).
    async fn attach(&mut self, job: AttachJob) -> bool {
        let AttachJob {
            target,
            msg,
            already_attached,
        } = job;
        let (reply, answer) = oneshot::channel();
        let cmd = RoomCmd::Attach {
            conn: self.conn,
            out: self.out.clone(),
            msg,
            already_attached,
            reply,
        };
        if let Err(mpsc::error::SendError(cmd)) = target.tx.send(cmd).await {
            // The room closed since it was looked up.
            if let RoomCmd::Attach { msg, .. } = cmd {
                let step = self.state.room_not_found(&msg);
                // Counted already, as the frame it was.
                if let ConnStep::Fatal {
                    frame,
                    close: (code, reason),
                    ..
                } = step
                {
                    self.send(&frame);
                    self.out.close(code, reason);
                }
            }
            return false;
        }
        match answer.await {
            Ok(AttachOutcome::Attached { host }) => {
                self.state
                    .on_attached(target, host, self.relay.clock.now_ms());
                true
            }
            Ok(AttachOutcome::Refused { fatal }) => !fatal,
            Err(_) => false,
        }
    }
}
