//! Delayed observer streams.
//!
//! The match records the projection of every perspective at each recorded
//! tick. An observer receives a frame only once `releaseAt` (= the time it
//! was recorded + its grant's `delayMs`) has come; the server chooses the
//! projection (from the grant) and the watermark (from its clock), never
//! the client. A frame carries the whole projection (`world`: on join,
//! perspective change, resume beyond the batch bound, resync) or a delta
//! from the frame just before it. Frames are built once per (perspective,
//! delay, sequence, kind), serialized once, and shared by every observer at
//! that cursor.
//!
//! Commentary (what agents disclosed) rides the first frame recorded after
//! it, so it is released at that frame's `releaseAt`, never before. A delta
//! frame carries the commentary recorded with it; a keyframe carries the
//! last [`MAX_KEYFRAME_COMMENTARY`] entries of its perspective up to it, so
//! an observer that skipped frames (a resume past the batch bound, a
//! restart) still reads recent commentary; ids tell it what it already has.

use crate::protocol::{
    ObserverAgentCard, ObserverCommentary, ObserverFrame, ObserverGrant, ObserverMessage,
    ObserverRequest, ObserverState, Outcome, ProtocolError, ServerErrorCode, ServerMsg,
};
use hostwire_core::delta::{apply, diff, Json, JsonDelta};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

/// The perspective of an omniscient grant that sees every team at once.
pub const OMNISCIENT: &str = "omniscient";
/// The batch bound: an observer more than this many frames behind gets a
/// keyframe of the newest released frame instead of the deltas between.
pub const OBSERVER_BATCH_MAX: u64 = 32;
/// Frames kept per perspective; when full, the oldest go first. An
/// observer whose watermark is older than every kept frame waits in
/// `buffering` (it never receives a frame early).
pub const MAX_OBSERVER_HISTORY: usize = 8192;
/// The longest delay a grant may ask for.
pub const MAX_OBSERVER_DELAY_MS: u64 = 3_600_000;
/// Commentary entries a keyframe carries: the newest of its perspective up
/// to it (those of skipped frames included, older ones dropped).
pub const MAX_KEYFRAME_COMMENTARY: usize = 32;

#[derive(Debug)]
struct Recorded {
    sequence: u64,
    tick: u64,
    recorded_at: u64,
    world: Json,
    /// From `sequence - 1`; `None` when the frame must go as a keyframe
    /// (the first one, and after a resync).
    delta: Option<JsonDelta>,
    outcomes: Option<Arc<BTreeMap<String, Outcome>>>,
    /// Disclosed since the frame before (what a delta frame carries).
    commentary: Vec<Arc<ObserverCommentary>>,
    /// The newest entries up to this frame (what a keyframe carries);
    /// shared by consecutive frames until new commentary comes.
    recent: Arc<Vec<Arc<ObserverCommentary>>>,
}

/// A frame as sent: the message and its text, shared.
#[derive(Debug)]
pub struct ObserverOut {
    pub frame: Arc<ObserverFrame>,
    pub text: Arc<str>,
}

#[derive(Debug, Default)]
struct PerspectiveLog {
    frames: VecDeque<Recorded>,
    next_sequence: u64,
    resync: bool,
    built: HashMap<(u64, u64, bool), Arc<ObserverOut>>,
    /// The newest commentary entries of this perspective, oldest first.
    recent: Arc<Vec<Arc<ObserverCommentary>>>,
}

/// What the match records for observers, by perspective.
#[derive(Debug, Default)]
pub struct ObserverFeed {
    logs: BTreeMap<String, PerspectiveLog>,
    /// The longest delay of any grant: frames are kept at least that long
    /// (and the last `OBSERVER_BATCH_MAX + 1` always, for resuming observers).
    retain_ms: u64,
    /// The match is over: the final frame of each perspective is the last.
    closed: bool,
    agent_cards: Arc<Vec<ObserverAgentCard>>,
    /// The last sequence of every perspective before a restart.
    base_sequence: u64,
}

impl ObserverFeed {
    pub fn new() -> Self {
        Self::default()
    }

    /// After a restart: sequences go on after `last` (the number of
    /// recordings before it), and the first new frame is a keyframe, so an
    /// observer resuming with `after` never sees a sequence twice.
    pub fn continue_after(&mut self, last: u64) {
        self.base_sequence = last;
    }

    /// Keeps frames long enough for a grant with this delay.
    pub fn note_delay(&mut self, delay_ms: u64) {
        self.retain_ms = self.retain_ms.max(delay_ms);
    }

    /// The public agent cards sent with keyframes.
    pub fn set_agent_cards(&mut self, cards: Vec<ObserverAgentCard>) {
        self.agent_cards = Arc::new(cards);
        for log in self.logs.values_mut() {
            log.built.retain(|&(_, _, keyframe), _| !keyframe);
        }
    }

    fn log_mut(&mut self, perspective: &str) -> &mut PerspectiveLog {
        let base = self.base_sequence;
        self.logs
            .entry(perspective.to_owned())
            .or_insert_with(|| PerspectiveLog {
                next_sequence: base,
                ..PerspectiveLog::default()
            })
    }

    /// After a restart: the commentary of `perspective` disclosed before
    /// the last recording, which the next keyframe carries (its newest
    /// [`MAX_KEYFRAME_COMMENTARY`] entries).
    pub fn carry_commentary(&mut self, perspective: &str, entries: Vec<Arc<ObserverCommentary>>) {
        let log = self.log_mut(perspective);
        let skip = entries.len().saturating_sub(MAX_KEYFRAME_COMMENTARY);
        log.recent = Arc::new(entries.into_iter().skip(skip).collect());
    }

    /// Records the projection of `perspective` at `tick`, made at `now`,
    /// with the `commentary` disclosed for it since the frame before.
    /// Consecutive worlds share unchanged subtrees (the stored world is the
    /// previous one with the delta applied).
    pub fn record(
        &mut self,
        perspective: &str,
        tick: u64,
        now: u64,
        world: Json,
        outcomes: Option<Arc<BTreeMap<String, Outcome>>>,
        commentary: Vec<Arc<ObserverCommentary>>,
    ) {
        let retain_ms = self.retain_ms;
        let log = self.log_mut(perspective);
        if !commentary.is_empty() {
            let skip =
                (log.recent.len() + commentary.len()).saturating_sub(MAX_KEYFRAME_COMMENTARY);
            log.recent = Arc::new(
                log.recent
                    .iter()
                    .chain(&commentary)
                    .skip(skip)
                    .cloned()
                    .collect(),
            );
        }
        let (delta, world) = match log.frames.back() {
            Some(prev) if !log.resync => {
                let d = diff(&prev.world, &world);
                let shared = apply(&prev.world, &d).unwrap_or(world);
                (Some(d), shared)
            }
            _ => (None, world),
        };
        log.resync = false;
        log.next_sequence += 1;
        let recorded_at = log.frames.back().map_or(now, |p| p.recorded_at.max(now));
        log.frames.push_back(Recorded {
            sequence: log.next_sequence,
            tick,
            recorded_at,
            world,
            delta,
            outcomes,
            commentary,
            recent: log.recent.clone(),
        });
        while log.frames.len() > MAX_OBSERVER_HISTORY
            || (log.frames.len() > OBSERVER_BATCH_MAX as usize + 1
                && log.frames[1].recorded_at.saturating_add(retain_ms) <= now)
        {
            log.frames.pop_front();
        }
        let oldest = log.frames.front().map_or(0, |f| f.sequence);
        log.built.retain(|&(_, seq, _), _| seq >= oldest);
    }

    /// The next frame recorded for `perspective` goes as a keyframe.
    pub fn resync(&mut self, perspective: &str) {
        if let Some(log) = self.logs.get_mut(perspective) {
            log.resync = true;
        }
    }

    /// The match is over: observers are told `closed` once they have the
    /// last frame (which they receive only at its `releaseAt`).
    pub fn close(&mut self) {
        self.closed = true;
    }

    pub fn frames_kept(&self, perspective: &str) -> usize {
        self.logs.get(perspective).map_or(0, |l| l.frames.len())
    }

    fn build(
        &mut self,
        perspective: &str,
        delay_ms: u64,
        index: usize,
        keyframe: bool,
    ) -> Arc<ObserverOut> {
        let cards = self.agent_cards.clone();
        let log = self
            .logs
            .get_mut(perspective)
            .expect("caller found the log");
        let r = &log.frames[index];
        log.built
            .entry((delay_ms, r.sequence, keyframe))
            .or_insert_with(|| {
                let frame = Arc::new(ObserverFrame {
                    sequence: r.sequence,
                    tick: r.tick,
                    recorded_at: r.recorded_at,
                    release_at: r.recorded_at.saturating_add(delay_ms),
                    perspective: perspective.to_owned(),
                    world: keyframe.then(|| r.world.clone()),
                    delta: if keyframe { None } else { r.delta.clone() },
                    outcomes: r.outcomes.as_ref().map(|o| (**o).clone()),
                    commentary: {
                        let c: &[Arc<ObserverCommentary>] =
                            if keyframe { &r.recent } else { &r.commentary };
                        (!c.is_empty()).then(|| c.iter().map(|e| (**e).clone()).collect())
                    },
                    agent_cards: (keyframe && !cards.is_empty()).then(|| (*cards).clone()),
                });
                let text = ServerMsg::Observer(ObserverMessage {
                    state: ObserverState::Ready,
                    grant: None,
                    frame: Some(frame.clone()),
                })
                .to_text()
                .into();
                Arc::new(ObserverOut { frame, text })
            })
            .clone()
    }
}

/// What an observer connection receives next.
#[derive(Debug, Clone)]
pub enum ObserverSend {
    /// A frame (shared with every observer at the same cursor).
    Frame(Arc<ObserverOut>),
    /// A state change without a frame (`buffering`, `closed`).
    State(Arc<str>),
}

impl ObserverSend {
    pub fn text(&self) -> &Arc<str> {
        match self {
            ObserverSend::Frame(f) => &f.text,
            ObserverSend::State(t) => t,
        }
    }
}

/// One observer's position in the feed.
#[derive(Debug, Clone)]
pub struct ObserverCursor {
    grant: ObserverGrant,
    perspective: Option<String>,
    last: Option<u64>,
    state: ObserverState,
}

impl ObserverCursor {
    pub fn new(grant: ObserverGrant) -> Self {
        Self {
            grant,
            perspective: None,
            last: None,
            state: ObserverState::Buffering,
        }
    }

    pub fn grant(&self) -> &ObserverGrant {
        &self.grant
    }

    /// The admission message: the grant and `buffering`, nothing live.
    pub fn admission(&self) -> ServerMsg {
        ServerMsg::Observer(ObserverMessage {
            state: ObserverState::Buffering,
            grant: Some(self.grant.clone()),
            frame: None,
        })
    }

    /// Follows `request.perspective` (which the grant must allow), resuming
    /// after the sequence the observer already holds if it says so.
    pub fn request(&mut self, request: &ObserverRequest) -> Result<(), ProtocolError> {
        let p = request.perspective.as_str();
        let allowed = match &self.grant {
            ObserverGrant::Team { team, .. } => p == team,
            ObserverGrant::Omniscient { teams, .. } => {
                p == OMNISCIENT || teams.iter().any(|t| t == p)
            }
        };
        if !allowed {
            return Err(ProtocolError::new(
                ServerErrorCode::Forbidden,
                format!("perspective: {p:?} is outside this observer's grant"),
            ));
        }
        if self.perspective.as_deref() != Some(p) {
            self.perspective = Some(p.to_owned());
            self.last = None;
        }
        if request.after.is_some() {
            self.last = request.after;
        }
        Ok(())
    }

    /// Everything released to this observer by `now`, oldest first.
    pub fn poll(&mut self, feed: &mut ObserverFeed, now: u64) -> Vec<ObserverSend> {
        let mut out = Vec::new();
        if self.state == ObserverState::Closed {
            return out;
        }
        let Some(p) = self.perspective.clone() else {
            return out;
        };
        let delay = self.grant.delay_ms();
        let released = now.checked_sub(delay).and_then(|watermark| {
            let log = feed.logs.get(&p)?;
            let n = log.frames.partition_point(|f| f.recorded_at <= watermark);
            n.checked_sub(1).map(|i| (i, log))
        });
        let Some((newest, log)) = released else {
            return out;
        };
        let newest_seq = log.frames[newest].sequence;
        let oldest_seq = log.frames[0].sequence;
        let final_seq = log.frames.back().map(|f| f.sequence);
        let plan: Option<(usize, bool)> = match self.last {
            Some(l) if l == newest_seq => None,
            Some(l)
                if l < newest_seq
                    && l >= oldest_seq
                    && newest_seq - l <= OBSERVER_BATCH_MAX
                    && log
                        .frames
                        .range((l - oldest_seq + 1) as usize..=newest)
                        .all(|f| f.delta.is_some()) =>
            {
                Some(((l - oldest_seq + 1) as usize, false))
            }
            _ => Some((newest, true)),
        };
        if let Some((from, keyframe)) = plan {
            for i in from..=newest {
                out.push(ObserverSend::Frame(feed.build(&p, delay, i, keyframe)));
            }
            self.last = Some(newest_seq);
            self.state = ObserverState::Ready;
        }
        if feed.closed && final_seq == self.last {
            self.state = ObserverState::Closed;
            out.push(ObserverSend::State(
                ServerMsg::Observer(ObserverMessage {
                    state: ObserverState::Closed,
                    grant: None,
                    frame: None,
                })
                .to_text()
                .into(),
            ));
        }
        out
    }

    /// When [`poll`](Self::poll) will next have something to send.
    pub fn next_release_at(&self, feed: &ObserverFeed) -> Option<u64> {
        if self.state == ObserverState::Closed {
            return None;
        }
        let log = feed.logs.get(self.perspective.as_deref()?)?;
        let next = match self.last {
            Some(l) => log.frames.iter().find(|f| f.sequence > l)?,
            None => log.frames.front()?,
        };
        Some(next.recorded_at.saturating_add(self.grant.delay_ms()))
    }

    pub fn last_sequence(&self) -> Option<u64> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grant(delay_ms: u64) -> ObserverGrant {
        ObserverGrant::Team {
            team: "red".into(),
            delay_ms,
        }
    }

    fn follow(c: &mut ObserverCursor, after: Option<u64>) {
        c.request(&ObserverRequest {
            perspective: "red".into(),
            after,
        })
        .unwrap();
    }

    fn frames(sends: &[ObserverSend]) -> Vec<Arc<ObserverFrame>> {
        sends
            .iter()
            .filter_map(|s| match s {
                ObserverSend::Frame(f) => Some(f.frame.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn frames_wait_for_release_at_and_start_with_a_keyframe() {
        let mut feed = ObserverFeed::new();
        feed.note_delay(5_000);
        let mut c = ObserverCursor::new(grant(5_000));
        follow(&mut c, None);
        for t in 0..10u64 {
            feed.record(
                "red",
                t,
                1_000 + t * 100,
                Json::from(json!({"t": t})),
                None,
                vec![],
            );
        }
        assert!(c.poll(&mut feed, 5_999).is_empty());
        assert_eq!(c.next_release_at(&feed), Some(6_000));
        let got = frames(&c.poll(&mut feed, 6_000));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].world, Some(Json::from(json!({"t": 0}))));
        assert_eq!(got[0].release_at, 6_000);
        let got = frames(&c.poll(&mut feed, 6_250));
        assert_eq!(
            got.iter().map(|f| f.sequence).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert!(got
            .iter()
            .all(|f| f.delta.is_some() && f.world.is_none() && f.release_at <= 6_250));
    }

    #[test]
    fn a_resume_beyond_the_batch_bound_or_a_resync_is_a_keyframe_and_frames_are_shared() {
        let mut feed = ObserverFeed::new();
        for t in 0..100u64 {
            feed.record("red", t, t, Json::from(json!({"t": t})), None, vec![]);
        }
        let mut a = ObserverCursor::new(grant(0));
        follow(&mut a, Some(100 - OBSERVER_BATCH_MAX));
        let got = a.poll(&mut feed, 1_000);
        assert_eq!(got.len() as u64, OBSERVER_BATCH_MAX);
        let mut b = ObserverCursor::new(grant(0));
        follow(&mut b, Some(100 - OBSERVER_BATCH_MAX));
        let got_b = b.poll(&mut feed, 1_000);
        // The same frames, the same allocations.
        match (&got[0], &got_b[0]) {
            (ObserverSend::Frame(x), ObserverSend::Frame(y)) => assert!(Arc::ptr_eq(x, y)),
            _ => panic!(),
        }
        let mut far = ObserverCursor::new(grant(0));
        follow(&mut far, Some(100 - OBSERVER_BATCH_MAX - 1));
        let got = frames(&far.poll(&mut feed, 1_000));
        assert_eq!(got.len(), 1);
        assert!(got[0].world.is_some());
        feed.resync("red");
        feed.record("red", 100, 100, Json::from(json!({"t": 100})), None, vec![]);
        let got = frames(&a.poll(&mut feed, 1_000));
        assert!(got[0].world.is_some() && got[0].sequence == 101);
    }

    #[test]
    fn perspective_outside_the_grant_is_forbidden_and_a_change_is_a_keyframe() {
        let mut feed = ObserverFeed::new();
        for p in ["red", "blue", OMNISCIENT] {
            feed.record(p, 0, 0, Json::from(json!({"p": p})), None, vec![]);
            feed.record(p, 1, 1, Json::from(json!({"p": p, "x": 1})), None, vec![]);
        }
        let mut c = ObserverCursor::new(grant(0));
        let e = c
            .request(&ObserverRequest {
                perspective: "blue".into(),
                after: None,
            })
            .unwrap_err();
        assert_eq!(e.code, ServerErrorCode::Forbidden);
        let mut o = ObserverCursor::new(ObserverGrant::Omniscient {
            teams: vec!["red".into(), "blue".into()],
            delay_ms: 0,
        });
        for p in ["red", OMNISCIENT] {
            o.request(&ObserverRequest {
                perspective: p.into(),
                after: None,
            })
            .unwrap();
            let got = frames(&o.poll(&mut feed, 10));
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].perspective, p);
            assert!(got[0].world.is_some());
        }
    }

    #[test]
    fn an_omniscient_grants_teams_are_the_team_perspectives_it_may_follow() {
        // The decision (docs/protocols/playerthree.md, "Observer streams"):
        // `teams` lists the team perspectives an omniscient grant may follow
        // besides "omniscient"; the omniscient perspective is the whole
        // world, whatever `teams` holds.
        let mut feed = ObserverFeed::new();
        for p in ["red", "blue", OMNISCIENT] {
            feed.record(p, 0, 0, Json::from(json!({"p": p})), None, vec![]);
        }
        let mut o = ObserverCursor::new(ObserverGrant::Omniscient {
            teams: vec!["red".into()],
            delay_ms: 0,
        });
        let e = o
            .request(&ObserverRequest {
                perspective: "blue".into(),
                after: None,
            })
            .unwrap_err();
        assert_eq!(e.code, ServerErrorCode::Forbidden);
        o.request(&ObserverRequest {
            perspective: OMNISCIENT.into(),
            after: None,
        })
        .unwrap();
        let got = frames(&o.poll(&mut feed, 10));
        assert_eq!(got[0].perspective, OMNISCIENT);
        assert_eq!(
            got[0].world.as_ref().map(|w| w.to_string()),
            Some(json!({"p": OMNISCIENT}).to_string())
        );
    }

    fn said(id: u64) -> Arc<ObserverCommentary> {
        Arc::new(ObserverCommentary {
            id: format!("c{id}"),
            team: "red".into(),
            role: "red-scout".into(),
            tick: id,
            category: crate::protocol::CommentaryCategory::Chat,
            text: format!("line {id}"),
        })
    }

    fn ids(f: &ObserverFrame) -> Vec<String> {
        f.commentary
            .iter()
            .flatten()
            .map(|c| c.id.clone())
            .collect()
    }

    #[test]
    fn deltas_carry_their_own_commentary_and_keyframes_the_newest_shared() {
        let mut feed = ObserverFeed::new();
        feed.carry_commentary("red", (0..40).map(said).collect());
        let n = 40u64;
        for t in 0..n {
            let c = if t % 2 == 0 {
                vec![said(100 + t)]
            } else {
                vec![]
            };
            feed.record("red", t, t, Json::from(json!({"t": t})), None, c);
        }
        let mut a = ObserverCursor::new(grant(0));
        follow(&mut a, Some(n - 4));
        let got = frames(&a.poll(&mut feed, 1_000));
        assert_eq!(got.len(), 4);
        let own: Vec<Vec<String>> = got.iter().map(|f| ids(f)).collect();
        assert_eq!(
            own,
            [
                vec!["c136".to_owned()],
                vec![],
                vec!["c138".to_owned()],
                vec![]
            ]
        );
        assert!(got[1].commentary.is_none(), "no empty list on the wire");
        // Two observers far behind share one keyframe with the newest
        // MAX_KEYFRAME_COMMENTARY entries (carried ones included, in order).
        let mut b = ObserverCursor::new(grant(0));
        let mut c = ObserverCursor::new(grant(0));
        follow(&mut b, None);
        follow(&mut c, Some(1));
        let (kb, kc) = (b.poll(&mut feed, 1_000), c.poll(&mut feed, 1_000));
        match (&kb[0], &kc[0]) {
            (ObserverSend::Frame(x), ObserverSend::Frame(y)) => assert!(Arc::ptr_eq(x, y)),
            _ => panic!(),
        }
        let k = &frames(&kb)[0];
        assert!(k.world.is_some());
        let want: Vec<String> = (28..40)
            .map(|i| format!("c{i}"))
            .chain((0..n).step_by(2).map(|t| format!("c{}", 100 + t)))
            .collect();
        assert_eq!(want.len(), MAX_KEYFRAME_COMMENTARY);
        assert_eq!(ids(k), want);
    }

    #[test]
    fn closed_comes_after_the_final_frame_is_released() {
        let mut feed = ObserverFeed::new();
        feed.note_delay(1_000);
        let mut c = ObserverCursor::new(grant(1_000));
        follow(&mut c, None);
        feed.record("red", 0, 0, Json::from(json!(0)), None, vec![]);
        feed.record("red", 1, 500, Json::from(json!(1)), None, vec![]);
        feed.close();
        let first = c.poll(&mut feed, 1_000);
        assert_eq!(first.len(), 1);
        let last = c.poll(&mut feed, 1_500);
        assert_eq!(last.len(), 2);
        assert!(last[1].text().contains(r#""state":"closed""#));
        assert!(c.poll(&mut feed, 99_999).is_empty());
    }
}
