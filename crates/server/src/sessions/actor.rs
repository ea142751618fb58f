//! One task per session: it owns the engine and each attached device's
//! worker RPC state, handles commands in the order they arrive, carries
//! out the engine's outputs (`outputs.rs`) and arms one timer at the
//! earliest of the engine's `poll_timeout`, the devices' Plugin API call
//! deadlines and the session's expiry. The HTTP API's operations are in
//! `admin.rs`, the device side of worker RPC in `rpc.rs`.

pub use super::admin::{Admin, AdminReply};
use super::recording::Recorder;
use super::restore::KeptState;
use super::rpc::Device;
use super::services::ServiceHost;
use super::{SessionMetrics, Sessions, STORE_QUEUE};
use crate::store_writer::{Durable, StoreWriter};
use crate::ws;
use hostwire_core::token::Token;
use hostwire_memizy::session::{
    AssetCatalog, CallId, InstanceId, Phase, RecordId, ServiceCallId, Session,
};
use hostwire_memizy::{ProtocolError, SessionEndReason, View};
use hostwire_store::sessions::SessionWrite;
use hostwire_worker_rpc::frame::{Frame, FrameError, Payload};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// A device's outbound queue (text frames).
pub type DeviceOut = ws::Outbound;

/// 1013: the device did not read its frames fast enough.
pub const CLOSE_TOO_SLOW: ws::Close = (1013, "too slow: outbound queue full");
/// 4001: the device did not present the token of the instance it attaches as.
pub const CLOSE_UNAUTHORIZED: ws::Close = (4001, "unauthorized: wrong or missing token");
/// Assets read from the store and encoded at once, over all sessions (each
/// costs up to the 2 MB asset and its base64 text); more wait their turn.
pub const CONCURRENT_ASSET_LOADS: usize = 16;

pub(super) static ASSET_LOADS: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(CONCURRENT_ASSET_LOADS);

/// Who may attach as which instance: the host token opens the board, the
/// settings screen and the host's own player; each player's token opens
/// that player's instance. Compared in constant time.
#[derive(Debug, Clone)]
pub struct Auth {
    pub host: Token,
    pub players: HashMap<String, Token>,
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
    Durable {
        id: RecordId,
        outcome: Result<(), String>,
    },
    /// A service call's worker answered (result JSON text) or failed.
    ServiceDone {
        id: ServiceCallId,
        outcome: Result<String, ProtocolError>,
    },
    /// Do what is due now (the clock moved); answered when done.
    Wake(oneshot::Sender<()>),
    Shutdown,
}

pub(super) struct Actor {
    pub(super) sessions: Arc<Sessions>,
    pub(super) metrics: Arc<SessionMetrics>,
    pub(super) s: Session,
    pub(super) devices: HashMap<InstanceId, Device>,
    /// Each record's answer from the store writer, in the order queued.
    pub(super) store_tx: mpsc::Sender<(RecordId, Durable)>,
    pub(super) writer: StoreWriter<SessionWrite>,
    /// HTTP `save` requests waiting for their record to be durable.
    pub(super) saves: HashMap<RecordId, (AdminReply, Value)>,
    pub(super) result: Option<Value>,
    pub(super) auth: Auth,
    pub(super) assets: AssetCatalog,
    pub(super) services: Arc<ServiceHost>,
    /// Service calls out: what stops each (`true`: its deadline passed) and
    /// its deadline.
    pub(super) service_calls: HashMap<ServiceCallId, (oneshot::Sender<bool>, u64)>,
    /// This session's own queue, for the tasks it starts (weak: the
    /// session ends when every device and the API let go of it).
    pub(super) me: mpsc::WeakSender<Cmd>,
    /// When this task started (the session was created or continued).
    pub(super) started_at: u64,
    /// The last attach, Host API call or HTTP API operation.
    pub(super) last_used: u64,
    /// An `updateSettings` call being handled: its answer waits until the
    /// settings it changed are kept.
    pub(super) held: Option<(InstanceId, CallId)>,
    /// Its rows were removed (it expired): nothing more is kept.
    pub(super) removed: bool,
    /// What a replay needs (SPEC 10).
    pub(super) rec: Recorder,
}

/// Starts the task of a session and its store writer; `None` if the server
/// holds as many sessions as it may or the id is taken. `auth` says who
/// may attach; `assets` where `getAsset`'s bytes are; `rec` the recording
/// so far (empty for a new session, the kept one for one brought back).
pub fn spawn(
    sessions: &Arc<Sessions>,
    s: Session,
    auth: Auth,
    assets: AssetCatalog,
    rec: super::recording::Recorder,
) -> Option<SessionHandle> {
    let (tx, rx) = mpsc::channel(super::SESSION_QUEUE);
    let handle = SessionHandle { tx: tx.clone() };
    let id = s.id().to_owned();
    if !sessions.insert(id.clone(), handle.clone()) {
        return None;
    }
    // A root span: the session outlives the request that created it.
    let span = tracing::info_span!(parent: None, "session", id = %id);
    let (store_tx, store_rx) = mpsc::channel(STORE_QUEUE);
    tokio::spawn(tracing::Instrument::instrument(
        store_answers(Arc::clone(&sessions.metrics), store_rx, tx.clone()),
        span.clone(),
    ));
    sessions.metrics.sessions.fetch_add(1, Relaxed);
    let actor = Actor {
        metrics: Arc::clone(&sessions.metrics),
        sessions: Arc::clone(sessions),
        s,
        devices: HashMap::new(),
        store_tx,
        writer: sessions.writer(),
        saves: HashMap::new(),
        result: None,
        auth,
        assets,
        services: sessions.services(),
        service_calls: HashMap::new(),
        me: tx.downgrade(),
        started_at: sessions.clock.now_ms(),
        last_used: sessions.clock.now_ms(),
        held: None,
        removed: false,
        rec,
    };
    tokio::spawn(tracing::Instrument::instrument(actor.run(rx), span));
    Some(handle)
}

/// Reports one session's records to it in order, each once the store
/// writer says it is durable (or failed).
async fn store_answers(
    metrics: Arc<SessionMetrics>,
    mut rx: mpsc::Receiver<(RecordId, Durable)>,
    session: mpsc::Sender<Cmd>,
) {
    while let Some((id, durable)) = rx.recv().await {
        let outcome = if durable.wait().await {
            Ok(())
        } else {
            metrics.store_failures.fetch_add(1, Relaxed);
            Err("the store did not take the record".to_owned())
        };
        if session.send(Cmd::Durable { id, outcome }).await.is_err() {
            return;
        }
    }
}

impl Actor {
    /// Session time and game time now (SPEC 4.2).
    pub(super) fn times(&self, now: u64) -> (f64, f64) {
        let c = self.s.clock();
        (now as f64 + c.offset_ms, c.game_time(now as f64))
    }

    /// Hands the recording to the store writer (kept behind the session's
    /// other records; a full queue tries again at the next change).
    pub(super) fn write_recording(&mut self) {
        if self.removed || !self.rec.dirty() {
            return;
        }
        let body = self.rec.take_document(self.s.id());
        let w = SessionWrite::Recording {
            session_id: self.s.id().to_owned(),
            body,
            at_ms: self.now(),
        };
        self.writer.try_write_behind(self.s.id(), vec![w]);
    }

    pub(super) fn now(&self) -> u64 {
        self.sessions.clock.now_ms()
    }

    /// When the session expires: `lobby_ttl_ms` after it started here if
    /// still in its lobby, `idle_ttl_ms` after its last use while no
    /// device is attached.
    fn expires_at(&self) -> Option<u64> {
        let lobby = (self.s.phase() == Phase::Lobby)
            .then(|| self.started_at.saturating_add(self.sessions.lobby_ttl_ms()));
        let idle = self
            .devices
            .is_empty()
            .then(|| self.last_used.saturating_add(self.sessions.idle_ttl_ms()));
        match (lobby, idle) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn expired(&self) -> bool {
        self.saves.is_empty() && self.expires_at().is_some_and(|t| self.now() >= t)
    }

    /// Removes the expired session: devices closed, every row keyed by it
    /// deleted (durably, before it is forgotten: the API then answers 404,
    /// also after a restart).
    async fn expire(&mut self) {
        self.removed = true;
        for (_, d) in self.devices.drain() {
            d.out.close((1001, "session expired"));
        }
        let id = self.s.id().to_owned();
        let removed = self
            .writer
            .write_durable(
                &id,
                vec![SessionWrite::Removed {
                    session_id: id.clone(),
                }],
            )
            .await;
        tracing::info!(session = %id, removed, "hosted session expired");
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        self.drain();
        loop {
            if self.expired() {
                self.expire().await;
                break;
            }
            let wait = self
                .s
                .poll_timeout()
                .into_iter()
                .chain(self.expires_at())
                .chain(self.devices_timeout())
                .min()
                .map(|at| Duration::from_millis(at.saturating_sub(self.now())));
            let cmd = tokio::select! {
                c = rx.recv() => c,
                () = sleep_opt(wait) => {
                    // The engine's deadline, a Plugin API call's or the
                    // session's expiry.
                    self.tick();
                    continue;
                }
            };
            let Some(cmd) = cmd else { break };
            if let Cmd::Wake(done) = cmd {
                self.tick();
                let expired = self.expired();
                if expired {
                    self.expire().await;
                }
                let _ = done.send(());
                if expired {
                    break;
                }
                continue;
            }
            if matches!(cmd, Cmd::Attach { .. } | Cmd::Frame { .. } | Cmd::Admin(..)) {
                self.last_used = self.now();
            }
            if !self.handle(cmd) {
                break;
            }
            // A deadline that passed while commands kept the task busy (or
            // on a clock that moved without the timer) is handled now.
            self.tick();
            if self.rec.due() {
                self.write_recording();
            }
            if self.s.phase() == Phase::Closed && self.devices.is_empty() && self.saves.is_empty() {
                break;
            }
        }
        for d in self.devices.values() {
            d.out.close((1001, "session closed"));
        }
        if self.s.phase() == Phase::Closed && self.s.result().is_none() && !self.removed {
            // Stopped without a result (its authority stayed away): a
            // restart does not bring it back, `continue` does.
            let w = KeptState::of(&self.s, self.now()).write(self.s.id());
            self.writer.write_behind(self.s.id(), vec![w]).await;
        }
        if self.rec.dirty() && !self.removed {
            let body = self.rec.take_document(self.s.id());
            let w = SessionWrite::Recording {
                session_id: self.s.id().to_owned(),
                body,
                at_ms: self.now(),
            };
            self.writer.write_behind(self.s.id(), vec![w]).await;
        }
        self.sessions.remove(self.s.id());
        self.metrics.sessions.fetch_sub(1, Relaxed);
    }

    /// Handles one command; `false` stops the session's task.
    fn handle(&mut self, cmd: Cmd) -> bool {
        let now = self.now();
        match cmd {
            Cmd::Attach {
                instance,
                view,
                address,
                out,
                token,
                done,
            } => {
                let is_host_player = self
                    .s
                    .players()
                    .iter()
                    .any(|p| p.id == address && p.is_host);
                let allowed = token
                    .as_deref()
                    .is_some_and(|t| self.auth.allows(view, &address, is_host_player, t));
                if !allowed {
                    let why = match (token.is_some(), view) {
                        (false, _) => "token: required (?token= or Authorization: Bearer)",
                        (true, View::Board | View::Settings) => {
                            "token: not the session's host token"
                        }
                        (true, _) => "token: not the token of this player",
                    };
                    let _ = done.send(Err(AttachRefused::Unauthorized(why.to_owned())));
                    return true;
                }
                match self.s.attach(instance, view, &address, now) {
                    Ok(()) => {
                        // Worker RPC: the server's hello goes first.
                        let mut d = Device::new(out);
                        let _ = d.flush();
                        self.devices.insert(instance, d);
                        self.rec.attached(instance, &address);
                        let _ = done.send(Ok(()));
                    }
                    Err(e) => {
                        let _ = done.send(Err(AttachRefused::Refused(e.to_string())));
                    }
                }
            }
            Cmd::Detach { instance } => {
                self.devices.remove(&instance);
                self.rec.detached(instance);
                self.s.detach(instance, now);
            }
            Cmd::Frame { instance, frame } => self.on_frame(instance, frame, now),
            Cmd::Respond {
                instance,
                call,
                result,
            } => self.respond(instance, call, result),
            Cmd::Durable { id, outcome } => {
                if let Some((reply, body)) = self.saves.remove(&id) {
                    let _ = reply.send(match &outcome {
                        Ok(()) => Ok(body),
                        Err(why) => {
                            Err((503, format!("the saved game could not be stored: {why}")))
                        }
                    });
                }
                self.s.record_durable(id, outcome, now);
            }
            Cmd::ServiceDone { id, outcome } => {
                self.service_calls.remove(&id);
                self.s
                    .service_done(id, outcome.as_deref().map_err(Clone::clone), now);
            }
            Cmd::Admin(op, reply) => self.admin(*op, reply, now),
            Cmd::Wake(done) => {
                let _ = done.send(());
            }
            Cmd::Shutdown => return false,
        }
        true
    }
}

impl Actor {
    /// Does what is due now: the engine's deadline, the devices' Plugin API
    /// call deadlines, then every output.
    fn tick(&mut self) {
        let now = self.now();
        if self.s.poll_timeout().is_some_and(|at| at <= now) {
            self.s.handle_timeout(now);
        }
        self.device_timeouts(now);
        self.drain();
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Why an instance was closed, for logs.
pub fn end_reason(r: &SessionEndReason) -> &str {
    r.as_str()
}
