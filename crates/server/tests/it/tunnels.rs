//! Any node serves any client: three real `hostwire serve` processes on
//! one PostgreSQL and one real `nats-server`. A client that reaches a node
//! which does not own its unit is carried to the owner over NATS and plays
//! as on one server; the owner `kill -9`ed, the carried clients are closed
//! with 1012, reconnect, and go on where the room was taken over.
//!
//! Time is never waited for by sleeping: outcomes are polled for with a
//! deadline.

use crate::cluster::Nats;
use crate::failover::{
    attach, attach_until, create, host_frame, info, join_frame, metric, until_frame, upload, Attach,
};
use crate::support::process::Process;
use crate::support::relay::{temp_dir, Client, ORIGIN};
use crate::support::server::GUARD;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// The ggui app of these tests, with its agent credential.
const GGUI_APP: &str = "notes=notes-agent-credential-0123456789";

/// A ggui agent API call on `p`.
async fn ggui(p: &Process, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    crate::support::http::call(
        method,
        &format!("{}/ggui/sessions/{path}", p.http()),
        Some("notes-agent-credential-0123456789"),
        body.as_ref(),
    )
    .await
}

/// A node `id` on PostgreSQL `url` and `nats`, its leases lasting `ttl`.
fn node(url: &str, nats: &Nats, id: &str, ttl: &str, dir: &tempfile::TempDir) -> Process {
    Process::serve(
        dir.path(),
        &[
            "--postgres-url",
            url,
            "--nats-url",
            &nats.url(),
            "--node-id",
            id,
            "--lease-ttl",
            ttl,
        ],
        &[
            ("GGUI_APPS", GGUI_APP),
            ("ALLOWED_ORIGINS", ORIGIN),
            ("HOSTWIRE_OPERATOR_TOKEN", crate::support::server::OPERATOR),
        ],
    )
}

async fn health(p: &Process) -> Value {
    crate::support::http::call("GET", &format!("{}/api/health", p.http()), None, None)
        .await
        .1
}

/// Waits until each node lists the others as peers (the owner must be
/// heard of before a client can be carried to it).
pub(crate) async fn until_peers(nodes: &[&Process]) {
    let deadline = tokio::time::Instant::now() + GUARD;
    for p in nodes {
        loop {
            let h = health(p).await;
            if h["peers"].as_array().map_or(0, Vec::len) == nodes.len() - 1 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "peers: {h}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// The close code `c` ends with (frames before it skipped).
async fn closed_with(c: &mut Client) -> u16 {
    loop {
        match tokio::time::timeout(GUARD, c.ws.next()).await {
            Ok(Some(Ok(Message::Close(f)))) => return f.map_or(1005, |f| u16::from(f.code)),
            Ok(Some(Ok(_))) => continue,
            other => panic!("no close: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_relay_game_with_the_host_on_one_node_and_players_on_two_others() {
    let Some(url) = hostwire_store::testing::fresh_database("tunnel_relay") else {
        return;
    };
    let Some(nats) = Nats::start("tunnel_relay") else {
        return;
    };
    let dirs = [temp_dir("tn-a"), temp_dir("tn-b"), temp_dir("tn-c")];
    let mut a = node(&url, &nats, "a", "2s", &dirs[0]);
    let b = node(&url, &nats, "b", "2s", &dirs[1]);
    let c = node(&url, &nats, "c", "2s", &dirs[2]);
    until_peers(&[&a, &b, &c]).await;
    let (pin, token) = create(&a).await;
    let (mut host, _) = attach_until(&a, host_frame(&pin, &token), "hosting").await;
    // Ann reaches b and Bob reaches c: both are carried to a.
    let (mut ann, ann_v) = attach_until(&b, join_frame(&pin, "Ann", None), "joined").await;
    let (mut bob, bob_v) = attach_until(&c, join_frame(&pin, "Bob", None), "joined").await;
    let joined = until_frame(&mut host, "presence").await;
    assert_eq!(joined["event"], "join", "{joined}");
    // Frames both ways, in order.
    for n in 0..20 {
        host.send(json!({"t": "to", "to": ann_v["playerId"], "data": {"n": n}}))
            .await;
        host.send(json!({"t": "to", "to": bob_v["playerId"], "data": {"n": n}}))
            .await;
    }
    for n in 0..20 {
        assert_eq!(until_frame(&mut ann, "data").await["data"]["n"], n);
        assert_eq!(until_frame(&mut bob, "data").await["data"]["n"], n);
    }
    ann.send(json!({"t": "up", "data": {"answer": 42}})).await;
    let from = until_frame(&mut host, "from").await;
    assert_eq!(
        (&from["from"], &from["data"]["answer"]),
        (&ann_v["playerId"], &json!(42)),
        "{from}"
    );
    bob.send(json!({"t": "up", "data": {"answer": 7}})).await;
    assert_eq!(until_frame(&mut host, "from").await["data"]["answer"], 7);
    // The relay's own answers come back through the tunnel too.
    bob.send(json!({"t": "ping"})).await;
    until_frame(&mut bob, "pong").await;
    // The owner counts the carried clients as its own players, and every
    // node answers the room's API as the owner does.
    for p in [&a, &b, &c] {
        let (status, v) = info(p, &pin).await;
        assert_eq!((status, &v["players"]), (200, &json!(2)), "{v}");
    }
    // A bundle uploaded through b and read through c: bigger than one
    // frame between nodes and than NATS's 1 MB message, the owner's
    // headers kept.
    let big = "x".repeat(3_000_000);
    assert_eq!(upload(&b, &pin, &token, &big).await["version"], 1);
    let bundle = reqwest::get(format!("{}/api/rooms/{pin}/bundle", c.http()))
        .await
        .unwrap();
    assert_eq!(bundle.status(), 200);
    assert_eq!(bundle.headers()["x-bundle-version"], "1");
    assert!(bundle.text().await.unwrap().contains(&big));
    let (status, v) = crate::support::http::call(
        "PUT",
        &format!("{}/api/rooms/{pin}/bundle", c.http()),
        Some("not the host token"),
        Some(&json!({"pluginHtml": "<p>", "set": {"items": []}})),
    )
    .await;
    assert_eq!(status, 403, "the owner's refusal comes back as it is: {v}");
    assert!(metric(&b, "hostwire_cluster_frames_sent_total").await >= 2);
    assert!(metric(&a, "hostwire_cluster_tunnels_accepted_total").await >= 2);
    let h = health(&b).await;
    assert!(
        h["tunnels"]["framesReceived"].as_u64().unwrap() >= 20,
        "{h}"
    );
    // A kick on the owner reaches the carried player with its close.
    host.send(json!({"t": "kick", "playerId": bob_v["playerId"]}))
        .await;
    let kicked = until_frame(&mut bob, "closed").await;
    assert_eq!(kicked["reason"], "kicked", "{kicked}");
    assert_eq!(closed_with(&mut bob).await, 1000, "the relay's own close");

    // The owner dies: the carried client is told to reconnect (1012)
    // within the peer expiry, and finds the room on its new owner.
    a.kill_9();
    assert_eq!(closed_with(&mut ann).await, 1012);
    let (mut host, _) = attach_until(&b, host_frame(&pin, &token), "hosting").await;
    let (mut ann, v) = attach_until(
        &c,
        join_frame(&pin, "Ann", ann_v["token"].as_str()),
        "joined",
    )
    .await;
    assert_eq!(v["playerId"], ann_v["playerId"], "{v}");
    host.send(json!({"t": "to", "to": ann_v["playerId"], "data": "again"}))
        .await;
    assert_eq!(until_frame(&mut ann, "data").await["data"], "again");
}

#[tokio::test]
async fn a_carried_client_is_refused_as_before_when_the_owner_does_not_answer() {
    let Some(url) = hostwire_store::testing::fresh_database("tunnel_refused") else {
        return;
    };
    let Some(nats) = Nats::start("tunnel_refused") else {
        return;
    };
    let dirs = [temp_dir("tr-a"), temp_dir("tr-b")];
    let a = node(&url, &nats, "a", "60s", &dirs[0]);
    let b = node(&url, &nats, "b", "60s", &dirs[1]);
    until_peers(&[&a, &b]).await;
    let (pin, _) = create(&a).await;
    // a paused: its lease is live, but nobody answers the opening.
    crate::failover::signal(&a, libc::SIGSTOP);
    let refused = attach(&b, &join_frame(&pin, "Ann", None)).await;
    crate::failover::signal(&a, libc::SIGCONT);
    match refused {
        Attach::Closed(code) => assert_eq!(code, crate::failover::CLOSE_ROOM_ELSEWHERE),
        Attach::Frame(_, v) => panic!("answered while the owner was paused: {v}"),
    }
    assert_eq!(
        metric(&b, "hostwire_cluster_tunnels_refused_total").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_playerthree_match_is_played_through_nodes_that_do_not_own_it() {
    use crate::support::playerthree::{create_match, mint, PlayerThreeFrames};
    let Some(url) = hostwire_store::testing::fresh_database("tunnel_match") else {
        return;
    };
    let Some(nats) = Nats::start("tunnel_match") else {
        return;
    };
    let dirs = [temp_dir("tm-a"), temp_dir("tm-b"), temp_dir("tm-c")];
    let a = node(&url, &nats, "a", "2s", &dirs[0]);
    let b = node(&url, &nats, "b", "2s", &dirs[1]);
    let c = node(&url, &nats, "c", "2s", &dirs[2]);
    until_peers(&[&a, &b, &c]).await;
    let (id, op) = create_match(&a.http()).await;
    // The operator's API answers on a node that does not own the match.
    let red = mint(&b.http(), &id, &op, json!({"kind": "team", "team": "red"})).await;
    // The team's client joins through c, and its calls reach the match.
    let mut o = crate::support::relay::Client::connect(&c.ws("/playerthree/ws"), None)
        .await
        .unwrap();
    o.send(json!({"op": "join", "token": red})).await;
    assert_eq!(o.recv().await["ok"], true);
    let seat = o
        .expect_ok(json!({"op": "mint", "seq": 1, "role": "red-scout"}))
        .await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    o.expect_ok(json!({"op": "controller", "seq": 2, "role": "red-scout", "controller": {"kind": "agent", "supervised": true}}))
        .await;
    // A seat minted over the tunnel joins through b.
    let mut s = crate::support::relay::Client::connect(&b.ws("/playerthree/ws"), None)
        .await
        .unwrap();
    s.send(json!({"op": "join", "token": seat})).await;
    assert_eq!(s.recv().await["ok"], true);
    let p = s
        .expect_ok(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "hold"}))
        .await;
    assert!(p["proposal"].is_string(), "{p}");
    assert!(metric(&a, "hostwire_cluster_tunnels_accepted_total").await >= 3);
    // A token no node knows is refused as on one node.
    let mut x = crate::support::relay::Client::connect(&b.ws("/playerthree/ws"), None)
        .await
        .unwrap();
    x.send(json!({"op": "join", "token": "p3t_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}))
        .await;
    assert_ne!(x.recv().await["ok"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosted_session_is_driven_and_played_through_nodes_that_do_not_own_it() {
    use crate::failover_units::{api, roster};
    use crate::support::session::presenter_body;
    let Some(url) = hostwire_store::testing::fresh_database("tunnel_session") else {
        return;
    };
    let Some(nats) = Nats::start("tunnel_session") else {
        return;
    };
    let dirs = [temp_dir("ts-a"), temp_dir("ts-b"), temp_dir("ts-c")];
    let a = node(&url, &nats, "a", "2s", &dirs[0]);
    let b = node(&url, &nats, "b", "2s", &dirs[1]);
    let c = node(&url, &nats, "c", "2s", &dirs[2]);
    until_peers(&[&a, &b, &c]).await;
    let (on_a, on_b, on_c) = (api(&a), api(&b), api(&c));
    let (sid, token) = on_a.create(&presenter_body(2)).await;
    for other in [&on_b, &on_c] {
        *other.tokens.lock().unwrap() = on_a.tokens.lock().unwrap().clone();
    }
    let path = format!("/memizy/sessions/{sid}");
    // The host's page drives the session through b and c.
    let (st, v) = on_b
        .request(
            "POST",
            &format!("{path}/players"),
            Some(&token),
            Some(&json!({"id": "p3", "name": "Cyd"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(roster(&v), ["p1", "p2", "p3"], "{v}");
    let (st, v) = on_c.op(&sid, &token, "start").await;
    assert_eq!(st, 200, "{v}");
    // The board attaches through b: its hello and its calls reach a.
    let (board, _) = on_b.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let after = on_c.status(&sid, &token).await;
    assert_eq!(after["instances"], 1, "the board, carried to a: {after}");
    assert_eq!(after, on_a.status(&sid, &token).await);
    assert!(metric(&a, "hostwire_cluster_tunnels_accepted_total").await >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ggui_session_is_leased_served_through_any_node_and_taken_over_after_a_kill_9() {
    let Some(url) = hostwire_store::testing::fresh_database("tunnel_ggui") else {
        return;
    };
    let Some(nats) = Nats::start("tunnel_ggui") else {
        return;
    };
    let dirs = [temp_dir("tg-a"), temp_dir("tg-b"), temp_dir("tg-c")];
    let mut a = node(&url, &nats, "a", "2s", &dirs[0]);
    let b = node(&url, &nats, "b", "2s", &dirs[1]);
    let c = node(&url, &nats, "c", "2s", &dirs[2]);
    until_peers(&[&a, &b, &c]).await;
    let (st, v) = ggui(&a, "PUT", "notes-1", Some(json!({}))).await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(metric(&a, "hostwire_cluster_units_owned").await, 1);
    // Every node answers for it as a does; only a holds it.
    let (st, v) = ggui(
        &b,
        "POST",
        "notes-1/props",
        Some(json!({"props": {"n": 1}})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = ggui(&c, "GET", "notes-1", None).await;
    assert_eq!((st, &v["props"]["n"]), (200, &json!(1)), "{v}");
    assert_eq!(metric(&b, "hostwire_cluster_units_owned").await, 0);
    assert_eq!(metric(&c, "hostwire_cluster_units_owned").await, 0);
    // Creating it again through c is answered by a (it exists: 200).
    let (st, v) = ggui(&c, "PUT", "notes-1", Some(json!({}))).await;
    assert_eq!((st, &v["created"]), (200, &json!(false)), "{v}");
    // A UI token minted through b (by a, which serves the session) opens a
    // socket on c, carried to a; an update pushed through b reaches it.
    let (st, v) = ggui(&b, "POST", "notes-1/ui-tokens", None).await;
    assert_eq!(st, 201, "{v}");
    let ws = format!(
        "{}?token={}",
        c.ws("/ggui/ws"),
        v["token"].as_str().unwrap()
    );
    let mut ui = Client::connect(&ws, None).await.unwrap();
    ui.send(json!({"type": "subscribe", "payload": {"sessionId": "notes-1"}, "requestId": "sub"}))
        .await;
    assert_eq!(ui.recv().await["type"], "ack");
    let (st, v) = ggui(
        &b,
        "POST",
        "notes-1/props",
        Some(json!({"props": {"n": 3}})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    loop {
        let f = ui.recv().await;
        if f["payload"]["props"]["n"] == 3 {
            break;
        }
    }
    // A made-up token of a's is refused by a.
    let forged = format!("{}?token=61.not-a-token", c.ws("/ggui/ws"));
    let mut x = Client::connect(&forged, None).await.unwrap();
    assert_eq!(closed_with(&mut x).await, 1008);
    let (st, v) = ggui(
        &c,
        "POST",
        "notes-1/props",
        Some(json!({"props": {"n": 1}})),
    )
    .await;
    assert_eq!(st, 200, "{v}");

    a.kill_9();

    // b takes it over once a's lease has run out, with what a stored.
    let deadline = tokio::time::Instant::now() + GUARD * 2;
    loop {
        let (st, v) = ggui(&b, "GET", "notes-1", None).await;
        if st == 200 {
            assert_eq!(v["props"]["n"], 1, "{v}");
            break;
        }
        assert_eq!(st, 503, "{v}");
        assert!(tokio::time::Instant::now() < deadline, "still refused: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(metric(&b, "hostwire_cluster_units_owned").await, 1);
    let (st, v) = ggui(
        &c,
        "POST",
        "notes-1/props",
        Some(json!({"props": {"n": 2}})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = ggui(&b, "GET", "notes-1", None).await;
    assert_eq!((st, &v["props"]["n"]), (200, &json!(2)), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_mid_game_moves_the_carried_players_and_loses_nothing_acknowledged() {
    let Some(url) = hostwire_store::testing::fresh_database("tunnel_nats_restart") else {
        return;
    };
    let Some(mut nats) = Nats::start("tunnel_nats_restart") else {
        return;
    };
    let dirs = [temp_dir("tnr-a"), temp_dir("tnr-b")];
    let a = node(&url, &nats, "a", "2s", &dirs[0]);
    let b = node(&url, &nats, "b", "2s", &dirs[1]);
    until_peers(&[&a, &b]).await;
    let (pin, token) = create(&a).await;
    let (mut host, _) = attach_until(&a, host_frame(&pin, &token), "hosting").await;
    let (mut ann, ann_v) = attach_until(&b, join_frame(&pin, "Ann", None), "joined").await;
    let (_eve, eve_v) = attach_until(&b, join_frame(&pin, "Eve", None), "joined").await;
    // Acknowledged before NATS goes: a kick.
    host.send(json!({"t": "kick", "playerId": eve_v["playerId"]}))
        .await;
    loop {
        let p = until_frame(&mut host, "presence").await;
        if p["event"] == "leave" {
            break;
        }
    }

    nats.stop();
    // Ann's tunnel ends once b stops hearing a: she is told to reconnect.
    assert_eq!(closed_with(&mut ann).await, 1012);
    // a serves its own clients meanwhile: the host is still there.
    host.send(json!({"t": "ping"})).await;
    until_frame(&mut host, "pong").await;
    nats.restart().unwrap();
    until_peers(&[&a, &b]).await;

    // Ann comes back through b as herself; Eve stays kicked.
    let (mut ann, v) = attach_until(
        &b,
        join_frame(&pin, "Ann", ann_v["token"].as_str()),
        "joined",
    )
    .await;
    assert_eq!(v["playerId"], ann_v["playerId"], "{v}");
    match attach(&b, &join_frame(&pin, "Eve", eve_v["token"].as_str())).await {
        Attach::Frame(_, v) => assert_eq!(v["code"], "KICKED", "{v}"),
        Attach::Closed(code) => panic!("closed {code}"),
    }
    host.send(json!({"t": "to", "to": ann_v["playerId"], "data": "after NATS"}))
        .await;
    assert_eq!(until_frame(&mut ann, "data").await["data"], "after NATS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_game_refuses_what_it_cannot_store_and_keeps_what_it_acknowledged() {
    let Some(mut pg) = hostwire_store::testing::OwnServer::start("tunnel_pg_restart") else {
        return;
    };
    let Some(nats) = Nats::start("tunnel_pg_restart") else {
        return;
    };
    let url = pg.url();
    let dirs = [temp_dir("tpr-a"), temp_dir("tpr-b")];
    let a = node(&url, &nats, "a", "2s", &dirs[0]);
    let b = node(&url, &nats, "b", "2s", &dirs[1]);
    until_peers(&[&a, &b]).await;
    let (pin, token) = create(&a).await;
    let (mut host, _) = attach_until(&a, host_frame(&pin, &token), "hosting").await;
    let (_ann, ann_v) = attach_until(&b, join_frame(&pin, "Ann", None), "joined").await;
    let (_eve, eve_v) = attach_until(&a, join_frame(&pin, "Eve", None), "joined").await;
    host.send(json!({"t": "kick", "playerId": eve_v["playerId"]}))
        .await;
    loop {
        let p = until_frame(&mut host, "presence").await;
        if p["event"] == "leave" {
            break;
        }
    }

    pg.stop();
    // What cannot be stored is refused, not acknowledged.
    host.send(json!({"t": "kick", "playerId": ann_v["playerId"]}))
        .await;
    let e = until_frame(&mut host, "error").await;
    assert_eq!(e["code"], "INTERNAL_ERROR", "{e}");
    pg.restart().unwrap();

    // The room goes on (on a, or on b if b took it while a could not
    // renew): the host and Ann come back through b as themselves, Ann
    // still in (her kick was refused), Eve still out.
    let (mut host, v) = attach_until(&b, host_frame(&pin, &token), "hosting").await;
    let ids: Vec<&str> = v["players"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [ann_v["playerId"].as_str().unwrap()], "{v}");
    let (mut ann, v) = attach_until(
        &b,
        join_frame(&pin, "Ann", ann_v["token"].as_str()),
        "joined",
    )
    .await;
    assert_eq!(v["playerId"], ann_v["playerId"], "{v}");
    match attach(&b, &join_frame(&pin, "Eve", eve_v["token"].as_str())).await {
        Attach::Frame(_, v) => assert_eq!(v["code"], "KICKED", "{v}"),
        Attach::Closed(code) => panic!("closed {code}"),
    }
    // And what is acknowledged now is stored again.
    host.send(json!({"t": "to", "to": ann_v["playerId"], "data": "after PostgreSQL"}))
        .await;
    assert_eq!(
        until_frame(&mut ann, "data").await["data"],
        "after PostgreSQL"
    );
}

#[tokio::test]
async fn a_carried_player_that_stops_reading_is_closed_as_too_slow_and_the_others_go_on() {
    use crate::support::relay::RelayFrames;
    use crate::support::ws::Ended;
    let Some(url) = hostwire_store::testing::fresh_database("tunnel_slow") else {
        return;
    };
    let Some(nats) = Nats::start("tunnel_slow") else {
        return;
    };
    let dirs = [temp_dir("ts-a"), temp_dir("ts-b"), temp_dir("ts-c")];
    let a = node(&url, &nats, "a", "60s", &dirs[0]);
    let b = node(&url, &nats, "b", "60s", &dirs[1]);
    let c = node(&url, &nats, "c", "60s", &dirs[2]);
    until_peers(&[&a, &b, &c]).await;
    let (pin, token) = create(&a).await;
    let (mut host, _) = attach_until(&a, host_frame(&pin, &token), "hosting").await;
    // The slow player reaches b with a small receive buffer and stops
    // reading; Bob reaches c and reads.
    let mut slow = Client::connect_with_receive_buffer(&b.ws("/ws"), Some(ORIGIN), 16 * 1024).await;
    slow.send(join_frame(&pin, "Slow", None)).await;
    let slow_id = until_frame(&mut slow, "joined").await["playerId"].clone();
    let (mut bob, bob_v) = attach_until(&c, join_frame(&pin, "Bob", None), "joined").await;
    // Frames of 256 KiB (each in fragments between the nodes): the slow
    // player's node takes them only as its outbound queue (8 MiB) has
    // room, and the owner sends at most a window ahead of that.
    let chunk = "y".repeat(256 * 1024);
    let mut closed = false;
    for i in 0..400 {
        host.send(json!({"t": "to", "to": slow_id, "data": chunk}))
            .await;
        if i % 10 == 9 {
            let seen = host.until_pong().await;
            if seen
                .iter()
                .any(|p| p["event"] == "disconnect" && p["player"]["id"] == slow_id)
            {
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "the slow player was never closed");
    // Reading now, it gets what was on its way, then the relay's close for
    // a slow reader, from the node it reached.
    assert_eq!(slow.ended().await, Ended::Closed(1013));
    // Bob, carried to the same owner through another node, goes on.
    host.send(json!({"t": "to", "to": bob_v["playerId"], "data": "still here"}))
        .await;
    assert_eq!(until_frame(&mut bob, "data").await["data"], "still here");
    assert_eq!(
        metric(&a, "hostwire_cluster_tunnels_too_slow_total").await
            + metric(&b, "hostwire_cluster_tunnels_too_slow_total").await,
        0,
        "no queue between the nodes overflowed: the window held the owner back"
    );
}
