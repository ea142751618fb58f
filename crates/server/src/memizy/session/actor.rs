//! One task per session: it owns the engine, handles commands in the order
//! they arrive, carries out the engine's outputs (replies and Plugin API
//! calls to devices, records to the store, events) and arms the engine's
//! timer at `poll_timeout`.

use super::restore::KeptState;
use super::services::{self, ServiceHost};
use super::{SessionMetrics, Sessions, STORE_QUEUE};
use crate::store_writer::{Durable, StoreWriter};
use crate::ws::{self, Refused};
use axum::extract::ws::Utf8Bytes;
use base64::Engine;
use hostwire_core::token::Token;
use hostwire_memizy::session::{
    AssetCatalog, CallId, CloseReason, InstanceId, Output, Phase, PlayerSpec, Record, RecordId,
    Reply, ServiceCallId, Session, SessionError, SessionEvent,
};
use hostwire_memizy::{ProtocolError, ProtocolErrorCode, SessionEndReason, View};
use hostwire_store::sessions::SessionWrite;
use hostwire_worker_rpc::frame::{ErrorEnvelope, Frame, Outcome, Payload, PROTOCOL_VERSION};
use serde_json::{json, Value};
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

static ASSET_LOADS: tokio::sync::Semaphore =
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
    /// A Host API call: a `request` frame's id, method and params text.
    Call {
        instance: InstanceId,
        call: CallId,
        method: String,
        params: String,
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
    /// The device's worker RPC `cancel` of its call.
    Cancel {
        instance: InstanceId,
        call: CallId,
    },
    /// Do what is due now (the clock moved); answered when done.
    Wake(oneshot::Sender<()>),
    Shutdown,
}

struct Device {
    out: DeviceOut,
    /// The id of the next Plugin API call sent to it.
    next_call: u64,
}

struct Actor {
    sessions: Arc<Sessions>,
    metrics: Arc<SessionMetrics>,
    s: Session,
    devices: HashMap<InstanceId, Device>,
    /// Each record's answer from the store writer, in the order queued.
    store_tx: mpsc::Sender<(RecordId, Durable)>,
    writer: StoreWriter<SessionWrite>,
    /// HTTP `save` requests waiting for their record to be durable.
    saves: HashMap<RecordId, (AdminReply, Value)>,
    result: Option<Value>,
    auth: Auth,
    assets: AssetCatalog,
    services: Arc<ServiceHost>,
    /// Service calls out: what stops each (`true`: its deadline passed) and
    /// its deadline.
    service_calls: HashMap<ServiceCallId, (oneshot::Sender<bool>, u64)>,
    /// This session's own queue, for the tasks it starts (weak: the
    /// session ends when every device and the API let go of it).
    me: mpsc::WeakSender<Cmd>,
    /// When this task started (the session was created or continued).
    started_at: u64,
    /// The last attach, Host API call or HTTP API operation.
    last_used: u64,
    /// An `updateSettings` call being handled: its answer waits until the
    /// settings it changed are kept.
    held: Option<(InstanceId, CallId)>,
    /// Its rows were removed (it expired): nothing more is kept.
    removed: bool,
    /// What a replay needs (SPEC 10).
    rec: super::recording::Recorder,
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

/// A record as the store keeps it.
pub fn to_write(record: &Record) -> SessionWrite {
    match record {
        Record::Snapshot {
            session_id,
            snapshot,
        } => SessionWrite::Snapshot {
            session_id: session_id.clone(),
            snapshot: snapshot.to_string(),
            game_time_ms: None,
        },
        Record::SnapshotDiscarded { session_id } => SessionWrite::SnapshotDiscarded {
            session_id: session_id.clone(),
        },
        Record::PluginData {
            user,
            plugin_id,
            scope,
            set_id,
            value,
        } => SessionWrite::PluginData {
            user: user.clone(),
            plugin_id: plugin_id.clone(),
            scope: serde_json::to_value(scope)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            set_id: set_id.clone().unwrap_or_default(),
            value: value.to_string(),
        },
        Record::Answer(a) => SessionWrite::Answer {
            session_id: a.session_id.clone(),
            user: a.user.clone(),
            set_id: a.set_id.clone(),
            item_id: a.item_id.clone(),
            body: serde_json::to_string(a).unwrap_or_default(),
            progress: a
                .progress
                .as_ref()
                .and_then(|p| serde_json::to_string(p).ok()),
        },
        Record::Result {
            session_id,
            result,
            at_ms,
        } => SessionWrite::Result {
            session_id: session_id.clone(),
            result: serde_json::to_string(result).unwrap_or_default(),
            at_ms: *at_ms,
        },
        Record::SavedGame(g) => SessionWrite::SavedGame {
            session_id: g.session_id.clone(),
            body: serde_json::to_string(g).unwrap_or_default(),
        },
    }
}

/// A worker RPC `response` frame answering a Host API call.
/// The server's worker RPC `hello`, the first frame on every device socket.
pub fn hello_text() -> String {
    Frame::Hello {
        v: PROTOCOL_VERSION.to_owned(),
        features: Vec::new(),
        agent: Some(concat!("hostwire/", env!("CARGO_PKG_VERSION")).to_owned()),
    }
    .to_text()
}

pub fn response_text(call: CallId, result: Result<Payload, ErrorEnvelope>) -> String {
    Frame::Response {
        v: PROTOCOL_VERSION.to_owned(),
        id: call,
        outcome: match result {
            Ok(p) => Outcome::Ok(p),
            Err(e) => Outcome::Err(e),
        },
    }
    .to_text()
}

fn reply_payload(r: Reply) -> Payload {
    match r {
        Reply::Init(init) => Payload::json(&*init).unwrap_or_else(|_| Payload::null()),
        Reply::Done => Payload::null(),
        // Answered by `Actor::send_asset` with the bytes; not reached.
        Reply::Asset { key, item_id } => Payload::from(&json!({"key": key, "itemId": item_id})),
        Reply::Service(text) => {
            Payload::from_text(text.to_string()).unwrap_or_else(|_| Payload::null())
        }
    }
}

/// A protocol error as a worker RPC error: its SPEC code and message.
pub fn envelope(e: &ProtocolError) -> ErrorEnvelope {
    ErrorEnvelope::new(e.code.as_str(), e.message.clone())
}

fn session_error(e: SessionError) -> (u16, String) {
    let status = match e {
        SessionError::WrongPhase(_) => 409,
        SessionError::UnknownPlayer(_) => 404,
        _ => 400,
    };
    (status, e.to_string())
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Lobby => "lobby",
        Phase::Loading => "loading",
        Phase::Countdown { .. } => "countdown",
        Phase::Running => "running",
        Phase::Finished => "finished",
        Phase::Closed => "closed",
    }
}

impl Actor {
    /// Session time and game time now (SPEC 4.2).
    fn times(&self, now: u64) -> (f64, f64) {
        let c = self.s.clock();
        (now as f64 + c.offset_ms, c.game_time(now as f64))
    }

    /// Hands the recording to the store writer (kept behind the session's
    /// other records; a full queue tries again at the next change).
    fn write_recording(&mut self) {
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

    fn now(&self) -> u64 {
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
                .min()
                .map(|at| Duration::from_millis(at.saturating_sub(self.now())));
            let cmd = tokio::select! {
                c = rx.recv() => c,
                () = sleep_opt(wait) => {
                    // The engine's deadline or the session's expiry.
                    let now = self.now();
                    if self.s.poll_timeout().is_some_and(|at| at <= now) {
                        self.s.handle_timeout(now);
                    }
                    self.drain();
                    continue;
                }
            };
            let Some(cmd) = cmd else { break };
            if let Cmd::Wake(done) = cmd {
                let now = self.now();
                if self.s.poll_timeout().is_some_and(|at| at <= now) {
                    self.s.handle_timeout(now);
                }
                self.drain();
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
            if matches!(cmd, Cmd::Attach { .. } | Cmd::Call { .. } | Cmd::Admin(..)) {
                self.last_used = self.now();
            }
            if !self.handle(cmd) {
                break;
            }
            // A deadline that passed while commands kept the task busy (or
            // on a clock that moved without the timer) is handled now.
            let now = self.now();
            if self.s.poll_timeout().is_some_and(|at| at <= now) {
                self.s.handle_timeout(now);
            }
            self.drain();
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
                        // Worker RPC: each side says hello first.
                        let _ = out.send(Utf8Bytes::from(hello_text()));
                        self.devices.insert(instance, Device { out, next_call: 1 });
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
            Cmd::Call {
                instance,
                call,
                method,
                params,
            } => {
                self.metrics.host_calls.fetch_add(1, Relaxed);
                if method == "updateSettings" {
                    self.held = Some((instance, call));
                }
                if method == "send" {
                    let authority = self.s.authority_address();
                    self.rec
                        .send_called(instance, call, &params, authority.as_deref());
                }
                self.s.handle_call(instance, call, &method, &params, now);
            }
            Cmd::Cancel { instance, call } => {
                // A pending service call stops and is answered CANCELLED;
                // any other call finishes and its answer is dropped by the
                // device, as worker RPC has it.
                if self.s.cancel_call(instance, call, now) {
                    let text = response_text(
                        call,
                        Err(ErrorEnvelope::new(
                            hostwire_worker_rpc::codes::CANCELLED,
                            "service: the call was cancelled",
                        )),
                    );
                    self.push(instance, text);
                }
            }
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

    fn admin(&mut self, op: Admin, reply: AdminReply, now: u64) {
        let r = match op {
            Admin::Status => Ok(self.status()),
            // A change is answered once it is kept.
            Admin::AddPlayer(spec, token) => {
                let id = spec.id.clone();
                match self.s.add_player(*spec, now) {
                    Ok(()) => {
                        self.auth.players.insert(id, token);
                        return self.reply_when_kept(reply, self.status());
                    }
                    Err(e) => Err(session_error(e)),
                }
            }
            Admin::Kick(id) => match self.s.kick_player(&id, now) {
                Ok(()) => {
                    self.auth.players.remove(&id);
                    return self.reply_when_kept(reply, self.status());
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Rename(id, name) => match self.s.rename_player(&id, &name, now) {
                Ok(()) => return self.reply_when_kept(reply, self.status()),
                Err(e) => Err(session_error(e)),
            },
            Admin::Config(c) => {
                self.s.set_config(c, now);
                return self.reply_when_kept(reply, self.status());
            }
            Admin::Start => match self.s.start_game(now) {
                Ok(()) => return self.reply_when_kept(reply, self.status()),
                Err(e) => Err(session_error(e)),
            },
            Admin::Pause => match self.s.pause(now) {
                Ok(()) => {
                    self.rec.event("pause", self.times(now), None);
                    self.write_recording();
                    return self.reply_when_kept(reply, self.status());
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Resume => match self.s.resume(now) {
                Ok(()) => {
                    self.rec.event("resume", self.times(now), None);
                    return self.reply_when_kept(reply, self.status());
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Continue => {
                let paused = self.s.clock().paused_at.is_some();
                match self.s.phase() {
                    Phase::Running if !paused => Err((409, "the session is running".into())),
                    Phase::Running | Phase::Loading | Phase::Countdown { .. } => {
                        let mut v = self.status();
                        let tokens: std::collections::BTreeMap<&str, &str> = self
                            .auth
                            .players
                            .iter()
                            .map(|(p, t)| (p.as_str(), t.as_str()))
                            .collect();
                        v["playerTokens"] = json!(tokens);
                        return self.reply_when_kept(reply, v);
                    }
                    Phase::Lobby => Err((409, "the session is in its lobby: start it".into())),
                    Phase::Finished | Phase::Closed => {
                        Err((409, "the game has ended; it cannot be continued".into()))
                    }
                }
            }
            Admin::End => {
                self.s.close(SessionEndReason::Closed, now);
                Ok(self.status())
            }
            Admin::Recording => {
                Ok(serde_json::from_str(&self.rec.document(self.s.id())).unwrap_or(Value::Null))
            }
            Admin::Save => match self.s.save_game(now) {
                Some((id, saved)) => {
                    let body = json!({"saved": saved});
                    self.saves.insert(id, (reply, body));
                    return;
                }
                None => Err((
                    409,
                    "this game cannot be saved (not started, or ended)".into(),
                )),
            },
        };
        let _ = reply.send(r);
    }

    /// The session's state as a restart brings it back, queued for the
    /// store: `None` when the store queue is full.
    fn keep(&self) -> Option<Durable> {
        let w = KeptState::of(&self.s, self.now()).write(self.s.id());
        self.writer.try_queue_acked(self.s.id(), vec![w])
    }

    /// Answers `body` once the session's state after the change is kept
    /// (503 when it could not be: the change is not acknowledged).
    fn reply_when_kept(&self, reply: AdminReply, body: Value) {
        let Some(kept) = self.keep() else {
            let _ = reply.send(Err((
                503,
                "the store is behind: the change was not kept; try again".into(),
            )));
            return;
        };
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let _ = reply.send(if kept.wait().await {
                Ok(body)
            } else {
                Err((503, "the change could not be stored; try again".into()))
            });
        }));
    }

    fn status(&self) -> Value {
        let (settings, valid, message) = self.s.settings();
        json!({
            "sessionId": self.s.id(),
            "phase": phase_name(self.s.phase()),
            "players": self.s.players(),
            "settings": settings,
            "settingsValid": valid,
            "settingsMessage": message,
            "clock": self.s.clock(),
            "instances": self.s.instance_count(),
            "result": self.result,
        })
    }

    /// Carries out every output the engine has.
    fn drain(&mut self) {
        while let Some(o) = self.s.poll_output() {
            match o {
                Output::Reply {
                    instance,
                    call,
                    result: Ok(Reply::Asset { key, item_id }),
                } => self.send_asset(instance, call, key, item_id),
                Output::Reply {
                    instance,
                    call,
                    result,
                } => {
                    let now = self.now();
                    self.rec
                        .answered(instance, call, result.is_ok(), self.times(now));
                    if let Ok(Reply::Init(init)) = &result {
                        if !self.rec.has_init()
                            && init.session.self_address == init.session.authority
                        {
                            let seed = self.s.current_game(now).display_seed;
                            self.rec.init(&**init, &seed);
                        }
                    }
                    let held = self.held == Some((instance, call));
                    if held {
                        self.held = None;
                    }
                    let held = held && result.is_ok();
                    let text =
                        response_text(call, result.map(reply_payload).map_err(|e| envelope(&e)));
                    match self.devices.get(&instance) {
                        // updateSettings is answered once its settings are kept.
                        Some(d) if held => {
                            let (out, kept) = (d.out.clone(), self.keep());
                            tokio::spawn(tracing::Instrument::in_current_span(async move {
                                let kept = match kept {
                                    Some(k) => k.wait().await,
                                    None => false,
                                };
                                let text = if kept {
                                    text
                                } else {
                                    let e = ProtocolError::new(
                                        ProtocolErrorCode::InternalError,
                                        "updateSettings: could not be stored; try again",
                                    );
                                    response_text(call, Err(envelope(&e)))
                                };
                                let _ = out.send(Utf8Bytes::from(text));
                            }));
                        }
                        _ => self.push(instance, text),
                    }
                }
                Output::Call { instance, call } => {
                    if call.method == "start" {
                        let now = self.now();
                        self.rec.event("start", self.times(now), None);
                    }
                    let Some(d) = self.devices.get_mut(&instance) else {
                        continue;
                    };
                    let id = d.next_call;
                    d.next_call += 1;
                    let params = Payload::from_text(call.args.to_string()).ok();
                    let text = Frame::Request {
                        v: PROTOCOL_VERSION.to_owned(),
                        id,
                        method: call.method.to_owned(),
                        params,
                    }
                    .to_text();
                    self.metrics.plugin_calls.fetch_add(1, Relaxed);
                    self.push(instance, text);
                }
                Output::Close { instance, reason } => {
                    self.rec.detached(instance);
                    if let Some(d) = self.devices.remove(&instance) {
                        let why = match &reason {
                            CloseReason::SessionEnded(r) => r.as_str().to_owned(),
                            CloseReason::HelloTimeout => "hello-timeout".into(),
                            CloseReason::SlowConsumer => "slow-consumer".into(),
                            CloseReason::Replaced => "replaced".into(),
                        };
                        let bye = Frame::Goodbye {
                            v: PROTOCOL_VERSION.to_owned(),
                            reason: Some(why),
                            error: None,
                        }
                        .to_text();
                        let _ = d.out.send(bye.into());
                        d.out.close((1000, "session instance closed"));
                    }
                }
                Output::Persist { id, record } => {
                    if let Record::Result { result, .. } = &record {
                        let now = self.now();
                        let r = serde_json::to_value(result).ok();
                        self.rec.event("end", self.times(now), r);
                        self.write_recording();
                    }
                    let mut w = to_write(&record);
                    if let SessionWrite::Snapshot { game_time_ms, .. } = &mut w {
                        // A game brought back by a restart resumes at it.
                        let t = self.s.clock().game_time(self.now() as f64);
                        *game_time_ms = Some(t.max(0.0) as u64);
                    }
                    let queued = self
                        .writer
                        .try_queue_acked(self.s.id(), vec![w])
                        .map(|d| self.store_tx.try_send((id, d)));
                    if !matches!(queued, Some(Ok(()))) {
                        // The engine bounds the records in flight to the
                        // answers' queue, so this is a writer that is gone
                        // or a store queue that is full.
                        let now = self.now();
                        self.s.record_durable(
                            id,
                            Err("the store writer is not running".into()),
                            now,
                        );
                    }
                }
                Output::Service(req) => {
                    let params = services::params(&req.payload, self.s.id(), req.player.as_deref());
                    match self.services.call(&req.name, self.s.id(), params) {
                        Ok((call, ticket)) => {
                            let (stop, stopped) = oneshot::channel();
                            self.service_calls.insert(req.id, (stop, req.deadline_ms));
                            let (me, host, id) =
                                (self.me.clone(), Arc::clone(&self.services), req.id);
                            // The call runs beside the session: the engine
                            // goes on with other calls, and its deadline
                            // (CancelService) stops this one.
                            tokio::spawn(tracing::Instrument::in_current_span(async move {
                                tokio::select! {
                                    r = call => {
                                        let outcome = host.outcome(&req.name, &ticket, r);
                                        if let Some(me) = me.upgrade() {
                                            let _ = me.send(Cmd::ServiceDone { id, outcome }).await;
                                        }
                                    }
                                    timed_out = stopped => {
                                        if timed_out.unwrap_or(false) {
                                            host.timed_out(&ticket);
                                        }
                                    }
                                }
                            }));
                        }
                        Err(e) => {
                            let now = self.now();
                            self.s.service_done(req.id, Err(e), now);
                        }
                    }
                }
                Output::CancelService { id } => {
                    if let Some((stop, deadline)) = self.service_calls.remove(&id) {
                        let _ = stop.send(self.now() >= deadline);
                    }
                }
                Output::Event(e) => {
                    if let SessionEvent::Ended { result } = e {
                        self.result = serde_json::to_value(result).ok();
                    }
                }
            }
        }
    }

    /// `getAsset`'s answer: the bytes, read from the store beside the
    /// session, as `{key, itemId, mimeType, size, base64}`.
    fn send_asset(
        &mut self,
        instance: InstanceId,
        call: CallId,
        key: String,
        item_id: Option<String>,
    ) {
        let Some(d) = self.devices.get(&instance) else {
            return;
        };
        let out = d.out.clone();
        let Some(file) = self.assets.file(item_id.as_deref(), &key).cloned() else {
            let e = ProtocolError::new(
                ProtocolErrorCode::AssetNotFound,
                format!("getAsset: key {key:?} has no file in the bundle"),
            );
            self.push(instance, response_text(call, Err(envelope(&e))));
            return;
        };
        let store = self.sessions.store();
        let sid = self.s.id().to_owned();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let Ok(_permit) = ASSET_LOADS.acquire().await else {
                return;
            };
            let path = file.file.clone();
            let loaded = tokio::task::spawn_blocking(move || store.load_asset(&sid, &path)).await;
            let result = match loaded {
                Ok(Ok(Some(bytes))) => Ok(Payload::from(&json!({
                    "key": key,
                    "itemId": item_id,
                    "mimeType": file.mime_type,
                    "size": bytes.len(),
                    "base64": base64::engine::general_purpose::STANDARD.encode(&bytes),
                }))),
                Ok(Ok(None)) => Err(ProtocolError::new(
                    ProtocolErrorCode::AssetNotFound,
                    format!("getAsset: key {key:?}: its file is not stored"),
                )),
                Ok(Err(e)) => Err(ProtocolError::new(
                    ProtocolErrorCode::InternalError,
                    format!("getAsset: the store failed: {}", e.reason()),
                )),
                Err(e) => Err(ProtocolError::new(
                    ProtocolErrorCode::InternalError,
                    format!("getAsset: {e}"),
                )),
            };
            let text = response_text(call, result.map_err(|e| envelope(&e)));
            // A full queue closes the device (1013); its reader detaches it.
            let _ = out.send(Utf8Bytes::from(text));
        }));
    }

    fn push(&mut self, instance: InstanceId, text: String) {
        let Some(d) = self.devices.get(&instance) else {
            return;
        };
        if let Err(Refused::Full) = d.out.send(Utf8Bytes::from(text)) {
            self.metrics.slow_devices.fetch_add(1, Relaxed);
            self.devices.remove(&instance);
            let now = self.now();
            self.s.detach(instance, now);
        }
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
