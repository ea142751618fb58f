//! Drives a [`Session`] in memory on a manual clock: a board and N
//! controllers as simulated plugin instances, and an in-memory store that
//! makes records durable at once, later, or never.
#![allow(dead_code)]

use hostwire_core::{Clock, ManualClock};
use hostwire_memizy::calls::decode_plugin_call;
use hostwire_memizy::manifest::parse_plugin_manifest;
use hostwire_memizy::session::*;
use hostwire_memizy::{DisplaySet, HostAs, InitPayload, Mode, ProtocolError};
use hostwire_memizy::{ProtocolErrorCode, View};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

pub const PLUGIN_ID: &str = "https://example.com/plugins/quiz-race";

/// What the store does with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// Durable as soon as it is written.
    Durable,
    /// Written, not yet acknowledged (the test acknowledges).
    Hold,
    /// The write fails.
    Fail,
}

pub struct Sim {
    pub s: Session,
    pub clock: ManualClock,
    next_call: u64,
    pub replies: HashMap<(InstanceId, CallId), Result<Reply, ProtocolError>>,
    /// Plugin API calls each instance received, decoded: (method, args).
    pub inbox: BTreeMap<InstanceId, Vec<(String, Value)>>,
    pub closed: HashMap<InstanceId, CloseReason>,
    pub store: Vec<(RecordId, Record)>,
    pub store_mode: StoreMode,
    pub held: Vec<RecordId>,
    pub services: Vec<ServiceRequest>,
    pub cancelled: Vec<ServiceCallId>,
    pub events: Vec<SessionEvent>,
}

pub fn manifest(memizy: Value) -> hostwire_memizy::PluginManifest {
    let doc = json!({
        "version": "1.0",
        "id": PLUGIN_ID,
        "appName": "Quiz Race",
        "pluginVersion": "1.0.0",
        "capabilities": {"actions": ["render"], "types": ["mcq-single", "true-false", "flashcard"]},
        "appSpecific": {"memizy": memizy}
    });
    parse_plugin_manifest(doc).expect("a valid manifest")
}

pub fn quiz_memizy() -> Value {
    json!({
        "protocol": "1.0",
        "modes": {
            "solo": {},
            "multiplayer": {"players": {"min": 1, "max": 40}, "hostAs": ["presenter", "player"], "lateJoin": true}
        },
        "settingsScreen": {"size": "compact"},
        "settings": [
            {"id": "questionTime", "type": "number", "label": "Time", "default": 20, "min": 5, "max": 120}
        ],
        "services": ["chess.puzzles", "ai.chat"]
    })
}

pub fn quiz_set() -> DisplaySet {
    DisplaySet {
        meta: json!({"id": "set-1", "title": "Planets"}),
        items: vec![
            json!({"id": "q1", "type": "mcq-single", "question": "Largest planet?", "skills": ["astro.planets"],
                   "options": [{"id": "j", "text": "Jupiter"}, {"id": "m", "text": "Mars"}, {"id": "v", "text": "Venus"}],
                   "correctId": "j", "explanation": "It is."}),
            json!({"id": "q2", "type": "true-false", "question": "Sound is faster than light.", "correctAnswer": false}),
        ],
    }
}

pub fn config(mode: Mode, host_as: Option<HostAs>) -> SessionConfig {
    let m = manifest(quiz_memizy());
    let mut c = SessionConfig::new("session-1", mode, host_as, PLUGIN_ID, m.runtime, quiz_set());
    c.item_types = m.types;
    c.set_id = "set-1".into();
    c.services = ServiceRegistry::new().offer("chess.puzzles", ServiceSpec { timeout_ms: 2_000 });
    c.assets.set.insert("img/planet.png".into(), 1_000);
    c.assets
        .set
        .insert("video/huge.mp4".into(), 3 * 1024 * 1024);
    c.assets.items.insert(
        "q1".into(),
        BTreeMap::from([("img/planet.png".to_owned(), 500)]),
    );
    c
}

pub fn hello_args() -> String {
    hello_args_with("1.0", PLUGIN_ID)
}

pub fn hello_args_with(protocol: &str, plugin: &str) -> String {
    json!([{
        "protocol": protocol,
        "sdk": {"name": "@memizy/plugin-sdk", "version": "1.0.3"},
        "plugin": {"id": plugin, "version": "1.0.0"},
        "features": []
    }])
    .to_string()
}

pub const T0: u64 = 1_764_460_800_000;

impl Sim {
    pub fn new(cfg: SessionConfig) -> Self {
        let clock = ManualClock::new(T0);
        let s = Session::new(cfg, clock.now_ms()).expect("a valid session");
        Self::from_session(s, clock)
    }

    pub fn from_session(s: Session, clock: ManualClock) -> Self {
        let mut sim = Sim {
            s,
            clock,
            next_call: 1,
            replies: HashMap::new(),
            inbox: BTreeMap::new(),
            closed: HashMap::new(),
            store: Vec::new(),
            store_mode: StoreMode::Durable,
            held: Vec::new(),
            services: Vec::new(),
            cancelled: Vec::new(),
            events: Vec::new(),
        };
        sim.pump();
        sim
    }

    /// A presenter session with `n` players p1..pn in its lobby.
    pub fn presenter(n: usize) -> Self {
        let mut sim = Sim::new(config(Mode::Multiplayer, Some(HostAs::Presenter)));
        for i in 1..=n {
            sim.add(&format!("p{i}"));
        }
        sim
    }

    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn add(&mut self, id: &str) {
        let now = self.now();
        self.s
            .add_player(PlayerSpec::new(id, format!("Player {id}")), now)
            .expect("player added");
        self.pump();
    }

    /// Drains every output, acting as the server would.
    pub fn pump(&mut self) {
        while let Some(o) = self.s.poll_output() {
            match o {
                Output::Reply {
                    instance,
                    call,
                    result,
                } => {
                    assert!(
                        self.replies.insert((instance, call), result).is_none(),
                        "a call answered twice"
                    );
                }
                Output::Call { instance, call } => {
                    // Every call is valid on the wire: the library's own decoder takes it.
                    decode_plugin_call(call.method, &call.args)
                        .unwrap_or_else(|e| panic!("{} {}: {e}", call.method, call.args));
                    let args: Value = serde_json::from_str(&call.args).unwrap();
                    self.inbox
                        .entry(instance)
                        .or_default()
                        .push((call.method.to_owned(), args));
                }
                Output::Close { instance, reason } => {
                    self.closed.insert(instance, reason);
                }
                Output::Persist { id, record } => {
                    self.store.push((id, record));
                    match self.store_mode {
                        StoreMode::Durable => {
                            let now = self.now();
                            self.s.record_durable(id, Ok(()), now);
                        }
                        StoreMode::Hold => self.held.push(id),
                        StoreMode::Fail => {
                            let now = self.now();
                            self.s.record_durable(id, Err("disk full".into()), now);
                        }
                    }
                }
                Output::Service(req) => self.services.push(req),
                Output::CancelService { id } => self.cancelled.push(id),
                Output::Event(e) => self.events.push(e),
            }
        }
    }

    /// Acknowledges every held record.
    pub fn release(&mut self) {
        let now = self.now();
        for id in std::mem::take(&mut self.held) {
            self.s.record_durable(id, Ok(()), now);
        }
        self.pump();
    }

    /// A call; its reply if it came at once.
    pub fn call(
        &mut self,
        inst: InstanceId,
        method: &str,
        args: &str,
    ) -> Option<Result<Reply, ProtocolError>> {
        let id = self.start_call(inst, method, args);
        self.reply(inst, id)
    }

    /// A call whose answer may come later; returns its id.
    pub fn start_call(&mut self, inst: InstanceId, method: &str, args: &str) -> CallId {
        let id = self.next_call;
        self.next_call += 1;
        let now = self.now();
        self.s.handle_call(inst, id, method, args, now);
        self.pump();
        id
    }

    pub fn reply(
        &mut self,
        inst: InstanceId,
        call: CallId,
    ) -> Option<Result<Reply, ProtocolError>> {
        self.replies.remove(&(inst, call))
    }

    /// The call succeeds (at once or once the store made it durable).
    pub fn ok(&mut self, inst: InstanceId, method: &str, args: &str) -> Reply {
        match self.call(inst, method, args) {
            Some(Ok(r)) => r,
            other => panic!("{method} {args}: expected success, got {other:?}"),
        }
    }

    /// The call fails with `code`; returns its message.
    pub fn fails(
        &mut self,
        inst: InstanceId,
        method: &str,
        args: &str,
        code: ProtocolErrorCode,
    ) -> String {
        match self.call(inst, method, args) {
            Some(Err(e)) if e.code == code => e.message,
            other => panic!("{method}: expected {code}, got {other:?}"),
        }
    }

    pub fn attach(&mut self, inst: InstanceId, view: View, address: &str) {
        let now = self.now();
        self.s.attach(inst, view, address, now).expect("attached");
        self.pump();
    }

    pub fn hello(&mut self, inst: InstanceId) -> InitPayload {
        match self.ok(inst, "hello", &hello_args()) {
            Reply::Init(p) => *p,
            other => panic!("hello: {other:?}"),
        }
    }

    /// attach + hello + ready.
    pub fn join(&mut self, inst: InstanceId, view: View, address: &str) -> InitPayload {
        self.attach(inst, view, address);
        let init = self.hello(inst);
        self.ok(inst, "ready", "[]");
        init
    }

    pub fn detach(&mut self, inst: InstanceId) {
        let now = self.now();
        self.s.detach(inst, now);
        self.pump();
    }

    /// Moves the clock, running every timeout on the way at its time.
    pub fn advance(&mut self, ms: u64) {
        let target = self.now() + ms;
        for _ in 0..100_000 {
            match self.s.poll_timeout() {
                Some(t) if t <= target && t > self.now() => {
                    self.clock.set_ms(t);
                    self.s.handle_timeout(t);
                    self.pump();
                }
                Some(t) if t <= self.now() => {
                    let now = self.now();
                    self.s.handle_timeout(now);
                    self.pump();
                    if self.s.poll_timeout() == Some(t) {
                        break;
                    }
                }
                _ => break,
            }
        }
        self.clock.set_ms(target);
        self.s.handle_timeout(target);
        self.pump();
    }

    /// Takes what an instance received.
    pub fn take(&mut self, inst: InstanceId) -> Vec<(String, Value)> {
        self.inbox.remove(&inst).unwrap_or_default()
    }

    /// Takes the instance's received calls of one method, args only.
    pub fn take_method(&mut self, inst: InstanceId, method: &str) -> Vec<Value> {
        let all = self.take(inst);
        let (hit, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|(m, _)| m == method);
        if !rest.is_empty() {
            self.inbox.insert(inst, rest);
        }
        hit.into_iter().map(|(_, a)| a).collect()
    }

    pub fn records<F: Fn(&Record) -> bool>(&self, f: F) -> Vec<&Record> {
        self.store.iter().map(|(_, r)| r).filter(|r| f(r)).collect()
    }

    pub fn has_event<F: Fn(&SessionEvent) -> bool>(&self, f: F) -> bool {
        self.events.iter().any(f)
    }
}

pub fn send_args(to: Value, data: Value) -> String {
    json!([{"to": to, "data": data}]).to_string()
}
