//! What one pending ggui action keeps in memory, measured with a counting
//! allocator (this test binary's own): a 1 MiB action of many small
//! values, held until the agent drains it. The pending copy is its JSON
//! text; before, it was a parsed tree many times the action's size.

use hostwire_core::Clock;
use hostwire_core::ManualClock;
use hostwire_ggui::{Channel, ChannelConfig, ConnId};
use serde_json::json;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            IN_USE.fetch_add(layout.size(), SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), SeqCst);
    }
}

#[global_allocator]
static A: Counting = Counting;

fn drain_outputs(ch: &mut Channel) {
    while ch.poll_output().is_some() {}
}

#[test]
fn a_pending_action_keeps_about_its_own_size() {
    let clock = ManualClock::new(1_796_022_000_000);
    let mut ch = Channel::new(ChannelConfig::default());
    let c = ConnId(1);
    ch.connection_opened(c, clock.now_ms(), true);
    let sub = json!({"type": "subscribe", "requestId": "s", "payload": {"sessionId": "s"}});
    ch.frame_received(c, sub.to_string().as_bytes(), clock.now_ms());
    drain_outputs(&mut ch);
    // Small numbers: the most tree per byte of text.
    let data: Vec<u32> = (0..500_000).map(|i| i % 10).collect();
    let frame = json!({"type": "action", "requestId": "a", "payload": {"sessionId": "s", "type": "data:submit", "payload": {"action": "big", "data": data}}}).to_string();
    assert!(frame.len() <= 1024 * 1024, "{}", frame.len());
    let data_bytes = serde_json::to_string(&data).unwrap().len();
    let before = IN_USE.load(SeqCst);
    ch.frame_received(c, frame.as_bytes(), clock.now_ms());
    drain_outputs(&mut ch);
    let with_action = IN_USE.load(SeqCst);
    assert_eq!(ch.pending_actions("s", 10).unwrap().len(), 1);
    ch.drain_actions("s", 1, clock.now_ms()).unwrap();
    drain_outputs(&mut ch);
    let drained = IN_USE.load(SeqCst);
    let pending = with_action.saturating_sub(drained);
    eprintln!(
        "action data {data_bytes} B; kept with it pending {} B; the pending copy {pending} B ({:.1}x)",
        with_action - before,
        pending as f64 / data_bytes as f64
    );
    assert!(pending <= 2 * data_bytes, "{pending} B for {data_bytes} B");
}
