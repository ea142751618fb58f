//! Property: any interleaving of concurrent calls, cancels and responses
//! resolves every call exactly once and leaves nothing pending.

use hostwire_worker_rpc::transport::memory_pair;
use hostwire_worker_rpc::{codes, Call, Peer, PeerConfig, Side};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

#[derive(Debug, Clone)]
enum Op {
    /// The handler of call i answers.
    Respond(usize),
    /// The caller cancels call i.
    Cancel(usize),
    /// The caller drops call i.
    Drop(usize),
    /// The caller awaits call i (only once it was answered).
    Await(usize),
    /// Let the tasks run a little.
    Yield(u8),
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..n).prop_map(Op::Respond),
        (0..n).prop_map(Op::Cancel),
        (0..n).prop_map(Op::Drop),
        (0..n).prop_map(Op::Await),
        (1u8..8).prop_map(Op::Yield),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum Resolution {
    Answered(Value),
    Cancelled,
}

type Gates = Arc<Mutex<HashMap<i64, oneshot::Sender<()>>>>;

async fn run(n: usize, ops: Vec<Op>) {
    let (a, b) = memory_pair();
    let host = Peer::new(Side::Host, a, PeerConfig::default());
    let worker = Peer::new(Side::Worker, b, PeerConfig::default());
    let gates: Gates = Arc::default();
    let finished = Arc::new(Mutex::new(Vec::<i64>::new()));
    let (g, f) = (Arc::clone(&gates), Arc::clone(&finished));
    worker.register("task", move |p, ctx| {
        let i = p.parse::<i64>().unwrap();
        let (tx, rx) = oneshot::channel();
        g.lock().unwrap().insert(i, tx);
        let f = Arc::clone(&f);
        async move {
            let out = tokio::select! {
                _ = rx => Ok(json!(i)),
                _ = ctx.cancel.cancelled() => Err(hostwire_worker_rpc::RpcError::new(codes::CANCELLED, "cancelled")),
            };
            f.lock().unwrap().push(i);
            out
        }
    });
    let mut calls: Vec<Option<Call>> = (0..n).map(|i| Some(host.call("task", json!(i)))).collect();
    let mut resolved: Vec<Vec<Resolution>> = vec![Vec::new(); n];
    let mut responded = vec![false; n];
    for op in ops {
        match op {
            Op::Respond(i) => {
                // The handler may not have started yet: let it.
                for _ in 0..50 {
                    if gates.lock().unwrap().contains_key(&(i as i64)) || responded[i] {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                if let Some(gate) = gates.lock().unwrap().remove(&(i as i64)) {
                    let _ = gate.send(());
                    responded[i] = true;
                }
            }
            Op::Cancel(i) => {
                if let Some(c) = calls[i].take() {
                    c.cancel();
                    resolved[i].push(Resolution::Cancelled);
                }
            }
            Op::Drop(i) => {
                if calls[i].take().is_some() {
                    resolved[i].push(Resolution::Cancelled);
                }
            }
            Op::Await(i) => {
                if responded[i] {
                    if let Some(c) = calls[i].take() {
                        let r = c.await;
                        // Answered, or cancelled first by the handler side.
                        resolved[i].push(match r {
                            Ok(v) => Resolution::Answered(v.to_value().unwrap()),
                            Err(e) => panic!("call {i} failed: {e}"),
                        });
                    }
                }
            }
            Op::Yield(k) => {
                for _ in 0..k {
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    // Answer everything still open, then await the rest.
    for _ in 0..200 {
        let all_started = (0..n).all(|i| {
            responded[i]
                || gates.lock().unwrap().contains_key(&(i as i64))
                || finished.lock().unwrap().contains(&(i as i64))
        });
        if all_started {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Calls still open are answered; a cancelled call's handler must end
    // through its cancellation alone.
    let mut held = Vec::new();
    for (i, gate) in gates.lock().unwrap().drain() {
        if calls[i as usize].is_some() {
            let _ = gate.send(());
        } else {
            held.push(gate);
        }
    }
    for (i, c) in calls.iter_mut().enumerate() {
        if let Some(c) = c.take() {
            match c.await {
                Ok(v) => resolved[i].push(Resolution::Answered(v.to_value().unwrap())),
                Err(e) => panic!("call {i} failed: {e}"),
            }
        }
    }
    for (i, r) in resolved.iter().enumerate() {
        assert_eq!(r.len(), 1, "call {i} resolved {r:?}");
        if let Resolution::Answered(v) = &r[0] {
            assert_eq!(v, &json!(i));
        }
    }
    // Every handler ran to its end once, and nothing is left on either side.
    for _ in 0..1000 {
        if host.pending() + worker.pending() == 0 && finished.lock().unwrap().len() == n {
            break;
        }
        tokio::task::yield_now().await;
    }
    let mut f = finished.lock().unwrap().clone();
    f.sort();
    assert_eq!(f, (0..n as i64).collect::<Vec<_>>());
    assert_eq!(host.pending() + worker.pending(), 0);
    drop(held);
    let s = host.stats();
    assert_eq!(
        (s.duplicate_responses, s.unknown_ids, s.protocol_errors),
        (0, 0, 0),
        "{s:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn every_call_resolves_exactly_once(n in 1usize..10, seed_ops in proptest::collection::vec(op(10), 0..60)) {
        let ops: Vec<Op> = seed_ops
            .into_iter()
            .map(|o| match o {
                Op::Respond(i) => Op::Respond(i % n),
                Op::Cancel(i) => Op::Cancel(i % n),
                Op::Drop(i) => Op::Drop(i % n),
                Op::Await(i) => Op::Await(i % n),
                y => y,
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(n, ops));
    }
}
