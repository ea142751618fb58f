//! The owner's side of a tunnel: openings taken, a carried connection run
//! over a pipe with the protocol's own code (or a carried HTTP request
//! through this node's router), and what it sends put on the link to the
//! client's node in order, with the credit its connection grants.

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
        if !self.register(&open.tunnel, &open.from, dispatch::To::Queue(in_tx)) {
            self.metrics.refused.fetch_add(1, Relaxed);
            return "too many tunnels";
        }
        self.metrics.opened_in.fetch_add(1, Relaxed);
        // What the client's node grants back: the owner sends at most a
        // window ahead of it.
        let window = Arc::new(Window::default());
        self.route_credits(&open.tunnel, Arc::clone(&window));
        let pipe = ws::Pipe {
            from_peer: in_rx,
            to_peer: Box::new(ToClient {
                sender: self.sender(&open.from, &open.tunnel),
                window,
                taken: (0, 0),
                tunnels: Arc::clone(self),
            }),
        };
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
        if !self.register(&open.tunnel, &open.from, dispatch::To::Queue(in_tx)) {
            self.metrics.refused.fetch_add(1, Relaxed);
            return "too many tunnels";
        }
        self.metrics.opened_in.fetch_add(1, Relaxed);
        let (out_tx, out_rx) = mpsc::channel(TUNNEL_FRAMES);
        tokio::spawn(forward(self.sender(&open.from, &open.tunnel), out_rx));
        let tunnels = Arc::clone(self);
        let id = open.tunnel;
        self.serve_carried(in_rx, out_tx, open.ip, move || tunnels.remove(&id));
        "ok"
    }
}

/// What a carried connection sends, on its way to the client's node: in
/// order on the link, at most [`WINDOW_FRAMES`] / [`WINDOW_BYTES`] ahead
/// of that node's credit, past which it is not ready and the connection's
/// outbound queue fills (the protocol's own rule for a slow client then
/// applies), and with this side's credit for what the connection took.
struct ToClient {
    sender: link::Sender,
    window: Arc<Window>,
    /// Frames and bytes taken and not yet credited.
    taken: (u64, u64),
    tunnels: Arc<Tunnels>,
}

impl futures_util::Sink<Message> for ToClient {
    type Error = crate::ws::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        std::task::ready!(self.window.poll_open(cx));
        std::task::ready!(self.sender.poll_room(cx));
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, m: Message) -> Result<(), Self::Error> {
        let this = self.get_mut();
        if let Message::Text(t) = &m {
            this.window.sent(t.len() as u64);
            this.tunnels.metrics.frames_out.fetch_add(1, Relaxed);
        }
        let Some(wires) = wire_of(m) else {
            return Ok(());
        };
        match wires.iter().all(|w| this.sender.send(w)) {
            true => Ok(()),
            false => Err(ws::closed()),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The link publishes on its own.
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
}

impl ws::ToPeer for ToClient {
    fn taken(&mut self, bytes: usize) {
        self.taken = (self.taken.0 + 1, self.taken.1 + bytes as u64);
        if self.taken.0 >= CREDIT_FRAMES || self.taken.1 >= CREDIT_BYTES {
            let (frames, bytes) = std::mem::take(&mut self.taken);
            self.sender.send(&Wire::Credit { frames, bytes });
        }
    }
}

/// Sends what a carried HTTP request's answer sends, in order, until its
/// server lets go of the channel.
pub(super) async fn forward(mut sender: link::Sender, mut rx: mpsc::Receiver<Message>) {
    while let Some(m) = rx.recv().await {
        std::future::poll_fn(|cx| sender.poll_room(cx)).await;
        let Some(wires) = wire_of(m) else { continue };
        if !wires.iter().all(|w| sender.send(w)) {
            return;
        }
    }
}

/// The messages that carry what a connection sends (a pong carries
/// nothing: the driver's own answer, not the protocol's).
fn wire_of(m: Message) -> Option<Vec<Wire>> {
    Some(match m {
        Message::Text(t) => Wire::frame(true, Bytes::from(t)),
        Message::Binary(b) => Wire::frame(false, b),
        Message::Ping(_) => vec![Wire::Keepalive],
        // The driver writes no raw frames.
        Message::Pong(_) | Message::Frame(_) => return None,
        Message::Close(f) => {
            let (code, reason) = f.map_or((1005, String::new()), |f| {
                (f.code.into(), f.reason.as_str().to_owned())
            });
            vec![Wire::Close(code, reason)]
        }
    })
}
