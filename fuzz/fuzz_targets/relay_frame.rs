//! Any bytes as relay client frames, through a connection and a room:
//! never a panic; the one-pass decoding of `to` and `up` answers as the
//! field-by-field one; every reply is a JSON frame; forwarded data is the
//! exact text that was sent.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_memizy::relay::protocol::decode_client_frame_by_fields;
use hostwire_memizy::relay::{
    decode_client_frame, ConnStep, ConnectionState, RelayClientMessage, RelayServerMessage, Room,
    RoomOutput,
};
use hostwire_memizy::RELAY_LIMITS;
use libfuzzer_sys::fuzz_target;

fn assert_json(frame: &RelayServerMessage, source: &str) {
    let text = frame.encode(source);
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["t"], frame.kind().as_str());
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let decoded = decode_client_frame(text);
    // The one-pass path for `to` and `up` answers as the field-by-field one.
    assert_eq!(decoded, decode_client_frame_by_fields(text));
    if let Ok(
        RelayClientMessage::To { data: Some(r), .. } | RelayClientMessage::Up { data: Some(r) },
    ) = decoded
    {
        assert!(serde_json::from_str::<serde_json::Value>(&text[r]).is_ok());
    }
    let mut conn: ConnectionState<&str> = ConnectionState::new(0, RELAY_LIMITS);
    let (mut room, _) = Room::create("123456".into(), 0, RELAY_LIMITS);
    let mut out = Vec::new();
    room.attach_player(2, Some("p"), None, false, &mut out);
    let token = room.host_token().as_str().to_owned();
    room.attach_host(1, Some(&token), false, &mut out);
    conn.on_attached("123456", true, 0);
    // The same frame from the host and from a player, split on newlines.
    for (i, line) in text.split('\n').enumerate() {
        let sender = if i % 2 == 0 { 1 } else { 2 };
        match conn.on_frame(line, i as u64) {
            ConnStep::Reply { frame, .. }
            | ConnStep::RateLimited(frame)
            | ConnStep::Fatal { frame, .. } => {
                assert_json(&frame, "");
            }
            ConnStep::Attach {
                msg,
                already_attached,
                ..
            } => {
                let _ = match msg {
                    RelayClientMessage::Host { host_token, .. } => {
                        room.attach_host(9, host_token.as_deref(), already_attached, &mut out)
                    }
                    RelayClientMessage::Join { name, token, .. } => room.attach_player(
                        9,
                        name.as_deref(),
                        token.as_deref(),
                        already_attached,
                        &mut out,
                    ),
                    _ => unreachable!(),
                };
            }
            ConnStep::Forward(msg) => room.frame(sender, &msg, i as u64, &mut out),
        }
        for o in out.drain(..) {
            if let RoomOutput::Send { frame, .. } | RoomOutput::Broadcast { frame, .. } = o {
                assert_json(&frame, line);
            }
        }
    }
});
