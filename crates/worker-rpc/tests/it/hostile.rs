//! A hostile or buggy peer, frame by frame: every call ends, every malformed
//! frame whose id can be read fails its own call, every queue is bounded.

use futures_util::{SinkExt, StreamExt};
use hostwire_worker_rpc::frame::*;
use hostwire_worker_rpc::transport::{
    memory_pair, memory_pair_bounded, ndjson, Inbound, Transport,
};
use hostwire_worker_rpc::{codes, Payload, Peer, PeerConfig, RpcError, Side};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::oneshot;

/// The other end of a peer, driven frame by frame.
struct Raw {
    t: Transport,
}

impl Raw {
    async fn recv_inbound(&mut self) -> Option<Vec<u8>> {
        match tokio::time::timeout(Duration::from_secs(10), self.t.reader.next())
            .await
            .expect("a frame within 10 s")
        {
            Some(Ok(Inbound::Frame(b))) => Some(b),
            None => None,
            other => panic!("{other:?}"),
        }
    }
    async fn recv(&mut self) -> Frame {
        let b = self.recv_inbound().await.expect("open");
        parse_frame_bytes(&b).unwrap()
    }
    async fn send(&mut self, v: Value) {
        self.send_text(v.to_string()).await;
    }
    async fn send_text(&mut self, t: impl Into<String>) {
        self.t.writer.send(t.into()).await.unwrap();
    }
    async fn hello(&mut self) {
        assert_eq!(self.recv().await.kind(), "hello");
        self.send(json!({"v": "1.0.0", "kind": "hello"})).await;
    }
    /// The error response to `id`.
    async fn error_for(&mut self, id: Id) -> ErrorEnvelope {
        loop {
            match self.recv().await {
                Frame::Response {
                    id: i,
                    outcome: Outcome::Err(e),
                    ..
                } if i == id => return e,
                Frame::StreamAck { .. } => continue,
                other => panic!("expected an error response to {id}, got {other:?}"),
            }
        }
    }
}

fn raw_pair(side: Side, config: PeerConfig) -> (Peer, Raw) {
    let (a, b) = memory_pair();
    (Peer::new(side, a, config), Raw { t: b })
}

/// A worker with `echo`, and `hold` (answers when released, or CANCELLED).
fn worker(config: PeerConfig) -> (Peer, Raw) {
    let (peer, raw) = raw_pair(Side::Worker, config);
    peer.register("echo", |p, _| async move { Ok(p) });
    peer.register("hold", |p, ctx| async move {
        ctx.cancel.cancelled().await;
        Err::<Payload, _>(RpcError::new(codes::CANCELLED, format!("held {p}")))
    });
    (peer, raw)
}

/// A host call the raw side answers; returns the call and its id.
async fn host_call(host: &Peer, raw: &mut Raw) -> (hostwire_worker_rpc::Call, Id) {
    let call = host.call("m", json!(null));
    let Frame::Request { id, .. } = raw.recv().await else {
        panic!()
    };
    (call, id)
}

/// `fut`, or a failure if it has not ended within 10 s: a call that hangs
/// fails its test instead of hanging it.
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("no end within 10 s: a call hung")
}

fn assert_protocol_error(e: &RpcError, field: &str) {
    assert_eq!(e.code, codes::PROTOCOL_ERROR, "{e}");
    assert!(e.message.contains(field), "{e} should name {field}");
}

#[tokio::test]
async fn a_response_whose_error_has_no_code_fails_its_call() {
    let (host, mut raw) = raw_pair(Side::Host, PeerConfig::default());
    raw.hello().await;
    let (call, id) = host_call(&host, &mut raw).await;
    // The usual JavaScript shape of an error.
    raw.send(
        json!({"v": "1.0.0", "kind": "response", "id": id, "ok": false,
        "error": {"name": "TypeError", "message": "x is undefined"}}),
    )
    .await;
    assert_protocol_error(&within(call).await.unwrap_err(), "error.code");
    // A second answer is a duplicate, and the connection goes on.
    raw.send(json!({"v": "1.0.0", "kind": "response", "id": id, "ok": true}))
        .await;
    let (call, id) = host_call(&host, &mut raw).await;
    raw.send(json!({"v": "1.0.0", "kind": "response", "id": id, "ok": true, "result": 2}))
        .await;
    assert_eq!(call.await.unwrap(), json!(2));
    assert_eq!(host.stats().duplicate_responses, 1);
}

#[tokio::test]
async fn malformed_progress_and_stream_ack_fail_their_call() {
    let (host, mut raw) = raw_pair(Side::Host, PeerConfig::default());
    raw.hello().await;
    let (call, id) = host_call(&host, &mut raw).await;
    raw.send(json!({"v": "1.0.0", "kind": "progress", "id": id}))
        .await;
    assert_protocol_error(&within(call).await.unwrap_err(), "progress");
    // The peer is told to stop.
    assert!(matches!(raw.recv().await, Frame::Cancel { id: i, .. } if i == id));
    let mut tx = host.open_stream("up", json!(null));
    let Frame::StreamOpen { id, .. } = raw.recv().await else {
        panic!()
    };
    raw.send(json!({"v": "1.0.0", "kind": "stream-ack", "id": id, "ack": 0, "credit": "lots"}))
        .await;
    let e = tx.send(json!(1)).await.err().unwrap_or_else(|| {
        panic!("a stream whose ack is malformed must fail");
    });
    assert!(
        e.code == codes::CANCELLED || e.code == codes::PROTOCOL_ERROR,
        "{e}"
    );
    assert_protocol_error(&within(tx.finish()).await.unwrap_err(), "credit");
}

#[tokio::test]
async fn malformed_stream_frames_end_the_stream_with_the_field() {
    let (peer, mut raw) = raw_pair(Side::Worker, PeerConfig::default());
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    peer.register_stream("sum", move |_, mut rx, _| {
        let seen = seen_tx.clone();
        async move {
            let mut total = 0.0;
            while let Some(item) = rx.next().await {
                match item {
                    Ok(v) => total += v.parse::<f64>().unwrap(),
                    Err(e) => {
                        let _ = seen.send(e.clone());
                        return Err(e);
                    }
                }
            }
            Ok(json!(total))
        }
    });
    raw.hello().await;
    let cases = [
        (
            json!({"v": "1.0.0", "kind": "stream-chunk", "id": 1, "seq": "2", "data": 10}),
            "seq",
        ),
        (
            json!({"v": "1.0.0", "kind": "stream-chunk", "id": 1, "seq": 0, "data": 10}),
            "seq",
        ),
        (
            json!({"v": "1.0.0", "kind": "stream-end", "id": 1, "ok": false,
                "error": {"name": "Error", "message": "disk"}}),
            "error.code",
        ),
        (
            json!({"v": "1.0.0", "kind": "cancel", "id": 1, "reason": 5}),
            "reason",
        ),
    ];
    for (bad, field) in cases {
        raw.send(json!({"v": "1.0.0", "kind": "stream-open", "id": 1, "method": "sum"}))
            .await;
        assert!(matches!(raw.recv().await, Frame::StreamAck { id: 1, .. }));
        raw.send(json!({"v": "1.0.0", "kind": "stream-chunk", "id": 1, "seq": 1, "data": 100}))
            .await;
        raw.send(bad).await;
        // Not 12 instead of 112: the stream fails, naming the field.
        let e = raw.error_for(1).await;
        assert_eq!(e.code, codes::PROTOCOL_ERROR, "{e:?}");
        assert!(e.message.contains(field), "{e:?}");
        let e = within(seen.recv()).await.unwrap();
        assert_protocol_error(&e, field);
    }
}

#[tokio::test]
async fn a_malformed_cancel_ends_the_call_it_names() {
    let (peer, mut raw) = worker(PeerConfig::default());
    raw.hello().await;
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 4, "method": "hold"}))
        .await;
    raw.send(json!({"v": "1.0.0", "kind": "cancel", "id": 4, "reason": {"why": 1}}))
        .await;
    let e = raw.error_for(4).await;
    assert_eq!(e.code, codes::PROTOCOL_ERROR);
    assert!(e.message.contains("reason"), "{e:?}");
    // Answered once: the handler's own CANCELLED answer is not sent after.
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 5, "method": "echo", "params": 5}))
        .await;
    assert!(matches!(raw.recv().await, Frame::Response { id: 5, .. }));
    assert_eq!(peer.pending(), 0);
}

#[tokio::test]
async fn a_goodbye_whose_reason_is_a_number_still_ends_every_call() {
    let (host, mut raw) = raw_pair(Side::Host, PeerConfig::default());
    raw.hello().await;
    let (call, _) = host_call(&host, &mut raw).await;
    raw.send(json!({"v": "1.0.0", "kind": "goodbye", "reason": 42}))
        .await;
    assert_protocol_error(&within(call).await.unwrap_err(), "reason");
    assert_protocol_error(&within(host.wait_closed()).await, "reason");
}

#[tokio::test]
async fn a_malformed_hello_is_answered_with_a_goodbye_that_says_why() {
    let (host, mut raw) = raw_pair(Side::Host, PeerConfig::default());
    assert_eq!(raw.recv().await.kind(), "hello");
    raw.send(json!({"v": "1.0.0", "kind": "hello", "features": "all"}))
        .await;
    let Frame::Goodbye { error: Some(e), .. } = raw.recv().await else {
        panic!("expected a goodbye")
    };
    assert_eq!(e.code, codes::PROTOCOL_ERROR);
    assert!(e.message.contains("features"), "{e:?}");
    assert_protocol_error(&within(host.ready()).await.unwrap_err(), "features");
    // The transport closes after it.
    assert_eq!(raw.recv_inbound().await, None);
}

#[tokio::test]
async fn frames_refused_before_parsing_are_still_answered() {
    let config = PeerConfig {
        max_frame_bytes: 4096,
        ..PeerConfig::default()
    };
    let (peer, mut raw) = worker(config);
    raw.hello().await;
    let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    // The frame object is level 1: params may nest 127 levels, not 128.
    raw.send_text(format!(
        r#"{{"v":"1.0.0","kind":"request","id":1,"method":"echo","params":{}}}"#,
        nest(MAX_FRAME_DEPTH - 1)
    ))
    .await;
    assert!(matches!(
        raw.recv().await,
        Frame::Response {
            id: 1,
            outcome: Outcome::Ok(_),
            ..
        }
    ));
    raw.send_text(format!(
        r#"{{"v":"1.0.0","kind":"request","id":2,"method":"echo","params":{}}}"#,
        nest(MAX_FRAME_DEPTH)
    ))
    .await;
    let e = raw.error_for(2).await;
    assert!(e.message.contains("nested deeper than 128"), "{e:?}");
    // Too large for this peer's limit; the id is near the start.
    raw.send_text(format!(
        r#"{{"v":"1.0.0","kind":"request","id":3,"method":"echo","params":"{}"}}"#,
        "x".repeat(5000)
    ))
    .await;
    let e = raw.error_for(3).await;
    assert!(e.message.contains("the limit is 4096"), "{e:?}");
    // A string that is not Unicode where text is required.
    raw.send_text(r#"{"v":"1.0.0","kind":"request","id":4,"method":"a\ud800b"}"#)
        .await;
    let e = raw.error_for(4).await;
    assert!(e.message.contains("method"), "{e:?}");
    // Not JSON: the lenient pass still finds the id.
    raw.send_text(r#"{"id":6,"kind":"request","v":"1.0.0","method":"echo","params":[1,}"#)
        .await;
    assert_eq!(raw.error_for(6).await.code, codes::PROTOCOL_ERROR);
    assert_eq!(peer.stats().protocol_errors, 4);
}

#[tokio::test]
async fn lone_surrogates_big_numbers_and_integer_ids_pass_through() {
    let (_peer, mut raw) = worker(PeerConfig::default());
    raw.hello().await;
    for (id_text, id) in [("5.0", 5), ("1e3", 1000), ("7", 7)] {
        raw.send_text(format!(
            r#"{{"v":"1.0.0","kind":"request","id":{id_text},"method":"echo","params":["a\ud800b",1e400,{{"k":"\udc00"}}]}}"#
        ))
        .await;
        let b = raw.recv_inbound().await.unwrap();
        let text = String::from_utf8(b).unwrap();
        assert!(
            text.contains(&format!(r#""id":{id},"#)),
            "answered under {id}: {text}"
        );
        assert!(
            text.contains(r#""result":["a\ud800b",1e400,{"k":"\udc00"}]"#),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_lone_surrogate_in_error_data_reaches_the_caller() {
    let (host, mut raw) = raw_pair(Side::Host, PeerConfig::default());
    raw.hello().await;
    let (call, id) = host_call(&host, &mut raw).await;
    raw.send_text(format!(
        r#"{{"v":"1.0.0","kind":"response","id":{id},"ok":false,"error":{{"code":"E","message":"m","data":{{"s":"\ud800"}}}}}}"#
    ))
    .await;
    let e = within(call).await.unwrap_err();
    assert_eq!(e.data.unwrap().get(), r#"{"s":"\ud800"}"#);
}

#[tokio::test]
async fn a_frame_of_another_major_of_any_kind_is_a_version_mismatch() {
    for bad in [
        json!({"v": "2.0.0", "kind": "response", "id": 1, "ok": true}),
        json!({"v": "2.0.0", "kind": "progress", "id": 1, "progress": 1}),
        json!({"v": "2.0.0", "kind": "goodbye"}),
        json!({"v": "2.0.0", "kind": "stream-ack", "id": 1, "ack": 0, "credit": 1}),
        json!({"v": "2.0.0", "kind": "stream-chunk", "id": 9, "seq": 1, "data": 1}),
        // Shaped as that version likes: still a version mismatch.
        json!({"v": "2.0.0", "kind": "response", "id": 1, "status": "done"}),
    ] {
        let (host, mut raw) = raw_pair(Side::Host, PeerConfig::default());
        raw.hello().await;
        let (call, _) = host_call(&host, &mut raw).await;
        raw.send(bad.clone()).await;
        let Frame::Goodbye { error: Some(e), .. } = raw.recv().await else {
            panic!("expected a goodbye after {bad}")
        };
        assert_eq!(e.code, codes::VERSION_MISMATCH);
        assert_eq!(
            within(call).await.unwrap_err().code,
            codes::VERSION_MISMATCH
        );
        assert_eq!(raw.recv_inbound().await, None, "the transport closes");
    }
    // A request of another major, even malformed, gets an error response.
    let (_peer, mut raw) = worker(PeerConfig::default());
    raw.hello().await;
    raw.send(json!({"v": "2.0.0", "kind": "request", "id": 3, "op": "echo"}))
        .await;
    assert_eq!(raw.error_for(3).await.code, codes::VERSION_MISMATCH);
}

#[tokio::test]
async fn a_duplicate_in_flight_id_leaves_the_original_call_alone() {
    let (peer, mut raw) = raw_pair(Side::Worker, PeerConfig::default());
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let release = std::sync::Mutex::new(Some(release_rx));
    peer.register("gate", move |_, _| {
        let rx = release.lock().unwrap().take();
        async move {
            if let Some(rx) = rx {
                let _ = rx.await;
            }
            Ok(json!("real answer"))
        }
    });
    raw.hello().await;
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 5, "method": "gate"}))
        .await;
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 5, "method": "gate"}))
        .await;
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 5}))
        .await;
    // The reader has seen both duplicates once this round trip is back.
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 6, "method": "nope"}))
        .await;
    assert_eq!(raw.error_for(6).await.code, codes::UNKNOWN_METHOD);
    release_tx.send(()).unwrap();
    let Frame::Response {
        id: 5,
        outcome: Outcome::Ok(v),
        ..
    } = raw.recv().await
    else {
        panic!("the original call's own answer")
    };
    assert_eq!(v, json!("real answer"));
    assert_eq!(peer.stats().duplicate_ids, 2);
    // Once answered, the id may be used again.
    raw.send(json!({"v": "1.0.0", "kind": "request", "id": 5, "method": "nope"}))
        .await;
    assert_eq!(raw.error_for(5).await.code, codes::UNKNOWN_METHOD);
}

#[tokio::test]
async fn a_bad_byte_fails_one_frame_not_the_connection() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    // The worker speaks NDJSON over a pipe; this side writes raw bytes.
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let (r, w) = tokio::io::split(ours);
    let peer = Peer::new(Side::Worker, ndjson(r, w), PeerConfig::default());
    peer.register("echo", |p, _| async move { Ok(p) });
    let (rd, mut wr) = tokio::io::split(theirs);
    let mut lines = tokio::io::BufReader::new(rd).lines();
    let mut bad = br#"{"v":"1.0.0","kind":"request","id":3,"method":"echo","params":""#.to_vec();
    bad.extend_from_slice(b"\xff\"}\n");
    wr.write_all(b"{\"v\":\"1.0.0\",\"kind\":\"hello\"}\n")
        .await
        .unwrap();
    wr.write_all(&bad).await.unwrap();
    wr.write_all(
        b"{\"v\":\"1.0.0\",\"kind\":\"request\",\"id\":4,\"method\":\"echo\",\"params\":\"ok\"}\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(lines.next_line().await.unwrap().unwrap());
    }
    assert!(got[0].contains("hello"));
    assert!(
        got[1].contains(r#""id":3,"ok":false"#) && got[1].contains("not UTF-8"),
        "{}",
        got[1]
    );
    assert!(
        got[2].contains(r#""id":4,"ok":true,"result":"ok""#),
        "{}",
        got[2]
    );
    assert!(peer.closed().is_none());
}

#[tokio::test]
async fn calls_in_flight_are_bounded_on_both_sides() {
    let config = PeerConfig {
        max_inbound_calls: 2,
        max_outbound_calls: 2,
        ..PeerConfig::default()
    };
    let (peer, mut raw) = worker(config);
    raw.hello().await;
    for id in 1..=3 {
        raw.send(json!({"v": "1.0.0", "kind": "request", "id": id, "method": "hold"}))
            .await;
    }
    let e = raw.error_for(3).await;
    assert_eq!(e.code, codes::TOO_MANY_CALLS, "{e:?}");
    assert_eq!(peer.stats().calls_refused, 1);
    // This side's own calls: the third fails at once, nothing is sent.
    let _a = peer.call("x", json!(1));
    let _b = peer.call("x", json!(2));
    let e = within(peer.call("x", json!(3))).await.unwrap_err();
    assert_eq!(e.code, codes::TOO_MANY_CALLS);
    for _ in 0..2 {
        assert!(matches!(raw.recv().await, Frame::Request { .. }));
    }
}

#[tokio::test]
async fn frames_held_before_hello_are_bounded() {
    let config = PeerConfig {
        max_held_frames: 4,
        ..PeerConfig::default()
    };
    let (peer, mut raw) = worker(config);
    assert_eq!(raw.recv().await.kind(), "hello");
    // Requests, but never a hello: their answers are held, up to 4.
    for id in 1..=20 {
        raw.send(json!({"v": "1.0.0", "kind": "request", "id": id, "method": "echo"}))
            .await;
    }
    let Frame::Goodbye { error: Some(e), .. } = raw.recv().await else {
        panic!("expected a goodbye")
    };
    assert_eq!(e.code, codes::PROTOCOL_ERROR);
    assert!(e.message.contains("held back"), "{e:?}");
    assert_eq!(raw.recv_inbound().await, None);
    assert_eq!(within(peer.wait_closed()).await.code, codes::PROTOCOL_ERROR);
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_reading_gets_back_pressure_then_a_goodbye() {
    let config = PeerConfig {
        max_outbound_bytes: 4096,
        write_timeout: Duration::from_secs(30),
        ..PeerConfig::default()
    };
    let (a, b) = memory_pair_bounded(1);
    let peer = Peer::new(Side::Worker, a, config);
    peer.register("echo", |p, _| async move { Ok(p) });
    let mut raw = Raw { t: b };
    raw.hello().await;
    // Many requests, never reading an answer.
    let big = "y".repeat(1000);
    for id in 1..=50u64 {
        raw.send(
            json!({"v": "1.0.0", "kind": "request", "id": id, "method": "echo", "params": big}),
        )
        .await;
    }
    let pending = peer.call("x", json!(null));
    // The handlers' answers wait for room; the writer waits for the reader
    // for 30 s, then the connection ends.
    let e = tokio::time::timeout(Duration::from_secs(600), pending)
        .await
        .expect("the call ends once the write timeout has passed");
    assert_eq!(e.unwrap_err().code, codes::WRITE_TIMEOUT);
    // What the reader finds when it reads again ends with the goodbye.
    let mut last = None;
    let mut answers = 0;
    while let Some(b) = raw.recv_inbound().await {
        let f = parse_frame_bytes(&b).unwrap();
        answers += usize::from(f.kind() == "response");
        last = Some(f);
    }
    // Back-pressure: far fewer than the 50 answers were ever queued.
    assert!(answers < 10, "{answers} answers were queued");
    assert_eq!(peer.wait_closed().await.code, codes::WRITE_TIMEOUT);
    let Some(Frame::Goodbye { error: Some(e), .. }) = last else {
        panic!("{last:?}")
    };
    assert_eq!(e.code, codes::WRITE_TIMEOUT);
}

#[tokio::test]
async fn a_frame_over_the_limit_fails_one_call_and_the_connection_stays() {
    let config = PeerConfig {
        max_frame_bytes: 2048,
        ..PeerConfig::default()
    };
    let (a, b) = memory_pair();
    let host = Peer::new(Side::Host, a, config.clone());
    let worker = Peer::new(Side::Worker, b, config);
    worker.register("emit", |p, _| async move {
        Ok(json!("x".repeat(p.parse::<usize>().unwrap())))
    });
    worker.register_stream("count", |_, mut rx, _| async move {
        let mut n = 0;
        while let Some(item) = rx.next().await {
            item?;
            n += 1;
        }
        Ok(json!(n))
    });
    // The answer is too large: that call fails.
    let e = host.call("emit", json!(5000)).await.unwrap_err();
    assert_eq!(e.code, codes::FRAME_TOO_LARGE, "{e}");
    assert_eq!(
        host.call("emit", json!(10)).await.unwrap(),
        json!("x".repeat(10))
    );
    // The request is too large: it fails here, nothing is sent.
    let e = host
        .call("emit", json!("z".repeat(5000)))
        .await
        .unwrap_err();
    assert_eq!(e.code, codes::FRAME_TOO_LARGE);
    // A chunk too large fails alone; the stream goes on.
    let mut tx = host.open_stream("count", json!(null));
    tx.send(json!(1)).await.unwrap();
    assert_eq!(
        tx.send(json!("z".repeat(5000))).await.unwrap_err().code,
        codes::FRAME_TOO_LARGE
    );
    tx.send(json!(2)).await.unwrap();
    assert_eq!(tx.finish().await.unwrap(), json!(2));
    assert!(host.closed().is_none() && worker.closed().is_none());
}

#[tokio::test]
async fn progress_for_a_caller_that_does_not_read_is_bounded() {
    let config = PeerConfig {
        max_progress_queued: 2,
        ..PeerConfig::default()
    };
    let (a, b) = memory_pair();
    let host = Peer::new(Side::Host, a, config);
    let worker = Peer::new(Side::Worker, b, PeerConfig::default());
    worker.register("chatty", |_, ctx| async move {
        for i in 0..10 {
            ctx.progress(json!(i))?;
        }
        Ok(json!("done"))
    });
    let mut call = host.call("chatty", json!(null));
    // Let the whole answer arrive before reading anything.
    within(async {
        while host.stats().progress_dropped < 8 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(call.next_progress().await.unwrap(), json!(0));
    assert_eq!(call.await.unwrap(), json!("done"));
    assert_eq!(host.stats().progress_dropped, 8);
}
