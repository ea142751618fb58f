//! Any bytes as a message of a tunnel between nodes (what NATS hands a
//! node on its frame subject). Never a panic; a message read encodes back
//! to exactly its bytes (nothing is lost or changed in reading), and a
//! close reason read is UTF-8 within RFC 6455's 123 bytes.
#![no_main]

use bytes::Bytes;
use hostwire::cluster::tunnel::wire::Wire;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    if let Ok((seq, wire)) = Wire::decode(&payload) {
        if let Wire::Close(_, reason) = &wire {
            assert!(reason.len() <= 123);
        }
        assert_eq!(wire.encode(seq), payload);
    }
});
