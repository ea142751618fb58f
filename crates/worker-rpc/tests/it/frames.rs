//! Every frame's round trip, and every malformed frame's error.

use hostwire_worker_rpc::error::{codes, RpcError};
use hostwire_worker_rpc::frame::*;
use serde_json::json;

fn env(code: &str) -> ErrorEnvelope {
    ErrorEnvelope {
        code: code.into(),
        message: "m".into(),
        data: Some(json!({"k": 1}).into()),
        cause: Some(Box::new(ErrorEnvelope::new("INNER", "i"))),
    }
}

fn all_frames() -> Vec<Frame> {
    let v = || PROTOCOL_VERSION.to_owned();
    vec![
        Frame::Request {
            v: v(),
            id: 1,
            method: "echo".into(),
            params: Some(json!({"a": [1, 2]}).into()),
        },
        Frame::Request {
            v: v(),
            id: 3,
            method: "noParams".into(),
            params: None,
        },
        Frame::Response {
            v: v(),
            id: 1,
            outcome: Outcome::Ok(json!("ok").into()),
        },
        Frame::Response {
            v: v(),
            id: 1,
            outcome: Outcome::Err(env("BAD")),
        },
        Frame::Cancel {
            v: v(),
            id: 5,
            reason: Some("timeout".into()),
        },
        Frame::Cancel {
            v: v(),
            id: 5,
            reason: None,
        },
        Frame::Progress {
            v: v(),
            id: 7,
            progress: json!({"done": 3, "total": 10}).into(),
        },
        Frame::StreamOpen {
            v: v(),
            id: 9,
            method: "upload".into(),
            params: Some(json!(null).into()),
        },
        Frame::StreamChunk {
            v: v(),
            id: 9,
            seq: 1,
            data: json!("chunk").into(),
        },
        Frame::StreamEnd {
            v: v(),
            id: 9,
            outcome: Outcome::Ok(Payload::null()),
        },
        Frame::StreamEnd {
            v: v(),
            id: 9,
            outcome: Outcome::Err(env("ABORT")),
        },
        Frame::StreamAck {
            v: v(),
            id: 9,
            ack: 4,
            credit: 8,
        },
        Frame::Hello {
            v: v(),
            features: vec!["x".into()],
            agent: Some("test/1".into()),
        },
        Frame::Goodbye {
            v: v(),
            reason: Some("bye".into()),
            error: Some(env("SHUTDOWN")),
        },
        Frame::Goodbye {
            v: v(),
            reason: None,
            error: None,
        },
    ]
}

#[test]
fn every_frame_round_trips() {
    let frames = all_frames();
    let kinds: std::collections::BTreeSet<&str> = frames.iter().map(Frame::kind).collect();
    assert_eq!(kinds.len(), 10, "all ten kinds are covered");
    for f in frames {
        let text = f.to_text();
        assert!(!text.contains('\n'));
        let back = parse_frame(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(back, f, "{text}");
        assert!(back.is_compatible());
    }
}

#[test]
fn response_and_stream_end_are_discriminated_by_ok() {
    let ok = parse_frame(r#"{"v":"1.0.0","kind":"response","id":1,"ok":true}"#).unwrap();
    assert_eq!(
        ok,
        Frame::Response {
            v: "1.0.0".into(),
            id: 1,
            outcome: Outcome::Ok(Payload::null())
        }
    );
    let err = parse_frame(
        r#"{"v":"1.0.0","kind":"stream-end","id":2,"ok":false,"error":{"code":"E","message":"m"}}"#,
    )
    .unwrap();
    assert!(matches!(err, Frame::StreamEnd { outcome: Outcome::Err(ref e), .. } if e.code == "E"));
}

fn field_of(text: &str) -> String {
    let e = parse_frame(text).expect_err(text);
    assert!(!e.to_string().is_empty());
    e.field
}

#[test]
fn malformed_frames_name_the_field() {
    let cases = [
        ("", ""),
        ("[]", ""),
        ("{", ""),
        (r#"{"v":"1.0.0"}"#, "kind"),
        (r#"{"v":"1.0.0","kind":"shout"}"#, "kind"),
        (r#"{"kind":"request","id":1,"method":"m"}"#, "v"),
        (r#"{"v":1,"kind":"request","id":1,"method":"m"}"#, "v"),
        (r#"{"v":"1.0.0","kind":"request","method":"m"}"#, "id"),
        (
            r#"{"v":"1.0.0","kind":"request","id":-1,"method":"m"}"#,
            "id",
        ),
        (
            r#"{"v":"1.0.0","kind":"request","id":1.5,"method":"m"}"#,
            "id",
        ),
        (
            r#"{"v":"1.0.0","kind":"request","id":9007199254740992,"method":"m"}"#,
            "id",
        ),
        (
            r#"{"v":"1.0.0","kind":"request","id":"1","method":"m"}"#,
            "id",
        ),
        (r#"{"v":"1.0.0","kind":"request","id":1}"#, "method"),
        (
            r#"{"v":"1.0.0","kind":"request","id":1,"method":""}"#,
            "method",
        ),
        (r#"{"v":"1.0.0","kind":"response","id":1}"#, "ok"),
        (r#"{"v":"1.0.0","kind":"response","id":1,"ok":"yes"}"#, "ok"),
        (
            r#"{"v":"1.0.0","kind":"response","id":1,"ok":false}"#,
            "error",
        ),
        (
            r#"{"v":"1.0.0","kind":"response","id":1,"ok":false,"error":"boom"}"#,
            "error",
        ),
        (
            r#"{"v":"1.0.0","kind":"response","id":1,"ok":false,"error":{"message":"m"}}"#,
            "error.code",
        ),
        (
            r#"{"v":"1.0.0","kind":"response","id":1,"ok":false,"error":{"code":"E","message":"m","cause":{"code":"C"}}}"#,
            "error.cause.message",
        ),
        (
            r#"{"v":"1.0.0","kind":"cancel","id":1,"reason":5}"#,
            "reason",
        ),
        (r#"{"v":"1.0.0","kind":"progress","id":1}"#, "progress"),
        (
            r#"{"v":"1.0.0","kind":"stream-chunk","id":1,"seq":0,"data":1}"#,
            "seq",
        ),
        (
            r#"{"v":"1.0.0","kind":"stream-chunk","id":1,"seq":1}"#,
            "data",
        ),
        (
            r#"{"v":"1.0.0","kind":"stream-ack","id":1,"ack":0}"#,
            "credit",
        ),
        (
            r#"{"v":"1.0.0","kind":"hello","features":[1]}"#,
            "features[0]",
        ),
        (
            r#"{"v":"1.0.0","kind":"goodbye","error":{"code":""}}"#,
            "error.code",
        ),
    ];
    for (text, field) in cases {
        assert_eq!(field_of(text), field, "{text}");
    }
    // The id of a malformed request is kept, so it can be answered.
    let e = parse_frame(r#"{"v":"1.0.0","kind":"request","id":7}"#).unwrap_err();
    assert_eq!((e.id, e.kind), (Some(7), Some(Kind::Request)));
}

#[test]
fn another_major_still_parses_but_is_not_compatible() {
    let f = parse_frame(r#"{"v":"2.0.0","kind":"request","id":1,"method":"m"}"#).unwrap();
    assert!(!f.is_compatible());
    assert!(parse_frame(r#"{"v":"1.9.3","kind":"hello"}"#)
        .unwrap()
        .is_compatible());
    assert!(!parse_frame(r#"{"v":"banana","kind":"hello"}"#)
        .unwrap()
        .is_compatible());
    assert_eq!(major_of("10.1.0"), Some(10));
}

fn chain(depth: usize) -> ErrorEnvelope {
    let mut e = ErrorEnvelope::new("L0", "bottom");
    for i in 1..depth {
        e = ErrorEnvelope {
            code: format!("L{i}"),
            message: format!("level {i}"),
            data: None,
            cause: Some(Box::new(e)),
        };
    }
    e
}

#[test]
fn cause_chains_of_any_depth_on_the_wire_are_bounded_when_rebuilt() {
    // Deep on the wire (within the JSON nesting bound): parses whole.
    let deep = chain(60);
    let f = Frame::Response {
        v: PROTOCOL_VERSION.into(),
        id: 1,
        outcome: Outcome::Err(deep.clone()),
    };
    let back = parse_frame(&f.to_text()).unwrap();
    let Frame::Response {
        outcome: Outcome::Err(env),
        ..
    } = back
    else {
        panic!()
    };
    assert_eq!(env, deep);
    let e = RpcError::from_envelope(&env, 8);
    assert_eq!(e.depth(), 9, "8 links and one marker");
    assert!(e.truncated);
    let mut last = &e;
    while let Some(c) = last.cause.as_deref() {
        last = c;
    }
    assert_eq!(last.code, codes::CAUSE_TRUNCATED);
    assert!(last.message.contains("52 more"));
    // Within the bound nothing is marked.
    let short = RpcError::from_envelope(&chain(3), 8);
    assert_eq!((short.depth(), short.truncated), (3, false));
    assert_eq!(short.to_envelope(), chain(3));
    // The bound is configurable.
    assert_eq!(RpcError::from_envelope(&chain(10), 2).depth(), 3);
}

#[derive(Debug)]
struct Looping;

impl std::fmt::Display for Looping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("I am my own cause")
    }
}

impl std::error::Error for Looping {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self)
    }
}

#[derive(Debug)]
struct Wrap(RpcError);

impl std::fmt::Display for Wrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("outer")
    }
}

impl std::error::Error for Wrap {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[test]
fn a_cyclic_cause_chain_is_cut_and_marked() {
    let e = RpcError::from_std(&Looping, "WORKER_FAILED", 8);
    assert_eq!(e.code, "WORKER_FAILED");
    assert_eq!(e.depth(), 2);
    assert_eq!(e.cause.as_ref().unwrap().code, codes::CAUSE_CYCLE);
    // A plain chain is kept link by link.
    let wrapped = Wrap(RpcError::new("X", "inner"));
    let e = RpcError::from_std(&wrapped, "IO", 8);
    assert_eq!(e.depth(), 2);
    assert_eq!(e.cause.as_ref().unwrap().message, "[X] inner");
}

#[test]
fn huge_and_deep_frames_are_refused_before_parsing() {
    let deep = format!(
        r#"{{"v":"1.0.0","kind":"progress","id":1,"progress":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    assert!(parse_frame(&deep)
        .unwrap_err()
        .message
        .contains("nested deeper"));
}
