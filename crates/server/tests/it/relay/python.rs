//! The relay tried from outside: `tests/py/relay_client.py`, a Python
//! client written from the protocol's documents alone (not from this
//! code), runs its allowed and forbidden cases against the real server on
//! 127.0.0.1 with its SQLite store, and finds a room again across a
//! restart. Python 3 with the `websockets` package
//! (10.x) must be installed: without it this test fails, it does not skip.

use crate::support::relay::{config, TestRelay, ORIGIN, T0};
use hostwire_core::ManualClock;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The whole script's guard (each of its reads has its own), not a wait.
const SCRIPT_GUARD: Duration = Duration::from_secs(300);

const INSTALL: &str = "the relay's Python client test needs Python 3 with the `websockets` \
     package (10.x or later): on Debian or Ubuntu `apt-get install python3 python3-websockets`, \
     elsewhere `python3 -m pip install websockets`; `.ci/run` installs it where it is missing";

/// A Python 3 that can `import websockets`: `HOSTWIRE_PYTHON` when set,
/// else `python3` on PATH, else the system's, which is where Debian's
/// python3-websockets installs (a pyenv or virtualenv `python3` earlier on
/// PATH does not see it).
fn python() -> String {
    let candidates = match std::env::var("HOSTWIRE_PYTHON") {
        Ok(p) => vec![p],
        Err(_) => vec!["python3".to_owned(), "/usr/bin/python3".to_owned()],
    };
    let mut tried = Vec::new();
    for candidate in candidates {
        match Command::new(&candidate)
            .args(["-c", "import sys, websockets; print(sys.version_info[0])"])
            .output()
        {
            Ok(out) if out.status.success() && out.stdout.starts_with(b"3") => return candidate,
            Ok(out) => tried.push(format!(
                "{candidate}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => tried.push(format!("{candidate}: {e}")),
        }
    }
    panic!("{INSTALL}\ntried:\n{}", tried.join("\n"));
}

/// The script with the relay's addresses; the relay runs on a manual clock
/// that nothing advances, so its per-IP limits are exact.
fn script(python: &str, relay: &TestRelay, extra: &[&str]) -> tokio::process::Command {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/relay_client.py");
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(&script)
        .args(["--http", &relay.http, "--ws", &relay.ws, "--origin", ORIGIN])
        .arg("--frozen-clock")
        .args(extra)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
    cmd
}

/// Fails with the script's output unless it exited 0 with a summary of
/// some cases passed and none failed.
fn passed(what: &str, status: std::process::ExitStatus, stdout: &str, stderr: &str) {
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        status.success(),
        "the Python client failed {what} ({status}):\n{stdout}\n{stderr}"
    );
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        last.ends_with(" passed, 0 failed") && !last.starts_with("0 "),
        "the Python client's summary {what}: {last:?}\n{stdout}"
    );
}

async fn run(mut cmd: tokio::process::Command, what: &str) {
    let out = tokio::time::timeout(SCRIPT_GUARD, cmd.output())
        .await
        .expect("the Python client did not finish")
        .expect("run the Python client");
    passed(
        what,
        out.status,
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_written_from_the_documents_alone() {
    let python = python();
    let relay = TestRelay::start(config()).await;
    run(script(&python, &relay, &[]), "").await;
}

/// The same client through a node that owns none of its rooms: three
/// real nodes on PostgreSQL and NATS, rooms created on one, every socket
/// opened on another and carried to the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_through_a_node_that_does_not_own_its_rooms() {
    let python = python();
    let Some(url) = hostwire_store::testing::fresh_database("python_tunnel") else {
        return;
    };
    let Some(nats) = crate::cluster::Nats::start("python_tunnel") else {
        return;
    };
    let dirs = [
        crate::support::relay::temp_dir("py-a"),
        crate::support::relay::temp_dir("py-b"),
    ];
    let node = |id: &str, dir: &tempfile::TempDir| {
        crate::support::process::Process::serve(
            dir.path(),
            &[
                "--postgres-url",
                &url,
                "--nats-url",
                &nats.url(),
                "--node-id",
                id,
            ],
            &[("ALLOWED_ORIGINS", ORIGIN)],
        )
    };
    let (a, b) = (node("a", &dirs[0]), node("b", &dirs[1]));
    crate::tunnels::until_peers(&[&a, &b]).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/relay_client.py");
    let mut cmd = tokio::process::Command::new(&python);
    cmd.arg(&script)
        .args([
            "--http",
            &a.http(),
            "--ws",
            &b.ws("/ws"),
            "--origin",
            ORIGIN,
        ])
        // Per-IP limits are counted by each node (docs/cluster.md): a
        // carried connection's first join by the node it reached, its
        // later ones by the owner, so one IP's joins are not one count
        // here, which this case expects exactly.
        .args(["--skip", "joins_past_the_ip_burst"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
    run(cmd, "through a node that does not own its rooms").await;
    assert!(
        crate::support::http::metric(&b.http(), "hostwire_cluster_tunnels_opened_total").await > 0
    );
}

/// The script makes a room's state and says READY; the server stops (its
/// sockets must close with 1001) and starts again on the same database;
/// the script finds the room, its players, kicks and bundle again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_finds_its_room_after_a_restart() {
    let python = python();
    let dir = crate::support::relay::temp_dir("relay-python");
    let state = dir.path().join("state.json");
    let state = state.to_str().unwrap();
    let mut relay = TestRelay::start_at(
        config(),
        dir.path().join("hostwire.db"),
        ManualClock::new(T0),
    )
    .await;

    let mut before = script(
        &python,
        &relay,
        &["--phase", "before-restart", "--state", state],
    );
    before.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = before.spawn().expect("run the Python client");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stdout = String::new();
    loop {
        let line = tokio::time::timeout(SCRIPT_GUARD, lines.next_line())
            .await
            .expect("the Python client did not say READY")
            .expect("read the Python client's output");
        let Some(line) = line else {
            break; // ended before READY: `passed` below reports why
        };
        stdout.push_str(&line);
        stdout.push('\n');
        if line == "READY" {
            relay.stop().await;
        }
    }
    let out = tokio::time::timeout(SCRIPT_GUARD, child.wait_with_output())
        .await
        .expect("the Python client did not finish")
        .expect("wait for the Python client");
    passed(
        "before the restart",
        out.status,
        &stdout,
        &String::from_utf8_lossy(&out.stderr),
    );

    let relay = TestRelay::start_at(config(), relay.db.clone(), relay.clock.clone()).await;
    run(
        script(
            &python,
            &relay,
            &["--phase", "after-restart", "--state", state],
        ),
        "after the restart",
    )
    .await;
}
