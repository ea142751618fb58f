//! What a ping flood from a client that never reads costs the server, on
//! `/ggui/ws`, `/playerthree/ws` and `/memizy/session/ws`, counted by the
//! global allocator. Each pong the server owes waits unsent;
//! the WebSocket layer's unsent-bytes cap keeps them to a few MB.

use crate::counting::{IN_USE, PEAK};
use crate::support::session::{Api, TestHost, GUARD};
use crate::support::sockets::*;
use futures_util::SinkExt;
use std::sync::atomic::Ordering::SeqCst;
use tokio_tungstenite::tungstenite::Message;

/// Pings sent by one client: 25 MB of pongs owed to it.
const PINGS: usize = 200_000;
/// What one flooding connection may cost the server: the unsent-bytes cap
/// (at most 4 MiB + 64 KiB on these endpoints) in a buffer that grows by
/// doubling, whose growth from 4 to 8 MiB holds both for a moment (12 MiB),
/// and the rest of a connection with what the process holds meanwhile (the
/// count is the whole process's: 12 MiB alone left 32 KB for it, and runs
/// went 130 KB either side of that).
const BOUND: usize = 13 * 1024 * 1024;

/// Floods `ws` with pings, never reading, then closes; returns the peak
/// growth of memory in use, once the server has read the whole flood
/// (`read_all` says when).
async fn flood_peak(mut ws: Ws, read_all: impl Fn() -> bool) -> usize {
    let base = IN_USE.load(SeqCst);
    PEAK.store(base, SeqCst);
    for _ in 0..PINGS {
        if ws.send(Message::Ping(vec![7u8; 125].into())).await.is_err() {
            break;
        }
    }
    // The client's Close comes after every ping: once the server has read
    // it, it has read them all.
    let _ = ws.send(Message::Close(None)).await;
    tokio::time::timeout(GUARD, async {
        while !read_all() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the server never read the whole flood");
    PEAK.load(SeqCst).saturating_sub(base)
}

// The lock is held for the whole test on purpose: it keeps the other
// memory tests of this binary out of the count.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_from_a_client_that_never_reads_costs_a_few_mb_on_every_endpoint() {
    let _alone = crate::counting::alone();
    let h = TestHost::start().await;
    let api = Api::of(&h);
    let app = h.server.as_ref().unwrap();
    let mut peaks = Vec::new();

    let ws = ggui_subscribed(&h, "flood", Some(16 * 1024)).await;
    let ggui = std::sync::Arc::clone(&app.ggui.metrics);
    let peak = flood_peak(ws, || ggui.connections.load(SeqCst) == 0).await;
    peaks.push(("/ggui/ws", peak));

    let (_, _, token) = p3_token(&h.http).await;
    let ws = p3_joined(&h, &token, Some(16 * 1024)).await;
    let p3 = std::sync::Arc::clone(&app.playerthree.metrics);
    let peak = flood_peak(ws, || p3.connections.load(SeqCst) == 0).await;
    peaks.push(("/playerthree/ws", peak));

    let mut ws = board(&h, &api, Some(16 * 1024)).await;
    hello(&mut ws).await;
    let sessions = std::sync::Arc::clone(&app.sessions.metrics);
    tokio::time::timeout(GUARD, async {
        while sessions.devices.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    let peak = flood_peak(ws, || sessions.devices.load(SeqCst) == 0).await;
    peaks.push(("/memizy/session/ws", peak));

    eprintln!("peak growth per flooding connection: {peaks:?}");
    for (endpoint, peak) in peaks {
        assert!(peak < BOUND, "{endpoint}: {peak} bytes");
    }
}
