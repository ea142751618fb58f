//! The floor: a bare WebSocket forwarder that speaks just enough of relay
//! protocol 1 for the load generator (create a room, attach, `to`, `up`),
//! with no validation, no limits, no presence and no store. Same stack as
//! hostwire (axum, tokio). Two ways to drive a socket, to measure against
//! each other: a reader task and a writer task (that batches) over the
//! split socket, or one task over the unsplit socket that selects between
//! its next frame and its outbound queue (`--one-task`).

use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

type Tx = mpsc::UnboundedSender<Utf8Bytes>;

#[derive(Default)]
struct RoomConns {
    host: Option<Tx>,
    players: HashMap<String, Tx>,
}

#[derive(Default)]
struct Forwarder {
    rooms: Mutex<HashMap<String, Arc<Mutex<RoomConns>>>>,
    next: AtomicU64,
    one_task: bool,
}

#[derive(Deserialize)]
struct Frame<'a> {
    t: &'a str,
    #[serde(default)]
    pin: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

pub fn router() -> Router {
    router_with(false)
}

/// The forwarder, its sockets each driven by one task when `one_task`.
pub fn router_with(one_task: bool) -> Router {
    Router::new()
        .route("/api/rooms", post(create))
        .route("/ws", get(upgrade))
        .with_state(Arc::new(Forwarder {
            one_task,
            ..Forwarder::default()
        }))
}

async fn create(State(f): State<Arc<Forwarder>>) -> impl IntoResponse {
    let pin = format!("{:06}", 100_000 + f.next.fetch_add(1, Relaxed) % 900_000);
    f.rooms.lock().unwrap().insert(pin.clone(), Arc::default());
    (
        axum::http::StatusCode::CREATED,
        Json(json!({"pin": pin, "hostToken": "bare"})),
    )
}

async fn upgrade(State(f): State<Arc<Forwarder>>, ws: WebSocketUpgrade) -> impl IntoResponse {
    ws.read_buffer_size(1024)
        .write_buffer_size(16 * 1024)
        .on_upgrade(move |s| async move {
            if f.one_task {
                conn_one_task(f, s).await
            } else {
                conn(f, s).await
            }
        })
}

/// What a connection is attached to.
#[derive(Default)]
struct Attached {
    room: Option<Arc<Mutex<RoomConns>>>,
    me: String,
}

/// One task for the connection: the socket is not split, and frames for it
/// are written by the task that reads it, between reads.
async fn conn_one_task(f: Arc<Forwarder>, mut socket: WebSocket) {
    // Unbounded, as in `conn`: the bare forwarder is the benchmark's floor
    // (no limits), driven only by the load generator, which reads.
    let (tx, mut rx) = mpsc::unbounded_channel::<Utf8Bytes>();
    let mut at = Attached::default();
    loop {
        tokio::select! {
            Some(m) = rx.recv() => {
                let mut ok = socket.feed(Message::Text(m)).await.is_ok();
                while ok {
                    match rx.try_recv() {
                        Ok(m) => ok = socket.feed(Message::Text(m)).await.is_ok(),
                        Err(_) => break,
                    }
                }
                if !ok || socket.flush().await.is_err() {
                    break;
                }
            }
            msg = socket.next() => {
                let Some(Ok(msg)) = msg else { break };
                if let Message::Text(text) = msg {
                    on_text(&f, &tx, &mut at, &text);
                }
            }
        }
    }
    if let Some(r) = at.room {
        r.lock().unwrap().players.remove(&at.me);
    }
}

async fn conn(f: Arc<Forwarder>, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    // Unbounded: the bare forwarder is the benchmark's floor, with no
    // limits, driven only by the load generator, which reads.
    let (tx, mut rx) = mpsc::unbounded_channel::<Utf8Bytes>();
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if sink.feed(Message::Text(m)).await.is_err() {
                return;
            }
            while let Ok(m) = rx.try_recv() {
                if sink.feed(Message::Text(m)).await.is_err() {
                    return;
                }
            }
            if sink.flush().await.is_err() {
                return;
            }
        }
    });
    let mut at = Attached::default();
    while let Some(Ok(msg)) = stream.next().await {
        let Message::Text(text) = msg else { continue };
        on_text(&f, &tx, &mut at, &text);
    }
    if let Some(r) = at.room {
        r.lock().unwrap().players.remove(&at.me);
    }
    drop(tx);
    let _ = writer.await;
}

/// One text frame from a connection: what the forwarder does with it.
fn on_text(f: &Forwarder, tx: &Tx, at: &mut Attached, text: &str) {
    let Ok(frame) = serde_json::from_str::<Frame>(text) else {
        return;
    };
    match frame.t {
        "host" | "join" => {
            let Some(r) = frame
                .pin
                .and_then(|p| f.rooms.lock().unwrap().get(&p).cloned())
            else {
                return;
            };
            if frame.t == "host" {
                r.lock().unwrap().host = Some(tx.clone());
                let _ = tx.send(Utf8Bytes::from(r#"{"t":"hosting","players":[]}"#));
            } else {
                at.me = format!("p-{}", f.next.fetch_add(1, Relaxed));
                r.lock().unwrap().players.insert(at.me.clone(), tx.clone());
                let _ = tx.send(Utf8Bytes::from(
                    json!({"t": "joined", "playerId": at.me, "token": "bare"}).to_string(),
                ));
                let presence =
                    json!({"t": "presence", "player": {"id": at.me}, "event": "join"}).to_string();
                if let Some(h) = &r.lock().unwrap().host {
                    let _ = h.send(Utf8Bytes::from(presence));
                }
            }
            at.room = Some(r);
        }
        "to" => {
            if let (Some(r), Some(to)) = (&at.room, frame.to) {
                let out = format!(
                    "{{\"t\":\"data\",\"data\":{}}}",
                    frame.data.map_or("null", |d| d.get())
                );
                if let Some(p) = r.lock().unwrap().players.get(&to) {
                    let _ = p.send(Utf8Bytes::from(out));
                }
            }
        }
        "up" => {
            if let Some(r) = &at.room {
                let out = format!(
                    "{{\"t\":\"from\",\"from\":\"{}\",\"data\":{}}}",
                    at.me,
                    frame.data.map_or("null", |d| d.get())
                );
                if let Some(h) = &r.lock().unwrap().host {
                    let _ = h.send(Utf8Bytes::from(out));
                }
            }
        }
        "ping" => {
            let _ = tx.send(Utf8Bytes::from(r#"{"t":"pong","time":0}"#));
        }
        _ => {}
    }
}
