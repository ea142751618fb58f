//! `hostwire serve --postgres-url`: what must survive a restart lives in a
//! real PostgreSQL (started by the tests, `hostwire_store::testing`), so a
//! node started on the same database with another data directory finds
//! every room; a URL that cannot serve stops the start-up naming the option,
//! never printing the password.

use crate::support::process::{serve_failing, Process};
use crate::support::relay::{temp_dir, Client, ORIGIN};
use serde_json::{json, Value};

async fn host(p: &Process, pin: &str, token: &str) -> Value {
    let mut h = Client::connect(&p.ws("/ws"), Some(ORIGIN)).await.unwrap();
    h.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}))
        .await;
    h.recv().await
}

#[tokio::test]
async fn a_room_outlives_its_node_on_postgres_with_its_pin_and_host_token() {
    let Some(url) = hostwire_store::testing::fresh_database("serve_on_postgres") else {
        return;
    };
    let origins = ("ALLOWED_ORIGINS", ORIGIN);
    let first = temp_dir("pg-node-1");
    // A short lease: the next node takes the room over once it has run out.
    let lease = ["--postgres-url", &url, "--lease-ttl", "1s"];
    let mut p = Process::serve(first.path(), &lease, &[origins]);
    // Every store call made while serving runs on the blocking pool's
    // thread: none starts a thread of its own (start-up may).
    let started = hops(&p).await;
    let (status, v) =
        crate::support::http::call("POST", &format!("{}/api/rooms", p.http()), None, None).await;
    assert_eq!(status, 201, "{v}");
    let pin = v["pin"].as_str().unwrap().to_owned();
    let token = v["hostToken"].as_str().unwrap().to_owned();
    assert_eq!(host(&p, &pin, &token).await["t"], "hosting");
    let html = r#"<script type="application/oqse-manifest+json">{"appName":"Quiz"}</script>"#;
    let r = reqwest::Client::new()
        .put(format!("{}/api/rooms/{pin}/bundle", p.http()))
        .header("Authorization", format!("Bearer {token}"))
        .body(json!({"pluginHtml": html, "set": {"items": []}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(hops(&p).await, started, "a store call hopped to a thread");
    p.kill_9();

    // Another node: its own (empty) data directory, the same database.
    let second = temp_dir("pg-node-2");
    let p = Process::serve(second.path(), &lease, &[origins]);
    let started = hops(&p).await;
    // 503 while the dead node's lease runs.
    let deadline = tokio::time::Instant::now() + crate::support::server::GUARD;
    let info = loop {
        let (status, v) =
            crate::support::http::call("GET", &format!("{}/api/rooms/{pin}", p.http()), None, None)
                .await;
        if status == 200 {
            break v;
        }
        assert_eq!(status, 503, "{v}");
        assert!(tokio::time::Instant::now() < deadline, "never taken over");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(info["pin"], json!(pin), "{info}");
    assert_eq!(info["appName"], "Quiz", "{info}");
    assert_eq!(host(&p, &pin, &token).await["t"], "hosting");
    let wrong = host(&p, &pin, &"x".repeat(token.len())).await;
    assert_eq!(wrong["t"], "error", "{wrong}");
    let bundle = reqwest::get(format!("{}/api/rooms/{pin}/bundle", p.http()))
        .await
        .unwrap();
    assert_eq!(bundle.headers()["x-bundle-version"], "1");
    assert!(bundle.text().await.unwrap().contains("Quiz"));
    assert!(
        !second.path().join("hostwire.db").exists(),
        "nothing was kept in SQLite"
    );
    assert_eq!(hops(&p).await, started, "a store call hopped to a thread");
}

/// PostgreSQL store calls that ran on a thread started for the call.
async fn hops(p: &Process) -> u64 {
    crate::support::http::metric(&p.http(), "hostwire_store_pg_thread_hops_total").await
}

#[tokio::test]
async fn an_unusable_postgres_url_stops_the_start_naming_the_option_not_the_password() {
    // Nothing listens on the port of a listener just closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let secret = "s3cret-pa55word";
    for url in [
        format!("postgres://node:{secret}@127.0.0.1:{port}/hostwire"),
        format!("postgres://node:{secret}@127.0.0.1:{port}/hostwire?sslmode=nonsense"),
        format!("postgres://node:{secret}@127.0.0.1:notaport/hostwire"),
    ] {
        let stderr = serve_failing(&[], &[("HOSTWIRE_POSTGRES_URL", &url)]).await;
        let line = stderr
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_else(|| panic!("{stderr}"));
        assert!(
            line.contains("--postgres-url / HOSTWIRE_POSTGRES_URL"),
            "{line}"
        );
        assert!(
            line.contains("cannot use the PostgreSQL database"),
            "{line}"
        );
        assert!(!stderr.contains(secret), "{stderr}");
    }
}

#[tokio::test]
async fn serve_help_names_the_postgres_url_and_hides_its_value() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire"))
        .args(["serve", "--help"])
        .env(
            "HOSTWIRE_POSTGRES_URL",
            "postgres://node:s3cret@db/hostwire",
        )
        .output()
        .await
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("--postgres-url"), "{help}");
    assert!(help.contains("[env: HOSTWIRE_POSTGRES_URL]"), "{help}");
    assert!(!help.contains("s3cret"), "{help}");
}

#[tokio::test]
async fn an_empty_postgres_url_is_sqlite_in_the_data_directory() {
    let dir = temp_dir("pg-empty");
    let p = Process::serve(dir.path(), &[], &[("HOSTWIRE_POSTGRES_URL", "")]);
    let (status, _) =
        crate::support::http::call("POST", &format!("{}/api/rooms", p.http()), None, None).await;
    assert_eq!(status, 201);
    assert!(dir.path().join("hostwire.db").exists());
}
