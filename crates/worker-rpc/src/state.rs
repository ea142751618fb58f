//! The rules of one worker RPC connection, with no I/O (the style of
//! quinn-proto): frames come in through [`PeerState::handle_bytes`] (or
//! `handle_frame` / `handle_malformed`) with `now`; the frames to write are
//! pulled with [`PeerState::poll_transmit`], what happened with
//! [`PeerState::poll_event`], and [`PeerState::poll_timeout`] says when to
//! call [`PeerState::handle_timeout`]. Time is milliseconds on the
//! driver's clock.
//!
//! Ids: each side numbers its own requests and streams (this one 1, 2, 3,
//! …). Which side allocated an id follows from the frame's kind, so the
//! peer may use any integer in 0..=2^53−1 that it does not have in flight
//! already. Every call ends: with its result, its error, `CANCELLED`, a
//! timeout, or the error the connection closed with. Every queue has a
//! bound in [`PeerConfig`].

use crate::error::{codes, RpcError, DEFAULT_MAX_CAUSE_DEPTH};
use crate::frame::*;
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

/// Which end of the connection this peer is (for logs: the rules are the
/// same for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The trusted host.
    Host,
    /// The isolated worker.
    Worker,
}

/// Default of [`PeerConfig::max_inbound_calls`].
pub const DEFAULT_MAX_INBOUND_CALLS: usize = 256;
/// Default of [`PeerConfig::max_outbound_calls`].
pub const DEFAULT_MAX_OUTBOUND_CALLS: usize = 256;
/// Default of [`PeerConfig::max_outbound_bytes`].
pub const DEFAULT_MAX_OUTBOUND_BYTES: usize = 2 * MAX_FRAME_BYTES;
/// Default of [`PeerConfig::max_held_frames`].
pub const DEFAULT_MAX_HELD_FRAMES: usize = 1024;
/// Default of [`PeerConfig::max_progress_queued`].
pub const DEFAULT_MAX_PROGRESS_QUEUED: usize = 64;
/// Default of [`PeerConfig::write_timeout`].
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`PeerConfig::stream_window`].
pub const DEFAULT_STREAM_WINDOW: u64 = 16;

#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Cause chains rebuilt from the wire, and sent, keep at most this many
    /// links.
    pub max_cause_depth: usize,
    /// Chunks a stream receiver lets a sender have in flight (and so the
    /// most chunks buffered per incoming stream).
    pub stream_window: u64,
    /// Sent in `hello`, for logs.
    pub agent: Option<String>,
    /// The largest frame sent (and accepted from a transport that does not
    /// bound it itself). A response, chunk or progress over it fails alone.
    pub max_frame_bytes: usize,
    /// The peer's requests and streams served at once; one more is answered
    /// `TOO_MANY_CALLS`.
    pub max_inbound_calls: usize,
    /// This side's calls and streams in flight (cancelled ones count until
    /// the peer answers them); one more fails at once with `TOO_MANY_CALLS`.
    pub max_outbound_calls: usize,
    /// Bytes of responses, chunks, acks and progress queued for the writer;
    /// senders wait for room (back-pressure). Requests, cancels and the
    /// goodbye, bounded by `max_outbound_calls`, never wait.
    pub max_outbound_bytes: usize,
    /// Frames held back until the peer's `hello`; one more ends the
    /// connection with a `PROTOCOL_ERROR` goodbye.
    pub max_held_frames: usize,
    /// `progress` values queued per call for a caller that does not read
    /// them; more are dropped (and counted).
    pub max_progress_queued: usize,
    /// How long one write (or flush) may wait for the peer to read; past
    /// it the connection ends with `WRITE_TIMEOUT` (a goodbye is tried).
    pub write_timeout: Duration,
    /// Whether frames other than `hello` and `goodbye` wait for the peer's
    /// `hello` (default `true`). A peer that never says hello (a browser
    /// device of a hosted session) is served with `false`.
    pub await_peer_hello: bool,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            max_cause_depth: DEFAULT_MAX_CAUSE_DEPTH,
            stream_window: DEFAULT_STREAM_WINDOW,
            agent: Some(concat!("hostwire-worker-rpc/", env!("CARGO_PKG_VERSION")).to_owned()),
            max_frame_bytes: MAX_FRAME_BYTES,
            max_inbound_calls: DEFAULT_MAX_INBOUND_CALLS,
            max_outbound_calls: DEFAULT_MAX_OUTBOUND_CALLS,
            max_outbound_bytes: DEFAULT_MAX_OUTBOUND_BYTES,
            max_held_frames: DEFAULT_MAX_HELD_FRAMES,
            max_progress_queued: DEFAULT_MAX_PROGRESS_QUEUED,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            await_peer_hello: true,
        }
    }
}

/// Counters of what went wrong on the wire.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeerStats {
    /// Malformed frames, chunks out of order, and frames that break a rule.
    pub protocol_errors: u64,
    pub unknown_ids: u64,
    pub duplicate_responses: u64,
    pub responses_after_cancel: u64,
    pub credit_violations: u64,
    pub version_mismatches: u64,
    /// Requests and stream-opens whose id was already in flight (dropped).
    pub duplicate_ids: u64,
    /// Requests and stream-opens answered `TOO_MANY_CALLS`.
    pub calls_refused: u64,
    /// `progress` values dropped for a caller that did not read them.
    pub progress_dropped: u64,
}

/// A frame to write, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub text: String,
    pub kind: Kind,
}

/// What happened on the connection, for the driver to act on.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The peer's `hello` arrived.
    Ready,
    /// The peer opened a call (`stream: false`) or a stream to be served
    /// here. It is answered with [`PeerState::respond`]; a stream's first
    /// credit goes out with [`PeerState::accept_stream`].
    Request {
        id: Id,
        method: String,
        /// `None` when the frame had no `params`.
        params: Option<Payload>,
        stream: bool,
    },
    /// The peer cancelled a call or stream served here (or it ended here
    /// for a broken rule): its handler stops; its answer is `CANCELLED`.
    Cancelled { id: Id },
    /// The next chunk of a stream served here: in order, within credit.
    Chunk { id: Id, seq: u64, data: Payload },
    /// A stream served here ended: the sender's end (ok or its error), or
    /// why it ended early.
    StreamEnd {
        id: Id,
        result: Result<(), RpcError>,
    },
    /// One of this side's calls or streams ended, exactly once.
    Response {
        id: Id,
        result: Result<Payload, RpcError>,
    },
    /// A `progress` value of one of this side's calls.
    Progress { id: Id, progress: Payload },
    /// One of this side's streams got credit, or ended: a sender waiting
    /// for credit looks again.
    Credit { id: Id },
    /// The connection closed with this error; nothing more is accepted.
    Closed(RpcError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hello {
    Waiting,
    Done,
}

/// This side's stream: chunks sent against the credit granted.
#[derive(Debug, Default)]
struct OutStream {
    granted: u64,
    sent: u64,
}

/// One of this side's calls or streams in flight.
#[derive(Debug)]
struct Outgoing {
    deadline: Option<u64>,
    stream: Option<OutStream>,
}

/// The peer's stream served here: chunks received against credit given.
#[derive(Debug)]
struct InStream {
    granted: u64,
    received: u64,
}

/// One of the peer's calls or streams served here.
#[derive(Debug)]
struct Serving {
    cancelled: bool,
    stream: Option<InStream>,
}

/// One worker RPC connection's state: see the module documentation.
#[derive(Debug)]
pub struct PeerState {
    side: Side,
    config: PeerConfig,
    next_id: Id,
    hello: Hello,
    closed: Option<RpcError>,
    /// Frames for the writer, in order; `queued_bytes` counts them and the
    /// held ones.
    out: VecDeque<Transmit>,
    held: VecDeque<Transmit>,
    queued_bytes: usize,
    calls: HashMap<Id, Outgoing>,
    /// The deadlines of `calls`, earliest first: the driver asks for the
    /// earliest on every turn, and a host with many peers asks each.
    deadlines: BTreeSet<(u64, Id)>,
    /// This side's cancelled calls whose late response is still due.
    cancelled: HashSet<Id>,
    serving: HashMap<Id, Serving>,
    events: VecDeque<Event>,
    stats: PeerStats,
    last_error: Option<String>,
}

fn version() -> String {
    PROTOCOL_VERSION.to_owned()
}

fn protocol_err(message: impl Into<String>) -> RpcError {
    RpcError::new(codes::PROTOCOL_ERROR, message)
}

fn version_mismatch(v: &str) -> RpcError {
    RpcError::new(
        codes::VERSION_MISMATCH,
        format!("the peer speaks {v}; this side speaks {PROTOCOL_VERSION}"),
    )
}

/// Which counter a broken rule goes to.
#[derive(Clone, Copy)]
enum Counter {
    UnknownIds,
    DuplicateResponses,
    CreditViolations,
    DuplicateIds,
}

impl PeerState {
    /// A connection whose first frame out is this side's `hello`.
    pub fn new(side: Side, config: PeerConfig) -> PeerState {
        let mut s = PeerState {
            side,
            next_id: 1,
            hello: if config.await_peer_hello {
                Hello::Waiting
            } else {
                Hello::Done
            },
            config,
            closed: None,
            out: VecDeque::new(),
            held: VecDeque::new(),
            queued_bytes: 0,
            calls: HashMap::new(),
            deadlines: BTreeSet::new(),
            cancelled: HashSet::new(),
            serving: HashMap::new(),
            events: VecDeque::new(),
            stats: PeerStats::default(),
            last_error: None,
        };
        let hi = Frame::Hello {
            v: version(),
            features: Vec::new(),
            agent: s.config.agent.clone(),
        };
        s.push_text(hi.to_text(), Kind::Hello);
        s
    }

    pub fn side(&self) -> Side {
        self.side
    }

    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    /// The next frame to write.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let t = self.out.pop_front()?;
        self.queued_bytes = self.queued_bytes.saturating_sub(t.text.len());
        Some(t)
    }

    /// The next thing that happened.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`PeerState::handle_timeout`] is next due: the earliest
    /// deadline of this side's calls.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// Every call whose deadline is at or before `now` fails with
    /// `TIMEOUT`, and the peer gets `cancel`.
    pub fn handle_timeout(&mut self, now: u64) {
        let due: Vec<Id> = self
            .deadlines
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, id)| *id)
            .collect();
        for id in due {
            self.cancel_with(
                id,
                "timeout",
                RpcError::new(codes::TIMEOUT, "no answer before the deadline"),
            );
        }
    }

    /// Bytes queued for the writer (also those held until the peer's
    /// `hello`): a driver makes senders of responses, chunks, acks and
    /// progress wait while this is at `max_outbound_bytes`.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Whether a waiting sender may queue its frame now.
    pub fn has_room(&self) -> bool {
        self.queued_bytes < self.config.max_outbound_bytes.max(1) || self.closed.is_some()
    }

    /// Whether the peer's `hello` has arrived.
    pub fn is_ready(&self) -> bool {
        self.hello == Hello::Done && self.closed.is_none()
    }

    /// The error the connection closed with, if it did.
    pub fn closed(&self) -> Option<&RpcError> {
        self.closed.as_ref()
    }

    pub fn stats(&self) -> PeerStats {
        self.stats.clone()
    }

    pub fn last_protocol_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Calls and streams still waiting for an answer, both ways.
    pub fn pending(&self) -> usize {
        self.calls.len() + self.serving.len()
    }

    /// Whether `id` is one of the peer's calls served here.
    pub fn is_serving(&self, id: Id) -> bool {
        self.serving.contains_key(&id)
    }

    /// Counts a `progress` value the driver dropped for a caller that did
    /// not read it.
    pub fn note_progress_dropped(&mut self) {
        self.stats.progress_dropped += 1;
    }

    // ---- frames out ----

    /// The frame as text, if the peer can accept it (size and depth).
    pub fn encode(&self, frame: &Frame) -> Result<String, RpcError> {
        let text = frame.to_text();
        if text.len() > self.config.max_frame_bytes {
            return Err(RpcError::new(
                codes::FRAME_TOO_LARGE,
                format!(
                    "the {} frame is {} bytes; the limit is {}",
                    frame.kind(),
                    text.len(),
                    self.config.max_frame_bytes
                ),
            ));
        }
        if hostwire_core::json::deeper_than(text.as_bytes(), MAX_FRAME_DEPTH) {
            return Err(RpcError::new(
                codes::FRAME_TOO_LARGE,
                format!(
                    "the {} frame nests deeper than {MAX_FRAME_DEPTH} levels",
                    frame.kind()
                ),
            ));
        }
        Ok(text)
    }

    /// Queues a frame: before the peer's `hello` only our `hello` and a
    /// `goodbye` go out; the rest is held, up to `max_held_frames`.
    fn push_text(&mut self, text: String, kind: Kind) {
        if self.hello == Hello::Waiting && !matches!(kind, Kind::Hello | Kind::Goodbye) {
            if self.held.len() >= self.config.max_held_frames {
                let n = self.config.max_held_frames;
                self.goodbye_and_close(
                    "too many frames before hello",
                    protocol_err(format!(
                        "more than {n} frames held back waiting for the peer's hello"
                    )),
                );
                return;
            }
            self.queued_bytes += text.len();
            self.held.push_back(Transmit { text, kind });
            return;
        }
        self.queued_bytes += text.len();
        self.out.push_back(Transmit { text, kind });
    }

    fn push(&mut self, frame: &Frame) -> Result<(), RpcError> {
        let text = self.encode(frame)?;
        self.push_text(text, frame.kind_of());
        Ok(())
    }

    /// The response frame for `result`, falling back to an error response
    /// when the answer itself cannot be sent (too large or too deep).
    fn response_text(&self, id: Id, result: Result<Payload, RpcError>) -> String {
        let outcome = match result {
            Ok(v) => Outcome::Ok(v),
            Err(e) => Outcome::Err(e.to_envelope_bounded(self.config.max_cause_depth)),
        };
        let frame = Frame::Response {
            v: version(),
            id,
            outcome,
        };
        match self.encode(&frame) {
            Ok(t) => t,
            Err(e) => Frame::Response {
                v: version(),
                id,
                outcome: Outcome::Err(ErrorEnvelope::new(e.code, e.message)),
            }
            .to_text(),
        }
    }

    fn send_response(&mut self, id: Id, result: Result<Payload, RpcError>) {
        if self.closed.is_none() {
            let text = self.response_text(id, result);
            self.push_text(text, Kind::Response);
        }
    }

    // ---- this side's calls and streams ----

    fn alloc_id(&mut self) -> Result<Id, RpcError> {
        if self.next_id > MAX_ID {
            return Err(RpcError::new(
                codes::TOO_MANY_CALLS,
                "every id of this connection is used",
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        Ok(id)
    }

    /// Sends `request` (or `stream-open`) for `method`: its id, or why it
    /// cannot start (closed, too many calls, too large); nothing is sent
    /// then. Its end comes as [`Event::Response`], by `deadline` at the
    /// latest if one is given.
    pub fn call(
        &mut self,
        method: &str,
        params: Payload,
        stream: bool,
        deadline: Option<u64>,
    ) -> Result<Id, RpcError> {
        if let Some(err) = &self.closed {
            return Err(err.clone());
        }
        let in_flight = self.calls.len() + self.cancelled.len();
        if in_flight >= self.config.max_outbound_calls {
            return Err(RpcError::new(
                codes::TOO_MANY_CALLS,
                format!(
                    "{in_flight} calls in flight; the limit is {}",
                    self.config.max_outbound_calls
                ),
            ));
        }
        let id = self.alloc_id()?;
        let (method, params) = (method.to_owned(), Some(params));
        let frame = if stream {
            Frame::StreamOpen {
                v: version(),
                id,
                method,
                params,
            }
        } else {
            Frame::Request {
                v: version(),
                id,
                method,
                params,
            }
        };
        let text = self.encode(&frame)?;
        if let Some(at) = deadline {
            self.deadlines.insert((at, id));
        }
        self.calls.insert(
            id,
            Outgoing {
                deadline,
                stream: stream.then(OutStream::default),
            },
        );
        self.push_text(text, frame.kind_of());
        Ok(id)
    }

    /// Ends one of this side's calls in the books: the call and its
    /// deadline.
    fn take_call(&mut self, id: Id) -> Option<Outgoing> {
        let c = self.calls.remove(&id)?;
        if let Some(at) = c.deadline {
            self.deadlines.remove(&(at, id));
        }
        Some(c)
    }

    /// Sets (or moves) the deadline of one of this side's calls.
    pub fn set_deadline(&mut self, id: Id, at: u64) {
        if let Some(c) = self.calls.get_mut(&id) {
            if let Some(old) = c.deadline.replace(at) {
                self.deadlines.remove(&(old, id));
            }
            self.deadlines.insert((at, id));
        }
    }

    /// Cancels one of this side's calls: it ends with `err` (its
    /// [`Event::Response`]), the peer gets `cancel`, and its late response
    /// is expected. `false` if it had already ended.
    pub fn cancel_with(&mut self, id: Id, reason: &str, err: RpcError) -> bool {
        if self.take_call(id).is_none() {
            return false;
        }
        if let Some(closed) = &self.closed {
            let err = closed.clone();
            self.events.push_back(Event::Response {
                id,
                result: Err(err),
            });
            return true;
        }
        self.cancelled.insert(id);
        self.events.push_back(Event::Credit { id });
        self.events.push_back(Event::Response {
            id,
            result: Err(err),
        });
        let _ = self.push(&Frame::Cancel {
            v: version(),
            id,
            reason: Some(reason.to_owned()),
        });
        true
    }

    /// Cancels one of this side's calls on the caller's behalf.
    pub fn cancel(&mut self, id: Id, reason: &str) -> bool {
        self.cancel_with(
            id,
            reason,
            RpcError::new(codes::CANCELLED, "cancelled by the caller"),
        )
    }

    /// Chunks one of this side's streams may still send: an error if the
    /// connection closed or the stream ended.
    pub fn credit(&self, id: Id) -> Result<u64, RpcError> {
        if let Some(err) = &self.closed {
            return Err(err.clone());
        }
        match self.calls.get(&id).and_then(|c| c.stream.as_ref()) {
            Some(o) => Ok(o.granted.saturating_sub(o.sent)),
            None => Err(RpcError::new(
                codes::CANCELLED,
                "the receiver ended the stream",
            )),
        }
    }

    /// Sends the next chunk of one of this side's streams, if it has credit
    /// (`Ok(false)`: none; wait for [`Event::Credit`]). A chunk over the
    /// frame limit fails alone; the stream goes on.
    pub fn send_chunk(&mut self, id: Id, data: &Payload) -> Result<bool, RpcError> {
        if self.credit(id)? == 0 {
            return Ok(false);
        }
        let Some(o) = self.calls.get_mut(&id).and_then(|c| c.stream.as_mut()) else {
            return Ok(false);
        };
        let frame = Frame::StreamChunk {
            v: version(),
            id,
            seq: o.sent + 1,
            data: data.clone(),
        };
        let text = self.encode(&frame)?;
        if let Some(o) = self.calls.get_mut(&id).and_then(|c| c.stream.as_mut()) {
            o.sent += 1;
        }
        self.push_text(text, Kind::StreamChunk);
        Ok(true)
    }

    /// Ends one of this side's streams: `Ok` waits for the receiver's
    /// result; an error aborts it (its result no longer comes).
    pub fn end_stream(&mut self, id: Id, result: Result<(), RpcError>) -> Result<(), RpcError> {
        if let Some(err) = &self.closed {
            return Err(err.clone());
        }
        let outcome = match &result {
            Ok(()) => Outcome::Ok(Payload::null()),
            Err(e) => Outcome::Err(e.to_envelope_bounded(self.config.max_cause_depth)),
        };
        if let Err(e) = result {
            if self.take_call(id).is_some() {
                self.cancelled.insert(id);
                self.events
                    .push_back(Event::Response { id, result: Err(e) });
            }
        }
        self.push(&Frame::StreamEnd {
            v: version(),
            id,
            outcome,
        })
    }

    // ---- the peer's calls and streams ----

    /// Answers one of the peer's calls or streams served here (a cancelled
    /// one is answered `CANCELLED`, so both sides forget it). `false` if it
    /// is no longer served (it ended here already).
    pub fn respond(&mut self, id: Id, result: Result<Payload, RpcError>) -> bool {
        let Some(serving) = self.serving.remove(&id) else {
            return false;
        };
        if self.closed.is_some() {
            return false;
        }
        let result = if serving.cancelled {
            Err(RpcError::new(codes::CANCELLED, "cancelled by the caller"))
        } else {
            result
        };
        self.send_response(id, result);
        true
    }

    /// Sends `progress` for one of the peer's calls. Fails (and sends
    /// nothing) when the call is over or cancelled, or the value too large.
    pub fn progress(&mut self, id: Id, progress: Payload) -> Result<(), RpcError> {
        match self.serving.get(&id) {
            Some(s) if !s.cancelled && self.closed.is_none() => {}
            _ => return Err(RpcError::new(codes::CANCELLED, "the call was cancelled")),
        }
        self.push(&Frame::Progress {
            v: version(),
            id,
            progress,
        })
    }

    /// Gives a stream served here its first credit (the window).
    pub fn accept_stream(&mut self, id: Id) {
        let window = self.window();
        if self.serving.get(&id).is_some_and(|s| s.stream.is_some()) {
            let _ = self.push(&Frame::StreamAck {
                v: version(),
                id,
                ack: 0,
                credit: window,
            });
        }
    }

    /// The receiver of a stream served here took chunks up to `seq`: the
    /// sender gets `credit` more.
    pub fn ack(&mut self, id: Id, seq: u64, credit: u64) {
        if self.closed.is_some() {
            return;
        }
        let Some(st) = self.serving.get_mut(&id).and_then(|s| s.stream.as_mut()) else {
            return;
        };
        st.granted = st.granted.saturating_add(credit).min(MAX_ID);
        let _ = self.push(&Frame::StreamAck {
            v: version(),
            id,
            ack: seq,
            credit,
        });
    }

    fn window(&self) -> u64 {
        self.config.stream_window.clamp(1, MAX_ID)
    }

    // ---- goodbye and close ----

    /// Says goodbye: every pending call and stream fails with `GOODBYE`,
    /// the peer's fail with `PEER_GOODBYE` there, and nothing more is sent.
    pub fn goodbye(&mut self, reason: &str) {
        if self.closed.is_some() {
            return;
        }
        let _ = self.push(&Frame::Goodbye {
            v: version(),
            reason: Some(reason.to_owned()),
            error: None,
        });
        self.close(RpcError::new(
            codes::GOODBYE,
            format!("this side said goodbye: {reason}"),
        ));
    }

    /// Says goodbye with `err` and closes: for failures of the connection
    /// as a whole.
    pub fn goodbye_and_close(&mut self, reason: &str, err: RpcError) {
        if self.closed.is_some() {
            return;
        }
        let bye = Frame::Goodbye {
            v: version(),
            reason: Some(reason.to_owned()),
            error: Some(err.to_envelope_bounded(self.config.max_cause_depth)),
        };
        self.push_text(bye.to_text(), Kind::Goodbye);
        self.close(err);
    }

    /// Fails everything open with `err`; nothing more is accepted or
    /// queued, frames held for the peer's `hello` are dropped, and what
    /// is queued already (a goodbye) is still for the writer.
    pub fn close(&mut self, err: RpcError) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(err.clone());
        let mut ids: Vec<Id> = self.calls.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let c = self.take_call(id);
            if c.is_some_and(|c| c.stream.is_some()) {
                self.events.push_back(Event::Credit { id });
            }
            self.events.push_back(Event::Response {
                id,
                result: Err(err.clone()),
            });
        }
        self.cancelled.clear();
        let mut ids: Vec<Id> = self.serving.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let s = self.serving.remove(&id);
            self.events.push_back(Event::Cancelled { id });
            if s.is_some_and(|s| s.stream.is_some()) {
                self.events.push_back(Event::StreamEnd {
                    id,
                    result: Err(err.clone()),
                });
            }
        }
        for t in self.held.drain(..) {
            self.queued_bytes = self.queued_bytes.saturating_sub(t.text.len());
        }
        self.events.push_back(Event::Closed(err));
    }

    // ---- frames in ----

    fn note(&mut self, counter: Option<Counter>, message: String) {
        if let Some(c) = counter {
            match c {
                Counter::UnknownIds => self.stats.unknown_ids += 1,
                Counter::DuplicateResponses => self.stats.duplicate_responses += 1,
                Counter::CreditViolations => self.stats.credit_violations += 1,
                Counter::DuplicateIds => self.stats.duplicate_ids += 1,
            }
        }
        self.last_error = Some(message);
    }

    /// A broken rule: counted as a protocol error and under `counter`.
    fn protocol_error(&mut self, counter: Counter, message: String) {
        self.stats.protocol_errors += 1;
        self.note(Some(counter), message);
    }

    /// A frame's bytes as they came off the transport (the frame limit is
    /// checked before parsing).
    pub fn handle_bytes(&mut self, bytes: &[u8], now: u64) {
        if bytes.len() > self.config.max_frame_bytes {
            self.handle_oversize(bytes, bytes.len(), now);
            return;
        }
        match parse_frame_bytes(bytes) {
            Ok(frame) => self.handle_frame(frame, now),
            Err(e) => self.handle_malformed(e, now),
        }
    }

    /// A frame of `size` bytes, over the limit, of which `head` was read.
    pub fn handle_oversize(&mut self, head: &[u8], size: usize, now: u64) {
        let h = read_head(head);
        let e = FrameError {
            field: String::new(),
            message: format!(
                "the frame is {size} bytes; the limit is {}",
                self.config.max_frame_bytes
            ),
            kind: h.kind,
            id: h.id,
            v: h.v,
        };
        self.handle_malformed(e, now);
    }

    /// The transport ended (or failed) with `err`: everything fails.
    pub fn handle_transport_closed(&mut self, err: RpcError) {
        self.close(err);
    }

    /// A frame of another MAJOR: a request or stream-open is answered with
    /// the error; anything else ends the connection.
    fn other_major(&mut self, kind: Option<Kind>, id: Option<Id>, v: &str) {
        self.stats.version_mismatches += 1;
        let err = version_mismatch(v);
        match (kind, id) {
            (Some(Kind::Request | Kind::StreamOpen), Some(id)) => {
                if !self.serving.contains_key(&id) {
                    self.send_response(id, Err(err));
                }
            }
            _ => self.goodbye_and_close("version mismatch", err),
        }
    }

    /// A frame that failed to parse: the call or stream it belongs to
    /// fails with `PROTOCOL_ERROR` naming the field.
    pub fn handle_malformed(&mut self, e: FrameError, _now: u64) {
        if self.closed.is_some() {
            return;
        }
        if e.other_major() {
            let v = e.v.clone().unwrap_or_default();
            return self.other_major(e.kind, e.id, &v);
        }
        let what = e.kind.map_or("frame", Kind::as_str);
        let message = format!("malformed {what}: {e}");
        self.stats.protocol_errors += 1;
        self.note(None, message.clone());
        let err = protocol_err(message);
        match (e.kind, e.id) {
            (Some(Kind::Hello), _) => self.goodbye_and_close("malformed hello", err),
            // The peer is leaving all the same.
            (Some(Kind::Goodbye), _) => self.close(err),
            (Some(Kind::Request | Kind::StreamOpen), Some(id)) => {
                if self.serving.contains_key(&id) {
                    // Answering under this id would resolve the original call.
                    self.stats.duplicate_ids += 1;
                    self.last_error = Some(format!("id {id} is already in flight"));
                } else {
                    self.send_response(id, Err(err));
                }
            }
            (Some(Kind::Response), Some(id)) => self.fail_call(id, err, true),
            (Some(Kind::Progress | Kind::StreamAck), Some(id)) => self.fail_call(id, err, false),
            (Some(Kind::Cancel | Kind::StreamChunk | Kind::StreamEnd), Some(id)) => {
                self.end_serving(id, err)
            }
            _ => {} // nothing to attribute it to: counted and kept as the last error
        }
    }

    /// Fails one of this side's calls (and its stream). Unless the peer
    /// has already answered it (`answered`), tells the peer to stop with
    /// `cancel` and expects its late response.
    fn fail_call(&mut self, id: Id, err: RpcError, answered: bool) {
        if answered {
            if let Some(c) = self.take_call(id) {
                if c.stream.is_some() {
                    self.events.push_back(Event::Credit { id });
                }
                self.events.push_back(Event::Response {
                    id,
                    result: Err(err),
                });
            }
        } else {
            self.cancel_with(id, "protocol error", err);
        }
    }

    /// Ends one of the peer's calls or streams here with `err`: its
    /// handler is cancelled and the peer gets `err` as the response.
    fn end_serving(&mut self, id: Id, err: RpcError) {
        let Some(s) = self.serving.remove(&id) else {
            return;
        };
        self.events.push_back(Event::Cancelled { id });
        if s.stream.is_some() {
            self.events.push_back(Event::StreamEnd {
                id,
                result: Err(err.clone()),
            });
        }
        self.send_response(id, Err(err));
    }

    /// A new request or stream from the peer: any id not already in
    /// flight, within the limit of calls served at once.
    fn accept_peer_id(&mut self, id: Id) -> bool {
        if self.serving.contains_key(&id) {
            // Answering under this id would resolve the original call.
            self.protocol_error(
                Counter::DuplicateIds,
                format!("id {id} is already in flight"),
            );
            return false;
        }
        let serving = self.serving.len();
        if serving >= self.config.max_inbound_calls {
            self.stats.calls_refused += 1;
            let err = RpcError::new(
                codes::TOO_MANY_CALLS,
                format!(
                    "{serving} calls in flight; the limit is {}",
                    self.config.max_inbound_calls
                ),
            );
            self.send_response(id, Err(err));
            return false;
        }
        true
    }

    /// One parsed frame from the peer.
    pub fn handle_frame(&mut self, frame: Frame, _now: u64) {
        if self.closed.is_some() {
            return;
        }
        if !frame.is_compatible() {
            let (kind, id) = (frame.kind_of(), frame.id());
            return self.other_major(Some(kind), id, frame.version());
        }
        match frame {
            Frame::Hello { .. } => {
                if self.hello == Hello::Waiting {
                    self.hello = Hello::Done;
                    self.out.extend(self.held.drain(..));
                    self.events.push_back(Event::Ready);
                }
            }
            Frame::Goodbye { reason, error, .. } => {
                let mut err = RpcError::new(
                    codes::PEER_GOODBYE,
                    format!(
                        "the peer said goodbye: {}",
                        reason.as_deref().unwrap_or("no reason given")
                    ),
                );
                if let Some(e) = error {
                    err = err.with_cause(RpcError::from_envelope(&e, self.config.max_cause_depth));
                }
                self.close(err);
            }
            Frame::Request {
                id, method, params, ..
            } => self.open_serving(id, method, params, false),
            Frame::StreamOpen {
                id, method, params, ..
            } => self.open_serving(id, method, params, true),
            Frame::Response { id, outcome, .. } => self.on_response(id, outcome),
            Frame::Cancel { id, .. } => {
                if let Some(s) = self.serving.get_mut(&id) {
                    if !s.cancelled {
                        s.cancelled = true;
                        let stream = s.stream.is_some();
                        self.events.push_back(Event::Cancelled { id });
                        if stream {
                            self.events.push_back(Event::StreamEnd {
                                id,
                                result: Err(RpcError::new(
                                    codes::CANCELLED,
                                    "the sender cancelled the stream",
                                )),
                            });
                        }
                    }
                }
            }
            Frame::Progress { id, progress, .. } => {
                if self.calls.contains_key(&id) {
                    self.events.push_back(Event::Progress { id, progress });
                } else if !self.cancelled.contains(&id) {
                    self.protocol_error(
                        Counter::UnknownIds,
                        format!("progress for unknown id {id}"),
                    );
                }
            }
            Frame::StreamChunk { id, seq, data, .. } => self.on_chunk(id, seq, data),
            Frame::StreamEnd { id, outcome, .. } => {
                let open = self
                    .serving
                    .get_mut(&id)
                    .and_then(|s| s.stream.take().map(|_| s.cancelled));
                // A cancelled stream was already told it ended.
                if open == Some(false) {
                    let result = match outcome {
                        Outcome::Ok(_) => Ok(()),
                        Outcome::Err(e) => {
                            Err(RpcError::from_envelope(&e, self.config.max_cause_depth))
                        }
                    };
                    self.events.push_back(Event::StreamEnd { id, result });
                }
            }
            Frame::StreamAck { id, credit, .. } => {
                if let Some(o) = self.calls.get_mut(&id).and_then(|c| c.stream.as_mut()) {
                    o.granted = o.granted.saturating_add(credit).min(MAX_ID);
                    self.events.push_back(Event::Credit { id });
                }
            }
        }
    }

    fn open_serving(&mut self, id: Id, method: String, params: Option<Payload>, stream: bool) {
        if !self.accept_peer_id(id) {
            return;
        }
        let window = self.window();
        self.serving.insert(
            id,
            Serving {
                cancelled: false,
                stream: stream.then_some(InStream {
                    granted: window,
                    received: 0,
                }),
            },
        );
        self.events.push_back(Event::Request {
            id,
            method,
            params,
            stream,
        });
    }

    fn on_response(&mut self, id: Id, outcome: Outcome) {
        if let Some(c) = self.take_call(id) {
            // A stream's receiver answered: a sender waiting for credit
            // wakes up and finds the stream gone.
            if c.stream.is_some() {
                self.events.push_back(Event::Credit { id });
            }
            let result = match outcome {
                Outcome::Ok(v) => Ok(v),
                Outcome::Err(e) => Err(RpcError::from_envelope(&e, self.config.max_cause_depth)),
            };
            self.events.push_back(Event::Response { id, result });
        } else if self.cancelled.remove(&id) {
            self.stats.responses_after_cancel += 1;
        } else if id < self.next_id {
            self.protocol_error(
                Counter::DuplicateResponses,
                format!("a second response to {id}"),
            );
        } else {
            self.protocol_error(
                Counter::UnknownIds,
                format!("a response to unknown id {id}"),
            );
        }
    }

    fn on_chunk(&mut self, id: Id, seq: u64, data: Payload) {
        let Some(st) = self
            .serving
            .get_mut(&id)
            .filter(|s| !s.cancelled)
            .and_then(|s| s.stream.as_mut())
        else {
            // Late chunks after the receiver finished look the same.
            self.note(
                Some(Counter::UnknownIds),
                format!("a chunk for unknown stream {id}"),
            );
            return;
        };
        if seq != st.received + 1 {
            let message = format!(
                "stream-chunk seq: {seq} is out of order (expected {})",
                st.received + 1
            );
            self.stats.protocol_errors += 1;
            self.note(None, message.clone());
            self.end_serving(id, protocol_err(message));
        } else if seq > st.granted {
            let message = format!("chunk {seq} is beyond the {} granted", st.granted);
            self.protocol_error(Counter::CreditViolations, message.clone());
            self.end_serving(id, RpcError::new(codes::STREAM_CREDIT_EXCEEDED, message));
        } else {
            st.received = seq;
            self.events.push_back(Event::Chunk { id, seq, data });
        }
    }
}
