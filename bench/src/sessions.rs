//! Hosted Memizy sessions under load: N sessions of a board (the authority)
//! and C controllers, created over the HTTP API and played by the headless
//! device client over `/memizy/session/ws`. Controllers `send` to the
//! authority; the board sends each controller its own view (`to: [id]`,
//! as SPEC 8.1 expects of an authority) or broadcasts (`to: "all"`). Each
//! message carries its send time; the latency is from the `send` call to
//! the recipient's `deliver`, timed as the frame is read.

use crate::load::{latency, Latency};
use crate::procstat::{self, CpuUse, ProcSample};
use anyhow::{anyhow, bail, Context as _, Result};
use futures_util::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use hostwire::sessions::device::{Device, PluginCall, RemoteError};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The plugin every session runs.
pub const PLUGIN_ID: &str = "https://example.com/plugins/bench-race";
/// SPEC 8.1's guaranteed `send` rate: per controller, and the authority's
/// per other instance.
pub const SPEC_SEND_HZ: f64 = 30.0;
/// Sessions set up at once (HTTP, attach, `hello`, `ready`).
const SETUP_CONCURRENCY: usize = 8;
/// A guard on each set-up step and on the count mode, not a pace.
const GUARD: Duration = Duration::from_secs(60);
/// How long answers still in flight are awaited after a step stops.
const ANSWER_GRACE: Duration = Duration::from_secs(5);
/// A device's ticks of `send`s awaiting their answers, at most: a tick
/// that would pass it is skipped (and counted), so a server that falls
/// behind holds the load back instead of growing the client's queues.
pub const TICKS_IN_FLIGHT: usize = 4;

/// How the board answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BoardTo {
    /// One `send` per controller, `to: [id]`: each device its own view.
    Each,
    /// One `send` to `"all"` per tick.
    All,
}

#[derive(Debug, Clone)]
pub struct Params {
    pub sessions: usize,
    pub controllers: usize,
    /// Per-instance rates to measure, one step each, on the same sessions:
    /// each controller's `send`s per second, and the board's per controller.
    pub rates: Vec<f64>,
    pub board_to: BoardTo,
    /// Bytes of each message's data.
    pub payload: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Count mode (the smoke test): every sender ticks this many times and
    /// a step ends when every message arrived, not after a duration.
    pub ticks_per_sender: Option<u64>,
    pub quiet: bool,
}

/// The only place the bench attaches a device: connect with the
/// instance's token (the host token for the board, the player's own for a
/// controller) and `hello`.
pub async fn attach(
    ws: &str,
    session: &str,
    view: &str,
    address: &str,
    token: &str,
) -> Result<Device> {
    let d = Device::connect(ws, session, view, address, token)
        .await
        .with_context(|| format!("attaching {view} {address}"))?;
    d.hello(PLUGIN_ID)
        .await
        .map_err(|e| anyhow!("hello of {view} {address}: {e}"))?;
    Ok(d)
}

fn manifest(max_players: usize) -> Value {
    json!({
        "version": "1.0",
        "id": PLUGIN_ID,
        "appName": "Bench Race",
        "pluginVersion": "1.0.0",
        "capabilities": {"actions": ["render"], "types": ["mcq-single", "true-false"]},
        "appSpecific": {"memizy": {
            "protocol": "1.0",
            "modes": {
                "multiplayer": {"players": {"min": 1, "max": max_players}, "hostAs": ["presenter"], "lateJoin": true}
            }
        }}
    })
}

/// A presenter session of `controllers` players: a small plugin bundle
/// (the manifest island and nothing else) and a two-item set.
pub fn create_body(controllers: usize) -> Value {
    let html = format!(
        "<!doctype html><html><head><script type=\"application/oqse-manifest+json\">{}</script></head><body></body></html>",
        manifest(controllers.clamp(1, 200))
    );
    let players: Vec<Value> = (1..=controllers)
        .map(|i| json!({"id": format!("p{i}"), "name": format!("Player {i}")}))
        .collect();
    json!({
        "pluginHtml": html,
        "set": {
            "meta": {"id": "bench-set", "title": "Planets"},
            "items": [
                {"id": "q1", "type": "mcq-single", "question": "Largest planet?",
                 "options": [{"id": "j", "text": "Jupiter"}, {"id": "m", "text": "Mars"}],
                 "correctId": "j"},
                {"id": "q2", "type": "true-false", "question": "Sound is faster than light.", "correctAnswer": false}
            ]
        },
        "mode": "multiplayer",
        "hostAs": "presenter",
        "players": players,
        // Play starts as soon as every instance is ready.
        "timing": {"countdownMs": 0}
    })
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn us_of(at: Instant) -> u64 {
    at.saturating_duration_since(base()).as_micros() as u64
}

fn now_us() -> u64 {
    us_of(Instant::now())
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// One session, every device attached, `hello` and `ready` said, `start()`
/// delivered to the board.
struct Game {
    board: Device,
    controllers: Vec<(Device, String)>,
}

/// Times a creation answered 503 (the server handles at most
/// `CONCURRENT_SESSION_CREATIONS` at once) is tried again.
const CREATION_RETRIES: usize = 200;

async fn open_session(http: &reqwest::Client, url: &str, ws: &str, c: usize) -> Result<Game> {
    let body = create_body(c);
    let mut tries = 0;
    let r = loop {
        let mut req = http.post(format!("{url}/memizy/sessions")).json(&body);
        // Creating a session needs the server's operator credential.
        if let Some(op) = crate::p3match::operator_credential() {
            req = req.bearer_auth(op);
        }
        let r = req.send().await?;
        if r.status().as_u16() == 503 && tries < CREATION_RETRIES {
            // The server says to try again: more setup requests are in
            // flight than it creates at once.
            tries += 1;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            continue;
        }
        break r;
    };
    if r.status().as_u16() != 201 {
        bail!("POST /memizy/sessions: {} {}", r.status(), r.text().await?);
    }
    let v: Value = r.json().await?;
    let sid = v["sessionId"].as_str().context("sessionId")?.to_owned();
    let token = v["hostToken"].as_str().context("hostToken")?.to_owned();
    let r = http
        .post(format!("{url}/memizy/sessions/{sid}/start"))
        .bearer_auth(&token)
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("start: {} {}", r.status(), r.text().await?);
    }
    let player_tokens = &v["playerTokens"];
    let mut board = attach(ws, &sid, "board", "board", &token).await?;
    ready(&board).await?;
    let mut controllers = Vec::with_capacity(c);
    for i in 1..=c {
        let id = format!("p{i}");
        let player_token = player_tokens[&id]
            .as_str()
            .with_context(|| format!("playerTokens.{id}"))?;
        let d = attach(ws, &sid, "controller", &id, player_token).await?;
        ready(&d).await?;
        controllers.push((d, id));
    }
    board
        .wait_for("start", GUARD)
        .await
        .ok_or_else(|| anyhow!("session {sid}: no start() on the board"))?;
    // What came before play (playersChanged, …) is not measured.
    board.drain_calls();
    for (d, _) in &mut controllers {
        d.drain_calls();
    }
    Ok(Game { board, controllers })
}

async fn ready(d: &Device) -> Result<()> {
    d.call("ready", json!([]))
        .await
        .map(|_| ())
        .map_err(|e| anyhow!("ready: {e}"))
}

/// Shared counters of one step.
#[derive(Default)]
struct Counters {
    /// The measured window, µs since [`base`]: `u64::MAX` until set.
    window: Mutex<(u64, u64)>,
    sends_ok: AtomicU64,
    /// Messages delivered within the window, by direction.
    to_board: AtomicU64,
    to_controllers: AtomicU64,
    /// Every message delivered (count mode's end).
    all_delivered: AtomicU64,
    /// `send`s answered with an error, by code.
    errors: Mutex<BTreeMap<String, u64>>,
    unanswered: AtomicU64,
    /// `send`s not made because their device had [`TICKS_IN_FLIGHT`] ticks
    /// unanswered.
    held_back: AtomicU64,
    hist_to_board: Mutex<Option<Histogram<u64>>>,
    hist_to_controllers: Mutex<Option<Histogram<u64>>>,
}

impl Counters {
    fn new() -> Counters {
        let c = Counters::default();
        *c.window.lock().unwrap() = (u64::MAX, u64::MAX);
        c
    }
    fn in_window(&self, at_us: u64) -> bool {
        let (a, b) = *self.window.lock().unwrap();
        at_us >= a && at_us < b
    }
    fn error(&self, code: &str) {
        *self
            .errors
            .lock()
            .unwrap()
            .entry(code.to_owned())
            .or_default() += 1;
    }
    fn merge(slot: &Mutex<Option<Histogram<u64>>>, h: &Histogram<u64>) {
        let mut g = slot.lock().unwrap();
        match g.as_mut() {
            Some(all) => {
                let _ = all.add(h);
            }
            None => *g = Some(h.clone()),
        }
    }
}

/// How one device sends in a step.
#[derive(Clone, Copy)]
struct Pace {
    hz: f64,
    /// Where in the period its first tick falls (0..1).
    phase: f64,
    /// At most this many sending ticks (count mode).
    budget: Option<u64>,
}

/// Where in its period sender `k` ticks, spread evenly over the period.
fn phase_of(k: usize) -> f64 {
    (k as f64 * 0.618_033_988_749_895).fract()
}

fn message(to: Value, pad: &str) -> Value {
    json!([{"to": to, "data": {"ts": now_us(), "p": pad}}])
}

type Answer = oneshot::Receiver<Result<Value, RemoteError>>;

/// Records the `deliver`s a device got: latency from the embedded send
/// time to the moment the frame was read.
fn take_delivers(calls: Vec<PluginCall>, c: &Counters, h: &mut Histogram<u64>, to_board: bool) {
    for call in calls {
        if call.method != "deliver" {
            continue;
        }
        let Some(ts) = call.args[0]["data"]["ts"].as_u64() else {
            continue;
        };
        c.all_delivered.fetch_add(1, Relaxed);
        let at = us_of(call.at);
        if c.in_window(at) {
            if to_board {
                c.to_board.fetch_add(1, Relaxed);
            } else {
                c.to_controllers.fetch_add(1, Relaxed);
            }
            let _ = h.record(at.saturating_sub(ts).max(1));
        }
    }
}

/// One device for one step: every tick it sends what `frames` makes and
/// takes the `deliver`s read since the last tick (each was timed as it was
/// read, so taking them once a tick costs no accuracy). Returns the device
/// for the next step.
async fn play<F>(
    mut d: Device,
    pace: Pace,
    c: Arc<Counters>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    to_board: bool,
    frames: F,
) -> Device
where
    F: Fn() -> Vec<Value> + Send,
{
    let mut h = histogram();
    let mut left = pace.budget.unwrap_or(u64::MAX);
    let period = Duration::from_secs_f64(1.0 / pace.hz.max(0.001));
    let first = tokio::time::Instant::now() + period.mul_f64(pace.phase);
    let mut tick = tokio::time::interval_at(first, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut answers: FuturesUnordered<Answer> = FuturesUnordered::new();
    // The `send`s of one tick.
    let mut batch = 1;
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::pin!(stopped);
    let note =
        |c: &Counters, r: Result<Result<Value, RemoteError>, oneshot::error::RecvError>| match r {
            Ok(Ok(_)) => {
                c.sends_ok.fetch_add(1, Relaxed);
            }
            Ok(Err(e)) => c.error(&e.code),
            Err(_) => c.error("TRANSPORT_CLOSED"),
        };
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = tick.tick() => {
                if left > 0 {
                    if answers.len() + batch > TICKS_IN_FLIGHT * batch {
                        // Count mode sends this tick's later instead.
                        c.held_back.fetch_add(batch as u64, Relaxed);
                    } else {
                        left -= 1;
                        let f = frames();
                        batch = f.len().max(1);
                        for args in f {
                            answers.push(d.send_call("send", &args).1);
                        }
                    }
                }
                take_delivers(d.drain_calls(), &c, &mut h, to_board);
            }
            Some(r) = answers.next(), if !answers.is_empty() => note(&c, r),
        }
    }
    // Every call ends: answered within the grace, or counted as unanswered.
    let grace = tokio::time::Instant::now() + ANSWER_GRACE;
    while !answers.is_empty() {
        match tokio::time::timeout_at(grace, answers.next()).await {
            Ok(Some(r)) => note(&c, r),
            Ok(None) => break,
            Err(_) => {
                c.unanswered.fetch_add(answers.len() as u64, Relaxed);
                break;
            }
        }
    }
    take_delivers(d.drain_calls(), &c, &mut h, to_board);
    let slot = if to_board {
        &c.hist_to_board
    } else {
        &c.hist_to_controllers
    };
    Counters::merge(slot, &h);
    d
}

#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    pub sessions: usize,
    pub controllers: usize,
    /// Each controller's `send`s per second; the board's per controller.
    pub rate_hz: f64,
    pub board_to: BoardTo,
    /// Messages offered to routing per second (one per recipient).
    pub offered_per_s: f64,
    /// Messages delivered per second (a `deliver` read by its recipient):
    /// the routed calls.
    pub routed_per_s: f64,
    pub to_board_per_s: f64,
    pub to_controllers_per_s: f64,
    /// `send` calls answered with success per second.
    pub sends_ok_per_s: f64,
    pub seconds: f64,
    /// From a controller's `send` to the board's `deliver`.
    pub latency_to_board: Latency,
    /// From the board's `send` to a controller's `deliver`.
    pub latency_to_controllers: Latency,
    pub errors: BTreeMap<String, u64>,
    pub unanswered: u64,
    /// `send`s held back over the step (warm-up included) because their
    /// device had [`TICKS_IN_FLIGHT`] ticks unanswered: the server was behind.
    pub held_back: u64,
    /// Devices the server closed during the step: goodbye reason or close code.
    pub closes: BTreeMap<String, u64>,
    pub server_cpu: Option<CpuUse>,
    /// Server CPU µs per routed call.
    pub server_us_per_routed: Option<f64>,
    pub server_rss_kb: Option<u64>,
    /// The load generator's own CPU: near 100 % it, not the server, limits.
    pub generator_cpu: Option<CpuUse>,
    /// How busy each core was over the window, whoever used it (the
    /// machine may be shared): a core near 100 % limits the process on it.
    pub cores_busy_pct: Vec<f64>,
}

/// Busy and total jiffies of each core, from /proc/stat.
fn core_times() -> Vec<(u64, u64)> {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return Vec::new();
    };
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect();
            let total: u64 = f.iter().take(8).sum();
            // idle and iowait
            let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
            (total - idle, total)
        })
        .collect()
}

fn busy_between(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let total = y.1.saturating_sub(x.1).max(1) as f64;
            100.0 * y.0.saturating_sub(x.0) as f64 / total
        })
        .collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub sessions: usize,
    pub controllers: usize,
    pub devices: usize,
    pub payload: usize,
    pub setup_seconds: f64,
    /// The server's RSS before the sessions were created and once every
    /// device was attached.
    pub server_rss_kb_before: Option<u64>,
    pub server_rss_kb_attached: Option<u64>,
    pub steps: Vec<StepResult>,
}

/// Creates the sessions, then measures each rate step on them.
pub async fn run(url: &str, p: &Params, server_pid: Option<u32>) -> Result<RunResult> {
    let url = url.trim_end_matches('/').to_owned();
    let ws = if let Some(rest) = url.strip_prefix("https://") {
        format!("wss://{rest}")
    } else {
        format!("ws://{}", url.trim_start_matches("http://"))
    };
    let http = reqwest::Client::new();
    let rss_before = server_pid.and_then(procstat::sample).map(|s| s.rss_kb);
    let t0 = Instant::now();
    let mut games: Vec<Game> = Vec::with_capacity(p.sessions);
    {
        let mut opening = futures_util::stream::iter(0..p.sessions)
            .map(|i| {
                let (http, url, ws) = (&http, &url, &ws);
                async move {
                    open_session(http, url, ws, p.controllers)
                        .await
                        .with_context(|| format!("session {i}"))
                }
            })
            .buffer_unordered(SETUP_CONCURRENCY);
        while let Some(g) = opening.next().await {
            games.push(g?);
            if !p.quiet {
                eprint!("\rsessions ready: {}/{}", games.len(), p.sessions);
            }
        }
    }
    if !p.quiet {
        eprintln!();
    }
    let setup_seconds = t0.elapsed().as_secs_f64();
    let rss_attached = server_pid.and_then(procstat::sample).map(|s| s.rss_kb);
    let mut steps = Vec::new();
    for &rate in &p.rates {
        let (r, back) = step(games, p, rate, server_pid).await?;
        games = back;
        if !p.quiet {
            eprintln!(
                "rate {rate:>5.1}/s: routed {:>9.0}/s of {:>9.0} offered, p99 to the board {} µs, server CPU {}",
                r.routed_per_s,
                r.offered_per_s,
                r.latency_to_board.p99_us,
                r.server_cpu.map_or("–".into(), |c| format!("{:.1} %", c.total_pct))
            );
        }
        steps.push(r);
    }
    for g in &games {
        g.board.close();
        for (d, _) in &g.controllers {
            d.close();
        }
    }
    Ok(RunResult {
        sessions: p.sessions,
        controllers: p.controllers,
        devices: p.sessions * (p.controllers + 1),
        payload: p.payload,
        setup_seconds,
        server_rss_kb_before: rss_before,
        server_rss_kb_attached: rss_attached,
        steps,
    })
}

async fn step(
    games: Vec<Game>,
    p: &Params,
    rate: f64,
    server_pid: Option<u32>,
) -> Result<(StepResult, Vec<Game>)> {
    let c = Arc::new(Counters::new());
    let pad: Arc<str> = "x".repeat(p.payload.saturating_sub(30).max(1)).into();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut k = 0;
    let mut pace = || {
        k += 1;
        Pace {
            hz: rate,
            phase: phase_of(k),
            budget: p.ticks_per_sender,
        }
    };
    let mut tasks = Vec::with_capacity(games.len());
    for g in games {
        let ids: Vec<String> = g.controllers.iter().map(|(_, id)| id.clone()).collect();
        let (pad2, board_to) = (Arc::clone(&pad), p.board_to);
        let board = tokio::spawn(play(
            g.board,
            pace(),
            Arc::clone(&c),
            stop_rx.clone(),
            true,
            move || match board_to {
                BoardTo::Each => ids.iter().map(|id| message(json!([id]), &pad2)).collect(),
                BoardTo::All => vec![message(json!("all"), &pad2)],
            },
        ));
        let mut ctrls = Vec::with_capacity(g.controllers.len());
        for (d, id) in g.controllers {
            let pad = Arc::clone(&pad);
            let t = tokio::spawn(play(
                d,
                pace(),
                Arc::clone(&c),
                stop_rx.clone(),
                false,
                move || vec![message(json!("authority"), &pad)],
            ));
            ctrls.push((t, id));
        }
        tasks.push((board, ctrls));
    }
    // Per controller and second: its own send and the board's to it.
    let per_s = (p.sessions * p.controllers) as f64 * 2.0 * rate;
    let (seconds, sends_ok, cpu, gen_cpu, rss, cores) = if let Some(n) = p.ticks_per_sender {
        // Count mode: everything is measured; the step ends when every
        // message arrived (the guard ends one that lost some).
        let expected = n * (p.sessions * p.controllers) as u64 * 2;
        *c.window.lock().unwrap() = (0, u64::MAX);
        let start = Instant::now();
        let guard = start + GUARD;
        while c.all_delivered.load(Relaxed) < expected && Instant::now() < guard {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let seconds = start.elapsed().as_secs_f64();
        (
            seconds,
            c.sends_ok.load(Relaxed),
            None,
            None,
            None,
            Vec::new(),
        )
    } else {
        tokio::time::sleep(p.warmup).await;
        let me = std::process::id();
        let before: Option<ProcSample> = server_pid.and_then(procstat::sample);
        let gen_before = procstat::sample(me);
        let cores_before = core_times();
        let start = Instant::now();
        c.window.lock().unwrap().0 = us_of(start);
        let sends_before = c.sends_ok.load(Relaxed);
        let end = start + p.duration;
        let mut last = 0;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_secs(1).min(end - Instant::now())).await;
            if !p.quiet {
                let now = c.sends_ok.load(Relaxed);
                eprint!(
                    "\r{:>6.1} s  sends answered {:>9}/s  errors {:?}   ",
                    start.elapsed().as_secs_f64(),
                    now - last,
                    c.errors.lock().unwrap()
                );
                last = now;
            }
        }
        let stop = Instant::now();
        c.window.lock().unwrap().1 = us_of(stop);
        let sends = c.sends_ok.load(Relaxed) - sends_before;
        let seconds = stop.duration_since(start).as_secs_f64();
        let after = server_pid.and_then(procstat::sample);
        let gen_after = procstat::sample(me);
        let cores = busy_between(&cores_before, &core_times());
        if !p.quiet {
            eprintln!();
        }
        (
            seconds,
            sends,
            before
                .zip(after)
                .map(|(a, b)| procstat::cpu_between(a, b, seconds)),
            gen_before
                .zip(gen_after)
                .map(|(a, b)| procstat::cpu_between(a, b, seconds)),
            after.map(|a| a.rss_kb),
            cores,
        )
    };
    stop_tx.send_replace(true);
    let mut games = Vec::with_capacity(tasks.len());
    let mut closes: BTreeMap<String, u64> = BTreeMap::new();
    let mut note_end = |d: &Device| {
        let e = d.ended.lock().map(|e| e.clone()).unwrap_or_default();
        let what = match e {
            (Some(reason), _) => Some(reason),
            (None, Some(code)) => Some(code.to_string()),
            _ => None,
        };
        if let Some(w) = what {
            *closes.entry(w).or_default() += 1;
        }
    };
    for (board, ctrls) in tasks {
        let board = board.await.context("a board task")?;
        note_end(&board);
        let mut controllers = Vec::with_capacity(ctrls.len());
        for (t, id) in ctrls {
            let d = t.await.context("a controller task")?;
            note_end(&d);
            controllers.push((d, id));
        }
        games.push(Game { board, controllers });
    }
    // Count mode: every answer is in now.
    let sends_ok = if p.ticks_per_sender.is_some() {
        c.sends_ok.load(Relaxed)
    } else {
        sends_ok
    };
    let to_board = c.to_board.load(Relaxed) as f64 / seconds;
    let to_controllers = c.to_controllers.load(Relaxed) as f64 / seconds;
    let routed = to_board + to_controllers;
    let offered = if p.ticks_per_sender.is_some() {
        routed
    } else {
        per_s
    };
    let r = StepResult {
        sessions: p.sessions,
        controllers: p.controllers,
        rate_hz: rate,
        board_to: p.board_to,
        offered_per_s: offered,
        routed_per_s: routed,
        to_board_per_s: to_board,
        to_controllers_per_s: to_controllers,
        sends_ok_per_s: sends_ok as f64 / seconds,
        seconds,
        latency_to_board: latency(&c.hist_to_board.lock().unwrap().clone()),
        latency_to_controllers: latency(&c.hist_to_controllers.lock().unwrap().clone()),
        errors: c.errors.lock().unwrap().clone(),
        unanswered: c.unanswered.load(Relaxed),
        held_back: c.held_back.load(Relaxed),
        closes,
        server_us_per_routed: cpu.map(|c| c.total_pct / 100.0 * 1e6 / routed.max(1.0)),
        server_cpu: cpu,
        server_rss_kb: rss,
        generator_cpu: gen_cpu,
        cores_busy_pct: cores,
    };
    Ok((r, games))
}
