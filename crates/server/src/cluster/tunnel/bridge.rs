//! The client node's side of a tunnel: the client's WebSocket stays here,
//! under this node's driver (its idle timeout, pings, frame limit and
//! outbound bound); its messages go to the owner in order, and the owner's
//! frames and close come back to it (put on its outbound queue by the
//! dispatcher, `dispatch.rs`, with no task between).

use super::dispatch::{ClientEnd, To};
use super::wire::Wire;
use super::{Open, Route, Tunnels, Window, CLOSE_LOST, OPEN_TIMEOUT};
use crate::ws;
use crate::ws::Utf8Bytes;
use bytes::Bytes;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

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
        let end = Arc::new(ClientEnd {
            out: reader.out().clone(),
            sender: Mutex::new(self.sender(route.owner, &id)),
            ended: Notify::new(),
            done: AtomicBool::new(false),
        });
        let to = To::Client {
            end: Arc::clone(&end),
            taken: (0, 0),
        };
        // The opening's wait (about 1.4 KB of state) and the closing's are
        // boxed: once each, where the bridge's own future is held for the
        // carried connection's life.
        if !self.register(&id, route.owner, to) || !Box::pin(self.open_there(&id, &route)).await {
            end.done.store(true, Relaxed);
            self.remove(&id);
            self.metrics.refused.fetch_add(1, Relaxed);
            refused(reader.out());
            Box::pin(reader.finish()).await;
            return;
        }
        self.metrics.opened_out.fetch_add(1, Relaxed);
        let window = Arc::new(Window::default());
        self.route_credits(&id, Arc::clone(&window));
        let carried = Carried {
            tunnels: &self,
            end: &end,
            window: &window,
        };
        let ok = first
            .into_iter()
            .all(|f| carried.frame(true, Bytes::from(f)));
        let mut reader = reader;
        let ended = if ok {
            carried.run(&mut reader).await
        } else {
            reader.out().close(CLOSE_LOST);
            Ended::Owner
        };
        end.done.store(true, Relaxed);
        if let Ended::Client = ended {
            end.sender().send(&Wire::End);
        }
        self.remove(&id);
        Box::pin(reader.finish()).await;
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
    end: &'a ClientEnd,
    /// What was sent that the owner has not credited yet.
    window: &'a Window,
}

impl Carried<'_> {
    /// A text or binary frame, in fragments when long; counted against
    /// the window.
    fn frame(&self, text: bool, body: Bytes) -> bool {
        self.window.sent(body.len() as u64);
        self.tunnels.metrics.frames_out.fetch_add(1, Relaxed);
        self.end.sender().frame(text, body)
    }

    fn send(&self, w: &Wire) -> bool {
        self.end.sender().send(w)
    }

    /// Both ways until one side ends.
    async fn run(&self, reader: &mut ws::Reader) -> Ended {
        let out = reader.out().clone();
        let c = *reader.config();
        let mut beat = tokio::time::interval(c.ping_interval.min(c.idle_timeout / 3));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        beat.tick().await;
        // After the client's oversized message: only the owner's answer
        // and close are still awaited, for at most the close grace.
        let mut grace: Option<tokio::time::Instant> = None;
        let link = Arc::clone(&self.end.sender().link);
        loop {
            let until = grace.unwrap_or_else(|| tokio::time::Instant::now() + c.close_grace);
            tokio::select! {
                // Past the owner's credit the client is not read: its TCP
                // window fills, as it would on a direct connection. So is
                // it while the link to the owner is full.
                ev = async {
                    poll_fn(|cx| self.window.poll_open(cx)).await;
                    poll_fn(|cx| link.poll_room(cx)).await;
                    poll_fn(|cx| reader.poll_event(cx)).await
                }, if grace.is_none() => {
                    let sent = match ev {
                        ws::Event::Text(t) => self.frame(true, Bytes::from(t)),
                        ws::Event::Binary(b) => self.frame(false, b),
                        ws::Event::Oversized => {
                            grace = Some(tokio::time::Instant::now() + c.close_grace);
                            self.send(&Wire::Oversized(c.max_message_bytes as u64 + 1))
                        }
                        ws::Event::End => return Ended::Client,
                    };
                    if !sent {
                        out.close(CLOSE_LOST);
                        return Ended::Owner;
                    }
                }
                // The dispatcher closed the client (the owner's close, or
                // the tunnel lost).
                _ = self.end.ended.notified() => return Ended::Owner,
                _ = beat.tick() => {
                    if !self.send(&Wire::Keepalive) {
                        out.close(CLOSE_LOST);
                        return Ended::Owner;
                    }
                }
                _ = tokio::time::sleep_until(until), if grace.is_some() => return Ended::Client,
            }
        }
    }
}
