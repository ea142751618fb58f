//! The durability rules of the live channel, driven in memory: writes
//! handed out and answered by hand, what waits for them held, refused
//! writes taken back, group commit, the idle sweep on the unit's timer.

use hostwire_ggui::channel::*;
use hostwire_ggui::durable::*;
use serde_json::{json, Map, Value};

const T0: u64 = 1_796_022_000_000;
const TTL: u64 = 10 * 60 * 1000;

type Unit = DurableChannel<&'static str>;

fn unit() -> Unit {
    let mut u = Unit::new(Channel::new(ChannelConfig::default()), true, TTL, T0);
    u.apply(|ch| {
        ch.create_session(
            CreateSession {
                session_id: "s1".into(),
                ..Default::default()
            },
            T0,
        )
        .unwrap();
        ch.create_session(
            CreateSession {
                session_id: "s2".into(),
                ..Default::default()
            },
            T0,
        )
        .unwrap();
    });
    // The creations' writes, answered.
    for w in writes(&mut u) {
        u.ack(w.id, true);
    }
    drain(&mut u);
    u
}

fn open(u: &mut Unit, id: u64, session: &str) -> ConnId {
    let c = ConnId(id);
    u.apply(|ch| ch.connection_opened(c, T0, true));
    send(
        u,
        c,
        json!({"type": "subscribe", "requestId": "sub", "payload": {"sessionId": session}}),
    );
    for w in writes(u) {
        u.ack(w.id, true);
    }
    drain(u);
    c
}

fn send(u: &mut Unit, c: ConnId, v: Value) {
    u.frame_received(c, v.to_string().as_bytes(), T0);
}

fn action(session: &str, req: &str) -> Value {
    json!({"type": "action", "requestId": req, "payload": {"sessionId": session, "type": "data:submit", "payload": {"action": "go", "data": {"n": 1}}}})
}

fn writes(u: &mut Unit) -> Vec<Write> {
    std::iter::from_fn(|| u.poll_write()).collect()
}

/// The frames out (type, requestId, connection), the closes and answers.
#[derive(Debug, Default, PartialEq)]
struct Told {
    frames: Vec<(u64, String, Value)>,
    closes: Vec<(u64, u16)>,
    answers: Vec<(&'static str, bool)>,
    wakes: Vec<String>,
}

fn drain(u: &mut Unit) -> Told {
    let mut t = Told::default();
    while let Some(s) = u.poll_output() {
        match s {
            Step::Out(Output::Send { conn, frame }) => {
                let v: Value = serde_json::from_str(&frame).unwrap();
                let ty = v["type"].as_str().unwrap().to_owned();
                let code = v["payload"]["code"].clone();
                let req = v["requestId"].clone();
                t.frames.push((conn.0, ty, json!([req, code])));
            }
            Step::Out(Output::Close { conn, code, .. }) => t.closes.push((conn.0, code)),
            Step::Out(Output::ActionsAvailable { session_id }) => t.wakes.push(session_id),
            Step::Out(o) => panic!("not carried out: {o:?}"),
            Step::Answer { tag, stored } => t.answers.push((tag, stored)),
        }
    }
    t
}

fn acks(t: &Told) -> Vec<String> {
    t.frames
        .iter()
        .filter(|(_, ty, _)| ty == "ack")
        .map(|(_, _, v)| v[0].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn an_actions_ack_waits_for_its_write_and_nothing_behind_it_goes_first() {
    let mut u = unit();
    let c = open(&mut u, 1, "s1");
    send(&mut u, c, action("s1", "a1"));
    assert!(u.takes_queued(), "a batch that waits takes the queued ones");
    // A ping behind the action: held with it.
    send(&mut u, c, json!({"type": "ping", "requestId": "p"}));
    assert!(drain(&mut u).frames.is_empty(), "nothing before the write");
    let ws = writes(&mut u);
    assert_eq!(ws.len(), 1);
    assert_eq!(ws[0].session_id, "s1");
    assert!(ws[0]
        .records
        .iter()
        .any(|r| matches!(r, Record::LedgerEvent { .. })));
    assert!(!u.accepts(), "no command while the write is on its way");
    assert_eq!(u.poll_timeout(), None, "the sweep waits for the write too");
    assert!(
        drain(&mut u).frames.is_empty(),
        "the ack waits for the store"
    );
    assert!(!u.ack(ws[0].id, true));
    let t = drain(&mut u);
    let order: Vec<&str> = t.frames.iter().map(|(_, ty, _)| ty.as_str()).collect();
    assert_eq!(order, ["ack", "pong"], "{t:?}");
    assert_eq!(t.wakes, ["s1"]);
    assert!(u.accepts());
}

#[test]
fn a_refused_write_takes_the_action_back_and_answers_append_failed() {
    let mut u = unit();
    let c = open(&mut u, 1, "s1");
    send(&mut u, c, action("s1", "a1"));
    let ws = writes(&mut u);
    assert!(u.ack(ws[0].id, false), "a refused change is reported");
    let t = drain(&mut u);
    assert_eq!(t.frames.len(), 1, "{t:?}");
    assert_eq!(t.frames[0].2, json!(["a1", "APPEND_FAILED"]));
    assert!(
        t.wakes.is_empty(),
        "no long poll woken for a change taken back"
    );
    assert_eq!(u.channel.read_session("s1").unwrap().sequence, 0);
    // Its sequence is given again.
    send(&mut u, c, action("s1", "a2"));
    let ws = writes(&mut u);
    u.ack(ws[0].id, true);
    drain(&mut u);
    assert_eq!(u.channel.read_session("s1").unwrap().sequence, 1);
}

#[test]
fn queued_actions_of_two_sessions_share_a_batch_with_one_write_each_and_a_refusal_stays_in_its_session(
) {
    let mut u = unit();
    let c1 = open(&mut u, 1, "s1");
    let c2 = open(&mut u, 2, "s2");
    send(&mut u, c1, action("s1", "a1"));
    send(&mut u, c2, action("s2", "b1"));
    send(&mut u, c1, action("s1", "a2"));
    // A replay to s1's subscriber behind the changes: it may show what is
    // taken back.
    send(
        &mut u,
        c1,
        json!({"type": "subscribe", "requestId": "again", "payload": {"sessionId": "s1", "sinceSequence": 0}}),
    );
    let ws = writes(&mut u);
    let sessions: Vec<&str> = ws.iter().map(|w| w.session_id.as_str()).collect();
    assert_eq!(sessions, ["s1", "s2"], "one write per session");
    // Several writes in flight: the answers come one by one.
    assert!(!u.ack(ws[1].id, true));
    assert!(
        drain(&mut u).frames.is_empty(),
        "held until every write is answered"
    );
    assert!(u.ack(ws[0].id, false));
    let t = drain(&mut u);
    let c1_frames: Vec<Value> = t
        .frames
        .iter()
        .filter(|(c, _, _)| *c == 1)
        .map(|(_, _, v)| v.clone())
        .collect();
    assert_eq!(
        c1_frames,
        [
            json!(["a1", "APPEND_FAILED"]),
            json!(["a2", "APPEND_FAILED"])
        ]
    );
    assert_eq!(acks(&t), ["b1"], "s2's action stands");
    assert_eq!(
        t.closes,
        [(1, CLOSE_STORE_FAILED)],
        "the replayed one closes"
    );
    assert_eq!(u.channel.read_session("s1").unwrap().sequence, 0);
    assert_eq!(u.channel.read_session("s2").unwrap().sequence, 1);
}

#[test]
fn a_refused_props_update_tells_nobody_and_answers_not_stored() {
    let mut u = unit();
    let c = open(&mut u, 1, "s1");
    let mut props = Map::new();
    props.insert("title".into(), json!("new"));
    u.apply(|ch| ch.push_props("s1", props, None, T0)).unwrap();
    u.answer("props");
    assert!(
        drain(&mut u).frames.is_empty(),
        "the update waits for its write"
    );
    let ws = writes(&mut u);
    u.ack(ws[0].id, false);
    let t = drain(&mut u);
    assert_eq!(t.answers, [("props", false)]);
    assert!(
        t.frames.is_empty(),
        "subscriber told of a refused update: {t:?}"
    );
    assert!(t.closes.is_empty(), "the subscriber stays: {t:?}");
    assert_eq!(u.channel.read_session("s1").unwrap().props, None);
    // Stored: told and answered.
    let mut props = Map::new();
    props.insert("title".into(), json!("newer"));
    u.apply(|ch| ch.push_props("s1", props, None, T0)).unwrap();
    u.answer("again");
    let ws = writes(&mut u);
    u.ack(ws[0].id, true);
    let t = drain(&mut u);
    assert_eq!(t.answers, [("again", true)]);
    assert_eq!(t.frames.len(), 1);
    let _ = c;
}

#[test]
fn an_answer_with_nothing_to_store_goes_at_once() {
    let mut u = unit();
    u.apply(|ch| ch.read_session("s1"));
    u.answer("read");
    assert_eq!(drain(&mut u).answers, [("read", true)]);
}

#[test]
fn without_a_store_nothing_waits_and_no_write_is_handed_out() {
    let mut u = Unit::new(Channel::new(ChannelConfig::default()), false, TTL, T0);
    let c = ConnId(1);
    u.apply(|ch| ch.connection_opened(c, T0, true));
    send(
        &mut u,
        c,
        json!({"type": "subscribe", "requestId": "sub", "payload": {"sessionId": "s1"}}),
    );
    send(&mut u, c, action("s1", "a1"));
    assert!(u.poll_write().is_none());
    assert!(u.accepts());
    assert_eq!(acks(&drain(&mut u)), ["sub", "a1"]);
}

#[test]
fn host_contexts_are_kept_latest_and_written_once_the_queue_runs_dry() {
    let mut u = unit();
    let c = open(&mut u, 1, "s1");
    for mode in ["inline", "fullscreen", "pip"] {
        send(
            &mut u,
            c,
            json!({"type": "host_context_observed", "payload": {"sessionId": "s1", "hostContext": {"currentDisplayMode": mode}}}),
        );
    }
    let ws = writes(&mut u);
    let contexts: Vec<&Record> = ws
        .iter()
        .flat_map(|w| &w.records)
        .filter(|r| matches!(r, Record::HostContext { .. }))
        .collect();
    assert_eq!(contexts.len(), 1, "{ws:?}");
    assert!(
        matches!(contexts[0], Record::HostContext { host_context, .. } if host_context["currentDisplayMode"] == "pip")
    );
}

#[test]
fn the_sweep_on_the_units_timer_removes_an_idle_session_and_its_rows() {
    let mut u = unit();
    let at = u.poll_timeout().unwrap();
    assert_eq!(at, T0 + EXPIRY_SWEEP_MS);
    // In use (a long poll waits on s2): kept.
    assert!(u.handle_timeout(at, |id| id == "s2").is_empty());
    let at = u.poll_timeout().unwrap();
    assert_eq!(at, T0 + 2 * EXPIRY_SWEEP_MS);
    let late = T0 + EXPIRY_SWEEP_MS + TTL;
    assert_eq!(u.handle_timeout(late, |id| id == "s2"), ["s1"]);
    let ws = writes(&mut u);
    assert_eq!(ws.len(), 1);
    assert_eq!(
        ws[0].records,
        [Record::SessionRemoved {
            session_id: "s1".into()
        }]
    );
    assert!(u.channel.read_session("s1").is_none());
    assert!(u.channel.read_session("s2").is_some());
    // A removed session folds to nothing.
    let folded = Channel::fold_records([
        Record::Session(SessionRecord {
            session_id: "s1".into(),
            app_id: "a".into(),
            action_spec: None,
            stream_spec: None,
            host_context: None,
            props: None,
            version_override: None,
            created_at_ms: 0,
        }),
        Record::SessionRemoved {
            session_id: "s1".into(),
        },
    ]);
    assert!(folded.is_empty());
}

#[test]
fn a_creation_is_answered_once_its_session_is_stored() {
    let mut u = unit();
    let create = |id: &str| CreateSession {
        session_id: id.into(),
        ..Default::default()
    };
    u.apply(|ch| ch.create_session(create("s3"), T0)).unwrap();
    u.answer("refused");
    assert!(drain(&mut u).answers.is_empty(), "answered unstored");
    let ws = writes(&mut u);
    assert_eq!(ws.len(), 1);
    assert_eq!(ws[0].session_id, "s3");
    u.ack(ws[0].id, false);
    assert_eq!(drain(&mut u).answers, [("refused", false)]);
    u.apply(|ch| ch.create_session(create("s4"), T0)).unwrap();
    u.answer("stored");
    let ws = writes(&mut u);
    u.ack(ws[0].id, true);
    assert_eq!(drain(&mut u).answers, [("stored", true)]);
}
