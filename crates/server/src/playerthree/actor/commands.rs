//! What a match's task is asked ([`MatchCmd`]) and the handle it is asked
//! through ([`MatchHandle`]); each command as the protocol crate's
//! [`MatchCommand`] and the [`Tag`] its answer goes back to.

use crate::playerthree::ws::ConnOut;
use crate::ws::Utf8Bytes;
use hostwire_playerthree::durable::MatchCommand;
use hostwire_playerthree::host::{ProposalStatus, Told};
use hostwire_playerthree::protocol::{Disclosure, ProtocolError};
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::{ClientMsg, ConnId, Json, Principal, ServerMsg};
use rmcp::service::{Peer, RoleServer};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// An MCP agent's seat, as its session is bound to it (the protocol
/// crate's).
pub use hostwire_playerthree::durable::SeatBinding;

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
    /// Told when another node took the match over (its lease lost).
    pub lost: Arc<tokio::sync::Notify>,
}

/// Where a command's answer goes, and what the server side keeps of it
/// (a socket's outbound queue, an MCP session's peer).
pub enum Tag {
    Join(ConnOut, oneshot::Sender<Result<(), ProtocolError>>),
    /// A join's reply, once its socket is set up.
    Joined(oneshot::Sender<Result<(), ProtocolError>>),
    Mint(oneshot::Sender<Result<String, ProtocolError>>),
    Revoke(oneshot::Sender<bool>),
    Card(oneshot::Sender<Result<(), ProtocolError>>),
    McpJoin(
        Peer<RoleServer>,
        oneshot::Sender<Result<SeatBinding, ProtocolError>>,
    ),
    Check(oneshot::Sender<Result<(), ProtocolError>>),
    Call(oneshot::Sender<ServerMsg>),
    View(oneshot::Sender<Option<Json>>),
    /// The session told when its team's view changes (`None`: no longer).
    ViewPeer(Option<Peer<RoleServer>>),
    Tells(oneshot::Sender<Vec<Told>>),
    /// The session tells are pushed to (`None`: no longer).
    InboxPeer(Option<Peer<RoleServer>>),
    Proposal(oneshot::Sender<Option<ProposalStatus>>),
    IsAgent(oneshot::Sender<bool>),
    Disclose(oneshot::Sender<Result<Json, ProtocolError>>),
    Wake(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
}

impl From<MatchCmd> for (MatchCommand<Utf8Bytes>, Option<Tag>) {
    fn from(cmd: MatchCmd) -> Self {
        use MatchCommand as C;
        let (cmd, tag) = match cmd {
            MatchCmd::Join {
                conn,
                token,
                out,
                reply,
            } => (C::Join { conn, token }, Tag::Join(out, reply)),
            MatchCmd::Text { conn, text } => return (C::Text { conn, text }, None),
            MatchCmd::Leave { conn } => return (C::Leave { conn }, None),
            MatchCmd::Mint { principal, reply } => (C::Mint { principal }, Tag::Mint(reply)),
            MatchCmd::Revoke { token, reply } => (C::Revoke { token }, Tag::Revoke(reply)),
            MatchCmd::SetCard { role, card, reply } => {
                (C::SetCard { role, card }, Tag::Card(reply))
            }
            MatchCmd::McpJoin {
                conn,
                token,
                peer,
                reply,
            } => (C::McpJoin { conn, token }, Tag::McpJoin(peer, reply)),
            MatchCmd::McpCheck { token, reply } => (C::McpCheck { token }, Tag::Check(reply)),
            MatchCmd::McpCall { conn, msg, reply } => (C::McpCall { conn, msg }, Tag::Call(reply)),
            MatchCmd::McpView { team, reply } => (C::McpView { team }, Tag::View(reply)),
            MatchCmd::McpSubscribe { conn, team, peer } => {
                let on = peer.is_some();
                (C::McpSubscribe { conn, team, on }, Tag::ViewPeer(peer))
            }
            MatchCmd::McpInbox { role, reply } => (C::McpInbox { role }, Tag::Tells(reply)),
            MatchCmd::McpPeekInbox { role, reply } => (C::McpPeekInbox { role }, Tag::Tells(reply)),
            MatchCmd::McpPushed { conn } => return (C::McpPushed { conn }, None),
            MatchCmd::McpSubscribeInbox { conn, role, peer } => {
                let on = peer.is_some();
                (
                    C::McpSubscribeInbox { conn, role, on },
                    Tag::InboxPeer(peer),
                )
            }
            MatchCmd::McpProposal { id, reply } => (C::McpProposal { id }, Tag::Proposal(reply)),
            MatchCmd::McpIsAgent { role, reply } => (C::McpIsAgent { role }, Tag::IsAgent(reply)),
            MatchCmd::McpDisclose {
                conn,
                disclosure,
                reply,
            } => (C::McpDisclose { conn, disclosure }, Tag::Disclose(reply)),
            MatchCmd::Wake(done) => (C::Wake, Tag::Wake(done)),
            MatchCmd::Shutdown(done) => (C::Shutdown, Tag::Shutdown(done)),
        };
        (cmd, Some(tag))
    }
}
