//! The one WebSocket driver under every endpoint, tried from outside on
//! `/ws`, `/ggui/ws`, `/playerthree/ws` and `/memizy/session/ws`:
//!
//! - a client that pings and never reads is closed at the idle timeout
//!   (pings are not activity), on every endpoint;
//! - invalid UTF-8 in a text frame closes 1007 with a reason, everywhere;
//! - a flooding client gets the frames queued before its close and the
//!   close code, not a reset;
//! - shutdown closes every socket (attached or not) with 1001 and answers
//!   ggui long polls, within the grace;
//! - who may connect: clients that are not browsers (no `Origin`) where
//!   they are expected, and a refused upgrade says why.

use crate::support::session::{Api, TestHost, GGUI_AGENT, GUARD};
use crate::support::sockets::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::Message;

#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The close code and its reason.
    Closed(u16, String),
    /// No close frame: a reset or the socket just ended (what a browser
    /// reports as 1006).
    Dropped,
}

/// Reads until the connection ends: the texts that came first, and how it
/// ended.
async fn read_to_end(ws: &mut Ws) -> (Vec<String>, Ended) {
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout(GUARD, ws.next())
            .await
            .expect("connection did not end")
        {
            None | Some(Err(_)) => return (texts, Ended::Dropped),
            Some(Ok(Message::Close(Some(f)))) => {
                return (
                    texts,
                    Ended::Closed(u16::from(f.code), f.reason.to_string()),
                )
            }
            Some(Ok(Message::Close(None))) => {
                return (
                    texts,
                    Ended::Closed(u16::from(CloseCode::Status), String::new()),
                )
            }
            Some(Ok(Message::Text(t))) => texts.push(t.to_string()),
            Some(Ok(_)) => continue,
        }
    }
}

/// Pings (never reading) for twice `idle`, in steps of a sixth of it;
/// true once the server has closed the connection (a send fails).
async fn ping_flood_is_cut_off(ws: &mut Ws, idle: Duration) -> bool {
    for _ in 0..12 {
        for _ in 0..200 {
            let ping = Message::Ping(vec![7u8; 125].into());
            if ws.send(ping).await.is_err() {
                return true;
            }
        }
        tokio::time::advance(idle / 6).await;
    }
    false
}

#[tokio::test(start_paused = true)]
async fn a_client_that_pings_and_never_reads_is_closed_at_the_idle_timeout_on_ggui() {
    let h = TestHost::start().await;
    let mut ws = ggui_subscribed(&h, "flood", Some(16 * 1024)).await;
    assert!(ping_flood_is_cut_off(&mut ws, IDLE).await, "still open");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_pings_and_never_reads_is_closed_at_the_idle_timeout_on_playerthree() {
    let h = TestHost::start().await;
    let (_, _, token) = p3_token(&h.http).await;
    let mut ws = p3_joined(&h, &token, Some(16 * 1024)).await;
    assert!(ping_flood_is_cut_off(&mut ws, IDLE).await, "still open");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_pings_and_never_reads_is_closed_at_the_idle_timeout_on_sessions() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let mut ws = board(&h, &api, Some(16 * 1024)).await;
    // Said hello: the board is a device the session keeps.
    hello(&mut ws).await;
    assert!(ping_flood_is_cut_off(&mut ws, IDLE).await, "still open");
}

/// Sends a text frame whose payload is not UTF-8.
async fn send_invalid_utf8(ws: &mut Ws) {
    let frame = Frame::message(vec![b'"', 0xff, 0xfe, b'"'], OpCode::Data(Data::Text), true);
    ws.send(Message::Frame(frame)).await.unwrap();
}

async fn assert_closed_1007(mut ws: Ws, endpoint: &str) {
    send_invalid_utf8(&mut ws).await;
    let (texts, ended) = read_to_end(&mut ws).await;
    assert!(
        !texts.iter().any(|t| t.contains("goodbye")),
        "{endpoint}: {texts:?}"
    );
    match ended {
        Ended::Closed(1007, reason) => assert!(reason.contains("UTF-8"), "{endpoint}: {reason}"),
        other => panic!("{endpoint}: {other:?}"),
    }
}

#[tokio::test]
async fn invalid_utf8_in_a_text_frame_closes_1007_with_a_reason_on_every_endpoint() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let relay = connect(&format!("{}/ws", h.ws), Some(ORIGIN), None).await;
    assert_closed_1007(relay, "/ws").await;
    let ggui = connect(&ggui_url(&h, "s1").await, None, None).await;
    assert_closed_1007(ggui, "/ggui/ws").await;
    let (_, _, token) = p3_token(&h.http).await;
    let p3 = p3_joined(&h, &token, None).await;
    assert_closed_1007(p3, "/playerthree/ws").await;
    let device = board(&h, &api, None).await;
    assert_closed_1007(device, "/memizy/session/ws").await;
}

#[tokio::test]
async fn a_flooding_client_gets_its_answers_and_the_close_code_not_a_reset() {
    let h = TestHost::start().await;
    let (_, _, token) = p3_token(&h.http).await;
    // A small receive window: the answers wait in the server's send buffer
    // while the client is busy sending, where a reset would destroy them.
    let mut ws = p3_joined(&h, &token, Some(4 * 1024)).await;
    // The clock stands still: a burst of 40, then 50 refusals in a row,
    // then the close (4029); the client goes on sending meanwhile.
    let hold = |seq: u64| {
        Message::text(
            json!({"op": "call", "seq": seq, "role": "red-scout", "method": "hold"}).to_string(),
        )
    };
    for seq in 1..=3000 {
        if ws.send(hold(seq)).await.is_err() {
            break;
        }
    }
    let (texts, ended) = read_to_end(&mut ws).await;
    assert_eq!(ended, Ended::Closed(4029, "rate limited".into()));
    let results: Vec<Value> = texts
        .iter()
        .map(|t| serde_json::from_str::<Value>(t).unwrap())
        .filter(|v| v["op"] == "result")
        .collect();
    // Every answer queued before the close arrived: 40 done, 50 refused.
    assert_eq!(results.len(), 90, "{}", results.len());
    assert_eq!(results[39]["ok"], true);
    assert_eq!(results[89]["code"], "rate_limited");
}

#[tokio::test]
async fn shutdown_closes_every_socket_with_1001_and_answers_long_polls_within_the_grace() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (_, _, token) = p3_token(&h.http).await;
    let mut sockets = [
        // Attached to nothing.
        (
            "/ws",
            connect(&format!("{}/ws", h.ws), Some(ORIGIN), None).await,
        ),
        (
            "/ggui/ws",
            connect(&ggui_url(&h, "s0").await, None, None).await,
        ),
        (
            "/playerthree/ws before its join",
            connect(&format!("{}/playerthree/ws", h.ws), None, None).await,
        ),
        // Attached.
        ("/ggui/ws subscribed", ggui_subscribed(&h, "s1", None).await),
        ("/playerthree/ws joined", p3_joined(&h, &token, None).await),
        ("/memizy/session/ws", board(&h, &api, None).await),
    ];
    let http = h.http.clone();
    let poll = tokio::spawn(async move {
        reqwest::Client::new()
            .get(format!("{http}/ggui/sessions/s1/actions?waitMs=25000"))
            .header("Authorization", format!("Bearer {GGUI_AGENT}"))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    // The poll is waiting (a condition, not a time).
    tokio::time::timeout(GUARD, async {
        loop {
            let m = reqwest::get(format!("{}/metrics", h.http))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if m.lines().any(|l| l == "hostwire_ggui_long_polls 1") {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the long poll never waited");
    let started = tokio::time::Instant::now();
    let mut h = h;
    let server = h.server.take().unwrap();
    let stop = tokio::spawn(server.shutdown());
    for (name, ws) in sockets.iter_mut() {
        let (_, ended) = read_to_end(ws).await;
        assert!(matches!(ended, Ended::Closed(1001, _)), "{name}: {ended:?}");
    }
    let answered = tokio::time::timeout(GUARD, poll).await.unwrap().unwrap();
    assert!(
        answered.is_ok(),
        "the long poll was not answered: {answered:?}"
    );
    tokio::time::timeout(GUARD, stop).await.unwrap().unwrap();
    let grace = Duration::from_millis(hostwire::relay::SERVER_LIMITS.shutdown_grace_ms);
    assert!(started.elapsed() < grace, "{:?}", started.elapsed());
}

#[tokio::test]
async fn who_may_connect_and_why_a_refused_upgrade_is_refused() {
    let strict = {
        use hostwire::http::AllowedOrigins;
        let mut config = crate::support::session::relay_config();
        config.allowed_origins = AllowedOrigins::List(vec![ORIGIN.to_owned()]);
        let store = std::sync::Arc::new(hostwire_store::SqliteStore::in_memory().unwrap());
        let clock = hostwire_core::ManualClock::new(crate::support::session::T0);
        crate::support::server::Spawn::new(config)
            .start(store, &clock)
            .await
    };

    let base = format!("ws://{}", strict.addr);
    // A bot or game server sends no Origin: its token admits it.
    let (_, _, token) = p3_token(&format!("http://{}", strict.addr)).await;
    let mut bot = connect(&format!("{base}/playerthree/ws"), None, None).await;
    bot.send(Message::text(
        json!({"op": "join", "token": token}).to_string(),
    ))
    .await
    .unwrap();
    assert_eq!(text(&mut bot).await["ok"], true);
    drop(bot);
    // A browser of another origin is refused, and told why.
    for path in ["/ws", "/playerthree/ws"] {
        let mut req = format!("{base}{path}").into_client_request().unwrap();
        req.headers_mut()
            .insert("Origin", "https://evil.example".parse().unwrap());
        match tokio_tungstenite::connect_async(req).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                assert_eq!(r.status(), 403, "{path}");
                let body =
                    String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned();
                assert!(body.contains("Origin not allowed:"), "{path}: {body:?}");
            }
            other => panic!("{path}: {:?}", other.map(|_| ())),
        }
    }
    // The relay is for browsers: no Origin is refused, with why.
    let req = format!("{base}/ws").into_client_request().unwrap();
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), 403);
            let body =
                String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned();
            assert!(body.contains("Origin not allowed:"), "{body:?}");
        }
        other => panic!("/ws without Origin: {:?}", other.map(|_| ())),
    }
    strict.shutdown().await;
}

/// A client's bytes on a raw TCP socket, and what the server answered: up
/// to `until` (the connection is kept alive), or all it sent before it
/// closed.
async fn raw_exchange(addr: &str, request: &[u8], until: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    while !String::from_utf8_lossy(&answer).contains(until) {
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(GUARD, tcp.read(&mut chunk))
            .await
            .expect("no answer")
            .unwrap();
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// A text frame as a client sends it (RFC 6455 5.2: masked; a payload
/// under 64 KiB).
fn client_text_frame(payload: &[u8]) -> Vec<u8> {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut f = vec![0x81u8];
    if payload.len() < 126 {
        f.push(0x80 | payload.len() as u8);
    } else {
        f.push(0x80 | 126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

fn upgrade_request(path: &str, host: &str, version: &str, key: bool) -> String {
    let key = if key {
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    } else {
        ""
    };
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: {version}\r\n{key}\r\n"
    )
}

#[tokio::test]
async fn a_frame_sent_with_the_upgrade_request_is_read_and_a_bad_upgrade_says_why() {
    let h = TestHost::start().await;
    let addr = h.ws.trim_start_matches("ws://").to_owned();
    // The join sent in the same write as the upgrade request, before the
    // 101: the HTTP layer has read it with the request, and the socket
    // must still get it.
    let (_, _, token) = p3_token(&h.http).await;
    let join = json!({"op": "join", "token": token}).to_string();
    let mut bytes = upgrade_request("/playerthree/ws", &addr, "13", true).into_bytes();
    bytes.extend(client_text_frame(join.as_bytes()));
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut tcp, &bytes)
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(GUARD, tokio::io::AsyncReadExt::read(&mut tcp, &mut b))
            .await
            .expect("no answer to the upgrade")
            .unwrap();
        assert_eq!(n, 1, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "the RFC's accept for its sample key: {head}"
    );
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        tcp,
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    let answer = tokio::time::timeout(GUARD, ws.next())
        .await
        .expect("no answer to the join")
        .expect("closed")
        .unwrap();
    let v: Value = serde_json::from_str(answer.to_text().unwrap()).unwrap();
    assert_eq!(v["ok"], true, "the join sent with the request: {v}");

    // What is no upgrade is refused before any protocol runs, with why.
    let cases = [
        (
            upgrade_request("/ws", &addr, "8", true),
            "400",
            "Sec-WebSocket-Version must be 13",
        ),
        (
            upgrade_request("/ws", &addr, "13", false),
            "400",
            "Sec-WebSocket-Key is missing",
        ),
        (
            format!("GET /ggui/ws HTTP/1.1\r\nHost: {addr}\r\nSec-WebSocket-Version: 13\r\n\r\n"),
            "400",
            "the Connection header does not say upgrade",
        ),
    ];
    for (request, status, why) in cases {
        let answer = raw_exchange(&addr, request.as_bytes(), why).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{request}: {answer}"
        );
        assert!(answer.contains(why), "{request}: {answer}");
    }
}
