//! Hostile and buggy peers of the ggui live channel: oversized and deeply
//! nested frames, floods, readers that never read, and the bounds on
//! sessions, subscribers and long polls.

use crate::support::ggui::*;
use hostwire::ggui::GguiConfig;
use serde_json::{json, Value};

#[tokio::test]
async fn a_frame_over_64_kib_before_subscribe_is_refused_with_1009() {
    let s = Server::start().await;
    let mut c = s.client_for("any").await;
    let big = format!(
        r#"{{"type":"ping","payload":{{"pad":"{}"}}}}"#,
        "x".repeat(70 * 1024)
    );
    c.send_text(&big).await;
    c.expect_error("FRAME_TOO_LARGE").await;
    assert_eq!(c.ended().await, Ended::Closed(1009));
}

#[tokio::test]
async fn a_frame_over_1_mib_after_subscribe_is_refused_with_1009() {
    let s = Server::start().await;
    let (mut c, _) = s.subscribed("big").await;
    // Within 1 MiB after a subscribe: accepted.
    let fine = format!(
        r#"{{"type":"ping","payload":{{"pad":"{}"}}}}"#,
        "x".repeat(512 * 1024)
    );
    c.send_text(&fine).await;
    assert_eq!(c.recv().await["type"], "pong");
    let big = format!(
        r#"{{"type":"ping","payload":{{"pad":"{}"}}}}"#,
        "x".repeat(1024 * 1024 + 1)
    );
    c.send_text(&big).await;
    c.expect_error("FRAME_TOO_LARGE").await;
    assert_eq!(c.ended().await, Ended::Closed(1009));
    assert_eq!(s.metric("hostwire_ggui_oversized_frames_total").await, 1);
}

#[tokio::test]
async fn deeply_nested_input_is_refused_on_the_socket_and_the_api() {
    let s = Server::start().await;
    let (mut c, _) = s.subscribed("deep").await;
    let deep = format!(
        r#"{{"type":"action","payload":{{"sessionId":"deep","type":"data:submit","payload":{{"action":"a","data":{}{}}}}}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    c.send_text(&deep).await;
    let e = c.expect_error("INVALID_MESSAGE").await;
    assert!(
        e["payload"]["message"].as_str().unwrap().contains("64"),
        "{e}"
    );
    assert!(c.until_pong().await.is_empty(), "the socket lives on");

    let body = format!(
        r#"{{"channel":"c","payload":{}1{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let r = reqwest::Client::new()
        .post(format!("{}/ggui/sessions/deep/emit", s.http))
        .bearer_auth(app_credential("conformance"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "INVALID_MESSAGE", "{v}");
}

#[tokio::test]
async fn an_api_body_over_its_bound_is_413() {
    let s = Server::start().await;
    s.create("b", json!({})).await;
    let body = format!(
        r#"{{"channel":"c","payload":"{}"}}"#,
        "x".repeat(2 * 1024 * 1024 + 10)
    );
    let r = reqwest::Client::new()
        .post(format!("{}/ggui/sessions/b/emit", s.http))
        .bearer_auth(app_credential("conformance"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // A payload within the body bound but over the frame bound.
    let body = format!(
        r#"{{"channel":"c","payload":"{}"}}"#,
        "x".repeat(1024 * 1024 + 10)
    );
    let (status, v) = s
        .api("POST", "b/emit", Some(serde_json::from_str(&body).unwrap()))
        .await;
    assert_eq!((status, v["code"].as_str()), (413, Some("FRAME_TOO_LARGE")));
}

#[tokio::test]
async fn every_frame_of_a_flood_is_refused_then_the_socket_closed_with_1008() {
    let s = Server::start().await;
    let (mut c, _) = s.subscribed("flood").await;
    // The manual clock does not move: the burst (200) is all there is.
    for _ in 0..1_250 {
        c.send(json!({"type": "ping"})).await;
    }
    let mut pongs = 0;
    let mut limited = 0;
    loop {
        match tokio::time::timeout(GUARD, futures_util::StreamExt::next(&mut c.ws))
            .await
            .expect("no close")
        {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                match v["type"].as_str() {
                    Some("pong") => pongs += 1,
                    Some("error") => {
                        assert_eq!(v["payload"]["code"], "RATE_LIMITED");
                        limited += 1
                    }
                    _ => panic!("{v}"),
                }
            }
            Some(Ok(tokio_tungstenite::tungstenite::Message::Close(f))) => {
                assert_eq!(u16::from(f.unwrap().code), 1008);
                break;
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => panic!("dropped without a close"),
        }
    }
    // The subscribe took one token of the burst of 200; each frame past
    // it is answered, and the 1,000th refusal in a row closes.
    assert_eq!((pongs, limited), (199, 1_000));
}

#[tokio::test]
async fn a_subscriber_that_never_reads_is_closed_and_the_others_go_on() {
    let config = GguiConfig {
        outbound_queue: 16,
        ..GguiConfig::default()
    };
    let s = Server::with(config).await;
    s.create("slow", json!({})).await;
    let mut stuck = Client::connect_with_receive_buffer(&s.ui_url("slow").await, None, 4096).await;
    stuck
        .send(json!({"type": "subscribe", "payload": {"sessionId": "slow"}}))
        .await;
    let (mut reader, _) = s.subscribed("slow").await;
    // `stuck` reads nothing more: 64 KiB envelopes fill its socket, then
    // its queue.
    let pad = "y".repeat(64 * 1024);
    let mut n = 0;
    while s.metric("hostwire_ggui_slow_consumers_closed_total").await == 0 {
        n += 1;
        assert!(n < 2_000, "the stuck reader was never closed");
        s.emit("slow", "feed", json!(pad)).await;
        // The reading subscriber keeps up.
        assert_eq!(reader.recv().await["payload"]["seq"], n);
    }
    let (_, v) = s.api("GET", "slow", None).await;
    assert_eq!(v["subscribers"], 1, "the stuck reader left the session");
    s.emit("slow", "feed", json!("after")).await;
    assert_eq!(reader.recv().await["payload"]["payload"], "after");
}

#[tokio::test]
async fn sessions_subscribers_and_long_polls_are_bounded() {
    let mut config = GguiConfig::default();
    config.channel.max_sessions = 2;
    config.channel.max_subscribers_per_session = 2;
    let s = Server::with(config).await;
    s.create("one", json!({})).await;
    s.create("two", json!({})).await;
    let (status, v) = s.api("PUT", "three", Some(json!({}))).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (503, Some("SESSION_CREATE_FAILED"))
    );
    // A subscribe creates nothing: its UI token is for an existing session.
    // An existing session is still idempotent at the bound.
    assert_eq!(s.api("PUT", "two", Some(json!({}))).await.0, 200);

    let _a = s.subscribed("one").await;
    let _b = s.subscribed("one").await;
    let mut c = s.client_for("one").await;
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "one"}, "requestId": "x"}))
        .await;
    let e = c.expect_error("TOO_MANY_SUBSCRIBERS").await;
    assert_eq!(e["requestId"], "x");
    drop(_a);
    // Once one leaves there is room again (the close is seen first).
    tokio::time::timeout(GUARD, async {
        loop {
            c.send(json!({"type": "subscribe", "payload": {"sessionId": "one"}}))
                .await;
            let v = c.recv().await;
            if v["type"] == "ack" {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();

    // Long polls: 16 wait, the 17th is refused at once.
    let mut polls = Vec::new();
    for _ in 0..16 {
        let http = s.http.clone();
        polls.push(tokio::spawn(async move {
            reqwest::Client::new()
                .get(format!("{http}/ggui/sessions/two/actions?waitMs=25000"))
                .bearer_auth(app_credential("conformance"))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    tokio::time::timeout(GUARD, async {
        while s.metric("hostwire_ggui_long_polls").await < 16 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    let (status, v) = s.api("GET", "two/actions?waitMs=25000", None).await;
    assert_eq!((status, v["code"].as_str()), (429, Some("RATE_LIMITED")));
    // An action wakes them all.
    let (mut sub, _) = s.subscribed("two").await;
    sub.send(action("two", "go", json!({}), "r")).await;
    for p in polls {
        assert_eq!(tokio::time::timeout(GUARD, p).await.unwrap().unwrap(), 200);
    }
}

/// Tokio's clock is paused in the tests below: the runtime jumps to the
/// next timer whenever every task waits, so 90 s pass without waiting.
fn secs(s: u64) -> std::time::Duration {
    std::time::Duration::from_secs(s)
}

/// Reads whatever arrives within 50 ms (answering pings); returns the pings.
async fn read_for_50_ms(c: &mut Client) -> usize {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut pings = 0;
    while let Ok(Some(m)) =
        tokio::time::timeout(std::time::Duration::from_millis(50), c.ws.next()).await
    {
        match m.unwrap() {
            Message::Ping(_) => pings += 1,
            Message::Close(f) => panic!("closed: {f:?}"),
            _ => {}
        }
    }
    pings
}

#[tokio::test(start_paused = true)]
async fn a_socket_silent_for_90_s_is_closed_with_1001_and_one_that_answers_pings_stays() {
    let s = Server::start().await;
    // `quiet` reads nothing, so it answers none of the server's pings;
    // `alive` reads, and its library answers each ping with a pong.
    let (mut quiet, _) = s.subscribed("idle").await;
    let (mut alive, _) = s.subscribed("idle").await;
    let mut pings = 0;
    for _ in 0..8 {
        advance_seconds(11).await;
        pings += read_for_50_ms(&mut alive).await;
    }
    // 88 s in: nothing is closed yet.
    assert_eq!(s.metric("hostwire_ggui_connections").await, 2);
    advance_seconds(3).await;
    assert_eq!(quiet.ended().await, Ended::Closed(1001));
    // 200 s in, `alive` is still served.
    for _ in 0..10 {
        advance_seconds(11).await;
        pings += read_for_50_ms(&mut alive).await;
    }
    assert!(alive.until_pong().await.is_empty());
    assert_eq!(pings, 6, "one ping per 30 s");
    assert_eq!(s.metric("hostwire_ggui_connections").await, 1);
}

#[tokio::test(start_paused = true)]
async fn a_long_poll_waits_what_it_asked_and_never_more_than_25_s() {
    let s = Server::start().await;
    s.create("lp", json!({})).await;
    let client = reqwest::Client::new();
    for (asked, waited) in [(0, 0), (1_000, 1), (25_000, 25), (600_000, 25)] {
        let t = tokio::time::Instant::now();
        let r = tokio::time::timeout(
            secs(3_600),
            client
                .get(format!(
                    "{}/ggui/sessions/lp/actions?waitMs={asked}",
                    s.http
                ))
                .bearer_auth(app_credential("conformance"))
                .send(),
        )
        .await
        .expect("the long poll never ended")
        .unwrap();
        let took = t.elapsed();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v, json!({"actions": []}));
        assert!(
            took >= secs(waited) && took < secs(waited) + secs(1),
            "waitMs={asked} answered after {took:?}"
        );
    }
}

/// What 1,500 actions sent at once on one socket get back: every answer
/// names its action's `requestId`, no action is answered twice, and an
/// action without an answer is one the connection was closed before
/// (with a documented code).
async fn flood_of_actions(s: &Server, session: &str, n: usize) -> (usize, usize, Option<u16>) {
    s.create(
        session,
        json!({"actionSpec": {"go": {"schema": {"type": "object", "properties": {"i": {"type": "integer"}}}}}}),
    )
    .await;
    let (mut c, _) = s.subscribed(session).await;
    for i in 0..n {
        let frame = action(session, "go", json!({"i": i}), &format!("a{i}"));
        futures_util::SinkExt::feed(
            &mut c.ws,
            tokio_tungstenite::tungstenite::Message::Text(frame.to_string().into()),
        )
        .await
        .unwrap();
    }
    futures_util::SinkExt::flush(&mut c.ws).await.unwrap();
    let mut answered = std::collections::HashSet::new();
    let (mut acks, mut refused) = (0, 0);
    let mut closed = None;
    while answered.len() < n {
        match tokio::time::timeout(GUARD, futures_util::StreamExt::next(&mut c.ws))
            .await
            .expect("an action was neither answered nor the socket closed")
        {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                let id = v["requestId"]
                    .as_str()
                    .unwrap_or_else(|| panic!("an answer without its requestId: {v}"))
                    .to_owned();
                assert!(answered.insert(id.clone()), "{id} answered twice: {v}");
                match v["type"].as_str() {
                    Some("ack") => acks += 1,
                    Some("error") => {
                        let code = v["payload"]["code"].as_str().unwrap();
                        assert!(["RATE_LIMITED", "APPEND_FAILED"].contains(&code), "{v}");
                        refused += 1
                    }
                    _ => panic!("{v}"),
                }
            }
            Some(Ok(tokio_tungstenite::tungstenite::Message::Close(f))) => {
                closed = Some(u16::from(f.unwrap().code));
                break;
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => panic!("dropped without a close"),
        }
    }
    (acks, refused, closed)
}

#[tokio::test]
async fn every_action_of_a_flood_is_answered_with_its_request_id_or_the_socket_closed() {
    let s = Server::start().await;
    let (acks, refused, closed) = flood_of_actions(&s, "flood", 1_500).await;
    // The manual clock does not move: the burst (200, one for the
    // subscribe) is all there is, and 1,000 refusals in a row close.
    // Actions still held behind a validation when it closes are not
    // answered: the close tells the client.
    assert_eq!(closed, Some(1008), "{acks} acks, {refused} refused");
    assert!(acks >= 1, "{acks} acks, {refused} refused");
    assert!(refused >= 1_000, "{acks} acks, {refused} refused");
    assert!(
        acks + refused <= 199 + 1_000,
        "{acks} acks, {refused} refused"
    );
}

#[tokio::test]
async fn a_configured_rate_lets_every_action_of_a_flood_through_to_an_answer() {
    let mut config = GguiConfig::default();
    config.channel.rate_per_second = 1_000.0;
    config.channel.rate_burst = 2_000;
    let s = Server::with(config).await;
    let (acks, refused, closed) = flood_of_actions(&s, "flood", 1_500).await;
    // Within the configured burst nothing is rate limited and the socket
    // stays; actions past the held-frame bound are refused, each named.
    assert_eq!(closed, None, "{acks} acks, {refused} refused");
    assert_eq!(acks + refused, 1_500);
    assert!(acks >= 1, "{acks} acks, {refused} refused");
}

#[tokio::test]
async fn a_projector_and_a_hundred_pupils_fit_one_session_by_default() {
    let s = Server::start().await;
    let mut screens = Vec::new();
    for _ in 0..101 {
        screens.push(s.subscribed("class").await.0);
    }
    s.emit("class", "board", json!("next slide")).await;
    for c in &mut screens {
        assert_eq!(c.recv().await["payload"]["payload"], "next slide");
    }
}

#[tokio::test]
async fn a_configured_subscriber_cap_is_applied() {
    let mut config = GguiConfig::default();
    config.channel.max_subscribers_per_session = 3;
    let s = Server::with(config).await;
    let mut screens = Vec::new();
    for _ in 0..3 {
        screens.push(s.subscribed("small").await.0);
    }
    let mut c = s.client_for("small").await;
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "small"}, "requestId": "4th"}))
        .await;
    assert_eq!(
        c.expect_error("TOO_MANY_SUBSCRIBERS").await["requestId"],
        "4th"
    );
}

/// The agent API's bodies are decoded into their types: text that is not
/// JSON is `INVALID_JSON`, JSON of another shape `INVALID_MESSAGE` with the
/// field at fault named first.
#[tokio::test]
async fn api_bodies_of_the_wrong_shape_name_the_field() {
    let s = Server::start().await;
    s.create("shape", json!({})).await;
    let post = |path: &'static str, body: &'static str| {
        let url = format!("{}/ggui/sessions/shape/{path}", s.http);
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .bearer_auth(app_credential("conformance"))
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    for (path, body, code, field) in [
        (
            "emit",
            r#"{"channel":"c","payload":1,"complete":"yes"}"#,
            "INVALID_MESSAGE",
            "complete",
        ),
        (
            "emit",
            r#"{"channel":7,"payload":1}"#,
            "INVALID_MESSAGE",
            "channel",
        ),
        (
            "emit",
            r#"{"payload":1}"#,
            "INVALID_MESSAGE",
            "request body: missing field `channel`",
        ),
        (
            "props",
            r#"{"props":{},"epoch":-1}"#,
            "INVALID_MESSAGE",
            "epoch",
        ),
        ("props", r#"{"props":[]}"#, "INVALID_MESSAGE", "props"),
        ("props", r#"[1]"#, "INVALID_MESSAGE", "request body"),
        (
            "actions/drain",
            r#"{"upTo":true}"#,
            "INVALID_MESSAGE",
            "upTo",
        ),
        (
            "emit",
            r#"{"channel":"c","payload":1"#,
            "INVALID_JSON",
            "request body is not JSON",
        ),
        (
            "emit",
            r#"{}}"upTo":"12"}"#,
            "INVALID_JSON",
            "request body is not JSON",
        ),
    ] {
        let (status, v) = post(path, body).await;
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some(code)),
            "{body}: {v}"
        );
        let message = v["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
    }
    // Invalid UTF-8, even in a field the route skips, is not JSON.
    let r = reqwest::Client::new()
        .post(format!("{}/ggui/sessions/shape/emit", s.http))
        .bearer_auth(app_credential("conformance"))
        .body(b"{\"x\":\"\xff\",\"channel\":\"c\",\"payload\":1}".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "INVALID_JSON", "{v}");
    // A body of the right shape still works, and an empty one is `{}`.
    let (status, v) = post(
        "emit",
        r#"{"channel":"c","payload":{"n":1},"complete":true}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = post("props", "").await;
    assert_eq!(status, 400, "{v}");
    assert!(v["message"].as_str().unwrap().contains("props"), "{v}");
}
