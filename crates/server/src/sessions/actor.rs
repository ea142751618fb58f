//! One task per session, driven by THE unit driver ([`crate::unit::drive`]).
//! The session's durability rules (which records are kept, what waits for
//! them, what a refused write answers, its expiry) are the protocol
//! crate's ([`DurableSession`]); [`Hosted`] adds what the server keeps
//! beside it without a channel: each attached device's worker RPC state
//! (`rpc.rs`), who may attach, the recording. It handles commands in the
//! order they arrive (the HTTP API's operations in `admin.rs`), turns the
//! engine's outputs into outputs of its own (`outputs.rs`), and arms one
//! timer at the earliest of the engine's `poll_timeout`, the devices'
//! Plugin API call deadlines and the session's expiry. Its outputs are
//! carried out by the devices' sockets and the requests waiting
//! (`deliver.rs`).

use super::deliver::Devices;
pub use super::hosted::{
    Admin, AdminReply, AttachRefused, Auth, Cmd, DeviceOut, SessionHandle, CLOSE_TOO_SLOW,
    CLOSE_UNAUTHORIZED,
};
use super::hosted::{Hosted, Out};
use super::kept::KeptState;
use super::recording::Batch;
use super::Sessions;
use crate::unit::{self, Store, Unit, Write};
use hostwire_memizy::session::{
    AssetCatalog, DurableSession, Expiry, InstanceId, Phase, Record, Session, SessionRecord,
};
use hostwire_memizy::{SessionEndReason, View};
use hostwire_store::sessions::SessionWrite;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Starts the task of a session; `None` if the server holds as many
/// sessions as it may or the id is taken. `auth` says who may attach;
/// `assets` where `getAsset`'s bytes are; `rec` the recording so far
/// (empty for a new session, the kept one for one brought back).
pub fn spawn(
    sessions: &Arc<Sessions>,
    s: Session,
    auth: Auth,
    assets: AssetCatalog,
    rec: super::recording::Recorder,
) -> Option<SessionHandle> {
    let (tx, rx) = mpsc::channel(super::SESSION_QUEUE);
    let handle = SessionHandle {
        tx: tx.clone(),
        lost: Arc::default(),
    };
    let id = s.id().to_owned();
    if !sessions.insert(id.clone(), handle.clone()) {
        return None;
    }
    // A root span: the session outlives the request that created it.
    let span = tracing::info_span!(parent: None, "session", id = %id);
    sessions.metrics.sessions.fetch_add(1, Relaxed);
    let expiry = Expiry {
        lobby_ttl_ms: sessions.lobby_ttl_ms(),
        idle_ttl_ms: sessions.idle_ttl_ms(),
    };
    let now = sessions.clock.now_ms();
    let hosted = Hosted {
        d: DurableSession::new(s, expiry, now),
        rpc: Default::default(),
        devices_due: None,
        out: VecDeque::new(),
        metrics: Arc::clone(&sessions.metrics),
        result: None,
        auth,
        assets,
        services: sessions.services(),
        service_calls: Default::default(),
        held: None,
        wakes: Vec::new(),
        rec,
    };
    let devices = Devices::new(Arc::clone(sessions), tx.downgrade());
    tokio::spawn(tracing::Instrument::instrument(
        run(Arc::clone(sessions), hosted, devices, handle.clone(), rx),
        span,
    ));
    Some(handle)
}

/// The session's task: handles commands until the session ends, or until
/// another node takes it over (then it answers nothing more, writes
/// nothing more, and closes its devices with
/// [`CLOSE_SESSION_MOVED`](super::CLOSE_SESSION_MOVED)).
async fn run(
    sessions: Arc<Sessions>,
    mut hosted: Hosted,
    mut devices: Devices,
    handle: SessionHandle,
    mut rx: mpsc::Receiver<Cmd>,
) {
    let id = hosted.d.session().id().to_owned();
    let writer = sessions.writer();
    let store = Store {
        writer: &writer,
        key: &id,
        clock: &*sessions.clock,
    };
    hosted.drain(sessions.clock.now_ms());
    let lost = tokio::select! {
        // A loss first: the refused write that told it must not be
        // answered as the store's failure.
        biased;
        () = handle.lost.notified() => true,
        () = unit::drive(&mut hosted, &mut devices, &mut rx, store) => false,
    };
    if lost {
        devices.close_all(super::CLOSE_SESSION_MOVED);
        rx.close();
        sessions.remove(&id, &handle);
        sessions.metrics.sessions.fetch_sub(1, Relaxed);
        tracing::warn!("hosted session dropped: another node took it over");
        return;
    }
    devices.close_all((1001, "session closed"));
    let now = sessions.clock.now_ms();
    let s = hosted.d.session();
    let removed = hosted.d.is_removed();
    if s.phase() == Phase::Closed && s.result().is_none() && !removed {
        // Stopped without a result (its authority stayed away): a
        // restart does not bring it back, `continue` does.
        let w = KeptState::of(s, now).write(&id);
        writer.write_behind(&id, vec![w]).await;
    }
    if let Some(b) = hosted.rec.take_unsaved().filter(|_| !removed) {
        let mut writes = Vec::with_capacity(2);
        recording_writes(&id, b.head, b.first_seq, b.entries, now, &mut writes);
        writer.write_behind(&id, writes).await;
    }
    sessions.remove(&id, &handle);
    sessions.metrics.sessions.fetch_sub(1, Relaxed);
    if let Some(leases) = sessions.leases() {
        // The session's last writes under its lease, then the lease goes:
        // a node asked for it next brings it back from them.
        writer.flush().await;
        leases
            .release(hostwire_store::lease::UnitKind::HostedSession, &id)
            .await;
    }
}

impl Hosted {
    /// Session time and game time now (SPEC 4.2).
    pub(super) fn times(&self, now: u64) -> (f64, f64) {
        let c = self.d.session().clock();
        (now as f64 + c.offset_ms, c.game_time(now as f64))
    }

    /// Hands what the store lacks of the recording to the store writer,
    /// behind the session's other records.
    pub(super) fn write_recording(&mut self, now: u64) {
        if self.d.is_removed() {
            return;
        }
        if let Some(b) = self.rec.take_batch() {
            self.d.write_behind(SessionRecord::Recording {
                head: b.head,
                first_seq: b.first_seq,
                entries: b.entries,
                at_ms: now,
            });
        }
    }

    /// A record as the store keeps it (a recording's batch is two
    /// writes).
    fn push_writes(&self, r: SessionRecord, out: &mut Vec<SessionWrite>) {
        let id = self.d.session().id();
        let w = match r {
            SessionRecord::Engine {
                record,
                game_time_ms,
            } => {
                let mut w = super::outputs::to_write(&record);
                if let SessionWrite::Snapshot {
                    game_time_ms: t, ..
                } = &mut w
                {
                    // A game brought back by a restart resumes at it.
                    *t = Some(game_time_ms);
                }
                w
            }
            SessionRecord::Kept { at_ms } => KeptState::of(self.d.session(), at_ms).write(id),
            SessionRecord::Recording {
                head,
                first_seq,
                entries,
                at_ms,
            } => return recording_writes(id, head, first_seq, entries, at_ms, out),
            SessionRecord::Removed => SessionWrite::Removed {
                session_id: id.to_owned(),
            },
        };
        out.push(w);
    }

    /// Handles one command at `now`.
    fn command(&mut self, cmd: Cmd, now: u64) {
        if matches!(cmd, Cmd::Attach { .. } | Cmd::Frame { .. } | Cmd::Admin(..)) {
            self.d.used(now);
        }
        match cmd {
            Cmd::Attach {
                instance,
                view,
                address,
                out,
                token,
                done,
            } => self.attach(instance, view, address, out, token, done, now),
            Cmd::Detach { instance } => {
                self.rpc.remove(&instance);
                self.rec.detached(instance);
                self.out.push_back(Out::Forget(instance));
                self.d.act(now, |s| s.detach(instance, now));
            }
            Cmd::Frame { instance, frame } => self.on_frame(instance, frame, now),
            Cmd::Respond {
                instance,
                call,
                result,
            } => self.respond(instance, call, result),
            Cmd::ServiceDone { id, outcome } => {
                self.service_calls.remove(&id);
                // Its task has ended: only its place among the stops goes.
                self.out.push_back(Out::CancelService(id, false));
                let outcome = outcome.as_deref().map_err(Clone::clone);
                self.d.act(now, |s| s.service_done(id, outcome, now));
            }
            Cmd::Admin(op, reply) => self.admin(*op, reply, now),
            Cmd::Wake(done) => {
                // Do what is due now, then answer (once the session's
                // removal is answered, if it expires now).
                self.timeout(now);
                if self.d.is_removed() {
                    self.wakes.push(done);
                } else {
                    self.out.push_back(Out::Woken(done));
                }
            }
            Cmd::Shutdown => self.out.push_back(Out::Stop),
        }
        if self.rec.due(now) {
            self.write_recording(now);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attach(
        &mut self,
        instance: InstanceId,
        view: View,
        address: String,
        out: DeviceOut,
        token: Option<String>,
        done: oneshot::Sender<Result<(), AttachRefused>>,
        now: u64,
    ) {
        let s = self.d.session();
        let is_host_player = s.players().iter().any(|p| p.id == address && p.is_host);
        let allowed = token
            .as_deref()
            .is_some_and(|t| self.auth.allows(view, &address, is_host_player, t));
        if !allowed {
            let why = match (token.is_some(), view) {
                (false, _) => "token: required (?token= or Authorization: Bearer)",
                (true, View::Board | View::Settings) => "token: not the session's host token",
                (true, _) => "token: not the token of this player",
            };
            let refused = Err(AttachRefused::Unauthorized(why.to_owned()));
            let _ = done.send(refused);
            return;
        }
        // The engine's outputs of the attach go after the device is known
        // (they are drained after this command).
        match self.d.act(now, |s| s.attach(instance, view, &address, now)) {
            Ok(()) => {
                // Worker RPC: the server's hello goes first.
                self.rpc
                    .insert(instance, Box::new(super::rpc::device_state()));
                self.rec.attached(instance, &address);
                self.out.push_back(Out::Attached(instance, out, done));
                self.flush(instance);
            }
            Err(e) => {
                let _ = done.send(Err(AttachRefused::Refused(e.to_string())));
            }
        }
    }

    /// Does what is due at `now`: the engine's deadline or the session's
    /// expiry, the devices' Plugin API call deadlines.
    fn timeout(&mut self, now: u64) {
        self.d.handle_timeout(now);
        self.device_timeouts(now);
        if self.rec.due(now) {
            self.write_recording(now);
        }
    }

    /// The end once closed with nothing left to answer.
    fn stop_when_done(&mut self) {
        if self.d.is_done() && self.rpc.is_empty() {
            self.out.push_back(Out::Stop);
        }
    }
}

impl Unit for Hosted {
    type Command = Cmd;
    type Output = Out;
    type Record = SessionWrite;

    fn handle(&mut self, cmd: Cmd, now: u64) {
        self.command(cmd, now);
        self.drain(now);
        self.stop_when_done();
    }
    fn poll_output(&mut self) -> Option<Out> {
        self.out.pop_front()
    }
    fn poll_timeout(&self) -> Option<u64> {
        self.d
            .poll_timeout()
            .into_iter()
            .chain(self.devices_timeout())
            // Nothing more is written once its removal is (no timer for it).
            .chain(self.rec.deadline().filter(|_| !self.d.is_removed()))
            .min()
    }
    fn handle_timeout(&mut self, now: u64) {
        self.timeout(now);
        self.drain(now);
        self.stop_when_done();
    }
    fn poll_write(&mut self) -> Option<Write<SessionWrite>> {
        let w = self.d.poll_write()?;
        for r in &w.records {
            if let SessionRecord::Engine {
                record: Record::Result { result, at_ms, .. },
                ..
            } = r
            {
                // The game ended: the recording says so, and is kept.
                let r = serde_json::to_value(result).ok();
                self.rec.event("end", self.times(*at_ms), r);
                self.write_recording(*at_ms);
            }
        }
        let mut records = Vec::with_capacity(w.records.len() + 1);
        for r in w.records {
            if let SessionRecord::Recording {
                head,
                first_seq,
                entries,
                ..
            } = &r
            {
                let batch = Batch {
                    first_seq: *first_seq,
                    end_seq: first_seq + entries.len() as u64,
                    head: head.is_some(),
                };
                self.rec.in_flight(w.id, batch);
            }
            self.push_writes(r, &mut records);
        }
        Some(Write { id: w.id, records })
    }
    fn ack(&mut self, id: u64, durable: bool, now: u64) {
        if !durable {
            self.metrics.store_failures.fetch_add(1, Relaxed);
        }
        self.rec.acked(id, durable, now);
        self.d.ack(id, durable, now);
        self.drain(now);
        self.stop_when_done();
    }
    fn accepts(&self) -> bool {
        self.d.accepts()
    }
    // A full store queue refuses the write at once: the session keeps
    // answering its devices and its timers.
    fn waits_for_store(&self) -> bool {
        false
    }
}

/// A recording's batch as the store keeps it: its head, if it changed,
/// and its entries.
fn recording_writes(
    id: &str,
    head: Option<String>,
    first_seq: u64,
    entries: Vec<String>,
    at_ms: u64,
    out: &mut Vec<SessionWrite>,
) {
    if let Some(body) = head {
        out.push(SessionWrite::Recording {
            session_id: id.to_owned(),
            body,
            at_ms,
        });
    }
    if !entries.is_empty() {
        out.push(SessionWrite::RecordingEntries {
            session_id: id.to_owned(),
            first_seq,
            entries,
        });
    }
}

/// Why an instance was closed, for logs.
pub fn end_reason(r: &SessionEndReason) -> &str {
    r.as_str()
}
