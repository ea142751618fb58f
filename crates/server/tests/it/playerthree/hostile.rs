//! Hostile peers on `/playerthree/ws`: floods past the rate limit,
//! oversized, deeply nested and malformed messages, and a client that
//! never reads.

use crate::support::playerthree::*;
use futures_util::SinkExt;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use tokio_tungstenite::tungstenite::Message;

const MAX_MESSAGE_BYTES: usize = hostwire_playerthree::MAX_MESSAGE_BYTES;

async fn owner(t: &TestServer) -> (Client, String, String) {
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, v) = t.join(&red).await;
    assert_eq!(v["ok"], true);
    o.recv_op("view").await;
    (o, id, op)
}

fn hold(seq: u64) -> serde_json::Value {
    json!({"op": "call", "seq": seq, "role": "red-scout", "method": "hold"})
}

#[tokio::test]
async fn a_flood_is_rate_limited_then_closed() {
    let t = TestServer::start().await;
    let (mut o, _, _) = owner(&t).await;
    // The clock stands still: the burst of 40 is all there is.
    for seq in 1..=41 {
        o.send(hold(seq)).await;
    }
    for seq in 1..=40 {
        assert_eq!(o.result(seq).await["ok"], true);
    }
    let r = o.result(41).await;
    assert_eq!(r["code"], "rate_limited", "{r}");
    // Time refills the bucket.
    t.advance(1000).await;
    assert_eq!(o.call(hold(42)).await["ok"], true);
    // Refused messages in a row past RATE_LIMIT_STRIKES close the socket.
    for seq in 43..200 {
        if o.ws
            .send(Message::Text(hold(seq).to_string().into()))
            .await
            .is_err()
        {
            break;
        }
    }
    assert_eq!(o.ended().await, Ended::Closed(4029));
}

#[tokio::test]
async fn oversized_messages_are_bad_message_and_far_oversized_ones_close() {
    let t = TestServer::start().await;
    let (mut o, _, _) = owner(&t).await;
    let pad = "x".repeat(MAX_MESSAGE_BYTES);
    let big = json!({"op": "mandate", "seq": 1, "role": "red-scout", "mandate": pad});
    o.send(big).await;
    let r = o.recv_op("result").await;
    assert_eq!(r["code"], "bad_message", "{r}");
    assert!(
        r["message"].as_str().unwrap().contains("MAX_MESSAGE_BYTES"),
        "{r}"
    );
    // The connection lives on.
    assert_eq!(o.call(hold(2)).await["ok"], true);
    // Past twice the cap, the WebSocket layer stops reading it.
    let huge = "y".repeat(2 * MAX_MESSAGE_BYTES + 1);
    let _ = o.ws.send(Message::Text(huge.into())).await;
    assert_eq!(o.ended().await, Ended::Closed(1009));
    assert_eq!(t.p3().metrics.oversized.load(Relaxed), 1);
}

#[tokio::test]
async fn deeply_nested_and_malformed_messages_name_the_problem() {
    let t = TestServer::start().await;
    let (mut o, _, _) = owner(&t).await;
    let deep = format!(
        r#"{{"op":"mandate","seq":1,"role":"red-scout","mandate":{}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    o.send_text(&deep).await;
    let r = o.recv_op("result").await;
    assert_eq!(r["code"], "bad_message", "{r}");
    assert!(r["message"].as_str().unwrap().contains("deeper"), "{r}");
    for (text, names) in [
        ("not json", "JSON"),
        (r#"{"op":"fly","seq":2}"#, "op"),
        (
            r#"{"op":"mint","seq":3,"role":"red-scout","extra":1}"#,
            "extra",
        ),
        (r#"{"op":"call","seq":4,"role":7,"method":"hold"}"#, "role"),
        (r#"[1,2,3]"#, "object"),
    ] {
        o.send_text(text).await;
        let r = o.recv_op("result").await;
        assert_eq!(r["code"], "bad_message", "{text}: {r}");
        assert!(
            r["message"].as_str().unwrap().contains(names),
            "{text}: {r}"
        );
    }
    // Binary that is not UTF-8.
    o.ws.send(Message::Binary(vec![0xff, 0xfe].into()))
        .await
        .unwrap();
    let r = o.recv_op("result").await;
    assert_eq!(r["code"], "bad_message", "{r}");
    // After all of it, the connection still plays.
    assert_eq!(o.call(hold(9)).await["ok"], true);
}

#[tokio::test]
async fn a_client_that_never_reads_is_closed_when_its_queue_is_full() {
    let mut config = p3_config();
    config.outbound_queue = 8;
    let t = TestServer::start_with(config).await;
    let (id, op) = create_match(&t.http).await;
    let spectator = mint(&t.http, &id, &op, json!({"kind": "spectator"})).await;
    let mut c = Client::connect_with_receive_buffer(&t.ws, Some(ORIGIN), 4096).await;
    c.send(json!({"op": "join", "token": spectator})).await;
    // Each watch of both teams sends two keyframes and the seats; the
    // client reads none of it. The first few megabytes go into the
    // kernel's socket buffers on loopback (frames are written at once
    // while the socket takes them); then the queue fills.
    let mut sent = 0;
    'flood: for _ in 0..50_000 {
        for teams in [json!([]), json!(["red", "blue"])] {
            let m = json!({"op": "watch", "teams": teams}).to_string();
            if c.ws.send(Message::Text(m.into())).await.is_err() {
                break 'flood;
            }
            sent += 1;
        }
        if sent % 40 == 0 {
            // A second's worth of rate for the next 40.
            t.advance(2000).await;
        }
        if t.p3().metrics.slow_consumers_closed.load(Relaxed) > 0 {
            break;
        }
    }
    // What the server has not read yet (up to megabytes in its socket's
    // buffer on a busy machine), it reads now; bounded by GUARD, not by a
    // count of turns.
    let _ = tokio::time::timeout(GUARD, async {
        while t.p3().metrics.slow_consumers_closed.load(Relaxed) == 0 {
            t.advance(2000).await;
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        t.p3().metrics.slow_consumers_closed.load(Relaxed),
        1,
        "never closed after {sent} messages"
    );
    // Closed with 1013 ahead of what was queued (or dropped, when the
    // writer was stuck on the full socket).
    let ended = c.ended().await;
    assert!(
        matches!(ended, Ended::Closed(1013) | Ended::Dropped),
        "{ended:?}"
    );
    // The match goes on for everyone else.
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (_, v) = t.join(&red).await;
    assert_eq!(v["ok"], true);
}
