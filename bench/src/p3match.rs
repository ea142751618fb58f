//! The PlayerThree match benchmark, over real WebSockets against `hostwire
//! serve`: one match of the example game (Ridge) whose red team's view
//! update each tick is fanned out to N spectators of that team (built once
//! and shared by the server), then a second match whose delayed frames are
//! released to N observers of the red team. For each: frames delivered per
//! second, the server's CPU per delivered frame (from /proc), and for the
//! observers how late each frame arrived after its `releaseAt`; for the
//! spectators, how long one update takes to reach all of them.
//!
//! A Ridge match ends after 60 ticks, so each phase measures within one
//! match's life: the window ends a second before the last tick at the
//! latest.

use crate::load::{latency, Latency};
use crate::procstat::{self, CpuUse};
use anyhow::{bail, Context as _, Result};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Ticks a Ridge match lasts (`hostwire_playerthree::demo::MAX_TICKS`).
const MATCH_TICKS: u64 = 60;

#[derive(Debug, Clone)]
pub struct MatchParams {
    pub http: String,
    pub origin: String,
    pub spectators: usize,
    pub observers: usize,
    /// The observers' grant delay.
    pub delay_ms: u64,
    /// The server's `PLAYERTHREE_TICK_MS` (the window must fit a match).
    pub tick_ms: u64,
    pub warmup: Duration,
    pub duration: Duration,
    pub quiet: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PhaseResult {
    pub connections: usize,
    pub seconds: f64,
    pub delivered: u64,
    pub delivered_per_s: f64,
    pub mean_frame_bytes: f64,
    pub server_cpu: Option<CpuUse>,
    pub server_cpu_us_per_frame: Option<f64>,
    /// The growth of the server's anonymous RSS (`RssAnon`) from before the
    /// phase's connections opened to when they had all joined, per
    /// connection: what a joined spectator or observer holds.
    pub anon_bytes_per_connection: Option<f64>,
    /// Observers: delivered time minus `releaseAt`. Spectators: from the
    /// first to the last spectator's receipt of one view version.
    pub latency: Latency,
    /// Spectators: versions every spectator received in the window;
    /// observers: frames each observer received, at least.
    pub complete_updates: u64,
    /// Frames that arrived before their `releaseAt` (must be 0).
    pub early: u64,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MatchResult {
    pub tick_ms: u64,
    pub delay_ms: u64,
    pub spectators: PhaseResult,
    pub observers: PhaseResult,
}

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

async fn connect(ws_url: &str, origin: &str) -> Result<Ws> {
    let mut req = ws_url.into_client_request()?;
    req.headers_mut().insert("Origin", origin.parse()?);
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(16 * 1024);
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(config), true).await?;
    Ok(ws)
}

async fn next_json(ws: &mut Ws) -> Result<Value> {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Err(_) => bail!("no frame in 30 s"),
            Ok(None) => bail!("connection closed"),
            Ok(Some(Err(e))) => bail!("{e}"),
            Ok(Some(Ok(Message::Text(t)))) => return Ok(serde_json::from_str(&t)?),
            Ok(Some(Ok(_))) => continue,
        }
    }
}

/// The server's operator credential (creating a match needs it), from
/// `HOSTWIRE_OPERATOR_TOKEN` as the server has it.
pub fn operator_credential() -> Option<String> {
    std::env::var("HOSTWIRE_OPERATOR_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
}

struct Api {
    http: reqwest::Client,
    base: String,
    origin: String,
}

impl Api {
    async fn post(&self, path: &str, bearer: Option<&str>, body: Value) -> Result<Value> {
        let mut r = self
            .http
            .post(format!("{}/playerthree{path}", self.base))
            .header("Origin", &self.origin)
            .body(body.to_string());
        if let Some(b) = bearer {
            r = r.header("Authorization", format!("Bearer {b}"));
        }
        let r = r.send().await?;
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("POST /playerthree{path}: {status} {v}");
        }
        Ok(v)
    }

    /// A new match: (id, operator token).
    async fn create(&self) -> Result<(String, String)> {
        let operator = operator_credential();
        let v = self
            .post("/matches", operator.as_deref(), json!({}))
            .await?;
        Ok((
            v["match"].as_str().context("match")?.to_owned(),
            v["operatorToken"]
                .as_str()
                .context("operatorToken")?
                .to_owned(),
        ))
    }

    async fn mint(&self, id: &str, op: &str, principal: Value) -> Result<String> {
        let v = self
            .post(&format!("/matches/{id}/tokens"), Some(op), principal)
            .await?;
        Ok(v["token"].as_str().context("token")?.to_owned())
    }
}

async fn join(ws_url: &str, origin: &str, token: &str) -> Result<Ws> {
    let mut ws = connect(ws_url, origin).await?;
    ws.send(Message::Text(
        json!({"op": "join", "token": token}).to_string().into(),
    ))
    .await?;
    let v = next_json(&mut ws).await?;
    if v["ok"] != true {
        bail!("join refused: {v}");
    }
    Ok(ws)
}

/// What every reader task shares.
#[derive(Default)]
struct Shared {
    measuring: AtomicBool,
    stop: AtomicBool,
    delivered: AtomicU64,
    bytes: AtomicU64,
    early: AtomicU64,
    /// Spectators: version → (first receipt µs, last receipt µs, readers).
    versions: Mutex<HashMap<u64, (u64, u64, usize)>>,
    /// Observers: lateness µs.
    hist: Mutex<Option<Histogram<u64>>>,
    errors: Mutex<Vec<String>>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// The `version` of a view frame, read without parsing the body.
fn view_version(text: &str) -> Option<u64> {
    if !text.starts_with("{\"op\":\"view\"") {
        return None;
    }
    let i = text.find("\"version\":")? + 10;
    let rest = &text.as_bytes()[i..];
    let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..n]).ok()?.parse().ok()
}

/// The `releaseAt` of an observer frame, in ms.
fn release_at(text: &str) -> Option<u64> {
    let i = text.find("\"releaseAt\":")? + 12;
    let rest = &text.as_bytes()[i..];
    let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..n]).ok()?.parse().ok()
}

async fn spectator(mut ws: Ws, s: Arc<Shared>) {
    while !s.stop.load(Relaxed) {
        let m = match tokio::time::timeout(Duration::from_millis(500), ws.next()).await {
            Err(_) => continue,
            Ok(None) | Ok(Some(Err(_))) => {
                if !s.stop.load(Relaxed) {
                    s.errors
                        .lock()
                        .unwrap()
                        .push("spectator: connection ended".into());
                }
                return;
            }
            Ok(Some(Ok(m))) => m,
        };
        let Message::Text(t) = m else { continue };
        let at = epoch_us();
        if !s.measuring.load(Relaxed) {
            continue;
        }
        s.delivered.fetch_add(1, Relaxed);
        s.bytes.fetch_add(t.len() as u64, Relaxed);
        if let Some(v) = view_version(&t) {
            let mut g = s.versions.lock().unwrap();
            let e = g.entry(v).or_insert((at, at, 0));
            e.0 = e.0.min(at);
            e.1 = e.1.max(at);
            e.2 += 1;
        }
    }
}

async fn observer(mut ws: Ws, s: Arc<Shared>) {
    let mut h = histogram();
    while !s.stop.load(Relaxed) {
        let m = match tokio::time::timeout(Duration::from_millis(500), ws.next()).await {
            Err(_) => continue,
            Ok(None) | Ok(Some(Err(_))) => break,
            Ok(Some(Ok(m))) => m,
        };
        let Message::Text(t) = m else { continue };
        let at = epoch_us();
        if !s.measuring.load(Relaxed) {
            continue;
        }
        let Some(release) = release_at(&t) else {
            continue;
        };
        s.delivered.fetch_add(1, Relaxed);
        s.bytes.fetch_add(t.len() as u64, Relaxed);
        let release_us = release * 1000;
        if at < release_us {
            // Within the same millisecond counts as on time: releaseAt
            // has millisecond resolution.
            if release_us - at >= 1000 {
                s.early.fetch_add(1, Relaxed);
            }
            let _ = h.record(1);
        } else {
            let _ = h.record((at - release_us).max(1));
        }
    }
    let mut g = s.hist.lock().unwrap();
    match g.as_mut() {
        Some(all) => {
            let _ = all.add(&h);
        }
        None => *g = Some(h),
    }
}

/// Opens `n` connections with `token`, a few at a time.
async fn open_all(p: &MatchParams, ws_url: &str, token: &str, n: usize) -> Result<Vec<Ws>> {
    let mut out = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let joins = chunk.iter().map(|_| join(ws_url, &p.origin, token));
        for r in futures_util::future::join_all(joins).await {
            out.push(r?);
        }
        if !p.quiet {
            eprint!("\rconnections: {}/{n}", out.len());
        }
    }
    if !p.quiet {
        eprintln!();
    }
    Ok(out)
}

/// Waits out the warm-up, then measures until the duration has passed or
/// the match is about to end.
async fn measure(
    p: &MatchParams,
    s: &Shared,
    created: Instant,
    server_pid: Option<u32>,
) -> Result<(f64, Option<CpuUse>)> {
    tokio::time::sleep(p.warmup).await;
    let end_of_match = created + Duration::from_millis(MATCH_TICKS * p.tick_ms);
    let stop_at = (Instant::now() + p.duration).min(end_of_match - Duration::from_secs(1));
    let window = stop_at.saturating_duration_since(Instant::now());
    if window < Duration::from_secs(1) {
        bail!("the match ends before a measurement window fits: raise PLAYERTHREE_TICK_MS (--tick-ms) or shorten the warm-up");
    }
    let a = server_pid.and_then(procstat::sample);
    s.measuring.store(true, Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    s.measuring.store(false, Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    let b = server_pid.and_then(procstat::sample);
    let cpu = match (a, b) {
        (Some(a), Some(b)) => Some(procstat::cpu_between(a, b, seconds)),
        _ => None,
    };
    Ok((seconds, cpu))
}

/// The growth of `RssAnon` between two samples, per connection.
fn anon_per_connection(
    before: Option<procstat::ProcSample>,
    after: Option<procstat::ProcSample>,
    n: usize,
) -> Option<f64> {
    let (a, b) = (before?, after?);
    Some(b.anon_kb.saturating_sub(a.anon_kb) as f64 * 1024.0 / n.max(1) as f64)
}

fn phase_result(s: &Shared, n: usize, seconds: f64, cpu: Option<CpuUse>) -> PhaseResult {
    let delivered = s.delivered.load(Relaxed);
    let per_s = delivered as f64 / seconds.max(1e-9);
    PhaseResult {
        connections: n,
        seconds,
        delivered,
        delivered_per_s: per_s,
        mean_frame_bytes: s.bytes.load(Relaxed) as f64 / delivered.max(1) as f64,
        server_cpu: cpu,
        server_cpu_us_per_frame: cpu.map(|c| c.total_pct / 100.0 * 1e6 / per_s.max(1e-9)),
        anon_bytes_per_connection: None,
        latency: latency(&s.hist.lock().unwrap()),
        complete_updates: 0,
        early: s.early.load(Relaxed),
        errors: s.errors.lock().unwrap().clone(),
    }
}

/// The two phases, one match each.
pub async fn run(p: &MatchParams, server_pid: Option<u32>) -> Result<MatchResult> {
    let api = Api {
        http: reqwest::Client::new(),
        base: p.http.trim_end_matches('/').to_owned(),
        origin: p.origin.clone(),
    };
    let ws_url = format!(
        "ws://{}/playerthree/ws",
        api.base.trim_start_matches("http://")
    );

    // Spectators of red: every tick's red view, one frame shared by all.
    let (id, op) = api.create().await?;
    let created = Instant::now();
    let red = api
        .mint(&id, &op, json!({"kind": "team", "team": "red"}))
        .await?;
    let watch = api
        .mint(&id, &op, json!({"kind": "spectator", "team": "red"}))
        .await?;
    let mut owner = join(&ws_url, &p.origin, &red).await?;
    // The red units move, so each view carries unit changes besides the tick.
    for (seq, role) in [(1, "red-scout"), (2, "red-guard")] {
        owner
            .send(Message::Text(
                json!({"op": "call", "seq": seq, "role": role, "method": "move", "args": {"dir": "s"}})
                    .to_string()
                    .into(),
            ))
            .await?;
    }
    let s = Arc::new(Shared::default());
    let before = server_pid.and_then(procstat::sample);
    let conns = open_all(p, &ws_url, &watch, p.spectators).await?;
    let joined = server_pid.and_then(procstat::sample);
    let owner_reader = tokio::spawn(spectator(owner, Arc::new(Shared::default())));
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|ws| tokio::spawn(spectator(ws, Arc::clone(&s))))
        .collect();
    let (seconds, cpu) = measure(p, &s, created, server_pid).await?;
    s.stop.store(true, Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    owner_reader.abort();
    let mut spectators = phase_result(&s, p.spectators, seconds, cpu);
    spectators.anon_bytes_per_connection = anon_per_connection(before, joined, p.spectators);
    {
        // Fan-out: first to last receipt of each version all got.
        let mut h = histogram();
        let mut complete = 0;
        for (first, last, n) in s.versions.lock().unwrap().values() {
            if *n == p.spectators {
                complete += 1;
                let _ = h.record((last - first).max(1));
            }
        }
        spectators.latency = latency(&Some(h));
        spectators.complete_updates = complete;
    }

    // Observers of red, delayed: frames released at releaseAt.
    let (id, op) = api.create().await?;
    let created = Instant::now();
    let grant = json!({"kind": "observer", "grant": {"kind": "team", "team": "red", "delayMs": p.delay_ms}});
    let token = api.mint(&id, &op, grant).await?;
    let s = Arc::new(Shared::default());
    let before = server_pid.and_then(procstat::sample);
    let mut conns = open_all(p, &ws_url, &token, p.observers).await?;
    for ws in &mut conns {
        ws.send(Message::Text(
            json!({"op": "observer", "perspective": "red"})
                .to_string()
                .into(),
        ))
        .await?;
    }
    let joined = server_pid.and_then(procstat::sample);
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|ws| tokio::spawn(observer(ws, Arc::clone(&s))))
        .collect();
    let (seconds, cpu) = measure(p, &s, created, server_pid).await?;
    s.stop.store(true, Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let mut observers = phase_result(&s, p.observers, seconds, cpu);
    observers.anon_bytes_per_connection = anon_per_connection(before, joined, p.observers);
    observers.complete_updates = observers.delivered / p.observers.max(1) as u64;

    Ok(MatchResult {
        tick_ms: p.tick_ms,
        delay_ms: p.delay_ms,
        spectators,
        observers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_release_times_are_read_from_the_frame_text() {
        assert_eq!(
            view_version(r#"{"op":"view","team":"red","version":17,"delta":{}}"#),
            Some(17)
        );
        assert_eq!(view_version(r#"{"op":"seats","version":3}"#), None);
        assert_eq!(
            release_at(
                r#"{"op":"observer","state":"ready","frame":{"sequence":2,"releaseAt":1700000000123}}"#
            ),
            Some(1_700_000_000_123)
        );
        assert_eq!(release_at(r#"{"op":"observer","state":"buffering"}"#), None);
    }
}
