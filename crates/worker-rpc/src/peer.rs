//! An async RPC peer over any transport of frames.
//!
//! One reader task dispatches incoming frames; one writer task sends ours,
//! `hello` first and nothing else until the peer's `hello` has arrived.
//!
//! Ids: each side numbers its own requests and streams (this one 1, 2, 3,
//! …). Which side allocated an id follows from the frame's kind, so the
//! peer may use any integer in 0..=2^53−1 that it does not have in flight
//! already. Every call ends: with its result, its error, `CANCELLED`, a
//! timeout, or the error the connection closed with. Every queue has a
//! bound in [`PeerConfig`].

use crate::error::{codes, RpcError, DEFAULT_MAX_CAUSE_DEPTH};
use crate::frame::*;
use crate::transport::{Inbound, Transport};
use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedSemaphorePermit, Semaphore};

/// Which end of the connection this peer is (for logs: the rules are the
/// same for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The trusted host.
    Host,
    /// The isolated worker.
    Worker,
}

/// Default of [`PeerConfig::max_inbound_calls`].
pub const DEFAULT_MAX_INBOUND_CALLS: usize = 256;
/// Default of [`PeerConfig::max_outbound_calls`].
pub const DEFAULT_MAX_OUTBOUND_CALLS: usize = 256;
/// Default of [`PeerConfig::max_outbound_bytes`].
pub const DEFAULT_MAX_OUTBOUND_BYTES: usize = 2 * MAX_FRAME_BYTES;
/// Default of [`PeerConfig::max_held_frames`].
pub const DEFAULT_MAX_HELD_FRAMES: usize = 1024;
/// Default of [`PeerConfig::max_progress_queued`].
pub const DEFAULT_MAX_PROGRESS_QUEUED: usize = 64;
/// Default of [`PeerConfig::write_timeout`].
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`PeerConfig::stream_window`].
pub const DEFAULT_STREAM_WINDOW: u64 = 16;

#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Cause chains rebuilt from the wire, and sent, keep at most this many
    /// links.
    pub max_cause_depth: usize,
    /// Chunks a stream receiver lets a sender have in flight (and so the
    /// most chunks buffered per incoming stream).
    pub stream_window: u64,
    /// Sent in `hello`, for logs.
    pub agent: Option<String>,
    /// The largest frame sent (and accepted from a transport that does not
    /// bound it itself). A response, chunk or progress over it fails alone.
    pub max_frame_bytes: usize,
    /// The peer's requests and streams served at once; one more is answered
    /// `TOO_MANY_CALLS`.
    pub max_inbound_calls: usize,
    /// This side's calls and streams in flight (cancelled ones count until
    /// the peer answers them); one more fails at once with `TOO_MANY_CALLS`.
    pub max_outbound_calls: usize,
    /// Bytes of responses, chunks, acks and progress queued for the writer;
    /// senders wait for room (back-pressure). Requests, cancels and the
    /// goodbye, bounded by `max_outbound_calls`, never wait.
    pub max_outbound_bytes: usize,
    /// Frames held back until the peer's `hello`; one more ends the
    /// connection with a `PROTOCOL_ERROR` goodbye.
    pub max_held_frames: usize,
    /// `progress` values queued per call for a caller that does not read
    /// them; more are dropped (and counted).
    pub max_progress_queued: usize,
    /// How long one write (or flush) may wait for the peer to read; past
    /// it the connection ends with `WRITE_TIMEOUT` (a goodbye is tried).
    pub write_timeout: Duration,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            max_cause_depth: DEFAULT_MAX_CAUSE_DEPTH,
            stream_window: DEFAULT_STREAM_WINDOW,
            agent: Some(concat!("hostwire-worker-rpc/", env!("CARGO_PKG_VERSION")).to_owned()),
            max_frame_bytes: MAX_FRAME_BYTES,
            max_inbound_calls: DEFAULT_MAX_INBOUND_CALLS,
            max_outbound_calls: DEFAULT_MAX_OUTBOUND_CALLS,
            max_outbound_bytes: DEFAULT_MAX_OUTBOUND_BYTES,
            max_held_frames: DEFAULT_MAX_HELD_FRAMES,
            max_progress_queued: DEFAULT_MAX_PROGRESS_QUEUED,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
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
    /// Sends a `progress` frame for this call. Fails (and sends nothing)
    /// when the value is over the frame limit or the outbound queue is
    /// full: progress is advisory and never waits.
    pub fn progress(&self, progress: impl Into<Payload>) -> Result<(), RpcError> {
        if self.cancel.is_cancelled() {
            return Err(RpcError::new(codes::CANCELLED, "the call was cancelled"));
        }
        let frame = Frame::Progress {
            v: version(),
            id: self.id,
            progress: progress.into(),
        };
        let text = self.peer.shared.encode(&frame)?;
        let permit = self.peer.shared.try_permit(text.len()).ok_or_else(|| {
            RpcError::new(
                codes::TOO_MANY_CALLS,
                "the outbound queue is full; progress dropped",
            )
        })?;
        self.peer.shared.push(text, Kind::Progress, Some(permit));
        Ok(())
    }
}

type CallHandler =
    Arc<dyn Fn(Payload, Context) -> BoxFuture<'static, Result<Payload, RpcError>> + Send + Sync>;
type StreamHandler = Arc<
    dyn Fn(Payload, StreamReceiver, Context) -> BoxFuture<'static, Result<Payload, RpcError>>
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
    reply: oneshot::Sender<Result<Payload, RpcError>>,
    progress: mpsc::Sender<Payload>,
}

struct OutStream {
    granted: u64,
    sent: u64,
    notify: Arc<Notify>,
    failed: Option<RpcError>,
}

enum StreamItem {
    Chunk(u64, Payload),
    End(Result<(), RpcError>),
}

struct InStream {
    /// Bounded by the credit window: a chunk beyond `granted` is a
    /// protocol error and never queued.
    tx: mpsc::UnboundedSender<StreamItem>,
    granted: u64,
    received: u64,
    cancel: CancelToken,
}

#[derive(Default)]
struct State {
    closed: Option<RpcError>,
    /// This side's requests and streams waiting for their response.
    calls: HashMap<Id, PendingCall>,
    /// This side's cancelled calls whose late response is still due.
    cancelled: HashSet<Id>,
    /// The peer's requests and streams being handled here.
    serving: HashMap<Id, CancelToken>,
    out_streams: HashMap<Id, OutStream>,
    in_streams: HashMap<Id, InStream>,
}

/// Counters of what went wrong on the wire.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeerStats {
    /// Malformed frames, chunks out of order, and frames that break a rule.
    pub protocol_errors: u64,
    pub unknown_ids: u64,
    pub duplicate_responses: u64,
    pub responses_after_cancel: u64,
    pub credit_violations: u64,
    pub version_mismatches: u64,
    /// Requests and stream-opens whose id was already in flight (dropped).
    pub duplicate_ids: u64,
    /// Requests and stream-opens answered `TOO_MANY_CALLS`.
    pub calls_refused: u64,
    /// `progress` values dropped for a caller that did not read them.
    pub progress_dropped: u64,
}

#[derive(Default)]
struct Stats {
    protocol_errors: AtomicU64,
    unknown_ids: AtomicU64,
    duplicate_responses: AtomicU64,
    responses_after_cancel: AtomicU64,
    credit_violations: AtomicU64,
    version_mismatches: AtomicU64,
    duplicate_ids: AtomicU64,
    calls_refused: AtomicU64,
    progress_dropped: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// What goes to the writer task.
enum Out {
    Frame {
        text: String,
        kind: Kind,
        _permit: Option<OwnedSemaphorePermit>,
    },
    /// Finish: flush, close the transport, stop.
    Close,
}

struct Shared {
    side: Side,
    config: PeerConfig,
    next_id: AtomicU64,
    /// Bounded in bytes by `budget`: a frame is queued only after its size
    /// is taken from it (back-pressure, then the write timeout).
    out: mpsc::UnboundedSender<Out>,
    /// Room in the outbound queue, in bytes.
    budget: Arc<Semaphore>,
    state: Mutex<State>,
    handlers: RwLock<HashMap<String, Handler>>,
    hello: watch::Sender<HelloState>,
    closed_tx: watch::Sender<Option<RpcError>>,
    writer_done: watch::Sender<bool>,
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

fn protocol_err(message: impl Into<String>) -> RpcError {
    RpcError::new(codes::PROTOCOL_ERROR, message)
}

impl Shared {
    /// The frame as text, if the peer can accept it (size and depth).
    fn encode(&self, frame: &Frame) -> Result<String, RpcError> {
        let text = frame.to_text();
        if text.len() > self.config.max_frame_bytes {
            return Err(RpcError::new(
                codes::FRAME_TOO_LARGE,
                format!(
                    "the {} frame is {} bytes; the limit is {}",
                    frame.kind(),
                    text.len(),
                    self.config.max_frame_bytes
                ),
            ));
        }
        if hostwire_core::json::nesting_depth(text.as_bytes(), MAX_FRAME_DEPTH) > MAX_FRAME_DEPTH {
            return Err(RpcError::new(
                codes::FRAME_TOO_LARGE,
                format!(
                    "the {} frame nests deeper than {MAX_FRAME_DEPTH} levels",
                    frame.kind()
                ),
            ));
        }
        Ok(text)
    }

    fn charge(&self, len: usize) -> u32 {
        len.clamp(1, self.config.max_outbound_bytes.max(1))
            .min(u32::MAX as usize) as u32
    }

    fn try_permit(&self, len: usize) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.budget)
            .try_acquire_many_owned(self.charge(len))
            .ok()
    }

    fn push(&self, text: String, kind: Kind, permit: Option<OwnedSemaphorePermit>) {
        let _ = self.out.send(Out::Frame {
            text,
            kind,
            _permit: permit,
        });
    }

    /// Queues a frame that never waits (requests, cancels, the goodbye:
    /// their number is bounded by the calls in flight).
    fn send_now(&self, frame: &Frame) -> Result<(), RpcError> {
        let text = self.encode(frame)?;
        let permit = self.try_permit(text.len());
        self.push(text, frame.kind_of(), permit);
        Ok(())
    }

    /// Queues a frame once the outbound queue has room for it.
    async fn send_wait(&self, frame: &Frame) -> Result<(), RpcError> {
        let text = self.encode(frame)?;
        self.send_text_wait(text, frame.kind_of()).await
    }

    async fn send_text_wait(&self, text: String, kind: Kind) -> Result<(), RpcError> {
        let permit = Arc::clone(&self.budget)
            .acquire_many_owned(self.charge(text.len()))
            .await
            .map_err(|_| self.closed_error())?;
        self.push(text, kind, Some(permit));
        Ok(())
    }

    fn closed_error(&self) -> RpcError {
        lock(&self.state)
            .closed
            .clone()
            .unwrap_or_else(|| RpcError::new(codes::TRANSPORT_CLOSED, "the connection closed"))
    }

    fn alloc_id(&self) -> Result<Id, RpcError> {
        let id = self.next_id.fetch_add(1, SeqCst);
        if id > MAX_ID {
            return Err(RpcError::new(
                codes::TOO_MANY_CALLS,
                "every id of this connection is used",
            ));
        }
        Ok(id)
    }

    fn count(&self, counter: &AtomicU64, message: String) {
        counter.fetch_add(1, SeqCst);
        if let Ok(mut l) = self.stats.last_error.lock() {
            *l = Some(message);
        }
    }

    fn protocol_error(&self, counter: &AtomicU64, message: String) {
        self.stats.protocol_errors.fetch_add(1, SeqCst);
        self.count(counter, message);
    }

    /// The response frame for `result`, falling back to an error response
    /// when the answer itself cannot be sent (too large or too deep).
    fn response_text(&self, id: Id, result: Result<Payload, RpcError>) -> String {
        let outcome = match result {
            Ok(v) => Outcome::Ok(v),
            Err(e) => Outcome::Err(e.to_envelope_bounded(self.config.max_cause_depth)),
        };
        let frame = Frame::Response {
            v: version(),
            id,
            outcome,
        };
        match self.encode(&frame) {
            Ok(t) => t,
            Err(e) => Frame::Response {
                v: version(),
                id,
                outcome: Outcome::Err(ErrorEnvelope::new(e.code, e.message)),
            }
            .to_text(),
        }
    }

    async fn respond(&self, id: Id, result: Result<Payload, RpcError>) {
        let text = self.response_text(id, result);
        let _ = self.send_text_wait(text, Kind::Response).await;
    }

    /// Says goodbye with `err` and closes: for failures of the connection
    /// as a whole.
    fn goodbye_and_close(&self, reason: &str, err: RpcError) {
        if lock(&self.state).closed.is_some() {
            return;
        }
        let _ = self.send_now(&Frame::Goodbye {
            v: version(),
            reason: Some(reason.to_owned()),
            error: Some(err.to_envelope_bounded(self.config.max_cause_depth)),
        });
        self.close_all(err);
    }

    /// Fails everything open with `err`; nothing more is accepted, and the
    /// writer finishes what is queued before it (a goodbye) and closes.
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
        s.cancelled.clear();
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
        // Senders waiting for room fail with the closing error.
        self.budget.close();
        let _ = self.out.send(Out::Close);
        self.hello.send_if_modified(|h| {
            if *h == HelloState::Waiting {
                *h = HelloState::Failed(err.clone());
                true
            } else {
                false
            }
        });
    }

    /// Fails one of this side's calls (and its stream). Unless the peer
    /// has already answered it (`answered`), tells the peer to stop with
    /// `cancel` and expects its late response.
    fn fail_call(&self, id: Id, err: RpcError, answered: bool) -> bool {
        let mut s = lock(&self.state);
        let Some(call) = s.calls.remove(&id) else {
            return false;
        };
        if let Some(o) = s.out_streams.remove(&id) {
            o.notify.notify_waiters();
            o.notify.notify_one();
        }
        if !answered {
            s.cancelled.insert(id);
        }
        drop(s);
        let _ = call.reply.send(Err(err));
        if answered {
            return true;
        }
        let _ = self.send_now(&Frame::Cancel {
            v: version(),
            id,
            reason: Some("protocol error".into()),
        });
        true
    }

    /// Ends one of the peer's calls or streams here with `err`: the handler
    /// is cancelled and the peer gets `err` as the response.
    async fn end_serving(&self, id: Id, err: RpcError) -> bool {
        let (token, stream) = {
            let mut s = lock(&self.state);
            (s.serving.remove(&id), s.in_streams.remove(&id))
        };
        let Some(token) = token else {
            return false;
        };
        token.cancel();
        if let Some(st) = stream {
            let _ = st.tx.send(StreamItem::End(Err(err.clone())));
        }
        self.respond(id, Err(err)).await;
        true
    }
}

impl Peer {
    /// Starts a peer on `transport`; it sends `hello` at once.
    pub fn new(side: Side, transport: Transport, config: PeerConfig) -> Peer {
        let (out, out_rx) = mpsc::unbounded_channel();
        let (hello, hello_rx) = watch::channel(HelloState::Waiting);
        let shared = Arc::new(Shared {
            side,
            next_id: AtomicU64::new(1),
            out,
            budget: Arc::new(Semaphore::new(config.max_outbound_bytes.max(1))),
            state: Mutex::new(State::default()),
            handlers: RwLock::new(HashMap::new()),
            hello,
            closed_tx: watch::channel(None).0,
            writer_done: watch::channel(false).0,
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

    pub fn side(&self) -> Side {
        self.shared.side
    }

    pub fn config(&self) -> &PeerConfig {
        &self.shared.config
    }

    /// Registers a handler for `method`.
    pub fn register<F, Fut, R>(&self, method: &str, handler: F)
    where
        F: Fn(Payload, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
        R: Into<Payload>,
    {
        let h: CallHandler = Arc::new(move |p, c| {
            let fut = handler(p, c);
            Box::pin(async move { fut.await.map(Into::into) })
        });
        if let Ok(mut m) = self.shared.handlers.write() {
            m.insert(method.to_owned(), Handler::Call(h));
        }
    }

    /// Registers a handler for streams opened with `method`.
    pub fn register_stream<F, Fut, R>(&self, method: &str, handler: F)
    where
        F: Fn(Payload, StreamReceiver, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
        R: Into<Payload>,
    {
        let h: StreamHandler = Arc::new(move |p, r, c| {
            let fut = handler(p, r, c);
            Box::pin(async move { fut.await.map(Into::into) })
        });
        if let Ok(mut m) = self.shared.handlers.write() {
            m.insert(method.to_owned(), Handler::Stream(h));
        }
    }

    /// The caller's handle on a request now in flight.
    fn pending_call(
        &self,
        id: u64,
        rx: oneshot::Receiver<Result<Payload, RpcError>>,
        progress: mpsc::Receiver<Payload>,
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

    /// Registers a call of `kind` and queues its frame; a call that cannot
    /// start resolves at once with why.
    fn start(&self, kind: Kind, method: &str, params: Payload) -> (Call, Option<Arc<Notify>>) {
        let (reply, rx) = oneshot::channel();
        let (progress, progress_rx) = mpsc::channel(self.shared.config.max_progress_queued.max(1));
        let id = match self.shared.alloc_id() {
            Ok(id) => id,
            Err(e) => {
                let _ = reply.send(Err(e));
                return (self.pending_call(0, rx, progress_rx), None);
            }
        };
        let frame = match kind {
            Kind::StreamOpen => Frame::StreamOpen {
                v: version(),
                id,
                method: method.to_owned(),
                params: Some(params),
            },
            _ => Frame::Request {
                v: version(),
                id,
                method: method.to_owned(),
                params: Some(params),
            },
        };
        let call = self.pending_call(id, rx, progress_rx);
        let text = match self.shared.encode(&frame) {
            Ok(t) => t,
            Err(e) => {
                let _ = reply.send(Err(e));
                return (call, None);
            }
        };
        let mut s = lock(&self.shared.state);
        if let Some(err) = &s.closed {
            let _ = reply.send(Err(err.clone()));
            return (call, None);
        }
        let in_flight = s.calls.len() + s.cancelled.len();
        if in_flight >= self.shared.config.max_outbound_calls {
            drop(s);
            let _ = reply.send(Err(RpcError::new(
                codes::TOO_MANY_CALLS,
                format!(
                    "{in_flight} calls in flight; the limit is {}",
                    self.shared.config.max_outbound_calls
                ),
            )));
            return (call, None);
        }
        s.calls.insert(id, PendingCall { reply, progress });
        let notify = (kind == Kind::StreamOpen).then(|| {
            let notify = Arc::new(Notify::new());
            s.out_streams.insert(
                id,
                OutStream {
                    granted: 0,
                    sent: 0,
                    notify: Arc::clone(&notify),
                    failed: None,
                },
            );
            notify
        });
        drop(s);
        let permit = self.shared.try_permit(text.len());
        self.shared.push(text, kind, permit);
        (call, notify)
    }

    /// Calls `method` on the other side. Dropping or cancelling the
    /// returned future sends `cancel`.
    pub fn call(&self, method: &str, params: impl Into<Payload>) -> Call {
        self.start(Kind::Request, method, params.into()).0
    }

    /// Opens a stream to the other side's stream handler for `method`.
    pub fn open_stream(&self, method: &str, params: impl Into<Payload>) -> StreamSender {
        let (call, notify) = self.start(Kind::StreamOpen, method, params.into());
        StreamSender {
            id: call.id,
            notify: notify.unwrap_or_default(),
            result: Some(call),
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
    /// Returns once the goodbye is flushed and the transport closed (or the
    /// write timeout passed).
    pub async fn goodbye(&self, reason: &str) {
        if lock(&self.shared.state).closed.is_none() {
            let _ = self.shared.send_now(&Frame::Goodbye {
                v: version(),
                reason: Some(reason.to_owned()),
                error: None,
            });
            self.shared.close_all(RpcError::new(
                codes::GOODBYE,
                format!("this side said goodbye: {reason}"),
            ));
        }
        self.flushed().await;
    }

    /// Resolves once the writer has finished: everything queued before the
    /// close (a goodbye included) is written and the transport closed.
    async fn flushed(&self) {
        let mut rx = self.shared.writer_done.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Resolves when the connection has closed, with the reason, after the
    /// last frame (a goodbye) is flushed: a process may exit then.
    pub async fn wait_closed(&self) -> RpcError {
        let mut rx = self.shared.closed_tx.subscribe();
        let seen = rx
            .wait_for(Option::is_some)
            .await
            .map(|e| e.clone())
            .ok()
            .flatten();
        self.flushed().await;
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
            duplicate_ids: s.duplicate_ids.load(SeqCst),
            calls_refused: s.calls_refused.load(SeqCst),
            progress_dropped: s.progress_dropped.load(SeqCst),
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
            let _ = self.shared.send_now(&Frame::Cancel {
                v: version(),
                id,
                reason: Some(reason.to_owned()),
            });
        }
    }
}

/// Waits at most the write timeout for `fut`; `false` if it failed or
/// timed out (then the connection closes with why).
async fn bounded<F>(shared: &Shared, what: &str, fut: F) -> bool
where
    F: Future<Output = Result<(), std::io::Error>>,
{
    match tokio::time::timeout(shared.config.write_timeout, fut).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            shared.close_all(RpcError::new(
                codes::TRANSPORT_CLOSED,
                format!("the transport failed while writing {what}: {e}"),
            ));
            false
        }
        Err(_) => {
            shared.close_all(RpcError::new(
                codes::WRITE_TIMEOUT,
                format!(
                    "the peer read nothing for {:?} while this side was writing {what}",
                    shared.config.write_timeout
                ),
            ));
            false
        }
    }
}

async fn write_loop(
    shared: Arc<Shared>,
    mut writer: crate::transport::FrameSink,
    mut rx: mpsc::UnboundedReceiver<Out>,
    mut hello: watch::Receiver<HelloState>,
) {
    let hi = Frame::Hello {
        v: version(),
        features: Vec::new(),
        agent: shared.config.agent.clone(),
    };
    let mut ok = bounded(&shared, "hello", writer.send(hi.to_text())).await;
    // Nothing but goodbye goes out before the peer's hello.
    let mut open = false;
    let mut held: VecDeque<Out> = VecDeque::new();
    let mut timed_out = false;
    while ok {
        let item = tokio::select! {
            biased;
            changed = hello.changed(), if !open => {
                if changed.is_err() { break }
                if *hello.borrow_and_update() == HelloState::Done {
                    open = true;
                    while let Some(Out::Frame { text, .. }) = held.pop_front() {
                        ok = bounded(&shared, "a held frame", writer.feed(text)).await;
                        if !ok { break }
                    }
                    ok = ok && bounded(&shared, "held frames", writer.flush()).await;
                }
                continue;
            }
            item = rx.recv() => item,
        };
        let Some(Out::Frame {
            text,
            kind,
            _permit,
        }) = item
        else {
            break; // Close, or every sender gone
        };
        if !open && kind != Kind::Goodbye {
            if held.len() >= shared.config.max_held_frames {
                shared.goodbye_and_close(
                    "too many frames before hello",
                    protocol_err(format!(
                        "more than {} frames held back waiting for the peer's hello",
                        shared.config.max_held_frames
                    )),
                );
                continue; // on to the goodbye
            }
            held.push_back(Out::Frame {
                text,
                kind,
                _permit,
            });
            continue;
        }
        let bye = kind == Kind::Goodbye;
        ok = bounded(&shared, kind.as_str(), writer.feed(text)).await;
        drop(_permit);
        if ok && (bye || rx.is_empty()) {
            ok = bounded(&shared, "frames", writer.flush()).await;
        }
        if !ok {
            timed_out = matches!(shared.closed_error().code.as_str(), codes::WRITE_TIMEOUT);
        }
        if bye {
            break;
        }
    }
    drop(held);
    if timed_out {
        // Tell the peer why, if it reads at all.
        let err = shared.closed_error();
        let bye = Frame::Goodbye {
            v: version(),
            reason: Some("write timeout".into()),
            error: Some(err.to_envelope()),
        };
        let _ = tokio::time::timeout(shared.config.write_timeout, writer.send(bye.to_text())).await;
    }
    let _ = tokio::time::timeout(shared.config.write_timeout, writer.close()).await;
    if lock(&shared.state).closed.is_none() {
        shared.close_all(RpcError::new(codes::TRANSPORT_CLOSED, "the writer stopped"));
    }
    shared.writer_done.send_replace(true);
}

async fn read_loop(peer: Peer, mut reader: crate::transport::FrameStream) {
    let shared = Arc::clone(&peer.shared);
    let mut closed = shared.closed_tx.subscribe();
    loop {
        let item = tokio::select! {
            biased;
            _ = closed.wait_for(Option::is_some) => return,
            item = reader.next() => item,
        };
        let parsed = match item {
            Some(Ok(Inbound::Frame(bytes))) if bytes.len() <= shared.config.max_frame_bytes => {
                parse_frame_bytes(&bytes)
            }
            Some(Ok(Inbound::Frame(bytes))) => Err(oversize(&bytes, bytes.len(), &shared)),
            Some(Ok(Inbound::Oversize { head, size })) => Err(oversize(&head, size, &shared)),
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
        let go_on = match parsed {
            Ok(frame) => dispatch(&peer, frame).await,
            Err(e) => malformed(&peer, e).await,
        };
        if !go_on {
            return;
        }
    }
}

fn oversize(head: &[u8], size: usize, shared: &Shared) -> FrameError {
    let h = read_head(head);
    FrameError {
        field: String::new(),
        message: format!(
            "the frame is {size} bytes; the limit is {}",
            shared.config.max_frame_bytes
        ),
        kind: h.kind,
        id: h.id,
        v: h.v,
    }
}

fn version_mismatch(v: &str) -> RpcError {
    RpcError::new(
        codes::VERSION_MISMATCH,
        format!("the peer speaks {v}; this side speaks {PROTOCOL_VERSION}"),
    )
}

/// A frame of another MAJOR: a request or stream-open is answered with the
/// error; anything else ends the connection. `false` stops the reader.
async fn other_major(shared: &Shared, kind: Option<Kind>, id: Option<Id>, v: &str) -> bool {
    shared.stats.version_mismatches.fetch_add(1, SeqCst);
    let err = version_mismatch(v);
    match (kind, id) {
        (Some(Kind::Request | Kind::StreamOpen), Some(id)) => {
            if !lock(&shared.state).serving.contains_key(&id) {
                shared.respond(id, Err(err)).await;
            }
            true
        }
        _ => {
            shared.goodbye_and_close("version mismatch", err);
            false
        }
    }
}

/// A frame that failed to parse: the call or stream it belongs to fails
/// with `PROTOCOL_ERROR` naming the field. `false` stops the reader.
async fn malformed(peer: &Peer, e: FrameError) -> bool {
    let shared = &peer.shared;
    if e.other_major() {
        let v = e.v.clone().unwrap_or_default();
        return other_major(shared, e.kind, e.id, &v).await;
    }
    let what = e.kind.map_or("frame", Kind::as_str);
    let message = format!("malformed {what}: {e}");
    shared.count(&shared.stats.protocol_errors, message.clone());
    let err = protocol_err(message);
    match (e.kind, e.id) {
        (Some(Kind::Hello), _) => {
            shared.goodbye_and_close("malformed hello", err);
            false
        }
        (Some(Kind::Goodbye), _) => {
            // The peer is leaving all the same.
            shared.close_all(err);
            false
        }
        (Some(Kind::Request | Kind::StreamOpen), Some(id)) => {
            if lock(&shared.state).serving.contains_key(&id) {
                // Answering under this id would resolve the original call.
                shared.count(
                    &shared.stats.duplicate_ids,
                    format!("id {id} is already in flight"),
                );
            } else {
                shared.respond(id, Err(err)).await;
            }
            true
        }
        (Some(Kind::Response), Some(id)) => {
            shared.fail_call(id, err, true);
            true
        }
        (Some(Kind::Progress | Kind::StreamAck), Some(id)) => {
            shared.fail_call(id, err, false);
            true
        }
        (Some(Kind::Cancel | Kind::StreamChunk | Kind::StreamEnd), Some(id)) => {
            shared.end_serving(id, err).await;
            true
        }
        _ => true, // nothing to attribute it to: counted and logged
    }
}

/// Handles one frame; `false` stops the reader.
async fn dispatch(peer: &Peer, frame: Frame) -> bool {
    let shared = &peer.shared;
    if !frame.is_compatible() {
        return other_major(shared, Some(frame.kind_of()), frame.id(), frame.version()).await;
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
            if let Some(token) = accept_peer_id(shared, id).await {
                serve_call(
                    peer,
                    id,
                    method,
                    params.unwrap_or_else(Payload::null),
                    token,
                )
                .await;
            }
        }
        Frame::StreamOpen {
            id, method, params, ..
        } => {
            if let Some(token) = accept_peer_id(shared, id).await {
                serve_stream(
                    peer,
                    id,
                    method,
                    params.unwrap_or_else(Payload::null),
                    token,
                )
                .await;
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
            } else if id < shared.next_id.load(SeqCst) {
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
                    if c.progress.try_send(progress).is_err() {
                        shared.stats.progress_dropped.fetch_add(1, SeqCst);
                    }
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
            // Decide under the lock; answer after it.
            let verdict = {
                let mut s = lock(&shared.state);
                match s.in_streams.get_mut(&id) {
                    None => Err(None),
                    Some(st) if seq != st.received + 1 => Err(Some((
                        false,
                        format!(
                            "stream-chunk seq: {seq} is out of order (expected {})",
                            st.received + 1
                        ),
                    ))),
                    Some(st) if seq > st.granted => Err(Some((
                        true,
                        format!("chunk {seq} is beyond the {} granted", st.granted),
                    ))),
                    Some(st) => {
                        st.received = seq;
                        let _ = st.tx.send(StreamItem::Chunk(seq, data));
                        Ok(())
                    }
                }
            };
            match verdict {
                Ok(()) => {}
                // Late chunks after the receiver finished look the same.
                Err(None) => shared.count(
                    &shared.stats.unknown_ids,
                    format!("a chunk for unknown stream {id}"),
                ),
                Err(Some((false, message))) => {
                    shared.count(&shared.stats.protocol_errors, message.clone());
                    shared.end_serving(id, protocol_err(message)).await;
                }
                Err(Some((true, message))) => {
                    shared.protocol_error(&shared.stats.credit_violations, message.clone());
                    let err = RpcError::new(codes::STREAM_CREDIT_EXCEEDED, message);
                    shared.end_serving(id, err).await;
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
                o.granted = o.granted.saturating_add(credit).min(MAX_ID);
                o.notify.notify_waiters();
                o.notify.notify_one();
            }
        }
    }
    true
}

/// A new request or stream from the peer: any id not already in flight,
/// within the limit of calls served at once.
async fn accept_peer_id(shared: &Shared, id: Id) -> Option<CancelToken> {
    let refused = {
        let mut s = lock(&shared.state);
        if s.serving.contains_key(&id) {
            Some(None)
        } else if s.serving.len() >= shared.config.max_inbound_calls {
            Some(Some(s.serving.len()))
        } else {
            let token = CancelToken::default();
            s.serving.insert(id, token.clone());
            return Some(token);
        }
    };
    match refused {
        Some(Some(serving)) => {
            shared.stats.calls_refused.fetch_add(1, SeqCst);
            let err = RpcError::new(
                codes::TOO_MANY_CALLS,
                format!(
                    "{serving} calls in flight; the limit is {}",
                    shared.config.max_inbound_calls
                ),
            );
            shared.respond(id, Err(err)).await;
        }
        _ => {
            // Answering under this id would resolve the original call.
            shared.protocol_error(
                &shared.stats.duplicate_ids,
                format!("id {id} is already in flight"),
            );
        }
    }
    None
}

fn lookup(shared: &Shared, method: &str) -> Option<Handler> {
    shared.handlers.read().ok()?.get(method).cloned()
}

async fn finish_serving(
    shared: &Shared,
    id: Id,
    result: Result<Payload, RpcError>,
    cancel: &CancelToken,
) {
    let (still, closed) = {
        let mut s = lock(&shared.state);
        s.in_streams.remove(&id);
        (s.serving.remove(&id).is_some(), s.closed.is_some())
    };
    if closed || !still {
        return;
    }
    // A cancelled call is answered CANCELLED, so both sides forget it.
    let result = if cancel.is_cancelled() {
        Err(RpcError::new(codes::CANCELLED, "cancelled by the caller"))
    } else {
        result
    };
    shared.respond(id, result).await;
}

async fn serve_call(peer: &Peer, id: Id, method: String, params: Payload, cancel: CancelToken) {
    let shared = &peer.shared;
    let handler = match lookup(shared, &method) {
        Some(Handler::Call(h)) => h,
        Some(Handler::Stream(_)) => {
            let e = RpcError::new(
                codes::UNKNOWN_METHOD,
                format!("{method:?} takes a stream, not a call"),
            );
            finish_serving(shared, id, Err(e), &cancel).await;
            return;
        }
        None => {
            let e = RpcError::new(codes::UNKNOWN_METHOD, format!("no method {method:?}"));
            finish_serving(shared, id, Err(e), &cancel).await;
            return;
        }
    };
    spawn_handler(peer, id, method, cancel, move |ctx| handler(params, ctx));
}

/// Runs a handler with its context and answers with what it returns.
fn spawn_handler<F>(peer: &Peer, id: Id, method: String, cancel: CancelToken, run: F)
where
    F: FnOnce(Context) -> BoxFuture<'static, Result<Payload, RpcError>>,
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
        finish_serving(&shared, id, result, &cancel).await;
    });
}

async fn serve_stream(peer: &Peer, id: Id, method: String, params: Payload, cancel: CancelToken) {
    let shared = &peer.shared;
    let handler = match lookup(shared, &method) {
        Some(Handler::Stream(h)) => h,
        _ => {
            let e = RpcError::new(
                codes::UNKNOWN_METHOD,
                format!("no stream method {method:?}"),
            );
            finish_serving(shared, id, Err(e), &cancel).await;
            return;
        }
    };
    let window = shared.config.stream_window.clamp(1, MAX_ID);
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
    let _ = shared
        .send_wait(&Frame::StreamAck {
            v: version(),
            id,
            ack: 0,
            credit: window,
        })
        .await;
    let receiver = StreamReceiver {
        id,
        rx,
        peer: peer.clone(),
        unacked: 0,
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
    rx: oneshot::Receiver<Result<Payload, RpcError>>,
    peer: Peer,
    done: bool,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    progress: mpsc::Receiver<Payload>,
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
    pub async fn next_progress(&mut self) -> Option<Payload> {
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
    type Output = Result<Payload, RpcError>;

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
    /// A chunk over the frame limit fails alone; the stream goes on.
    pub async fn send(&mut self, data: impl Into<Payload>) -> Result<(), RpcError> {
        let mut data = Some(data.into());
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            let text = {
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
                    let frame = Frame::StreamChunk {
                        v: version(),
                        id: self.id,
                        seq: o.sent + 1,
                        data: data.take().unwrap_or_else(Payload::null),
                    };
                    let text = self.peer.shared.encode(&frame)?;
                    o.sent += 1;
                    Some(text)
                } else {
                    None
                }
            };
            match text {
                Some(text) => {
                    return self
                        .peer
                        .shared
                        .send_text_wait(text, Kind::StreamChunk)
                        .await
                }
                None => n.await,
            }
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
    pub async fn finish(mut self) -> Result<Payload, RpcError> {
        self.ended = true;
        let sent = self
            .peer
            .shared
            .send_wait(&Frame::StreamEnd {
                v: version(),
                id: self.id,
                outcome: Outcome::Ok(Payload::null()),
            })
            .await;
        match self.result.take() {
            Some(call) => {
                sent?;
                call.await
            }
            None => Err(RpcError::new(codes::CANCELLED, "already finished")),
        }
    }

    /// Ends the stream with an error.
    pub fn abort(mut self, err: RpcError) {
        self.ended = true;
        let env = err.to_envelope_bounded(self.peer.shared.config.max_cause_depth);
        let _ = self.peer.shared.send_now(&Frame::StreamEnd {
            v: version(),
            id: self.id,
            outcome: Outcome::Err(env),
        });
        if let Some(mut call) = self.result.take() {
            call.done = true;
            let mut s = lock(&self.peer.shared.state);
            if s.calls.remove(&self.id).is_some() {
                s.cancelled.insert(self.id);
            }
            s.out_streams.remove(&self.id);
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
    window: u64,
    done: bool,
}

impl StreamReceiver {
    /// The next chunk; `None` after the sender's ok end; an error if the
    /// sender aborted, cancelled, broke the protocol or went away.
    pub async fn next(&mut self) -> Option<Result<Payload, RpcError>> {
        if self.done {
            return None;
        }
        match self.rx.recv().await {
            Some(StreamItem::Chunk(seq, data)) => {
                self.unacked += 1;
                // Grant credit back in batches of half the window.
                if self.unacked >= (self.window / 2).max(1) {
                    let credit = std::mem::take(&mut self.unacked);
                    let still = {
                        let mut s = lock(&self.peer.shared.state);
                        match s.in_streams.get_mut(&self.id) {
                            Some(st) => {
                                st.granted += credit;
                                true
                            }
                            None => false,
                        }
                    };
                    if still {
                        let _ = self
                            .peer
                            .shared
                            .send_wait(&Frame::StreamAck {
                                v: version(),
                                id: self.id,
                                ack: seq,
                                credit,
                            })
                            .await;
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
