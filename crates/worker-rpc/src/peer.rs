//! An async RPC peer over any transport of frames: a thin tokio driver of
//! [`PeerState`], which holds every rule of the connection.
//!
//! One reader task feeds the state the frames that arrive; one writer task
//! writes the frames it queues (`hello` first, nothing else until the
//! peer's `hello` has arrived, bounded by the write timeout); one timer
//! task calls `handle_timeout` at `poll_timeout`. What the state reports
//! resolves calls, wakes stream senders and starts handlers.

use crate::error::{codes, RpcError};
use crate::frame::*;
use crate::state::{Event, PeerState};
pub use crate::state::{
    PeerConfig, PeerStats, Side, DEFAULT_MAX_HELD_FRAMES, DEFAULT_MAX_INBOUND_CALLS,
    DEFAULT_MAX_OUTBOUND_BYTES, DEFAULT_MAX_OUTBOUND_CALLS, DEFAULT_MAX_PROGRESS_QUEUED,
    DEFAULT_STREAM_WINDOW, DEFAULT_WRITE_TIMEOUT,
};
use crate::transport::{Inbound, Transport};
use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};

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
        let progress = progress.into();
        self.peer.shared.run(|i| {
            if !i.state.has_room() {
                return Err(RpcError::new(
                    codes::TOO_MANY_CALLS,
                    "the outbound queue is full; progress dropped",
                ));
            }
            i.state.progress(self.id, progress)
        })
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

enum StreamItem {
    Chunk(u64, Payload),
    End(Result<(), RpcError>),
}

/// Where a call's result and progress go.
struct CallSlot {
    reply: oneshot::Sender<Result<Payload, RpcError>>,
    progress: mpsc::Sender<Payload>,
}

/// The state and, by id, who waits on it.
struct Inner {
    state: PeerState,
    calls: HashMap<Id, CallSlot>,
    serving: HashMap<Id, CancelToken>,
    /// Bounded by the credit window: the state refuses a chunk beyond it.
    in_streams: HashMap<Id, mpsc::UnboundedSender<StreamItem>>,
    out_streams: HashMap<Id, Arc<Notify>>,
}

/// A handler to start once the state's lock is let go.
struct Start {
    id: Id,
    method: String,
    params: Payload,
    handler: Handler,
    stream: Option<mpsc::UnboundedReceiver<StreamItem>>,
    cancel: CancelToken,
}

struct Shared {
    inner: Mutex<Inner>,
    handlers: RwLock<HashMap<String, Handler>>,
    /// Frames queued or the connection closed.
    wake_writer: Notify,
    /// A deadline was set.
    wake_timer: Notify,
    /// The writer took a frame: senders waiting for room look again.
    room: Notify,
    hello: watch::Sender<HelloState>,
    closed_tx: watch::Sender<Option<RpcError>>,
    writer_done: watch::Sender<bool>,
    /// Zero of the state's millisecond clock.
    epoch: tokio::time::Instant,
}

/// One end of a worker RPC connection. Cheap to clone.
#[derive(Clone)]
pub struct Peer {
    shared: Arc<Shared>,
}

fn unknown_method(method: &str, stream: bool, handler: Option<&Handler>) -> RpcError {
    let message = match (stream, handler) {
        (false, Some(Handler::Stream(_))) => format!("{method:?} takes a stream, not a call"),
        (true, _) => format!("no stream method {method:?}"),
        (false, _) => format!("no method {method:?}"),
    };
    RpcError::new(codes::UNKNOWN_METHOD, message)
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Runs `f` on the state, then carries out what it reported: calls
    /// resolved, senders woken, handlers started.
    fn run<R>(self: &Arc<Self>, f: impl FnOnce(&mut Inner) -> R) -> R {
        let (r, starts) = {
            let mut inner = self.lock();
            let r = f(&mut inner);
            (r, self.drain(&mut inner))
        };
        self.wake_writer.notify_one();
        for s in starts {
            self.start(s);
        }
        r
    }

    /// Runs `f` once the outbound queue has room (back-pressure), unless
    /// `still` says it has nothing left to do.
    async fn run_with_room<R>(
        self: &Arc<Self>,
        still: impl Fn(&Inner) -> bool,
        f: impl FnOnce(&mut Inner) -> R,
    ) -> Option<R> {
        let mut f = Some(f);
        loop {
            let n = self.room.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            {
                let inner = self.lock();
                if !still(&inner) {
                    return None;
                }
                if inner.state.has_room() {
                    drop(inner);
                    return f.take().map(|f| self.run(f));
                }
            }
            n.await;
        }
    }

    fn drain(&self, inner: &mut Inner) -> Vec<Start> {
        let mut starts = Vec::new();
        while let Some(e) = inner.state.poll_event() {
            match e {
                Event::Ready => {
                    self.hello.send_replace(HelloState::Done);
                }
                Event::Request {
                    id,
                    method,
                    params,
                    stream,
                } => {
                    let handler = self
                        .handlers
                        .read()
                        .ok()
                        .and_then(|h| h.get(&method).cloned());
                    let ok = matches!(
                        (&handler, stream),
                        (Some(Handler::Call(_)), false) | (Some(Handler::Stream(_)), true)
                    );
                    let handler = match handler {
                        Some(h) if ok => h,
                        other => {
                            let err = unknown_method(&method, stream, other.as_ref());
                            inner.state.respond(id, Err(err));
                            continue;
                        }
                    };
                    let cancel = CancelToken::default();
                    inner.serving.insert(id, cancel.clone());
                    let rx = stream.then(|| {
                        let (tx, rx) = mpsc::unbounded_channel();
                        inner.in_streams.insert(id, tx);
                        inner.state.accept_stream(id);
                        rx
                    });
                    starts.push(Start {
                        id,
                        method,
                        params: params.unwrap_or_else(Payload::null),
                        handler,
                        stream: rx,
                        cancel,
                    });
                }
                Event::Cancelled { id } => {
                    if let Some(t) = inner.serving.get(&id) {
                        t.cancel();
                    }
                }
                Event::Chunk { id, seq, data } => {
                    if let Some(tx) = inner.in_streams.get(&id) {
                        let _ = tx.send(StreamItem::Chunk(seq, data));
                    }
                }
                Event::StreamEnd { id, result } => {
                    if let Some(tx) = inner.in_streams.remove(&id) {
                        let _ = tx.send(StreamItem::End(result));
                    }
                }
                Event::Response { id, result } => {
                    if let Some(n) = inner.out_streams.remove(&id) {
                        n.notify_waiters();
                        n.notify_one();
                    }
                    if let Some(slot) = inner.calls.remove(&id) {
                        let _ = slot.reply.send(result);
                    }
                }
                Event::Progress { id, progress } => {
                    if let Some(slot) = inner.calls.get(&id) {
                        if slot.progress.try_send(progress).is_err() {
                            inner.state.note_progress_dropped();
                        }
                    }
                }
                Event::Credit { id } => {
                    if let Some(n) = inner.out_streams.get(&id) {
                        n.notify_waiters();
                        n.notify_one();
                    }
                }
                Event::Closed(err) => {
                    self.closed_tx.send_replace(Some(err.clone()));
                    self.hello.send_if_modified(|h| {
                        let waiting = *h == HelloState::Waiting;
                        if waiting {
                            *h = HelloState::Failed(err.clone());
                        }
                        waiting
                    });
                    for (_, n) in inner.out_streams.drain() {
                        n.notify_waiters();
                        n.notify_one();
                    }
                    inner.serving.clear();
                    self.room.notify_waiters();
                    self.wake_timer.notify_one();
                }
            }
        }
        starts
    }

    fn start(self: &Arc<Self>, s: Start) {
        let peer = Peer {
            shared: Arc::clone(self),
        };
        let ctx = Context {
            id: s.id,
            method: s.method,
            cancel: s.cancel.clone(),
            peer: peer.clone(),
        };
        let fut = match (s.handler, s.stream) {
            (Handler::Stream(h), Some(rx)) => {
                let window = self.lock().state.config().stream_window.clamp(1, MAX_ID);
                let receiver = StreamReceiver {
                    id: s.id,
                    rx,
                    peer,
                    unacked: 0,
                    window,
                    done: false,
                };
                h(s.params, receiver, ctx)
            }
            (Handler::Call(h), _) => h(s.params, ctx),
            (Handler::Stream(_), None) => return,
        };
        let (shared, id) = (Arc::clone(self), s.id);
        tokio::spawn(async move {
            let result = fut.await;
            shared.finish_serving(id, result).await;
        });
    }

    /// A handler returned: its answer goes out once there is room.
    async fn finish_serving(self: &Arc<Self>, id: Id, result: Result<Payload, RpcError>) {
        self.run_with_room(
            |i| i.state.is_serving(id),
            |i| {
                i.serving.remove(&id);
                i.in_streams.remove(&id);
                i.state.respond(id, result)
            },
        )
        .await;
    }

    fn close(self: &Arc<Self>, err: RpcError) {
        self.run(|i| i.state.close(err));
    }

    fn closed_error(&self) -> RpcError {
        self.lock()
            .state
            .closed()
            .cloned()
            .unwrap_or_else(|| RpcError::new(codes::TRANSPORT_CLOSED, "the connection closed"))
    }
}

impl Peer {
    /// Starts a peer on `transport`; it sends `hello` at once.
    pub fn new(side: Side, transport: Transport, config: PeerConfig) -> Peer {
        let hello = if config.await_peer_hello {
            HelloState::Waiting
        } else {
            HelloState::Done
        };
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                state: PeerState::new(side, config),
                calls: HashMap::new(),
                serving: HashMap::new(),
                in_streams: HashMap::new(),
                out_streams: HashMap::new(),
            }),
            handlers: RwLock::new(HashMap::new()),
            wake_writer: Notify::new(),
            wake_timer: Notify::new(),
            room: Notify::new(),
            hello: watch::channel(hello).0,
            closed_tx: watch::channel(None).0,
            writer_done: watch::channel(false).0,
            epoch: tokio::time::Instant::now(),
        });
        let Transport { reader, writer } = transport;
        tokio::spawn(write_loop(Arc::clone(&shared), writer));
        tokio::spawn(read_loop(Arc::clone(&shared), reader));
        tokio::spawn(timer_loop(Arc::clone(&shared)));
        Peer { shared }
    }

    pub fn side(&self) -> Side {
        self.shared.lock().state.side()
    }

    pub fn config(&self) -> PeerConfig {
        self.shared.lock().state.config().clone()
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

    /// Registers a call (or stream) and queues its frame; a call that
    /// cannot start resolves at once with why.
    fn start(&self, method: &str, params: Payload, stream: bool) -> (Call, Arc<Notify>) {
        let (reply, rx) = oneshot::channel();
        let max = self.shared.lock().state.config().max_progress_queued.max(1);
        let (progress, progress_rx) = mpsc::channel(max);
        let notify = Arc::new(Notify::new());
        let mut slot = Some(CallSlot { reply, progress });
        let started = self.shared.run(|i| {
            let id = i.state.call(method, params, stream, None)?;
            if let Some(slot) = slot.take() {
                i.calls.insert(id, slot);
            }
            if stream {
                i.out_streams.insert(id, Arc::clone(&notify));
            }
            Ok::<_, RpcError>(id)
        });
        let id = match (started, slot) {
            (Ok(id), _) => id,
            (Err(e), slot) => {
                if let Some(slot) = slot {
                    let _ = slot.reply.send(Err(e));
                }
                0
            }
        };
        let call = Call {
            id,
            rx,
            peer: self.clone(),
            done: id == 0,
            failed_early: id == 0,
            progress: progress_rx,
        };
        (call, notify)
    }

    /// Calls `method` on the other side. Dropping or cancelling the
    /// returned future sends `cancel`.
    pub fn call(&self, method: &str, params: impl Into<Payload>) -> Call {
        self.start(method, params.into(), false).0
    }

    /// Opens a stream to the other side's stream handler for `method`.
    pub fn open_stream(&self, method: &str, params: impl Into<Payload>) -> StreamSender {
        let (call, notify) = self.start(method, params.into(), true);
        StreamSender {
            id: call.id,
            notify,
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
        self.shared.run(|i| i.state.goodbye(reason));
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
        self.shared.lock().state.closed().cloned()
    }

    pub fn stats(&self) -> PeerStats {
        self.shared.lock().state.stats()
    }

    pub fn last_protocol_error(&self) -> Option<String> {
        self.shared
            .lock()
            .state
            .last_protocol_error()
            .map(str::to_owned)
    }

    /// Calls and streams still waiting for an answer (for leak checks).
    pub fn pending(&self) -> usize {
        self.shared.lock().state.pending()
    }

    fn cancel_call(&self, id: Id, reason: &str) {
        self.shared.run(|i| {
            i.calls.remove(&id);
            i.out_streams.remove(&id);
            i.state.cancel(id, reason)
        });
    }
}

/// Waits at most the write timeout for `fut`; `false` if it failed or
/// timed out (then the connection closes with why).
async fn bounded<F>(shared: &Arc<Shared>, limit: Duration, what: &str, fut: F) -> bool
where
    F: Future<Output = Result<(), std::io::Error>>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            shared.close(RpcError::new(
                codes::TRANSPORT_CLOSED,
                format!("the transport failed while writing {what}: {e}"),
            ));
            false
        }
        Err(_) => {
            shared.close(RpcError::new(
                codes::WRITE_TIMEOUT,
                format!("the peer read nothing for {limit:?} while this side was writing {what}"),
            ));
            false
        }
    }
}

async fn write_loop(shared: Arc<Shared>, mut writer: crate::transport::FrameSink) {
    let limit = shared.lock().state.config().write_timeout;
    let mut timed_out = false;
    loop {
        let wake = shared.wake_writer.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let (next, more, closed) = {
            let mut inner = shared.lock();
            let next = inner.state.poll_transmit();
            let more = inner.state.queued_bytes() > 0;
            (next, more, inner.state.closed().is_some())
        };
        let Some(t) = next else {
            if closed {
                break;
            }
            wake.await;
            continue;
        };
        shared.room.notify_waiters();
        let bye = t.kind == Kind::Goodbye;
        let mut ok = bounded(&shared, limit, t.kind.as_str(), writer.feed(t.text)).await;
        if ok && (bye || !more) {
            ok = bounded(&shared, limit, "frames", writer.flush()).await;
        }
        if !ok {
            timed_out = shared.closed_error().code == codes::WRITE_TIMEOUT;
            break;
        }
        if bye {
            break;
        }
    }
    if timed_out {
        // Tell the peer why, if it reads at all.
        let err = shared.closed_error();
        let bye = Frame::Goodbye {
            v: PROTOCOL_VERSION.to_owned(),
            reason: Some("write timeout".into()),
            error: Some(err.to_envelope()),
        };
        let _ = tokio::time::timeout(limit, writer.send(bye.to_text())).await;
    }
    let _ = tokio::time::timeout(limit, writer.close()).await;
    shared.close(RpcError::new(codes::TRANSPORT_CLOSED, "the writer stopped"));
    shared.writer_done.send_replace(true);
}

async fn read_loop(shared: Arc<Shared>, mut reader: crate::transport::FrameStream) {
    let mut closed = shared.closed_tx.subscribe();
    loop {
        let item = tokio::select! {
            biased;
            _ = closed.wait_for(Option::is_some) => return,
            item = reader.next() => item,
        };
        let now = shared.now_ms();
        let go_on = shared.run(|i| {
            match item {
                Some(Ok(Inbound::Frame(bytes))) => i.state.handle_bytes(&bytes, now),
                Some(Ok(Inbound::Oversize { head, size })) => {
                    i.state.handle_oversize(&head, size, now)
                }
                Some(Err(e)) => i.state.handle_transport_closed(RpcError::new(
                    codes::TRANSPORT_CLOSED,
                    format!("the transport failed: {e}"),
                )),
                None => i.state.handle_transport_closed(RpcError::new(
                    codes::TRANSPORT_CLOSED,
                    "the transport closed without goodbye",
                )),
            }
            i.state.closed().is_none()
        });
        if !go_on {
            return;
        }
    }
}

/// Calls `handle_timeout` whenever the state's earliest deadline passes.
async fn timer_loop(shared: Arc<Shared>) {
    loop {
        let wake = shared.wake_timer.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let (next, closed) = {
            let inner = shared.lock();
            (inner.state.poll_timeout(), inner.state.closed().is_some())
        };
        if closed {
            return;
        }
        match next {
            Some(at) => {
                let when = shared.epoch + Duration::from_millis(at);
                tokio::select! {
                    () = tokio::time::sleep_until(when) => {
                        let now = shared.now_ms().max(at);
                        shared.run(|i| i.state.handle_timeout(now));
                    }
                    () = wake => {}
                }
            }
            None => wake.await,
        }
    }
}

/// A pending call: resolves once with the result. Dropping it before then
/// sends `cancel`.
pub struct Call {
    id: Id,
    rx: oneshot::Receiver<Result<Payload, RpcError>>,
    peer: Peer,
    done: bool,
    /// It failed before it started (its result is waiting in `rx`).
    failed_early: bool,
    progress: mpsc::Receiver<Payload>,
}

impl Call {
    pub fn id(&self) -> Id {
        self.id
    }

    /// Fails with `TIMEOUT` (and sends `cancel`) if no answer comes in time.
    pub fn timeout(self, after: Duration) -> Call {
        if !self.done {
            let shared = &self.peer.shared;
            let at = shared.now_ms().saturating_add(after.as_millis() as u64);
            shared.run(|i| i.state.set_deadline(self.id, at));
            shared.wake_timer.notify_one();
        }
        self
    }

    /// Cancels the call: `cancel` goes to the handler; the call resolves no more.
    pub fn cancel(mut self) {
        if !self.done {
            self.done = true;
            self.peer.cancel_call(self.id, "cancelled by the caller");
        }
    }

    /// The next `progress` value, or `None` once the call is over.
    pub async fn next_progress(&mut self) -> Option<Payload> {
        if self.done && !self.failed_early {
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
        if self.done && !self.failed_early {
            return Poll::Ready(Err(RpcError::new(
                codes::CANCELLED,
                "the call was already resolved or cancelled",
            )));
        }
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(r) => {
                self.done = true;
                self.failed_early = false;
                Poll::Ready(r.unwrap_or_else(|_| {
                    Err(RpcError::new(codes::TRANSPORT_CLOSED, "the peer went away"))
                }))
            }
            Poll::Pending => Poll::Pending,
        }
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
        let data = data.into();
        let shared = &self.peer.shared;
        let id = self.id;
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            let credit = shared.lock().state.credit(id)?;
            if credit > 0 {
                let sent = shared
                    .run_with_room(|_| true, |i| i.state.send_chunk(id, &data))
                    .await;
                match sent {
                    Some(Ok(true)) => return Ok(()),
                    Some(Ok(false)) => continue,
                    Some(Err(e)) => return Err(e),
                    None => return Err(shared.closed_error()),
                }
            }
            n.await;
        }
    }

    /// Chunks that may still be sent without waiting.
    pub fn credit(&self) -> u64 {
        self.peer.shared.lock().state.credit(self.id).unwrap_or(0)
    }

    /// Ends the stream and waits for the receiver's result.
    pub async fn finish(mut self) -> Result<Payload, RpcError> {
        self.ended = true;
        let id = self.id;
        let sent = self
            .peer
            .shared
            .run_with_room(|_| true, |i| i.state.end_stream(id, Ok(())))
            .await
            .unwrap_or_else(|| Err(self.peer.shared.closed_error()));
        match self.result.take() {
            Some(call) => {
                if call.failed_early {
                    return call.await;
                }
                sent?;
                call.await
            }
            None => Err(RpcError::new(codes::CANCELLED, "already finished")),
        }
    }

    /// Ends the stream with an error.
    pub fn abort(mut self, err: RpcError) {
        self.ended = true;
        if let Some(mut call) = self.result.take() {
            call.done = true;
        }
        let id = self.id;
        self.peer.shared.run(|i| {
            i.calls.remove(&id);
            i.out_streams.remove(&id);
            let _ = i.state.end_stream(id, Err(err));
        });
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
                    let id = self.id;
                    self.peer
                        .shared
                        .run_with_room(|i| i.state.is_serving(id), |i| i.state.ack(id, seq, credit))
                        .await;
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
