//! What this node sends to one other node over all the tunnels between
//! them: each tunnel appends its messages to the link's batch, and one task
//! per link publishes what has piled up as one NATS message. Under load a
//! NATS message then carries many frames, so that a carried frame costs a
//! share of one publish, one delivery and one wake on each node instead of
//! a whole one (see docs/BENCHMARKS.md, "Cluster"); when idle, a frame goes
//! alone at once: nothing waits for a batch to fill.
//!
//! Bounds: a batch is published once it holds [`BATCH_BYTES`]; a link holds
//! at most [`LINK_BYTES`] not yet handed to NATS, past which a tunnel's
//! frames wait ([`Link::poll_room`]; the tunnel then reads no more of its
//! client, or its connection's outbound queue fills). The few messages that
//! never wait (credits, keepalives, closes) are bounded by the tunnels'
//! credit windows and beats.

use super::wire::{self, Wire};
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use tokio::sync::Notify;

/// The bytes of one NATS message of a link (NATS refuses a message over
/// its `max_payload`, 1 MB by default; a record is at most a fragment of
/// 256 KiB and its head, so a batch stays under 800 KiB).
pub const BATCH_BYTES: usize = 512 * 1024;

/// Bytes a link holds not yet handed to NATS; a tunnel's next frame waits
/// past it.
pub const LINK_BYTES: usize = 8 * 1024 * 1024;

/// One other node's link, held by every tunnel to it; the last one gone
/// ends its task once what it holds is published.
pub struct Link {
    shared: Arc<Shared>,
}

struct Shared {
    subject: String,
    state: Mutex<State>,
    /// Wakes the publishing task.
    ready: Notify,
}

#[derive(Default)]
struct State {
    batches: VecDeque<BytesMut>,
    /// Bytes in `batches`.
    bytes: usize,
    /// Tunnels waiting for room.
    waiting: Vec<Waker>,
    /// No more batches come (every holder is gone).
    closed: bool,
    /// NATS refused a publish: the client is closed, nothing more goes.
    failed: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How a link hands a batch on (NATS's publish; a test's channel).
pub type Publish = Box<dyn FnMut(Bytes) -> BoxFuture<'static, Result<(), String>> + Send>;

impl Link {
    /// A link publishing to `subject`, its task spawned.
    pub fn start(
        client: async_nats::Client,
        subject: String,
        metrics: Arc<super::TunnelMetrics>,
    ) -> Arc<Link> {
        let to = subject.clone();
        Link::spawn(
            subject,
            Box::new(move |batch| {
                let (client, to) = (client.clone(), to.clone());
                metrics
                    .batches_out
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Box::pin(async move { client.publish(to, batch).await.map_err(|e| e.to_string()) })
            }),
        )
    }

    /// A link handing its batches to `publish`, its task spawned.
    pub fn spawn(subject: String, publish: Publish) -> Arc<Link> {
        let shared = Arc::new(Shared {
            subject,
            state: Mutex::default(),
            ready: Notify::new(),
        });
        tokio::spawn(run(Arc::clone(&shared), publish));
        Arc::new(Link { shared })
    }

    /// Appends `tunnel`'s message; false when nothing more can go (NATS
    /// refused a publish).
    pub fn push(&self, tunnel: &str, seq: u64, w: &Wire) -> bool {
        if tunnel.len() > wire::MAX_TUNNEL_ID {
            return false;
        }
        let mut s = self.shared.state();
        if s.failed {
            return false;
        }
        let need = 5 + tunnel.len() + w.encoded_len();
        let fits = s
            .batches
            .back()
            .is_some_and(|b| b.len() + need <= BATCH_BYTES);
        if !fits {
            s.batches
                .push_back(BytesMut::with_capacity(need.min(BATCH_BYTES)));
        }
        let batch = s.batches.back_mut().expect("a batch");
        let put = wire::put_record(batch, tunnel, seq, w);
        debug_assert!(put, "the id's length is checked above");
        s.bytes += need;
        drop(s);
        self.shared.ready.notify_one();
        true
    }

    /// Ready when the link has room for another frame; otherwise the
    /// task is woken once the link has published some of what it holds.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.shared.state();
        if s.bytes < LINK_BYTES || s.failed {
            return Poll::Ready(());
        }
        if !s.waiting.iter().any(|w| w.will_wake(cx.waker())) {
            s.waiting.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.state().closed = true;
        self.shared.ready.notify_one();
    }
}

/// Publishes the link's batches in order until it is closed and empty.
async fn run(shared: Arc<Shared>, mut publish: Publish) {
    loop {
        let next = {
            let mut s = shared.state();
            match s.batches.pop_front() {
                Some(b) => {
                    s.bytes -= b.len().min(s.bytes);
                    for w in s.waiting.drain(..) {
                        w.wake();
                    }
                    Some(b)
                }
                None if s.closed => return,
                None => None,
            }
        };
        let Some(batch) = next else {
            shared.ready.notified().await;
            continue;
        };
        if let Err(e) = publish(batch.freeze()).await {
            tracing::warn!(subject = %shared.subject, error = %e, "frames between nodes not sent: tunnels end");
            let mut s = shared.state();
            s.failed = true;
            s.batches.clear();
            s.bytes = 0;
            for w in s.waiting.drain(..) {
                w.wake();
            }
            return;
        }
    }
}

/// One side of one tunnel, sending: its messages go on its peer's link,
/// numbered in order.
pub struct Sender {
    pub link: Arc<Link>,
    pub tunnel: String,
    seq: u64,
}

impl Sender {
    pub fn new(link: Arc<Link>, tunnel: String) -> Sender {
        Sender {
            link,
            tunnel,
            seq: 0,
        }
    }

    /// Sends one message in the tunnel's order; false when nothing more
    /// can go.
    pub fn send(&mut self, w: &Wire) -> bool {
        let sent = self.link.push(&self.tunnel, self.seq, w);
        self.seq += 1;
        sent
    }

    /// A text or binary frame, in fragments when long.
    pub fn frame(&mut self, text: bool, body: bytes::Bytes) -> bool {
        Wire::frame(text, body).iter().all(|w| self.send(w))
    }

    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.link.poll_room(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// A link whose batches go into a channel, one at a time: the next
    /// waits until the test took the last.
    fn link() -> (Arc<Link>, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(1);
        let publish: Publish = Box::new(move |b| {
            let tx = tx.clone();
            Box::pin(async move { tx.send(b).await.map_err(|e| e.to_string()) })
        });
        (Link::spawn("test".into(), publish), rx)
    }

    fn text(n: usize) -> Wire {
        Wire::Text(Bytes::from(vec![b'x'; n]))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn messages_pushed_before_the_task_runs_go_in_one_batch_in_order() {
        let (link, mut rx) = link();
        for seq in 0..100 {
            assert!(link.push("t1", seq, &text(10)));
        }
        let batch = rx.recv().await.expect("a batch");
        let seqs: Vec<u64> = wire::records(&batch)
            .map(|r| Wire::decode(&r.expect("a record").1).expect("a message").0)
            .collect();
        assert_eq!(seqs, (0..100).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_batch_holds_at_most_batch_bytes() {
        let (link, mut rx) = link();
        let frame = text(100 * 1024);
        for seq in 0..20 {
            assert!(link.push("t1", seq, &frame));
        }
        let mut seen = 0;
        while seen < 20 {
            let batch = rx.recv().await.expect("a batch");
            assert!(batch.len() <= BATCH_BYTES, "{} bytes", batch.len());
            seen += wire::records(&batch).count();
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn past_link_bytes_a_tunnel_waits_and_is_woken_when_batches_went() {
        let (link, mut rx) = link();
        let frame = text(200 * 1024);
        let mut seq = 0;
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        while link.poll_room(&mut cx).is_ready() {
            assert!(link.push("t1", seq, &frame));
            seq += 1;
            assert!(seq < 1000, "the link never filled");
        }
        // The task took one batch and waits for the channel: what the link
        // holds stays within its bound plus the frame that passed it.
        let held = link.shared.state().bytes;
        assert!(
            (LINK_BYTES..LINK_BYTES + 300 * 1024).contains(&held),
            "{held}"
        );
        let room = std::future::poll_fn(|cx| link.poll_room(cx));
        let taker = async {
            let mut taken = 0;
            while taken < seq {
                taken += wire::records(&rx.recv().await.expect("a batch")).count() as u64;
            }
        };
        tokio::join!(room, taker);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_publish_ends_the_link_and_frees_its_waiters() {
        let publish: Publish = Box::new(|_| Box::pin(async { Err("closed".to_owned()) }));
        let link = Link::spawn("test".into(), publish);
        assert!(link.push("t1", 0, &Wire::Keepalive));
        tokio::task::yield_now().await;
        assert!(!link.push("t1", 1, &Wire::Keepalive));
    }
}
