//! What bundles cost in memory, counted by the global allocator
//! (SQLite's allocations included).
//!
//! - one upload of an 8 MiB body of hostile HTML and JSON peaks under 4×
//!   its body, from the request to the stored answer;
//! - a restart loads rooms without their bundle bytes;
//! - downloads of many rooms' bundles hold at most `bundle_cache_bytes`.

use crate::counting::{IN_USE, PEAK};
use crate::support::relay::*;
use hostwire::relay::RelayConfig;
use hostwire_core::ManualClock;
use hostwire_memizy::RELAY_LIMITS;
use serde_json::Value;
use std::sync::atomic::Ordering::SeqCst;

/// Peak heap over the baseline while `f` runs, in bytes.
async fn peak_of<T>(f: impl std::future::Future<Output = T>) -> (T, usize) {
    let base = IN_USE.load(SeqCst);
    PEAK.store(base, SeqCst);
    let out = f.await;
    (out, PEAK.load(SeqCst).saturating_sub(base))
}

/// An upload body of close to `bundle_bytes`: a plugin whose HTML nests
/// `<div>`s and `<b>`s deeply (quadratic for a tree builder) around its
/// manifest, and a set of many small JSON values.
fn hostile_body(limit: usize, app: &str) -> String {
    let html_part = limit / 2;
    let mut html = String::with_capacity(html_part + 256);
    html.push_str(&format!(
        r#"<script type="application/oqse-manifest+json">{{"appName":"{app}"}}</script>"#
    ));
    while html.len() + 8 < html_part / 2 {
        html.push_str("<div>");
    }
    while html.len() + 8 < html_part {
        html.push_str("<b>");
    }
    let head = serde_json::to_string(&html).unwrap();
    let mut body = String::with_capacity(limit);
    body.push_str(r#"{"pluginHtml":"#);
    body.push_str(&head);
    body.push_str(r#","set":{"items":["#);
    let item = r#"{"q":"\u00e9?","a":[1,2.5,true,null,{"k":"v"}]},"#;
    while body.len() + item.len() + 16 < limit {
        body.push_str(item);
    }
    body.push_str(r#"{}]}}"#);
    assert!(body.len() <= limit);
    body
}

async fn upload(http: &str, pin: &str, token: &str, body: String) -> Value {
    let r = reqwest::Client::new()
        .put(format!("{http}/api/rooms/{pin}/bundle"))
        .header("Authorization", format!("Bearer {token}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[test]
fn bundles_cost_a_bounded_multiple_of_their_size() {
    let _alone = crate::counting::alone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let limit = RELAY_LIMITS.bundle_bytes;
        // A memory test, not a timing one: the 5 s check bound of a
        // debug build on a loaded machine must not decide it.
        let mut t = TestRelay::start(RelayConfig {
            server_limits: hostwire::relay::ServerLimits {
                bundle_check_timeout_ms: 120_000,
                ..hostwire::relay::SERVER_LIMITS
            },
            ..config()
        })
        .await;
        let (pin, token) = t.create_room().await;
        // Warm up: the first request sets up pools and buffers that stay.
        upload(&t.http, &pin, &token, hostile_body(64 * 1024, "Warm")).await;

        let body = hostile_body(limit, "Big");
        let size = body.len();
        let (answer, peak) = peak_of(upload(&t.http, &pin, &token, body)).await;
        assert_eq!(answer["version"], 2);
        println!(
            "upload of {size} bytes: peak {peak} bytes over the baseline ({:.2}x)",
            peak as f64 / size as f64
        );
        assert!(
            peak < 4 * size,
            "one upload peaked at {peak} bytes, {:.2}x its {size}-byte body",
            peak as f64 / size as f64
        );

        // Eight rooms with a 4 MiB bundle each: 32 MiB on disk.
        let each = 4 * 1024 * 1024;
        let mut rooms = Vec::new();
        for i in 0..8 {
            let (pin, token) = t.create_room().await;
            upload(&t.http, &pin, &token, hostile_body(each, &format!("R{i}"))).await;
            rooms.push(pin);
        }
        t.stop().await;
        let (t2, peak) = peak_of(TestRelay::start_at(
            config(),
            t.db.clone(),
            ManualClock::new(T0),
        ))
        .await;
        println!("restart with 9 stored bundles (40 MiB): peak {peak} bytes");
        assert!(
            peak < each,
            "a restart loaded bundle bytes: peak {peak} bytes"
        );
        let mut t2 = t2;
        t2.stop().await;

        // Downloads of every room at once, with a 12 MiB budget: at most
        // the budget is held however many are asked for.
        let budget = 12 * 1024 * 1024;
        let small = TestRelay::start_at(
            RelayConfig {
                server_limits: hostwire::relay::ServerLimits {
                    bundle_cache_bytes: budget,
                    ..hostwire::relay::SERVER_LIMITS
                },
                ..config()
            },
            t.db.clone(),
            ManualClock::new(T0),
        )
        .await;
        let (_, peak) = peak_of(async {
            for pin in &rooms {
                let r = reqwest::get(format!("{}/api/rooms/{pin}/bundle", small.http))
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                let n = r.bytes().await.unwrap().len();
                assert!(n > each - 64, "{n}");
                assert!(small.relay().bundles.bytes_held() <= budget);
            }
        })
        .await;
        println!("8 downloads of 4 MiB with a 12 MiB budget: peak {peak} bytes");
        // The budget, plus one body the client holds while it checks it.
        assert!(
            peak < budget + 3 * each,
            "downloads held {peak} bytes over a {budget}-byte budget"
        );
    });
}
