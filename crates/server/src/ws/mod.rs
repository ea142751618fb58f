//! THE WebSocket connection driver: every endpoint (`/ws`, `/ggui/ws`,
//! `/playerthree/ws`, `/memizy/session/ws`) runs its sockets through this,
//! with its protocol's choices as data ([`Config`]). It owns:
//!
//! - the upgrade ([`Upgrade`]): RFC 6455's checks and the 101, then the
//!   accept loop's TCP stream taken back from the HTTP layer and read and
//!   written by tungstenite directly ([`WebSocket`]), with a frame limit,
//!   a small read buffer, a message with nothing before it written behind
//!   its header with no copy, and a cap on unsent bytes (replies to pings
//!   included: a client that pings and never reads cannot grow them
//!   without limit; one held message of at most 16 KiB beside them);
//! - the reader ([`Reader`]): a client's pings never counted as activity
//!   (the idle timeout and the server's pings are timed by the registry's
//!   one sweep a second, no timer per socket), the WebSocket
//!   layer's refusals mapped (an oversized message is an [`Event`] the
//!   protocol answers; RFC 6455 violations close 1007 / 1002 with a reason);
//! - the writer, which drains the connection's bounded outbound queue
//!   (frames and bytes), with a direct-write fast path for an idle
//!   connection where the protocol asks for it ([`Config::direct_write`]);
//!   it runs in the connection's one task beside the protocol's reader,
//!   over the one unsplit socket, which lives in the queue's allocation
//!   (an idle connection is one task with its boxed future, one allocation
//!   of shared state and the socket's own buffers);
//! - a clean close ([`Reader::finish`]): after the server's Close frame it
//!   keeps reading (and discarding) until the peer's Close or
//!   [`Config::close_linger`], so the frames queued before the close and its
//!   code reach the client instead of a TCP reset;
//! - every socket of a server in one registry ([`Sockets`]), so that a
//!   shutdown closes each of them with 1001, attached to a unit or not,
//!   and one sweep finds the silent ones ([`SWEEP_TICK`]).
//!
//! A protocol keeps only its own rules: what a text frame means and what to
//! answer.
mod close;
mod config;
mod frame_ends;
mod reader;
mod socket;
mod sockets;
mod stream;
mod tcp;
mod writer;

pub use crate::outbound::{Close, Refused};
pub use config::*;
pub use frame_ends::FrameEnds;
pub use reader::{Event, Reader};
pub use socket::{closed, oversized, Pipe, Socket, ToPeer};
pub use sockets::{Sockets, SWEEP_TICK};
pub use stream::WebSocket;
pub use tcp::{Tcp, SCRATCH_BYTES};
pub use tungstenite::protocol::CloseFrame;
pub use tungstenite::{Error, Message, Utf8Bytes};
pub use writer::{Outbound, Parked};

use reader::End;
use writer::write_loop;

use crate::http::counted::Counted;
use crate::outbound;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// A WebSocket upgrade request (RFC 6455 4.2.1: a GET with `Upgrade:
/// websocket`, `Connection: upgrade`, version 13 and a key) and the
/// server's [`Sockets`], which the accept loop puts in every request (none
/// when the router is served otherwise).
pub struct Upgrade {
    accept: HeaderValue,
    on_upgrade: hyper::upgrade::OnUpgrade,
    sockets: Option<Sockets>,
}

/// Why a request is no WebSocket upgrade: its status and the reason.
#[derive(Debug)]
pub struct NotUpgrade(StatusCode, &'static str);

impl IntoResponse for NotUpgrade {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

/// The `Sec-WebSocket-Accept` of an upgrade request's headers (RFC 6455
/// 4.2.1: `Connection: upgrade`, `Upgrade: websocket`, version 13 and a
/// key), or why they are no upgrade.
pub fn accept_key(headers: &HeaderMap) -> Result<HeaderValue, NotUpgrade> {
    let has = |name, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    let refuse = |why| Err(NotUpgrade(StatusCode::BAD_REQUEST, why));
    if !has(header::CONNECTION, "upgrade") {
        return refuse("the Connection header does not say upgrade");
    }
    if !has(header::UPGRADE, "websocket") {
        return refuse("the Upgrade header does not say websocket");
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(|v| v.as_bytes())
        != Some(b"13")
    {
        return refuse("Sec-WebSocket-Version must be 13");
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return refuse("Sec-WebSocket-Key is missing");
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    HeaderValue::try_from(accept).or_else(|_| refuse("Sec-WebSocket-Key"))
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = NotUpgrade;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        if parts.method != Method::GET {
            return Err(NotUpgrade(
                StatusCode::METHOD_NOT_ALLOWED,
                "a WebSocket upgrade is a GET",
            ));
        }
        let accept = accept_key(&parts.headers)?;
        let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return Err(NotUpgrade(
                StatusCode::UPGRADE_REQUIRED,
                "this connection cannot be upgraded",
            ));
        };
        let sockets = parts.extensions.get::<Sockets>().cloned();
        Ok(Upgrade {
            accept,
            on_upgrade,
            sockets,
        })
    }
}

impl Upgrade {
    /// Answers 101 and, once the HTTP layer hands the socket over, runs the
    /// connection with `config`: `run`'s future in one task with the
    /// connection's writer (`run` is not an `async fn`: the socket is
    /// consumed before `run`'s future exists, so that future, kept for the
    /// connection's whole life, does not hold room for it). One task, not a
    /// writer task beside the reader's: an idle connection costs one task
    /// (its future boxed, see below), and the writer goes on whatever the
    /// protocol awaits.
    pub fn on_upgrade<F, Fut>(self, config: Arc<Config>, run: F) -> Response
    where
        F: FnOnce(Connection) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Upgrade {
            accept,
            on_upgrade,
            sockets,
        } = self;
        // The upgraded socket runs in a task of its own, in a `ws` span
        // under its connection's (which names the peer) at debug level
        // only: a span kept for the socket's life costs the subscriber's
        // registry about 400 bytes per connection (docs/BENCHMARKS.md,
        // "A socket's span"), where at info a socket writes almost no line.
        let span = tracing::debug_span!("ws");
        // The upgrade waits in a task of its own, which then starts the
        // connection's: a future that did both would keep room for the
        // upgrade's state and captures (`run` among them) for the
        // connection's life. The connection's future is boxed: tokio sizes
        // a task in steps of 128 bytes (a cache line pair), the allocator
        // in steps of 16, and every idle connection holds it for its life
        // (docs/BENCHMARKS.md, "Idle connections").
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let Some(socket) = upgraded(on_upgrade, &config).await else {
                    return;
                };
                let (c, drain) = Connection::start(Socket::Ws(socket), config, sockets);
                let connection = Connection::drive(c, drain, run);
                let span = tracing::Span::current();
                // A disabled span (the default log level) is not kept: its
                // handle alone is 40 bytes of every connection's future.
                if span.is_disabled() {
                    tokio::spawn(Box::pin(connection));
                } else {
                    tokio::spawn(Box::pin(tracing::Instrument::instrument(connection, span)));
                }
            },
            span,
        ));
        let mut res = StatusCode::SWITCHING_PROTOCOLS.into_response();
        let h = res.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        res
    }
}

/// The socket the HTTP layer hands over after its 101, as a [`WebSocket`]
/// with `config`'s limits and buffers; `None` if the client went first.
async fn upgraded(
    on_upgrade: hyper::upgrade::OnUpgrade,
    config: &Arc<Config>,
) -> Option<stream::WebSocket> {
    let upgraded = on_upgrade.await.ok()?;
    // The accept loop's socket, taken apart: every connection is served by
    // `crate::http::serve`.
    let Ok(parts) = upgraded.downcast::<hyper_util::rt::TokioIo<Counted>>() else {
        tracing::error!("an upgraded socket not of the accept loop: dropped");
        return None;
    };
    let counted = parts.io.into_inner();
    let tcp = tcp::Tcp::counted(counted.stream, counted.slot);
    Some(stream::WebSocket::new(
        tcp,
        &parts.read_buf,
        Arc::clone(config),
    ))
}

/// A connection just upgraded: its reader and its sending side.
pub struct Connection {
    pub reader: Reader,
    pub out: Outbound,
}

impl Connection {
    /// Runs a connection over a [`Pipe`] (another node's client) as
    /// [`Upgrade::on_upgrade`] runs a WebSocket: `run` beside the writer,
    /// in the future returned, which the caller spawns.
    pub fn over_pipe<F, Fut>(
        pipe: Pipe,
        config: Arc<Config>,
        sockets: Option<Sockets>,
        run: F,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: FnOnce(Connection) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (c, drain) = Connection::start(Socket::Pipe(pipe), config, sockets);
        Connection::drive(c, drain, run)
    }

    /// The protocol's `run` and the writer, in one future. Each is polled
    /// on every wake of the task: a wake meant for the other costs a check
    /// of the queue or of the socket's readiness, no system call.
    fn drive<F, Fut>(
        c: Connection,
        drain: outbound::Drain<Utf8Bytes, Parked>,
        run: F,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: FnOnce(Connection) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        futures_util::future::join(run(c), write_loop(drain)).map(|_| ())
    }

    fn start(
        socket: Socket,
        config: Arc<Config>,
        sockets: Option<Sockets>,
    ) -> (Connection, outbound::Drain<Utf8Bytes, Parked>) {
        let (out, drain) = outbound::queue(Parked {
            piped: matches!(socket, Socket::Pipe(_)),
            socket: Mutex::new(Some(socket)),
            config: Arc::clone(&config),
            active: AtomicBool::new(false),
            expired: AtomicBool::new(false),
        });
        let out = Outbound(out);
        // Every socket is in a registry, which times its idle timeout and
        // its pings.
        let sockets = sockets.unwrap_or_else(Sockets::detached);
        let id = sockets.register(&out);
        let reader = Reader {
            out: out.clone(),
            end: End::Open,
            registered: (sockets, id),
        };
        (Connection { reader, out }, drain)
    }
}
