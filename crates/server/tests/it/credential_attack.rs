//! The credential layer tried from outside, over real sockets: nothing is
//! created without a credential, wrong credentials are throttled per IP,
//! creations are limited per IP.

use crate::support::playerthree::*;
use reqwest::StatusCode;
use serde_json::json;

async fn post(url: &str, bearer: Option<&str>, body: &str) -> (StatusCode, Option<String>) {
    let mut r = reqwest::Client::new().post(url).body(body.to_owned());
    if let Some(b) = bearer {
        r = r.header("Authorization", format!("Bearer {b}"));
    }
    let r = r.send().await.unwrap();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (r.status(), retry)
}

#[tokio::test]
async fn an_anonymous_playerthree_match_is_refused() {
    let t = TestServer::start().await;
    let url = format!("{}/playerthree/matches", t.http);
    for _ in 0..3 {
        assert_eq!(post(&url, None, "").await.0, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        post(&url, Some("not-the-operator-credential"), "").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(t.p3().match_count(), 0, "nothing was created");
    // The scheme is case-insensitive.
    assert_eq!(post(&url, Some(OPERATOR), "").await.0, StatusCode::CREATED);
    let r = reqwest::Client::new()
        .post(&url)
        .header("Authorization", format!("bEaReR {OPERATOR}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn an_anonymous_hosted_session_is_refused() {
    let t = TestServer::start().await;
    let url = format!("{}/memizy/sessions", t.http);
    let body = json!({"pluginHtml": "", "set": {"meta": {}, "items": []}, "mode": "solo"});
    let (status, _) = post(&url, None, &body.to_string()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = post(&url, Some("a-wrong-operator-credential"), &body.to_string()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // With the credential the body is read (and this one is refused for
    // what it holds, not for who sent it).
    let (status, _) = post(&url, Some(OPERATOR), &body.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn wrong_credentials_are_throttled_per_ip() {
    let t = TestServer::start().await;
    let (id, operator) = create_match(&t.http).await;
    let mint = format!("{}/playerthree/matches/{id}/tokens", t.http);
    let burst = hostwire::http::credentials::WRONG_CREDENTIAL_BURST_PER_IP;
    let principal = json!({"kind": "team", "team": "red"}).to_string();
    for i in 0..burst {
        let guess = format!("guess-{i:027}");
        assert_eq!(
            post(&mint, Some(&guess), &principal).await.0,
            StatusCode::UNAUTHORIZED,
            "guess {i}"
        );
    }
    // Past the burst every credential waits, even the right one: a guess
    // that happens to be right is not told apart.
    let (status, retry) = post(&mint, Some("one-more-guess"), &principal).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry.as_deref(), Some("1"));
    let (status, _) = post(&mint, Some(&operator), &principal).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Every endpoint counts against the same IP.
    let create = format!("{}/playerthree/matches", t.http);
    assert_eq!(
        post(&create, Some(OPERATOR), "").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Once its bucket refills, the IP is heard again.
    t.clock.advance_ms(1_000);
    assert_eq!(
        post(&mint, Some(&operator), &principal).await.0,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn playerthree_matches_are_limited_per_ip() {
    let t = TestServer::start().await;
    let url = format!("{}/playerthree/matches", t.http);
    let per_hour = hostwire::http::credentials::MATCHES_PER_IP_PER_HOUR;
    for _ in 0..per_hour {
        assert_eq!(post(&url, Some(OPERATOR), "").await.0, StatusCode::CREATED);
    }
    let (status, retry) = post(&url, Some(OPERATOR), "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(retry.unwrap().parse::<u64>().unwrap() > 3_000);
    assert_eq!(t.p3().match_count(), per_hour as usize);
}
