//! The ggui live channel over a real WebSocket: subscribe / ack / replay,
//! the version handshake, tenancy, contract validation, acks, host
//! context, ping, errors, authentication, and the agent API that drives it.

use crate::support::ggui::*;
use hostwire::ggui::GguiConfig;
use hostwire_ggui::{encode_frame, make_stream_envelope, MakeStreamEnvelope, VersionPolicy};
use serde_json::{json, Value};

const TODO_SPEC: &str = r#"{"toggleTask": {"schema": {"type": "object",
    "properties": {"id": {"type": "string"}, "done": {"type": "boolean"}}, "required": ["id"]}},
    "note": {}}"#;

fn todo_spec() -> Value {
    serde_json::from_str(TODO_SPEC).unwrap()
}

#[tokio::test]
async fn subscribe_is_acked_with_both_sequences_and_the_version_echoing_the_request_id() {
    let s = Server::start().await;
    s.create("s1", json!({"actionSpec": todo_spec()})).await;
    s.emit("s1", "feed", json!({"n": 1})).await;
    let (_c, ack) = s.subscribed("s1").await;
    assert_eq!(ack["requestId"], "sub");
    assert_eq!(ack["payload"]["sequence"], 0);
    assert_eq!(ack["payload"]["streamSeq"], 1);
    assert_eq!(ack["payload"]["serverVersion"], VERSION);
    assert_eq!(ack["payload"]["timestamp"], T0);
}

#[tokio::test]
async fn a_valid_action_is_appended_acked_consumed_and_drained() {
    let s = Server::start().await;
    s.create("s1", json!({"actionSpec": todo_spec()})).await;
    let (mut c, _) = s.subscribed("s1").await;
    c.send(action(
        "s1",
        "toggleTask",
        json!({"id": "t1", "done": true}),
        "r1",
    ))
    .await;
    let ack = c.recv().await;
    assert_eq!(ack["type"], "ack", "{ack}");
    assert_eq!(ack["requestId"], "r1");
    assert_eq!(ack["payload"]["sequence"], 1);
    c.send(action("s1", "note", json!({"text": "hi"}), "r2"))
        .await;
    assert_eq!(c.recv().await["payload"]["sequence"], 2);

    let (status, v) = s.api("GET", "s1/actions?waitMs=0", None).await;
    assert_eq!(status, 200);
    let actions = v["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 2, "{v}");
    assert_eq!(actions[0]["intent"], "toggleTask");
    assert_eq!(actions[0]["actionData"], json!({"id": "t1", "done": true}));
    assert_eq!(actions[0]["actionId"], "1");
    let (_, v) = s.api("GET", "s1", None).await;
    assert_eq!(v["sequence"], 2);
    assert_eq!(v["pendingActions"], 2);

    let (status, v) = s
        .api("POST", "s1/actions/drain", Some(json!({"upTo": "1"})))
        .await;
    assert_eq!((status, v["drained"].as_u64()), (200, Some(1)));
    let drain = c.recv().await;
    assert_eq!(drain["type"], "drain_ack");
    assert_eq!(drain["payload"]["eventId"], "1");
    assert_eq!(drain["payload"]["appId"], "conformance");
    let (_, v) = s.api("GET", "s1/actions?waitMs=0", None).await;
    assert_eq!(v["actions"].as_array().unwrap().len(), 1);
    assert_eq!(v["actions"][0]["actionId"], "2");
}

#[tokio::test]
async fn a_long_poll_wakes_when_an_action_arrives() {
    let s = Server::start().await;
    s.create("s1", json!({})).await;
    let (mut c, _) = s.subscribed("s1").await;
    let http = s.http.clone();
    let poll = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .get(format!("{http}/ggui/sessions/s1/actions?waitMs=25000"))
            .bearer_auth(app_credential("conformance"))
            .send()
            .await
            .unwrap();
        r.json::<Value>().await.unwrap()
    });
    // The action is sent only once the poll is waiting (a condition, not
    // a time).
    tokio::time::timeout(GUARD, async {
        while s.metric("hostwire_ggui_long_polls").await == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the long poll never waited");
    c.send(action("s1", "anything", json!({"x": 1}), "r1"))
        .await;
    assert_eq!(c.recv().await["type"], "ack");
    let v = tokio::time::timeout(GUARD, poll).await.unwrap().unwrap();
    assert_eq!(v["actions"][0]["intent"], "anything", "{v}");
}

#[tokio::test]
async fn contract_violations_name_the_field_and_append_nothing() {
    let s = Server::start().await;
    s.create("s1", json!({"actionSpec": todo_spec()})).await;
    let (mut c, _) = s.subscribed("s1").await;
    c.send(action("s1", "toggleTask", json!({"id": 41}), "bad1"))
        .await;
    let e = c.expect_error("CONTRACT_VIOLATION").await;
    assert_eq!(e["requestId"], "bad1");
    let d = &e["payload"]["details"];
    assert_eq!(d["error"], "contract_violation");
    assert_eq!(d["tool"], "ggui_event");
    assert!(d["hint"].is_string(), "{d}");
    let v = &d["violations"][0];
    assert_eq!(v["keyword"], "type", "{d}");
    assert!(v["field"].as_str().unwrap().contains("id"), "{d}");

    // Undeclared action; an undeclared key (schemas are closed).
    c.send(action("s1", "doesNotExist", json!({}), "bad2"))
        .await;
    let e = c.expect_error("CONTRACT_VIOLATION").await;
    assert_eq!(e["requestId"], "bad2");
    c.send(action(
        "s1",
        "toggleTask",
        json!({"id": "a", "extra": 1}),
        "bad3",
    ))
    .await;
    c.expect_error("CONTRACT_VIOLATION").await;

    let (_, v) = s.api("GET", "s1", None).await;
    assert_eq!(
        (v["sequence"].as_u64(), v["pendingActions"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test]
async fn strict_version_mismatch_gets_upgrade_required_then_close() {
    let s = Server::start().await;
    let mut c = s.client_for("v1").await;
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "v1", "supportedVersions": ["0.9"]}, "requestId": "q"}))
        .await;
    let e = c.expect_error("UPGRADE_REQUIRED").await;
    assert_eq!(e["payload"]["serverVersion"], VERSION);
    assert_eq!(e["requestId"], "q");
    assert_eq!(c.ended().await, Ended::Closed(1000));

    // A matching list is accepted.
    let mut c = s.client_for("v1").await;
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "v1", "supportedVersions": ["0.9", VERSION]}}))
        .await;
    assert_eq!(c.recv().await["type"], "ack");
}

#[tokio::test]
async fn advisory_version_mismatch_keeps_the_socket_and_the_operator_override_is_advertised() {
    let mut config = GguiConfig::default();
    config.channel.version_policy = VersionPolicy::Advisory;
    let s = Server::with(config).await;
    s.create("v2", json!({})).await;
    let (status, v) = s
        .api(
            "PUT",
            "v2/version",
            Some(json!({"version": "99.99-unsupported"})),
        )
        .await;
    assert_eq!(
        (status, v["serverVersion"].as_str()),
        (200, Some("99.99-unsupported"))
    );
    let mut c = s.client_for("v2").await;
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "v2", "supportedVersions": [VERSION]}}))
        .await;
    let e = c.expect_error("UPGRADE_REQUIRED").await;
    assert_eq!(e["payload"]["serverVersion"], "99.99-unsupported");
    assert_eq!(e["payload"]["details"]["policy"], "advisory");
    assert!(c.until_pong().await.is_empty(), "the socket stays open");
    // Without a list, the override is what the ack advertises.
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "v2"}}))
        .await;
    assert_eq!(
        c.recv().await["payload"]["serverVersion"],
        "99.99-unsupported"
    );
    // Cleared: the server's own again.
    s.api("PUT", "v2/version", Some(json!({"version": null})))
        .await;
    let (_, ack) = s.subscribed("v2").await;
    assert_eq!(ack["payload"]["serverVersion"], VERSION);
}

#[tokio::test]
async fn app_tenancy_defaults_and_mismatches() {
    let mut config = GguiConfig::default();
    config.channel.default_app_id = "my-default".into();
    let s = Server::with(config).await;
    // Created by a subscribe without an app: the default app.
    s.subscribed("t1").await;
    let (_, v) = s.api("GET", "t1", None).await;
    assert_eq!(v["appId"], "my-default");
    // Created through the API without an app: the default app too.
    s.create("t2", json!({})).await;
    assert_eq!(s.api("GET", "t2", None).await.1["appId"], "my-default");
    // Another app: APP_MISMATCH, no ack, the socket stays open.
    s.create("t3", json!({"appId": "other"})).await;
    let mut c = s.client_for("t3").await;
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "t3", "appId": "my-default"}, "requestId": "m"}))
        .await;
    let e = c.expect_error("APP_MISMATCH").await;
    assert_eq!(e["requestId"], "m");
    assert!(c.until_pong().await.is_empty());
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "t3", "appId": "other"}}))
        .await;
    assert_eq!(c.recv().await["type"], "ack");
    // The API refuses another app for an existing session, and is
    // idempotent for the same one.
    let other = app_credential("other");
    let (status, v) = s
        .api_as(Some(&other), "PUT", "t3", Some(json!({"appId": "third"})))
        .await;
    assert_eq!((status, v["code"].as_str()), (403, Some("APP_MISMATCH")));
    let (status, v) = s.api("PUT", "t3", Some(json!({"appId": "other"}))).await;
    assert_eq!((status, v["created"].as_bool()), (200, Some(false)));
}

#[tokio::test]
async fn host_context_observed_is_stored_and_a_bad_one_refused() {
    let s = Server::start().await;
    let (mut c, _) = s.subscribed("h1").await;
    let ctx = json!({"availableDisplayModes": ["inline", "fullscreen"], "currentDisplayMode": "inline",
        "containerDimensions": {"maxWidth": 480, "height": 320}, "platform": "web",
        "deviceCapabilities": {"touch": false, "hover": true}, "locale": "en-US", "timeZone": "Europe/Paris"});
    c.send(json!({"type": "host_context_observed", "payload": {"sessionId": "h1", "hostContext": ctx}}))
        .await;
    assert!(
        c.until_pong().await.is_empty(),
        "no reply to host_context_observed"
    );
    assert_eq!(s.api("GET", "h1", None).await.1["hostContext"], ctx);
    c.send(json!({"type": "host_context_observed", "payload": {"sessionId": "h1", "hostContext": {"bogus": 1}}}))
        .await;
    let e = c.expect_error("INVALID_MESSAGE").await;
    assert!(
        e["payload"]["message"].as_str().unwrap().contains("bogus"),
        "{e}"
    );
    assert_eq!(
        s.api("GET", "h1", None).await.1["hostContext"],
        ctx,
        "nothing stored"
    );
}

#[tokio::test]
async fn ping_and_the_errors_of_bad_frames() {
    let s = Server::start().await;
    let mut c = s.client_for("e1").await;
    c.send(json!({"type": "ping", "requestId": "p"})).await;
    let pong = c.recv().await;
    assert_eq!(
        (pong["type"].as_str(), pong["requestId"].as_str()),
        (Some("pong"), Some("p"))
    );
    c.send_text("{not json").await;
    c.expect_error("INVALID_JSON").await;
    c.send(json!({"type": "teleport", "payload": {}})).await;
    c.expect_error("UNSUPPORTED_MESSAGE").await;
    c.send(action("x", "a", json!({}), "early")).await;
    let e = c.expect_error("NOT_SUBSCRIBED").await;
    assert_eq!(e["requestId"], "early");
    c.send(json!({"type": "subscribe", "payload": {"sessionId": 7}}))
        .await;
    let e = c.expect_error("INVALID_MESSAGE").await;
    assert!(
        e["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("sessionId"),
        "{e}"
    );
    // Subscribed to one session, an action naming another.
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "e1"}}))
        .await;
    assert_eq!(c.recv().await["type"], "ack");
    c.send(action("e2", "a", json!({}), "other")).await;
    c.expect_error("SESSION_MISMATCH").await;
}

#[tokio::test]
async fn replay_follows_each_policy_and_both_cursors_in_order() {
    let s = Server::start().await;
    s.create("r1", json!({"streamSpec": {"log": {"replay": "all"}, "status": {"replay": "latest"}, "tick": {"replay": "none"}}}))
        .await;
    let (mut c, _) = s.subscribed("r1").await;
    c.send(action("r1", "go", json!({"n": 1}), "a1")).await;
    c.recv().await;
    s.api("POST", "r1/props", Some(json!({"props": {"title": "x"}})))
        .await;
    assert_eq!(c.recv().await["type"], "props_update");
    // seq 1..=6
    s.emit("r1", "log", json!("l1")).await;
    s.emit("r1", "status", json!("s1")).await;
    s.emit("r1", "tick", json!("t1")).await;
    s.emit("r1", "log", json!("l2")).await;
    s.emit("r1", "status", json!("s2")).await;
    s.emit("r1", "tick", json!("t2")).await;

    let mut r = s.client_for("r1").await;
    r.send(json!({"type": "subscribe", "payload": {"sessionId": "r1", "fromSeq": 0, "sinceSequence": 0}}))
        .await;
    let ack = r.recv().await;
    assert_eq!(
        (
            ack["type"].as_str(),
            ack["payload"]["sequence"].as_u64(),
            ack["payload"]["streamSeq"].as_u64()
        ),
        (Some("ack"), Some(2), Some(6))
    );
    let seen = r.until_pong().await;
    let kinds: Vec<(String, Value)> = seen
        .iter()
        .map(|f| {
            (
                f["type"].as_str().unwrap().to_owned(),
                if f["type"] == "render_event" {
                    f["payload"]["seq"].clone()
                } else {
                    f["payload"]["payload"].clone()
                },
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("render_event".into(), json!(1)),
            ("render_event".into(), json!(2)),
            ("data".into(), json!("l1")),
            ("data".into(), json!("l2")),
            ("data".into(), json!("s2")),
        ]
    );
    assert_eq!(seen[0]["payload"]["type"], "user.submitted");
    assert_eq!(seen[1]["payload"]["type"], "ui.updated");

    // Cursors past part of it.
    r.send(json!({"type": "subscribe", "payload": {"sessionId": "r1", "fromSeq": 4, "sinceSequence": 1}}))
        .await;
    assert_eq!(r.recv().await["type"], "ack");
    let seen = r.until_pong().await;
    let got: Vec<Value> = seen.iter().map(|f| f["payload"]["seq"].clone()).collect();
    assert_eq!(got, vec![json!(2), json!(5)], "{seen:?}");

    // No cursors: nothing replayed.
    r.send(json!({"type": "subscribe", "payload": {"sessionId": "r1"}}))
        .await;
    assert_eq!(r.recv().await["type"], "ack");
    assert!(r.until_pong().await.is_empty());

    // Bad and out-of-range ledger cursors.
    r.send(json!({"type": "subscribe", "payload": {"sessionId": "r1", "sinceSequence": -1}}))
        .await;
    assert_eq!(r.recv().await["type"], "ack");
    r.expect_error("INVALID_SINCE_SEQUENCE").await;
    r.send(json!({"type": "subscribe", "payload": {"sessionId": "r1", "sinceSequence": 9}}))
        .await;
    assert_eq!(r.recv().await["type"], "ack");
    let e = r.expect_error("REPLAY_HORIZON_PASSED").await;
    assert_eq!(e["payload"]["details"]["currentSequence"], 2);

    // The live tail: both subscribers get the next envelope.
    s.emit("r1", "tick", json!("t3")).await;
    assert_eq!(r.recv().await["payload"]["seq"], 7);
    // The first subscriber got every envelope live, in seq order.
    let live: Vec<Value> = c
        .until_pong()
        .await
        .iter()
        .map(|f| f["payload"]["seq"].clone())
        .collect();
    assert_eq!(live, (1..=7).map(|n| json!(n)).collect::<Vec<_>>());
}

#[tokio::test]
async fn an_all_buffer_keeps_256_and_says_when_replay_was_truncated() {
    let s = Server::start().await;
    s.create("b1", json!({"streamSpec": {"log": {"replay": "all"}}}))
        .await;
    for i in 1..=260 {
        s.emit("b1", "log", json!(i)).await;
    }
    let mut r = s.client_for("b1").await;
    r.send(json!({"type": "subscribe", "payload": {"sessionId": "b1", "fromSeq": 0}}))
        .await;
    let ack = r.recv().await;
    assert_eq!(ack["payload"]["replayTruncated"], true, "{ack}");
    let seen = r.until_pong().await;
    assert_eq!(seen.len(), 256);
    assert_eq!(seen[0]["payload"]["seq"], 5);
    // A cursor past the evicted entries is not truncated.
    r.send(json!({"type": "subscribe", "payload": {"sessionId": "b1", "fromSeq": 10}}))
        .await;
    let ack = r.recv().await;
    assert!(ack["payload"].get("replayTruncated").is_none(), "{ack}");
    assert_eq!(r.until_pong().await.len(), 250);
}

#[tokio::test]
async fn the_wire_carries_the_builders_exact_bytes() {
    let s = Server::start().await;
    s.create("w1", json!({})).await;
    let (mut c, _) = s.subscribed("w1").await;
    let payload = json!({"z": 1, "a": [1, 2.5, "é"], "m": {"y": null, "b": true}});
    let (status, _) = s
        .api("POST", "w1/emit", Some(json!({"channel": "feed", "mode": "replace", "payload": payload.clone(), "complete": true})))
        .await;
    assert_eq!(status, 200);
    let expected = make_stream_envelope(MakeStreamEnvelope {
        session_id: "w1".into(),
        channel: "feed".into(),
        mode: hostwire_ggui::StreamChannelMode::Replace,
        payload,
        complete: Some(true),
        seq: Some(1),
        ..Default::default()
    });
    let bytes = encode_frame("data", &expected, None);
    assert_eq!(c.recv_text().await, &*bytes);
    assert!(
        bytes.contains(r#""schemaVersion":"draft-2026-08-19""#),
        "{bytes}"
    );
    // An envelope without `complete`: the key is absent, not null.
    s.emit("w1", "feed", json!(2)).await;
    let text = c.recv_text().await;
    let expected = make_stream_envelope(MakeStreamEnvelope {
        session_id: "w1".into(),
        channel: "feed".into(),
        payload: json!(2),
        seq: Some(2),
        ..Default::default()
    });
    assert_eq!(text, &*encode_frame("data", &expected, None));
    assert!(!text.contains("complete"));
}

#[tokio::test]
async fn a_contract_error_goes_out_on_the_reserved_channel_and_is_replayed() {
    let s = Server::start().await;
    s.create("ce", json!({})).await;
    let (mut c, _) = s.subscribed("ce").await;
    let err = json!({"toolName": "ggui_render", "error": {"code": "SCHEMA_VIOLATION", "message": "bad"}, "timestamp": 1});
    s.emit("ce", "_ggui:contract-error", err.clone()).await;
    let f = c.recv().await;
    assert_eq!(
        (f["type"].as_str(), f["payload"]["channel"].as_str()),
        (Some("data"), Some("_ggui:contract-error"))
    );
    // Reserved channels are always replayed in full.
    let mut r = s.client_for("ce").await;
    r.send(json!({"type": "subscribe", "payload": {"sessionId": "ce", "fromSeq": 0}}))
        .await;
    r.recv().await;
    assert_eq!(r.recv().await["payload"]["payload"], err);
}

#[tokio::test]
async fn the_agent_api_needs_an_app_credential() {
    let s = Server::start().await;
    // None, and a wrong one: 401, nothing created.
    assert_eq!(s.api_as(None, "PUT", "a1", None).await.0, 401);
    assert_eq!(s.api_as(Some("wrong"), "PUT", "a1", None).await.0, 401);
    assert_eq!(
        s.api_as(Some(&app_credential("conformance")), "GET", "a1", None)
            .await
            .0,
        404
    );
    // The app's own credential.
    let (status, v) = s
        .api_as(Some(&app_credential("conformance")), "PUT", "a1", None)
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["session"]["appId"], "conformance");
}

#[tokio::test]
async fn the_api_names_bad_fields_and_unknown_sessions() {
    let s = Server::start().await;
    let (status, v) = s
        .api(
            "POST",
            "nope/emit",
            Some(json!({"channel": "c", "payload": 1})),
        )
        .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (404, Some("SESSION_NOT_FOUND"))
    );
    s.create("f1", json!({})).await;
    let (status, v) = s.api("POST", "f1/emit", Some(json!({"payload": 1}))).await;
    assert_eq!(status, 400);
    assert!(v["message"].as_str().unwrap().contains("channel"), "{v}");
    let (status, v) = s
        .api(
            "POST",
            "f1/emit",
            Some(json!({"channel": "c", "payload": 1, "mode": "sideways"})),
        )
        .await;
    assert_eq!(status, 400);
    assert!(v["message"].as_str().unwrap().contains("mode"), "{v}");
    let (status, v) = s.api("POST", "f1/props", Some(json!({"props": []}))).await;
    assert_eq!(status, 400);
    assert!(v["message"].as_str().unwrap().contains("props"), "{v}");
    let (status, v) = s
        .api(
            "PUT",
            "f2",
            Some(json!({"actionSpec": {"a": {"schema": {"$ref": "http://example.org/s.json"}}}})),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    let (status, v) = s.api("POST", "f1/actions/drain", Some(json!({}))).await;
    assert_eq!(status, 400);
    assert!(v["message"].as_str().unwrap().contains("upTo"), "{v}");
    let (status, v) = s.api("GET", "f1/actions?max=0", None).await;
    assert_eq!(status, 400);
    assert!(v["message"].as_str().unwrap().contains("max"), "{v}");
    let (status, v) = s.api("GET", "nope", None).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (404, Some("SESSION_NOT_FOUND"))
    );
}

#[tokio::test]
async fn a_browser_origin_not_allowed_is_refused_403_and_an_allowed_one_upgrades() {
    use hostwire::http::AllowedOrigins;
    use tokio_tungstenite::tungstenite::Error;
    let config = GguiConfig {
        allowed_origins: AllowedOrigins::List(vec!["https://app.example".into()]),
        ..GguiConfig::default()
    };
    let s = Server::with(config).await;
    for refused in ["https://evil.example", "null", "https://app.example.evil"] {
        match Client::connect_from(&s.ws, refused).await {
            Err(Error::Http(r)) => assert_eq!(r.status(), 403, "{refused}"),
            Err(e) => panic!("{refused}: {e}"),
            Ok(_) => panic!("{refused}: upgraded"),
        }
    }
    // The allowed origin, and an agent that sends none, both upgrade.
    let mut browser = Client::connect_from(&s.ui_url("o1").await, "https://app.example")
        .await
        .unwrap();
    let mut agent = s.client_for("o1").await;
    for c in [&mut browser, &mut agent] {
        c.send(json!({"type": "subscribe", "payload": {"sessionId": "o1"}}))
            .await;
        assert_eq!(c.recv().await["type"], "ack");
    }
}
