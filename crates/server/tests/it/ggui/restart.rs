//! ggui sessions survive a restart of the real `hostwire serve`: a client
//! that resubscribes with its cursors gets exactly the frames it would
//! have had without the restart, and the counters go on.

use crate::support::ggui::{action, Client, Ended, GguiFrames};
use crate::support::process::Process;
use serde_json::{json, Value};

struct Spawned {
    process: Process,
    http: String,
    ws: String,
}

/// The agent credential of the app the tests use.
const NOTES: &str = "notes-agent-credential-0123456789";

fn spawn(dir: &std::path::Path) -> Spawned {
    let process = Process::serve(dir, &[], &[("GGUI_APPS", &format!("notes={NOTES}"))]);
    Spawned {
        http: process.http(),
        ws: process.ws("/ggui/ws"),
        process,
    }
}

/// Stops the server with SIGTERM and waits for it to exit.
fn stop(mut s: Spawned) {
    let status = s.process.sigterm();
    assert!(status.success(), "{status}");
}

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> Value {
    let mut r = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(NOTES);
    if let Some(b) = body {
        r = r.body(b.to_string());
    }
    let r = r.send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap()
}

/// The live channel's URL with a UI token of the session `keep`, minted
/// by its app's agent.
async fn ui_ws(s: &Spawned) -> String {
    let url = format!("{}/ggui/sessions/keep/ui-tokens", s.http);
    let v = call(reqwest::Method::POST, url, None).await;
    format!("{}?token={}", s.ws, v["token"].as_str().unwrap())
}

/// Everything a resubscribe with these cursors delivers, the ack's
/// timestamp aside.
async fn replay(s: &Spawned, from_seq: u64, since: u64) -> Vec<Value> {
    let mut c = Client::connect(&ui_ws(s).await, None).await.unwrap();
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "keep", "appId": "notes", "fromSeq": from_seq, "sinceSequence": since}}))
        .await;
    let mut ack = c.recv().await;
    assert_eq!(ack["type"], "ack", "{ack}");
    ack["payload"].as_object_mut().unwrap().remove("timestamp");
    let mut frames = vec![ack];
    frames.extend(c.until_pong().await);
    frames
}

#[tokio::test]
async fn a_resubscribe_after_a_restart_replays_from_its_cursors() {
    let dir = tempfile::Builder::new()
        .prefix("hostwire-test-ggui-restart-")
        .tempdir()
        .unwrap();
    let s = spawn(dir.path());
    let api = |p: &str| format!("{}/ggui/sessions/{p}", s.http);
    call(
        reqwest::Method::PUT,
        api("keep"),
        Some(json!({"appId": "notes", "actionSpec": {"add": {"schema": {"type": "object", "properties": {"text": {"type": "string"}}}}},
            "streamSpec": {"log": {"replay": "all"}, "status": {"replay": "latest"}}})),
    )
    .await;
    let mut c = Client::connect(&ui_ws(&s).await, None).await.unwrap();
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "keep", "appId": "notes"}}))
        .await;
    assert_eq!(c.recv().await["type"], "ack");
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        c.send(action(
            "keep",
            "add",
            json!({"text": text}),
            &format!("r{i}"),
        ))
        .await;
        assert_eq!(c.recv().await["payload"]["sequence"], i as u64 + 1);
    }
    let ctx = json!({"platform": "desktop", "locale": "fr-FR"});
    c.send(json!({"type": "host_context_observed", "payload": {"sessionId": "keep", "hostContext": ctx}}))
        .await;
    call(
        reqwest::Method::POST,
        api("keep/props"),
        Some(json!({"props": {"title": "T"}, "epoch": 2})),
    )
    .await;
    for (ch, p) in [
        ("log", "a"),
        ("status", "busy"),
        ("log", "b"),
        ("tick", "x"),
        ("status", "idle"),
        ("log", "c"),
    ] {
        call(
            reqwest::Method::POST,
            api("keep/emit"),
            Some(json!({"channel": ch, "payload": p})),
        )
        .await;
    }
    // The agent handled the first action.
    call(
        reqwest::Method::POST,
        api("keep/actions/drain"),
        Some(json!({"upTo": 1})),
    )
    .await;
    c.until_pong().await;
    let before_all = replay(&s, 0, 0).await;
    let before_part = replay(&s, 3, 2).await;
    let view_before = call(reqwest::Method::GET, api("keep"), None).await;
    assert_eq!(before_all.len(), 1 + 4 + 4, "{before_all:#?}");

    stop(s);
    assert_eq!(c.ended().await, Ended::Closed(1001));

    let s = spawn(dir.path());
    let api = |p: &str| format!("{}/ggui/sessions/{p}", s.http);
    assert_eq!(replay(&s, 0, 0).await, before_all);
    assert_eq!(replay(&s, 3, 2).await, before_part);
    let mut view = call(reqwest::Method::GET, api("keep"), None).await;
    // Who is subscribed right now is not state that survives a restart
    // (the replay sockets may or may not have been counted out yet).
    let mut view_before = view_before;
    view.as_object_mut().unwrap().remove("subscribers");
    view_before.as_object_mut().unwrap().remove("subscribers");
    assert_eq!(view, view_before);
    assert_eq!(view["appId"], "notes");
    assert_eq!(view["hostContext"], ctx);
    assert_eq!(view["sequence"], 4);
    assert_eq!(view["streamSeq"], 6);
    // The undrained actions are still waiting for the agent.
    let pending = call(reqwest::Method::GET, api("keep/actions?waitMs=0"), None).await;
    let ids: Vec<&str> = pending["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["actionId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["2", "3"]);
    // The counters go on, and the action spec was kept.
    let env = call(
        reqwest::Method::POST,
        api("keep/emit"),
        Some(json!({"channel": "log", "payload": "d"})),
    )
    .await;
    assert_eq!(env["seq"], 7);
    let mut c = Client::connect(&ui_ws(&s).await, None).await.unwrap();
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "keep", "appId": "notes"}}))
        .await;
    c.recv().await;
    c.send(action("keep", "add", json!({"text": 5}), "bad"))
        .await;
    c.expect_error("CONTRACT_VIOLATION").await;
    c.send(action("keep", "add", json!({"text": "four"}), "ok"))
        .await;
    assert_eq!(c.recv().await["payload"]["sequence"], 5);
    stop(s);
}
