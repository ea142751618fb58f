//! The server side of a hosted session: what holds a channel. Each
//! attached device's outbound queue, the requests waiting for their
//! answer, the service calls and asset reads running beside the session
//! (their answers come back through the session's own queue).

use super::hosted::{Cmd, DeviceOut, Hosted, Out};
use super::services::{ServiceHost, Ticket};
use super::{SessionMetrics, Sessions};
use crate::unit::Deliver;
use crate::ws::Utf8Bytes;
use crate::ws::{self, Refused};
use base64::Engine;
use foldhash::{HashMap, HashMapExt};
use hostwire_memizy::session::{BundledFile, CallId, InstanceId, ServiceCallId};
use hostwire_memizy::{ProtocolError, ProtocolErrorCode};
use hostwire_worker_rpc::frame::Payload;
use serde_json::json;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Assets read from the store and encoded at once, over all sessions (each
/// costs up to the 2 MB asset and its base64 text); more wait their turn.
pub const CONCURRENT_ASSET_LOADS: usize = 16;

static ASSET_LOADS: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(CONCURRENT_ASSET_LOADS);

/// The devices' sockets and what runs beside the session.
pub(super) struct Devices {
    sessions: Arc<Sessions>,
    metrics: Arc<SessionMetrics>,
    outs: HashMap<InstanceId, DeviceOut>,
    /// The devices with frames held for [`Deliver::release`]: a burst of
    /// calls (the board's `send` to each controller) leaves each socket in
    /// one write instead of one per frame.
    held: Vec<InstanceId>,
    /// What stops each service call out.
    stops: HashMap<ServiceCallId, oneshot::Sender<bool>>,
    /// The session's own queue, for the tasks it starts (weak: the
    /// session ends when every device and the API let go of it).
    me: mpsc::WeakSender<Cmd>,
}

impl Devices {
    pub(super) fn new(sessions: Arc<Sessions>, me: mpsc::WeakSender<Cmd>) -> Devices {
        Devices {
            metrics: Arc::clone(&sessions.metrics),
            sessions,
            outs: HashMap::new(),
            held: Vec::new(),
            stops: HashMap::new(),
            me,
        }
    }

    pub(super) fn close_all(&mut self, code: ws::Close) {
        for (_, out) in self.outs.drain() {
            out.close(code);
        }
    }

    /// Sends a frame; a device whose queue is full is being closed as too
    /// slow (its reader then detaches it): nothing more goes to it.
    fn frame(&mut self, instance: InstanceId, text: String) {
        let Some(out) = self.outs.get(&instance) else {
            return;
        };
        match out.send_held(Utf8Bytes::from(text)) {
            Ok(()) if !self.held.contains(&instance) => self.held.push(instance),
            Ok(()) => {}
            Err(Refused::Full) => {
                self.metrics.slow_devices.fetch_add(1, Relaxed);
                self.outs.remove(&instance);
            }
            Err(_) => {}
        }
    }

    /// Runs a service call beside the session: the engine goes on with
    /// other calls, and its deadline (`CancelService`) stops this one.
    fn service(
        &mut self,
        id: ServiceCallId,
        name: String,
        call: hostwire_worker_rpc::Call,
        ticket: Ticket,
        host: Arc<ServiceHost>,
    ) {
        let (stop, stopped) = oneshot::channel();
        self.stops.insert(id, stop);
        let me = self.me.clone();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            tokio::select! {
                r = call => {
                    let outcome = host.outcome(&name, &ticket, r);
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

    /// Reads an asset from the store beside the session; its answer comes
    /// back as `Respond` (the session's task holds the call's state).
    fn asset(
        &self,
        session_id: &str,
        (instance, call): (InstanceId, CallId),
        file: BundledFile,
        key: String,
        item_id: Option<String>,
    ) {
        let me = self.me.clone();
        let store = self.sessions.store();
        let sid = session_id.to_owned();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let Ok(_permit) = ASSET_LOADS.acquire().await else {
                return;
            };
            let path = file.file.clone();
            let loaded = crate::blocking::spawn(move || store.load_asset(&sid, &path)).await;
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
}

impl Deliver<Hosted> for Devices {
    fn deliver(&mut self, hosted: &Hosted, out: Out) -> ControlFlow<()> {
        match out {
            Out::Attached(instance, out, done) => {
                // What was held for a socket this one replaces still leaves.
                if let Some(old) = self.outs.insert(instance, out) {
                    old.release();
                }
                let _ = done.send(Ok(()));
            }
            Out::Frame(instance, text) => self.frame(instance, text),
            Out::Close(instance, code) => {
                if let Some(out) = self.outs.remove(&instance) {
                    out.close(code);
                }
            }
            Out::Forget(instance) => {
                if let Some(out) = self.outs.remove(&instance) {
                    out.release();
                }
            }
            Out::CloseAll(code) => self.close_all(code),
            Out::Reply(reply, r) => {
                let _ = reply.send(r);
            }
            Out::Asset {
                instance,
                call,
                file,
                key,
                item_id,
            } => {
                let id = hosted.d.session().id();
                self.asset(id, (instance, call), file, key, item_id);
            }
            Out::Service(id, name, call, ticket, host) => {
                self.service(id, name, call, ticket, host)
            }
            Out::CancelService(id, timed_out) => {
                if let Some(stop) = self.stops.remove(&id) {
                    let _ = stop.send(timed_out);
                }
            }
            Out::Woken(done) => {
                let _ = done.send(());
            }
            Out::Stop => return ControlFlow::Break(()),
        }
        ControlFlow::Continue(())
    }

    fn release(&mut self) {
        for instance in self.held.drain(..) {
            if let Some(out) = self.outs.get(&instance) {
                out.release();
            }
        }
    }
}
