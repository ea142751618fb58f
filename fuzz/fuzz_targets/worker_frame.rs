//! Any bytes as a worker RPC frame: never a panic; text parses as its
//! bytes do; a frame that parses is written as serde_json writes it and
//! round-trips; a refused frame's id is in range; rebuilt cause chains stay
//! within their bound.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_worker_rpc::error::RpcError;
use hostwire_worker_rpc::frame::{
    parse_frame, parse_frame_by_fields, parse_frame_bytes, Frame, Outcome, MAX_ID,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = parse_frame_bytes(data);
    // Text (UTF-8 already) takes the path without the UTF-8 check, to the
    // same answer; so does the field-by-field path alone.
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(parse_frame(text), parsed);
        assert_eq!(parse_frame_by_fields(text), parsed);
    }
    match parsed {
        Ok(frame) => {
            let text = frame.to_text();
            // The hand-written text is serde_json's serialization.
            assert_eq!(
                text,
                serde_json::to_string(&frame).expect("a frame serializes")
            );
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
