//! Failover: relay rooms whose hosts sit on one node and whose players
//! reach it through others, the owner killed (SIGKILL) mid-game; every
//! client reconnects (the host to another node, each player to the node it
//! used) and rejoins with its token. Measured per client: the time from the
//! kill to its rejoin answer, and to its first frame from the other side
//! after it.

use crate::load::{connect, latency, open_room_spread, Latency, Spread, Target};
use anyhow::{bail, Context as _, Result};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// How long a client waits after a refused or failed reconnect before the
/// next attempt (a client's backoff: short, so that what is measured is
/// the cluster's takeover and not the wait).
pub const RETRY: Duration = Duration::from_millis(100);

/// How long a reconnecting client waits for the answer to its `host` or
/// `join` before it counts the attempt as failed.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct Params {
    pub rooms: usize,
    pub players: usize,
    pub host_hz: f64,
    pub player_hz: f64,
    pub payload: usize,
    /// Traffic before the kill.
    pub warmup: Duration,
    /// The owner's PID: killed with SIGKILL after the warm-up.
    pub kill_pid: u32,
    /// How long after the kill the clients have to come back.
    pub guard: Duration,
    pub quiet: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailoverResult {
    pub rooms: usize,
    pub players: usize,
    pub clients: usize,
    /// Clients that had a frame after the kill within the guard.
    pub recovered: usize,
    pub guard_s: f64,
    /// When the owner was killed (Unix ms), to read beside the nodes' logs.
    pub killed_at_unix_ms: u64,
    /// Kill → the `hosting` / `joined` answer on the new connection.
    pub rejoined: Latency,
    pub rejoined_hosts: Latency,
    pub rejoined_players: Latency,
    /// Kill → the first frame from the other side after that.
    pub first_frame: Latency,
    pub first_frame_hosts: Latency,
    pub first_frame_players: Latency,
    /// Connection attempts after the kill, and why the failed ones failed
    /// (a close code, `connect`, `timeout`, or an `error` frame's code).
    pub attempts: u64,
    pub refusals: BTreeMap<String, u64>,
    /// How long a refused attempt took, from connecting to its refusal.
    pub refusal_time: Latency,
    /// Clients whose connection ended before the kill, or that got no
    /// frame after it.
    pub failures: BTreeMap<String, u64>,
}

/// What every client task shares.
struct Shared {
    killed: OnceLock<Instant>,
    stop: tokio::sync::watch::Sender<bool>,
    attempts: AtomicUsize,
    refusals: Mutex<BTreeMap<String, u64>>,
    failures: Mutex<BTreeMap<String, u64>>,
    rejoined_hosts: Mutex<Histogram<u64>>,
    rejoined_players: Mutex<Histogram<u64>>,
    refused: Mutex<Histogram<u64>>,
    hosts: Mutex<Histogram<u64>>,
    players: Mutex<Histogram<u64>>,
}

fn bump(m: &Mutex<BTreeMap<String, u64>>, key: &str) {
    *m.lock().unwrap().entry(key.to_owned()).or_default() += 1;
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

fn since_kill_us(s: &Shared) -> u64 {
    s.killed
        .get()
        .map_or(0, |k| k.elapsed().as_micros() as u64)
        .max(1)
}

/// One client: who it is, where it goes back to, what it says there.
struct Client {
    /// The player ids a host sends `to`; empty for a player.
    to: Vec<String>,
    again: Target,
    rejoin: Value,
    hz: f64,
    phase: f64,
}

/// How a stretch of traffic on one connection ended.
enum Ended {
    Stopped,
    Closed,
}

/// Sends at `c.hz` and reads until the connection ends or the run stops;
/// with `first` set, records there the time from the kill to the first
/// frame from the other side, as it arrives (the run ends once every
/// client has one), and says whether it came.
async fn traffic(
    ws: &mut crate::load::Ws,
    c: &Client,
    pad: &str,
    shared: &Shared,
    mut first: Option<&Mutex<Histogram<u64>>>,
) -> (Ended, bool) {
    let mut got = false;
    let period = Duration::from_secs_f64(1.0 / c.hz.max(0.001));
    let start = tokio::time::Instant::now() + period.mul_f64(c.phase);
    let mut tick = tokio::time::interval_at(start, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = shared.stop.subscribe();
    loop {
        tokio::select! {
            () = stopped(&mut stop) => return (Ended::Stopped, got),
            _ = tick.tick() => {
                let frames: Vec<String> = if c.to.is_empty() {
                    vec![format!("{{\"t\":\"up\",\"data\":{}}}", data(pad))]
                } else {
                    c.to.iter()
                        .map(|id| format!("{{\"t\":\"to\",\"to\":{id},\"data\":{}}}", data(pad)))
                        .collect()
                };
                for f in frames {
                    if ws.feed(Message::Text(f.into())).await.is_err() {
                        return (Ended::Closed, got);
                    }
                }
                if ws.flush().await.is_err() {
                    return (Ended::Closed, got);
                }
            }
            m = ws.next() => match m {
                Some(Ok(Message::Text(t))) => {
                    if t.contains("\"ts\":") {
                        if let Some(h) = first.take() {
                            let _ = h.lock().unwrap().record(since_kill_us(shared));
                            got = true;
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return (Ended::Closed, got),
                Some(Ok(_)) => {}
            },
        }
    }
}

/// Resolves once the run stops (the watch's guard is not held past it).
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

fn data(pad: &str) -> String {
    // The generator's clock is all a frame's receiver needs: it marks a
    // frame from the other side, not a latency here.
    format!("{{\"ts\":1,\"p\":\"{pad}\"}}")
}

/// Reconnects until the new connection answers `hosting` / `joined` (or
/// the run stops); counts every failed attempt by why.
async fn rejoin(c: &Client, shared: &Shared) -> Option<crate::load::Ws> {
    let mut stop = shared.stop.subscribe();
    loop {
        let now_stopped = *stop.borrow();
        if now_stopped {
            return None;
        }
        shared.attempts.fetch_add(1, Relaxed);
        let began = Instant::now();
        match attempt(c).await {
            Ok(ws) => return Some(ws),
            Err(why) => {
                bump(&shared.refusals, &why);
                let us = began.elapsed().as_micros() as u64;
                let _ = shared.refused.lock().unwrap().record(us.max(1));
            }
        }
        tokio::select! {
            () = stopped(&mut stop) => return None,
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}

async fn attempt(c: &Client) -> Result<crate::load::Ws, String> {
    let mut ws = connect(&c.again).await.map_err(|_| "connect".to_owned())?;
    ws.send(Message::Text(c.rejoin.to_string().into()))
        .await
        .map_err(|_| "send".to_owned())?;
    let answer = tokio::time::timeout(ANSWER_TIMEOUT, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).unwrap_or_default();
                    return match v["t"].as_str() {
                        Some("hosting" | "joined") => Ok(()),
                        Some("error") => Err(format!("error {}", v["code"])),
                        _ => continue,
                    };
                }
                Some(Ok(Message::Close(f))) => {
                    return Err(format!("close {}", f.map_or(1005, |f| u16::from(f.code))))
                }
                Some(Ok(_)) => continue,
                None | Some(Err(_)) => return Err("eof".to_owned()),
            }
        }
    })
    .await
    .map_err(|_| "timeout".to_owned())?;
    answer.map(|()| ws)
}

async fn run_client(mut ws: crate::load::Ws, c: Client, pad: Arc<String>, shared: Arc<Shared>) {
    if let (Ended::Stopped, _) = traffic(&mut ws, &c, &pad, &shared, None).await {
        return;
    }
    if shared.killed.get().is_none() {
        bump(&shared.failures, "ended before the kill");
        return;
    }
    drop(ws);
    let Some(mut ws) = rejoin(&c, &shared).await else {
        bump(&shared.failures, "not rejoined");
        return;
    };
    let (rejoined, h) = if c.to.is_empty() {
        (&shared.rejoined_players, &shared.players)
    } else {
        (&shared.rejoined_hosts, &shared.hosts)
    };
    let _ = rejoined.lock().unwrap().record(since_kill_us(&shared));
    match traffic(&mut ws, &c, &pad, &shared, Some(h)).await {
        (_, true) => {}
        (Ended::Closed, false) => bump(&shared.failures, "closed again before a frame"),
        (Ended::Stopped, false) => bump(&shared.failures, "no frame after rejoining"),
    }
}

/// Opens the rooms (hosts on `spread.host`, players round-robin over
/// `spread.players`), plays, kills the owner, and measures the recovery.
/// A room's host comes back to `spread.players[room % n]`.
pub async fn run(spread: &Spread, p: &Params) -> Result<FailoverResult> {
    if spread.players.is_empty() {
        bail!("failover needs the other nodes' URLs (--player-url)");
    }
    let http = reqwest::Client::new();
    let pad = Arc::new("x".repeat(p.payload.saturating_sub(40).max(1)));
    let shared = Arc::new(Shared {
        killed: OnceLock::new(),
        stop: tokio::sync::watch::channel(false).0,
        attempts: AtomicUsize::new(0),
        refusals: Mutex::default(),
        failures: Mutex::default(),
        rejoined_hosts: Mutex::new(histogram()),
        rejoined_players: Mutex::new(histogram()),
        refused: Mutex::new(histogram()),
        hosts: Mutex::new(histogram()),
        players: Mutex::new(histogram()),
    });
    let mut clients = Vec::new();
    let mut k = 0usize;
    let mut phase = || {
        k += 1;
        (k as f64 * 0.618_033_988_749_895).fract()
    };
    for r in 0..p.rooms {
        let first = r * p.players;
        let (room, tokens) = open_room_spread(&http, spread, p.players, first)
            .await
            .with_context(|| format!("opening room {r}"))?;
        let host_token = room.host_token.clone();
        let to = room
            .players
            .iter()
            .map(|(_, id)| serde_json::to_string(id).unwrap_or_default())
            .collect();
        clients.push((
            room.host,
            Client {
                to,
                again: spread.players[r % spread.players.len()].clone(),
                rejoin: json!({"t": "host", "protocol": 1, "pin": room.pin, "hostToken": host_token}),
                hz: p.host_hz,
                phase: phase(),
            },
        ));
        for (i, ((ws, _), token)) in room.players.into_iter().zip(tokens).enumerate() {
            clients.push((
                ws,
                Client {
                    to: Vec::new(),
                    again: spread.player(first + i).clone(),
                    rejoin: json!({"t": "join", "protocol": 1, "pin": room.pin, "name": format!("p{i}"), "token": token}),
                    hz: p.player_hz,
                    phase: phase(),
                },
            ));
        }
        if !p.quiet {
            eprint!("\rrooms ready: {}/{}", r + 1, p.rooms);
        }
    }
    if !p.quiet {
        eprintln!();
    }
    let n = clients.len();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(ws, c)| {
            let shared = Arc::clone(&shared);
            let pad = Arc::clone(&pad);
            tokio::spawn(run_client(ws, c, pad, shared))
        })
        .collect();
    tokio::time::sleep(p.warmup).await;
    let _ = shared.killed.set(Instant::now());
    let killed_at_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // SAFETY: kill(2) with a plain PID and signal has no memory effects.
    if unsafe { libc::kill(p.kill_pid as libc::pid_t, libc::SIGKILL) } != 0 {
        shared.stop.send_replace(true);
        bail!(
            "killing {}: {}",
            p.kill_pid,
            std::io::Error::last_os_error()
        );
    }
    // Every client is done once it has its first frame after the kill (or
    // gave up); the guard ends the rest.
    let done = |s: &Shared| {
        let h = s.hosts.lock().unwrap().len() + s.players.lock().unwrap().len();
        let f: u64 = s.failures.lock().unwrap().values().sum();
        (h + f) as usize >= n
    };
    let guard = Instant::now() + p.guard;
    while !done(&shared) && Instant::now() < guard {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if !p.quiet {
            let got = shared.hosts.lock().unwrap().len() + shared.players.lock().unwrap().len();
            eprint!(
                "\r{:>5.1} s after the kill: {got}/{n} clients have a frame   ",
                shared.killed.get().unwrap().elapsed().as_secs_f64()
            );
        }
    }
    if !p.quiet {
        eprintln!();
    }
    shared.stop.send_replace(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let hosts = shared.hosts.lock().unwrap().clone();
    let players = shared.players.lock().unwrap().clone();
    let mut all = hosts.clone();
    let _ = all.add(&players);
    let recovered = all.len() as usize;
    let mut failures = shared.failures.lock().unwrap().clone();
    let accounted = recovered + failures.values().sum::<u64>() as usize;
    if accounted < n {
        failures.insert("no frame within the guard".into(), (n - accounted) as u64);
    }
    let rejoined_hosts = shared.rejoined_hosts.lock().unwrap().clone();
    let rejoined_players = shared.rejoined_players.lock().unwrap().clone();
    let mut rejoined = rejoined_hosts.clone();
    let _ = rejoined.add(&rejoined_players);
    let refusals = shared.refusals.lock().unwrap().clone();
    let refused = shared.refused.lock().unwrap().clone();
    Ok(FailoverResult {
        rooms: p.rooms,
        players: p.players,
        clients: n,
        recovered,
        guard_s: p.guard.as_secs_f64(),
        killed_at_unix_ms,
        rejoined: latency(&Some(rejoined)),
        rejoined_hosts: latency(&Some(rejoined_hosts)),
        rejoined_players: latency(&Some(rejoined_players)),
        first_frame: latency(&Some(all)),
        first_frame_hosts: latency(&Some(hosts)),
        first_frame_players: latency(&Some(players)),
        attempts: shared.attempts.load(Relaxed) as u64,
        refusals,
        refusal_time: latency(&Some(refused)),
        failures,
    })
}
