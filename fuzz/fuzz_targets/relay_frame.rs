//! Any bytes as relay client frames, through a connection and a room:
//! never a panic; every reply is a JSON frame; forwarded data is the exact
//! text that was sent.
#![no_main]

use hostwire_memizy::relay::{decode_client_frame, ConnStep, ConnectionState, RelayClientMessage, Room, RoomOutput};
use hostwire_memizy::RELAY_LIMITS;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(RelayClientMessage::To { data: Some(r), .. } | RelayClientMessage::Up { data: Some(r) }) = decode_client_frame(text) {
        assert!(serde_json::from_str::<serde_json::Value>(&text[r]).is_ok());
    }
    let mut conn = ConnectionState::new(0, RELAY_LIMITS);
    let (mut room, _) = Room::create("123456".into(), 0, RELAY_LIMITS);
    let mut out = Vec::new();
    room.attach_player(2, Some("p"), None, &mut out);
    let token = room.host_token().as_str().to_owned();
    room.attach_host(1, Some(&token), &mut out);
    conn.on_attached("123456", true, 0);
    // The same frame from the host and from a player, split on newlines.
    for (i, line) in text.split('\n').enumerate() {
        let sender = if i % 2 == 0 { 1 } else { 2 };
        match conn.on_frame(line, i as u64) {
            ConnStep::Reply(f) | ConnStep::RateLimited(f) | ConnStep::Fatal(f, _) => {
                assert!(serde_json::from_slice::<serde_json::Value>(&f).is_ok());
            }
            ConnStep::Attach { msg, .. } => match msg {
                RelayClientMessage::Host { host_token, .. } => room.attach_host(9, host_token.as_deref(), &mut out),
                RelayClientMessage::Join { name, token, .. } => room.attach_player(9, name.as_deref(), token.as_deref(), &mut out),
                _ => unreachable!(),
            },
            ConnStep::Forward(msg) => room.frame(sender, &msg, line, i as u64, &mut out),
        }
        for o in out.drain(..) {
            if let RoomOutput::Send { frame, .. } = o {
                assert!(serde_json::from_slice::<serde_json::Value>(&frame).is_ok(), "{}", String::from_utf8_lossy(&frame));
            }
        }
    }
});
