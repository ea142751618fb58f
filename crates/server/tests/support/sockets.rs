//! Sockets on every endpoint of one server, for the WebSocket driver's
//! tests: raw clients (with or without `Origin`, with a small receive
//! buffer), a joined PlayerThree seat, a started session's board, a
//! subscribed ggui socket.

pub use super::server::ORIGIN;
use super::session::{presenter_body, Api, TestHost, GGUI_AGENT, OPERATOR};
pub use super::ws::Ws;
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// The idle timeout of the three newer endpoints (the relay's is its
/// limits').
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(90);

/// A WebSocket to `url`, with an `Origin` when given and a kernel receive
/// buffer of `recv_buffer` bytes when given (a client that never reads
/// then fills it fast).
pub async fn connect(url: &str, origin: Option<&str>, recv_buffer: Option<u32>) -> Ws {
    super::ws::open(url, origin, recv_buffer).await.unwrap()
}

pub async fn text(ws: &mut Ws) -> Value {
    super::ws::next_json(ws).await
}

/// A PlayerThree match and a seat's token: (match id, operator, token).
pub async fn p3_token(http: &str) -> (String, String, String) {
    let c = reqwest::Client::new();
    let v: Value = c
        .post(format!("{http}/playerthree/matches"))
        .header("Authorization", format!("Bearer {OPERATOR}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = v["match"].as_str().unwrap().to_owned();
    let op = v["operatorToken"].as_str().unwrap().to_owned();
    let r = c
        .post(format!("{http}/playerthree/matches/{id}/tokens"))
        .header("Authorization", format!("Bearer {op}"))
        .body(json!({"kind": "team", "team": "red"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    (id, op, v["token"].as_str().unwrap().to_owned())
}

/// A joined PlayerThree socket (its join answered).
pub async fn p3_joined(h: &TestHost, token: &str, recv_buffer: Option<u32>) -> Ws {
    let mut ws = connect(&format!("{}/playerthree/ws", h.ws), None, recv_buffer).await;
    ws.send(Message::text(
        json!({"op": "join", "token": token}).to_string(),
    ))
    .await
    .unwrap();
    let v = text(&mut ws).await;
    assert_eq!(v["ok"], true, "{v}");
    ws
}

/// A hosted session's board socket, attached (before `hello`).
pub async fn board(h: &TestHost, api: &Api, recv_buffer: Option<u32>) -> Ws {
    let (sid, host) = api.create(&presenter_body(2)).await;
    let (status, v) = api.op(&sid, &host, "start").await;
    assert_eq!(status, 200, "{v}");
    let url = format!(
        "{}/memizy/session/ws?session={sid}&view=board&address=board&token={host}",
        h.ws
    );
    connect(&url, None, recv_buffer).await
}

/// A ggui socket subscribed to a new session.
pub async fn ggui_subscribed(h: &TestHost, session: &str, recv_buffer: Option<u32>) -> Ws {
    let c = reqwest::Client::new();
    let r = c
        .put(format!("{}/ggui/sessions/{session}", h.http))
        .header("Authorization", format!("Bearer {GGUI_AGENT}"))
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let ui_token = ggui_ui_token(h, session).await;
    let mut ws = connect(
        &format!("{}/ggui/ws?token={ui_token}", h.ws),
        None,
        recv_buffer,
    )
    .await;
    ws.send(Message::text(
        json!({"type": "subscribe", "payload": {"sessionId": session}, "requestId": "sub"})
            .to_string(),
    ))
    .await
    .unwrap();
    assert_eq!(text(&mut ws).await["type"], "ack");
    ws
}

/// The live channel's URL with a UI token of `session`, created first.
pub async fn ggui_url(h: &TestHost, session: &str) -> String {
    let r = reqwest::Client::new()
        .put(format!("{}/ggui/sessions/{session}", h.http))
        .header("Authorization", format!("Bearer {GGUI_AGENT}"))
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    format!("{}/ggui/ws?token={}", h.ws, ggui_ui_token(h, session).await)
}

/// A UI token of an existing ggui session, minted by its agent.
pub async fn ggui_ui_token(h: &TestHost, session: &str) -> String {
    let r = reqwest::Client::new()
        .post(format!("{}/ggui/sessions/{session}/ui-tokens", h.http))
        .header("Authorization", format!("Bearer {GGUI_AGENT}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    v["token"].as_str().unwrap().to_owned()
}

/// `hello` on a device socket: the device is then one the session keeps.
pub async fn hello(ws: &mut Ws) {
    let hello = hostwire_worker_rpc::frame::Frame::Request {
        v: hostwire_worker_rpc::frame::PROTOCOL_VERSION.to_owned(),
        id: 1,
        method: "hello".into(),
        params: Some(hostwire_worker_rpc::frame::Payload::from(
            &hostwire::sessions::device::hello_args(super::session::PLUGIN_ID),
        )),
    };
    ws.send(Message::text(hello.to_text())).await.unwrap();
}
