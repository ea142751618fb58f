//! The one HTTP helper: a request with an optional bearer credential and
//! JSON body, answered with its status and JSON (the text itself when it
//! is not JSON, null when empty).

use super::server::GUARD;
use serde_json::Value;

pub async fn call(
    method: &str,
    url: &str,
    bearer: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let c = reqwest::Client::new();
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut r = c.request(method, url);
    if let Some(t) = bearer {
        r = r.header("Authorization", format!("Bearer {t}"));
    }
    if let Some(b) = body {
        r = r
            .header("Content-Type", "application/json")
            .body(b.to_string());
    }
    let r = tokio::time::timeout(3 * GUARD, r.send())
        .await
        .expect("HTTP call hung")
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, v)
}

/// The value of the counter or gauge `name` on `/metrics`.
pub async fn metric(http: &str, name: &str) -> u64 {
    let text = reqwest::get(format!("{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no metric {name}"))
        .trim()
        .parse()
        .unwrap()
}
