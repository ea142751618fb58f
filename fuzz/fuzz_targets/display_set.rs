//! Any JSON as a set's items: preparing it never panics, shuffles are
//! permutations, and public items are marked.
#![no_main]

use hostwire_memizy::{prepare_display_set, DisplaySet};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((seed_len, rest)) = data.split_first() else { return };
    let n = usize::from(*seed_len).min(rest.len()) % 16;
    let (seed, json) = rest.split_at(n);
    let seed = String::from_utf8_lossy(seed);
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(json) else { return };
    let set = DisplaySet { meta: Value::Null, items };
    let p = prepare_display_set(&set, Some(&seed));
    assert_eq!(p.set.items.len(), set.items.len());
    for item in &p.public_set.items {
        if item.is_object() {
            assert_eq!(item["answerHidden"], Value::Bool(true));
        }
    }
});
