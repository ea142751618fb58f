//! Host-call and plugin-call decoding: every method, every rule.

use hostwire_memizy::calls::{check_asset_size, check_service_result};
use hostwire_memizy::{
    decode_host_call, decode_host_call_with, decode_plugin_call, DataScope, HostCall, PluginCall,
    ProtocolErrorCode as C, Recipients, SessionEndReason, View, LIMITS,
};
use serde_json::value::RawValue;

fn code(method: &str, args: &str) -> C {
    decode_host_call(method, args)
        .expect_err(&format!("{method}({args}) must fail"))
        .code
}

fn msg(method: &str, args: &str) -> String {
    decode_host_call(method, args).unwrap_err().message
}

const HELLO: &str = r#"[{"protocol":"1.0","sdk":{"name":"@memizy/plugin-sdk","version":"1.0.3"},"plugin":{"id":"https://x.org/p","version":"1.0.0"},"features":[]}]"#;

#[test]
fn hello_decodes_and_validates_every_field() {
    let HostCall::Hello(h) = decode_host_call("hello", HELLO).unwrap() else {
        panic!()
    };
    assert_eq!(h.protocol, "1.0");
    assert_eq!(h.sdk.version, "1.0.3");
    let bad_protocol = HELLO.replace(r#""protocol":"1.0""#, r#""protocol":"1""#);
    assert!(msg("hello", &bad_protocol).contains("handshake.protocol"));
    let no_sdk_name = HELLO.replace(r#""name":"@memizy/plugin-sdk","#, "");
    let m = msg("hello", &no_sdk_name);
    assert!(
        m.starts_with("[INVALID_ARGUMENT] hello: handshake.sdk"),
        "{m}"
    );
    assert!(m.contains("name"), "{m}");
    let empty_id = HELLO.replace(r#""id":"https://x.org/p""#, r#""id":"""#);
    assert!(msg("hello", &empty_id).contains("handshake.plugin.id must not be empty"));
    let feature_type = HELLO.replace(r#""features":[]"#, r#""features":[5]"#);
    assert!(msg("hello", &feature_type).contains("handshake.features[0]"));
    let many: Vec<String> = (0..101).map(|i| format!("\"f{i}\"")).collect();
    let too_many = HELLO.replace(
        r#""features":[]"#,
        &format!(r#""features":[{}]"#, many.join(",")),
    );
    assert!(msg("hello", &too_many).contains("at most 100"));
    assert_eq!(code("hello", "[]"), C::InvalidArgument);
    assert_eq!(
        code("hello", &format!("[{},1]", &HELLO[1..HELLO.len() - 1])),
        C::InvalidArgument
    );
    // Unknown fields are ignored (SPEC 9: receivers ignore what they do not know).
    let extra = HELLO.replace(r#""features":[]"#, r#""features":[],"future":{"x":1}"#);
    assert!(decode_host_call("hello", &extra).is_ok());
}

#[test]
fn unknown_and_reserved_methods() {
    for m in ["exit", "resize", "setChanged", "saveProgress"] {
        let e = decode_host_call(m, "[]").unwrap_err();
        assert_eq!(e.code, C::UnknownMethod, "{m}");
        assert!(e.message.contains("reserved"), "{}", e.message);
    }
    for m in ["nope", "", "HELLO", "__proto__", "start"] {
        assert_eq!(code(m, "[]"), C::UnknownMethod, "{m}");
    }
    assert_eq!(
        decode_plugin_call("hello", "[]").unwrap_err().code,
        C::UnknownMethod
    );
    assert_eq!(
        decode_plugin_call("setChanged", "[]").unwrap_err().code,
        C::UnknownMethod
    );
}

#[test]
fn ready_takes_no_arguments() {
    assert!(matches!(
        decode_host_call("ready", "[]"),
        Ok(HostCall::Ready)
    ));
    assert!(msg("ready", "[1]").contains("takes 0 argument"));
    assert!(msg("ready", "{}").contains("must be a JSON array"));
    assert!(msg("ready", "[").contains("must be a JSON array"));
}

#[test]
fn send_borrows_data_and_checks_recipients_and_size() {
    let args = r#"[{"to":"all","data":{"k":"state","v":[1,2,3]}}]"#;
    let HostCall::Send(m) = decode_host_call("send", args).unwrap() else {
        panic!()
    };
    assert_eq!(m.to, Recipients::All);
    assert_eq!(m.data.get(), r#"{"k":"state","v":[1,2,3]}"#);
    // The data is a slice of the input: decoding copied nothing.
    let start = args.as_ptr() as usize;
    let data = m.data.get().as_ptr() as usize;
    assert!(data >= start && data < start + args.len());

    let HostCall::Send(m) =
        decode_host_call("send", r#"[{"to":["p-1","board"],"data":null}]"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        m.to,
        Recipients::Addresses(vec!["p-1".into(), "board".into()])
    );
    assert!(msg("send", r#"[{"to":[],"data":1}]"#).contains("message.to must list 1 to 500"));
    assert!(msg("send", r#"[{"to":[""],"data":1}]"#).contains("message.to[0] must not be empty"));
    assert!(msg("send", r#"[{"to":"everyone","data":1}]"#).contains("message.to"));
    assert!(msg("send", r#"[{"data":1}]"#).contains("to"));
    assert!(msg("send", r#"[{"to":"all"}]"#).contains("data"));

    // 64 KB of data passes, one byte more is MESSAGE_TOO_LARGE.
    let fill = |n: usize| format!(r#"[{{"to":"authority","data":"{}"}}]"#, "x".repeat(n - 2));
    assert!(decode_host_call("send", &fill(LIMITS.message_bytes)).is_ok());
    let e = decode_host_call("send", &fill(LIMITS.message_bytes + 1)).unwrap_err();
    assert_eq!(e.code, C::MessageTooLarge);
    assert!(
        e.message.contains("message.data is 65537 bytes"),
        "{}",
        e.message
    );
    // Whitespace around the value does not count toward its size.
    let padded = format!(
        r#"[{{"to":"authority","data":   "{}"   }}]"#,
        "x".repeat(LIMITS.message_bytes - 2)
    );
    assert!(decode_host_call("send", &padded).is_ok());
    // Far too large input is refused before parsing, with the method's code.
    let huge = format!("[{}]", "1,".repeat(LIMITS.max_call_bytes()));
    assert_eq!(code("send", &huge), C::MessageTooLarge);
}

#[test]
fn non_json_values_are_rejected() {
    assert!(msg("send", r#"[{"to":"all","data":1e400}]"#).contains("INVALID_ARGUMENT"));
    assert!(msg("saveSnapshot", r#"[[1e999]]"#).contains("snapshot must be plain JSON"));
    // A lone surrogate escape is JSON text a JavaScript host accepts too; the
    // opaque data passes through unchanged.
    assert!(decode_host_call("send", r#"[{"to":"all","data":"\ud800"}]"#).is_ok());
    assert_eq!(
        code("send", r#"[{"to":"all","data":NaN}]"#),
        C::InvalidArgument
    );
    let deep = format!(
        r#"[{{"to":"all","data":{}{}}}]"#,
        "[".repeat(80),
        "]".repeat(80)
    );
    assert!(msg("send", &deep).contains("nested deeper than 64"));
}

#[test]
fn save_snapshot_and_save_data_limits() {
    assert!(matches!(
        decode_host_call("saveSnapshot", r#"[{"s":1}]"#),
        Ok(HostCall::SaveSnapshot(_))
    ));
    let snap = |n: usize| format!(r#"["{}"]"#, "s".repeat(n - 2));
    assert!(decode_host_call("saveSnapshot", &snap(LIMITS.snapshot_bytes)).is_ok());
    assert_eq!(
        code("saveSnapshot", &snap(LIMITS.snapshot_bytes + 1)),
        C::SnapshotTooLarge
    );

    let HostCall::SaveData { scope, value } =
        decode_host_call("saveData", r#"["set",{"level":3}]"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(scope, DataScope::Set);
    assert_eq!(value.get(), r#"{"level":3}"#);
    assert!(msg("saveData", r#"["account",1]"#).contains("scope"));
    assert!(msg("saveData", r#"["plugin"]"#).contains("takes 2"));
    let data = |n: usize| format!(r#"["plugin","{}"]"#, "d".repeat(n - 2));
    assert!(decode_host_call("saveData", &data(LIMITS.data_bytes)).is_ok());
    assert_eq!(
        code("saveData", &data(LIMITS.data_bytes + 1)),
        C::DataTooLarge
    );
}

#[test]
fn record_answer_rules() {
    let ok = r#"[{"itemId":"q1","isCorrect":true,"confidence":3,"timeSpentMs":1200,"hintsUsed":0,"isSkipped":false,"answer":["b"]}]"#;
    let HostCall::RecordAnswer(a) = decode_host_call("recordAnswer", ok).unwrap() else {
        panic!()
    };
    assert_eq!(a.answer.unwrap().get(), r#"["b"]"#);
    assert_eq!(a.confidence, Some(3));
    let cases = [
        (r#"[{"isCorrect":true}]"#, "itemId"),
        (
            r#"[{"itemId":"","isCorrect":true}]"#,
            "answer.itemId must not be empty",
        ),
        (r#"[{"itemId":"q","isCorrect":"yes"}]"#, "answer.isCorrect"),
        (
            r#"[{"itemId":"q","isCorrect":true,"confidence":5}]"#,
            "answer.confidence must be 1, 2, 3 or 4",
        ),
        (
            r#"[{"itemId":"q","isCorrect":true,"confidence":0}]"#,
            "answer.confidence",
        ),
        (
            r#"[{"itemId":"q","isCorrect":true,"timeSpentMs":-1}]"#,
            "answer.timeSpentMs must be a non-negative integer",
        ),
        (
            r#"[{"itemId":"q","isCorrect":true,"hintsUsed":1.5}]"#,
            "answer.hintsUsed",
        ),
        (
            r#"[{"itemId":"q","isCorrect":true,"playerId":""}]"#,
            "answer.playerId",
        ),
        (
            r#"[{"itemId":"q","isCorrect":true,"item":{"id":"other","type":"mcq-single"}}]"#,
            "answer.item.id must equal itemId",
        ),
        (
            r#"[{"itemId":"q","isCorrect":true,"item":{"id":"q"}}]"#,
            "answer.item",
        ),
        (
            r#"[{"itemId":"q","isCorrect":true,"item":{"id":"q","type":""}}]"#,
            "answer.item.type must not be empty",
        ),
    ];
    for (args, needle) in cases {
        let m = msg("recordAnswer", args);
        assert!(
            m.starts_with("[INVALID_ARGUMENT]") && m.contains(needle),
            "{args}: {m}"
        );
    }
    // A 4 KB answer passes, one byte more is DATA_TOO_LARGE.
    let answer = |n: usize| {
        format!(
            r#"[{{"itemId":"q","isCorrect":false,"answer":"{}"}}]"#,
            "a".repeat(n - 2)
        )
    };
    assert!(decode_host_call("recordAnswer", &answer(LIMITS.answer_bytes)).is_ok());
    let e = decode_host_call("recordAnswer", &answer(LIMITS.answer_bytes + 1)).unwrap_err();
    assert_eq!(e.code, C::DataTooLarge);
    assert!(e.message.contains("answer.answer"));
    // A 32 KB generated item passes, more is DATA_TOO_LARGE.
    let item = |n: usize| {
        let head = r#"{"id":"g","type":"mcq-single","q":""}"#.len();
        format!(
            r#"[{{"itemId":"g","isCorrect":true,"item":{{"id":"g","type":"mcq-single","q":"{}"}}}}]"#,
            "i".repeat(n - head)
        )
    };
    assert!(decode_host_call("recordAnswer", &item(LIMITS.generated_item_bytes)).is_ok());
    let e = decode_host_call("recordAnswer", &item(LIMITS.generated_item_bytes + 1)).unwrap_err();
    assert_eq!(e.code, C::DataTooLarge);
    assert!(e.message.contains("answer.item is"));
}

#[test]
fn update_settings_get_asset_end_report_error_service() {
    let HostCall::UpdateSettings(u) = decode_host_call(
        "updateSettings",
        r#"[{"values":{"rounds":5},"valid":true}]"#,
    )
    .unwrap() else {
        panic!()
    };
    assert!(u.valid);
    assert!(msg("updateSettings", r#"[{"values":[],"valid":true}]"#).contains("update.values"));
    assert!(msg(
        "updateSettings",
        &format!(
            r#"[{{"values":{{}},"valid":false,"message":"{}"}}]"#,
            "m".repeat(501)
        )
    )
    .contains("update.message"));

    let HostCall::GetAsset { key, item_id } =
        decode_host_call("getAsset", r#"["img/a.png","q1"]"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        (key.as_str(), item_id.as_deref()),
        ("img/a.png", Some("q1"))
    );
    assert!(matches!(
        decode_host_call("getAsset", r#"["k"]"#),
        Ok(HostCall::GetAsset { item_id: None, .. })
    ));
    assert!(msg("getAsset", r#"[""]"#).contains("key must not be empty"));
    assert!(
        msg("getAsset", &format!(r#"["{}"]"#, "k".repeat(201))).contains("key must be at most 200")
    );
    assert!(msg("getAsset", r#"["k",7]"#).contains("itemId"));

    let HostCall::End(r) = decode_host_call(
        "end",
        r#"[{"scores":{"p-1":10,"p-2":7.5},"summary":"Ann wins"}]"#,
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(r.scores.unwrap()["p-2"], 7.5);
    assert!(msg("end", r#"[{"scores":{"p-1":"ten"}}]"#).contains("result.scores"));
    assert!(
        msg("end", &format!(r#"[{{"summary":"{}"}}]"#, "s".repeat(1001)))
            .contains("result.summary")
    );

    assert!(matches!(
        decode_host_call(
            "reportError",
            r#"[{"code":"E1","message":"boom","context":{"a":1}}]"#
        ),
        Ok(HostCall::ReportError(_))
    ));
    assert!(msg("reportError", r#"[{"code":"","message":"x"}]"#).contains("error.code"));
    assert!(msg(
        "reportError",
        r#"[{"code":"E","message":"x","context":[1]}]"#
    )
    .contains("error.context"));

    let HostCall::Service { name, payload } =
        decode_host_call("service", r#"["chess.puzzles",{"rating":1400}]"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        (name.as_str(), payload.get()),
        ("chess.puzzles", r#"{"rating":1400}"#)
    );
    for bad in ["Chess", "chess..x", ".x", "x.", "1x", "a b"] {
        assert!(
            msg("service", &format!(r#"["{bad}",1]"#)).contains("name must be lowercase"),
            "{bad}"
        );
    }
    let payload = |n: usize| format!(r#"["tts.speak","{}"]"#, "p".repeat(n - 2));
    assert!(decode_host_call("service", &payload(LIMITS.service_request_bytes)).is_ok());
    assert_eq!(
        code("service", &payload(LIMITS.service_request_bytes + 1)),
        C::MessageTooLarge
    );
}

#[test]
fn results_and_assets_have_limits() {
    let big: Box<RawValue> = serde_json::from_str(&format!(
        "\"{}\"",
        "r".repeat(LIMITS.service_result_bytes - 1)
    ))
    .unwrap();
    assert_eq!(
        check_service_result(&big, &LIMITS).unwrap_err().code,
        C::MessageTooLarge
    );
    let ok: Box<RawValue> = serde_json::from_str(&format!(
        "\"{}\"",
        "r".repeat(LIMITS.service_result_bytes - 2)
    ))
    .unwrap();
    assert!(check_service_result(&ok, &LIMITS).is_ok());
    assert!(check_asset_size("a", LIMITS.asset_bytes, &LIMITS).is_ok());
    assert_eq!(
        check_asset_size("a", LIMITS.asset_bytes + 1, &LIMITS)
            .unwrap_err()
            .code,
        C::DataTooLarge
    );
}

#[test]
fn a_host_may_raise_limits() {
    let raised = hostwire_memizy::Limits {
        message_bytes: 128 * 1024,
        ..LIMITS
    };
    let args = format!(r#"[{{"to":"all","data":"{}"}}]"#, "x".repeat(100 * 1024));
    assert_eq!(code("send", &args), C::MessageTooLarge);
    assert!(decode_host_call_with("send", &args, &raised).is_ok());
}

#[test]
fn authority_and_view_rules_are_declared() {
    let snap = decode_host_call("saveSnapshot", "[1]").unwrap();
    assert!(snap.requires_authority());
    assert!(decode_host_call("end", "[{}]")
        .unwrap()
        .requires_authority());
    assert!(!decode_host_call("ready", "[]")
        .unwrap()
        .requires_authority());
    let data = decode_host_call("saveData", r#"["plugin",1]"#).unwrap();
    assert_eq!(
        data.allowed_views(),
        Some(&[View::Solo, View::Controller][..])
    );
    let settings = decode_host_call("updateSettings", r#"[{"values":{},"valid":true}]"#).unwrap();
    assert_eq!(settings.allowed_views(), Some(&[View::Settings][..]));
}

#[test]
fn plugin_calls_decode() {
    assert!(matches!(
        decode_plugin_call("start", "[]"),
        Ok(PluginCall::Start)
    ));
    let args = r#"[{"from":"p-1","data":{"a":1},"sentAt":1234.5}]"#;
    let PluginCall::Deliver(m) = decode_plugin_call("deliver", args).unwrap() else {
        panic!()
    };
    assert_eq!(
        (m.from.as_str(), m.data.get(), m.sent_at),
        ("p-1", r#"{"a":1}"#, 1234.5)
    );
    assert!(
        decode_plugin_call("deliver", r#"[{"from":"","data":1,"sentAt":1}]"#)
            .unwrap_err()
            .message
            .contains("message.from")
    );
    assert!(decode_plugin_call("deliver", r#"[{"from":"b","data":1}]"#)
        .unwrap_err()
        .message
        .contains("sentAt"));
    let PluginCall::PlayersChanged(p) = decode_plugin_call(
        "playersChanged",
        r#"[[{"id":"p","name":"A","isHost":false,"connected":true,"avatar":"x"}]]"#,
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(p[0].name, "A");
    assert!(decode_plugin_call("playersChanged", r#"[[{"id":"p"}]]"#)
        .unwrap_err()
        .message
        .contains("players[0]"));
    assert!(
        matches!(decode_plugin_call("authorityChanged", r#"[{"connected":false}]"#), Ok(PluginCall::AuthorityChanged(s)) if !s.connected)
    );
    assert!(matches!(
        decode_plugin_call("configChanged", r#"[{"locale":"cs","theme":"dark"}]"#),
        Ok(PluginCall::ConfigChanged(_))
    ));
    assert!(
        decode_plugin_call("configChanged", r#"[{"locale":"cs","theme":"blue"}]"#)
            .unwrap_err()
            .message
            .contains("config.theme")
    );
    assert!(matches!(
        decode_plugin_call(
            "clockChanged",
            r#"[{"offsetMs":5,"pausedMs":0,"pausedAt":null}]"#
        ),
        Ok(PluginCall::ClockChanged(_))
    ));
    assert!(
        decode_plugin_call("clockChanged", r#"[{"offsetMs":5,"pausedMs":0}]"#)
            .unwrap_err()
            .message
            .contains("pausedAt")
    );
    let PluginCall::SessionEnded(r) =
        decode_plugin_call("sessionEnded", r#"["host-left"]"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(r, SessionEndReason::HostLeft);
    let PluginCall::SessionEnded(r) = decode_plugin_call("sessionEnded", r#"["moved"]"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(r.as_str(), "moved");
}
