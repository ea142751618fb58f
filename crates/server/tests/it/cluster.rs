//! `hostwire serve --nats-url`: real `nats-server` processes (Debian's
//! `nats-server` package) and real `hostwire serve` processes that find
//! each other through heartbeats, lose a `kill -9`ed node, and find each
//! other again after NATS restarts.
//!
//! Each test starts its own `nats-server` on a free loopback port (nodes of
//! one test must not hear another's), through a shell that stops it when
//! its standard input closes: when the test drops it, or when the test
//! binary ends however it ends, so no `nats-server` outlives the tests.
//! Where no `nats-server` can be had, the test says so loudly on standard
//! error and returns; under `CI=true` it fails.

use crate::support::process::{serve_failing, Process};
use crate::support::server::{temp_dir, GUARD};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

/// The environment variable naming a `nats-server` binary for the tests.
const NATS_SERVER_VAR: &str = "HOSTWIRE_TEST_NATS_SERVER";

/// The line `nats-server` logs once it accepts clients.
const READY: &str = "Server is ready";

/// How often a test looks again at a node's health while it waits for
/// heartbeats (real processes on real time).
const POLL: Duration = Duration::from_millis(50);

/// Runs `nats-server` (`$1`) on port `$2` until standard input closes.
const NATS_SCRIPT: &str = r#"
"$1" -a 127.0.0.1 -p "$2" </dev/null &
pid=$!
cat >/dev/null || true
kill -TERM "$pid" 2>/dev/null || true
wait "$pid" || true
"#;

fn nats_server_binary() -> Option<String> {
    if let Ok(p) = std::env::var(NATS_SERVER_VAR) {
        if !p.is_empty() {
            return Some(p);
        }
    }
    let out = Command::new("sh")
        .args(["-c", "command -v nats-server"])
        .output()
        .ok()?;
    let on_path = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    if out.status.success() && !on_path.is_empty() {
        return Some(on_path);
    }
    // Debian installs it in /usr/sbin, not on a user's PATH.
    ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .map(str::to_owned)
}

/// A running `nats-server`, stopped when dropped.
pub(crate) struct Nats {
    bin: String,
    port: u16,
    run: Option<(Child, ChildStdin)>,
}

impl Nats {
    /// A `nats-server` on a free loopback port; `None` (said loudly, a
    /// failure under CI) where there is none.
    pub(crate) fn start(test: &str) -> Option<Nats> {
        let Some(bin) = nats_server_binary() else {
            unavailable(test, "no nats-server binary");
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut n = Nats {
            bin,
            port,
            run: None,
        };
        if let Err(why) = n.restart() {
            unavailable(test, &why);
            return None;
        }
        Some(n)
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server and waits for it to be gone.
    pub(crate) fn stop(&mut self) {
        if let Some((mut child, stdin)) = self.run.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }

    /// Starts the server (again) on its port; waits until it is ready.
    pub(crate) fn restart(&mut self) -> Result<(), String> {
        self.stop();
        let port = self.port.to_string();
        let mut child = Command::new("sh")
            .args(["-c", NATS_SCRIPT, "hostwire-test-nats", &self.bin, &port])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.bin))?;
        let stdin = child.stdin.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        // Carries one message (ready, or the log when it exits first).
        let (tx, rx) = std::sync::mpsc::channel();
        // Read until ready, then keep draining so it never blocks on a
        // full pipe.
        std::thread::spawn(move || {
            let mut log = Vec::new();
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(t) = &tx {
                    if line.contains(READY) {
                        let _ = t.send(Ok(()));
                        tx = None;
                    } else {
                        log.push(line);
                    }
                }
            }
            if let Some(t) = tx {
                let _ = t.send(Err(log.join("\n")));
            }
        });
        match rx.recv_timeout(GUARD) {
            Ok(Ok(())) => {
                self.run = Some((child, stdin));
                Ok(())
            }
            other => {
                drop(stdin);
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("nats-server did not start: {other:?}"))
            }
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

fn unavailable(test: &str, why: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let line = format!(
        "\n*** NATS test {test} NOT RUN: {why}. Install Debian's nats-server package or set {NATS_SERVER_VAR}. ***\n"
    );
    if ci {
        panic!("{line} (CI=true: a test that could not run is a failure)");
    }
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// A node `id` on `nats`.
fn node(nats: &Nats, id: &str, dir: &tempfile::TempDir) -> Process {
    Process::serve(
        dir.path(),
        &["--node-id", id],
        &[("HOSTWIRE_NATS_URL", &nats.url())],
    )
}

async fn health(p: &Process) -> Value {
    reqwest::get(format!("{}/api/health", p.http()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn peer_ids(h: &Value) -> Vec<String> {
    h["peers"]
        .as_array()
        .unwrap_or_else(|| panic!("{h}"))
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits (at most [`GUARD`]) until `p`'s health satisfies `ok`; the last
/// health seen.
async fn until(p: &Process, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let h = health(p).await;
        if ok(&h) {
            return h;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {h}");
        tokio::time::sleep(POLL).await;
    }
}

async fn metrics(p: &Process) -> String {
    reqwest::get(format!("{}/metrics", p.http()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test]
async fn three_nodes_list_each_other_and_drop_the_one_killed() {
    let Some(nats) = Nats::start("three_nodes") else {
        return;
    };
    let dirs = [temp_dir("nats-a"), temp_dir("nats-b"), temp_dir("nats-c")];
    let a = node(&nats, "node-a", &dirs[0]);
    let b = node(&nats, "node-b", &dirs[1]);
    let mut c = node(&nats, "node-c", &dirs[2]);
    for (p, others) in [
        (&a, ["node-b", "node-c"]),
        (&b, ["node-a", "node-c"]),
        (&c, ["node-a", "node-b"]),
    ] {
        let h = until(p, "every other node listed", |h| peer_ids(h) == others).await;
        assert_eq!(h["nats"], "connected", "{h}");
        assert!(h["node"].as_str().unwrap().starts_with("node-"), "{h}");
        // Where the peer serves, and when it was last heard from.
        assert!(
            h["peers"][0]["addr"]
                .as_str()
                .unwrap()
                .starts_with("127.0.0.1:"),
            "{h}"
        );
        assert!(h["peers"][0]["lastSeenMs"].as_u64().unwrap() > 0, "{h}");
    }
    let m = metrics(&a).await;
    assert_eq!(metric(&m, "hostwire_cluster_peers"), 2, "{m}");
    // The first connection is no reconnection.
    assert_eq!(
        metric(&m, "hostwire_cluster_nats_reconnects_total"),
        0,
        "{m}"
    );
    assert!(
        metric(&m, "hostwire_cluster_heartbeats_sent_total") >= 1,
        "{m}"
    );
    assert!(
        metric(&m, "hostwire_cluster_heartbeats_received_total") >= 2,
        "{m}"
    );

    c.kill_9();
    for (p, other) in [(&a, "node-b"), (&b, "node-a")] {
        until(p, "the killed node dropped", |h| peer_ids(h) == [other]).await;
    }
    let m = metrics(&a).await;
    assert_eq!(metric(&m, "hostwire_cluster_peers"), 1, "{m}");
    assert!(
        metric(&m, "hostwire_cluster_peers_dropped_total") >= 1,
        "{m}"
    );
}

#[tokio::test]
async fn peers_come_back_when_nats_restarts() {
    let Some(mut nats) = Nats::start("nats_restart") else {
        return;
    };
    let dirs = [temp_dir("nats-r1"), temp_dir("nats-r2")];
    let a = node(&nats, "one", &dirs[0]);
    let b = node(&nats, "two", &dirs[1]);
    until(&a, "two listed", |h| peer_ids(h) == ["two"]).await;
    until(&b, "one listed", |h| peer_ids(h) == ["one"]).await;

    nats.stop();
    // The nodes go on serving, know NATS is away, and lose their peers.
    for p in [&a, &b] {
        until(p, "NATS away, peers gone", |h| {
            h["nats"] == "disconnected" && peer_ids(h).is_empty()
        })
        .await;
    }
    nats.restart().unwrap();
    until(&a, "two back", |h| {
        h["nats"] == "connected" && peer_ids(h) == ["two"]
    })
    .await;
    until(&b, "one back", |h| {
        h["nats"] == "connected" && peer_ids(h) == ["one"]
    })
    .await;
    let m = metrics(&a).await;
    assert!(
        metric(&m, "hostwire_cluster_nats_disconnects_total") >= 1,
        "{m}"
    );
    assert!(
        metric(&m, "hostwire_cluster_nats_reconnects_total") >= 1,
        "{m}"
    );
    assert_eq!(metric(&m, "hostwire_cluster_nats_connected"), 1, "{m}");
}

#[tokio::test]
async fn malformed_and_oversized_heartbeats_are_ignored_and_counted() {
    let Some(nats) = Nats::start("bad_heartbeats") else {
        return;
    };
    let dir = temp_dir("nats-bad");
    let a = node(&nats, "only", &dir);
    until(&a, "up", |h| h["nats"] == "connected").await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let subject = hostwire::cluster::HEARTBEAT_SUBJECT;
    let big = format!(
        r#"{{"node":"big","addr":"x","startedMs":1,"units":["{}"]}}"#,
        "u".repeat(hostwire::cluster::MAX_HEARTBEAT_BYTES)
    );
    for bad in [
        "not json".to_owned(),
        r#"{"node":"has space","addr":"x","startedMs":1}"#.to_owned(),
        big,
    ] {
        client.publish(subject, bad.into()).await.unwrap();
    }
    // A well-formed one from a node that sends only once: listed, then
    // dropped after three intervals.
    client
        .publish(
            subject,
            r#"{"node":"ghost","addr":"10.0.0.9:1","startedMs":1}"#.into(),
        )
        .await
        .unwrap();
    client.flush().await.unwrap();
    until(&a, "ghost listed", |h| peer_ids(h) == ["ghost"]).await;
    let m = metrics(&a).await;
    assert_eq!(
        metric(
            &m,
            "hostwire_cluster_heartbeats_rejected_total{reason=\"malformed\"}"
        ),
        2,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "hostwire_cluster_heartbeats_rejected_total{reason=\"too_large\"}"
        ),
        1,
        "{m}"
    );
    until(&a, "ghost dropped", |h| peer_ids(h).is_empty()).await;
}

#[tokio::test]
async fn a_node_without_nats_answers_health_as_the_reference_relay() {
    let dir = temp_dir("nats-none");
    let p = Process::serve(
        dir.path(),
        &["--node-id", "solo"],
        &[("HOSTWIRE_NATS_URL", "")],
    );
    // Exactly the reference relay's body: a single node is today's server.
    let h = health(&p).await;
    assert_eq!(
        h,
        serde_json::json!({"ok": true, "rooms": 0, "connections": 0, "players": 0}),
        "{h}"
    );
}

#[tokio::test]
async fn an_unreachable_nats_or_a_bad_node_id_stops_the_start_naming_the_option() {
    // Nothing listens on the port of a listener just closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://node:s3cret-pa55@127.0.0.1:{port}");
    let stderr = serve_failing(&[], &[("HOSTWIRE_NATS_URL", &url)]).await;
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("--nats-url / HOSTWIRE_NATS_URL"), "{line}");
    assert!(line.contains("cannot reach the NATS server"), "{line}");
    assert!(!stderr.contains("s3cret-pa55"), "{stderr}");

    let stderr = serve_failing(&["--node-id", "no spaces"], &[]).await;
    assert!(stderr.contains("--node-id / HOSTWIRE_NODE_ID"), "{stderr}");
}

#[tokio::test]
async fn serve_help_names_the_nats_url_and_node_id() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire"))
        .args(["serve", "--help"])
        .env("HOSTWIRE_NATS_URL", "nats://node:s3cret@nats:4222")
        .output()
        .await
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("--nats-url"), "{help}");
    assert!(help.contains("[env: HOSTWIRE_NATS_URL]"), "{help}");
    assert!(help.contains("--node-id"), "{help}");
    assert!(help.contains("[env: HOSTWIRE_NODE_ID"), "{help}");
    assert!(!help.contains("s3cret"), "{help}");
}
