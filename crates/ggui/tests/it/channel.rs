//! Every rule of the live channel, driven in-process through the sans-IO
//! core with a manual clock: frames in, outputs out.

use hostwire_core::Clock;
use hostwire_core::ManualClock;
use hostwire_ggui::channel::*;
use hostwire_ggui::frames::{codes, ReplayPolicy, StreamChannelMode};
use hostwire_ggui::PROTOCOL_SCHEMA_VERSION;
use serde_json::{json, Value};
use std::sync::Arc;

struct Harness {
    ch: Channel,
    clock: ManualClock,
    records: Vec<Record>,
    closes: Vec<(ConnId, u16)>,
    wakeups: Vec<String>,
    sent: Vec<(ConnId, Arc<str>)>,
    /// The store refuses what it is given (a full disk).
    store_fails: bool,
    /// Validations handed out (deferred validation), not yet run.
    jobs: Vec<ValidationJob>,
}

impl Harness {
    fn new() -> Self {
        Self::with(ChannelConfig::default())
    }

    fn with(config: ChannelConfig) -> Self {
        Self {
            ch: Channel::new(config),
            clock: ManualClock::new(1_796_022_000_000),
            records: Vec::new(),
            closes: Vec::new(),
            wakeups: Vec::new(),
            sent: Vec::new(),
            store_fails: false,
            jobs: Vec::new(),
        }
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    fn open(&mut self, id: u64) -> ConnId {
        let c = ConnId(id);
        self.ch.connection_opened(c, self.now(), true);
        c
    }

    fn raw(&mut self, c: ConnId, bytes: &[u8]) -> Vec<Value> {
        let now = self.now();
        self.ch.frame_received(c, bytes, now);
        self.drain(c)
    }

    fn send(&mut self, c: ConnId, v: Value) -> Vec<Value> {
        self.raw(c, v.to_string().as_bytes())
    }

    /// Polls every output; returns the frames for `c`.
    fn drain(&mut self, c: ConnId) -> Vec<Value> {
        let mut mine = Vec::new();
        let mut dropping = false;
        while let Some(o) = self.ch.poll_output() {
            match o {
                Output::Send { .. } | Output::ActionsAvailable { .. } if dropping => {}
                Output::Durable {
                    conn,
                    frame,
                    otherwise,
                    undo,
                } => {
                    let frame = if self.store_fails {
                        self.ch.not_stored(undo);
                        dropping = true;
                        otherwise
                    } else {
                        frame
                    };
                    if conn == c {
                        mine.push(serde_json::from_str(&frame).unwrap());
                    }
                    self.sent.push((conn, frame));
                }
                Output::Commit { undo } => {
                    if self.store_fails {
                        self.ch.not_stored(undo);
                        dropping = true;
                    }
                }
                Output::Send { conn, frame } => {
                    if conn == c {
                        mine.push(serde_json::from_str(&frame).unwrap());
                    }
                    self.sent.push((conn, frame));
                }
                Output::Close { conn, code, .. } => self.closes.push((conn, code)),
                Output::Persist(r) => self.records.push(*r),
                Output::ActionsAvailable { session_id } => self.wakeups.push(session_id),
                Output::Validate(job) => self.jobs.push(*job),
            }
        }
        mine
    }

    fn subscribe(&mut self, c: ConnId, payload: Value) -> Vec<Value> {
        self.send(
            c,
            json!({"type": "subscribe", "requestId": "sub", "payload": payload}),
        )
    }

    fn create(&mut self, req: CreateSession) -> bool {
        let now = self.now();
        let r = self.ch.create_session(req, now).unwrap();
        self.drain(ConnId(u64::MAX));
        r
    }
}

fn types(frames: &[Value]) -> Vec<&str> {
    frames.iter().map(|f| f["type"].as_str().unwrap()).collect()
}

fn create(id: &str) -> CreateSession {
    CreateSession {
        session_id: id.into(),
        ..Default::default()
    }
}

fn action(session: &str, req: &str, name: &str, data: Value) -> Value {
    json!({"type": "action", "requestId": req, "payload": {"sessionId": session, "type": "data:submit", "payload": {"action": name, "data": data}}})
}

#[test]
fn subscribe_without_app_provisions_the_default_app_and_acks_the_version() {
    let mut h = Harness::new();
    let c = h.open(1);
    let frames = h.subscribe(
        c,
        json!({"sessionId": "ck-absent-appid-1", "supportedVersions": [PROTOCOL_SCHEMA_VERSION]}),
    );
    assert_eq!(types(&frames), vec!["ack"]);
    assert_eq!(frames[0]["requestId"], "sub");
    assert_eq!(
        frames[0]["payload"]["serverVersion"],
        PROTOCOL_SCHEMA_VERSION
    );
    assert_eq!(frames[0]["payload"]["sequence"], 0);
    assert_eq!(frames[0]["payload"]["streamSeq"], 0);
    assert_eq!(frames[0]["payload"]["timestamp"], h.now());
    assert_eq!(
        h.ch.read_session("ck-absent-appid-1").unwrap().app_id,
        "conformance"
    );
    // A configured default app is used instead.
    let mut h = Harness::with(ChannelConfig {
        default_app_id: "tenant-7".into(),
        ..Default::default()
    });
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    assert_eq!(h.ch.read_session("s").unwrap().app_id, "tenant-7");
}

#[test]
fn app_mismatch_refuses_without_ack_or_subscription() {
    let mut h = Harness::new();
    h.create(CreateSession {
        app_id: Some("conformance-other".into()),
        ..create("ck-app-mismatch-1")
    });
    let c = h.open(1);
    let frames = h.subscribe(
        c,
        json!({"sessionId": "ck-app-mismatch-1", "appId": "conformance"}),
    );
    assert_eq!(types(&frames), vec!["error"]);
    assert_eq!(frames[0]["payload"]["code"], "APP_MISMATCH");
    assert_eq!(frames[0]["requestId"], "sub");
    assert_eq!(h.ch.subscriber_count("ck-app-mismatch-1"), 0);
    assert!(h.closes.is_empty(), "the socket stays open");
    // The right app subscribes.
    let frames = h.subscribe(
        c,
        json!({"sessionId": "ck-app-mismatch-1", "appId": "conformance-other"}),
    );
    assert_eq!(types(&frames), vec!["ack"]);
}

#[test]
fn version_mismatch_strict_closes_advisory_does_not() {
    let mut h = Harness::new();
    h.create(CreateSession {
        version_override: Some("99.99-unsupported".into()),
        ..create("ck-version-mismatch-1")
    });
    let c = h.open(1);
    let frames = h.subscribe(c, json!({"sessionId": "ck-version-mismatch-1", "supportedVersions": [PROTOCOL_SCHEMA_VERSION]}));
    assert_eq!(types(&frames), vec!["error"]);
    let p = &frames[0]["payload"];
    assert_eq!(p["code"], "UPGRADE_REQUIRED");
    assert_eq!(p["serverVersion"], "99.99-unsupported");
    assert_eq!(p["details"]["serverVersion"], "99.99-unsupported");
    assert_eq!(p["details"]["policy"], "reject");
    assert_eq!(h.closes, vec![(c, CLOSE_UPGRADE_REQUIRED)]);
    // After a close nothing more is handled on that connection.
    assert!(h.send(c, json!({"type": "ping"})).is_empty());

    let mut h = Harness::with(ChannelConfig {
        version_policy: VersionPolicy::Advisory,
        advertised_version: "draft-2099-01-01".into(),
        ..Default::default()
    });
    let c = h.open(1);
    let frames = h.subscribe(
        c,
        json!({"sessionId": "s", "supportedVersions": [PROTOCOL_SCHEMA_VERSION]}),
    );
    assert_eq!(frames[0]["payload"]["code"], "UPGRADE_REQUIRED");
    assert_eq!(frames[0]["payload"]["details"]["policy"], "advisory");
    assert!(h.closes.is_empty());
    // A client that declares nothing is accepted and told the version.
    let frames = h.subscribe(c, json!({"sessionId": "s"}));
    assert_eq!(frames[0]["payload"]["serverVersion"], "draft-2099-01-01");
    // An empty list is a declaration without the server's version.
    let frames = h.subscribe(c, json!({"sessionId": "s", "supportedVersions": []}));
    assert_eq!(frames[0]["payload"]["code"], "UPGRADE_REQUIRED");
}

#[test]
fn version_override_can_be_set_and_cleared() {
    let mut h = Harness::new();
    h.create(create("s"));
    h.ch.set_version_override("s", Some("x-1".into())).unwrap();
    assert_eq!(h.ch.read_session("s").unwrap().server_version, "x-1");
    h.ch.set_version_override("s", None).unwrap();
    assert_eq!(
        h.ch.read_session("s").unwrap().server_version,
        PROTOCOL_SCHEMA_VERSION
    );
    assert_eq!(
        h.ch.set_version_override("nope", None).unwrap_err(),
        ApiError::SessionNotFound("nope".into())
    );
}

#[test]
fn declared_action_is_appended_then_acked_with_its_sequence() {
    let mut h = Harness::new();
    h.create(CreateSession {
        action_spec: Some(json!({"toggleTask": {"nextStep": "todo.toggle"}})),
        ..create("ck-action-ack-1")
    });
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "ck-action-ack-1"}));
    for n in 1..=3u64 {
        h.clock.advance_ms(5);
        let frames = h.send(
            c,
            action(
                "ck-action-ack-1",
                &format!("r{n}"),
                "toggleTask",
                json!({"id": "seed-1"}),
            ),
        );
        assert_eq!(types(&frames), vec!["ack"]);
        assert_eq!(frames[0]["requestId"], format!("r{n}"));
        assert_eq!(
            frames[0]["payload"],
            json!({"sequence": n, "timestamp": h.now()})
        );
    }
    assert_eq!(h.ch.read_session("ck-action-ack-1").unwrap().sequence, 3);
    assert_eq!(h.wakeups.len(), 3);
    let pending = h.ch.pending_actions("ck-action-ack-1", 10).unwrap();
    assert_eq!(pending.len(), 3);
    assert_eq!(pending[0].intent, "toggleTask");
    assert_eq!(pending[0].action_data.get(), r#"{"id":"seed-1"}"#);
    // The tool comes from the declared nextStep, not from the client.
    assert_eq!(pending[0].ui_context["tool"], "todo.toggle");
    let ledger: Vec<&Record> = h
        .records
        .iter()
        .filter(|r| matches!(r, Record::LedgerEvent { .. }))
        .collect();
    assert_eq!(ledger.len(), 3);
}

#[test]
fn contract_violations_are_refused_and_not_appended() {
    let mut h = Harness::new();
    h.create(CreateSession {
        action_spec: Some(json!({"toggleTask": {"schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}})),
        ..create("ck-schema-violation-1")
    });
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "ck-schema-violation-1"}));
    let frames = h.send(
        c,
        action(
            "ck-schema-violation-1",
            "ck-req",
            "toggleTask",
            json!({"id": 41}),
        ),
    );
    assert_eq!(types(&frames), vec!["error"]);
    assert_eq!(frames[0]["requestId"], "ck-req");
    let p = &frames[0]["payload"];
    assert_eq!(p["code"], "CONTRACT_VIOLATION");
    assert_eq!(p["details"]["error"], "contract_violation");
    assert_eq!(p["details"]["tool"], "ggui_event");
    assert_eq!(
        p["details"]["violations"],
        json!([{"field": "toggleTask.data.id", "message": "must be string", "expected": "string", "received": "number", "keyword": "type"}])
    );
    assert!(p["details"]["hint"]
        .as_str()
        .unwrap()
        .starts_with("The user-action payload"));
    let frames = h.send(
        c,
        action("ck-schema-violation-1", "r2", "doesNotExist", json!({})),
    );
    assert_eq!(
        frames[0]["payload"]["details"]["violations"][0]["field"],
        "action"
    );
    assert_eq!(
        h.ch.read_session("ck-schema-violation-1").unwrap().sequence,
        0
    );
    assert!(h
        .ch
        .pending_actions("ck-schema-violation-1", 10)
        .unwrap()
        .is_empty());
    // A valid one goes through.
    let frames = h.send(
        c,
        action(
            "ck-schema-violation-1",
            "r3",
            "toggleTask",
            json!({"id": "a"}),
        ),
    );
    assert_eq!(frames[0]["payload"]["sequence"], 1);
}

#[test]
fn sessions_without_an_action_spec_accept_every_action() {
    let mut h = Harness::new();
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    let frames = h.send(c, action("s", "r", "anything", json!([1, 2])));
    assert_eq!(frames[0]["type"], "ack");
}

#[test]
fn frames_before_subscribe_and_across_sessions_are_refused() {
    let mut h = Harness::new();
    let c = h.open(1);
    let frames = h.send(c, action("s", "r", "a", json!({})));
    assert_eq!(frames[0]["payload"]["code"], "NOT_SUBSCRIBED");
    assert_eq!(frames[0]["requestId"], "r");
    let hc =
        json!({"type": "host_context_observed", "payload": {"sessionId": "s", "hostContext": {}}});
    assert_eq!(h.send(c, hc)[0]["payload"]["code"], "NOT_SUBSCRIBED");
    h.subscribe(c, json!({"sessionId": "s"}));
    let frames = h.send(c, action("other", "r", "a", json!({})));
    assert_eq!(frames[0]["payload"]["code"], "SESSION_MISMATCH");
    assert!(frames[0]["payload"]["message"]
        .as_str()
        .unwrap()
        .contains("payload.sessionId"));
}

#[test]
fn host_context_is_stored_verbatim_without_a_reply() {
    let mut h = Harness::new();
    h.create(create("ck-host-context-1"));
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "ck-host-context-1"}));
    let hc = json!({"availableDisplayModes": ["inline", "fullscreen"], "currentDisplayMode": "inline",
        "containerDimensions": {"maxWidth": 480, "height": 320}, "platform": "web",
        "deviceCapabilities": {"touch": false, "hover": true}, "locale": "en-US", "timeZone": "America/Los_Angeles"});
    let frames = h.send(c, json!({"type": "host_context_observed", "payload": {"sessionId": "ck-host-context-1", "hostContext": hc}}));
    assert!(frames.is_empty());
    let view = h.ch.read_session("ck-host-context-1").unwrap();
    assert_eq!(Value::Object(view.host_context.unwrap()), hc);
    // Only the host context is recorded, not the session row with its
    // props.
    assert!(h
        .records
        .iter()
        .any(|r| matches!(r, Record::HostContext { host_context, .. } if Value::Object(host_context.clone()) == hc)));
    assert!(!h
        .records
        .iter()
        .any(|r| matches!(r, Record::Session(s) if s.host_context.is_some())));
    // A second observation replaces the first (no merge).
    h.send(c, json!({"type": "host_context_observed", "payload": {"sessionId": "ck-host-context-1", "hostContext": {"locale": "fr"}}}));
    assert_eq!(
        Value::Object(
            h.ch.read_session("ck-host-context-1")
                .unwrap()
                .host_context
                .unwrap()
        ),
        json!({"locale": "fr"})
    );
}

#[test]
fn ping_pong_invalid_json_and_unknown_types() {
    let mut h = Harness::new();
    let c = h.open(1);
    assert_eq!(
        h.send(c, json!({"type": "ping", "requestId": "p1", "payload": {}})),
        vec![json!({"type": "pong", "payload": {}, "requestId": "p1"})]
    );
    let frames = h.raw(c, b"{not json");
    assert_eq!(frames[0]["payload"]["code"], "INVALID_JSON");
    let frames = h.send(c, json!({"type": "render", "payload": {}}));
    assert_eq!(frames[0]["payload"]["code"], "UNSUPPORTED_MESSAGE");
    let frames = h.send(c, json!({"type": "subscribe", "payload": {"sessionId": 7}}));
    assert_eq!(frames[0]["payload"]["code"], "INVALID_MESSAGE");
    assert_eq!(
        frames[0]["payload"]["message"],
        "payload.sessionId must be a string"
    );
    assert!(h.closes.is_empty());
}

#[test]
fn frame_caps_before_and_after_subscribe() {
    let mut h = Harness::new();
    let c = h.open(1);
    let big = json!({"type": "ping", "payload": {"pad": "x".repeat(70 * 1024)}}).to_string();
    let frames = h.raw(c, big.as_bytes());
    assert_eq!(frames[0]["payload"]["code"], "FRAME_TOO_LARGE");
    assert_eq!(h.closes, vec![(c, 1009)]);
    let d = h.open(2);
    h.subscribe(d, json!({"sessionId": "s"}));
    let frames = h.raw(d, big.as_bytes());
    assert_eq!(types(&frames), vec!["pong"]);
    assert_eq!(h.closes.len(), 1);
}

#[test]
fn replay_order_is_ack_ledger_pages_stream_then_live_tail() {
    let mut h = Harness::new();
    h.create(CreateSession {
        stream_spec: Some(
            json!({"log": {"replay": "all"}, "status": {"replay": "latest"}, "noise": {}}),
        ),
        ..create("s")
    });
    let agent = h.open(1);
    h.subscribe(agent, json!({"sessionId": "s"}));
    for i in 0..150 {
        h.send(agent, action("s", &format!("r{i}"), "a", json!({"i": i})));
    }
    for (ch, n) in [
        ("log", 1),
        ("status", 2),
        ("noise", 3),
        ("log", 4),
        ("status", 5),
    ] {
        h.ch.emit("s", ch, StreamChannelMode::Append, json!(n), None)
            .unwrap();
    }
    h.drain(agent);
    let c = h.open(2);
    let frames = h.subscribe(
        c,
        json!({"sessionId": "s", "sinceSequence": 0, "fromSeq": 0}),
    );
    let t = types(&frames);
    assert_eq!(t[0], "ack");
    assert_eq!(frames[0]["payload"]["sequence"], 150);
    assert_eq!(frames[0]["payload"]["streamSeq"], 5);
    assert!(frames[0]["payload"].get("replayTruncated").is_none());
    assert!(t[1..151].iter().all(|&x| x == "render_event"));
    let seqs: Vec<u64> = frames[1..151]
        .iter()
        .map(|f| f["payload"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=150).collect::<Vec<_>>());
    assert_eq!(frames[1]["payload"]["type"], "user.submitted");
    assert_eq!(
        frames[1]["payload"]["timestamp"],
        "2026-11-30T07:00:00.000Z"
    );
    assert_eq!(
        frames[1]["payload"]["data"]["payload"]["data"],
        json!({"i": 0})
    );
    // Stream replay: "log" all (1, 4), "status" latest (5), "noise" none.
    let stream: Vec<u64> = frames[151..]
        .iter()
        .map(|f| f["payload"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(t[151..], ["data", "data", "data"]);
    assert_eq!(stream, vec![1, 4, 5]);
    // The live tail follows.
    h.ch.emit(
        "s",
        "noise",
        StreamChannelMode::Replace,
        json!("live"),
        Some(true),
    )
    .unwrap();
    let tail = h.drain(c);
    assert_eq!(tail[0]["payload"]["seq"], 6);
    assert_eq!(tail[0]["payload"]["complete"], true);
    assert_eq!(tail[0]["payload"]["schemaVersion"], PROTOCOL_SCHEMA_VERSION);
    // A cursor in the middle replays only what follows it.
    let d = h.open(3);
    let frames = h.subscribe(
        d,
        json!({"sessionId": "s", "sinceSequence": 148, "fromSeq": 4}),
    );
    // After seq 4: "status" (latest) 5; "noise" 6 is never kept.
    assert_eq!(
        types(&frames),
        vec!["ack", "render_event", "render_event", "data"]
    );
    assert_eq!(frames[3]["payload"]["seq"], 5);
    // No cursors, no replay.
    let e = h.open(4);
    assert_eq!(
        types(&h.subscribe(e, json!({"sessionId": "s"}))),
        vec!["ack"]
    );
}

#[test]
fn replay_horizon_and_malformed_cursors() {
    let mut h = Harness::with(ChannelConfig {
        ledger_max_events: 5,
        ..Default::default()
    });
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    for i in 0..8 {
        h.send(c, action("s", "r", "a", json!(i)));
    }
    let d = h.open(2);
    // Below the horizon (entries 1..=3 were evicted).
    let frames = h.subscribe(d, json!({"sessionId": "s", "sinceSequence": 2}));
    assert_eq!(types(&frames), vec!["ack", "error"]);
    assert_eq!(frames[1]["payload"]["code"], "REPLAY_HORIZON_PASSED");
    assert_eq!(
        frames[1]["payload"]["details"],
        json!({"currentSequence": 8})
    );
    assert_eq!(frames[1]["requestId"], "sub");
    // Past the end.
    let frames = h.subscribe(d, json!({"sessionId": "s", "sinceSequence": 9}));
    assert_eq!(frames[1]["payload"]["code"], "REPLAY_HORIZON_PASSED");
    // At the horizon: every retained entry.
    let frames = h.subscribe(d, json!({"sessionId": "s", "sinceSequence": 3}));
    assert_eq!(frames.len(), 6);
    for bad in [json!(-1), json!(1.5), json!("3"), json!(null)] {
        let frames = h.subscribe(d, json!({"sessionId": "s", "sinceSequence": bad}));
        assert_eq!(types(&frames), vec!["ack", "error"], "{bad}");
        assert_eq!(frames[1]["payload"]["code"], "INVALID_SINCE_SEQUENCE");
    }
}

#[test]
fn replay_truncated_when_all_entries_were_evicted() {
    let mut h = Harness::new();
    h.create(CreateSession {
        stream_spec: Some(json!({"log": {"replay": "all"}})),
        ..create("s")
    });
    for i in 0..300 {
        h.ch.emit("s", "log", StreamChannelMode::Append, json!(i), None)
            .unwrap();
    }
    let c = h.open(1);
    let frames = h.subscribe(c, json!({"sessionId": "s", "fromSeq": 0}));
    assert_eq!(frames[0]["payload"]["replayTruncated"], true);
    assert_eq!(frames.len(), 1 + STREAM_BUFFER_MAX);
    assert_eq!(frames[1]["payload"]["seq"], 45);
    let d = h.open(2);
    let frames = h.subscribe(d, json!({"sessionId": "s", "fromSeq": 290}));
    assert!(frames[0]["payload"].get("replayTruncated").is_none());
    assert_eq!(frames.len(), 11);
    // Evictions are reported for the store.
    let dropped: usize = h
        .records
        .iter()
        .map(|r| match r {
            Record::StreamEntriesDropped { seqs, .. } => seqs.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(dropped, 300 - STREAM_BUFFER_MAX);
}

#[test]
fn fan_out_shares_one_serialization() {
    let mut h = Harness::new();
    h.create(create("s"));
    let conns: Vec<ConnId> = (1..=3).map(|i| h.open(i)).collect();
    for &c in &conns {
        h.subscribe(c, json!({"sessionId": "s"}));
    }
    h.sent.clear();
    let env =
        h.ch.emit("s", "c", StreamChannelMode::Append, json!({"x": 1}), None)
            .unwrap();
    assert_eq!(env.seq, Some(1));
    h.drain(ConnId(0));
    assert_eq!(h.sent.len(), 3);
    assert!(h.sent.windows(2).all(|w| Arc::ptr_eq(&w[0].1, &w[1].1)));
    assert_eq!(
        &*h.sent[0].1,
        format!(
            r#"{{"type":"data","payload":{{"sessionId":"s","channel":"c","mode":"append","payload":{{"x":1}},"seq":1,"schemaVersion":"{PROTOCOL_SCHEMA_VERSION}"}}}}"#
        )
    );
}

#[test]
fn contract_errors_go_out_on_their_channel() {
    use hostwire_ggui::frames::*;
    let mut h = Harness::new();
    h.create(create("s"));
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    let payload = make_contract_error_payload(MakeContractErrorPayload {
        tool_name: "todo.add".into(),
        action_name: Some("addTodo".into()),
        source_action: None,
        error: ContractError {
            code: "SCHEMA_VIOLATION".into(),
            message: "bad".into(),
            caused_by: None,
        },
        timestamp: "t".into(),
        schema_version: SchemaVersionStamp::Default,
    });
    h.ch.emit_contract_error("s", &payload).unwrap();
    let frames = h.drain(c);
    assert_eq!(frames[0]["payload"]["channel"], "_ggui:contract-error");
    assert_eq!(frames[0]["payload"]["payload"]["toolName"], "todo.add");
    // Reserved channels are replayed as "all" whatever the spec says.
    let d = h.open(2);
    let frames = h.subscribe(d, json!({"sessionId": "s", "fromSeq": 0}));
    assert_eq!(types(&frames), vec!["ack", "data"]);
}

#[test]
fn props_push_reaches_subscribers_and_the_ledger() {
    let mut h = Harness::new();
    h.create(create("ck-props-update-1"));
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "ck-props-update-1"}));
    let props = json!({"greeting": "updated-by-host"})
        .as_object()
        .unwrap()
        .clone();
    let seq =
        h.ch.push_props("ck-props-update-1", props.clone(), Some(2), h.now())
            .unwrap();
    assert_eq!(seq, 1);
    let frames = h.drain(c);
    assert_eq!(
        frames,
        vec![
            json!({"type": "props_update", "payload": {"sessionId": "ck-props-update-1", "props": {"greeting": "updated-by-host"}, "epoch": 2}})
        ]
    );
    assert_eq!(
        h.ch.read_session("ck-props-update-1").unwrap().props,
        Some(props)
    );
    let d = h.open(2);
    let frames = h.subscribe(
        d,
        json!({"sessionId": "ck-props-update-1", "sinceSequence": 0}),
    );
    assert_eq!(frames[1]["payload"]["type"], "ui.updated");
}

#[test]
fn pending_actions_are_bounded_in_bytes_and_kept_as_text() {
    let mut h = Harness::with(ChannelConfig {
        max_pending_action_bytes: 100,
        ..Default::default()
    });
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    let sixty = "x".repeat(58);
    assert_eq!(
        h.send(c, action("s", "r1", "a", json!(sixty)))[0]["type"],
        "ack"
    );
    let frames = h.send(c, action("s", "r2", "a", json!(sixty)));
    assert_eq!(frames[0]["payload"]["code"], "APPEND_FAILED", "{frames:?}");
    assert!(
        frames[0]["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("100 bytes"),
        "{frames:?}"
    );
    let pending = h.ch.pending_actions("s", 10).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].action_data.get(), format!("\"{sixty}\""));
    // Draining gives the bytes back.
    assert_eq!(h.ch.drain_actions("s", 1, h.now()).unwrap(), 1);
    h.drain(c);
    assert_eq!(
        h.send(c, action("s", "r3", "a", json!(sixty)))[0]["type"],
        "ack"
    );
}

#[test]
fn drain_acks_and_the_pending_bound() {
    let mut h = Harness::with(ChannelConfig {
        max_pending_actions: 3,
        ..Default::default()
    });
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    for i in 0..3 {
        assert_eq!(h.send(c, action("s", "r", "a", json!(i)))[0]["type"], "ack");
    }
    let frames = h.send(c, action("s", "full", "a", json!(3)));
    assert_eq!(frames[0]["payload"]["code"], "APPEND_FAILED");
    assert_eq!(frames[0]["requestId"], "full");
    let pending = h.ch.pending_actions("s", 2).unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|p| p.action_id.as_str())
            .collect::<Vec<_>>(),
        vec!["1", "2"]
    );
    // Peeking removes nothing.
    assert_eq!(h.ch.pending_actions("s", 10).unwrap().len(), 3);
    assert_eq!(h.ch.drain_actions("s", 2, h.now()).unwrap(), 2);
    let frames = h.drain(c);
    assert_eq!(types(&frames), vec!["drain_ack", "drain_ack"]);
    assert_eq!(frames[0]["payload"]["eventId"], "1");
    assert_eq!(frames[0]["payload"]["appId"], "conformance");
    assert_eq!(
        frames[0]["payload"]["drainedAt"],
        "2026-11-30T07:00:00.000Z"
    );
    let consumed = h.ch.consume_actions("s", 10, h.now()).unwrap();
    assert_eq!(consumed.len(), 1);
    assert_eq!(types(&h.drain(c)), vec!["drain_ack"]);
    assert_eq!(h.ch.pending_actions("s", 10).unwrap().len(), 0);
    assert_eq!(h.send(c, action("s", "r", "a", json!(4)))[0]["type"], "ack");
    assert!(h
        .records
        .iter()
        .any(|r| matches!(r, Record::ActionsDrained { up_to: 3, .. })));
    assert_eq!(clamp_long_poll_ms(Some(60_000)), 25_000);
    assert_eq!(clamp_long_poll_ms(Some(10)), 10);
    assert_eq!(clamp_long_poll_ms(None), LONG_POLL_MAX_MS);
}

#[test]
fn bounds_on_sessions_subscribers_and_rate() {
    let mut h = Harness::with(ChannelConfig {
        max_sessions: 2,
        max_subscribers_per_session: 2,
        rate_per_second: 10.0,
        rate_burst: 5,
        ..Default::default()
    });
    h.create(create("a"));
    h.create(create("b"));
    assert_eq!(
        h.ch.create_session(create("c"), 0).unwrap_err(),
        ApiError::SessionLimit(2)
    );
    let c = h.open(1);
    let frames = h.subscribe(c, json!({"sessionId": "c"}));
    assert_eq!(frames[0]["payload"]["code"], "SESSION_CREATE_FAILED");
    let d = h.open(2);
    let e = h.open(3);
    h.subscribe(c, json!({"sessionId": "a"}));
    h.subscribe(d, json!({"sessionId": "a"}));
    let frames = h.subscribe(e, json!({"sessionId": "a"}));
    assert_eq!(frames[0]["payload"]["code"], "TOO_MANY_SUBSCRIBERS");
    // A connection that leaves frees its slot.
    h.ch.connection_closed(d);
    assert_eq!(
        types(&h.subscribe(e, json!({"sessionId": "a"}))),
        vec!["ack"]
    );
    // Rate: 5 in a burst, then each frame is refused with RATE_LIMITED
    // naming its requestId.
    let f = h.open(4);
    let mut replies = Vec::new();
    for i in 0..20 {
        replies.extend(h.send(f, json!({"type": "ping", "requestId": format!("p{i}")})));
    }
    assert_eq!(replies.iter().filter(|r| r["type"] == "pong").count(), 5);
    let limited: Vec<&Value> = replies.iter().filter(|r| r["type"] == "error").collect();
    assert_eq!(limited.len(), 15);
    for (i, l) in limited.iter().enumerate() {
        assert_eq!(l["payload"]["code"], "RATE_LIMITED");
        assert_eq!(l["requestId"], format!("p{}", i + 5));
    }
    h.clock.advance_ms(1_000);
    assert_eq!(types(&h.send(f, json!({"type": "ping"}))), vec!["pong"]);
    // A flood that never stops is closed.
    for _ in 0..(RATE_LIMITED_FRAMES_BEFORE_CLOSE + 20) {
        h.send(f, json!({"type": "ping"}));
    }
    assert!(h.closes.contains(&(f, CLOSE_POLICY_VIOLATION)));
}

#[test]
fn ws_token_authentication() {
    let mut h = Harness::with(ChannelConfig {
        ws_token: Some("s3cret".into()),
        ..Default::default()
    });
    let c = ConnId(1);
    h.ch.connection_opened(c, 0, false);
    let frames = h.subscribe(c, json!({"sessionId": "s"}));
    assert_eq!(frames[0]["payload"]["code"], "UNAUTHENTICATED");
    let frames = h.subscribe(c, json!({"sessionId": "s", "wsToken": "wrong"}));
    assert_eq!(
        frames[0]["payload"]["message"],
        "payload.wsToken is not valid"
    );
    assert_eq!(
        h.ch.session_count(),
        0,
        "nothing is provisioned for an unauthenticated caller"
    );
    assert_eq!(
        types(&h.subscribe(c, json!({"sessionId": "s", "wsToken": "s3cret"}))),
        vec!["ack"]
    );
    // A connection the server authenticated (bearer) needs no wsToken.
    let d = ConnId(2);
    h.ch.connection_opened(d, 0, true);
    assert_eq!(
        types(&h.subscribe(d, json!({"sessionId": "s"}))),
        vec!["ack"]
    );
}

#[test]
fn create_session_is_idempotent_and_checks_its_input() {
    let mut h = Harness::new();
    assert!(h.create(create("s")));
    assert!(!h.create(CreateSession {
        action_spec: Some(json!({"go": {}})),
        ..create("s")
    }));
    assert_eq!(
        h.ch.create_session(
            CreateSession {
                app_id: Some("other".into()),
                ..create("s")
            },
            0
        )
        .unwrap_err()
        .http_status(),
        409
    );
    let e =
        h.ch.create_session(
            CreateSession {
                action_spec: Some(json!({"go": {"schema": {"type": "nonsense"}}})),
                ..create("t")
            },
            0,
        )
        .unwrap_err();
    assert!(
        matches!(&e, ApiError::InvalidField(m) if m.starts_with("actionSpec.go.schema")),
        "{e:?}"
    );
    assert_eq!(e.code(), codes::INVALID_MESSAGE);
    let e = h.ch.create_session(create(""), 0).unwrap_err();
    assert_eq!(
        e,
        ApiError::InvalidField("sessionId must be 1 to 256 bytes".into())
    );
    let e =
        h.ch.create_session(
            CreateSession {
                stream_spec: Some(json!({"c": {"replay": "forever"}})),
                ..create("t")
            },
            0,
        )
        .unwrap_err();
    assert!(e.to_string().contains("streamSpec.c.replay"));
    // The updated spec is in force.
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    assert_eq!(
        h.send(c, action("s", "r", "nope", json!({})))[0]["payload"]["code"],
        "CONTRACT_VIOLATION"
    );
}

#[test]
fn resubscribing_moves_the_connection() {
    let mut h = Harness::new();
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "a"}));
    h.subscribe(c, json!({"sessionId": "b"}));
    assert_eq!(
        (h.ch.subscriber_count("a"), h.ch.subscriber_count("b")),
        (0, 1)
    );
    h.subscribe(c, json!({"sessionId": "b"}));
    assert_eq!(h.ch.subscriber_count("b"), 1, "no duplicate subscription");
    let frames = h.send(c, json!({"type": "channel_subscribe", "requestId": "cs", "payload": {"sessionId": "b", "appId": "conformance", "channelName": "feed"}}));
    assert_eq!(frames[0]["type"], "channel_error");
    assert_eq!(frames[0]["payload"]["code"], "CHANNEL_UNKNOWN");
    assert!(h.send(c, json!({"type": "channel_unsubscribe", "payload": {"sessionId": "b", "appId": "conformance", "channelName": "feed"}})).is_empty());
    h.ch.connection_closed(c);
    assert_eq!(h.ch.subscriber_count("b"), 0);
}

#[test]
fn emit_checks_session_and_size() {
    let mut h = Harness::new();
    assert_eq!(
        h.ch.emit("nope", "c", StreamChannelMode::Append, json!(1), None)
            .unwrap_err()
            .http_status(),
        404
    );
    h.create(create("s"));
    let big = json!("x".repeat(1024 * 1024 + 1));
    assert!(matches!(
        h.ch.emit("s", "c", StreamChannelMode::Append, big, None),
        Err(ApiError::PayloadTooLarge { .. })
    ));
    // A refused emit takes no seq.
    assert_eq!(
        h.ch.emit("s", "c", StreamChannelMode::Append, json!(1), None)
            .unwrap()
            .seq,
        Some(1)
    );
}

#[test]
fn a_restart_replays_from_the_clients_cursor() {
    let mut h = Harness::new();
    h.create(CreateSession {
        // Declared schemas are closed: `i` must be declared to be sent.
        action_spec: Some(
            json!({"go": {"schema": {"type": "object", "properties": {"i": {"type": "integer"}}}}}),
        ),
        stream_spec: Some(json!({"log": {"replay": "all"}, "st": {"replay": "latest"}})),
        ..create("s")
    });
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    for i in 0..5 {
        h.send(c, action("s", "r", "go", json!({"i": i})));
    }
    h.send(c, json!({"type": "host_context_observed", "payload": {"sessionId": "s", "hostContext": {"platform": "web"}}}));
    for (ch, n) in [("log", 1), ("st", 2), ("x", 3), ("st", 4), ("log", 5)] {
        h.ch.emit("s", ch, StreamChannelMode::Append, json!(n), None)
            .unwrap();
    }
    h.ch.drain_actions("s", 2, h.now()).unwrap();
    h.drain(c);
    let before = {
        let d = h.open(2);
        h.subscribe(
            d,
            json!({"sessionId": "s", "sinceSequence": 1, "fromSeq": 1}),
        )
    };

    // The records, as a store would keep them, rebuild the session.
    let mut after = Harness::new();
    for r in Channel::fold_records(h.records.clone()) {
        after.ch.restore_session(r).unwrap();
    }
    let view = after.ch.read_session("s").unwrap();
    assert_eq!(
        (view.sequence, view.stream_seq, view.pending_actions),
        (5, 5, 3)
    );
    assert_eq!(view.host_context.unwrap()["platform"], "web");
    let d = after.open(2);
    let mut replayed = after.subscribe(
        d,
        json!({"sessionId": "s", "sinceSequence": 1, "fromSeq": 1}),
    );
    let mut expected = before;
    // Only the ack's timestamp may differ.
    replayed[0]["payload"]["timestamp"] = json!(0);
    expected[0]["payload"]["timestamp"] = json!(0);
    assert_eq!(replayed, expected);
    // The sequence goes on without a gap, and the spec is still enforced.
    assert_eq!(
        after.send(d, action("s", "r", "go", json!({})))[0]["payload"]["sequence"],
        6
    );
    assert_eq!(
        after.send(d, action("s", "r", "go", json!(1)))[0]["payload"]["code"],
        "CONTRACT_VIOLATION"
    );
    assert_eq!(
        after
            .ch
            .emit("s", "x", StreamChannelMode::Append, json!(0), None)
            .unwrap()
            .seq,
        Some(6)
    );
    let pending = after.ch.pending_actions("s", 10).unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|p| p.action_id.as_str())
            .collect::<Vec<_>>(),
        vec!["3", "4", "5", "6"]
    );
}

#[test]
fn restore_refuses_broken_histories() {
    let mut ch = Channel::new(ChannelConfig::default());
    assert!(ch.restore_session(RestoredSession::default()).is_err());
    let rec = SessionRecord {
        session_id: "s".into(),
        app_id: "a".into(),
        action_spec: None,
        stream_spec: None,
        host_context: None,
        props: None,
        version_override: None,
        created_at_ms: 0,
    };
    let ev = |seq| hostwire_ggui::frames::GguiSessionEvent {
        seq,
        event_type: "x".into(),
        timestamp: "t".into(),
        data: json!(null),
    };
    let broken = RestoredSession {
        record: Some(rec.clone()),
        ledger: vec![ev(1), ev(3)],
        ..Default::default()
    };
    assert!(ch
        .restore_session(broken)
        .unwrap_err()
        .to_string()
        .contains("gap"));
    let ok = RestoredSession {
        record: Some(rec),
        ledger: vec![ev(1), ev(2)],
        ledger_last_sequence: 2,
        stream: vec![],
        stream_seq: 9,
        drained_up_to: 0,
    };
    ch.restore_session(ok).unwrap();
    assert_eq!(ch.read_session("s").unwrap().stream_seq, 9);
    let _ = ReplayPolicy::All;
}

#[test]
fn an_action_the_store_refuses_is_not_acked_and_leaves_nothing() {
    let mut h = Harness::new();
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    h.store_fails = true;
    let frames = h.send(c, action("s", "r1", "lost", json!({})));
    assert_eq!(types(&frames), vec!["error"], "{frames:?}");
    assert_eq!(frames[0]["payload"]["code"], codes::APPEND_FAILED);
    assert!(h.wakeups.is_empty(), "the agent was woken for nothing");
    assert!(h.ch.pending_actions("s", 10).unwrap().is_empty());
    h.store_fails = false;
    let frames = h.send(c, action("s", "r2", "kept", json!({})));
    assert_eq!(types(&frames), vec!["ack"]);
    assert_eq!(
        frames[0]["payload"]["sequence"], 1,
        "its seq is given again"
    );
}

#[test]
fn props_the_store_refuses_are_not_sent_and_change_nothing() {
    let mut h = Harness::new();
    let c = h.open(1);
    h.subscribe(c, json!({"sessionId": "s"}));
    let now = h.now();
    let mut old = serde_json::Map::new();
    old.insert("title".into(), json!("old"));
    h.ch.push_props("s", old, None, now).unwrap();
    assert_eq!(types(&h.drain(c)), vec!["props_update"]);
    let before = h.ch.read_session("s").unwrap();
    h.store_fails = true;
    let mut new = serde_json::Map::new();
    new.insert("title".into(), json!("new"));
    h.ch.push_props("s", new, None, now).unwrap();
    assert!(
        h.drain(c).is_empty(),
        "subscribers told of props not stored"
    );
    assert_eq!(h.ch.read_session("s").unwrap(), before);
}

#[test]
fn deferred_validation_keeps_each_sessions_order_and_lets_others_through() {
    let mut h = Harness::with(ChannelConfig {
        defer_validation: true,
        inline_validation_max_cost: 0,
        ..Default::default()
    });
    let spec =
        json!({"pick": {"schema": {"type": "object", "properties": {"id": {"type": "string"}}}}});
    for id in ["a", "b"] {
        h.create(CreateSession {
            action_spec: Some(spec.clone()),
            ..create(id)
        });
    }
    let (a, b) = (h.open(1), h.open(2));
    h.subscribe(a, json!({"sessionId": "a"}));
    h.subscribe(b, json!({"sessionId": "b"}));
    // Nothing is answered while a's first action is being validated: the
    // ping and the second action wait behind it.
    assert!(h
        .send(a, action("a", "a1", "pick", json!({"id": "x"})))
        .is_empty());
    assert!(h
        .send(a, json!({"type": "ping", "requestId": "p"}))
        .is_empty());
    assert!(h
        .send(a, action("a", "a2", "pick", json!({"id": 7})))
        .is_empty());
    assert_eq!(h.jobs.len(), 1);
    // Another session's action is validated meanwhile, and acked first.
    assert!(h
        .send(b, action("b", "b1", "pick", json!({"id": "y"})))
        .is_empty());
    assert_eq!(h.jobs.len(), 2);
    let b_job = h.jobs.pop().unwrap();
    assert_eq!(b_job.session_id(), "b");
    let now = h.now();
    h.ch.action_validated(b_job.run(), now);
    let frames = h.drain(b);
    assert_eq!(types(&frames), vec!["ack"]);
    assert_eq!(frames[0]["requestId"], "b1");
    // a's first action: its ack, then the held ping's pong, then the
    // second action goes to validation (and is refused).
    let job = h.jobs.pop().unwrap();
    h.ch.action_validated(job.run(), now);
    let frames = h.drain(a);
    assert_eq!(types(&frames), vec!["ack", "pong"]);
    assert_eq!(frames[0]["payload"]["sequence"], 1);
    let job = h.jobs.pop().unwrap();
    h.ch.action_validated(job.run(), now);
    let frames = h.drain(a);
    assert_eq!(
        frames[0]["payload"]["code"], "CONTRACT_VIOLATION",
        "{frames:?}"
    );
    assert_eq!(frames[0]["requestId"], "a2");
    assert!(h.jobs.is_empty());
}

#[test]
fn a_cheap_action_is_validated_inline_and_a_costly_one_off_the_channel() {
    let mut h = Harness::with(ChannelConfig {
        defer_validation: true,
        ..Default::default()
    });
    let spec =
        json!({"pick": {"schema": {"type": "object", "properties": {"id": {"type": "string"}}}}});
    h.create(CreateSession {
        action_spec: Some(spec),
        ..create("a")
    });
    let a = h.open(1);
    h.subscribe(a, json!({"sessionId": "a"}));
    // A small action: acknowledged at once, no job handed out.
    let frames = h.send(a, action("a", "a1", "pick", json!({"id": "x"})));
    assert_eq!(types(&frames), vec!["ack"], "{frames:?}");
    assert!(h.jobs.is_empty());
    // One past the budget goes to a thread, and the session waits for it.
    let big = "x".repeat(INLINE_VALIDATION_MAX_COST as usize);
    assert!(h
        .send(a, action("a", "a2", "pick", json!({"id": big})))
        .is_empty());
    assert_eq!(h.jobs.len(), 1);
    let job = h.jobs.pop().unwrap();
    let now = h.now();
    h.ch.action_validated(job.run(), now);
    let frames = h.drain(a);
    assert_eq!(types(&frames), vec!["ack"], "{frames:?}");
    assert_eq!(frames[0]["requestId"], "a2");
}

#[test]
fn frames_held_behind_a_validation_are_bounded() {
    let mut h = Harness::with(ChannelConfig {
        defer_validation: true,
        inline_validation_max_cost: 0,
        rate_burst: 4 * MAX_HELD_FRAMES_PER_SESSION as u32,
        ..Default::default()
    });
    h.create(CreateSession {
        action_spec: Some(json!({"pick": {}})),
        ..create("a")
    });
    let a = h.open(1);
    h.subscribe(a, json!({"sessionId": "a"}));
    assert!(h.send(a, action("a", "a1", "pick", json!({}))).is_empty());
    for _ in 0..MAX_HELD_FRAMES_PER_SESSION {
        assert!(h.send(a, json!({"type": "ping"})).is_empty());
    }
    let frames = h.send(a, json!({"type": "ping"}));
    assert_eq!(frames[0]["payload"]["code"], "RATE_LIMITED", "{frames:?}");
    let job = h.jobs.pop().unwrap();
    let now = h.now();
    h.ch.action_validated(job.run(), now);
    let frames = h.drain(a);
    assert_eq!(frames.len(), 1 + MAX_HELD_FRAMES_PER_SESSION);
}

#[test]
fn a_burst_of_actions_within_the_rate_limit_is_held_and_each_acked() {
    let mut h = Harness::with(ChannelConfig {
        defer_validation: true,
        inline_validation_max_cost: 0,
        ..Default::default()
    });
    h.create(CreateSession {
        action_spec: Some(json!({"pick": {}})),
        ..create("a")
    });
    let a = h.open(1);
    h.subscribe(a, json!({"sessionId": "a"}));
    // The default burst of one connection, all while the first validates.
    let burst = ChannelConfig::default().rate_burst as usize - 1;
    let mut refused = 0;
    for i in 0..burst {
        refused += h
            .send(a, action("a", &format!("a{i}"), "pick", json!({})))
            .len();
    }
    assert_eq!(
        refused, 0,
        "actions of a burst within the rate were refused"
    );
    // Each validation lets the held frames through up to the next action.
    let mut acks = 0;
    while let Some(job) = h.jobs.pop() {
        let now = h.now();
        h.ch.action_validated(job.run(), now);
        for f in h.drain(a) {
            assert_eq!(f["type"], "ack", "{f}");
            acks += 1;
        }
    }
    assert_eq!(acks, burst);
}

#[test]
fn each_close_the_channel_asks_for_has_its_reason() {
    assert_eq!(close_reason(CLOSE_POLICY_VIOLATION), "rate limit exceeded");
    assert_eq!(close_reason(CLOSE_UPGRADE_REQUIRED), "upgrade required");
    assert_eq!(close_reason(CLOSE_GOING_AWAY), "going away");
    assert_eq!(
        close_reason(hostwire_ggui::decode::CLOSE_MESSAGE_TOO_BIG),
        "frame too large"
    );
    assert_eq!(close_reason(CLOSE_STORE_FAILED), "closed");
}

#[test]
fn a_session_dropped_for_another_node_closes_its_connections_and_records_nothing() {
    let mut h = Harness::new();
    let (a, b, other) = (h.open(1), h.open(2), h.open(3));
    h.subscribe(a, json!({"sessionId": "moving"}));
    // b is bound to the session by its UI token, not subscribed yet.
    h.ch.bind_connection(b, "moving".into(), "conformance".into());
    h.subscribe(other, json!({"sessionId": "staying"}));
    h.records.clear();
    assert!(h.ch.drop_session("moving"));
    h.drain(a);
    assert_eq!(
        h.closes,
        vec![(a, CLOSE_SESSION_MOVED), (b, CLOSE_SESSION_MOVED)]
    );
    assert!(h.records.is_empty(), "{:?}", h.records);
    assert!(h.ch.read_session("moving").is_none());
    assert_eq!(h.ch.subscriber_count("staying"), 1);
    assert_eq!(
        close_reason(CLOSE_SESSION_MOVED),
        "session moved to another node"
    );
    assert!(!h.ch.drop_session("moving"));
}
