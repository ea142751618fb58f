//! The relay under attack: a hostile client cannot take memory or time
//! beyond the documented limits, nor take the server down.

use crate::support::relay::*;
use futures_util::SinkExt;
use hostwire::relay::{RelayConfig, ServerLimits, SERVER_LIMITS};
use hostwire_memizy::RELAY_LIMITS;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

fn with_limits(server_limits: ServerLimits) -> RelayConfig {
    RelayConfig {
        server_limits,
        ..config()
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_that_pings_and_never_reads_is_closed_at_the_idle_timeout() {
    let t = TestRelay::start(config()).await;
    let mut flood = Client::connect_with_receive_buffer(&t.ws, Some(ORIGIN), 16 * 1024).await;
    // Pings all through the idle timeout, nothing read: pings are not
    // activity, so the connection is closed when the timeout passes.
    let step = RELAY_LIMITS.idle_timeout_ms / 6;
    'flood: for _ in 0..8 {
        for _ in 0..200 {
            let ping = Message::Ping(vec![7u8; 125].into());
            if flood.ws.send(ping).await.is_err() {
                break 'flood;
            }
        }
        tokio::time::advance(Duration::from_millis(step)).await;
    }
    assert!(matches!(
        flood.ended().await,
        Ended::Closed(1001) | Ended::Dropped
    ));
}

#[tokio::test]
async fn a_slow_reader_is_closed_with_1013_once_its_queue_holds_too_many_bytes() {
    let t = TestRelay::start(with_limits(ServerLimits {
        outbound_queue_bytes: 1024 * 1024,
        ..SERVER_LIMITS
    }))
    .await;
    let (mut host, pin, _) = t.host().await;
    let mut slow = Client::connect_with_receive_buffer(&t.ws, Some(ORIGIN), 16 * 1024).await;
    slow.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "Slow"}))
        .await;
    let joined = slow.recv().await;
    let slow_id = joined["playerId"].as_str().unwrap().to_owned();
    host.recv().await;
    // 100 frames of 256 KiB: far fewer than the queue's 1,024 frames, far
    // more than its bytes.
    let chunk = "y".repeat(256 * 1024);
    let mut closed = false;
    for i in 0..100 {
        host.send(json!({"t": "to", "to": slow_id, "data": chunk}))
            .await;
        if i % 10 == 9 {
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
    assert_eq!(t.relay().metrics.slow_consumers_closed.load(Relaxed), 1);
    // Reading now, it gets what was on its way, then the documented close.
    assert_eq!(slow.ended().await, Ended::Closed(1013));
}

#[tokio::test]
async fn room_creation_beyond_the_room_cap_is_a_clear_503() {
    let t = TestRelay::start(with_limits(ServerLimits {
        max_rooms: 2,
        ..SERVER_LIMITS
    }))
    .await;
    t.create_room().await;
    t.create_room().await;
    let r = reqwest::Client::new()
        .post(format!("{}/api/rooms", t.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        v["error"].as_str().unwrap_or("").contains("MAX_ROOMS"),
        "{v}"
    );
    // Health still answers.
    let h = reqwest::get(format!("{}/api/health", t.http))
        .await
        .unwrap();
    assert_eq!(h.status(), 200);
}

/// Reads until the server closes the socket; `true` if it did.
async fn server_closes(tcp: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(GUARD * 6, tcp.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

fn addr(t: &TestRelay) -> String {
    t.http.trim_start_matches("http://").to_owned()
}

#[tokio::test(start_paused = true)]
async fn a_silent_socket_is_closed_after_the_header_read_timeout() {
    let t = TestRelay::start(config()).await;
    let mut tcp = tokio::net::TcpStream::connect(addr(&t)).await.unwrap();
    assert!(server_closes(&mut tcp).await, "a silent socket stayed open");
}

#[tokio::test(start_paused = true)]
async fn a_header_trickled_byte_by_byte_is_cut_off() {
    use tokio::io::AsyncWriteExt;
    let t = TestRelay::start(config()).await;
    let mut tcp = tokio::net::TcpStream::connect(addr(&t)).await.unwrap();
    let header =
        b"GET /api/health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let step = Duration::from_millis(SERVER_LIMITS.header_read_timeout_ms / 8);
    let mut cut = false;
    for b in header {
        if tcp.write_all(&[*b]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::advance(step).await;
    }
    assert!(cut || server_closes(&mut tcp).await, "the trickle went on");
}

#[tokio::test(start_paused = true)]
async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = TestRelay::start(config()).await;
    let (pin, token) = t.create_room().await;
    let mut tcp = tokio::net::TcpStream::connect(addr(&t)).await.unwrap();
    let head = format!(
        "PUT /api/rooms/{pin}/bundle HTTP/1.1\r\nHost: x\r\nOrigin: {ORIGIN}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"a\":"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let r = tokio::time::timeout(
        Duration::from_millis(SERVER_LIMITS.body_read_timeout_ms * 2),
        tcp.read_to_end(&mut answer),
    )
    .await;
    assert!(r.is_ok(), "the half-sent body was waited for without end");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}

#[tokio::test]
async fn connections_per_ip_are_capped_and_a_closed_one_frees_its_place() {
    let t = TestRelay::start(with_limits(ServerLimits {
        connections_per_ip: 3,
        ..SERVER_LIMITS
    }))
    .await;
    let a = t.client().await;
    let _b = t.client().await;
    let _c = t.client().await;
    assert!(
        Client::connect(&t.ws, Some(ORIGIN)).await.is_err(),
        "a fourth connection from one IP was accepted"
    );
    drop(a);
    // Its place comes back once the server has seen it close.
    let again = tokio::time::timeout(GUARD, async {
        loop {
            if let Ok(c) = Client::connect(&t.ws, Some(ORIGIN)).await {
                return c;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(again.is_ok(), "a closed connection kept its place");
}

#[tokio::test]
async fn shutdown_ends_within_its_grace_while_a_body_is_half_sent() {
    use tokio::io::AsyncWriteExt;
    let mut t = TestRelay::start(with_limits(ServerLimits {
        shutdown_grace_ms: 1_000,
        body_read_timeout_ms: 3_600_000,
        ..SERVER_LIMITS
    }))
    .await;
    let (pin, token) = t.create_room().await;
    let mut tcp = tokio::net::TcpStream::connect(addr(&t)).await.unwrap();
    let head = format!(
        "PUT /api/rooms/{pin}/bundle HTTP/1.1\r\nHost: x\r\nOrigin: {ORIGIN}\r\nAuthorization: Bearer {token}\r\nContent-Length: 1000\r\n\r\n{{"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    // The request is in its handler, waiting for the body.
    let v: serde_json::Value = reqwest::get(format!("{}/api/health", t.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["ok"], true);
    assert!(
        tokio::time::timeout(GUARD, t.stop()).await.is_ok(),
        "shutdown waited for the half-sent body"
    );
}

#[tokio::test]
async fn bundle_uploads_beyond_the_concurrent_bound_are_refused_503() {
    use tokio::io::AsyncWriteExt;
    let t = TestRelay::start(with_limits(ServerLimits {
        concurrent_uploads: 1,
        ..SERVER_LIMITS
    }))
    .await;
    let (pin, token) = t.create_room().await;
    // One upload holds its place while its body is on its way.
    let mut tcp = tokio::net::TcpStream::connect(addr(&t)).await.unwrap();
    let head = format!(
        "PUT /api/rooms/{pin}/bundle HTTP/1.1\r\nHost: x\r\nOrigin: {ORIGIN}\r\nAuthorization: Bearer {token}\r\nContent-Length: 1000\r\n\r\n{{"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let put = |body: String| {
        reqwest::Client::new()
            .put(format!("{}/api/rooms/{pin}/bundle", t.http))
            .header("Origin", ORIGIN)
            .header("Authorization", format!("Bearer {token}"))
            .body(body)
            .send()
    };
    let bundle = json!({"pluginHtml": "<p>x</p>", "set": {}}).to_string();
    // The first may not have reached its handler yet: a 200 is retried
    // until the held upload is seen.
    let r = tokio::time::timeout(GUARD, async {
        loop {
            let r = put(bundle.clone()).await.unwrap();
            if r.status() != 200 {
                return r;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a second upload was never refused");
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("CONCURRENT_UPLOADS"),
        "{v}"
    );
    // Once it is gone, uploads go through again.
    drop(tcp);
    let ok = tokio::time::timeout(GUARD, async {
        loop {
            if put(bundle.clone()).await.unwrap().status() == 200 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        ok.is_ok(),
        "the place of a dropped upload was not given back"
    );
}

#[tokio::test]
async fn behind_a_proxy_the_address_it_saw_counts_not_the_one_the_client_wrote() {
    let t = TestRelay::start(RelayConfig {
        trust_proxy: true,
        rooms_per_ip_per_hour: 1,
        ..config()
    })
    .await;
    let create = |xff: &'static str| {
        reqwest::Client::new()
            .post(format!("{}/api/rooms", t.http))
            .header("X-Forwarded-For", xff)
            .send()
    };
    assert_eq!(create("1.1.1.1, 9.9.9.9").await.unwrap().status(), 201);
    // The client wrote another address; the proxy appended the same one.
    assert_eq!(create("2.2.2.2, 9.9.9.9").await.unwrap().status(), 429);
    assert_eq!(create("1.1.1.1, 8.8.8.8").await.unwrap().status(), 201);
}

#[tokio::test]
async fn the_bearer_scheme_is_matched_case_insensitively() {
    let t = TestRelay::start(config()).await;
    let (pin, token) = t.create_room().await;
    let bundle = json!({"pluginHtml": "<p>x</p>", "set": {}}).to_string();
    for scheme in ["bearer", "BEARER"] {
        let r = reqwest::Client::new()
            .put(format!("{}/api/rooms/{pin}/bundle", t.http))
            .header("Origin", ORIGIN)
            .header("Authorization", format!("{scheme} {token}"))
            .body(bundle.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
}
