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

use super::actor::{MatchCmd, SeatBinding};
use super::PlayerThree;
use crate::http::{bearer, Presented, Refused};
use axum::extract::FromRequestParts;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hostwire_playerthree::decode::{decode_disclosure, MAX_COMMENTARY_TEXT_BYTES};
use hostwire_playerthree::host::{ProposalStatus, MAX_COMMENTARY_PER_TICK};
use hostwire_playerthree::protocol::{token_shape_ok, ProtocolError, Roles};
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{ClientMsg, ConnId, Json, ServerMsg, MAX_MESSAGE_BYTES};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::sync::Mutex;
use tokio::sync::{mpsc, oneshot, OnceCell};

/// Live MCP sessions one server holds; a new one past it is refused (503).
pub const MAX_MCP_SESSIONS: u64 = 1024;
/// The largest MCP request body (a tool call's arguments are a `call`'s).
pub const MAX_MCP_BODY_BYTES: usize = MAX_MESSAGE_BYTES;

/// Milliseconds a seat stays `live` after its token's last MCP session
/// ended: an agent whose client opens a session per request keeps its
/// seat live between requests instead of flipping it (and pushing
/// `seats` to every watcher) twice a request.
pub const MCP_LIVE_GRACE_MS: u64 = 30_000;

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
    let gatekeeper = Arc::new(McpGate {
        p3: Arc::clone(&p3),
        manager,
        sessions: Mutex::new(Registry::default()),
    });
    let _ = p3.mcp.set(Arc::clone(&gatekeeper));
    Router::new()
        .nest_service("/playerthree/mcp", service)
        .layer(from_fn_with_state(gatekeeper, authenticate))
}

/// MCP sessions one seat token may hold at once (`initialize` past it: 429).
pub const MAX_MCP_SESSIONS_PER_TOKEN: usize = 4;
/// MCP sessions one client IP may hold at once (`initialize` past it: 429).
pub const MAX_MCP_SESSIONS_PER_IP: usize = 64;

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
    manager: Arc<LocalSessionManager>,
    sessions: Mutex<Registry>,
}

impl McpGate {
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
async fn authenticate(State(g): State<Arc<McpGate>>, req: Request, next: Next) -> Response {
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
            {
                let reg = g.registry();
                if reg.by_id.len() as u64 >= MAX_MCP_SESSIONS {
                    return refused(StatusCode::SERVICE_UNAVAILABLE, "MAX_MCP_SESSIONS reached");
                }
                if reg.count(|(h, _)| *h == hash) >= g.p3.config.mcp_sessions_per_token {
                    return refused(
                        StatusCode::TOO_MANY_REQUESTS,
                        "MAX_MCP_SESSIONS_PER_TOKEN reached: end a session (DELETE) first",
                    );
                }
                if reg.count(|(_, ip)| *ip == presented.ip) >= g.p3.config.mcp_sessions_per_ip {
                    return refused(
                        StatusCode::TOO_MANY_REQUESTS,
                        "MAX_MCP_SESSIONS_PER_IP reached: end a session (DELETE) first",
                    );
                }
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

/// One MCP session: the seat it is bound to, once its first request came.
pub struct Agent {
    p3: Arc<PlayerThree>,
    bound: OnceCell<Bound>,
    seq: AtomicU64,
}

struct Bound {
    token: String,
    seat: SeatBinding,
    conn: ConnId,
    tx: mpsc::Sender<MatchCmd>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        // The session ended: the seat stays live for the grace if it was
        // its token's last one.
        let _ = self.tx.try_send(MatchCmd::Leave { conn: self.conn });
    }
}

fn mcp_error(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::invalid_request(e.to_string(), None)
}

impl Agent {
    fn new(p3: Arc<PlayerThree>) -> Self {
        Self {
            p3,
            bound: OnceCell::new(),
            seq: AtomicU64::new(1),
        }
    }

    /// The session's seat; the first request binds it, later ones must
    /// carry the same token.
    async fn seat(&self, ctx: &RequestContext<RoleServer>) -> Result<&Bound, ErrorData> {
        let token = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| bearer(&p.headers))
            .ok_or_else(|| mcp_error("Authorization: Bearer <seat token> required"))?
            .to_owned();
        let bound = self
            .bound
            .get_or_try_init(|| async {
                let handle = self
                    .p3
                    .match_of_token(&token)
                    .ok_or_else(|| mcp_error("bad_token: not a live token"))?;
                let conn = self.p3.next_conn();
                let (reply, answer) = oneshot::channel();
                handle
                    .tx
                    .send(MatchCmd::McpJoin {
                        conn,
                        token: token.clone(),
                        peer: ctx.peer.clone(),
                        reply,
                    })
                    .await
                    .map_err(|_| mcp_error("match closed"))?;
                let seat = answer
                    .await
                    .map_err(|_| mcp_error("match closed"))?
                    .map_err(|e| mcp_error(format!("{}: {}", e.code.as_str(), e.message)))?;
                self.p3.metrics.mcp_sessions.fetch_add(1, Relaxed);
                Ok::<_, ErrorData>(Bound {
                    token: token.clone(),
                    seat,
                    conn,
                    tx: handle.tx.clone(),
                })
            })
            .await?;
        if bound.token != token {
            return Err(mcp_error(
                "forbidden: this session belongs to another token",
            ));
        }
        Ok(bound)
    }

    async fn ask<T>(
        &self,
        b: &Bound,
        cmd: impl FnOnce(oneshot::Sender<T>) -> MatchCmd,
    ) -> Result<T, ErrorData> {
        let (reply, answer) = oneshot::channel();
        b.tx.send(cmd(reply))
            .await
            .map_err(|_| mcp_error("match closed"))?;
        answer.await.map_err(|_| mcp_error("match closed"))
    }

    /// A client op of the seat's own token, answered as a tool result.
    async fn client_op(&self, b: &Bound, msg: ClientMsg) -> Result<CallToolResponse, ErrorData> {
        let conn = b.conn;
        let reply = self
            .ask(b, |reply| MatchCmd::McpCall { conn, msg, reply })
            .await?;
        Ok(tool_result(&reply).into())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.bound.initialized() {
            self.p3.metrics.mcp_sessions.fetch_sub(1, Relaxed);
        }
    }
}

/// A host answer as a tool result.
fn answer(r: Result<Json, ProtocolError>) -> CallToolResult {
    tool_result(&match r {
        Ok(data) => ServerMsg::ok(0, data),
        Err(e) => ServerMsg::error(0, &e),
    })
}

/// A `result` as a tool result: `data` on success, `{code, message}` as
/// an error result.
fn tool_result(reply: &ServerMsg) -> CallToolResult {
    let v: Value = serde_json::from_str(&reply.to_text()).unwrap_or(Value::Null);
    if v["ok"] == Value::Bool(true) {
        let data = v["data"].clone();
        CallToolResult::success(vec![ContentBlock::text(data.to_string())])
    } else {
        let e = json!({ "code": v["code"], "message": v["message"] });
        CallToolResult::error(vec![ContentBlock::text(e.to_string())])
    }
}

fn schema(v: Value) -> Arc<serde_json::Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(serde_json::Map::new()),
    }
}

/// The tools besides the control methods.
const TELL: &str = "tell";
const INBOX: &str = "inbox";
const PROPOSAL: &str = "proposal";
const DISCLOSE: &str = "disclose";

impl ServerHandler for Agent {
    #[allow(deprecated)] // logging: pushed tells (see actor.rs)
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_logging()
                .build(),
        )
        .with_instructions(
            "A PlayerThree seat: one tool per control method of the seat; read or subscribe \
             to the team view resource; `tell` answers your owners; `inbox` holds their \
             tells (subscribe to the inbox resource to have each pushed as a \
             `playerthree/tell` log message); on a supervised seat a call returns a \
             pending proposal, see `proposal`; `disclose` shares a summary or chat line \
             with the match's observers (public, after their delay).",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let b = self.seat(&ctx).await?;
        let mut tools: Vec<Tool> = b
            .seat
            .methods
            .iter()
            .map(|m| {
                Tool::new(
                    m.name.clone(),
                    m.description.clone(),
                    schema(m.input_schema.clone()),
                )
            })
            .collect();
        tools.push(Tool::new(
            TELL,
            "Say something to your team's owners (your reply to their tells).",
            schema(json!({
                "type": "object",
                "properties": {"text": {"type": "string", "maxLength": 4096}},
                "required": ["text"],
                "additionalProperties": false
            })),
        ));
        tools.push(Tool::new(
            INBOX,
            "Take the tells your owners sent you that you have not read yet.",
            schema(json!({"type": "object", "additionalProperties": false})),
        ));
        tools.push(Tool::new(
            PROPOSAL,
            "Where a supervised proposal stands: pending, applied (with its result), rejected or failed.",
            schema(json!({
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
                "additionalProperties": false
            })),
        ));
        let role = b.seat.role.clone();
        if self
            .ask(b, |reply| MatchCmd::McpIsAgent { role, reply })
            .await?
        {
            tools.push(Tool::new(
                DISCLOSE,
                format!(
                    "Share a summary of your play or a chat line with the match's observers. \
                     Public: observers read it with the frame recorded after it, once their \
                     delay has passed. At most {MAX_COMMENTARY_TEXT_BYTES} bytes, \
                     {MAX_COMMENTARY_PER_TICK} per tick."
                ),
                schema(json!({
                    "type": "object",
                    "properties": {
                        "category": {"type": "string", "enum": ["summary", "chat"]},
                        "text": {"type": "string", "minLength": 1, "maxLength": MAX_COMMENTARY_TEXT_BYTES}
                    },
                    "required": ["category", "text"],
                    "additionalProperties": false
                })),
            ));
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let b = self.seat(&ctx).await?;
        let args = Value::Object(request.arguments.unwrap_or_default());
        let seq = self.seq.fetch_add(1, Relaxed);
        match request.name.as_ref() {
            TELL => {
                let Some(text) = args.get("text").and_then(Value::as_str) else {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(
                        "text: expected a string",
                    )])
                    .into());
                };
                let msg = ClientMsg::Tell {
                    seq,
                    roles: Roles::Some(vec![b.seat.role.clone()]),
                    text: text.to_owned(),
                    ping: None,
                };
                self.client_op(b, msg).await
            }
            INBOX => {
                let role = b.seat.role.clone();
                let told = self
                    .ask(b, |reply| MatchCmd::McpInbox { role, reply })
                    .await?;
                let list: Vec<Value> = told.iter().map(told_json).collect();
                Ok(CallToolResult::success(vec![ContentBlock::text(
                    Value::Array(list).to_string(),
                )])
                .into())
            }
            PROPOSAL => {
                let Some(id) = args.get("id").and_then(Value::as_str).map(str::to_owned) else {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(
                        "id: expected a string",
                    )])
                    .into());
                };
                let status = self
                    .ask(b, |reply| MatchCmd::McpProposal { id, reply })
                    .await?;
                let v = match status {
                    None => {
                        return Ok(CallToolResult::error(vec![ContentBlock::text(
                            json!({"code": "approval_not_found"}).to_string(),
                        )])
                        .into())
                    }
                    Some(ProposalStatus::Pending) => json!({"status": "pending"}),
                    Some(ProposalStatus::Applied(r)) => {
                        json!({"status": "applied", "result": r.to_value()})
                    }
                    Some(ProposalStatus::Rejected) => json!({"status": "rejected"}),
                    Some(ProposalStatus::Failed(m)) => json!({"status": "failed", "message": m}),
                };
                Ok(CallToolResult::success(vec![ContentBlock::text(v.to_string())]).into())
            }
            DISCLOSE => {
                let disclosure = match decode_disclosure(&Json::from(args)) {
                    Ok(d) => d,
                    Err(e) => return Ok(answer(Err(e)).into()),
                };
                let conn = b.conn;
                let r = self
                    .ask(b, |reply| MatchCmd::McpDisclose {
                        conn,
                        disclosure,
                        reply,
                    })
                    .await?;
                Ok(answer(r).into())
            }
            method => {
                let msg = ClientMsg::Call {
                    seq,
                    role: b.seat.role.clone(),
                    method: method.to_owned(),
                    args: Json::from(args),
                };
                self.client_op(b, msg).await
            }
        }
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let b = self.seat(&ctx).await?;
        let r = Resource::new(view_uri(&b.seat.match_id, &b.seat.team), "team view")
            .with_description("Your team's fogged view of the match, as JSON.")
            .with_mime_type("application/json");
        let i = Resource::new(inbox_uri(&b.seat.match_id, &b.seat.role), "inbox")
            .with_description(
                "Your owners' tells waiting for you; subscribe to have each pushed as it arrives.",
            )
            .with_mime_type("application/json");
        Ok(ListResourcesResult::with_all_items(vec![r, i]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let b = self.seat(&ctx).await?;
        let uri = view_uri(&b.seat.match_id, &b.seat.team);
        let inbox = inbox_uri(&b.seat.match_id, &b.seat.role);
        if request.uri == inbox {
            let role = b.seat.role.clone();
            let told = self
                .ask(b, |reply| MatchCmd::McpPeekInbox { role, reply })
                .await?;
            let text = Value::Array(told.iter().map(told_json).collect()).to_string();
            return Ok(ReadResourceResult::new(vec![
                ResourceContents::text(text, inbox).with_mime_type("application/json")
            ])
            .into());
        }
        if request.uri != uri {
            return Err(ErrorData::resource_not_found(
                format!("uri: this seat reads {uri} and {inbox}"),
                None,
            ));
        }
        let team = b.seat.team.clone();
        let view = self
            .ask(b, |reply| MatchCmd::McpView { team, reply })
            .await?;
        let text = view.map_or(Value::Null, |v| v.to_value()).to_string();
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(text, uri).with_mime_type("application/json")
        ])
        .into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let b = self.seat(&ctx).await?;
        let cmd = if request.uri == inbox_uri(&b.seat.match_id, &b.seat.role) {
            MatchCmd::McpSubscribeInbox {
                conn: b.conn,
                role: b.seat.role.clone(),
                peer: Some(ctx.peer.clone()),
            }
        } else if request.uri == view_uri(&b.seat.match_id, &b.seat.team) {
            MatchCmd::McpSubscribe {
                conn: b.conn,
                team: b.seat.team.clone(),
                peer: Some(ctx.peer.clone()),
            }
        } else {
            return Err(ErrorData::resource_not_found(
                "uri: neither this seat's view nor its inbox",
                None,
            ));
        };
        b.tx.send(cmd).await.map_err(|_| mcp_error("match closed"))
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let b = self.seat(&ctx).await?;
        let cmd = if request.uri == inbox_uri(&b.seat.match_id, &b.seat.role) {
            MatchCmd::McpSubscribeInbox {
                conn: b.conn,
                role: b.seat.role.clone(),
                peer: None,
            }
        } else {
            MatchCmd::McpSubscribe {
                conn: b.conn,
                team: b.seat.team.clone(),
                peer: None,
            }
        };
        b.tx.send(cmd).await.map_err(|_| mcp_error("match closed"))
    }
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
