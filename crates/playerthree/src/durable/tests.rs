//! A match driven in memory as the server drives it: every write held
//! until the test answers it (durable or refused), outputs carried out as
//! frames read back as JSON, time moved by hand.

use super::*;
use crate::demo::Ridge;
use crate::host::{CloseReason, MatchConfig};
use serde_json::{json, Value};
use std::collections::HashMap;

const T0: u64 = 1_000_000;
/// Ridge finishes by its 60th tick (6 s here): before the finished
/// match's time ends, an unjoined one has expired and an idle presence
/// has ended.
const TIMES: MatchTimes = MatchTimes {
    tick_ms: 100,
    finished_ttl_ms: 3_600_000,
    unjoined_ttl_ms: 5_000,
    mcp_live_grace_ms: 30_000,
};

struct Sim {
    d: DurableMatch<Ridge, u32>,
    now: u64,
    /// Writes handed out and not answered yet, oldest first.
    unanswered: VecDeque<PendingWrite>,
    /// What the store holds, in the order it became durable.
    stored: Vec<Change>,
    frames: HashMap<ConnId, Vec<Value>>,
    closes: Vec<(ConnId, CloseReason)>,
    /// Every answer, with the tag of its command.
    answers: Vec<(Option<u32>, Answer)>,
    /// Every other output.
    notes: Vec<MatchOutput>,
    next_tag: u32,
}

fn principal(kind: &str, role: &str, team: &str) -> Principal {
    let (r#match, role, team) = ("m1".to_owned(), role.to_owned(), team.to_owned());
    match kind {
        "team" => Principal::Team { r#match, team },
        _ => Principal::Seat {
            r#match,
            role,
            team,
        },
    }
}

impl Sim {
    fn new(config: MatchConfig) -> Sim {
        let mut m = Match::new("m1", Ridge::new(), config, T0);
        // The creator writes a new match's records.
        m.take_outputs();
        let mut sim = Sim {
            d: DurableMatch::new(m, TIMES, T0),
            now: T0,
            unanswered: VecDeque::new(),
            stored: Vec::new(),
            frames: HashMap::new(),
            closes: Vec::new(),
            answers: Vec::new(),
            notes: Vec::new(),
            next_tag: 1,
        };
        sim.pump();
        sim
    }

    fn pump(&mut self) {
        while let Some(w) = self.d.poll_write() {
            self.unanswered.push_back(w);
        }
        while let Some(done) = self.d.poll_output() {
            for o in done.outputs {
                match o {
                    MatchOutput::Host(Output::Send { conn, text }) => {
                        let v = serde_json::from_str(&text).unwrap();
                        self.frames.entry(conn).or_default().push(v);
                    }
                    MatchOutput::Host(Output::Close { conn, reason }) => {
                        self.closes.push((conn, reason))
                    }
                    o => self.notes.push(o),
                }
            }
            self.answers.push((done.tag, done.answer));
        }
    }

    /// Handles a command as the driver does (then what time has come);
    /// its tag.
    fn cmd(&mut self, cmd: MatchCommand) -> u32 {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.d.handle(cmd, Some(tag), self.now);
        self.pump();
        self.due();
        tag
    }

    fn due(&mut self) {
        while self.d.poll_timeout().is_some_and(|t| t <= self.now) {
            self.d.handle_timeout(self.now);
            self.pump();
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        self.due();
    }

    fn ack_next(&mut self, durable: bool) {
        let w = self.unanswered.pop_front().expect("a write in flight");
        if durable {
            self.stored.extend(w.changes);
        }
        self.d.ack(w.id, durable, self.now);
        self.pump();
        self.due();
    }

    fn ack_all(&mut self) {
        while !self.unanswered.is_empty() {
            self.ack_next(true);
        }
    }

    fn answer(&self, tag: u32) -> Option<&Answer> {
        self.answers
            .iter()
            .find(|(t, _)| *t == Some(tag))
            .map(|(_, a)| a)
    }

    /// The operator mints a token (stored at once).
    fn mint(&mut self, p: Principal) -> String {
        let tag = self.cmd(MatchCommand::Mint { principal: p });
        self.ack_all();
        match self.answer(tag) {
            Some(Answer::Minted(Ok(t))) => t.clone(),
            a => panic!("not minted: {a:?}"),
        }
    }

    fn join(&mut self, conn: ConnId, p: Principal) -> String {
        let token = self.mint(p);
        let tag = self.cmd(MatchCommand::Join {
            conn,
            token: token.clone(),
        });
        assert!(matches!(self.answer(tag), Some(Answer::Joined(_, Ok(_)))));
        token
    }

    fn send(&mut self, conn: ConnId, msg: Value) {
        let text = msg.to_string();
        self.cmd(MatchCommand::Text { conn, text });
    }

    /// The `result`s `conn` got, taken.
    fn results(&mut self, conn: ConnId) -> Vec<Value> {
        let frames = self.frames.remove(&conn).unwrap_or_default();
        frames.into_iter().filter(|v| v["op"] == "result").collect()
    }

    fn frames_of(&mut self, conn: ConnId, op: &str) -> Vec<Value> {
        let frames = self.frames.remove(&conn).unwrap_or_default();
        frames.into_iter().filter(|v| v["op"] == op).collect()
    }
}

fn mandate(seq: u64, goal: &str) -> Value {
    json!({"op": "mandate", "seq": seq, "role": "red-scout", "mandate": {"goal": goal}})
}

#[test]
fn an_owners_change_is_told_once_durable_and_the_match_waits_for_it() {
    let mut s = Sim::new(MatchConfig::default());
    s.join(1, principal("team", "", "red"));
    s.frames.clear();
    s.send(1, mandate(1, "hold"));
    // Nothing told yet: not the reply, not the seats it changed.
    assert_eq!(s.frames.get(&1), None);
    assert_eq!(s.unanswered.len(), 1);
    assert!(!s.d.accepts(), "commands wait behind the change");
    assert_eq!(s.d.poll_timeout(), None, "time waits for the store");
    // A command that came anyway runs after it.
    s.d.handle(
        MatchCommand::Text {
            conn: 1,
            text: mandate(2, "push").to_string(),
        },
        None,
        s.now,
    );
    s.pump();
    assert_eq!(s.frames.get(&1), None);
    s.ack_next(true);
    let seats = s.frames[&1].iter().position(|v| v["op"] == "seats");
    let results = s.results(1);
    assert!(seats.is_some(), "the seats it changed are told");
    assert_eq!(results.len(), 1, "the second change waits in turn");
    assert_eq!(results[0]["seq"], 1);
    assert_eq!(results[0]["data"]["policyVersion"], 1);
    s.ack_next(true);
    let results = s.results(1);
    assert_eq!(results[0]["seq"], 2);
    assert_eq!(results[0]["data"]["policyVersion"], 2);
    assert!(s.d.accepts());
    assert!(s.d.poll_timeout().is_some());
}

#[test]
fn a_refused_change_is_taken_back_and_its_asker_told_internal() {
    let mut s = Sim::new(MatchConfig::default());
    s.join(1, principal("team", "", "red"));
    s.frames.clear();
    s.send(1, mandate(1, "lost"));
    s.ack_next(false);
    let frames = s.frames.remove(&1).unwrap();
    // What told of the change is dropped; the asker hears why.
    assert!(frames.iter().all(|v| v["op"] != "seats"), "{frames:?}");
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0]["code"], "internal");
    assert_eq!(
        frames[0]["message"],
        "store: the policy change was not stored"
    );
    // The policy is as it was: the next change is version 1 again.
    s.send(1, mandate(2, "kept"));
    s.ack_next(true);
    assert_eq!(s.results(1)[0]["data"]["policyVersion"], 1);
    assert!(s.d.accepts());
}

#[test]
fn a_refused_mint_is_refused_from_then_on() {
    let mut s = Sim::new(MatchConfig::default());
    s.join(1, principal("team", "", "red"));
    s.frames.clear();
    s.send(1, json!({"op": "mint", "seq": 1, "role": "red-scout"}));
    s.ack_next(false);
    let r = s.results(1);
    assert_eq!(r[0]["code"], "internal", "{r:?}");
    // The token's revocation is written behind.
    let w = s.unanswered.pop_front().unwrap();
    assert!(
        matches!(&w.changes[..], [Change::Record(Record::Revoked { .. })]),
        "{w:?}"
    );
}

#[test]
fn operator_answers_wait_for_their_writes_while_the_match_goes_on() {
    let mut s = Sim::new(MatchConfig::default());
    let a = s.cmd(MatchCommand::Mint {
        principal: principal("team", "", "red"),
    });
    let card = s.cmd(MatchCommand::SetCard {
        role: "red-scout".into(),
        card: None,
    });
    let b = s.cmd(MatchCommand::Mint {
        principal: principal("team", "", "blue"),
    });
    // Three writes in flight, nothing answered, the match still going.
    assert_eq!(s.unanswered.len(), 3);
    assert_eq!(s.answer(a), None);
    assert!(s.d.accepts());
    s.advance(TIMES.tick_ms);
    assert_eq!(s.d.game_match().game().tick(), 1, "time goes on");
    s.ack_next(true);
    assert!(matches!(s.answer(a), Some(Answer::Minted(Ok(_)))));
    assert_eq!(s.answer(card), None);
    s.ack_next(false);
    let refused = ProtocolError::new(ServerErrorCode::Internal, "store: the card was not stored");
    assert_eq!(s.answer(card), Some(&Answer::Card(Err(refused))));
    s.ack_next(false);
    match s.answer(b) {
        Some(Answer::Minted(Err(e))) => assert_eq!(e.message, "store: the token was not stored"),
        a => panic!("{a:?}"),
    }
    // Every token minted is noted for its lookup, stored or not.
    let minted = s
        .notes
        .iter()
        .filter(|o| matches!(o, MatchOutput::Minted(_)))
        .count();
    assert_eq!(minted, 2);
}

#[test]
fn ticks_come_at_their_time_and_a_jump_is_caught_up_then_skipped() {
    let mut s = Sim::new(MatchConfig::default());
    s.join(1, principal("team", "", "red"));
    s.frames.clear();
    assert_eq!(s.d.poll_timeout(), Some(T0 + TIMES.tick_ms));
    s.advance(TIMES.tick_ms - 1);
    assert_eq!(s.d.game_match().game().tick(), 0);
    s.advance(1);
    assert_eq!(s.d.game_match().game().tick(), 1);
    assert_eq!(s.frames_of(1, "view").len(), 1, "one view a tick");
    // The clock jumps: the ticks missed are caught up at once.
    s.advance(30 * TIMES.tick_ms);
    assert_eq!(s.d.game_match().game().tick(), 31);
    // It jumps far (past Ridge's end): at most MAX_CATCH_UP_TICKS run,
    // the rest are skipped, and the next is one tick from now.
    s.advance((10 + MAX_CATCH_UP_TICKS) * TIMES.tick_ms);
    assert_eq!(s.d.poll_timeout(), Some(s.now + TIMES.tick_ms));
    // Ticks' records are written behind.
    assert!(!s.unanswered.is_empty());
    assert!(s.d.accepts());
}

#[test]
fn a_timer_handled_early_is_not_asked_for_at_the_same_time_again() {
    let mut s = Sim::new(MatchConfig::default());
    // A driver whose clock lags its timer: the time it handled is done.
    s.d.handle_timeout(T0);
    assert!(s.d.poll_timeout().is_some_and(|t| t > T0));
}

#[test]
fn a_match_nobody_joins_expires_with_its_removal_as_its_last_write() {
    let mut s = Sim::new(MatchConfig::default());
    s.ack_all();
    s.advance(TIMES.unjoined_ttl_ms - 1);
    assert!(!s.d.is_expired());
    s.ack_all();
    s.advance(1);
    assert!(s.d.is_expired());
    assert!(s
        .notes
        .iter()
        .any(|o| matches!(o, MatchOutput::Expired { joined: false })));
    let last = s.unanswered.back().unwrap();
    assert_eq!(last.changes, [Change::RemoveMatch]);
    // Nothing more: no timer, no command, no write.
    assert_eq!(s.d.poll_timeout(), None);
    let writes = s.unanswered.len();
    let tag = s.cmd(MatchCommand::Revoke { token: "x".into() });
    assert_eq!(s.answer(tag), None);
    assert_eq!(s.unanswered.len(), writes);
}

#[test]
fn a_joined_match_expires_only_after_it_finished() {
    let mut s = Sim::new(MatchConfig::default());
    s.join(1, principal("team", "", "red"));
    s.advance(TIMES.unjoined_ttl_ms);
    s.ack_all();
    assert!(!s.d.is_expired());
    // Ridge ends by MAX_TICKS at the latest.
    while s.d.game_match().finished_at().is_none() {
        s.advance(TIMES.tick_ms);
        s.ack_all();
    }
    let finished = s.d.game_match().finished_at().unwrap();
    s.now = finished + TIMES.finished_ttl_ms - 1;
    s.due();
    assert!(!s.d.is_expired());
    s.advance(1);
    assert!(s.d.is_expired());
    assert!(s
        .notes
        .iter()
        .any(|o| matches!(o, MatchOutput::Expired { joined: true })));
}

#[test]
fn an_mcp_presence_outlasts_its_last_session_by_the_grace() {
    let mut s = Sim::new(MatchConfig::default());
    s.join(1, principal("team", "", "red"));
    let seat = s.mint(principal("seat", "red-scout", "red"));
    let live = |s: &mut Sim| -> Option<bool> {
        let seats = s.frames_of(1, "seats");
        let last = seats.last()?;
        let scout = last["seats"]
            .as_array()?
            .iter()
            .find(|x| x["role"] == "red-scout")?;
        scout["live"].as_bool()
    };
    s.frames.clear();
    for conn in [10, 11] {
        let tag = s.cmd(MatchCommand::McpJoin {
            conn,
            token: seat.clone(),
        });
        assert!(matches!(s.answer(tag), Some(Answer::McpJoined(_, Ok(_)))));
    }
    assert_eq!(live(&mut s), Some(true), "one presence for both sessions");
    s.cmd(MatchCommand::Leave { conn: 10 });
    s.cmd(MatchCommand::Leave { conn: 11 });
    assert_eq!(live(&mut s), None, "still live within the grace");
    s.advance(TIMES.mcp_live_grace_ms - 1);
    assert_eq!(live(&mut s), None);
    s.advance(1);
    assert_eq!(live(&mut s), Some(false));
}

#[test]
fn tells_go_to_a_subscribed_session_one_push_at_a_time() {
    let config = MatchConfig {
        chat: true,
        ..MatchConfig::default()
    };
    let mut s = Sim::new(config);
    s.join(1, principal("team", "", "red"));
    let seat = s.mint(principal("seat", "red-scout", "red"));
    s.send(
        1,
        json!({"op":"controller","seq":1,"role":"red-scout","controller":{"kind":"agent"}}),
    );
    s.ack_all();
    assert!(s
        .notes
        .iter()
        .any(|o| matches!(o, MatchOutput::ControllerChanged(r) if r == "red-scout")));
    s.cmd(MatchCommand::McpJoin {
        conn: 10,
        token: seat,
    });
    s.cmd(MatchCommand::McpSubscribeInbox {
        conn: 10,
        role: "red-scout".into(),
        on: true,
    });
    let tell =
        |seq: u64, text: &str| json!({"op":"tell","seq":seq,"roles":["red-scout"],"text":text});
    let pushes = |s: &mut Sim| -> Vec<Vec<String>> {
        let notes = std::mem::take(&mut s.notes);
        notes
            .into_iter()
            .filter_map(|o| match o {
                MatchOutput::PushTells { conns, tells } => {
                    assert_eq!(conns, [10]);
                    Some(tells.iter().map(|t| t.text.clone()).collect())
                }
                _ => None,
            })
            .collect()
    };
    s.notes.clear();
    s.send(1, tell(2, "one"));
    s.ack_all();
    assert_eq!(pushes(&mut s), [vec!["one".to_owned()]]);
    // While that push is in flight, tells wait in the inbox.
    s.send(1, tell(3, "two"));
    s.send(1, tell(4, "three"));
    s.ack_all();
    assert!(pushes(&mut s).is_empty());
    s.cmd(MatchCommand::McpPushed { conn: 10 });
    assert_eq!(pushes(&mut s), [vec!["two".to_owned(), "three".to_owned()]]);
}

#[test]
fn a_revoked_seat_ends_every_session_acting_through_it() {
    let mut s = Sim::new(MatchConfig::default());
    let seat = s.mint(principal("seat", "red-scout", "red"));
    for conn in [10, 11] {
        s.cmd(MatchCommand::McpJoin {
            conn,
            token: seat.clone(),
        });
    }
    s.cmd(MatchCommand::Revoke { token: seat });
    let mut ended: Vec<ConnId> = s
        .notes
        .iter()
        .filter_map(|o| match o {
            MatchOutput::SessionEnded(c) => Some(*c),
            _ => None,
        })
        .collect();
    ended.sort_unstable();
    assert_eq!(ended, [10, 11]);
    assert_eq!(s.closes, [(10, CloseReason::Revoked)]);
}

#[test]
fn an_observer_frame_is_released_at_its_release_at_between_ticks() {
    let mut s = Sim::new(MatchConfig::default());
    // A delay that is not a whole number of ticks: the frame recorded at
    // creation (T0) is due between the 2nd and 3rd ticks.
    let delay = 250;
    let grant = json!({"kind": "team", "team": "red", "delayMs": delay});
    let token = s.mint(Principal::Observer {
        r#match: "m1".into(),
        grant: serde_json::from_value(grant).unwrap(),
    });
    s.cmd(MatchCommand::Join { conn: 5, token });
    s.send(5, json!({"op": "observer", "perspective": "red"}));
    s.frames.clear();
    s.advance(2 * TIMES.tick_ms);
    assert!(s.frames_of(5, "observer").is_empty(), "released early");
    // The match asks for its timer at the release, not at the next tick.
    assert_eq!(s.d.poll_timeout(), Some(T0 + delay));
    s.advance(delay - 2 * TIMES.tick_ms - 1);
    assert!(s.frames_of(5, "observer").is_empty());
    s.advance(1);
    let frames = s.frames_of(5, "observer");
    assert!(!frames.is_empty(), "nothing released at releaseAt");
    for f in &frames {
        assert_eq!(f["frame"]["releaseAt"], T0 + delay, "{f}");
    }
}
