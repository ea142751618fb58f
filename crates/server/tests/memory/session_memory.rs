//! What a hosted session's set costs the server, counted by the global
//! allocator.
//! A set is kept as the text it came in, not as a JSON tree: a tree of
//! small values costs tens of times its text. Creating sessions with sets
//! just under the body limit keeps a small multiple of their bytes, both
//! at the peak of a creation and held while the session lives.

use crate::counting::{IN_USE, PEAK};
use crate::support::session::{presenter_body, Api, TestHost};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::SeqCst;

/// A set whose text is about `bytes` long, made of what costs a JSON tree
/// the most per byte: short arrays of one-digit numbers and one-letter keys.
fn heavy_set(bytes: usize) -> Value {
    let item = |i: usize| {
        json!({"id": format!("q{i}"), "type": "true-false", "question": "?", "correctAnswer": true,
               "x": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],
               "y": {"a":0,"b":0,"c":0,"d":0,"e":0,"f":0,"g":0,"h":0}})
    };
    let one = item(0).to_string().len() + 1;
    let items: Vec<Value> = (0..bytes / one).map(item).collect();
    json!({"meta": {"id": "set-heavy", "title": "Heavy"}, "items": items})
}

/// The peak and the held growth of memory, per byte of request body, of
/// each session created with a set just under the body limit.
const PEAK_PER_BYTE: usize = 10;
const HELD_PER_BYTE: usize = 3;

// The lock is held for the whole test on purpose: it keeps the other
// memory tests of this binary out of the count.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_set_costs_a_small_multiple_of_its_text() {
    let _alone = crate::counting::alone();
    let h = TestHost::start().await;
    let api = Api::of(&h);
    // Warm the server's one-time allocations (pools, statements) first.
    api.create(&presenter_body(1)).await;

    let mut body = presenter_body(1);
    body["set"] = heavy_set(7 * 1024 * 1024);
    let text = body.to_string();
    let len = text.len();
    assert!(len > 7_000_000 && len < 8 * 1024 * 1024, "{len}");
    let client = reqwest::Client::new();
    for round in 0..3 {
        let base = IN_USE.load(SeqCst);
        PEAK.store(base, SeqCst);
        let r = client
            .post(format!("{}/memizy/sessions", h.http))
            .header(
                "authorization",
                format!("Bearer {}", crate::support::session::OPERATOR),
            )
            .header("content-type", "application/json")
            .body(text.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        drop(r);
        let peak = PEAK.load(SeqCst).saturating_sub(base);
        let held = IN_USE.load(SeqCst).saturating_sub(base);
        eprintln!(
            "round {round}: body {len} B, peak +{peak} B ({:.1}x), held +{held} B ({:.1}x)",
            peak as f64 / len as f64,
            held as f64 / len as f64
        );
        // The request's own text (the client's copy, the server's body)
        // counts in the peak too.
        assert!(
            peak < PEAK_PER_BYTE * len,
            "peak {peak} for a body of {len}"
        );
        assert!(
            held < HELD_PER_BYTE * len,
            "held {held} for a body of {len}"
        );
    }
}
