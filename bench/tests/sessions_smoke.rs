//! Smoke mode of the hosted-sessions scenario: 2 sessions of a board and 2
//! controllers, a few calls each way, against the server on 127.0.0.1
//! with its SQLite store and a manual clock; and its report section. Not a
//! benchmark.
#![cfg(target_os = "linux")]

use hostwire::app::App;
use hostwire::http::AllowedOrigins;
use hostwire::relay::{RelayConfig, OUTBOUND_QUEUE, SERVER_LIMITS};
use hostwire_bench::sessions::{self, BoardTo, Params};
use hostwire_core::ManualClock;
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::SqliteStore;
use std::sync::Arc;
use std::time::Duration;

/// The operator credential of the test server, which the load generator
/// reads from the environment as it does against `hostwire serve`.
const OPERATOR: &str = "smoke-operator-credential-0123456789";

async fn server() -> App {
    std::env::set_var("HOSTWIRE_OPERATOR_TOKEN", OPERATOR);
    let store = Arc::new(SqliteStore::in_memory().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = RelayConfig {
        allowed_origins: AllowedOrigins::Any,
        trust_proxy: false,
        rooms_per_ip_per_hour: 10_000,
        limits: RELAY_LIMITS,
        server_limits: SERVER_LIMITS,
        outbound_queue: OUTBOUND_QUEUE,
        credentials: hostwire::http::CredentialSettings {
            operator_token: Some(OPERATOR.to_owned()),
            ..Default::default()
        },
    };
    // The clock stands still: the send rates' bursts (60) cover the few
    // calls of count mode, and no session timer fires.
    let mut stores = hostwire::app::Stores::relay_only(Arc::clone(&store) as _).unwrap();
    stores.sessions = store as _;
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    App::start(
        listener,
        hostwire::app::AppConfig::new(config, clock, stores),
    )
    .unwrap()
}

fn tiny(board_to: BoardTo, ticks: u64) -> Params {
    Params {
        sessions: 2,
        controllers: 2,
        rates: vec![200.0],
        board_to,
        payload: 200,
        warmup: Duration::ZERO,
        duration: Duration::ZERO,
        ticks_per_sender: Some(ticks),
        quiet: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_route_every_call_both_ways() {
    let app = server().await;
    let url = format!("http://{}", app.addr);
    for board_to in [BoardTo::Each, BoardTo::All] {
        let r = sessions::run(&url, &tiny(board_to, 5), None).await.unwrap();
        assert_eq!((r.sessions, r.devices), (2, 6));
        let st = &r.steps[0];
        // 2 sessions × 2 controllers × 5 messages, each way.
        assert_eq!(st.latency_to_board.samples, 20, "{board_to:?} {st:?}");
        assert_eq!(st.latency_to_controllers.samples, 20, "{board_to:?} {st:?}");
        assert!(st.errors.is_empty() && st.unanswered == 0, "{st:?}");
        assert!(st.closes.is_empty(), "{st:?}");
        // Every send answered: 20 by controllers; the board's 20 (each) or 10 (all).
        let board_sends = if board_to == BoardTo::Each {
            20.0
        } else {
            10.0
        };
        assert_eq!(
            (st.sends_ok_per_s * st.seconds).round(),
            20.0 + board_sends,
            "{st:?}"
        );
        let l = &st.latency_to_board;
        assert!(l.p50_us > 0 && l.p99_us >= l.p50_us, "{l:?}");
    }
}

#[test]
fn the_report_gives_the_ratio_to_the_relay() {
    let tmp = tempfile::Builder::new()
        .prefix("hostwire-bench-sessions-report-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let lat = serde_json::json!({"p50_us": 400, "p90_us": 900, "p99_us": 2500, "p999_us": 6000, "max_us": 9000, "samples": 1000, "curve": []});
    let step = |rate: f64, routed: f64, cpu: f64| {
        serde_json::json!({
            "sessions": 100, "controllers": 30, "rate_hz": rate, "board_to": "each",
            "offered_per_s": 6000.0 * rate, "routed_per_s": routed, "to_board_per_s": routed / 2.0,
            "to_controllers_per_s": routed / 2.0, "sends_ok_per_s": routed, "seconds": 20.0,
            "latency_to_board": lat, "latency_to_controllers": lat, "errors": {}, "unanswered": 0,
            "closes": {}, "server_cpu": {"user_pct": cpu / 2.0, "system_pct": cpu / 2.0, "total_pct": cpu},
            "server_us_per_routed": cpu / 100.0 * 1e6 / routed, "server_rss_kb": 300000,
            "generator_cpu": {"user_pct": 40.0, "system_pct": 20.0, "total_pct": 60.0},
            "held_back": if rate > 10.0 { 5000 } else { 0 }, "cores_busy_pct": [70.0, cpu]
        })
    };
    let run = serde_json::json!({"scenario": "sessions", "result": {
        "sessions": 100, "controllers": 30, "devices": 3100, "payload": 200, "setup_seconds": 4.0,
        "server_rss_kb_before": 20000, "server_rss_kb_attached": 120000,
        // 10 µs a routed call at 5/s; saturated at 30/s.
        "steps": [step(5.0, 30000.0, 30.0), step(30.0, 90000.0, 99.0)]
    }});
    std::fs::write(dir.join("sessions-hostwire.json"), run.to_string()).unwrap();
    // The relay's classroom right before and after: 4 and 6 µs a frame.
    for (i, cpu) in [(1, 20.0), (2, 30.0)] {
        let r = serde_json::json!({"scenario": "classroom", "result": {
            "rooms": 50, "players": 40, "player_hz": 5.0, "host_hz": 20.0, "offered_per_s": 50000.0,
            "delivered_per_s": 50000.0, "seconds": 20.0, "latency": lat, "errors": {}, "closes": {},
            "server_cpu": {"user_pct": cpu / 2.0, "system_pct": cpu / 2.0, "total_pct": cpu}, "server_rss_kb": 30000
        }});
        std::fs::write(
            dir.join(format!("sessions-baseline-{i}.json")),
            r.to_string(),
        )
        .unwrap();
    }
    let s = hostwire_bench::report_sessions::section(dir);
    assert!(s.contains("## Hosted Memizy sessions"), "{s}");
    // 10 µs ÷ the baseline's 5 µs (the mean of 4 and 6).
    assert!(
        s.contains("| 5/s | 30000 | 30000 | 15000 | 15000 | 400 µs | 2500 µs | 2500 µs | 30.0 % | 10.00 µs | 2.00× | 60.0 % | 70 %, 30 % |"),
        "{s}"
    );
    assert!(
        s.contains("- at 30/s: saturated: the server used 99 % of its core; 50 % of the offered messages were routed; 5000 sends held back"),
        "{s}"
    );
    // 11 µs a routed call at 30/s: 90,909 a second on one core, half the 180,000 offered.
    assert!(
        s.contains("At 30/s per instance the server spent 11.00 µs of CPU per routed call, 2.20× the relay's per forwarded frame: at that cost one core carries about 90909 routed calls a second, 51 % of the 180000"),
        "{s}"
    );
    assert!(!s.contains("- at 5/s"), "{s}");
    assert!(hostwire_bench::report_sessions::section(&dir.join("none")).is_empty());
}
