//! Golden values computed by running the protocol's own TypeScript
//! (`@ggui-ai/protocol`: the envelope builders as of 0.1.0-rc.x, whose
//! `makeActionEnvelope` still takes `stackIndex` / `stackItemId` and whose
//! `makeContractErrorPayload` still takes `actionName` / `sourceAction`, with
//! `PROTOCOL_VERSION` set to `draft-2026-08-19`; `contentHash`;
//! `blueprintKey` of the current repository; `validateActionData` and
//! `ContractViolationError`) under Node 20, outside this repository, bundled
//! with esbuild. `reference.json` holds their outputs verbatim; these tests
//! hold hostwire's outputs against them byte for byte.

use hostwire_ggui::frames::*;
use hostwire_ggui::validate::{contract_violation, ActionSpec, EVENT_HINT, EVENT_TOOL};
use hostwire_ggui::{blueprint_key, canonicalize_contract, content_hash};
use serde_json::{json, Value};

fn golden() -> Value {
    serde_json::from_str(include_str!("../golden/reference.json")).unwrap()
}

fn g(key: &str) -> String {
    golden()[key].as_str().unwrap().to_owned()
}

fn ser<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

#[test]
fn action_envelope_bytes() {
    let base = || MakeActionEnvelope {
        session_id: "s1".into(),
        event_type: "data:submit".into(),
        ..Default::default()
    };
    let e = make_action_envelope(MakeActionEnvelope {
        payload: Some(json!({"action": "toggleTask", "data": {"id": "a"}})),
        ..base()
    });
    assert_eq!(ser(&e), g("action_default"));
    let e = make_action_envelope(MakeActionEnvelope {
        payload: Some(json!({"action": "go", "data": null})),
        stack_index: Some(2.into()),
        stack_item_id: Some("item-9".into()),
        client_seq: Some(7.into()),
        schema_version: SchemaVersionStamp::Given("draft-2025-01-01".into()),
        ..base()
    });
    assert_eq!(ser(&e), g("action_full"));
    let e = make_action_envelope(MakeActionEnvelope {
        schema_version: SchemaVersionStamp::Omit,
        ..base()
    });
    assert_eq!(ser(&e), g("action_omit"));
    assert_eq!(ser(&make_action_envelope(base())), g("action_minimal"));
}

#[test]
fn stream_envelope_bytes() {
    let e = make_stream_envelope(MakeStreamEnvelope {
        session_id: "s1".into(),
        channel: "todos".into(),
        mode: StreamChannelMode::Append,
        payload: json!([1, {"b": 2, "a": "x"}]),
        ..Default::default()
    });
    assert_eq!(ser(&e), g("stream_default"));
    let e = make_stream_envelope(MakeStreamEnvelope {
        session_id: "s1".into(),
        channel: "todos".into(),
        mode: StreamChannelMode::Replace,
        payload: json!({"n": 1.5}),
        complete: Some(true),
        seq: Some(3),
        schema_version: SchemaVersionStamp::Given("x-1".into()),
    });
    assert_eq!(ser(&e), g("stream_full"));
    let e = make_stream_envelope(MakeStreamEnvelope {
        session_id: "s1".into(),
        channel: "c".into(),
        mode: StreamChannelMode::Append,
        payload: Value::Null,
        complete: Some(false),
        seq: Some(0),
        schema_version: SchemaVersionStamp::Omit,
    });
    assert_eq!(ser(&e), g("stream_omit"));
}

#[test]
fn error_and_contract_error_bytes() {
    assert_eq!(
        ser(&make_error_payload("APP_MISMATCH", "nope", None)),
        g("error_min")
    );
    assert_eq!(
        ser(&make_error_payload(
            "REPLAY_HORIZON_PASSED",
            "m",
            Some(json!({"currentSequence": 4}))
        )),
        g("error_details")
    );
    let p = make_contract_error_payload(MakeContractErrorPayload {
        tool_name: "todo.add".into(),
        action_name: None,
        source_action: None,
        error: ContractError {
            code: contract_error_codes::SCHEMA_VIOLATION.into(),
            message: "bad".into(),
            caused_by: None,
        },
        timestamp: "2026-11-30T07:00:00.000Z".into(),
        schema_version: SchemaVersionStamp::Default,
    });
    assert_eq!(ser(&p), g("contract_error_min"));
    let p = make_contract_error_payload(MakeContractErrorPayload {
        tool_name: "todo.add".into(),
        action_name: Some("addTodo".into()),
        source_action: Some(SourceAction {
            action_type: "wired-action".into(),
            dispatched_at: "2026-11-30T06:59:59.000Z".into(),
        }),
        error: ContractError {
            code: contract_error_codes::AUTH_REJECTED.into(),
            message: "denied".into(),
            caused_by: Some("upstream 401".into()),
        },
        timestamp: "2026-11-30T07:00:00.000Z".into(),
        schema_version: SchemaVersionStamp::Given("v9".into()),
    });
    assert_eq!(ser(&p), g("contract_error_full"));
    let p = make_contract_error_payload(MakeContractErrorPayload {
        tool_name: "t".into(),
        action_name: None,
        source_action: None,
        error: ContractError {
            code: contract_error_codes::PIPE_NOT_FOUND.into(),
            message: "m".into(),
            caused_by: None,
        },
        timestamp: "ts".into(),
        schema_version: SchemaVersionStamp::Omit,
    });
    assert_eq!(ser(&p), g("contract_error_omit"));
}

#[test]
fn content_hashes() {
    assert_eq!(
        content_hash("export default function App() { return null; }"),
        g("content_hash_ascii")
    );
    assert_eq!(content_hash("cafe\u{301}"), g("content_hash_nonnfc"));
    assert_eq!(content_hash("caf\u{e9}"), g("content_hash_nfc"));
    assert_eq!(content_hash(""), g("content_hash_empty"));
}

#[test]
fn blueprint_keys_and_canonical_text() {
    let all = golden();
    let cases = all["blueprint"].as_object().unwrap();
    assert!(cases.len() >= 11);
    for (name, case) in cases {
        let input: Value = serde_json::from_str(case["input"].as_str().unwrap()).unwrap();
        assert_eq!(
            canonicalize_contract(Some(&input)),
            case["canonical"].as_str().unwrap(),
            "canonical text of {name}"
        );
        assert_eq!(
            blueprint_key(Some(&input)),
            case["key"].as_str().unwrap(),
            "key of {name}"
        );
    }
    // Non-NFC and NFC spellings of the same contract share one key.
    assert_eq!(cases["non_nfc"]["key"], cases["nfc"]["key"]);
    // Prose does not change the key; key order does not either.
    assert_eq!(cases["simple"]["key"], cases["simple_no_prose"]["key"]);
    assert_eq!(
        blueprint_key(None),
        all["blueprint_undefined"].as_str().unwrap()
    );
}

fn golden_spec() -> ActionSpec {
    ActionSpec::from_json(&json!({
        "toggleTask": {"label": "toggleTask", "schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}},
        "setMode": {"label": "setMode", "schema": {"type": "object", "properties": {"mode": {"enum": ["a", "b"]}, "tags": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}}}}},
        "noSchema": {"label": "noSchema"}
    }))
    .unwrap()
}

#[test]
fn contract_violation_details_and_messages() {
    let all = golden();
    let spec = golden_spec();
    let cases = all["violations"].as_object().unwrap();
    for (name, case) in cases {
        if case["valid"] == json!(true) {
            continue;
        }
        let input: Value = serde_json::from_str(case["input"].as_str().unwrap()).unwrap();
        let result = spec.validate_action_data(Some(&input));
        assert!(!result.valid(), "{name} must be refused");
        let (message, details) = contract_violation(EVENT_TOOL, &result.violations, EVENT_HINT);
        let expected: Value = serde_json::from_str(case["details"].as_str().unwrap()).unwrap();
        if name == "enum_nested" {
            // Several violations: the same set; the validators visit
            // keywords in different orders.
            let mut ours: Vec<String> = details["violations"]
                .as_array()
                .unwrap()
                .iter()
                .map(Value::to_string)
                .collect();
            let mut theirs: Vec<String> = expected["violations"]
                .as_array()
                .unwrap()
                .iter()
                .map(Value::to_string)
                .collect();
            ours.sort();
            theirs.sort();
            assert_eq!(ours, theirs, "{name}");
            continue;
        }
        assert_eq!(
            serde_json::to_string(&details).unwrap(),
            case["details"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(message, case["message"].as_str().unwrap(), "{name}");
    }
    for name in ["ok", "ok_noschema"] {
        assert_eq!(cases[name]["valid"], json!(true));
    }
    assert!(spec
        .validate_action_data(Some(&json!({"action": "toggleTask", "data": {"id": "x"}})))
        .valid());
    assert!(spec
        .validate_action_data(Some(
            &json!({"action": "noSchema", "data": {"anything": [1]}})
        ))
        .valid());
}

/// Frames whose action data breaks its declared schema in several ways at
/// once, sent over the channel; `contract_violations.json` holds what the
/// protocol's `validateActionData` and `ContractViolationError` make of
/// the same action text (run under Node 20 from the built
/// `@ggui-ai/protocol` 0.11.0, outside this repository): the error
/// payload must be the same, byte for byte, violations in the same order.
#[test]
fn contract_violation_frames_match_the_protocol_package() {
    use hostwire_ggui::channel::{Channel, ChannelConfig, CreateSession, Output};
    use hostwire_ggui::ConnId;
    let cases: Value =
        serde_json::from_str(include_str!("../golden/contract_violations.json")).unwrap();
    for case in cases.as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut ch = Channel::new(ChannelConfig::default());
        ch.create_session(
            CreateSession {
                session_id: "s".into(),
                action_spec: Some(case["actionSpec"].clone()),
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let conn = ConnId(1);
        ch.connection_opened(conn, 0, true);
        ch.frame_received(
            conn,
            br#"{"type":"subscribe","payload":{"sessionId":"s"}}"#,
            0,
        );
        while ch.poll_output().is_some() {}
        let frame = format!(
            r#"{{"type":"action","requestId":"r","payload":{{"sessionId":"s","type":"data:submit","payload":{}}}}}"#,
            case["payloadText"].as_str().unwrap()
        );
        ch.frame_received(conn, frame.as_bytes(), 0);
        let mut answers = Vec::new();
        while let Some(o) = ch.poll_output() {
            if let Output::Send { frame, .. } = o {
                answers.push(serde_json::from_str::<Value>(&frame).unwrap());
            }
        }
        assert_eq!(answers.len(), 1, "{name}: {answers:?}");
        assert_eq!(answers[0]["type"], "error", "{name}: {}", answers[0]);
        assert_eq!(answers[0]["requestId"], "r", "{name}: {}", answers[0]);
        assert_eq!(
            ser(&answers[0]["payload"]),
            ser(&case["error"]),
            "{name}: the package's violations differ"
        );
    }
}
