//! Rooms survive a restart: a graceful one in-process, and `kill -9` of the
//! real server process.

use crate::support::process::Process;
use crate::support::relay::*;
use serde_json::{json, Value};
use std::process::Command;

async fn put_bundle(http: &str, pin: &str, token: &str, app: &str) -> u64 {
    let html =
        format!(r#"<script type="application/oqse-manifest+json">{{"appName":"{app}"}}</script>"#);
    let r = reqwest::Client::new()
        .put(format!("{http}/api/rooms/{pin}/bundle"))
        .header("Authorization", format!("Bearer {token}"))
        .body(json!({"pluginHtml": html, "set": {"items": []}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["version"]
        .as_u64()
        .unwrap()
}

async fn rejoin(ws: &str, pin: &str, token: &str) -> (Client, Value) {
    let mut c = Client::connect(ws, Some(ORIGIN)).await.unwrap();
    c.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "ignored", "token": token}))
        .await;
    let v = c.recv().await;
    (c, v)
}

#[tokio::test]
async fn a_graceful_restart_keeps_rooms_and_closes_sockets_with_1001() {
    let mut t = TestRelay::start(config()).await;
    let (mut host, pin, host_token) = t.host().await;
    let (mut a, a_id, a_token) = t.player(&pin, "Ann").await;
    let (_b, b_id, b_token) = t.player(&pin, "Bob").await;
    let (mut c, c_id, _) = t.player(&pin, "Cyd").await;
    for _ in 0..3 {
        host.recv().await;
    }
    c.send(json!({"t": "rename", "name": "Cyd the Great"}))
        .await;
    host.recv().await;
    host.send(json!({"t": "kick", "playerId": b_id})).await;
    host.send(json!({"t": "open", "open": false})).await;
    host.until_pong().await;
    put_bundle(&t.http, &pin, &host_token, "Quiz").await;
    let version = put_bundle(&t.http, &pin, &host_token, "Quiz Race").await;
    assert_eq!(version, 2);

    t.stop().await;
    assert_eq!(a.ended().await, Ended::Closed(1001));
    assert_eq!(host.ended().await, Ended::Closed(1001));

    let t = TestRelay::start_at(config(), t.db.clone(), t.clock.clone()).await;
    let (mut a, v) = rejoin(&t.ws, &pin, &a_token).await;
    assert_eq!(
        (
            v["playerId"].as_str(),
            v["name"].as_str(),
            v["hostConnected"].as_bool()
        ),
        (Some(a_id.as_str()), Some("Ann"), Some(false))
    );
    let mut host = t.client().await;
    host.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": host_token}))
        .await;
    let v = host.recv().await;
    assert_eq!(v["t"], "hosting");
    assert_eq!(
        v["players"],
        json!([{"id": a_id, "name": "Ann", "connected": true}, {"id": c_id, "name": "Cyd the Great", "connected": false}])
    );
    assert_eq!(
        a.recv().await,
        json!({"t": "host-presence", "connected": true})
    );
    host.send(json!({"t": "to", "to": a_id, "data": {"after": "restart"}}))
        .await;
    assert_eq!(a.recv().await["data"], json!({"after": "restart"}));
    // The kicked token and the closed flag were kept.
    let (mut b, _) = (Client::connect(&t.ws, Some(ORIGIN)).await.unwrap(), ());
    b.send(json!({"t": "join", "protocol": 1, "pin": pin, "token": b_token}))
        .await;
    b.expect_error("KICKED", true).await;
    let mut n = t.client().await;
    n.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "New"}))
        .await;
    n.expect_error("ROOM_CLOSED", true).await;
    // The bundle is served with the same version.
    let r = reqwest::get(format!("{}/api/rooms/{pin}/bundle", t.http))
        .await
        .unwrap();
    assert_eq!(r.headers()["x-bundle-version"], "2");
    let info: Value = reqwest::get(format!("{}/api/rooms/{pin}", t.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        info,
        json!({"pin": pin, "open": false, "appName": "Quiz Race", "players": 2})
    );
}

#[tokio::test]
async fn expiry_counts_from_the_stored_times() {
    let mut t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (_a, _, a_token) = t.player(&pin, "Ann").await;
    host.ws.close(None).await.unwrap();
    // Wait until the room has seen the host leave (the player is told).
    let (_probe, _) = rejoin(&t.ws, &pin, &a_token).await;
    // 6 of the 10 minutes pass before the restart, 4 after it.
    t.clock.advance_ms(6 * 60 * 1000);
    t.stop().await;
    let t = TestRelay::start_at(config(), t.db.clone(), t.clock.clone()).await;
    t.clock.advance_ms(4 * 60 * 1000);
    t.relay().sweep().await;
    let (mut a, v) = rejoin(&t.ws, &pin, &a_token).await;
    assert_eq!(v["t"], "joined", "10 minutes away in all: not yet expired");
    t.clock.advance_ms(1);
    t.relay().sweep().await;
    assert_eq!(a.recv().await, json!({"t": "closed", "reason": "expired"}));
}

struct Server {
    process: Process,
    http: String,
    ws: String,
}

fn spawn_server(dir: &std::path::Path) -> Server {
    spawn_server_with(dir, Command::new(env!("CARGO_BIN_EXE_hostwire")))
}

fn spawn_server_with(dir: &std::path::Path, command: Command) -> Server {
    let process = Process::serve_with(command, dir, &["--allowed-origins", ORIGIN], &[]);
    Server {
        http: process.http(),
        ws: process.ws("/ws"),
        process,
    }
}

/// A room created over HTTP on a spawned server, and its host attached:
/// (host, pin, host token).
async fn host_room(s: &Server) -> (Client, String, String) {
    let v: Value = reqwest::Client::new()
        .post(format!("{}/api/rooms", s.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (pin, token) = (
        v["pin"].as_str().unwrap().to_owned(),
        v["hostToken"].as_str().unwrap().to_owned(),
    );
    let mut host = Client::connect(&s.ws, Some(ORIGIN)).await.unwrap();
    host.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token}))
        .await;
    assert_eq!(host.recv().await["t"], "hosting");
    (host, pin, token)
}

#[tokio::test]
async fn kill_9_and_start_again_on_the_same_data_directory() {
    let dir = temp_dir("kill9");
    let mut s = spawn_server(dir.path());
    let (mut host, pin, host_token) = host_room(&s).await;
    let mut players = Vec::new();
    for name in ["Ann", "Bob", "Cyd"] {
        let mut p = Client::connect(&s.ws, Some(ORIGIN)).await.unwrap();
        p.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": name}))
            .await;
        let v = p.recv().await;
        players.push((
            v["playerId"].as_str().unwrap().to_owned(),
            v["token"].as_str().unwrap().to_owned(),
            name,
        ));
        host.recv().await;
    }
    // The bundle upload is acknowledged once durable, and the store writes
    // in order: everything before it is on disk too.
    let version = put_bundle(&s.http, &pin, &host_token, "Quiz Race").await;

    s.process.kill_9();
    assert_eq!(host.ended().await, Ended::Dropped);

    let mut s = spawn_server(dir.path());
    let mut host = Client::connect(&s.ws, Some(ORIGIN)).await.unwrap();
    host.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": host_token}))
        .await;
    let v = host.recv().await;
    let roster: Vec<(String, String)> = v["players"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = players
        .iter()
        .map(|(id, _, n)| (id.clone(), n.to_string()))
        .collect();
    assert_eq!(roster, expected, "the same roster, in join order");
    let mut clients = Vec::new();
    for (id, token, name) in &players {
        let (c, v) = rejoin(&s.ws, &pin, token).await;
        assert_eq!(
            (v["playerId"].as_str(), v["name"].as_str()),
            (Some(id.as_str()), Some(*name))
        );
        assert_eq!(host.recv().await["event"], "connect");
        clients.push(c);
    }
    let r = reqwest::get(format!("{}/api/rooms/{pin}/bundle", s.http))
        .await
        .unwrap();
    assert_eq!(
        r.headers()["x-bundle-version"],
        version.to_string().as_str()
    );
    // Forwarding goes on both ways.
    for (i, (id, _, _)) in players.iter().enumerate() {
        host.send(json!({"t": "to", "to": id, "data": i})).await;
        assert_eq!(clients[i].recv().await, json!({"t": "data", "data": i}));
        clients[i]
            .send(json!({"t": "up", "data": format!("from {i}")}))
            .await;
        assert_eq!(
            host.recv().await,
            json!({"t": "from", "from": id, "data": format!("from {i}")})
        );
    }
    s.process.kill_9();
}

/// The first CPU this process may run on.
fn one_core() -> usize {
    // SAFETY: sched_getaffinity fills a zeroed, correctly sized set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .find(|&c| libc::CPU_ISSET(c, &set))
            .expect("a CPU to run on")
    }
}

#[tokio::test]
async fn on_one_core_the_server_relays_and_stops_cleanly_on_sigterm() {
    use std::os::unix::process::CommandExt;
    let dir = temp_dir("one-core");
    let core = one_core();
    let mut command = Command::new(env!("CARGO_BIN_EXE_hostwire"));
    // SAFETY: the closure only calls sched_setaffinity, which is
    // async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(core, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // With one core the server runs on the single-threaded runtime.
    let mut s = spawn_server_with(dir.path(), command);
    let (mut host, pin, _) = host_room(&s).await;
    let mut p = Client::connect(&s.ws, Some(ORIGIN)).await.unwrap();
    p.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "Solo"}))
        .await;
    let id = p.recv().await["playerId"].as_str().unwrap().to_owned();
    host.recv().await;
    host.send(json!({"t": "to", "to": id, "data": {"q": 1}}))
        .await;
    assert_eq!(p.recv().await, json!({"t": "data", "data": {"q": 1}}));

    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(s.process.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(host.ended().await, Ended::Closed(1001));
    assert_eq!(p.ended().await, Ended::Closed(1001));
    assert!(s.process.child.wait().unwrap().success());
}

#[test]
fn a_second_server_on_the_same_data_directory_refuses_to_start() {
    let dir = temp_dir("locked");
    let mut first = spawn_server(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_hostwire"))
        .args(["serve", "--port", "0", "--host", "127.0.0.1"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the second server started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another hostwire server is using the data directory"),
        "{err}"
    );
    first.process.kill_9();
}
