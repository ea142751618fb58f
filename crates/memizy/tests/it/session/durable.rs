//! The durability rules of a hosted session ([`DurableSession`]), in memory
//! on the manual clock: what waits for a write's acknowledgement, what a
//! refused write answers, several writes in flight, expiry.

use crate::support::*;
use hostwire_core::Clock;
use hostwire_memizy::session::*;
use hostwire_memizy::{ProtocolError, ProtocolErrorCode as C, SessionEndReason, View};

const BOARD: InstanceId = 100;
const ANSWER: &str = r#"[{"itemId": "q1", "isCorrect": true}]"#;
const EXPIRY: Expiry = Expiry {
    lobby_ttl_ms: 60_000,
    idle_ttl_ms: 30_000,
};

type Outs = Vec<SessionOutput<&'static str>>;

/// A presenter game with one player, running: board 100, controller 1.
fn running() -> (DurableSession<&'static str>, u64) {
    let mut sim = Sim::presenter(1);
    let now = sim.now();
    sim.s.start_game(now).unwrap();
    sim.pump();
    sim.join(BOARD, View::Board, "board");
    sim.join(1, View::Controller, "p1");
    sim.advance(DEFAULT_COUNTDOWN_MS);
    assert_eq!(sim.s.phase(), Phase::Running);
    let Sim { s, clock, .. } = sim;
    let now = clock.now_ms();
    (DurableSession::new(s, EXPIRY, now), now)
}

fn outputs(d: &mut DurableSession<&'static str>) -> Outs {
    std::iter::from_fn(|| d.poll_output()).collect()
}

fn reply_of(outs: &Outs, inst: InstanceId, call: CallId) -> Option<&Result<Reply, ProtocolError>> {
    outs.iter().find_map(|o| match o {
        SessionOutput::Engine(Output::Reply {
            instance,
            call: c,
            result,
        }) if (*instance, *c) == (inst, call) => Some(result),
        _ => None,
    })
}

fn kept(outs: &Outs) -> Vec<(&'static str, bool)> {
    outs.iter()
        .filter_map(|o| match o {
            SessionOutput::Kept { tag, durable } => Some((*tag, *durable)),
            _ => None,
        })
        .collect()
}

fn call(
    d: &mut DurableSession<&'static str>,
    inst: InstanceId,
    id: CallId,
    method: &str,
    args: &str,
    now: u64,
) {
    d.act(now, |s| s.handle_call(inst, id, method, args, now));
}

#[test]
fn a_record_is_answered_only_once_durable_and_a_refused_one_is_an_internal_error() {
    let (mut d, now) = running();
    outputs(&mut d);
    call(&mut d, 1, 10, "recordAnswer", ANSWER, now);
    assert!(
        reply_of(&outputs(&mut d), 1, 10).is_none(),
        "answered before durable"
    );
    let w = d.poll_write().expect("the answer is written");
    assert!(matches!(
        w.records.as_slice(),
        [SessionRecord::Engine {
            record: Record::Answer(_),
            ..
        }]
    ));
    assert!(d.poll_write().is_none());
    d.ack(w.id, true, now);
    assert!(matches!(
        reply_of(&outputs(&mut d), 1, 10),
        Some(Ok(Reply::Done))
    ));

    call(&mut d, 1, 11, "recordAnswer", ANSWER, now + 5_000);
    let w = d.poll_write().expect("the answer is written");
    d.ack(w.id, false, now + 5_000);
    match reply_of(&outputs(&mut d), 1, 11) {
        Some(Err(e)) => {
            assert_eq!(e.code, C::InternalError);
            assert!(e.message.contains("could not be stored"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn several_writes_in_flight_are_answered_by_id_in_any_order() {
    let (mut d, now) = running();
    outputs(&mut d);
    d.keep_then("a", now);
    d.keep_then("b", now);
    call(&mut d, 1, 12, "recordAnswer", ANSWER, now);
    let ws: Vec<PendingWrite> = std::iter::from_fn(|| d.poll_write()).collect();
    assert_eq!(ws.len(), 3);
    assert!(matches!(ws[0].records[..], [SessionRecord::Kept { at_ms }] if at_ms == now));
    assert!(
        kept(&outputs(&mut d)).is_empty(),
        "nothing is kept before its answer"
    );
    d.ack(ws[1].id, false, now);
    assert_eq!(kept(&outputs(&mut d)), [("b", false)]);
    d.ack(ws[2].id, true, now);
    assert!(matches!(
        reply_of(&outputs(&mut d), 1, 12),
        Some(Ok(Reply::Done))
    ));
    d.ack(ws[0].id, true, now);
    assert_eq!(kept(&outputs(&mut d)), [("a", true)]);
    // An answer that comes twice (or for no write) changes nothing.
    d.ack(ws[0].id, true, now);
    assert!(outputs(&mut d).is_empty());
}

#[test]
fn a_saved_game_is_answered_once_durable_and_holds_off_expiry() {
    let (mut d, now) = running();
    d.act(now, |s| {
        s.detach(1, now);
        s.detach(BOARD, now);
    });
    outputs(&mut d);
    assert_eq!(d.expires_at(), Some(now + EXPIRY.idle_ttl_ms));
    d.save("save", now).expect("a running game can be saved");
    assert_eq!(d.expires_at(), None, "a save waits: the session stays");
    let w = d.poll_write().expect("the saved game is written");
    assert!(matches!(
        w.records.as_slice(),
        [SessionRecord::Engine {
            record: Record::SavedGame(_),
            ..
        }]
    ));
    assert!(!outputs(&mut d)
        .iter()
        .any(|o| matches!(o, SessionOutput::Saved { .. })));
    d.ack(w.id, false, now);
    let outs = outputs(&mut d);
    assert!(matches!(
        outs.as_slice(),
        [
            SessionOutput::Saved {
                tag: "save",
                outcome: Err(_),
                ..
            },
            ..
        ]
    ));
    assert_eq!(d.expires_at(), Some(now + EXPIRY.idle_ttl_ms));
}

#[test]
fn a_game_not_started_cannot_be_saved() {
    let sim = Sim::presenter(1);
    let Sim { s, clock, .. } = sim;
    let mut d: DurableSession<&str> = DurableSession::new(s, EXPIRY, clock.now_ms());
    assert_eq!(d.save("save", clock.now_ms()), Err("save"));
    assert!(d.poll_write().is_none());
}

#[test]
fn an_expired_session_writes_its_removal_and_takes_nothing_more_until_answered() {
    let Sim { s, clock, .. } = Sim::presenter(1);
    let t0 = clock.now_ms();
    let mut d: DurableSession<&str> = DurableSession::new(s, EXPIRY, t0);
    outputs(&mut d);
    // In its lobby: the lobby's time to live from its start, then idle's
    // from its last use, whichever is first.
    assert_eq!(d.poll_timeout(), Some(t0 + EXPIRY.idle_ttl_ms));
    d.used(t0 + 40_000);
    assert_eq!(d.poll_timeout(), Some(t0 + EXPIRY.lobby_ttl_ms));
    d.handle_timeout(t0 + EXPIRY.lobby_ttl_ms - 1);
    assert!(outputs(&mut d).is_empty() && d.accepts());
    d.handle_timeout(t0 + EXPIRY.lobby_ttl_ms);
    assert!(matches!(
        outputs(&mut d).as_slice(),
        [SessionOutput::Expiring]
    ));
    assert!(!d.accepts(), "no command while its removal is written");
    assert_eq!(d.poll_timeout(), None);
    let w = d.poll_write().expect("the removal is written");
    assert_eq!(w.records, [SessionRecord::Removed]);
    // Nothing more is kept once removed.
    d.keep_then("late", t0 + EXPIRY.lobby_ttl_ms);
    assert_eq!(kept(&outputs(&mut d)), [("late", false)]);
    d.write_behind(SessionRecord::Recording {
        head: Some("{}".into()),
        first_seq: 0,
        entries: vec![],
        at_ms: 0,
    });
    assert!(d.poll_write().is_none());
    d.ack(w.id, true, t0 + EXPIRY.lobby_ttl_ms);
    assert!(matches!(
        outputs(&mut d).as_slice(),
        [SessionOutput::Expired { durable: true }]
    ));
}

#[test]
fn an_attached_session_does_not_idle_out_and_a_closed_one_is_done_once_answered() {
    let (mut d, now) = running();
    outputs(&mut d);
    assert_eq!(
        d.expires_at(),
        None,
        "instances are attached and it is not in its lobby"
    );
    d.keep_then("before the end", now);
    d.act(now, |s| s.close(SessionEndReason::Closed, now));
    let outs = outputs(&mut d);
    assert!(outs
        .iter()
        .any(|o| matches!(o, SessionOutput::Engine(Output::Close { .. }))));
    assert!(!d.is_done(), "an answer waits for the store");
    let w = d.poll_write().unwrap();
    d.ack(w.id, true, now);
    assert_eq!(kept(&outputs(&mut d)), [("before the end", true)]);
    assert!(d.is_done());
}

#[test]
fn a_recording_written_behind_holds_nothing_and_is_answered_to_no_one() {
    let (mut d, now) = running();
    d.act(now, |s| s.close(SessionEndReason::Closed, now));
    outputs(&mut d);
    d.write_behind(SessionRecord::Recording {
        head: Some("{}".into()),
        first_seq: 0,
        entries: vec!["{}".into()],
        at_ms: now,
    });
    assert!(d.is_done(), "nothing waits for a write behind");
    let w = d.poll_write().unwrap();
    d.ack(w.id, false, now);
    assert!(outputs(&mut d).is_empty());
}
