//! A saved game continued after a restart of the real binary: the same
//! session and player ids, progress and plugin data intact, the board
//! recreated from its snapshot without `start()`, the session paused. And
//! the board reloading in a running game: messages to the authority are
//! refused while it is away, and it resumes from its snapshot.

mod session_support;

use serde_json::json;
use session_support::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Server {
    child: Child,
    api: Api,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_server(dir: &std::path::Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostwire"))
        .env("HOSTWIRE_OPERATOR_TOKEN", OPERATOR)
        .args([
            "serve",
            "--port",
            "0",
            "--host",
            "127.0.0.1",
            "--allowed-origins",
            "*",
        ])
        .arg("--data-dir")
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().rsplit("http://").next().unwrap().to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "{line}");
    Server {
        child,
        api: Api {
            http: format!("http://{addr}"),
            ws: format!("ws://{addr}"),
            tokens: Default::default(),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_game_continues_after_a_restart_with_progress_and_plugin_data() {
    let dir = tempfile::Builder::new()
        .prefix("hostwire-test-session-restart-")
        .tempdir()
        .unwrap();
    let s = spawn_server(dir.path());
    let api = &s.api;
    // With a set asset: its file is in the store beside the session.
    let mut body = presenter_body(2);
    body["set"]["meta"]["assets"] =
        json!({"cover": {"type": "image", "value": "assets/cover.png", "mimeType": "image/png"}});
    body["assets"] = json!({"assets/cover.png": "iVBORw0KGgo="});
    let (sid, token) = api.create(&body).await;
    api.op(&sid, &token, "start").await;
    let (mut board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let (p2, _) = api.device(&sid, "controller", "p2").await;
    p2.call("ready", json!([])).await.unwrap();
    board.wait_for("start", GUARD).await.expect("start");
    p1.call(
        "recordAnswer",
        json!([{"itemId": "q1", "isCorrect": true, "answer": "j"}]),
    )
    .await
    .unwrap();
    p1.call("saveData", json!(["plugin", {"avatar": "fox"}]))
        .await
        .unwrap();
    p1.call("saveData", json!(["set", {"streak": 3}]))
        .await
        .unwrap();
    board
        .call("saveSnapshot", json!([{"round": 4, "scores": {"p1": 1}}]))
        .await
        .unwrap();
    let (st, v) = api.op(&sid, &token, "save").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["saved"]["sessionId"], sid.as_str());
    drop((board, p1, p2));
    drop(s);

    let s = spawn_server(dir.path());
    let api = &s.api;
    // Not running until continued.
    let (st, _) = api.op(&sid, &token, "pause").await;
    assert_eq!(st, 409);
    let (st, v) = api.op(&sid, &token, "continue").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["phase"], "running");
    assert!(
        v["clock"]["pausedAt"].is_number(),
        "continued paused: {}",
        v["clock"]
    );
    let (mut board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["session"]["id"], sid.as_str());
    assert_eq!(init["snapshot"], json!({"round": 4, "scores": {"p1": 1}}));
    board.call("ready", json!([])).await.unwrap();
    let (p1, init) = api.device(&sid, "controller", "p1").await;
    assert_eq!(init["data"]["plugin"], json!({"avatar": "fox"}));
    assert_eq!(init["data"]["set"], json!({"streak": 3}));
    assert_eq!(init["progress"]["q1"]["bucket"], 2, "{}", init["progress"]);
    p1.call("ready", json!([])).await.unwrap();
    // The bundle's file is served after the restart.
    let a = p1.call("getAsset", json!(["cover"])).await.unwrap();
    assert_eq!(
        (&a["base64"], &a["mimeType"], &a["size"]),
        (&json!("iVBORw0KGgo="), &json!("image/png"), &json!(8))
    );
    let (st, v) = api.op(&sid, &token, "resume").await;
    assert_eq!(st, 200, "{v}");
    assert!(v["clock"]["pausedAt"].is_null());
    // Recreated from the snapshot: never start().
    let calls = board.drain_calls();
    assert!(calls.iter().all(|c| c.method != "start"), "{calls:?}");
    p1.call("send", send_args(json!("authority"), json!("back")))
        .await
        .unwrap();
    let d = board
        .wait_for("deliver", GUARD)
        .await
        .expect("deliver after continue");
    assert_eq!(d.args[0]["data"], "back");
}

#[tokio::test]
async fn the_board_reloads_and_resumes_from_its_snapshot_while_messages_to_it_are_refused() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, token) = api.create(&presenter_body(2)).await;
    api.op(&sid, &token, "start").await;
    let (mut board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (mut p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let (p2, _) = api.device(&sid, "controller", "p2").await;
    p2.call("ready", json!([])).await.unwrap();
    board.wait_for("start", GUARD).await.expect("start");
    board
        .call("saveSnapshot", json!([{"round": 2}]))
        .await
        .unwrap();
    board.close();
    let c = p1
        .wait_for("authorityChanged", GUARD)
        .await
        .expect("authorityChanged");
    assert_eq!(c.args[0]["connected"], false);
    let r = p1
        .call("send", send_args(json!("authority"), json!("hello?")))
        .await;
    assert_eq!(r.unwrap_err().code, "AUTHORITY_UNAVAILABLE");
    // The board reloads: a new instance at the same address gets the snapshot.
    let (mut board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["snapshot"], json!({"round": 2}));
    // Still refused until the recreated authority is ready.
    let r = p1
        .call("send", send_args(json!("authority"), json!("now?")))
        .await;
    assert_eq!(r.unwrap_err().code, "AUTHORITY_UNAVAILABLE");
    board.call("ready", json!([])).await.unwrap();
    let c = p1
        .wait_for("authorityChanged", GUARD)
        .await
        .expect("authorityChanged back");
    assert_eq!(c.args[0]["connected"], true);
    p1.call("send", send_args(json!("authority"), json!("now")))
        .await
        .unwrap();
    let d = board
        .wait_for("deliver", GUARD)
        .await
        .expect("deliver to the reloaded board");
    assert_eq!(d.args[0]["data"], "now");
    assert!(board.drain_calls().iter().all(|c| c.method != "start"));
}
