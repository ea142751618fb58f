//! The gate in front of MCP: origins, the seat token on every request, a
//! session bound to the token that opened it, and the caps on sessions
//! per token, per client IP and per server.

use super::MAX_MCP_SESSIONS;
use crate::http::{Presented, Refused};
use crate::playerthree::actor::MatchCmd;
use crate::playerthree::{Find, PlayerThree};
use axum::extract::FromRequestParts;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hostwire_playerthree::protocol::token_shape_ok;
use hostwire_playerthree::tokens::TokenHash;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::SessionManager;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use tokio::sync::oneshot;

/// Who opened each MCP session: its token (by hash) and client IP, from
/// its `initialize`.
#[derive(Default)]
struct Registry {
    by_id: HashMap<String, (TokenHash, String)>,
}

impl Registry {
    fn count(&self, f: impl Fn(&(TokenHash, String)) -> bool) -> usize {
        self.by_id.values().filter(|e| f(e)).count()
    }
}

pub(crate) struct McpGate {
    p3: Arc<PlayerThree>,
    pub(super) manager: Arc<LocalSessionManager>,
    sessions: Mutex<Registry>,
}

impl McpGate {
    pub(super) fn new(p3: Arc<PlayerThree>, manager: Arc<LocalSessionManager>) -> Self {
        Self {
            p3,
            manager,
            sessions: Mutex::new(Registry::default()),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets sessions rmcp no longer holds (ended, idled out).
    async fn prune(&self) {
        let live: std::collections::HashSet<String> = self
            .manager
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        self.registry().by_id.retain(|id, _| live.contains(id));
    }

    /// Ends every session of a token now (it was revoked).
    pub(crate) async fn end_token(&self, token: TokenHash) {
        let ids: Vec<String> = self
            .registry()
            .by_id
            .iter()
            .filter(|(_, (h, _))| *h == token)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.end(&id).await;
        }
    }

    /// The refusal of a new session past the caps per server, per token
    /// and per client IP.
    fn over_caps(&self, hash: TokenHash, ip: &str) -> Option<Response> {
        let reg = self.registry();
        if reg.by_id.len() as u64 >= MAX_MCP_SESSIONS {
            return Some(refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "MAX_MCP_SESSIONS reached",
            ));
        }
        if reg.count(|(h, _)| *h == hash) >= self.p3.config.mcp_sessions_per_token {
            return Some(refused(
                StatusCode::TOO_MANY_REQUESTS,
                "MAX_MCP_SESSIONS_PER_TOKEN reached: end a session (DELETE) first",
            ));
        }
        if reg.count(|(_, i)| i == ip) >= self.p3.config.mcp_sessions_per_ip {
            return Some(refused(
                StatusCode::TOO_MANY_REQUESTS,
                "MAX_MCP_SESSIONS_PER_IP reached: end a session (DELETE) first",
            ));
        }
        None
    }

    /// Ends a session now (its token was revoked).
    async fn end(&self, id: &str) {
        self.registry().by_id.remove(id);
        let id: rmcp::transport::common::server_side_http::SessionId = id.to_owned().into();
        let _ = self.manager.close_session(&id).await;
    }
}

fn unauthorized(message: &'static str) -> Response {
    let mut r = (StatusCode::UNAUTHORIZED, message).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"playerthree\""),
    );
    r
}

fn refused(status: StatusCode, message: &'static str) -> Response {
    (status, message).into_response()
}

/// Refuses, before MCP sees them: origins not allowed; requests without a
/// seat token that is, now, valid (a revoked seat's sessions end here);
/// a session id opened by another token (it reads nothing: 404); an
/// `initialize` past the caps per token, per IP and per server. Counts
/// each session from its `initialize`, bound to the token that sent it.
pub(super) async fn authenticate(
    State(g): State<Arc<McpGate>>,
    req: Request,
    next: Next,
) -> Response {
    if !req.uri().path().starts_with("/playerthree/mcp") {
        return next.run(req).await;
    }
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok());
    // Agents are not browsers and send no Origin; a browser's must be
    // allowed (no page of another site may drive an agent's seat).
    if origin.is_some() && !g.p3.origins.allows(origin) {
        return (StatusCode::FORBIDDEN, "Origin not allowed").into_response();
    }
    let (mut parts, body) = req.into_parts();
    let presented = match Presented::from_request_parts(&mut parts, &()).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    // On a cluster the token's match is taken over first if this node
    // does not run it (another live node's: 503).
    if let Some(t) = presented.token.as_deref().filter(|t| token_shape_ok(t)) {
        if let Find::Elsewhere(_) | Find::Unavailable = g.p3.find_by_token(t).await {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "the seat token's match is served by another node; try again",
            )
                .into_response();
        }
    }
    let handle = match presented.check(|t| {
        if token_shape_ok(t) {
            g.p3.match_of_token(t)
        } else {
            None
        }
    }) {
        Ok(h) => h,
        Err(Refused::Throttled(retry)) => return Refused::Throttled(retry).response("seat token"),
        Err(Refused::Missing) => {
            return unauthorized("Authorization: Bearer <seat token> required")
        }
        Err(Refused::Wrong) => return unauthorized("not a seat token of a hosted match"),
    };
    let token = presented.token.clone().unwrap_or_default();
    let hash = TokenHash::of(&token);
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Its current state, on every request.
    let (reply, answer) = oneshot::channel();
    let state = match handle
        .tx
        .send(MatchCmd::McpCheck {
            token: token.clone(),
            reply,
        })
        .await
    {
        Ok(()) => answer.await.ok(),
        Err(_) => None,
    };
    match state {
        Some(Ok(())) => {}
        Some(Err(e)) if e.code == hostwire_playerthree::protocol::ServerErrorCode::Forbidden => {
            return refused(StatusCode::FORBIDDEN, "MCP takes a seat token");
        }
        _ => {
            if let Some(id) = &session {
                let ours = g.registry().by_id.get(id).is_some_and(|(h, _)| *h == hash);
                if ours {
                    tracing::debug!(session = %id, "MCP session of a revoked token ended");
                    g.end(id).await;
                }
            }
            return unauthorized("the seat token is no longer valid");
        }
    }
    match &session {
        Some(id) => {
            let bound = g.registry().by_id.get(id).map(|(h, _)| *h);
            if bound != Some(hash) {
                // Another token's session, or none: nothing to read.
                return refused(StatusCode::NOT_FOUND, "session not found");
            }
            let delete = parts.method == axum::http::Method::DELETE;
            let r = next.run(Request::from_parts(parts, body)).await;
            if delete && r.status().is_success() {
                g.registry().by_id.remove(id);
            }
            r
        }
        None => {
            g.prune().await;
            if let Some(r) = g.over_caps(hash, &presented.ip) {
                return r;
            }
            let r = next.run(Request::from_parts(parts, body)).await;
            if let Some(id) = r
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
            {
                // Bound to its token from its `initialize` on.
                g.registry()
                    .by_id
                    .insert(id.to_owned(), (hash, presented.ip.clone()));
            }
            r
        }
    }
}
