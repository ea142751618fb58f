//! The command line: `hostwire serve`, `check` and `restore`, their
//! arguments (each with its environment variable) and logging.
//!
//! [`args`] holds the arguments, [`config`] what they configure; this file
//! starts the server.

mod args;
mod config;

use args::{Cli, Command};
use config::{credential, ggui_apps};

pub use args::{GguiVersionPolicy, LogFormat, ServeArgs, DEFAULT_ALLOWED_ORIGINS};
pub use config::{ggui_config, memizy_services, relay_config, MAX_GGUI_APP_ID_CHARS};

use crate::app::{self, App};
use crate::check;
use crate::http::AllowedOrigins;
use anyhow::anyhow;
use clap::Parser;
use hostwire_core::SystemClock;
use hostwire_store::SqliteStore;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The database file in the data directory.
pub const DB_FILE: &str = "hostwire.db";

/// The `hostwire` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Restore(args) => restore(&args),
        Command::Serve(args) => match serve(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
    }
}

/// `hostwire restore`: what was done, or why nothing was.
fn restore(args: &args::RestoreArgs) -> ExitCode {
    if args.postgres_url.as_ref().is_some_and(|u| !u.is_empty()) {
        eprintln!(
            "error: the server's database is PostgreSQL (--postgres-url / HOSTWIRE_POSTGRES_URL is set), which does not read {}: restore that database with its own tools (pg_restore); nothing was changed",
            args.data_dir.join(DB_FILE).display()
        );
        return ExitCode::from(1);
    }
    match hostwire_store::restore_into(&args.data_dir, DB_FILE, &args.backup) {
        Ok(done) => {
            let live = args.data_dir.join(DB_FILE);
            println!(
                "restored {} from {} ({} bytes, schema version {})",
                live.display(),
                args.backup.display(),
                done.bytes,
                done.schema_version
            );
            if let Some(kept) = done.replaced {
                println!("the database it replaced is kept as {}", kept.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let unchanged = matches!(
                e,
                hostwire_store::RestoreError::Lock(_)
                    | hostwire_store::RestoreError::Unusable { .. }
            );
            let note = if unchanged {
                " (nothing was changed)"
            } else {
                ""
            };
            eprintln!("error: {e}{note}");
            ExitCode::from(1)
        }
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
fn open_store(db: &Path, sync: hostwire_store::SqliteSync) -> anyhow::Result<SqliteStore> {
    SqliteStore::open_with(db, sync).map_err(|e| {
        let reason = e.reason();
        anyhow!(
            "cannot open the database {}: {reason}. Hint: the data directory must be writable (SQLite keeps {DB_FILE}-wal beside it); choose another with --data-dir or HOSTWIRE_DATA_DIR",
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
            None => {
                let sync = args.sqlite_synchronous.into();
                let store = open_store(&db, sync)?;
                tracing::info!(db = %db.display(), synchronous = sync.pragma(), "SQLite store opened");
                (app::Stores::sqlite(&Arc::new(store)), db.display().to_string())
            }
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
        app_config.lease_ttl = args.lease_ttl;
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
