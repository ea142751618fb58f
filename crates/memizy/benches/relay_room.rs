//! A relay room's own work per frame, without sockets: a host's `to` and a
//! player's `up` decoded, routed by the room and encoded for their
//! recipient, beside parsing the same frame to a `serde_json::Value`
//! (the baseline, in the same run). A room of 40 players, as the
//! classroom's.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use hostwire_memizy::limits::RELAY_LIMITS;
use hostwire_memizy::relay::{decode_client_frame, Room, RoomOutput};

const PLAYERS: u64 = 40;

/// A room with its host on connection 0 and 40 players on 1..=40.
fn room() -> (Room, Vec<String>) {
    let (mut room, _) = Room::create("123456".into(), 0, RELAY_LIMITS);
    let mut out = Vec::new();
    let token = room.host_token().as_str().to_owned();
    room.attach_host(0, Some(&token), false, &mut out);
    for conn in 1..=PLAYERS {
        room.attach_player(conn, Some("pupil"), None, false, &mut out);
    }
    let ids = room.record().players.into_iter().map(|p| p.id).collect();
    (room, ids)
}

/// Decodes `frame`, lets the room route it and encodes what it sends.
fn route(room: &mut Room, conn: u64, frame: &str, out: &mut Vec<RoomOutput>) -> usize {
    let msg = decode_client_frame(frame).expect("a valid frame");
    room.frame(conn, &msg, 0, out);
    let mut bytes = 0;
    for o in out.drain(..) {
        if let RoomOutput::Send { frame: f, .. } = o {
            bytes += f.encode(frame).len();
        }
    }
    bytes
}

fn relay_room(c: &mut Criterion) {
    let (mut room, ids) = room();
    let data = r#"{"kind":"question","id":17,"text":"What is 7 x 8?","choices":["54","56","58"],"ms":1500}"#;
    let to = format!(
        r#"{{"t":"to","to":"{}","data":{data}}}"#,
        ids[PLAYERS as usize / 2]
    );
    let up = format!(r#"{{"t":"up","data":{data}}}"#);
    let mut out = Vec::new();
    assert!(
        route(&mut room, 0, &to, &mut out) > 0,
        "the `to` reaches its player"
    );
    assert!(
        route(&mut room, 7, &up, &mut out) > 0,
        "the `up` reaches the host"
    );

    let mut g = c.benchmark_group("relay room (40 players)");
    for (name, conn, frame) in [("host `to`", 0, &to), ("player `up`", 7, &up)] {
        g.throughput(Throughput::Bytes(frame.len() as u64));
        g.bench_function(format!("{name}: decoded, routed, encoded"), |b| {
            b.iter(|| route(&mut room, conn, black_box(frame), &mut out))
        });
        g.bench_function(format!("{name} (baseline: parse to Value)"), |b| {
            b.iter(|| serde_json::from_str::<serde_json::Value>(black_box(frame)).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, relay_room);
criterion_main!(benches);
