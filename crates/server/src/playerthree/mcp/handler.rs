//! What an MCP session offers: one tool per control method of its seat
//! and `tell`, `inbox`, `proposal`, `disclose`; its team view and inbox
//! as resources, readable and subscribable.

use super::agent::{answer, mcp_error, schema, Agent};
use super::{inbox_uri, told_json, view_uri};
use crate::playerthree::actor::MatchCmd;
use hostwire_playerthree::decode::{decode_disclosure, MAX_COMMENTARY_TEXT_BYTES};
use hostwire_playerthree::host::{ProposalStatus, MAX_COMMENTARY_PER_TICK};
use hostwire_playerthree::protocol::Roles;
use hostwire_playerthree::{ClientMsg, Json};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
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
