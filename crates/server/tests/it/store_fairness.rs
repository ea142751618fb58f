//! One protocol's write flood does not slow another's acknowledged writes:
//! 20 PlayerThree owners write `mandate`s at the largest message size as
//! fast as the server reads them, while the relay creates rooms (each
//! answered once its row is durable) on the same SQLite file. The rooms'
//! creation time under the flood is compared with the idle one measured
//! in the same run. The server reads each token's messages at its byte
//! rate (`INBOUND_BYTES_PER_SECOND_PER_TOKEN`): past it, the flood waits
//! in its own TCP window.

use crate::support::playerthree::*;
use hostwire_playerthree::protocol::MAX_MESSAGE_BYTES;
use serde_json::json;
use std::time::Instant;
use tokio::sync::watch;

/// Flooding owners, one match each (the issue's attack).
const FLOODERS: usize = 20;
/// Rooms created for each figure; the median is compared.
const ROOMS: usize = 12;
/// Mandates the flood has acknowledged before each room under it is
/// created: the rooms are spread over the flood, not taken in a lull.
const ACKS_PER_ROOM: u64 = 2;

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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A mandate of the largest size a message may have. Built by copying
/// one padding, so that the flooding clients (on the test's runtime) cost
/// little beside the server they flood.
fn big_mandate(seq: u64, pad: &str) -> String {
    format!(r#"{{"op":"mandate","seq":{seq},"role":"red-scout","mandate":{{"goal":"{pad}"}}}}"#)
}

fn padding() -> String {
    let head = big_mandate(u64::from(u32::MAX), "");
    "m".repeat(MAX_MESSAGE_BYTES - head.len() - 8)
}

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
    let mut idle = Vec::new();
    for _ in 0..ROOMS {
        idle.push(create_room_ms(&s.http).await);
    }
    let idle = median(idle);

    let pad: std::sync::Arc<str> = padding().into();
    assert!(big_mandate(1, &pad).len() <= MAX_MESSAGE_BYTES);
    let (acked_tx, mut acked) = watch::channel(0u64);
    let acked_tx = std::sync::Arc::new(acked_tx);
    let mut flood = Vec::new();
    for owner in owners {
        let (ws, pad, acked_tx) = (s.ws.clone(), pad.clone(), acked_tx.clone());
        flood.push(tokio::spawn(async move {
            loop {
                // A fresh connection each burst: each has its own message
                // rate, and none starts its token's byte rate afresh.
                let mut c = Client::connect(&ws, Some(ORIGIN)).await.unwrap();
                c.send(json!({"op": "join", "token": owner})).await;
                c.recv().await;
                let burst = hostwire_playerthree::host::MESSAGE_BURST as u64 - 1;
                for seq in 1..=burst {
                    c.send_text(&big_mandate(seq, &pad)).await;
                }
                for seq in 1..=burst {
                    let r = c.result(seq).await;
                    assert_eq!(r["ok"], true, "{r}");
                    acked_tx.send_modify(|n| *n += 1);
                }
            }
        }));
    }
    // The flood under way (past every token's burst) before the figure.
    tokio::time::timeout(GUARD * 3, acked.wait_for(|n| *n >= 5 * FLOODERS as u64))
        .await
        .expect("the flood was not acknowledged")
        .unwrap();
    let before = *acked.borrow();
    let mut flooded = Vec::new();
    for _ in 0..ROOMS {
        let last = *acked.borrow_and_update();
        tokio::time::timeout(GUARD, acked.wait_for(|n| *n >= last + ACKS_PER_ROOM))
            .await
            .expect("the flood stopped")
            .unwrap();
        flooded.push(create_room_ms(&s.http).await);
    }
    let during = *acked.borrow() - before;
    for f in &flood {
        // Stopped mid-send: the server sees its connections drop.
        f.abort();
    }
    let flooded = median(flooded);
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
    // Generous: the debug build on a shared machine; the flood unbounded
    // made it 100 to 600 times the idle figure.
    assert!(
        flooded <= (idle * 20.0).max(idle + 50.0),
        "idle {idle:.2} ms, flooded {flooded:.2} ms"
    );
}
