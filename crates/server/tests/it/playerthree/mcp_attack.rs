//! MCP sessions tried from outside: only seat tokens open one, each is
//! bound to its token, capped per token and per IP, and ends when its
//! seat is revoked.

use crate::support::playerthree::*;
use serde_json::json;

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
const LIST_TOOLS: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;

/// POSTs `body` to MCP as `token` (in `session`): (status, session id).
async fn mcp_post(
    t: &TestServer,
    token: &str,
    session: Option<&str>,
    body: &str,
) -> (u16, Option<String>) {
    let mut r = reqwest::Client::new()
        .post(&t.mcp)
        .header("Authorization", format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(body.to_owned());
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    let r = tokio::time::timeout(GUARD, r.send())
        .await
        .unwrap()
        .unwrap();
    let id = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    (r.status().as_u16(), id)
}

async fn initialize(t: &TestServer, token: &str) -> (u16, Option<String>) {
    mcp_post(t, token, None, INITIALIZE).await
}

/// A seat token of `role`, the seat handed to an agent by its team's owner.
async fn seat_token(t: &TestServer, id: &str, op: &str, team: &str, role: &str) -> String {
    let owner = mint(&t.http, id, op, json!({"kind": "team", "team": team})).await;
    let (mut o, _) = t.join(&owner).await;
    o.expect_ok(json!({"op": "controller", "seq": 1, "role": role, "controller": {"kind": "agent", "supervised": false}}))
        .await;
    let d = o
        .expect_ok(json!({"op": "mint", "seq": 2, "role": role}))
        .await;
    d["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_spectator_token_cannot_initialize() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let spectator = mint(&t.http, &id, &op, json!({"kind": "spectator"})).await;
    let team = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    for token in [&spectator, &team] {
        let (status, session) = initialize(&t, token).await;
        assert_eq!(status, 403);
        assert_eq!(session, None);
    }
    assert_eq!(t.p3().mcp_sessions_open().await, 0);
    let seat = seat_token(&t, &id, &op, "red", "red-scout").await;
    let (status, session) = initialize(&t, &seat).await;
    assert_eq!(status, 200);
    assert!(session.is_some());
}

#[tokio::test]
async fn mcp_sessions_are_capped_per_token_and_per_ip() {
    let mut config = p3_config();
    config.mcp_sessions_per_token = 2;
    config.mcp_sessions_per_ip = 3;
    let t = TestServer::start_with(config).await;
    let (id, op) = create_match(&t.http).await;
    let a = seat_token(&t, &id, &op, "red", "red-scout").await;
    let b = seat_token(&t, &id, &op, "blue", "blue-scout").await;
    let (status, first) = initialize(&t, &a).await;
    assert_eq!(status, 200);
    assert_eq!(initialize(&t, &a).await.0, 200);
    assert_eq!(initialize(&t, &a).await.0, 429, "per token");
    assert_eq!(initialize(&t, &b).await.0, 200);
    assert_eq!(initialize(&t, &b).await.0, 429, "per IP");
    assert_eq!(t.p3().mcp_sessions_open().await, 3);
    // Ending one (DELETE) makes room.
    let r = reqwest::Client::new()
        .delete(&t.mcp)
        .header("Authorization", format!("Bearer {a}"))
        .header("mcp-session-id", first.unwrap())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(initialize(&t, &b).await.0, 200);
}

#[tokio::test]
async fn another_token_with_a_session_id_reads_nothing() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let a = seat_token(&t, &id, &op, "red", "red-scout").await;
    let b = seat_token(&t, &id, &op, "blue", "blue-scout").await;
    let (status, session) = initialize(&t, &a).await;
    assert_eq!(status, 200);
    let session = session.unwrap();
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(mcp_post(&t, &a, Some(&session), initialized).await.0, 202);
    // b presents a's session id: nothing, on POST, GET and DELETE.
    assert_eq!(mcp_post(&t, &b, Some(&session), LIST_TOOLS).await.0, 404);
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = reqwest::Client::new()
            .request(method.clone(), &t.mcp)
            .header("Authorization", format!("Bearer {b}"))
            .header("Accept", "text/event-stream")
            .header("mcp-session-id", &session)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method}");
    }
    // The session is still a's.
    assert_eq!(mcp_post(&t, &a, Some(&session), LIST_TOOLS).await.0, 200);
}

#[tokio::test]
async fn a_revoked_seats_session_ends() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let a = seat_token(&t, &id, &op, "red", "red-scout").await;
    let (status, session) = initialize(&t, &a).await;
    assert_eq!(status, 200);
    let session = session.unwrap();
    assert_eq!(t.p3().mcp_sessions_open().await, 1);
    assert_eq!(revoke(&t.http, &id, &op, &a).await, 200);
    assert_eq!(t.p3().mcp_sessions_open().await, 0, "ended at once");
    assert_eq!(mcp_post(&t, &a, Some(&session), LIST_TOOLS).await.0, 401);
}

/// Opens the session's GET stream on a socket with a small receive
/// buffer and never reads it: the server's pushes soon stall.
async fn unread_stream(t: &TestServer, token: &str, session: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let addr: std::net::SocketAddr = t
        .mcp
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let req = format!(
        "GET /playerthree/mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Accept: text/event-stream\r\nmcp-session-id: {session}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

#[tokio::test]
async fn tells_to_a_stream_nobody_reads_hold_one_push_per_session() {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let owner = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = t.join(&owner).await;
    o.expect_ok(json!({"op": "controller", "seq": 1, "role": "red-scout", "controller": {"kind": "agent", "supervised": false}}))
        .await;
    let d = o
        .expect_ok(json!({"op": "mint", "seq": 2, "role": "red-scout"}))
        .await;
    let seat = d["token"].as_str().unwrap().to_owned();

    let (status, session) = initialize(&t, &seat).await;
    assert_eq!(status, 200);
    let session = session.unwrap();
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(
        mcp_post(&t, &seat, Some(&session), initialized).await.0,
        202
    );
    let _stream = unread_stream(&t, &seat, &session).await;
    let subscribe = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"resources/subscribe","params":{{"uri":"playerthree://{id}/inbox/red-scout"}}}}"#
    );
    assert_eq!(mcp_post(&t, &seat, Some(&session), &subscribe).await.0, 200);

    // Many large tells, far more than the stream's buffers hold, from
    // several owners: each token is read at most
    // INBOUND_BYTES_PER_SECOND_PER_TOKEN.
    let mut owners = vec![o];
    for _ in 0..15 {
        let token = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
        owners.push(t.join(&token).await.0);
    }
    let text = "x".repeat(4000);
    let pushes = &t.p3().metrics.mcp_tell_pushes;
    let mut most = 0;
    let mut refused = 0;
    let mut seq = 3;
    for _ in 0..60 {
        for i in 0..20 {
            seq += 1;
            let n = owners.len();
            let r = owners[i % n]
                .call(json!({"op": "tell", "seq": seq, "roles": ["red-scout"], "text": text}))
                .await;
            if r["ok"] == false {
                refused += 1;
            }
            most = most.max(pushes.load(std::sync::atomic::Ordering::Relaxed));
        }
        t.tick().await;
    }
    assert!(most <= 1, "{most} tell pushes in flight for one session");
    // What the stream did not take waited in the seat's bounded inbox.
    assert!(refused > 0, "no tell met MAX_INBOX_PER_SEAT");
}
