//! The accept loop: HTTP/1.1 connections (WebSocket upgrades included)
//! with the limits a hostile client meets before any handler runs:
//!
//! - a cap on open connections per client IP (an IPv6 client by its /64;
//!   beyond it the socket is closed at once);
//! - a header read timeout (a silent socket, or a header trickled byte by
//!   byte, is closed; it also ends idle keep-alive connections);
//! - a deadline for a whole request body ([`BodyTimeout`]);
//! - a bounded graceful shutdown: every WebSocket is closed with 1001 (by
//!   the [`Sockets`] registry, each request carries it), requests in flight
//!   are finished; connections still open after the grace time are
//!   dropped.

use super::counted::{Counted, PerIp};
use super::LARGEST_REQUEST_BODY;
use crate::ws::Sockets;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tower_service::Service;

/// The limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub connections_per_ip: usize,
    pub shutdown_grace: Duration,
}

/// A request body that took longer than its deadline.
#[derive(Debug)]
pub struct BodyTimeout;

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body not received in time")
    }
}

impl std::error::Error for BodyTimeout {}

/// Whether an error (or one of its sources) is a [`BodyTimeout`].
pub fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.is::<BodyTimeout>() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// How long a body dropped unread is waited for between two of its
/// chunks before the connection is closed (nginx's `lingering_timeout`
/// is 5 s): a client that sent only its headers is not held for long.
pub const LINGER_IDLE: Duration = Duration::from_secs(2);

/// A body that fails with [`BodyTimeout`] once its deadline passes. The
/// timer is made only when the body is first read: requests without a
/// body (most of them, WebSocket upgrades included) cost none.
///
/// A body its handler drops unread (a request refused on its headers: a
/// spent budget, a busy upload slot) is read to its end and dropped by a
/// task of its own, within the same deadline, at most
/// [`LARGEST_REQUEST_BODY`] bytes and [`LINGER_IDLE`] between chunks.
/// Closing a socket with unread bytes resets it, and a client still
/// sending its body then loses the answer (its write fails, or its TCP
/// stack discards what it had received).
struct Deadline {
    /// `None` only once handed to the task that drains it.
    inner: Option<Incoming>,
    limit: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether dropping the body unread drains it (not for the drain's own).
    linger: bool,
}

impl Deadline {
    fn new(inner: Incoming, limit: Duration) -> Self {
        Self {
            inner: Some(inner),
            limit,
            sleep: None,
            linger: true,
        }
    }

    /// Reads and drops the rest of the body, at most `left` bytes: past
    /// them, or at the deadline, the body is dropped and hyper closes the
    /// connection.
    async fn drain(mut self, mut left: u64) {
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut self).poll_frame(cx));
            let Ok(Some(Ok(frame))) = tokio::time::timeout(LINGER_IDLE, frame).await else {
                return;
            };
            let n = frame.data_ref().map_or(0, |d| d.len() as u64);
            let Some(l) = left.checked_sub(n) else { return };
            left = l;
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if !self.linger || self.is_end_stream() {
            return;
        }
        let cap = LARGEST_REQUEST_BODY as u64;
        // A declared length past the largest body is refused unread (413)
        // and not worth reading; a chunked body is read up to the cap.
        if self.size_hint().upper().is_some_and(|n| n > cap) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rest = Deadline {
            inner: self.inner.take(),
            limit: self.limit,
            sleep: self.sleep.take(),
            linger: false,
        };
        runtime.spawn(rest.drain(cap));
    }
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(r) = Pin::new(inner).poll_frame(cx) {
            return Poll::Ready(r.map(|f| f.map_err(Into::into)));
        }
        let limit = this.limit;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

/// Serves `router` on `listener` until `stop` resolves, then closes every
/// socket of `sockets` (1001) and waits at most `shutdown_grace` for open
/// connections and sockets to end before dropping them.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    sockets: Sockets,
    stop: impl Future<Output = ()>,
) {
    let per_ip = Arc::new(PerIp::default());
    // Every connection task holds a sender: all are gone once `done`
    // yields `None`.
    let (alive, mut done) = tokio::sync::mpsc::channel::<()>(1);
    let (stopping, stop_rx) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of files, mostly: wait a little, not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // An IPv6 client counts as its /64, which it could otherwise rotate
        // through.
        let ip = super::client_ip::limit_addr(peer.ip());
        let Some(slot) = PerIp::take(&per_ip, ip, limits.connections_per_ip) else {
            tracing::debug!(ip = %peer.ip(), "connection refused: CONNECTIONS_PER_IP reached");
            drop(stream);
            continue;
        };
        // Without TCP_NODELAY, small frames wait for delayed ACKs (~40 ms).
        let _ = stream.set_nodelay(true);
        let spoke = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let header_timeout = limits.header_read_timeout;
        let router = router.clone();
        let body_limit = limits.body_read_timeout;
        let sockets = sockets.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let mut req = req.map(|inner| Body::new(Deadline::new(inner, body_limit)));
            req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
            req.extensions_mut().insert(sockets.clone());
            router.clone().call(req)
        });
        let conn = http
            .serve_connection(
                TokioIo::new(Counted {
                    stream,
                    slot,
                    spoke: Arc::clone(&spoke),
                }),
                svc,
            )
            .with_upgrades();
        let alive = alive.clone();
        let mut stop_rx = stop_rx.clone();
        // Every line of the connection's requests, and of its socket once
        // upgraded (`ws::Upgrade`), names its peer.
        let span = tracing::info_span!("conn", peer = %peer);
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let _alive = alive;
                tokio::pin!(conn);
                let silent = tokio::time::sleep(header_timeout);
                tokio::pin!(silent);
                let mut watch_silence = true;
                loop {
                    tokio::select! {
                        _ = conn.as_mut() => return,
                        _ = stop_rx.wait_for(|s| *s) => break,
                        () = &mut silent, if watch_silence => {
                            if !spoke.load(std::sync::atomic::Ordering::Relaxed) {
                                // Not a byte in the header read timeout.
                                return;
                            }
                            watch_silence = false;
                        }
                    }
                }
                // Ends after the request in flight, or at once when idle.
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            },
            span,
        ));
    }
    drop(listener);
    let _ = stopping.send(true);
    drop(alive);
    // Upgraded connections have left hyper: the registry closes and
    // counts them.
    sockets.close_all();
    let ended = async {
        let _ = done.recv().await;
        sockets.ended().await;
    };
    if tokio::time::timeout(limits.shutdown_grace, ended)
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace time: dropped");
    }
}
