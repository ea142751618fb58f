//! The units other than relay rooms owned through leases on a real
//! PostgreSQL, with real `hostwire serve` processes: a unit created on one
//! node is refused (503) on another while its owner lives, and after
//! `kill -9` of the owner another node serves it with its acknowledged
//! state once the owner's lease has run out.
//!
//! Time is never waited for by sleeping: outcomes are polled for with a
//! deadline.

use crate::failover::{run_out_leases, signal};
use crate::support::process::Process;
use crate::support::server::{temp_dir, GUARD};
use crate::support::session::{presenter_body, Api, OPERATOR};
use hostwire::sessions::device::Device;
use serde_json::{json, Value};
use std::time::Duration;

/// Between two looks at an outcome that is polled for.
const POLL: Duration = Duration::from_millis(50);

/// A node on `url` named `id`, its leases lasting `ttl`.
fn node(url: &str, id: &str, ttl: &str, dir: &tempfile::TempDir) -> Process {
    Process::serve(
        dir.path(),
        &[
            "--postgres-url",
            url,
            "--node-id",
            id,
            "--lease-ttl",
            ttl,
            "--allowed-origins",
            "*",
        ],
        &[("HOSTWIRE_OPERATOR_TOKEN", OPERATOR)],
    )
}

pub(crate) fn api(p: &Process) -> Api {
    Api {
        http: p.http(),
        ws: p.ws(""),
        tokens: Default::default(),
    }
}

/// The ids of the players a status lists, in roster order.
pub(crate) fn roster(status: &Value) -> Vec<String> {
    status["players"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| p["id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Asks `api` with `method` on `path` until it answers something other
/// than 503 (the old owner's lease still running), within [`GUARD`] twice.
async fn until_served(api: &Api, method: &str, path: &str, token: &str) -> (u16, Value) {
    let deadline = tokio::time::Instant::now() + GUARD * 2;
    loop {
        let (st, v) = api.request(method, path, Some(token), None).await;
        if st != 503 {
            return (st, v);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path}: still refused: {v}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosted_session_is_served_by_its_owner_alone_and_after_its_kill_9_by_another_node() {
    let Some(url) = hostwire_store::testing::fresh_database("failover_session") else {
        return;
    };
    let dirs = [temp_dir("fos-a"), temp_dir("fos-b")];
    let mut a = node(&url, "a", "2s", &dirs[0]);
    let b = node(&url, "b", "1s", &dirs[1]);
    let (on_a, on_b) = (api(&a), api(&b));
    let mut body = presenter_body(2);
    body["settings"] = json!({"questionTime": 30});
    let (sid, token) = on_a.create(&body).await;
    *on_b.tokens.lock().unwrap() = on_a.tokens.lock().unwrap().clone();
    let path = format!("/memizy/sessions/{sid}");
    let (st, v) = on_a
        .request(
            "POST",
            &format!("{path}/players"),
            Some(&token),
            Some(&json!({"id": "p3", "name": "Cyd", "user": "cyd@school"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let before = on_a.status(&sid, &token).await;
    assert_eq!(roster(&before), ["p1", "p2", "p3"], "{before}");

    // While a lives, b neither answers for the session nor changes it.
    let (st, v) = on_b.request("GET", &path, Some(&token), None).await;
    assert_eq!(st, 503, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("another node"),
        "{v}"
    );
    let (st, v) = on_b
        .request(
            "POST",
            &format!("{path}/players"),
            Some(&token),
            Some(&json!({"id": "p9", "name": "Zed"})),
        )
        .await;
    assert_eq!(st, 503, "{v}");
    let board = Device::connect(&on_b.ws, &sid, "board", "board", &token).await;
    assert!(
        board.is_err(),
        "a device attached on a node not owning the session"
    );
    // a still serves it, unchanged by b.
    assert_eq!(
        on_a.status(&sid, &token).await["players"],
        before["players"]
    );

    a.kill_9();

    // b takes it over once a's lease has run out: the acknowledged roster
    // and settings, a lobby still.
    let (st, after) = until_served(&on_b, "GET", &path, &token).await;
    assert_eq!(st, 200, "{after}");
    assert_eq!(after["phase"], "lobby", "{after}");
    assert_eq!(after["players"], before["players"], "{after}");
    assert_eq!(after["settings"]["questionTime"], 30, "{after}");
    // And it goes on there.
    let (st, v) = on_b
        .request(
            "POST",
            &format!("{path}/players"),
            Some(&token),
            Some(&json!({"id": "p4", "name": "Dot"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(roster(&v), ["p1", "p2", "p3", "p4"], "{v}");
    let (st, v) = on_b.op(&sid, &token, "start").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["phase"], "loading", "{v}");
    let (board, _) = on_b.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (st, h) =
        crate::support::http::call("GET", &format!("{}/api/health", b.http()), None, None).await;
    assert_eq!(st, 200);
    assert_eq!(h["units"]["owned"], 1, "{h}");
    assert_eq!(h["units"]["list"][0]["kind"], "hosted_session", "{h}");
    assert_eq!(h["units"]["list"][0]["generation"], 2, "{h}");
}

/// Joins PlayerThree's `/playerthree/ws` on `p` with `token`: the client
/// and its first answer.
async fn p3_join(p: &Process, token: &str) -> (crate::support::relay::Client, Value) {
    let mut c = crate::support::relay::Client::connect(&p.ws("/playerthree/ws"), None)
        .await
        .unwrap();
    c.send(json!({"op": "join", "token": token})).await;
    let v = c.recv().await;
    (c, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_playerthree_match_is_served_by_its_owner_alone_and_after_its_kill_9_by_another_node() {
    use crate::support::playerthree::{create_match, mint, mint_raw, revoke};
    let Some(url) = hostwire_store::testing::fresh_database("failover_match") else {
        return;
    };
    let dirs = [temp_dir("fom-a"), temp_dir("fom-b")];
    let mut a = node(&url, "a", "2s", &dirs[0]);
    let b = node(&url, "b", "1s", &dirs[1]);
    let (id, op) = create_match(&a.http()).await;
    let red = mint(&a.http(), &id, &op, json!({"kind": "team", "team": "red"})).await;
    let gone = mint(&a.http(), &id, &op, json!({"kind": "spectator"})).await;
    assert_eq!(revoke(&a.http(), &id, &op, &gone).await, 200);
    let (_red_on_a, v) = p3_join(&a, &red).await;
    assert_eq!(v["ok"], true, "{v}");

    // While a lives, b neither mints for the match nor joins its tokens.
    let (st, v) = mint_raw(&b.http(), &id, &op, json!({"kind": "spectator"})).await;
    assert_eq!(st, 503, "{v}");
    let (_c, v) = p3_join(&b, &red).await;
    assert_ne!(v["ok"], true, "a join on a node not owning the match: {v}");

    a.kill_9();

    // b takes it over once a's lease has run out: the tokens a minted
    // open it, the one a revoked stays revoked.
    let deadline = tokio::time::Instant::now() + GUARD * 2;
    let blue = loop {
        let (st, v) = mint_raw(&b.http(), &id, &op, json!({"kind": "team", "team": "blue"})).await;
        if st != 503 {
            assert_eq!(st, 201, "{v}");
            break v["token"].as_str().unwrap().to_owned();
        }
        assert!(tokio::time::Instant::now() < deadline, "still refused: {v}");
        tokio::time::sleep(POLL).await;
    };
    let (_red, v) = p3_join(&b, &red).await;
    assert_eq!(v["ok"], true, "{v}");
    let (_blue, v) = p3_join(&b, &blue).await;
    assert_eq!(v["ok"], true, "{v}");
    let (_gone, v) = p3_join(&b, &gone).await;
    assert_ne!(
        v["ok"], true,
        "a revoked token joined after the takeover: {v}"
    );
    let (st, h) =
        crate::support::http::call("GET", &format!("{}/api/health", b.http()), None, None).await;
    assert_eq!(st, 200);
    assert_eq!(h["units"]["owned"], 1, "{h}");
    assert_eq!(h["units"]["list"][0]["kind"], "playerthree_match", "{h}");
    assert_eq!(h["units"]["list"][0]["generation"], 2, "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_of_a_hosted_session_is_fenced_changes_nothing_and_moves_its_devices() {
    let Some(url) = hostwire_store::testing::fresh_database("failover_session_pause") else {
        return;
    };
    let dirs = [temp_dir("fsp-a"), temp_dir("fsp-b")];
    // a renews only every 20 s: after it wakes, its next act is the
    // API call's write, not a renewal.
    let a = node(&url, "a", "60s", &dirs[0]);
    let b = node(&url, "b", "1s", &dirs[1]);
    let (on_a, on_b) = (api(&a), api(&b));
    let (sid, token) = on_a.create(&presenter_body(2)).await;
    let (st, v) = on_a.op(&sid, &token, "start").await;
    assert_eq!(st, 200, "{v}");
    // The board's socket, read raw to see its close code.
    let url_ws = format!(
        "{}/memizy/session/ws?session={sid}&view=board&address=board&token={token}",
        on_a.ws
    );
    let mut board = crate::support::relay::Client::connect(&url_ws, None)
        .await
        .unwrap();

    signal(&a, libc::SIGSTOP);
    run_out_leases(&url).await;
    // b takes the session over when asked.
    let (st, v) = until_served(&on_b, "GET", &format!("/memizy/sessions/{sid}"), &token).await;
    assert_eq!(st, 200, "{v}");
    signal(&a, libc::SIGCONT);

    // a's host adds a player: a write a must not make.
    let (st, v) = on_a
        .request(
            "POST",
            &format!("/memizy/sessions/{sid}/players"),
            Some(&token),
            Some(&json!({"id": "p9", "name": "Zed"})),
        )
        .await;
    assert_ne!(st, 200, "a fenced node answered a change: {v}");
    assert_eq!(
        board.ended().await,
        crate::support::ws::Ended::Closed(1012),
        "the device of a lost session is moved"
    );
    // b's session has no such player, and a answers nothing more for it.
    let after = on_b.status(&sid, &token).await;
    assert_eq!(roster(&after), ["p1", "p2"], "{after}");
    let (st, v) = on_a
        .request(
            "GET",
            &format!("/memizy/sessions/{sid}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(st, 503, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_of_a_ggui_session_is_fenced_changes_nothing_and_moves_its_sockets() {
    let Some(url) = hostwire_store::testing::fresh_database("failover_ggui") else {
        return;
    };
    let dirs = [temp_dir("fog-a"), temp_dir("fog-b")];
    let serve = |id: &str, ttl: &str, dir: &tempfile::TempDir| {
        Process::serve(
            dir.path(),
            &["--postgres-url", &url, "--node-id", id, "--lease-ttl", ttl],
            &[("GGUI_APPS", "notes=notes-agent-credential-0123456789")],
        )
    };
    let agent = |p: &Process, method: &'static str, path: &str, body: Option<Value>| {
        let url = format!("{}/ggui/sessions/{path}", p.http());
        async move {
            crate::support::http::call(
                method,
                &url,
                Some("notes-agent-credential-0123456789"),
                body.as_ref(),
            )
            .await
        }
    };
    // a renews only every 20 s: after it wakes, its next act is the
    // agent's write, not a renewal.
    let a = serve("a", "60s", &dirs[0]);
    let b = serve("b", "1s", &dirs[1]);
    let (st, v) = agent(&a, "PUT", "notes-1", Some(json!({}))).await;
    assert_eq!(st, 201, "{v}");
    let (st, v) = agent(&a, "POST", "notes-1/ui-tokens", None).await;
    assert_eq!(st, 201, "{v}");
    let ws = format!(
        "{}?token={}",
        a.ws("/ggui/ws"),
        v["token"].as_str().unwrap()
    );
    let mut ui = crate::support::relay::Client::connect(&ws, None)
        .await
        .unwrap();
    ui.send(json!({"type": "subscribe", "payload": {"sessionId": "notes-1"}, "requestId": "sub"}))
        .await;
    assert_eq!(ui.recv().await["type"], "ack");
    // While a lives, b does not serve it.
    let (st, v) = agent(&b, "GET", "notes-1", None).await;
    assert_eq!(st, 503, "{v}");

    signal(&a, libc::SIGSTOP);
    run_out_leases(&url).await;
    let (st, v) = agent(
        &b,
        "POST",
        "notes-1/props",
        Some(json!({"props": {"n": 5}})),
    )
    .await;
    assert_eq!(st, 200, "b takes it over when asked: {v}");
    signal(&a, libc::SIGCONT);

    // a's late write is fenced: not acknowledged, and its socket moves.
    let (st, v) = agent(
        &a,
        "POST",
        "notes-1/props",
        Some(json!({"props": {"n": 9}})),
    )
    .await;
    assert_ne!(st, 200, "a fenced write was acknowledged: {v}");
    assert_eq!(ui.ended().await, crate::support::ws::Ended::Closed(1012));
    let (st, v) = agent(&b, "GET", "notes-1", None).await;
    assert_eq!((st, &v["props"]["n"]), (200, &json!(5)), "{v}");
    assert_eq!(
        crate::support::http::metric(&a.http(), "hostwire_cluster_leases_lost_total").await,
        1
    );
}
