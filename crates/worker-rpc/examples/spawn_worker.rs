//! Spawns the echo worker as a child process and calls it over NDJSON.
//!
//!     cargo build -p hostwire-worker-rpc --bin hostwire-echo-worker
//!     cargo run -p hostwire-worker-rpc --example spawn_worker

use hostwire_worker_rpc::transport::spawn_worker;
use hostwire_worker_rpc::{Peer, PeerConfig, Side};
use serde_json::json;
use std::path::PathBuf;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The worker binary sits next to this example's directory.
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    let worker = dir.join("hostwire-echo-worker");
    let (transport, mut child) = spawn_worker(tokio::process::Command::new(&worker))?;
    let host = Peer::new(Side::Host, transport, PeerConfig::default());
    host.ready().await?;
    println!(
        "echo  -> {}",
        host.call("echo", json!({"hello": "worker"})).await?
    );
    println!(
        "add   -> {}",
        host.call("add", json!({"a": 2, "b": 40})).await?
    );
    let mut stream = host.open_stream("sum", json!(null));
    for n in 1..=100 {
        stream.send(json!(n)).await?;
    }
    println!("sum   -> {}", stream.finish().await?);
    match host.call("fail", json!(null)).await {
        Err(e) => println!(
            "fail  -> {e} (cause: {})",
            e.cause.as_ref().map(|c| c.to_string()).unwrap_or_default()
        ),
        Ok(v) => println!("fail  -> unexpectedly {v}"),
    }
    host.goodbye("done").await;
    let status = child.wait().await?;
    println!("worker exited: {status}");
    Ok(())
}
