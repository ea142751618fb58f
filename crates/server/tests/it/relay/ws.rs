//! Relay protocol 1 over real WebSockets: every rule of the reference.

use crate::support::relay::*;
use hostwire::relay::RelayConfig;
use hostwire_memizy::RELAY_LIMITS;
use serde_json::{json, Value};

#[tokio::test]
async fn forwarding_both_ways_in_order() {
    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, _) = t.player(&pin, "Ann").await;
    let v = host.recv().await;
    assert_eq!(
        v,
        json!({"t": "presence", "player": {"id": a_id, "name": "Ann", "connected": true}, "event": "join"})
    );
    let (mut b, b_id, _) = t.player(&pin, "Bob").await;
    assert_eq!(host.recv().await["event"], "join");

    // Within the player's burst of 120 (the join took one).
    for i in 0..110 {
        host.send(json!({"t": "to", "to": a_id, "data": {"n": i, "k": "state"}}))
            .await;
        b.send(json!({"t": "up", "data": {"n": i}})).await;
    }
    for i in 0..110 {
        assert_eq!(
            a.recv().await,
            json!({"t": "data", "data": {"n": i, "k": "state"}})
        );
        assert_eq!(
            host.recv().await,
            json!({"t": "from", "from": b_id, "data": {"n": i}})
        );
    }
    // Data is forwarded as sent, whatever JSON it is.
    host.send_text(&format!(
        r#"{{"t":"to","to":"{a_id}","data":[1, "two", null, {{"x": 1.5e3}}]}}"#
    ))
    .await;
    assert_eq!(
        a.recv().await["data"],
        json!([1, "two", null, {"x": 1500.0}])
    );
    // No data at all is forwarded without a data field.
    a.send(json!({"t": "up"})).await;
    assert_eq!(host.recv().await, json!({"t": "from", "from": a_id}));
    // `to` an unknown player is dropped silently; nothing else arrives.
    host.send(json!({"t": "to", "to": "p-nobody", "data": 1}))
        .await;
    host.send(json!({"t": "to", "to": 5, "data": 1})).await;
    assert!(host.until_pong().await.is_empty());
    assert!(a.until_pong().await.is_empty());
}

/// Frames for an idle connection are written at once by whoever routes
/// them; the rest wait in its queue. Big frames that fill the socket and
/// small ones between them take both ways (and the writer's finishing of a
/// half-written frame), on a runtime with more than one thread: the player
/// still gets every frame, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_written_at_once_or_queued_arrive_in_order() {
    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, _) = t.player(&pin, "Ann").await;
    host.recv().await;
    let big = "z".repeat(200 * 1024);
    // Within the host's burst; the player reads nothing until all are sent.
    for i in 0..100 {
        let pad = if i % 3 == 0 { big.as_str() } else { "" };
        host.send(json!({"t": "to", "to": a_id, "data": {"n": i, "pad": pad}}))
            .await;
    }
    for i in 0..100 {
        let v = a.recv().await;
        assert_eq!(v["data"]["n"], i, "frame {i} out of order");
        let want = if i % 3 == 0 { big.len() } else { 0 };
        assert_eq!(v["data"]["pad"].as_str().map(str::len), Some(want));
    }
    assert!(a.until_pong().await.is_empty());
    // One frame to an idle player whose socket takes little at a time:
    // written in part by whoever routed it, the rest by the writer.
    let mut b = Client::connect_with_receive_buffer(&t.ws, Some(ORIGIN), 4096).await;
    b.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "Bob"}))
        .await;
    let b_id = b.recv().await["playerId"].as_str().unwrap().to_owned();
    host.recv().await;
    let huge = "h".repeat(RELAY_LIMITS.frame_bytes - 1024);
    host.send(json!({"t": "to", "to": b_id, "data": huge}))
        .await;
    assert!(host.until_pong().await.is_empty());
    let v = b.recv().await;
    assert_eq!(v["data"].as_str().map(str::len), Some(huge.len()));
}

#[tokio::test]
async fn presence_and_host_presence() {
    let t = TestRelay::start(config()).await;
    let (pin, token) = t.create_room().await;
    // A player may join before the host attaches.
    let (mut a, a_id, _) = t.player(&pin, "Ann").await;
    let mut host = t.client().await;
    host.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}))
        .await;
    assert_eq!(
        host.recv().await,
        json!({"t": "hosting", "pin": pin, "players": [{"id": a_id, "name": "Ann", "connected": true}]})
    );
    assert_eq!(
        a.recv().await,
        json!({"t": "host-presence", "connected": true})
    );
    let (mut b, _, _) = t.player(&pin, "Bob").await;
    drop(b.ws.close(None).await);
    let _join = host.recv().await;
    let v = host.recv().await;
    assert_eq!(
        (v["event"].as_str(), v["player"]["connected"].as_bool()),
        (Some("disconnect"), Some(false))
    );
    // The host leaving is announced to players.
    host.ws.close(None).await.unwrap();
    assert_eq!(
        a.recv().await,
        json!({"t": "host-presence", "connected": false})
    );
    let mut c = t.client().await;
    c.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "Cyd"}))
        .await;
    assert_eq!(c.recv().await["hostConnected"], false);
    // Rename: normalized, announced; empty is ignored.
    let mut host = t.client().await;
    host.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}))
        .await;
    assert_eq!(host.recv().await["players"].as_array().unwrap().len(), 3);
    a.send(json!({"t": "rename", "name": "  Ann \n  Marie  "}))
        .await;
    assert_eq!(
        host.recv().await,
        json!({"t": "presence", "player": {"id": a_id, "name": "Ann Marie", "connected": true}, "event": "rename"})
    );
    a.send(json!({"t": "rename", "name": "   "})).await;
    a.send(json!({"t": "rename", "name": 42})).await;
    assert!(host.until_pong().await.is_empty());
}

#[tokio::test]
async fn names_are_normalized_at_join() {
    let t = TestRelay::start(config()).await;
    let (_host, pin, _) = t.host().await;
    let mut p = t.client().await;
    p.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": format!("  a  b {}", "c".repeat(40))})).await;
    let v = p.recv().await;
    assert_eq!(
        v["name"].as_str().unwrap(),
        format!("a b {}", "c".repeat(28))
    );
    let mut q = t.client().await;
    q.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": " \t "}))
        .await;
    assert_eq!(q.recv().await["name"], "Player");
    let mut r = t.client().await;
    r.send(json!({"t": "join", "protocol": 1, "pin": pin}))
        .await;
    assert_eq!(r.recv().await["name"], "Player");
}

#[tokio::test]
async fn rejoin_by_token_and_connection_replacement() {
    let t = TestRelay::start(config()).await;
    let (mut host, pin, token) = t.host().await;
    let (mut a, a_id, a_token) = t.player(&pin, "Ann").await;
    host.recv().await;
    let mut again = t.client().await;
    again.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "Someone else", "token": a_token})).await;
    let v = again.recv().await;
    assert_eq!(
        v,
        json!({"t": "joined", "pin": pin, "playerId": a_id, "token": a_token, "name": "Ann", "hostConnected": true}),
        "a rejoin keeps id, token and name"
    );
    assert_eq!(
        a.ended().await,
        Ended::Closed(4000),
        "the older connection is replaced"
    );
    let v = host.recv().await;
    assert_eq!(v["event"], "connect");
    // The new connection carries the player's traffic.
    host.send(json!({"t": "to", "to": a_id, "data": "hi"}))
        .await;
    assert_eq!(again.recv().await["data"], "hi");
    // An unknown token joins as a new player.
    let mut stranger = t.client().await;
    stranger
        .send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "X", "token": "x".repeat(32)}))
        .await;
    assert_ne!(stranger.recv().await["playerId"], a_id);

    // A second host connection replaces the first.
    let mut host2 = t.client().await;
    host2
        .send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}))
        .await;
    assert_eq!(host2.recv().await["t"], "hosting");
    assert_eq!(host.ended().await, Ended::Closed(4000));
    assert_eq!(
        again.recv().await,
        json!({"t": "host-presence", "connected": true})
    );
}

#[tokio::test]
async fn attach_failures_are_fatal() {
    let t = TestRelay::start(config()).await;
    let (pin, token) = t.create_room().await;
    let cases = [
        (
            json!({"t": "join", "protocol": 1, "pin": "999999", "name": "A"}),
            "ROOM_NOT_FOUND",
        ),
        (
            json!({"t": "join", "protocol": 1, "pin": "12", "name": "A"}),
            "ROOM_NOT_FOUND",
        ),
        (
            json!({"t": "host", "protocol": 1, "pin": "999999", "hostToken": token}),
            "ROOM_NOT_FOUND",
        ),
        (
            json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": "wrong"}),
            "NOT_ALLOWED",
        ),
        (
            json!({"t": "host", "protocol": 1, "pin": pin}),
            "NOT_ALLOWED",
        ),
        (
            json!({"t": "join", "protocol": 2, "pin": pin, "name": "A"}),
            "UNSUPPORTED_PROTOCOL",
        ),
        (
            json!({"t": "host", "pin": pin, "hostToken": token}),
            "UNSUPPORTED_PROTOCOL",
        ),
    ];
    for (frame, code) in cases {
        let mut c = t.client().await;
        c.send(frame.clone()).await;
        c.expect_error(code, true).await;
        assert_eq!(c.ended().await, Ended::Closed(4000), "{frame}");
    }
}

#[tokio::test]
async fn closed_and_full_rooms() {
    let mut limits = RELAY_LIMITS;
    limits.players_per_room = 2;
    let t = TestRelay::start(RelayConfig { limits, ..config() }).await;
    let (mut host, pin, _) = t.host().await;
    let (_a, _, a_token) = t.player(&pin, "A").await;
    host.send(json!({"t": "open", "open": false})).await;
    host.until_pong().await;
    let info: Value = reqwest::get(format!("{}/api/rooms/{pin}", t.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["open"], false);
    let mut c = t.client().await;
    c.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "New"}))
        .await;
    c.expect_error("ROOM_CLOSED", true).await;
    assert_eq!(c.ended().await, Ended::Closed(4000));
    // A known token still rejoins a closed room.
    let mut back = t.client().await;
    back.send(json!({"t": "join", "protocol": 1, "pin": pin, "token": a_token}))
        .await;
    assert_eq!(back.recv().await["t"], "joined");
    // `open` is true only for `true`.
    host.send(json!({"t": "open", "open": "yes"})).await;
    host.send(json!({"t": "open", "open": true})).await;
    host.until_pong().await;
    let (_b, _, _) = t.player(&pin, "B").await;
    let mut full = t.client().await;
    full.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "C"}))
        .await;
    full.expect_error("ROOM_FULL", true).await;
    assert_eq!(full.ended().await, Ended::Closed(4000));
}

#[tokio::test]
async fn kick_and_a_kicked_tokens_rejoin() {
    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, a_token) = t.player(&pin, "Ann").await;
    host.recv().await;
    host.send(json!({"t": "kick", "playerId": a_id})).await;
    assert_eq!(a.recv().await, json!({"t": "closed", "reason": "kicked"}));
    assert_eq!(a.ended().await, Ended::Closed(1000));
    assert_eq!(
        host.recv().await,
        json!({"t": "presence", "player": {"id": a_id, "name": "Ann", "connected": false}, "event": "leave"})
    );
    let mut back = t.client().await;
    back.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "Ann", "token": a_token}))
        .await;
    back.expect_error("KICKED", true).await;
    assert_eq!(back.ended().await, Ended::Closed(4000));
    // Kicking an unknown id does nothing.
    host.send(json!({"t": "kick", "playerId": "p-none"})).await;
    assert!(host.until_pong().await.is_empty());
    let info: Value = reqwest::get(format!("{}/api/rooms/{pin}", t.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["players"], 0);
}

#[tokio::test]
async fn wrong_role_and_unattached_frames() {
    let t = TestRelay::start(config()).await;
    let (mut host, pin, token) = t.host().await;
    let (mut a, a_id, _) = t.player(&pin, "Ann").await;
    host.recv().await;
    for frame in [
        json!({"t": "to", "to": a_id, "data": 1}),
        json!({"t": "kick", "playerId": a_id}),
        json!({"t": "open", "open": false}),
        json!({"t": "close"}),
        json!({"t": "dance"}),
    ] {
        a.send(frame.clone()).await;
        let v = a.expect_error("NOT_ALLOWED", false).await;
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("is not allowed here"),
            "{frame}: {v}"
        );
    }
    for frame in [
        json!({"t": "up", "data": 1}),
        json!({"t": "rename", "name": "H"}),
    ] {
        host.send(frame).await;
        host.expect_error("NOT_ALLOWED", false).await;
    }
    // A second attach on one connection is refused, not fatal.
    host.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}))
        .await;
    host.expect_error("NOT_ALLOWED", false).await;
    a.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "Again"}))
        .await;
    a.expect_error("NOT_ALLOWED", false).await;
    // Before attaching, only ping works.
    let mut c = t.client().await;
    for frame in [
        json!({"t": "up", "data": 1}),
        json!({"t": "to", "to": a_id, "data": 1}),
        json!({"t": "close"}),
    ] {
        c.send(frame).await;
        let v = c.expect_error("NOT_ALLOWED", false).await;
        assert!(v["message"].as_str().unwrap().contains("first"));
    }
    assert!(c.until_pong().await.is_empty());
    // Everyone is still connected and working.
    host.send(json!({"t": "to", "to": a_id, "data": "still here"}))
        .await;
    assert_eq!(a.recv().await["data"], "still here");
}

#[tokio::test]
async fn bad_frames() {
    let mut limits = RELAY_LIMITS;
    limits.frame_bytes = 1024;
    let t = TestRelay::start(RelayConfig { limits, ..config() }).await;
    let mut c = t.client().await;
    for bad in [
        "{",
        "not json",
        "[1,2]",
        "42",
        r#"{"no":"t"}"#,
        r#"{"t":7}"#,
    ] {
        c.send_text(bad).await;
        c.expect_error("BAD_MESSAGE", false).await;
    }
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, _) = t.player(&pin, "A").await;
    host.recv().await;
    let big = json!({"t": "to", "to": a_id, "data": "x".repeat(1100)});
    host.send(big).await;
    let v = host.expect_error("TOO_LARGE", false).await;
    assert!(v["message"].as_str().unwrap().contains("1024"));
    assert!(
        a.until_pong().await.is_empty(),
        "the oversized frame was not forwarded"
    );
    host.send(json!({"t": "to", "to": a_id, "data": "x".repeat(900)}))
        .await;
    assert_eq!(a.recv().await["t"], "data");
    // Far beyond the cap, the WebSocket layer closes the connection.
    // The WebSocket layer's refusal is known by its error type: the client
    // is told why before the close.
    c.send_text(&"x".repeat(4096)).await;
    c.expect_error("TOO_LARGE", true).await;
    assert_eq!(c.ended().await, Ended::Closed(1009));
    // Ping is answered with the server's clock.
    let mut p = t.client().await;
    p.send(json!({"t": "ping"})).await;
    assert_eq!(p.recv().await, json!({"t": "pong", "time": T0}));
}

#[tokio::test]
async fn rate_limits() {
    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, _) = t.player(&pin, "A").await;
    host.recv().await;
    // The clock stands still: a player gets its burst (120), then RATE_LIMITED.
    // The join used one token.
    for i in 0..125 {
        a.send(json!({"t": "up", "data": i})).await;
    }
    let mut forwarded = 0;
    for _ in 0..119 {
        assert_eq!(host.recv().await["t"], "from");
        forwarded += 1;
    }
    assert_eq!(forwarded, 119);
    for _ in 0..6 {
        a.expect_error("RATE_LIMITED", false).await;
    }
    assert!(
        host.until_pong().await.is_empty(),
        "limited frames are dropped"
    );
    // One second later, 60 more.
    t.clock.advance_ms(1_000);
    for i in 0..61 {
        a.send(json!({"t": "up", "data": i})).await;
    }
    for _ in 0..60 {
        assert_eq!(host.recv().await["t"], "from");
    }
    a.expect_error("RATE_LIMITED", false).await;
    // The host's limit is far higher: 1,000 frames at once pass.
    for i in 0..1000 {
        host.send(json!({"t": "to", "to": a_id, "data": i})).await;
    }
    for i in 0..1000 {
        assert_eq!(a.recv().await["data"], i);
    }
    let m = reqwest::get(format!("{}/metrics", t.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("hostwire_relay_rate_limited_total 7"), "{m}");
    assert!(m.contains("hostwire_relay_errors_total{code=\"RATE_LIMITED\"} 7"));
    assert!(m.contains("hostwire_relay_frames_out_total{type=\"data\"} 1000"));
}

#[tokio::test]
async fn host_close_and_expiry() {
    let t = TestRelay::start(config()).await;
    // The host closes the room.
    let (mut host, pin, _) = t.host().await;
    let (mut a, _, _) = t.player(&pin, "A").await;
    host.send(json!({"t": "close"})).await;
    for c in [&mut host, &mut a] {
        let mut got = c.recv().await;
        if got["t"] == "presence" {
            got = c.recv().await;
        }
        assert_eq!(got, json!({"t": "closed", "reason": "host"}));
        assert_eq!(c.ended().await, Ended::Closed(1000));
    }
    assert_eq!(
        reqwest::get(format!("{}/api/rooms/{pin}", t.http))
            .await
            .unwrap()
            .status(),
        404
    );

    // The host away for 10 minutes: expired.
    let (mut host, pin, _) = t.host().await;
    let (mut a, _, _) = t.player(&pin, "A").await;
    host.ws.close(None).await.unwrap();
    assert_eq!(a.recv().await["t"], "host-presence");
    t.clock.advance_ms(RELAY_LIMITS.host_away_ms);
    t.relay().sweep().await;
    assert!(
        a.until_pong().await.is_empty(),
        "exactly 10 minutes is not yet expired"
    );
    t.clock.advance_ms(1);
    t.relay().sweep().await;
    assert_eq!(a.recv().await, json!({"t": "closed", "reason": "expired"}));
    assert_eq!(a.ended().await, Ended::Closed(1000));
    assert_eq!(
        reqwest::get(format!("{}/api/rooms/{pin}", t.http))
            .await
            .unwrap()
            .status(),
        404
    );

    // A room without its host from the start expires the same way.
    let (idle_pin, _) = t.create_room().await;
    // A room older than 6 hours expires even with its host attached.
    let (mut host, pin, _) = t.host().await;
    for _ in 0..36 {
        t.clock.advance_ms(RELAY_LIMITS.room_max_age_ms / 36);
        t.relay().sweep().await;
        if host.until_pong().await.iter().any(|v| v["t"] == "closed") {
            panic!("expired too early");
        }
    }
    t.clock.advance_ms(1);
    t.relay().sweep().await;
    assert_eq!(
        host.recv().await,
        json!({"t": "closed", "reason": "expired"})
    );
    assert_eq!(
        reqwest::get(format!("{}/api/rooms/{pin}", t.http))
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        reqwest::get(format!("{}/api/rooms/{idle_pin}", t.http))
            .await
            .unwrap()
            .status(),
        404
    );
    let m = reqwest::get(format!("{}/metrics", t.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("hostwire_relay_rooms_expired_total 3"), "{m}");
}

#[tokio::test]
async fn a_reader_that_cannot_keep_up_is_closed() {
    let t = TestRelay::start(RelayConfig {
        outbound_queue: 4,
        ..config()
    })
    .await;
    let (mut host, pin, _) = t.host().await;
    let (mut slow, slow_id, _) = t.player(&pin, "Slow").await;
    let (mut fast, fast_id, _) = t.player(&pin, "Fast").await;
    host.recv().await;
    host.recv().await;
    // The slow player reads nothing while the host sends it far more than
    // the socket buffers hold.
    let chunk = "y".repeat(256 * 1024);
    let mut closed = false;
    for i in 0..400 {
        host.send(json!({"t": "to", "to": slow_id, "data": chunk}))
            .await;
        if i % 20 == 19 {
            let v = host.until_pong().await;
            if v.iter()
                .any(|p| p["event"] == "disconnect" && p["player"]["id"] == slow_id)
            {
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "the slow reader was never closed");
    // Everyone else goes on.
    host.send(json!({"t": "to", "to": fast_id, "data": "ok"}))
        .await;
    assert_eq!(fast.recv().await["data"], "ok");
    let m = reqwest::get(format!("{}/metrics", t.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("hostwire_relay_slow_consumers_closed_total 1"),
        "{m}"
    );
    // The slow socket ends.
    assert!(matches!(
        slow.ended().await,
        Ended::Dropped | Ended::Closed(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn an_unresponsive_connection_is_closed_after_the_idle_timeout() {
    // Tokio's clock is paused: the 60 s pass without waiting.
    let t = TestRelay::start(config()).await;
    let (_host, pin, _) = t.host().await;
    let (mut quiet, _, _) = t.player(&pin, "Quiet").await;
    let (mut alive, _, _) = t.player(&pin, "Alive").await;
    // Nothing read, so not even the server's pings are answered.
    advance_seconds(RELAY_LIMITS.idle_timeout_ms / 1_000 - 1).await;
    // One that sends in time stays.
    assert!(alive.until_pong().await.len() <= 1);
    advance_seconds(2).await;
    assert_eq!(quiet.ended().await, Ended::Closed(1001));
    // The host read nothing either and was closed; the active player is
    // still connected and told so.
    let seen = alive.until_pong().await;
    assert!(
        seen.contains(&json!({"t": "host-presence", "connected": false})),
        "{seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_server_pings_every_30_seconds_and_a_pong_keeps_the_connection() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let t = TestRelay::start(config()).await;
    let (_host, pin, _) = t.host().await;
    let (mut p, _, _) = t.player(&pin, "Pinged").await;
    let mut pings = 0;
    // 100 s on the paused clock: past the 60 s idle timeout, which the
    // pongs (answered by the client library as it reads) keep away.
    for _ in 0..10 {
        tokio::time::advance(std::time::Duration::from_secs(10)).await;
        while let Ok(Some(Ok(m))) =
            tokio::time::timeout(std::time::Duration::from_millis(50), p.ws.next()).await
        {
            match m {
                Message::Ping(_) => pings += 1,
                Message::Close(f) => panic!("closed: {f:?}"),
                _ => {}
            }
        }
    }
    assert_eq!(pings, 3, "one ping per 30 s in 100 s");
}

/// A counter of `/metrics`, by its full name with labels.
async fn metric(t: &TestRelay, series: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", t.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

#[tokio::test]
async fn metrics_count_frames_by_type_and_errors_by_code() {
    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, _) = t.player(&pin, "A").await;
    host.recv().await;
    host.send(json!({"t": "to", "to": a_id, "data": [1, 2]}))
        .await;
    assert_eq!(a.recv().await["t"], "data");
    a.send(json!({"t": "up", "data": "x"})).await;
    assert_eq!(host.recv().await["t"], "from");
    a.send_text("{").await;
    a.expect_error("BAD_MESSAGE", false).await;
    a.send(json!({"t": "to", "to": a_id})).await;
    a.expect_error("NOT_ALLOWED", false).await;
    let mut lost = t.client().await;
    lost.send(json!({"t": "join", "protocol": 1, "pin": "999999"}))
        .await;
    lost.expect_error("ROOM_NOT_FOUND", true).await;
    a.until_pong().await;

    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_in_total{type="host"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_in_total{type="join"}"#).await,
        2
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_in_total{type="to"}"#).await,
        2
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_in_total{type="up"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_in_total{type="ping"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_in_total{type="invalid"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_out_total{type="data"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_out_total{type="from"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_out_total{type="error"}"#).await,
        3
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_frames_out_total{type="hosting"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_errors_total{code="BAD_MESSAGE"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_errors_total{code="NOT_ALLOWED"}"#).await,
        1
    );
    assert_eq!(
        metric(&t, r#"hostwire_relay_errors_total{code="ROOM_NOT_FOUND"}"#).await,
        1
    );
    // `{"t":"data","data":[1,2]}` and `{"t":"from","from":"p-…","data":"x"}`.
    let from_len = format!(r#"{{"t":"from","from":"{a_id}","data":"x"}}"#).len() as u64;
    assert_eq!(
        metric(&t, "hostwire_relay_forwarded_bytes_total").await,
        25 + from_len
    );
}

/// Frames a client writes at once arrive in one read of the server's, far
/// more than tungstenite takes at a time: every one must come out whole and
/// in order, including those that straddle two reads (over 64 KiB in all,
/// the thread's read buffer), a frame of several such buffers, and a frame
/// sent in fragments.
#[tokio::test]
async fn frames_written_at_once_are_all_read_whole_and_in_order() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::Message;

    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, _) = t.player(&pin, "Ann").await;
    assert_eq!(host.recv().await["event"], "join");

    // Sizes around tungstenite's read buffer (128 B), the relay's copy
    // threshold (512 B), and one frame bigger than two thread buffers.
    let sizes: Vec<usize> = (0..400)
        .map(|i| match i % 7 {
            0 => 1,
            1 => 120,
            2 => 140,
            3 => 500,
            4 => 530,
            5 => 1000,
            _ => 3000,
        })
        .chain([200_000, 5])
        .collect();
    let frames: Vec<String> = sizes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            json!({"t": "to", "to": a_id, "data": {"n": i, "pad": "x".repeat(*n)}}).to_string()
        })
        .collect();
    for f in &frames {
        host.ws.feed(Message::Text(f.clone().into())).await.unwrap();
    }
    // One message in three fragments, as a browser may send a long one.
    let last = json!({"t": "to", "to": a_id, "data": {"n": "fragmented", "pad": "y".repeat(300)}})
        .to_string()
        .into_bytes();
    let (one, rest) = last.split_at(100);
    let (two, three) = rest.split_at(150);
    let fragment = |op, bytes: &[u8], fin| Message::Frame(Frame::message(bytes.to_vec(), op, fin));
    host.ws
        .feed(fragment(OpCode::Data(Data::Text), one, false))
        .await
        .unwrap();
    host.ws
        .feed(fragment(OpCode::Data(Data::Continue), two, false))
        .await
        .unwrap();
    host.ws
        .feed(fragment(OpCode::Data(Data::Continue), three, true))
        .await
        .unwrap();
    host.ws.flush().await.unwrap();

    for (i, n) in sizes.iter().enumerate() {
        let v = a.recv().await;
        assert_eq!(
            v["data"]["n"], i,
            "frame {i} out of order: {}",
            v["data"]["n"]
        );
        assert_eq!(
            v["data"]["pad"].as_str().unwrap().len(),
            *n,
            "frame {i} cut"
        );
    }
    let v = a.recv().await;
    assert_eq!(v["data"]["n"], "fragmented", "{v}");
    assert_eq!(v["data"]["pad"], "y".repeat(300));
}
