//! The peer over real transports: a child process (NDJSON on stdin and
//! stdout) and a WebSocket on 127.0.0.1.

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
