//! A whole multiplayer game in memory: a board and 30 controllers as
//! simulated plugins, from the lobby to the end, with the board reloading
//! from its snapshot, a late joiner and a misbehaving player.

use crate::support::*;
use hostwire_memizy::session::*;
use hostwire_memizy::{ProtocolErrorCode as C, View};
use serde_json::{json, Value};
use std::collections::BTreeMap;

const BOARD: InstanceId = 1_000;
const PLAYERS: u64 = 30;
const ROUNDS: u64 = 5;

/// The board's game: counts the answers of each round, scores them,
/// records them for each player and sends every device the new state.
struct BoardPlugin {
    inst: InstanceId,
    state: Value,
}

impl BoardPlugin {
    fn react(&mut self, sim: &mut Sim) {
        let mut changed = false;
        for (method, args) in sim.take(self.inst) {
            match method.as_str() {
                "start" => {
                    self.state = json!({"round": 0, "scores": {}, "answers": 0});
                    self.publish(sim);
                }
                "deliver" => {
                    let from = args[0]["from"].as_str().unwrap().to_owned();
                    let data = &args[0]["data"];
                    if data["answer"].is_string() {
                        let correct = data["answer"] == "j";
                        let s = &mut self.state["scores"][&from];
                        *s = json!(s.as_i64().unwrap_or(0) + i64::from(correct));
                        self.state["answers"] = json!(self.state["answers"].as_i64().unwrap() + 1);
                        let rec = json!([{"playerId": from, "itemId": "q1", "isCorrect": correct, "answer": data["answer"]}]);
                        assert!(matches!(
                            sim.call(self.inst, "recordAnswer", &rec.to_string()),
                            Some(Ok(_))
                        ));
                        changed = true;
                    }
                }
                _ => {}
            }
        }
        if changed {
            // The SDK saves the state after actions; the host keeps the latest.
            let snap = json!([self.state]).to_string();
            assert!(matches!(
                sim.call(self.inst, "saveSnapshot", &snap),
                Some(Ok(_)) | None
            ));
        }
    }

    fn next_round(&mut self, sim: &mut Sim) {
        self.state["round"] = json!(self.state["round"].as_i64().unwrap() + 1);
        self.publish(sim);
    }

    fn publish(&mut self, sim: &mut Sim) {
        let snap = json!([self.state]).to_string();
        assert!(matches!(
            sim.call(self.inst, "saveSnapshot", &snap),
            Some(Ok(_)) | None
        ));
        sim.ok(
            self.inst,
            "send",
            &send_args(json!("all"), json!({"state": self.state})),
        );
    }
}

fn last_round_seen(sim: &mut Sim, inst: InstanceId) -> Option<i64> {
    sim.take_method(inst, "deliver")
        .iter()
        .rev()
        .find_map(|a| a[0]["data"]["state"]["round"].as_i64())
}

#[test]
fn a_board_and_thirty_controllers_play_from_lobby_to_end() {
    let mut sim = Sim::presenter(PLAYERS as usize);
    assert_eq!(sim.s.phase(), Phase::Lobby);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.pump();

    // Loading: every device connects; the board first.
    let board_init = sim.join(BOARD, View::Board, "board");
    assert_eq!(board_init.players.len(), PLAYERS as usize);
    for i in 1..=PLAYERS {
        let init = sim.join(i, View::Controller, &format!("p{i}"));
        assert_eq!(init.session.self_address, format!("p{i}"));
        assert_eq!(init.set.parse().unwrap().items[0]["answerHidden"], true);
    }
    assert!(matches!(sim.s.phase(), Phase::Countdown { .. }));
    sim.advance(DEFAULT_COUNTDOWN_MS);
    assert_eq!(sim.s.phase(), Phase::Running);
    for i in 1..=PLAYERS {
        sim.take(i);
    }
    let mut board = BoardPlugin {
        inst: BOARD,
        state: Value::Null,
    };
    board.react(&mut sim);
    assert_eq!(board.state["round"], 0);

    let mut seen: BTreeMap<InstanceId, i64> = BTreeMap::new();
    let mut controllers: Vec<InstanceId> = (1..=PLAYERS).collect();
    let mut board_inst = BOARD;
    for round in 1..=ROUNDS {
        board.next_round(&mut sim);
        for &c in &controllers {
            if let Some(r) = last_round_seen(&mut sim, c) {
                seen.insert(c, r);
            }
        }
        for &c in &controllers {
            assert_eq!(
                seen.get(&c),
                Some(&(round as i64)),
                "controller {c} is behind"
            );
        }

        // Every player answers; p7 misbehaves meanwhile.
        for &c in &controllers {
            let answer = if c % 3 == 0 { "m" } else { "j" };
            sim.ok(
                c,
                "send",
                &send_args(json!("authority"), json!({"answer": answer})),
            );
        }
        if round == 2 {
            misbehave(&mut sim, 7);
        }
        board.react(&mut sim);
        sim.advance(1_000);

        if round == 3 {
            // The teacher reloads the board: messages to it are refused
            // until it is back from its snapshot, without start().
            let saved = sim.s.snapshot().map(str::to_owned).unwrap();
            sim.detach(board_inst);
            for &c in &controllers {
                assert_eq!(
                    sim.take_method(c, "authorityChanged"),
                    vec![json!([{"connected": false}])]
                );
            }
            sim.fails(
                5,
                "send",
                &send_args(json!("authority"), json!({"answer": "j"})),
                C::AuthorityUnavailable,
            );
            sim.advance(2_000);
            board_inst = BOARD + 1;
            sim.attach(board_inst, View::Board, "board");
            let init = sim.hello(board_inst);
            assert_eq!(
                init.snapshot,
                serde_json::from_str::<Value>(&saved).unwrap()
            );
            sim.ok(board_inst, "ready", "[]");
            assert!(sim.take_method(board_inst, "start").is_empty());
            board = BoardPlugin {
                inst: board_inst,
                state: init.snapshot,
            };
            for &c in &controllers {
                assert_eq!(
                    sim.take_method(c, "authorityChanged"),
                    vec![json!([{"connected": true}])]
                );
            }
        }
        if round == 4 {
            // A late joiner takes part from the next round on.
            sim.add("p31");
            let init = sim.join(31, View::Controller, "p31");
            assert!(init.session.late_join);
            assert_eq!(init.players.len(), PLAYERS as usize + 1);
            controllers.push(31);
        }
    }

    // Every answer was recorded as learning progress, durably.
    let answers = sim.records(|r| matches!(r, Record::Answer(_))).len() as u64;
    // 30 players for 5 rounds, and the late joiner in the last one.
    assert_eq!(answers, PLAYERS * ROUNDS + 1);
    assert_eq!(sim.s.progress("p1").unwrap()["q1"]["bucket"], 4);
    // Only wrong answers: learning (1), never new (0).
    assert_eq!(sim.s.progress("p3").unwrap()["q1"]["bucket"], 1);
    assert_eq!(board.state["answers"], json!(PLAYERS * ROUNDS + 1));
    assert_eq!(sim.s.progress("p31").unwrap()["q1"]["bucket"], 2);

    // The end: results stored, only once, snapshot discarded.
    let scores = board.state["scores"].clone();
    let end = json!([{"scores": scores, "summary": "well played"}]).to_string();
    sim.ok(board_inst, "end", &end);
    sim.ok(board_inst, "end", "[{}]");
    assert_eq!(sim.records(|r| matches!(r, Record::Result { .. })).len(), 1);
    assert!(sim.has_event(|e| matches!(e, SessionEvent::Ended { result } if result.summary.as_deref() == Some("well played"))));
    sim.advance(DEFAULT_FINISHED_CLOSE_MS);
    for &c in &controllers {
        assert_eq!(
            sim.take_method(c, "sessionEnded"),
            vec![json!(["finished"])]
        );
        sim.fails(
            c,
            "send",
            &send_args(json!("all"), json!(1)),
            C::SessionEnded,
        );
    }
    assert_eq!(
        sim.take_method(board_inst, "sessionEnded"),
        vec![json!(["finished"])]
    );
    assert_eq!(sim.s.phase(), Phase::Closed);
    assert!(sim.s.poll_timeout().is_none());
}

/// A buggy or hostile player: every misdeed gets its error, nobody else
/// notices.
fn misbehave(sim: &mut Sim, me: InstanceId) {
    let big = "x".repeat(70_000);
    sim.fails(
        me,
        "send",
        &send_args(json!("all"), json!(big)),
        C::MessageTooLarge,
    );
    sim.fails(me, "hello", &hello_args(), C::InvalidArgument);
    sim.fails(me, "saveSnapshot", r#"[{"mine": true}]"#, C::NotAuthority);
    sim.fails(me, "end", r#"[{"scores": {"p7": 1000}}]"#, C::NotAuthority);
    sim.fails(
        me,
        "updateSettings",
        r#"[{"values": {}, "valid": true}]"#,
        C::NotAllowedInView,
    );
    sim.fails(
        me,
        "recordAnswer",
        r#"[{"playerId": "p8", "itemId": "q1", "isCorrect": false}]"#,
        C::NotAuthority,
    );
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    sim.fails(
        me,
        "send",
        &format!(r#"[{{"to": "all", "data": {deep}}}]"#),
        C::InvalidArgument,
    );
    // A flood to one player: the burst passes, the rest is refused.
    let mut limited = 0;
    for _ in 0..200 {
        if let Some(Err(e)) = sim.call(me, "send", &send_args(json!(["p8"]), json!("spam"))) {
            assert_eq!(e.code, C::RateLimited);
            limited += 1;
        }
    }
    // The burst is 60 and this round's answer took one of it.
    assert_eq!(limited, 200 - 59);
    assert_eq!(sim.take_method(8, "deliver").len(), 59);
    // Error reports beyond the rate vanish without an error.
    for _ in 0..50 {
        sim.ok(me, "reportError", r#"[{"code": "X", "message": "noise"}]"#);
    }
}
