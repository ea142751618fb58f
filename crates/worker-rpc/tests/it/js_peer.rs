//! Cross-language: a JavaScript peer written from the seed and
//! docs/protocols/worker-rpc.md (tests/js, plain Node, no packages) drives
//! `hostwire-echo-worker`, and a Rust host `Peer` drives a JavaScript
//! worker. Node.js 18 or later must be installed: without it these tests
//! fail, they do not skip.

use hostwire_worker_rpc::transport::spawn_worker;
use hostwire_worker_rpc::{codes, Payload, Peer, PeerConfig, RpcError, Side};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

fn js(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/js")
        .join(file)
}

/// `node`, or a failure that says what to install.
fn node() -> &'static str {
    match Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => {
            let v = String::from_utf8_lossy(&out.stdout);
            let major: u32 = v
                .trim()
                .trim_start_matches('v')
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            assert!(
                major >= 18,
                "the cross-language tests need Node.js 18 or later; found {v}"
            );
            "node"
        }
        other => panic!(
            "the cross-language tests need Node.js 18 or later as `node` on PATH \
             (e.g. `apt-get install nodejs`); running it failed: {other:?}"
        ),
    }
}

#[test]
fn a_javascript_host_drives_the_echo_worker() {
    let out = Command::new(node())
        .arg(js("host.mjs"))
        .arg(env!("CARGO_BIN_EXE_hostwire-echo-worker"))
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "a JavaScript case failed:\n{stdout}");
    assert!(stdout.contains(", 0 failed"), "{stdout}");
    assert!(!stdout.contains(" 0 passed"), "{stdout}");
}

fn js_worker(env: &[(&str, &str)], config: PeerConfig) -> (Peer, tokio::process::Child) {
    let mut cmd = tokio::process::Command::new(node());
    cmd.arg(js("worker.mjs"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (transport, child) = spawn_worker(cmd).expect("spawn node");
    (Peer::new(Side::Host, transport, config), child)
}

fn protocol_error(e: &RpcError, mention: &str) {
    assert_eq!(e.code, codes::PROTOCOL_ERROR, "{e}");
    assert!(e.message.contains(mention), "{e} should name {mention}");
}

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_rust_host_drives_a_javascript_worker() {
    let config = PeerConfig {
        max_inbound_calls: 2,
        ..PeerConfig::default()
    };
    let (host, mut child) = js_worker(&[], config);
    host.ready().await.unwrap();
    // 1,000 calls, 50 in flight.
    let mut ids = 0..1000;
    let mut lanes = Vec::new();
    for _ in 0..50 {
        let chunk: Vec<i64> = ids.by_ref().take(20).collect();
        let h = host.clone();
        lanes.push(tokio::spawn(async move {
            for i in chunk {
                let r = h.call("echo", json!({"i": i})).timeout(T).await.unwrap();
                assert_eq!(r, json!({"i": i}));
            }
        }));
    }
    for l in lanes {
        l.await.unwrap();
    }
    assert_eq!(
        host.call("add", json!({"a": 2, "b": 40})).await.unwrap(),
        json!(42)
    );
    let e = host.call("fail", json!(null)).await.unwrap_err();
    assert_eq!(
        (e.code.as_str(), e.data.unwrap().get()),
        ("OUTER", r#"{"line":3}"#)
    );
    // Progress, then cancel: the worker answers CANCELLED, dropped here.
    let mut call = host.call("wait", json!(null));
    let p = call.next_progress().await.unwrap();
    assert_eq!(p, json!({"stage": "waiting"}));
    call.cancel();
    // Streams both ways, and a call back.
    let mut tx = host.open_stream("sum", json!(null));
    for i in 1..=100 {
        tx.send(json!(i)).await.unwrap();
    }
    assert_eq!(tx.finish().timeout_after(T).await, json!(5050));
    host.register_stream("collect", |_, mut rx, _| async move {
        let mut all = Vec::new();
        while let Some(v) = rx.next().await {
            all.push(v?);
        }
        Payload::json(&all).map_err(|e| RpcError::new("BAD", e.to_string()))
    });
    host.register("ping", |_, _| async move { Ok(json!("pong")) });
    let got = host
        .call("produce", json!({"n": 40, "method": "collect"}))
        .timeout(T)
        .await
        .unwrap();
    assert_eq!(got, json!((0..40).collect::<Vec<_>>()));
    assert_eq!(
        host.call("call_back", json!({"method": "ping"}))
            .timeout(T)
            .await
            .unwrap(),
        json!("pong")
    );
    while host.stats().responses_after_cancel < 1 {
        tokio::task::yield_now().await;
    }

    // A buggy worker: each malformed answer fails its own call.
    let e = host
        .call("bad_error", json!(null))
        .timeout(T)
        .await
        .unwrap_err();
    protocol_error(&e, "error.code");
    let e = host
        .call("bad_progress", json!(null))
        .timeout(T)
        .await
        .unwrap_err();
    protocol_error(&e, "progress");
    let e = host
        .call("deep", json!({"levels": 128}))
        .timeout(T)
        .await
        .unwrap_err();
    protocol_error(&e, "nested deeper than 128");
    assert!(host
        .call("deep", json!({"levels": 127}))
        .timeout(T)
        .await
        .is_ok());
    let e = host
        .call("bad_byte", json!(null))
        .timeout(T)
        .await
        .unwrap_err();
    protocol_error(&e, "UTF-8");
    assert_eq!(
        host.call("id_as_float", json!(null))
            .timeout(T)
            .await
            .unwrap(),
        json!("float id")
    );
    let s = host
        .call("surrogate", json!(null))
        .timeout(T)
        .await
        .unwrap();
    assert_eq!(s.get(), r#""a\ud800b""#);
    // A malformed chunk from the worker's stream ends it, naming seq.
    host.register_stream("count", |_, mut rx, _| async move {
        let mut n = 0;
        while let Some(v) = rx.next().await {
            v?;
            n += 1;
        }
        Ok(json!(n))
    });
    let r = host
        .call("bad_chunk", json!({"method": "count"}))
        .timeout(T)
        .await
        .unwrap()
        .to_value()
        .unwrap();
    assert_eq!(r["code"], json!(codes::PROTOCOL_ERROR), "{r}");
    assert!(r["message"].as_str().unwrap().contains("seq"), "{r}");
    // A duplicate in-flight id is left alone: one answer, the real one.
    let gate = Arc::new(Notify::new());
    let g = Arc::clone(&gate);
    host.register("slow", move |_, _| {
        let g = Arc::clone(&g);
        async move {
            g.notified().await;
            Ok(json!("real answer"))
        }
    });
    let g = Arc::clone(&gate);
    host.register("release", move |_, _| {
        let g = Arc::clone(&g);
        async move {
            g.notify_one();
            Ok(Value::Null)
        }
    });
    let r = host
        .call("dup", json!({"method": "slow", "release": "release"}))
        .timeout(T)
        .await
        .unwrap();
    assert_eq!(r, json!({"answers": 1, "result": "real answer"}));
    assert_eq!(host.stats().duplicate_ids, 1);
    // The host's own limit of calls in flight: the third gets TOO_MANY_CALLS.
    host.register("hold", |_, ctx| async move {
        ctx.cancel.cancelled().await;
        Ok(Value::Null)
    });
    let r = host
        .call("flood", json!({"n": 3, "method": "hold"}))
        .timeout(T)
        .await
        .unwrap();
    assert_eq!(r, json!(codes::TOO_MANY_CALLS));
    host.goodbye("done").await;
    let status = tokio::time::timeout(T, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

trait TimeoutAfter {
    async fn timeout_after(self, t: Duration) -> Payload;
}

impl<F: std::future::Future<Output = Result<Payload, RpcError>>> TimeoutAfter for F {
    async fn timeout_after(self, t: Duration) -> Payload {
        tokio::time::timeout(t, self).await.unwrap().unwrap()
    }
}

#[tokio::test]
async fn a_javascript_goodbye_whose_reason_is_a_number_ends_every_call() {
    let (host, _child) = js_worker(&[], PeerConfig::default());
    let pending = host.call("wait", json!(null));
    let e = host
        .call("bad_goodbye", json!(null))
        .timeout(T)
        .await
        .unwrap_err();
    protocol_error(&e, "reason");
    protocol_error(&pending.await.unwrap_err(), "reason");
}

#[tokio::test]
async fn a_javascript_frame_of_another_major_ends_the_connection() {
    let (host, mut child) = js_worker(&[], PeerConfig::default());
    let pending = host.call("wait", json!(null));
    let e = host
        .call("other_major", json!(null))
        .timeout(T)
        .await
        .unwrap_err();
    assert_eq!(e.code, codes::VERSION_MISMATCH, "{e}");
    assert_eq!(pending.await.unwrap_err().code, codes::VERSION_MISMATCH);
    // The JavaScript worker got the goodbye and exits.
    let status = tokio::time::timeout(T, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn a_javascript_hello_of_another_major_or_malformed_is_refused() {
    let (host, _child) = js_worker(&[("JS_WORKER_VERSION", "2.0.0")], PeerConfig::default());
    let e = tokio::time::timeout(T, host.ready())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, codes::VERSION_MISMATCH);
    let (host, _child) = js_worker(&[("JS_WORKER_HELLO", "bad")], PeerConfig::default());
    let e = tokio::time::timeout(T, host.ready())
        .await
        .unwrap()
        .unwrap_err();
    protocol_error(&e, "features");
}
