//! The command line: `hostwire serve` and `hostwire check`, their
//! arguments (each with its environment variable) and logging.

use crate::app::{self, App};
use crate::check;
use crate::http::AllowedOrigins;
use crate::relay::{RelayConfig, ServerLimits, OUTBOUND_QUEUE, SERVER_LIMITS};
use anyhow::anyhow;
use clap::{Args, Parser, Subcommand, ValueEnum};
use hostwire_core::SystemClock;
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::SqliteStore;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The reference relay's default origins: the local development servers.
pub const DEFAULT_ALLOWED_ORIGINS: &str = "http://localhost:5180,http://127.0.0.1:5180";

#[derive(Parser)]
#[command(
    name = "hostwire",
    version,
    about = "Server and tools for host ↔ guest wire protocols"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: every protocol (the Memizy relay and hosted
    /// sessions, ggui, PlayerThree) on HTTP + WebSocket, with what must
    /// survive a restart in an embedded SQLite database (or PostgreSQL,
    /// --postgres-url).
    ///
    /// Every option can also be set by the environment variable shown.
    // Boxed: the options are hundreds of bytes, parsed once.
    Serve(Box<ServeArgs>),
    /// Check a Memizy plugin file: its manifest, the content policy a host
    /// would apply, and (with --set) whether it can play a set.
    ///
    /// Exit status: 0 valid, 1 invalid, 2 unreadable input.
    Check(check::CheckArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Port to listen on (0 picks a free one; the address is logged).
    #[arg(long, env = "PORT", default_value_t = 8787)]
    pub port: u16,
    /// Address to listen on. Use 0.0.0.0 to accept other machines.
    #[arg(long, env = "HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Browser origins allowed to use every protocol (the relay, hosted
    /// sessions, ggui, PlayerThree), comma-separated, e.g.
    /// "https://play.example.org". "*" allows any origin (development only).
    /// Clients that send no Origin (agents, bots) are admitted by their
    /// credential where the endpoint allows them (docs/operations.md).
    #[arg(long, env = "ALLOWED_ORIGINS", default_value = DEFAULT_ALLOWED_ORIGINS)]
    pub allowed_origins: String,
    /// Take the client IP from X-Forwarded-For (behind a reverse proxy).
    /// Set TRUST_PROXY=1 to enable.
    #[arg(long, env = "TRUST_PROXY", default_value = "0", value_parser = parse_flag, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "1")]
    pub trust_proxy: bool,
    /// With TRUST_PROXY: how many reverse proxies in front of the server
    /// append to X-Forwarded-For. The client IP is the entry this many in
    /// from the right; entries further left were written by the client.
    #[arg(long, env = "TRUSTED_PROXY_HOPS", default_value_t = SERVER_LIMITS.trusted_proxy_hops, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub trusted_proxy_hops: usize,
    /// Directory of the embedded database (created if missing).
    #[arg(long, env = "HOSTWIRE_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Keep what must survive a restart in this PostgreSQL database
    /// (postgres://USER:PASSWORD@HOST:PORT/DATABASE) instead of the
    /// embedded SQLite file; its schema is migrated at start-up. Empty:
    /// SQLite.
    #[arg(long, env = "HOSTWIRE_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// Join the other nodes on this NATS server (nats://HOST:PORT): each
    /// node announces itself there every second and lists the others in
    /// /api/health. Unreachable at start-up: the start stops; lost later:
    /// reconnected. Empty: a single node.
    #[arg(long, env = "HOSTWIRE_NATS_URL", hide_env_values = true)]
    pub nats_url: Option<String>,
    /// This node's id among its peers (1 to 64 letters, digits, '-', '_',
    /// '.'). Unset: a random one, made at each start and logged.
    #[arg(long, env = "HOSTWIRE_NODE_ID")]
    pub node_id: Option<String>,
    /// Rooms one client IP may create per hour (a school shares one IP);
    /// hosted Memizy sessions are limited by the same number, counted apart.
    #[arg(long, env = "ROOMS_PER_IP_PER_HOUR", default_value_t = RELAY_LIMITS.rooms_per_ip_per_hour)]
    pub rooms_per_ip_per_hour: u32,
    /// Room lookups (GET /api/rooms/:pin) one client IP may make per
    /// second, after its burst; beyond it 429 with Retry-After. 0: no limit.
    #[arg(long, env = "LOOKUPS_PER_IP_PER_SECOND", default_value_t = SERVER_LIMITS.lookups_per_ip_per_second)]
    pub lookups_per_ip_per_second: u32,
    /// Room lookups one client IP may make at once.
    #[arg(long, env = "LOOKUP_BURST_PER_IP", default_value_t = SERVER_LIMITS.lookup_burst_per_ip)]
    pub lookup_burst_per_ip: u32,
    /// `join` and `host` frames one client IP may send per second over all
    /// its connections, after its burst; beyond it RATE_LIMITED and close
    /// 1013. 0: no limit.
    #[arg(long, env = "JOINS_PER_IP_PER_SECOND", default_value_t = SERVER_LIMITS.joins_per_ip_per_second)]
    pub joins_per_ip_per_second: u32,
    /// `join` and `host` frames one client IP may send at once (a class
    /// joining together).
    #[arg(long, env = "JOIN_BURST_PER_IP", default_value_t = SERVER_LIMITS.join_burst_per_ip)]
    pub join_burst_per_ip: u32,
    /// The operator credential: creating a PlayerThree match
    /// (`POST /playerthree/matches`) or a hosted Memizy session
    /// (`POST /memizy/sessions`) needs it as `Authorization: Bearer`. At
    /// least 16 characters. Unset: one is made at first start and kept in
    /// <data dir>/credentials/operator.token (its path is printed).
    #[arg(long, env = "HOSTWIRE_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,
    /// Wrong credentials one client IP may present per second, on any
    /// endpoint, after its burst; beyond it 429 with Retry-After, before
    /// the next one is even compared.
    #[arg(long, env = "WRONG_CREDENTIALS_PER_IP_PER_SECOND", default_value_t = crate::http::credentials::WRONG_CREDENTIALS_PER_IP_PER_SECOND)]
    pub wrong_credentials_per_ip_per_second: u32,
    /// Wrong credentials one client IP may present at once.
    #[arg(long, env = "WRONG_CREDENTIAL_BURST_PER_IP", default_value_t = crate::http::credentials::WRONG_CREDENTIAL_BURST_PER_IP)]
    pub wrong_credential_burst_per_ip: u32,
    /// PlayerThree matches one client IP may create per hour.
    #[arg(long, env = "MATCHES_PER_IP_PER_HOUR", default_value_t = crate::http::credentials::MATCHES_PER_IP_PER_HOUR)]
    pub matches_per_ip_per_hour: u32,
    /// ggui sessions one client IP may create per hour.
    #[arg(long, env = "GGUI_SESSIONS_PER_IP_PER_HOUR", default_value_t = crate::http::credentials::GGUI_SESSIONS_PER_IP_PER_HOUR)]
    pub ggui_sessions_per_ip_per_hour: u32,
    /// Bytes of request bodies the whole server reads and handles at once,
    /// over every protocol's API (at least 8 MiB, the largest body); past
    /// it a request is answered 503 with Retry-After before its body is read.
    #[arg(long, env = "REQUEST_BODY_BUDGET_BYTES", default_value_t = crate::http::REQUEST_BODY_BUDGET_BYTES)]
    pub request_body_budget_bytes: usize,
    /// Live rooms on this server; beyond it room creation answers 503.
    #[arg(long, env = "MAX_ROOMS", default_value_t = SERVER_LIMITS.max_rooms)]
    pub max_rooms: usize,
    /// Open connections from one client IP (a school shares one IP).
    #[arg(long, env = "CONNECTIONS_PER_IP", default_value_t = SERVER_LIMITS.connections_per_ip)]
    pub connections_per_ip: usize,
    /// Milliseconds a client has to send a request header.
    #[arg(long, env = "HEADER_READ_TIMEOUT_MS", default_value_t = SERVER_LIMITS.header_read_timeout_ms)]
    pub header_read_timeout_ms: u64,
    /// Milliseconds a client has to send a whole request body.
    #[arg(long, env = "BODY_READ_TIMEOUT_MS", default_value_t = SERVER_LIMITS.body_read_timeout_ms)]
    pub body_read_timeout_ms: u64,
    /// Milliseconds a stopping server waits for open connections.
    #[arg(long, env = "SHUTDOWN_GRACE_MS", default_value_t = SERVER_LIMITS.shutdown_grace_ms)]
    pub shutdown_grace_ms: u64,
    /// Bytes queued for one WebSocket before it is closed as too slow (1013).
    #[arg(long, env = "OUTBOUND_QUEUE_BYTES", default_value_t = SERVER_LIMITS.outbound_queue_bytes)]
    pub outbound_queue_bytes: usize,
    /// Bundle uploads read and checked at once; beyond it 503.
    #[arg(long, env = "CONCURRENT_UPLOADS", default_value_t = SERVER_LIMITS.concurrent_uploads)]
    pub concurrent_uploads: usize,
    /// Bundle bytes held in memory at once, cached or being sent (at least
    /// the 8 MiB of one bundle); beyond it a download waits, then 503.
    #[arg(long, env = "BUNDLE_CACHE_BYTES", default_value_t = SERVER_LIMITS.bundle_cache_bytes)]
    pub bundle_cache_bytes: usize,
    /// Log format. Text has colours only on a terminal (and without
    /// NO_COLOR).
    #[arg(long, env = "HOSTWIRE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Which logs to print: a level (error, warn, info, debug, trace) or
    /// directives per module, e.g. "info,hostwire=debug".
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
    /// Replaced by per-app credentials (GGUI_APPS): setting it stops the
    /// server with a hint, so that no deployment runs open by mistake.
    #[arg(long, env = "GGUI_TOKEN", hide = true, hide_env_values = true)]
    pub ggui_token: Option<String>,
    /// ggui: the apps whose agents may use the agent API, comma-separated,
    /// each `APP` or `APP=CREDENTIAL` (at least 16 characters). An app
    /// without a credential gets one made at first start, kept in
    /// <data dir>/credentials/ggui-app-APP.token (its path is printed).
    /// Each agent sees only its own app's sessions.
    #[arg(long = "ggui-app", env = "GGUI_APPS", value_delimiter = ',', default_value = hostwire_ggui::channel::DEFAULT_APP_ID)]
    pub ggui_apps: Vec<String>,
    /// ggui: the app a session belongs to when none is named.
    #[arg(long, env = "GGUI_DEFAULT_APP", default_value = hostwire_ggui::channel::DEFAULT_APP_ID)]
    pub ggui_default_app: String,
    /// ggui: the version subscribers are told (sessions may override it).
    #[arg(long, env = "GGUI_SERVER_VERSION", default_value = hostwire_ggui::PROTOCOL_VERSION)]
    pub ggui_server_version: String,
    /// ggui: on a version mismatch, `strict` closes the socket after
    /// UPGRADE_REQUIRED, `advisory` keeps it open.
    #[arg(long, env = "GGUI_VERSION_POLICY", value_enum, default_value_t = GguiVersionPolicy::Strict)]
    pub ggui_version_policy: GguiVersionPolicy,
    /// PlayerThree: milliseconds between two ticks of a match.
    #[arg(long, env = "PLAYERTHREE_TICK_MS", default_value_t = crate::playerthree::DEFAULT_TICK_MS)]
    pub playerthree_tick_ms: u64,
    /// Memizy sessions: a service offered to plugins (SPEC 5.3), as
    /// NAME=COMMAND: a worker process spoken to with worker RPC on its
    /// stdin and stdout. Repeat the option for more; in the environment,
    /// separate them with ";". A bare program name is looked up beside
    /// this executable, then on PATH; a service whose program is missing
    /// is not offered. Empty: no services.
    #[arg(
        long = "memizy-service",
        env = "MEMIZY_SERVICES",
        value_delimiter = ';',
        default_value = "answers.check=hostwire-answer-checker"
    )]
    pub memizy_services: Vec<String>,
    /// Memizy sessions, offline classrooms: a local file of the plugin SDK
    /// (its self-contained ES module bundle, at most 4 MiB), served at
    /// /memizy/play/vendor/plugin-sdk.mjs; plugin documents' imports of
    /// `@memizy/plugin-sdk@1` from a CDN are pointed there. Unset: nothing
    /// is served or rewritten.
    #[arg(long, env = "HOSTWIRE_PLUGIN_SDK")]
    pub plugin_sdk: Option<PathBuf>,
    /// Memizy sessions: milliseconds a service call may take before it
    /// fails with INTERNAL_ERROR.
    #[arg(long, env = "MEMIZY_SERVICE_TIMEOUT_MS", default_value_t = crate::sessions::services::DEFAULT_SERVICE_TIMEOUT_MS)]
    pub memizy_service_timeout_ms: u64,
    /// Memizy sessions: milliseconds a hosted session may stay in its
    /// lobby (never started) after it was created or continued; then its
    /// devices are closed and its rows removed.
    #[arg(long, env = "MEMIZY_SESSION_LOBBY_TTL_MS", default_value_t = crate::sessions::DEFAULT_LOBBY_TTL_MS)]
    pub memizy_session_lobby_ttl_ms: u64,
    /// Memizy sessions: milliseconds a hosted session with no device
    /// attached and no API call stays; then its rows are removed.
    #[arg(long, env = "MEMIZY_SESSION_IDLE_TTL_MS", default_value_t = crate::sessions::DEFAULT_IDLE_TTL_MS)]
    pub memizy_session_idle_ttl_ms: u64,
    /// PlayerThree: milliseconds a finished match stays (its report and
    /// tokens readable) before it and its records are removed.
    #[arg(long, env = "PLAYERTHREE_FINISHED_TTL_MS", default_value_t = crate::playerthree::DEFAULT_FINISHED_TTL_MS)]
    pub playerthree_finished_ttl_ms: u64,
    /// PlayerThree: milliseconds a match nobody has joined since its
    /// creation (or the last restart) stays before it and its records are
    /// removed.
    #[arg(long, env = "PLAYERTHREE_UNJOINED_TTL_MS", default_value_t = crate::playerthree::DEFAULT_UNJOINED_TTL_MS)]
    pub playerthree_unjoined_ttl_ms: u64,
    /// ggui: milliseconds a session nobody uses (no subscriber, no agent
    /// call, no long poll) stays before it and its rows are removed.
    #[arg(long, env = "GGUI_SESSION_IDLE_TTL_MS", default_value_t = crate::ggui::DEFAULT_IDLE_TTL_MS)]
    pub ggui_session_idle_ttl_ms: u64,
    /// ggui: frames one live-channel socket may send per second once its
    /// burst is spent; past it each frame is refused with RATE_LIMITED.
    #[arg(long, env = "GGUI_FRAMES_PER_SECOND", default_value_t = hostwire_ggui::channel::RATE_LIMIT_PER_SECOND, value_parser = clap::value_parser!(u32).range(1..))]
    pub ggui_frames_per_second: u32,
    /// ggui: frames one live-channel socket may send at once.
    #[arg(long, env = "GGUI_FRAME_BURST", default_value_t = hostwire_ggui::channel::RATE_LIMIT_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub ggui_frame_burst: u32,
    /// ggui: sockets subscribed to one session at once (a classroom's
    /// projector and every pupil's screen); past it TOO_MANY_SUBSCRIBERS.
    #[arg(long, env = "GGUI_SUBSCRIBERS_PER_SESSION", default_value_t = hostwire_ggui::channel::MAX_SUBSCRIBERS_PER_SESSION, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub ggui_subscribers_per_session: usize,
}

/// The services `serve` offers: each NAME=COMMAND whose program exists.
pub fn memizy_services(
    args: &ServeArgs,
) -> anyhow::Result<Vec<crate::sessions::services::ServiceCommand>> {
    let mut out = Vec::new();
    for spec in args.memizy_services.iter().filter(|s| !s.trim().is_empty()) {
        let cmd = crate::sessions::services::ServiceCommand::parse(spec)
            .map_err(|e| anyhow!("--memizy-service / MEMIZY_SERVICES: {e}"))?;
        if cmd.program_exists() {
            out.push(cmd);
        } else {
            tracing::warn!(
                service = %cmd.name,
                program = %cmd.program.display(),
                "service not offered: its program was not found (build it with `cargo build --release`, or set --memizy-service / MEMIZY_SERVICES)"
            );
        }
    }
    Ok(out)
}

/// What a ggui version mismatch does to the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GguiVersionPolicy {
    Strict,
    Advisory,
}

/// The ggui live channel's configuration from `serve`'s arguments.
pub fn ggui_config(args: &ServeArgs) -> crate::ggui::GguiConfig {
    let mut c = crate::ggui::GguiConfig {
        allowed_origins: AllowedOrigins::parse(&args.allowed_origins),
        ..Default::default()
    };
    c.idle_ttl_ms = args.ggui_session_idle_ttl_ms;
    c.channel.rate_per_second = f64::from(args.ggui_frames_per_second);
    c.channel.rate_burst = args.ggui_frame_burst;
    c.channel.max_subscribers_per_session = args.ggui_subscribers_per_session;
    c.channel.default_app_id = args.ggui_default_app.clone();
    c.channel.advertised_version = args.ggui_server_version.clone();
    c.channel.version_policy = match args.ggui_version_policy {
        GguiVersionPolicy::Strict => hostwire_ggui::VersionPolicy::Strict,
        GguiVersionPolicy::Advisory => hostwire_ggui::VersionPolicy::Advisory,
    };
    c
}

/// The longest ggui app id GGUI_APPS takes.
pub const MAX_GGUI_APP_ID_CHARS: usize = 64;

/// The ggui apps of GGUI_APPS with their agent credentials (configured, or
/// kept in the data directory).
fn ggui_apps(dir: &Path, specs: &[String]) -> anyhow::Result<Vec<crate::ggui::GguiApp>> {
    let mut apps: Vec<crate::ggui::GguiApp> = Vec::new();
    for spec in specs.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let (id, configured) = match spec.split_once('=') {
            Some((id, c)) => (id.trim(), Some(c)),
            None => (spec, None),
        };
        let ok = !id.is_empty()
            && id.len() <= MAX_GGUI_APP_ID_CHARS
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok || id.starts_with('.') {
            anyhow::bail!(
                "GGUI_APPS: app id {id:?} must be 1 to {MAX_GGUI_APP_ID_CHARS} letters, digits, '-', '_' or '.'"
            );
        }
        if apps.iter().any(|a| a.id == id) {
            anyhow::bail!("GGUI_APPS: app {id:?} is named twice");
        }
        let credential = credential(
            dir,
            "GGUI_APPS",
            configured,
            &format!("ggui-app-{id}.token"),
            &format!("ggui agent credential of app {id}"),
        )?;
        apps.push(crate::ggui::GguiApp {
            id: id.to_owned(),
            credential,
        });
    }
    Ok(apps)
}

/// The database file in the data directory.
pub const DB_FILE: &str = "hostwire.db";

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

fn parse_flag(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        other => Err(format!("expected 1 or 0, got {other:?}")),
    }
}

/// The relay's configuration from `serve`'s arguments.
pub fn relay_config(args: &ServeArgs) -> RelayConfig {
    RelayConfig {
        allowed_origins: AllowedOrigins::parse(&args.allowed_origins),
        trust_proxy: args.trust_proxy,
        rooms_per_ip_per_hour: args.rooms_per_ip_per_hour,
        limits: RELAY_LIMITS,
        server_limits: ServerLimits {
            max_rooms: args.max_rooms,
            connections_per_ip: args.connections_per_ip.max(1),
            header_read_timeout_ms: args.header_read_timeout_ms,
            body_read_timeout_ms: args.body_read_timeout_ms,
            shutdown_grace_ms: args.shutdown_grace_ms,
            outbound_queue_bytes: args.outbound_queue_bytes,
            concurrent_uploads: args.concurrent_uploads.max(1),
            trusted_proxy_hops: args.trusted_proxy_hops.max(1),
            lookups_per_ip_per_second: args.lookups_per_ip_per_second,
            lookup_burst_per_ip: args.lookup_burst_per_ip,
            joins_per_ip_per_second: args.joins_per_ip_per_second,
            join_burst_per_ip: args.join_burst_per_ip,
            bundle_cache_bytes: args.bundle_cache_bytes,
            ..SERVER_LIMITS
        },
        outbound_queue: OUTBOUND_QUEUE,
        credentials: crate::http::CredentialSettings {
            operator_token: args.operator_token.clone(),
            wrong_per_ip_per_second: args.wrong_credentials_per_ip_per_second,
            wrong_burst_per_ip: args.wrong_credential_burst_per_ip,
            matches_per_ip_per_hour: args.matches_per_ip_per_hour,
            ggui_sessions_per_ip_per_hour: args.ggui_sessions_per_ip_per_hour,
            request_body_budget_bytes: args.request_body_budget_bytes,
        },
    }
}

/// A credential from its setting, or the one kept in the data directory
/// (made at first start); the file's path is printed, never the secret.
fn credential(
    dir: &Path,
    setting: &str,
    configured: Option<&str>,
    file: &str,
    what: &str,
) -> anyhow::Result<String> {
    if let Some(v) = configured.filter(|v| !v.trim().is_empty()) {
        return crate::http::credentials::checked_credential(setting, v);
    }
    let (token, path) = crate::http::credentials::load_or_make(dir, file).map_err(|e| {
        anyhow!(
            "cannot keep the {what} in {}: {e}. Hint: set {setting}, or choose a writable --data-dir / HOSTWIRE_DATA_DIR",
            dir.join(crate::http::credentials::CREDENTIALS_DIR).join(file).display()
        )
    })?;
    // On stderr: stdout's first line stays where the server listens.
    eprintln!(
        "hostwire {what}: {} (set {setting} to choose it)",
        path.display()
    );
    Ok(token)
}

/// The `hostwire` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Serve(args) => match serve(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
    }
}

/// rmcp logs each MCP session id at `info` when it creates one; a session
/// id read from a log is enough to talk in that session's stream, so its
/// session module logs at `warn` unless the filter names it.
const QUIET_MCP_SESSIONS: &str = "rmcp::transport::streamable_http_server::session=warn";

fn init_logs(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = if filter.contains("streamable_http_server") {
        filter.to_owned()
    } else {
        format!("{filter},{QUIET_MCP_SESSIONS}")
    };
    let filter = filter.as_str();
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| anyhow!("invalid log filter {filter:?} (--log-filter, RUST_LOG): {e}"))?;
    let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
    Ok(())
}

/// Why the port cannot be listened on, in one line with a hint.
fn bind_error(addr: &str, e: &std::io::Error) -> anyhow::Error {
    use std::io::ErrorKind;
    let hint = match e.kind() {
        ErrorKind::AddrInUse => {
            "another process listens there: stop it, or choose another port with --port or PORT (0 picks a free one)"
        }
        ErrorKind::PermissionDenied => "ports below 1024 need privileges: choose a higher one with --port or PORT",
        ErrorKind::AddrNotAvailable => {
            "this machine has no such address: use 127.0.0.1, or 0.0.0.0 for every interface, with --host or HOST"
        }
        _ => "check --host / HOST and --port / PORT",
    };
    anyhow!("cannot listen on {addr}: {e}. Hint: {hint}")
}

/// Creates the data directory; returns it as an absolute path.
fn data_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    std::fs::create_dir_all(&abs).map_err(|e| {
        anyhow!(
            "cannot create the data directory {}: {e}. Hint: choose a writable directory with --data-dir or HOSTWIRE_DATA_DIR",
            abs.display()
        )
    })?;
    Ok(std::fs::canonicalize(&abs).unwrap_or(abs))
}

/// Opens the database, with one line naming the file when it cannot.
fn open_store(db: &Path) -> anyhow::Result<SqliteStore> {
    SqliteStore::open(db).map_err(|e| {
        let reason = e.reason();
        anyhow!(
            "cannot open the database {}: {reason}. Hint: the data directory must be writable (SQLite keeps {DB_FILE}-wal and {DB_FILE}-shm beside it); choose another with --data-dir or HOSTWIRE_DATA_DIR",
            db.display()
        )
    })
}

/// `hostwire serve`.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logs(args.log_format, &args.log_filter)?;
    let rt = app::runtime().map_err(|e| anyhow!("cannot start the runtime: {e}"))?;
    rt.block_on(async move {
        // The port first: a server that cannot listen leaves no files.
        let addr = format!("{}:{}", args.host, args.port);
        let listener = TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(|e| bind_error(&addr, &e))?;
        let dir = data_dir(&args.data_dir)?;
        let _dir_lock = hostwire_store::lock_data_dir(&dir)?;
        let db = dir.join(DB_FILE);
        // An empty value (`HOSTWIRE_POSTGRES_URL=`) is no value: SQLite.
        let (stores, database) = match args.postgres_url.as_deref().filter(|u| !u.is_empty()) {
            Some(url) => app::Stores::connect_postgres(url)?,
            None => (app::Stores::sqlite(&Arc::new(open_store(&db)?)), db.display().to_string()),
        };
        let files = app::raise_open_file_limit();
        tracing::info!(
            open_files = files,
            "open-file limit (each connection uses one)"
        );
        let mut config = relay_config(&args);
        config.credentials.operator_token = Some(credential(
            &dir,
            "HOSTWIRE_OPERATOR_TOKEN",
            args.operator_token.as_deref(),
            crate::http::credentials::OPERATOR_CREDENTIAL_FILE,
            "operator credential",
        )?);
        if config.allowed_origins == AllowedOrigins::Any {
            tracing::warn!("ALLOWED_ORIGINS=* accepts every origin: for development only");
        }
        if args.request_body_budget_bytes < crate::http::LARGEST_REQUEST_BODY {
            anyhow::bail!(
                "REQUEST_BODY_BUDGET_BYTES: {} is under the largest request body ({} bytes); no bundle could be uploaded",
                args.request_body_budget_bytes,
                crate::http::LARGEST_REQUEST_BODY
            );
        }
        if args.ggui_token.is_some() {
            anyhow::bail!(
                "GGUI_TOKEN is no longer read: each ggui app has its own agent credential. Set GGUI_APPS=APP=CREDENTIAL (or APP, to have one made in the data directory) and unset GGUI_TOKEN"
            );
        }
        let mut ggui = ggui_config(&args);
        ggui.apps = ggui_apps(&dir, &args.ggui_apps)?;
        let mut p3_config =
            crate::playerthree::PlayerThreeConfig::new(config.allowed_origins.clone());
        p3_config.tick_ms = args.playerthree_tick_ms.max(1);
        p3_config.finished_ttl_ms = args.playerthree_finished_ttl_ms;
        p3_config.unjoined_ttl_ms = args.playerthree_unjoined_ttl_ms;
        let services = memizy_services(&args)?;
        tracing::info!(services = ?services.iter().map(|s| &s.name).collect::<Vec<_>>(), "memizy services offered");
        // Read once, before anything is served: a wrong path stops the start.
        let plugin_sdk = args
            .plugin_sdk
            .as_deref()
            .map(crate::sessions::play::PluginSdk::load)
            .transpose()?;
        let mut app_config = app::AppConfig::new(
            config,
            Arc::new(SystemClock),
            stores,
        );
        app_config.ggui = ggui;
        app_config.cluster = crate::cluster::Cluster::configure(
            args.nats_url.as_deref(),
            args.node_id.clone(),
            Arc::clone(&app_config.clock),
        )
        .await?;
        app_config.playerthree = p3_config;
        let sessions = &mut app_config.sessions;
        sessions.services = services;
        sessions.service_timeout_ms = args.memizy_service_timeout_ms.max(1);
        sessions.lobby_ttl_ms = args.memizy_session_lobby_ttl_ms;
        sessions.idle_ttl_ms = args.memizy_session_idle_ttl_ms;
        sessions.plugin_sdk = plugin_sdk;
        let app_config_node = app_config.cluster.node().to_owned();
        let server = App::start(listener, app_config)?;
        let stop = app::stop_signal();
        // A line for scripts and tests: where we listen.
        println!("hostwire listening on http://{}", server.addr);
        tracing::info!(addr = %server.addr, node = %app_config_node, db = %database, origins = %args.allowed_origins, "hostwire listening");
        stop.await;
        tracing::info!("shutting down");
        server.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn ggui(argv: &[&str]) -> crate::ggui::GguiConfig {
        let mut all = vec!["serve"];
        all.extend_from_slice(argv);
        ggui_config(&Serve::try_parse_from(all).unwrap().args)
    }

    #[test]
    fn ggui_caps_are_settings_with_their_defaults() {
        let c = ggui(&[]).channel;
        assert_eq!(
            (
                c.rate_per_second,
                c.rate_burst,
                c.max_subscribers_per_session
            ),
            (100.0, 200, 256)
        );
        let c = ggui(&[
            "--ggui-frames-per-second",
            "500",
            "--ggui-frame-burst",
            "1000",
            "--ggui-subscribers-per-session",
            "1024",
        ])
        .channel;
        assert_eq!(
            (
                c.rate_per_second,
                c.rate_burst,
                c.max_subscribers_per_session
            ),
            (500.0, 1_000, 1_024)
        );
        // No cap of zero: it would refuse every frame or every screen.
        for flag in [
            "--ggui-frames-per-second",
            "--ggui-frame-burst",
            "--ggui-subscribers-per-session",
        ] {
            assert!(
                Serve::try_parse_from(["serve", flag, "0"]).is_err(),
                "{flag}"
            );
        }
    }
}
