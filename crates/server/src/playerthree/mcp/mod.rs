//! `/playerthree/mcp`: agents over MCP (streamable HTTP, `rmcp`). Every
//! request carries the agent's seat token (`Authorization: Bearer`); a
//! session is bound to the seat of its first request and joins the match
//! as that seat (its `SeatInfo` shows `live` while the token has a
//! session, and [`MCP_LIVE_GRACE_MS`] after its last one ended).
//!
//! - tools: one per control method of the seat (the game's input schema),
//!   `tell` (the agent's reply to its owners), `inbox` (its owners' tells
//!   waiting for it), `proposal` (where a supervised proposal stands), and,
//!   while an agent plays the seat, `disclose` (commentary for observers,
//!   released with the delayed frames; `tools/list_changed` when the
//!   seat's controller changes);
//! - resource: the seat's team view, `playerthree://{match}/view/{team}`,
//!   readable and subscribable (`notifications/resources/updated` when a
//!   tick changes it);
//! - resource: the seat's inbox, `playerthree://{match}/inbox/{role}`
//!   (the tells waiting, read without taking them). Subscribed, each tell
//!   is pushed as it arrives, as a logging notification
//!   (`notifications/message`, logger `playerthree/tell`, data `{role,
//!   text, tick, ping?}`), and taken from the inbox: a subscribed agent
//!   never needs `inbox`.
//!
//! A tool call is a `call` of the seat's own token: scopes, supervision
//! (the result is a pending proposal) and every refusal are the host's.

mod agent;
mod gate;
mod handler;

pub use agent::Agent;
pub(crate) use gate::McpGate;

use super::PlayerThree;
use axum::middleware::from_fn_with_state;
use axum::Router;
use hostwire_playerthree::MAX_MESSAGE_BYTES;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};
use std::sync::Arc;

/// Live MCP sessions one server holds; a new one past it is refused (503).
pub const MAX_MCP_SESSIONS: u64 = 1024;
/// MCP sessions one seat token may hold at once (`initialize` past it: 429).
pub const MAX_MCP_SESSIONS_PER_TOKEN: usize = 4;
/// MCP sessions one client IP may hold at once (`initialize` past it: 429).
pub const MAX_MCP_SESSIONS_PER_IP: usize = 64;
/// The largest MCP request body (a tool call's arguments are a `call`'s).
pub const MAX_MCP_BODY_BYTES: usize = MAX_MESSAGE_BYTES;

/// Milliseconds a seat stays `live` after its token's last MCP session
/// ended (the protocol crate's).
pub use hostwire_playerthree::durable::MCP_LIVE_GRACE_MS;

/// The logger name of a pushed tell.
pub const TELL_LOGGER: &str = "playerthree/tell";

/// The URI of a seat's inbox resource.
pub fn inbox_uri(match_id: &str, role: &str) -> String {
    format!("playerthree://{match_id}/inbox/{role}")
}

/// A tell as an agent sees it (the `inbox` tool, the inbox resource, a
/// pushed tell).
pub fn told_json(t: &hostwire_playerthree::host::Told) -> Value {
    let mut v = json!({"role": t.role, "text": t.text, "tick": t.tick});
    if let Some(p) = &t.ping {
        v["ping"] = p.to_value();
    }
    v
}

/// The URI of a team's view resource.
pub fn view_uri(match_id: &str, team: &str) -> String {
    format!("playerthree://{match_id}/view/{team}")
}

pub fn router(p3: Arc<PlayerThree>) -> Router {
    let config = StreamableHttpServerConfig::default()
        // Hosts are the deployment's; browsers are held to the allowed
        // origins by `authenticate`.
        .with_allowed_hosts(Vec::<String>::new())
        .with_max_request_body_bytes(MAX_MCP_BODY_BYTES);
    let factory_p3 = Arc::clone(&p3);
    let manager = Arc::new(LocalSessionManager::default());
    let service: StreamableHttpService<Agent, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(Agent::new(Arc::clone(&factory_p3))),
        Arc::clone(&manager),
        config,
    );
    let gatekeeper = Arc::new(McpGate::new(Arc::clone(&p3), manager));
    let _ = p3.mcp.set(Arc::clone(&gatekeeper));
    Router::new()
        .nest_service("/playerthree/mcp", service)
        .layer(from_fn_with_state(gatekeeper, gate::authenticate))
}

impl PlayerThree {
    /// MCP sessions open now (as rmcp holds them), for tests and metrics.
    pub async fn mcp_sessions_open(&self) -> usize {
        match self.mcp.get() {
            Some(g) => g.manager.sessions.read().await.len(),
            None => 0,
        }
    }
}
