//! Any bytes as heartbeats from NATS, split into several messages, each
//! seen by one node's peer table at a moving time. Never a panic; an
//! accepted heartbeat names a valid node, fits the bound and encodes back
//! to itself; the table never holds more than `MAX_PEERS` peers, nor
//! itself, nor a peer past its expiry.
#![no_main]

use hostwire::cluster::peers::is_node_id;
use hostwire::cluster::{Heartbeat, Peers, Rejection, MAX_HEARTBEAT_BYTES, MAX_PEERS};
use libfuzzer_sys::fuzz_target;

const EXPIRY_MS: u64 = 3_000;

fuzz_target!(|data: &[u8]| {
    let mut peers = Peers::new("self-node", EXPIRY_MS);
    let mut now = 0u64;
    // Messages separated by a 0xff byte (never in JSON text); each one's
    // first byte moves the clock (by 0 to 12.75 s), the rest is the
    // heartbeat.
    for chunk in data.split(|b| *b == 0xff) {
        let Some((&tick, msg)) = chunk.split_first() else {
            continue;
        };
        now += u64::from(tick) * 50;
        match Heartbeat::decode(msg) {
            Ok(hb) => {
                assert!(msg.len() <= MAX_HEARTBEAT_BYTES);
                assert!(is_node_id(&hb.node), "{:?}", hb.node);
                assert_eq!(Heartbeat::decode(&hb.encode()), Ok(hb.clone()));
                match peers.observe(hb, now) {
                    Ok(_) | Err(Rejection::Full) => {}
                    Err(r) => panic!("observe refused with {r:?}"),
                }
            }
            Err(Rejection::TooLarge) => assert!(msg.len() > MAX_HEARTBEAT_BYTES),
            Err(Rejection::Malformed) => {}
            Err(Rejection::Full) => panic!("decode cannot be full"),
        }
        let listed = peers.list(now);
        assert!(listed.len() <= MAX_PEERS);
        for p in &listed {
            assert_ne!(p.heartbeat.node, "self-node");
            assert!(now.saturating_sub(p.last_seen_ms) <= EXPIRY_MS);
        }
        peers.expire(now);
    }
});
