//! The outbound queue tested alone: order, bounds, kills, held frames.

use super::*;
use std::task::Waker;

const SLOW: Close = (1013, "too slow");

/// Bounds for a test's queue: a `u32` frame weighs 10 bytes, a byte
/// vector its length.
struct Limits {
    cap: usize,
    max_bytes: usize,
}

impl Bounds<u32> for Limits {
    fn cap(&self) -> usize {
        self.cap
    }
    fn max_bytes(&self) -> usize {
        self.max_bytes
    }
    fn weigh(_: &u32) -> usize {
        10
    }
}

impl Bounds<Vec<u8>> for Limits {
    fn cap(&self) -> usize {
        self.cap
    }
    fn max_bytes(&self) -> usize {
        self.max_bytes
    }
    fn weigh(frame: &Vec<u8>) -> usize {
        frame.len()
    }
}

/// A queue of at most `cap` frames and no byte bound.
fn frames<T>(cap: usize) -> (Outbound<T, Limits>, Drain<T, Limits>)
where
    Limits: Bounds<T>,
{
    queue(Limits {
        cap,
        max_bytes: usize::MAX,
    })
}

fn work<T>(d: &Drain<T, Limits>) -> Poll<Work<T>>
where
    Limits: Bounds<T>,
{
    d.poll_work(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn frames_come_out_in_order() {
    let (out, drain) = frames::<u32>(8);
    assert_eq!(work(&drain), Poll::Pending);
    out.push(1, SLOW).unwrap();
    out.push(2, SLOW).unwrap();
    assert_eq!(work(&drain), Poll::Ready(Work::Frame(1)));
    out.push(3, SLOW).unwrap();
    assert_eq!(drain.next_frame(), Some(2));
    assert_eq!(drain.next_frame(), Some(3));
    assert_eq!(drain.next_frame(), None);
    assert_eq!(work(&drain), Poll::Pending);
}

#[test]
fn a_drained_queue_gives_back_what_a_burst_took() {
    let (out, drain) = frames::<u32>(1024);
    for i in 0..1000 {
        out.push(i, SLOW).unwrap();
    }
    while drain.next_frame().is_some() {}
    assert_eq!(drain.shared.lock().frames.capacity(), KEEP_CAPACITY);
}

#[test]
fn a_ping_goes_after_the_queued_frames() {
    let (out, drain) = frames::<u32>(8);
    out.push(1, SLOW).unwrap();
    out.closer().ping();
    assert_eq!(work(&drain), Poll::Ready(Work::Frame(1)));
    assert_eq!(work(&drain), Poll::Ready(Work::Ping));
    assert_eq!(work(&drain), Poll::Pending);
}

/// A waker that counts its wakes.
struct Counted(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Counted {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_full_queue_kills_the_connection_once() {
    let (out, drain) = frames::<u32>(2);
    let wakes = Arc::new(Counted(Default::default()));
    let reader = Waker::from(Arc::clone(&wakes));
    assert_eq!(
        out.poll_killed(&mut Context::from_waker(&reader)),
        Poll::Pending
    );
    out.push(1, SLOW).unwrap();
    out.push(2, SLOW).unwrap();
    assert_eq!(out.push(3, SLOW), Err(Refused::Full));
    // The reader waiting on the kill is woken and sees it.
    assert_eq!(wakes.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(
        out.poll_killed(&mut Context::from_waker(&reader)),
        Poll::Ready(SLOW)
    );
    assert_eq!(out.push(4, SLOW), Err(Refused::Closing));
    assert_eq!(out.killed(), Some(SLOW));
    // The kill goes ahead of the queued frames.
    assert_eq!(work(&drain), Poll::Ready(Work::Kill(SLOW)));
    assert_eq!(drain.next_frame(), None);
    assert!(!drain.kill((1000, "later")), "only the first kill counts");
    assert_eq!(out.killed(), Some(SLOW));
}

#[test]
fn a_queue_over_its_bytes_kills_the_connection_and_frees_them() {
    let (out, drain) = queue::<Vec<u8>, _>(Limits {
        cap: 1024,
        max_bytes: 100,
    });
    // An empty queue takes one frame whatever its size.
    out.push(vec![0; 150], SLOW).unwrap();
    assert_eq!(work(&drain), Poll::Ready(Work::Frame(vec![0; 150])));
    drain.idle();
    out.push(vec![0; 60], SLOW).unwrap();
    out.push(vec![0; 40], SLOW).unwrap();
    assert_eq!(drain.shared.lock().bytes, 100);
    assert_eq!(out.push(vec![0; 1], SLOW), Err(Refused::Full));
    let s = drain.shared.lock();
    assert_eq!((s.frames.len(), s.frames.capacity(), s.bytes), (0, 0, 0));
    drop(s);
    assert_eq!(work(&drain), Poll::Ready(Work::Kill(SLOW)));
}

#[test]
fn taking_frames_gives_back_their_bytes() {
    let (out, drain) = queue::<Vec<u8>, _>(Limits {
        cap: 1024,
        max_bytes: 100,
    });
    drain.shared.lock().busy = true;
    for _ in 0..10 {
        out.push(vec![0; 50], SLOW).unwrap();
        out.push(vec![0; 50], SLOW).unwrap();
        assert!(drain.next_frame().is_some());
        assert!(drain.next_frame().is_some());
    }
    assert_eq!(drain.shared.lock().bytes, 0);
}

#[test]
fn close_follows_the_queued_frames_and_refuses_later_ones() {
    let (out, drain) = frames::<u32>(8);
    out.push(1, SLOW).unwrap();
    out.close((1008, "policy"));
    assert_eq!(out.push(2, SLOW), Err(Refused::Closing));
    assert_eq!(work(&drain), Poll::Ready(Work::Frame(1)));
    assert_eq!(work(&drain), Poll::Ready(Work::Close((1008, "policy"))));
}

#[test]
fn the_writer_ends_when_every_sender_is_gone() {
    let (out, drain) = frames::<u32>(8);
    let room = out.clone();
    drop(out);
    assert_eq!(work(&drain), Poll::Pending);
    room.push(7, SLOW).unwrap();
    drop(room);
    // What was queued is still written first.
    assert_eq!(work(&drain), Poll::Ready(Work::Frame(7)));
    assert_eq!(work(&drain), Poll::Ready(Work::End));
}

#[test]
fn only_an_idle_queue_offers_a_frame_for_writing_at_once() {
    let (out, drain) = frames::<u32>(8);
    // Written at once: nothing for the writer.
    out.push_or_write(1, SLOW, |_| Direct::Written).unwrap();
    assert_eq!(work(&drain), Poll::Pending);
    // Declined: queued as usual.
    out.push_or_write(2, SLOW, Direct::Declined).unwrap();
    // With a frame queued, the next is not offered: it cannot overtake.
    out.push_or_write(3, SLOW, |_| panic!("offered past a queued frame"))
        .unwrap();
    assert_eq!(work(&drain), Poll::Ready(Work::Frame(2)));
    assert_eq!(drain.next_frame(), Some(3));
    // Nor while the writer is at work, though the queue is empty: a
    // frame written now would overtake the ones it took.
    out.push_or_write(33, SLOW, |_| panic!("offered while the writer works"))
        .unwrap();
    assert_eq!(drain.next_frame(), Some(33));
    drain.idle();
    // Half written: the writer is asked to finish it, and until it has
    // begun, what follows waits in the queue (where the bound counts it),
    // not in the socket's own unsent bytes.
    out.push_or_write(4, SLOW, |_| Direct::Unflushed).unwrap();
    out.push_or_write(44, SLOW, |_| panic!("offered while a flush is owed"))
        .unwrap();
    assert_eq!(work(&drain), Poll::Ready(Work::Frame(44)));
    assert_eq!(work(&drain), Poll::Ready(Work::Flush));
    drain.idle();
    assert_eq!(work(&drain), Poll::Pending);
    // A closing connection takes nothing, not even at once.
    out.close((1000, "bye"));
    assert_eq!(
        out.push_or_write(5, SLOW, |_| panic!("offered while closing")),
        Err(Refused::Closing)
    );
}

/// Counts its wakes.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn held_frames_wake_no_writer_and_leave_together_when_released() {
    let (out, drain) = frames::<u32>(8);
    let wakes = Arc::new(Wakes(0.into()));
    let waker = Waker::from(Arc::clone(&wakes));
    let woken = || wakes.0.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        drain.poll_work(&mut Context::from_waker(&waker)),
        Poll::Pending
    );
    for f in 1..=3 {
        out.push_held(f, SLOW).unwrap();
    }
    assert_eq!(woken(), 0, "a held frame woke the writer");
    // Idle: all three handed to one write; the socket took two.
    let mut seen = Vec::new();
    out.release(|q| {
        seen.extend(q.drain(..2));
        true
    });
    assert_eq!(seen, vec![1, 2]);
    // The rest goes to the writer, with its bytes counted.
    assert_eq!(woken(), 1);
    assert_eq!(out.shared.lock().bytes, 10);
    assert_eq!(work(&drain), Poll::Ready(Work::Frame(3)));
    // While the writer is at work nothing is written around it.
    out.push_held(4, SLOW).unwrap();
    out.release(|_| panic!("written while the writer works"));
    assert_eq!(drain.next_frame(), Some(4));
    drain.idle();
    // All written but not flushed: the writer finishes it.
    out.push_held(5, SLOW).unwrap();
    out.release(|q| {
        q.clear();
        false
    });
    assert_eq!(work(&drain), Poll::Ready(Work::Flush));
    assert_eq!(out.shared.lock().bytes, 0);
    // Nothing held: nothing to do.
    out.release(|_| panic!("released an empty queue"));
}

#[test]
fn a_kill_from_the_writer_wakes_the_reader() {
    let (out, drain) = frames::<u32>(8);
    let cx = &mut Context::from_waker(Waker::noop());
    assert_eq!(out.poll_killed(cx), Poll::Pending);
    assert!(drain.kill((1006, "write failed")));
    assert_eq!(out.poll_killed(cx), Poll::Ready((1006, "write failed")));
    // The writer's kill did not count as a sender leaving.
    drop(out);
    assert_eq!(
        work(&drain),
        Poll::Ready(Work::Kill((1006, "write failed")))
    );
}
