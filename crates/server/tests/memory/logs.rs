//! A relay room's log lines carry its PIN: a reader follows one room's
//! life by its name, whichever task wrote the line.

use crate::support::relay::*;
use serde_json::json;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Everything the subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }
}

// One thread: the subscriber set for this test's thread sees every task
// of the server, and a line written before a frame is sent is in the
// buffer once the frame arrives.
// The guard serialises this binary's tests; it is held across awaits on
// purpose (the other tests wait for it on their own threads, never on this
// runtime's).
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "current_thread")]
async fn a_rooms_lines_carry_its_pin_from_creation_to_close() {
    let _alone = crate::counting::alone();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let (mut a, _, _) = t.player(&pin, "A").await;
    host.send(json!({"t": "close"})).await;
    for c in [&mut host, &mut a] {
        let mut got = c.recv().await;
        if got["t"] == "presence" {
            got = c.recv().await;
        }
        assert_eq!(got, json!({"t": "closed", "reason": "host"}));
        assert_eq!(c.ended().await, Ended::Closed(1000));
    }

    let lines = captured.lines();
    let room = format!("room{{pin={pin}}}");
    for event in ["room created", "room closed"] {
        let line = lines
            .iter()
            .find(|l| l.contains(event))
            .unwrap_or_else(|| panic!("no {event:?} line in {lines:#?}"));
        assert!(line.contains(&room), "{line}");
    }
    // Every line that names the room is in its span (no line with the PIN
    // as a field of its own, outside it).
    for line in lines.iter().filter(|l| l.contains(&pin)) {
        assert!(line.contains(&room), "{line}");
    }
    // A room's span is its own, not that of the connection that created it.
    let created = lines.iter().find(|l| l.contains("room created")).unwrap();
    assert!(!created.contains("conn{"), "{created}");
}
