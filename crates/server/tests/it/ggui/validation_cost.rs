//! A ggui action schema whose evaluation blows up is refused when the
//! contract is registered, over the agent API, with the protocol's code
//! and the schema path; the live channel goes on serving other sessions.

use crate::support::ggui::*;
use serde_json::{json, Map, Value};

/// `l0 = allOf[$ref l1, $ref l1]`, …: 2^levels schemas at one place.
fn ref_chain(levels: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..levels {
        let next = format!("#/definitions/l{}", i + 1);
        defs.insert(
            format!("l{i}"),
            json!({"allOf": [{"$ref": next}, {"$ref": next}]}),
        );
    }
    defs.insert(format!("l{levels}"), json!({"type": "string"}));
    json!({"definitions": defs, "$ref": "#/definitions/l0"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exploding_schema_is_refused_at_registration_naming_its_path() {
    let s = Server::start().await;
    for schema in [
        ref_chain(30),
        json!({"type": "string", "pattern": "^(?=(a+)+$)"}),
    ] {
        let (status, v) = s
            .api(
                "PUT",
                "boom",
                Some(json!({"actionSpec": {"a": {"schema": schema}}})),
            )
            .await;
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some("INVALID_MESSAGE")),
            "{v}"
        );
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .starts_with("actionSpec.a.schema"),
            "{v}"
        );
    }
    // Another session registers a reasonable schema and is served.
    s.create(
        "calm",
        json!({"actionSpec": {"pick": {"schema": {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}}}}}),
    )
    .await;
    let (mut c, _) = s.subscribed("calm").await;
    c.send(action("calm", "pick", json!({"id": "abc"}), "r1"))
        .await;
    let ack = c.recv().await;
    assert_eq!(ack["type"], "ack", "{ack}");
}

/// The worst schema that registers: every element of an array is checked
/// against as many schemas as the fan-out bound allows, through references.
fn worst_admissible() -> Value {
    let per = (hostwire_ggui::validate::MAX_SCHEMA_FANOUT as usize - 1) / 2;
    json!({
        "definitions": {"s": {"type": "string", "pattern": "^(a|b)+$", "maxLength": 64}},
        "type": "array",
        "items": {"allOf": (0..per).map(|_| json!({"$ref": "#/definitions/s"})).collect::<Vec<_>>()}
    })
}

/// Actions of session `a` flooded ahead of session `b`'s one action.
const FLOOD: usize = 8;
/// Bytes of one flooded action's data: each costs a tenth of a second or
/// more to validate (the debug build several times that).
const FLOOD_ACTION_BYTES: usize = 128 * 1024;

/// Session A floods the worst allowed schema's worst actions; session B's
/// one action is acknowledged after at most the validation A has under
/// way, not after A's whole flood: A's acks sent before B's stay within a
/// bound that does not depend on FLOOD. Counted on the server's own frame
/// counter, so no wall-clock time decides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sessions_costly_actions_do_not_delay_another_sessions_ack() {
    let s = Server::start().await;
    s.create(
        "flood",
        json!({"actionSpec": {"a": {"schema": worst_admissible()}}}),
    )
    .await;
    s.create(
        "calm",
        json!({"actionSpec": {"pick": {"schema": {"type": "object", "properties": {"id": {"type": "string"}}}}}}),
    )
    .await;
    let (mut a, _) = s.subscribed("flood").await;
    let (mut b, _) = s.subscribed("calm").await;
    let data: Vec<&str> = std::iter::repeat_n("ab", FLOOD_ACTION_BYTES / 5).collect();
    let costly = action("flood", "a", json!(data), "a0").to_string();
    for i in 0..FLOOD {
        a.send_text(&costly.replace("\"a0\"", &format!("\"a{i}\"")))
            .await;
    }
    // The first ack: the rest of the flood has reached the server.
    let first = a.recv().await;
    assert_eq!(
        (first["type"].as_str(), first["requestId"].as_str()),
        (Some("ack"), Some("a0")),
        "{first}"
    );
    let before = s.metric("hostwire_ggui_frames_out_total").await;
    let started = std::time::Instant::now();
    b.send(action("calm", "pick", json!({"id": "x"}), "b1"))
        .await;
    let ack = b.recv().await;
    let waited = started.elapsed();
    let sent = s.metric("hostwire_ggui_frames_out_total").await - before;
    assert_eq!(
        (ack["type"].as_str(), ack["requestId"].as_str()),
        (Some("ack"), Some("b1")),
        "{ack}"
    );
    eprintln!("b's ack after {waited:?}; frames sent meanwhile: {sent} (flood of {FLOOD})");
    // B's ack, the one of A's actions that was being validated, and one
    // more that may finish while the counter is read.
    assert!(
        sent <= 3,
        "{sent} frames went out before b's ack: b waited for a's flood"
    );
    // A's acks still come, in order.
    for i in 1..FLOOD {
        let v = a.recv().await;
        assert_eq!(v["type"], "ack", "{v}");
        assert_eq!(v["requestId"], format!("a{i}"));
        assert_eq!(v["payload"]["sequence"], i as u64 + 1);
    }
}
