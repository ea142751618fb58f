//! The relay's edges under attack: which `X-Forwarded-For` entry counts,
//! per-IP rates for lookups and joins (and what the host can do about a
//! join flood), origins compared as origins, WebSocket protocol errors
//! closed with their codes, and the host's `close` answered in order.

use crate::support::relay::*;
use futures_util::{SinkExt, StreamExt};
use hostwire::http::AllowedOrigins;
use hostwire::relay::{RelayConfig, ServerLimits, SERVER_LIMITS};
use serde_json::{json, Value};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

fn with_limits(server_limits: ServerLimits) -> RelayConfig {
    RelayConfig {
        server_limits,
        ..config()
    }
}

fn addr(t: &TestRelay) -> String {
    t.http.trim_start_matches("http://").to_owned()
}

// --- Item 9: TRUSTED_PROXY_HOPS ---------------------------------------

/// `hostwire serve` with these environment variables, on a free port; the
/// child and its base URL.
async fn serve_with_env(
    env: &[(&str, &str)],
) -> (tokio::process::Child, String, tempfile::TempDir) {
    let dir = temp_dir("edges-cli");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire"));
    cmd.kill_on_drop(true)
        .env_remove("RUST_LOG")
        .args(["serve", "--port", "0"])
        .arg("--data-dir")
        .arg(dir.path())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(GUARD, stdout.read_line(&mut line))
        .await
        .expect("no address line")
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("hostwire listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    (child, url, dir)
}

#[tokio::test]
async fn trusted_proxy_hops_from_the_environment_picks_the_entry_that_many_in_from_the_right() {
    let (_child, url, _dir) = serve_with_env(&[
        ("TRUST_PROXY", "1"),
        ("TRUSTED_PROXY_HOPS", "2"),
        ("ROOMS_PER_IP_PER_HOUR", "1"),
    ])
    .await;
    let create = |xff: &'static str| {
        reqwest::Client::new()
            .post(format!("{url}/api/rooms"))
            .header("X-Forwarded-For", xff)
            .send()
    };
    // Two proxies: the outer one saw the client at 9.9.9.9, the inner one
    // appended the outer one's address. The leftmost was written by the
    // client.
    assert_eq!(
        create("1.1.1.1, 9.9.9.9, 10.0.0.2").await.unwrap().status(),
        201
    );
    assert_eq!(
        create("2.2.2.2, 9.9.9.9, 10.0.0.2").await.unwrap().status(),
        429,
        "the same client, another address written by it"
    );
    assert_eq!(
        create("1.1.1.1, 8.8.8.8, 10.0.0.2").await.unwrap().status(),
        201,
        "another client behind the same two proxies"
    );
}

#[tokio::test]
async fn serve_help_names_the_new_options_environment_variables() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire"))
        .args(["serve", "--help"])
        .output()
        .await
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for var in [
        "TRUSTED_PROXY_HOPS",
        "LOOKUPS_PER_IP_PER_SECOND",
        "LOOKUP_BURST_PER_IP",
        "JOINS_PER_IP_PER_SECOND",
        "JOIN_BURST_PER_IP",
    ] {
        assert!(help.contains(&format!("[env: {var}")), "{var} in:\n{help}");
    }
}

// --- Item 10: per-IP rates for lookups and joins ----------------------

async fn lookup(t: &TestRelay, pin: &str, xff: Option<&str>) -> reqwest::Response {
    let mut r = reqwest::Client::new().get(format!("{}/api/rooms/{pin}", t.http));
    if let Some(x) = xff {
        r = r.header("X-Forwarded-For", x);
    }
    r.send().await.unwrap()
}

#[tokio::test]
async fn room_lookups_are_limited_per_ip_with_a_clear_429_and_retry_after() {
    let t = TestRelay::start(RelayConfig {
        trust_proxy: true,
        ..with_limits(ServerLimits {
            lookups_per_ip_per_second: 2,
            lookup_burst_per_ip: 5,
            ..SERVER_LIMITS
        })
    })
    .await;
    let (pin, _) = t.create_room().await;
    // Guessing: found or not, every lookup costs a token.
    for (i, p) in [pin.as_str(), "100000", "999999", "abc", pin.as_str()]
        .iter()
        .enumerate()
    {
        let r = lookup(&t, p, Some("6.6.6.6")).await;
        assert_ne!(r.status(), 429, "lookup {i}");
    }
    let r = lookup(&t, &pin, Some("6.6.6.6")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(
        r.headers()["content-type"],
        "application/json; charset=utf-8"
    );
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("LOOKUPS_PER_IP_PER_SECOND"),
        "{v}"
    );
    // Another client IP has its own bucket; time refills this one.
    assert_eq!(lookup(&t, &pin, Some("7.7.7.7")).await.status(), 200);
    // An IPv6 client counts as its /64: rotating through it buys nothing.
    for i in 0..5 {
        let ip = format!("2001:db8:1:2::{i:x}");
        assert_eq!(lookup(&t, &pin, Some(&ip)).await.status(), 200, "{ip}");
    }
    assert_eq!(
        lookup(&t, &pin, Some("2001:db8:1:2:ffff::1"))
            .await
            .status(),
        429
    );
    assert_eq!(
        lookup(&t, &pin, Some("2001:db8:1:3::1")).await.status(),
        200
    );
    t.clock.advance_ms(1_000);
    for _ in 0..2 {
        assert_eq!(lookup(&t, &pin, Some("6.6.6.6")).await.status(), 200);
    }
    assert_eq!(lookup(&t, &pin, Some("6.6.6.6")).await.status(), 429);
    let m = reqwest::get(format!("{}/metrics", t.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("hostwire_relay_lookups_rate_limited_total 3"),
        "{m}"
    );
}

#[tokio::test]
async fn the_per_ip_tables_stay_bounded_under_many_addresses_and_forget_idle_ones() {
    let t = TestRelay::start(RelayConfig {
        trust_proxy: true,
        ..with_limits(ServerLimits {
            lookups_per_ip_per_second: 1,
            lookup_burst_per_ip: 3,
            rate_limited_ips: 50,
            ..SERVER_LIMITS
        })
    })
    .await;
    // 500 addresses, each spending a token and never coming back.
    for i in 0..500u32 {
        let xff = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        let r = lookup(&t, "100000", Some(&xff)).await;
        assert_eq!(r.status(), 404);
        assert!(t.relay().rate_limited_ips().0 <= 50);
    }
    // Full of draining buckets, each pass makes room for an eighth.
    let held = t.relay().rate_limited_ips().0;
    assert!((44..=50).contains(&held), "{held}");
    // Refilled buckets say nothing a new one would not: the sweep drops them.
    t.clock.advance_ms(3_000);
    t.relay().sweep().await;
    assert_eq!(t.relay().rate_limited_ips(), (0, 0));
}

fn join(pin: &str, name: &str) -> Value {
    json!({"t": "join", "protocol": 1, "pin": pin, "name": name})
}

#[tokio::test]
async fn a_join_flood_from_one_ip_is_limited_and_the_host_shuts_it_out() {
    let t = TestRelay::start(with_limits(ServerLimits {
        joins_per_ip_per_second: 1,
        join_burst_per_ip: 6,
        ..SERVER_LIMITS
    }))
    .await;
    // The host's own attach counts: 5 tokens are left for joins.
    let (mut host, pin, _) = t.host().await;
    let mut admitted = Vec::new();
    let mut refused = 0;
    for i in 0..20 {
        let mut c = t.client().await;
        c.send(join(&pin, &format!("bot{i}"))).await;
        let v = c.recv().await;
        if v["t"] == "joined" {
            admitted.push((c, v));
            continue;
        }
        // Not fatal (a class behind one IP tries again), but closed with
        // 1013 so that the client reconnects with its backoff.
        assert_eq!(
            (v["code"].as_str(), v["fatal"].as_bool()),
            (Some("RATE_LIMITED"), Some(false)),
            "{v}"
        );
        assert!(v["message"].as_str().unwrap().contains("try again in 1 s"));
        assert_eq!(c.ended().await, Ended::Closed(1013));
        refused += 1;
    }
    assert_eq!((admitted.len(), refused), (5, 15));
    // The host saw each one come in.
    let seen = host.until_pong().await;
    let joins: Vec<&Value> = seen.iter().filter(|v| v["event"] == "join").collect();
    assert_eq!(joins.len(), 5, "{seen:?}");
    // It closes the room to new players and kicks the bots.
    host.send(json!({"t": "open", "open": false})).await;
    for (c, v) in &mut admitted {
        host.send(json!({"t": "kick", "playerId": v["playerId"]}))
            .await;
        assert_eq!(c.recv().await, json!({"t": "closed", "reason": "kicked"}));
        assert_eq!(c.ended().await, Ended::Closed(1000));
    }
    // Tokens refilled: the flood goes on, and meets a closed room.
    t.clock.advance_ms(10_000);
    let mut again = t.client().await;
    again.send(join(&pin, "bot")).await;
    again.expect_error("ROOM_CLOSED", true).await;
    assert_eq!(again.ended().await, Ended::Closed(4000));
    // A kicked bot's token is refused.
    let mut back = t.client().await;
    back.send(json!({"t": "join", "protocol": 1, "pin": pin, "token": admitted[0].1["token"]}))
        .await;
    back.expect_error("KICKED", true).await;
    let info: Value = lookup(&t, &pin, None).await.json().await.unwrap();
    assert_eq!(
        (info["players"].as_u64(), info["open"].as_bool()),
        (Some(0), Some(false))
    );
}

// --- Item 11: origins as origins; protocol errors closed with codes ---

#[tokio::test]
async fn a_configured_origin_in_upper_case_or_with_a_trailing_slash_matches() {
    let t = TestRelay::start(RelayConfig {
        allowed_origins: AllowedOrigins::parse(
            "HTTPS://Play.Example.ORG:443/, http://other.example",
        ),
        ..config()
    })
    .await;
    // The browser sends the origin as the URL Standard serializes it.
    let r = reqwest::Client::new()
        .post(format!("{}/api/rooms", t.http))
        .header("Origin", ORIGIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(r.headers()["access-control-allow-origin"], ORIGIN);
    let mut ws = Client::connect(&t.ws, Some(ORIGIN)).await.unwrap();
    ws.send(json!({"t": "ping"})).await;
    assert_eq!(ws.recv().await["t"], "pong");
    // Another port or scheme is another origin.
    for o in ["https://play.example.org:8443", "http://play.example.org"] {
        let r = reqwest::Client::new()
            .post(format!("{}/api/rooms", t.http))
            .header("Origin", o)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{o}");
        assert!(Client::connect(&t.ws, Some(o)).await.is_err(), "{o}");
    }
}

/// A WebSocket upgrade written by hand; the socket after the 101.
async fn raw_upgrade(t: &TestRelay) -> TcpStream {
    let mut tcp = TcpStream::connect(addr(t)).await.unwrap();
    let req = format!(
        "GET /ws HTTP/1.1\r\nHost: x\r\nOrigin: {ORIGIN}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(GUARD, tcp.read(&mut b))
            .await
            .expect("no upgrade answer")
            .unwrap();
        assert_eq!(n, 1, "closed during the upgrade");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    tcp
}

/// A client frame: `first` is FIN, RSV and opcode; masked unless `mask` is
/// `None`.
fn frame(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut f = vec![first];
    match mask {
        Some(m) => {
            f.push(0x80 | payload.len() as u8);
            f.extend_from_slice(&m);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ m[i % 4]));
        }
        None => {
            f.push(payload.len() as u8);
            f.extend_from_slice(payload);
        }
    }
    f
}

/// The server's close frame after `bytes`: its code and reason (`None`
/// for a close frame without a code; panics if the socket ends without
/// one).
async fn close_after(t: &TestRelay, bytes: &[u8]) -> (Option<u16>, String) {
    let mut tcp = raw_upgrade(t).await;
    tcp.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    loop {
        // Server frames are unmasked; this test's are all short.
        while buf.len() >= 2 && buf.len() >= 2 + (buf[1] & 0x7f) as usize {
            let len = (buf[1] & 0x7f) as usize;
            assert!(len < 126, "a long server frame");
            let (op, payload) = (buf[0] & 0x0f, buf[2..2 + len].to_vec());
            buf.drain(..2 + len);
            if op == 0x8 {
                if payload.len() < 2 {
                    return (None, String::new());
                }
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                return (
                    Some(code),
                    String::from_utf8(payload[2..].to_vec()).unwrap(),
                );
            }
        }
        let mut chunk = [0u8; 256];
        let n = tokio::time::timeout(GUARD, tcp.read(&mut chunk))
            .await
            .expect("no close frame")
            .unwrap_or(0);
        assert!(n > 0, "the socket ended without a close frame");
        buf.extend_from_slice(&chunk[..n]);
    }
}

const MASK: Option<[u8; 4]> = Some([0x12, 0x34, 0x56, 0x78]);

#[tokio::test]
async fn websocket_protocol_errors_close_with_their_code_and_a_reason() {
    let t = TestRelay::start(config()).await;
    // Invalid UTF-8 in a text frame: 1007.
    let (code, reason) = close_after(&t, &frame(0x81, &[b'{', 0xff, 0xfe], MASK)).await;
    assert_eq!(code, Some(1007), "{reason}");
    assert!(reason.contains("UTF-8"), "{reason}");
    // Invalid UTF-8 split over a fragmented message: 1007 too.
    let mut split = frame(0x01, b"{\"t\":\"", MASK);
    split.extend(frame(0x80, &[0xc3, 0x28], MASK));
    assert_eq!(close_after(&t, &split).await.0, Some(1007));
    // An unmasked client frame: 1002.
    let (code, reason) = close_after(&t, &frame(0x81, br#"{"t":"ping"}"#, None)).await;
    assert_eq!(code, Some(1002), "{reason}");
    assert!(reason.contains("unmasked"), "{reason}");
    // Reserved bits without an extension: 1002.
    let (code, reason) = close_after(&t, &frame(0xC1, br#"{"t":"ping"}"#, MASK)).await;
    assert_eq!(code, Some(1002), "{reason}");
    assert!(reason.contains("reserved"), "{reason}");
    // A reserved opcode: 1002.
    let (code, reason) = close_after(&t, &frame(0x83, b"x", MASK)).await;
    assert_eq!(code, Some(1002), "{reason}");
    // The server is fine, and a good frame still gets its answer.
    let mut c = t.client().await;
    c.send(json!({"t": "ping"})).await;
    assert_eq!(c.recv().await["t"], "pong");
}

// --- Item 12: the host's close, answered in order ----------------------

/// The next text frame and then the close, as (frame, code, reason).
async fn closed_then_close(ws: &mut Client) -> (Option<Value>, Option<u16>, String) {
    let mut text = None;
    loop {
        let m = tokio::time::timeout(GUARD, ws.ws.next())
            .await
            .expect("nothing arrived");
        match m {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                // A player's view of the host attaching may come first.
                if v["t"] != "presence" && v["t"] != "host-presence" {
                    text.get_or_insert(v);
                }
            }
            Some(Ok(Message::Close(Some(f)))) => {
                return (text, Some(u16::from(f.code)), f.reason.to_string())
            }
            Some(Ok(Message::Close(None))) => return (text, None, String::new()),
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return (text, None, "dropped".into()),
        }
    }
}

#[tokio::test]
async fn a_host_that_closes_the_room_and_its_socket_at_once_always_gets_closed_then_1000() {
    let t = TestRelay::start(config()).await;
    for round in 0..50 {
        let (mut host, pin, _) = t.host().await;
        let (mut a, _, _) = t.player(&pin, "A").await;
        let (mut b, _, _) = t.player(&pin, "B").await;
        // Both joins reached the host before it closes.
        host.until_pong().await;
        // `close` and the close frame in one write: the server reads both
        // at once, as from a client that closes right after sending.
        host.ws
            .feed(Message::Text(json!({"t": "close"}).to_string().into()))
            .await
            .unwrap();
        host.ws
            .close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "bye".into(),
            }))
            .await
            .unwrap();
        let want = (
            Some(json!({"t": "closed", "reason": "host"})),
            Some(1000),
            "room closed".to_owned(),
        );
        assert_eq!(
            closed_then_close(&mut host).await,
            want,
            "host, round {round}"
        );
        assert_eq!(
            closed_then_close(&mut a).await,
            want,
            "player A, round {round}"
        );
        assert_eq!(
            closed_then_close(&mut b).await,
            want,
            "player B, round {round}"
        );
    }
}
