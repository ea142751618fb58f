//! What a big frame leaves behind once it is sent: nothing that grows with
//! its size. Each connection's WebSocket layer keeps its write buffer for
//! the socket's life, so a buffer that took a whole 2 MiB frame would keep
//! 2 MiB for every player a host ever sent one to.

use crate::counting::IN_USE;
use crate::support::relay::*;
use serde_json::json;
use std::sync::atomic::Ordering::SeqCst;
use tokio::io::AsyncReadExt;
use tokio_tungstenite::MaybeTlsStream;

const PLAYERS: usize = 20;
const FRAME: usize = 2 * 1024 * 1024;

// The lock is held for the whole test on purpose: it keeps the other
// memory tests of this binary out of the count.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_frame_sent_to_many_players_leaves_no_buffer_its_size() {
    let _alone = crate::counting::alone();
    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let mut players = Vec::new();
    for i in 0..PLAYERS {
        let (p, id, _) = t.player(&pin, &format!("p{i}")).await;
        assert_eq!(host.recv().await["event"], "join");
        players.push((p, id));
    }
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
    for (_, id) in &raw {
        host.send(json!({"t": "to", "to": id, "data": pad})).await;
    }
    let mut buf = vec![0u8; 64 * 1024];
    for (tcp, _) in &mut raw {
        // The message is the last thing sent to the player: its bytes
        // (the text and the frames' headers) end with the text's last two.
        let (mut total, mut tail) = (0, [0u8; 2]);
        while total < text.len() || &tail != b"\"}" {
            let n = tokio::time::timeout(GUARD, tcp.read(&mut buf))
                .await
                .expect("the big frame did not come")
                .unwrap();
            assert!(n > 0, "closed after {total} bytes");
            total += n;
            tail = if n >= 2 {
                [buf[n - 2], buf[n - 1]]
            } else {
                [tail[1], buf[0]]
            };
        }
    }
    // Every frame has been read by its player, so the server has written
    // each whole. What it holds now: the host's read buffer (which took
    // one frame whole; tungstenite has no way to give it back) and, per
    // player, at most a write buffer and one fragment.
    let held = IN_USE.load(SeqCst).saturating_sub(base);
    let bound = 2 * FRAME + PLAYERS * 64 * 1024;
    eprintln!("held after {PLAYERS} frames of {FRAME} B: {held} B (bound {bound})");
    assert!(held < bound, "{held} bytes held after the frames were sent");
}
