//! `serve`'s and `check`'s arguments, each with its environment variable.

use crate::check;
use crate::relay::SERVER_LIMITS;
use clap::{Args, Parser, Subcommand, ValueEnum};
use hostwire_memizy::RELAY_LIMITS;
use std::path::PathBuf;

/// The reference relay's default origins: the local development servers.
pub const DEFAULT_ALLOWED_ORIGINS: &str = "http://localhost:5180,http://127.0.0.1:5180";

#[derive(Parser)]
#[command(
    name = "hostwire",
    version,
    about = "Server and tools for host ↔ guest wire protocols"
)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Subcommand)]
pub(super) enum Command {
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
    /// Put a backup (from GET /admin/backup) back as the data directory's
    /// database, with the server stopped. The copy is checked first; the
    /// database it replaces is kept beside it as
    /// hostwire.db.replaced-<UTC time>, with everything it held.
    ///
    /// Exit status: 0 restored, 1 refused (a server uses the directory,
    /// the file is not a whole hostwire database, a file error).
    Restore(RestoreArgs),
}

#[derive(Args, Debug, Clone)]
pub struct RestoreArgs {
    /// The backup to put back.
    pub backup: PathBuf,
    /// The data directory whose database it becomes (created if missing).
    #[arg(long, env = "HOSTWIRE_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Read only to refuse: a server on PostgreSQL does not read the
    /// SQLite file, so a restore into it would change nothing it serves.
    #[arg(long, env = "HOSTWIRE_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
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
    /// When the SQLite file's commits are on disk: `normal` survives a
    /// killed process with no fsync per commit; `full` also survives a
    /// power cut or a kernel crash, at an fsync per commit.
    #[arg(long, env = "HOSTWIRE_SQLITE_SYNCHRONOUS", value_enum, default_value_t = SqliteSynchronous::Normal)]
    pub sqlite_synchronous: SqliteSynchronous,
    /// Keep what must survive a restart in this PostgreSQL database
    /// (postgres://USER:PASSWORD@HOST:PORT/DATABASE) instead of the
    /// embedded SQLite file; its schema is migrated at start-up. Empty:
    /// SQLite.
    #[arg(long, env = "HOSTWIRE_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// Join the other nodes on this NATS server (nats://HOST:PORT): each
    /// node announces itself there every second and lists the others in
    /// /api/health, and a client of a unit another node owns is carried
    /// to that node over it. Unreachable at start-up: the start stops;
    /// lost later: reconnected. Empty: a single node.
    #[arg(long, env = "HOSTWIRE_NATS_URL", hide_env_values = true)]
    pub nats_url: Option<String>,
    /// This node's id among its peers (1 to 64 letters, digits, '-', '_',
    /// '.'). Unset: a random one, made at each start and logged.
    #[arg(long, env = "HOSTWIRE_NODE_ID")]
    pub node_id: Option<String>,
    /// On PostgreSQL, how long a node owns a unit (a relay room, a hosted
    /// or ggui session, a PlayerThree match) without
    /// renewing its lease (e.g. 5s, 1500ms): a node that dies or is cut
    /// off loses its units to another node this long after its last
    /// renewal. Renewed every third of it.
    #[arg(long, env = "HOSTWIRE_LEASE_TTL", default_value = "5s", value_parser = lease_ttl)]
    pub lease_ttl: std::time::Duration,
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

/// What a ggui version mismatch does to the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GguiVersionPolicy {
    Strict,
    Advisory,
}

/// SQLite's `synchronous` (WAL mode), as [`hostwire_store::SqliteSync`].
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum SqliteSynchronous {
    Normal,
    Full,
}

impl From<SqliteSynchronous> for hostwire_store::SqliteSync {
    fn from(s: SqliteSynchronous) -> Self {
        match s {
            SqliteSynchronous::Normal => hostwire_store::SqliteSync::Normal,
            SqliteSynchronous::Full => hostwire_store::SqliteSync::Full,
        }
    }
}

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

/// A lease length: a duration (`5s`, `1500ms`) of at least
/// [`MIN_LEASE_TTL`](crate::cluster::leases::MIN_LEASE_TTL).
fn lease_ttl(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (a duration: 5s, 1500ms)"))?;
    let min = crate::cluster::leases::MIN_LEASE_TTL;
    if d < min {
        return Err(format!("at least {}", humantime::format_duration(min)));
    }
    Ok(d)
}
