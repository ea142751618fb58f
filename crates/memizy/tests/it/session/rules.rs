//! Every rule of a hosted Memizy session, one test each, in memory on the
//! manual clock.

use crate::support::*;
use hostwire_memizy::session::*;
use hostwire_memizy::{HostAs, Mode, ProtocolErrorCode as C, SessionEndReason, View};
use serde_json::{json, Value};

const BOARD: InstanceId = 100;

/// A presenter game with `n` players, running: board 100, controllers 1..=n.
fn running(n: usize) -> Sim {
    let mut sim = Sim::presenter(n);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.pump();
    sim.join(BOARD, View::Board, "board");
    for i in 1..=n {
        sim.join(i as u64, View::Controller, &format!("p{i}"));
    }
    sim.advance(DEFAULT_COUNTDOWN_MS);
    assert_eq!(sim.s.phase(), Phase::Running);
    for i in 1..=n as u64 {
        sim.take(i);
    }
    sim.take(BOARD);
    sim
}

fn code_of(r: Option<Result<Reply, hostwire_memizy::ProtocolError>>) -> Option<C> {
    match r {
        Some(Err(e)) => Some(e.code),
        _ => None,
    }
}

// ----- hello, negotiation, InitPayload -----

#[test]
fn hello_is_called_once_per_instance() {
    let mut sim = running(1);
    let m = sim.fails(1, "hello", &hello_args(), C::InvalidArgument);
    assert!(m.contains("second time"), "{m}");
    // Other calls still work: the instance is not harmed.
    sim.ok(1, "send", &send_args(json!("authority"), json!({"a": 1})));
}

#[test]
fn calls_before_hello_are_refused() {
    let mut sim = Sim::presenter(1);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.attach(1, View::Controller, "p1");
    let m = sim.fails(1, "ready", "[]", C::InvalidArgument);
    assert!(m.contains("call hello first"), "{m}");
}

#[test]
fn version_negotiation_and_plugin_identity() {
    let mut sim = Sim::presenter(1);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.attach(1, View::Controller, "p1");
    sim.fails(
        1,
        "hello",
        &hello_args_with("2.0", PLUGIN_ID),
        C::UnsupportedProtocol,
    );
    let m = sim.fails(
        1,
        "hello",
        &hello_args_with("1.0", "https://evil.example/x"),
        C::InvalidArgument,
    );
    assert!(m.contains("handshake.plugin.id"), "{m}");
    match sim.ok(1, "hello", &hello_args_with("1.7", PLUGIN_ID)) {
        Reply::Init(p) => assert_eq!(p.protocol, "1.0"),
        r => panic!("{r:?}"),
    }
}

#[test]
fn a_plugin_protocol_this_host_cannot_run_is_refused_at_creation() {
    // SPEC 4.3: checked before loading, not when the board says hello.
    for (protocol, needle) in [("2.0", "newer host"), ("1.9", "newer host")] {
        let mut memizy = quiz_memizy();
        memizy["protocol"] = json!(protocol);
        let m = manifest(memizy);
        let c = SessionConfig::new("s", Mode::Solo, None, PLUGIN_ID, m.runtime, quiz_set());
        let Err(e) = Session::new(c, 0) else {
            panic!("protocol {protocol} accepted");
        };
        let e = e.to_string();
        assert!(e.contains("appSpecific.memizy.protocol"), "{protocol}: {e}");
        assert!(e.contains(needle), "{protocol}: {e}");
    }
}

fn raw(v: serde_json::Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(&v).unwrap()
}

#[test]
fn only_declared_item_types_reach_the_plugin() {
    // SPEC 4.2: the plugin declares mcq-single, true-false and flashcard.
    let mut cfg = config(Mode::Solo, None);
    cfg.set
        .items
        .push(raw(json!({"id": "mp", "type": "match-pairs",
        "prompts": [{"id": "a", "text": "A"}], "matches": [{"id": "b", "text": "B"}],
        "pairs": [{"promptId": "a", "matchId": "b"}]})));
    let mut sim = Sim::new(cfg);
    let now = sim.now();
    sim.s.add_player(PlayerSpec::new("p1", "Ann"), now).unwrap();
    sim.s.start_game(now).unwrap();
    sim.pump();
    let init = sim.join(1, View::Solo, "p1");
    let set = init.set.parse().unwrap();
    let ids: Vec<&str> = set.items.iter().filter_map(|i| i["id"].as_str()).collect();
    assert!(!ids.contains(&"mp"), "{ids:?}");
    assert_eq!(ids.len(), 2, "{ids:?}");
    // An answer for it is not one of the set's: it needs its item.
    let m = sim.fails(
        1,
        "recordAnswer",
        r#"[{"itemId": "mp", "isCorrect": true}]"#,
        C::InvalidArgument,
    );
    assert!(m.contains("answer.item"), "{m}");
    // "*" declares every type.
    let mut cfg = config(Mode::Solo, None);
    cfg.item_types = Some(vec!["*".into()]);
    cfg.set
        .items
        .push(raw(json!({"id": "mp", "type": "match-pairs"})));
    let mut sim = Sim::new(cfg);
    let now = sim.now();
    sim.s.add_player(PlayerSpec::new("p1", "Ann"), now).unwrap();
    sim.s.start_game(now).unwrap();
    sim.pump();
    assert_eq!(
        sim.join(1, View::Solo, "p1")
            .set
            .parse()
            .unwrap()
            .items
            .len(),
        3
    );
}

#[test]
fn init_payload_depends_on_the_instance() {
    let mut cfg = config(Mode::Multiplayer, Some(HostAs::Presenter));
    cfg.settings.insert("questionTime".into(), json!(30));
    let mut sim = Sim::new(cfg);
    let mut spec = PlayerSpec::new("p1", "Ann");
    spec.progress.insert(
        "q1".into(),
        json!({"bucket": 2, "stats": {"attempts": 2, "incorrect": 0, "streak": 2}}),
    );
    spec.data.plugin = json!({"coins": 5});
    let now = sim.now();
    sim.s.add_player(spec, now).unwrap();
    sim.s.start_game(now).unwrap();
    sim.pump();
    let board = sim.join(BOARD, View::Board, "board");
    let c = sim.join(1, View::Controller, "p1");
    // The authority (board) has the full items, no progress and no data.
    assert_eq!(board.session.authority, "board");
    assert_eq!(board.set.parse().unwrap().items[0]["correctId"], "j");
    assert!(board.progress.is_empty());
    assert_eq!(board.data.plugin, Value::Null);
    assert_eq!(board.settings["questionTime"], 30);
    // A controller has public items and its own progress and data.
    assert_eq!(c.set.parse().unwrap().items[0].get("correctId"), None);
    assert_eq!(c.set.parse().unwrap().items[0]["answerHidden"], true);
    assert_eq!(c.progress["q1"]["bucket"], 2);
    assert_eq!(c.data.plugin, json!({"coins": 5}));
    assert_eq!(c.snapshot, Value::Null);
    assert_eq!(c.services, vec!["chess.puzzles".to_owned()]);
    assert!(!c.session.late_join);
    // The same display order for everyone.
    let ids = |p: &hostwire_memizy::InitPayload| -> Vec<Value> {
        p.set.parse().unwrap().items[0]["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].clone())
            .collect()
    };
    assert_eq!(ids(&board), ids(&c));
}

#[test]
fn only_the_authority_gets_the_snapshot() {
    let mut sim = running(1);
    sim.ok(BOARD, "saveSnapshot", r#"[{"round": 3}]"#);
    sim.detach(1);
    sim.attach(2, View::Controller, "p1");
    assert_eq!(sim.hello(2).snapshot, Value::Null);
    sim.detach(BOARD);
    sim.attach(101, View::Board, "board");
    assert_eq!(sim.hello(101).snapshot, json!({"round": 3}));
}

// ----- authority and views -----

#[test]
fn authority_methods_refuse_other_instances() {
    let mut sim = running(2);
    sim.fails(1, "saveSnapshot", "[{}]", C::NotAuthority);
    sim.fails(1, "end", "[{}]", C::NotAuthority);
    assert!(sim
        .records(|r| matches!(r, Record::Snapshot { .. } | Record::Result { .. }))
        .is_empty());
}

#[test]
fn view_limited_methods_refuse_other_views() {
    let mut sim = running(1);
    sim.fails(
        BOARD,
        "saveData",
        r#"["plugin", {"x": 1}]"#,
        C::NotAllowedInView,
    );
    sim.fails(
        1,
        "updateSettings",
        r#"[{"values": {}, "valid": true}]"#,
        C::NotAllowedInView,
    );
    sim.ok(1, "saveData", r#"["plugin", {"x": 1}]"#);
}

#[test]
fn host_as_player_makes_the_hosts_controller_the_authority() {
    let mut sim = Sim::new(config(Mode::Multiplayer, Some(HostAs::Player)));
    let now = sim.now();
    sim.s
        .add_player(PlayerSpec::new("h", "Host").host(), now)
        .unwrap();
    sim.add("p1");
    sim.s.start_game(now).unwrap();
    let init = sim.join(1, View::Controller, "h");
    assert_eq!(init.session.authority, "h");
    assert_eq!(init.set.parse().unwrap().items[0]["correctId"], "j");
    sim.join(2, View::Controller, "p1");
    sim.advance(DEFAULT_COUNTDOWN_MS);
    assert_eq!(sim.take_method(1, "start").len(), 1);
    assert!(sim.take_method(2, "start").is_empty());
    sim.fails(2, "saveSnapshot", "[{}]", C::NotAuthority);
    sim.ok(1, "saveSnapshot", "[{}]");
}

// ----- end and SESSION_ENDED -----

#[test]
fn end_counts_once_and_discards_the_snapshot() {
    let mut sim = running(1);
    sim.ok(BOARD, "saveSnapshot", r#"[{"s": 1}]"#);
    sim.ok(
        BOARD,
        "end",
        r#"[{"scores": {"p1": 3}, "summary": "done"}]"#,
    );
    sim.ok(BOARD, "end", r#"[{"scores": {"p1": 99}}]"#);
    let results = sim.records(|r| matches!(r, Record::Result { .. }));
    assert_eq!(results.len(), 1);
    assert!(
        matches!(results[0], Record::Result { result, .. } if result.scores.as_ref().unwrap()["p1"] == 3.0)
    );
    assert_eq!(
        sim.records(|r| matches!(r, Record::SnapshotDiscarded { .. }))
            .len(),
        1
    );
    assert_eq!(sim.s.snapshot(), None);
    // A snapshot after the end is not stored.
    let before = sim.records(|r| matches!(r, Record::Snapshot { .. })).len();
    sim.ok(BOARD, "saveSnapshot", r#"[{"s": 2}]"#);
    assert_eq!(
        sim.records(|r| matches!(r, Record::Snapshot { .. })).len(),
        before
    );
    assert_eq!(sim.s.phase(), Phase::Finished);
    // The host closes the instances a while later.
    sim.advance(DEFAULT_FINISHED_CLOSE_MS);
    assert_eq!(
        sim.take_method(1, "sessionEnded"),
        vec![json!(["finished"])]
    );
    assert_eq!(sim.s.phase(), Phase::Closed);
}

#[test]
fn a_closing_session_tells_each_instance_only_that_it_ended() {
    // The board attaches first (the lowest instance id), as a real board
    // does: its removal must not reach the controllers as "the authority is
    // away" or a new roster ahead of their own `sessionEnded`.
    const FIRST_BOARD: InstanceId = 0;
    let mut sim = Sim::presenter(2);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.pump();
    sim.join(FIRST_BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    sim.join(2, View::Controller, "p2");
    sim.advance(DEFAULT_COUNTDOWN_MS);
    for i in [FIRST_BOARD, 1, 2] {
        sim.take(i);
    }
    sim.ok(FIRST_BOARD, "end", r#"[{"scores": {"p1": 1}}]"#);
    sim.advance(DEFAULT_FINISHED_CLOSE_MS);
    assert_eq!(sim.s.phase(), Phase::Closed);
    for c in [1, 2] {
        let got: Vec<String> = sim.take(c).into_iter().map(|(m, _)| m).collect();
        assert_eq!(got, vec!["sessionEnded".to_owned()], "controller {c}");
    }
}

#[test]
fn a_replaced_instance_gets_session_ended_first() {
    let mut sim = running(1);
    sim.attach(11, View::Controller, "p1");
    assert_eq!(sim.take_method(1, "sessionEnded"), vec![json!(["closed"])]);
    assert_eq!(sim.closed.get(&1), Some(&CloseReason::Replaced));
}

#[test]
fn calls_after_session_ended_get_session_ended() {
    let mut sim = running(2);
    let now = sim.now();
    sim.s.kick_player("p2", now).unwrap();
    sim.pump();
    assert_eq!(sim.take_method(2, "sessionEnded"), vec![json!(["kicked"])]);
    assert_eq!(
        sim.closed.get(&2),
        Some(&CloseReason::SessionEnded(SessionEndReason::Kicked))
    );
    sim.fails(
        2,
        "send",
        &send_args(json!("all"), json!(1)),
        C::SessionEnded,
    );
    // The others saw the roster change.
    let roster = sim.take_method(1, "playersChanged");
    assert_eq!(roster.last().unwrap()[0].as_array().unwrap().len(), 1);
}

// ----- routing -----

#[test]
fn messages_arrive_in_order_at_most_once() {
    let mut sim = running(3);
    for n in 0..10 {
        sim.ok(
            1,
            "send",
            &send_args(json!(["p2", "p2", "board"]), json!({"n": n})),
        );
    }
    let got: Vec<i64> = sim
        .take_method(2, "deliver")
        .iter()
        .map(|a| a[0]["data"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    assert_eq!(sim.take_method(BOARD, "deliver").len(), 10);
    assert!(sim.take_method(3, "deliver").is_empty());
    assert!(
        sim.take_method(1, "deliver").is_empty(),
        "never to the sender"
    );
}

#[test]
fn all_means_every_other_instance() {
    let mut sim = running(3);
    sim.ok(2, "send", &send_args(json!("all"), json!("hi")));
    for i in [1, 3, BOARD] {
        let d = sim.take_method(i, "deliver");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0][0]["from"], "p2");
    }
    assert!(sim.take_method(2, "deliver").is_empty());
}

#[test]
fn messages_to_disconnected_instances_are_dropped() {
    let mut sim = running(2);
    sim.detach(2);
    sim.ok(BOARD, "send", &send_args(json!(["p2"]), json!({"x": 1})));
    sim.attach(5, View::Controller, "p2");
    let init = sim.hello(5);
    assert!(init.session.late_join, "a reconnect joins a running game");
    assert!(sim.take_method(5, "deliver").is_empty());
    assert!(sim.take_method(2, "deliver").is_empty());
}

#[test]
fn unknown_and_reserved_addresses_are_invalid() {
    let mut sim = running(1);
    let m = sim.fails(
        1,
        "send",
        &send_args(json!(["p1", "nobody"]), json!(1)),
        C::InvalidArgument,
    );
    assert!(m.contains("message.to[1]"), "{m}");
    sim.fails(
        1,
        "send",
        &send_args(json!(["server"]), json!(1)),
        C::InvalidArgument,
    );
}

#[test]
fn sent_at_is_session_time() {
    let mut cfg = config(Mode::Multiplayer, Some(HostAs::Presenter));
    cfg.clock_offset_ms = -1_000.0;
    let mut sim = Sim::new(cfg);
    sim.add("p1");
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    sim.advance(DEFAULT_COUNTDOWN_MS + 250);
    sim.ok(1, "send", &send_args(json!("authority"), json!(1)));
    let d = sim.take_method(BOARD, "deliver");
    assert_eq!(
        d[0][0]["sentAt"].as_f64().unwrap(),
        (sim.now() as f64) - 1_000.0
    );
}

#[test]
fn authority_away_refuses_messages_then_comes_back() {
    let mut sim = running(2);
    sim.ok(BOARD, "saveSnapshot", r#"[{"round": 1}]"#);
    sim.detach(BOARD);
    for i in [1, 2] {
        assert_eq!(
            sim.take_method(i, "authorityChanged"),
            vec![json!([{"connected": false}])]
        );
    }
    assert!(sim.has_event(|e| *e == SessionEvent::AuthorityAway));
    sim.fails(
        1,
        "send",
        &send_args(json!("authority"), json!({"a": 1})),
        C::AuthorityUnavailable,
    );
    // Messages between players still flow.
    sim.ok(1, "send", &send_args(json!(["p2"]), json!(1)));
    assert_eq!(sim.take_method(2, "deliver").len(), 1);
    // The board reloads: a new instance, the snapshot, no start().
    sim.attach(101, View::Board, "board");
    let init = sim.hello(101);
    assert_eq!(init.snapshot, json!({"round": 1}));
    sim.fails(
        1,
        "send",
        &send_args(json!("authority"), json!({"a": 2})),
        C::AuthorityUnavailable,
    );
    sim.ok(101, "ready", "[]");
    assert!(sim.take_method(101, "start").is_empty());
    assert!(
        sim.take_method(101, "authorityChanged").is_empty(),
        "never on the authority"
    );
    for i in [1, 2] {
        assert_eq!(
            sim.take_method(i, "authorityChanged"),
            vec![json!([{"connected": true}])]
        );
    }
    sim.ok(1, "send", &send_args(json!("authority"), json!({"a": 3})));
    assert_eq!(sim.take_method(101, "deliver").len(), 1);
}

#[test]
fn an_absent_authority_ends_the_session_with_host_left() {
    let mut cfg = config(Mode::Multiplayer, Some(HostAs::Presenter));
    cfg.timing.authority_away_ms = 60_000;
    let mut sim = Sim::new(cfg);
    sim.add("p1");
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    sim.advance(DEFAULT_COUNTDOWN_MS);
    sim.detach(BOARD);
    sim.advance(59_999);
    assert_eq!(sim.s.phase(), Phase::Running);
    sim.advance(1);
    assert_eq!(sim.s.phase(), Phase::Closed);
    assert_eq!(
        sim.take_method(1, "sessionEnded"),
        vec![json!(["host-left"])]
    );
}

#[test]
fn a_late_instance_learns_the_authority_is_away() {
    let mut sim = running(2);
    sim.detach(BOARD);
    sim.detach(2);
    sim.attach(7, View::Controller, "p2");
    sim.hello(7);
    assert_eq!(
        sim.take_method(7, "authorityChanged"),
        vec![json!([{"connected": false}])]
    );
}

// ----- limits and rates -----

#[test]
fn send_rate_per_instance() {
    let mut sim = running(2);
    for _ in 0..60 {
        sim.ok(1, "send", &send_args(json!(["p2"]), json!(1)));
    }
    sim.fails(
        1,
        "send",
        &send_args(json!(["p2"]), json!(1)),
        C::RateLimited,
    );
    sim.advance(34);
    sim.ok(1, "send", &send_args(json!(["p2"]), json!(1)));
    sim.fails(
        1,
        "send",
        &send_args(json!(["p2"]), json!(1)),
        C::RateLimited,
    );
}

#[test]
fn the_authority_sends_at_the_rate_per_other_instance() {
    let mut sim = running(2);
    for _ in 0..60 {
        sim.ok(BOARD, "send", &send_args(json!(["p1"]), json!(1)));
    }
    let m = sim.fails(
        BOARD,
        "send",
        &send_args(json!(["p1"]), json!(1)),
        C::RateLimited,
    );
    assert!(m.contains("p1"), "{m}");
    for _ in 0..60 {
        sim.ok(BOARD, "send", &send_args(json!(["p2"]), json!(1)));
    }
    sim.fails(
        BOARD,
        "send",
        &send_args(json!("all"), json!(1)),
        C::RateLimited,
    );
}

#[test]
fn oversized_messages_and_payloads_get_their_codes() {
    let mut sim = running(1);
    let big = "x".repeat(64 * 1024 + 1);
    sim.fails(
        1,
        "send",
        &send_args(json!("all"), json!(big)),
        C::MessageTooLarge,
    );
    let snap = "y".repeat(1024 * 1024 + 1);
    sim.fails(
        BOARD,
        "saveSnapshot",
        &json!([snap]).to_string(),
        C::SnapshotTooLarge,
    );
    let data = "z".repeat(256 * 1024 + 1);
    sim.fails(
        1,
        "saveData",
        &json!(["set", data]).to_string(),
        C::DataTooLarge,
    );
    let answer = "a".repeat(4 * 1024 + 1);
    sim.fails(
        1,
        "recordAnswer",
        &json!([{"itemId": "q1", "isCorrect": true, "answer": answer}]).to_string(),
        C::DataTooLarge,
    );
    let payload = "p".repeat(64 * 1024 + 1);
    sim.fails(
        1,
        "service",
        &json!(["chess.puzzles", payload]).to_string(),
        C::MessageTooLarge,
    );
}

#[test]
fn snapshots_are_kept_latest_at_two_per_second_and_acknowledged_when_durable() {
    let mut sim = running(1);
    sim.store_mode = StoreMode::Hold;
    let first = sim.start_call(BOARD, "saveSnapshot", r#"[{"n": 0}]"#);
    assert_eq!(sim.reply(BOARD, first), None, "waits for durability");
    let calls: Vec<CallId> = (1..5)
        .map(|n| sim.start_call(BOARD, "saveSnapshot", &format!(r#"[{{"n": {n}}}]"#)))
        .collect();
    let written = |sim: &Sim| sim.records(|r| matches!(r, Record::Snapshot { .. })).len();
    assert_eq!(written(&sim), 1);
    sim.release();
    assert!(matches!(sim.reply(BOARD, first), Some(Ok(Reply::Done))));
    assert_eq!(
        sim.reply(BOARD, calls[0]),
        None,
        "coalesced: waits for its successor"
    );
    sim.advance(499);
    assert_eq!(written(&sim), 1);
    sim.advance(1);
    assert_eq!(written(&sim), 2);
    match sim.store.last().unwrap() {
        (_, Record::Snapshot { snapshot, .. }) => assert_eq!(&**snapshot, r#"{"n": 4}"#),
        r => panic!("{r:?}"),
    }
    sim.release();
    for c in calls {
        assert!(matches!(sim.reply(BOARD, c), Some(Ok(Reply::Done))));
    }
}

#[test]
fn a_failed_write_is_reported_not_acknowledged() {
    let mut sim = running(1);
    sim.store_mode = StoreMode::Fail;
    let m = sim.fails(BOARD, "saveSnapshot", "[{}]", C::InternalError);
    assert!(m.contains("could not be stored"), "{m}");
    let m = sim.fails(
        1,
        "recordAnswer",
        r#"[{"itemId": "q1", "isCorrect": true}]"#,
        C::InternalError,
    );
    assert!(m.contains("recordAnswer"), "{m}");
}

#[test]
fn plugin_data_is_kept_latest_per_scope_at_one_per_second() {
    let mut sim = running(1);
    sim.ok(1, "saveData", r#"["plugin", {"coins": 1}]"#);
    sim.ok(1, "saveData", r#"["set", {"level": 1}]"#);
    let c2 = sim.start_call(1, "saveData", r#"["plugin", {"coins": 2}]"#);
    let c3 = sim.start_call(1, "saveData", r#"["plugin", {"coins": 3}]"#);
    let data = |sim: &Sim| {
        sim.records(|r| matches!(r, Record::PluginData { .. }))
            .into_iter()
            .map(|r| match r {
                Record::PluginData {
                    scope,
                    value,
                    set_id,
                    user,
                    plugin_id,
                } => {
                    assert_eq!((user.as_str(), plugin_id.as_str()), ("p1", PLUGIN_ID));
                    (format!("{scope:?}"), value.to_string(), set_id.clone())
                }
                _ => unreachable!(),
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(data(&sim).len(), 2);
    assert_eq!(data(&sim)[1].2.as_deref(), Some("set-1"));
    sim.advance(1_000);
    let d = data(&sim);
    assert_eq!(d.len(), 3);
    assert_eq!(d[2].1, r#"{"coins": 3}"#);
    assert!(matches!(sim.reply(1, c2), Some(Ok(Reply::Done))));
    assert!(matches!(sim.reply(1, c3), Some(Ok(Reply::Done))));
    // A reconnect sees the latest value.
    sim.detach(1);
    sim.attach(2, View::Controller, "p1");
    assert_eq!(sim.hello(2).data.plugin, json!({"coins": 3}));
}

#[test]
fn record_answer_rate_per_instance_and_per_player_for_the_authority() {
    let mut sim = running(2);
    let a = r#"[{"itemId": "q1", "isCorrect": true}]"#;
    for _ in 0..20 {
        sim.ok(1, "recordAnswer", a);
    }
    sim.fails(1, "recordAnswer", a, C::RateLimited);
    sim.advance(100);
    sim.ok(1, "recordAnswer", a);
    for p in ["p1", "p2"] {
        let arg = json!([{"playerId": p, "itemId": "q2", "isCorrect": false}]).to_string();
        for _ in 0..20 {
            sim.ok(BOARD, "recordAnswer", &arg);
        }
        sim.fails(BOARD, "recordAnswer", &arg, C::RateLimited);
    }
}

#[test]
fn get_asset_resolves_item_then_set_with_rate_and_size() {
    let mut sim = running(1);
    assert_eq!(
        sim.ok(1, "getAsset", r#"["img/planet.png", "q1"]"#),
        Reply::Asset {
            key: "img/planet.png".into(),
            item_id: Some("q1".into())
        }
    );
    assert_eq!(
        sim.ok(1, "getAsset", r#"["img/planet.png", "q2"]"#),
        Reply::Asset {
            key: "img/planet.png".into(),
            item_id: None
        }
    );
    sim.fails(1, "getAsset", r#"["nope.png"]"#, C::AssetNotFound);
    sim.fails(1, "getAsset", r#"["video/huge.mp4"]"#, C::DataTooLarge);
    for _ in 0..16 {
        sim.ok(1, "getAsset", r#"["img/planet.png"]"#);
    }
    sim.fails(1, "getAsset", r#"["img/planet.png"]"#, C::RateLimited);
}

#[test]
fn error_reports_beyond_the_rate_are_dropped_without_an_error() {
    let mut sim = running(1);
    for _ in 0..15 {
        sim.ok(1, "reportError", r#"[{"code": "E", "message": "oops"}]"#);
    }
    let n = sim
        .events
        .iter()
        .filter(|e| matches!(e, SessionEvent::ErrorReport { .. }))
        .count();
    assert_eq!(n, 10);
    sim.advance(200);
    sim.ok(1, "reportError", r#"[{"code": "E", "message": "oops"}]"#);
    let n = sim
        .events
        .iter()
        .filter(|e| matches!(e, SessionEvent::ErrorReport { .. }))
        .count();
    assert_eq!(n, 11);
}

// ----- services -----

#[test]
fn services_must_be_declared_and_offered() {
    let mut sim = running(1);
    let m = sim.fails(1, "service", r#"["ai.chat", {}]"#, C::ServiceUnavailable);
    assert!(m.contains("does not offer"), "{m}");
    let m = sim.fails(1, "service", r#"["tts", {}]"#, C::ServiceUnavailable);
    assert!(m.contains("does not declare"), "{m}");
    assert!(sim.services.is_empty());
}

#[test]
fn a_service_call_is_run_by_the_server_and_answered() {
    let mut sim = running(1);
    let call = sim.start_call(1, "service", r#"["chess.puzzles", {"level": 3}]"#);
    let req = sim.services.pop().unwrap();
    assert_eq!(
        (req.name.as_str(), &*req.payload, req.player.as_deref()),
        ("chess.puzzles", r#"{"level": 3}"#, Some("p1"))
    );
    assert_eq!(sim.reply(1, call), None);
    let now = sim.now();
    sim.s.service_done(req.id, Ok(r#"{"puzzle": "e4"}"#), now);
    sim.pump();
    assert_eq!(
        sim.reply(1, call),
        Some(Ok(Reply::Service(r#"{"puzzle": "e4"}"#.into())))
    );
    // A result beyond 256 KB is MESSAGE_TOO_LARGE.
    let call = sim.start_call(1, "service", r#"["chess.puzzles", {}]"#);
    let req = sim.services.pop().unwrap();
    let big = json!("r".repeat(256 * 1024)).to_string();
    sim.s.service_done(req.id, Ok(&big), now);
    sim.pump();
    assert_eq!(code_of(sim.reply(1, call)), Some(C::MessageTooLarge));
}

#[test]
fn a_service_that_does_not_answer_in_time_fails() {
    let mut sim = running(1);
    let call = sim.start_call(1, "service", r#"["chess.puzzles", {}]"#);
    let req = sim.services.pop().unwrap();
    sim.advance(1_999);
    assert_eq!(sim.reply(1, call), None);
    sim.advance(1);
    assert_eq!(code_of(sim.reply(1, call)), Some(C::InternalError));
    assert_eq!(sim.cancelled, vec![req.id]);
    // The server's own timer is an input too.
    let call = sim.start_call(1, "service", r#"["chess.puzzles", {}]"#);
    let req = sim.services.pop().unwrap();
    let now = sim.now();
    sim.s.service_timed_out(req.id, now);
    sim.pump();
    assert_eq!(code_of(sim.reply(1, call)), Some(C::InternalError));
    // A late answer after that is ignored.
    sim.s.service_done(req.id, Ok("1"), now);
    sim.pump();
    assert_eq!(sim.reply(1, call), None);
}

#[test]
fn service_rate_is_thirty_a_minute() {
    let mut sim = running(1);
    for _ in 0..30 {
        let c = sim.start_call(1, "service", r#"["chess.puzzles", {}]"#);
        let req = sim.services.pop().unwrap();
        let now = sim.now();
        sim.s.service_done(req.id, Ok("null"), now);
        sim.pump();
        assert!(matches!(sim.reply(1, c), Some(Ok(_))));
    }
    sim.fails(1, "service", r#"["chess.puzzles", {}]"#, C::RateLimited);
    sim.advance(2_000);
    let c = sim.start_call(1, "service", r#"["chess.puzzles", {}]"#);
    assert_eq!(sim.reply(1, c), None, "accepted again after 2 s");
}

// ----- lifecycle -----

#[test]
fn countdown_once_everyone_is_ready_then_start_on_the_authority_only() {
    let mut sim = Sim::presenter(2);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    assert_eq!(sim.s.phase(), Phase::Loading);
    sim.attach(2, View::Controller, "p2");
    sim.hello(2);
    assert_eq!(sim.s.phase(), Phase::Loading);
    sim.ok(2, "ready", "[]");
    let ends = sim.now() + DEFAULT_COUNTDOWN_MS;
    assert_eq!(sim.s.phase(), Phase::Countdown { ends_at_ms: ends });
    sim.advance(DEFAULT_COUNTDOWN_MS - 1);
    assert!(sim.take_method(BOARD, "start").is_empty());
    sim.advance(1);
    assert_eq!(sim.take_method(BOARD, "start"), vec![json!([])]);
    assert!(sim.take_method(1, "start").is_empty());
    assert!(sim.take_method(2, "start").is_empty());
    assert_eq!(sim.s.phase(), Phase::Running);
}

#[test]
fn the_countdown_begins_after_the_ready_timeout() {
    let mut sim = Sim::presenter(2);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    sim.advance(DEFAULT_READY_TIMEOUT_MS - 1);
    assert_eq!(sim.s.phase(), Phase::Loading);
    sim.advance(1);
    assert!(matches!(sim.s.phase(), Phase::Countdown { .. }));
    sim.advance(DEFAULT_COUNTDOWN_MS);
    assert_eq!(sim.take_method(BOARD, "start").len(), 1);
}

#[test]
fn solo_starts_right_after_ready() {
    let mut sim = Sim::new(config(Mode::Solo, None));
    sim.add("me");
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    let init = sim.join(1, View::Solo, "me");
    assert_eq!(init.session.authority, "me");
    assert_eq!(init.set.parse().unwrap().items[0]["correctId"], "j");
    assert_eq!(sim.take_method(1, "start"), vec![json!([])]);
    assert_eq!(sim.s.phase(), Phase::Running);
    assert!(!sim.has_event(|e| matches!(e, SessionEvent::Countdown { .. })));
}

#[test]
fn the_lobby_settings_screen_validates_and_gates_start() {
    let mut sim = Sim::presenter(1);
    sim.attach(9, View::Settings, "settings");
    let init = sim.hello(9);
    assert_eq!(init.session.view, View::Settings);
    assert!(init.progress.is_empty());
    let m = sim.fails(
        9,
        "updateSettings",
        r#"[{"values": {"questionTime": 500}, "valid": true}]"#,
        C::InvalidArgument,
    );
    assert!(m.contains("update.values.questionTime"), "{m}");
    sim.fails(
        9,
        "updateSettings",
        r#"[{"values": {"colour": 1}, "valid": true}]"#,
        C::InvalidArgument,
    );
    sim.ok(
        9,
        "updateSettings",
        r#"[{"values": {"questionTime": 40}, "valid": false, "message": "pick a mode"}]"#,
    );
    let now = sim.now();
    assert!(
        matches!(sim.s.start_game(now), Err(SessionError::SettingsInvalid(m)) if m == "pick a mode")
    );
    sim.ok(
        9,
        "updateSettings",
        r#"[{"values": {"questionTime": 40}, "valid": true}]"#,
    );
    // The settings screen hears roster changes.
    sim.add("p2");
    assert_eq!(sim.take_method(9, "playersChanged").len(), 1);
    sim.s.start_game(now).unwrap();
    sim.pump();
    assert_eq!(sim.take_method(9, "sessionEnded"), vec![json!(["closed"])]);
    assert_eq!(
        sim.join(BOARD, View::Board, "board").settings["questionTime"],
        40
    );
}

#[test]
fn game_instances_attach_only_after_start() {
    let mut sim = Sim::presenter(1);
    let now = sim.now();
    assert!(sim.s.attach(1, View::Controller, "p1", now).is_err());
    assert!(sim.s.attach(2, View::Board, "p1", now).is_err());
    sim.s.start_game(now).unwrap();
    assert!(sim.s.attach(3, View::Settings, "settings", now).is_err());
    assert!(sim.s.attach(4, View::Controller, "ghost", now).is_err());
    sim.s.attach(1, View::Controller, "p1", now).unwrap();
}

#[test]
fn pause_and_resume_change_the_clock_everywhere() {
    let mut sim = running(1);
    let t = sim.now();
    sim.s.pause(t).unwrap();
    sim.pump();
    let c = sim.take_method(1, "clockChanged");
    assert_eq!(c[0][0]["pausedAt"].as_f64(), Some(t as f64));
    assert_eq!(sim.take_method(BOARD, "clockChanged").len(), 1);
    sim.advance(5_000);
    let now = sim.now();
    sim.s.resume(now).unwrap();
    sim.pump();
    let c = sim.take_method(1, "clockChanged");
    assert_eq!(c[0][0]["pausedAt"], Value::Null);
    assert_eq!(c[0][0]["pausedMs"].as_f64(), Some(5_000.0));
    assert!(sim.s.resume(now).is_err());
}

#[test]
fn players_changed_on_every_roster_change() {
    let mut sim = running(2);
    sim.add("p3");
    let last = |sim: &mut Sim| sim.take_method(1, "playersChanged").pop().unwrap()[0].clone();
    assert_eq!(last(&mut sim).as_array().unwrap().len(), 3);
    let now = sim.now();
    sim.s.rename_player("p2", "Bea", now).unwrap();
    sim.pump();
    assert_eq!(last(&mut sim)[1]["name"], "Bea");
    sim.detach(2);
    assert_eq!(last(&mut sim)[1]["connected"], false);
    sim.attach(22, View::Controller, "p2");
    assert_eq!(last(&mut sim)[1]["connected"], true);
    assert!(sim.s.rename_player("p2", "", now).is_err());
}

#[test]
fn a_late_joiner_gets_a_running_game_unless_late_join_is_off() {
    let mut sim = running(1);
    sim.add("p9");
    sim.attach(9, View::Controller, "p9");
    let init = sim.hello(9);
    assert!(init.session.late_join);
    assert_eq!(init.players.len(), 2);
    let mut m = quiz_memizy();
    m["modes"]["multiplayer"]["lateJoin"] = json!(false);
    let mut cfg = config(Mode::Multiplayer, Some(HostAs::Presenter));
    cfg.runtime = manifest(m).runtime;
    let mut sim = Sim::new(cfg);
    sim.add("p1");
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    sim.advance(DEFAULT_COUNTDOWN_MS);
    assert_eq!(
        sim.s.add_player(PlayerSpec::new("late", "Late"), sim.now()),
        Err(SessionError::LateJoinNotAllowed)
    );
}

#[test]
fn a_reconnect_is_a_new_instance_with_a_new_init_payload() {
    let mut sim = running(1);
    sim.ok(1, "saveData", r#"["set", {"level": 4}]"#);
    sim.attach(11, View::Controller, "p1");
    assert_eq!(sim.closed.get(&1), Some(&CloseReason::Replaced));
    sim.fails(
        1,
        "send",
        &send_args(json!("all"), json!(1)),
        C::SessionEnded,
    );
    let init = sim.hello(11);
    assert_eq!(init.data.set, json!({"level": 4}));
    sim.ok(11, "ready", "[]");
    sim.ok(11, "send", &send_args(json!("authority"), json!(1)));
}

#[test]
fn a_saved_game_continues_paused_from_its_snapshot_without_start() {
    let mut sim = running(2);
    sim.ok(BOARD, "saveSnapshot", r#"[{"round": 7}]"#);
    sim.advance(12_345);
    let now = sim.now();
    let game_time = sim.s.clock().game_time(now as f64);
    let (_, saved) = sim.s.save_game(now).unwrap();
    sim.pump();
    assert_eq!(sim.records(|r| matches!(r, Record::SavedGame(_))).len(), 1);
    assert_eq!(saved.players.len(), 2);
    // Weeks later, in another room.
    sim.clock.advance_ms(14 * 24 * 3600 * 1000);
    let later = sim.now();
    let cfg = config(Mode::Multiplayer, Some(HostAs::Presenter));
    let s = Session::continue_saved(cfg, &saved, Vec::new(), later).unwrap();
    let mut sim2 = Sim::from_session(s, sim.clock.clone());
    assert_eq!(sim2.s.phase(), Phase::Running);
    let init = sim2.join(BOARD, View::Board, "board");
    assert_eq!(init.snapshot, json!({"round": 7}));
    assert_eq!(init.session.id, "session-1");
    assert_eq!(init.clock.game_time(later as f64), game_time);
    assert!(init.clock.paused_at.is_some());
    let c = sim2.join(1, View::Controller, "p1");
    assert_eq!(
        c.players.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        ["p1", "p2"]
    );
    sim2.advance(60_000);
    assert!(sim2.take_method(BOARD, "start").is_empty());
    sim2.s.resume(sim2.now()).unwrap();
    sim2.pump();
    let clock = sim2.take_method(1, "clockChanged").pop().unwrap();
    let clock: hostwire_memizy::SessionClock = serde_json::from_value(clock[0].clone()).unwrap();
    assert_eq!(clock.game_time(sim2.now() as f64), game_time);
    // A game that has ended cannot be saved.
    sim2.ok(BOARD, "end", "[{}]");
    assert!(sim2.s.save_game(sim2.now()).is_none());
}

// ----- learning progress -----

#[test]
fn answers_update_leitner_progress_and_generated_items_only_stats() {
    let mut sim = running(1);
    sim.ok(
        1,
        "recordAnswer",
        r#"[{"itemId": "q1", "isCorrect": true, "answer": "j", "timeSpentMs": 900}]"#,
    );
    sim.ok(
        1,
        "recordAnswer",
        r#"[{"itemId": "q1", "isCorrect": true}]"#,
    );
    // OQSEP: familiar (2) after one correct answer, consolidated (3) after two.
    assert_eq!(sim.s.progress("p1").unwrap()["q1"]["bucket"], 3);
    sim.ok(
        1,
        "recordAnswer",
        r#"[{"itemId": "q1", "isCorrect": false}]"#,
    );
    let p = sim.s.progress("p1").unwrap()["q1"].clone();
    // A wrong answer is learning (1): 0 is kept for new or reset items.
    assert_eq!(p["bucket"], 1);
    assert_eq!(
        p["stats"],
        json!({"attempts": 3, "incorrect": 1, "streak": 0})
    );
    assert!(p["nextReviewAt"].as_str().unwrap().ends_with('Z'));
    // A generated item: statistics, not the schedule.
    sim.ok(1, "recordAnswer", r#"[{"itemId": "gen-1", "isCorrect": true, "item": {"id": "gen-1", "type": "chess-puzzle", "skills": ["chess.tactics.fork"]}}]"#);
    assert!(sim.s.progress("p1").unwrap().get("gen-1").is_none());
    assert_eq!(
        sim.s.player_stats("p1"),
        Some(PlayerStats {
            answers: 4,
            correct: 3,
            generated: 1
        })
    );
    let answers: Vec<&AnswerWrite> = sim
        .store
        .iter()
        .filter_map(|(_, r)| match r {
            Record::Answer(a) => Some(&**a),
            _ => None,
        })
        .collect();
    assert_eq!(answers.len(), 4);
    assert_eq!(answers[0].skills, vec!["astro.planets".to_owned()]);
    assert_eq!(answers[0].answer.as_deref(), Some("\"j\""));
    assert!(answers[3].generated && answers[3].progress.is_none());
    assert_eq!(answers[3].skills, vec!["chess.tactics.fork".to_owned()]);
    // Not in the set and no item: the item is required.
    let m = sim.fails(
        1,
        "recordAnswer",
        r#"[{"itemId": "zzz", "isCorrect": true}]"#,
        C::InvalidArgument,
    );
    assert!(m.contains("answer.item"), "{m}");
    // The progress comes back in the next InitPayload.
    sim.detach(1);
    sim.attach(2, View::Controller, "p1");
    assert_eq!(sim.hello(2).progress["q1"]["bucket"], 1);
}

#[test]
fn only_the_authority_records_for_another_player() {
    let mut sim = running(2);
    let m = sim.fails(
        1,
        "recordAnswer",
        r#"[{"playerId": "p2", "itemId": "q1", "isCorrect": true}]"#,
        C::NotAuthority,
    );
    assert!(m.contains("answer.playerId"), "{m}");
    sim.ok(
        1,
        "recordAnswer",
        r#"[{"playerId": "p1", "itemId": "q1", "isCorrect": true}]"#,
    );
    sim.fails(
        BOARD,
        "recordAnswer",
        r#"[{"itemId": "q1", "isCorrect": true}]"#,
        C::InvalidArgument,
    );
    sim.fails(
        BOARD,
        "recordAnswer",
        r#"[{"playerId": "ghost", "itemId": "q1", "isCorrect": true}]"#,
        C::InvalidArgument,
    );
    sim.ok(
        BOARD,
        "recordAnswer",
        r#"[{"playerId": "p2", "itemId": "q1", "isCorrect": true}]"#,
    );
    assert_eq!(sim.s.progress("p2").unwrap()["q1"]["bucket"], 2);
}

// ----- bounds -----

#[test]
fn an_instance_may_have_only_so_many_calls_waiting() {
    let mut sim = running(1);
    sim.store_mode = StoreMode::Hold;
    for i in 0..MAX_PENDING_CALLS_PER_INSTANCE {
        let c = sim.start_call(1, "saveData", &format!(r#"["plugin", {i}]"#));
        assert_eq!(sim.reply(1, c), None);
    }
    let m = sim.fails(1, "saveData", r#"["plugin", 0]"#, C::RateLimited);
    assert!(m.contains("waiting"), "{m}");
    // Sends do not wait and still pass.
    sim.ok(1, "send", &send_args(json!("authority"), json!(1)));
    sim.store_mode = StoreMode::Durable;
    sim.advance(1_000);
    sim.release();
    // Every waiting call was answered: the instance may write again.
    sim.ok(1, "saveData", r#"["set", 1]"#);
}

#[test]
fn the_store_may_have_only_so_many_records_in_flight() {
    let mut cfg = config(Mode::Multiplayer, Some(HostAs::Presenter));
    cfg.bounds.records_in_flight = 3;
    let mut sim = Sim::new(cfg);
    for i in 1..=4 {
        sim.add(&format!("p{i}"));
    }
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(BOARD, View::Board, "board");
    for i in 1..=4 {
        sim.join(i, View::Controller, &format!("p{i}"));
    }
    sim.store_mode = StoreMode::Hold;
    for i in 1..=3 {
        sim.start_call(
            i,
            "recordAnswer",
            r#"[{"itemId": "q1", "isCorrect": true}]"#,
        );
    }
    let m = sim.fails(
        4,
        "recordAnswer",
        r#"[{"itemId": "q1", "isCorrect": true}]"#,
        C::InternalError,
    );
    assert!(m.contains("store is behind"), "{m}");
    sim.store_mode = StoreMode::Durable;
    sim.release();
    sim.ok(
        4,
        "recordAnswer",
        r#"[{"itemId": "q1", "isCorrect": true}]"#,
    );
}

#[test]
fn a_slow_consumer_is_closed_and_then_treated_as_disconnected() {
    let mut cfg = config(Mode::Multiplayer, Some(HostAs::Presenter));
    cfg.bounds.queued_calls_per_instance = 5;
    let mut sim = Sim::new(cfg);
    sim.add("p1");
    sim.add("p2");
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    sim.join(2, View::Controller, "p2");
    sim.advance(DEFAULT_COUNTDOWN_MS);
    // The server does not poll in between: the outputs pile up.
    for n in 0..10 {
        let now = sim.now();
        sim.s.handle_call(
            1,
            1_000 + n,
            "send",
            &send_args(json!(["p2"]), json!(n)),
            now,
        );
    }
    sim.pump();
    assert_eq!(sim.closed.get(&2), Some(&CloseReason::SlowConsumer));
    assert_eq!(sim.take_method(2, "deliver").len(), 5);
    assert!(!sim.s.players()[1].connected);
}

#[test]
fn a_session_whose_outputs_are_not_polled_refuses_work() {
    let mut cfg = config(Mode::Multiplayer, Some(HostAs::Presenter));
    cfg.bounds.queued_outputs_per_session = 50;
    let mut sim = Sim::new(cfg);
    sim.add("p1");
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    sim.advance(DEFAULT_COUNTDOWN_MS);
    let mut refused = 0;
    for n in 0..40 {
        let now = sim.now();
        sim.s.handle_call(
            1,
            2_000 + n,
            "send",
            &send_args(json!("authority"), json!(n)),
            now,
        );
    }
    let queued = sim.s.queued_outputs();
    sim.pump();
    let delivered = sim.take_method(BOARD, "deliver").len();
    assert!(delivered <= 25, "{delivered}");
    for n in 0..40 {
        if let Some(Err(e)) = sim.replies.get(&(1, 2_000 + n)) {
            assert_eq!(e.code, C::InternalError);
            assert!(e.message.contains("overloaded"));
            refused += 1;
        }
    }
    assert_eq!(refused + delivered, 40);
    // What piles up is the delivered calls and one reply per call.
    assert_eq!(queued, 2 * delivered + refused);
}

#[test]
fn the_session_is_due_when_an_instance_that_has_not_said_hello_must_be_closed() {
    let mut sim = Sim::presenter(2);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.join(1, View::Board, "board");
    let without = sim.s.poll_timeout();
    sim.attach(2, View::Controller, "p1");
    let hello_by = now + 10_000;
    assert!(
        sim.s.poll_timeout().is_some_and(|t| t <= hello_by),
        "{:?}",
        sim.s.poll_timeout()
    );
    // Once it said hello, or left, its deadline is gone.
    sim.hello(2);
    assert_eq!(sim.s.poll_timeout(), without);
    sim.attach(3, View::Controller, "p2");
    assert!(sim.s.poll_timeout().is_some_and(|t| t <= hello_by));
    sim.detach(3);
    assert_eq!(sim.s.poll_timeout(), without);
}

#[test]
fn an_instance_that_does_not_say_hello_in_time_is_closed() {
    let mut sim = Sim::presenter(1);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.attach(1, View::Controller, "p1");
    sim.advance(9_999);
    assert!(sim.closed.is_empty());
    sim.advance(1);
    assert_eq!(sim.closed.get(&1), Some(&CloseReason::HelloTimeout));
    assert_eq!(sim.s.instance_count(), 0);
}

#[test]
fn unknown_and_reserved_methods() {
    let mut sim = running(1);
    sim.fails(1, "saveProgress", "[]", C::UnknownMethod);
    sim.fails(1, "nope", "[]", C::UnknownMethod);
    sim.fails(1, "send", "not json", C::InvalidArgument);
}
