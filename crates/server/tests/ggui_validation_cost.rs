//! A ggui action schema whose evaluation blows up is refused when the
//! contract is registered, over the agent API, with the protocol's code
//! and the schema path; the live channel goes on serving other sessions.

mod ggui_common;

use ggui_common::*;
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
