//! The client node's side of a tunnel: the client's WebSocket stays here,
//! under this node's driver (its idle timeout, pings, frame limit and
//! outbound bound); its messages go to the owner in order, and the owner's
//! frames and close come back to it.

use super::wire::Wire;
use super::{
    intern_reason, Open, Route, Tunnels, CLOSE_LOST, OPEN_TIMEOUT, TUNNEL_FRAMES, WINDOW_BYTES,
    WINDOW_FRAMES,
};
use crate::ws;
use axum::extract::ws::{Message, Utf8Bytes};
use bytes::Bytes;
use std::future::poll_fn;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc;

/// How a bridge ended.
enum Ended {
    /// The client went (or this node closed it): the owner is told.
    Client,
    /// The owner closed it, or the tunnel was lost: nothing to tell.
    Owner,
}

impl Tunnels {
    /// Carries `reader`'s connection to `route.owner`: first `first` (the
    /// frames already read here that named the unit), then every message
    /// of the client, while the owner's frames come back. When the owner
    /// cannot be reached, `refused` answers the client (as the protocol
    /// refuses a unit served elsewhere, for it to reconnect). Returns
    /// once the connection has ended ([`ws::Reader::finish`] is called).
    pub async fn bridge(
        self: Arc<Self>,
        route: Route<'_>,
        first: Vec<Utf8Bytes>,
        reader: ws::Reader,
        refused: impl FnOnce(&ws::Outbound),
    ) {
        let id = Tunnels::new_id();
        let (tx, rx) = mpsc::channel(TUNNEL_FRAMES);
        if !self.register(&id, route.owner, tx) || !self.open_there(&id, &route).await {
            self.remove(&id);
            self.metrics.refused.fetch_add(1, Relaxed);
            refused(reader.out());
            reader.finish().await;
            return;
        }
        self.metrics.opened_out.fetch_add(1, Relaxed);
        let mut carried = Carried {
            tunnels: &self,
            subject: super::frame_subject(route.owner, &id),
            seq: 0,
            in_flight: (0, 0),
            taken: (0, 0),
        };
        let mut ok = true;
        for f in first {
            ok = ok && carried.frame(true, Bytes::from(f)).await;
        }
        let mut reader = reader;
        let ended = if ok {
            carried.run(&mut reader, rx).await
        } else {
            reader.out().close(CLOSE_LOST);
            Ended::Owner
        };
        if let Ended::Client = ended {
            let _ = carried.send(Wire::End).await;
        }
        self.remove(&id);
        reader.finish().await;
    }

    /// Asks the owner to open its side: true once it answered `ok`.
    pub(super) async fn open_there(&self, id: &str, route: &Route<'_>) -> bool {
        let open = Open {
            tunnel: id.to_owned(),
            protocol: route.protocol.to_owned(),
            ip: route.ip.to_owned(),
            from: self.node.clone(),
            handshake: route.handshake.to_owned(),
        };
        let Ok(payload) = serde_json::to_vec(&open) else {
            return false;
        };
        let asked = self
            .client
            .request(super::open_subject(route.owner), payload.into());
        match tokio::time::timeout(OPEN_TIMEOUT, asked).await {
            Ok(Ok(m)) if &m.payload[..] == b"ok" => true,
            Ok(Ok(m)) => {
                tracing::debug!(owner = route.owner, answer = ?m.payload, "tunnel refused");
                false
            }
            Ok(Err(e)) => {
                tracing::debug!(owner = route.owner, error = %e, "tunnel not opened");
                false
            }
            Err(_) => false,
        }
    }
}

/// The client's messages on their way to the owner.
struct Carried<'a> {
    tunnels: &'a Tunnels,
    subject: String,
    seq: u64,
    /// Frames and bytes sent that the owner has not credited yet.
    in_flight: (u64, u64),
    /// Frames and bytes of the owner taken and not yet credited back.
    taken: (u64, u64),
}

impl Carried<'_> {
    async fn send(&mut self, w: Wire) -> bool {
        let sent = self
            .tunnels
            .client
            .publish(self.subject.clone(), w.encode(self.seq))
            .await;
        self.seq += 1;
        sent.is_ok()
    }

    /// A text or binary frame, in fragments when long; counted against
    /// the window.
    async fn frame(&mut self, text: bool, body: Bytes) -> bool {
        self.in_flight.0 += 1;
        self.in_flight.1 += body.len() as u64;
        self.tunnels.metrics.frames_out.fetch_add(1, Relaxed);
        for w in Wire::frame(text, body) {
            if !self.send(w).await {
                return false;
            }
        }
        true
    }

    /// Notes a frame of the owner's taken; the credit to grant when one is
    /// due.
    fn took(&mut self, bytes: u64) -> Option<(u64, u64)> {
        self.taken = (self.taken.0 + 1, self.taken.1 + bytes);
        if self.taken.0 >= super::CREDIT_FRAMES || self.taken.1 >= super::CREDIT_BYTES {
            return Some(std::mem::take(&mut self.taken));
        }
        None
    }

    /// Whether the owner's credit lets another frame of the client go.
    fn may_send(&self) -> bool {
        self.in_flight.0 < WINDOW_FRAMES && self.in_flight.1 < WINDOW_BYTES
    }

    /// A credit of the owner (a pong of 16 bytes: frames, then bytes).
    fn credit(&mut self, b: &[u8]) {
        let Ok(n) = <[u8; 16]>::try_from(b) else {
            return;
        };
        let frames = u64::from_be_bytes(n[..8].try_into().expect("8 bytes"));
        let bytes = u64::from_be_bytes(n[8..].try_into().expect("8 bytes"));
        self.in_flight.0 = self.in_flight.0.saturating_sub(frames);
        self.in_flight.1 = self.in_flight.1.saturating_sub(bytes);
    }

    /// Both ways until one side ends.
    async fn run(
        &mut self,
        reader: &mut ws::Reader,
        mut from_owner: mpsc::Receiver<Result<Message, axum::Error>>,
    ) -> Ended {
        let out = reader.out().clone();
        let c = *reader.config();
        let mut beat = tokio::time::interval(c.ping_interval.min(c.idle_timeout / 3));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        beat.tick().await;
        // After the client's oversized message: only the owner's answer
        // and close are still awaited, for at most the close grace.
        let mut grace: Option<tokio::time::Instant> = None;
        loop {
            let until = grace.unwrap_or_else(|| tokio::time::Instant::now() + c.close_grace);
            tokio::select! {
                // Past the window the client is not read: its TCP window
                // fills, as it would on a direct connection.
                ev = poll_fn(|cx| reader.poll_event(cx)), if grace.is_none() && self.may_send() => {
                    let sent = match ev {
                        ws::Event::Text(t) => self.frame(true, Bytes::from(t)).await,
                        ws::Event::Binary(b) => self.frame(false, b).await,
                        ws::Event::Oversized => {
                            grace = Some(tokio::time::Instant::now() + c.close_grace);
                            self.send(Wire::Oversized(c.max_message_bytes as u64 + 1)).await
                        }
                        ws::Event::End => return Ended::Client,
                    };
                    if !sent {
                        out.close(CLOSE_LOST);
                        return Ended::Owner;
                    }
                }
                m = from_owner.recv() => match m {
                    Some(Ok(Message::Text(t))) => {
                        let n = t.len() as u64;
                        if out.send(t).is_err() {
                            return Ended::Client;
                        }
                        // Taken: the owner may send that much more.
                        if let Some((frames, bytes)) = self.took(n) {
                            if !self.send(Wire::Credit { frames, bytes }).await {
                                out.close(CLOSE_LOST);
                                return Ended::Owner;
                            }
                        }
                    }
                    Some(Ok(Message::Close(f))) => {
                        let (code, reason) = f.map_or((1000, "closed"), |f| {
                            (f.code, intern_reason(f.reason.as_str()))
                        });
                        out.close((code, reason));
                        return Ended::Owner;
                    }
                    Some(Ok(Message::Pong(b))) => self.credit(&b),
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => {
                        out.close(CLOSE_LOST);
                        return Ended::Owner;
                    }
                },
                _ = beat.tick() => {
                    if !self.send(Wire::Keepalive).await {
                        out.close(CLOSE_LOST);
                        return Ended::Owner;
                    }
                }
                _ = tokio::time::sleep_until(until), if grace.is_some() => return Ended::Client,
            }
        }
    }
}
