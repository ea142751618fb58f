//! Any text as an inbound PlayerThree message: the decoder never panics,
//! refuses with `bad_message` naming a field, and whatever it accepts (and
//! one refused message in 16) goes through a match (one connection per
//! principal kind) without a panic.
#![no_main]

use hostwire_playerthree::decode::{decode_inbound, MAX_SAFE_INTEGER};
use hostwire_playerthree::demo::Ridge;
use hostwire_playerthree::host::{Match, MatchConfig, Output};
use hostwire_playerthree::protocol::{
    ObserverGrant, Principal, ServerErrorCode, MAX_MESSAGE_BYTES,
};
use hostwire_playerthree::Inbound;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match decode_inbound(text) {
        Err(e) => {
            assert_eq!(e.error.code, ServerErrorCode::BadMessage);
            assert!(!e.error.message.is_empty());
            assert!(e.seq.is_none_or(|s| s <= MAX_SAFE_INTEGER));
            // A refused message never reaches the match's state; one in 16
            // still goes through it (errors, rate limits), the rest are
            // skipped so that the fuzzer spends its time on the decoder.
            if text.len() % 16 != 0 {
                return;
            }
        }
        Ok(m) => {
            assert!(text.len() <= MAX_MESSAGE_BYTES);
            if let Inbound::Client(c) = &m {
                assert!(c.seq() <= MAX_SAFE_INTEGER);
            }
        }
    }
    let mut m = Match::new("m", Ridge::new(), MatchConfig::default(), 0);
    let principals = [
        Principal::Team { r#match: "m".into(), team: "red".into() },
        Principal::Human { r#match: "m".into(), role: "blue-scout".into(), team: "blue".into() },
        Principal::Seat { r#match: "m".into(), role: "red-scout".into(), team: "red".into() },
        Principal::Spectator { r#match: "m".into(), team: None },
        Principal::Observer {
            r#match: "m".into(),
            grant: ObserverGrant::Omniscient { teams: vec!["red".into(), "blue".into()], delay_ms: 50 },
        },
    ];
    for (i, p) in principals.into_iter().enumerate() {
        let t = m.mint(p).unwrap();
        m.connect(i as u64, t.as_str(), 0).unwrap();
    }
    for now in [0u64, 100, 200] {
        for conn in 0..5 {
            m.handle_message(conn, text, now);
        }
        m.tick(now + 50);
    }
    for o in m.take_outputs() {
        if let Output::Send { text, .. } = o {
            assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok());
        }
    }
});
