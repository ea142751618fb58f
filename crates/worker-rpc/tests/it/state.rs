//! The rules of a connection, on `PeerState` alone: two states wired in
//! memory, frames moved by hand, time a number the test chooses (no tokio,
//! no sleeps).

use hostwire_worker_rpc::frame::{parse_frame, Frame, Outcome, Payload};
use hostwire_worker_rpc::{codes, RpcError};
use hostwire_worker_rpc::{Event, PeerConfig, PeerState, Side};
use serde_json::json;

/// Every frame `from` has queued, delivered to `to` at `now`.
fn pump(from: &mut PeerState, to: &mut PeerState, now: u64) -> usize {
    let mut n = 0;
    while let Some(t) = from.poll_transmit() {
        to.handle_bytes(t.text.as_bytes(), now);
        n += 1;
    }
    n
}

fn frames(s: &mut PeerState) -> Vec<Frame> {
    std::iter::from_fn(|| s.poll_transmit())
        .map(|t| parse_frame(&t.text).unwrap())
        .collect()
}

fn events(s: &mut PeerState) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn send(s: &mut PeerState, v: serde_json::Value, now: u64) {
    s.handle_bytes(v.to_string().as_bytes(), now);
}

fn p(v: serde_json::Value) -> Payload {
    Payload::from(&v)
}

/// A host and a worker that have said hello to each other.
fn pair(config: PeerConfig) -> (PeerState, PeerState) {
    let mut host = PeerState::new(Side::Host, config.clone());
    let mut worker = PeerState::new(Side::Worker, config);
    pump(&mut host, &mut worker, 0);
    pump(&mut worker, &mut host, 0);
    assert_eq!(events(&mut host), vec![Event::Ready]);
    assert_eq!(events(&mut worker), vec![Event::Ready]);
    (host, worker)
}

fn error_code(e: &Event) -> Option<&str> {
    match e {
        Event::Response { result: Err(e), .. } => Some(e.code.as_str()),
        _ => None,
    }
}

#[test]
fn a_call_past_its_deadline_ends_with_timeout_and_a_cancel_and_not_before() {
    let (mut host, mut worker) = pair(PeerConfig::default());
    let id = host.call("slow", p(json!(1)), false, Some(1_000)).unwrap();
    pump(&mut host, &mut worker, 10);
    assert!(
        matches!(&events(&mut worker)[..], [Event::Request { method, .. }] if method == "slow")
    );
    assert_eq!(host.poll_timeout(), Some(1_000));
    host.handle_timeout(999);
    assert_eq!(events(&mut host), vec![]);
    host.handle_timeout(1_000);
    let ev = events(&mut host);
    assert_eq!(
        ev.iter().filter_map(error_code).collect::<Vec<_>>(),
        [codes::TIMEOUT]
    );
    assert_eq!(host.poll_timeout(), None);
    // The worker is told to stop; its late answer is expected and dropped.
    pump(&mut host, &mut worker, 1_001);
    assert_eq!(events(&mut worker), vec![Event::Cancelled { id }]);
    assert!(worker.respond(id, Ok(p(json!("late")))));
    let answer = frames(&mut worker);
    let [Frame::Response {
        outcome: Outcome::Err(e),
        ..
    }] = &answer[..]
    else {
        panic!("{answer:?}")
    };
    assert_eq!(e.code, codes::CANCELLED);
    host.handle_frame(answer.into_iter().next().unwrap(), 1_002);
    assert_eq!(events(&mut host), vec![]);
    assert_eq!(host.stats().responses_after_cancel, 1);
    assert_eq!(host.stats().protocol_errors, 0);
    assert_eq!((host.pending(), worker.pending()), (0, 0));
}

#[test]
fn a_cancelled_call_is_answered_cancelled_and_only_once() {
    let (mut host, mut worker) = pair(PeerConfig::default());
    let id = host.call("work", p(json!(null)), false, None).unwrap();
    pump(&mut host, &mut worker, 0);
    events(&mut worker);
    assert!(host.cancel(id, "the user left"));
    assert!(!host.cancel(id, "again"), "a call is cancelled once");
    assert_eq!(
        events(&mut host)
            .iter()
            .filter_map(error_code)
            .collect::<Vec<_>>(),
        [codes::CANCELLED]
    );
    pump(&mut host, &mut worker, 0);
    assert_eq!(events(&mut worker), vec![Event::Cancelled { id }]);
    assert!(
        worker.progress(id, p(json!(50))).is_err(),
        "no progress after cancel"
    );
    assert!(worker.respond(id, Ok(p(json!("done")))));
    assert!(!worker.respond(id, Ok(p(json!("twice")))), "answered once");
    let out = frames(&mut worker);
    let [Frame::Response {
        outcome: Outcome::Err(e),
        ..
    }] = &out[..]
    else {
        panic!("{out:?}")
    };
    assert_eq!(e.code, codes::CANCELLED, "not the handler's late result");
    host.handle_frame(out.into_iter().next().unwrap(), 0);
    assert_eq!(host.stats().responses_after_cancel, 1);
}

#[test]
fn stream_credit_bounds_the_sender_and_acks_grant_more() {
    let config = PeerConfig {
        stream_window: 2,
        ..PeerConfig::default()
    };
    let (mut host, mut worker) = pair(config);
    let id = host.call("upload", p(json!(null)), true, None).unwrap();
    // No credit until the receiver grants its window.
    assert_eq!(host.credit(id).unwrap(), 0);
    assert!(!host.send_chunk(id, &p(json!(0))).unwrap());
    pump(&mut host, &mut worker, 0);
    assert!(matches!(
        &events(&mut worker)[..],
        [Event::Request { stream: true, .. }]
    ));
    worker.accept_stream(id);
    pump(&mut worker, &mut host, 0);
    assert_eq!(events(&mut host), vec![Event::Credit { id }]);
    assert_eq!(host.credit(id).unwrap(), 2);
    assert!(host.send_chunk(id, &p(json!(1))).unwrap());
    assert!(host.send_chunk(id, &p(json!(2))).unwrap());
    assert!(
        !host.send_chunk(id, &p(json!(3))).unwrap(),
        "the window is spent"
    );
    pump(&mut host, &mut worker, 0);
    assert_eq!(
        events(&mut worker),
        vec![
            Event::Chunk {
                id,
                seq: 1,
                data: p(json!(1))
            },
            Event::Chunk {
                id,
                seq: 2,
                data: p(json!(2))
            },
        ]
    );
    worker.ack(id, 2, 1);
    pump(&mut worker, &mut host, 0);
    assert_eq!(host.credit(id).unwrap(), 1);
    assert!(host.send_chunk(id, &p(json!(3))).unwrap());
    host.end_stream(id, Ok(())).unwrap();
    pump(&mut host, &mut worker, 0);
    let ev = events(&mut worker);
    assert_eq!(
        ev.last(),
        Some(&Event::StreamEnd { id, result: Ok(()) }),
        "{ev:?}"
    );
    assert!(worker.respond(id, Ok(p(json!(3)))));
    pump(&mut worker, &mut host, 0);
    assert!(events(&mut host).contains(&Event::Response {
        id,
        result: Ok(p(json!(3)))
    }));
    assert!(host.credit(id).is_err(), "the stream is over");
    assert_eq!(worker.stats().credit_violations, 0);
}

#[test]
fn a_chunk_beyond_the_credit_ends_the_stream_with_stream_credit_exceeded() {
    let config = PeerConfig {
        stream_window: 2,
        ..PeerConfig::default()
    };
    let (_, mut worker) = pair(config);
    let open = json!({"v": "1.0.0", "kind": "stream-open", "id": 7, "method": "upload"});
    send(&mut worker, open, 0);
    worker.accept_stream(7);
    frames(&mut worker);
    for seq in 1..=3 {
        send(
            &mut worker,
            json!({"v": "1.0.0", "kind": "stream-chunk", "id": 7, "seq": seq, "data": seq}),
            0,
        );
    }
    let ev = events(&mut worker);
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, Event::Chunk { .. }))
            .count(),
        2,
        "{ev:?}"
    );
    assert!(ev.iter().any(|e| matches!(e, Event::StreamEnd { result: Err(e), .. } if e.code == codes::STREAM_CREDIT_EXCEEDED)));
    let out = frames(&mut worker);
    let [Frame::Response {
        id: 7,
        outcome: Outcome::Err(e),
        ..
    }] = &out[..]
    else {
        panic!("{out:?}")
    };
    assert_eq!(e.code, codes::STREAM_CREDIT_EXCEEDED);
    assert_eq!(worker.stats().credit_violations, 1);
    // The handler's own answer comes too late: the peer already has one.
    assert!(!worker.respond(7, Ok(p(json!(2)))));
    assert!(frames(&mut worker).is_empty());
}

#[test]
fn goodbye_ends_every_call_on_both_sides_and_nothing_follows_it() {
    let (mut host, mut worker) = pair(PeerConfig::default());
    let mine = host.call("a", p(json!(1)), false, Some(5_000)).unwrap();
    let served = worker.call("b", p(json!(2)), false, None).unwrap();
    pump(&mut host, &mut worker, 0);
    pump(&mut worker, &mut host, 0);
    events(&mut host);
    events(&mut worker);
    host.goodbye("shutting down");
    let ev = events(&mut host);
    assert!(ev.contains(&Event::Cancelled { id: served }), "{ev:?}");
    assert_eq!(
        ev.iter().filter_map(error_code).collect::<Vec<_>>(),
        [codes::GOODBYE]
    );
    assert!(matches!(ev.last(), Some(Event::Closed(e)) if e.code == codes::GOODBYE));
    // Nothing is sent after the goodbye, and no timer is left.
    assert!(!host.respond(served, Ok(p(json!("late")))));
    assert!(host.call("c", p(json!(3)), false, None).is_err());
    assert_eq!(host.poll_timeout(), None);
    let out = frames(&mut host);
    assert!(matches!(&out[..], [Frame::Goodbye { .. }]), "{out:?}");
    worker.handle_frame(out.into_iter().next().unwrap(), 1);
    let ev = events(&mut worker);
    assert!(ev.contains(&Event::Cancelled { id: mine }), "{ev:?}");
    assert_eq!(
        ev.iter().filter_map(error_code).collect::<Vec<_>>(),
        [codes::PEER_GOODBYE]
    );
    assert_eq!((host.pending(), worker.pending()), (0, 0));
}

#[test]
fn frames_before_the_peers_hello_are_held_and_bounded() {
    let config = PeerConfig {
        max_held_frames: 2,
        ..PeerConfig::default()
    };
    let mut worker = PeerState::new(Side::Worker, config);
    assert!(matches!(&frames(&mut worker)[..], [Frame::Hello { .. }]));
    worker.call("a", p(json!(1)), false, None).unwrap();
    worker.call("b", p(json!(2)), false, None).unwrap();
    assert!(
        frames(&mut worker).is_empty(),
        "held until the peer's hello"
    );
    assert!(
        worker.queued_bytes() > 0,
        "held frames count against the outbound bytes"
    );
    let e = worker.call("c", p(json!(3)), false, None);
    assert!(e.is_ok(), "the call itself starts; the connection ends");
    let out = frames(&mut worker);
    let [Frame::Goodbye { error: Some(e), .. }] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(e.code, codes::PROTOCOL_ERROR);
    assert_eq!(worker.closed().unwrap().code, codes::PROTOCOL_ERROR);
    assert_eq!(worker.queued_bytes(), 0);
}

#[test]
fn a_peer_that_never_says_hello_is_served_when_told_not_to_wait() {
    let config = PeerConfig {
        await_peer_hello: false,
        ..PeerConfig::default()
    };
    let mut server = PeerState::new(Side::Host, config);
    assert!(server.is_ready());
    send(
        &mut server,
        json!({"v": "1.0.0", "kind": "request", "id": 3, "method": "hello"}),
        0,
    );
    assert!(server.respond(3, Ok(p(json!({"ok": true})))));
    let out = frames(&mut server);
    assert!(
        matches!(
            &out[..],
            [Frame::Hello { .. }, Frame::Response { id: 3, .. }]
        ),
        "{out:?}"
    );
}

#[test]
fn calls_in_flight_are_bounded_both_ways() {
    let config = PeerConfig {
        max_inbound_calls: 1,
        max_outbound_calls: 1,
        ..PeerConfig::default()
    };
    let (mut host, mut worker) = pair(config);
    host.call("a", p(json!(1)), false, None).unwrap();
    let e = host.call("b", p(json!(2)), false, None).unwrap_err();
    assert_eq!(e.code, codes::TOO_MANY_CALLS);
    pump(&mut host, &mut worker, 0);
    events(&mut worker);
    send(
        &mut worker,
        json!({"v": "1.0.0", "kind": "request", "id": 9, "method": "x"}),
        0,
    );
    let out = frames(&mut worker);
    let [Frame::Response {
        id: 9,
        outcome: Outcome::Err(e),
        ..
    }] = &out[..]
    else {
        panic!("{out:?}")
    };
    assert_eq!(e.code, codes::TOO_MANY_CALLS);
    assert_eq!(worker.stats().calls_refused, 1);
    // A duplicate of an id in flight is dropped, not answered.
    send(
        &mut worker,
        json!({"v": "1.0.0", "kind": "request", "id": 1, "method": "a"}),
        0,
    );
    assert!(frames(&mut worker).is_empty());
    assert_eq!(worker.stats().duplicate_ids, 1);
}

#[test]
fn a_request_of_another_major_is_answered_and_a_malformed_one_names_its_field() {
    let (_, mut worker) = pair(PeerConfig::default());
    send(
        &mut worker,
        json!({"v": "2.0.0", "kind": "request", "id": 4, "method": "x"}),
        0,
    );
    send(
        &mut worker,
        json!({"v": "1.0.0", "kind": "request", "id": 5, "method": 3}),
        0,
    );
    let out = frames(&mut worker);
    let codes_and_messages: Vec<(String, String)> = out
        .iter()
        .map(|f| match f {
            Frame::Response {
                outcome: Outcome::Err(e),
                ..
            } => (e.code.clone(), e.message.clone()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(codes_and_messages[0].0, codes::VERSION_MISMATCH);
    assert_eq!(codes_and_messages[1].0, codes::PROTOCOL_ERROR);
    assert!(
        codes_and_messages[1].1.contains("method"),
        "{codes_and_messages:?}"
    );
    assert!(worker.closed().is_none());
}

mod every_call_ends {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        /// The host calls, with a deadline `after` ms from now (or none).
        Call(Option<u64>),
        /// The host cancels its n-th call.
        Cancel(usize),
        /// The host moves its n-th call's deadline to `after` ms from now.
        Move(usize, u64),
        /// The worker answers its n-th request.
        Answer(usize),
        /// Frames in flight are delivered.
        Deliver,
        /// Time passes.
        Wait(u64),
        /// A side says goodbye.
        Goodbye(bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => proptest::option::of(1u64..5_000).prop_map(Op::Call),
            1 => (0usize..8).prop_map(Op::Cancel),
            1 => (0usize..8, 1u64..5_000).prop_map(|(n, a)| Op::Move(n, a)),
            2 => (0usize..8).prop_map(Op::Answer),
            3 => Just(Op::Deliver),
            2 => (0u64..3_000).prop_map(Op::Wait),
            1 => any::<bool>().prop_map(Op::Goodbye),
        ]
    }

    /// Responses each of the host's calls got.
    fn ended(host: &mut PeerState, ends: &mut HashMap<u64, usize>) {
        for e in events(host) {
            if let Event::Response { id, .. } = e {
                *ends.entry(id).or_default() += 1;
            }
        }
    }

    proptest! {
        #[test]
        fn every_call_ends_exactly_once_on_a_manual_clock(ops in proptest::collection::vec(op(), 0..60)) {
            let (mut host, mut worker) = pair(PeerConfig::default());
            let (mut now, mut calls, mut served) = (0u64, Vec::new(), Vec::new());
            let mut ends: HashMap<u64, usize> = HashMap::new();
            for op in ops {
                match op {
                    Op::Call(after) => {
                        if let Ok(id) = host.call("m", p(json!(null)), false, after.map(|a| now + a)) {
                            calls.push(id);
                        }
                    }
                    Op::Cancel(n) => {
                        if let Some(id) = calls.get(n) {
                            host.cancel(*id, "test");
                        }
                    }
                    Op::Move(n, after) => {
                        if let Some(id) = calls.get(n) {
                            host.set_deadline(*id, now + after);
                        }
                    }
                    Op::Answer(n) => {
                        if let Some(id) = served.get(n) {
                            worker.respond(*id, Ok(p(json!(n))));
                        }
                    }
                    Op::Deliver => {
                        pump(&mut host, &mut worker, now);
                        pump(&mut worker, &mut host, now);
                    }
                    Op::Wait(ms) => {
                        now += ms;
                        if host.poll_timeout().is_some_and(|t| t <= now) {
                            host.handle_timeout(now);
                        }
                    }
                    Op::Goodbye(host_side) => {
                        if host_side { host.goodbye("bye") } else { worker.goodbye("bye") }
                    }
                }
                for e in events(&mut worker) {
                    if let Event::Request { id, .. } = e {
                        served.push(id);
                    }
                }
                ended(&mut host, &mut ends);
                // No deadline is left in the past.
                prop_assert!(host.poll_timeout().is_none_or(|t| t > now));
            }
            // The end: the worker answers all, frames flow, time passes
            // every deadline; whatever is left ends with the connection.
            for id in served.clone() {
                worker.respond(id, Ok(p(json!("late"))));
            }
            pump(&mut worker, &mut host, now);
            pump(&mut host, &mut worker, now);
            pump(&mut worker, &mut host, now);
            ended(&mut host, &mut ends);
            if let Some(t) = host.poll_timeout() {
                host.handle_timeout(t);
            }
            host.close(RpcError::new(codes::TRANSPORT_CLOSED, "end of test"));
            ended(&mut host, &mut ends);
            for id in &calls {
                prop_assert_eq!(ends.get(id).copied(), Some(1), "call {} of {:?}", id, ends);
            }
            prop_assert_eq!(ends.len(), calls.len());
            prop_assert_eq!(host.pending(), 0);
            // No deadline outlives its call.
            prop_assert_eq!(host.poll_timeout(), None);
        }
    }
}
