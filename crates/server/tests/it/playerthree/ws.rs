//! `/playerthree/ws` over a real socket: joining with each principal,
//! every op and its error codes, views and delayed observer frames under
//! the manual clock, revocation, and the operator's HTTP API.

use crate::support::playerthree::*;
use serde_json::{json, Value};

/// A match with a team token for each side: (server, match, operator,
/// red team token, blue team token).
async fn match_with_teams() -> (TestServer, String, String, String, String) {
    let t = TestServer::start().await;
    let (id, op) = create_match(&t.http).await;
    let red = mint(&t.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let blue = mint(&t.http, &id, &op, json!({"kind": "team", "team": "blue"})).await;
    (t, id, op, red, blue)
}

#[tokio::test]
async fn each_principal_joins_and_gets_what_it_may_see() {
    let (t, id, op, red, _) = match_with_teams().await;

    let (mut owner, v) = t.join(&red).await;
    assert_eq!(
        (v["op"].as_str(), v["seq"].as_u64(), v["ok"].as_bool()),
        (Some("result"), Some(0), Some(true)),
        "{v}"
    );
    assert_eq!(
        v["data"],
        json!({"kind": "team", "match": id, "team": "red"})
    );
    let seats = owner.recv().await;
    assert_eq!(seats["op"], "seats", "{seats}");
    let roles: Vec<&str> = seats["seats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["role"].as_str().unwrap())
        .collect();
    assert!(roles.iter().all(|r| r.starts_with("red-")), "{roles:?}");
    assert_eq!(owner.recv().await["op"], "cards");
    let view = owner.recv().await;
    assert_eq!(
        (
            view["op"].as_str(),
            view["team"].as_str(),
            view["version"].as_u64()
        ),
        (Some("view"), Some("red"), Some(1)),
        "{view}"
    );
    assert!(view["view"].is_object() && view.get("delta").is_none());
    // Fog: blue is out of sight of red's corner.
    assert_eq!(view["view"]["enemies"], json!([]));

    let human = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "human", "team": "blue", "role": "blue-guard"}),
    )
    .await;
    let (mut h, v) = t.join(&human).await;
    assert_eq!(v["data"]["kind"], "human");
    assert_eq!(h.recv_op("view").await["team"], "blue");

    let seat = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "seat", "team": "red", "role": "red-scout"}),
    )
    .await;
    let (_s, v) = t.join(&seat).await;
    assert_eq!(v["data"]["kind"], "seat");
    // An agent's connection shows its seat live to the owners.
    let seats = owner.recv_op("seats").await;
    let scout = seats["seats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["role"] == "red-scout")
        .unwrap()
        .clone();
    assert_eq!(scout["live"], true, "{scout}");

    let spectator = mint(&t.http, &id, &op, json!({"kind": "spectator"})).await;
    let (mut sp, v) = t.join(&spectator).await;
    assert_eq!(v["data"]["kind"], "spectator");
    sp.send(json!({"op": "watch", "teams": ["blue"]})).await;
    let v = sp.recv_op("view").await;
    assert_eq!(
        (v["team"].as_str(), v["version"].as_u64()),
        (Some("blue"), Some(1))
    );

    let observer = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "observer", "grant": {"kind": "omniscient", "teams": ["red", "blue"], "delayMs": 3000}}),
    )
    .await;
    let (mut ob, v) = t.join(&observer).await;
    assert_eq!(v["data"]["kind"], "observer");
    let adm = ob.recv().await;
    assert_eq!(
        (adm["op"].as_str(), adm["state"].as_str()),
        (Some("observer"), Some("buffering")),
        "{adm}"
    );
    assert_eq!(adm["grant"]["delayMs"], 3000);
}

#[tokio::test]
async fn bad_tokens_are_refused_before_any_lookup_and_the_socket_closes() {
    let (t, _, _, _, _) = match_with_teams().await;
    for token in [
        "short".to_owned(),
        "+".repeat(32),
        "A".repeat(32), // well-formed, never issued
    ] {
        let (mut c, v) = t.join(&token).await;
        assert_eq!(
            (v["ok"].as_bool(), v["code"].as_str()),
            (Some(false), Some("bad_token")),
            "{v}"
        );
        assert_eq!(c.ended().await, Ended::Closed(4001));
    }
    // A first message that is not a join.
    let mut c = t.client().await;
    c.send(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "hold"}))
        .await;
    let v = c.recv().await;
    assert_eq!(v["code"], "bad_message", "{v}");
    assert_eq!(c.ended().await, Ended::Closed(1008));
    // A join with an extra member.
    let mut c = t.client().await;
    c.send(json!({"op": "join", "token": "A".repeat(32), "extra": 1}))
        .await;
    let v = c.recv().await;
    assert_eq!(v["code"], "bad_message", "{v}");
    assert!(v["message"].as_str().unwrap().contains("extra"), "{v}");
}

#[tokio::test]
async fn owner_ops_and_their_error_codes() {
    let (t, id, op, red, _) = match_with_teams().await;
    let (mut o, _) = t.join(&red).await;
    o.drain().await;

    // call: own seat, unknown method, bad args, other team, no such role.
    let d = o
        .expect_ok(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "move", "args": {"dir": "s"}}))
        .await;
    assert_eq!(d, json!({"ok": true, "order": "s"}));
    o.expect_error(
        json!({"op": "call", "seq": 2, "role": "red-scout", "method": "fly"}),
        "invalid",
    )
    .await;
    o.expect_error(
        json!({"op": "call", "seq": 3, "role": "red-scout", "method": "move", "args": {"dir": "up"}}),
        "invalid",
    )
    .await;
    o.expect_error(
        json!({"op": "call", "seq": 4, "role": "blue-scout", "method": "hold"}),
        "forbidden",
    )
    .await;
    o.expect_error(
        json!({"op": "call", "seq": 5, "role": "nobody", "method": "hold"}),
        "not_in_match",
    )
    .await;

    // stream: obs pushes every tick; an unknown section is invalid.
    o.expect_ok(json!({"op": "stream", "seq": 6, "role": "red-scout", "everyTicks": 1, "detail": ["scores"]}))
        .await;
    o.expect_error(
        json!({"op": "stream", "seq": 7, "role": "red-scout", "everyTicks": 1, "detail": ["secrets"]}),
        "invalid",
    )
    .await;
    t.tick().await;
    let obs = o.recv_op("obs").await;
    assert_eq!(obs["role"], "red-scout", "{obs}");

    // mandate, scopes, controller, mint.
    o.expect_ok(json!({"op": "mandate", "seq": 8, "role": "red-scout", "mandate": {"goal": "take the flag"}}))
        .await;
    o.expect_error(
        json!({"op": "scopes", "seq": 9, "role": "red-scout", "scopes": ["teleport"]}),
        "invalid",
    )
    .await;
    o.expect_ok(json!({"op": "scopes", "seq": 10, "role": "red-scout", "scopes": ["hold"]}))
        .await;
    // tell to a human-played seat: mode_unavailable.
    o.expect_error(
        json!({"op": "tell", "seq": 11, "roles": ["red-scout"], "text": "hi"}),
        "mode_unavailable",
    )
    .await;
    o.expect_ok(json!({"op": "controller", "seq": 12, "role": "red-scout", "controller": {"kind": "agent"}}))
        .await;
    let minted = o
        .expect_ok(json!({"op": "mint", "seq": 13, "role": "red-scout"}))
        .await;
    let seat_token = minted["token"].as_str().unwrap().to_owned();
    assert_eq!(seat_token.len(), 32);

    // The agent: within its scopes only, never owner ops or another seat.
    let (mut a, v) = t.join(&seat_token).await;
    assert_eq!(v["data"]["role"], "red-scout", "{v}");
    a.expect_ok(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "hold"}))
        .await;
    a.expect_error(
        json!({"op": "call", "seq": 2, "role": "red-scout", "method": "move", "args": {"dir": "e"}}),
        "out_of_scope",
    )
    .await;
    a.expect_error(
        json!({"op": "call", "seq": 3, "role": "red-guard", "method": "hold"}),
        "forbidden",
    )
    .await;
    for (seq, msg) in [
        (
            4,
            json!({"op": "controller", "seq": 4, "role": "red-scout", "controller": {"kind": "human"}}),
        ),
        (5, json!({"op": "mint", "seq": 5, "role": "red-scout"})),
        (
            6,
            json!({"op": "mandate", "seq": 6, "role": "red-scout", "mandate": 1}),
        ),
        (
            7,
            json!({"op": "scopes", "seq": 7, "role": "red-scout", "scopes": ["*"]}),
        ),
        (
            8,
            json!({"op": "resolveApproval", "seq": 8, "role": "red-scout", "id": "p1", "approve": true}),
        ),
    ] {
        let r = a.call(msg).await;
        assert_eq!(
            (r["seq"].as_u64(), r["code"].as_str()),
            (Some(seq), Some("forbidden")),
            "{r}"
        );
    }

    // Chat: the owner tells, the agent's tell is `said` to the owners.
    o.expect_ok(json!({"op": "tell", "seq": 14, "roles": ["red-scout"], "text": "go"}))
        .await;
    a.expect_ok(json!({"op": "tell", "seq": 9, "roles": "all", "text": "on my way"}))
        .await;
    let said = o.recv_op("said").await;
    assert_eq!(
        (said["role"].as_str(), said["text"].as_str()),
        (Some("red-scout"), Some("on my way"))
    );

    // Supervision: a call is a proposal until an owner resolves it.
    o.expect_ok(json!({"op": "scopes", "seq": 15, "role": "red-scout", "scopes": ["*"]}))
        .await;
    o.expect_ok(json!({"op": "controller", "seq": 16, "role": "red-scout", "controller": {"kind": "agent", "supervised": true}}))
        .await;
    let p = a
        .expect_ok(json!({"op": "call", "seq": 10, "role": "red-scout", "method": "move", "args": {"dir": "e"}}))
        .await;
    assert_eq!(p["status"], "pending", "{p}");
    let id_p = p["proposal"].as_str().unwrap().to_owned();
    a.expect_error(
        json!({"op": "call", "seq": 11, "role": "red-scout", "method": "hold"}),
        "approval_pending",
    )
    .await;
    o.expect_error(
        json!({"op": "resolveApproval", "seq": 17, "role": "red-scout", "id": "nope", "approve": true}),
        "approval_not_found",
    )
    .await;
    let r = o
        .expect_ok(json!({"op": "resolveApproval", "seq": 18, "role": "red-scout", "id": id_p, "approve": true}))
        .await;
    assert_eq!(r["status"], "applied", "{r}");

    // Spectators and observers may do none of the client ops.
    let spectator = mint(&t.http, &id, &op, json!({"kind": "spectator"})).await;
    let (mut sp, _) = t.join(&spectator).await;
    sp.expect_error(
        json!({"op": "call", "seq": 1, "role": "red-scout", "method": "hold"}),
        "forbidden",
    )
    .await;
    sp.send(json!({"op": "watch", "teams": ["green"]})).await;
    let v = sp.recv_op("result").await;
    assert_eq!(
        (v["seq"].as_u64(), v["code"].as_str()),
        (Some(0), Some("not_in_match")),
        "{v}"
    );
    let ob_token = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "observer", "grant": {"kind": "team", "team": "red", "delayMs": 0}}),
    )
    .await;
    let (mut ob, _) = t.join(&ob_token).await;
    ob.recv_op("observer").await;
    ob.expect_error(
        json!({"op": "mint", "seq": 1, "role": "red-scout"}),
        "forbidden",
    )
    .await;
    // A perspective outside the grant.
    ob.send(json!({"op": "observer", "perspective": "blue"}))
        .await;
    let v = ob.recv_op("result").await;
    assert_eq!(v["code"], "forbidden", "{v}");
}

#[tokio::test]
async fn a_tick_sends_one_delta_from_the_previous_version() {
    let (t, id, op, red, _) = match_with_teams().await;
    let (mut o, _) = t.join(&red).await;
    let spectator = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "spectator", "team": "red"}),
    )
    .await;
    let (mut sp, _) = t.join(&spectator).await;
    assert_eq!(sp.recv_op("view").await["version"], 1);
    o.drain().await;
    o.expect_ok(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "move", "args": {"dir": "s"}}))
        .await;
    t.tick().await;
    let a = o.recv_op("view").await;
    let b = sp.recv_op("view").await;
    assert_eq!(
        (a["version"].as_u64(), a["team"].as_str()),
        (Some(2), Some("red")),
        "{a}"
    );
    assert!(a.get("view").is_none(), "a delta, not a keyframe: {a}");
    // Built once: the same delta for the owner and the spectator.
    assert_eq!(a, b);
    // A spectator of red may not watch blue.
    sp.send(json!({"op": "watch", "teams": ["blue"]})).await;
    assert_eq!(sp.recv_op("result").await["code"], "forbidden");
}

#[tokio::test]
async fn observer_frames_are_never_released_before_release_at() {
    let (t, id, op, _, _) = match_with_teams().await;
    let delay = 5000;
    let token = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "observer", "grant": {"kind": "team", "team": "red", "delayMs": delay}}),
    )
    .await;
    let (mut ob, _) = t.join(&token).await;
    assert_eq!(ob.recv().await["state"], "buffering");
    ob.send(json!({"op": "observer", "perspective": "red"}))
        .await;
    // Ticks at T0+1s..T0+4s: the first frame (recorded at creation, T0)
    // is due at T0+5s.
    for _ in 0..4 {
        t.tick().await;
    }
    let early = ob.drain().await;
    assert!(early.is_empty(), "released early: {early:?}");
    t.advance(999).await;
    assert!(ob.drain().await.is_empty());
    t.advance(1).await;
    let now = hostwire_core::Clock::now_ms(&t.clock);
    let frames = ob.drain().await;
    assert!(!frames.is_empty(), "nothing released at releaseAt");
    for f in &frames {
        assert_eq!(f["state"], "ready", "{f}");
        let release_at = f["frame"]["releaseAt"].as_u64().unwrap();
        assert!(release_at <= now, "{f}");
        assert_eq!(
            release_at,
            f["frame"]["recordedAt"].as_u64().unwrap() + delay,
            "{f}"
        );
        // A team grant sees its team's fogged projection only.
        let world = &f["frame"]["world"];
        if world.is_object() {
            assert_eq!(world["team"], "red", "{f}");
            assert!(world
                .get("units")
                .unwrap()
                .as_array()
                .unwrap()
                .iter()
                .all(|u| u["role"].as_str().unwrap().starts_with("red-")));
        }
    }
    assert!(frames[0]["frame"]["world"].is_object(), "a keyframe first");
}

#[tokio::test]
async fn revoking_a_token_closes_its_connections_and_refuses_it() {
    let (t, id, op, red, _) = match_with_teams().await;
    let (mut o, _) = t.join(&red).await;
    o.drain().await;
    assert_eq!(revoke(&t.http, &id, &op, &red).await, 200);
    assert_eq!(o.ended().await, Ended::Closed(4003));
    let (_, v) = t.join(&red).await;
    assert_eq!(v["code"], "bad_token", "{v}");
    assert_eq!(revoke(&t.http, &id, &op, &"Z".repeat(32)).await, 404);
}

#[tokio::test]
async fn the_operator_api_refuses_without_the_operator_token_and_names_bad_fields() {
    let (t, id, op, red, _) = match_with_teams().await;
    let (status, _) = mint_raw(&t.http, &id, &red, json!({"kind": "spectator"})).await;
    assert_eq!(status, 401, "a team token is not the operator's");
    let (status, _) = mint_raw(&t.http, &"x".repeat(16), &op, json!({"kind": "spectator"})).await;
    assert_eq!(status, 404);
    let (status, v) = mint_raw(&t.http, &id, &op, json!({"kind": "team"})).await;
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("team"), "{v}");
    let (status, v) = mint_raw(&t.http, &id, &op, json!({"kind": "team", "team": "green"})).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (400, Some("not_in_match")),
        "{v}"
    );
    let (status, v) = mint_raw(
        &t.http,
        &id,
        &op,
        json!({"kind": "observer", "grant": {"kind": "team", "team": "red", "delayMs": 3_600_001}}),
    )
    .await;
    assert_eq!((status, v["code"].as_str()), (400, Some("invalid")), "{v}");
    let (status, _) = mint_raw(
        &t.http,
        &id,
        &op,
        json!({"kind": "spectator", "match": "other"}),
    )
    .await;
    assert_eq!(status, 400);
    // A body past MAX_API_BODY_BYTES.
    let r = reqwest::Client::new()
        .post(format!("{}/playerthree/matches/{id}/tokens", t.http))
        .header("Authorization", format!("Bearer {op}"))
        .body("x".repeat(10_000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let _: Value = Value::Null;
}

#[tokio::test]
async fn the_operator_gives_a_seat_its_card_and_observers_see_it_while_an_agent_plays() {
    let (t, id, op, red, _) = match_with_teams().await;
    let http = reqwest::Client::new();
    let url = |role: &str| format!("{}/playerthree/matches/{id}/seats/{role}/card", t.http);
    let card = json!({"id": "scout-bot-7", "name": "Scout Bot"});
    // Only the match's operator sets a card; a bad one is refused by name.
    let r = http.put(url("red-scout")).json(&card).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .put(url("red-scout"))
        .bearer_auth(&op)
        .json(&json!({"id": " ", "name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().starts_with("id:"), "{v}");
    let r = http
        .put(url("nobody"))
        .bearer_auth(&op)
        .json(&card)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // An agent plays red-scout; the operator gives it its card.
    let (mut o, _) = t.join(&red).await;
    o.drain().await;
    o.expect_ok(json!({"op": "controller", "seq": 1, "role": "red-scout", "controller": {"kind": "agent", "supervised": false}}))
        .await;
    let r = http
        .put(url("red-scout"))
        .bearer_auth(&op)
        .json(&card)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The seat's public card reaches the match's clients.
    loop {
        let c = o.recv_op("cards").await;
        let seat = c["cards"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["role"] == "red-scout")
            .cloned()
            .unwrap();
        if seat.get("card") == Some(&card) {
            break;
        }
    }
    // An observer's keyframe carries it as an agent card.
    let ob_token = mint(
        &t.http,
        &id,
        &op,
        json!({"kind": "observer", "grant": {"kind": "team", "team": "red", "delayMs": 0}}),
    )
    .await;
    let (mut ob, _) = t.join(&ob_token).await;
    ob.send(json!({"op": "observer", "perspective": "red"}))
        .await;
    t.tick().await;
    let keyframe = loop {
        let f = ob.recv_op("observer").await;
        if f["frame"]["world"].is_object() {
            break f;
        }
    };
    assert_eq!(
        keyframe["frame"]["agentCards"],
        json!([{"team": "red", "role": "red-scout", "card": card}]),
        "{keyframe}"
    );
    // DELETE clears it.
    let r = http
        .delete(url("red-scout"))
        .bearer_auth(&op)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
