//! What the session's task makes of the session's outputs: replies and
//! Plugin API calls to devices (through their worker RPC state), answers
//! that waited for the store, service calls, events; each becomes an
//! [`Out`] for the server side (`deliver.rs`).

use super::hosted::{Hosted, Out, Tag};
use super::rpc::{reply_payload, rpc_error, PLUGIN_CALL_TIMEOUT_MS};
use super::services;
use hostwire_memizy::session::{
    CallId, CloseReason, InstanceId, Output, Record, Reply, SessionEvent, SessionOutput,
};
use hostwire_memizy::{ProtocolError, ProtocolErrorCode};
use hostwire_store::sessions::SessionWrite;
use hostwire_worker_rpc::frame::Payload;
use hostwire_worker_rpc::PeerState;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

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

impl Hosted {
    /// Turns every output of the session into one of the server's.
    pub(super) fn drain(&mut self, now: u64) {
        while let Some(o) = self.d.poll_output() {
            match o {
                SessionOutput::Engine(o) => self.engine_output(o, now),
                SessionOutput::Kept { tag, durable } => self.kept(tag, durable),
                SessionOutput::Saved {
                    tag: Tag::Save(reply),
                    saved,
                    outcome,
                } => {
                    let r = match outcome {
                        Ok(()) => Ok(json!({"saved": saved})),
                        Err(why) => {
                            Err((503, format!("the saved game could not be stored: {why}")))
                        }
                    };
                    self.out.push_back(Out::Reply(reply, r));
                }
                SessionOutput::Saved { .. } => {}
                SessionOutput::Expiring => {
                    self.rpc.clear();
                    self.out.push_back(Out::CloseAll((1001, "session expired")));
                }
                SessionOutput::Expired { durable } => {
                    let id = self.d.session().id();
                    tracing::info!(session = %id, removed = durable, "hosted session expired");
                    for w in self.wakes.drain(..) {
                        self.out.push_back(Out::Woken(w));
                    }
                    self.out.push_back(Out::Stop);
                }
            }
        }
    }

    /// An answer that waited for the session's state to be kept.
    fn kept(&mut self, tag: Tag, durable: bool) {
        match tag {
            Tag::Admin(reply, body) => {
                let r = match durable {
                    true => Ok(body),
                    false => Err((503, "the change could not be stored; try again".into())),
                };
                self.out.push_back(Out::Reply(reply, r));
            }
            Tag::Settings(instance, call, payload) => {
                let result = match durable {
                    true => Ok(payload),
                    false => Err(ProtocolError::new(
                        ProtocolErrorCode::InternalError,
                        "updateSettings: could not be stored; try again",
                    )),
                };
                self.respond(instance, call, result);
            }
            Tag::Save(reply) => {
                let _ = reply.send(Err((
                    503,
                    "the change could not be stored; try again".into(),
                )));
            }
        }
    }

    /// Carries out one output of the engine.
    fn engine_output(&mut self, o: Output, now: u64) {
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
            } => self.reply(instance, call, result, now),
            Output::Call { instance, call } => {
                if call.method == "start" {
                    self.rec.event("start", self.times(now), None);
                }
                let Some(rpc) = self.rpc.get_mut(&instance) else {
                    return;
                };
                // The engine writes a call's arguments as JSON itself.
                let params = Payload::from_valid_text(call.args.to_string());
                let deadline = now + PLUGIN_CALL_TIMEOUT_MS;
                match rpc.call(call.method, params, false, Some(deadline)) {
                    Ok(_) => {
                        self.devices_due =
                            Some(self.devices_due.map_or(deadline, |d| d.min(deadline)));
                        self.metrics.plugin_calls.fetch_add(1, Relaxed);
                    }
                    Err(e) => tracing::debug!(instance, error = %e, "Plugin API call not sent"),
                }
                self.flush(instance);
            }
            Output::Close { instance, reason } => {
                self.rec.detached(instance);
                if let Some(mut rpc) = self.rpc.remove(&instance) {
                    let why = match &reason {
                        CloseReason::SessionEnded(r) => r.as_str(),
                        CloseReason::HelloTimeout => "hello-timeout",
                        CloseReason::SlowConsumer => "slow-consumer",
                        CloseReason::Replaced => "replaced",
                    };
                    rpc.goodbye(why);
                    self.flush_state(instance, &mut rpc);
                    self.out
                        .push_back(Out::Close(instance, (1000, "session instance closed")));
                }
            }
            // Records are handed out as writes, never here.
            Output::Persist { .. } => {}
            Output::Service(req) => self.start_service(req, now),
            Output::CancelService { id } => {
                if let Some(deadline) = self.service_calls.remove(&id) {
                    self.out.push_back(Out::CancelService(id, now >= deadline));
                }
            }
            Output::Event(e) => {
                if let SessionEvent::Ended { result } = e {
                    self.result = serde_json::to_value(result).ok();
                }
            }
        }
    }

    /// A Host API call's answer, once its call is recorded.
    fn reply(
        &mut self,
        instance: InstanceId,
        call: CallId,
        result: Result<Reply, ProtocolError>,
        now: u64,
    ) {
        self.rec
            .answered(instance, call, result.is_ok(), self.times(now));
        if let Ok(Reply::Init(init)) = &result {
            if !self.rec.has_init() && init.session.self_address == init.session.authority {
                let seed = self.d.session().current_game(now).display_seed;
                self.rec.init(&**init, &seed);
            }
        }
        let held = self.held == Some((instance, call));
        if held {
            self.held = None;
        }
        let result = result.map(reply_payload);
        match result {
            // updateSettings is answered once its settings are kept.
            Ok(payload) if held && self.rpc.contains_key(&instance) => self
                .d
                .keep_then(Tag::Settings(instance, call, payload), now),
            result => self.respond(instance, call, result),
        }
    }

    /// Starts a service call beside the session.
    fn start_service(&mut self, req: hostwire_memizy::session::ServiceRequest, now: u64) {
        let s = self.d.session();
        let params = services::params(&req.payload, s.id(), req.player.as_deref());
        match self.services.call(&req.name, s.id(), params) {
            Ok((call, ticket)) => {
                self.service_calls.insert(req.id, req.deadline_ms);
                let host = Arc::clone(&self.services);
                self.out
                    .push_back(Out::Service(req.id, req.name, call, ticket, host));
            }
            Err(e) => self.d.act(now, |s| s.service_done(req.id, Err(e), now)),
        }
    }

    /// `getAsset`'s answer: the bytes, read from the store beside the
    /// session (`deliver.rs`), as `{key, itemId, mimeType, size, base64}`.
    fn send_asset(
        &mut self,
        instance: InstanceId,
        call: CallId,
        key: String,
        item_id: Option<String>,
    ) {
        if !self.rpc.contains_key(&instance) {
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
        self.out.push_back(Out::Asset {
            instance,
            call,
            file,
            key,
            item_id,
        });
    }

    /// Answers a device's Host API call (once: a call it cancelled is
    /// answered `CANCELLED`; one already answered is not answered again).
    pub(super) fn respond(
        &mut self,
        instance: InstanceId,
        call: CallId,
        result: Result<Payload, ProtocolError>,
    ) {
        if let Some(rpc) = self.rpc.get_mut(&instance) {
            rpc.respond(call, result.map_err(|e| rpc_error(&e)));
            self.flush(instance);
        }
    }

    /// Hands a device's queued frames to its socket.
    pub(super) fn flush(&mut self, instance: InstanceId) {
        if let Some(rpc) = self.rpc.get_mut(&instance) {
            while let Some(t) = rpc.poll_transmit() {
                self.out.push_back(Out::Frame(instance, t.text));
            }
        }
    }

    /// [`Hosted::flush`] for a state no longer in the map.
    fn flush_state(&mut self, instance: InstanceId, rpc: &mut PeerState) {
        while let Some(t) = rpc.poll_transmit() {
            self.out.push_back(Out::Frame(instance, t.text));
        }
    }
}
