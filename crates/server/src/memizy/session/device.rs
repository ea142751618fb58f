//! A headless device: one simulated plugin instance over
//! `/memizy/session/ws`, for tests and benchmarks. It sends Host API calls
//! as worker RPC `request`s and awaits their `response`s; the Plugin API
//! calls the server sends are answered at once (`null`) and kept in an
//! inbox, each with the instant it arrived.

use futures_util::{SinkExt, StreamExt};
use hostwire_worker_rpc::frame::{parse_frame, Frame, Outcome, Payload, PROTOCOL_VERSION};
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

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, RemoteError>>>>>;

pub struct Device {
    /// A test and bench client: its owner decides how much it sends, and
    /// the socket writer drains this as fast as the server reads.
    out: mpsc::UnboundedSender<Message>,
    pending: Pending,
    inbox: mpsc::Receiver<PluginCall>,
    next_id: AtomicU64,
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
        let (out, mut out_rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let (inbox_tx, inbox) = mpsc::channel(DEVICE_INBOX);
        let ended = Arc::new(Mutex::new((None, None)));
        let dropped = Arc::new(AtomicU64::new(0));
        let (p, e, d, o) = (
            Arc::clone(&pending),
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
                match parse_frame(&text) {
                    Ok(Frame::Response { id, outcome, .. }) => {
                        let r = match outcome {
                            Outcome::Ok(p) => Ok(p.to_value().unwrap_or(Value::Null)),
                            Outcome::Err(e) => Err(RemoteError {
                                code: e.code,
                                message: e.message,
                            }),
                        };
                        if let Some(w) = p.lock().ok().and_then(|mut p| p.remove(&id)) {
                            let _ = w.send(r);
                        }
                    }
                    Ok(Frame::Request {
                        id, method, params, ..
                    }) => {
                        let answer = Frame::Response {
                            v: PROTOCOL_VERSION.to_owned(),
                            id,
                            outcome: Outcome::Ok(Payload::null()),
                        };
                        let _ = o.send(Message::text(answer.to_text()));
                        let args = params
                            .and_then(|p| p.to_value().ok())
                            .unwrap_or(Value::Array(Vec::new()));
                        if inbox_tx.try_send(PluginCall { method, args, at }).is_err() {
                            d.fetch_add(1, Relaxed);
                        }
                    }
                    Ok(Frame::Goodbye { reason, error, .. }) => {
                        if let Ok(mut e) = e.lock() {
                            e.0 = reason.or(error.map(|e| e.code));
                        }
                    }
                    _ => {}
                }
            }
            // Calls still waiting end with an error, never a hang.
            if let Ok(mut p) = p.lock() {
                for (_, w) in p.drain() {
                    let _ = w.send(Err(RemoteError {
                        code: "TRANSPORT_CLOSED".into(),
                        message: "the connection closed".into(),
                    }));
                }
            }
        });
        Ok(Device {
            out,
            pending,
            inbox,
            next_id: AtomicU64::new(1),
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
        let id = self.next_id.fetch_add(1, Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut p) = self.pending.lock() {
            p.insert(id, tx);
        }
        let frame = Frame::Request {
            v: PROTOCOL_VERSION.to_owned(),
            id,
            method: method.to_owned(),
            params: Some(Payload::from(args)),
        };
        let _ = self.out.send(Message::text(frame.to_text()));
        (id, rx)
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
        if let Ok(mut p) = self.pending.lock() {
            p.insert(id, tx);
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
