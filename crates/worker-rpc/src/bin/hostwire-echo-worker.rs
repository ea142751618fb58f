//! A small worker for tests, benchmarks and the example: it speaks worker
//! RPC as NDJSON on stdin / stdout until the host says goodbye (or the
//! connection fails), flushes its last frame, and exits.
//!
//! Methods: `echo` (returns its params unchanged, byte for byte), `add`
//! ({a, b} → a + b), `wait` (sends progress, then waits until cancelled),
//! `fail` (an error with a cause), `emit` ({bytes} → a string of that many
//! `x`), `call_back` ({method, params} → calls the host and returns its
//! answer), `produce` ({n, method} → streams 0..n to the host's stream
//! handler `method` and returns its answer); stream method `sum` (adds the
//! numbers streamed to it).
//!
//! Limits come from the environment (defaults in `PeerConfig`):
//! `WORKER_RPC_MAX_FRAME_BYTES`, `WORKER_RPC_MAX_INBOUND_CALLS`,
//! `WORKER_RPC_MAX_OUTBOUND_CALLS`, `WORKER_RPC_MAX_HELD_FRAMES`,
//! `WORKER_RPC_STREAM_WINDOW`, `WORKER_RPC_WRITE_TIMEOUT_MS`.

use hostwire_worker_rpc::transport::stdio;
use hostwire_worker_rpc::{codes, Payload, Peer, PeerConfig, RpcError, Side};
use serde_json::{json, Value};
use std::time::Duration;

fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

fn config() -> PeerConfig {
    let mut c = PeerConfig::default();
    if let Some(n) = env_num("WORKER_RPC_MAX_FRAME_BYTES") {
        c.max_frame_bytes = n as usize;
    }
    if let Some(n) = env_num("WORKER_RPC_MAX_INBOUND_CALLS") {
        c.max_inbound_calls = n as usize;
    }
    if let Some(n) = env_num("WORKER_RPC_MAX_OUTBOUND_CALLS") {
        c.max_outbound_calls = n as usize;
    }
    if let Some(n) = env_num("WORKER_RPC_MAX_HELD_FRAMES") {
        c.max_held_frames = n as usize;
    }
    if let Some(n) = env_num("WORKER_RPC_STREAM_WINDOW") {
        c.stream_window = n;
    }
    if let Some(n) = env_num("WORKER_RPC_WRITE_TIMEOUT_MS") {
        c.write_timeout = Duration::from_millis(n);
    }
    c
}

fn number(p: &Value, field: &str) -> Result<f64, RpcError> {
    p[field].as_f64().ok_or_else(|| {
        RpcError::new(
            "INVALID_PARAMS",
            format!("params.{field}: must be a number"),
        )
    })
}

fn params(p: &Payload) -> Result<Value, RpcError> {
    p.to_value()
        .map_err(|e| RpcError::new("INVALID_PARAMS", format!("params: {e}")))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let peer = Peer::new(Side::Worker, stdio(), config());
    peer.register("echo", |params, _ctx| async move { Ok(params) });
    peer.register("add", |p, _ctx| async move {
        let p = params(&p)?;
        Ok(json!(number(&p, "a")? + number(&p, "b")?))
    });
    peer.register("wait", |_p, ctx| async move {
        let _ = ctx.progress(json!({"stage": "waiting"}));
        ctx.cancel.cancelled().await;
        Err::<Value, _>(RpcError::new(codes::CANCELLED, "cancelled"))
    });
    peer.register("fail", |_p, _ctx| async move {
        Err::<Value, _>(
            RpcError::new("OUTER", "it failed").with_cause(RpcError::new("INNER", "because")),
        )
    });
    peer.register("emit", |p, _ctx| async move {
        let n = number(&params(&p)?, "bytes")? as usize;
        Ok(json!("x".repeat(n)))
    });
    peer.register("call_back", |p, ctx| async move {
        let p = params(&p)?;
        let method = p["method"].as_str().unwrap_or("").to_owned();
        ctx.peer
            .call(&method, p["params"].clone())
            .timeout(Duration::from_secs(30))
            .await
    });
    peer.register("produce", |p, ctx| async move {
        let p = params(&p)?;
        let n = number(&p, "n")? as u64;
        let method = p["method"].as_str().unwrap_or("").to_owned();
        let mut tx = ctx.peer.open_stream(&method, Value::Null);
        for i in 0..n {
            tx.send(json!(i)).await?;
        }
        tx.finish().await
    });
    peer.register_stream("sum", |_p, mut rx, _ctx| async move {
        let mut total = 0.0;
        while let Some(item) = rx.next().await {
            total += item?.parse::<f64>().unwrap_or(0.0);
        }
        Ok(Value::from(total))
    });
    // Returns once the last frame (a goodbye) is flushed or the write
    // timeout passed.
    let why = peer.wait_closed().await;
    eprintln!("worker: closed: {why}");
    // Exit now: tokio's stdin and stdout block in threads of their own,
    // and a runtime waits for those at shutdown (a peer that neither
    // closes our stdin nor reads our stdout would keep us alive).
    std::process::exit(0);
}
