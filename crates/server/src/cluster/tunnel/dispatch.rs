//! What arrives from other nodes: each batch on this node's frame subject
//! taken apart, and each message handed to its tunnel, in order. On the
//! owner's side a message goes to the queue its pipe reads; on the
//! client's node the owner's frames go straight to the client's own
//! outbound queue (no task between), and their credit back on the link.

use super::link::Sender;
use super::wire::{self, Wire, OUT_OF_BAND};
use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::MutexGuard;
use tokio::sync::Notify;

/// Where a tunnel's messages go on this node.
pub(super) enum To {
    /// A queue its side's task reads (the owner's pipe, a carried HTTP
    /// request on either side), bounded at [`TUNNEL_FRAMES`].
    Queue(mpsc::Sender<Result<Message, crate::ws::Error>>),
    /// The client's own connection (the client's node of a carried
    /// WebSocket): frames go to its outbound queue, under the protocol's
    /// bound for a slow client. `taken`: frames and bytes not yet credited.
    Client {
        end: Arc<ClientEnd>,
        taken: (u64, u64),
    },
}

/// What a message asks of this node once the tunnels' map is let go (the
/// writes to clients, in the order of the batch).
enum After {
    /// The queue was full: the tunnel ended, its peer is told.
    TooSlow {
        peer: String,
        id: String,
    },
    Frame(Arc<ClientEnd>, Utf8Bytes, Option<(u64, u64)>),
    Close(Arc<ClientEnd>, u16, String),
    Lost(Arc<ClientEnd>),
}

/// The client's end of a carried connection, shared by its bridge (which
/// reads the client) and the dispatcher (which writes to it).
pub(super) struct ClientEnd {
    pub(super) out: ws::Outbound,
    /// The tunnel's messages to the owner: the client's frames (the
    /// bridge), and the credit for the owner's (the dispatcher).
    pub(super) sender: Mutex<Sender>,
    /// Told when the owner closed the connection or the tunnel was lost.
    pub(super) ended: Notify,
    /// The bridge is done: nothing more is written to the client here.
    pub(super) done: AtomicBool,
}

impl ClientEnd {
    pub(super) fn sender(&self) -> MutexGuard<'_, Sender> {
        self.sender.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One of the owner's frames, and the credit due for what was taken.
    pub(super) fn deliver(&self, frame: Utf8Bytes, credit: Option<(u64, u64)>) {
        // A full outbound queue closes the client (the protocol's rule
        // for a slow client); the bridge then sees it end.
        let _ = self.out.send(frame);
        if let Some((frames, bytes)) = credit {
            self.sender().send(&Wire::Credit { frames, bytes });
        }
    }

    /// The owner closed the connection: the client gets its close.
    pub(super) fn closed_by_owner(&self, code: u16, reason: &str) {
        if !self.done.load(Relaxed) {
            self.out.close((code, intern_reason(reason)));
        }
        self.ended.notify_one();
    }

    /// The tunnel was lost: the client is told to reconnect.
    pub(super) fn lost(&self) {
        if !self.done.load(Relaxed) {
            self.out.close(CLOSE_LOST);
        }
        self.ended.notify_one();
    }
}

impl Tunnels {
    pub(super) async fn take_frames(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let subject = frame_subject(&self.node);
        let mut sub = match self.client.subscribe(subject).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot take frames between nodes: clients of units owned elsewhere will be refused");
                return;
            }
        };
        let mut after = Vec::new();
        loop {
            tokio::select! {
                m = sub.next() => match m {
                    Some(m) => self.take_batch(&m.payload, &mut after),
                    None => return,
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Hands each message of a batch to its tunnel.
    fn take_batch(&self, batch: &Bytes, after: &mut Vec<After>) {
        self.metrics.batches_in.fetch_add(1, Relaxed);
        {
            let mut open = self.open_map();
            for r in wire::records(batch) {
                let Ok((id, m)) = r else {
                    // What the rest carried is lost: the tunnels it was
                    // for see the gap in their next message.
                    tracing::warn!("malformed batch between nodes");
                    break;
                };
                if let Some(a) = self.take_frame(&mut open, id, &m) {
                    after.push(a);
                }
            }
        }
        for a in after.drain(..) {
            match a {
                After::TooSlow { peer, id } => {
                    let (code, reason) = CLOSE_TOO_SLOW;
                    self.link(&peer)
                        .push(&id, OUT_OF_BAND, &Wire::Close(code, reason.to_owned()));
                }
                After::Frame(end, t, credit) => end.deliver(t, credit),
                After::Close(end, code, reason) => end.closed_by_owner(code, &reason),
                After::Lost(end) => end.lost(),
            }
        }
    }

    /// Ends tunnel `id` as lost; its client, if here, is closed after what
    /// it was sent.
    fn lose(&self, open: &mut HashMap<String, Entry>, id: &str) -> Option<After> {
        self.metrics.lost.fetch_add(1, Relaxed);
        match open.remove(id)?.to {
            To::Client { end, .. } => Some(After::Lost(end)),
            To::Queue(_) => None,
        }
    }

    /// Hands one message to its tunnel; what is left to do once the map
    /// is let go.
    fn take_frame(
        &self,
        open: &mut HashMap<String, Entry>,
        id: &str,
        payload: &Bytes,
    ) -> Option<After> {
        let decoded = Wire::decode(payload);
        // Its tunnel ended: what was on the way is dropped.
        let entry = open.get_mut(id)?;
        let (seq, wire) = match decoded {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(tunnel = id, error = ?e, "malformed message between nodes: tunnel ended");
                return self.lose(open, id);
            }
        };
        if seq != OUT_OF_BAND {
            if seq != entry.next_seq {
                tracing::warn!(
                    tunnel = id,
                    expected = entry.next_seq,
                    got = seq,
                    "a frame between nodes was lost: tunnel ended"
                );
                return self.lose(open, id);
            }
            entry.next_seq += 1;
        }
        self.metrics.frames_in.fetch_add(1, Relaxed);
        let joined = |entry: &mut Entry, last: Bytes| match entry.partial.take() {
            None => last,
            Some(mut p) => {
                p.extend_from_slice(&last);
                p.freeze()
            }
        };
        let item = match wire {
            Wire::Fragment(b) => {
                let p = entry.partial.get_or_insert_with(bytes::BytesMut::new);
                if p.len() + b.len() > MAX_CARRIED_FRAME {
                    return self.lose(open, id);
                }
                p.extend_from_slice(&b);
                return None;
            }
            Wire::Text(b) => match Utf8Bytes::try_from(joined(entry, b)) {
                Ok(t) => Ok(Message::Text(t)),
                Err(_) => return self.lose(open, id),
            },
            Wire::Binary(b) => Ok(Message::Binary(joined(entry, b))),
            Wire::Oversized(n) => Err(ws::oversized(n as usize, 0)),
            // A pong is what the driver counts as the peer's sign of life.
            Wire::Keepalive => Ok(Message::Pong(Bytes::new())),
            Wire::Credit { frames, bytes } => {
                if let Some(w) = &entry.window {
                    w.credit(frames, bytes);
                }
                return None;
            }
            Wire::Close(code, reason) => Ok(Message::Close(Some(CloseFrame {
                code: code.into(),
                reason: Utf8Bytes::from(reason),
            }))),
            Wire::End => {
                return match open.remove(id)?.to {
                    To::Client { end, .. } => Some(After::Lost(end)),
                    To::Queue(_) => None,
                };
            }
        };
        let tx = match &mut entry.to {
            To::Queue(tx) => tx,
            To::Client { end, taken } => {
                return match item {
                    Ok(Message::Text(t)) => {
                        *taken = (taken.0 + 1, taken.1 + t.len() as u64);
                        let due = taken.0 >= CREDIT_FRAMES || taken.1 >= CREDIT_BYTES;
                        let credit = due.then(|| std::mem::take(taken));
                        Some(After::Frame(Arc::clone(end), t, credit))
                    }
                    Ok(Message::Close(f)) => {
                        let (code, reason) = f.map_or((1000, Default::default()), |f| {
                            (f.code.into(), f.reason.as_str().to_owned())
                        });
                        let end = Arc::clone(end);
                        open.remove(id);
                        Some(After::Close(end, code, reason))
                    }
                    // The owner's beats: the client's socket has its own.
                    _ => None,
                };
            }
        };
        match tx.try_send(item) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(_)) => {
                let peer = entry.peer.clone();
                open.remove(id);
                self.metrics.too_slow.fetch_add(1, Relaxed);
                Some(After::TooSlow {
                    peer,
                    id: id.to_owned(),
                })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                open.remove(id);
                None
            }
        }
    }
}
