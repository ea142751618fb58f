//! The owner's side of a tunnel: openings taken, a carried connection run
//! over a pipe with the protocol's own code (or a carried HTTP request
//! through this node's router), and what it sends published back in order
//! with the credit its connection grants.

use super::wire::Wire;
use super::*;

impl Tunnels {
    pub(super) async fn take_openings(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut sub = match self.client.subscribe(open_subject(&self.node)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot take tunnels from other nodes");
                return;
            }
        };
        loop {
            let m = tokio::select! {
                m = sub.next() => m,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Some(m) = m else { return };
            let answer = self.open_here(&m.payload);
            if let Some(reply) = m.reply {
                let _ = self.client.publish(reply, answer.into()).await;
            }
        }
    }

    /// Starts the owner's side of a tunnel: `ok`, or why not.
    fn open_here(self: &Arc<Self>, payload: &[u8]) -> &'static str {
        if payload.len() > MAX_OPEN_BYTES {
            return "opening too large";
        }
        let Ok(open) = serde_json::from_slice::<Open>(payload) else {
            return "malformed opening";
        };
        if open.protocol == http::HTTP_PROTOCOL {
            return self.open_http(open);
        }
        let acceptor = self
            .acceptors
            .lock()
            .expect("acceptors")
            .get(open.protocol.as_str())
            .cloned();
        let Some(acceptor) = acceptor else {
            return "unknown protocol";
        };
        let (in_tx, in_rx) = mpsc::channel(TUNNEL_FRAMES);
        if !self.register(&open.tunnel, &open.from, in_tx) {
            self.metrics.refused.fetch_add(1, Relaxed);
            return "too many tunnels";
        }
        self.metrics.opened_in.fetch_add(1, Relaxed);
        let (out_tx, out_rx) = mpsc::channel(TUNNEL_FRAMES);
        // Credits are few (one per CREDIT_FRAMES frames taken, and the
        // client's node sends at most WINDOW_FRAMES ahead): unbounded, so
        // that one is never lost for want of room.
        let (credit_tx, credit_rx) = mpsc::unbounded_channel();
        let (mut frames, mut bytes) = (0u64, 0u64);
        let pipe = ws::Pipe {
            from_peer: in_rx,
            to_peer: tokio_util::sync::PollSender::new(out_tx),
            taken: Box::new(move |n| {
                frames += 1;
                bytes += n as u64;
                if frames >= CREDIT_FRAMES || bytes >= CREDIT_BYTES {
                    let _ = credit_tx.send((frames, bytes));
                    (frames, bytes) = (0, 0);
                }
            }),
        };
        // What the client's node grants back: the owner sends at most a
        // window ahead of it. Unbounded, and bounded by that window (a
        // credit per CREDIT_FRAMES frames of at most WINDOW_FRAMES sent).
        let (granted_tx, granted_rx) = mpsc::unbounded_channel();
        self.route_credits(&open.tunnel, granted_tx);
        tokio::spawn(Arc::clone(self).send_frames(
            open.from.clone(),
            open.tunnel.clone(),
            out_rx,
            Some((credit_rx, granted_rx)),
        ));
        let run = ws::Connection::over_pipe(
            pipe,
            Arc::clone(&acceptor.config),
            self.sockets.get().cloned(),
            move |c| {
                let client = Client {
                    ip: open.ip.into_boxed_str(),
                    handshake: open.handshake,
                };
                (acceptor.run)(c, client)
            },
        );
        let tunnels = Arc::clone(self);
        let id = open.tunnel;
        let span = tracing::info_span!("tunnel", id = %id, from = %open.from);
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                run.await;
                tunnels.remove(&id);
            },
            span,
        ));
        "ok"
    }

    /// The owner's side of a carried HTTP request.
    fn open_http(self: &Arc<Self>, open: Open) -> &'static str {
        if self.router.get().is_none() {
            return "no router";
        }
        let (in_tx, in_rx) = mpsc::channel(TUNNEL_FRAMES);
        if !self.register(&open.tunnel, &open.from, in_tx) {
            self.metrics.refused.fetch_add(1, Relaxed);
            return "too many tunnels";
        }
        self.metrics.opened_in.fetch_add(1, Relaxed);
        let (out_tx, out_rx) = mpsc::channel(TUNNEL_FRAMES);
        tokio::spawn(Arc::clone(self).send_frames(open.from, open.tunnel.clone(), out_rx, None));
        let tunnels = Arc::clone(self);
        let id = open.tunnel;
        self.serve_carried(in_rx, out_tx, open.ip, move || tunnels.remove(&id));
        "ok"
    }

    /// Publishes what the owner's connection sends, in order, to the
    /// client node, with the credits its connection grants, until the
    /// connection lets go of its pipe. With `credits` (a carried
    /// WebSocket: the grants of this side, and those of the client's
    /// node) it sends at most [`WINDOW_FRAMES`] / [`WINDOW_BYTES`] ahead
    /// of the client node's grants, and then takes no more of the
    /// connection's frames: its outbound queue fills, and the protocol's
    /// own rule for a slow client applies.
    pub(super) async fn send_frames(
        self: Arc<Self>,
        peer: String,
        tunnel: String,
        mut rx: mpsc::Receiver<Message>,
        credits: Option<(Credits, Credits)>,
    ) {
        let subject = frame_subject(&peer, &tunnel);
        let mut seq = 0u64;
        let windowed = credits.is_some();
        let (mut grants, mut granted) = match credits {
            Some((a, b)) => (Some(a), Some(b)),
            None => (None, None),
        };
        let mut in_flight = (0u64, 0u64);
        loop {
            let open = !windowed || (in_flight.0 < WINDOW_FRAMES && in_flight.1 < WINDOW_BYTES);
            let wires = tokio::select! {
                m = rx.recv(), if open => match m {
                    Some(m) => {
                        if let Message::Text(t) = &m {
                            in_flight = (in_flight.0 + 1, in_flight.1 + t.len() as u64);
                        }
                        match wire_of(m) {
                            Some(w) => w,
                            None => continue,
                        }
                    }
                    None => return,
                },
                Some((frames, bytes)) = async {
                    match grants.as_mut() {
                        Some(g) => g.recv().await,
                        None => std::future::pending().await,
                    }
                } => vec![Wire::Credit { frames, bytes }],
                Some((frames, bytes)) = async {
                    match granted.as_mut() {
                        Some(g) => g.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    in_flight = (in_flight.0.saturating_sub(frames), in_flight.1.saturating_sub(bytes));
                    continue;
                }
            };
            for w in wires {
                if self
                    .client
                    .publish(subject.clone(), w.encode(seq))
                    .await
                    .is_err()
                {
                    return;
                }
                seq += 1;
            }
            self.metrics.frames_out.fetch_add(1, Relaxed);
        }
    }
}

/// Credits (frames, bytes) on their way between a tunnel's tasks.
type Credits = mpsc::UnboundedReceiver<(u64, u64)>;

/// The messages that carry what a connection sends (a pong carries
/// nothing: the driver's own answer, not the protocol's).
fn wire_of(m: Message) -> Option<Vec<Wire>> {
    Some(match m {
        Message::Text(t) => Wire::frame(true, Bytes::from(t)),
        Message::Binary(b) => Wire::frame(false, b),
        Message::Ping(_) => vec![Wire::Keepalive],
        Message::Pong(_) => return None,
        Message::Close(f) => {
            let (code, reason) = f.map_or((1005, String::new()), |f| {
                (f.code, f.reason.as_str().to_owned())
            });
            vec![Wire::Close(code, reason)]
        }
    })
}
