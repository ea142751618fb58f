//! Any text as an inbound PlayerThree message: the decoder never panics,
//! refuses with `bad_message` naming a field, and whatever it accepts (and
//! one refused message in 16) goes through a match (one connection per
//! principal kind) without a panic. The same text, if it is JSON, as the
//! arguments of a disclosure (the MCP tool `disclose`): refused with
//! `bad_message`, or accepted within its bounds and disclosed by each
//! principal (only the agent's seat may).
#![no_main]
#![forbid(unsafe_code)]

use hostwire_playerthree::decode::{
    decode_disclosure, decode_inbound, MAX_COMMENTARY_TEXT_BYTES, MAX_SAFE_INTEGER, MESSAGE_LIMITS,
};
use hostwire_playerthree::demo::Ridge;
use hostwire_playerthree::host::{Match, MatchConfig, Output};
use hostwire_playerthree::protocol::{
    ObserverGrant, Principal, ServerErrorCode, MAX_MESSAGE_BYTES,
};
use hostwire_playerthree::{Inbound, Json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let disclosure = hostwire_core::json::from_str_bounded::<Json>(text, MESSAGE_LIMITS)
        .ok()
        .map(|args| decode_disclosure(&args));
    if let Some(d) = &disclosure {
        match d {
            Err(e) => assert_eq!(e.code, ServerErrorCode::BadMessage),
            Ok(d) => {
                assert!(!d.text.trim().is_empty() && d.text.len() <= MAX_COMMENTARY_TEXT_BYTES)
            }
        }
    }
    match decode_inbound(text) {
        Err(e) => {
            assert_eq!(e.error.code, ServerErrorCode::BadMessage);
            assert!(!e.error.message.is_empty());
            assert!(e.seq.is_none_or(|s| s <= MAX_SAFE_INTEGER));
            // A refused message never reaches the match's state; one in 16
            // still goes through it (errors, rate limits), the rest are
            // skipped so that the fuzzer spends its time on the decoder.
            if text.len() % 16 != 0 && !matches!(disclosure, Some(Ok(_))) {
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
        Principal::Team {
            r#match: "m".into(),
            team: "red".into(),
        },
        Principal::Human {
            r#match: "m".into(),
            role: "blue-scout".into(),
            team: "blue".into(),
        },
        Principal::Seat {
            r#match: "m".into(),
            role: "red-scout".into(),
            team: "red".into(),
        },
        Principal::Spectator {
            r#match: "m".into(),
            team: None,
        },
        Principal::Observer {
            r#match: "m".into(),
            grant: ObserverGrant::Omniscient {
                teams: vec!["red".into(), "blue".into()],
                delay_ms: 50,
            },
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
    if let Some(Ok(d)) = disclosure {
        m.handle_message(
            0,
            r#"{"op":"controller","seq":1,"role":"red-scout","controller":{"kind":"agent"}}"#,
            300,
        );
        for conn in 0..5 {
            let r = m.disclose(conn, d.clone());
            assert_eq!(r.is_ok(), conn == 2, "{r:?}");
        }
        m.tick(400);
    }
    for o in m.take_outputs() {
        if let Output::Send { text, .. } = o {
            assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok());
        }
    }
});
