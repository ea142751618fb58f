//! One protocol's write flood does not slow another's acknowledged writes:
//! 20 PlayerThree owners write `mandate`s at the largest message size as
//! fast as the server answers them, while the relay creates rooms (each
//! answered once its row is durable) on the same SQLite file. The rooms'
//! creation time under the flood is compared with the idle one measured
//! in the same run.

mod playerthree_support;
use hostwire_playerthree::protocol::MAX_MESSAGE_BYTES;
use playerthree_support::*;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Flooding owners, one match each (the attack).
const FLOODERS: usize = 20;
/// Rooms created for each figure; the median is compared.
const ROOMS: usize = 12;

async fn create_room_ms(http: &str) -> f64 {
    let t = Instant::now();
    let r = reqwest::Client::new()
        .post(format!("{http}/api/rooms"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    t.elapsed().as_secs_f64() * 1000.0
}

async fn median_creation_ms(http: &str) -> f64 {
    let mut v = Vec::new();
    for _ in 0..ROOMS {
        v.push(create_room_ms(http).await);
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A mandate of the largest size a message may have.
fn big_mandate(seq: u64) -> String {
    let head = json!({"op": "mandate", "seq": seq, "role": "red-scout", "mandate": {"goal": ""}})
        .to_string();
    let pad = "m".repeat(MAX_MESSAGE_BYTES - head.len() - 8);
    json!({"op": "mandate", "seq": seq, "role": "red-scout", "mandate": {"goal": pad}}).to_string()
}

// Still far above the bound (see docs/BENCHMARKS.md): run by hand with
// `--ignored --nocapture` until the flood is bounded.
#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_playerthree_mandate_flood_does_not_slow_relay_room_creation() {
    let s = TestServer::start().await;
    let mut owners = Vec::new();
    for _ in 0..FLOODERS {
        let (id, op) = create_match(&s.http).await;
        owners.push(mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await);
    }
    // Warm up, then the idle figure.
    create_room_ms(&s.http).await;
    let idle = median_creation_ms(&s.http).await;

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for owner in owners {
        let (ws, stop, acked) = (s.ws.clone(), Arc::clone(&stop), Arc::clone(&acked));
        flood.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                // A fresh connection each burst: each has its own rate.
                let mut c = Client::connect(&ws).await;
                c.send(json!({"op": "join", "token": owner})).await;
                c.recv().await;
                let burst = hostwire_playerthree::host::MESSAGE_BURST as u64 - 1;
                for seq in 1..=burst {
                    c.send_text(&big_mandate(seq)).await;
                }
                for seq in 1..=burst {
                    if c.result(seq).await["ok"] == true {
                        acked.fetch_add(1, Relaxed);
                    }
                }
            }
        }));
    }
    // The flood under way before the figure is taken.
    while acked.load(Relaxed) < 200 {
        tokio::task::yield_now().await;
    }
    let before = acked.load(Relaxed);
    let flooded = median_creation_ms(&s.http).await;
    let during = acked.load(Relaxed) - before;
    stop.store(true, Relaxed);
    for f in flood {
        tokio::time::timeout(GUARD * 3, f).await.unwrap().unwrap();
    }
    eprintln!(
        "relay room creation: idle median {idle:.2} ms, during the flood {flooded:.2} ms \
         ({during} mandates of {MAX_MESSAGE_BYTES} bytes acknowledged meanwhile)"
    );
    let metrics = reqwest::get(format!("{}/metrics", s.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for l in metrics
        .lines()
        .filter(|l| l.starts_with("hostwire_store_write_seconds"))
    {
        eprintln!("{l}");
    }
    assert!(during >= 40, "no flood while measuring: {during} mandates");
    // Generous: the debug build on a shared machine; the issue saw 160×.
    assert!(
        flooded <= (idle * 20.0).max(idle + 50.0),
        "idle {idle:.2} ms, flooded {flooded:.2} ms"
    );
}
