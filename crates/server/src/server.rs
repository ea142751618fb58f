//! `hostwire serve`: configuration, start-up, the sweep timer and graceful
//! shutdown.

use crate::metrics::Metrics;
use crate::relay::{router, AllowedOrigins, Relay, RelayConfig};
use crate::store_writer::StoreWriter;
use clap::{Args, ValueEnum};
use hostwire_core::{Clock, SystemClock};
use hostwire_memizy::RELAY_LIMITS;
use hostwire_store::{RelayStore, SqliteStore};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The reference relay's default origins: the local development servers.
pub const DEFAULT_ALLOWED_ORIGINS: &str = "http://localhost:5180,http://127.0.0.1:5180";

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Port to listen on (0 picks a free one; the address is logged).
    #[arg(long, env = "PORT", default_value_t = 8787)]
    pub port: u16,
    /// Address to listen on. Use 0.0.0.0 to accept other machines.
    #[arg(long, env = "HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Browser origins allowed to use the relay, comma-separated, e.g.
    /// "https://play.example.org". "*" allows any origin (development only).
    #[arg(long, env = "ALLOWED_ORIGINS", default_value = DEFAULT_ALLOWED_ORIGINS)]
    pub allowed_origins: String,
    /// Take the client IP from X-Forwarded-For (behind a reverse proxy).
    /// Set TRUST_PROXY=1 to enable.
    #[arg(long, env = "TRUST_PROXY", default_value = "0", value_parser = parse_flag, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "1")]
    pub trust_proxy: bool,
    /// Directory of the embedded database (created if missing).
    #[arg(long, env = "HOSTWIRE_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Rooms one client IP may create per hour (a school shares one IP).
    #[arg(long, env = "ROOMS_PER_IP_PER_HOUR", default_value_t = RELAY_LIMITS.rooms_per_ip_per_hour)]
    pub rooms_per_ip_per_hour: u32,
    /// Log format.
    #[arg(long, env = "HOSTWIRE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
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

/// A running relay.
pub struct RelayServer {
    pub addr: SocketAddr,
    pub relay: Arc<Relay>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl RelayServer {
    /// Starts serving on `listener` with the rooms `store` holds.
    pub fn start(
        listener: TcpListener,
        config: RelayConfig,
        clock: Arc<dyn Clock>,
        store: Arc<dyn RelayStore>,
    ) -> anyhow::Result<RelayServer> {
        let metrics = Arc::new(Metrics::default());
        let stored = store.load_rooms()?;
        let loaded = stored.len();
        let writer = StoreWriter::start(store, Arc::clone(&metrics));
        let relay = Relay::start(config, clock, metrics, writer, stored);
        let addr = listener.local_addr()?;
        // Without TCP_NODELAY, small frames wait for delayed ACKs (~40 ms).
        let listener =
            axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY");
                }
            });
        let (stop, mut stopped) = watch::channel(false);
        let app = router(Arc::clone(&relay)).into_make_service_with_connect_info::<SocketAddr>();
        let sweeper = Arc::clone(&relay);
        let mut sweep_stop = stop.subscribe();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(RELAY_LIMITS.sweep_interval_ms));
            loop {
                tokio::select! {
                    _ = tick.tick() => sweeper.sweep().await,
                    _ = sweep_stop.changed() => break,
                }
            }
        });
        let shutdown_relay = Arc::clone(&relay);
        let task = tokio::spawn(async move {
            let graceful = async move {
                let _ = stopped.wait_for(|s| *s).await;
                // Sockets first (1001), then the store is flushed.
                shutdown_relay.shutdown().await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(graceful)
                .await
            {
                tracing::error!(error = %e, "server error");
            }
        });
        tracing::info!(%addr, rooms = loaded, "relay listening");
        Ok(RelayServer {
            addr,
            relay,
            stop,
            task,
        })
    }

    /// Stops accepting, closes every socket with 1001, flushes the store.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.relay.shutdown().await;
    }
}

pub fn relay_config(args: &ServeArgs) -> RelayConfig {
    RelayConfig {
        allowed_origins: AllowedOrigins::parse(&args.allowed_origins),
        trust_proxy: args.trust_proxy,
        rooms_per_ip_per_hour: args.rooms_per_ip_per_hour,
        limits: RELAY_LIMITS,
        outbound_queue: crate::relay::OUTBOUND_QUEUE,
    }
}

fn init_logs(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Raises the open-file soft limit to the hard limit: every connection is a
/// file, and a common default of 1,024 would cap a server at about 1,000
/// players. Returns the limit in force.
#[cfg(unix)]
pub fn raise_open_file_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit on a local, zero-initialized struct.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 0;
        }
        if l.rlim_cur < l.rlim_max {
            let wanted = libc::rlimit {
                rlim_cur: l.rlim_max,
                rlim_max: l.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
                return wanted.rlim_cur;
            }
        }
        l.rlim_cur
    }
}

#[cfg(not(unix))]
pub fn raise_open_file_limit() -> u64 {
    0
}

/// `hostwire serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logs(args.log_format);
    let files = raise_open_file_limit();
    tracing::info!(
        open_files = files,
        "open-file limit (each connection uses one)"
    );
    // On one core the work-stealing scheduler only adds cross-thread
    // bookkeeping: the single-threaded one runs the same tasks.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rt = if cores == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    rt.block_on(async move {
        std::fs::create_dir_all(&args.data_dir)?;
        let db = args.data_dir.join("hostwire.db");
        let store: Arc<dyn RelayStore> = Arc::new(SqliteStore::open(&db)?);
        let listener = TcpListener::bind((args.host.as_str(), args.port)).await?;
        let config = relay_config(&args);
        if config.allowed_origins == AllowedOrigins::Any {
            tracing::warn!("ALLOWED_ORIGINS=* accepts every origin: for development only");
        }
        let server = RelayServer::start(listener, config, Arc::new(SystemClock), store)?;
        // A line for scripts and tests: where we listen.
        println!("hostwire relay listening on http://{}", server.addr);
        tracing::info!(db = %db.display(), origins = %args.allowed_origins, "serving");
        stop_signal().await;
        tracing::info!("shutting down");
        server.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    })
}
