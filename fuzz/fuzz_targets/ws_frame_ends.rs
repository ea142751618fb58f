//! A client's bytes as the socket driver hands them to tungstenite: in
//! pieces that never cross a frame's end. Whatever the bytes and however
//! they arrive, every piece is within what was asked and what was there,
//! a reader always gets on, nothing is handed out twice or skipped, and it
//! is between messages only at a frame's end.
#![no_main]
#![forbid(unsafe_code)]

use hostwire::ws::FrameEnds;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&[want, chunk], bytes)) = data.split_first_chunk::<2>() else {
        return;
    };
    let want = usize::from(want) + 1;
    let chunk = usize::from(chunk) + 1;
    let mut ends = FrameEnds::default();
    let (mut have, mut at) = (0, 0);
    while at < bytes.len() {
        match ends.give(&bytes[at..have], want) {
            Some(n) if at < have => {
                assert!(
                    n > 0 && n <= want && at + n <= have,
                    "{n} of {want} at {at}/{have}"
                );
                at += n;
                // Between messages only at a frame's end: the state let go
                // there holds no part of a frame.
                assert!(!ends.between_messages() || ends.at_boundary());
            }
            _ if have < bytes.len() => have = (have + chunk).min(bytes.len()),
            // A header cut off by the end of the stream: kept, never given.
            _ => break,
        }
    }
});
