//! The agent API reads a bounded number of body bytes at once: requests
//! whose bodies would pass the budget are answered 503 `RATE_LIMITED` at
//! once, before their bodies are read, and the budget comes back when
//! they end.

use crate::support::ggui::*;
use hostwire::ggui::api::{API_BODY_BUDGET_BYTES, API_BODY_LIMIT};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A request that declares a body of `API_BODY_LIMIT` bytes and sends
/// only its first bytes: held open, as a slow or hostile agent does.
async fn held_request(http: &str, i: usize) -> TcpStream {
    let addr = http.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PUT /ggui/sessions/held{i} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {API_BODY_LIMIT}\r\n\r\n{{\"appId\": \"",
        app_credential("conformance")
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_budget_are_refused_503_before_they_are_read() {
    let s = Server::start().await;
    let held_count = API_BODY_BUDGET_BYTES / API_BODY_LIMIT;
    let mut held = Vec::new();
    for i in 0..held_count {
        held.push(held_request(&s.http, i).await);
    }
    // Once the held bodies have their share, a further body is refused.
    let refused = tokio::time::timeout(GUARD, async {
        loop {
            let (status, v) = s.api("PUT", "extra", Some(json!({}))).await;
            if status == 503 {
                return v;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a body past the budget was read");
    assert_eq!(refused["code"], "RATE_LIMITED", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("request body"),
        "{refused}"
    );
    // A declared body over the limit is 413 before anything is read.
    let (status, v) = s
        .api(
            "POST",
            "extra/emit",
            Some(json!({"channel": "c", "payload": "x".repeat(API_BODY_LIMIT)})),
        )
        .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (413, Some("FRAME_TOO_LARGE")),
        "{v}"
    );
    // Reads without a body (a long poll, a session read) are not charged.
    let (status, _) = s.api("GET", "extra", None).await;
    assert_ne!(status, 503);
    drop(held);
    tokio::time::timeout(GUARD, async {
        loop {
            let (status, _) = s.api("PUT", "extra", Some(json!({}))).await;
            if status == 200 || status == 201 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the budget came back");
}
