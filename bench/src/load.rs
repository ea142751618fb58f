//! The relay load generator: rooms created over HTTP, one host and P
//! players per room over real WebSockets, traffic at set rates, one-way
//! latency from the send time embedded in each payload.

use crate::procstat::{self, CpuUse, ProcSample};
use anyhow::{anyhow, bail, Context as _, Result};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Where the server is.
#[derive(Debug, Clone)]
pub struct Target {
    pub http: String,
    pub ws: String,
    pub origin: String,
}

impl Target {
    pub fn new(url: &str, origin: &str) -> Target {
        let http = url.trim_end_matches('/').to_owned();
        let ws = if let Some(rest) = http.strip_prefix("https://") {
            format!("wss://{rest}/ws")
        } else {
            format!("ws://{}/ws", http.trim_start_matches("http://"))
        };
        Target {
            http,
            ws,
            origin: origin.to_owned(),
        }
    }
}

/// Where a run's clients go: each room's host to `host`, its players
/// round-robin over `players` (several nodes of a cluster; one server when
/// they are the host's).
#[derive(Debug, Clone)]
pub struct Spread {
    pub host: Target,
    pub players: Vec<Target>,
}

impl Spread {
    /// Every client to `t`.
    pub fn one(t: &Target) -> Spread {
        Spread {
            host: t.clone(),
            players: vec![t.clone()],
        }
    }

    /// The target of the run's `k`th player (counted over every room, so
    /// that each room has players on each target).
    pub fn player(&self, k: usize) -> &Target {
        self.players
            .get(k % self.players.len().max(1))
            .unwrap_or(&self.host)
    }
}

/// The processes whose CPU and memory a run reads from /proc: the servers'
/// (summed: one node, or every node of a cluster) and those beside them
/// (NATS), summed apart.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    pub servers: Vec<u32>,
    pub side: Vec<u32>,
}

impl Watch {
    pub fn server(pid: Option<u32>) -> Watch {
        Watch {
            servers: pid.into_iter().collect(),
            side: Vec::new(),
        }
    }
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    base().elapsed().as_micros() as u64
}

/// What a run is doing now.
const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// Shared counters of a run.
pub struct Counters {
    phase: AtomicU8,
    /// Wakes every connection task when the run stops.
    stop: tokio::sync::watch::Sender<bool>,
    pub sent: AtomicU64,
    pub delivered: AtomicU64,
    pub measured_delivered: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    closes: Mutex<BTreeMap<String, u64>>,
    hist: Mutex<Option<Histogram<u64>>>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            phase: AtomicU8::new(WARMUP),
            stop: tokio::sync::watch::channel(false).0,
            sent: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            measured_delivered: AtomicU64::new(0),
            errors: Mutex::default(),
            closes: Mutex::default(),
            hist: Mutex::default(),
        }
    }
}

impl Counters {
    fn stop(&self) {
        self.phase.store(STOP, Relaxed);
        self.stop.send_replace(true);
    }

    fn error(&self, code: &str) {
        *self
            .errors
            .lock()
            .unwrap()
            .entry(code.to_owned())
            .or_default() += 1;
    }
    fn close(&self, code: &str) {
        *self
            .closes
            .lock()
            .unwrap()
            .entry(code.to_owned())
            .or_default() += 1;
    }
    fn merge(&self, h: &Histogram<u64>) {
        let mut g = self.hist.lock().unwrap();
        match g.as_mut() {
            Some(all) => {
                let _ = all.add(h);
            }
            None => *g = Some(h.clone()),
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// The embedded send time, from a received `data` or `from` frame.
fn sent_at(frame: &str) -> Option<u64> {
    let i = frame.find("\"ts\":")? + 5;
    let rest = &frame.as_bytes()[i..];
    let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..n]).ok()?.parse().ok()
}

/// Where in its period sender `k` ticks, spread evenly so that the
/// offered load is smooth rather than every sender at once.
fn phase_of(k: usize) -> f64 {
    (k as f64 * 0.618_033_988_749_895).fract()
}

fn payload(pad: &str, flood: bool) -> String {
    // ~payload bytes of JSON: the send time, a marker, padding.
    format!(
        "{{\"ts\":{},\"f\":{},\"p\":\"{pad}\"}}",
        now_us(),
        u8::from(flood)
    )
}

pub async fn create_room(http: &reqwest::Client, t: &Target) -> Result<(String, String)> {
    let r = http
        .post(format!("{}/api/rooms", t.http))
        .header("Origin", &t.origin)
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("POST /api/rooms: {}", r.status());
    }
    let v: Value = r.json().await?;
    Ok((
        v["pin"].as_str().context("pin")?.to_owned(),
        v["hostToken"].as_str().context("hostToken")?.to_owned(),
    ))
}

pub async fn connect(t: &Target) -> Result<Ws> {
    let mut req = t.ws.as_str().into_client_request()?;
    req.headers_mut().insert("Origin", t.origin.parse()?);
    // tungstenite zero-fills the whole free read buffer before each read
    // (128 KiB by default): half of the generator's CPU went to that.
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(16 * 1024);
    // TCP_NODELAY: small frames must not wait for delayed ACKs.
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(config), true).await?;
    Ok(ws)
}

async fn next_json(ws: &mut Ws) -> Result<Value> {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Err(_) => bail!("no answer in 30 s"),
            Ok(None) => bail!("connection closed"),
            Ok(Some(Err(e))) => bail!("{e}"),
            Ok(Some(Ok(Message::Text(t)))) => return Ok(serde_json::from_str(&t)?),
            Ok(Some(Ok(_))) => continue,
        }
    }
}

/// A room ready for traffic.
pub struct Room {
    pub pin: String,
    pub host_token: String,
    pub host: Ws,
    pub players: Vec<(Ws, String)>,
}

pub async fn open_room(http: &reqwest::Client, t: &Target, players: usize) -> Result<Room> {
    Ok(open_room_spread(http, &Spread::one(t), players, 0).await?.0)
}

/// A room whose host is on `spread.host` and whose players are spread
/// from the run's `first`th player on; also each player's rejoin token.
pub async fn open_room_spread(
    http: &reqwest::Client,
    spread: &Spread,
    players: usize,
    first: usize,
) -> Result<(Room, Vec<String>)> {
    let t = &spread.host;
    let (pin, token) = create_room(http, t).await?;
    let mut host = connect(t).await?;
    host.send(Message::Text(
        json!({"t": "host", "protocol": 1, "pin": pin, "hostToken": token})
            .to_string()
            .into(),
    ))
    .await?;
    let v = next_json(&mut host).await?;
    if v["t"] != "hosting" {
        bail!("host attach failed: {v}");
    }
    let mut list = Vec::with_capacity(players);
    let mut tokens = Vec::with_capacity(players);
    for i in 0..players {
        let mut p = connect(spread.player(first + i)).await?;
        p.send(Message::Text(
            json!({"t": "join", "protocol": 1, "pin": pin, "name": format!("p{i}")})
                .to_string()
                .into(),
        ))
        .await?;
        let v = next_json(&mut p).await?;
        let id = v["playerId"]
            .as_str()
            .ok_or_else(|| anyhow!("join failed: {v}"))?
            .to_owned();
        tokens.push(v["token"].as_str().unwrap_or_default().to_owned());
        list.push((p, id));
    }
    // The host's presence frames.
    for _ in 0..players {
        next_json(&mut host).await?;
    }
    Ok((
        Room {
            pin,
            host_token: token,
            host,
            players: list,
        },
        tokens,
    ))
}

fn record(frame: &str, c: &Counters, h: &mut Histogram<u64>, count_flood: bool) {
    if frame.starts_with("{\"t\":\"error\"") {
        let code = serde_json::from_str::<Value>(frame)
            .ok()
            .and_then(|v| v["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        c.error(&code);
        return;
    }
    let Some(ts) = sent_at(frame) else { return };
    c.delivered.fetch_add(1, Relaxed);
    if c.phase.load(Relaxed) == MEASURE {
        let flood = frame.contains("\"f\":1");
        if flood && !count_flood {
            return;
        }
        c.measured_delivered.fetch_add(1, Relaxed);
        let _ = h.record(now_us().saturating_sub(ts).max(1));
    }
}

fn note_close(
    m: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
    c: &Counters,
) -> bool {
    match m {
        None => {
            c.close("eof");
            true
        }
        Some(Err(_)) => {
            c.close("error");
            true
        }
        Some(Ok(Message::Close(f))) => {
            c.close(
                &f.map(|f| u16::from(f.code).to_string())
                    .unwrap_or_else(|| "none".into()),
            );
            true
        }
        _ => false,
    }
}

/// One connection: every tick (at `hz`, at most `budget` ticks) it sends
/// the frames `frames` makes, in one flush; it records what it receives.
async fn run_connection<F>(mut ws: Ws, s: Sender, c: Arc<Counters>, frames: F)
where
    F: Fn() -> Vec<String> + Send,
{
    let mut h = histogram();
    let mut left = s.budget.unwrap_or(u64::MAX);
    let hz = s.hz;
    let period = Duration::from_secs_f64(1.0 / hz.max(0.001));
    let first = tokio::time::Instant::now() + period.mul_f64(s.phase);
    let mut tick = tokio::time::interval_at(first, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = c.stop.subscribe();
    // One waiter for the whole run, not a new one per frame.
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::pin!(stopped);
    'run: loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = tick.tick(), if hz > 0.0 && left > 0 => {
                left -= 1;
                for f in frames() {
                    if ws.feed(Message::Text(f.into())).await.is_err() {
                        c.close("error");
                        break 'run;
                    }
                    c.sent.fetch_add(1, Relaxed);
                }
                if ws.flush().await.is_err() {
                    c.close("error");
                    break;
                }
            }
            m = ws.next() => {
                if let Some(Ok(Message::Text(t))) = &m {
                    record(t, &c, &mut h, false);
                    continue;
                }
                if note_close(m, &c) {
                    break;
                }
            }
        }
    }
    c.merge(&h);
    let _ = ws.close(None).await;
}

/// How one connection sends.
#[derive(Clone, Copy)]
struct Sender {
    hz: f64,
    /// Where in the period its first tick falls (0..1).
    phase: f64,
    /// At most this many ticks (count mode).
    budget: Option<u64>,
}

/// The host: a `to` for each player every tick.
async fn run_host(ws: Ws, ids: Vec<String>, s: Sender, pad: Arc<String>, c: Arc<Counters>) {
    let to: Vec<String> = ids
        .iter()
        .map(|id| serde_json::to_string(id).unwrap_or_default())
        .collect();
    let frames = move || {
        to.iter()
            .map(|id| {
                format!(
                    "{{\"t\":\"to\",\"to\":{id},\"data\":{}}}",
                    payload(&pad, false)
                )
            })
            .collect()
    };
    run_connection(ws, s, c, frames).await;
}

/// A player: one `up` every tick.
async fn run_player(ws: Ws, s: Sender, pad: Arc<String>, c: Arc<Counters>, flood: bool) {
    let frames = move || {
        vec![format!(
            "{{\"t\":\"up\",\"data\":{}}}",
            payload(&pad, flood)
        )]
    };
    run_connection(ws, s, c, frames).await;
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub samples: u64,
    /// (latency µs, percentile) points for plotting.
    pub curve: Vec<(u64, f64)>,
}

pub fn latency(h: &Option<Histogram<u64>>) -> Latency {
    match h {
        Some(h) if !h.is_empty() => Latency {
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            samples: h.len(),
            curve: h
                .iter_quantiles(2)
                .map(|v| (v.value_iterated_to(), v.percentile()))
                .collect(),
        },
        _ => Latency {
            p50_us: 0,
            p90_us: 0,
            p99_us: 0,
            p999_us: 0,
            max_us: 0,
            samples: 0,
            curve: vec![],
        },
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub rooms: usize,
    pub players: usize,
    pub player_hz: f64,
    pub host_hz: f64,
    pub offered_per_s: f64,
    pub delivered_per_s: f64,
    pub seconds: f64,
    pub latency: Latency,
    pub errors: BTreeMap<String, u64>,
    pub closes: BTreeMap<String, u64>,
    pub server_cpu: Option<CpuUse>,
    pub server_rss_kb: Option<u64>,
    /// How many server processes `server_cpu` and `server_rss_kb` sum.
    pub servers: usize,
    /// The processes beside the servers (NATS), summed apart.
    pub side_cpu: Option<CpuUse>,
}

#[derive(Debug, Clone)]
pub struct Classroom {
    pub rooms: usize,
    pub players: usize,
    pub player_hz: f64,
    pub host_hz: f64,
    pub payload: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// One extra player in the first room sends at this rate (flood).
    pub flooder_hz: Option<f64>,
    /// Count mode (the smoke test): every sender sends this many frames
    /// and the run ends when all of them arrived, not after a duration.
    pub frames_per_sender: Option<u64>,
    pub quiet: bool,
}

/// Runs classroom traffic and measures it.
pub async fn classroom(t: &Target, p: &Classroom, server_pid: Option<u32>) -> Result<RunResult> {
    classroom_spread(&Spread::one(t), p, &Watch::server(server_pid)).await
}

/// Classroom traffic with the hosts and players where `spread` puts them,
/// the CPU of every process of `watch`.
pub async fn classroom_spread(spread: &Spread, p: &Classroom, watch: &Watch) -> Result<RunResult> {
    let t = &spread.host;
    let http = reqwest::Client::new();
    let pad = Arc::new("x".repeat(p.payload.saturating_sub(40).max(1)));
    let c = Arc::new(Counters::default());
    c.phase.store(WARMUP, Relaxed);
    let mut rooms = Vec::new();
    for i in 0..p.rooms {
        rooms.push(
            open_room_spread(&http, spread, p.players, i * p.players)
                .await
                .with_context(|| format!("opening room {i}"))?
                .0,
        );
        if !p.quiet {
            eprint!("\rrooms ready: {}/{}", i + 1, p.rooms);
        }
    }
    let mut flooder = None;
    if p.flooder_hz.is_some() {
        let extra = open_room_player(t, &rooms[0]).await?;
        flooder = Some(extra);
    }
    if !p.quiet {
        eprintln!();
    }
    let mut tasks = Vec::new();
    let budget = p.frames_per_sender;
    let mut k = 0;
    let mut sender = |hz: f64| {
        k += 1;
        Sender {
            hz,
            phase: phase_of(k),
            budget,
        }
    };
    for r in rooms {
        let ids: Vec<String> = r.players.iter().map(|(_, id)| id.clone()).collect();
        let s = sender(p.host_hz);
        tasks.push(tokio::spawn(run_host(
            r.host,
            ids,
            s,
            Arc::clone(&pad),
            Arc::clone(&c),
        )));
        for (ws, _) in r.players {
            let s = sender(p.player_hz);
            tasks.push(tokio::spawn(run_player(
                ws,
                s,
                Arc::clone(&pad),
                Arc::clone(&c),
                false,
            )));
        }
    }
    if let (Some(ws), Some(hz)) = (flooder, p.flooder_hz) {
        let s = sender(hz);
        tasks.push(tokio::spawn(run_player(
            ws,
            s,
            Arc::clone(&pad),
            Arc::clone(&c),
            true,
        )));
    }
    if let Some(n) = p.frames_per_sender {
        // Count mode: measure everything; end when every frame arrived (a
        // guard ends a run that lost frames).
        let expected = n * (p.rooms * p.players * 2) as u64;
        let start = Instant::now();
        c.phase.store(MEASURE, Relaxed);
        let guard = Instant::now() + Duration::from_secs(60);
        while c.measured_delivered.load(Relaxed) < expected && Instant::now() < guard {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        c.stop();
        let seconds = start.elapsed().as_secs_f64();
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        return Ok(run_result(
            p,
            &c,
            expected as f64 / seconds,
            seconds,
            Measured::default(),
        ));
    }
    tokio::time::sleep(p.warmup).await;
    let before = procstat::sample_all(&watch.servers);
    let side_before = procstat::sample_all(&watch.side);
    let start = Instant::now();
    c.phase.store(MEASURE, Relaxed);
    let mut last = c.delivered.load(Relaxed);
    let end = start + p.duration;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(1).min(end - Instant::now())).await;
        let now = c.delivered.load(Relaxed);
        if !p.quiet {
            eprint!(
                "\r{:>6.1} s  delivered {:>10}/s  errors {:?}   ",
                start.elapsed().as_secs_f64(),
                now - last,
                c.errors.lock().unwrap()
            );
        }
        last = now;
    }
    c.stop();
    let seconds = start.elapsed().as_secs_f64();
    let after = procstat::sample_all(&watch.servers);
    let side_after = procstat::sample_all(&watch.side);
    if !p.quiet {
        eprintln!();
    }
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    let offered = p.rooms as f64 * p.players as f64 * (p.host_hz + p.player_hz);
    let between = |a: Option<ProcSample>, b: Option<ProcSample>| {
        a.zip(b).map(|(a, b)| procstat::cpu_between(a, b, seconds))
    };
    let m = Measured {
        cpu: between(before, after),
        rss: after.map(|a| a.rss_kb),
        servers: watch.servers.len(),
        side_cpu: between(side_before, side_after),
    };
    Ok(run_result(p, &c, offered, seconds, m))
}

/// What /proc said of the watched processes over a run.
#[derive(Default)]
struct Measured {
    cpu: Option<CpuUse>,
    rss: Option<u64>,
    servers: usize,
    side_cpu: Option<CpuUse>,
}

fn run_result(p: &Classroom, c: &Counters, offered: f64, seconds: f64, m: Measured) -> RunResult {
    let hist = c.hist.lock().unwrap().clone();
    let errors = c.errors.lock().unwrap().clone();
    let closes = c.closes.lock().unwrap().clone();
    RunResult {
        rooms: p.rooms,
        players: p.players,
        player_hz: p.player_hz,
        host_hz: p.host_hz,
        offered_per_s: offered,
        delivered_per_s: c.measured_delivered.load(Relaxed) as f64 / seconds,
        seconds,
        latency: latency(&hist),
        errors,
        closes,
        server_cpu: m.cpu,
        server_rss_kb: m.rss,
        servers: m.servers,
        side_cpu: m.side_cpu,
    }
}

/// One more player in `room` (the flooder); the host's presence frame for
/// it is read by the host task and ignored.
async fn open_room_player(t: &Target, room: &Room) -> Result<Ws> {
    let mut p = connect(t).await?;
    p.send(Message::Text(
        json!({"t": "join", "protocol": 1, "pin": room.pin, "name": "flooder"})
            .to_string()
            .into(),
    ))
    .await?;
    let v = next_json(&mut p).await?;
    if v["t"] != "joined" {
        bail!("flooder join failed: {v}");
    }
    Ok(p)
}

/// Idle connections: join and send nothing; memory per connection.
#[derive(Debug, Clone, Serialize)]
pub struct IdleResult {
    pub connections: usize,
    pub rss_kb_before: u64,
    pub rss_kb_after: u64,
    pub bytes_per_connection: f64,
    /// The same from the anonymous part of RSS alone (`RssAnon`).
    pub anon_kb_before: u64,
    pub anon_kb_after: u64,
    pub anon_bytes_per_connection: f64,
    pub held_seconds: f64,
    pub still_open: usize,
    /// How many waves the connections came in.
    pub waves: usize,
}

pub async fn idle(
    t: &Target,
    n: usize,
    hold: Duration,
    server_pid: u32,
    quiet: bool,
) -> Result<IdleResult> {
    idle_spread(&Spread::one(t), n, Waves::ONE, hold, &[server_pid], quiet).await
}

/// How idle connections arrive: `count` waves of equal size, `gap` apart.
#[derive(Debug, Clone, Copy)]
pub struct Waves {
    pub count: usize,
    pub gap: Duration,
}

impl Waves {
    /// Every connection at once, one after another.
    pub const ONE: Waves = Waves {
        count: 1,
        gap: Duration::ZERO,
    };
}

/// Idle connections spread over `spread`'s player targets (rooms created on
/// its host's); memory summed over `servers` (every node of a cluster).
pub async fn idle_spread(
    spread: &Spread,
    n: usize,
    waves: Waves,
    hold: Duration,
    servers: &[u32],
    quiet: bool,
) -> Result<IdleResult> {
    let t = &spread.host;
    let http = reqwest::Client::new();
    let before = procstat::sample_all(servers).context("reading the servers' /proc")?;
    let mut conns: Vec<Ws> = Vec::with_capacity(n);
    let per_room = 100usize;
    let mut pin = String::new();
    let per_wave = n.div_ceil(waves.count.max(1));
    for i in 0..n {
        if i > 0 && i % per_wave == 0 {
            tokio::time::sleep(waves.gap).await;
        }
        if i % per_room == 0 {
            pin = create_room(&http, t).await?.0;
        }
        let mut p = connect(spread.player(i))
            .await
            .with_context(|| format!("connection {i}"))?;
        p.send(Message::Text(
            json!({"t": "join", "protocol": 1, "pin": pin, "name": "idle"})
                .to_string()
                .into(),
        ))
        .await?;
        let v = next_json(&mut p).await?;
        if v["t"] != "joined" {
            bail!("join failed: {v}");
        }
        conns.push(p);
        if !quiet && i % 500 == 0 {
            eprint!("\rconnections: {}/{n}", i + 1);
        }
    }
    if !quiet {
        eprintln!();
    }
    let start = Instant::now();
    tokio::time::sleep(hold).await;
    let after = procstat::sample_all(servers).context("reading the servers' /proc")?;
    // Every connection is still usable: a ping on each.
    let mut open = 0;
    for ws in conns.iter_mut() {
        if ws
            .send(Message::Text(r#"{"t":"ping"}"#.into()))
            .await
            .is_ok()
            && next_json(ws).await.is_ok()
        {
            open += 1;
        }
    }
    Ok(IdleResult {
        connections: n,
        rss_kb_before: before.rss_kb,
        rss_kb_after: after.rss_kb,
        bytes_per_connection: (after.rss_kb.saturating_sub(before.rss_kb) * 1024) as f64 / n as f64,
        anon_kb_before: before.anon_kb,
        anon_kb_after: after.anon_kb,
        anon_bytes_per_connection: (after.anon_kb.saturating_sub(before.anon_kb) * 1024) as f64
            / n as f64,
        held_seconds: start.elapsed().as_secs_f64(),
        still_open: open,
        waves: waves.count,
    })
}
