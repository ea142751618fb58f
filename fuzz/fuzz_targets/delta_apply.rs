//! Any delta against any base value: `apply` never panics; when it
//! succeeds, diffing the result against the base and applying that gives
//! the result again; apply(a, diff(a, b)) == b for any two values; and a
//! delta made by `diff` applies to another value as its text does.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_core::delta::{apply, diff, Json, JsonDelta};
use hostwire_core::json::{from_slice_bounded, JsonLimits};
use libfuzzer_sys::fuzz_target;

const LIMITS: JsonLimits = JsonLimits::new(64 * 1024, 64);

fuzz_target!(|data: &[u8]| {
    // base, a NUL byte, then the delta (or a second value).
    let Some(split) = data.iter().position(|&b| b == 0) else {
        return;
    };
    let (Ok(base), Ok(other)) = (
        from_slice_bounded::<Json>(&data[..split], LIMITS),
        from_slice_bounded::<Json>(&data[split + 1..], LIMITS),
    ) else {
        return;
    };
    if let Ok(out) = apply(&base, &JsonDelta::from_json(other.clone())) {
        let d = diff(&base, &out);
        assert_eq!(apply(&base, &d).unwrap(), out);
    }
    let d = diff(&base, &other);
    assert_eq!(apply(&base, &d).unwrap(), other);
    // A made delta means what its text means on any value, not only on
    // the one it was made against: the same result or the same error.
    let wire = JsonDelta::from_json(d.to_json());
    assert_eq!(apply(&other, &d), apply(&other, &wire));
    let text = serde_json::to_string(&d).unwrap();
    let back: JsonDelta = serde_json::from_str(&text).unwrap();
    assert_eq!(apply(&base, &back).unwrap(), other);
});
