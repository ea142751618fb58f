//! Any JSON as a set's items: preparing it never panics, shuffles are
//! permutations, public items are marked, and the text form a session
//! keeps prepares the same sets.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_memizy::{prepare_display_set, prepare_set_text, DisplaySet, SetText};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((seed_len, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(*seed_len).min(rest.len()) % 16;
    let (seed, json) = rest.split_at(n);
    let seed = String::from_utf8_lossy(seed);
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    let set = DisplaySet {
        meta: Value::Null,
        items,
    };
    let p = prepare_display_set(&set, Some(&seed));
    assert_eq!(p.set.items.len(), set.items.len());
    for item in &p.public_set.items {
        if item.is_object() {
            assert_eq!(item["answerHidden"], Value::Bool(true));
        }
    }
    let t =
        prepare_set_text(&SetText::from_display(&set), Some(&seed), |_| true).expect("JSON items");
    assert_eq!(t.full.parse().expect("full"), p.set);
    assert_eq!(t.public.parse().expect("public"), p.public_set);
});
