//! What a big frame leaves behind once it is sent or read: nothing that
//! grows with its size. tungstenite keeps its write and read buffers for
//! the socket's life, at the most they ever held: a buffer that took a
//! whole 2 MiB frame would keep 2 MiB for every player a host ever sent one
//! to, and for every client that ever sent one.

use crate::counting::IN_USE;
use crate::support::relay::*;
use serde_json::json;
use std::sync::atomic::Ordering::SeqCst;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::MaybeTlsStream;

const PLAYERS: usize = 20;
/// The read buffer of each runtime thread (2 here), made on its first read:
/// counted if that read falls after the baseline.
const THREAD_BUFFERS: usize = 2 * hostwire::ws::SCRATCH_BYTES;
const FRAME: usize = 2 * 1024 * 1024;

// The lock is held for the whole test on purpose: it keeps the other
// memory tests of this binary out of the count.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_frame_sent_to_many_players_leaves_no_buffer_its_size() {
    let _alone = crate::counting::alone();
    let t = TestRelay::start(config()).await;
    let (mut host, mut players) = t.room_of(PLAYERS).await;
    // Each player gets one small frame first, so that what every
    // connection holds before the big one is in the baseline.
    for (p, id) in &mut players {
        host.send(json!({"t": "to", "to": id, "data": 1})).await;
        assert_eq!(p.recv().await["data"], 1);
    }
    // The players read the big frame's bytes off the socket into one
    // small buffer: a WebSocket client would hold the whole message, and
    // this process's count would be the clients' as much as the server's.
    let mut raw: Vec<_> = players
        .into_iter()
        .map(|(p, id)| match p.ws.into_inner() {
            MaybeTlsStream::Plain(tcp) => (tcp, id),
            _ => unreachable!("plain TCP"),
        })
        .collect();
    let pad = "x".repeat(FRAME);
    let text = json!({"t": "data", "data": pad}).to_string();
    let base = IN_USE.load(SeqCst);
    // The host writes each big frame whole (one frame, as a browser does)
    // onto its socket itself: its WebSocket client would keep a write
    // buffer of the frame's size, counted here as the server's.
    let MaybeTlsStream::Plain(host_tcp) = host.ws.get_mut() else {
        unreachable!("plain TCP")
    };
    for (_, id) in &raw {
        let to = json!({"t": "to", "to": id, "data": pad}).to_string();
        host_tcp
            .write_all(&masked_text_frame(to.as_bytes()))
            .await
            .unwrap();
    }
    let mut buf = vec![0u8; 64 * 1024];
    for (tcp, _) in &mut raw {
        // The message is the last thing sent to the player: its bytes
        // (the text and the frames' headers) end with the text's last two.
        let (mut total, mut tail) = (0, [0u8; 2]);
        while total < text.len() || &tail != b"\"}" {
            let n = read_some(tcp, &mut buf, "the big frame").await;
            total += n;
            tail = if n >= 2 {
                [buf[n - 2], buf[n - 1]]
            } else {
                [tail[1], buf[0]]
            };
        }
    }
    // Every frame has been read by its player, so the server has written
    // each whole. What it may hold now, per connection: a write buffer and
    // a fragment, or a small read buffer after a big frame.
    let bound = (PLAYERS + 1) * 64 * 1024 + THREAD_BUFFERS;
    let held = settled_below(base, bound).await;
    eprintln!("held after {PLAYERS} frames of {FRAME} B: {held} B (bound {bound})");
    assert!(held < bound, "{held} bytes held after the frames were sent");
}

/// The bytes in use above `base` once they are below `bound`, or after the
/// guard: the server's tasks may still be letting go of a frame (its text,
/// its last fragment) a moment after the client has read it.
async fn settled_below(base: usize, bound: usize) -> usize {
    let held = || IN_USE.load(SeqCst).saturating_sub(base);
    let _ = tokio::time::timeout(GUARD, async {
        while held() >= bound {
            tokio::task::yield_now().await;
        }
    })
    .await;
    held()
}

/// A client's text frame, masked as RFC 6455 5.3 has it, in one piece.
fn masked_text_frame(payload: &[u8]) -> Vec<u8> {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut f = vec![0x81u8, 0x80 | 127];
    f.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// A client's big frame, read by a protocol that is done with it before it
/// reads the next (ggui answers a frame that is no JSON at once).
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_frame_read_leaves_no_read_buffer_its_size() {
    use crate::support::session::TestHost;
    use crate::support::sockets::ggui_subscribed;
    let _alone = crate::counting::alone();
    let h = TestHost::start().await;
    let mut ws = ggui_subscribed(&h, "big", None).await;
    let garbage = "y".repeat(FRAME / 4);
    let base = IN_USE.load(SeqCst);
    let MaybeTlsStream::Plain(tcp) = ws.get_mut() else {
        unreachable!("plain TCP")
    };
    tcp.write_all(&masked_text_frame(garbage.as_bytes()))
        .await
        .unwrap();
    let answer = crate::support::ws::next_json(&mut ws).await;
    assert_eq!(answer["payload"]["code"], "INVALID_JSON", "{answer}");
    let bound = 64 * 1024 + THREAD_BUFFERS;
    let held = settled_below(base, bound).await;
    eprintln!(
        "held after a frame of {} B was read: {held} B",
        garbage.len()
    );
    assert!(held < bound, "{held} bytes held after the frame was read");
}

/// Frames over a socket's read buffer but under the fragment size (each
/// player's one `up` of 15 KiB): tungstenite's read buffer grows to take
/// each whole, and would keep that size for the socket's life.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_read_buffer_leaves_no_read_buffer_its_size() {
    const PLAYERS: usize = 40;
    const UP: usize = 15 * 1024;
    let _alone = crate::counting::alone();
    let t = TestRelay::start(config()).await;
    let (mut host, mut players) = t.room_of(PLAYERS).await;
    // A small frame first, so that what each connection holds once it has
    // read a frame is in the baseline.
    for (p, _) in &mut players {
        p.send(json!({"t": "up", "data": 1})).await;
        assert_eq!(host.recv().await["data"], 1);
    }
    let pad = "u".repeat(UP);
    let up = masked_text_frame(json!({"t": "up", "data": pad}).to_string().as_bytes());
    // The host reads the forwarded frames' bytes off its socket into one
    // small buffer (a WebSocket client's buffers would be counted as the
    // server's): `from` frames of 126 bytes or more have a 4-byte header.
    let from = |id: &str| format!(r#"{{"t":"from","from":"{id}","data":"{pad}"}}"#).len() + 4;
    let expected: usize = players.iter().map(|(_, id)| from(id)).sum();
    let MaybeTlsStream::Plain(mut host_tcp) = host.ws.into_inner() else {
        unreachable!("plain TCP")
    };
    let mut buf = vec![0u8; 64 * 1024];
    let base = IN_USE.load(SeqCst);
    // Written onto each player's socket whole, for the same reason.
    for (p, _) in &mut players {
        let MaybeTlsStream::Plain(tcp) = p.ws.get_mut() else {
            unreachable!("plain TCP")
        };
        tcp.write_all(&up).await.unwrap();
    }
    let mut total = 0;
    while total < expected {
        let n = read_some(&mut host_tcp, &mut buf, "the forwarded frames").await;
        total += n;
    }
    assert_eq!(total, expected, "the forwarded frames' bytes");
    let bound = PLAYERS * 2 * 1024 + THREAD_BUFFERS;
    let held = settled_below(base, bound).await;
    eprintln!("held after {PLAYERS} frames of {UP} B were read: {held} B (bound {bound})");
    assert!(held < bound, "{held} bytes held after the frames were read");
}

/// What the socket has now, at least a byte: the server's bytes read off a
/// raw socket into one small buffer.
async fn read_some(tcp: &mut tokio::net::TcpStream, buf: &mut [u8], what: &str) -> usize {
    let n = tokio::time::timeout(GUARD, tcp.read(buf))
        .await
        .unwrap_or_else(|_| panic!("{what} did not come"))
        .unwrap();
    assert!(n > 0, "closed while waiting for {what}");
    n
}
