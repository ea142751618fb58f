//! One WebSocket connection of the relay: the upgrade (origin, frame caps,
//! buffer sizes), a reader that decodes frames and hands them to the room,
//! and a writer that drains the connection's bounded outbound queue.

use super::outbound::Outbound;
use super::room::{AttachCmd, FrameCmd, RoomCmd, RoomHandle};
use super::Relay;
use crate::ws;
use crate::ws::Utf8Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hostwire_memizy::relay::*;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// tungstenite's read buffer per connection, held for the socket's life:
/// small, since every idle connection holds it. A burst is still one system
/// call (into the thread's buffer, `ws::SCRATCH_BYTES`), from which
/// tungstenite takes this much at a time.
const READ_BUFFER: usize = 128;

/// Frames up to this size are copied out of tungstenite's read buffer (see
/// `on_message`).
const COPY_UP_TO: usize = 512;

/// How long the host's `close` may take to come back as the room's close.
const ROOM_CLOSE_GRACE: Duration = ws::CLOSE_GRACE;

/// The relay's socket settings, from its limits.
pub(super) fn socket_config(config: &super::RelayConfig) -> ws::Config {
    let limits = &config.limits;
    ws::Config {
        // Frames above the protocol cap but within twice it get TOO_LARGE
        // and the connection lives; beyond that the connection is closed
        // (1009).
        max_message_bytes: limits.frame_bytes.saturating_mul(2),
        // Small buffers: an idle connection should cost little memory;
        // big frames are read in more, smaller reads.
        read_buffer: READ_BUFFER,
        max_unsent_bytes: config.server_limits.ws_write_buffer_bytes,
        idle_timeout: Duration::from_millis(limits.idle_timeout_ms),
        outbound_frames: config.outbound_queue,
        outbound_bytes: config.server_limits.outbound_queue_bytes,
        too_slow: super::outbound::TOO_SLOW,
        oversized: (CLOSE_TOO_BIG, "frame too large"),
        // A room writes to its own players' sockets: a frame for an idle
        // connection leaves at once, without waking its writer.
        direct_write: true,
        ..ws::Config::new(limits.frame_bytes.saturating_mul(2))
    }
}

pub(super) async fn ws_upgrade(
    State(relay): State<Arc<Relay>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    ws: ws::Upgrade,
) -> Response {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if !relay.origins.allows(origin) {
        return (
            StatusCode::FORBIDDEN,
            "Origin not allowed: /ws admits browsers of the configured origins only",
        )
            .into_response();
    }
    // What the per-IP join rate counts this connection's attaches as.
    let ip: Box<str> = relay.client_ip(&headers, peer).into();
    let config = Arc::clone(&relay.socket_config);
    ws.on_upgrade(config, move |c| handle_socket(relay, c, ip))
}

/// The relay's name on a tunnel between nodes.
pub(super) const TUNNEL_PROTOCOL: &str = "relay";

/// How this node serves a relay client another node carries here.
pub(super) fn acceptor(relay: &Arc<Relay>) -> crate::cluster::tunnel::Acceptor {
    let r = Arc::clone(relay);
    crate::cluster::tunnel::Acceptor {
        config: Arc::clone(&relay.socket_config),
        run: Box::new(move |c, client| Box::pin(handle_socket(Arc::clone(&r), c, client.ip))),
    }
}

/// The connection's reader; its writer is the driver's.
fn handle_socket(
    relay: Arc<Relay>,
    c: ws::Connection,
    ip: Box<str>,
) -> impl Future<Output = ()> + Send {
    let conn: ConnId = relay.next_conn();
    relay.metrics.connections.fetch_add(1, Relaxed);
    read_loop(relay, conn, ip, c.reader, Outbound(c.out))
}

/// Reads the connection's frames until it ends, then waits for its writer.
fn read_loop(
    relay: Arc<Relay>,
    conn: ConnId,
    ip: Box<str>,
    mut socket: ws::Reader,
    out: Outbound,
) -> impl Future<Output = ()> + Send {
    let mut reader = Reader {
        state: ConnectionState::new(relay.clock.now_ms(), relay.config.limits),
        relay,
        conn,
        ip,
        first_join_counted: out.0.is_piped(),
        out,
    };
    // An async block, not an async fn: what it captures is used in place,
    // where an async fn would keep its arguments twice in its state.
    async move {
        // The loop's way out is its value, gone before the last wait: a
        // carried connection's owner and first frame, kept across a wait,
        // would widen every connection's state for its life.
        let last = {
            let exit = loop {
                let next = poll_fn(|cx| socket.poll_event(cx)).await;
                // The rare cases (an attach, a full room queue, a look-up
                // elsewhere) go through one boxed call, and `flow` is moved
                // into it whole: nothing of them (not even the `Flow`) widens
                // every connection's state for its life.
                let flow = reader.on_message(next);
                match flow {
                    Flow::Go => continue,
                    Flow::Stop => break None,
                    _ => {}
                }
                match Box::pin(reader.rare(flow)).await {
                    Found::Go => {}
                    Found::Stop => break None,
                    Found::Elsewhere(owner, first) => break Some((owner, first)),
                }
            };
            // One thin box, not an `Either` of two (16 bytes): the state
            // is then exactly jemalloc's 224-byte class.
            Box::pin(end(reader, socket, exit))
        };
        last.await
    }
}

/// How the connection ends: carried to the node that owns its room, or
/// closed here.
async fn end(reader: Reader, socket: ws::Reader, exit: Option<(String, Utf8Bytes)>) {
    match exit {
        Some((owner, first)) => carry(reader, socket, owner, first).await,
        None => finish(reader, socket).await,
    }
}

/// Carries a connection whose room another node owns to that node (it
/// is attached to no room here).
async fn carry(reader: Reader, socket: ws::Reader, owner: String, first: Utf8Bytes) {
    let Reader { relay, ip, .. } = reader;
    if let Some(t) = relay.tunnels.get() {
        let route = crate::cluster::tunnel::Route {
            owner: &owner,
            protocol: TUNNEL_PROTOCOL,
            ip: &ip,
            handshake: "",
        };
        Arc::clone(t)
            .bridge(route, vec![first], socket, |out| {
                out.close(super::CLOSE_ROOM_ELSEWHERE)
            })
            .await;
    }
    relay.metrics.connections.fetch_sub(1, Relaxed);
}

/// Leaves the room, then closes the socket cleanly.
async fn finish(reader: Reader, socket: ws::Reader) {
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
    socket.finish().await;
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
    /// A connection carried from another node: its first `join` or `host`
    /// was counted against the IP's rate there.
    first_join_counted: bool,
}

/// What the reader does after a message (rare cases boxed, to keep this
/// small: it lives in the reader's state across the wait).
enum Flow {
    Go,
    Stop,
    Attach(Box<AttachJob>),
    /// The room's queue is full: wait to hand it this.
    RoomBusy(RoomCmd),
    /// The host closed the room: read nothing more until the room has
    /// closed this connection too (see [`Reader::room_closed`]).
    AwaitRoomClose,
    /// The room is not on this node: look for it in the store (a
    /// cluster's).
    Find(Box<FindJob>),
}

struct FindJob {
    pin: String,
    msg: RelayClientMessage,
    /// The frame as the client sent it, for the owner if it is elsewhere.
    text: Utf8Bytes,
    already_attached: bool,
}

/// What looking for a room elsewhere came to.
enum Found {
    Go,
    Stop,
    /// Another node owns it: carry the connection there, starting with
    /// this frame.
    Elsewhere(String, Utf8Bytes),
}

struct AttachJob {
    target: RoomHandle,
    msg: RelayClientMessage,
    already_attached: bool,
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

    fn on_message(&mut self, next: ws::Event) -> Flow {
        let text = match next {
            ws::Event::Text(t) => t,
            ws::Event::Binary(b) => match Utf8Bytes::try_from(b) {
                Ok(t) => t,
                Err(_) => return self.act(self.state.on_not_text()),
            },
            ws::Event::Oversized => {
                self.act(self.state.on_oversized());
                return Flow::Stop;
            }
            ws::Event::End => return Flow::Stop,
        };
        let now = self.relay.clock.now_ms();
        match self.state.on_frame(&text, now) {
            ConnStep::Attach {
                pin,
                msg,
                already_attached,
            } => {
                // Counted per client IP over all its connections, before
                // the PIN is looked up: a guess costs a token too. The
                // first of a connection carried here was counted by the
                // node it reached; its later ones are counted here.
                let counted = std::mem::take(&mut self.first_join_counted);
                if let Err(retry) = match counted {
                    true => Ok(()),
                    false => self.relay.joins.try_take(&self.ip, now),
                } {
                    self.relay.metrics.rate_limited.fetch_add(1, Relaxed);
                    return self.act(self.state.attach_rate_limited(&msg, retry.seconds));
                }
                match self.relay.room(&pin) {
                    // On a cluster it may be the store's, for this node to
                    // take over, or another node's.
                    None if self.relay.leases.is_some() => Flow::Find(Box::new(FindJob {
                        pin,
                        msg,
                        text,
                        already_attached,
                    })),
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
                // cannot be reused while the frame waits for the room:
                // tungstenite would read into ever smaller room, then take
                // a new buffer. A copy frees it.
                let text = if text.len() <= COPY_UP_TO {
                    Utf8Bytes::from(text.as_str().to_owned())
                } else {
                    text
                };
                // The room's queue is rarely full: no send future (and its
                // waiter) per frame.
                let conn = self.conn;
                let closes_room = self.state.is_host() && matches!(msg, RelayClientMessage::Close);
                match r
                    .tx
                    .try_send(RoomCmd::Frame(Box::new(FrameCmd { conn, msg, text })))
                {
                    Ok(()) if closes_room => Flow::AwaitRoomClose,
                    Ok(()) => Flow::Go,
                    Err(mpsc::error::TrySendError::Full(cmd)) => Flow::RoomBusy(cmd),
                    Err(mpsc::error::TrySendError::Closed(_)) => Flow::Stop,
                }
            }
            step => self.act(step),
        }
    }

    /// What the read loop does after a message that needs a wait: an
    /// attach, a command for a room whose queue is full, the wait for a
    /// closing room, a look-up elsewhere.
    async fn rare(&mut self, flow: Flow) -> Found {
        let go = |ok: bool| if ok { Found::Go } else { Found::Stop };
        match flow {
            Flow::Go => Found::Go,
            Flow::Stop => Found::Stop,
            Flow::Attach(job) => go(self.attach(*job).await),
            Flow::RoomBusy(cmd) => {
                let Some(r) = self.state.room() else {
                    return Found::Stop;
                };
                let closes_room = self.state.is_host()
                    && matches!(&cmd, RoomCmd::Frame(f) if matches!(f.msg, RelayClientMessage::Close));
                if r.tx.send(cmd).await.is_err() {
                    return Found::Stop;
                }
                go(!(closes_room && self.room_closed().await))
            }
            Flow::AwaitRoomClose => go(!self.room_closed().await),
            Flow::Find(job) => self.find(*job).await,
        }
    }

    /// After the host's `close`: waits (at most [`ROOM_CLOSE_GRACE`]) for the
    /// room to close this connection, which it does after `closed`; true
    /// once it has. Reading on would let the WebSocket layer answer a close
    /// frame the host sent right behind its `close` with an echo of it,
    /// ahead of `closed` and the room's 1000 "room closed", which could
    /// then never be sent (about 1 run in 10).
    async fn room_closed(&self) -> bool {
        tokio::time::timeout(ROOM_CLOSE_GRACE, poll_fn(|cx| self.out.0.poll_killed(cx)))
            .await
            .is_ok()
    }

    /// Finds a room this node does not serve yet and attaches to it, or
    /// says where it is.
    async fn find(&mut self, job: FindJob) -> Found {
        let FindJob {
            pin,
            msg,
            text,
            already_attached,
        } = job;
        let go = |ok| if ok { Found::Go } else { Found::Stop };
        match self.relay.find_room(&pin).await {
            super::Find::Here(target) => {
                self.relay.metrics.frame_in(msg.kind());
                let attached = self.attach(AttachJob {
                    target,
                    msg,
                    already_attached,
                });
                go(attached.await)
            }
            super::Find::NotFound => {
                self.act(self.state.room_not_found(&msg));
                Found::Stop
            }
            // A connection attached here, or carried here already, is not
            // carried on: it is refused as below.
            super::Find::Elsewhere(owner)
                if !already_attached
                    && !self.out.0.is_piped()
                    && self.relay.tunnels.get().is_some() =>
            {
                Found::Elsewhere(owner, text)
            }
            // No fatal frame: the client reconnects, and finds the room
            // once its owner's lease has run out.
            super::Find::Elsewhere(_) | super::Find::Unavailable => {
                self.relay.metrics.frame_in(msg.kind());
                let (code, reason) = super::CLOSE_ROOM_ELSEWHERE;
                self.out.close(code, reason);
                Found::Stop
            }
        }
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
        let cmd = RoomCmd::Attach(Box::new(AttachCmd {
            conn: self.conn,
            out: self.out.clone(),
            msg,
            already_attached,
            reply,
        }));
        if let Err(mpsc::error::SendError(cmd)) = target.tx.send(cmd).await {
            // The room closed since it was looked up.
            if let RoomCmd::Attach(a) = cmd {
                let step = self.state.room_not_found(&a.msg);
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
