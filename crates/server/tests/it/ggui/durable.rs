//! What the ggui live channel acknowledges is durable, against the real
//! SQLite file (failures injected by triggers on it, as a full disk
//! would fail): an action is acked only once its ledger entry is
//! committed, a props update is answered only once stored, and a host
//! context update writes the host context alone.

use crate::support::ggui::*;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// A second connection to the server's database file.
fn db(path: &std::path::Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).unwrap();
    c.busy_timeout(GUARD).unwrap();
    c
}

fn count(path: &std::path::Path, sql: &str) -> i64 {
    db(path).query_row(sql, [], |r| r.get(0)).unwrap()
}

async fn restart(s: &mut Server) {
    s.stop().await;
    let db = s.db.clone();
    let dir = s.take_dir();
    let mut again = Server::start_at(Default::default(), db, s.clock.clone()).await;
    again.keep_dir(dir);
    *s = again;
}

#[tokio::test]
async fn an_action_on_a_failing_store_is_not_acked_and_an_acked_one_survives_a_restart() {
    let mut s = Server::start().await;
    s.create("a1", json!({})).await;
    let (mut c, _) = s.subscribed("a1").await;
    db(&s.db)
        .execute_batch(
            "CREATE TRIGGER refuse_ledger BEFORE INSERT ON ggui_ledger
             BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    c.send(action("a1", "lost", json!({}), "r1")).await;
    let e = c.expect_error("APPEND_FAILED").await;
    assert_eq!(e["requestId"], "r1", "{e}");
    // Nothing of it is left: the agent sees no action, the ledger did
    // not move.
    let (_, v) = s.api("GET", "a1/actions?max=10", None).await;
    assert_eq!(v["actions"].as_array().map(Vec::len), Some(0), "{v}");

    db(&s.db)
        .execute_batch("DROP TRIGGER refuse_ledger;")
        .unwrap();
    c.send(action("a1", "kept", json!({"n": 1}), "r2")).await;
    let ack = c.recv().await;
    assert_eq!(
        (ack["type"].as_str(), ack["requestId"].as_str()),
        (Some("ack"), Some("r2")),
        "{ack}"
    );
    let seq = ack["payload"]["sequence"].as_u64().unwrap();
    assert_eq!(seq, 1, "the refused action's sequence is given again");
    // Durable when acked: the row is in the file now.
    assert_eq!(
        count(
            &s.db,
            "SELECT COUNT(*) FROM ggui_ledger WHERE session_id = 'a1'"
        ),
        1
    );

    restart(&mut s).await;
    let (_, v) = s.api("GET", "a1/actions?max=10", None).await;
    let entries = v["actions"].as_array().cloned().unwrap_or_default();
    assert_eq!(entries.len(), 1, "{v}");
    assert_eq!(entries[0]["intent"], "kept", "{v}");
    s.stop().await;
}

#[tokio::test]
async fn a_props_update_on_a_failing_store_answers_503_and_changes_nothing() {
    let mut s = Server::start().await;
    s.create("p1", json!({})).await;
    let (status, _) = s
        .api("POST", "p1/props", Some(json!({"props": {"title": "old"}})))
        .await;
    assert_eq!(status, 200);
    let (mut c, _) = s.subscribed("p1").await;
    db(&s.db)
        .execute_batch(
            "CREATE TRIGGER refuse_rows BEFORE UPDATE ON ggui_sessions
             BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    let (status, v) = s
        .api("POST", "p1/props", Some(json!({"props": {"title": "new"}})))
        .await;
    assert_eq!(status, 503, "{v}");
    // No subscriber was told, and the session did not change.
    assert!(c.until_pong().await.is_empty(), "props_update sent");
    let (_, view) = s.api("GET", "p1", None).await;
    assert_eq!(view["props"], json!({"title": "old"}), "{view}");
    db(&s.db)
        .execute_batch("DROP TRIGGER refuse_rows;")
        .unwrap();
    let (status, v) = s
        .api(
            "POST",
            "p1/props",
            Some(json!({"props": {"title": "newer"}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["sequence"], view["sequence"].as_u64().unwrap() + 1, "{v}");
    s.stop().await;
}

#[tokio::test]
async fn a_host_context_update_writes_the_host_context_alone() {
    let mut s = Server::start().await;
    s.create("h1", json!({})).await;
    let big: String = "x".repeat(100_000);
    let (status, _) = s
        .api("POST", "h1/props", Some(json!({"props": {"big": big}})))
        .await;
    assert_eq!(status, 200);
    let (mut c, _) = s.subscribed("h1").await;
    // Every write of the session row's record (with its props) is logged.
    db(&s.db)
        .execute_batch(
            "CREATE TABLE record_writes (n INTEGER);
             CREATE TRIGGER log_record AFTER UPDATE OF record ON ggui_sessions
             BEGIN INSERT INTO record_writes VALUES (1); END;",
        )
        .unwrap();
    let mut last = Value::Null;
    for i in 0..50 {
        last = json!({"platform": "web", "locale": "en-US", "containerDimensions": {"height": i}});
        c.send(json!({"type": "host_context_observed", "payload": {"sessionId": "h1", "hostContext": last}}))
            .await;
    }
    assert!(c.until_pong().await.is_empty());
    restart(&mut s).await;
    assert_eq!(
        count(&s.db, "SELECT COUNT(*) FROM record_writes"),
        0,
        "the row with its props was rewritten for a host context"
    );
    let (_, view) = s.api("GET", "h1", None).await;
    assert_eq!(
        view["hostContext"], last,
        "the latest host context survives a restart"
    );
    assert_eq!(view["props"]["big"].as_str().map(str::len), Some(100_000));
    s.stop().await;
}

/// Actions sent one after another on one socket are stored a batch per
/// commit (group commit), each acknowledged once its batch is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_actions_share_commits_and_are_each_acked_in_order() {
    let mut config = hostwire::ggui::GguiConfig::default();
    config.channel.rate_per_second = 10_000.0;
    config.channel.rate_burst = 10_000;
    let mut s = Server::with(config).await;
    s.create(
        "g1",
        json!({"actionSpec": {"pick": {"schema": {"type": "object", "properties": {"id": {"type": "integer"}}}}}}),
    )
    .await;
    let (mut c, _) = s.subscribed("g1").await;
    const N: u64 = 400;
    let commits_before = s.metric("hostwire_store_write_seconds_count").await;
    for i in 0..N {
        c.send_text(&action("g1", "pick", json!({"id": i}), &format!("r{i}")).to_string())
            .await;
    }
    for i in 0..N {
        let ack = c.recv().await;
        assert_eq!(
            (ack["type"].as_str(), ack["requestId"].as_str()),
            (Some("ack"), Some(format!("r{i}").as_str())),
            "{ack}"
        );
        assert_eq!(ack["payload"]["sequence"], i + 1, "{ack}");
    }
    let commits = s.metric("hostwire_store_write_seconds_count").await - commits_before;
    eprintln!("{N} actions in {commits} commits");
    // One commit per action was the old way; frames that wait while a
    // commit is under way share the next one.
    assert!(commits <= N / 4, "{commits} commits for {N} actions");
    assert_eq!(
        count(
            &s.db,
            "SELECT COUNT(*) FROM ggui_ledger WHERE session_id = 'g1'"
        ),
        N as i64
    );
    s.stop().await;
}

/// A subscriber replayed changes that the store then refused is closed
/// (1011) instead of being left with entries that no longer exist; the
/// actions are answered `APPEND_FAILED`. The frames are held behind a
/// costly validation, so they are handled in one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_changes_the_store_refused_closes_the_subscriber() {
    let mut s = Server::start().await;
    s.create(
        "f1",
        json!({"actionSpec": {"pick": {"schema": {"type": "object", "properties": {"id": {"type": "string"}}}}}}),
    )
    .await;
    let (mut c, _) = s.subscribed("f1").await;
    db(&s.db)
        .execute_batch(
            "CREATE TRIGGER refuse_ledger BEFORE INSERT ON ggui_ledger
             BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    // Validated off the actor (past the inline budget); the two frames
    // after it wait for it in the channel. The three leave in one write,
    // so that the two are queued before the first one's write is refused
    // even when this test's task runs late.
    let big = "x".repeat(64 * 1024);
    let frames = [
        action("f1", "pick", json!({"id": big}), "big"),
        action("f1", "pick", json!({"id": "small"}), "small"),
        json!({"type": "subscribe", "requestId": "again", "payload": {"sessionId": "f1", "fromSeq": 0, "sinceSequence": 0}}),
    ];
    for f in frames {
        futures_util::SinkExt::feed(&mut c.ws, Message::Text(f.to_string().into()))
            .await
            .unwrap();
    }
    futures_util::SinkExt::flush(&mut c.ws).await.unwrap();
    for id in ["big", "small"] {
        let e = c.expect_error("APPEND_FAILED").await;
        assert_eq!(e["requestId"], id, "{e}");
    }
    assert_eq!(c.ended().await, Ended::Closed(1011));
    // What the store holds is what a new subscriber is replayed: nothing.
    db(&s.db)
        .execute_batch("DROP TRIGGER refuse_ledger;")
        .unwrap();
    let mut d = s.client_for("f1").await;
    d.send(json!({"type": "subscribe", "requestId": "fresh", "payload": {"sessionId": "f1", "fromSeq": 0, "sinceSequence": 0}}))
        .await;
    let frames = d.until_pong().await;
    assert!(
        frames.iter().all(|f| f["type"] == "ack"),
        "replayed what was not stored: {frames:?}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_session_created_on_a_failing_store_is_not_acknowledged_and_not_kept() {
    let mut s = Server::start().await;
    db(&s.db)
        .execute_batch(
            "CREATE TRIGGER refuse_sessions BEFORE INSERT ON ggui_sessions
             BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    let (status, v) = s.api("PUT", "c1", Some(json!({}))).await;
    assert_eq!(status, 503, "a creation acknowledged unstored: {v}");
    let (status, v) = s.api("GET", "c1", None).await;
    assert_eq!(status, 404, "kept though not stored: {v}");
    db(&s.db)
        .execute_batch("DROP TRIGGER refuse_sessions;")
        .unwrap();
    let (status, v) = s.api("PUT", "c1", Some(json!({}))).await;
    assert_eq!((status, &v["created"]), (201, &json!(true)), "{v}");
    restart(&mut s).await;
    let (status, v) = s.api("GET", "c1", None).await;
    assert_eq!(status, 200, "an acknowledged creation lost: {v}");
    s.stop().await;
}

#[tokio::test]
async fn an_emit_and_a_version_on_a_failing_store_are_not_acknowledged() {
    let mut s = Server::start().await;
    s.create("e1", json!({"streamSpec": {"log": {"replay": "all"}}}))
        .await;
    db(&s.db)
        .execute_batch(
            "CREATE TRIGGER refuse_stream BEFORE INSERT ON ggui_stream
             BEGIN SELECT RAISE(ABORT, 'disk full'); END;
             CREATE TRIGGER refuse_rows BEFORE UPDATE ON ggui_sessions
             BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    let (status, v) = s
        .api(
            "POST",
            "e1/emit",
            Some(json!({"channel": "log", "payload": {"n": 1}})),
        )
        .await;
    assert_eq!((status, &v["code"]), (503, &json!("APPEND_FAILED")), "{v}");
    let (status, v) = s
        .api("PUT", "e1/version", Some(json!({"version": "v9"})))
        .await;
    assert_eq!((status, &v["code"]), (503, &json!("APPEND_FAILED")), "{v}");
    db(&s.db)
        .execute_batch("DROP TRIGGER refuse_stream; DROP TRIGGER refuse_rows;")
        .unwrap();
    s.emit("e1", "log", json!({"n": 2})).await;
    s.stop().await;
}
