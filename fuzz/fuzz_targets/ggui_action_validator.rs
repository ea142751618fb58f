//! Any JSON as an action payload against fixed declared schemas, and any
//! JSON as a declared schema (the part before the first NUL) against any
//! payload (the rest): never a panic; the result is deterministic and
//! bounded; every violation names a field under the action.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_ggui::validate::{
    contract_violation, ActionSpec, EVENT_HINT, EVENT_TOOL, MAX_VIOLATIONS,
};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::sync::OnceLock;

fn fixed() -> &'static ActionSpec {
    static SPEC: OnceLock<ActionSpec> = OnceLock::new();
    SPEC.get_or_init(|| {
        ActionSpec::from_json(&json!({
            "go": {"schema": {"type": "object", "properties": {
                "n": {"type": "integer", "minimum": 0, "maximum": 10},
                "s": {"type": ["string", "null"], "minLength": 1, "pattern": "^[a-z]+$"},
                "e": {"enum": ["a", 1, null]},
                "items": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {"k": {"const": true}}}},
                "any": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                "mail": {"type": "string", "format": "email"}
            }, "required": ["n"]}},
            "free": {}
        }))
        .unwrap()
    })
}

fn check(spec: &ActionSpec, payload: Option<&Value>) {
    let r = spec.validate_action_data(payload);
    assert!(r.violations.len() <= MAX_VIOLATIONS);
    assert_eq!(r, spec.validate_action_data(payload), "deterministic");
    if let Some(Value::Object(m)) = payload {
        if let Some(Value::String(a)) = m.get("action") {
            for v in &r.violations {
                assert!(
                    v.field == "action" || v.field.starts_with(&format!("{a}.data")),
                    "{}",
                    v.field
                );
            }
        }
    }
    let (_, details) = contract_violation(EVENT_TOOL, &r.violations, EVENT_HINT);
    assert_eq!(
        details["violations"].as_array().unwrap().len(),
        r.violations.len()
    );
}

fuzz_target!(|data: &[u8]| {
    let limits = hostwire_core::JsonLimits::new(64 * 1024, 64);
    let (schema_part, payload_part) = match data.iter().position(|&b| b == 0) {
        Some(i) => (Some(&data[..i]), &data[i + 1..]),
        None => (None, data),
    };
    let Ok(payload) = hostwire_core::json::from_slice_bounded::<Value>(payload_part, limits) else {
        return;
    };
    check(fixed(), Some(&payload));
    check(fixed(), Some(&json!({"action": "go", "data": payload})));
    if let Some(schema_bytes) = schema_part {
        if let Ok(schema) = hostwire_core::json::from_slice_bounded::<Value>(schema_bytes, limits) {
            if let Ok(spec) = ActionSpec::from_json(&json!({"x": {"schema": schema}})) {
                check(&spec, Some(&json!({"action": "x", "data": payload})));
                check(&spec, Some(&json!({"action": "x"})));
            }
        }
    }
});
