//! Round-trip calls per second and stream throughput, over the in-memory
//! and child-process transports, with a bare channel ping-pong of the same
//! frame text as the floor measured in the same run.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hostwire_worker_rpc::transport::{memory_pair, spawn_worker};
use hostwire_worker_rpc::{Peer, PeerConfig, Side};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

const BATCH: u64 = 100;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn memory_peers(rt: &Runtime) -> (Peer, Peer) {
    rt.block_on(async {
        let (a, b) = memory_pair();
        let host = Peer::new(Side::Host, a, PeerConfig::default());
        let worker = Peer::new(Side::Worker, b, PeerConfig::default());
        worker.register("echo", |p, _| async move { Ok(p) });
        worker.register_stream("sum", |_, mut rx, _| async move {
            let mut n = 0u64;
            while let Some(v) = rx.next().await {
                v?;
                n += 1;
            }
            Ok(json!(n))
        });
        host.ready().await.unwrap();
        (host, worker)
    })
}

fn child_peer(rt: &Runtime) -> (Peer, tokio::process::Child) {
    rt.block_on(async {
        let cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostwire-echo-worker"));
        let (t, child) = spawn_worker(cmd).unwrap();
        let host = Peer::new(Side::Host, t, PeerConfig::default());
        host.ready().await.unwrap();
        (host, child)
    })
}

fn params() -> Value {
    json!({"itemId": "q-12", "answer": ["b", "d"], "n": 42})
}

fn calls(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("round_trip_calls");
    g.throughput(Throughput::Elements(BATCH));
    let (host, _worker) = memory_peers(&rt);
    g.bench_function("memory, sequential", |b| {
        b.to_async(&rt).iter(|| async {
            for _ in 0..BATCH {
                host.call("echo", params()).await.unwrap();
            }
        })
    });
    g.bench_function("memory, 100 concurrent", |b| {
        b.to_async(&rt).iter(|| async {
            let calls: Vec<_> = (0..BATCH).map(|_| host.call("echo", params())).collect();
            for c in calls {
                c.await.unwrap();
            }
        })
    });
    // The floor: the same request and response text through two channels,
    // with no peer (no parsing, no bookkeeping).
    let req =
        json!({"v": "1.0.0", "kind": "request", "id": 1, "method": "echo", "params": params()})
            .to_string();
    let resp = json!({"v": "1.0.0", "kind": "response", "id": 1, "ok": true, "result": params()})
        .to_string();
    let (to_w, mut w_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (to_h, h_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let h_rx = std::sync::Arc::new(tokio::sync::Mutex::new(h_rx));
    rt.spawn(async move {
        while let Some(_m) = w_rx.recv().await {
            let _ = to_h.send(resp.clone());
        }
    });
    g.bench_function("baseline: channel ping-pong of the same text", |b| {
        b.to_async(&rt).iter(|| async {
            let mut rx = h_rx.lock().await;
            for _ in 0..BATCH {
                to_w.send(req.clone()).unwrap();
                rx.recv().await.unwrap();
            }
        })
    });
    let (child_host, _child) = child_peer(&rt);
    g.bench_function("child process, sequential", |b| {
        b.to_async(&rt).iter(|| async {
            for _ in 0..BATCH {
                child_host.call("echo", params()).await.unwrap();
            }
        })
    });
    g.bench_function("child process, 100 concurrent", |b| {
        b.to_async(&rt).iter(|| async {
            let calls: Vec<_> = (0..BATCH)
                .map(|_| child_host.call("echo", params()))
                .collect();
            for c in calls {
                c.await.unwrap();
            }
        })
    });
    g.finish();
}

fn streams(c: &mut Criterion) {
    let rt = runtime();
    const CHUNKS: u64 = 1000;
    let chunk = json!("x".repeat(1024));
    let mut g = c.benchmark_group("stream_throughput_1kb_chunks");
    g.throughput(Throughput::Elements(CHUNKS));
    let (host, _worker) = memory_peers(&rt);
    g.bench_function("memory", |b| {
        b.to_async(&rt).iter(|| async {
            let mut tx = host.open_stream("sum", Value::Null);
            for _ in 0..CHUNKS {
                tx.send(chunk.clone()).await.unwrap();
            }
            tx.finish().await.unwrap();
        })
    });
    let (child_host, _child) = child_peer(&rt);
    g.bench_function("child process", |b| {
        b.to_async(&rt).iter(|| async {
            let mut tx = child_host.open_stream("sum", Value::Null);
            for _ in 0..CHUNKS {
                tx.send(chunk.clone()).await.unwrap();
            }
            tx.finish().await.unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, calls, streams);
criterion_main!(benches);
