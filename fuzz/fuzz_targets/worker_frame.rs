//! Any bytes as a worker RPC frame: never a panic; a frame that parses
//! round-trips; a refused frame's id is in range; rebuilt cause chains stay
//! within their bound.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_worker_rpc::error::RpcError;
use hostwire_worker_rpc::frame::{parse_frame_bytes, Frame, Outcome, MAX_ID};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_frame_bytes(data) {
        Ok(frame) => {
            let text = frame.to_text();
            let again = parse_frame_bytes(text.as_bytes()).expect("a parsed frame re-parses");
            assert_eq!(again, frame);
            if let Frame::Response {
                outcome: Outcome::Err(e),
                ..
            }
            | Frame::StreamEnd {
                outcome: Outcome::Err(e),
                ..
            } = &frame
            {
                assert!(RpcError::from_envelope(e, 8).depth() <= 9);
            }
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert!(e.id.is_none_or(|id| id <= MAX_ID));
        }
    }
});
