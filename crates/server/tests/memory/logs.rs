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

/// Counts the spans open in the subscriber's registry.
struct OpenSpans(Arc<std::sync::atomic::AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for OpenSpans {
    fn on_new_span(
        &self,
        _: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn on_close(&self, _: tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

// At the default level (info) an open WebSocket keeps no span: one kept for
// the socket's life cost the registry about 400 bytes per idle connection.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "current_thread")]
async fn an_open_socket_keeps_no_span_at_the_default_level() {
    use tracing_subscriber::layer::SubscriberExt;
    let _alone = crate::counting::alone();
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(OpenSpans(Arc::clone(&open)))
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink));
    let _guard = tracing::subscriber::set_default(subscriber);

    let t = TestRelay::start(config()).await;
    let (mut host, pin, _) = t.host().await;
    let mut players = Vec::new();
    for i in 0..40 {
        players.push(t.player(&pin, &format!("P{i}")).await.0);
    }
    // Every player's join has reached the host: each socket is open and idle.
    for _ in 0..40 {
        assert_eq!(host.recv().await["t"], "presence");
    }
    let spans = open.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        spans < 10,
        "{spans} spans open for 41 idle sockets (the room's and the server's own are a few)"
    );
    drop(players);
}
