//! The peer over real transports: a child process (NDJSON on stdin and
//! stdout) and a WebSocket on 127.0.0.1.

use futures_util::{SinkExt, StreamExt};
use hostwire_worker_rpc::transport::{spawn_worker, websocket};
use hostwire_worker_rpc::{codes, Peer, PeerConfig, Side};
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test]
async fn a_child_process_worker() {
    let cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire-echo-worker"));
    let (transport, mut child) = spawn_worker(cmd).unwrap();
    let host = Peer::new(Side::Host, transport, PeerConfig::default());
    host.ready().await.unwrap();
    assert_eq!(
        host.call("echo", json!({"a": [1, "x", null]}))
            .await
            .unwrap(),
        json!({"a": [1, "x", null]})
    );
    assert_eq!(
        host.call("add", json!({"a": 1.5, "b": 2})).await.unwrap(),
        json!(3.5)
    );
    let e = host.call("fail", Value::Null).await.unwrap_err();
    assert_eq!(
        (e.code.as_str(), e.cause.as_ref().unwrap().code.as_str()),
        ("OUTER", "INNER")
    );
    assert_eq!(
        host.call("missing", Value::Null).await.unwrap_err().code,
        codes::UNKNOWN_METHOD
    );
    let mut tx = host.open_stream("sum", Value::Null);
    for i in 1..=500 {
        tx.send(json!(i)).await.unwrap();
    }
    assert_eq!(tx.finish().await.unwrap(), json!(125_250.0));
    // Cancel reaches the worker process; the worker answers CANCELLED,
    // which arrives as a response after cancel.
    let mut call = host.call("wait", Value::Null);
    assert_eq!(
        call.next_progress().await.map(|p| p.to_value().unwrap()),
        Some(json!({"stage": "waiting"}))
    );
    call.cancel();
    let mut dropped = host.call("wait", Value::Null);
    dropped.next_progress().await;
    drop(dropped);
    while host.stats().responses_after_cancel < 2 {
        tokio::task::yield_now().await;
    }
    // Goodbye ends the worker cleanly.
    host.goodbye("done").await;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn a_worker_that_dies_fails_pending_calls() {
    let cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire-echo-worker"));
    let (transport, mut child) = spawn_worker(cmd).unwrap();
    let host = Peer::new(Side::Host, transport, PeerConfig::default());
    host.ready().await.unwrap();
    let call = host.call("wait", Value::Null);
    child.kill().await.unwrap();
    assert_eq!(call.await.unwrap_err().code, codes::TRANSPORT_CLOSED);
}

#[tokio::test]
async fn over_a_websocket() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let worker = Peer::new(Side::Worker, websocket(ws), PeerConfig::default());
        worker.register("echo", |p, _| async move { Ok(p) });
        worker.register_stream("count", |_, mut rx, _| async move {
            let mut n = 0;
            while let Some(v) = rx.next().await {
                v?;
                n += 1;
            }
            Ok(json!(n))
        });
        worker.wait_closed().await
    });
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}"))
        .await
        .unwrap();
    let host = Peer::new(Side::Host, websocket(ws), PeerConfig::default());
    assert_eq!(
        host.call("echo", json!("over ws")).await.unwrap(),
        json!("over ws")
    );
    let mut tx = host.open_stream("count", Value::Null);
    for i in 0..100 {
        tx.send(json!(i)).await.unwrap();
    }
    assert_eq!(tx.finish().await.unwrap(), json!(100));
    host.goodbye("bye").await;
    let why = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(why.code, codes::PEER_GOODBYE);
}

#[tokio::test]
async fn a_binary_websocket_message_that_is_not_utf8_fails_one_frame() {
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let worker = Peer::new(Side::Worker, websocket(ws), PeerConfig::default());
        worker.register("echo", |p, _| async move { Ok(p) });
        worker.wait_closed().await
    });
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}"))
        .await
        .unwrap();
    assert!(next_text(&mut ws).await.contains("hello"));
    ws.send(Message::text(r#"{"v":"1.0.0","kind":"hello"}"#))
        .await
        .unwrap();
    let mut bad = br#"{"v":"1.0.0","kind":"request","id":3,"method":"echo","params":""#.to_vec();
    bad.extend_from_slice(b"\xc3\x28\"}");
    ws.send(Message::binary(bad)).await.unwrap();
    let answer = next_text(&mut ws).await;
    assert!(
        answer.contains(r#""id":3,"ok":false"#) && answer.contains("not UTF-8"),
        "{answer}"
    );
    // The connection goes on; binary UTF-8 is read like text.
    ws.send(Message::binary(
        br#"{"v":"1.0.0","kind":"request","id":4,"method":"echo","params":"ok"}"#.to_vec(),
    ))
    .await
    .unwrap();
    let answer = next_text(&mut ws).await;
    assert!(
        answer.contains(r#""id":4,"ok":true,"result":"ok""#),
        "{answer}"
    );
}

async fn next_text<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::Message;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Text(t))) => return t.to_string(),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    }
}
