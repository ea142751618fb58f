//! Property: under any interleaving of valid and malformed frames from a
//! hostile peer, every call ends, and ends the way the rules say: answered,
//! failed with `PROTOCOL_ERROR` by a malformed answer whose id can be read,
//! cancelled by its caller, or failed with `TRANSPORT_CLOSED` when the peer
//! goes away. Every request of the peer gets exactly one answer, an error
//! for a malformed one.

use futures_util::{SinkExt, StreamExt};
use hostwire_worker_rpc::frame::{parse_frame_bytes, Frame, Outcome, MAX_HEAD_BYTES};
use hostwire_worker_rpc::transport::{Inbound, Transport};
use hostwire_worker_rpc::{codes, Call, Peer, PeerConfig, Side};
use proptest::prelude::*;
use std::collections::HashMap;
use std::io;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    /// A valid answer to call i.
    Answer(usize),
    /// A malformed answer to call i, of the given variant.
    Malformed(usize, u8),
    /// Valid progress for call i.
    Progress(usize),
    /// A frame with no id to read.
    Garbage(u8),
    /// A response to an id never issued.
    Unknown,
    /// The caller drops call i.
    Drop(usize),
    /// The peer sends a request of its own, valid or not.
    Request(bool),
    Yield(u8),
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..n).prop_map(Op::Answer),
        3 => (0..n, 0u8..7).prop_map(|(i, v)| Op::Malformed(i, v)),
        1 => (0..n).prop_map(Op::Progress),
        2 => (0u8..5).prop_map(Op::Garbage),
        1 => Just(Op::Unknown),
        1 => (0..n).prop_map(Op::Drop),
        2 => any::<bool>().prop_map(Op::Request),
        2 => (1u8..6).prop_map(Op::Yield),
    ]
}

/// A malformed answer to `id`: each one's id can be read.
fn malformed(id: u64, variant: u8) -> Inbound {
    let text = match variant {
        0 => format!(
            r#"{{"v":"1.0.0","kind":"response","id":{id},"ok":false,"error":{{"name":"Error","message":"m"}}}}"#
        ),
        1 => format!(r#"{{"v":"1.0.0","kind":"response","id":{id},"ok":"yes"}}"#),
        2 => format!(
            r#"{{"v":"1.0.0","kind":"response","id":{id},"ok":true,"result":{}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        ),
        3 => {
            let mut b =
                format!(r#"{{"v":"1.0.0","kind":"response","id":{id},"ok":true,"result":""#)
                    .into_bytes();
            b.extend_from_slice(b"\xff\xfe\"}");
            return Inbound::Frame(b);
        }
        4 => {
            let head = format!(
                r#"{{"v":"1.0.0","kind":"response","id":{id},"ok":true,"result":"{}"#,
                "x".repeat(MAX_HEAD_BYTES)
            );
            return Inbound::Oversize {
                head: head.into_bytes(),
                size: 1 << 30,
            };
        }
        5 => format!(r#"{{"v":"1.0.0","kind":"progress","id":{id}}}"#),
        _ => format!(r#"{{"v":"1.0.0","kind":"response","id":{id},"ok":true,"result":1e400"#),
    };
    Inbound::Frame(text.into_bytes())
}

fn garbage(variant: u8) -> Inbound {
    Inbound::Frame(match variant {
        0 => b"not json".to_vec(),
        1 => br#"{"v":"1.0.0","kind":"response"}"#.to_vec(),
        2 => b"[1,2,3]".to_vec(),
        3 => b"\xff\xff\xff".to_vec(),
        _ => br#"{"v":"1.0.0","kind":"response","id":"seven","ok":true}"#.to_vec(),
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Answered(u64),
    ProtocolError,
    Dropped,
    Closed,
}

async fn run(n: usize, ops: Vec<Op>) {
    let (to_host, host_in) = futures_channel::mpsc::unbounded::<Inbound>();
    let (host_out, mut from_host) = futures_channel::mpsc::unbounded::<String>();
    let transport = Transport {
        reader: Box::pin(host_in.map(Ok::<_, io::Error>)),
        writer: Box::pin(host_out.sink_map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e))),
    };
    let host = Peer::new(Side::Host, transport, PeerConfig::default());
    host.register("echo", |p, _| async move { Ok(p) });
    let send = |f: Inbound| to_host.unbounded_send(f).unwrap();
    let text = |s: String| Inbound::Frame(s.into_bytes());
    send(text(r#"{"v":"1.0.0","kind":"hello"}"#.into()));
    let mut calls: Vec<Option<Call>> = (0..n)
        .map(|i| Some(host.call("task", serde_json::json!(i))))
        .collect();
    let ids: Vec<u64> = calls.iter().map(|c| c.as_ref().unwrap().id()).collect();
    let mut expect: Vec<Option<Expect>> = vec![None; n];
    let mut requests: HashMap<u64, bool> = HashMap::new();
    let mut next_request = 1_000_000u64;
    for op in ops {
        match op {
            Op::Answer(i) => {
                send(text(format!(
                    r#"{{"v":"1.0.0","kind":"response","id":{},"ok":true,"result":{i}}}"#,
                    ids[i]
                )));
                expect[i].get_or_insert(Expect::Answered(i as u64));
            }
            Op::Malformed(i, v) => {
                send(malformed(ids[i], v));
                expect[i].get_or_insert(Expect::ProtocolError);
            }
            Op::Progress(i) => send(text(format!(
                r#"{{"v":"1.0.0","kind":"progress","id":{},"progress":{i}}}"#,
                ids[i]
            ))),
            Op::Garbage(v) => send(garbage(v)),
            Op::Unknown => send(text(
                r#"{"v":"1.0.0","kind":"response","id":999999,"ok":true}"#.into(),
            )),
            Op::Drop(i) => {
                if calls[i].take().is_some() {
                    expect[i].get_or_insert(Expect::Dropped);
                }
            }
            Op::Request(valid) => {
                next_request += 1;
                let id = next_request;
                requests.insert(id, valid);
                send(text(if valid {
                    format!(
                        r#"{{"v":"1.0.0","kind":"request","id":{id},"method":"echo","params":{id}}}"#
                    )
                } else {
                    format!(r#"{{"v":"1.0.0","kind":"request","id":{id},"method":7}}"#)
                }));
            }
            Op::Yield(k) => {
                for _ in 0..k {
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    // Let the host answer the peer's requests, then the peer goes away.
    let mut answers: HashMap<u64, Vec<bool>> = HashMap::new();
    let wanted = requests.len();
    let mut got = 0;
    while got < wanted {
        let line = tokio::time::timeout(Duration::from_secs(60), from_host.next())
            .await
            .expect("the host answers every request")
            .expect("open");
        if let Ok(Frame::Response { id, outcome, .. }) = parse_frame_bytes(line.as_bytes()) {
            if requests.contains_key(&id) {
                got += 1;
                answers
                    .entry(id)
                    .or_default()
                    .push(matches!(outcome, Outcome::Ok(_)));
            }
        }
    }
    drop(to_host);
    for (i, c) in calls.iter_mut().enumerate() {
        let Some(c) = c.take() else { continue };
        // A hang would show here: with time paused, the minute passes at once.
        let r = tokio::time::timeout(Duration::from_secs(60), c)
            .await
            .unwrap_or_else(|_| panic!("call {i} never ended"));
        let want = expect[i].clone().unwrap_or(Expect::Closed);
        match (&want, &r) {
            (Expect::Answered(v), Ok(p)) => assert_eq!(p.get(), v.to_string()),
            (Expect::ProtocolError, Err(e)) => assert_eq!(e.code, codes::PROTOCOL_ERROR, "{e}"),
            (Expect::Closed, Err(e)) => assert_eq!(e.code, codes::TRANSPORT_CLOSED, "{e}"),
            _ => panic!("call {i}: expected {want:?}, got {r:?}"),
        }
    }
    for (id, valid) in &requests {
        assert_eq!(answers.get(id), Some(&vec![*valid]), "request {id}");
    }
    host.wait_closed().await;
    assert_eq!(host.pending(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn every_call_ends_as_the_rules_say(n in 1usize..8, seed_ops in proptest::collection::vec(op(8), 0..50)) {
        let ops: Vec<Op> = seed_ops
            .into_iter()
            .map(|o| match o {
                Op::Answer(i) => Op::Answer(i % n),
                Op::Malformed(i, v) => Op::Malformed(i % n, v),
                Op::Progress(i) => Op::Progress(i % n),
                Op::Drop(i) => Op::Drop(i % n),
                y => y,
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(run(n, ops));
    }
}
