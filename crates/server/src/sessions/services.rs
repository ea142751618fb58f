//! The services this server offers to hosted sessions (SPEC 5.3). Each one
//! is a worker process, started on its first call, spoken to with worker
//! RPC 1.0.0 as NDJSON on its stdin and stdout through
//! [`hostwire_worker_rpc::Peer`]. The host calls the worker's method named
//! as the service with `{"payload": <the plugin's payload>, "caller":
//! {"sessionId": …, "player": … | null}}`; the worker's result is the
//! service's result.
//!
//! Every call ends: the session's engine fails a call whose deadline
//! passed (and the call here is dropped, which sends `cancel`); a worker
//! that exits fails its calls and is started again for the next one; a
//! worker that lets a call time out without answering anything since that
//! call was sent is taken as hung and killed (its other calls fail, the
//! next call starts it again). At most [`MAX_STARTS_PER_MINUTE`] starts a
//! minute: beyond it calls fail at once until the minute has passed.

use hostwire_core::Clock;
use hostwire_memizy::calls::is_service_name;
use hostwire_memizy::limits::{CALL_ENVELOPE_BYTES, LIMITS};
use hostwire_memizy::session::{ServiceRegistry, ServiceSpec};
use hostwire_memizy::{ProtocolError, ProtocolErrorCode as Code};
use hostwire_worker_rpc::transport::{NdjsonCodec, Transport};
use hostwire_worker_rpc::{codes, Payload, Peer, PeerConfig, RpcError, Side};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::process::{Child, Command};
use tokio_util::codec::{FramedRead, FramedWrite};

/// How long a service call may take unless configured otherwise.
pub const DEFAULT_SERVICE_TIMEOUT_MS: u64 =
    hostwire_memizy::session::services::DEFAULT_SERVICE_TIMEOUT_MS;
/// Starts of one worker within a minute (its first start included); more
/// are refused until the minute has passed, so a worker that dies at once
/// is not restarted in a loop.
pub const MAX_STARTS_PER_MINUTE: usize = 5;
/// The largest frame read from a worker: a result of the SPEC's 256 KB and
/// its envelope. A longer line is not buffered; its call fails as
/// `MESSAGE_TOO_LARGE`.
pub const MAX_WORKER_FRAME_BYTES: usize = LIMITS.service_result_bytes + CALL_ENVELOPE_BYTES;
/// Calls in flight to one worker (over all sessions); one more fails with
/// `INTERNAL_ERROR` ("busy").
pub const MAX_CALLS_PER_WORKER: usize = 256;
/// Calls of one session in flight to one worker: one session's flood takes
/// this share of the worker and no more (one more fails `RATE_LIMITED`),
/// so the other sessions' calls are still taken and answered. Sixteen
/// sessions at their share fill [`MAX_CALLS_PER_WORKER`].
pub const MAX_CALLS_PER_SESSION: usize = 16;
/// The built-in example service and its worker program.
pub const BUILTIN_SERVICE: &str = "answers.check";
pub const BUILTIN_WORKER: &str = "hostwire-answer-checker";

/// One configured service: `name=program arg…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCommand {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl ServiceCommand {
    /// Reads `name=program arg…` (arguments split at whitespace). A bare
    /// program name is looked up beside this executable, then on `PATH`.
    pub fn parse(spec: &str) -> Result<ServiceCommand, String> {
        let (name, command) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec:?}: expected NAME=COMMAND"))?;
        let name = name.trim();
        if !is_service_name(name) {
            return Err(format!(
                "{name:?}: a service name is lowercase segments joined by dots (e.g. answers.check)"
            ));
        }
        let mut words = command.split_whitespace();
        let program = words
            .next()
            .ok_or_else(|| format!("{name}: the command is empty"))?;
        Ok(ServiceCommand {
            name: name.to_owned(),
            program: resolve_program(program),
            args: words.map(str::to_owned).collect(),
        })
    }

    /// Whether the program exists (a service whose program is missing is
    /// not offered).
    pub fn program_exists(&self) -> bool {
        self.program.is_file()
    }
}

fn resolve_program(program: &str) -> PathBuf {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return p.to_owned();
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(program)));
    if let Some(b) = beside.filter(|b| b.is_file()) {
        return b;
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(program))
                .find(|c| c.is_file())
        })
        .unwrap_or_else(|| p.to_owned())
}

/// Counters of the services, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct ServiceMetrics {
    pub calls: AtomicU64,
    pub failures: AtomicU64,
    pub worker_starts: AtomicU64,
    pub workers_killed_hung: AtomicU64,
}

/// The services offered and their workers.
pub struct ServiceHost {
    workers: BTreeMap<String, Arc<Worker>>,
    timeout_ms: u64,
    pub metrics: Arc<ServiceMetrics>,
}

impl std::fmt::Debug for ServiceHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceHost")
            .field("services", &self.workers.keys().collect::<Vec<_>>())
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

struct Live {
    peer: Peer,
    _child: Child,
    generation: u64,
    /// Calls this worker answered (its result or its own error).
    answers: Arc<AtomicU64>,
}

#[derive(Default)]
struct WorkerState {
    live: Option<Live>,
    generation: u64,
    /// When it was started within the last minute (clock ms).
    starts: VecDeque<u64>,
    /// Calls in flight, by session (over every generation of the worker).
    in_flight: HashMap<String, usize>,
}

struct Worker {
    cmd: ServiceCommand,
    clock: Arc<dyn Clock>,
    metrics: Arc<ServiceMetrics>,
    state: Mutex<WorkerState>,
}

/// Where a call stands, to tell a hung worker from a slow call; it holds
/// the call's place in its session's share until it is dropped.
pub struct Ticket {
    worker: Arc<Worker>,
    generation: u64,
    answers_at_start: u64,
    answers: Arc<AtomicU64>,
    session_id: String,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.worker.lock();
        if let Some(n) = s.in_flight.get_mut(&self.session_id) {
            *n -= 1;
            if *n == 0 {
                s.in_flight.remove(&self.session_id);
            }
        }
    }
}

impl ServiceHost {
    /// No services.
    pub fn none() -> ServiceHost {
        ServiceHost {
            workers: BTreeMap::new(),
            timeout_ms: DEFAULT_SERVICE_TIMEOUT_MS,
            metrics: Arc::default(),
        }
    }

    pub fn new(
        commands: Vec<ServiceCommand>,
        timeout_ms: u64,
        clock: Arc<dyn Clock>,
        metrics: Arc<ServiceMetrics>,
    ) -> ServiceHost {
        let workers = commands
            .into_iter()
            .map(|cmd| {
                (
                    cmd.name.clone(),
                    Arc::new(Worker {
                        cmd,
                        clock: Arc::clone(&clock),
                        metrics: Arc::clone(&metrics),
                        state: Mutex::new(WorkerState::default()),
                    }),
                )
            })
            .collect();
        ServiceHost {
            workers,
            timeout_ms: timeout_ms.max(1),
            metrics,
        }
    }

    /// The engine's registry: every service offered, with its timeout.
    pub fn registry(&self) -> ServiceRegistry {
        self.workers.keys().fold(ServiceRegistry::new(), |r, name| {
            r.offer(
                name.clone(),
                ServiceSpec {
                    timeout_ms: self.timeout_ms,
                },
            )
        })
    }

    pub fn names(&self) -> Vec<String> {
        self.workers.keys().cloned().collect()
    }

    /// Starts a call of `name`: the future of its result (JSON text) and
    /// its ticket (for [`ServiceHost::timed_out`]).
    /// A session has at most [`MAX_CALLS_PER_SESSION`] calls in flight to
    /// one worker.
    pub fn call(
        &self,
        name: &str,
        session_id: &str,
        params: Payload,
    ) -> Result<(hostwire_worker_rpc::Call, Ticket), ProtocolError> {
        let Some(w) = self.workers.get(name) else {
            return Err(ProtocolError::new(
                Code::ServiceUnavailable,
                format!("service: {name:?} is not offered by this host"),
            ));
        };
        self.metrics.calls.fetch_add(1, Relaxed);
        {
            let mut s = w.lock();
            let n = s.in_flight.entry(session_id.to_owned()).or_default();
            if *n >= MAX_CALLS_PER_SESSION {
                self.metrics.failures.fetch_add(1, Relaxed);
                return Err(ProtocolError::new(
                    Code::RateLimited,
                    format!(
                        "service: {name:?}: this session has {MAX_CALLS_PER_SESSION} calls of it in flight; try again when one is answered"
                    ),
                ));
            }
            *n += 1;
        }
        // From here the ticket gives the place back, also on failure.
        let mut ticket = Ticket {
            worker: Arc::clone(w),
            generation: 0,
            answers_at_start: 0,
            answers: Arc::default(),
            session_id: session_id.to_owned(),
        };
        let (peer, generation, answers) = w.live().inspect_err(|_| {
            self.metrics.failures.fetch_add(1, Relaxed);
        })?;
        ticket.generation = generation;
        ticket.answers_at_start = answers.load(Relaxed);
        ticket.answers = answers;
        Ok((peer.call(name, params), ticket))
    }

    /// What a call's outcome means for the plugin; counts the answer.
    pub fn outcome(
        &self,
        name: &str,
        ticket: &Ticket,
        r: Result<Payload, RpcError>,
    ) -> Result<String, ProtocolError> {
        let answered = match &r {
            Ok(_) => true,
            Err(e) => !matches!(
                e.code.as_str(),
                codes::TRANSPORT_CLOSED
                    | codes::PEER_GOODBYE
                    | codes::GOODBYE
                    | codes::TIMEOUT
                    | codes::CANCELLED
                    | codes::WRITE_TIMEOUT
                    | codes::TOO_MANY_CALLS
                    | codes::FRAME_TOO_LARGE
            ),
        };
        if answered {
            ticket.answers.fetch_add(1, Relaxed);
        }
        let r = r.map(|p| p.get().to_owned()).map_err(|e| {
            // The peer fails a response over its frame bound as a
            // malformed frame naming the sizes: for the plugin that is the
            // result's size limit.
            let oversize = e.code == codes::PROTOCOL_ERROR
                && e.message.contains("the frame is ")
                && e.message.contains("the limit is ");
            let code = if oversize {
                codes::FRAME_TOO_LARGE
            } else {
                e.code.as_str()
            };
            let (code, why) = match code {
                codes::TRANSPORT_CLOSED | codes::PEER_GOODBYE | codes::WRITE_TIMEOUT => (
                    Code::InternalError,
                    "its worker exited or stopped reading; it is started again for the next call"
                        .to_owned(),
                ),
                codes::FRAME_TOO_LARGE => (
                    Code::MessageTooLarge,
                    format!("the result is over {} bytes", LIMITS.service_result_bytes),
                ),
                codes::TOO_MANY_CALLS => (
                    Code::InternalError,
                    "its worker is busy; try again".to_owned(),
                ),
                "INVALID_ARGUMENT" | "INVALID_PARAMS" => (
                    Code::InvalidArgument,
                    format!("the service refused the payload: {}", short(&e.message)),
                ),
                other => (
                    Code::InternalError,
                    format!(
                        "the service failed: {}: {}",
                        short(other),
                        short(&e.message)
                    ),
                ),
            };
            ProtocolError::new(code, format!("service: {name:?}: {why}"))
        });
        if r.is_err() {
            self.metrics.failures.fetch_add(1, Relaxed);
        }
        r
    }

    /// The call's deadline passed: if its worker answered nothing since the
    /// call was sent, it is hung and is killed (started again on the next
    /// call).
    pub fn timed_out(&self, ticket: &Ticket) {
        if ticket.answers.load(Relaxed) != ticket.answers_at_start {
            return;
        }
        let mut s = ticket.worker.lock();
        if s.live
            .as_ref()
            .is_some_and(|l| l.generation == ticket.generation)
        {
            s.live = None;
            self.metrics.workers_killed_hung.fetch_add(1, Relaxed);
            tracing::warn!(
                service = %ticket.worker.cmd.name,
                "service worker answered nothing within the call's timeout: killed, started again on the next call"
            );
        }
    }

    /// Stops every worker.
    pub fn shutdown(&self) {
        for w in self.workers.values() {
            w.lock().live = None;
        }
    }
}

impl Worker {
    fn lock(&self) -> std::sync::MutexGuard<'_, WorkerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The running worker, started if it is not.
    fn live(&self) -> Result<(Peer, u64, Arc<AtomicU64>), ProtocolError> {
        let mut s = self.lock();
        if let Some(l) = &s.live {
            if l.peer.closed().is_none() {
                return Ok((l.peer.clone(), l.generation, Arc::clone(&l.answers)));
            }
            tracing::warn!(service = %self.cmd.name, "service worker exited; starting it again");
            s.live = None;
        }
        let now = self.clock.now_ms();
        while s
            .starts
            .front()
            .is_some_and(|&t| now.saturating_sub(t) >= 60_000)
        {
            s.starts.pop_front();
        }
        if s.starts.len() >= MAX_STARTS_PER_MINUTE {
            return Err(ProtocolError::new(
                Code::InternalError,
                format!(
                    "service: {:?}: its worker was started {MAX_STARTS_PER_MINUTE} times in the last minute; try again later",
                    self.cmd.name
                ),
            ));
        }
        s.starts.push_back(now);
        s.generation += 1;
        self.metrics.worker_starts.fetch_add(1, Relaxed);
        let (transport, child) = spawn(&self.cmd).map_err(|e| {
            tracing::warn!(service = %self.cmd.name, program = %self.cmd.program.display(), error = %e, "cannot start the service worker");
            ProtocolError::new(
                Code::InternalError,
                format!("service: {:?}: its worker cannot be started", self.cmd.name),
            )
        })?;
        let config = PeerConfig {
            max_frame_bytes: MAX_WORKER_FRAME_BYTES,
            max_outbound_calls: MAX_CALLS_PER_WORKER,
            ..PeerConfig::default()
        };
        let peer = Peer::new(Side::Host, transport, config);
        let answers = Arc::new(AtomicU64::new(0));
        s.live = Some(Live {
            peer: peer.clone(),
            _child: child,
            generation: s.generation,
            answers: Arc::clone(&answers),
        });
        Ok((peer, s.generation, answers))
    }
}

/// The worker as a child process: NDJSON on its stdin and stdout, lines
/// read up to [`MAX_WORKER_FRAME_BYTES`]; its stderr is the server's.
fn spawn(cmd: &ServiceCommand) -> std::io::Result<(Transport, Child)> {
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = c.spawn()?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let transport = Transport {
        reader: Box::pin(FramedRead::new(
            stdout,
            NdjsonCodec::new(MAX_WORKER_FRAME_BYTES),
        )),
        writer: Box::pin(FramedWrite::new(
            stdin,
            NdjsonCodec::new(MAX_WORKER_FRAME_BYTES),
        )),
    };
    Ok((transport, child))
}

fn short(s: &str) -> String {
    s.chars().take(200).collect()
}

/// The params a worker gets: the plugin's payload (raw JSON text) and who
/// calls.
pub fn params(payload: &str, session_id: &str, player: Option<&str>) -> Payload {
    let caller = serde_json::json!({"sessionId": session_id, "player": player});
    let text = format!("{{\"payload\":{payload},\"caller\":{caller}}}");
    Payload::from_text(text).unwrap_or_else(|_| Payload::null())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_is_name_equals_command_with_its_arguments() {
        let c = ServiceCommand::parse("chess.puzzles = /opt/w --level 3").unwrap();
        assert_eq!(c.name, "chess.puzzles");
        assert_eq!(c.program, PathBuf::from("/opt/w"));
        assert_eq!(c.args, vec!["--level".to_owned(), "3".to_owned()]);
        assert!(ServiceCommand::parse("Chess=/opt/w")
            .unwrap_err()
            .contains("lowercase"));
        assert!(ServiceCommand::parse("chess")
            .unwrap_err()
            .contains("NAME=COMMAND"));
        assert!(ServiceCommand::parse("chess= ")
            .unwrap_err()
            .contains("empty"));
        // A bare name that is nowhere stays as it was, and is not offered.
        let c = ServiceCommand::parse("x.y=no-such-worker-program").unwrap();
        assert!(!c.program_exists());
    }

    #[test]
    fn params_carry_the_payload_as_it_came_and_the_caller() {
        let p = params(r#"{"a": 1}"#, "s1", Some("p1"));
        assert_eq!(
            p.get(),
            r#"{"payload":{"a": 1},"caller":{"sessionId":"s1","player":"p1"}}"#
        );
    }
}
