//! The agent API reads a bounded number of body bytes at once: requests
//! whose bodies would pass the budget are answered 503 `RATE_LIMITED` at
//! once, before their bodies are read, and the budget comes back when
//! they end.

use crate::support::ggui::*;
use hostwire::ggui::api::{API_BODY_BUDGET_BYTES, API_BODY_LIMIT};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A connection that has sent `request_line`, the app's credential,
/// `content_length` and `body_start` (the rest of the body never comes).
async fn sent_head(
    http: &str,
    request_line: &str,
    content_length: usize,
    body_start: &str,
) -> TcpStream {
    let addr = http.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{request_line}\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n{body_start}",
        app_credential("conformance")
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

/// A request that declares a body of `API_BODY_LIMIT` bytes and sends
/// only its first bytes: held open, as a slow or hostile agent does.
async fn held_request(http: &str, i: usize) -> TcpStream {
    let line = format!("PUT /ggui/sessions/held{i} HTTP/1.1");
    sent_head(http, &line, API_BODY_LIMIT, "{\"appId\": \"").await
}

/// What the server answers to a request head whose body is never sent.
async fn answer_to_head(http: &str, request_line: &str, content_length: usize) -> String {
    let mut s = sent_head(http, request_line, content_length, "").await;
    let mut answer = Vec::new();
    // Read to the end of the answer's body (the server then waits a
    // moment for the request's body before it closes); the guard bounds a
    // server that would wait for the body before answering.
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = tokio::io::AsyncReadExt::read(&mut s, &mut chunk).await?;
            answer.extend_from_slice(&chunk[..n]);
            if n == 0 || answer_is_whole(&answer) {
                return Ok::<_, std::io::Error>(());
            }
        }
    };
    let _ = tokio::time::timeout(GUARD, read).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether `answer` holds a whole HTTP answer: its head and as many body
/// bytes as its `content-length` says.
fn answer_is_whole(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    body.len() >= length
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
    // (The probe waits for all of them: a probe in flight while a held
    // request arrives would take the share that one needs, and that one
    // would be refused instead.)
    tokio::time::timeout(GUARD, async {
        while s.metric("hostwire_ggui_api_body_bytes").await < API_BODY_BUDGET_BYTES as u64 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the held bodies took the whole budget");
    let (status, refused) = s.api("PUT", "extra", Some(json!({}))).await;
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["code"], "RATE_LIMITED", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("request body"),
        "{refused}"
    );
    // A declared body over the limit is 413 before anything is read: the
    // head alone gets the answer. (A client that writes the whole body may
    // find the connection closed under it: the server does not read it.)
    let answer = answer_to_head(
        &s.http,
        "POST /ggui/sessions/extra/emit HTTP/1.1",
        API_BODY_LIMIT + 1,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("FRAME_TOO_LARGE"), "{answer}");
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
    tokio::time::timeout(GUARD, async {
        while s.metric("hostwire_ggui_api_body_bytes").await > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the gauge came back to 0");
}
