//! ggui live channel benchmark over real sockets on 127.0.0.1:
//!
//! 1. actions validated (against a JSON Schema) and acked per second: one
//!    client pipelines `action` frames in batches of 500 and reads the 500
//!    acks; the agent drains between batches (not timed).
//! 2. stream envelopes fanned out per second to 100 subscribers: the agent
//!    emits envelopes through the HTTP API (4 in flight), and the time runs
//!    until every subscriber has read every envelope.
//!
//! The server runs in this process (real SQLite store in a temp dir, the
//! persistence behind it as in production), with the per-connection rate
//! limit raised so that the channel, not the limiter, is measured.
//!
//! `cargo bench -p hostwire-bench --bench ggui_live [-- ACTIONS ENVELOPES]`

use futures_util::{SinkExt, StreamExt};
use hostwire::app::App;
use hostwire::ggui::GguiConfig;
use hostwire::http::AllowedOrigins;
use hostwire::memizy::{RelayConfig, OUTBOUND_QUEUE};
use hostwire_core::SystemClock;
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::SqliteStore;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;

const SUBSCRIBERS: usize = 100;
const BATCH: usize = 500;
const IN_FLIGHT: usize = 4;
const GUARD: Duration = Duration::from_secs(120);

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn subscribe(url: &str, session: &str) -> Ws {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    ws.send(Message::Text(
        json!({"type": "subscribe", "payload": {"sessionId": session}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let ack = next_json(&mut ws).await;
    assert_eq!(ack["type"], "ack", "{ack}");
    ws
}

async fn next_json(ws: &mut Ws) -> Value {
    loop {
        match tokio::time::timeout(GUARD, ws.next())
            .await
            .expect("hung")
            .unwrap()
            .unwrap()
        {
            Message::Text(t) => return serde_json::from_str(&t).unwrap(),
            Message::Close(c) => panic!("closed: {c:?}"),
            _ => {}
        }
    }
}

async fn actions(http: &str, ws_url: &str, total: usize) -> f64 {
    let client = reqwest::Client::new();
    let spec = json!({"actionSpec": {"toggleTask": {"schema": {"type": "object",
        "properties": {"id": {"type": "string", "minLength": 1}, "done": {"type": "boolean"},
                       "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
        "required": ["id", "done"]}}}});
    client
        .put(format!("{http}/ggui/sessions/bench-actions"))
        .body(spec.to_string())
        .send()
        .await
        .unwrap();
    let ws = subscribe(ws_url, "bench-actions").await;
    let (mut tx, mut rx) = ws.split();
    let mut timed = Duration::ZERO;
    let mut done = 0;
    while done < total {
        let n = BATCH.min(total - done);
        let frames: Vec<String> = (0..n)
            .map(|i| {
                json!({"type": "action", "requestId": format!("r{}", done + i), "payload": {
                    "sessionId": "bench-actions", "type": "data:submit",
                    "payload": {"action": "toggleTask", "data": {"id": format!("task-{i}"), "done": i % 2 == 0, "tags": ["a", "b"]}}}})
                .to_string()
            })
            .collect();
        let t = Instant::now();
        let sender = async {
            for f in frames {
                tx.feed(Message::Text(f.into())).await.unwrap();
            }
            tx.flush().await.unwrap();
        };
        let receiver = async {
            let mut last = 0;
            for _ in 0..n {
                let v = loop {
                    match tokio::time::timeout(GUARD, rx.next())
                        .await
                        .expect("hung")
                        .unwrap()
                        .unwrap()
                    {
                        // A drain is acknowledged per drained event: the
                        // earlier batch's may still be arriving.
                        Message::Text(t) if t.contains("\"drain_ack\"") => continue,
                        Message::Text(t) => break serde_json::from_str::<Value>(&t).unwrap(),
                        _ => continue,
                    }
                };
                assert_eq!(v["type"], "ack", "{v}");
                last = v["payload"]["sequence"].as_u64().unwrap();
            }
            last
        };
        let ((), last) = tokio::join!(sender, receiver);
        timed += t.elapsed();
        done += n;
        // The agent drains what it handled (not timed).
        let r = client
            .post(format!("{http}/ggui/sessions/bench-actions/actions/drain"))
            .body(json!({"upTo": last}).to_string())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        // The drain_ack frame goes to this subscriber too: read it.
        loop {
            match rx.next().await.unwrap().unwrap() {
                Message::Text(t) if t.contains("drain_ack") => break,
                _ => {}
            }
        }
        let _ = &mut rx;
    }
    total as f64 / timed.as_secs_f64()
}

async fn fan_out(http: &str, ws_url: &str, envelopes: usize) -> (f64, f64) {
    let client = reqwest::Client::new();
    client
        .put(format!("{http}/ggui/sessions/bench-fan"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let all_in = Arc::new(Notify::new());
    let target = (envelopes * SUBSCRIBERS) as u64;
    let mut readers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut ws = subscribe(ws_url, "bench-fan").await;
        let (received, all_in) = (Arc::clone(&received), Arc::clone(&all_in));
        readers.push(tokio::spawn(async move {
            for _ in 0..envelopes {
                let v = next_json(&mut ws).await;
                debug_assert_eq!(v["type"], "data");
                if received.fetch_add(1, Relaxed) + 1 == target {
                    all_in.notify_one();
                }
            }
        }));
    }
    let payload =
        json!({"kind": "progress", "step": 3, "of": 10, "label": "Fetching the weather for Lyon"});
    let body = json!({"channel": "status", "payload": payload}).to_string();
    let url = format!("{http}/ggui/sessions/bench-fan/emit");
    let t = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut emitters = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (client, url, body, next) =
            (client.clone(), url.clone(), body.clone(), Arc::clone(&next));
        emitters.push(tokio::spawn(async move {
            while next.fetch_add(1, Relaxed) < envelopes as u64 {
                let r = client.post(&url).body(body.clone()).send().await.unwrap();
                assert!(r.status().is_success());
            }
        }));
    }
    for e in emitters {
        e.await.unwrap();
    }
    let emitted = t.elapsed();
    tokio::time::timeout(GUARD, async {
        while received.load(Relaxed) < target {
            all_in.notified().await;
        }
    })
    .await
    .expect("not every subscriber got every envelope");
    let elapsed = t.elapsed();
    for r in readers {
        r.await.unwrap();
    }
    (
        target as f64 / elapsed.as_secs_f64(),
        envelopes as f64 / emitted.as_secs_f64(),
    )
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let total_actions = args.first().copied().unwrap_or(20_000);
    let envelopes = args.get(1).copied().unwrap_or(2_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(&dir.path().join("hostwire.db")).unwrap());
        let mut config = GguiConfig::default();
        config.channel.rate_per_second = 1e9;
        config.channel.rate_burst = u32::MAX;
        config.channel.max_subscribers_per_session = SUBSCRIBERS;
        let relay = RelayConfig {
            allowed_origins: AllowedOrigins::Any,
            trust_proxy: false,
            rooms_per_ip_per_hour: RELAY_LIMITS.rooms_per_ip_per_hour,
            limits: RELAY_LIMITS,
            outbound_queue: OUTBOUND_QUEUE,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let app = App::start_with_ggui(
            listener,
            relay,
            Arc::new(SystemClock),
            Arc::clone(&store) as _,
            config,
            Some(store as _),
        )
        .unwrap();
        let http = format!("http://{}", app.addr);
        let ws = format!("ws://{}/ggui/ws", app.addr);
        let rate = actions(&http, &ws, total_actions).await;
        println!("ggui actions validated and acked: {total_actions} in batches of {BATCH}: {rate:.0}/s");
        let (delivered, emitted) = fan_out(&http, &ws, envelopes).await;
        println!(
            "ggui stream envelopes fanned out to {SUBSCRIBERS} subscribers: {envelopes} envelopes, {delivered:.0} deliveries/s ({emitted:.0} emits/s through the HTTP API, {IN_FLIGHT} in flight)"
        );
        app.shutdown().await;
    });
}
