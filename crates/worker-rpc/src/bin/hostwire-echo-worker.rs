//! A small worker for tests, benchmarks and the example: it speaks worker
//! RPC as NDJSON on stdin / stdout until the host says goodbye.
//!
//! Methods: `echo` (returns its params), `add` ({a, b} → a + b), `wait`
//! (sends progress, then waits until cancelled), `fail` (an error with a
//! cause); stream method `sum` (adds the numbers streamed to it).

use hostwire_worker_rpc::transport::stdio;
use hostwire_worker_rpc::{codes, Peer, PeerConfig, RpcError, Side};
use serde_json::{json, Value};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let peer = Peer::new(Side::Worker, stdio(), PeerConfig::default());
    peer.register("echo", |params, _ctx| async move { Ok(params) });
    peer.register("add", |p, _ctx| async move {
        match (p["a"].as_f64(), p["b"].as_f64()) {
            (Some(a), Some(b)) => Ok(json!(a + b)),
            _ => Err(RpcError::new("INVALID_PARAMS", "add needs numbers a and b")),
        }
    });
    peer.register("wait", |_p, ctx| async move {
        ctx.progress(json!({"stage": "waiting"}));
        ctx.cancel.cancelled().await;
        Err(RpcError::new(codes::CANCELLED, "cancelled"))
    });
    peer.register("fail", |_p, _ctx| async move {
        Err(RpcError::new("OUTER", "it failed").with_cause(RpcError::new("INNER", "because")))
    });
    peer.register_stream("sum", |_p, mut rx, _ctx| async move {
        let mut total = 0.0;
        while let Some(item) = rx.next().await {
            total += item?.as_f64().unwrap_or(0.0);
        }
        Ok(Value::from(total))
    });
    let why = peer.wait_closed().await;
    eprintln!("worker: closed: {why}");
}
