//! Hosted sessions nobody uses expire: one left in its lobby is removed
//! with its rows after the lobby time, one in use stays.

use crate::support::server::Spawn;
use crate::support::session::*;
use hostwire_store::sessions::SessionStore;
use hostwire_store::SqliteStore;

const LOBBY_TTL_MS: u64 = 60_000;
const IDLE_TTL_MS: u64 = 60_000;

#[tokio::test]
async fn a_session_left_in_its_lobby_expires_with_its_rows() {
    let h = TestHost::start().await;
    let sessions = &h.server.as_ref().unwrap().sessions;
    sessions.use_expiry(LOBBY_TTL_MS, 10 * LOBBY_TTL_MS);
    let api = Api::of(&h);
    let (idle, idle_token) = api.create(&presenter_body(2)).await;
    let (used, used_token) = api.create(&presenter_body(2)).await;
    let (s, v) = api.op(&used, &used_token, "start").await;
    assert_eq!(s, 200, "{v}");

    // Not yet.
    h.clock.advance_ms(LOBBY_TTL_MS - 1);
    sessions.wake().await;
    api.status(&idle, &idle_token).await;

    // Expired: the API answers 404 for it, the started one is there.
    h.clock.advance_ms(1);
    sessions.wake().await;
    let (s, v) = api
        .request(
            "GET",
            &format!("/memizy/sessions/{idle}"),
            Some(&idle_token),
            None,
        )
        .await;
    assert_eq!(s, 404, "{v}");
    api.status(&used, &used_token).await;

    // Its rows are gone from the file, so a restart does not know it.
    let mut h = h;
    if let Some(server) = h.server.take() {
        server.shutdown().await;
    }
    let store = SqliteStore::open(&h.db).unwrap();
    assert!(store.load_session(&idle).unwrap().is_none());
    assert!(store.list_assets(&idle).unwrap().is_empty());
    assert!(store.load_player_tokens(&idle).unwrap().is_empty());
    assert!(store.load_session(&used).unwrap().is_some());
}

/// A server on the same file and clock as `h` had (after `h` stopped).
async fn restarted(h: &TestHost) -> hostwire::app::App {
    Spawn {
        sessions_durable: true,
        ..Spawn::new(relay_config())
    }
    .start_at(&h.db, &h.clock)
    .await
}

#[tokio::test]
async fn a_session_stopped_by_a_restart_expires_when_nobody_uses_it() {
    let mut h = TestHost::start().await;
    let api = Api::of(&h);
    let (idle, idle_token) = api.create(&presenter_body(2)).await;
    let (used, used_token) = api.create(&presenter_body(2)).await;
    if let Some(server) = h.server.take() {
        server.shutdown().await;
    }
    let server = restarted(&h).await;
    server.sessions.use_expiry(IDLE_TTL_MS, IDLE_TTL_MS);
    let api = Api {
        http: format!("http://{}", server.addr),
        ..Api::of(&h)
    };
    // Not brought back until it is used: nothing runs it, its rows stay.
    assert_eq!(server.sessions.expire_stopped().await, 0);
    assert!(SqliteStore::open(&h.db)
        .unwrap()
        .load_session(&idle)
        .unwrap()
        .is_some());

    h.clock.advance_ms(IDLE_TTL_MS - 1);
    assert_eq!(server.sessions.expire_stopped().await, 0);
    // Its host reads the other: it comes back, in its lobby.
    assert_eq!(api.status(&used, &used_token).await["phase"], "lobby");
    h.clock.advance_ms(1);
    // Removed now, by this sweep or by the server's own (its first tick
    // runs at start and can come this late on a loaded machine): what is
    // checked is that it is gone.
    let swept = server.sessions.expire_stopped().await;
    assert!(swept <= 1, "{swept}");
    let (s, v) = api
        .request(
            "GET",
            &format!("/memizy/sessions/{idle}"),
            Some(&idle_token),
            None,
        )
        .await;
    assert_eq!(s, 404, "{v}");
    api.status(&used, &used_token).await;
    let store = SqliteStore::open(&h.db).unwrap();
    assert!(store.load_session(&idle).unwrap().is_none());
    assert!(store.list_assets(&idle).unwrap().is_empty());
    assert!(store.load_session(&used).unwrap().is_some());
    server.shutdown().await;
}

#[tokio::test]
async fn a_started_session_without_devices_expires_and_one_with_a_device_stays() {
    let h = TestHost::start().await;
    let sessions = &h.server.as_ref().unwrap().sessions;
    sessions.use_expiry(10 * IDLE_TTL_MS, IDLE_TTL_MS);
    let api = Api::of(&h);
    let (idle, idle_token) = api.create(&presenter_body(2)).await;
    let (used, used_token) = api.create(&presenter_body(2)).await;
    for (sid, token) in [(&idle, &idle_token), (&used, &used_token)] {
        let (s, v) = api.op(sid, token, "start").await;
        assert_eq!(s, 200, "{v}");
    }
    let (_board, _) = api.device(&used, "board", "board").await;

    h.clock.advance_ms(IDLE_TTL_MS - 1);
    sessions.wake().await;
    assert_eq!(api.status(&idle, &idle_token).await["phase"], "loading");
    // The status call above was a use: its time starts again.
    h.clock.advance_ms(IDLE_TTL_MS);
    sessions.wake().await;
    let (s, v) = api
        .request(
            "GET",
            &format!("/memizy/sessions/{idle}"),
            Some(&idle_token),
            None,
        )
        .await;
    assert_eq!(s, 404, "{v}");
    // The one with its board attached is in use.
    assert_eq!(api.status(&used, &used_token).await["phase"], "loading");
}
