//! What the session's task does with the engine's outputs: replies and
//! Plugin API calls to devices (through their worker RPC state), records
//! to the store, service calls, events.

use super::actor::{Actor, Cmd, ASSET_LOADS};
use super::rpc::{reply_payload, rpc_error, PLUGIN_CALL_TIMEOUT_MS};
use super::services;
use base64::Engine;
use hostwire_memizy::session::{
    CallId, CloseReason, InstanceId, Output, Record, Reply, SessionEvent,
};
use hostwire_memizy::{ProtocolError, ProtocolErrorCode};
use hostwire_store::sessions::SessionWrite;
use hostwire_worker_rpc::frame::Payload;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::oneshot;

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

impl Actor {
    /// Carries out every output the engine has.
    pub(super) fn drain(&mut self) {
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
                } => self.reply(instance, call, result),
                Output::Call { instance, call } => {
                    if call.method == "start" {
                        let now = self.now();
                        self.rec.event("start", self.times(now), None);
                    }
                    let Some(d) = self.devices.get_mut(&instance) else {
                        continue;
                    };
                    let params = Payload::from_text(call.args.to_string())
                        .unwrap_or_else(|_| Payload::null());
                    let deadline = self.sessions.clock.now_ms() + PLUGIN_CALL_TIMEOUT_MS;
                    match d.rpc.call(call.method, params, false, Some(deadline)) {
                        Ok(_) => {
                            self.metrics.plugin_calls.fetch_add(1, Relaxed);
                        }
                        Err(e) => tracing::debug!(instance, error = %e, "Plugin API call not sent"),
                    }
                    self.flush(instance);
                }
                Output::Close { instance, reason } => {
                    self.rec.detached(instance);
                    if let Some(mut d) = self.devices.remove(&instance) {
                        let why = match &reason {
                            CloseReason::SessionEnded(r) => r.as_str(),
                            CloseReason::HelloTimeout => "hello-timeout",
                            CloseReason::SlowConsumer => "slow-consumer",
                            CloseReason::Replaced => "replaced",
                        };
                        d.rpc.goodbye(why);
                        let _ = d.flush();
                        d.out.close((1000, "session instance closed"));
                    }
                }
                Output::Persist { id, record } => self.persist(id, record),
                Output::Service(req) => self.start_service(req),
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

    /// A Host API call's answer, once its call is recorded.
    fn reply(&mut self, instance: InstanceId, call: CallId, result: Result<Reply, ProtocolError>) {
        let now = self.now();
        self.rec
            .answered(instance, call, result.is_ok(), self.times(now));
        if let Ok(Reply::Init(init)) = &result {
            if !self.rec.has_init() && init.session.self_address == init.session.authority {
                let seed = self.s.current_game(now).display_seed;
                self.rec.init(&**init, &seed);
            }
        }
        let held = self.held == Some((instance, call));
        if held {
            self.held = None;
        }
        let result = result.map(reply_payload);
        if held && result.is_ok() && self.devices.contains_key(&instance) {
            // updateSettings is answered once its settings are kept.
            let (kept, me) = (self.keep(), self.me.clone());
            tokio::spawn(tracing::Instrument::in_current_span(async move {
                let kept = match kept {
                    Some(k) => k.wait().await,
                    None => false,
                };
                let result = if kept {
                    result
                } else {
                    Err(ProtocolError::new(
                        ProtocolErrorCode::InternalError,
                        "updateSettings: could not be stored; try again",
                    ))
                };
                if let Some(me) = me.upgrade() {
                    let _ = me
                        .send(Cmd::Respond {
                            instance,
                            call,
                            result,
                        })
                        .await;
                }
            }));
        } else {
            self.respond(instance, call, result);
        }
    }

    /// A record for the store writer; its acknowledgement comes back as
    /// `Cmd::Durable`.
    fn persist(&mut self, id: hostwire_memizy::session::RecordId, record: Record) {
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
            self.s
                .record_durable(id, Err("the store writer is not running".into()), now);
        }
    }

    /// Starts a service call beside the session.
    fn start_service(&mut self, req: hostwire_memizy::session::ServiceRequest) {
        let params = services::params(&req.payload, self.s.id(), req.player.as_deref());
        match self.services.call(&req.name, self.s.id(), params) {
            Ok((call, ticket)) => {
                let (stop, stopped) = oneshot::channel();
                self.service_calls.insert(req.id, (stop, req.deadline_ms));
                let (me, host, id) = (self.me.clone(), Arc::clone(&self.services), req.id);
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

    /// `getAsset`'s answer: the bytes, read from the store beside the
    /// session, as `{key, itemId, mimeType, size, base64}`.
    fn send_asset(
        &mut self,
        instance: InstanceId,
        call: CallId,
        key: String,
        item_id: Option<String>,
    ) {
        if !self.devices.contains_key(&instance) {
            return;
        }
        let Some(file) = self.assets.file(item_id.as_deref(), &key).cloned() else {
            let e = ProtocolError::new(
                ProtocolErrorCode::AssetNotFound,
                format!("getAsset: key {key:?} has no file in the bundle"),
            );
            self.respond(instance, call, Err(e));
            return;
        };
        let me = self.me.clone();
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
            // Answered by the session's task, which holds the call's state.
            if let Some(me) = me.upgrade() {
                let _ = me
                    .send(Cmd::Respond {
                        instance,
                        call,
                        result,
                    })
                    .await;
            }
        }));
    }

    /// Answers a device's Host API call (once: a call it cancelled is
    /// answered `CANCELLED`; one already answered is not answered again).
    pub(super) fn respond(
        &mut self,
        instance: InstanceId,
        call: CallId,
        result: Result<Payload, ProtocolError>,
    ) {
        if let Some(d) = self.devices.get_mut(&instance) {
            d.rpc.respond(call, result.map_err(|e| rpc_error(&e)));
            self.flush(instance);
        }
    }

    /// Hands a device's queued frames to its socket; a device whose queue
    /// is full is detached (its socket is being closed as too slow).
    pub(super) fn flush(&mut self, instance: InstanceId) {
        let Some(d) = self.devices.get_mut(&instance) else {
            return;
        };
        if d.flush().is_err() {
            self.metrics.slow_devices.fetch_add(1, Relaxed);
            self.devices.remove(&instance);
            let now = self.now();
            self.s.detach(instance, now);
        }
    }
}
