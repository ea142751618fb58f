//! The relay's HTTP API over real sockets: every endpoint and status, CORS,
//! Origin refusal, and 429 on room creation.

use crate::support::relay::*;
use reqwest::{Client as Http, StatusCode};
use serde_json::{json, Value};

fn bundle_body(app_name: &str) -> String {
    let html = format!(
        r#"<html><script type="application/oqse-manifest+json">{{"version":"1.0","id":"https://x.org/p","appName":"{app_name}"}}</script></html>"#
    );
    json!({"pluginHtml": html, "set": {"meta": {}, "items": []}}).to_string()
}

#[tokio::test]
async fn rooms_info_and_bundles() {
    let t = TestRelay::start(config()).await;
    let http = Http::new();
    let (pin, token) = t.create_room().await;
    assert_eq!(pin.len(), 6);
    assert!((100_000..=999_999).contains(&pin.parse::<u32>().unwrap()));
    assert_eq!(token.len(), 32);

    let info: Value = http
        .get(format!("{}/api/rooms/{pin}", t.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        info,
        json!({"pin": pin, "open": true, "appName": null, "players": 0})
    );
    for bad in ["999999", "12345", "abcdef"] {
        let r = http
            .get(format!("{}/api/rooms/{bad}", t.http))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{bad}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].is_string());
    }

    let bundle_url = format!("{}/api/rooms/{pin}/bundle", t.http);
    assert_eq!(
        http.get(&bundle_url).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    let put = |auth: Option<String>, body: String| {
        let mut r = http.put(&bundle_url).body(body);
        if let Some(a) = auth {
            r = r.header("Authorization", a);
        }
        r.send()
    };
    assert_eq!(
        put(None, bundle_body("Quiz")).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        put(Some("Bearer nope".into()), bundle_body("Quiz"))
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    let auth = Some(format!("Bearer {token}"));
    assert_eq!(
        put(auth.clone(), "{not json".into())
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        put(
            auth.clone(),
            json!({"pluginHtml": 1, "set": {}}).to_string()
        )
        .await
        .unwrap()
        .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        put(
            auth.clone(),
            json!({"pluginHtml": "x", "set": null}).to_string()
        )
        .await
        .unwrap()
        .status(),
        StatusCode::BAD_REQUEST
    );
    let huge = format!(
        "{{\"pluginHtml\":\"{}\",\"set\":{{}}}}",
        "x".repeat(8 * 1024 * 1024)
    );
    // Not the host: refused before the body is read, whatever its size.
    assert_eq!(
        put(Some("Bearer nope".into()), huge.clone())
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        put(auth.clone(), huge).await.unwrap().status(),
        StatusCode::PAYLOAD_TOO_LARGE
    );

    let body = bundle_body("Quiz Race");
    let r = put(auth.clone(), body.clone()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"version": 1}));
    let r = http.get(&bundle_url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["x-bundle-version"], "1");
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    assert_eq!(r.text().await.unwrap(), body, "served as uploaded");
    let info: Value = http
        .get(format!("{}/api/rooms/{pin}", t.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["appName"], "Quiz Race");

    let r = put(auth.clone(), bundle_body("Second")).await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"version": 2}));
    let r = http.get(&bundle_url).send().await.unwrap();
    assert_eq!(r.headers()["x-bundle-version"], "2");

    // A plugin without a data island uploads fine; appName becomes null.
    put(
        auth,
        json!({"pluginHtml": "<p>no manifest</p>", "set": {}}).to_string(),
    )
    .await
    .unwrap();
    let info: Value = http
        .get(format!("{}/api/rooms/{pin}", t.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["appName"], Value::Null);
}

#[tokio::test]
async fn health_not_found_and_wrong_methods() {
    let t = TestRelay::start(config()).await;
    let http = Http::new();
    let (pin, _) = t.create_room().await;
    let h: Value = http
        .get(format!("{}/api/health", t.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        h,
        json!({"ok": true, "rooms": 1, "connections": 0, "players": 0})
    );
    for path in ["/api/nope", "/api/rooms/123456/other", "/api/rooms/"] {
        assert_eq!(
            http.get(format!("{}{path}", t.http))
                .send()
                .await
                .unwrap()
                .status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    let r = http
        .delete(format!("{}/api/rooms/{pin}", t.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let r = http
        .post(format!("{}/api/rooms/{pin}/bundle", t.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let r = http
        .get(format!("{}/api/rooms", t.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    let r = http
        .post(format!("{}/api/health", t.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let r = http.put(format!("{}/ws", t.http)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let m = http
        .get(format!("{}/metrics", t.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("hostwire_relay_rooms 1"), "{m}");
    assert!(m.contains("hostwire_relay_rooms_created_total 1"));
}

/// A comma-separated header list, compared as browsers do: case and
/// spaces do not matter.
fn list(h: &reqwest::header::HeaderMap, name: &str) -> String {
    h.get_all(name)
        .iter()
        .flat_map(|v| v.to_str().unwrap().split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test]
async fn cors_and_origin_rules() {
    let t = TestRelay::start(config()).await;
    let http = Http::new();
    let r = http
        .request(reqwest::Method::OPTIONS, format!("{}/api/rooms", t.http))
        .header("Origin", ORIGIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], ORIGIN);
    assert_eq!(
        list(h, "access-control-allow-methods"),
        "get,post,put,options"
    );
    assert_eq!(
        list(h, "access-control-allow-headers"),
        "authorization,content-type"
    );
    assert_eq!(h["access-control-max-age"], "600");
    assert_eq!(list(h, "vary"), "origin");

    let r = http
        .post(format!("{}/api/rooms", t.http))
        .header("Origin", ORIGIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["access-control-allow-origin"], ORIGIN);
    assert_eq!(
        list(r.headers(), "access-control-expose-headers"),
        "x-bundle-version"
    );
    assert_eq!(list(r.headers(), "vary"), "origin");

    let evil = "https://evil.example";
    let r = http
        .post(format!("{}/api/rooms", t.http))
        .header("Origin", evil)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = http
        .request(reqwest::Method::OPTIONS, format!("{}/api/rooms", t.http))
        .header("Origin", evil)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    // Health answers any origin.
    let r = http
        .get(format!("{}/api/health", t.http))
        .header("Origin", evil)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // The WebSocket upgrade checks the Origin too (a missing one is refused).
    assert!(Client::connect(&t.ws, Some(evil)).await.is_err());
    assert!(Client::connect(&t.ws, None).await.is_err());
    assert!(Client::connect(&t.ws, Some(ORIGIN)).await.is_ok());
}

#[tokio::test]
async fn any_origin_in_development() {
    let t = TestRelay::start(hostwire::relay::RelayConfig {
        allowed_origins: hostwire::http::AllowedOrigins::parse("*"),
        ..config()
    })
    .await;
    assert!(Client::connect(&t.ws, None).await.is_ok());
    assert!(Client::connect(&t.ws, Some("https://anything.example"))
        .await
        .is_ok());
}

#[tokio::test]
async fn room_creation_is_limited_per_ip_per_hour() {
    let t = TestRelay::start(hostwire::relay::RelayConfig {
        rooms_per_ip_per_hour: 3,
        ..config()
    })
    .await;
    let http = Http::new();
    for _ in 0..3 {
        t.create_room().await;
    }
    let r = http
        .post(format!("{}/api/rooms", t.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // The clock has not moved: the oldest creation leaves the hour's
    // window in a whole hour.
    assert_eq!(r.headers()["retry-after"], "3600");
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    t.clock.advance_ms(3_599_000);
    let r = http
        .post(format!("{}/api/rooms", t.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    t.clock.advance_ms(1_000);
    assert_eq!(
        http.post(format!("{}/api/rooms", t.http))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn forwarded_for_counts_only_behind_a_trusted_proxy() {
    let t = TestRelay::start(hostwire::relay::RelayConfig {
        rooms_per_ip_per_hour: 1,
        trust_proxy: true,
        ..config()
    })
    .await;
    let http = Http::new();
    let post = |ip: &'static str| {
        http.post(format!("{}/api/rooms", t.http))
            .header("X-Forwarded-For", ip)
            .send()
    };
    assert_eq!(
        post("10.0.0.1, 10.9.9.9").await.unwrap().status(),
        StatusCode::CREATED
    );
    // The entry the proxy appended counts, not the ones the client wrote.
    assert_eq!(
        post("10.0.0.5, 10.9.9.9").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        post("10.0.0.2").await.unwrap().status(),
        StatusCode::CREATED
    );

    let untrusted = TestRelay::start(hostwire::relay::RelayConfig {
        rooms_per_ip_per_hour: 1,
        ..config()
    })
    .await;
    let post = |ip: &'static str| {
        http.post(format!("{}/api/rooms", untrusted.http))
            .header("X-Forwarded-For", ip)
            .send()
    };
    assert_eq!(
        post("10.0.0.1").await.unwrap().status(),
        StatusCode::CREATED
    );
    assert_eq!(
        post("10.0.0.2").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}
