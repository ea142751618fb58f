//! One MCP session ([`Agent`]): the seat its first request binds it to,
//! and how it asks its match and turns the answers into tool results.

use crate::http::bearer;
use crate::playerthree::actor::{MatchCmd, SeatBinding};
use crate::playerthree::PlayerThree;
use hostwire_playerthree::protocol::ProtocolError;
use hostwire_playerthree::{ClientMsg, ConnId, Json, ServerMsg};
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, OnceCell};
/// One MCP session: the seat it is bound to, once its first request came.
pub struct Agent {
    pub(super) p3: Arc<PlayerThree>,
    bound: OnceCell<Bound>,
    /// The `seq` of the session's next client op.
    pub(super) seq: AtomicU64,
}

/// The seat a session is bound to, and the connection it acts through.
pub(super) struct Bound {
    token: String,
    pub(super) seat: SeatBinding,
    pub(super) conn: ConnId,
    pub(super) tx: mpsc::Sender<MatchCmd>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        // The session ended: the seat stays live for the grace if it was
        // its token's last one.
        let _ = self.tx.try_send(MatchCmd::Leave { conn: self.conn });
    }
}

pub(super) fn mcp_error(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::invalid_request(e.to_string(), None)
}

impl Agent {
    pub(super) fn new(p3: Arc<PlayerThree>) -> Self {
        Self {
            p3,
            bound: OnceCell::new(),
            seq: AtomicU64::new(1),
        }
    }

    /// The session's seat; the first request binds it, later ones must
    /// carry the same token.
    pub(super) async fn seat(&self, ctx: &RequestContext<RoleServer>) -> Result<&Bound, ErrorData> {
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

    pub(super) async fn ask<T>(
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
    pub(super) async fn client_op(
        &self,
        b: &Bound,
        msg: ClientMsg,
    ) -> Result<CallToolResponse, ErrorData> {
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
pub(super) fn answer(r: Result<Json, ProtocolError>) -> CallToolResult {
    tool_result(&match r {
        Ok(data) => ServerMsg::ok(0, data),
        Err(e) => ServerMsg::error(0, &e),
    })
}

/// A `result` as a tool result: `data` on success, `{code, message}` as
/// an error result.
pub(super) fn tool_result(reply: &ServerMsg) -> CallToolResult {
    let v: Value = serde_json::from_str(&reply.to_text()).unwrap_or(Value::Null);
    if v["ok"] == Value::Bool(true) {
        let data = v["data"].clone();
        CallToolResult::success(vec![ContentBlock::text(data.to_string())])
    } else {
        let e = json!({ "code": v["code"], "message": v["message"] });
        CallToolResult::error(vec![ContentBlock::text(e.to_string())])
    }
}

pub(super) fn schema(v: Value) -> Arc<serde_json::Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(serde_json::Map::new()),
    }
}
