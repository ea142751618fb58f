//! Worker RPC on the device socket, as the library's `PeerState` has it:
//! a Plugin API call the device never answers ends at its deadline (on the
//! manual clock) with a `cancel`, and not before; a `stream-open` (the Host
//! API has no streams) is answered and the device plays on; a `hello` of
//! another MAJOR ends the connection with a `goodbye` that says why.

use crate::support::session::*;
use futures_util::{SinkExt, StreamExt};
use hostwire::sessions::rpc::PLUGIN_CALL_TIMEOUT_MS;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn next_text(ws: &mut Ws) -> Value {
    loop {
        match tokio::time::timeout(GUARD, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => return serde_json::from_str::<Value>(&t).unwrap(),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    }
}

/// The frames up to the response to `id`, which is the last.
async fn until_response(ws: &mut Ws, id: u64) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let f = next_text(ws).await;
        let done = f["kind"] == "response" && f["id"] == id;
        seen.push(f);
        if done {
            return seen;
        }
    }
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// A raw board socket of a started game that has said its Memizy hello.
async fn board(h: &TestHost) -> (Ws, String, String) {
    let api = Api::of(h);
    let (sid, token) = api.create(&presenter_body(2)).await;
    api.op(&sid, &token, "start").await;
    let url = format!(
        "{}/memizy/session/ws?session={sid}&view=board&address=board&token={token}",
        h.ws
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let first = next_text(&mut ws).await;
    assert_eq!(first["kind"], "hello", "{first}");
    let hello = hostwire::sessions::device::hello_args(PLUGIN_ID);
    send(
        &mut ws,
        json!({"v": "1.0.0", "kind": "request", "id": 1, "method": "hello", "params": hello}),
    )
    .await;
    let r = until_response(&mut ws, 1).await;
    assert_eq!(r.last().unwrap()["ok"], true, "{r:?}");
    (ws, sid, token)
}

#[tokio::test]
async fn a_plugin_api_call_never_answered_ends_at_its_deadline_with_a_cancel() {
    let h = TestHost::start().await;
    let (mut ws, sid, token) = board(&h).await;
    // A player is renamed: the board gets a Plugin API call
    // (`playersChanged`), and never answers it.
    let api = Api::of(&h);
    api.request(
        "PATCH",
        &format!("/memizy/sessions/{sid}/players/p1"),
        Some(&token),
        Some(&json!({"name": "Ann"})),
    )
    .await;
    let call = loop {
        let f = next_text(&mut ws).await;
        if f["kind"] == "request" {
            break f;
        }
    };
    let id = call["id"].as_u64().unwrap();
    let sessions = &h.server.as_ref().unwrap().sessions;
    // Just before the deadline nothing is cancelled: the answer to a call
    // sent after the wake comes first.
    h.clock.advance_ms(PLUGIN_CALL_TIMEOUT_MS - 1);
    sessions.wake().await;
    send(
        &mut ws,
        json!({"v": "1.0.0", "kind": "request", "id": 2, "method": "noSuchCall", "params": []}),
    )
    .await;
    let before = until_response(&mut ws, 2).await;
    assert!(before.iter().all(|f| f["kind"] != "cancel"), "{before:?}");
    // At the deadline the call ends and the device is told.
    h.clock.advance_ms(1);
    sessions.wake().await;
    send(
        &mut ws,
        json!({"v": "1.0.0", "kind": "request", "id": 3, "method": "noSuchCall", "params": []}),
    )
    .await;
    let after = until_response(&mut ws, 3).await;
    let cancels: Vec<&Value> = after.iter().filter(|f| f["kind"] == "cancel").collect();
    assert_eq!(cancels.len(), 1, "{after:?}");
    assert_eq!(cancels[0]["id"], id, "{after:?}");
    // Its late answer is taken quietly; the device plays on.
    send(
        &mut ws,
        json!({"v": "1.0.0", "kind": "response", "id": id, "ok": true, "result": null}),
    )
    .await;
    send(
        &mut ws,
        json!({"v": "1.0.0", "kind": "request", "id": 4, "method": "ready", "params": []}),
    )
    .await;
    let r = until_response(&mut ws, 4).await;
    assert_eq!(r.last().unwrap()["ok"], true, "{r:?}");
}

/// The next Plugin API call the board gets.
async fn next_call(ws: &mut Ws) -> u64 {
    loop {
        let f = next_text(ws).await;
        if f["kind"] == "request" {
            return f["id"].as_u64().unwrap();
        }
    }
}

/// The cancels among the frames up to the response to a probe `id`.
async fn cancels_by(ws: &mut Ws, id: u64) -> Vec<Value> {
    send(
        ws,
        json!({"v": "1.0.0", "kind": "request", "id": id, "method": "noSuchCall", "params": []}),
    )
    .await;
    let seen = until_response(ws, id).await;
    seen.into_iter().filter(|f| f["kind"] == "cancel").collect()
}

#[tokio::test]
async fn a_later_call_ends_at_its_own_deadline_after_an_earlier_one_was_answered() {
    let h = TestHost::start().await;
    let (mut ws, sid, token) = board(&h).await;
    let api = Api::of(&h);
    let rename = |name: &'static str| {
        let (api, path, token) = (&api, format!("/memizy/sessions/{sid}/players/p1"), &token);
        async move {
            api.request("PATCH", &path, Some(token), Some(&json!({"name": name})))
                .await;
        }
    };
    // The first call is answered; the second, 10 s later, is not.
    rename("Ann").await;
    let first = next_call(&mut ws).await;
    send(
        &mut ws,
        json!({"v": "1.0.0", "kind": "response", "id": first, "ok": true, "result": null}),
    )
    .await;
    h.clock.advance_ms(10_000);
    rename("Bea").await;
    let second = next_call(&mut ws).await;
    let sessions = &h.server.as_ref().unwrap().sessions;
    // The first call's deadline passes: nothing ends.
    h.clock.advance_ms(PLUGIN_CALL_TIMEOUT_MS - 10_000);
    sessions.wake().await;
    assert_eq!(cancels_by(&mut ws, 2).await, Vec::<Value>::new());
    // Just before the second's nothing either; at it, the second ends.
    h.clock.advance_ms(10_000 - 1);
    sessions.wake().await;
    assert_eq!(cancels_by(&mut ws, 3).await, Vec::<Value>::new());
    h.clock.advance_ms(1);
    sessions.wake().await;
    let cancels = cancels_by(&mut ws, 4).await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["id"], second, "{cancels:?}");
}

#[tokio::test]
async fn a_stream_open_is_answered_unknown_method_and_the_device_plays_on() {
    let h = TestHost::start().await;
    let (mut ws, _, _) = board(&h).await;
    send(
        &mut ws,
        json!({"v": "1.0.0", "kind": "stream-open", "id": 7, "method": "send", "params": []}),
    )
    .await;
    let r = until_response(&mut ws, 7).await;
    let last = r.last().unwrap();
    assert_eq!(last["ok"], false, "{r:?}");
    assert_eq!(last["error"]["code"], "UNKNOWN_METHOD", "{r:?}");
    send(
        &mut ws,
        json!({"v": "1.0.0", "kind": "request", "id": 8, "method": "ready", "params": []}),
    )
    .await;
    let r = until_response(&mut ws, 8).await;
    assert_eq!(r.last().unwrap()["ok"], true, "{r:?}");
}

#[tokio::test]
async fn a_hello_of_another_major_ends_the_connection_with_a_goodbye_that_says_why() {
    let h = TestHost::start().await;
    let (mut ws, _, _) = board(&h).await;
    send(
        &mut ws,
        json!({"v": "2.0.0", "kind": "hello", "features": []}),
    )
    .await;
    let bye = loop {
        let f = next_text(&mut ws).await;
        if f["kind"] == "goodbye" {
            break f;
        }
    };
    assert_eq!(bye["error"]["code"], "VERSION_MISMATCH", "{bye}");
    assert!(
        bye["error"]["message"].as_str().unwrap().contains("2.0.0"),
        "{bye}"
    );
    let close = loop {
        match tokio::time::timeout(GUARD, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(c))) => break c,
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(close.map(|c| u16::from(c.code)), Some(1002));
}
