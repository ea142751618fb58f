//! A misbehaving player gets the protocol's errors while the game goes on
//! for the others: oversized messages, floods, calls from the wrong view,
//! a second `hello`, malformed and deeply nested frames, a frame over the
//! connection's limit, and a device that never reads (closed at the byte
//! bound of its queue).

use crate::support::session::*;
use serde_json::{json, Value};

/// A started presenter game of `n` players, board and controllers ready.
async fn game(api: &Api, n: usize) -> (String, String, Device, Vec<Device>) {
    let (sid, token) = api.create(&presenter_body(n)).await;
    api.op(&sid, &token, "start").await;
    let (mut board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let mut ctrls = Vec::new();
    for id in player_ids(n) {
        let (d, _) = api.device(&sid, "controller", &id).await;
        d.call("ready", json!([])).await.unwrap();
        ctrls.push(d);
    }
    board.wait_for("start", GUARD).await.expect("start");
    (sid, token, board, ctrls)
}

fn code(r: Result<Value, hostwire::sessions::device::RemoteError>) -> String {
    r.expect_err("an error").code
}

#[tokio::test]
async fn a_misbehaving_player_gets_errors_and_the_game_goes_on() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_sid, _token, mut board, mut ctrls) = game(&api, 3).await;
    let bad = &ctrls[0];
    // A second hello.
    assert_eq!(code(bad.hello(PLUGIN_ID).await), "INVALID_ARGUMENT");
    // Authority-only and view-limited methods.
    assert_eq!(
        code(bad.call("saveSnapshot", json!([{"mine": true}])).await),
        "NOT_AUTHORITY"
    );
    assert_eq!(code(bad.call("end", json!([{}])).await), "NOT_AUTHORITY");
    assert_eq!(
        code(
            bad.call("updateSettings", json!([{"values": {}, "valid": true}]))
                .await
        ),
        "NOT_ALLOWED_IN_VIEW"
    );
    // An oversized message (over the 64 KB send limit, under the frame limit).
    let big = "x".repeat(70 * 1024);
    assert_eq!(
        code(
            bad.call("send", send_args(json!("authority"), json!(big)))
                .await
        ),
        "MESSAGE_TOO_LARGE"
    );
    // A flood: past the burst of 60, RATE_LIMITED.
    let mut pending = Vec::new();
    for i in 0..100 {
        pending.push(
            bad.send_call("send", &send_args(json!("authority"), json!({"flood": i})))
                .1,
        );
    }
    let mut limited = 0;
    for p in pending {
        if let Err(e) = Device::answer(p).await {
            assert_eq!(e.code, "RATE_LIMITED", "{e}");
            limited += 1;
        }
    }
    assert!(limited >= 30, "{limited} of 100 refused");
    // An unknown method and a malformed frame with a readable id.
    assert_eq!(
        code(bad.call("selfDestruct", json!([])).await),
        "UNKNOWN_METHOD"
    );
    // The others play on: a controller's message reaches the board.
    ctrls[1]
        .call(
            "send",
            send_args(json!("authority"), json!({"answer": "j"})),
        )
        .await
        .unwrap();
    loop {
        let d = board
            .wait_for("deliver", GUARD)
            .await
            .expect("the good player's message");
        if d.args[0]["from"] == "p2" {
            assert_eq!(d.args[0]["data"], json!({"answer": "j"}));
            break;
        }
    }
    board
        .call("send", send_args(json!("all"), json!("round 2")))
        .await
        .unwrap();
    let d = ctrls[2]
        .wait_for("deliver", GUARD)
        .await
        .expect("deliver to p3");
    assert_eq!(d.args[0]["data"], "round 2");
}

#[tokio::test]
async fn malformed_and_deeply_nested_frames_get_errors_naming_the_problem() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_sid, _token, _board, ctrls) = game(&api, 1).await;
    let d = &ctrls[0];
    // Nesting past the worker RPC frame depth: refused before the engine,
    // answered under its id.
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let (id, rx) = d.send_call("noop", &json!(null));
    let _ = id;
    drop(rx);
    let frame =
        format!(r#"{{"v":"1.0.0","kind":"request","id":9000,"method":"send","params":{deep}}}"#);
    let (_, rx) = d.send_call("ready", &json!([]));
    Device::answer(rx).await.unwrap();
    d.send_raw(frame);
    // Nesting within the frame depth but past the call's own depth limit:
    // the library's decoder refuses it.
    let nested = (0..80).fold(json!(1), |v, _| json!([v]));
    let r = d.call("send", send_args(json!("authority"), nested)).await;
    assert_eq!(code(r), "INVALID_ARGUMENT");
    // The connection is still usable.
    d.call("ready", json!([])).await.unwrap();
}

#[tokio::test]
async fn a_frame_over_the_connection_limit_closes_with_1009_and_the_others_play_on() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_sid, _token, mut board, ctrls) = game(&api, 2).await;
    let huge = "x".repeat(hostwire::sessions::MAX_DEVICE_FRAME_BYTES + 1);
    ctrls[0].send_raw(huge);
    let r = ctrls[0].call("ready", json!([])).await;
    assert_eq!(code(r), "TRANSPORT_CLOSED");
    let ended = ctrls[0].ended.lock().unwrap().clone();
    assert_eq!(ended.1, Some(1009), "{ended:?}");
    ctrls[1]
        .call("send", send_args(json!("authority"), json!("still here")))
        .await
        .unwrap();
    loop {
        let d = board
            .wait_for("deliver", GUARD)
            .await
            .expect("p2's message");
        if d.args[0]["from"] == "p2" {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_never_reads_is_closed_at_its_byte_bound_and_the_game_goes_on() {
    use futures_util::SinkExt;
    use hostwire::sessions::{DEVICE_OUTBOUND_BYTES, DEVICE_OUTBOUND_QUEUE};
    use tokio_tungstenite::tungstenite::Message;
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, token) = api.create(&presenter_body(2)).await;
    api.op(&sid, &token, "start").await;
    let (mut board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    // p1 says hello and ready on a raw socket with a small receive buffer
    // (the kernel holds little for it), then never reads again.
    let p1_token = api.token_for(&sid, "controller", "p1");
    let url = format!(
        "{}/memizy/session/ws?session={sid}&view=controller&address=p1&token={p1_token}",
        h.ws
    );
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(8 * 1024).unwrap();
    let stream = sock.connect(h.server.as_ref().unwrap().addr).await.unwrap();
    let (mut raw, _) = tokio_tungstenite::client_async(url, stream).await.unwrap();
    let hello = json!({"v": "1.0.0", "kind": "request", "id": 1, "method": "hello",
        "params": hostwire::sessions::device::hello_args(PLUGIN_ID)});
    raw.send(Message::text(hello.to_string())).await.unwrap();
    raw.send(Message::text(
        r#"{"v":"1.0.0","kind":"request","id":2,"method":"ready","params":[]}"#,
    ))
    .await
    .unwrap();
    let (mut p2, _) = api.device(&sid, "controller", "p2").await;
    p2.call("ready", json!([])).await.unwrap();
    board.wait_for("start", GUARD).await.expect("start");
    // Frames of 16 KB, far under the frame and message caps, and fewer in
    // all than the queue's frame bound: only the byte bound can close p1.
    // Their total is room for the kernel's buffers (the sender's at most
    // 4 MB) and more than 4 MB queued beside them.
    const FRAME: usize = 16 * 1024;
    const BURST: usize = 56;
    let max_frames = DEVICE_OUTBOUND_QUEUE * 7 / 8;
    assert!(max_frames * FRAME > 3 * DEVICE_OUTBOUND_BYTES);
    let blob = "y".repeat(FRAME);
    let mut sent = 0;
    let mut closed_after = None;
    while sent + BURST <= max_frames {
        for _ in 0..BURST {
            board
                .call("send", send_args(json!(["p1"]), json!(blob)))
                .await
                .unwrap();
            sent += 1;
        }
        // The clock refills the per-recipient rate (30/s, burst 60).
        h.clock.advance_ms(2_000);
        let st = api.status(&sid, &token).await;
        let p1 = st["players"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == "p1")
            .unwrap()
            .clone();
        if p1["connected"] == false {
            closed_after = Some(sent);
            break;
        }
    }
    let sent = closed_after.expect("p1 was not closed: its queue's byte bound did not hold");
    assert!(sent < DEVICE_OUTBOUND_QUEUE, "{sent} frames");
    assert!(
        sent * FRAME > DEVICE_OUTBOUND_BYTES,
        "closed after {sent} frames, before 4 MB were queued"
    );
    let slow = h
        .server
        .as_ref()
        .unwrap()
        .sessions
        .metrics
        .slow_devices
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(slow, 1);
    // The others play on.
    board
        .call("send", send_args(json!(["p2"]), json!("fine")))
        .await
        .unwrap();
    loop {
        let d = p2
            .wait_for("deliver", GUARD)
            .await
            .expect("p2 still served");
        if d.args[0]["data"] == "fine" {
            break;
        }
    }
    drop(raw);
}

#[tokio::test]
async fn a_device_without_its_instance_token_is_closed_4001_and_attaches_with_it() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, host) = api.create(&presenter_body(2)).await;
    api.op(&sid, &host, "start").await;
    let p1 = api.token_for(&sid, "controller", "p1");
    let p2 = api.token_for(&sid, "controller", "p2");
    assert_eq!(p1.len(), 32);
    assert_ne!(p1, p2);
    let refused = [
        ("board", "board", ""),
        ("board", "board", p1.as_str()),
        ("controller", "p1", p2.as_str()),
        ("controller", "p1", host.as_str()),
        ("controller", "p1", "not-a-token"),
    ];
    for (view, address, token) in refused {
        let d = Device::connect(&h.ws, &sid, view, address, token)
            .await
            .unwrap();
        assert_eq!(code(d.hello(PLUGIN_ID).await), "TRANSPORT_CLOSED");
        let ended = d.ended.lock().unwrap().clone();
        assert_eq!(
            ended,
            (Some("unauthorized".to_owned()), Some(4001)),
            "{view} {address} {token:?}"
        );
    }
    let st = api.status(&sid, &host).await;
    assert_eq!(st["instances"], 0, "nothing attached: {st}");
    let unauthorized = h
        .server
        .as_ref()
        .unwrap()
        .sessions
        .metrics
        .unauthorized
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(unauthorized, 5);
    // With their own tokens they attach.
    let (_board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["session"]["view"], "board");
    let (_p1, init) = api.device(&sid, "controller", "p1").await;
    assert_eq!(init["session"]["self"], "p1");

    // Host as player: the host token opens the host's own controller, not
    // another player's.
    let mut body = presenter_body(0);
    body["hostAs"] = json!("player");
    body["players"] =
        json!([{"id": "h", "name": "Host", "isHost": true}, {"id": "p1", "name": "Ann"}]);
    let (sid, host) = api.create(&body).await;
    api.op(&sid, &host, "start").await;
    let d = Device::connect(&h.ws, &sid, "controller", "h", &host)
        .await
        .unwrap();
    assert_eq!(d.hello(PLUGIN_ID).await.unwrap()["session"]["self"], "h");
    let d = Device::connect(&h.ws, &sid, "controller", "p1", &host)
        .await
        .unwrap();
    assert_eq!(code(d.hello(PLUGIN_ID).await), "TRANSPORT_CLOSED");
    assert_eq!(d.ended.lock().unwrap().1, Some(4001));
}

/// `POST /memizy/sessions` needs no credentials and each session may keep
/// megabytes in the store: one client IP creates at most
/// `ROOMS_PER_IP_PER_HOUR` sessions an hour, then 429 until the hour moves.
#[tokio::test]
async fn session_creation_is_limited_per_client_ip() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let per_hour = hostwire_memizy::limits::RELAY_LIMITS.rooms_per_ip_per_hour;
    for _ in 0..per_hour {
        api.create(&presenter_body(1)).await;
    }
    let (status, v) = api
        .request("POST", "/memizy/sessions", None, Some(&presenter_body(1)))
        .await;
    assert_eq!(status, 429, "{v}");
    assert!(
        v.to_string().contains("ROOMS_PER_IP_PER_HOUR"),
        "the answer names the limit: {v}"
    );
    // And when to come back: the clock has not moved, so in an hour.
    assert!(
        v.to_string().contains("try again in 3600 s"),
        "the answer says when: {v}"
    );
    // The window is an hour on the server's clock.
    h.clock.advance_ms(3_600_000);
    api.create(&presenter_body(1)).await;
}

/// A creation body over 8 MB is refused with 413 (it is read only under a
/// creation permit, with its bound).
#[tokio::test]
async fn a_creation_body_over_its_bound_is_413() {
    let h = TestHost::start().await;
    let body = vec![b' '; 8 * 1024 * 1024 + 1];
    let r = reqwest::Client::new()
        .post(format!("{}/memizy/sessions", h.http))
        .header("authorization", format!("Bearer {OPERATOR}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let api = Api::of(&h);
    api.create(&presenter_body(1)).await;
}

#[tokio::test]
async fn calls_over_their_spec_size_get_the_spec_code_and_the_connection_stays() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_sid, _token, mut board, ctrls) = game(&api, 1).await;
    let d = &ctrls[0];
    let big = |n: usize| json!("x".repeat(n));
    let r = d
        .call("send", send_args(json!("authority"), big(1_500_000)))
        .await;
    assert_eq!(code(r), "MESSAGE_TOO_LARGE");
    let r = board.call("saveSnapshot", json!([big(1_300_000)])).await;
    assert_eq!(code(r), "SNAPSHOT_TOO_LARGE");
    let r = d
        .call(
            "recordAnswer",
            json!([{"itemId": "q1", "isCorrect": true, "answer": big(2_000_000)}]),
        )
        .await;
    assert_eq!(code(r), "DATA_TOO_LARGE");
    // Both connections stay: the board is still the authority and hears p1.
    d.call("send", send_args(json!("authority"), json!("small")))
        .await
        .unwrap();
    loop {
        let m = board
            .wait_for("deliver", GUARD)
            .await
            .expect("p1's message");
        if m.args[0]["data"] == "small" {
            break;
        }
    }
    board
        .call("saveSnapshot", json!([{"round": 1}]))
        .await
        .unwrap();
}

/// The next text frame of a raw device socket, as JSON.
async fn next_text<S>(ws: &mut S) -> Value
where
    S: futures_util::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        match tokio::time::timeout(GUARD, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => return serde_json::from_str::<Value>(&t).unwrap(),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn the_server_says_hello_first_and_answers_another_major_without_running_it() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, host) = api.create(&presenter_body(1)).await;
    api.op(&sid, &host, "start").await;
    let token = api.token_for(&sid, "controller", "p1");
    let url = format!(
        "{}/memizy/session/ws?session={sid}&view=controller&address=p1&token={token}",
        api.ws
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let first = next_text(&mut ws).await;
    assert_eq!(first["kind"], "hello", "{first}");
    assert_eq!(first["v"], "1.0.0", "{first}");
    // The Memizy hello of MAJOR 2 is refused unread; the same call in 1.0.0
    // is then the instance's first hello, which it could not be had the
    // other been run.
    let hello = hostwire::sessions::device::hello_args(PLUGIN_ID);
    let call = |v: &str, id: u64| {
        json!({"v": v, "kind": "request", "id": id, "method": "hello", "params": hello}).to_string()
    };
    ws.send(Message::text(call("2.0.0", 1))).await.unwrap();
    let r = next_text(&mut ws).await;
    assert_eq!(
        (r["kind"].as_str(), r["id"].as_u64()),
        (Some("response"), Some(1)),
        "{r}"
    );
    assert_eq!(r["error"]["code"], "VERSION_MISMATCH", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("2.0.0"),
        "{r}"
    );
    ws.send(Message::text(call("1.0.0", 2))).await.unwrap();
    let r = next_text(&mut ws).await;
    assert_eq!(r["id"], 2, "{r}");
    assert_eq!(r["ok"], true, "{r}");
}
