//! Random interleavings of calls, detaches, reconnects, time, store and
//! service answers: every call of an attached instance is answered exactly
//! once when the store and the services are done, every Plugin API call is
//! valid on the wire (checked by the driver), and nothing panics.

use crate::support::*;
use hostwire_memizy::session::*;
use hostwire_memizy::View;
use proptest::prelude::*;

const BOARD: InstanceId = 100;

#[derive(Debug, Clone)]
enum Op {
    Call(u8, usize),
    Detach(u8),
    Reattach(u8),
    Advance(u64),
    Ack,
    Fail,
    ServiceDone,
    ServiceTimeout,
    Pause,
}

/// Calls a plugin may make, good and bad.
const CALLS: &[(&str, &str)] = &[
    ("send", r#"[{"to":"authority","data":{"a":1}}]"#),
    ("send", r#"[{"to":"all","data":[1,2]}]"#),
    ("send", r#"[{"to":["p1","p2","board"],"data":null}]"#),
    ("send", r#"[{"to":["nobody"],"data":1}]"#),
    ("saveSnapshot", r#"[{"round":1}]"#),
    ("saveData", r#"["plugin",{"c":1}]"#),
    ("saveData", r#"["set",2]"#),
    ("recordAnswer", r#"[{"itemId":"q1","isCorrect":true}]"#),
    (
        "recordAnswer",
        r#"[{"playerId":"p2","itemId":"q2","isCorrect":false}]"#,
    ),
    (
        "recordAnswer",
        r#"[{"itemId":"g","isCorrect":true,"item":{"id":"g","type":"x-gen"}}]"#,
    ),
    ("getAsset", r#"["img/planet.png"]"#),
    ("getAsset", r#"["missing"]"#),
    ("service", r#"["chess.puzzles",{}]"#),
    ("service", r#"["ai.chat",{}]"#),
    ("reportError", r#"[{"code":"E","message":"m"}]"#),
    ("updateSettings", r#"[{"values":{},"valid":true}]"#),
    ("end", r#"[{"scores":{"p1":1}}]"#),
    ("ready", "[]"),
    ("hello", ""),
    ("nope", "[]"),
    ("send", "[1,2"),
];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, 0..CALLS.len()).prop_map(|(i, c)| Op::Call(i, c)),
        1 => (0u8..4).prop_map(Op::Detach),
        1 => (0u8..4).prop_map(Op::Reattach),
        2 => (0u64..3_000).prop_map(Op::Advance),
        2 => Just(Op::Ack),
        1 => Just(Op::Fail),
        1 => Just(Op::ServiceDone),
        1 => Just(Op::ServiceTimeout),
        1 => Just(Op::Pause),
    ]
}

fn address(d: u8) -> (View, String) {
    if d == 0 {
        (View::Board, "board".into())
    } else {
        (View::Controller, format!("p{d}"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn every_call_is_answered_once(ops in proptest::collection::vec(op(), 1..120)) {
        let mut sim = Sim::presenter(3);
        let now = sim.now();
        sim.s.start_game(now).unwrap();
        sim.store_mode = StoreMode::Hold;
        let mut current = [BOARD, 1, 2, 3];
        for (d, inst) in current.iter().enumerate() {
            let (view, addr) = address(d as u8);
            sim.attach(*inst, view, &addr);
            sim.hello(*inst);
            let c = sim.start_call(*inst, "ready", "[]");
            prop_assert!(sim.reply(*inst, c).is_some());
        }
        sim.advance(DEFAULT_COUNTDOWN_MS);
        let mut next = 1_000;
        let mut issued = Vec::new();
        for op in ops {
            match op {
                Op::Call(d, c) => {
                    let inst = current[d as usize];
                    let (m, a) = CALLS[c];
                    let args = if m == "hello" { hello_args() } else { a.to_owned() };
                    let id = sim.start_call(inst, m, &args);
                    issued.push((inst, id));
                }
                Op::Detach(d) => sim.detach(current[d as usize]),
                Op::Reattach(d) => {
                    let (view, addr) = address(d);
                    next += 1;
                    let now = sim.now();
                    if sim.s.attach(next, view, &addr, now).is_ok() {
                        current[d as usize] = next;
                        sim.pump();
                        let id = sim.start_call(next, "hello", &hello_args());
                        issued.push((next, id));
                    }
                }
                Op::Advance(ms) => sim.advance(ms),
                Op::Ack | Op::Fail => {
                    if !sim.held.is_empty() {
                        let id = sim.held.remove(0);
                        let now = sim.now();
                        let outcome = if matches!(op, Op::Ack) { Ok(()) } else { Err("disk".into()) };
                        sim.s.record_durable(id, outcome, now);
                        sim.pump();
                    }
                }
                Op::ServiceDone | Op::ServiceTimeout => {
                    if let Some(r) = sim.services.pop() {
                        let now = sim.now();
                        if matches!(op, Op::ServiceDone) {
                            sim.s.service_done(r.id, Ok(r#"{"ok":true}"#), now);
                        } else {
                            sim.s.service_timed_out(r.id, now);
                        }
                        sim.pump();
                    }
                }
                Op::Pause => {
                    let now = sim.now();
                    if sim.s.pause(now).is_err() {
                        let _ = sim.s.resume(now);
                    }
                    sim.pump();
                }
            }
            prop_assert_eq!(sim.s.queued_outputs(), 0);
        }
        // The store and the services finish; coalesced writes are flushed.
        sim.store_mode = StoreMode::Durable;
        sim.release();
        for r in std::mem::take(&mut sim.services) {
            let now = sim.now();
            sim.s.service_done(r.id, Ok("1"), now);
        }
        sim.pump();
        sim.advance(1_000);
        sim.release();
        for (inst, call) in issued {
            if sim.s.is_attached(inst) {
                prop_assert!(
                    sim.replies.contains_key(&(inst, call)),
                    "call {} of instance {} never answered", call, inst
                );
            }
        }
    }
}
