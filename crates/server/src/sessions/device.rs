//! A headless device: one simulated plugin instance over
//! `/memizy/session/ws`, for tests and benchmarks. Its worker RPC end is a
//! [`PeerState`] (call ids, one response each, the server's `cancel`s):
//! it sends Host API calls as `request`s and awaits their `response`s; the
//! Plugin API calls the server sends are answered at once (`null`) and
//! kept in an inbox, each with the instant it arrived. Hostile cases send
//! raw frames beside it and read their answers by id.

use futures_util::{SinkExt, StreamExt};
use hostwire_worker_rpc::frame::{parse_frame, Frame, Outcome, Payload};
use hostwire_worker_rpc::{Event, PeerConfig, PeerState, RpcError, Side};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

/// Plugin API calls kept for one device before further ones are dropped
/// (and counted).
pub const DEVICE_INBOX: usize = 65_536;
/// How long [`Device::call`] waits for an answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// An error answer: the SPEC's (or worker RPC's) code and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// A Plugin API call the device got.
#[derive(Debug, Clone)]
pub struct PluginCall {
    pub method: String,
    pub args: Value,
    pub at: Instant,
}

type Waiter = oneshot::Sender<Result<Value, RemoteError>>;

/// The device's worker RPC state and who waits on it.
struct Rpc {
    state: PeerState,
    /// Host API calls sent through the state, by id.
    calls: HashMap<u64, Waiter>,
    /// Answers expected to raw frames, by id (the state never saw them).
    raw: HashMap<u64, Waiter>,
}

type Shared = Arc<Mutex<Rpc>>;

fn remote(e: RpcError) -> RemoteError {
    RemoteError {
        code: e.code,
        message: e.message,
    }
}

impl Rpc {
    /// Hands what the state queued to the socket writer.
    fn flush(&mut self, out: &mpsc::UnboundedSender<Message>) {
        while let Some(t) = self.state.poll_transmit() {
            let _ = out.send(Message::text(t.text));
        }
    }

    /// Resolves calls and answers Plugin API calls as the state reports.
    fn events(&mut self, at: Instant, inbox: &mpsc::Sender<PluginCall>, dropped: &AtomicU64) {
        while let Some(e) = self.state.poll_event() {
            match e {
                Event::Response { id, result } => {
                    if let Some(w) = self.calls.remove(&id) {
                        let r = result.map(|p| p.to_value().unwrap_or(Value::Null));
                        let _ = w.send(r.map_err(remote));
                    }
                }
                Event::Request {
                    id, method, params, ..
                } => {
                    self.state.respond(id, Ok(Payload::null()));
                    let args = params
                        .and_then(|p| p.to_value().ok())
                        .unwrap_or(Value::Array(Vec::new()));
                    if inbox.try_send(PluginCall { method, args, at }).is_err() {
                        dropped.fetch_add(1, Relaxed);
                    }
                }
                _ => {}
            }
        }
    }
}

pub struct Device {
    /// A test and bench client: its owner decides how much it sends, and
    /// the socket writer drains this as fast as the server reads.
    out: mpsc::UnboundedSender<Message>,
    rpc: Shared,
    inbox: mpsc::Receiver<PluginCall>,
    /// The `goodbye` reason and the close code, once the server said them.
    pub ended: Arc<Mutex<(Option<String>, Option<u16>)>>,
    pub dropped: Arc<AtomicU64>,
}

impl Device {
    /// Attaches to `session` as `view` at `address` with `token` (the host
    /// token for the board and the settings screen, the player's token for a
    /// player's instance). `base` is `ws://host:port`.
    pub async fn connect(
        base: &str,
        session: &str,
        view: &str,
        address: &str,
        token: &str,
    ) -> anyhow::Result<Device> {
        let url =
            format!("{base}/memizy/session/ws?session={session}&view={view}&address={address}&token={token}");
        // TCP_NODELAY: a call must not wait for the ACK of the one before
        // (Nagle's algorithm against delayed ACKs: tens of milliseconds).
        // A 4 KiB read buffer: tungstenite zero-fills the free part of it
        // before each read, and 128 KiB (its default) made that most of a
        // benchmark client's CPU.
        let config = WebSocketConfig::default().read_buffer_size(4096);
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), true).await?;
        let (mut sink, mut stream) = ws.split();
        // Unbounded on purpose: this is the test and benchmark client's own
        // writer, fed only by its replies to the server it talks to.
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let config = PeerConfig {
            // The server's hello comes first; calls need not wait for it.
            await_peer_hello: false,
            max_outbound_calls: usize::MAX,
            ..PeerConfig::default()
        };
        let rpc: Shared = Arc::new(Mutex::new(Rpc {
            state: PeerState::new(Side::Worker, config),
            calls: HashMap::new(),
            raw: HashMap::new(),
        }));
        // Its own hello is not sent: the server reads none from devices.
        if let Ok(mut r) = rpc.lock() {
            let _ = r.state.poll_transmit();
        }
        let (inbox_tx, inbox) = mpsc::channel(DEVICE_INBOX);
        let ended = Arc::new(Mutex::new((None, None)));
        let dropped = Arc::new(AtomicU64::new(0));
        let (r, e, d, o) = (
            Arc::clone(&rpc),
            Arc::clone(&ended),
            Arc::clone(&dropped),
            out.clone(),
        );
        tokio::spawn(async move {
            while let Some(Ok(m)) = stream.next().await {
                let text = match m {
                    Message::Text(t) => t.to_string(),
                    Message::Close(c) => {
                        if let Ok(mut e) = e.lock() {
                            e.1 = Some(c.map_or(1005, |c| u16::from(c.code)));
                        }
                        break;
                    }
                    _ => continue,
                };
                let at = Instant::now();
                let Ok(mut rpc) = r.lock() else { break };
                match parse_frame(&text) {
                    Ok(Frame::Response { id, outcome, .. }) if rpc.raw.contains_key(&id) => {
                        let r = match outcome {
                            Outcome::Ok(p) => Ok(p.to_value().unwrap_or(Value::Null)),
                            Outcome::Err(e) => Err(RemoteError {
                                code: e.code,
                                message: e.message,
                            }),
                        };
                        if let Some(w) = rpc.raw.remove(&id) {
                            let _ = w.send(r);
                        }
                    }
                    // The server's goodbye is kept; the calls end when the
                    // socket does (TRANSPORT_CLOSED).
                    Ok(Frame::Goodbye { reason, error, .. }) => {
                        if let Ok(mut e) = e.lock() {
                            e.0 = reason.or(error.map(|e| e.code));
                        }
                    }
                    Ok(frame) => rpc.state.handle_frame(frame, 0),
                    Err(err) => rpc.state.handle_malformed(err, 0),
                }
                rpc.events(at, &inbox_tx, &d);
                rpc.flush(&o);
            }
            // Calls still waiting end with an error, never a hang.
            if let Ok(mut rpc) = r.lock() {
                let closed = RpcError::new("TRANSPORT_CLOSED", "the connection closed");
                rpc.state.handle_transport_closed(closed.clone());
                rpc.events(Instant::now(), &inbox_tx, &d);
                for (_, w) in rpc.raw.drain() {
                    let _ = w.send(Err(remote(closed.clone())));
                }
            }
        });
        Ok(Device {
            out,
            rpc,
            inbox,
            ended,
            dropped,
        })
    }

    /// Sends a Host API call and returns its id (the answer is awaited with
    /// [`Device::answer`]).
    pub fn send_call(
        &self,
        method: &str,
        args: &Value,
    ) -> (u64, oneshot::Receiver<Result<Value, RemoteError>>) {
        let (tx, rx) = oneshot::channel();
        let Ok(mut rpc) = self.rpc.lock() else {
            return (0, rx);
        };
        match rpc.state.call(method, Payload::from(args), false, None) {
            Ok(id) => {
                rpc.calls.insert(id, tx);
                rpc.flush(&self.out);
                (id, rx)
            }
            Err(e) => {
                let _ = tx.send(Err(remote(e)));
                (0, rx)
            }
        }
    }

    /// Awaits the answer of a call sent with [`Device::send_call`].
    pub async fn answer(
        rx: oneshot::Receiver<Result<Value, RemoteError>>,
    ) -> Result<Value, RemoteError> {
        match tokio::time::timeout(CALL_TIMEOUT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(RemoteError {
                code: "TRANSPORT_CLOSED".into(),
                message: "the connection closed".into(),
            }),
            Err(_) => Err(RemoteError {
                code: "TIMEOUT".into(),
                message: "no answer in time".into(),
            }),
        }
    }

    /// A Host API call and its answer.
    pub async fn call(&self, method: &str, args: Value) -> Result<Value, RemoteError> {
        let (_, rx) = self.send_call(method, &args);
        Self::answer(rx).await
    }

    /// Sends any text as one frame whose answer comes under `id` (for
    /// hostile cases).
    pub fn send_raw_expecting(
        &self,
        id: u64,
        text: String,
    ) -> oneshot::Receiver<Result<Value, RemoteError>> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut rpc) = self.rpc.lock() {
            rpc.raw.insert(id, tx);
        }
        let _ = self.out.send(Message::text(text));
        rx
    }

    /// Sends any text as one frame (for hostile cases).
    pub fn send_raw(&self, text: String) {
        let _ = self.out.send(Message::text(text));
    }

    /// `hello` with a valid handshake for `plugin_id`: the `InitPayload`.
    pub async fn hello(&self, plugin_id: &str) -> Result<Value, RemoteError> {
        self.call("hello", hello_args(plugin_id)).await
    }

    /// The next Plugin API call, or `None` when the connection closed or
    /// nothing came within `within`.
    pub async fn next_call(&mut self, within: Duration) -> Option<PluginCall> {
        tokio::time::timeout(within, self.inbox.recv())
            .await
            .ok()
            .flatten()
    }

    /// Skips Plugin API calls until one of `method` comes.
    pub async fn wait_for(&mut self, method: &str, within: Duration) -> Option<PluginCall> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let c = tokio::time::timeout_at(deadline, self.inbox.recv())
                .await
                .ok()
                .flatten()?;
            if c.method == method {
                return Some(c);
            }
        }
    }

    /// Plugin API calls received so far and not yet taken.
    pub fn drain_calls(&mut self) -> Vec<PluginCall> {
        let mut v = Vec::new();
        while let Ok(c) = self.inbox.try_recv() {
            v.push(c);
        }
        v
    }

    /// Closes the connection.
    pub fn close(&self) {
        let _ = self.out.send(Message::Close(None));
    }
}

/// The arguments of a valid `hello`.
pub fn hello_args(plugin_id: &str) -> Value {
    json!([{
        "protocol": "1.0",
        "sdk": {"name": "@memizy/plugin-sdk", "version": "1.0.3"},
        "plugin": {"id": plugin_id, "version": "1.0.0"},
        "features": []
    }])
}
