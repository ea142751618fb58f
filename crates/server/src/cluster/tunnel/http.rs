//! Every HTTP API answers on every node: a request for a unit another node
//! owns is carried to that node over a tunnel and its answer carried
//! back, streamed (a bundle of any size, an MCP event stream).
//!
//! How a node knows: the handler runs here first, as on one node. When it
//! asked for a unit a live node holds, [`Leases::take_over`] notes that
//! node ([`note_owner`]) in a task-local of the request, and the handler
//! answers 503; [`carry_http`] then sends the request to the owner, which
//! runs it through its own router as a request of its own (marked
//! [`Carried`]: it is never carried on), and answers with the owner's
//! answer. When the owner cannot be reached the 503 stands.
//!
//! What is carried: the method, URI, headers (those of visible ASCII) and
//! body of a request whose body is declared at most
//! [`MAX_CARRIED_REQUEST`] bytes (read here first: the handler read it
//! too); a longer one is served here only, and answers 503 if its unit is
//! elsewhere. The answer comes back in [`CHUNK`]-byte frames through the
//! tunnel's bounded queue.
//!
//! [`Leases::take_over`]: crate::cluster::leases::Leases::take_over

use super::{Route, Tunnels, TUNNEL_FRAMES};
use crate::ws::{CloseFrame, Message};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Body as _;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The protocol name of an HTTP exchange on a tunnel.
pub const HTTP_PROTOCOL: &str = "http";

/// The longest request body carried to another node: above the largest
/// API body (a relay bundle's 8 MiB, in its JSON); read here first within
/// the server's request-body budget.
pub const MAX_CARRIED_REQUEST: usize = 12 * 1024 * 1024;

/// The bytes of one frame of a carried body.
pub const CHUNK: usize = 64 * 1024;

// The owner's queue for the tunnel holds a whole carried body.
const _: () = assert!(MAX_CARRIED_REQUEST <= TUNNEL_FRAMES * CHUNK);

/// How long the owner may take to start its answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest head (method, URI, headers; status and headers) read.
const MAX_HEAD_BYTES: usize = 64 * 1024;

tokio::task_local! {
    static OWNER: RefCell<Option<String>>;
}

/// Notes, for the request being served, that another live node owns the
/// unit it asked for (nothing outside a request).
pub fn note_owner(owner: &str) {
    let _ = OWNER.try_with(|o| *o.borrow_mut() = Some(owner.to_owned()));
}

/// Runs `f` (which looks a unit up), and says which live node owns the
/// unit when it is another's (what [`note_owner`] noted meanwhile).
pub async fn owner_of<F: std::future::Future>(f: F) -> (F::Output, Option<String>) {
    OWNER
        .scope(RefCell::new(None), async {
            let r = f.await;
            (r, OWNER.with(|o| o.borrow_mut().take()))
        })
        .await
}

/// The mark of a request another node carried here.
#[derive(Clone, Copy)]
pub struct Carried;

#[derive(Serialize, Deserialize)]
struct RequestHead {
    method: String,
    uri: String,
    headers: Vec<(String, String)>,
}

#[derive(Serialize, Deserialize)]
struct ResponseHead {
    status: u16,
    headers: Vec<(String, String)>,
}

fn visible_headers(h: &axum::http::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect()
}

fn set_headers(into: &mut axum::http::HeaderMap, headers: Vec<(String, String)>) {
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
            into.append(k, v);
        }
    }
}

/// The middleware: serves the request here, and carries it to the unit's
/// owner when the answer says another node has it.
pub async fn carry_http(State(tunnels): State<Arc<Tunnels>>, req: Request, next: Next) -> Response {
    let declared = req.body().size_hint().exact();
    let carried = req.extensions().get::<Carried>().is_some();
    let upgrade = req.headers().contains_key(axum::http::header::UPGRADE);
    let Some(len) = declared.filter(|n| !carried && !upgrade && *n as usize <= MAX_CARRIED_REQUEST)
    else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, len as usize).await else {
        return (StatusCode::BAD_REQUEST, "the request body ended early").into_response();
    };
    let head = RequestHead {
        method: parts.method.as_str().to_owned(),
        uri: parts.uri.to_string(),
        headers: visible_headers(&parts.headers),
    };
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_default();
    let req = Request::from_parts(parts, Body::from(bytes.clone()));
    let (answer, owner) = owner_of(next.run(req)).await;
    match owner {
        Some(owner) if answer.status() == StatusCode::SERVICE_UNAVAILABLE => tunnels
            .carry_request(&owner, head, bytes, &peer)
            .await
            .unwrap_or(answer),
        _ => answer,
    }
}

/// Ends its tunnel when the answer's body is dropped (read to its end, or
/// the client went).
struct Ends(Arc<Tunnels>, String);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.remove(&self.1);
    }
}

impl Tunnels {
    /// Carries one request to `owner`: its answer, or `None` when the
    /// owner could not be reached or did not start answering in time.
    async fn carry_request(
        self: &Arc<Self>,
        owner: &str,
        head: RequestHead,
        body: Bytes,
        peer: &str,
    ) -> Option<Response> {
        let id = Tunnels::new_id();
        let (tx, mut rx) = mpsc::channel(TUNNEL_FRAMES);
        if !self.register(&id, owner, super::dispatch::To::Queue(tx)) {
            return None;
        }
        let open = Ends(Arc::clone(self), id.clone());
        let route = Route {
            owner,
            protocol: HTTP_PROTOCOL,
            ip: peer,
            handshake: "",
        };
        if !self.open_there(&id, &route).await {
            self.metrics
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        let mut sender = self.sender(owner, &id);
        let head = Bytes::from(serde_json::to_vec(&head).ok()?);
        let frames = std::iter::once(head).chain(chunks(body));
        let wires = frames
            .map(super::wire::Wire::Binary)
            .chain([super::wire::Wire::End]);
        for w in wires {
            std::future::poll_fn(|cx| sender.poll_room(cx)).await;
            sender.send(&w).then_some(())?;
        }
        let first = tokio::time::timeout(ANSWER_TIMEOUT, rx.recv())
            .await
            .ok()??;
        let Ok(Message::Binary(h)) = first else {
            return None;
        };
        let h: ResponseHead = serde_json::from_slice(&h).ok()?;
        let stream = futures_util::stream::unfold((rx, open), |(mut rx, open)| async move {
            match rx.recv().await {
                Some(Ok(Message::Binary(b))) => Some((Ok(b), (rx, open))),
                Some(Ok(Message::Close(_))) => None,
                Some(Ok(_)) => Some((Ok(Bytes::new()), (rx, open))),
                Some(Err(_)) | None => Some((
                    Err(std::io::Error::other("the answer was cut between nodes")),
                    (rx, open),
                )),
            }
        });
        let mut r = Response::new(Body::from_stream(stream));
        *r.status_mut() = StatusCode::from_u16(h.status).ok()?;
        set_headers(r.headers_mut(), h.headers);
        Some(r)
    }

    /// The owner's side of a carried request: runs it through this node's
    /// router, and sends the answer back.
    pub(super) fn serve_carried(
        self: &Arc<Self>,
        mut from_peer: mpsc::Receiver<Result<Message, crate::ws::Error>>,
        to_peer: mpsc::Sender<Message>,
        peer: String,
        done: impl FnOnce() + Send + 'static,
    ) {
        let Some(router) = self.router.get().cloned() else {
            return;
        };
        tokio::spawn(async move {
            // Whatever way this ends, the tunnel goes.
            struct Done<F: FnOnce()>(Option<F>);
            impl<F: FnOnce()> Drop for Done<F> {
                fn drop(&mut self) {
                    if let Some(f) = self.0.take() {
                        f();
                    }
                }
            }
            let _done = Done(Some(done));
            let Ok(Some(Ok(Message::Binary(h)))) =
                tokio::time::timeout(ANSWER_TIMEOUT, from_peer.recv()).await
            else {
                return;
            };
            if h.len() > MAX_HEAD_BYTES {
                return;
            }
            let Ok(h) = serde_json::from_slice::<RequestHead>(&h) else {
                return;
            };
            let body = futures_util::stream::unfold(from_peer, |mut rx| async move {
                match rx.recv().await {
                    Some(Ok(Message::Binary(b))) => Some((Ok::<_, std::io::Error>(b), rx)),
                    _ => None,
                }
            });
            let (Ok(method), Ok(uri)) = (
                Method::from_bytes(h.method.as_bytes()),
                h.uri.parse::<Uri>(),
            ) else {
                return;
            };
            let mut req = Request::new(Body::from_stream(body));
            *req.method_mut() = method;
            *req.uri_mut() = uri;
            set_headers(req.headers_mut(), h.headers);
            req.extensions_mut().insert(Carried);
            if let Ok(addr) = peer.parse::<SocketAddr>() {
                req.extensions_mut().insert(ConnectInfo(addr));
            }
            let Ok(answer) = tower::ServiceExt::oneshot(router, req).await;
            send_answer(answer, &to_peer).await;
        });
    }
}

/// Sends an answer's head, its body in [`CHUNK`]s, then a close.
async fn send_answer(answer: Response, to_peer: &mpsc::Sender<Message>) {
    let (parts, mut body) = answer.into_parts();
    let head = ResponseHead {
        status: parts.status.as_u16(),
        headers: visible_headers(&parts.headers),
    };
    let Ok(head) = serde_json::to_vec(&head) else {
        return;
    };
    if to_peer.send(Message::Binary(head.into())).await.is_err() {
        return;
    }
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        let Ok(frame) = frame else { return };
        if let Ok(data) = frame.into_data() {
            for c in chunks(data) {
                if to_peer.send(Message::Binary(c)).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = to_peer
        .send(Message::Close(Some(CloseFrame {
            code: 1000.into(),
            reason: "".into(),
        })))
        .await;
}

/// `b` in pieces of at most [`CHUNK`] bytes, sharing its memory.
fn chunks(b: Bytes) -> impl Iterator<Item = Bytes> {
    let n = b.len().div_ceil(CHUNK);
    (0..n).map(move |i| b.slice(i * CHUNK..((i + 1) * CHUNK).min(b.len())))
}
