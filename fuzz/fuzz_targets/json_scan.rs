//! Any bytes through the pre-parse scan: never a panic, and on text serde
//! accepts as JSON the block scan agrees with the byte-by-byte one, and the
//! depth bound by the bracket count (`deeper_than`) with the scan.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_core::json::{deeper_than, nesting_depth, scan_structure, scan_structure_bytewise};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let stop = data.first().map_or(8, |b| usize::from(*b % 80));
    let fast = scan_structure(data, stop);
    let slow = scan_structure_bytewise(data, stop);
    if serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok() {
        assert_eq!(fast.max_depth, slow.max_depth);
        if slow.max_depth <= stop {
            assert_eq!(fast.big_numbers, slow.big_numbers);
        }
        assert_eq!(
            deeper_than(data, stop),
            nesting_depth(data, stop) > stop,
            "limit {stop}"
        );
    }
});
