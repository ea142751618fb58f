//! The command line of hostwire-bench (Linux only: see main.rs).

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use hostwire_bench::load::{self, Classroom, RunResult, Spread, Target, Watch};
use hostwire_bench::{
    failover, floor, forwarder, p3match, procstat, report, report_cluster, sessions,
};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "hostwire-bench",
    about = "Load generator and benchmark report for relay protocol 1 servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Common {
    /// The server's base URL (rooms over HTTP, traffic on /ws).
    #[arg(long, default_value = "http://127.0.0.1:8787")]
    url: String,
    /// The Origin header sent (must be allowed by the server).
    #[arg(long, default_value = "http://localhost:5180")]
    origin: String,
    /// The server's PID: its CPU (user, system) and RSS are read from /proc.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Another node of a cluster (repeatable): its CPU and RSS are added to
    /// --server-pid's.
    #[arg(long)]
    node_pid: Vec<u32>,
    /// A process beside the servers (repeatable; nats-server): its CPU is
    /// summed apart.
    #[arg(long)]
    side_pid: Vec<u32>,
    /// Pin as GENERATOR_CORE,SERVER_CORE (the server only with --server-pid).
    #[arg(long, value_parser = parse_pin)]
    pin: Option<(usize, usize)>,
    /// Write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
}

impl Common {
    /// Every server process of the run: --server-pid, then each --node-pid.
    fn servers(&self) -> Vec<u32> {
        self.server_pid
            .into_iter()
            .chain(self.node_pid.iter().copied())
            .collect()
    }

    fn watch(&self) -> Watch {
        Watch {
            servers: self.servers(),
            side: self.side_pid.clone(),
        }
    }

    /// Hosts (and rooms) on --url, players round-robin over `players`, or
    /// on --url without any.
    fn spread(&self, players: &[String]) -> Spread {
        let host = Target::new(&self.url, &self.origin);
        let players = if players.is_empty() {
            vec![host.clone()]
        } else {
            players
                .iter()
                .map(|u| Target::new(u, &self.origin))
                .collect()
        };
        Spread { host, players }
    }
}

fn parse_pin(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or("expected GENERATOR_CORE,SERVER_CORE")?;
    Ok((
        a.trim().parse().map_err(|_| "bad core")?,
        b.trim().parse().map_err(|_| "bad core")?,
    ))
}

#[derive(Args, Clone)]
struct Traffic {
    #[arg(long, default_value_t = 50)]
    rooms: usize,
    #[arg(long, default_value_t = 40)]
    players: usize,
    /// Each player sends `up` at this rate.
    #[arg(long, default_value_t = 5.0)]
    player_hz: f64,
    /// The host sends each player a `to` at this rate.
    #[arg(long, default_value_t = 20.0)]
    host_hz: f64,
    /// Bytes of each payload.
    #[arg(long, default_value_t = 200)]
    payload: usize,
    #[arg(long, default_value_t = 5.0)]
    warmup_s: f64,
    #[arg(long, default_value_t = 20.0)]
    duration_s: f64,
}

impl Traffic {
    fn classroom(&self, quiet: bool) -> Classroom {
        Classroom {
            rooms: self.rooms,
            players: self.players,
            player_hz: self.player_hz,
            host_hz: self.host_hz,
            payload: self.payload,
            warmup: Duration::from_secs_f64(self.warmup_s),
            duration: Duration::from_secs_f64(self.duration_s),
            flooder_hz: None,
            frames_per_sender: None,
            quiet,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// R rooms of a host and P players: players `up` at a rate, the host `to` each player at a rate.
    Classroom {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        traffic: Traffic,
        /// Where the players connect (repeatable: round-robin over them);
        /// the hosts and rooms stay on --url. Without it, on --url.
        #[arg(long)]
        player_url: Vec<String>,
    },
    /// Rooms hosted on --url with players through --player-url; the owner
    /// (--kill-pid) is killed with SIGKILL mid-game, and every client
    /// reconnects and rejoins with its token: the time from the kill to
    /// each client's first frame after it.
    Failover {
        #[command(flatten)]
        common: Common,
        /// The other nodes (repeatable): players connect round-robin, and
        /// each room's host reconnects to one of them.
        #[arg(long, required = true)]
        player_url: Vec<String>,
        /// The owner's PID, killed after the warm-up.
        #[arg(long)]
        kill_pid: u32,
        #[arg(long, default_value_t = 10)]
        rooms: usize,
        #[arg(long, default_value_t = 20)]
        players: usize,
        #[arg(long, default_value_t = 20.0)]
        host_hz: f64,
        #[arg(long, default_value_t = 5.0)]
        player_hz: f64,
        #[arg(long, default_value_t = 200)]
        payload: usize,
        #[arg(long, default_value_t = 3.0)]
        warmup_s: f64,
        /// How long after the kill the clients have to come back.
        #[arg(long, default_value_t = 30.0)]
        guard_s: f64,
    },
    /// The cluster section of docs/BENCHMARKS.md, from a run's results.
    ClusterReport {
        /// The results directory (cluster-*.json).
        #[arg(long, default_value = "target/bench-results")]
        results: PathBuf,
        /// The command that made them, quoted on the page.
        #[arg(long, default_value = "CLUSTER=1 bench/run.sh")]
        command: String,
    },
    /// Raise the offered load step by step until the server saturates a core
    /// or p99 passes the bound; report the last good step.
    Max {
        #[command(flatten)]
        common: Common,
        /// Rooms per step (players 20, host 100 Hz to each, players 5 Hz).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "10,20,30,40,50,60,70,85,100,125,150,200,300,400"
        )]
        steps: Vec<usize>,
        #[arg(long, default_value_t = 50_000)]
        p99_bound_us: u64,
        #[arg(long, default_value_t = 95.0)]
        cpu_bound_pct: f64,
        #[arg(long, default_value_t = 2.0)]
        warmup_s: f64,
        #[arg(long, default_value_t = 5.0)]
        duration_s: f64,
    },
    /// N connections that send nothing: memory per connection.
    Idle {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 10_000)]
        connections: usize,
        #[arg(long, default_value_t = 5.0)]
        hold_s: f64,
        /// Where the connections go (repeatable: round-robin); rooms are
        /// created on --url. Without it, on --url.
        #[arg(long)]
        player_url: Vec<String>,
        /// The connections come in this many waves, --wave-gap-s apart, as
        /// a day's clients arrive over time rather than all in a second.
        #[arg(long, default_value_t = 1)]
        waves: usize,
        #[arg(long, default_value_t = 3.0)]
        wave_gap_s: f64,
    },
    /// One player floods at 10× its limit while the others play: their p99
    /// with and without the flood.
    Flood {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        traffic: Traffic,
        /// The flooder's rate (10× the player limit of 60/s).
        #[arg(long, default_value_t = 600.0)]
        flood_hz: f64,
    },
    /// Players rename while they play: what a change acknowledged once
    /// stored costs, beside forwarding in the same rooms and in quiet ones.
    Churn {
        #[command(flatten)]
        common: Common,
        /// Rooms of each kind (quiet and churning).
        #[arg(long, default_value_t = 10)]
        rooms: usize,
        #[arg(long, default_value_t = 20)]
        players: usize,
        #[arg(long, default_value_t = 10.0)]
        up_hz: f64,
        #[arg(long, default_value_t = 2.0)]
        rename_hz: f64,
        #[arg(long, default_value_t = 5.0)]
        warmup_s: f64,
        #[arg(long, default_value_t = 20.0)]
        duration_s: f64,
    },
    /// PlayerThree: one match's red view fanned out to N spectators of red,
    /// then a second match's delayed frames released to N observers.
    Match {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 1000)]
        spectators: usize,
        #[arg(long, default_value_t = 1000)]
        observers: usize,
        /// The observers' grant delay.
        #[arg(long, default_value_t = 1000)]
        delay_ms: u64,
        /// The server's PLAYERTHREE_TICK_MS (a Ridge match lasts 60 ticks).
        #[arg(long, default_value_t = 250)]
        tick_ms: u64,
        #[arg(long, default_value_t = 2.0)]
        warmup_s: f64,
        #[arg(long, default_value_t = 10.0)]
        duration_s: f64,
    },
    /// Serve the bare forwarder (the floor) on HOST:PORT.
    Forwarder {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Drive each socket from one task over the unsplit socket, not a
        /// reader task and a writer task over its halves (tungstenite: the
        /// other crates always run one task per connection).
        #[arg(long)]
        one_task: bool,
        /// The WebSocket crate: axum's tungstenite, tokio-websockets or
        /// fastwebsockets (the same routes, HTTP side and room logic).
        #[arg(long, value_enum, default_value = "tungstenite")]
        ws: forwarder::WsCrate,
    },
    /// The kernel's floor: write frames to loopback TCP sockets and nothing
    /// else (no WebSocket, no JSON), one thread on the server's core.
    Floor {
        #[arg(long, value_enum, default_value = "send")]
        mode: floor::Mode,
        #[arg(long, default_value_t = 2000)]
        connections: usize,
        /// Frames per second to offer; 0 writes as fast as the core can.
        #[arg(long, default_value_t = 50_000)]
        rate: u64,
        /// Bytes per frame (a classroom `data` frame on the wire is about 240).
        #[arg(long, default_value_t = 240)]
        frame_bytes: usize,
        #[arg(long, default_value_t = 5.0)]
        duration_s: f64,
        /// Pin as READER_CORE,WRITER_CORE.
        #[arg(long, value_parser = parse_pin)]
        pin: Option<(usize, usize)>,
        /// Write the result as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Hosted Memizy sessions: N sessions of a board and C controllers over
    /// /memizy/session/ws, played at one or more per-instance `send` rates.
    Sessions {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        sessions: SessionsArgs,
    },
    /// Write docs/BENCHMARKS.md and the plots from the results of a run.
    Report(report::ReportArgs),
}

#[derive(Args, Clone)]
struct SessionsArgs {
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// Controllers per session (each session also has its board).
    #[arg(long, default_value_t = 30)]
    controllers: usize,
    /// Per-instance rates, one measured step each on the same sessions:
    /// every controller `send`s to the authority this often, and the board
    /// sends each controller this often. SPEC 8.1 guarantees 30/s.
    #[arg(long, value_delimiter = ',', default_value = "30")]
    rates: Vec<f64>,
    /// How the board answers: each controller its own view, or one `send`
    /// to all.
    #[arg(long, value_enum, default_value = "each")]
    board_to: sessions::BoardTo,
    /// Bytes of each message's data.
    #[arg(long, default_value_t = 200)]
    payload: usize,
    #[arg(long, default_value_t = 5.0)]
    warmup_s: f64,
    #[arg(long, default_value_t = 20.0)]
    duration_s: f64,
}

fn sessions_table(r: &sessions::StepResult) {
    let cpu = |c: Option<procstat::CpuUse>| {
        c.map_or("–".into(), |c| {
            format!(
                "{:.1} % of a core (user {:.1} %, system {:.1} %)",
                c.total_pct, c.user_pct, c.system_pct
            )
        })
    };
    println!(
        "sessions at {}/s per instance (board to {:?})",
        r.rate_hz, r.board_to
    );
    println!(
        "  sessions × controllers {} × {}",
        r.sessions, r.controllers
    );
    println!("  offered                {:.0} messages/s", r.offered_per_s);
    println!(
        "  routed                 {:.0} delivered/s ({:.0} to boards, {:.0} to controllers) over {:.1} s; sends answered {:.0}/s",
        r.routed_per_s, r.to_board_per_s, r.to_controllers_per_s, r.seconds, r.sends_ok_per_s
    );
    for (name, l) in [
        ("controller → board", &r.latency_to_board),
        ("board → controller", &r.latency_to_controllers),
    ] {
        println!(
            "  {name} (µs) p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
        );
    }
    println!("  server CPU             {}", cpu(r.server_cpu));
    if let Some(us) = r.server_us_per_routed {
        println!("  server CPU per routed  {us:.2} µs");
    }
    if let Some(rss) = r.server_rss_kb {
        println!("  server RSS             {rss} KiB");
    }
    println!("  generator CPU          {}", cpu(r.generator_cpu));
    if !r.cores_busy_pct.is_empty() {
        let busy: Vec<String> = r
            .cores_busy_pct
            .iter()
            .map(|b| format!("{b:.0} %"))
            .collect();
        println!("  cores busy (anyone)    {}", busy.join(", "));
    }
    println!(
        "  errors                 {:?} (unanswered {}, held back {})",
        r.errors, r.unanswered, r.held_back
    );
    println!("  closes                 {:?}", r.closes);
}

fn setup(common: &Common) {
    procstat::raise_fd_limit();
    if let Some((gen, server)) = common.pin {
        if let Err(e) = procstat::pin(0, gen) {
            eprintln!("warning: pinning the generator to core {gen}: {e}");
        }
        if let Some(pid) = common.server_pid {
            if let Err(e) = procstat::pin(pid, server) {
                eprintln!("warning: pinning the server to core {server}: {e}");
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn write_json(path: &Option<PathBuf>, v: &serde_json::Value) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(v)?)?;
    }
    Ok(())
}

fn table(title: &str, r: &RunResult) {
    println!("{title}");
    println!("  rooms × players        {} × {}", r.rooms, r.players);
    println!("  offered                {:.0} frames/s", r.offered_per_s);
    println!(
        "  delivered              {:.0} frames/s over {:.1} s",
        r.delivered_per_s, r.seconds
    );
    println!(
        "  latency (µs)           p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
        r.latency.p50_us, r.latency.p90_us, r.latency.p99_us, r.latency.p999_us, r.latency.max_us
    );
    if let Some(c) = r.server_cpu {
        println!(
            "  server CPU             {:.1} % of a core (user {:.1} %, system {:.1} %)",
            c.total_pct, c.user_pct, c.system_pct
        );
    }
    if let Some(rss) = r.server_rss_kb {
        println!("  server RSS             {rss} KiB");
    }
    if r.servers > 1 {
        println!("  (CPU and RSS summed over {} servers)", r.servers);
    }
    if let Some(c) = r.side_cpu {
        println!("  beside the servers     {:.1} % of a core", c.total_pct);
    }
    println!("  errors                 {:?}", r.errors);
    println!("  closes                 {:?}", r.closes);
}

pub fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Forwarder {
            listen,
            one_task,
            ws,
        } => runtime().block_on(async move {
            let l = tokio::net::TcpListener::bind(&listen).await?;
            println!(
                "bare forwarder listening on http://{} ({})",
                l.local_addr()?,
                ws.to_possible_value().expect("a named crate").get_name()
            );
            forwarder::serve(l, forwarder::router_for(ws, one_task)).await;
            Ok(())
        }),
        Command::Classroom {
            common,
            traffic,
            player_url,
        } => {
            setup(&common);
            let r = runtime().block_on(load::classroom_spread(
                &common.spread(&player_url),
                &traffic.classroom(common.quiet),
                &common.watch(),
            ))?;
            table("classroom", &r);
            write_json(&common.json, &json!({"scenario": "classroom", "result": r}))
        }
        Command::Churn {
            common,
            rooms,
            players,
            up_hz,
            rename_hz,
            warmup_s,
            duration_s,
        } => {
            setup(&common);
            let t = Target::new(&common.url, &common.origin);
            let p = hostwire_bench::churn::Churn {
                rooms,
                players,
                up_hz,
                rename_hz,
                warmup: Duration::from_secs_f64(warmup_s),
                duration: Duration::from_secs_f64(duration_s),
            };
            let r = runtime().block_on(hostwire_bench::churn::churn(&t, &p, common.server_pid))?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            write_json(&common.json, &json!({"scenario": "churn", "result": r}))
        }
        Command::Flood {
            common,
            traffic,
            flood_hz,
        } => {
            setup(&common);
            let t = Target::new(&common.url, &common.origin);
            let rt = runtime();
            let calm = rt.block_on(load::classroom(
                &t,
                &traffic.classroom(common.quiet),
                common.server_pid,
            ))?;
            let mut p = traffic.classroom(common.quiet);
            p.flooder_hz = Some(flood_hz);
            let flood = rt.block_on(load::classroom(&t, &p, common.server_pid))?;
            table("without the flood", &calm);
            table("with one player flooding", &flood);
            let ratio = flood.latency.p99_us as f64 / calm.latency.p99_us.max(1) as f64;
            println!("others' p99 with the flood / without: {ratio:.2}");
            write_json(
                &common.json,
                &json!({"scenario": "flood", "calm": calm, "flood": flood, "flood_hz": flood_hz, "p99_ratio": ratio}),
            )
        }
        Command::Max {
            common,
            steps,
            p99_bound_us,
            cpu_bound_pct,
            warmup_s,
            duration_s,
        } => {
            setup(&common);
            let t = Target::new(&common.url, &common.origin);
            let rt = runtime();
            let mut results: Vec<RunResult> = Vec::new();
            let mut last_good: Option<usize> = None;
            let mut stop_reason = "every step passed".to_owned();
            for (i, rooms) in steps.iter().enumerate() {
                let p = Classroom {
                    rooms: *rooms,
                    players: 20,
                    player_hz: 5.0,
                    host_hz: 100.0,
                    payload: 200,
                    warmup: Duration::from_secs_f64(warmup_s),
                    duration: Duration::from_secs_f64(duration_s),
                    flooder_hz: None,
                    frames_per_sender: None,
                    quiet: common.quiet,
                };
                let r = rt.block_on(load::classroom(&t, &p, common.server_pid))?;
                let cpu = r.server_cpu.map(|c| c.total_pct).unwrap_or(0.0);
                println!(
                    "step {rooms:>4} rooms: offered {:>9.0}/s delivered {:>9.0}/s p99 {:>7} µs server CPU {cpu:>5.1} %",
                    r.offered_per_s, r.delivered_per_s, r.latency.p99_us
                );
                let good = r.latency.p99_us <= p99_bound_us
                    && r.delivered_per_s >= 0.95 * r.offered_per_s
                    && cpu < cpu_bound_pct;
                results.push(r);
                if good {
                    last_good = Some(i);
                } else {
                    let r = results.last().unwrap();
                    stop_reason = if cpu >= cpu_bound_pct {
                        format!("the server used {cpu:.0} % of its core")
                    } else if r.latency.p99_us > p99_bound_us {
                        format!("p99 {} µs passed the bound", r.latency.p99_us)
                    } else {
                        format!(
                            "delivered {:.0} of {:.0} offered frames/s",
                            r.delivered_per_s, r.offered_per_s
                        )
                    };
                    break;
                }
            }
            let best = last_good.map(|i| results[i].clone());
            if let Some(b) = &best {
                table("last good step", b);
            }
            println!("stopped: {stop_reason}");
            write_json(
                &common.json,
                &json!({"scenario": "max", "steps": results, "last_good": best, "stop_reason": stop_reason}),
            )
        }
        Command::Idle {
            common,
            connections,
            hold_s,
            player_url,
            waves,
            wave_gap_s,
        } => {
            setup(&common);
            if common.server_pid.is_none() {
                anyhow::bail!("idle needs --server-pid to read the server's memory");
            }
            let r = runtime().block_on(load::idle_spread(
                &common.spread(&player_url),
                connections,
                load::Waves {
                    count: waves.max(1),
                    gap: Duration::from_secs_f64(wave_gap_s),
                },
                Duration::from_secs_f64(hold_s),
                &common.servers(),
                common.quiet,
            ))?;
            println!("idle");
            println!(
                "  connections            {} ({} still answering after {:.1} s)",
                r.connections, r.still_open, r.held_seconds
            );
            println!(
                "  server RSS             {} → {} KiB",
                r.rss_kb_before, r.rss_kb_after
            );
            println!(
                "  per connection         {:.0} bytes",
                r.bytes_per_connection
            );
            println!(
                "  anonymous RSS          {} → {} KiB, {:.0} bytes per connection",
                r.anon_kb_before, r.anon_kb_after, r.anon_bytes_per_connection
            );
            write_json(&common.json, &json!({"scenario": "idle", "result": r}))
        }
        Command::Floor {
            mode,
            connections,
            rate,
            frame_bytes,
            duration_s,
            pin,
            json,
        } => {
            procstat::raise_fd_limit();
            let r = floor::run(&floor::Params {
                mode,
                connections,
                rate,
                frame_bytes,
                duration: Duration::from_secs_f64(duration_s),
                frames: None,
                pin,
            })?;
            println!("floor ({mode:?})");
            println!(
                "  written                {:.0} frames/s of {} bytes to {} sockets{}",
                r.sent_per_s,
                r.frame_bytes,
                r.connections,
                r.offered_per_s
                    .map_or(" (flat out)".into(), |o| format!(" ({o} offered)"))
            );
            println!(
                "  writer CPU             {:.1} % of a core (user {:.1} %, system {:.1} %): {:.2} µs a frame",
                r.writer_user_pct + r.writer_system_pct,
                r.writer_user_pct,
                r.writer_system_pct,
                r.writer_us_per_frame
            );
            println!(
                "  reader CPU             {:.1} % of a core: {:.2} µs a frame",
                r.reader_pct, r.reader_us_per_frame
            );
            println!(
                "  latency (µs)           p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
                r.latency.p50_us,
                r.latency.p90_us,
                r.latency.p99_us,
                r.latency.p999_us,
                r.latency.max_us
            );
            if r.refused > 0 {
                println!(
                    "  refused                {} (socket buffer full)",
                    r.refused
                );
            }
            write_json(&json, &json!({"scenario": "floor", "result": r}))
        }
        Command::Sessions {
            common,
            sessions: a,
        } => {
            setup(&common);
            let p = sessions::Params {
                sessions: a.sessions,
                controllers: a.controllers,
                rates: a.rates,
                board_to: a.board_to,
                payload: a.payload,
                warmup: Duration::from_secs_f64(a.warmup_s),
                duration: Duration::from_secs_f64(a.duration_s),
                ticks_per_sender: None,
                quiet: common.quiet,
            };
            let r = runtime().block_on(sessions::run(&common.url, &p, common.server_pid))?;
            println!(
                "{} sessions of a board and {} controllers: {} devices attached in {:.1} s",
                r.sessions, r.controllers, r.devices, r.setup_seconds
            );
            if let (Some(a), Some(b)) = (r.server_rss_kb_before, r.server_rss_kb_attached) {
                println!("  server RSS             {a} → {b} KiB with every device attached");
            }
            for st in &r.steps {
                sessions_table(st);
            }
            write_json(&common.json, &json!({"scenario": "sessions", "result": r}))
        }
        Command::Match {
            common,
            spectators,
            observers,
            delay_ms,
            tick_ms,
            warmup_s,
            duration_s,
        } => {
            setup(&common);
            let p = p3match::MatchParams {
                http: common.url.clone(),
                origin: common.origin.clone(),
                spectators,
                observers,
                delay_ms,
                tick_ms,
                warmup: Duration::from_secs_f64(warmup_s),
                duration: Duration::from_secs_f64(duration_s),
                quiet: common.quiet,
            };
            let r = runtime().block_on(p3match::run(&p, common.server_pid))?;
            for (name, ph) in [("spectators", &r.spectators), ("observers", &r.observers)] {
                println!("{name} ({} connections)", ph.connections);
                println!(
                    "  delivered              {:.0} frames/s over {:.1} s ({:.0} bytes a frame)",
                    ph.delivered_per_s, ph.seconds, ph.mean_frame_bytes
                );
                if let Some(us) = ph.server_cpu_us_per_frame {
                    println!("  server CPU             {:.2} µs a delivered frame", us);
                }
                if let Some(b) = ph.anon_bytes_per_connection {
                    println!("  anonymous RSS          {b:.0} bytes a joined connection");
                }
                println!(
                    "  {}  p50 {}  p99 {}  max {} (µs)",
                    if name == "spectators" {
                        "first to last receipt "
                    } else {
                        "late after releaseAt  "
                    },
                    ph.latency.p50_us,
                    ph.latency.p99_us,
                    ph.latency.max_us
                );
                if ph.early > 0 || !ph.errors.is_empty() {
                    println!("  early {}  errors {:?}", ph.early, ph.errors);
                }
            }
            write_json(&common.json, &json!({"scenario": "match", "result": r}))
        }
        Command::Failover {
            common,
            player_url,
            kill_pid,
            rooms,
            players,
            host_hz,
            player_hz,
            payload,
            warmup_s,
            guard_s,
        } => {
            setup(&common);
            let p = failover::Params {
                rooms,
                players,
                host_hz,
                player_hz,
                payload,
                warmup: Duration::from_secs_f64(warmup_s),
                kill_pid,
                guard: Duration::from_secs_f64(guard_s),
                quiet: common.quiet,
            };
            let r = runtime().block_on(failover::run(&common.spread(&player_url), &p))?;
            println!(
                "failover ({} rooms × {} players, {} clients)",
                r.rooms, r.players, r.clients
            );
            for (name, l) in [
                ("kill → rejoined", &r.rejoined),
                ("  hosts", &r.rejoined_hosts),
                ("  players", &r.rejoined_players),
                ("kill → first frame", &r.first_frame),
                ("  hosts", &r.first_frame_hosts),
                ("  players", &r.first_frame_players),
            ] {
                println!(
                    "  {name:<22} p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms ({} clients)",
                    l.p50_us as f64 / 1e3,
                    l.p99_us as f64 / 1e3,
                    l.max_us as f64 / 1e3,
                    l.samples
                );
            }
            println!("  recovered              {} of {}", r.recovered, r.clients);
            println!(
                "  attempts               {} (refused: {:?})",
                r.attempts, r.refusals
            );
            if !r.failures.is_empty() {
                println!("  failures               {:?}", r.failures);
            }
            write_json(&common.json, &json!({"scenario": "failover", "result": r}))
        }
        Command::ClusterReport { results, command } => {
            print!("{}", report_cluster::section(&results, &command));
            Ok(())
        }
        Command::Report(args) => report::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn players_and_nodes_come_from_repeated_flags() {
        let cli = Cli::try_parse_from([
            "hostwire-bench",
            "classroom",
            "--url",
            "http://127.0.0.1:1",
            "--player-url",
            "http://127.0.0.1:2",
            "--player-url",
            "http://127.0.0.1:3",
            "--server-pid",
            "10",
            "--node-pid",
            "11",
            "--node-pid",
            "12",
            "--side-pid",
            "20",
        ])
        .unwrap();
        let Command::Classroom {
            common, player_url, ..
        } = cli.command
        else {
            panic!("not classroom");
        };
        let spread = common.spread(&player_url);
        assert_eq!(spread.host.ws, "ws://127.0.0.1:1/ws");
        let ws: Vec<&str> = (0..3).map(|k| spread.player(k).ws.as_str()).collect();
        assert_eq!(
            ws,
            [
                "ws://127.0.0.1:2/ws",
                "ws://127.0.0.1:3/ws",
                "ws://127.0.0.1:2/ws"
            ]
        );
        let watch = common.watch();
        assert_eq!((watch.servers, watch.side), (vec![10, 11, 12], vec![20]));
        // Without --player-url every client goes to --url.
        assert_eq!(common.spread(&[]).player(1).ws, "ws://127.0.0.1:1/ws");
        // failover needs the other nodes and the owner's PID.
        assert!(Cli::try_parse_from(["hostwire-bench", "failover", "--kill-pid", "1"]).is_err());
        assert!(Cli::try_parse_from([
            "hostwire-bench",
            "failover",
            "--player-url",
            "http://127.0.0.1:2"
        ])
        .is_err());
    }
}
