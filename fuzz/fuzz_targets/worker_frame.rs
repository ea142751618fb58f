//! Any text as a worker RPC frame: never a panic; a frame that parses
//! round-trips; rebuilt cause chains stay within their bound.
#![no_main]

use hostwire_worker_rpc::error::RpcError;
use hostwire_worker_rpc::frame::{parse_frame, Frame, Outcome};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match parse_frame(text) {
        Ok(frame) => {
            let again = parse_frame(&frame.to_text()).expect("a parsed frame re-parses");
            assert_eq!(again, frame);
            if let Frame::Response { outcome: Outcome::Err(e), .. } | Frame::StreamEnd { outcome: Outcome::Err(e), .. } = &frame {
                assert!(RpcError::from_envelope(e, 8).depth() <= 9);
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
