//! Smoke mode: the load generator, the bare forwarder and the report with
//! tiny counts, so the tools keep working. Not a benchmark.
#![cfg(target_os = "linux")]

use hostwire::app::App;
use hostwire::http::AllowedOrigins;
use hostwire::relay::{RelayConfig, OUTBOUND_QUEUE, SERVER_LIMITS};

use hostwire_bench::floor;
use hostwire_bench::load::{self, Classroom, Target};
use hostwire_core::SystemClock;
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::SqliteStore;
use std::sync::Arc;

/// The operator credential of the test server.
const OPERATOR: &str = "smoke-operator-credential-0123456789";
use std::time::Duration;

async fn hostwire_relay() -> App {
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
    let stores = hostwire::app::Stores::relay_only(store).unwrap();
    App::start(
        listener,
        hostwire::app::AppConfig::new(config, Arc::new(SystemClock), stores),
    )
    .unwrap()
}

fn tiny() -> Classroom {
    Classroom {
        rooms: 2,
        players: 3,
        player_hz: 200.0,
        host_hz: 200.0,
        payload: 200,
        warmup: Duration::ZERO,
        duration: Duration::ZERO,
        flooder_hz: None,
        frames_per_sender: Some(5),
        quiet: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classroom_against_hostwire_and_the_forwarder() {
    let server = hostwire_relay().await;
    let t = Target::new(&format!("http://{}", server.addr), "http://localhost:5180");
    let r = load::classroom(&t, &tiny(), None).await.unwrap();
    // 2 rooms × 3 players × 5 frames, each way.
    assert_eq!(r.latency.samples, 60, "{r:?}");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(r.latency.p50_us > 0 && r.latency.p99_us >= r.latency.p50_us);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, hostwire_bench::forwarder::router()).await });
    let t = Target::new(&format!("http://{addr}"), "http://localhost:5180");
    let r = load::classroom(&t, &tiny(), None).await.unwrap();
    assert_eq!(r.latency.samples, 60, "{r:?}");
}

/// Hosts on one URL, players round-robin over others (here two names of
/// the same server: a cluster's nodes need real processes, bench/cluster.sh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classroom_and_idle_with_the_players_on_other_urls() {
    let server = hostwire_relay().await;
    let port = server.addr.port();
    let origin = "http://localhost:5180";
    let spread = load::Spread {
        host: Target::new(&format!("http://127.0.0.1:{port}"), origin),
        players: vec![
            Target::new(&format!("http://localhost:{port}"), origin),
            Target::new(&format!("http://127.0.0.1:{port}/"), origin),
        ],
    };
    // Each room has players on each URL, counted over the run.
    assert_eq!(spread.player(0).http, format!("http://localhost:{port}"));
    assert_eq!(spread.player(1).http, format!("http://127.0.0.1:{port}"));
    assert_eq!(spread.player(4).http, spread.player(0).http);
    let me = std::process::id();
    let watch = load::Watch {
        servers: vec![me, me],
        side: vec![me],
    };
    let r = load::classroom_spread(&spread, &tiny(), &watch)
        .await
        .unwrap();
    assert_eq!(r.latency.samples, 60, "{r:?}");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let waves = load::Waves {
        count: 3,
        gap: Duration::ZERO,
    };
    let r = load::idle_spread(&spread, 12, waves, Duration::ZERO, &[me, me], true)
        .await
        .unwrap();
    assert_eq!((r.connections, r.still_open, r.waves), (12, 12, 3));
    assert!(
        r.anon_kb_after > 0 && r.anon_kb_after <= r.rss_kb_after,
        "{r:?}"
    );
    assert!(
        r.rss_kb_after >= 2 * load_rss_floor(),
        "summed over both: {r:?}"
    );
}

/// Some of this process's memory: a sum over it twice is at least twice.
fn load_rss_floor() -> u64 {
    hostwire_bench::procstat::sample(std::process::id())
        .unwrap()
        .rss_kb
        / 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_proc_samples() {
    let server = hostwire_relay().await;
    let t = Target::new(&format!("http://{}", server.addr), "http://localhost:5180");
    let r = load::idle(&t, 12, Duration::ZERO, std::process::id(), true)
        .await
        .unwrap();
    assert_eq!((r.connections, r.still_open), (12, 12));
    assert!(r.rss_kb_after > 0);
    let s = hostwire_bench::procstat::sample(std::process::id()).unwrap();
    assert!(s.user_s + s.system_s > 0.0);
}

/// Why this kernel refuses io_uring to the process, if it does: the default
/// seccomp profile of container runtimes denies its system calls (EPERM),
/// and kernels without it or with it switched off answer ENOSYS or EPERM.
fn io_uring_refused() -> Option<std::io::Error> {
    use std::io::ErrorKind;
    match io_uring::IoUring::new(8) {
        Ok(_) => None,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::PermissionDenied | ErrorKind::Unsupported
            ) =>
        {
            Some(e)
        }
        Err(e) => panic!("io_uring setup failed for another reason: {e}"),
    }
}

#[test]
fn the_kernel_floor_writes_and_reads_every_frame() {
    for mode in [floor::Mode::Send, floor::Mode::Uring] {
        if mode == floor::Mode::Uring {
            if let Some(e) = io_uring_refused() {
                eprintln!(
                    "skipped: the floor with io_uring (the kernel refuses io_uring here: {e})"
                );
                continue;
            }
        }
        let r = floor::run(&floor::Params {
            mode,
            connections: 8,
            rate: 0,
            frame_bytes: 240,
            duration: Duration::MAX,
            // Enough frames for the writer to run several of the kernel's
            // CPU-accounting ticks: with 2,000 (a millisecond) its CPU time
            // often read 0.
            frames: Some(100_000),
            pin: None,
        })
        .unwrap();
        // run() fails unless the reader got every byte written.
        assert_eq!(r.refused, 0, "{mode:?}");
        assert!(r.sent_per_s > 0.0 && r.writer_us_per_frame > 0.0, "{r:?}");
        // Every frame was timed on arrival.
        assert_eq!(r.latency.samples, 100_000, "{mode:?}");
    }
}

#[test]
fn the_report_renders_results() {
    let tmp = tempfile::Builder::new()
        .prefix("hostwire-bench-report-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let results = dir.join("results");
    std::fs::create_dir_all(&results).unwrap();
    let run = serde_json::json!({
        "rooms": 50, "players": 40, "player_hz": 5.0, "host_hz": 20.0, "offered_per_s": 50000.0,
        "delivered_per_s": 49500.0, "seconds": 10.0,
        "latency": {"p50_us": 300, "p90_us": 500, "p99_us": 900, "p999_us": 2000, "max_us": 5000, "samples": 1000, "curve": [[300, 50.0], [900, 99.0]]},
        "errors": {}, "closes": {}, "server_cpu": {"user_pct": 5.0, "system_pct": 7.0, "total_pct": 12.0}, "server_rss_kb": 30000
    });
    // Three runs each, taken in turns: the tables show each server's median
    // run, the ratio is the median of the paired runs.
    for (who, cpus) in [
        ("hostwire", [12.0, 14.0, 10.0]),
        ("forwarder", [10.0, 11.0, 9.0]),
    ] {
        for (i, cpu) in cpus.into_iter().enumerate() {
            let mut r = run.clone();
            r["server_cpu"] =
                serde_json::json!({"user_pct": 5.0, "system_pct": cpu - 5.0, "total_pct": cpu});
            std::fs::write(
                results.join(format!("classroom-{who}-{}.json", i + 1)),
                serde_json::json!({"scenario": "classroom", "result": r}).to_string(),
            )
            .unwrap();
        }
    }
    std::fs::write(
        results.join("floor-send-paced.json"),
        serde_json::json!({"scenario": "floor", "result": {
            "mode": "send", "connections": 2000, "frame_bytes": 240, "offered_per_s": 50000,
            "sent_per_s": 50000.0, "refused": 0, "writer_user_pct": 1.0, "writer_system_pct": 35.0,
            "writer_us_per_frame": 7.2, "reader_pct": 25.0, "reader_us_per_frame": 5.0,
            "latency": {"p50_us": 41, "p90_us": 108, "p99_us": 464, "p999_us": 2947, "max_us": 4203, "samples": 250000, "curve": []}
        }})
        .to_string(),
    )
    .unwrap();
    let out = dir.join("BENCHMARKS.md");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_hostwire-bench"))
        .args(["report", "--criterion"])
        .arg(dir.join("no-criterion"))
        .arg("--results")
        .arg(&results)
        .arg("--out")
        .arg(&out)
        .arg("--plots")
        .arg(dir.join("plots"))
        .status()
        .unwrap();
    assert!(status.success());
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.contains("| classroom 50×40 at ≤ 15 % of one core, p99 < 1 ms | 12.0 % of a core, p99 0.90 ms | met |"), "{page}");
    assert!(page.contains("| classroom 50×40 | hostwire | 49500 |"));
    assert!(
        page.contains("hostwire costs 1.20× (median of 3 paired runs, 1.11–1.27×) the floor"),
        "{page}"
    );
    assert!(
        page.contains(
            "| `send` per frame, 50k frames/s | 50000 | 36.0 % (1.0 + 35.0) | 7.20 | 25.0 % | 41 µs | 464 µs | 2947 µs |"
        ),
        "{page}"
    );
}
