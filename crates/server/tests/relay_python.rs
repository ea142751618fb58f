//! The relay tried from outside: `tests/py/relay_client.py`, a Python
//! client written from the protocol's documents alone (not from this
//! code), runs its allowed and forbidden cases against the real server on
//! 127.0.0.1 with its SQLite store. Python 3 with the `websockets` package
//! (10.x) must be installed: without it this test fails, it does not skip.

mod common;

use common::{config, TestRelay, ORIGIN};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_written_from_the_documents_alone() {
    let python = python();
    let relay = TestRelay::start(config()).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/relay_client.py");
    let mut cmd = tokio::process::Command::new(&python);
    cmd.arg(&script)
        .args(["--http", &relay.http, "--ws", &relay.ws, "--origin", ORIGIN])
        // The relay runs on a manual clock that nothing advances: the
        // per-IP limits are exact.
        .arg("--frozen-clock")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
    let out = tokio::time::timeout(SCRIPT_GUARD, cmd.output())
        .await
        .expect("the Python client did not finish")
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "the Python client failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        last.ends_with(" passed, 0 failed") && !last.starts_with("0 "),
        "the Python client's summary: {last:?}\n{stdout}"
    );
}
