//! ggui tenancy tried from outside: each app's agent credential reaches
//! only its own app's sessions; nothing is created anonymously.

mod ggui_common;
use ggui_common::*;
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
    assert_eq!(v["props"], json!({}), "{v}");
}
