//! A saved game continued after a restart of the real binary: the same
//! session and player ids, progress and plugin data intact, the board
//! recreated from its snapshot without `start()`, the session paused. And
//! the board reloading in a running game: messages to the authority are
//! refused while it is away, and it resumes from its snapshot.
//!
//! Every acknowledged session comes back after `kill -9`: a lobby as a
//! lobby, a running game from its latest acknowledged snapshot (saved or
//! not), a finished one as finished; and a scripted game killed at random
//! points many times never loses an acknowledged change.

use crate::support::process::Process;
use crate::support::session::*;
use serde_json::{json, Value};

struct Server {
    process: Process,
    api: Api,
}

impl Server {
    /// SIGKILL, and the process reaped.
    fn kill_9(mut self) {
        self.process.kill_9();
    }
}

fn data_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("hostwire-test-session-restart-")
        .tempdir()
        .unwrap()
}

/// The ids of the players a status lists, in roster order.
fn roster(status: &Value) -> Vec<String> {
    status["players"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| p["id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `old` killed with SIGKILL and a new server on `dir` that knows the
/// tokens `old`'s API answered.
fn restart(dir: &std::path::Path, old: Server) -> Server {
    let tokens = old.api.tokens.lock().unwrap().clone();
    old.kill_9();
    let s = spawn_server(dir);
    *s.api.tokens.lock().unwrap() = tokens;
    s
}

fn spawn_server(dir: &std::path::Path) -> Server {
    let process = Process::serve(
        dir,
        &["--allowed-origins", "*"],
        &[("HOSTWIRE_OPERATOR_TOKEN", OPERATOR)],
    );
    Server {
        api: Api {
            http: process.http(),
            ws: process.ws(""),
            tokens: Default::default(),
        },
        process,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_game_continues_after_a_restart_with_progress_and_plugin_data() {
    let dir = tempfile::Builder::new()
        .prefix("hostwire-test-session-restart-")
        .tempdir()
        .unwrap();
    let s = spawn_server(dir.path());
    let api = &s.api;
    // With a set asset: its file is in the store beside the session.
    let mut body = presenter_body(2);
    body["set"]["meta"]["assets"] =
        json!({"cover": {"type": "image", "value": "assets/cover.png", "mimeType": "image/png"}});
    body["assets"] = json!({"assets/cover.png": "iVBORw0KGgo="});
    let (sid, token) = api.create(&body).await;
    api.op(&sid, &token, "start").await;
    let (mut board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let (p2, _) = api.device(&sid, "controller", "p2").await;
    p2.call("ready", json!([])).await.unwrap();
    board.wait_for("start", GUARD).await.expect("start");
    p1.call(
        "recordAnswer",
        json!([{"itemId": "q1", "isCorrect": true, "answer": "j"}]),
    )
    .await
    .unwrap();
    p1.call("saveData", json!(["plugin", {"avatar": "fox"}]))
        .await
        .unwrap();
    p1.call("saveData", json!(["set", {"streak": 3}]))
        .await
        .unwrap();
    board
        .call("saveSnapshot", json!([{"round": 4, "scores": {"p1": 1}}]))
        .await
        .unwrap();
    let (st, v) = api.op(&sid, &token, "save").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["saved"]["sessionId"], sid.as_str());
    drop((board, p1, p2));
    drop(s);

    let s = spawn_server(dir.path());
    let api = &s.api;
    // Not running until continued.
    let (st, _) = api.op(&sid, &token, "pause").await;
    assert_eq!(st, 409);
    let (st, v) = api.op(&sid, &token, "continue").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["phase"], "running");
    assert_eq!(
        v["playerTokens"]["p1"],
        api.token_for(&sid, "controller", "p1").as_str()
    );
    assert!(
        v["clock"]["pausedAt"].is_number(),
        "continued paused: {}",
        v["clock"]
    );
    let (mut board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["session"]["id"], sid.as_str());
    assert_eq!(init["snapshot"], json!({"round": 4, "scores": {"p1": 1}}));
    board.call("ready", json!([])).await.unwrap();
    let (p1, init) = api.device(&sid, "controller", "p1").await;
    assert_eq!(init["data"]["plugin"], json!({"avatar": "fox"}));
    assert_eq!(init["data"]["set"], json!({"streak": 3}));
    assert_eq!(init["progress"]["q1"]["bucket"], 2, "{}", init["progress"]);
    p1.call("ready", json!([])).await.unwrap();
    // The bundle's file is served after the restart.
    let a = p1.call("getAsset", json!(["cover"])).await.unwrap();
    assert_eq!(
        (&a["base64"], &a["mimeType"], &a["size"]),
        (&json!("iVBORw0KGgo="), &json!("image/png"), &json!(8))
    );
    let (st, v) = api.op(&sid, &token, "resume").await;
    assert_eq!(st, 200, "{v}");
    assert!(v["clock"]["pausedAt"].is_null());
    // Recreated from the snapshot: never start().
    let calls = board.drain_calls();
    assert!(calls.iter().all(|c| c.method != "start"), "{calls:?}");
    p1.call("send", send_args(json!("authority"), json!("back")))
        .await
        .unwrap();
    let d = board
        .wait_for("deliver", GUARD)
        .await
        .expect("deliver after continue");
    assert_eq!(d.args[0]["data"], "back");
}

#[tokio::test]
async fn the_board_reloads_and_resumes_from_its_snapshot_while_messages_to_it_are_refused() {
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let (sid, token) = api.create(&presenter_body(2)).await;
    api.op(&sid, &token, "start").await;
    let (mut board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (mut p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let (p2, _) = api.device(&sid, "controller", "p2").await;
    p2.call("ready", json!([])).await.unwrap();
    board.wait_for("start", GUARD).await.expect("start");
    board
        .call("saveSnapshot", json!([{"round": 2}]))
        .await
        .unwrap();
    board.close();
    let c = p1
        .wait_for("authorityChanged", GUARD)
        .await
        .expect("authorityChanged");
    assert_eq!(c.args[0]["connected"], false);
    let r = p1
        .call("send", send_args(json!("authority"), json!("hello?")))
        .await;
    assert_eq!(r.unwrap_err().code, "AUTHORITY_UNAVAILABLE");
    // The board reloads: a new instance at the same address gets the snapshot.
    let (mut board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["snapshot"], json!({"round": 2}));
    // Still refused until the recreated authority is ready.
    let r = p1
        .call("send", send_args(json!("authority"), json!("now?")))
        .await;
    assert_eq!(r.unwrap_err().code, "AUTHORITY_UNAVAILABLE");
    board.call("ready", json!([])).await.unwrap();
    let c = p1
        .wait_for("authorityChanged", GUARD)
        .await
        .expect("authorityChanged back");
    assert_eq!(c.args[0]["connected"], true);
    p1.call("send", send_args(json!("authority"), json!("now")))
        .await
        .unwrap();
    let d = board
        .wait_for("deliver", GUARD)
        .await
        .expect("deliver to the reloaded board");
    assert_eq!(d.args[0]["data"], "now");
    assert!(board.drain_calls().iter().all(|c| c.method != "start"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lobby_survives_kill_9_with_its_players_tokens_and_settings() {
    let dir = data_dir();
    let s = spawn_server(dir.path());
    let api = &s.api;
    let mut body = presenter_body(2);
    body["settings"] = json!({"questionTime": 30});
    let (sid, token) = api.create(&body).await;
    let (st, v) = api
        .request(
            "POST",
            &format!("/memizy/sessions/{sid}/players"),
            Some(&token),
            Some(&json!({"id": "p3", "name": "Cyd", "user": "cyd@school"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = api
        .request(
            "DELETE",
            &format!("/memizy/sessions/{sid}/players/p2"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let before = api.status(&sid, &token).await;
    let s = restart(dir.path(), s);
    let api = &s.api;
    let after = api.status(&sid, &token).await;
    assert_eq!(after["phase"], "lobby", "{after}");
    assert_eq!(roster(&after), ["p1", "p3"], "{after}");
    assert_eq!(after["players"], before["players"]);
    assert_eq!(after["settings"]["questionTime"], 30, "{after}");
    // A player joins and the game starts after the restart.
    let (st, v) = api
        .request(
            "POST",
            &format!("/memizy/sessions/{sid}/players"),
            Some(&token),
            Some(&json!({"id": "p4", "name": "Dot"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(roster(&v), ["p1", "p3", "p4"]);
    let (st, v) = api.op(&sid, &token, "start").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["phase"], "loading");
    // The tokens answered before the restart still open their instances.
    let (mut board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["settings"]["questionTime"], 30);
    board.call("ready", json!([])).await.unwrap();
    let mut devices = Vec::new();
    for p in ["p1", "p3", "p4"] {
        let (d, _) = api.device(&sid, "controller", p).await;
        d.call("ready", json!([])).await.unwrap();
        devices.push(d);
    }
    board.wait_for("start", GUARD).await.expect("start");
    // The kicked player stays out.
    let kicked = Device::connect(
        &api.ws,
        &sid,
        "controller",
        "p2",
        &api.token_for(&sid, "controller", "p2"),
    )
    .await;
    if let Ok(d) = kicked {
        assert!(
            d.hello(PLUGIN_ID).await.is_err(),
            "the kicked player attached"
        );
    }
    s.kill_9();
}

/// A started presenter game of `n` players with its board and players
/// ready and `start()` delivered: (session, host token, board, players).
async fn started_game(api: &Api, n: usize) -> (String, String, Device, Vec<Device>) {
    let (sid, token) = api.create(&presenter_body(n)).await;
    let (st, v) = api.op(&sid, &token, "start").await;
    assert_eq!(st, 200, "{v}");
    let (mut board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let mut players = Vec::new();
    for p in player_ids(n) {
        let (d, _) = api.device(&sid, "controller", &p).await;
        d.call("ready", json!([])).await.unwrap();
        players.push(d);
    }
    board.wait_for("start", GUARD).await.expect("start");
    (sid, token, board, players)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_game_never_saved_resumes_from_its_latest_snapshot_after_kill_9() {
    let dir = data_dir();
    let s = spawn_server(dir.path());
    let (sid, token, board, players) = started_game(&s.api, 2).await;
    board
        .call("saveSnapshot", json!([{"round": 1}]))
        .await
        .unwrap();
    board
        .call("saveSnapshot", json!([{"round": 2, "scores": {"p1": 3}}]))
        .await
        .unwrap();
    let s = restart(dir.path(), s);
    drop((board, players));
    let api = &s.api;
    let v = api.status(&sid, &token).await;
    assert_eq!(v["phase"], "running", "{v}");
    assert!(v["clock"]["pausedAt"].is_number(), "paused: {v}");
    assert_eq!(roster(&v), ["p1", "p2"]);
    // `continue` answers as it does for a continued game.
    let (st, v) = api.op(&sid, &token, "continue").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["phase"], "running");
    let (mut board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["snapshot"], json!({"round": 2, "scores": {"p1": 3}}));
    board.call("ready", json!([])).await.unwrap();
    let (p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let (st, v) = api.op(&sid, &token, "resume").await;
    assert_eq!(st, 200, "{v}");
    p1.call("send", send_args(json!("authority"), json!("back")))
        .await
        .unwrap();
    let d = board.wait_for("deliver", GUARD).await.expect("deliver");
    assert_eq!(d.args[0]["data"], "back");
    let calls = board.drain_calls();
    assert!(calls.iter().all(|c| c.method != "start"), "{calls:?}");
    s.kill_9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_snapshot_beats_an_earlier_save_after_kill_9() {
    let dir = data_dir();
    let s = spawn_server(dir.path());
    let (sid, token, board, players) = started_game(&s.api, 1).await;
    board
        .call("saveSnapshot", json!([{"round": 1}]))
        .await
        .unwrap();
    let (st, v) = s.api.op(&sid, &token, "save").await;
    assert_eq!(st, 200, "{v}");
    board
        .call("saveSnapshot", json!([{"round": 5}]))
        .await
        .unwrap();
    let s = restart(dir.path(), s);
    drop((board, players));
    let api = &s.api;
    let (st, v) = api.op(&sid, &token, "continue").await;
    assert_eq!(st, 200, "{v}");
    let (_board, init) = api.device(&sid, "board", "board").await;
    assert_eq!(init["snapshot"], json!({"round": 5}));
    s.kill_9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_session_stays_finished_after_kill_9() {
    let dir = data_dir();
    let s = spawn_server(dir.path());
    let (sid, token, board, players) = started_game(&s.api, 1).await;
    board
        .call("saveSnapshot", json!([{"round": 9}]))
        .await
        .unwrap();
    let (st, v) = s.api.op(&sid, &token, "save").await;
    assert_eq!(st, 200, "{v}");
    let result = json!({"scores": {"p1": 7.0}, "summary": "done"});
    board.call("end", json!([result])).await.unwrap();
    let s = restart(dir.path(), s);
    drop((board, players));
    let api = &s.api;
    let v = api.status(&sid, &token).await;
    assert_eq!(v["phase"], "finished", "{v}");
    assert_eq!(v["result"], result);
    for op in ["continue", "start", "pause"] {
        let (st, v) = api.op(&sid, &token, op).await;
        assert_eq!(st, 409, "{op}: {v}");
    }
    let board = Device::connect(
        &api.ws,
        &sid,
        "board",
        "board",
        &api.token_for(&sid, "board", "board"),
    )
    .await;
    if let Ok(d) = board {
        assert!(
            d.hello(PLUGIN_ID).await.is_err(),
            "a finished game's board attached"
        );
    }
    let v = api.status(&sid, &token).await;
    assert_eq!(v["phase"], "finished", "{v}");
    s.kill_9();
}

/// How many times the scripted game's server is killed.
const KILLS: usize = 50;

/// What the last acknowledged change left, as the API and the board see it.
#[derive(Debug, Clone, PartialEq)]
enum Acked {
    Lobby {
        players: Vec<String>,
    },
    Started {
        players: Vec<String>,
        snapshot: Value,
    },
    Finished {
        result: Value,
    },
}

/// One step of the scripted game: what it does and the state once it is
/// acknowledged.
enum Step {
    AddPlayer(String),
    Kick(String),
    Start,
    Snapshot(Value),
    PauseOrResume(&'static str),
    Save,
    End(Value),
}

/// The state a restart may show: after a step that was acknowledged, only
/// `next`; after one killed in flight, `before` or `next`.
fn after(state: &Acked, step: &Step) -> Acked {
    match (state, step) {
        (Acked::Lobby { players }, Step::AddPlayer(p)) => {
            let mut players = players.clone();
            players.push(p.clone());
            Acked::Lobby { players }
        }
        (Acked::Lobby { players }, Step::Kick(p)) => Acked::Lobby {
            players: players.iter().filter(|q| *q != p).cloned().collect(),
        },
        (Acked::Lobby { players }, Step::Start) => Acked::Started {
            players: players.clone(),
            snapshot: Value::Null,
        },
        (Acked::Started { players, .. }, Step::Snapshot(v)) => Acked::Started {
            players: players.clone(),
            snapshot: v.clone(),
        },
        (Acked::Started { .. }, Step::End(r)) => Acked::Finished { result: r.clone() },
        (s, _) => s.clone(),
    }
}

/// The state the restarted server shows for `sid`.
async fn observed(api: &Api, sid: &str, token: &str) -> (Acked, Option<Device>) {
    let v = api.status(sid, token).await;
    match v["phase"].as_str() {
        Some("lobby") => (
            Acked::Lobby {
                players: roster(&v),
            },
            None,
        ),
        Some("finished") => (
            Acked::Finished {
                result: v["result"].clone(),
            },
            None,
        ),
        Some("running" | "loading") => {
            let (board, init) = api.device(sid, "board", "board").await;
            (
                Acked::Started {
                    players: roster(&v),
                    snapshot: init["snapshot"].clone(),
                },
                Some(board),
            )
        }
        _ => panic!("{sid} came back as {v}"),
    }
}

/// Runs one step against the server; `true` once it was acknowledged.
async fn run_step(api: &Api, sid: &str, token: &str, board: Option<&Device>, step: &Step) -> bool {
    let ok = |(st, _): (u16, Value)| st == 200;
    match step {
        Step::AddPlayer(p) => ok(api
            .request(
                "POST",
                &format!("/memizy/sessions/{sid}/players"),
                Some(token),
                Some(&json!({"id": p, "name": format!("Player {p}")})),
            )
            .await),
        Step::Kick(p) => ok(api
            .request(
                "DELETE",
                &format!("/memizy/sessions/{sid}/players/{p}"),
                Some(token),
                None,
            )
            .await),
        Step::Start => ok(api.op(sid, token, "start").await),
        Step::PauseOrResume(op) => {
            api.op(sid, token, op).await;
            true
        }
        Step::Save => {
            api.op(sid, token, "save").await;
            true
        }
        Step::Snapshot(v) => board
            .expect("a board in a started game")
            .call("saveSnapshot", json!([v]))
            .await
            .is_ok(),
        Step::End(r) => board
            .expect("a board in a started game")
            .call("end", json!([r]))
            .await
            .is_ok(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_of_scripted_games_loses_no_acknowledged_change() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("HOSTWIRE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5e55_1075);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = data_dir();
    let mut s = spawn_server(dir.path());
    let (mut sid, mut token) = s.api.create(&presenter_body(2)).await;
    let mut acked = Acked::Lobby {
        players: player_ids(2),
    };
    let mut next_player = 3;
    let mut n = 0u64;
    let mut board: Option<Device> = None;
    // What the kills came back to: lobby, started, finished; and how many
    // were in flight.
    let mut seen_states = [0usize; 3];
    let mut killed_in_flight = 0;
    // Kills since the current game started: past a few, the game ends, so
    // every seed reaches the finished state.
    let mut started_for = 0;
    for kill in 0..KILLS {
        started_for = match acked {
            Acked::Started { .. } => started_for + 1,
            _ => 0,
        };
        let steps = rng.random_range(1..5);
        let mut in_flight: Option<Acked> = None;
        let mut killed = false;
        for i in 0..steps {
            let step = match &acked {
                Acked::Lobby { players } => match rng.random_range(0..4) {
                    0 if players.len() > 1 => {
                        Step::Kick(players[rng.random_range(1..players.len())].clone())
                    }
                    0 | 1 => {
                        next_player += 1;
                        Step::AddPlayer(format!("p{next_player}"))
                    }
                    _ => Step::Start,
                },
                Acked::Started { .. } => match rng.random_range(0..12) {
                    _ if started_for > 4 => Step::End(json!({"scores": {"p1": n as f64}})),
                    0 | 11 => Step::End(json!({"scores": {"p1": n as f64}})),
                    1 => Step::PauseOrResume(if rng.random_bool(0.5) {
                        "pause"
                    } else {
                        "resume"
                    }),
                    2 => Step::Save,
                    _ => {
                        n += 1;
                        Step::Snapshot(json!({"n": n}))
                    }
                },
                Acked::Finished { .. } => {
                    // A new game; the finished one was checked.
                    (sid, token) = s.api.create(&presenter_body(2)).await;
                    acked = Acked::Lobby {
                        players: player_ids(2),
                    };
                    board = None;
                    continue;
                }
            };
            if matches!(acked, Acked::Started { .. }) && board.is_none() {
                board = Some(s.api.device(&sid, "board", "board").await.0);
            }
            let next = after(&acked, &step);
            if i + 1 == steps && rng.random_bool(0.5) {
                // Killed while this step is in flight: it may or may not
                // have been acknowledged.
                let (api, sid, token) = (
                    Api {
                        http: s.api.http.clone(),
                        ws: s.api.ws.clone(),
                        tokens: Default::default(),
                    },
                    sid.clone(),
                    token.clone(),
                );
                let b = board.take();
                // The step's request panics when the server dies under it
                // (the support's unwrap): that is "not acknowledged".
                let yields = rng.random_range(0..200);
                let task =
                    tokio::spawn(
                        async move { run_step(&api, &sid, &token, b.as_ref(), &step).await },
                    );
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                s = restart(dir.path(), s);
                killed = true;
                killed_in_flight += 1;
                if task.await.unwrap_or(false) {
                    acked = next;
                } else {
                    in_flight = Some(next);
                }
                break;
            }
            assert!(
                run_step(&s.api, &sid, &token, board.as_ref(), &step).await,
                "kill {kill}: a step was refused"
            );
            acked = next;
        }
        if !killed {
            s = restart(dir.path(), s);
        }
        let (seen, b) = observed(&s.api, &sid, &token).await;
        assert!(
            seen == acked || in_flight.as_ref() == Some(&seen),
            "kill {kill} (seed {seed}): came back as {seen:?}, acknowledged {acked:?}, in flight {in_flight:?}"
        );
        seen_states[match seen {
            Acked::Lobby { .. } => 0,
            Acked::Started { .. } => 1,
            Acked::Finished { .. } => 2,
        }] += 1;
        acked = seen;
        board = b;
    }
    s.kill_9();
    eprintln!(
        "{KILLS} kills (seed {seed}): came back as lobby {}, started {}, finished {}; {killed_in_flight} killed with a step in flight",
        seen_states[0], seen_states[1], seen_states[2]
    );
    assert!(
        seen_states.iter().all(|&n| n > 0) && killed_in_flight > 0,
        "the script reached every state and killed in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_screens_acknowledged_report_survives_kill_9() {
    let dir = data_dir();
    let s = spawn_server(dir.path());
    let mut m = manifest();
    m["appSpecific"]["memizy"]["settingsScreen"] = json!({"size": "compact"});
    let mut body = presenter_body(1);
    body["pluginHtml"] = json!(format!(
        "<!doctype html><html><head><script type=\"application/oqse-manifest+json\">{m}</script></head><body></body></html>"
    ));
    let (sid, token) = s.api.create(&body).await;
    let (screen, _) = s.api.device(&sid, "settings", "settings").await;
    screen
        .call(
            "updateSettings",
            json!([{"values": {"questionTime": 45}, "valid": false, "message": "pick a topic"}]),
        )
        .await
        .unwrap();
    drop(screen);
    let s = restart(dir.path(), s);
    let v = s.api.status(&sid, &token).await;
    assert_eq!(v["phase"], "lobby", "{v}");
    assert_eq!(v["settings"]["questionTime"], 45, "{v}");
    assert_eq!(
        (&v["settingsValid"], &v["settingsMessage"]),
        (&json!(false), &json!("pick a topic"))
    );
    // Start stays disabled while the screen says the settings are not valid.
    let (st, v) = s.api.op(&sid, &token, "start").await;
    assert_eq!(st, 400, "{v}");
    s.kill_9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lobby_and_a_running_game_survive_sigterm() {
    let dir = data_dir();
    let mut s = spawn_server(dir.path());
    let (lobby, lobby_token) = s.api.create(&presenter_body(1)).await;
    let (st, v) = s
        .api
        .request(
            "POST",
            &format!("/memizy/sessions/{lobby}/players"),
            Some(&lobby_token),
            Some(&json!({"id": "p2", "name": "Bea"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (game, game_token, board, players) = started_game(&s.api, 1).await;
    board
        .call("saveSnapshot", json!([{"round": 3}]))
        .await
        .unwrap();
    assert!(s.process.sigterm().success());
    drop((board, players));
    let tokens = s.api.tokens.lock().unwrap().clone();
    let s = spawn_server(dir.path());
    *s.api.tokens.lock().unwrap() = tokens;
    let v = s.api.status(&lobby, &lobby_token).await;
    assert_eq!(
        (v["phase"].as_str(), roster(&v)),
        (Some("lobby"), vec!["p1".to_owned(), "p2".to_owned()]),
        "{v}"
    );
    let v = s.api.status(&game, &game_token).await;
    assert_eq!(v["phase"], "running", "{v}");
    let (_board, init) = s.api.device(&game, "board", "board").await;
    assert_eq!(init["snapshot"], json!({"round": 3}));
    s.kill_9();
}

/// The session's recording as the API answers it: (entry types, actions' data).
async fn recording(api: &Api, sid: &str, token: &str) -> (Vec<String>, Vec<Value>, Value) {
    let (st, rec) = api
        .request(
            "GET",
            &format!("/memizy/sessions/{sid}/recording"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(st, 200, "{rec}");
    let entries = rec["entries"].as_array().unwrap();
    let kinds = entries
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    let actions = entries
        .iter()
        .filter(|e| e["type"] == "action")
        .map(|e| e["message"]["data"].clone())
        .collect();
    (kinds, actions, rec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_goes_on_after_a_restart_from_what_was_stored() {
    let dir = data_dir();
    let mut s = spawn_server(dir.path());
    let (sid, token, board, players) = started_game(&s.api, 1).await;
    players[0]
        .call("send", send_args(json!("authority"), json!("a1")))
        .await
        .unwrap();
    board
        .call("saveSnapshot", json!([{"round": 1}]))
        .await
        .unwrap();
    let (st, v) = s.api.op(&sid, &token, "pause").await;
    assert_eq!(st, 200, "{v}");
    let (kinds, actions, before) = recording(&s.api, &sid, &token).await;
    assert_eq!(kinds, ["start", "action", "pause"]);
    assert_eq!(actions, [json!("a1")]);
    assert!(s.process.sigterm().success());
    drop((board, players));
    let tokens = s.api.tokens.lock().unwrap().clone();
    let s = spawn_server(dir.path());
    *s.api.tokens.lock().unwrap() = tokens;
    let api = &s.api;
    let (st, v) = api.op(&sid, &token, "continue").await;
    assert_eq!(st, 200, "{v}");
    let (board, _) = api.device(&sid, "board", "board").await;
    board.call("ready", json!([])).await.unwrap();
    let (p1, _) = api.device(&sid, "controller", "p1").await;
    p1.call("ready", json!([])).await.unwrap();
    let (st, v) = api.op(&sid, &token, "resume").await;
    assert_eq!(st, 200, "{v}");
    p1.call("send", send_args(json!("authority"), json!("a2")))
        .await
        .unwrap();
    board
        .call("end", json!([{"scores": {"p1": 2}}]))
        .await
        .unwrap();
    // The whole record, in order: what came before the restart first.
    let (kinds, actions, after) = recording(api, &sid, &token).await;
    assert_eq!(
        actions,
        [json!("a1"), json!("a2")],
        "the actions of both runs: {after}"
    );
    assert_eq!(&kinds[..3], ["start", "action", "pause"], "{after}");
    assert_eq!(kinds.last().map(String::as_str), Some("end"), "{after}");
    let resumed = kinds.iter().position(|k| k == "resume").unwrap();
    let second = kinds.iter().rposition(|k| k == "action").unwrap();
    assert!(3 <= resumed && resumed < second, "{kinds:?}");
    // Game time only goes forward over the restart.
    let times: Vec<f64> = after["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["gameTimeMs"].as_f64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // The first run's InitPayload and seed stay the record's.
    assert_eq!(after["init"], before["init"]);
    assert_eq!(after["displaySeed"], before["displaySeed"]);
    s.kill_9();
}

/// A recording the API answered is in the store as answered: a `kill -9`
/// right after it loses none of its entries (they are written in batches
/// as the game goes, and the rest before the recording is answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_answered_is_kept_through_a_kill_9() {
    let dir = data_dir();
    let s = spawn_server(dir.path());
    // A session in its lobby has a record, empty.
    let (lobby, lobby_token) = s.api.create(&presenter_body(1)).await;
    let (kinds, _, empty) = recording(&s.api, &lobby, &lobby_token).await;
    assert!(kinds.is_empty() && empty["init"].is_null(), "{empty}");
    let (sid, token, board, players) = started_game(&s.api, 6).await;
    // More than one batch of the store, and not a whole number of them
    // (six players, each within SPEC 8.1's burst of sends).
    for i in 0..300 {
        players[i % 6]
            .call("send", send_args(json!("authority"), json!(i)))
            .await
            .unwrap();
    }
    let (kinds, actions, before) = recording(&s.api, &sid, &token).await;
    assert_eq!(kinds.len(), 301, "start and 300 actions");
    assert_eq!(actions.last(), Some(&json!(299)));
    s.kill_9();
    drop((board, players));
    let s = spawn_server(dir.path());
    let (kinds_after, actions_after, after) = recording(&s.api, &sid, &token).await;
    assert_eq!(
        actions_after, actions,
        "the actions answered before the kill"
    );
    assert_eq!(kinds_after, kinds);
    assert_eq!(after["init"], before["init"]);
    s.kill_9();
}
