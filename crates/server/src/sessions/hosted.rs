//! A hosted session as its task holds it ([`Hosted`]), the commands it
//! takes ([`Cmd`], [`Admin`]) and the outputs it gives ([`Out`]): the types
//! the session's files share. The task itself is `actor.rs`; the API's
//! operations `admin.rs`, the engine's outputs `outputs.rs`, the device
//! side of worker RPC `rpc.rs`, what holds a channel `deliver.rs`: each
//! builds on this file, and this file on none of them.

use super::recording::Recorder;
use super::services::{ServiceHost, Ticket};
use super::SessionMetrics;
use crate::ws;
use foldhash::HashMap;
use hostwire_core::token::Token;
use hostwire_memizy::session::{
    AssetCatalog, BundledFile, CallId, DurableSession, InstanceId, PlayerSpec, ServiceCallId,
};
use hostwire_memizy::{ProtocolError, View};
use hostwire_worker_rpc::frame::{Frame, FrameError, Payload};
use hostwire_worker_rpc::PeerState;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// A device's outbound queue (text frames).
pub type DeviceOut = ws::Outbound;

/// 1013: the device did not read its frames fast enough.
pub const CLOSE_TOO_SLOW: ws::Close = (1013, "too slow: outbound queue full");
/// 4001: the device did not present the token of the instance it attaches as.
pub const CLOSE_UNAUTHORIZED: ws::Close = (4001, "unauthorized: wrong or missing token");
/// Who may attach as which instance: the host token opens the board, the
/// settings screen and the host's own player; each player's token opens
/// that player's instance. Compared in constant time.
#[derive(Debug, Clone)]
pub struct Auth {
    pub host: Token,
    pub players: std::collections::HashMap<String, Token>,
}

impl Auth {
    /// Whether `token` opens the instance at `address` in `view`;
    /// `is_host_player` says whether that address is the host's player.
    pub fn allows(&self, view: View, address: &str, is_host_player: bool, token: &str) -> bool {
        let host = self.host.matches(token);
        match view {
            View::Board | View::Settings => host,
            View::Solo | View::Controller => {
                let own = self.players.get(address).is_some_and(|t| t.matches(token));
                own || (is_host_player && host)
            }
        }
    }
}

/// Why an attach was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachRefused {
    /// Wrong or missing token (close 4001).
    Unauthorized(String),
    /// The engine refused it (close 1008).
    Refused(String),
}

/// How to reach a session's task.
#[derive(Clone)]
pub struct SessionHandle {
    pub tx: mpsc::Sender<Cmd>,
    /// Told when another node took the session over (its lease lost).
    pub(super) lost: Arc<tokio::sync::Notify>,
}

pub enum Cmd {
    Attach {
        instance: InstanceId,
        view: View,
        address: String,
        out: DeviceOut,
        /// The token the device presented (`None`: none).
        token: Option<String>,
        done: oneshot::Sender<Result<(), AttachRefused>>,
    },
    Detach {
        instance: InstanceId,
    },
    /// A worker RPC frame from a device (or why it could not be read).
    Frame {
        instance: InstanceId,
        frame: Result<Frame, FrameError>,
    },
    /// The answer to a device's Host API call, found beside the task (an
    /// asset read from the store, settings once they are kept).
    Respond {
        instance: InstanceId,
        call: CallId,
        result: Result<Payload, ProtocolError>,
    },
    Admin(Box<Admin>, AdminReply),
    /// A service call's worker answered (result JSON text) or failed.
    ServiceDone {
        id: ServiceCallId,
        outcome: Result<String, ProtocolError>,
    },
    /// Do what is due now (the clock moved); answered when done.
    Wake(oneshot::Sender<()>),
    Shutdown,
}

/// What an answer waiting for the store carries.
pub(super) enum Tag {
    /// An HTTP API change, answered with `body` once kept.
    Admin(AdminReply, Value),
    /// An HTTP `save`.
    Save(AdminReply),
    /// A device's `updateSettings`, answered once its settings are kept.
    Settings(InstanceId, CallId, Payload),
}

/// A hosted session as the unit driver sees it: the engine with its
/// durability rules, and what the server keeps beside it.
pub(super) struct Hosted {
    pub(super) d: DurableSession<Tag>,
    /// Each attached device's worker RPC state, boxed: the state is over
    /// 500 B, and a map holds up to twice the slots of its entries.
    pub(super) rpc: HashMap<InstanceId, Box<PeerState>>,
    /// No device's Plugin API call is due before this (`None`: none is
    /// out). A bound, not the earliest: an answered call leaves it where
    /// it was, and the walk of every device's calls runs only once it has
    /// passed (the driver asks for the session's deadline every turn).
    pub(super) devices_due: Option<u64>,
    pub(super) out: VecDeque<Out>,
    pub(super) metrics: Arc<SessionMetrics>,
    pub(super) result: Option<Value>,
    pub(super) auth: Auth,
    pub(super) assets: AssetCatalog,
    pub(super) services: Arc<ServiceHost>,
    /// Service calls out, by their deadline (a cancel says whether it
    /// passed).
    pub(super) service_calls: HashMap<ServiceCallId, u64>,
    /// An `updateSettings` call being handled: its answer waits until the
    /// settings it changed are kept.
    pub(super) held: Option<(InstanceId, CallId)>,
    /// `Wake`s answered once the session's removal is.
    pub(super) wakes: Vec<oneshot::Sender<()>>,
    /// What a replay needs (SPEC 10).
    pub(super) rec: Recorder,
}

/// An HTTP API operation and where its answer goes.
pub enum Admin {
    Status,
    /// A player and the token its device attaches with.
    AddPlayer(Box<PlayerSpec>, Token),
    Kick(String),
    /// A player's new name (`playersChanged`).
    Rename(String, String),
    /// A new locale or theme (`configChanged`).
    Config(hostwire_memizy::HostConfig),
    Start,
    Pause,
    Resume,
    Save,
    /// The host ends the session: every instance gets
    /// `sessionEnded('closed')`.
    End,
    /// The recording (SPEC 10) as it stands.
    Recording,
    /// `continue`: a started game that is paused (as a continued or
    /// restored one is) or still loading answers its status and every
    /// player's token.
    Continue,
}

pub type AdminReply = oneshot::Sender<Result<Value, (u16, String)>>;

/// What the session's task carries out, in order.
pub(super) enum Out {
    /// The device attached: its frames go to `out` from now on; its reader
    /// is told.
    Attached(
        InstanceId,
        DeviceOut,
        oneshot::Sender<Result<(), AttachRefused>>,
    ),
    /// A worker RPC frame for a device.
    Frame(InstanceId, String),
    /// Closes a device's socket; nothing more goes to it.
    Close(InstanceId, ws::Close),
    /// The device detached: nothing more goes to it.
    Forget(InstanceId),
    /// Closes every device's socket.
    CloseAll(ws::Close),
    /// An HTTP API operation's answer.
    Reply(AdminReply, Result<Value, (u16, String)>),
    /// `getAsset`: its bytes are read beside the session.
    Asset {
        instance: InstanceId,
        call: CallId,
        file: BundledFile,
        key: String,
        item_id: Option<String>,
    },
    /// A service call started: it runs beside the session until answered
    /// or cancelled.
    Service(
        ServiceCallId,
        String,
        hostwire_worker_rpc::Call,
        Ticket,
        Arc<ServiceHost>,
    ),
    /// A service call stops; `true`: its deadline passed.
    CancelService(ServiceCallId, bool),
    /// A `Wake` is answered.
    Woken(oneshot::Sender<()>),
    /// The session's task ends.
    Stop,
}
