//! What `serve`'s arguments configure: the relay, ggui, the hosted
//! sessions' services, and the credentials kept in the data directory.

use super::args::{GguiVersionPolicy, ServeArgs};
use crate::http::AllowedOrigins;
use crate::relay::{RelayConfig, ServerLimits, OUTBOUND_QUEUE, SERVER_LIMITS};
use anyhow::anyhow;
use hostwire_memizy::RELAY_LIMITS;
use std::path::Path;

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
pub(super) fn ggui_apps(dir: &Path, specs: &[String]) -> anyhow::Result<Vec<crate::ggui::GguiApp>> {
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
pub(super) fn credential(
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
