//! What an idle socket holds once the registry's sweep has found it silent:
//! no WebSocket state and no read buffer (`hostwire::ws::WebSocket::shed`),
//! made afresh by its next frame, with nothing lost.

use crate::counting::IN_USE;
use crate::support::relay::*;
use serde_json::json;
use std::sync::atomic::Ordering::SeqCst;

const PLAYERS: usize = 40;
/// tungstenite's state (256 B) and its read buffer (128 B on the relay)
/// for each of the room's sockets, with room for a few let go early.
const FREED_PER_SOCKET: usize = 256;

// The lock is held for the whole test on purpose: it keeps the other
// memory tests of this binary out of the count.
#[allow(clippy::await_holding_lock)]
#[tokio::test(start_paused = true)]
async fn an_idle_socket_lets_go_of_its_websocket_state_until_its_next_frame() {
    let _alone = crate::counting::alone();
    let t = TestRelay::start(config()).await;
    let (mut host, mut players) = t.room_of(PLAYERS).await;
    // Every socket has just read a frame: each holds its state.
    for (i, (p, _)) in players.iter_mut().enumerate() {
        p.send(json!({"t": "up", "data": i})).await;
        assert_eq!(host.recv().await["data"], i);
    }
    for (p, id) in &mut players {
        host.send(json!({"t": "to", "to": id, "data": "hi"})).await;
        assert_eq!(p.recv().await["data"], "hi");
    }
    let busy = IN_USE.load(SeqCst);
    // Two sweeps find every socket silent.
    advance_seconds(3).await;
    let idle = IN_USE.load(SeqCst);
    let freed = busy.saturating_sub(idle);
    eprintln!("let go by {} idle sockets: {freed} B", PLAYERS + 1);
    assert!(
        freed >= (PLAYERS + 1) * FREED_PER_SOCKET,
        "{freed} B let go by {} idle sockets",
        PLAYERS + 1
    );
    // Nothing is lost: each socket reads and writes again.
    for (i, (p, id)) in players.iter_mut().enumerate() {
        p.send(json!({"t": "up", "data": i + 100})).await;
        assert_eq!(host.recv().await["data"], i + 100);
        host.send(json!({"t": "to", "to": id, "data": i})).await;
        assert_eq!(p.recv().await["data"], i);
    }
}
