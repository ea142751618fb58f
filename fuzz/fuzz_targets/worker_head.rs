//! Any bytes through the lenient pass that reads `kind`, `id` and `v` of a
//! refused worker RPC frame: never a panic, reads only its bounded head,
//! ids in range, and never disagrees with the strict decoder.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_worker_rpc::frame::{parse_frame_bytes, read_head, MAX_HEAD_BYTES, MAX_ID};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let head = read_head(data);
    assert!(head.id.is_none_or(|id| id <= MAX_ID));
    assert_eq!(head, read_head(&data[..data.len().min(MAX_HEAD_BYTES)]));
    if let Ok(frame) = parse_frame_bytes(data) {
        if let Some(kind) = head.kind {
            assert_eq!(kind, frame.kind_of());
        }
        if let (Some(a), Some(b)) = (head.id, frame.id()) {
            assert_eq!(a, b);
        }
        if let Some(v) = &head.v {
            assert_eq!(v, frame.version());
        }
    }
});
