//! Services and assets in the engine, on the manual clock: a service call
//! out never holds the session back, its deadline fails it alone, and
//! `getAsset` matches keys as OQSE writes them (lowercase).

use crate::support::*;
use hostwire_memizy::session::*;
use hostwire_memizy::{ProtocolErrorCode as C, View};
use serde_json::json;

const BOARD: InstanceId = 100;

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

#[test]
fn the_session_goes_on_while_a_service_call_is_out() {
    let mut sim = running(2);
    let slow = sim.start_call(1, "service", r#"["chess.puzzles", {"n": 1}]"#);
    let slow_req = sim.services.pop().unwrap();
    assert_eq!(sim.reply(1, slow), None);
    // The same instance and another go on: messages are routed, answers
    // recorded, another service call goes out and is answered first.
    sim.ok(1, "send", &send_args(json!("authority"), json!("move e4")));
    let d = sim.take_method(BOARD, "deliver");
    assert_eq!(d[0][0]["data"], "move e4");
    sim.ok(
        2,
        "recordAnswer",
        r#"[{"itemId": "q1", "isCorrect": true}]"#,
    );
    let fast = sim.start_call(2, "service", r#"["chess.puzzles", {"n": 2}]"#);
    let fast_req = sim.services.pop().unwrap();
    let now = sim.now();
    sim.s.service_done(fast_req.id, Ok("2"), now);
    sim.pump();
    assert_eq!(sim.reply(2, fast), Some(Ok(Reply::Service("2".into()))));
    assert_eq!(sim.reply(1, slow), None, "still out");
    // Its deadline fails it alone; the session is unharmed.
    sim.advance(slow_req.deadline_ms - sim.now());
    match sim.reply(1, slow) {
        Some(Err(e)) => {
            assert_eq!(e.code, C::InternalError);
            assert!(e.message.contains("did not answer within 2000 ms"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.cancelled, vec![slow_req.id]);
    sim.ok(1, "send", &send_args(json!("authority"), json!("move d4")));
}

#[test]
fn a_closed_instance_cancels_its_service_calls() {
    let mut sim = running(1);
    sim.start_call(1, "service", r#"["chess.puzzles", {}]"#);
    let req = sim.services.pop().unwrap();
    sim.detach(1);
    assert_eq!(sim.cancelled, vec![req.id]);
    // A late answer has nobody to go to and is dropped.
    let now = sim.now();
    sim.s.service_done(req.id, Ok("1"), now);
    sim.pump();
    assert!(sim.replies.is_empty());
}

#[test]
fn asset_keys_are_matched_in_lowercase() {
    let mut sim = running(1);
    assert_eq!(
        sim.ok(1, "getAsset", r#"["IMG/Planet.PNG", "q1"]"#),
        Reply::Asset {
            key: "img/planet.png".into(),
            item_id: Some("q1".into())
        }
    );
    sim.fails(1, "getAsset", r#"["IMG/none.png"]"#, C::AssetNotFound);
}
