//! Sans-IO throughput of the live channel: actions decoded, validated
//! against a declared schema, appended and acked, with its parts (the
//! decode, the validation) and a baseline (the same frame parsed into a
//! `Value`, no checks) measured beside it; and stream envelopes fanned out
//! to 100 subscribers (serialized once, shared).

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use hostwire_ggui::channel::{Channel, ChannelConfig, ConnId, CreateSession, Output};
use hostwire_ggui::decode::{decode_client_frame, ClientFrame};
use hostwire_ggui::frames::StreamChannelMode;
use hostwire_ggui::validate::ActionSpec;
use serde_json::{json, Value};

fn drain(ch: &mut Channel) -> usize {
    let mut n = 0;
    while let Some(o) = ch.poll_output() {
        if matches!(o, Output::Send { .. }) {
            n += 1;
        }
        black_box(o);
    }
    n
}

fn action_spec() -> Value {
    json!({"toggleTask": {"schema": {"type": "object", "properties": {
        "id": {"type": "string", "minLength": 1},
        "done": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}
    }, "required": ["id", "done"]}}})
}

fn session(ch: &mut Channel) {
    ch.create_session(
        CreateSession {
            session_id: "s".into(),
            action_spec: Some(action_spec()),
            stream_spec: Some(json!({"todos": {"replay": "all"}})),
            ..Default::default()
        },
        0,
    )
    .unwrap();
}

fn actions(c: &mut Criterion) {
    let mut ch = Channel::new(ChannelConfig {
        rate_per_second: 1e12,
        rate_burst: u32::MAX,
        ..Default::default()
    });
    session(&mut ch);
    let conn = ConnId(1);
    ch.connection_opened(conn, 0, true);
    ch.frame_received(
        conn,
        br#"{"type":"subscribe","payload":{"sessionId":"s"}}"#,
        0,
    );
    drain(&mut ch);
    let frame = json!({"type": "action", "requestId": "req-1", "payload": {"sessionId": "s", "type": "data:submit",
        "payload": {"action": "toggleTask", "data": {"id": "task-42", "done": true, "tags": ["home", "urgent"]}}}})
    .to_string();
    let mut g = c.benchmark_group("ggui_actions");
    g.throughput(Throughput::Elements(1));
    let mut now = 0u64;
    g.bench_function("validated_and_acked", |b| {
        b.iter(|| {
            now += 1;
            ch.frame_received(conn, frame.as_bytes(), now);
            assert_eq!(drain(&mut ch), 1);
            if now.is_multiple_of(512) {
                ch.drain_actions("s", u64::MAX, now).unwrap();
                drain(&mut ch);
            }
        })
    });
    g.bench_function("decode only", |b| {
        b.iter(|| black_box(decode_client_frame(black_box(frame.as_bytes()), true).unwrap()))
    });
    let spec = ActionSpec::from_json(&action_spec()).unwrap();
    let Ok(ClientFrame::Action { envelope, .. }) = decode_client_frame(frame.as_bytes(), true)
    else {
        panic!("not an action");
    };
    g.bench_function("validate only", |b| {
        b.iter(|| assert!(spec.validate_action_data(envelope.payload.as_ref()).valid()))
    });
    g.bench_function("baseline: parse to Value", |b| {
        b.iter(|| black_box(serde_json::from_slice::<Value>(black_box(frame.as_bytes())).unwrap()))
    });
    g.finish();
}

fn fan_out(c: &mut Criterion) {
    let mut ch = Channel::new(ChannelConfig {
        max_subscribers_per_session: 100,
        ..Default::default()
    });
    session(&mut ch);
    for i in 0..100 {
        let conn = ConnId(i);
        ch.connection_opened(conn, 0, true);
        ch.frame_received(
            conn,
            br#"{"type":"subscribe","payload":{"sessionId":"s"}}"#,
            0,
        );
    }
    drain(&mut ch);
    let payload =
        json!({"id": "task-42", "title": "Water the plants", "done": false, "tags": ["home"]});
    let mut g = c.benchmark_group("ggui_fan_out");
    g.throughput(Throughput::Elements(1));
    g.bench_function("envelope_to_100_subscribers", |b| {
        b.iter(|| {
            ch.emit(
                "s",
                "todos",
                StreamChannelMode::Append,
                payload.clone(),
                None,
            )
            .unwrap();
            assert_eq!(drain(&mut ch), 100);
        })
    });
    g.finish();
}

criterion_group!(benches, actions, fan_out);
criterion_main!(benches);
