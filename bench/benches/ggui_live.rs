//! ggui live channel benchmark over real sockets on 127.0.0.1:
//!
//! 1. actions validated (against a JSON Schema) and acked per second: one
//!    client pipelines `action` frames in batches of 500 and reads the 500
//!    acks; the agent drains between batches (not timed).
//! 2. stream envelopes fanned out per second to 100 subscribers: the agent
//!    emits envelopes through the HTTP API (4 in flight), and the time runs
//!    until every subscriber has read every envelope.
//!
//! 3. server CPU per action when actions come one at a time (one every
//!    11 ms, each ack awaited) against the same actions in one burst: the
//!    server runs on its own runtime (threads named `hw-server`, blocking
//!    threads kept alive), and its CPU is the sum of those threads' run
//!    time from `/proc/self/task/*/schedstat` (nanoseconds), so the
//!    client's work is not counted.
//!
//! Each is measured against a baseline on the same stack in the same run:
//! a bare WebSocket server (axum, tokio, one writer task per connection)
//! that answers every frame with a fixed ack of the same size, and forwards
//! every emitted body to its subscribers, with no parsing, validation,
//! ledger, buffer or store. The two take turns `--repeat` times; the
//! ratios of paired runs are what the report shows.
//!
//! The server runs in this process (real SQLite store in a temp dir, the
//! persistence behind it as in production), with the per-connection rate
//! limit raised so that the channel, not the limiter, is measured.
//!
//! `cargo bench -p hostwire-bench --bench ggui_live -- [ACTIONS ENVELOPES] [--repeat N] [--json PATH] [--spaced-only]`

use axum::extract::ws::{Message as AxMessage, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use hostwire::app::{App, AppConfig, Stores};
use hostwire::ggui::GguiConfig;
use hostwire::http::AllowedOrigins;
use hostwire::relay::{RelayConfig, OUTBOUND_QUEUE, SERVER_LIMITS};
use hostwire_core::SystemClock;
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::SqliteStore;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::Message;

const SUBSCRIBERS: usize = 100;
const BATCH: usize = 500;
const IN_FLIGHT: usize = 4;
const GUARD: Duration = Duration::from_secs(120);
/// The bare baseline's actions run is this many times longer.
const BARE_FACTOR: usize = 5;
/// The name of the server runtime's threads (a thread name is at most 15
/// bytes on Linux).
const SERVER_THREADS: &str = "hw-server";
/// Actions in the spaced run (and in the burst it is compared with).
const SPACED_ACTIONS: usize = 600;
/// The gap between spaced actions: more than the 10 ms of one 100 Hz rate
/// limit slot, as a person's clicks are.
const SPACED_GAP: Duration = Duration::from_millis(11);

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Where one run points: the ggui server, or the bare baseline.
struct Target {
    http: String,
    ws: String,
    /// The ggui server needs sessions created and actions drained.
    ggui: bool,
}

/// The agent credential of the app the bench drives.
const APP_CREDENTIAL: &str = "bench-agent-credential-0123456789";

async fn subscribe(url: &str, session: &str) -> Ws {
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true)
        .await
        .unwrap();
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

/// The live channel's URL for `session`: with a UI token minted by the
/// agent for the ggui server (every upgrade needs one), as is for the bare
/// server. The session must exist.
async fn ws_url(t: &Target, session: &str) -> String {
    if !t.ggui {
        return t.ws.clone();
    }
    let r = reqwest::Client::new()
        .post(format!("{}/ggui/sessions/{session}/ui-tokens", t.http))
        .bearer_auth(APP_CREDENTIAL)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let v: Value = r.json().await.unwrap();
    format!("{}?token={}", t.ws, v["token"].as_str().unwrap())
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

fn action_frame(session: &str, n: usize, i: usize) -> String {
    json!({"type": "action", "requestId": format!("r{n}"), "payload": {
        "sessionId": session, "type": "data:submit",
        "payload": {"action": "toggleTask", "data": {"id": format!("task-{i}"), "done": i.is_multiple_of(2), "tags": ["a", "b"]}}}})
    .to_string()
}

async fn actions(t: &Target, session: &str, total: usize) -> f64 {
    let client = reqwest::Client::new();
    register_contract(t, &client, session).await;
    let ws = subscribe(&ws_url(t, session).await, session).await;
    let (mut tx, mut rx) = ws.split();
    let mut timed = Duration::ZERO;
    let mut done = 0;
    while done < total {
        let n = BATCH.min(total - done);
        let frames: Vec<String> = (0..n).map(|i| action_frame(session, done + i, i)).collect();
        let start = Instant::now();
        let sender = async {
            for f in frames {
                tx.feed(Message::Text(f.into())).await.unwrap();
            }
            tx.flush().await.unwrap();
        };
        let receiver = async {
            let mut last = 0;
            for _ in 0..n {
                last = ack_sequence(&mut rx).await;
            }
            last
        };
        let ((), last) = tokio::join!(sender, receiver);
        timed += start.elapsed();
        done += n;
        // The agent drains what it handled (not timed).
        drain(t, &client, session, last).await;
    }
    total as f64 / timed.as_secs_f64()
}

async fn fan_out(t: &Target, session: &str, envelopes: usize) -> (f64, f64) {
    let client = reqwest::Client::new();
    if t.ggui {
        let r = client
            .put(format!("{}/ggui/sessions/{session}", t.http))
            .bearer_auth(APP_CREDENTIAL)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let received = Arc::new(AtomicU64::new(0));
    let all_in = Arc::new(Notify::new());
    let target = (envelopes * SUBSCRIBERS) as u64;
    let mut readers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut ws = subscribe(&ws_url(t, session).await, session).await;
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
    let url = if t.ggui {
        format!("{}/ggui/sessions/{session}/emit", t.http)
    } else {
        format!("{}/bare/emit", t.http)
    };
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut emitters = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (client, url, body, next) =
            (client.clone(), url.clone(), body.clone(), Arc::clone(&next));
        emitters.push(tokio::spawn(async move {
            while next.fetch_add(1, Relaxed) < envelopes as u64 {
                // The bare server ignores the agent's credential.
                let r = client
                    .post(&url)
                    .bearer_auth(APP_CREDENTIAL)
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "{}", r.status());
            }
        }));
    }
    for e in emitters {
        e.await.unwrap();
    }
    let emitted = start.elapsed();
    tokio::time::timeout(GUARD, async {
        while received.load(Relaxed) < target {
            all_in.notified().await;
        }
    })
    .await
    .expect("not every subscriber got every envelope");
    let elapsed = start.elapsed();
    for r in readers {
        r.await.unwrap();
    }
    (
        target as f64 / elapsed.as_secs_f64(),
        envelopes as f64 / emitted.as_secs_f64(),
    )
}

/// The sum over this process's threads whose name starts with `prefix` of
/// what `read` finds in the thread's `/proc/self/task/<id>` directory.
/// Threads that ended are not counted: the server runtime keeps its
/// blocking threads alive for the whole run.
fn sum_over_threads(prefix: &str, read: impl Fn(&std::path::Path) -> Option<u64>) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let dir = task.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.starts_with(prefix) {
            total += read(&dir).unwrap_or(0);
        }
    }
    total
}

/// Nanoseconds of CPU run so far by the threads named `prefix…` (the
/// first field of `schedstat` is the time on a CPU).
fn threads_cpu_ns(prefix: &str) -> u64 {
    sum_over_threads(prefix, |dir| {
        std::fs::read_to_string(dir.join("schedstat"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// Voluntary context switches so far of the threads named `prefix…`
/// (`status`): each is a thread going to sleep for want of work, so per
/// spaced action it counts the thread wakes the action cost.
fn threads_sleeps(prefix: &str) -> u64 {
    sum_over_threads(prefix, |dir| {
        std::fs::read_to_string(dir.join("status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
            .trim()
            .parse()
            .ok()
    })
}

/// The agent's contract for the actions the bench sends (the ggui server
/// only).
async fn register_contract(t: &Target, client: &reqwest::Client, session: &str) {
    if !t.ggui {
        return;
    }
    let spec = json!({"actionSpec": {"toggleTask": {"schema": {"type": "object",
        "properties": {"id": {"type": "string", "minLength": 1}, "done": {"type": "boolean"},
                       "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
        "required": ["id", "done"]}}}});
    let r = client
        .put(format!("{}/ggui/sessions/{session}", t.http))
        .bearer_auth(APP_CREDENTIAL)
        .body(spec.to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

/// The agent drains the actions up to `last` (the ggui server only), so
/// that the pending queue's bound is never what is measured.
async fn drain(t: &Target, client: &reqwest::Client, session: &str, last: u64) {
    if !t.ggui {
        return;
    }
    let r = client
        .post(format!("{}/ggui/sessions/{session}/actions/drain", t.http))
        .bearer_auth(APP_CREDENTIAL)
        .body(json!({"upTo": last}).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

/// The sequence of the next ack. A drain is acknowledged per drained
/// event: an earlier batch's may still be arriving, and is skipped.
async fn ack_sequence<S>(ws: &mut S) -> u64
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        match tokio::time::timeout(GUARD, ws.next())
            .await
            .expect("hung")
            .unwrap()
            .unwrap()
        {
            Message::Text(t) if t.contains("\"drain_ack\"") => continue,
            Message::Text(t) => {
                let v = serde_json::from_str::<Value>(&t).unwrap();
                assert_eq!(v["type"], "ack", "{v}");
                return v["payload"]["sequence"]
                    .as_u64()
                    .expect("an ack has a sequence");
            }
            _ => continue,
        }
    }
}

/// What one action cost the server, spaced and in a burst.
struct PerAction {
    /// Server CPU per action (µs), one at a time `gap` apart.
    spaced: f64,
    /// The same in one burst.
    burst: f64,
    /// Server threads' sleeps (voluntary context switches) per spaced
    /// action: the thread wakes it cost.
    spaced_sleeps: f64,
    /// The same in one burst.
    burst_sleeps: f64,
}

/// The server's CPU per action: `n` actions sent one at a time `gap`
/// apart (each ack awaited before the next), then `n` in one burst on the
/// same socket.
async fn spaced_and_burst(t: &Target, session: &str, n: usize, gap: Duration) -> PerAction {
    let client = reqwest::Client::new();
    register_contract(t, &client, session).await;
    let mut ws = subscribe(&ws_url(t, session).await, session).await;
    // Spaced: the server sleeps between actions, as with an agent UI
    // clicked by a person.
    let mut tick = tokio::time::interval(gap);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (before, slept) = (
        threads_cpu_ns(SERVER_THREADS),
        threads_sleeps(SERVER_THREADS),
    );
    let mut last = 0;
    for i in 0..n {
        tick.tick().await;
        ws.send(Message::Text(action_frame(session, i, i).into()))
            .await
            .unwrap();
        last = ack_sequence(&mut ws).await;
    }
    let spaced = threads_cpu_ns(SERVER_THREADS) - before;
    let spaced_sleeps = threads_sleeps(SERVER_THREADS) - slept;
    drain(t, &client, session, last).await;
    // The same count in one burst, pipelined.
    let (before, slept) = (
        threads_cpu_ns(SERVER_THREADS),
        threads_sleeps(SERVER_THREADS),
    );
    for i in 0..n {
        ws.feed(Message::Text(action_frame(session, n + i, i).into()))
            .await
            .unwrap();
    }
    ws.flush().await.unwrap();
    for _ in 0..n {
        last = ack_sequence(&mut ws).await;
    }
    let burst = threads_cpu_ns(SERVER_THREADS) - before;
    let burst_sleeps = threads_sleeps(SERVER_THREADS) - slept;
    drain(t, &client, session, last).await;
    let per = |ns: u64| ns as f64 / n as f64 / 1000.0;
    PerAction {
        spaced: per(spaced),
        burst: per(burst),
        spaced_sleeps: spaced_sleeps as f64 / n as f64,
        burst_sleeps: burst_sleeps as f64 / n as f64,
    }
}

// ----- the baseline: the same stack with no protocol work ---------------

/// The bare server's subscribers: a sender per connection. Unbounded on
/// purpose: it is the baseline (no limits, no checks), and what it holds is
/// bounded by the bench itself, which emits a fixed number of envelopes
/// with at most 4 in flight and reads every subscriber until the end.
#[derive(Default)]
struct Bare {
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Utf8Bytes>>>,
}

/// What the bare server answers every frame with: an ack the size of the
/// channel's (`{"type":"ack","requestId":"r12345","payload":{"sequence":…}}`).
const BARE_ACK: &str =
    r#"{"type":"ack","requestId":"r00000","payload":{"sequence":12345,"timestamp":1800000000000}}"#;

fn bare_router() -> Router {
    Router::new()
        .route("/bare/ws", get(bare_upgrade))
        .route("/bare/emit", post(bare_emit))
        .with_state(Arc::new(Bare::default()))
}

async fn bare_upgrade(
    State(bare): State<Arc<Bare>>,
    ws: WebSocketUpgrade,
) -> axum::response::Response {
    // The live channel's buffer sizes.
    ws.read_buffer_size(4 * 1024)
        .write_buffer_size(16 * 1024)
        .on_upgrade(move |s| bare_conn(bare, s))
}

async fn bare_conn(bare: Arc<Bare>, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    // Bounded by the bench's own traffic (see `Bare`).
    let (tx, mut rx) = mpsc::unbounded_channel::<Utf8Bytes>();
    bare.subscribers.lock().unwrap().push(tx.clone());
    // One writer task that writes what is queued, then flushes once.
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if sink.feed(AxMessage::Text(m)).await.is_err() {
                return;
            }
            while let Ok(m) = rx.try_recv() {
                if sink.feed(AxMessage::Text(m)).await.is_err() {
                    return;
                }
            }
            if sink.flush().await.is_err() {
                return;
            }
        }
    });
    let ack = Utf8Bytes::from_static(BARE_ACK);
    while let Some(Ok(m)) = stream.next().await {
        match m {
            AxMessage::Text(_) if tx.send(ack.clone()).is_err() => break,
            AxMessage::Close(_) => break,
            _ => {}
        }
    }
    drop(tx);
    bare.subscribers.lock().unwrap().retain(|s| !s.is_closed());
    writer.abort();
}

async fn bare_emit(State(bare): State<Arc<Bare>>, body: String) -> &'static str {
    // The body goes out as one frame, shared by every subscriber, as the
    // channel shares its serialized envelope.
    let frame = Utf8Bytes::from(format!(r#"{{"type":"data","payload":{body}}}"#));
    for s in bare.subscribers.lock().unwrap().iter() {
        let _ = s.send(frame.clone());
    }
    "{}"
}

// ----- the run -----------------------------------------------------------

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

fn main() {
    // Server CPU comes from /proc: elsewhere there is nothing to measure.
    if !cfg!(target_os = "linux") {
        eprintln!("the ggui_live bench runs on Linux only (it reads /proc/self/task)");
        return;
    }
    let mut numbers = Vec::new();
    let mut json_out = None;
    let mut repeat = 3usize;
    // Only the spaced and burst runs (for a profile of them alone).
    let mut spaced_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json_out = args.next(),
            "--repeat" => repeat = args.next().and_then(|n| n.parse().ok()).unwrap_or(3),
            "--spaced-only" => spaced_only = true,
            // `cargo bench` passes `--bench`; criterion-style flags are ignored.
            _ => numbers.extend(a.parse::<usize>().ok()),
        }
    }
    let total_actions = numbers.first().copied().unwrap_or(20_000);
    let envelopes = numbers.get(1).copied().unwrap_or(2_000);
    let repeat = repeat.max(1);
    // The server and the bench's clients run on two runtimes, so that the
    // server's CPU can be told apart by its threads' name.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name(SERVER_THREADS)
        .thread_keep_alive(Duration::from_secs(24 * 3600))
        .enable_all()
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("hw-client")
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (app, memory_app, bare_addr, bare_server) = server_rt.block_on(async {
        let store = Arc::new(SqliteStore::open(&dir.path().join("hostwire.db")).unwrap());
        let mut config = GguiConfig::default();
        config.channel.rate_per_second = 1e9;
        config.channel.rate_burst = u32::MAX;
        config.channel.max_subscribers_per_session = SUBSCRIBERS;
        config.apps = vec![hostwire::ggui::GguiApp {
            id: "conformance".to_owned(),
            credential: APP_CREDENTIAL.to_owned(),
        }];
        let relay = RelayConfig {
            allowed_origins: AllowedOrigins::Any,
            trust_proxy: false,
            rooms_per_ip_per_hour: RELAY_LIMITS.rooms_per_ip_per_hour,
            limits: RELAY_LIMITS,
            server_limits: SERVER_LIMITS,
            outbound_queue: OUTBOUND_QUEUE,
            credentials: hostwire::http::CredentialSettings {
                ggui_sessions_per_ip_per_hour: u32::MAX,
                ..Default::default()
            },
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut app_config =
            AppConfig::new(relay.clone(), Arc::new(SystemClock), Stores::sqlite(&store));
        app_config.ggui = config.clone();
        let app = App::start(listener, app_config).unwrap();
        // The same channel with no ggui store: what a spaced action costs
        // without its durable write.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut memory_config = AppConfig::new(
            relay,
            Arc::new(SystemClock),
            Stores::relay_only(store as _).unwrap(),
        );
        memory_config.ggui = config;
        let memory_app = App::start(listener, memory_config).unwrap();
        let bare_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let bare_addr = bare_listener.local_addr().unwrap();
        let bare_server = tokio::spawn(async move {
            // TCP_NODELAY, as hostwire sets it on every connection.
            let listener = bare_listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, bare_router()).await;
        });
        (app, memory_app, bare_addr, bare_server)
    });
    rt.block_on(async {
        let ggui = Target {
            http: format!("http://{}", app.addr),
            ws: format!("ws://{}/ggui/ws", app.addr),
            ggui: true,
        };
        let memory = Target {
            http: format!("http://{}", memory_app.addr),
            ws: format!("ws://{}/ggui/ws", memory_app.addr),
            ggui: true,
        };
        let bare = Target {
            http: format!("http://{bare_addr}"),
            ws: format!("ws://{bare_addr}/bare/ws"),
            ggui: false,
        };

        let mut action_runs = Vec::new();
        let mut fan_runs = Vec::new();
        let mut spaced_runs = Vec::new();
        for i in 1..=repeat {
            // Turns alternate so that each pair sees the machine alike.
            if spaced_only {
                let ours = spaced_and_burst(&ggui, &format!("s-{i}"), SPACED_ACTIONS, SPACED_GAP).await;
                let bare = spaced_and_burst(&bare, "bare", SPACED_ACTIONS, SPACED_GAP).await;
                println!(
                    "run {i}: spaced {:.1} µs ({:.2} sleeps), burst {:.1} µs; bare spaced {:.1} µs ({:.2} sleeps)",
                    ours.spaced, ours.spaced_sleeps, ours.burst, bare.spaced, bare.spaced_sleeps
                );
                continue;
            }
            let ours = actions(&ggui, &format!("bench-actions-{i}"), total_actions).await;
            // The bare server is so much faster that the same count would
            // be over in milliseconds: it gets five times the frames.
            let base = actions(&bare, "bare", total_actions * BARE_FACTOR).await;
            println!("run {i}: actions validated and acked: {ours:.0}/s; bare WebSocket acks: {base:.0}/s ({:.2}×)", ours / base);
            action_runs.push(json!({"ggui_per_s": ours, "bare_per_s": base}));
            let (ours, ours_emits) = fan_out(&ggui, &format!("bench-fan-{i}"), envelopes).await;
            let (base, base_emits) = fan_out(&bare, "bare", envelopes).await;
            println!(
                "run {i}: envelopes to {SUBSCRIBERS} subscribers: {ours:.0} deliveries/s ({ours_emits:.0} emits/s); bare: {base:.0} deliveries/s ({base_emits:.0} emits/s) ({:.2}×)",
                ours / base
            );
            let sp = spaced_and_burst(
                &ggui,
                &format!("bench-spaced-{i}"),
                SPACED_ACTIONS,
                SPACED_GAP,
            )
            .await;
            let sp_memory = spaced_and_burst(
                &memory,
                &format!("bench-spaced-memory-{i}"),
                SPACED_ACTIONS,
                SPACED_GAP,
            )
            .await;
            let sp_bare = spaced_and_burst(&bare, "bare", SPACED_ACTIONS, SPACED_GAP).await;
            println!(
                "run {i}: the same without a ggui store: {:.1} µs spaced ({:.2} sleeps), {:.1} µs in a burst",
                sp_memory.spaced, sp_memory.spaced_sleeps, sp_memory.burst
            );
            println!(
                "run {i}: server CPU per action, one every {SPACED_GAP:?}: {:.1} µs ({:.2} sleeps), in a burst: {:.1} µs ({:.3} sleeps) ({:.2}×); bare: {:.1} µs ({:.2} sleeps) / {:.1} µs ({:.2}×)",
                sp.spaced,
                sp.spaced_sleeps,
                sp.burst,
                sp.burst_sleeps,
                sp.spaced / sp.burst,
                sp_bare.spaced,
                sp_bare.spaced_sleeps,
                sp_bare.burst,
                sp_bare.spaced / sp_bare.burst
            );
            println!(
                "run {i}: spaced ÷ bare spaced: {:.2}× (no store: {:.2}×)",
                sp.spaced / sp_bare.spaced,
                sp_memory.spaced / sp_bare.spaced
            );
            spaced_runs.push(json!({
                "ggui_spaced_us": sp.spaced, "ggui_burst_us": sp.burst,
                "ggui_spaced_sleeps": sp.spaced_sleeps, "ggui_burst_sleeps": sp.burst_sleeps,
                "memory_spaced_us": sp_memory.spaced, "memory_burst_us": sp_memory.burst,
                "memory_spaced_sleeps": sp_memory.spaced_sleeps,
                "bare_spaced_us": sp_bare.spaced, "bare_burst_us": sp_bare.burst,
                "bare_spaced_sleeps": sp_bare.spaced_sleeps,
            }));
            fan_runs.push(json!({
                "ggui_deliveries_per_s": ours, "ggui_emits_per_s": ours_emits,
                "bare_deliveries_per_s": base, "bare_emits_per_s": base_emits,
            }));
        }
        let ratio = |runs: &[Value], a: &str, b: &str| {
            median(
                runs.iter()
                    .filter_map(|r| Some(r[a].as_f64()? / r[b].as_f64()?))
                    .collect(),
            )
        };
        println!(
            "median of {repeat}: actions {:.2}× the bare WebSocket; fan-out {:.2}×",
            ratio(&action_runs, "ggui_per_s", "bare_per_s"),
            ratio(&fan_runs, "ggui_deliveries_per_s", "bare_deliveries_per_s")
        );
        println!(
            "median of {repeat}: a spaced action costs {:.2}× one in a burst (bare WebSocket: {:.2}×)",
            ratio(&spaced_runs, "ggui_spaced_us", "ggui_burst_us"),
            ratio(&spaced_runs, "bare_spaced_us", "bare_burst_us")
        );
        if let Some(path) = json_out {
            let out = json!({
                "actions": {"total": total_actions, "bare_total": total_actions * BARE_FACTOR, "batch": BATCH, "runs": action_runs},
                "fan_out": {"envelopes": envelopes, "subscribers": SUBSCRIBERS, "in_flight": IN_FLIGHT, "runs": fan_runs},
                "spaced": {"actions": SPACED_ACTIONS, "gap_ms": SPACED_GAP.as_millis() as u64, "runs": spaced_runs},
            });
            std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
            println!("wrote {path}");
        }
    });
    server_rt.block_on(async {
        bare_server.abort();
        app.shutdown().await;
        memory_app.shutdown().await;
    });
}
