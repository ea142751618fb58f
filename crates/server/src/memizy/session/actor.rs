//! One task per session: it owns the engine, handles commands in the order
//! they arrive, carries out the engine's outputs (replies and Plugin API
//! calls to devices, records to the store, events) and arms the engine's
//! timer at `poll_timeout`.

use super::{SessionMetrics, Sessions, STORE_QUEUE};
use crate::outbound::{self, Direct, Refused};
use axum::extract::ws::Utf8Bytes;
use hostwire_memizy::session::{
    CallId, CloseReason, InstanceId, Output, Phase, PlayerSpec, Record, RecordId, Reply, Session,
    SessionError, SessionEvent,
};
use hostwire_memizy::{ProtocolError, ProtocolErrorCode, SessionEndReason, View};
use hostwire_store::sessions::{SessionStore, SessionWrite};
use hostwire_worker_rpc::frame::{ErrorEnvelope, Frame, Outcome, Payload, PROTOCOL_VERSION};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// A device's outbound queue (text frames).
pub type DeviceOut = outbound::Outbound<Utf8Bytes>;

/// 1013: the device did not read its frames fast enough.
pub const CLOSE_TOO_SLOW: outbound::Close = (1013, "too slow: outbound queue full");

/// How to reach a session's task.
#[derive(Clone)]
pub struct SessionHandle {
    pub tx: mpsc::Sender<Cmd>,
}

/// An HTTP API operation and where its answer goes.
pub enum Admin {
    Status,
    AddPlayer(Box<PlayerSpec>),
    Kick(String),
    Start,
    Pause,
    Resume,
    Save,
}

pub type AdminReply = oneshot::Sender<Result<Value, (u16, String)>>;

pub enum Cmd {
    Attach {
        instance: InstanceId,
        view: View,
        address: String,
        out: DeviceOut,
        done: oneshot::Sender<Result<(), String>>,
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
    store_tx: mpsc::Sender<(RecordId, SessionWrite)>,
    /// HTTP `save` requests waiting for their record to be durable.
    saves: HashMap<RecordId, (AdminReply, Value)>,
    result: Option<Value>,
}

/// Starts the task of a session and its store writer; `None` if the server
/// holds as many sessions as it may or the id is taken.
pub fn spawn(sessions: &Arc<Sessions>, s: Session) -> Option<SessionHandle> {
    let (tx, rx) = mpsc::channel(super::SESSION_QUEUE);
    let handle = SessionHandle { tx: tx.clone() };
    let id = s.id().to_owned();
    if !sessions.insert(id.clone(), handle.clone()) {
        return None;
    }
    let (store_tx, store_rx) = mpsc::channel(STORE_QUEUE);
    tokio::spawn(store_writer(
        sessions.store(),
        Arc::clone(&sessions.metrics),
        store_rx,
        tx.clone(),
    ));
    sessions.metrics.sessions.fetch_add(1, Relaxed);
    let actor = Actor {
        metrics: Arc::clone(&sessions.metrics),
        sessions: Arc::clone(sessions),
        s,
        devices: HashMap::new(),
        store_tx,
        saves: HashMap::new(),
        result: None,
    };
    tokio::spawn(actor.run(rx));
    Some(handle)
}

/// Writes one session's records in order; each is reported to the session
/// only once the store says it is durable (or failed).
async fn store_writer(
    store: Arc<dyn SessionStore>,
    metrics: Arc<SessionMetrics>,
    mut rx: mpsc::Receiver<(RecordId, SessionWrite)>,
    session: mpsc::Sender<Cmd>,
) {
    while let Some((id, w)) = rx.recv().await {
        let store = Arc::clone(&store);
        let outcome = tokio::task::spawn_blocking(move || store.apply_sessions(&[w]))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.reason()));
        if outcome.is_err() {
            metrics.store_failures.fetch_add(1, Relaxed);
        }
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
    fn now(&self) -> u64 {
        self.sessions.clock.now_ms()
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        self.drain();
        loop {
            let wait = self
                .s
                .poll_timeout()
                .map(|at| Duration::from_millis(at.saturating_sub(self.now())));
            let cmd = tokio::select! {
                c = rx.recv() => c,
                () = sleep_opt(wait) => {
                    let now = self.now();
                    self.s.handle_timeout(now);
                    self.drain();
                    continue;
                }
            };
            let Some(cmd) = cmd else { break };
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
            if self.s.phase() == Phase::Closed && self.devices.is_empty() && self.saves.is_empty() {
                break;
            }
        }
        for d in self.devices.values() {
            d.out.close((1001, "session closed"));
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
                done,
            } => match self.s.attach(instance, view, &address, now) {
                Ok(()) => {
                    self.devices.insert(instance, Device { out, next_call: 1 });
                    let _ = done.send(Ok(()));
                }
                Err(e) => {
                    let _ = done.send(Err(e.to_string()));
                }
            },
            Cmd::Detach { instance } => {
                self.devices.remove(&instance);
                self.s.detach(instance, now);
            }
            Cmd::Call {
                instance,
                call,
                method,
                params,
            } => {
                self.metrics.host_calls.fetch_add(1, Relaxed);
                self.s.handle_call(instance, call, &method, &params, now);
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
            Cmd::Admin(op, reply) => self.admin(*op, reply, now),
            Cmd::Shutdown => return false,
        }
        true
    }

    fn admin(&mut self, op: Admin, reply: AdminReply, now: u64) {
        let r = match op {
            Admin::Status => Ok(self.status()),
            Admin::AddPlayer(spec) => self
                .s
                .add_player(*spec, now)
                .map(|()| self.status())
                .map_err(session_error),
            Admin::Kick(id) => self
                .s
                .kick_player(&id, now)
                .map(|()| self.status())
                .map_err(session_error),
            Admin::Start => self
                .s
                .start_game(now)
                .map(|()| self.status())
                .map_err(session_error),
            Admin::Pause => self
                .s
                .pause(now)
                .map(|()| self.status())
                .map_err(session_error),
            Admin::Resume => self
                .s
                .resume(now)
                .map(|()| self.status())
                .map_err(session_error),
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
                    result,
                } => {
                    let text =
                        response_text(call, result.map(reply_payload).map_err(|e| envelope(&e)));
                    self.push(instance, text);
                }
                Output::Call { instance, call } => {
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
                        let _ = d
                            .out
                            .push_or_write(bye.into(), CLOSE_TOO_SLOW, Direct::Declined);
                        d.out.close((1000, "session instance closed"));
                    }
                }
                Output::Persist { id, record } => {
                    let w = to_write(&record);
                    if self.store_tx.try_send((id, w)).is_err() {
                        // The engine bounds the records in flight to the
                        // same number, so this is a writer that is gone.
                        let now = self.now();
                        self.s.record_durable(
                            id,
                            Err("the store writer is not running".into()),
                            now,
                        );
                    }
                }
                Output::Service(req) => {
                    // No service worker is attached to this session.
                    let now = self.now();
                    self.s.service_done(
                        req.id,
                        Err(ProtocolError::new(
                            ProtocolErrorCode::ServiceUnavailable,
                            format!("service: {:?} has no worker", req.name),
                        )),
                        now,
                    );
                }
                Output::CancelService { .. } => {}
                Output::Event(e) => {
                    if let SessionEvent::Ended { result } = e {
                        self.result = serde_json::to_value(result).ok();
                    }
                }
            }
        }
    }

    fn push(&mut self, instance: InstanceId, text: String) {
        let Some(d) = self.devices.get(&instance) else {
            return;
        };
        if let Err(Refused::Full) =
            d.out
                .push_or_write(Utf8Bytes::from(text), CLOSE_TOO_SLOW, Direct::Declined)
        {
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
