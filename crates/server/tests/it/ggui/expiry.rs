//! ggui sessions nobody uses expire: no subscriber, no agent call for the
//! idle time and the session is gone with its rows, also after a restart;
//! a subscribed one and one its agent calls stay.

use crate::support::ggui::*;
use hostwire::ggui::GguiConfig;
use serde_json::json;

const IDLE_TTL_MS: u64 = 60_000;

fn rows(path: &std::path::Path, id: &str) -> i64 {
    let c = rusqlite::Connection::open(path).unwrap();
    c.busy_timeout(GUARD).unwrap();
    let mut n = 0;
    for sql in [
        "SELECT COUNT(*) FROM ggui_sessions WHERE session_id = ?1",
        "SELECT COUNT(*) FROM ggui_ledger WHERE session_id = ?1",
        "SELECT COUNT(*) FROM ggui_stream WHERE session_id = ?1",
    ] {
        n += c.query_row(sql, [id], |r| r.get::<_, i64>(0)).unwrap();
    }
    n
}

#[tokio::test]
async fn a_ggui_session_nobody_uses_expires_with_its_rows() {
    let config = GguiConfig {
        idle_ttl_ms: IDLE_TTL_MS,
        ..Default::default()
    };
    let mut s = Server::with(config.clone()).await;
    s.create("idle", json!({})).await;
    s.emit("idle", "log", json!({"line": 1})).await;
    s.create("watched", json!({})).await;
    let (_c, _) = s.subscribed("watched").await;
    s.create("called", json!({})).await;
    let ggui = std::sync::Arc::clone(&s.app.as_ref().unwrap().ggui);

    // Not yet: nothing expires.
    s.clock.advance_ms(IDLE_TTL_MS - 1);
    assert_eq!(ggui.expire_idle().await, 0);
    // The agent calls one: its time starts again.
    let (status, v) = s.api("GET", "called", None).await;
    assert_eq!(status, 200, "{v}");

    // The unused one expires: the agent API no longer knows it.
    s.clock.advance_ms(1);
    assert_eq!(ggui.expire_idle().await, 1);
    let (status, v) = s.api("GET", "idle", None).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["code"], "SESSION_NOT_FOUND", "{v}");
    for id in ["watched", "called"] {
        let (status, v) = s.api("GET", id, None).await;
        assert_eq!(status, 200, "{id}: {v}");
    }

    // Its rows are gone, and a restart does not bring it back.
    s.stop().await;
    assert_eq!(rows(&s.db, "idle"), 0);
    assert!(rows(&s.db, "watched") > 0);
    let dir = s.take_dir();
    let mut again = Server::start_at(config, s.db.clone(), s.clock.clone()).await;
    again.keep_dir(dir);
    let (status, v) = again.api("GET", "idle", None).await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = again.api("GET", "watched", None).await;
    assert_eq!(status, 200, "{v}");
}
