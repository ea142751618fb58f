//! Invariants under arbitrary operation sequences: the ledger's sequence
//! is gap-free, and replay is ack, ledger, stream, in order, exactly what a
//! model of the replay policies predicts.

use hostwire_ggui::channel::*;
use hostwire_ggui::frames::StreamChannelMode;
use proptest::prelude::*;
use serde_json::{json, Value};

fn drain(ch: &mut Channel, conn: ConnId) -> Vec<Value> {
    let mut out = Vec::new();
    // Every store write succeeds here: an acknowledgement held until its
    // records are durable (`Durable`) is sent.
    while let Some(o) = ch.poll_output() {
        match o {
            Output::Send { conn: c, frame } | Output::Durable { conn: c, frame, .. }
                if c == conn =>
            {
                out.push(serde_json::from_str(&frame).unwrap());
            }
            _ => {}
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Op {
    Valid,
    Invalid,
    Props,
    Emit(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Valid),
        2 => Just(Op::Invalid),
        1 => Just(Op::Props),
        3 => (0usize..4).prop_map(Op::Emit),
    ]
}

const CHANNELS: [&str; 4] = ["all", "latest", "none", "_ggui:contract-error"];

fn setup(ring: usize) -> (Channel, ConnId) {
    let mut ch = Channel::new(ChannelConfig {
        stream_buffer_max: ring,
        ..Default::default()
    });
    ch.create_session(
        CreateSession {
            session_id: "s".into(),
            action_spec: Some(json!({"go": {"schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}})),
            stream_spec: Some(json!({"all": {"replay": "all"}, "latest": {"replay": "latest"}, "none": {"replay": "none"}})),
            ..Default::default()
        },
        0,
    )
    .unwrap();
    let c = ConnId(1);
    ch.connection_opened(c, 0, true);
    ch.frame_received(
        c,
        json!({"type": "subscribe", "payload": {"sessionId": "s"}})
            .to_string()
            .as_bytes(),
        0,
    );
    drain(&mut ch, c);
    (ch, c)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn ledger_sequence_is_gap_free(ops in prop::collection::vec(op(), 0..120)) {
        let (mut ch, c) = setup(256);
        let mut acked = Vec::new();
        let mut ledger_len = 0u64;
        for (i, o) in ops.iter().enumerate() {
            let now = i as u64;
            match o {
                Op::Valid | Op::Invalid => {
                    let data = if matches!(o, Op::Valid) { json!({"n": i}) } else { json!({"n": "x"}) };
                    let f = json!({"type": "action", "payload": {"sessionId": "s", "type": "data:submit", "payload": {"action": "go", "data": data}}});
                    ch.frame_received(c, f.to_string().as_bytes(), now);
                    for fr in drain(&mut ch, c) {
                        if fr["type"] == "ack" {
                            acked.push(fr["payload"]["sequence"].as_u64().unwrap());
                        }
                    }
                    if matches!(o, Op::Valid) { ledger_len += 1; }
                }
                Op::Props => {
                    let seq = ch.push_props("s", serde_json::Map::new(), None, now).unwrap();
                    acked.push(seq);
                    ledger_len += 1;
                    drain(&mut ch, c);
                }
                Op::Emit(k) => {
                    ch.emit("s", CHANNELS[*k], StreamChannelMode::Append, json!(i), None).unwrap();
                    drain(&mut ch, c);
                }
            }
        }
        // Every accepted entry got the next number: 1, 2, 3, ... with no gap.
        prop_assert_eq!(acked.clone(), (1..=ledger_len).collect::<Vec<_>>());
        prop_assert_eq!(ch.read_session("s").unwrap().sequence, ledger_len);
        let d = ConnId(2);
        ch.connection_opened(d, 0, true);
        ch.frame_received(d, json!({"type": "subscribe", "payload": {"sessionId": "s", "sinceSequence": 0}}).to_string().as_bytes(), 0);
        let frames = drain(&mut ch, d);
        let replayed: Vec<u64> = frames[1..].iter().map(|f| f["payload"]["seq"].as_u64().unwrap()).collect();
        prop_assert_eq!(replayed, acked);
    }

    #[test]
    fn replay_matches_the_policy_model(
        emits in prop::collection::vec(0usize..4, 0..60),
        ring in 1usize..10,
        from in 0u64..70,
        since in 0u64..3,
    ) {
        let (mut ch, c) = setup(ring);
        // The model: every emit gets the next seq; "all" and reserved share
        // a ring of `ring`; "latest" keeps the last; "none" keeps nothing.
        let mut ringed: Vec<u64> = Vec::new();
        let mut evicted_above = 0u64;
        let mut latest: Option<u64> = None;
        for (i, k) in emits.iter().enumerate() {
            let env = ch.emit("s", CHANNELS[*k], StreamChannelMode::Append, json!(i), None).unwrap();
            let seq = env.seq.unwrap();
            prop_assert_eq!(seq, i as u64 + 1);
            match CHANNELS[*k] {
                "latest" => latest = Some(seq),
                "none" => {}
                _ => {
                    ringed.push(seq);
                    if ringed.len() > ring {
                        evicted_above = ringed.remove(0);
                    }
                }
            }
        }
        drain(&mut ch, c);
        let mut expected: Vec<u64> = ringed.iter().copied().filter(|&s| s > from).collect();
        if let Some(l) = latest.filter(|&l| l > from) {
            expected.push(l);
        }
        expected.sort_unstable();
        ch.frame_received(c, json!({"type": "action", "payload": {"sessionId": "s", "type": "data:submit", "payload": {"action": "go", "data": {"n": 1}}}}).to_string().as_bytes(), 0);
        drain(&mut ch, c);
        let d = ConnId(2);
        ch.connection_opened(d, 0, true);
        ch.frame_received(d, json!({"type": "subscribe", "payload": {"sessionId": "s", "fromSeq": from, "sinceSequence": since}}).to_string().as_bytes(), 0);
        let frames = drain(&mut ch, d);
        let types: Vec<&str> = frames.iter().map(|f| f["type"].as_str().unwrap()).collect();
        // ack, then ledger (or its error), then stream entries.
        prop_assert_eq!(types[0], "ack");
        let ledger_part: Vec<&str> = types[1..].iter().copied().take_while(|t| *t != "data").collect();
        if since <= 1 {
            prop_assert_eq!(ledger_part.len() as u64, 1 - since);
            prop_assert!(ledger_part.iter().all(|t| *t == "render_event"));
        } else {
            prop_assert_eq!(ledger_part, vec!["error"]);
        }
        let data: Vec<u64> = frames.iter().filter(|f| f["type"] == "data").map(|f| f["payload"]["seq"].as_u64().unwrap()).collect();
        prop_assert_eq!(data, expected);
        let truncated = frames[0]["payload"].get("replayTruncated").is_some();
        prop_assert_eq!(truncated, from < evicted_above);
        prop_assert_eq!(frames[0]["payload"]["streamSeq"].as_u64().unwrap(), emits.len() as u64);
    }
}
