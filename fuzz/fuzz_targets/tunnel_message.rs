//! Any bytes as a batch of a tunnel link between nodes (what NATS hands a
//! node on its frame subject): records of a tunnel id and a message. Never
//! a panic; a record read is within the bytes given, a message read encodes
//! back to exactly its bytes (nothing is lost or changed in reading), a
//! close reason read is UTF-8 within RFC 6455's 123 bytes, and a batch whose
//! every record and message reads is written back to exactly its bytes.
#![no_main]

use bytes::{Bytes, BytesMut};
use hostwire::cluster::tunnel::wire::{put_record, records, Wire};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let batch = Bytes::copy_from_slice(data);
    let mut again = BytesMut::new();
    let mut whole = true;
    for r in records(&batch) {
        let Ok((id, m)) = r else {
            whole = false;
            break;
        };
        assert!(m.len() <= data.len());
        match Wire::decode(&m) {
            Ok((seq, wire)) => {
                if let Wire::Close(_, reason) = &wire {
                    assert!(reason.len() <= 123);
                }
                assert_eq!(wire.encode(seq), m);
                assert!(put_record(&mut again, id, seq, &wire));
            }
            Err(_) => whole = false,
        }
    }
    if whole {
        assert_eq!(&again[..], data);
    }
});
