//! Churn: what a change acknowledged only once it is stored costs a room.
//!
//! Players send `up` and, in half the rooms, `rename` too (a new name each
//! time, so each one is a write the room waits for before it answers). The
//! host of each room measures, on the same connections in the same run:
//! - `from` latency in quiet rooms (forwarding, the baseline);
//! - `from` latency in churning rooms (forwarding behind the room's own
//!   stored changes);
//! - `presence` `rename` latency (a change, from the player's send to the
//!   host being told, once it is on disk).
//!
//! Each payload and each new name carries its send time.

use crate::load::{latency, open_room, Latency, Target};
use crate::procstat::{self, CpuUse};
use anyhow::{Context as _, Result};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

#[derive(Debug, Clone)]
pub struct Churn {
    /// Rooms of each kind (quiet and churning).
    pub rooms: usize,
    pub players: usize,
    pub up_hz: f64,
    pub rename_hz: f64,
    pub warmup: Duration,
    pub duration: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChurnResult {
    pub rooms: usize,
    pub players: usize,
    pub up_hz: f64,
    pub rename_hz: f64,
    pub seconds: f64,
    pub quiet_up: Latency,
    pub churn_up: Latency,
    pub rename: Latency,
    /// Acknowledged renames per second, all churning rooms together.
    pub renames_per_s: f64,
    pub errors: BTreeMap<String, u64>,
    pub server_cpu: Option<CpuUse>,
}

fn now_us() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// The digits after `key` in `frame`.
fn number_after(frame: &str, key: &str) -> Option<u64> {
    let i = frame.find(key)? + key.len();
    let rest = &frame.as_bytes()[i..];
    let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..n]).ok()?.parse().ok()
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

struct Shared {
    measuring: AtomicBool,
    stop: tokio::sync::watch::Sender<bool>,
    quiet_up: Mutex<Histogram<u64>>,
    churn_up: Mutex<Histogram<u64>>,
    rename: Mutex<Histogram<u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
}

fn record(h: &Mutex<Histogram<u64>>, sent: u64) {
    if let Ok(mut h) = h.lock() {
        let _ = h.record(now_us().saturating_sub(sent).max(1));
    }
}

pub async fn churn(t: &Target, p: &Churn, server_pid: Option<u32>) -> Result<ChurnResult> {
    let http = reqwest::Client::new();
    let s = Arc::new(Shared {
        measuring: AtomicBool::new(false),
        stop: tokio::sync::watch::channel(false).0,
        quiet_up: Mutex::new(histogram()),
        churn_up: Mutex::new(histogram()),
        rename: Mutex::new(histogram()),
        errors: Mutex::default(),
    });
    let mut tasks = Vec::new();
    for i in 0..2 * p.rooms {
        let churning = i % 2 == 0;
        let room = open_room(&http, t, p.players)
            .await
            .with_context(|| format!("opening room {i}"))?;
        let mut host = room.host;
        let shared = Arc::clone(&s);
        let mut stop = s.stop.subscribe();
        tasks.push(tokio::spawn(async move {
            loop {
                let m = tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    m = host.next() => m,
                };
                let Some(Ok(Message::Text(f))) = m else { break };
                if f.starts_with("{\"t\":\"error\"") {
                    let code = serde_json::from_str::<serde_json::Value>(&f)
                        .ok()
                        .and_then(|v| v["code"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    if let Ok(mut e) = shared.errors.lock() {
                        *e.entry(code).or_default() += 1;
                    }
                    continue;
                }
                if !shared.measuring.load(Relaxed) {
                    continue;
                }
                if f.starts_with("{\"t\":\"from\"") {
                    if let Some(ts) = number_after(&f, "\"ts\":") {
                        let h = if churning {
                            &shared.churn_up
                        } else {
                            &shared.quiet_up
                        };
                        record(h, ts);
                    }
                } else if f.contains("\"event\":\"rename\"") {
                    if let Some(ts) = number_after(&f, "\"name\":\"n") {
                        record(&shared.rename, ts);
                    }
                }
            }
        }));
        for (k, (mut ws, _)) in room.players.into_iter().enumerate() {
            let mut stop = s.stop.subscribe();
            let (up_hz, rename_hz) = (p.up_hz, if churning { p.rename_hz } else { 0.0 });
            // Spread the senders over their period.
            let phase = (k as f64 * 0.618_033_988_749_895).fract();
            tasks.push(tokio::spawn(async move {
                let every = |hz: f64| Duration::from_secs_f64(1.0 / hz.max(0.001));
                let start = tokio::time::Instant::now();
                let mut up = tokio::time::interval_at(start + every(up_hz).mul_f64(phase), every(up_hz));
                let mut rename =
                    tokio::time::interval_at(start + every(rename_hz).mul_f64(phase), every(rename_hz));
                loop {
                    let frame = tokio::select! {
                        _ = stop.wait_for(|s| *s) => break,
                        _ = up.tick() => format!("{{\"t\":\"up\",\"data\":{{\"ts\":{}}}}}", now_us()),
                        _ = rename.tick(), if rename_hz > 0.0 => {
                            format!("{{\"t\":\"rename\",\"name\":\"n{}\"}}", now_us())
                        }
                        m = ws.next() => match m {
                            Some(Ok(_)) => continue,
                            _ => break,
                        },
                    };
                    if ws.send(Message::Text(frame.into())).await.is_err() {
                        break;
                    }
                }
                let _ = ws.close(None).await;
            }));
        }
    }
    tokio::time::sleep(p.warmup).await;
    s.measuring.store(true, Relaxed);
    let before = server_pid.and_then(procstat::sample);
    let start = Instant::now();
    tokio::time::sleep(p.duration).await;
    s.measuring.store(false, Relaxed);
    let seconds = start.elapsed().as_secs_f64();
    let after = server_pid.and_then(procstat::sample);
    s.stop.send_replace(true);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    let get = |h: &Mutex<Histogram<u64>>| latency(&h.lock().ok().map(|h| h.clone()));
    let rename = get(&s.rename);
    Ok(ChurnResult {
        rooms: p.rooms,
        players: p.players,
        up_hz: p.up_hz,
        rename_hz: p.rename_hz,
        seconds,
        quiet_up: get(&s.quiet_up),
        churn_up: get(&s.churn_up),
        renames_per_s: rename.samples as f64 / seconds,
        rename,
        errors: s.errors.lock().map(|e| e.clone()).unwrap_or_default(),
        server_cpu: before
            .zip(after)
            .map(|(a, b)| procstat::cpu_between(a, b, seconds)),
    })
}
