//! What PlayerThree keeps durable, against the real SQLite file: a token
//! minted over the WebSocket is answered only once its record is
//! committed; the store holds no token's text; a finished match is
//! removed with its records once it has expired.

use crate::support::playerthree::*;
use hostwire_playerthree::tokens::TokenHash;
use serde_json::{json, Value};

/// A second connection to the server's database file.
fn db(path: &std::path::Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).unwrap();
    c.busy_timeout(GUARD).unwrap();
    c
}

/// Every text the PlayerThree tables hold (records and match rows).
fn stored_text(path: &std::path::Path) -> Vec<String> {
    let c = db(path);
    let mut out = Vec::new();
    for sql in [
        "SELECT body FROM playerthree_records",
        "SELECT id || ' ' || game || ' ' || operator_token FROM playerthree_matches",
    ] {
        let mut st = c.prepare(sql).unwrap();
        let rows = st.query_map([], |r| r.get::<_, String>(0)).unwrap();
        out.extend(rows.map(Result::unwrap));
    }
    out
}

fn token_hashes(path: &std::path::Path) -> Vec<String> {
    stored_text(path)
        .iter()
        .filter_map(|t| serde_json::from_str::<Value>(t).ok())
        .filter(|r| r["record"] == "token")
        .map(|r| r["tokenHash"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_token_minted_over_the_websocket_is_handed_out_only_once_stored() {
    let s = TestServer::start().await;
    let (id, op) = create_match(&s.http).await;
    let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, v) = s.join(&red).await;
    assert_eq!(v["ok"], true, "{v}");

    // The disk refuses token records: the mint is not answered with a
    // token that a restart would not know.
    db(&s.db)
        .execute_batch(
            "CREATE TRIGGER refuse_tokens BEFORE INSERT ON playerthree_records
             WHEN NEW.kind = 'token' BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    let r = o
        .expect_error(
            json!({"op": "mint", "seq": 1, "role": "red-scout"}),
            "internal",
        )
        .await;
    assert!(r.get("data").is_none(), "{r}");
    let before = token_hashes(&s.db).len();

    // Stored again: the answer comes once the record is committed.
    db(&s.db)
        .execute_batch("DROP TRIGGER refuse_tokens;")
        .unwrap();
    let d = o
        .expect_ok(json!({"op": "mint", "seq": 2, "role": "red-scout"}))
        .await;
    let token = d["token"].as_str().unwrap().to_owned();
    let hashes = token_hashes(&s.db);
    assert_eq!(hashes.len(), before + 1);
    assert!(
        hashes.contains(&TokenHash::of(&token).to_hex()),
        "the minted token's record is in the file when its answer arrives"
    );
    let (_, v) = s.join(&token).await;
    assert_eq!(v["data"]["role"], "red-scout", "{v}");

    // No token's text is anywhere in the store: only hashes.
    let text = stored_text(&s.db);
    for t in [&op, &red, &token] {
        assert!(
            text.iter().all(|r| !r.contains(t.as_str())),
            "{t} stored in clear"
        );
    }
    let op_hash = TokenHash::of(&op).to_hex();
    assert!(text.iter().any(|r| r.ends_with(&op_hash)));
}

#[tokio::test]
async fn a_finished_match_expires_after_its_time_with_its_rows() {
    let mut config = p3_config();
    config.finished_ttl_ms = 30_000;
    let s = TestServer::start_with(config).await;
    let (id, op) = create_match(&s.http).await;
    let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = s.join(&red).await;
    // Ridge ends by MAX_TICKS at the latest.
    for _ in 0..hostwire_playerthree::demo::MAX_TICKS {
        s.tick().await;
    }
    let report = o.recv_op("report").await;
    assert_eq!(report["team"], "red");
    // Finished, not yet expired: still there, its token still joins.
    s.advance(29_000).await;
    assert_eq!(s.p3().match_count(), 1);
    // A match created now is far from finished when the first expires.
    let (keep, _) = create_match(&s.http).await;
    let (_, v) = s.join(&red).await;
    assert_eq!(v["ok"], true, "{v}");
    // Expired: connections closed 1000, gone from the API and the store.
    s.advance(1_000).await;
    assert_eq!(o.ended().await, Ended::Closed(1000));
    assert_eq!(s.p3().match_count(), 1);
    let (status, _) = mint_raw(&s.http, &id, &op, json!({"kind": "spectator"})).await;
    assert_eq!(status, 404);
    let (_, v) = s.join(&red).await;
    assert_eq!(v["code"], "bad_token", "{v}");
    // The rows go behind the match: a graceful stop flushes them.
    let mut s = s;
    s.stop().await;
    let c = db(&s.db);
    let count = |sql: &str| -> i64 { c.query_row(sql, [&id], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT COUNT(*) FROM playerthree_matches WHERE id = ?1"),
        0
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM playerthree_records WHERE match_id = ?1"),
        0
    );
    let kept: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM playerthree_records WHERE match_id = ?1",
            [&keep],
            |r| r.get(0),
        )
        .unwrap();
    assert!(kept > 0, "the other match keeps its records");
}

fn policy_rows(path: &std::path::Path, id: &str) -> i64 {
    db(path)
        .query_row(
            "SELECT COUNT(*) FROM playerthree_records WHERE match_id = ?1 AND kind = 'policy'",
            [id],
            |r| r.get(0),
        )
        .unwrap()
}

#[tokio::test]
async fn a_mandate_on_a_failing_store_is_refused_and_an_accepted_one_survives_a_restart() {
    let mut s = TestServer::start().await;
    let (id, op) = create_match(&s.http).await;
    let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = s.join(&red).await;
    db(&s.db)
        .execute_batch(
            "CREATE TRIGGER refuse_policies BEFORE INSERT ON playerthree_records
             WHEN NEW.kind = 'policy' BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    o.expect_error(
        json!({"op": "mandate", "seq": 1, "role": "red-scout", "mandate": {"goal": "lost"}}),
        "internal",
    )
    .await;
    db(&s.db)
        .execute_batch("DROP TRIGGER refuse_policies;")
        .unwrap();
    let d = o
        .expect_ok(
            json!({"op": "mandate", "seq": 2, "role": "red-scout", "mandate": {"goal": "kept"}}),
        )
        .await;
    // The refused change was taken back: the version moved once.
    assert_eq!(d["policyVersion"], 1, "{d}");
    assert_eq!(policy_rows(&s.db, &id), 1, "durable when answered");
    drop(o);
    s.restart().await;
    let (mut o, _) = s.join(&red).await;
    let seats = o.recv_op("seats").await;
    let scout = seats["seats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["role"] == "red-scout")
        .unwrap();
    assert_eq!(scout["policyVersion"], 1, "{seats}");
    let stored: String = db(&s.db)
        .query_row(
            "SELECT body FROM playerthree_records WHERE match_id = ?1 AND kind = 'policy'",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    assert!(stored.contains("kept"), "{stored}");
    let d = o
        .expect_ok(
            json!({"op": "mandate", "seq": 3, "role": "red-scout", "mandate": {"goal": "next"}}),
        )
        .await;
    assert_eq!(d["policyVersion"], 2, "{d}");
}

#[tokio::test]
async fn one_matchs_failing_write_does_not_fail_another_matchs() {
    let s = TestServer::start().await;
    let mut owners = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (id, op) = create_match(&s.http).await;
        let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
        owners.push(s.join(&red).await.0);
        ids.push(id);
    }
    db(&s.db)
        .execute_batch(&format!(
            "CREATE TRIGGER refuse_one BEFORE INSERT ON playerthree_records
             WHEN NEW.match_id = '{}' BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
            ids[1]
        ))
        .unwrap();
    // The file is held: the first mandates' batch waits in it, and the
    // rest are queued behind it, into one batch (or all three are in the
    // first).
    let lock = db(&s.db);
    lock.execute_batch("BEGIN IMMEDIATE;").unwrap();
    let mandate =
        |seq| json!({"op": "mandate", "seq": seq, "role": "red-scout", "mandate": {"goal": "g"}});
    owners[0].send(mandate(1)).await;
    owners[1].send(mandate(1)).await;
    owners[2].send(mandate(1)).await;
    tokio::time::timeout(GUARD, async {
        while s.p3().store_pending() < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the mandates were not queued");
    lock.execute_batch("COMMIT;").unwrap();
    let answers: Vec<Value> =
        futures_util::future::join_all(owners.iter_mut().map(|o| o.result(1))).await;
    assert_eq!(answers[0]["ok"], true, "{:?}", answers);
    assert_eq!(answers[1]["ok"], false, "{:?}", answers);
    assert_eq!(answers[1]["code"], "internal", "{:?}", answers);
    assert_eq!(
        answers[2]["ok"], true,
        "another match's unit in the same batch: {:?}",
        answers
    );
    assert_eq!(policy_rows(&s.db, &ids[2]), 1);
}

#[tokio::test]
async fn a_mandate_flood_leaves_a_bounded_number_of_rows_and_none_after_the_end() {
    let s = TestServer::start().await;
    let (id, op) = create_match(&s.http).await;
    let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    // 200 KiB in all: within the token's inbound burst
    // (`INBOUND_BYTE_BURST_PER_TOKEN`), so the socket reads it at once.
    let pad = "m".repeat(1024);
    let mut accepted = 0;
    // A fresh connection every few writes: each has its own rate.
    for _ in 0..20 {
        let (mut o, _) = s.join(&red).await;
        for seq in 1..=5u64 {
            for role in ["red-scout", "red-guard"] {
                let r = o
                    .call(json!({"op": "mandate", "seq": seq, "role": role, "mandate": {"goal": pad}}))
                    .await;
                assert_eq!(r["ok"], true, "{r}");
                accepted += 1;
            }
        }
    }
    assert_eq!(accepted, 200);
    let (mut o, _) = s.join(&red).await;
    let rows = policy_rows(&s.db, &id);
    assert!(
        rows <= 2,
        "one policy row per seat, not one per write: {rows}"
    );
    // Ridge ends by MAX_TICKS at the latest; then owners write no more.
    for _ in 0..hostwire_playerthree::demo::MAX_TICKS {
        s.tick().await;
    }
    o.recv_op("report").await;
    o.expect_error(
        json!({"op": "mandate", "seq": 999, "role": "red-scout", "mandate": {"goal": "late"}}),
        "paused",
    )
    .await;
}

#[tokio::test]
async fn a_match_nobody_joins_expires_after_its_time_with_its_rows() {
    let mut config = p3_config();
    config.unjoined_ttl_ms = 60_000;
    config.finished_ttl_ms = 3_600_000;
    let mut s = TestServer::start_with(config).await;
    let (idle, idle_op) = create_match(&s.http).await;
    let (used, used_op) = create_match(&s.http).await;
    let red = mint(
        &s.http,
        &used,
        &used_op,
        json!({"kind": "team", "team": "red"}),
    )
    .await;
    let (_o, v) = s.join(&red).await;
    assert_eq!(v["ok"], true, "{v}");
    // Not yet: both still there.
    s.advance(59_000).await;
    assert_eq!(s.p3().match_count(), 2);
    // The unjoined one is gone from the API; the joined one stays.
    s.advance(1_000).await;
    assert_eq!(s.p3().match_count(), 1);
    let (status, _) = mint_raw(&s.http, &idle, &idle_op, json!({"kind": "spectator"})).await;
    assert_eq!(status, 404);
    let (status, _) = mint_raw(&s.http, &used, &used_op, json!({"kind": "spectator"})).await;
    assert_eq!(status, 201);
    // Its rows are gone, and a restart does not bring it back.
    let metrics = std::sync::Arc::clone(&s.p3().metrics);
    s.stop().await;
    // Its expiry was counted once, though it came by a wake after the
    // clock moved (the match's task handles that time itself too).
    let expired = metrics
        .matches_expired
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(expired, 1);
    let c = db(&s.db);
    let count = |sql: &str, id: &str| -> i64 { c.query_row(sql, [id], |r| r.get(0)).unwrap() };
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM playerthree_matches WHERE id = ?1",
            &idle
        ),
        0
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM playerthree_records WHERE match_id = ?1",
            &idle
        ),
        0
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM playerthree_matches WHERE id = ?1",
            &used
        ),
        1
    );
    s.restart().await;
    assert_eq!(s.p3().match_count(), 1);
    let (status, _) = mint_raw(&s.http, &idle, &idle_op, json!({"kind": "spectator"})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_controller_change_on_a_failing_store_is_refused_and_taken_back() {
    let mut s = TestServer::start().await;
    let (id, op) = create_match(&s.http).await;
    let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = s.join(&red).await;
    let seat = o
        .expect_ok(json!({"op": "mint", "seq": 1, "role": "red-scout"}))
        .await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    o.expect_ok(json!({"op": "controller", "seq": 2, "role": "red-scout", "controller": {"kind": "agent", "supervised": true}}))
        .await;
    let (mut a, _) = s.join(&seat).await;
    let p = a
        .expect_ok(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "hold"}))
        .await;
    let proposal = p["proposal"].as_str().unwrap().to_owned();

    // The disk refuses controller records: the change is not acknowledged,
    // and it did not happen (the seat is still a supervised agent's, its
    // proposal still pending).
    db(&s.db)
        .execute_batch(
            "CREATE TRIGGER refuse_controllers BEFORE INSERT ON playerthree_records
             WHEN NEW.kind = 'controller' BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    let e = o
        .expect_error(
            json!({"op": "controller", "seq": 3, "role": "red-scout", "controller": {"kind": "human"}}),
            "internal",
        )
        .await;
    assert!(
        e["message"].as_str().unwrap_or("").contains("controller"),
        "{e}"
    );
    a.expect_error(
        json!({"op": "call", "seq": 2, "role": "red-scout", "method": "hold"}),
        "approval_pending",
    )
    .await;
    db(&s.db)
        .execute_batch("DROP TRIGGER refuse_controllers;")
        .unwrap();
    let r = o
        .expect_ok(json!({"op": "resolveApproval", "seq": 4, "role": "red-scout", "id": proposal, "approve": false}))
        .await;
    assert_eq!(r["status"], "rejected", "{r}");

    // Stored again: acknowledged once durable, and it survives a restart.
    o.expect_ok(
        json!({"op": "controller", "seq": 5, "role": "red-scout", "controller": {"kind": "human"}}),
    )
    .await;
    let rows: i64 = db(&s.db)
        .query_row(
            "SELECT COUNT(*) FROM playerthree_records WHERE match_id = ?1 AND kind = 'controller' AND body LIKE '%human%'",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 1, "durable when answered");
    drop((o, a));
    s.restart().await;
    let (mut a, _) = s.join(&seat).await;
    a.expect_error(
        json!({"op": "call", "seq": 1, "role": "red-scout", "method": "hold"}),
        "forbidden",
    )
    .await;
}

/// The rows a start-up reads for match `id` from the file (the store's
/// own load, as `PlayerThree::start` calls it).
fn rows_read_at_restore(path: &std::path::Path, id: &str) -> usize {
    use hostwire_store::playerthree::PlayerThreeStore;
    let store = hostwire_store::SqliteStore::open(path).unwrap();
    let m = store.load_matches().unwrap();
    m.iter().find(|m| m.id == id).unwrap().records.len()
}

/// The seats as an owner sees them, without who is connected.
async fn seats_of(s: &TestServer, token: &str) -> Value {
    let (mut o, _) = s.join(token).await;
    let mut seats = o.recv_op("seats").await["seats"].clone();
    for seat in seats.as_array_mut().unwrap() {
        seat.as_object_mut().unwrap().remove("live");
    }
    seats
}

#[tokio::test]
async fn a_restore_reads_a_bounded_number_of_rows_however_much_was_written() {
    let mut s = TestServer::start().await;
    let (id, op) = create_match(&s.http).await;
    let red = mint(&s.http, &id, &op, json!({"kind": "team", "team": "red"})).await;
    let (mut o, _) = s.join(&red).await;
    let seat = o
        .expect_ok(json!({"op": "mint", "seq": 1, "role": "red-scout"}))
        .await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    o.expect_ok(json!({"op": "controller", "seq": 2, "role": "red-scout", "controller": {"kind": "agent", "supervised": true}}))
        .await;
    drop(o);
    let pad = "m".repeat(1024);
    let mut read = Vec::new();
    // Each round writes mandates, proposals and their ends, agent replies
    // and a recorded tick; fresh connections each round (each has its own
    // rate).
    for _ in 0..3 {
        for _ in 0..8 {
            let (mut o, _) = s.join(&red).await;
            let (mut a, _) = s.join(&seat).await;
            for seq in 1..=5u64 {
                for role in ["red-scout", "red-guard"] {
                    o.expect_ok(json!({"op": "mandate", "seq": seq, "role": role, "mandate": {"goal": pad}}))
                        .await;
                }
                let p = a
                    .expect_ok(
                        json!({"op": "call", "seq": seq, "role": "red-scout", "method": "hold"}),
                    )
                    .await;
                o.expect_ok(json!({"op": "resolveApproval", "seq": 10 + seq, "role": "red-scout", "id": p["proposal"], "approve": seq % 2 == 0}))
                    .await;
                a.expect_ok(
                    json!({"op": "tell", "seq": 10 + seq, "roles": "all", "text": "on my way"}),
                )
                .await;
            }
            s.tick().await;
        }
        // One proposal left pending: a restore must bring it back.
        let (mut a, _) = s.join(&seat).await;
        a.expect_ok(json!({"op": "call", "seq": 1, "role": "red-scout", "method": "hold"}))
            .await;
        let before = seats_of(&s, &red).await;
        s.stop().await;
        read.push(rows_read_at_restore(&s.db, &id));
        s.restart().await;
        assert_eq!(seats_of(&s, &red).await, before, "restored as it was");
        // Its proposal is resolved after the restart, as before it.
        let pending = before
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["role"] == "red-scout")
            .unwrap()["pendingApproval"]
            .clone();
        let (mut o, _) = s.join(&red).await;
        o.expect_ok(json!({"op": "resolveApproval", "seq": 1, "role": "red-scout", "id": pending, "approve": false}))
            .await;
    }
    // What restore reads does not grow with what was written: the same
    // after each round, and small.
    assert!(read.iter().all(|r| *r == read[0]), "rows read: {read:?}");
    assert!(read[0] <= 24, "rows read: {read:?}");
}
