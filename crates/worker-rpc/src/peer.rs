//! An async RPC peer over any transport of frames.
//!
//! One reader task dispatches incoming frames; one writer task sends ours,
//! `hello` first and nothing else until the peer's `hello` has arrived.
//! Ids: the host side uses odd ids, the worker side even ones, each
//! increasing, so a request and a stream never share an id on one
//! connection and an id is never reused.

use crate::error::{codes, RpcError, DEFAULT_MAX_CAUSE_DEPTH};
use crate::frame::*;
use crate::transport::Transport;
use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};

/// Which end of the connection this peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The trusted host: odd ids.
    Host,
    /// The isolated worker: even ids.
    Worker,
}

impl Side {
    fn first_id(self) -> Id {
        match self {
            Side::Host => 1,
            Side::Worker => 2,
        }
    }
    /// Whether `id` was allocated by this side.
    fn owns(self, id: Id) -> bool {
        (id % 2 == 1) == (self == Side::Host)
    }
}

#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Cause chains rebuilt from the wire keep at most this many links.
    pub max_cause_depth: usize,
    /// Chunks a stream receiver lets a sender have in flight.
    pub stream_window: u64,
    /// Sent in `hello`, for logs.
    pub agent: Option<String>,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            max_cause_depth: DEFAULT_MAX_CAUSE_DEPTH,
            stream_window: 16,
            agent: Some(concat!("hostwire-worker-rpc/", env!("CARGO_PKG_VERSION")).to_owned()),
        }
    }
}

/// Cancellation seen by a handler.
#[derive(Clone, Default)]
pub struct CancelToken(Arc<(AtomicBool, Notify)>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0 .0.store(true, SeqCst);
        self.0 .1.notify_waiters();
    }
    pub fn is_cancelled(&self) -> bool {
        self.0 .0.load(SeqCst)
    }
    /// Resolves once cancelled.
    pub async fn cancelled(&self) {
        loop {
            let n = self.0 .1.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            n.await;
        }
    }
}

/// What a handler gets besides its params.
pub struct Context {
    pub id: Id,
    pub method: String,
    pub cancel: CancelToken,
    pub peer: Peer,
}

impl Context {
    /// Sends a `progress` frame for this call.
    pub fn progress(&self, progress: Value) {
        if !self.cancel.is_cancelled() {
            self.peer.shared.send(Frame::Progress {
                v: PROTOCOL_VERSION.into(),
                id: self.id,
                progress,
            });
        }
    }
}

type CallHandler =
    Arc<dyn Fn(Value, Context) -> BoxFuture<'static, Result<Value, RpcError>> + Send + Sync>;
type StreamHandler = Arc<
    dyn Fn(Value, StreamReceiver, Context) -> BoxFuture<'static, Result<Value, RpcError>>
        + Send
        + Sync,
>;

#[derive(Clone)]
enum Handler {
    Call(CallHandler),
    Stream(StreamHandler),
}

#[derive(Debug, Clone, PartialEq)]
enum HelloState {
    Waiting,
    Done,
    Failed(RpcError),
}

struct PendingCall {
    reply: oneshot::Sender<Result<Value, RpcError>>,
    progress: mpsc::UnboundedSender<Value>,
}

struct OutStream {
    granted: u64,
    sent: u64,
    notify: Arc<Notify>,
    failed: Option<RpcError>,
}

enum StreamItem {
    Chunk(u64, Value),
    End(Result<(), RpcError>),
}

struct InStream {
    tx: mpsc::UnboundedSender<StreamItem>,
    granted: u64,
    received: u64,
    cancel: CancelToken,
}

#[derive(Default)]
struct State {
    closed: Option<RpcError>,
    calls: HashMap<Id, PendingCall>,
    cancelled: HashSet<Id>,
    serving: HashMap<Id, CancelToken>,
    last_peer_id: Id,
    out_streams: HashMap<Id, OutStream>,
    in_streams: HashMap<Id, InStream>,
}

/// Counters of what went wrong on the wire.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeerStats {
    pub protocol_errors: u64,
    pub unknown_ids: u64,
    pub duplicate_responses: u64,
    pub responses_after_cancel: u64,
    pub credit_violations: u64,
    pub version_mismatches: u64,
}

#[derive(Default)]
struct Stats {
    protocol_errors: AtomicU64,
    unknown_ids: AtomicU64,
    duplicate_responses: AtomicU64,
    responses_after_cancel: AtomicU64,
    credit_violations: AtomicU64,
    version_mismatches: AtomicU64,
    last_error: Mutex<Option<String>>,
}

struct Shared {
    side: Side,
    config: PeerConfig,
    next_id: AtomicU64,
    out: mpsc::UnboundedSender<Frame>,
    state: Mutex<State>,
    handlers: RwLock<HashMap<String, Handler>>,
    hello: watch::Sender<HelloState>,
    closed_tx: watch::Sender<Option<RpcError>>,
    stats: Stats,
}

/// One end of a worker RPC connection. Cheap to clone.
#[derive(Clone)]
pub struct Peer {
    shared: Arc<Shared>,
}

fn version() -> String {
    PROTOCOL_VERSION.to_owned()
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn send(&self, frame: Frame) {
        let _ = self.out.send(frame);
    }

    fn alloc_id(&self) -> Id {
        self.next_id.fetch_add(2, SeqCst)
    }

    fn protocol_error(&self, counter: &AtomicU64, message: String) {
        counter.fetch_add(1, SeqCst);
        self.stats.protocol_errors.fetch_add(1, SeqCst);
        if let Ok(mut l) = self.stats.last_error.lock() {
            *l = Some(message);
        }
    }

    fn respond(&self, id: Id, result: Result<Value, RpcError>) {
        let outcome = match result {
            Ok(v) => Outcome::Ok(v),
            Err(e) => Outcome::Err(e.to_envelope()),
        };
        self.send(Frame::Response {
            v: version(),
            id,
            outcome,
        });
    }

    /// Fails everything open with `err`; nothing more is accepted.
    fn close_all(&self, err: RpcError) {
        let mut s = lock(&self.state);
        if s.closed.is_some() {
            return;
        }
        s.closed = Some(err.clone());
        self.closed_tx.send_replace(Some(err.clone()));
        for (_, c) in s.calls.drain() {
            let _ = c.reply.send(Err(err.clone()));
        }
        for (_, t) in s.serving.drain() {
            t.cancel();
        }
        for (_, o) in s.out_streams.iter_mut() {
            o.failed = Some(err.clone());
            o.notify.notify_waiters();
            o.notify.notify_one();
        }
        for (_, i) in s.in_streams.drain() {
            i.cancel.cancel();
            let _ = i.tx.send(StreamItem::End(Err(err.clone())));
        }
        drop(s);
        self.hello.send_if_modified(|h| {
            if *h == HelloState::Waiting {
                *h = HelloState::Failed(err.clone());
                true
            } else {
                false
            }
        });
    }
}

impl Peer {
    /// Starts a peer on `transport`; it sends `hello` at once.
    pub fn new(side: Side, transport: Transport, config: PeerConfig) -> Peer {
        let (out, out_rx) = mpsc::unbounded_channel();
        let (hello, hello_rx) = watch::channel(HelloState::Waiting);
        let shared = Arc::new(Shared {
            side,
            next_id: AtomicU64::new(side.first_id()),
            out,
            state: Mutex::new(State::default()),
            handlers: RwLock::new(HashMap::new()),
            hello,
            closed_tx: watch::channel(None).0,
            stats: Stats::default(),
            config,
        });
        let peer = Peer { shared };
        let Transport { reader, writer } = transport;
        tokio::spawn(write_loop(
            Arc::clone(&peer.shared),
            writer,
            out_rx,
            hello_rx,
        ));
        tokio::spawn(read_loop(peer.clone(), reader));
        peer
    }

    /// Registers a handler for `method`.
    pub fn register<F, Fut>(&self, method: &str, handler: F)
    where
        F: Fn(Value, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, RpcError>> + Send + 'static,
    {
        let h: CallHandler = Arc::new(move |p, c| Box::pin(handler(p, c)));
        if let Ok(mut m) = self.shared.handlers.write() {
            m.insert(method.to_owned(), Handler::Call(h));
        }
    }

    /// Registers a handler for streams opened with `method`.
    pub fn register_stream<F, Fut>(&self, method: &str, handler: F)
    where
        F: Fn(Value, StreamReceiver, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, RpcError>> + Send + 'static,
    {
        let h: StreamHandler = Arc::new(move |p, r, c| Box::pin(handler(p, r, c)));
        if let Ok(mut m) = self.shared.handlers.write() {
            m.insert(method.to_owned(), Handler::Stream(h));
        }
    }

    /// Calls `method` on the other side. Dropping or cancelling the
    /// returned future sends `cancel`.
    /// The caller's handle on a request now in flight.
    fn pending_call(
        &self,
        id: u64,
        rx: oneshot::Receiver<Result<Value, RpcError>>,
        progress: mpsc::UnboundedReceiver<Value>,
    ) -> Call {
        Call {
            id,
            rx,
            peer: self.clone(),
            done: false,
            deadline: None,
            progress,
        }
    }

    pub fn call(&self, method: &str, params: Value) -> Call {
        let id = self.shared.alloc_id();
        let (reply, rx) = oneshot::channel();
        let (progress, progress_rx) = mpsc::unbounded_channel();
        {
            let mut s = lock(&self.shared.state);
            if let Some(err) = &s.closed {
                let _ = reply.send(Err(err.clone()));
            } else {
                s.calls.insert(id, PendingCall { reply, progress });
                drop(s);
                self.shared.send(Frame::Request {
                    v: version(),
                    id,
                    method: method.to_owned(),
                    params: Some(params),
                });
            }
        }
        self.pending_call(id, rx, progress_rx)
    }

    /// Opens a stream to the other side's stream handler for `method`.
    pub fn open_stream(&self, method: &str, params: Value) -> StreamSender {
        let id = self.shared.alloc_id();
        let (reply, rx) = oneshot::channel();
        let (progress, progress_rx) = mpsc::unbounded_channel();
        let notify = Arc::new(Notify::new());
        {
            let mut s = lock(&self.shared.state);
            if let Some(err) = &s.closed {
                let _ = reply.send(Err(err.clone()));
            } else {
                s.calls.insert(id, PendingCall { reply, progress });
                s.out_streams.insert(
                    id,
                    OutStream {
                        granted: 0,
                        sent: 0,
                        notify: Arc::clone(&notify),
                        failed: None,
                    },
                );
                drop(s);
                self.shared.send(Frame::StreamOpen {
                    v: version(),
                    id,
                    method: method.to_owned(),
                    params: Some(params),
                });
            }
        }
        StreamSender {
            id,
            notify,
            result: Some(self.pending_call(id, rx, progress_rx)),
            peer: self.clone(),
            ended: false,
        }
    }

    /// Resolves once the peer's `hello` has arrived (or the connection failed).
    pub async fn ready(&self) -> Result<(), RpcError> {
        let mut rx = self.shared.hello.subscribe();
        let state = rx
            .wait_for(|h| *h != HelloState::Waiting)
            .await
            .map(|h| h.clone());
        match state {
            Ok(HelloState::Done) => Ok(()),
            Ok(HelloState::Failed(e)) => Err(e),
            _ => Err(RpcError::new(
                codes::TRANSPORT_CLOSED,
                "the connection closed",
            )),
        }
    }

    /// Says goodbye: every pending call and stream fails with `GOODBYE`,
    /// the peer's fail with `PEER_GOODBYE`, and nothing more is sent.
    pub async fn goodbye(&self, reason: &str) {
        self.shared.send(Frame::Goodbye {
            v: version(),
            reason: Some(reason.to_owned()),
            error: None,
        });
        self.shared.close_all(RpcError::new(
            codes::GOODBYE,
            format!("this side said goodbye: {reason}"),
        ));
        // Let the writer flush the goodbye.
        tokio::task::yield_now().await;
    }

    /// Resolves when the connection closes, with the reason.
    pub async fn wait_closed(&self) -> RpcError {
        let mut rx = self.shared.closed_tx.subscribe();
        let seen = rx
            .wait_for(Option::is_some)
            .await
            .map(|e| e.clone())
            .ok()
            .flatten();
        seen.unwrap_or_else(|| RpcError::new(codes::TRANSPORT_CLOSED, "closed"))
    }

    /// The error the connection closed with, if it did.
    pub fn closed(&self) -> Option<RpcError> {
        lock(&self.shared.state).closed.clone()
    }

    pub fn stats(&self) -> PeerStats {
        let s = &self.shared.stats;
        PeerStats {
            protocol_errors: s.protocol_errors.load(SeqCst),
            unknown_ids: s.unknown_ids.load(SeqCst),
            duplicate_responses: s.duplicate_responses.load(SeqCst),
            responses_after_cancel: s.responses_after_cancel.load(SeqCst),
            credit_violations: s.credit_violations.load(SeqCst),
            version_mismatches: s.version_mismatches.load(SeqCst),
        }
    }

    pub fn last_protocol_error(&self) -> Option<String> {
        self.shared
            .stats
            .last_error
            .lock()
            .ok()
            .and_then(|l| l.clone())
    }

    /// Calls and streams still waiting for an answer (for leak checks).
    pub fn pending(&self) -> usize {
        let s = lock(&self.shared.state);
        s.calls.len() + s.serving.len() + s.in_streams.len()
    }

    fn cancel_call(&self, id: Id, reason: &str) {
        let mut s = lock(&self.shared.state);
        let was_pending = s.calls.remove(&id).is_some();
        s.out_streams.remove(&id);
        if was_pending && s.closed.is_none() {
            s.cancelled.insert(id);
            drop(s);
            self.shared.send(Frame::Cancel {
                v: version(),
                id,
                reason: Some(reason.to_owned()),
            });
        }
    }
}

async fn write_loop(
    shared: Arc<Shared>,
    mut writer: crate::transport::FrameSink,
    mut rx: mpsc::UnboundedReceiver<Frame>,
    mut hello: watch::Receiver<HelloState>,
) {
    let hi = Frame::Hello {
        v: version(),
        features: Vec::new(),
        agent: shared.config.agent.clone(),
    };
    if writer.send(hi.to_text()).await.is_err() {
        shared.close_all(RpcError::new(
            codes::TRANSPORT_CLOSED,
            "the transport closed before hello",
        ));
        return;
    }
    drop(shared);
    // Nothing but goodbye goes out before the peer's hello.
    let mut held: Vec<Frame> = Vec::new();
    loop {
        let state = hello.borrow().clone();
        match state {
            HelloState::Done => break,
            HelloState::Failed(_) => {
                // Only a goodbye may still go out.
                for f in held
                    .drain(..)
                    .chain(std::iter::from_fn(|| rx.try_recv().ok()))
                {
                    if matches!(f, Frame::Goodbye { .. }) {
                        let _ = writer.send(f.to_text()).await;
                    }
                }
                let _ = writer.close().await;
                return;
            }
            HelloState::Waiting => {}
        }
        tokio::select! {
            changed = hello.changed() => if changed.is_err() { return },
            f = rx.recv() => match f {
                Some(f @ Frame::Goodbye { .. }) => {
                    let _ = writer.send(f.to_text()).await;
                    let _ = writer.close().await;
                    return;
                }
                Some(f) => held.push(f),
                None => return,
            },
        }
    }
    for f in held {
        if writer.feed(f.to_text()).await.is_err() {
            return;
        }
    }
    if writer.flush().await.is_err() {
        return;
    }
    while let Some(f) = rx.recv().await {
        let bye = matches!(f, Frame::Goodbye { .. });
        if writer.feed(f.to_text()).await.is_err() {
            return;
        }
        // Batch what is already queued into one flush (not past a goodbye).
        if !bye {
            while let Ok(f) = rx.try_recv() {
                let last = matches!(f, Frame::Goodbye { .. });
                if writer.feed(f.to_text()).await.is_err() {
                    return;
                }
                if last {
                    let _ = writer.flush().await;
                    let _ = writer.close().await;
                    return;
                }
            }
        }
        if writer.flush().await.is_err() {
            return;
        }
        if bye {
            let _ = writer.close().await;
            return;
        }
    }
}

async fn read_loop(peer: Peer, mut reader: crate::transport::FrameStream) {
    let shared = Arc::clone(&peer.shared);
    loop {
        let text = match reader.next().await {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                shared.close_all(RpcError::new(
                    codes::TRANSPORT_CLOSED,
                    format!("the transport failed: {e}"),
                ));
                return;
            }
            None => {
                shared.close_all(RpcError::new(
                    codes::TRANSPORT_CLOSED,
                    "the transport closed without goodbye",
                ));
                return;
            }
        };
        if lock(&shared.state).closed.is_some() {
            return;
        }
        match parse_frame(&text) {
            Ok(frame) => {
                if !dispatch(&peer, frame) {
                    return;
                }
            }
            Err(e) => {
                let message = format!("malformed frame: {e}");
                shared.protocol_error(&shared.stats.protocol_errors, message.clone());
                // Balance: protocol_error counted it twice.
                shared.stats.protocol_errors.fetch_sub(1, SeqCst);
                if let (Some(id), Some("request" | "stream-open")) = (e.id, e.kind.as_deref()) {
                    if !shared.side.owns(id) {
                        shared.respond(id, Err(RpcError::new(codes::PROTOCOL_ERROR, message)));
                    }
                }
            }
        }
    }
}

/// Handles one frame; `false` stops the reader.
fn dispatch(peer: &Peer, frame: Frame) -> bool {
    let shared = &peer.shared;
    if !frame.is_compatible() {
        shared.stats.version_mismatches.fetch_add(1, SeqCst);
        let err = RpcError::new(
            codes::VERSION_MISMATCH,
            format!(
                "the peer speaks {}; this side speaks {PROTOCOL_VERSION}",
                frame.version()
            ),
        );
        match frame {
            Frame::Hello { .. } => {
                shared.send(Frame::Goodbye {
                    v: version(),
                    reason: Some("version mismatch".into()),
                    error: Some(err.to_envelope()),
                });
                shared.close_all(err);
                return false;
            }
            Frame::Request { id, .. } | Frame::StreamOpen { id, .. } => {
                shared.respond(id, Err(err))
            }
            _ => {}
        }
        return true;
    }
    match frame {
        Frame::Hello { .. } => {
            shared.hello.send_if_modified(|h| {
                if *h == HelloState::Waiting {
                    *h = HelloState::Done;
                    true
                } else {
                    false
                }
            });
        }
        Frame::Goodbye { reason, error, .. } => {
            let mut err = RpcError::new(
                codes::PEER_GOODBYE,
                format!(
                    "the peer said goodbye: {}",
                    reason.as_deref().unwrap_or("no reason given")
                ),
            );
            if let Some(e) = error {
                err = err.with_cause(RpcError::from_envelope(&e, shared.config.max_cause_depth));
            }
            shared.close_all(err);
            return false;
        }
        Frame::Request {
            id, method, params, ..
        } => {
            if let Some(token) = accept_peer_id(shared, id) {
                serve_call(peer, id, method, params.unwrap_or(Value::Null), token);
            }
        }
        Frame::StreamOpen {
            id, method, params, ..
        } => {
            if let Some(token) = accept_peer_id(shared, id) {
                serve_stream(peer, id, method, params.unwrap_or(Value::Null), token);
            }
        }
        Frame::Response { id, outcome, .. } => {
            let mut s = lock(&shared.state);
            if let Some(call) = s.calls.remove(&id) {
                // A stream's receiver answered: a sender waiting for credit
                // wakes up and finds the stream gone.
                if let Some(o) = s.out_streams.remove(&id) {
                    o.notify.notify_waiters();
                    o.notify.notify_one();
                }
                drop(s);
                let result = match outcome {
                    Outcome::Ok(v) => Ok(v),
                    Outcome::Err(e) => {
                        Err(RpcError::from_envelope(&e, shared.config.max_cause_depth))
                    }
                };
                let _ = call.reply.send(result);
            } else if s.cancelled.remove(&id) {
                shared.stats.responses_after_cancel.fetch_add(1, SeqCst);
            } else if shared.side.owns(id) && id < shared.next_id.load(SeqCst) {
                drop(s);
                shared.protocol_error(
                    &shared.stats.duplicate_responses,
                    format!("a second response to {id}"),
                );
            } else {
                drop(s);
                shared.protocol_error(
                    &shared.stats.unknown_ids,
                    format!("a response to unknown id {id}"),
                );
            }
        }
        Frame::Cancel { id, .. } => {
            let s = lock(&shared.state);
            if let Some(t) = s.serving.get(&id) {
                t.cancel();
            }
            if let Some(i) = s.in_streams.get(&id) {
                i.cancel.cancel();
                let _ = i.tx.send(StreamItem::End(Err(RpcError::new(
                    codes::CANCELLED,
                    "the sender cancelled the stream",
                ))));
            }
        }
        Frame::Progress { id, progress, .. } => {
            let s = lock(&shared.state);
            match s.calls.get(&id) {
                Some(c) => {
                    let _ = c.progress.send(progress);
                }
                None if s.cancelled.contains(&id) => {}
                None => {
                    drop(s);
                    shared.protocol_error(
                        &shared.stats.unknown_ids,
                        format!("progress for unknown id {id}"),
                    );
                }
            }
        }
        Frame::StreamChunk { id, seq, data, .. } => {
            let mut s = lock(&shared.state);
            let Some(st) = s.in_streams.get_mut(&id) else {
                drop(s);
                // Chunks after the receiver finished are late, not wrong.
                if shared.side.owns(id) || id > lock(&shared.state).last_peer_id {
                    shared.protocol_error(
                        &shared.stats.unknown_ids,
                        format!("a chunk for unknown stream {id}"),
                    );
                }
                return true;
            };
            let violation = if seq != st.received + 1 {
                Some((
                    codes::PROTOCOL_ERROR,
                    format!("chunk {seq} out of order (expected {})", st.received + 1),
                    false,
                ))
            } else if seq > st.granted {
                Some((
                    codes::STREAM_CREDIT_EXCEEDED,
                    format!("chunk {seq} is beyond the {} granted", st.granted),
                    true,
                ))
            } else {
                None
            };
            match violation {
                None => {
                    st.received = seq;
                    let _ = st.tx.send(StreamItem::Chunk(seq, data));
                }
                Some((code, message, credit)) => {
                    let st = s.in_streams.remove(&id);
                    s.serving.remove(&id);
                    drop(s);
                    let err = RpcError::new(code, message.clone());
                    if let Some(st) = st {
                        st.cancel.cancel();
                        let _ = st.tx.send(StreamItem::End(Err(err.clone())));
                    }
                    let counter = if credit {
                        &shared.stats.credit_violations
                    } else {
                        &shared.stats.protocol_errors
                    };
                    shared.protocol_error(counter, message);
                    if !credit {
                        shared.stats.protocol_errors.fetch_sub(1, SeqCst);
                    }
                    shared.respond(id, Err(err));
                }
            }
        }
        Frame::StreamEnd { id, outcome, .. } => {
            let mut s = lock(&shared.state);
            if let Some(st) = s.in_streams.remove(&id) {
                let end = match outcome {
                    Outcome::Ok(_) => Ok(()),
                    Outcome::Err(e) => {
                        Err(RpcError::from_envelope(&e, shared.config.max_cause_depth))
                    }
                };
                let _ = st.tx.send(StreamItem::End(end));
            }
        }
        Frame::StreamAck { id, credit, .. } => {
            let mut s = lock(&shared.state);
            if let Some(o) = s.out_streams.get_mut(&id) {
                o.granted = o.granted.saturating_add(credit);
                o.notify.notify_waiters();
                o.notify.notify_one();
            }
        }
    }
    true
}

/// A new id from the peer: its parity and strictly increasing.
fn accept_peer_id(shared: &Shared, id: Id) -> Option<CancelToken> {
    let mut s = lock(&shared.state);
    if shared.side.owns(id) || id <= s.last_peer_id {
        drop(s);
        let why = if shared.side.owns(id) {
            "has this side's parity"
        } else {
            "was already used"
        };
        shared.protocol_error(&shared.stats.unknown_ids, format!("id {id} {why}"));
        shared.respond(
            id,
            Err(RpcError::new(
                codes::PROTOCOL_ERROR,
                format!("id {id} {why}"),
            )),
        );
        return None;
    }
    s.last_peer_id = id;
    let token = CancelToken::default();
    s.serving.insert(id, token.clone());
    Some(token)
}

fn lookup(shared: &Shared, method: &str) -> Option<Handler> {
    shared.handlers.read().ok()?.get(method).cloned()
}

fn finish_serving(shared: &Shared, id: Id, result: Result<Value, RpcError>, cancel: &CancelToken) {
    let mut s = lock(&shared.state);
    let still = s.serving.remove(&id).is_some();
    s.in_streams.remove(&id);
    let closed = s.closed.is_some();
    drop(s);
    if closed || !still {
        return;
    }
    // A cancelled call is answered CANCELLED, so both sides forget it.
    let result = if cancel.is_cancelled() {
        Err(RpcError::new(codes::CANCELLED, "cancelled by the caller"))
    } else {
        result
    };
    shared.respond(id, result);
}

fn serve_call(peer: &Peer, id: Id, method: String, params: Value, cancel: CancelToken) {
    let shared = Arc::clone(&peer.shared);
    let handler = match lookup(&shared, &method) {
        Some(Handler::Call(h)) => h,
        Some(Handler::Stream(_)) => {
            finish_serving(
                &shared,
                id,
                Err(RpcError::new(
                    codes::UNKNOWN_METHOD,
                    format!("{method:?} takes a stream, not a call"),
                )),
                &cancel,
            );
            return;
        }
        None => {
            finish_serving(
                &shared,
                id,
                Err(RpcError::new(
                    codes::UNKNOWN_METHOD,
                    format!("no method {method:?}"),
                )),
                &cancel,
            );
            return;
        }
    };
    spawn_handler(peer, id, method, cancel, move |ctx| handler(params, ctx));
}

/// Runs a handler with its context and answers with what it returns.
fn spawn_handler<F>(peer: &Peer, id: Id, method: String, cancel: CancelToken, run: F)
where
    F: FnOnce(Context) -> BoxFuture<'static, Result<Value, RpcError>>,
{
    let shared = Arc::clone(&peer.shared);
    let ctx = Context {
        id,
        method,
        cancel: cancel.clone(),
        peer: peer.clone(),
    };
    let fut = run(ctx);
    tokio::spawn(async move {
        let result = fut.await;
        finish_serving(&shared, id, result, &cancel);
    });
}

fn serve_stream(peer: &Peer, id: Id, method: String, params: Value, cancel: CancelToken) {
    let shared = Arc::clone(&peer.shared);
    let handler = match lookup(&shared, &method) {
        Some(Handler::Stream(h)) => h,
        _ => {
            finish_serving(
                &shared,
                id,
                Err(RpcError::new(
                    codes::UNKNOWN_METHOD,
                    format!("no stream method {method:?}"),
                )),
                &cancel,
            );
            return;
        }
    };
    let window = shared.config.stream_window.max(1);
    let (tx, rx) = mpsc::unbounded_channel();
    lock(&shared.state).in_streams.insert(
        id,
        InStream {
            tx,
            granted: window,
            received: 0,
            cancel: cancel.clone(),
        },
    );
    shared.send(Frame::StreamAck {
        v: version(),
        id,
        ack: 0,
        credit: window,
    });
    let receiver = StreamReceiver {
        id,
        rx,
        peer: peer.clone(),
        unacked: 0,
        last_seq: 0,
        window,
        done: false,
    };
    spawn_handler(peer, id, method, cancel, move |ctx| {
        handler(params, receiver, ctx)
    });
}

/// A pending call: resolves once with the result. Dropping it before then
/// sends `cancel`.
pub struct Call {
    id: Id,
    rx: oneshot::Receiver<Result<Value, RpcError>>,
    peer: Peer,
    done: bool,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    progress: mpsc::UnboundedReceiver<Value>,
}

impl Call {
    pub fn id(&self) -> Id {
        self.id
    }

    /// Fails with `TIMEOUT` (and sends `cancel`) if no answer comes in time.
    pub fn timeout(mut self, after: Duration) -> Call {
        self.deadline = Some(Box::pin(tokio::time::sleep(after)));
        self
    }

    /// Cancels the call: `cancel` goes to the handler; the call resolves no more.
    pub fn cancel(mut self) {
        self.done = true;
        self.peer.cancel_call(self.id, "cancelled by the caller");
    }

    /// The next `progress` value, or `None` once the call is over.
    pub async fn next_progress(&mut self) -> Option<Value> {
        if self.done {
            return None;
        }
        tokio::select! {
            biased;
            p = self.progress.recv() => p,
            _ = &mut self.rx => None,
        }
    }
}

impl Future for Call {
    type Output = Result<Value, RpcError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        if self.done {
            return Poll::Ready(Err(RpcError::new(
                codes::CANCELLED,
                "the call was already resolved or cancelled",
            )));
        }
        if let Poll::Ready(r) = Pin::new(&mut self.rx).poll(cx) {
            self.done = true;
            return Poll::Ready(r.unwrap_or_else(|_| {
                Err(RpcError::new(codes::TRANSPORT_CLOSED, "the peer went away"))
            }));
        }
        if let Some(d) = self.deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                self.done = true;
                let id = self.id;
                self.peer.cancel_call(id, "timeout");
                return Poll::Ready(Err(RpcError::new(
                    codes::TIMEOUT,
                    "no answer before the deadline",
                )));
            }
        }
        Poll::Pending
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.done {
            self.peer
                .cancel_call(self.id, "the caller dropped the call");
        }
    }
}

/// The sending end of a stream. `send` waits for credit.
pub struct StreamSender {
    id: Id,
    notify: Arc<Notify>,
    result: Option<Call>,
    peer: Peer,
    ended: bool,
}

impl StreamSender {
    pub fn id(&self) -> Id {
        self.id
    }

    /// Chunks sent and not yet acknowledged never exceed the credit granted.
    pub async fn send(&mut self, data: Value) -> Result<(), RpcError> {
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let mut s = lock(&self.peer.shared.state);
                if let Some(err) = s.closed.clone() {
                    return Err(err);
                }
                let Some(o) = s.out_streams.get_mut(&self.id) else {
                    return Err(RpcError::new(
                        codes::CANCELLED,
                        "the receiver ended the stream",
                    ));
                };
                if let Some(err) = o.failed.clone() {
                    return Err(err);
                }
                if o.sent < o.granted {
                    o.sent += 1;
                    let seq = o.sent;
                    drop(s);
                    self.peer.shared.send(Frame::StreamChunk {
                        v: version(),
                        id: self.id,
                        seq,
                        data,
                    });
                    return Ok(());
                }
            }
            n.await;
        }
    }

    /// Chunks that may still be sent without waiting.
    pub fn credit(&self) -> u64 {
        let s = lock(&self.peer.shared.state);
        s.out_streams
            .get(&self.id)
            .map_or(0, |o| o.granted.saturating_sub(o.sent))
    }

    /// Ends the stream and waits for the receiver's result.
    pub async fn finish(mut self) -> Result<Value, RpcError> {
        self.ended = true;
        self.peer.shared.send(Frame::StreamEnd {
            v: version(),
            id: self.id,
            outcome: Outcome::Ok(Value::Null),
        });
        match self.result.take() {
            Some(call) => call.await,
            None => Err(RpcError::new(codes::CANCELLED, "already finished")),
        }
    }

    /// Ends the stream with an error.
    pub fn abort(mut self, err: RpcError) {
        self.ended = true;
        self.peer.shared.send(Frame::StreamEnd {
            v: version(),
            id: self.id,
            outcome: Outcome::Err(err.to_envelope()),
        });
        if let Some(mut call) = self.result.take() {
            call.done = true;
            let mut s = lock(&self.peer.shared.state);
            s.calls.remove(&self.id);
            s.out_streams.remove(&self.id);
            s.cancelled.insert(self.id);
        }
    }
}

impl Drop for StreamSender {
    fn drop(&mut self) {
        if !self.ended {
            // The result call's own drop sends `cancel`.
            self.result.take();
        }
    }
}

/// The receiving end of a stream, given to a stream handler.
pub struct StreamReceiver {
    id: Id,
    rx: mpsc::UnboundedReceiver<StreamItem>,
    peer: Peer,
    unacked: u64,
    last_seq: u64,
    window: u64,
    done: bool,
}

impl StreamReceiver {
    /// The next chunk; `None` after the sender's ok end; an error if the
    /// sender aborted, cancelled or went away.
    pub async fn next(&mut self) -> Option<Result<Value, RpcError>> {
        if self.done {
            return None;
        }
        match self.rx.recv().await {
            Some(StreamItem::Chunk(seq, data)) => {
                self.last_seq = seq;
                self.unacked += 1;
                // Grant credit back in batches of half the window.
                if self.unacked >= (self.window / 2).max(1) {
                    let credit = std::mem::take(&mut self.unacked);
                    let mut s = lock(&self.peer.shared.state);
                    if let Some(st) = s.in_streams.get_mut(&self.id) {
                        st.granted += credit;
                        drop(s);
                        self.peer.shared.send(Frame::StreamAck {
                            v: version(),
                            id: self.id,
                            ack: seq,
                            credit,
                        });
                    }
                }
                Some(Ok(data))
            }
            Some(StreamItem::End(Ok(()))) | None => {
                self.done = true;
                None
            }
            Some(StreamItem::End(Err(e))) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
