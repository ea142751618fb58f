//! The shared service worker is shared fairly (over real sockets, with the
//! built-in answer checker): while one session floods `answers.check` with
//! more calls than the worker takes at once, another session's calls are
//! still taken and answered. The worker is held (SIGSTOP) while the flood
//! arrives, so the calls really are in flight at once, whatever the
//! machine's speed; it is the only worker this test binary starts.

use crate::support::session::*;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;

/// Flooding players and the calls each sends (under the 30 a minute each
/// instance may make), more in all than one worker takes in flight.
const FLOOD_PLAYERS: usize = 10;
const CALLS_EACH: usize = 28;

async fn started(api: &Api, players: usize) -> (String, Vec<Device>) {
    let (sid, token) = api.create(&presenter_body(players)).await;
    api.op(&sid, &token, "start").await;
    let (board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let mut devices = Vec::new();
    for id in player_ids(players) {
        let (p, _) = api.device(&sid, "controller", &id).await;
        p.call("ready", json!([])).await.unwrap();
        devices.push(p);
    }
    (sid, devices)
}

/// The pid of the answer checker this process started.
fn checker_pid() -> String {
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm is cut at 15 bytes.
        let Some((head, tail)) = stat.rsplit_once(") ") else {
            continue;
        };
        let ppid = tail.split_whitespace().nth(1);
        if head.contains("(hostwire-answer") && ppid == Some(me.as_str()) {
            return entry.file_name().to_string_lossy().into_owned();
        }
    }
    panic!("the answer checker is not running");
}

fn signal(pid: &str, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_flooding_the_shared_worker_does_not_starve_another() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    h.server
        .as_ref()
        .unwrap()
        .sessions
        .use_services(vec![answer_checker()], 60_000);
    let (_quiet_sid, quiet) = started(&api, 1).await;
    let (_flood_sid, flood) = started(&api, FLOOD_PLAYERS).await;
    let check = json!(["answers.check", {"answer": "venus", "accepted": ["Venus"]}]);
    // The first call starts the worker; then it is held.
    assert_eq!(
        quiet[0].call("service", check.clone()).await.unwrap()["correct"],
        true
    );
    let pid = checker_pid();
    signal(&pid, "-STOP");
    let metrics = std::sync::Arc::clone(&h.server.as_ref().unwrap().sessions.metrics.services);
    let before = metrics.calls.load(Relaxed);
    let mut flooded = Vec::new();
    for p in &flood {
        for _ in 0..CALLS_EACH {
            flooded.push(p.send_call("service", &check).1);
        }
    }
    let total = (FLOOD_PLAYERS * CALLS_EACH) as u64;
    tokio::time::timeout(GUARD, async {
        while metrics.calls.load(Relaxed) < before + total {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the flood reached the worker");
    // Now the other session calls, 8 times.
    let asked: Vec<_> = (0..8)
        .map(|_| quiet[0].send_call("service", &check).1)
        .collect();
    signal(&pid, "-CONT");
    let mut answered = 0;
    let mut refused: Vec<String> = Vec::new();
    for rx in asked {
        match Device::answer(rx).await {
            Ok(v) if v["correct"] == Value::Bool(true) => answered += 1,
            Ok(v) => refused.push(v.to_string()),
            Err(e) => refused.push(format!("{}: {}", e.code, e.message)),
        }
    }
    assert_eq!(answered, 8, "the quiet session's calls: {refused:?}");
    // The flood was held to its share: what is over it is RATE_LIMITED,
    // and what was taken is answered.
    let mut flood_answered = 0;
    let mut flood_codes = std::collections::BTreeMap::<String, usize>::new();
    for rx in flooded {
        match Device::answer(rx).await {
            Ok(_) => flood_answered += 1,
            Err(e) => *flood_codes.entry(e.code).or_default() += 1,
        }
    }
    eprintln!("flood: {flood_answered} answered, refused {flood_codes:?}");
    assert!(flood_answered >= 1, "{flood_codes:?}");
    assert!(
        flood_codes.keys().all(|c| c == "RATE_LIMITED"),
        "{flood_codes:?}"
    );
}
