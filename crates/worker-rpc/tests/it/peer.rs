//! The peer over the in-memory transport: calls, cancel, progress, streams,
//! hello, goodbye and every failure on the wire.

use futures_util::{SinkExt, StreamExt};
use hostwire_worker_rpc::frame::*;
use hostwire_worker_rpc::transport::{memory_pair, Inbound, Transport};
use hostwire_worker_rpc::{codes, Payload, Peer, PeerConfig, RpcError, Side};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn pair() -> (Peer, Peer) {
    let (a, b) = memory_pair();
    (
        Peer::new(Side::Host, a, PeerConfig::default()),
        Peer::new(Side::Worker, b, PeerConfig::default()),
    )
}

/// The other end of a peer, driven frame by frame.
struct Raw {
    t: Transport,
}

impl Raw {
    async fn recv(&mut self) -> Frame {
        let text = tokio::time::timeout(Duration::from_secs(10), self.t.reader.next())
            .await
            .expect("a frame")
            .expect("open")
            .unwrap();
        let Inbound::Frame(bytes) = text else {
            panic!("oversize")
        };
        parse_frame_bytes(&bytes).unwrap()
    }
    async fn send(&mut self, v: Value) {
        self.t.writer.send(v.to_string()).await.unwrap();
    }
    async fn hello(&mut self) {
        assert_eq!(self.recv().await.kind(), "hello");
        self.send(json!({"v": "1.0.0", "kind": "hello"})).await;
    }
}

fn raw_pair(side: Side) -> (Peer, Raw) {
    let (a, b) = memory_pair();
    (Peer::new(side, a, PeerConfig::default()), Raw { t: b })
}

#[tokio::test]
async fn calls_errors_and_unknown_methods() {
    let (host, worker) = pair();
    worker.register("add", |p, _| async move {
        let p = p.to_value().unwrap();
        Ok(json!(p["a"].as_i64().unwrap() + p["b"].as_i64().unwrap()))
    });
    worker.register("fail", |_, _| async move {
        Err::<Value, _>(
            RpcError::new("OUTER", "it failed")
                .with_data(json!({"x": 1}))
                .with_cause(RpcError::new("INNER", "because")),
        )
    });
    assert_eq!(
        host.call("add", json!({"a": 2, "b": 3})).await.unwrap(),
        json!(5)
    );
    let e = host.call("fail", Value::Null).await.unwrap_err();
    assert_eq!(
        (e.code.as_str(), e.data.map(|d| d.to_value().unwrap())),
        ("OUTER", Some(json!({"x": 1})))
    );
    assert_eq!(e.cause.as_ref().unwrap().code, "INNER");
    let e = host.call("nope", Value::Null).await.unwrap_err();
    assert_eq!(e.code, codes::UNKNOWN_METHOD);
    assert!(e.message.contains("nope"));
    // Both directions.
    host.register("ping", |_, _| async move { Ok(json!("pong")) });
    assert_eq!(
        worker.call("ping", Value::Null).await.unwrap(),
        json!("pong")
    );
    // Many concurrent calls each get their own answer.
    let calls: Vec<_> = (0..100)
        .map(|i| host.call("add", json!({"a": i, "b": 1})))
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        assert_eq!(c.await.unwrap(), json!(i as i64 + 1));
    }
    assert_eq!(host.stats(), Default::default());
    assert_eq!(host.pending() + worker.pending(), 0);
}

#[tokio::test]
async fn progress_reaches_the_caller() {
    let (host, worker) = pair();
    worker.register("job", |_, ctx| async move {
        for i in 1..=3 {
            ctx.progress(json!({"done": i, "total": 3})).unwrap();
        }
        Ok(json!("finished"))
    });
    let mut call = host.call("job", Value::Null);
    for i in 1..=3 {
        assert_eq!(
            call.next_progress().await.map(|p| p.to_value().unwrap()),
            Some(json!({"done": i, "total": 3}))
        );
    }
    assert_eq!(call.await.unwrap(), json!("finished"));
}

fn cancellable(worker: &Peer) -> Arc<AtomicUsize> {
    let seen = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&seen);
    worker.register("wait", move |_, ctx| {
        let s = Arc::clone(&s);
        async move {
            ctx.progress(json!("started")).unwrap();
            ctx.cancel.cancelled().await;
            s.fetch_add(1, Ordering::SeqCst);
            Ok(json!("ignored after cancel"))
        }
    });
    seen
}

#[tokio::test(start_paused = true)]
async fn cancel_drop_and_timeout_reach_the_handler() {
    let (host, worker) = pair();
    let seen = cancellable(&worker);
    // Explicit cancel.
    let mut call = host.call("wait", Value::Null);
    assert_eq!(
        call.next_progress().await.map(|p| p.to_value().unwrap()),
        Some(json!("started"))
    );
    call.cancel();
    // Dropping the future.
    let mut call = host.call("wait", Value::Null);
    assert_eq!(
        call.next_progress().await.map(|p| p.to_value().unwrap()),
        Some(json!("started"))
    );
    drop(call);
    // A deadline.
    let e = host
        .call("wait", Value::Null)
        .timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(e.code, codes::TIMEOUT);
    // The handlers saw all three, and answered CANCELLED, which the caller
    // drops as a response after cancel, not as an error.
    while seen.load(Ordering::SeqCst) < 3 || host.stats().responses_after_cancel < 3 {
        tokio::task::yield_now().await;
    }
    assert_eq!(host.stats().protocol_errors, 0);
    assert_eq!(host.pending() + worker.pending(), 0);
}

#[tokio::test]
async fn hello_comes_first_and_holds_everything_else() {
    let (peer, mut raw) = raw_pair(Side::Host);
    let call = peer.call("echo", json!(1));
    let first = raw.recv().await;
    assert!(matches!(first, Frame::Hello { ref agent, .. } if agent.is_some()));
    // The request is held until the other side's hello.
    assert!(
        tokio::time::timeout(Duration::from_millis(50), raw.t.reader.next())
            .await
            .is_err()
    );
    raw.send(json!({"v": "1.0.0", "kind": "hello", "features": []}))
        .await;
    let Frame::Request { id, method, .. } = raw.recv().await else {
        panic!()
    };
    assert_eq!((id, method.as_str()), (1, "echo"), "ids count from 1");
    raw.send(json!({"v": "1.0.0", "kind": "response", "id": id, "ok": true, "result": "back"}))
        .await;
    assert_eq!(call.await.unwrap(), json!("back"));
    peer.ready().await.unwrap();
}

#[tokio::test]
async fn a_hello_of_another_major_is_a_version_mismatch() {
    let (peer, mut raw) = raw_pair(Side::Host);
    let call = peer.call("echo", json!(1));
    raw.recv().await;
    raw.send(json!({"v": "2.0.0", "kind": "hello"})).await;
    let e = call.await.unwrap_err();
    assert_eq!(e.code, codes::VERSION_MISMATCH);
    assert!(e.message.contains("2.0.0"));
    let Frame::Goodbye {
        error: Some(err), ..
    } = raw.recv().await
    else {
        panic!("expected goodbye")
    };
    assert_eq!(err.code, codes::VERSION_MISMATCH);
    assert_eq!(
        peer.ready().await.unwrap_err().code,
        codes::VERSION_MISMATCH
    );
    assert_eq!(peer.stats().version_mismatches, 1);
}

#[tokio::test]
async fn a_request_of_another_major_is_answered_version_mismatch() {
    let (peer, mut raw) = raw_pair(Side::Worker);
    peer.register("echo", |p, _| async move { Ok(p) });
    raw.hello().await;
    raw.send(json!({"v": "3.1.0", "kind": "request", "id": 1, "method": "echo"}))
        .await;
    let Frame::Response {
        id: 1,
        outcome: Outcome::Err(e),
        ..
    } = raw.recv().await
    else {
        panic!()
    };
    assert_eq!(e.code, codes::VERSION_MISMATCH);
    // The connection goes on.
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 3, "method": "echo", "params": 9}))
        .await;
    assert!(
        matches!(raw.recv().await, Frame::Response { id: 3, outcome: Outcome::Ok(ref v), .. } if *v == json!(9))
    );
}

#[tokio::test]
async fn wire_failures_are_counted_and_answered() {
    let (peer, mut raw) = raw_pair(Side::Host);
    peer.register("echo", |p, _| async move { Ok(p) });
    raw.hello().await;
    // A response to an id never issued.
    raw.send(json!({"v": "1.0.0", "kind": "response", "id": 99, "ok": true}))
        .await;
    // A second response to one request.
    let call = peer.call("x", Value::Null);
    let Frame::Request { id, .. } = raw.recv().await else {
        panic!()
    };
    for _ in 0..2 {
        raw.send(json!({"v": "1.0.0", "kind": "response", "id": id, "ok": true, "result": 1}))
            .await;
    }
    assert_eq!(call.await.unwrap(), json!(1));
    // A malformed request is answered with the field that is wrong.
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 2}))
        .await;
    let Frame::Response {
        id: 2,
        outcome: Outcome::Err(e),
        ..
    } = raw.recv().await
    else {
        panic!()
    };
    assert_eq!(e.code, codes::PROTOCOL_ERROR);
    assert!(e.message.contains("method"), "{}", e.message);
    // Ids are the peer's own: any id not in flight, in any order.
    for id in [4, 5, 2, 9_007_199_254_740_991u64, 0] {
        raw.send(
            json!({"v": "1.0.0", "kind": "request", "id": id, "method": "echo", "params": id}),
        )
        .await;
        assert!(
            matches!(raw.recv().await, Frame::Response { id: i, outcome: Outcome::Ok(ref v), .. } if i == id && *v == json!(id))
        );
    }
    // Not JSON at all.
    raw.t.writer.send("not json".into()).await.unwrap();
    // Wait until the reader has seen everything: a round trip.
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 6, "method": "echo", "params": "sync"}))
        .await;
    raw.recv().await;
    let s = peer.stats();
    assert_eq!(s.duplicate_responses, 1, "{s:?}");
    assert_eq!(s.unknown_ids, 1, "{s:?}");
    // Unknown id, duplicate response, malformed request, not JSON.
    assert_eq!(s.protocol_errors, 4, "{s:?}");
    assert!(peer
        .last_protocol_error()
        .unwrap()
        .contains("malformed frame"));
}

#[tokio::test(start_paused = true)]
async fn a_sender_never_exceeds_the_granted_credit() {
    let (peer, mut raw) = raw_pair(Side::Host);
    raw.hello().await;
    let mut tx = peer.open_stream("upload", json!({"name": "f"}));
    let Frame::StreamOpen { id, method, .. } = raw.recv().await else {
        panic!()
    };
    assert_eq!(method, "upload");
    raw.send(json!({"v": "1.0.0", "kind": "stream-ack", "id": id, "ack": 0, "credit": 3}))
        .await;
    for i in 0..3 {
        tx.send(json!(i)).await.unwrap();
    }
    assert_eq!(tx.credit(), 0);
    // No fourth chunk until more credit: with time paused, waiting a minute
    // costs nothing.
    assert!(
        tokio::time::timeout(Duration::from_secs(60), tx.send(json!(3)))
            .await
            .is_err()
    );
    for seq in 1..=3 {
        assert!(matches!(raw.recv().await, Frame::StreamChunk { seq: s, .. } if s == seq));
    }
    raw.send(json!({"v": "1.0.0", "kind": "stream-ack", "id": id, "ack": 3, "credit": 2}))
        .await;
    tx.send(json!(4)).await.unwrap();
    tx.send(json!(5)).await.unwrap();
    assert!(matches!(
        raw.recv().await,
        Frame::StreamChunk { seq: 4, .. }
    ));
    assert!(matches!(
        raw.recv().await,
        Frame::StreamChunk { seq: 5, .. }
    ));
    let finish = tokio::spawn(tx.finish());
    assert!(matches!(
        raw.recv().await,
        Frame::StreamEnd {
            outcome: Outcome::Ok(_),
            ..
        }
    ));
    raw.send(json!({"v": "1.0.0", "kind": "response", "id": id, "ok": true, "result": "stored"}))
        .await;
    assert_eq!(finish.await.unwrap().unwrap(), json!("stored"));
}

#[tokio::test]
async fn a_chunk_beyond_the_credit_ends_the_stream() {
    let (peer, mut raw) = raw_pair(Side::Worker);
    let got = Arc::new(AtomicUsize::new(0));
    let g = Arc::clone(&got);
    peer.register_stream("sink", move |_, mut rx, _| {
        let g = Arc::clone(&g);
        async move {
            while let Some(item) = rx.next().await {
                item?;
                g.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Value::Null)
        }
    });
    raw.hello().await;
    raw.send(json!({"v": "1.0.0", "kind": "stream-open", "id": 1, "method": "sink"}))
        .await;
    let Frame::StreamAck { credit, .. } = raw.recv().await else {
        panic!()
    };
    assert_eq!(credit, 16);
    for seq in 1..=17 {
        raw.send(json!({"v": "1.0.0", "kind": "stream-chunk", "id": 1, "seq": seq, "data": seq}))
            .await;
    }
    loop {
        match raw.recv().await {
            Frame::StreamAck { .. } => continue,
            Frame::Response {
                id: 1,
                outcome: Outcome::Err(e),
                ..
            } => {
                assert_eq!(e.code, codes::STREAM_CREDIT_EXCEEDED);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(peer.stats().credit_violations, 1);
    assert!(got.load(Ordering::SeqCst) <= 16);
}

#[tokio::test]
async fn streams_in_both_directions() {
    let (host, worker) = pair();
    worker.register_stream("sum", |_, mut rx, _| async move {
        let mut total = 0;
        while let Some(v) = rx.next().await {
            total += v?.parse::<i64>().unwrap();
        }
        Ok(json!(total))
    });
    let mut tx = host.open_stream("sum", Value::Null);
    for i in 1..=1000 {
        tx.send(json!(i)).await.unwrap();
    }
    assert_eq!(tx.finish().await.unwrap(), json!(500_500));
    // The worker streams back to the host from inside a call.
    host.register_stream("collect", |_, mut rx, _| async move {
        let mut all = Vec::new();
        while let Some(v) = rx.next().await {
            all.push(v?);
        }
        Ok(Payload::json(&all).unwrap())
    });
    worker.register("produce", |p, ctx| async move {
        let mut tx = ctx.peer.open_stream("collect", Value::Null);
        for i in 0..p.parse::<i64>().unwrap() {
            tx.send(json!(i)).await?;
        }
        tx.finish().await
    });
    assert_eq!(
        host.call("produce", json!(40)).await.unwrap(),
        json!((0..40).collect::<Vec<_>>())
    );
    // A stream to an unknown method fails its sender.
    let mut tx = host.open_stream("nowhere", Value::Null);
    let _ = tx.send(json!(1)).await;
    assert_eq!(tx.finish().await.unwrap_err().code, codes::UNKNOWN_METHOD);
    // An aborted stream reaches the receiver as an error.
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel::<RpcError>();
    let seen_tx = std::sync::Mutex::new(Some(seen_tx));
    worker.register_stream("watch", move |_, mut rx, _| {
        let s = seen_tx.lock().unwrap().take();
        async move {
            while let Some(v) = rx.next().await {
                if let Err(e) = v {
                    if let Some(s) = s {
                        let _ = s.send(e.clone());
                    }
                    return Err(e);
                }
            }
            Ok(Value::Null)
        }
    });
    let mut tx = host.open_stream("watch", Value::Null);
    tx.send(json!(1)).await.unwrap();
    tx.abort(RpcError::new("DISK_FULL", "no space"));
    assert_eq!(seen_rx.await.unwrap().code, "DISK_FULL");
}

#[tokio::test]
async fn goodbye_in_the_middle_of_calls_and_streams() {
    let (host, worker) = pair();
    let seen = cancellable(&worker);
    worker.register_stream("hold", |_, mut rx, _| async move {
        while let Some(v) = rx.next().await {
            v?;
        }
        Ok(Value::Null)
    });
    let mut call = host.call("wait", Value::Null);
    call.next_progress().await;
    let mut tx = host.open_stream("hold", Value::Null);
    tx.send(json!(1)).await.unwrap();
    let other = host.call("wait", Value::Null);
    worker.goodbye("shutting down").await;
    let e = call.await.unwrap_err();
    assert_eq!(e.code, codes::PEER_GOODBYE);
    assert!(e.message.contains("shutting down"));
    assert_eq!(other.await.unwrap_err().code, codes::PEER_GOODBYE);
    let mut failed = None;
    for i in 0..100 {
        if let Err(e) = tx.send(json!(i)).await {
            failed = Some(e);
            break;
        }
    }
    assert_eq!(failed.unwrap().code, codes::PEER_GOODBYE);
    // The worker's own side is closed too: its handlers were cancelled.
    while seen.load(Ordering::SeqCst) < 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        worker.call("x", Value::Null).await.unwrap_err().code,
        codes::GOODBYE
    );
    assert_eq!(
        host.call("x", Value::Null).await.unwrap_err().code,
        codes::PEER_GOODBYE
    );
}

#[tokio::test]
async fn a_closed_transport_fails_pending_calls() {
    let (peer, raw) = raw_pair(Side::Host);
    let call = peer.call("x", Value::Null);
    drop(raw);
    assert_eq!(call.await.unwrap_err().code, codes::TRANSPORT_CLOSED);
    assert_eq!(peer.wait_closed().await.code, codes::TRANSPORT_CLOSED);
}
