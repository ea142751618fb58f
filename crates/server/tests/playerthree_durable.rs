//! What PlayerThree keeps durable, against the real SQLite file: a token
//! minted over the WebSocket is answered only once its record is
//! committed; the store holds no token's text; a finished match is
//! removed with its records once it has expired.

mod playerthree_support;
use hostwire_playerthree::tokens::TokenHash;
use playerthree_support::*;
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
