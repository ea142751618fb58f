//! Any bytes as ggui live-channel client frames (one per line), through
//! the channel's state machine: never a panic; every frame out is a JSON
//! object with a `type`; acked sequences are gap-free; a connection that
//! was told to close gets nothing more.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_ggui::channel::{Channel, ChannelConfig, ConnId, CreateSession, Output};
use hostwire_ggui::frames::StreamChannelMode;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let mut ch = Channel::new(ChannelConfig {
        ledger_max_events: 16,
        stream_buffer_max: 4,
        max_pending_actions: 8,
        ..Default::default()
    });
    ch.create_session(
        CreateSession {
            session_id: "s".into(),
            action_spec: Some(json!({
                "go": {"schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}, "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}}}, "required": ["n"]}},
                "free": {}
            })),
            stream_spec: Some(json!({"log": {"replay": "all"}, "st": {"replay": "latest"}})),
            ..Default::default()
        },
        0,
    )
    .unwrap();
    let conns = [ConnId(1), ConnId(2)];
    for c in conns {
        ch.connection_opened(c, 0, true);
    }
    let mut closed = [false; 2];
    let mut last_ack = 0u64;
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        let k = i % 2;
        ch.frame_received(conns[k], line, i as u64 * 3);
        if i % 5 == 4 {
            let _ = ch.emit(
                "s",
                ["log", "st", "x"][i % 3],
                StreamChannelMode::Append,
                json!(i),
                None,
            );
        }
        if i % 7 == 6 {
            let _ = ch.consume_actions("s", 3, i as u64);
        }
        while let Some(o) = ch.poll_output() {
            match o {
                // An action's ack is held until its records are durable
                // (`Durable`); this store never refuses, so it goes out.
                Output::Send { conn, frame } | Output::Durable { conn, frame, .. } => {
                    let idx = (conn.0 - 1) as usize;
                    assert!(!closed[idx], "a frame after close");
                    let v: Value = serde_json::from_str(&frame).expect("frames are JSON");
                    let t = v["type"].as_str().expect("frames have a type");
                    if t == "ack" && v["payload"].get("serverVersion").is_none() {
                        let seq = v["payload"]["sequence"].as_u64().unwrap();
                        assert_eq!(seq, last_ack + 1, "acked sequences are gap-free");
                        last_ack = seq;
                    }
                }
                Output::Close { conn, .. } => closed[(conn.0 - 1) as usize] = true,
                _ => {}
            }
        }
    }
    assert_eq!(ch.read_session("s").unwrap().sequence, last_ack);
});
