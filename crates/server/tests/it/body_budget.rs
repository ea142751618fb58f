//! One budget of request-body bytes over every protocol's API: a hosted
//! session's creation holding most of it makes a ggui agent's body wait
//! its turn (503 with Retry-After, before the body is read), and the
//! budget comes back when the held request ends.

use crate::support::server::Spawn;
use crate::support::session::{ggui_config, relay_config, GGUI_AGENT, GUARD, OPERATOR, T0};
use hostwire::app::App;
use hostwire::http::LARGEST_REQUEST_BODY;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn server() -> (App, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = relay_config();
    // The smallest budget there is: one largest body.
    config.credentials.request_body_budget_bytes = LARGEST_REQUEST_BODY;
    let app = Spawn {
        ggui: ggui_config(),
        sessions_durable: true,
        ..Spawn::new(config)
    }
    .start_at(
        &dir.path().join("h.db"),
        &hostwire_core::ManualClock::new(T0),
    )
    .await;
    let http = format!("http://{}", app.addr);
    (app, http, dir)
}

/// Waits (yielding, bounded by GUARD) until `f` holds.
async fn until(f: impl Fn() -> bool) {
    tokio::time::timeout(GUARD, async {
        while !f() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("never happened");
}

/// A hosted session's creation that declares 7 MiB and sends a few bytes,
/// once the budget holds its share.
async fn held_upload(app: &App, addr: &str) -> TcpStream {
    let mut held = TcpStream::connect(addr).await.unwrap();
    let declared = 7 * 1024 * 1024;
    held.write_all(
        format!(
            "POST /memizy/sessions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {OPERATOR}\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n{{\"pluginHtml\": \""
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (bodies, budget) = (app.gate.bodies(), app.gate.body_budget_bytes());
    until(|| bodies.available_permits() == budget - declared).await;
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_upload_to_one_api_makes_another_apis_body_wait() {
    let (app, http, _dir) = server().await;
    let budget = app.gate.body_budget_bytes();
    assert_eq!(budget, LARGEST_REQUEST_BODY);
    let addr = http.trim_start_matches("http://").to_owned();
    let held = held_upload(&app, &addr).await;
    let bodies = Arc::clone(app.gate.bodies());

    // A ggui agent's 1.5 MiB emit does not fit in what is left.
    let client = reqwest::Client::new();
    let emit = || {
        client
            .put(format!("{http}/ggui/sessions/s1"))
            .header("authorization", format!("Bearer {GGUI_AGENT}"))
            .header("content-type", "application/json")
            .body(format!(
                "{{\"appId\": \"conformance\", \"pad\": \"{}\"}}",
                "x".repeat(1536 * 1024)
            ))
            .send()
    };
    let r = emit().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "RATE_LIMITED", "{v}");
    let m = v["message"].as_str().unwrap();
    assert!(m.contains("REQUEST_BODY_BUDGET_BYTES"), "{m}");
    assert_eq!(v["error"], v["message"], "the relay's clients read `error`");

    // The held request ends: its share comes back, and the body is read.
    drop(held);
    until(|| bodies.available_permits() == budget).await;
    let r = emit().await.unwrap();
    assert_ne!(r.status(), 503, "{:?}", r.text().await);
    // Requests without a body are never charged.
    let r = client
        .get(format!("{http}/api/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// A client that sends its whole body before reading gets the 503, not a
/// reset: the server reads and drops what it did not take (up to the
/// largest body, within the body deadline) instead of closing with
/// unread bytes, which makes the client's TCP stack discard the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_body_sent_whole_still_gets_its_answer() {
    use tokio::io::AsyncReadExt;
    let (app, http, _dir) = server().await;
    let addr = http.trim_start_matches("http://").to_owned();
    let held = held_upload(&app, &addr).await;

    for round in 0..3 {
        let body = format!(
            "{{\"appId\": \"conformance\", \"pad\": \"{}\"}}",
            "x".repeat(6 * 1024 * 1024)
        );
        let request = format!(
            "PUT /ggui/sessions/s{round} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {GGUI_AGENT}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let sock = TcpStream::connect(&addr).await.unwrap();
        let (mut rd, mut wr) = sock.into_split();
        let writing = tokio::spawn(async move { wr.write_all(request.as_bytes()).await });
        let mut answer = Vec::new();
        let read = tokio::time::timeout(GUARD, rd.read_to_end(&mut answer))
            .await
            .expect("the answer never ended");
        let written = writing.await.unwrap();
        assert!(
            read.is_ok() && written.is_ok(),
            "round {round}: read {read:?}, write {written:?}, {} bytes read",
            answer.len()
        );
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 503"),
            "round {round}: {answer}"
        );
        assert!(answer.contains("REQUEST_BODY_BUDGET_BYTES"), "{answer}");
    }
    drop(held);
}
