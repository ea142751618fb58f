//! Any bytes as the body of each ggui agent API request that has one
//! (create, emit, props, drain, version). Never a panic; a refusal is
//! `INVALID_JSON` for text that is not JSON and `INVALID_MESSAGE`
//! otherwise, with a message; an accepted body is a JSON object (or empty).
#![no_main]

use hostwire::ggui::api::decode_body;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for route in ["create", "emit", "props", "drain", "version"] {
        match decode_body(route, data) {
            Ok(()) => {
                if !data.iter().all(u8::is_ascii_whitespace) {
                    let v: serde_json::Value =
                        serde_json::from_slice(data).expect("an accepted body is JSON");
                    assert!(v.is_object(), "an accepted body is an object");
                }
            }
            Err((code, message)) => {
                assert!(
                    code == "INVALID_JSON" || code == "INVALID_MESSAGE",
                    "{code}"
                );
                assert!(!message.is_empty());
                let blank = data.iter().all(u8::is_ascii_whitespace);
                if code == "INVALID_MESSAGE"
                    && !blank
                    && serde_json::from_slice::<serde_json::Value>(data).is_err()
                {
                    // Refused as a shape only when it nests too deep or is
                    // JSON of another shape.
                    assert!(message.contains("nests deeper"), "{message}");
                }
            }
        }
    }
});
