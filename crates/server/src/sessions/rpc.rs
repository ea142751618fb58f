//! The worker RPC end of each device socket, on
//! [`hostwire_worker_rpc::PeerState`] (the rules the services' `Peer`
//! drives too): the server's `hello`, the device's call ids and their one
//! response each, errors as envelopes, `cancel`, the Plugin API calls' ids
//! and deadlines, `goodbye`, frames of another MAJOR. The session's task
//! owns one per attached instance; what it queues goes to the device's
//! bounded outbound queue (`deliver.rs`).

use super::hosted::{Hosted, Out};
use hostwire_memizy::session::{CallId, InstanceId, Reply};
use hostwire_memizy::ProtocolError;
use hostwire_worker_rpc::frame::{Frame, FrameError, Payload};
use hostwire_worker_rpc::{codes, Event, PeerConfig, PeerState, RpcError, Side};
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;

/// How long a Plugin API call waits for the device's `response`; then it
/// ends (`TIMEOUT`) and the device gets `cancel`.
pub const PLUGIN_CALL_TIMEOUT_MS: u64 = 60_000;
/// A device's Host API calls answered at once (a service call, a held
/// `updateSettings`, an asset being read); one more is answered
/// `TOO_MANY_CALLS`.
pub const MAX_HOST_CALLS_IN_FLIGHT: usize = 256;
/// Plugin API calls to one device without its `response`; one more is not
/// sent (a device that reads but never answers).
pub const MAX_PLUGIN_CALLS_IN_FLIGHT: usize = super::DEVICE_OUTBOUND_QUEUE;

/// The worker RPC settings of a device socket. Devices (the browser page
/// among them) do not say `hello`, so nothing waits for theirs; the frame
/// limit in is the socket's own.
pub fn config() -> PeerConfig {
    PeerConfig {
        agent: Some(concat!("hostwire/", env!("CARGO_PKG_VERSION")).to_owned()),
        max_inbound_calls: MAX_HOST_CALLS_IN_FLIGHT,
        max_outbound_calls: MAX_PLUGIN_CALLS_IN_FLIGHT,
        await_peer_hello: false,
        ..PeerConfig::default()
    }
}

/// A device's worker RPC state: its first frame out is the server's
/// `hello`.
pub fn device_state() -> PeerState {
    PeerState::new(Side::Host, config())
}

/// An engine reply as a `response` payload.
pub fn reply_payload(r: Reply) -> Payload {
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
pub fn rpc_error(e: &ProtocolError) -> RpcError {
    RpcError::new(e.code.as_str(), e.message.clone())
}

/// 1002: the device broke worker RPC as a whole (a `hello` of another
/// MAJOR, a malformed one); its `goodbye` says why.
pub const CLOSE_PROTOCOL_ERROR: crate::ws::Close = (1002, "worker RPC protocol error");

impl Hosted {
    /// A frame from a device, through its worker RPC state.
    pub(super) fn on_frame(
        &mut self,
        instance: InstanceId,
        frame: Result<Frame, FrameError>,
        now: u64,
    ) {
        let Some(rpc) = self.rpc.get_mut(&instance) else {
            return;
        };
        match frame {
            Ok(f) => rpc.handle_frame(f, now),
            Err(e) => rpc.handle_malformed(e, now),
        }
        self.device_events(instance, now);
    }

    /// Carries out what a device's worker RPC state reported.
    fn device_events(&mut self, instance: InstanceId, now: u64) {
        let mut closed = None;
        while let Some(e) = self.rpc.get_mut(&instance).and_then(|rpc| rpc.poll_event()) {
            match e {
                Event::Request {
                    id,
                    method,
                    params,
                    stream: false,
                } => self.host_call(instance, id, &method, params, now),
                Event::Request { id, method, .. } => {
                    let e = RpcError::new(
                        codes::UNKNOWN_METHOD,
                        format!("{method:?}: the Host API has no streams"),
                    );
                    if let Some(rpc) = self.rpc.get_mut(&instance) {
                        rpc.respond(id, Err(e));
                    }
                }
                // A pending service call stops and is answered CANCELLED at
                // once; any other call is answered CANCELLED when it ends.
                Event::Cancelled { id }
                    if self.d.act(now, |s| s.cancel_call(instance, id, now)) =>
                {
                    if let Some(rpc) = self.rpc.get_mut(&instance) {
                        let e = RpcError::new(codes::CANCELLED, "service: the call was cancelled");
                        rpc.respond(id, Err(e));
                    }
                }
                Event::Closed(e) => closed = Some(e),
                // Answers to Plugin API calls (and their deadlines): the
                // engine needs none of them.
                _ => {}
            }
        }
        self.flush(instance);
        if let Some(e) = closed {
            if self.rpc.contains_key(&instance) {
                // Its reader sees the socket end and detaches it.
                let code = if e.code == codes::PEER_GOODBYE {
                    (1000, "goodbye")
                } else {
                    CLOSE_PROTOCOL_ERROR
                };
                self.out.push_back(Out::Close(instance, code));
            }
        }
    }

    /// A device's Host API call, for the engine.
    fn host_call(
        &mut self,
        instance: InstanceId,
        call: CallId,
        method: &str,
        params: Option<Payload>,
        now: u64,
    ) {
        self.metrics.host_calls.fetch_add(1, Relaxed);
        let params = params.as_ref().map_or("[]", Payload::get);
        if method == "updateSettings" {
            self.held = Some((instance, call));
        }
        if method == "send" {
            let authority = self.d.session().authority();
            self.rec.send_called(instance, call, params, authority);
        }
        self.d
            .act(now, |s| s.handle_call(instance, call, method, params, now));
    }

    /// When a Plugin API call to a device may be due (never later than
    /// the earliest deadline; see [`Hosted::devices_due`]).
    pub(super) fn devices_timeout(&self) -> Option<u64> {
        self.devices_due
    }

    /// Plugin API calls past their deadline end; their devices get
    /// `cancel`.
    pub(super) fn device_timeouts(&mut self, now: u64) {
        if self.devices_due.is_none_or(|at| at > now) {
            return;
        }
        self.devices_due = None;
        let due: Vec<InstanceId> = self
            .rpc
            .iter()
            .filter(|(_, rpc)| rpc.poll_timeout().is_some_and(|at| at <= now))
            .map(|(i, _)| *i)
            .collect();
        for instance in due {
            if let Some(rpc) = self.rpc.get_mut(&instance) {
                rpc.handle_timeout(now);
            }
            self.device_events(instance, now);
        }
        // The calls still out, walked once per deadline passed.
        self.devices_due = self.rpc.values().filter_map(|s| s.poll_timeout()).min();
    }
}
