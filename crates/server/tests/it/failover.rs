//! Relay rooms owned through leases on a real PostgreSQL, with real
//! `hostwire serve` processes: the owner `kill -9`ed mid-game (another node
//! takes the room over once its lease has run out, and the host and the
//! players go on there with nothing acknowledged lost), an owner paused
//! past its lease (its late write is fenced, changes nothing, and its
//! clients are closed with 1012 so that they reconnect), and SIGTERM
//! (the leases are released: another node serves the room at once).
//!
//! Time is never waited for by sleeping: outcomes are polled for with a
//! deadline, and the paused owner's lease is run out on the database's
//! clock.

use crate::support::process::Process;
use crate::support::relay::{temp_dir, Client, ORIGIN};
use crate::support::server::GUARD;
use futures_util::StreamExt;
use hostwire_store::lease::LeaseStore;
use hostwire_store::postgres::PgStore;
use hostwire_store::RelayStore;
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// Between two looks at an outcome that is polled for.
const POLL: Duration = Duration::from_millis(50);

/// The close of a client whose room moved to another node.
pub(crate) const CLOSE_ROOM_MOVED: u16 = 1012;
/// The close of a client that asked a node for a room another live node
/// owns.
pub(crate) const CLOSE_ROOM_ELSEWHERE: u16 = 1013;

/// A node on `url` named `id`, its leases lasting `ttl`.
fn node(url: &str, id: &str, ttl: &str, dir: &tempfile::TempDir) -> Process {
    Process::serve(
        dir.path(),
        &["--postgres-url", url, "--node-id", id, "--lease-ttl", ttl],
        &[("ALLOWED_ORIGINS", ORIGIN)],
    )
}

pub(crate) async fn create(p: &Process) -> (String, String) {
    let (status, v) =
        crate::support::http::call("POST", &format!("{}/api/rooms", p.http()), None, None).await;
    assert_eq!(status, 201, "{v}");
    (
        v["pin"].as_str().unwrap().to_owned(),
        v["hostToken"].as_str().unwrap().to_owned(),
    )
}

/// What the first answer to an attach was.
pub(crate) enum Attach {
    /// `hosting` or `joined` (or an error frame), on a live connection.
    Frame(Box<Client>, Value),
    /// The connection was closed with this code before any frame.
    Closed(u16),
}

/// Connects to `p` and sends `frame`.
pub(crate) async fn attach(p: &Process, frame: &Value) -> Attach {
    let mut c = Client::connect(&p.ws("/ws"), Some(ORIGIN)).await.unwrap();
    c.send(frame.clone()).await;
    loop {
        let m = tokio::time::timeout(GUARD, c.ws.next())
            .await
            .expect("no answer to an attach");
        match m {
            Some(Ok(Message::Text(t))) => {
                return Attach::Frame(Box::new(c), serde_json::from_str(&t).unwrap())
            }
            Some(Ok(Message::Close(f))) => {
                return Attach::Closed(f.map_or(1005, |f| u16::from(f.code)))
            }
            Some(Ok(_)) => continue,
            other => panic!("the connection broke: {other:?}"),
        }
    }
}

/// Attaches with `frame` to `p` until it answers `want` (the room's node
/// may still refuse it with 1013 while the old owner's lease runs), within
/// [`GUARD`] twice; the client and its answer.
pub(crate) async fn attach_until(p: &Process, frame: Value, want: &str) -> (Client, Value) {
    let deadline = tokio::time::Instant::now() + GUARD * 2;
    loop {
        match attach(p, &frame).await {
            Attach::Frame(c, v) if v["t"] == want => return (*c, v),
            Attach::Frame(_, v) => panic!("{frame} answered {v}"),
            Attach::Closed(code) => {
                assert_eq!(code, CLOSE_ROOM_ELSEWHERE, "{frame}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{frame}: still refused"
                );
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

pub(crate) fn host_frame(pin: &str, token: &str) -> Value {
    json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token})
}

pub(crate) fn join_frame(pin: &str, name: &str, token: Option<&str>) -> Value {
    let mut f = json!({"t": "join", "protocol": 1, "pin": pin, "name": name});
    if let Some(t) = token {
        f["token"] = json!(t);
    }
    f
}

/// Reads `c` until a frame of type `t` (presence frames and the like
/// skipped).
pub(crate) async fn until_frame(c: &mut Client, t: &str) -> Value {
    loop {
        let v = c.recv().await;
        if v["t"] == t {
            return v;
        }
    }
}

pub(crate) async fn info(p: &Process, pin: &str) -> (u16, Value) {
    crate::support::http::call("GET", &format!("{}/api/rooms/{pin}", p.http()), None, None).await
}

pub(crate) async fn metric(p: &Process, name: &str) -> u64 {
    crate::support::http::metric(&p.http(), name).await
}

pub(crate) async fn upload(p: &Process, pin: &str, token: &str, app: &str) -> Value {
    let html =
        format!(r#"<script type="application/oqse-manifest+json">{{"appName":"{app}"}}</script>"#);
    let (status, v) = crate::support::http::call(
        "PUT",
        &format!("{}/api/rooms/{pin}/bundle", p.http()),
        Some(token),
        Some(&json!({"pluginHtml": html, "set": {"items": []}})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

pub(crate) fn signal(p: &Process, sig: libc::c_int) {
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(p.child.id() as libc::pid_t, sig) }, 0);
}

#[tokio::test]
async fn the_owner_killed_mid_game_its_room_goes_on_on_another_node_with_nothing_acknowledged_lost()
{
    let Some(url) = hostwire_store::testing::fresh_database("failover_kill") else {
        return;
    };
    let dirs = [temp_dir("fo-a"), temp_dir("fo-b"), temp_dir("fo-c")];
    // 2 s: a renewal every 667 ms keeps it under a loaded machine's stalls.
    let mut a = node(&url, "a", "2s", &dirs[0]);
    let b = node(&url, "b", "1s", &dirs[1]);
    let c = node(&url, "c", "1s", &dirs[2]);
    let (pin, token) = create(&a).await;
    let (mut host, v) = attach_until(&a, host_frame(&pin, &token), "hosting").await;
    assert_eq!(v["players"], json!([]), "{v}");
    let (mut ann, ann_v) = attach_until(&a, join_frame(&pin, "Ann", None), "joined").await;
    let (_bob, bob_v) = attach_until(&a, join_frame(&pin, "Bob", None), "joined").await;
    let (_eve, eve_v) = attach_until(&a, join_frame(&pin, "Eve", None), "joined").await;
    host.send(json!({"t": "kick", "playerId": eve_v["playerId"]}))
        .await;
    loop {
        let p = until_frame(&mut host, "presence").await;
        if p["event"] == "leave" {
            break;
        }
    }
    assert_eq!(upload(&a, &pin, &token, "Quiz").await["version"], 1);
    assert_eq!(upload(&a, &pin, &token, "Quiz 2").await["version"], 2);
    // Mid-game: the host's frames reach a player.
    host.send(json!({"t": "to", "to": ann_v["playerId"], "data": {"k": "state", "n": 1}}))
        .await;
    assert_eq!(until_frame(&mut ann, "data").await["data"]["n"], 1);
    // A live owner's room is refused elsewhere, clearly.
    let (status, v) = info(&c, &pin).await;
    assert_eq!(status, 503, "{v}");
    assert!(v["error"].as_str().unwrap().contains("another node"), "{v}");
    match attach(&c, &join_frame(&pin, "Zed", None)).await {
        Attach::Closed(code) => assert_eq!(code, CLOSE_ROOM_ELSEWHERE),
        Attach::Frame(_, v) => panic!("a join on a node that does not own the room: {v}"),
    }
    // c's sweep would race b for the room once a's lease runs out: b is
    // the one node left to take it, so the test knows where it goes.
    drop(c);

    a.kill_9();

    // The host reconnects (through a load balancer: to b), and b takes the
    // room over once a's lease has run out.
    let (mut host, v) = attach_until(&b, host_frame(&pin, &token), "hosting").await;
    let mut ids: Vec<&str> = v["players"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    ids.sort();
    let mut want = vec![
        ann_v["playerId"].as_str().unwrap(),
        bob_v["playerId"].as_str().unwrap(),
    ];
    want.sort();
    assert_eq!(ids, want, "{v}");
    // The players come back with their tokens, as the same players.
    let (mut ann, v) = attach_until(
        &b,
        join_frame(&pin, "Ann", ann_v["token"].as_str()),
        "joined",
    )
    .await;
    assert_eq!(v["playerId"], ann_v["playerId"], "{v}");
    let (_bob, v) = attach_until(
        &b,
        join_frame(&pin, "Bob", bob_v["token"].as_str()),
        "joined",
    )
    .await;
    assert_eq!(v["playerId"], bob_v["playerId"], "{v}");
    // The kicked one stays kicked.
    match attach(&b, &join_frame(&pin, "Eve", eve_v["token"].as_str())).await {
        Attach::Frame(_, v) => assert_eq!(v["code"], "KICKED", "{v}"),
        Attach::Closed(code) => panic!("closed {code}"),
    }
    // The last acknowledged upload is served.
    let bundle = reqwest::get(format!("{}/api/rooms/{pin}/bundle", b.http()))
        .await
        .unwrap();
    assert_eq!(bundle.headers()["x-bundle-version"], "2");
    assert!(bundle.text().await.unwrap().contains("Quiz 2"));
    let (status, v) = info(&b, &pin).await;
    assert_eq!((status, &v["appName"]), (200, &json!("Quiz 2")), "{v}");
    // And the game goes on.
    host.send(json!({"t": "to", "to": ann_v["playerId"], "data": {"k": "state", "n": 2}}))
        .await;
    assert_eq!(until_frame(&mut ann, "data").await["data"]["n"], 2);
    ann.send(json!({"t": "up", "data": {"answer": 42}})).await;
    assert_eq!(until_frame(&mut host, "from").await["data"]["answer"], 42);

    assert_eq!(
        metric(&b, "hostwire_cluster_leases_taken_over_total").await,
        1
    );
    assert_eq!(metric(&b, "hostwire_cluster_units_owned").await, 1);
    let (status, h) =
        crate::support::http::call("GET", &format!("{}/api/health", b.http()), None, None).await;
    assert_eq!(status, 200);
    assert_eq!(h["node"], "b", "{h}");
    assert_eq!(h["units"]["owned"], 1, "{h}");
    assert_eq!(h["units"]["list"][0]["key"], json!(pin), "{h}");
    assert_eq!(h["units"]["list"][0]["generation"], 2, "{h}");
}

/// Runs out every live lease on the database's clock: what a pause past
/// the lease looks like to the other nodes, without waiting for it.
pub(crate) async fn run_out_leases(url: &str) {
    let url = url.to_owned();
    // The synchronous client runs its own runtime: off this one.
    hostwire::blocking::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.execute(
            "UPDATE unit_leases SET expires_at = now() - INTERVAL '1 second' WHERE owner IS NOT NULL",
            &[],
        )
        .unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_paused_owner_past_its_lease_is_fenced_changes_nothing_and_moves_its_clients() {
    let Some(url) = hostwire_store::testing::fresh_database("failover_pause") else {
        return;
    };
    let dirs = [temp_dir("fp-a"), temp_dir("fp-b")];
    // a renews only every 20 s: after it wakes, its next act is the
    // client's write, not a renewal.
    let a = node(&url, "a", "60s", &dirs[0]);
    let b = node(&url, "b", "1s", &dirs[1]);
    let (pin, token) = create(&a).await;
    let (mut host, _) = attach_until(&a, host_frame(&pin, &token), "hosting").await;
    let (mut ann, _) = attach_until(&a, join_frame(&pin, "Ann", None), "joined").await;

    signal(&a, libc::SIGSTOP);
    run_out_leases(&url).await;
    // b takes the room over when asked, and a new player joins there.
    let (status, v) = info(&b, &pin).await;
    assert_eq!((status, &v["players"]), (200, &json!(1)), "{v}");
    let (_bob, _) = attach_until(&b, join_frame(&pin, "Bob", None), "joined").await;
    signal(&a, libc::SIGCONT);

    // a's host closes the room to new players: a write a must not make.
    host.send(json!({"t": "open", "open": false})).await;
    assert_eq!(
        host.ended().await,
        crate::support::ws::Ended::Closed(CLOSE_ROOM_MOVED)
    );
    assert_eq!(
        ann.ended().await,
        crate::support::ws::Ended::Closed(CLOSE_ROOM_MOVED)
    );
    assert_eq!(metric(&a, "hostwire_cluster_leases_lost_total").await, 1);
    assert_eq!(metric(&a, "hostwire_cluster_units_owned").await, 0);

    // The database has b's room as b left it: open, with both players.
    let store = PgStore::connect(&url).unwrap();
    let room = store.load_room(&pin).unwrap().expect("the room is stored");
    assert!(room.record.open, "the fenced write changed the room");
    assert_eq!(room.record.players.len(), 2, "{:?}", room.record.players);
    let owners = store.owned_by("b").unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].generation, 2);
    // a answers nothing more for the room: b holds it.
    let (status, v) = info(&a, &pin).await;
    assert_eq!(status, 503, "{v}");
}

#[tokio::test]
async fn sigterm_releases_the_leases_and_another_node_serves_the_room_at_once() {
    let Some(url) = hostwire_store::testing::fresh_database("failover_term") else {
        return;
    };
    let dirs = [temp_dir("ft-a"), temp_dir("ft-b")];
    // Leases far longer than the test: only a release lets b take over.
    let mut a = node(&url, "a", "60s", &dirs[0]);
    let b = node(&url, "b", "60s", &dirs[1]);
    let (pin, token) = create(&a).await;
    let (mut host, _) = attach_until(&a, host_frame(&pin, &token), "hosting").await;
    let (_ann, ann_v) = attach_until(&a, join_frame(&pin, "Ann", None), "joined").await;
    let (status, _) = info(&b, &pin).await;
    assert_eq!(status, 503, "a holds the room");

    assert!(a.sigterm().success());
    assert_eq!(host.ended().await, crate::support::ws::Ended::Closed(1001));
    let (_host, v) = attach_until(&b, host_frame(&pin, &token), "hosting").await;
    assert_eq!(v["players"][0]["id"], ann_v["playerId"], "{v}");
    assert_eq!(
        metric(&b, "hostwire_cluster_leases_taken_over_total").await,
        1
    );
}

/// Polls `p`'s metric `name` until `ok` holds, within [`GUARD`].
async fn metric_until(p: &Process, name: &str, ok: impl Fn(u64) -> bool) -> u64 {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let v = metric(p, name).await;
        if ok(v) {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name}: {v}");
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test]
async fn a_live_owner_keeps_its_room_by_renewing_and_a_dead_ones_room_is_taken_over_unasked() {
    let Some(url) = hostwire_store::testing::fresh_database("failover_sweep") else {
        return;
    };
    let dirs = [temp_dir("fs-a"), temp_dir("fs-b")];
    // 2 s: a renewal every 667 ms keeps it under a loaded machine's stalls.
    let mut a = node(&url, "a", "2s", &dirs[0]);
    let b = node(&url, "b", "1s", &dirs[1]);
    let (pin, _) = create(&a).await;
    // Renewed past three lease lengths (a renewal every third of one),
    // and b never took the room meanwhile.
    metric_until(&a, "hostwire_cluster_leases_renewed_total", |n| n >= 9).await;
    assert_eq!(metric(&b, "hostwire_cluster_units_owned").await, 0);
    assert_eq!(metric(&a, "hostwire_cluster_units_owned").await, 1);

    a.kill_9();
    // Nobody asks for the room: b's sweep takes it over (its expiry timer
    // must run somewhere).
    metric_until(&b, "hostwire_cluster_leases_taken_over_total", |n| n == 1).await;
    assert_eq!(metric(&b, "hostwire_cluster_units_owned").await, 1);
    let (status, v) = info(&b, &pin).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test]
async fn serve_help_names_the_lease_ttl_and_a_bad_one_stops_the_start_naming_it() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire"))
        .args(["serve", "--help"])
        .output()
        .await
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("--lease-ttl"), "{help}");
    assert!(
        help.contains("[env: HOSTWIRE_LEASE_TTL=]") || help.contains("[env: HOSTWIRE_LEASE_TTL]"),
        "{help}"
    );
    assert!(help.contains("[default: 5s]"), "{help}");
    for bad in ["0s", "100ms", "soon"] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire"))
            .args(["serve", "--port", "0", "--lease-ttl", bad])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}");
        assert!(stderr.contains("--lease-ttl"), "{bad}: {stderr}");
    }
}

#[tokio::test]
async fn a_stopped_nodes_rooms_are_taken_over_though_nobody_asks_for_them() {
    let Some(url) = hostwire_store::testing::fresh_database("failover_handover") else {
        return;
    };
    let dirs = [temp_dir("fh-a"), temp_dir("fh-b")];
    let mut a = node(&url, "a", "60s", &dirs[0]);
    // b's sweep runs every third of its lease.
    let b = node(&url, "b", "1s", &dirs[1]);
    let (pin, _) = create(&a).await;
    assert!(a.sigterm().success());
    // No client comes back: b's sweep takes the room so that its timers
    // (its expiry) run somewhere.
    metric_until(&b, "hostwire_cluster_units_owned", |n| n == 1).await;
    let store = PgStore::connect(&url).unwrap();
    let owners = store.owned_by("b").unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].key, pin);
}
