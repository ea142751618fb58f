//! A multiplayer game hosted by the server over real sockets: a board and
//! 30 controllers from the lobby to the end, with answers and the result
//! in the store; and a late joiner.

use crate::support::session::*;
use hostwire_store::sessions::SessionStore;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_and_30_controllers_from_lobby_to_end() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, token) = api.create(&presenter_body(30)).await;
    let st = api.status(&sid, &token).await;
    assert_eq!(st["phase"], "lobby");
    assert_eq!(st["players"].as_array().unwrap().len(), 30);
    // Without the host token, nothing.
    let (s, _) = api.op(&sid, "wrong", "start").await;
    assert_eq!(s, 401);
    let (s, v) = api.op(&sid, &token, "start").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["phase"], "loading");

    let (mut board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["session"]["view"], "board");
    assert_eq!(init["session"]["authority"], "board");
    assert!(
        init["data"]["plugin"].is_null(),
        "the board has no plugin data"
    );
    board.call("ready", json!([])).await.unwrap();
    let mut ctrls = Vec::new();
    for id in player_ids(30) {
        let (d, init) = api.device(&sid, "controller", &id).await;
        assert_eq!(init["session"]["self"], id.as_str());
        // Controllers get public items: no correct answer.
        assert!(
            init["set"]["items"][0].get("correctId").is_none(),
            "{}",
            init["set"]["items"][0]
        );
        assert!(init["snapshot"].is_null());
        d.call("ready", json!([])).await.unwrap();
        ctrls.push(d);
    }
    // Every one ready, no countdown time: start() to the authority only.
    board
        .wait_for("start", GUARD)
        .await
        .expect("start on the board");
    board
        .call("send", send_args(json!("all"), json!({"round": 1})))
        .await
        .unwrap();
    for c in &mut ctrls {
        let d = c
            .wait_for("deliver", GUARD)
            .await
            .expect("deliver to a controller");
        assert_eq!(d.args[0]["from"], "board");
        assert_eq!(d.args[0]["data"], json!({"round": 1}));
        assert!(c.drain_calls().iter().all(|c| c.method != "start"));
    }
    for (i, c) in ctrls.iter().enumerate() {
        let answer = if i % 2 == 0 { "j" } else { "m" };
        c.call(
            "send",
            send_args(json!("authority"), json!({"answer": answer})),
        )
        .await
        .unwrap();
        c.call(
            "recordAnswer",
            json!([{"itemId": "q1", "isCorrect": answer == "j", "answer": answer}]),
        )
        .await
        .unwrap();
    }
    let mut from = std::collections::BTreeSet::new();
    while from.len() < 30 {
        let d = board
            .wait_for("deliver", GUARD)
            .await
            .expect("30 answers on the board");
        from.insert(d.args[0]["from"].as_str().unwrap().to_owned());
    }
    // recordAnswer resolved only once durable: the rows are there.
    assert_eq!(h.store.count_answers(&sid).unwrap(), 30);
    let progress = h.store.load_progress("p1", "set-1").unwrap();
    assert_eq!(progress.len(), 1);
    assert!(progress[0].1.contains("\"bucket\":2"), "{}", progress[0].1);
    board
        .call("saveSnapshot", json!([{"round": 1, "answers": 30}]))
        .await
        .unwrap();
    assert!(h
        .store
        .load_snapshot(&sid)
        .unwrap()
        .unwrap()
        .contains("\"answers\":30"));
    board
        .call("end", json!([{"scores": {"p1": 1.0}, "summary": "done"}]))
        .await
        .unwrap();
    // The instances stay open for finishedCloseMs, then get sessionEnded.
    assert_eq!(api.status(&sid, &token).await["phase"], "finished");
    h.clock.advance_ms(1000);
    api.status(&sid, &token).await;
    for c in &mut ctrls {
        let e = c
            .wait_for("sessionEnded", GUARD)
            .await
            .expect("sessionEnded");
        assert_eq!(e.args[0], "finished");
    }
    // The result is durable, the snapshot discarded: a finished game is not resumed.
    let result = h.store.load_result(&sid).unwrap().expect("a stored result");
    assert!(result.contains("\"summary\":\"done\""), "{result}");
    assert_eq!(h.store.load_snapshot(&sid).unwrap(), None);
}

#[tokio::test]
async fn a_late_joiner_gets_its_own_init_and_the_roster_changes() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, token) = api.create(&presenter_body(2)).await;
    api.op(&sid, &token, "start").await;
    let (mut board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let (p2, _) = api.device(&sid, "controller", "p2").await;
    p2.call("ready", json!([])).await.unwrap();
    board.wait_for("start", GUARD).await.expect("start");
    let (s, v) = api
        .request(
            "POST",
            &format!("/memizy/sessions/{sid}/players"),
            Some(&token),
            Some(&json!({"id": "late", "name": "Late Lou"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let pc = board
        .wait_for("playersChanged", GUARD)
        .await
        .expect("playersChanged");
    assert!(pc.args[0]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["id"] == "late"));
    let (mut late, init) = api.device(&sid, "controller", "late").await;
    assert_eq!(init["session"]["lateJoin"], true);
    assert_eq!(init["session"]["self"], "late");
    late.call("ready", json!([])).await.unwrap();
    board
        .call("send", send_args(json!(["late"]), json!("welcome")))
        .await
        .unwrap();
    let d = late
        .wait_for("deliver", GUARD)
        .await
        .expect("deliver to the late joiner");
    assert_eq!(d.args[0]["data"], "welcome");
    // Unknown players may not attach.
    let (s, _) = api
        .request(
            "POST",
            &format!("/memizy/sessions/{sid}/players"),
            Some(&token),
            Some(&json!({"id": "late", "name": "Again"})),
        )
        .await;
    assert_eq!(s, 400, "a duplicate player is refused");
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn get_asset_answers_the_bundled_bytes_within_the_size_and_rate_limits() {
    use base64::Engine;
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let mut body = presenter_body(1);
    let cover: Vec<u8> = (0..=255u8).cycle().take(5_000).collect();
    let diagram = b"<svg/>".to_vec();
    let big = vec![7u8; 2 * 1024 * 1024 + 1];
    body["set"]["meta"]["assets"] = json!({
        "cover": {"type": "image", "value": "assets/cover.png", "mimeType": "image/png"},
        "big": {"type": "video", "value": "assets/big.mp4", "mimeType": "video/mp4"},
        "web": {"type": "image", "value": "https://example.com/a.png"}
    });
    body["set"]["items"][0]["assets"] = json!({
        "diagram": {"type": "image", "value": "assets/q1.svg", "mimeType": "image/svg+xml"}
    });
    body["assets"] = json!({
        "assets/cover.png": b64(&cover),
        "assets/q1.svg": b64(&diagram),
        "assets/big.mp4": b64(&big)
    });
    let (sid, token) = api.create(&body).await;
    api.op(&sid, &token, "start").await;
    let (board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let bytes = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v["base64"].as_str().unwrap())
            .unwrap()
    };
    let a = p1.call("getAsset", json!(["cover"])).await.unwrap();
    assert_eq!(
        (&a["mimeType"], &a["size"]),
        (&json!("image/png"), &json!(5_000))
    );
    assert_eq!(bytes(&a), cover);
    // Item assets first; keys are matched case-insensitively.
    let a = p1.call("getAsset", json!(["Diagram", "q1"])).await.unwrap();
    assert_eq!(
        (&a["itemId"], &a["mimeType"]),
        (&json!("q1"), &json!("image/svg+xml"))
    );
    assert_eq!(bytes(&a), diagram);
    let err =
        |r: Result<Value, hostwire::sessions::device::RemoteError>| r.expect_err("an error").code;
    // Not a set asset; over 2 MB; a URL the plugin loads itself.
    assert_eq!(
        err(p1.call("getAsset", json!(["diagram"])).await),
        "ASSET_NOT_FOUND"
    );
    assert_eq!(
        err(p1.call("getAsset", json!(["big"])).await),
        "DATA_TOO_LARGE"
    );
    assert_eq!(
        err(p1.call("getAsset", json!(["web"])).await),
        "ASSET_NOT_FOUND"
    );
    // 10 a second, burst 20: five calls so far.
    for _ in 0..15 {
        p1.call("getAsset", json!(["cover"])).await.unwrap();
    }
    assert_eq!(
        err(p1.call("getAsset", json!(["cover"])).await),
        "RATE_LIMITED"
    );
    h.clock.advance_ms(100);
    assert_eq!(
        bytes(&p1.call("getAsset", json!(["cover"])).await.unwrap()),
        cover
    );
    // A file that is not base64 is refused at creation, naming it.
    body["assets"]["assets/cover.png"] = json!("not base64!");
    let (s, v) = api
        .request("POST", "/memizy/sessions", None, Some(&body))
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("assets[\"assets/cover.png\"]"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_page_renames_a_player_and_changes_the_locale_and_devices_hear_it() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, token) = api.create(&presenter_body(2)).await;
    api.op(&sid, &token, "start").await;
    let (mut board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["config"], json!({"locale": "en", "theme": "light"}));
    board.call("ready", json!([])).await.unwrap();
    let (p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let http = reqwest::Client::new();
    let url = |path: &str| format!("{}/memizy/sessions/{sid}{path}", api.http);

    // Rename: the roster says it, and the board hears playersChanged.
    let r = http
        .patch(url("/players/p1"))
        .bearer_auth(&token)
        .json(&json!({"name": "Ann"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let p = v["players"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "p1")
        .cloned();
    assert_eq!(p.unwrap()["name"], "Ann", "{v}");
    loop {
        let c = board
            .wait_for("playersChanged", GUARD)
            .await
            .expect("playersChanged");
        let players = c.args[0].as_array().unwrap();
        if players
            .iter()
            .any(|p| p["id"] == "p1" && p["name"] == "Ann")
        {
            break;
        }
    }
    // Config: every instance hears configChanged.
    let r = http
        .put(url("/config"))
        .bearer_auth(&token)
        .json(&json!({"locale": "pl-PL", "theme": "dark"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let c = board
        .wait_for("configChanged", GUARD)
        .await
        .expect("configChanged");
    assert_eq!(c.args[0], json!({"locale": "pl-PL", "theme": "dark"}));

    // Refusals name the field; the host token is required.
    let r = http
        .put(url("/config"))
        .bearer_auth(&token)
        .json(&json!({"locale": "<script>", "theme": "dark"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().starts_with("locale:"), "{v}");
    let r = http
        .put(url("/config"))
        .bearer_auth(&token)
        .json(&json!({"locale": "en", "theme": "pink"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http
        .patch(url("/players/p9"))
        .bearer_auth(&token)
        .json(&json!({"name": "Nobody"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .patch(url("/players/p1"))
        .json(&json!({"name": "Eve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // A lobby page on an allowed origin may drive the session.
    let r = http
        .request(reqwest::Method::OPTIONS, url("/players/p1"))
        .header("origin", "https://lobby.example")
        .header("access-control-request-method", "PATCH")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://lobby.example");
    let methods = h["access-control-allow-methods"].to_str().unwrap();
    assert!(
        methods.contains("PATCH") && methods.contains("PUT"),
        "{methods}"
    );
}
