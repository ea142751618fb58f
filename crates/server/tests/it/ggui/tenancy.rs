//! ggui tenancy tried from outside: each app's agent credential reaches
//! only its own app's sessions; nothing is created anonymously.

use crate::support::ggui::*;
use serde_json::json;

#[tokio::test]
async fn an_anonymous_ggui_session_is_refused() {
    let s = Server::start().await;
    let (status, v) = s.api_as(None, "PUT", "anon", Some(json!({}))).await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["code"], "UNAUTHENTICATED");
    let (status, _) = s
        .api_as(Some("not-an-app-credential-at-all"), "PUT", "anon", None)
        .await;
    assert_eq!(status, 401);
    // Nothing was created: the app's own agent finds no such session.
    assert_eq!(s.api("GET", "anon", None).await.0, 404);
}

#[tokio::test]
async fn one_apps_credential_cannot_touch_another_apps_session() {
    let s = Server::start().await;
    s.create(
        "b-session",
        json!({"appId": "notes", "actionSpec": {"add": {"schema": {"type": "object"}}}}),
    )
    .await;
    let a = app_credential("conformance");
    let a = Some(a.as_str());
    // Read, emit, props, consume, drain, version (upgrade): as if it did
    // not exist.
    let calls = [
        ("GET", "b-session", None),
        (
            "POST",
            "b-session/emit",
            Some(json!({"channel": "c", "payload": 1})),
        ),
        ("POST", "b-session/props", Some(json!({"props": {"x": 1}}))),
        ("GET", "b-session/actions", None),
        ("POST", "b-session/actions/drain", Some(json!({"upTo": 10}))),
        ("PUT", "b-session/version", Some(json!({"version": "9.9"}))),
    ];
    for (method, path, body) in calls {
        let (status, v) = s.api_as(a, method, path, body).await;
        assert_eq!(status, 404, "{method} {path}: {v}");
        assert_eq!(v["code"], "SESSION_NOT_FOUND", "{method} {path}");
    }
    // Nor can it create for another app.
    let (status, v) = s
        .api_as(a, "PUT", "mine", Some(json!({"appId": "notes"})))
        .await;
    assert_eq!(status, 403, "{v}");
    // The owner still reads its session unchanged.
    let (status, v) = s.api("GET", "b-session", None).await;
    assert_eq!(status, 200);
    assert_eq!(v["appId"], "notes");
    assert!(v["props"].is_null(), "no props were pushed: {v}");
    assert_eq!(v["sequence"], 0, "nothing reached its ledger: {v}");
    assert_eq!(v["streamSeq"], 0, "nothing was emitted: {v}");
}

#[tokio::test]
async fn a_ui_token_of_one_session_cannot_subscribe_to_another() {
    let s = Server::start().await;
    s.create("mine", json!({})).await;
    s.create("theirs", json!({"appId": "notes"})).await;
    s.emit("theirs", "secret", json!("for notes' users only"))
        .await;
    // No token, a wrong one: the upgrade is refused.
    assert!(Client::connect(&s.ws, None).await.is_err());
    assert!(Client::connect(&format!("{}?token=nope", s.ws), None)
        .await
        .is_err());
    // Minting for another app's session: as if it did not exist.
    let a = app_credential("conformance");
    let (status, _) = s.api_as(Some(&a), "POST", "theirs/ui-tokens", None).await;
    assert_eq!(status, 404);
    // A token of `mine` subscribes to `mine` only.
    let mut c = s.client_for("mine").await;
    for (session, app) in [
        ("theirs", None),
        ("theirs", Some("notes")),
        ("new-one", None),
    ] {
        let mut payload = json!({"sessionId": session, "fromSeq": 0});
        if let Some(app) = app {
            payload["appId"] = json!(app);
        }
        c.send(json!({"type": "subscribe", "payload": payload, "requestId": "x"}))
            .await;
        let e = c.expect_error("UNAUTHENTICATED").await;
        assert_eq!(e["requestId"], "x");
    }
    // Nothing was created by those subscribes.
    assert_eq!(s.api("GET", "new-one", None).await.0, 404);
    c.send(json!({"type": "subscribe", "payload": {"sessionId": "mine"}}))
        .await;
    assert_eq!(c.recv().await["type"], "ack");
}
