//! A change is acknowledged, in memory and to clients, only once it is
//! durable: with the real SQLite file made to fail for one room (triggers
//! that abort its writes, as a full disk would), a kick, `open:false`, a
//! close, a join, a rename and a bundle upload are refused with
//! `INTERNAL_ERROR` / 503 and change nothing; after a restart exactly the
//! acknowledged changes are there. And bundle bytes being sent count
//! against the bundle memory bound.

use crate::support::relay::*;
use serde_json::{json, Value};
use std::path::Path;

/// Makes every write of room `pin` fail inside SQLite (the server's own
/// transaction sees the error), until [`heal`].
fn fail_writes(db: &Path, pin: &str) {
    let c = rusqlite::Connection::open(db).unwrap();
    for (name, event, table) in [
        ("u", "UPDATE", "relay_rooms"),
        ("d", "DELETE", "relay_rooms"),
        ("pi", "INSERT", "relay_players"),
        ("pu", "UPDATE", "relay_players"),
        ("pd", "DELETE", "relay_players"),
        ("k", "INSERT", "relay_kicked"),
    ] {
        let row = if event == "DELETE" { "OLD" } else { "NEW" };
        c.execute_batch(&format!(
            "CREATE TRIGGER fail_{name}_{pin} BEFORE {event} ON {table}
             WHEN {row}.pin = '{pin}' BEGIN SELECT RAISE(ABORT, 'disk full (injected)'); END;"
        ))
        .unwrap();
    }
}

fn heal(db: &Path, pin: &str) {
    let c = rusqlite::Connection::open(db).unwrap();
    for name in ["u", "d", "pi", "pu", "pd", "k"] {
        c.execute_batch(&format!("DROP TRIGGER fail_{name}_{pin};"))
            .unwrap();
    }
}

async fn restart(t: &mut TestRelay) -> TestRelay {
    t.stop().await;
    TestRelay::start_at(config(), t.db.clone(), t.clock.clone()).await
}

async fn join_with(t: &TestRelay, pin: &str, token: &str) -> (Client, Value) {
    let mut c = t.client().await;
    c.send(json!({"t": "join", "protocol": 1, "pin": pin, "token": token}))
        .await;
    let v = c.recv().await;
    (c, v)
}

async fn expect_not_stored(c: &mut Client, what: &str) {
    let e = c.expect_error("INTERNAL_ERROR", false).await;
    let m = e["message"].as_str().unwrap();
    assert!(m.contains(what), "{m}");
}

#[tokio::test]
async fn a_kick_is_acknowledged_only_once_stored_and_only_an_acknowledged_kick_survives() {
    let mut t = TestRelay::start(config()).await;
    let (mut host, pin, host_token) = t.host().await;
    let (mut a, a_id, a_token) = t.player(&pin, "Ann").await;
    let (mut b, b_id, b_token) = t.player(&pin, "Bob").await;
    host.recv().await;
    host.recv().await;

    fail_writes(&t.db, &pin);
    host.send(json!({"t": "kick", "playerId": a_id})).await;
    expect_not_stored(&mut host, "kick").await;
    // Not kicked: Ann is still reachable and the host was told nothing else.
    host.send(json!({"t": "to", "to": a_id, "data": "still here"}))
        .await;
    assert_eq!(a.recv().await["data"], "still here");
    assert!(host.until_pong().await.is_empty());

    heal(&t.db, &pin);
    host.send(json!({"t": "kick", "playerId": b_id})).await;
    assert_eq!(b.recv().await, json!({"t": "closed", "reason": "kicked"}));
    assert_eq!(host.recv().await["event"], "leave");

    let t2 = restart(&mut t).await;
    let (_a2, v) = join_with(&t2, &pin, &a_token).await;
    assert_eq!(
        (v["t"].as_str(), v["playerId"].as_str()),
        (Some("joined"), Some(a_id.as_str())),
        "the kick that was refused is not in the store: {v}"
    );
    let (mut b2, _) = (t2.client().await, ());
    b2.send(json!({"t": "join", "protocol": 1, "pin": pin, "token": b_token}))
        .await;
    b2.expect_error("KICKED", true).await;
    let _ = host_token;
}

#[tokio::test]
async fn open_false_and_close_are_acknowledged_only_once_stored() {
    let mut t = TestRelay::start(config()).await;
    let (mut host, pin, host_token) = t.host().await;
    let (mut a, _, _) = t.player(&pin, "Ann").await;
    host.recv().await;

    fail_writes(&t.db, &pin);
    host.send(json!({"t": "open", "open": false})).await;
    expect_not_stored(&mut host, "\"open\"").await;
    host.send(json!({"t": "close"})).await;
    expect_not_stored(&mut host, "closed").await;
    // Still open, in memory and on disk; nobody was told it closed.
    assert!(a.until_pong().await.is_empty());
    let info: Value = reqwest::get(format!("{}/api/rooms/{pin}", t.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["open"], true);
    heal(&t.db, &pin);
    let (_n, _, _) = t.player(&pin, "New").await;
    host.recv().await;

    // A restart keeps the room open: neither change was acknowledged.
    let mut t2 = restart(&mut t).await;
    let (_, _, _) = t2.player(&pin, "After").await;
    // Acknowledged now: both survive the next restart.
    let mut host = t2.client().await;
    host.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": host_token}))
        .await;
    assert_eq!(host.recv().await["t"], "hosting");
    host.send(json!({"t": "open", "open": false})).await;
    assert!(host.until_pong().await.is_empty(), "no error this time");
    let t3 = restart(&mut t2).await;
    let mut n = t3.client().await;
    n.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "Late"}))
        .await;
    n.expect_error("ROOM_CLOSED", true).await;
    let mut host = t3.client().await;
    host.send(json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": host_token}))
        .await;
    assert_eq!(host.recv().await["t"], "hosting");
    host.send(json!({"t": "close"})).await;
    assert_eq!(host.recv().await, json!({"t": "closed", "reason": "host"}));
    let mut t3 = t3;
    let t4 = restart(&mut t3).await;
    let r = reqwest::get(format!("{}/api/rooms/{pin}", t4.http))
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the acknowledged close survived");
}

#[tokio::test]
async fn a_join_or_rename_the_store_refuses_is_told_and_changes_nothing() {
    let mut t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, a_token) = t.player(&pin, "Ann").await;
    host.recv().await;
    fail_writes(&t.db, &pin);
    let mut n = t.client().await;
    n.send(json!({"t": "join", "protocol": 1, "pin": pin, "name": "New"}))
        .await;
    expect_not_stored(&mut n, "join").await;
    // Not a fatal error: the client reconnects and joins again.
    assert_eq!(n.ended().await, Ended::Closed(1011));
    a.send(json!({"t": "rename", "name": "Anna"})).await;
    expect_not_stored(&mut a, "name").await;
    assert!(host.until_pong().await.is_empty(), "no join, no rename");
    let info: Value = reqwest::get(format!("{}/api/rooms/{pin}", t.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["players"], 1);
    heal(&t.db, &pin);
    let t2 = restart(&mut t).await;
    let (_, v) = join_with(&t2, &pin, &a_token).await;
    assert_eq!(
        (v["playerId"].as_str(), v["name"].as_str()),
        (Some(a_id.as_str()), Some("Ann"))
    );
}

async fn put(t: &TestRelay, pin: &str, token: &str, app: &str) -> reqwest::Response {
    let html =
        format!(r#"<script type="application/oqse-manifest+json">{{"appName":"{app}"}}</script>"#);
    reqwest::Client::new()
        .put(format!("{}/api/rooms/{pin}/bundle", t.http))
        .header("Authorization", format!("Bearer {token}"))
        .body(json!({"pluginHtml": html, "set": {"items": []}}).to_string())
        .send()
        .await
        .unwrap()
}

async fn served(t: &TestRelay, pin: &str) -> (String, String) {
    let r = reqwest::get(format!("{}/api/rooms/{pin}/bundle", t.http))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v = r.headers()["x-bundle-version"].to_str().unwrap().to_owned();
    let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    (v, body["pluginHtml"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_bundle_the_store_refuses_is_503_the_old_one_is_served_and_its_version_is_never_reused() {
    let mut t = TestRelay::start(config()).await;
    let (pin, token) = t.create_room().await;
    let r = put(&t, &pin, &token, "One").await;
    assert_eq!(r.json::<Value>().await.unwrap()["version"], 1);

    fail_writes(&t.db, &pin);
    let r = put(&t, &pin, &token, "Two").await;
    assert_eq!(r.status(), 503);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"].as_str().unwrap().contains("could not be stored"),
        "{e}"
    );
    let (v, html) = served(&t, &pin).await;
    assert_eq!(v, "1");
    assert!(html.contains("One"), "{html}");
    let info: Value = reqwest::get(format!("{}/api/rooms/{pin}", t.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["appName"], "One");

    heal(&t.db, &pin);
    let r = put(&t, &pin, &token, "Three").await;
    assert_eq!(r.status(), 200);
    let fresh = r.json::<Value>().await.unwrap()["version"]
        .as_u64()
        .unwrap();
    assert!(fresh > 2, "version 2 was tried with other content: {fresh}");
    let (v, html) = served(&t, &pin).await;
    assert_eq!(v, fresh.to_string());
    assert!(html.contains("Three"), "{html}");

    // From the store after a restart (rooms load without their bundles).
    let t2 = restart(&mut t).await;
    let (v, html) = served(&t2, &pin).await;
    assert_eq!(v, fresh.to_string());
    assert!(html.contains("Three"));
    let r = put(&t2, &pin, &token, "Four").await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["version"].as_u64(),
        Some(fresh + 1)
    );
}

/// Polls a condition the server reaches by itself (not a wait for time).
async fn until(mut f: impl FnMut() -> bool) {
    tokio::time::timeout(GUARD, async {
        while !f() {
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the condition never held");
}

#[tokio::test]
async fn two_rooms_in_one_batch_one_failing_the_other_durable() {
    let mut t = TestRelay::start(config()).await;
    let (mut h1, pin1, _) = t.host().await;
    let (_a1, a1_id, a1_token) = t.player(&pin1, "Ann").await;
    let (mut h2, pin2, _) = t.host().await;
    let (mut a2, a2_id, a2_token) = t.player(&pin2, "Bob").await;
    h1.recv().await;
    h2.recv().await;
    fail_writes(&t.db, &pin1);

    // Another connection holds the database's write lock: the writer takes
    // a room creation into a batch and waits in it, while the two kicks
    // queue behind it, to be written together in the next batch.
    let lock = rusqlite::Connection::open(&t.db).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE;").unwrap();
    let creation = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{}/api/rooms", t.http))
            .send(),
    );
    let relay = t.relay();
    until(|| relay.store_batch_len() == 1 && relay.store_queue_len() == 0).await;
    h1.send(json!({"t": "kick", "playerId": a1_id})).await;
    h2.send(json!({"t": "kick", "playerId": a2_id})).await;
    until(|| relay.store_queue_len() == 2).await;
    lock.execute_batch("ROLLBACK;").unwrap();

    expect_not_stored(&mut h1, "kick").await;
    assert_eq!(h2.recv().await["event"], "leave");
    assert_eq!(a2.recv().await["reason"], "kicked");
    assert_eq!(creation.await.unwrap().unwrap().status(), 201);
    heal(&t.db, &pin1);
    let t2 = restart(&mut t).await;
    let (_, v) = join_with(&t2, &pin1, &a1_token).await;
    assert_eq!(v["t"], "joined", "{v}");
    let mut b = t2.client().await;
    b.send(json!({"t": "join", "protocol": 1, "pin": pin2, "token": a2_token}))
        .await;
    b.expect_error("KICKED", true).await;
}

#[tokio::test]
async fn a_host_away_time_the_store_refused_is_written_again_at_the_next_sweep() {
    let mut t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, _, _) = t.player(&pin, "Ann").await;
    host.recv().await;
    fail_writes(&t.db, &pin);
    host.ws.close(None).await.unwrap();
    // The room has queued the host-away time once the player is told.
    assert_eq!(a.recv().await["t"], "host-presence");
    let relay = t.relay();
    until(|| relay.store_queue_len() == 0 && relay.store_batch_len() == 0).await;
    heal(&t.db, &pin);
    t.clock.advance_ms(5 * 60 * 1000);
    t.relay().sweep().await;

    // The host has been away since T0: after a restart the room expires
    // 10 minutes after T0, not 10 minutes after the restart.
    let t2 = restart(&mut t).await;
    t2.clock.advance_ms(5 * 60 * 1000);
    t2.relay().sweep().await;
    assert_eq!(
        reqwest::get(format!("{}/api/rooms/{pin}", t2.http))
            .await
            .unwrap()
            .status(),
        200,
        "exactly 10 minutes is not past the limit"
    );
    t2.clock.advance_ms(1);
    t2.relay().sweep().await;
    assert_eq!(
        reqwest::get(format!("{}/api/rooms/{pin}", t2.http))
            .await
            .unwrap()
            .status(),
        404
    );
}

/// A bundle body of `n` bytes.
fn big_bundle(n: usize) -> String {
    let head = r#"{"pluginHtml":"<p>","set":{"pad":""#;
    let mut s = String::with_capacity(n);
    s.push_str(head);
    s.push_str(&"x".repeat(n - head.len() - 3));
    s.push_str(r#""}}"#);
    s
}

#[tokio::test(start_paused = true)]
async fn bundle_bytes_being_sent_count_against_the_bundle_memory_bound() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The smallest budget: one bundle.
    let t = TestRelay::start(hostwire::relay::RelayConfig {
        server_limits: hostwire::relay::ServerLimits {
            bundle_cache_bytes: 0,
            ..hostwire::relay::SERVER_LIMITS
        },
        ..config()
    })
    .await;
    let n = hostwire_memizy::RELAY_LIMITS.bundle_bytes - 1024;
    let mut pins = Vec::new();
    for _ in 0..2 {
        let (pin, token) = t.create_room().await;
        let r = reqwest::Client::new()
            .put(format!("{}/api/rooms/{pin}/bundle", t.http))
            .header("Authorization", format!("Bearer {token}"))
            .body(big_bundle(n))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        pins.push(pin);
    }
    // A client that asks for the first bundle and does not read it: its
    // bytes stay in memory, being sent.
    let addr: std::net::SocketAddr = t.http.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut slow = socket.connect(addr).await.unwrap();
    slow.write_all(
        format!(
            "GET /api/rooms/{}/bundle HTTP/1.1\r\nHost: x\r\nOrigin: {ORIGIN}\r\n\r\n",
            pins[0]
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut first = [0u8; 12];
    slow.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    // No room for the second: it waits (10 s, on the paused clock), then 503.
    let r = reqwest::get(format!("{}/api/rooms/{}/bundle", t.http, pins[1]))
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"].as_str().unwrap().contains("BUNDLE_CACHE_BYTES"),
        "{e}"
    );
    // Once the slow client has its bundle, the second is served.
    let mut rest = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while rest.len() < n {
        let k = slow.read(&mut buf).await.unwrap();
        assert!(k > 0, "the first download ended early");
        rest.extend_from_slice(&buf[..k]);
    }
    let r = reqwest::get(format!("{}/api/rooms/{}/bundle", t.http, pins[1]))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), n);
}

#[tokio::test]
async fn forwarding_goes_on_while_a_change_of_the_room_is_being_stored() {
    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, a_id, _) = t.player(&pin, "Ann").await;
    let (mut b, b_id, _) = t.player(&pin, "Bob").await;
    host.recv().await;
    host.recv().await;
    // The database's write lock is held elsewhere: the kick waits in the
    // writer, unanswered.
    let lock = rusqlite::Connection::open(&t.db).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE;").unwrap();
    host.send(json!({"t": "kick", "playerId": a_id})).await;
    let relay = t.relay();
    until(|| relay.store_batch_len() == 1).await;
    // Players' frames go ahead of it, as if sent just before the kick.
    b.send(json!({"t": "up", "data": "from Bob"})).await;
    assert_eq!(host.recv().await["data"], "from Bob");
    a.send(json!({"t": "up", "data": "from Ann"})).await;
    assert_eq!(host.recv().await["data"], "from Ann");
    // The host's own next frame waits for its kick.
    host.send(json!({"t": "to", "to": b_id, "data": "after the kick"}))
        .await;
    lock.execute_batch("ROLLBACK;").unwrap();
    assert_eq!(host.recv().await["event"], "leave");
    assert_eq!(a.recv().await["reason"], "kicked");
    assert_eq!(b.recv().await["data"], "after the kick");
}
