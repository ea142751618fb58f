//! One task per room, driven by THE unit driver ([`crate::unit::drive`]):
//! it owns the room's state and handles its commands in order, so "in
//! order, at most once" holds by construction with no lock on the
//! forwarding path. The durability rules (which change waits for the
//! store, what goes ahead of it, going back when the store refuses) are
//! the protocol crate's ([`DurableRoom`]); here its outputs are carried
//! out: typed frames, each encoded once however many connections it goes
//! to, and counted by its type; closes; answers to the requests waiting.

use super::metrics::RelayMetrics;
use super::outbound::Outbound;
use super::Relay;
use crate::unit::{self, Deliver, Store, Unit, Write};
use crate::ws::Utf8Bytes;
use bytes::Bytes;
use foldhash::{HashMap, HashMapExt};
pub(super) use hostwire_memizy::relay::PutOutcome;
use hostwire_memizy::relay::*;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// A command for a room's task. Every variant is at most a pointer: a
/// room's queue keeps its blocks (32 commands each) for its life, and at
/// 16 bytes a command two blocks are 1.3 KB where a 120-byte frame inline
/// made them 8 KB, about 80 bytes per player of a room of 100. A frame's
/// box costs one small allocation beside the frame's own.
pub(super) enum RoomCmd {
    Attach(Box<AttachCmd>),
    Frame(Box<FrameCmd>),
    Detach {
        conn: ConnId,
    },
    Sweep,
    Info(oneshot::Sender<RoomInfo>),
    /// Whether a bearer token is the room's host token.
    IsHost(Box<(String, oneshot::Sender<bool>)>),
    /// The room's creation time and the version of the bundle it serves
    /// (its bytes are in the store).
    GetBundle(oneshot::Sender<Option<(u64, u64)>>),
    PutBundle(Box<PutBundleCmd>),
    Shutdown(oneshot::Sender<()>),
}

pub(super) struct AttachCmd {
    pub(super) conn: ConnId,
    pub(super) out: Outbound,
    pub(super) msg: RelayClientMessage,
    pub(super) already_attached: bool,
    pub(super) reply: oneshot::Sender<AttachOutcome>,
}

pub(super) struct FrameCmd {
    pub(super) conn: ConnId,
    pub(super) msg: RelayClientMessage,
    /// The client frame: `msg`'s data ranges point into it.
    pub(super) text: Utf8Bytes,
}

pub(super) struct PutBundleCmd {
    pub(super) token: String,
    pub(super) text: Bytes,
    pub(super) app_name: Option<String>,
    pub(super) reply: oneshot::Sender<PutOutcome>,
}

#[derive(Clone)]
pub(super) struct RoomHandle {
    pub(super) tx: mpsc::Sender<RoomCmd>,
    /// Told when another node took the room over: the task stops at once.
    pub(super) lost: Arc<tokio::sync::Notify>,
}

impl RoomHandle {
    pub(super) fn new(queue: usize) -> (RoomHandle, mpsc::Receiver<RoomCmd>) {
        let (tx, rx) = mpsc::channel(queue);
        let lost = Arc::default();
        (RoomHandle { tx, lost }, rx)
    }

    /// Whether both are the same room's (a PIN may name a newer room).
    pub(super) fn same(&self, other: &RoomHandle) -> bool {
        self.tx.same_channel(&other.tx)
    }
}

/// A frame encoded for writing, and counted as queued for `copies`
/// connections.
fn encode(
    metrics: &RelayMetrics,
    frame: &RelayServerMessage,
    source: &str,
    copies: usize,
) -> Utf8Bytes {
    // A `String` is UTF-8 already: no check on the way to the socket.
    let text = Utf8Bytes::from(frame.encode(source));
    metrics.frame_out(frame, text.len(), copies);
    text
}

/// What a command carries to its outputs: the client frame their `data`
/// ranges point into, or where its answer goes.
pub(super) enum Tag {
    None,
    Source(Utf8Bytes),
    /// The connection being attached (its frames go to it before it is
    /// the room's) and its reader, waiting for the outcome.
    Attach(Outbound, oneshot::Sender<AttachOutcome>),
    Info(oneshot::Sender<RoomInfo>),
    IsHost(oneshot::Sender<bool>),
    Bundle(oneshot::Sender<Option<(u64, u64)>>),
    Put(oneshot::Sender<PutOutcome>),
    Shutdown(oneshot::Sender<()>),
}

impl From<RoomCmd> for (RoomCommand, Tag) {
    fn from(cmd: RoomCmd) -> Self {
        match cmd {
            RoomCmd::Attach(a) => {
                let AttachCmd {
                    conn,
                    out,
                    msg,
                    already_attached,
                    reply,
                } = *a;
                (
                    RoomCommand::Attach {
                        conn,
                        msg,
                        already_attached,
                    },
                    Tag::Attach(out, reply),
                )
            }
            RoomCmd::Frame(f) => {
                let FrameCmd { conn, msg, text } = *f;
                (RoomCommand::Frame { conn, msg }, Tag::Source(text))
            }
            RoomCmd::Detach { conn } => (RoomCommand::Detach { conn }, Tag::None),
            RoomCmd::Sweep => (RoomCommand::Sweep, Tag::None),
            RoomCmd::Info(reply) => (RoomCommand::Info, Tag::Info(reply)),
            RoomCmd::IsHost(q) => {
                let (token, reply) = *q;
                (RoomCommand::IsHost { token }, Tag::IsHost(reply))
            }
            RoomCmd::GetBundle(reply) => (RoomCommand::GetBundle, Tag::Bundle(reply)),
            RoomCmd::PutBundle(p) => {
                let PutBundleCmd {
                    token,
                    text,
                    app_name,
                    reply,
                } = *p;
                (
                    RoomCommand::PutBundle {
                        token,
                        text,
                        app_name,
                    },
                    Tag::Put(reply),
                )
            }
            RoomCmd::Shutdown(done) => (RoomCommand::Shutdown, Tag::Shutdown(done)),
        }
    }
}

impl Unit for DurableRoom<Tag> {
    type Command = (RoomCommand, Tag);
    type Output = Done<Tag>;
    type Record = RoomChange;

    fn handle(&mut self, (cmd, tag): Self::Command, now: u64) {
        DurableRoom::handle(self, cmd, tag, now)
    }
    fn poll_output(&mut self) -> Option<Done<Tag>> {
        DurableRoom::poll_output(self)
    }
    fn poll_timeout(&self) -> Option<u64> {
        DurableRoom::poll_timeout(self)
    }
    // No timer: the relay's sweep timer sends `Sweep`.
    fn handle_timeout(&mut self, _now: u64) {}
    fn poll_write(&mut self) -> Option<Write<RoomChange>> {
        DurableRoom::poll_write(self).map(|w| Write {
            id: w.id,
            records: w.changes,
        })
    }
    fn ack(&mut self, id: u64, durable: bool, now: u64) {
        DurableRoom::ack(self, id, durable, now)
    }
    fn accepts(&self) -> bool {
        DurableRoom::accepts(self)
    }
}

/// The server side of one room: its connections' outbound queues.
struct Conns<'a> {
    relay: &'a Relay,
    pin: &'a str,
    conns: HashMap<ConnId, Outbound>,
    /// The room's players as counted in the relay's total.
    players: usize,
}

impl Conns<'_> {
    /// Where a frame for `conn` goes: a connection of the room, or the one
    /// being attached (a refused connection is not the room's, but its
    /// answer goes to it).
    fn target<'a>(
        &'a self,
        attaching: Option<(ConnId, &'a Outbound)>,
        conn: ConnId,
    ) -> Option<&'a Outbound> {
        self.conns
            .get(&conn)
            .or_else(|| attaching.filter(|(c, _)| *c == conn).map(|(_, o)| o))
    }

    /// Sends the frames and closes; true once the room has closed.
    fn carry_out(
        &mut self,
        outputs: Vec<RoomOutput>,
        source: &str,
        attaching: Option<(ConnId, &Outbound)>,
    ) -> bool {
        let metrics = &*self.relay.metrics;
        let mut closed = false;
        for o in outputs {
            match o {
                RoomOutput::Send { conn, frame } => {
                    if let Some(t) = self.target(attaching, conn) {
                        t.frame(encode(metrics, &frame, source, 1), metrics);
                    }
                }
                RoomOutput::Broadcast { conns: to, frame } => {
                    let targets: Vec<&Outbound> =
                        to.iter().filter_map(|c| self.conns.get(c)).collect();
                    if !targets.is_empty() {
                        let text = encode(metrics, &frame, source, targets.len());
                        for t in targets {
                            t.frame(text.clone(), metrics);
                        }
                    }
                }
                RoomOutput::Close { conn, code, reason } => {
                    if let Some(t) = self.conns.remove(&conn) {
                        t.close(code, reason);
                    } else if let Some(t) = self.target(attaching, conn) {
                        t.close(code, reason);
                    }
                }
                // The room hands its records out as writes, never here.
                RoomOutput::Persist(_) => {}
                RoomOutput::RoomClosed => closed = true,
            }
        }
        closed
    }

    /// Answers the request that waits for `answer`, once its frames are
    /// queued (the reader's next frames come after them).
    fn answer(&mut self, answer: Answer, tag: Tag) {
        match (answer, tag) {
            (Answer::Attach(conn, outcome), Tag::Attach(out, reply)) => {
                if matches!(outcome, AttachOutcome::Attached { .. }) {
                    self.conns.insert(conn, out);
                }
                let _ = reply.send(outcome);
            }
            (Answer::Detached(conn), _) => {
                self.conns.remove(&conn);
            }
            (Answer::Info(info), Tag::Info(reply)) => {
                let _ = reply.send(info);
            }
            (Answer::IsHost(is), Tag::IsHost(reply)) => {
                let _ = reply.send(is);
            }
            (Answer::Bundle(b), Tag::Bundle(reply)) => {
                let _ = reply.send(b);
            }
            (Answer::Put(outcome), Tag::Put(reply)) => {
                if let PutOutcome::Stored(_) = outcome {
                    self.relay.bundles.forget(self.pin);
                }
                let _ = reply.send(outcome);
            }
            (_, Tag::Shutdown(done)) => {
                self.conns.clear();
                let _ = done.send(());
            }
            _ => {}
        }
    }

    /// Moves the relay's player count by this room's change.
    fn count_players(&mut self, now: usize) {
        let players = &self.relay.players;
        if now > self.players {
            players.fetch_add((now - self.players) as u64, Relaxed);
        } else if now < self.players {
            players.fetch_sub((self.players - now) as u64, Relaxed);
        }
        self.players = now;
    }
}

impl Deliver<DurableRoom<Tag>> for Conns<'_> {
    fn deliver(&mut self, room: &DurableRoom<Tag>, done: Done<Tag>) -> ControlFlow<()> {
        let Done {
            tag,
            outputs,
            answer,
            expiry,
        } = done;
        match expiry {
            Expiry::Expired => {
                self.relay.metrics.rooms_expired.fetch_add(1, Relaxed);
                tracing::info!("room expired");
            }
            // Tried again at the next sweep.
            Expiry::NotStored => tracing::warn!("expired room not deleted: the store failed"),
            Expiry::None => {}
        }
        let (source, tag) = match tag {
            Tag::Source(text) => (text, Tag::None),
            tag => (Utf8Bytes::from_static(""), tag),
        };
        let attaching = match (&answer, &tag) {
            (Answer::Attach(conn, _), Tag::Attach(out, _)) => Some((*conn, out)),
            _ => None,
        };
        let closed = self.carry_out(outputs, &source, attaching);
        self.answer(answer, tag);
        self.count_players(room.acknowledged().player_count());
        if closed {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

/// The room's task: handles commands until the room closes, or until
/// another node takes it over (then it answers nothing more and closes its
/// clients with [`CLOSE_ROOM_MOVED`](super::CLOSE_ROOM_MOVED)).
///
/// Not an `async fn`: its arguments (the room among them, 352 bytes) would
/// be kept in the task beside what is made of them, for the room's life.
pub(super) fn run(
    relay: Arc<Relay>,
    room: Room,
    handle: RoomHandle,
    mut rx: mpsc::Receiver<RoomCmd>,
) -> impl Future<Output = ()> + Send {
    let pin = room.pin().to_owned();
    let players = room.player_count();
    let mut room = DurableRoom::new(room);
    async move {
        let mut conns = Conns {
            relay: &relay,
            pin: &pin,
            conns: HashMap::new(),
            players,
        };
        let store = Store {
            writer: &relay.writer,
            key: &pin,
            clock: &*relay.clock,
        };
        let lost = tokio::select! {
            // A loss first: the refused write that told it must not be
            // answered as the store's failure.
            biased;
            () = handle.lost.notified() => true,
            () = unit::drive(&mut room, &mut conns, &mut rx, store) => false,
        };
        if lost {
            let (code, reason) = super::CLOSE_ROOM_MOVED;
            for (_, out) in conns.conns.drain() {
                out.close(code, reason);
            }
            rx.close();
        }
        let players = conns.players;
        if let Ok(mut rooms) = relay.rooms.lock() {
            if rooms.get(&pin).is_some_and(|h| h.same(&handle)) {
                rooms.remove(&pin);
            }
        }
        relay.bundles.forget(&pin);
        relay.players.fetch_sub(players as u64, Relaxed);
        relay.metrics.rooms.fetch_sub(1, Relaxed);
        if lost {
            tracing::warn!("room dropped: another node took it over");
        } else {
            // The room ended: its lease goes too.
            if let Some(leases) = &relay.leases {
                leases
                    .release(hostwire_store::lease::UnitKind::RelayRoom, &pin)
                    .await;
            }
            tracing::info!("room closed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A room's queue keeps two blocks of 32 commands for its life: at 16
    /// bytes a command (a pointer and the variant) they are 544 bytes
    /// each; a frame held inline (120 bytes) made them 3,872.
    #[test]
    fn a_room_command_is_a_pointer_and_its_variant() {
        assert_eq!(std::mem::size_of::<RoomCmd>(), 16);
    }
}
