//! Any host calls from any instances into a running Memizy session, mixed
//! with detaches, reconnects, time, store acknowledgements and service
//! answers: never a panic; every Plugin API call is valid on the wire;
//! every call is answered at most once, and every call of an instance that
//! is still attached is answered once the store and the services are done;
//! the outputs stay bounded.
//!
//! Input: lines `<op><digit><rest>`. Digit 0 is the board, 1..9 players.
//! ops: c call (`rest` = `method args`), h hello, r ready, t (re)attach,
//! d detach, a advance (`rest` ms), k ack a record, f fail a record,
//! s service result (`rest`), x service timeout, p pause/resume, n late
//! join, e close.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_memizy::calls::decode_plugin_call;
use hostwire_memizy::manifest::parse_plugin_manifest;
use hostwire_memizy::session::*;
use hostwire_memizy::{DisplaySet, HostAs, Mode, SessionEndReason, View};
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use std::collections::{HashMap, HashSet, VecDeque};

const PLUGIN: &str = "https://example.com/plugins/fuzz";
const HELLO: &str = r#"[{"protocol":"1.0","sdk":{"name":"s","version":"1"},"plugin":{"id":"https://example.com/plugins/fuzz","version":"1"},"features":[]}]"#;

struct Driver {
    s: Session,
    now: u64,
    replies: HashSet<(InstanceId, CallId)>,
    issued: Vec<(InstanceId, CallId)>,
    held: VecDeque<RecordId>,
    services: VecDeque<ServiceCallId>,
    current: HashMap<u8, InstanceId>,
    next_instance: InstanceId,
    next_call: CallId,
}

impl Driver {
    fn pump(&mut self) {
        while let Some(o) = self.s.poll_output() {
            match o {
                Output::Reply {
                    instance,
                    call,
                    result,
                } => {
                    assert!(self.replies.insert((instance, call)), "answered twice");
                    if let Err(e) = result {
                        assert!(
                            e.message.starts_with(&format!("[{}]", e.code)),
                            "{}",
                            e.message
                        );
                    }
                }
                Output::Call { call, .. } => {
                    if let Err(e) = decode_plugin_call(call.method, &call.args) {
                        panic!("{} {}: {e}", call.method, call.args);
                    }
                }
                Output::Persist { id, .. } => self.held.push_back(id),
                Output::Service(r) => self.services.push_back(r.id),
                _ => {}
            }
        }
        assert!(self.s.queued_outputs() == 0);
    }

    fn address(d: u8) -> (View, String) {
        if d == 0 {
            (View::Board, "board".into())
        } else {
            (View::Controller, format!("p{d}"))
        }
    }

    fn attach(&mut self, d: u8) -> Option<InstanceId> {
        let id = self.next_instance;
        self.next_instance += 1;
        let (view, addr) = Self::address(d);
        self.s.attach(id, view, &addr, self.now).ok()?;
        self.current.insert(d, id);
        self.pump();
        Some(id)
    }

    fn call(&mut self, inst: InstanceId, method: &str, args: &str) {
        let c = self.next_call;
        self.next_call += 1;
        self.issued.push((inst, c));
        self.s.handle_call(inst, c, method, args, self.now);
        self.pump();
    }

    fn advance(&mut self, ms: u64) {
        let target = self.now + ms;
        for _ in 0..1_000 {
            match self.s.poll_timeout() {
                Some(t) if t <= target => {
                    self.now = self.now.max(t);
                    self.s.handle_timeout(self.now);
                    self.pump();
                    if self.s.poll_timeout() == Some(t) && t <= self.now {
                        break;
                    }
                }
                _ => break,
            }
        }
        self.now = target;
        self.s.handle_timeout(self.now);
        self.pump();
    }
}

fn session() -> Driver {
    let manifest = parse_plugin_manifest(json!({
        "version": "1.0", "id": PLUGIN, "appName": "Fuzz",
        "capabilities": {"types": ["mcq-single"]},
        "appSpecific": {"memizy": {
            "protocol": "1.0",
            "modes": {"multiplayer": {"players": {"min": 1, "max": 20}, "hostAs": ["presenter"]}},
            "settings": [{"id": "n", "type": "number", "label": "N", "default": 3, "min": 1, "max": 9}],
            "services": ["chess.puzzles"]
        }}
    }))
    .expect("manifest");
    let set = DisplaySet {
        meta: json!({"title": "t"}),
        items: vec![
            json!({"id": "q1", "type": "mcq-single", "options": [{"id": "a"}, {"id": "b"}], "correctId": "a"}),
        ],
    };
    let mut cfg = SessionConfig::new(
        "fz",
        Mode::Multiplayer,
        Some(HostAs::Presenter),
        PLUGIN,
        manifest.runtime,
        set,
    );
    cfg.services = ServiceRegistry::new().offer("chess.puzzles", ServiceSpec { timeout_ms: 1_000 });
    cfg.assets.set.insert("a.png".into(), 10);
    let now = 1_000_000;
    let mut d = Driver {
        s: Session::new(cfg, now).expect("session"),
        now,
        replies: HashSet::new(),
        issued: Vec::new(),
        held: VecDeque::new(),
        services: VecDeque::new(),
        current: HashMap::new(),
        next_instance: 1,
        next_call: 1,
    };
    for i in 1..=8 {
        d.s.add_player(PlayerSpec::new(format!("p{i}"), format!("P{i}")), now)
            .expect("player");
    }
    d.s.start_game(now).expect("start");
    d.pump();
    for digit in 0..=8u8 {
        let id = d.attach(digit).expect("attach");
        d.call(id, "hello", HELLO);
        d.call(id, "ready", "[]");
    }
    d.advance(DEFAULT_COUNTDOWN_MS);
    d
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut d = session();
    for line in text.split('\n').take(2_000) {
        let mut chars = line.chars();
        let (Some(op), Some(digit)) = (chars.next(), chars.next()) else {
            continue;
        };
        let digit = digit.to_digit(10).unwrap_or(1) as u8;
        let rest = chars.as_str();
        let inst = d.current.get(&digit).copied().unwrap_or(0);
        match op {
            'c' => {
                let (method, args) = rest.split_once(' ').unwrap_or((rest, "[]"));
                d.call(inst, method, args);
            }
            'h' => d.call(inst, "hello", HELLO),
            'r' => d.call(inst, "ready", "[]"),
            't' => {
                if let Some(id) = d.attach(digit) {
                    d.call(id, "hello", HELLO);
                }
            }
            'd' => {
                d.s.detach(inst, d.now);
                d.pump();
            }
            'a' => d.advance(rest.trim().parse::<u64>().unwrap_or(100) % 20_000),
            'k' | 'f' => {
                if let Some(id) = d.held.pop_front() {
                    let outcome = if op == 'k' {
                        Ok(())
                    } else {
                        Err(rest.to_owned())
                    };
                    d.s.record_durable(id, outcome, d.now);
                    d.pump();
                }
            }
            's' => {
                if let Some(id) = d.services.pop_front() {
                    d.s.service_done(id, Ok(rest), d.now);
                    d.pump();
                }
            }
            'x' => {
                if let Some(id) = d.services.pop_front() {
                    d.s.service_timed_out(id, d.now);
                    d.pump();
                }
            }
            'p' => {
                if d.s.pause(d.now).is_err() {
                    let _ = d.s.resume(d.now);
                }
                d.pump();
            }
            'n' => {
                let id = format!("late{}", d.next_instance);
                if d.s
                    .add_player(PlayerSpec::new(id.clone(), "Late"), d.now)
                    .is_ok()
                {
                    let i = d.next_instance;
                    d.next_instance += 1;
                    if d.s.attach(i, View::Controller, &id, d.now).is_ok() {
                        d.pump();
                        d.call(i, "hello", HELLO);
                    }
                }
                d.pump();
            }
            'e' => {
                d.s.close(SessionEndReason::from_wire(rest), d.now);
                d.pump();
            }
            _ => {}
        }
    }
    // The store and the services finish their work; time passes.
    while let Some(id) = d.held.pop_front() {
        d.s.record_durable(id, Ok(()), d.now);
        d.pump();
        if d.held.len() > 100_000 {
            break;
        }
    }
    d.advance(1_500);
    while let Some(id) = d.held.pop_front() {
        d.s.record_durable(id, Ok(()), d.now);
        d.pump();
    }
    for (inst, call) in std::mem::take(&mut d.issued) {
        if d.s.is_attached(inst) {
            assert!(
                d.replies.contains(&(inst, call)),
                "call {call} of instance {inst} never answered"
            );
        }
    }
});
