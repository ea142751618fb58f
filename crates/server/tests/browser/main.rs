//! Hosted sessions played in a real browser: the device page
//! (`/memizy/play`) in headless Chromium, a board and three controllers
//! each in its own browser, against the server on 127.0.0.1 port 0, with
//! test plugins of our own (`quiz.html`, `hostile.html`: SPEC 1.0 against
//! Penpal 7.0.6). Screenshots of the lobby, a running game and the results
//! go to `target/tmp/browser-screenshots/`.

mod support;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use support::*;

/// A controller page in the lobby, its view a controller.
const CONTROLLER_IN_LOBBY: &str =
    "document.body.dataset.phase === 'lobby' && document.body.dataset.view === 'controller'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_game_from_lobby_to_results() {
    let rig = Rig::start().await;
    let server = &rig.server;
    let s = server
        .create(QUIZ_HTML, &[("p1", "Ada"), ("p2", "Bo")])
        .await;
    let board = rig
        .open(
            &server.link(&s, &s.host),
            "document.body.dataset.phase === 'lobby' && document.body.dataset.players === '2'",
            "the lobby with two players",
        )
        .await;
    // The host adds the third player on the page and hands out its link.
    let invite = add_player(&board, "Cy").await;
    until(
        &board,
        "document.body.dataset.players === '3'",
        "three players",
    )
    .await;
    let mut controllers = Vec::new();
    for link in [
        server.link(&s, &s.players["p1"]),
        server.link(&s, &s.players["p2"]),
        invite,
    ] {
        controllers.push(
            rig.open(&link, CONTROLLER_IN_LOBBY, "a controller in the lobby")
                .await,
        );
    }
    let p3 = eval(&controllers[2], "window.hostwirePage.info.player").await;
    let p3 = p3.as_str().unwrap().to_owned();
    screenshot(&board, "lobby").await;

    click(&board, "#btn-start").await;
    // getAsset answers a Blob with the file's bytes and type; an unknown
    // key's error keeps the SPEC's `[CODE] message` form.
    let asset = in_plugin(
        &controllers[0],
        "document.body.dataset.asset",
        "the cover asset",
    )
    .await;
    assert_eq!(asset, json!("blob:image/png:300:0,1,2,3"));
    let missing = in_plugin(
        &controllers[0],
        "document.body.dataset.assetError",
        "the unknown asset",
    )
    .await;
    assert!(
        missing.as_str().unwrap().starts_with("[ASSET_NOT_FOUND] "),
        "{missing}"
    );
    // Question 1: Ada and Bo right, Cy wrong.
    answer(&controllers[0], 0, "j").await;
    answer(&controllers[1], 0, "j").await;
    answer(&controllers[2], 0, "m").await;
    in_plugin(
        &board,
        "document.body.dataset.q === '1'",
        "question 2 on the board",
    )
    .await;
    screenshot(&board, "running").await;
    // The host pauses and resumes: every device's plugin hears it.
    click(&board, "#btn-pause").await;
    in_plugin(
        &controllers[1],
        "document.body.dataset.paused === 'true'",
        "the pause on a controller",
    )
    .await;
    click(&board, "#btn-resume").await;
    in_plugin(
        &controllers[1],
        "document.body.dataset.paused === 'false'",
        "the resume on a controller",
    )
    .await;
    in_plugin(
        &controllers[0],
        "document.body.dataset.q === '1' && document.querySelector('button.choice')",
        "question 2 on Ada's phone",
    )
    .await;
    screenshot(&controllers[0], "running-controller").await;
    // Question 2 (false is right): Ada right, Bo and Cy wrong.
    answer(&controllers[0], 1, "false").await;
    answer(&controllers[1], 1, "true").await;
    answer(&controllers[2], 1, "true").await;
    until(
        &board,
        "document.body.dataset.results === 'shown'",
        "the results on the board",
    )
    .await;
    // The board's `end` was answered: the result is durable.
    in_plugin(
        &board,
        "document.body.dataset.resultStored === 'true'",
        "end() answered",
    )
    .await;
    screenshot(&board, "results").await;

    let shown = board_results(&board).await;
    let expected: BTreeMap<String, i64> =
        [("p1".to_owned(), 2), ("p2".to_owned(), 1), (p3.clone(), 0)].into();
    assert_eq!(shown, expected, "the board shows the game's scores");
    // What the server stored is what the board shows.
    let v = server.status(&s).await;
    assert_eq!(v["phase"], "finished", "{v}");
    let stored: BTreeMap<String, i64> = v["result"]["scores"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, n)| (k.clone(), n.as_f64().unwrap() as i64))
        .collect();
    assert_eq!(stored, shown);
    use hostwire_store::sessions::SessionStore;
    let kept: Value =
        serde_json::from_str(&server.store.load_result(&s.id).unwrap().unwrap()).unwrap();
    assert_eq!(kept["scores"], v["result"]["scores"]);
    // Every recordAnswer is in the store and in the players' progress.
    assert_eq!(server.store.count_answers(&s.id).unwrap(), 6);
    let progress = server.store.load_progress("p1", "set-planets").unwrap();
    let items: Vec<&str> = progress.iter().map(|(i, _)| i.as_str()).collect();
    assert!(
        items.contains(&"q1") && items.contains(&"q2"),
        "{progress:?}"
    );
    // The recording (SPEC 10): the authority's InitPayload with the set in
    // display order and the seed, the start, every answer with its sender
    // and game time, the pause and the end; kept in the store too.
    let rec = server.recording(&s).await;
    assert_eq!(
        rec["displaySeed"],
        json!(s.id),
        "the seed is the session id"
    );
    assert_eq!(rec["init"]["session"]["view"], "board");
    assert_eq!(
        rec["init"]["set"]["items"][0]["correctId"], "j",
        "the authority's full items"
    );
    let entries = rec["entries"].as_array().unwrap();
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    for k in ["start", "pause", "resume", "end"] {
        assert!(kinds.contains(&k), "{k} in {kinds:?}");
    }
    let answers: Vec<(String, String)> = entries
        .iter()
        .filter(|e| e["message"]["data"]["type"] == "answer")
        .map(|e| {
            assert!(e["gameTimeMs"].as_f64().is_some(), "{e}");
            (
                e["from"].as_str().unwrap().to_owned(),
                e["message"]["data"]["choice"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(answers.len(), 6, "{answers:?}");
    assert!(answers.contains(&("p1".to_owned(), "false".to_owned())));
    assert!(answers.contains(&(p3.clone(), "m".to_owned())));
    let stored = server.store.load_recording(&s.id).unwrap().unwrap();
    let kept: Value = serde_json::from_str(
        &hostwire::sessions::recording::document(&s.id, &stored)
            .unwrap()
            .text,
    )
    .unwrap();
    assert_eq!(kept["entries"].as_array().unwrap().len(), entries.len());
    for c in controllers {
        c.close().await.unwrap();
    }
    board.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_board_reloaded_mid_game_comes_back_from_its_snapshot() {
    let rig = Rig::start().await;
    let (_s, board, cs) = rig.started(QUIZ_HTML, THREE).await;
    answer(&cs[0], 0, "j").await;
    // The board kept Ada's answer in a snapshot the server acknowledged.
    in_plugin(
        &board,
        "document.querySelector('tr[data-player=p1] .score').textContent === '1' && Number(document.body.dataset.saved) >= 2",
        "Ada's point saved on the board",
    )
    .await;
    board.refresh().await.unwrap();
    // The controllers were told the authority was away, then back.
    for c in &cs[1..] {
        until(
            c,
            "document.body.dataset.overlaySeen === 'true'",
            "the waiting overlay",
        )
        .await;
        until(
            c,
            "document.body.dataset.overlay === 'hidden'",
            "the overlay gone",
        )
        .await;
    }
    // The recreated board has Ada's point (no start() again), and the game goes on.
    in_plugin(
        &board,
        "document.body.dataset.q === '0' && document.querySelector('tr[data-player=p1] .score').textContent === '1'",
        "the board resumed at question 1 with Ada's point",
    )
    .await;
    answer(&cs[1], 0, "j").await;
    answer(&cs[2], 0, "v").await;
    in_plugin(
        &board,
        "document.body.dataset.q === '1'",
        "question 2 after the reload",
    )
    .await;
    in_plugin(
        &cs[0],
        "document.body.dataset.q === '1' && document.body.dataset.score === '1'",
        "Ada at question 2 with her point",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_closed_and_reopened_rejoins_as_the_same_player() {
    let rig = Rig::start().await;
    let server = &rig.server;
    let (s, board, mut cs) = rig.started(QUIZ_HTML, THREE).await;
    answer(&cs[0], 0, "j").await;
    in_plugin(
        &board,
        "document.querySelector('tr[data-player=p1] .score').textContent === '1'",
        "Ada's point",
    )
    .await;
    // Ada's page is closed (her browser with it).
    let gone = cs.remove(0);
    gone.close().await.unwrap();
    /// Whether the board's roster shows `p` connected.
    fn shown(p: &str, connected: bool) -> String {
        format!("document.querySelector('#players li[data-player={p}]').dataset.connected === '{connected}'")
    }
    until(&board, &shown("p1", false), "Ada shown disconnected").await;
    // The same link again: Ada, with her point, at the same question.
    cs.insert(
        0,
        rig.open(
            &server.link(&s, &s.players["p1"]),
            "document.body.dataset.view === 'controller'",
            "Ada's page again",
        )
        .await,
    );
    in_plugin(
        &cs[0],
        "document.body.dataset.player === 'p1' && document.body.dataset.q === '0' && document.body.dataset.score === '1' && document.querySelector('#me').dataset.player === 'p1'",
        "Ada back as p1 with her point",
    )
    .await;
    until(&board, &shown("p1", true), "Ada shown connected").await;
    let v = server.status(&s).await;
    assert_eq!(
        v["players"].as_array().unwrap().len(),
        3,
        "no new player: {v}"
    );
    // Bo's tab goes to another page (which a browser may keep in its
    // back-forward cache): his page leaves the session, and his link
    // brings him back.
    cs[1].goto("about:blank").await.unwrap();
    until(&board, &shown("p2", false), "Bo shown disconnected").await;
    cs[1]
        .goto(&server.link(&s, &s.players["p2"]))
        .await
        .unwrap();
    in_plugin(
        &cs[1],
        "document.body.dataset.player === 'p2' && document.body.dataset.q === '0'",
        "Bo back",
    )
    .await;
    // The game goes on with them.
    answer(&cs[1], 0, "m").await;
    answer(&cs[2], 0, "j").await;
    in_plugin(&board, "document.body.dataset.q === '1'", "question 2").await;
    answer(&cs[0], 1, "false").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rates_and_sizes_are_refused_through_the_page_and_the_game_goes_on() {
    let rig = Rig::start().await;
    let (_s, board, cs) = rig.started(QUIZ_HTML, THREE).await;
    into_plugin(&cs[0]).await;
    click(&cs[0], "#flood").await;
    let codes = until(
        &cs[0],
        "document.getElementById('errors').dataset.flood === 'done' && document.getElementById('errors').dataset.codes",
        "the flood's answers",
    )
    .await;
    assert!(codes.as_str().unwrap().contains("RATE_LIMITED"), "{codes}");
    click(&cs[0], "#big").await;
    let codes = until(
        &cs[0],
        "document.getElementById('errors').dataset.big === 'done' && document.getElementById('errors').dataset.codes",
        "the large message's answer",
    )
    .await;
    assert!(
        codes.as_str().unwrap().contains("MESSAGE_TOO_LARGE"),
        "{codes}"
    );
    to_page(&cs[0]).await;
    // Still in the game: everyone answers and the board moves on.
    for c in &cs {
        answer(c, 0, "j").await;
    }
    in_plugin(
        &board,
        "document.body.dataset.q === '1'",
        "question 2 after the refusals",
    )
    .await;
    until(
        &cs[0],
        "document.body.dataset.link === 'online'",
        "the flooding page still online",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_plugin_is_contained() {
    let rig = Rig::start().await;
    let server = &rig.server;
    // Another origin the plugin tries to reach: it must see no connection.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let steal = format!("http://{}/steal", trap.local_addr().unwrap());
    let plugin = HOSTILE_HTML.replace("__STEAL_URL__", &steal);
    let (s, board, cs) = rig.started(&plugin, THREE).await;
    let play_url = server.link(&s, &s.players["p1"]);
    into_plugin(&cs[0]).await;
    click(&cs[0], "#attack").await;
    let flood = until(&cs[0], "document.body.dataset.flood", "the attack's end").await;
    let flood: Value = serde_json::from_str(flood.as_str().unwrap()).unwrap();
    let refused = flood["RATE_LIMITED"].as_u64().unwrap_or(0);
    assert!(refused >= 1000, "the flood is rate limited: {flood}");
    let d0 = eval(&cs[0], "Object.assign({}, document.body.dataset)").await;
    assert_eq!(d0["fetch"], "blocked", "{d0}");
    assert!(
        d0["violations"]
            .as_str()
            .unwrap_or("")
            .contains("connect-src"),
        "the CSP stopped the connection: {d0}"
    );
    to_page(&cs[0]).await;
    // The top page is still the device page, online.
    let url = cs[0].current_url().await.unwrap();
    assert_eq!(url.as_str(), play_url, "top.location was not changed");
    until(
        &cs[0],
        "document.body.dataset.link === 'online'",
        "the hostile device's page online",
    )
    .await;
    // Other devices are unaffected: a ping of Bo reaches the board.
    into_plugin(&cs[1]).await;
    click(&cs[1], "#ping").await;
    until(
        &cs[1],
        "document.body.dataset.pinged === 'ok'",
        "Bo's ping answered",
    )
    .await;
    in_plugin(
        &board,
        "document.body.dataset.pings_p2 === '1'",
        "Bo's ping on the board",
    )
    .await;
    assert_eq!(
        eval(&board, "document.body.dataset.link").await,
        json!("online")
    );
    // No forged `end` ended the game (a controller is not the authority).
    let v = server.status(&s).await;
    assert_eq!(v["phase"], "running", "{v}");
    match trap.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the plugin reached another origin: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_gets_a_clear_message() {
    let rig = Rig::start().await;
    let server = &rig.server;
    let s = server.create(QUIZ_HTML, &[("p1", "Ada")]).await;
    let c = rig
        .open(
            &server.link(&s, "not-the-token"),
            "document.body.dataset.failure === '401'",
            "the bad-token page",
        )
        .await;
    let text = eval(&c, "document.getElementById('message').textContent").await;
    assert!(
        text.as_str()
            .unwrap()
            .contains("token is wrong or has expired"),
        "{text}"
    );
    // The front door says what the server is and leads to the device page.
    c.goto(&format!("{}/", server.http)).await.unwrap();
    let t = until(&c, "document.body.textContent", "the front door").await;
    let t = t.as_str().unwrap();
    assert!(
        t.contains("/memizy/play") && t.contains("/ggui/ws") && t.contains("\"ok\": true"),
        "{t}"
    );
    // The browser's profile went to the driver's own directory, and the
    // directory goes with the driver: test runs leave nothing in /tmp.
    let tmp = rig.driver.tmp_dir().to_owned();
    let made: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        made.iter().any(|n| n.starts_with("org.chromium.Chromium")),
        "the browser's files are not in its driver's directory: {made:?}"
    );
    drop(c);
    drop(rig);
    assert!(!tmp.exists(), "{} was left behind", tmp.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_importing_the_sdk_from_its_cdn_plays_offline() {
    // No internet is needed: the CDN import is pointed at the server's copy.
    let rig = Rig::start_with_sdk(Some(TEST_SDK_MJS)).await;
    let (_s, board, cs) = rig.started(&quiz_through_the_sdk(), &[("p1", "Ada")]).await;
    for c in [&board, &cs[0]] {
        let sdk = in_plugin(
            c,
            "document.body.dataset.ready === 'true' && document.body.dataset.sdk",
            "the plugin ready, with the SDK from this server",
        )
        .await;
        assert_eq!(sdk, json!("hostwire-test-sdk"));
    }
    answer(&cs[0], 0, "j").await;
    answer(&cs[0], 1, "false").await;
    assert_eq!(
        results_shown(&board).await,
        BTreeMap::from([("p1".to_owned(), 2)])
    );
}

/// The settings a plugin's `InitPayload` carried, as the quiz shows them.
async fn plugin_settings(c: &fantoccini::Client, when: &str, what: &str) -> Value {
    let v = in_plugin(
        c,
        &format!("({when}) && document.body.dataset.settings"),
        what,
    )
    .await;
    serde_json::from_str(v.as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_screen_sets_what_the_boards_plugin_gets() {
    let rig = Rig::start().await;
    let server = &rig.server;
    let s = server.create(QUIZ_HTML, &[("p1", "Ada")]).await;
    // The host's settings screen: the plugin in view `settings`, in the lobby.
    let host = rig
        .open(
            &format!(
                "{}/memizy/play?view=settings#session={}&token={}",
                server.http, s.id, s.host
            ),
            "document.body.dataset.view === 'settings' && document.body.dataset.phase === 'lobby'",
            "the settings screen",
        )
        .await;
    let first = plugin_settings(
        &host,
        "document.getElementById('apply')",
        "the settings screen's plugin",
    )
    .await;
    assert_eq!(first, json!({"rounds": 2}), "the manifest's default");
    // Not valid yet: the host's Start is disabled.
    into_plugin(&host).await;
    click(&host, "#invalid").await;
    until(
        &host,
        "document.body.dataset.applied === 'invalid'",
        "the refusal kept",
    )
    .await;
    to_page(&host).await;
    until(
        &host,
        "document.getElementById('btn-start').disabled",
        "Start disabled while the settings are not valid",
    )
    .await;
    // One round: valid again, Start enabled.
    into_plugin(&host).await;
    let rounds = host
        .find(fantoccini::Locator::Css("#rounds"))
        .await
        .unwrap();
    rounds.clear().await.unwrap();
    rounds.send_keys("1").await.unwrap();
    click(&host, "#apply").await;
    until(
        &host,
        "document.body.dataset.applied === '1'",
        "rounds kept",
    )
    .await;
    to_page(&host).await;
    until(
        &host,
        "!document.getElementById('btn-start').disabled",
        "Start enabled again",
    )
    .await;
    // The same browser on the board's link: Start, and the board's plugin
    // gets the setting in its InitPayload.
    host.goto(&server.link(&s, &s.host)).await.unwrap();
    until(
        &host,
        "document.body.dataset.view === 'board' && document.body.dataset.phase === 'lobby'",
        "the board in the lobby",
    )
    .await;
    click(&host, "#btn-start").await;
    let got = plugin_settings(&host, "true", "the board's settings").await;
    assert_eq!(got, json!({"rounds": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_solo_game_plays_on_one_page() {
    let rig = Rig::start().await;
    let server = &rig.server;
    let s = server
        .create_with(
            QUIZ_HTML,
            json!({"mode": "solo", "players": [{"id": "me", "name": "Ada", "isHost": true}]}),
        )
        .await;
    let page = rig.in_lobby(&s, &s.host).await;
    click(&page, "#btn-start").await;
    in_plugin(
        &page,
        "document.body.dataset.view === 'solo' && document.body.dataset.player === 'me'",
        "the solo instance",
    )
    .await;
    // The one instance is the authority and answers itself.
    answer(&page, 0, "j").await;
    answer(&page, 1, "true").await;
    assert_eq!(
        results_shown(&page).await,
        BTreeMap::from([("me".to_owned(), 1)])
    );
    let v = server.status(&s).await;
    assert_eq!(v["phase"], "finished", "{v}");
    assert_eq!(v["result"]["scores"]["me"].as_f64(), Some(1.0), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_joining_after_the_start_plays_on() {
    let rig = Rig::start().await;
    let (_s, board, cs) = rig.started(QUIZ_HTML, &[("p1", "Ada")]).await;
    answer(&cs[0], 0, "j").await;
    in_plugin(&board, "document.body.dataset.q === '1'", "question 2").await;
    // The host adds Cy while the game runs; Cy opens the link.
    let invite = add_player(&board, "Cy").await;
    let cy = rig
        .open(
            &invite,
            "document.body.dataset.view === 'controller'",
            "Cy's page",
        )
        .await;
    let cy_id = eval(&cy, "window.hostwirePage.info.player").await;
    let cy_id = cy_id.as_str().unwrap().to_owned();
    // Cy gets the game as it stands, and the board counts Cy in.
    in_plugin(
        &cy,
        "document.body.dataset.q === '1' && document.querySelector('button.choice:not([disabled])')",
        "Cy at question 2",
    )
    .await;
    in_plugin(
        &board,
        &format!("document.querySelector('tr[data-player={cy_id}]')"),
        "Cy on the board",
    )
    .await;
    answer(&cs[0], 1, "false").await;
    answer(&cy, 1, "false").await;
    assert_eq!(
        results_shown(&board).await,
        BTreeMap::from([("p1".to_owned(), 2), (cy_id, 1)])
    );
}

/// How far the test server's clock is ahead of the browsers'.
const SERVER_AHEAD_MS: u64 = 3_600_000;
/// How far apart two readings of session time may be: the page's sample
/// of the server's clock and the moments of reading (a local round trip).
const SESSION_TIME_TOLERANCE_MS: f64 = 1_000.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_device_reads_the_servers_session_time() {
    // The server's clock an hour ahead of the devices': the pages correct
    // the SessionClock's offset, so the plugins' session time is the server's.
    let rig = Rig::start_with(None, Arc::new(AheadClock(SERVER_AHEAD_MS))).await;
    let server = &rig.server;
    let (s, board, cs) = rig.started(QUIZ_HTML, &[("p1", "Ada")]).await;
    for (c, who) in [(&board, "the board"), (&cs[0], "Ada's controller")] {
        let (st, v) = server
            .request(
                "GET",
                &format!("/memizy/play/api/{}", s.id),
                Some(&s.host),
                None,
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let at_server =
            v["serverTime"].as_f64().unwrap() + v["clock"]["offsetMs"].as_f64().unwrap();
        let on_device = in_plugin(c, "window.sessionNow()", "the plugin's session time").await;
        let skew = on_device.as_f64().unwrap() - at_server;
        assert!(
            skew.abs() < SESSION_TIME_TOLERANCE_MS,
            "{who} reads session time {skew} ms from the server's"
        );
    }
    // An answer stamped with the controller's session time is accepted at
    // the same session time on the server.
    answer(&cs[0], 0, "j").await;
    in_plugin(&board, "document.body.dataset.q === '1'", "question 2").await;
    let rec = server.recording(&s).await;
    let action = rec["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["message"]["data"]["type"] == "answer")
        .cloned()
        .unwrap();
    let skew = action["message"]["data"]["at"].as_f64().unwrap()
        - action["sessionTimeMs"].as_f64().unwrap();
    assert!(
        skew.abs() < SESSION_TIME_TOLERANCE_MS,
        "stamped {skew} ms from the server's session time: {action}"
    );
}
