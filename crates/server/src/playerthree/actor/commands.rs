//! What a match's task is asked ([`MatchCmd`]) and the handle it is asked
//! through ([`MatchHandle`]), with the seat an MCP session is bound to.

use crate::playerthree::ws::ConnOut;
use axum::extract::ws::Utf8Bytes;
use hostwire_playerthree::host::{ProposalStatus, Told};
use hostwire_playerthree::protocol::{Disclosure, ProtocolError};
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{ClientMsg, ConnId, ControlMethod, Json, Principal, ServerMsg};
use rmcp::service::{Peer, RoleServer};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// An MCP agent's seat, as its session is bound to it.
#[derive(Debug, Clone)]
pub struct SeatBinding {
    pub match_id: String,
    pub role: String,
    pub team: String,
    pub methods: Vec<ControlMethod>,
}

pub enum MatchCmd {
    Join {
        conn: ConnId,
        token: String,
        out: ConnOut,
        reply: oneshot::Sender<Result<(), ProtocolError>>,
    },
    Text {
        conn: ConnId,
        text: Utf8Bytes,
    },
    Leave {
        conn: ConnId,
    },
    Mint {
        principal: Principal,
        reply: oneshot::Sender<Result<String, ProtocolError>>,
    },
    Revoke {
        token: String,
        reply: oneshot::Sender<bool>,
    },
    /// The operator sets (or, with `None`, clears) a seat's card.
    SetCard {
        role: String,
        card: Option<hostwire_playerthree::protocol::EntrantCard>,
        reply: oneshot::Sender<Result<(), ProtocolError>>,
    },
    McpJoin {
        conn: ConnId,
        token: String,
        /// The session, told when its tool list changes.
        peer: Peer<RoleServer>,
        reply: oneshot::Sender<Result<SeatBinding, ProtocolError>>,
    },
    /// Whether a token is, now, a seat token of this match (MCP checks it
    /// on every request: a revoked seat's session ends at once).
    McpCheck {
        token: String,
        reply: oneshot::Sender<Result<(), ProtocolError>>,
    },
    McpCall {
        conn: ConnId,
        msg: ClientMsg,
        reply: oneshot::Sender<ServerMsg>,
    },
    McpView {
        team: String,
        reply: oneshot::Sender<Option<Json>>,
    },
    McpSubscribe {
        conn: ConnId,
        team: String,
        peer: Option<Peer<RoleServer>>,
    },
    McpInbox {
        role: String,
        reply: oneshot::Sender<Vec<Told>>,
    },
    McpPeekInbox {
        role: String,
        reply: oneshot::Sender<Vec<Told>>,
    },
    /// A push of tells to this session is done.
    McpPushed {
        conn: ConnId,
    },
    /// Push the seat's tells to this session as they arrive (`None`: stop).
    McpSubscribeInbox {
        conn: ConnId,
        role: String,
        peer: Option<Peer<RoleServer>>,
    },
    McpProposal {
        id: String,
        reply: oneshot::Sender<Option<ProposalStatus>>,
    },
    /// Whether the seat is played by an agent (and so offered `disclose`).
    McpIsAgent {
        role: String,
        reply: oneshot::Sender<bool>,
    },
    McpDisclose {
        conn: ConnId,
        disclosure: Disclosure,
        reply: oneshot::Sender<Result<Json, ProtocolError>>,
    },
    /// Runs the due work now (after a manual clock moved).
    Wake(oneshot::Sender<()>),
    /// Closes every connection with 1001.
    Shutdown(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct MatchHandle {
    pub id: Arc<str>,
    /// The operator token's hash (the text is never kept).
    pub operator_token: TokenHash,
    pub tx: mpsc::Sender<MatchCmd>,
    /// What its connections may send, in bytes ([`crate::playerthree::pace`]).
    pub inbound: Arc<crate::playerthree::pace::InboundPace>,
}
