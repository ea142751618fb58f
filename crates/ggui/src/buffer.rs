//! A session's two histories: the event ledger (what happened, gap-free
//! `seq` from 1, replayed as `render_event` frames from a `sinceSequence`
//! cursor) and the stream buffer (outbound envelopes kept per their
//! channel's replay policy, replayed as `data` frames from a `fromSeq`
//! cursor). Each entry keeps its frame serialized once, shared by every
//! reader (live fan-out and replay alike).

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::frames::{
    encode_frame, frame_types, GguiSessionEvent, ReplayPolicy, StreamEnvelope,
    RESERVED_CHANNEL_PREFIX,
};

/// One retained ledger entry: its `seq` and its `render_event` frame. The
/// event itself is not kept: replay needs only the frame, and holding the
/// `Value` tree too would double what a ledger of 10,000 costs (and its
/// clone and drop were most of an action's time).
#[derive(Debug, Clone)]
pub struct LedgerEntry {
    pub seq: u64,
    pub frame: Arc<str>,
}

/// What [`Ledger::append`] did.
#[derive(Debug, Clone)]
pub struct Appended {
    /// The new event, for the caller to persist.
    pub event: GguiSessionEvent,
    /// Its `render_event` frame (shared with the ledger).
    pub frame: Arc<str>,
    /// Older entries were evicted (the horizon moved).
    pub evicted: bool,
}

/// A bounded, gap-free event ledger. Oldest entries are evicted past
/// `max_events` or `max_bytes`; `horizon` is the highest evicted `seq`, so
/// a cursor `c` can be replayed iff `horizon <= c <= last_sequence`.
#[derive(Debug, Clone)]
pub struct Ledger {
    entries: VecDeque<LedgerEntry>,
    last_sequence: u64,
    horizon: u64,
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
}

impl Ledger {
    pub fn new(max_events: usize, max_bytes: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            last_sequence: 0,
            horizon: 0,
            bytes: 0,
            max_events: max_events.max(1),
            max_bytes,
        }
    }

    pub fn last_sequence(&self) -> u64 {
        self.last_sequence
    }

    pub fn horizon(&self) -> u64 {
        self.horizon
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends with the next `seq`; returns the event, its frame and
    /// whether older entries were evicted.
    pub fn append(&mut self, event_type: &str, timestamp: String, data: Value) -> Appended {
        self.last_sequence += 1;
        let event = GguiSessionEvent {
            seq: self.last_sequence,
            event_type: event_type.to_owned(),
            timestamp,
            data,
        };
        let frame = self.push(&event);
        let evicted = self.evict();
        Appended {
            event,
            frame,
            evicted,
        }
    }

    /// Takes back the newest entry, `seq`, that could not be stored: the
    /// next append gets its `seq` again. `false` if `seq` is not the
    /// newest. Entries its append evicted stay evicted (the store still
    /// has them; replay from before the horizon is refused as before).
    pub fn take_back(&mut self, seq: u64) -> bool {
        if self.last_sequence != seq || self.entries.back().map(|e| e.seq) != Some(seq) {
            return false;
        }
        if let Some(e) = self.entries.pop_back() {
            self.bytes -= e.frame.len();
        }
        self.last_sequence -= 1;
        true
    }

    fn push(&mut self, event: &GguiSessionEvent) -> Arc<str> {
        let frame = encode_frame(frame_types::RENDER_EVENT, event, None);
        self.bytes += frame.len();
        self.entries.push_back(LedgerEntry {
            seq: event.seq,
            frame: Arc::clone(&frame),
        });
        frame
    }

    fn evict(&mut self) -> bool {
        let mut evicted = false;
        // The newest entry always stays, whatever its size.
        while self.entries.len() > 1
            && (self.entries.len() > self.max_events || self.bytes > self.max_bytes)
        {
            if let Some(old) = self.entries.pop_front() {
                self.bytes -= old.frame.len();
                self.horizon = old.seq;
                evicted = true;
            }
        }
        evicted
    }

    /// Puts back a persisted entry (restore after a restart). Entries must
    /// come in ascending `seq`; one that does not follow is refused.
    pub fn restore(&mut self, event: GguiSessionEvent) -> Result<(), String> {
        if event.seq <= self.last_sequence {
            return Err(format!(
                "ledger entry {} does not follow {}",
                event.seq, self.last_sequence
            ));
        }
        if self.entries.is_empty() && event.seq > 1 {
            // History before the first restored entry is gone.
            self.horizon = self.horizon.max(event.seq - 1);
        } else if event.seq != self.last_sequence + 1 {
            return Err(format!(
                "ledger entry {} leaves a gap after {}",
                event.seq, self.last_sequence
            ));
        }
        self.last_sequence = event.seq;
        self.push(&event);
        self.evict();
        Ok(())
    }

    /// Sets the high-water mark when the retained ledger is empty (every
    /// entry evicted before a restart).
    pub fn restore_last_sequence(&mut self, last: u64) {
        if last > self.last_sequence && self.entries.is_empty() {
            self.last_sequence = last;
            self.horizon = last;
        }
    }

    /// Entries with `seq > since`, at most `limit`.
    pub fn page(&self, since: u64, limit: usize) -> impl Iterator<Item = &LedgerEntry> {
        let start = self.entries.partition_point(|e| e.seq <= since);
        self.entries.range(start..).take(limit)
    }

    /// Every retained entry, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &LedgerEntry> {
        self.entries.iter()
    }
}

/// One buffered envelope: its `seq`, channel and policy, and its `data`
/// frame (all that replay reads; the envelope itself goes to the caller).
#[derive(Debug, Clone)]
pub struct StreamEntry {
    pub seq: u64,
    pub channel: String,
    pub policy: ReplayPolicy,
    pub frame: Arc<str>,
}

impl StreamEntry {
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// What [`StreamBuffer::record`] did.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The envelope, back to the caller (to persist and answer with).
    pub envelope: StreamEnvelope,
    /// Its `seq`, the policy it was kept under, and its frame.
    pub seq: u64,
    pub policy: ReplayPolicy,
    pub frame: Arc<str>,
    /// Kept for replay (false under `none`).
    pub buffered: bool,
    /// `seq`s of entries that left the buffer (evicted or replaced).
    pub dropped: Vec<u64>,
}

/// The outbound replay buffer of one session: one `seq` counter shared by
/// every channel; `all` (and reserved `_ggui:` channels) share a ring of
/// `max_entries` (and `max_bytes`), oldest evicted; `latest` keeps one slot
/// per channel; `none` keeps nothing.
#[derive(Debug, Clone)]
pub struct StreamBuffer {
    seq: u64,
    ring: VecDeque<StreamEntry>,
    ring_bytes: usize,
    evicted_above: u64,
    latest: HashMap<String, StreamEntry>,
    max_entries: usize,
    max_bytes: usize,
}

/// Whether a channel is in the server-owned namespace (always replayed as `all`).
pub fn is_reserved_channel(channel: &str) -> bool {
    channel.starts_with(RESERVED_CHANNEL_PREFIX)
}

impl StreamBuffer {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            seq: 0,
            ring: VecDeque::new(),
            ring_bytes: 0,
            evicted_above: 0,
            latest: HashMap::new(),
            max_entries: max_entries.max(1),
            max_bytes,
        }
    }

    /// The last assigned `seq` (0 before any).
    pub fn current_seq(&self) -> u64 {
        self.seq
    }

    /// Envelopes kept for replay.
    pub fn len(&self) -> usize {
        self.ring.len() + self.latest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next `seq`, for an envelope about to be recorded.
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// Records an envelope that already carries `next_seq()`.
    pub fn record(&mut self, envelope: StreamEnvelope, policy: ReplayPolicy) -> Recorded {
        let seq = envelope.seq.unwrap_or(self.seq + 1);
        self.seq = self.seq.max(seq);
        self.insert(envelope, policy)
    }

    fn insert(&mut self, envelope: StreamEnvelope, policy: ReplayPolicy) -> Recorded {
        let policy = if is_reserved_channel(&envelope.channel) {
            ReplayPolicy::All
        } else {
            policy
        };
        let frame = encode_frame(frame_types::DATA, &envelope, None);
        let seq = envelope.seq.unwrap_or(0);
        let entry = || StreamEntry {
            seq,
            channel: envelope.channel.clone(),
            policy,
            frame: Arc::clone(&frame),
        };
        let mut dropped = Vec::new();
        let buffered = match policy {
            ReplayPolicy::None => false,
            ReplayPolicy::Latest => {
                if let Some(old) = self.latest.insert(envelope.channel.clone(), entry()) {
                    dropped.push(old.seq);
                }
                true
            }
            ReplayPolicy::All => {
                self.ring_bytes += frame.len();
                self.ring.push_back(entry());
                while self.ring.len() > 1
                    && (self.ring.len() > self.max_entries || self.ring_bytes > self.max_bytes)
                {
                    if let Some(old) = self.ring.pop_front() {
                        self.ring_bytes -= old.frame.len();
                        self.evicted_above = self.evicted_above.max(old.seq);
                        dropped.push(old.seq);
                    }
                }
                true
            }
        };
        Recorded {
            envelope,
            seq,
            policy,
            frame,
            buffered,
            dropped,
        }
    }

    /// Puts back a persisted entry (restore after a restart), in `seq` order.
    pub fn restore(
        &mut self,
        envelope: StreamEnvelope,
        policy: ReplayPolicy,
    ) -> Result<(), String> {
        let Some(seq) = envelope.seq else {
            return Err("stream entry has no seq".into());
        };
        if seq <= self.seq && !self.is_empty() {
            return Err(format!("stream entry {seq} does not follow {}", self.seq));
        }
        if self.ring.is_empty() && seq > 1 {
            // Whatever came before the first restored entry is gone.
            self.evicted_above = self.evicted_above.max(seq - 1);
        }
        self.seq = self.seq.max(seq);
        self.insert(envelope, policy);
        Ok(())
    }

    /// Sets the counter after a restore (entries under `none` are not
    /// persisted but did take a `seq`).
    pub fn restore_seq(&mut self, seq: u64) {
        self.seq = self.seq.max(seq);
    }

    /// The frames a subscriber with cursor `from_seq` gets back, in `seq`
    /// order, filtered by the channels' current policies, and whether
    /// entries the cursor asked for were evicted. `None` replays nothing.
    pub fn replay(
        &self,
        from_seq: Option<u64>,
        policy_of: impl Fn(&str) -> ReplayPolicy,
    ) -> (Vec<Arc<str>>, bool) {
        let Some(from) = from_seq else {
            return (Vec::new(), false);
        };
        let mut out: Vec<&StreamEntry> = self
            .ring
            .iter()
            .filter(|e| e.seq() > from)
            .filter(|e| {
                is_reserved_channel(&e.channel) || policy_of(&e.channel) == ReplayPolicy::All
            })
            .collect();
        out.extend(
            self.latest
                .values()
                .filter(|e| e.seq() > from && policy_of(&e.channel) == ReplayPolicy::Latest),
        );
        out.sort_by_key(|e| e.seq());
        let truncated = from < self.evicted_above;
        (
            out.into_iter().map(|e| e.frame.clone()).collect(),
            truncated,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::StreamChannelMode;
    use serde_json::json;

    fn env(buf: &StreamBuffer, channel: &str, n: u64) -> StreamEnvelope {
        StreamEnvelope {
            session_id: "s".into(),
            channel: channel.into(),
            mode: StreamChannelMode::Append,
            payload: json!(n),
            complete: None,
            seq: Some(buf.next_seq()),
            schema_version: None,
        }
    }

    fn seqs(frames: &[Arc<str>]) -> Vec<u64> {
        frames
            .iter()
            .map(|f| {
                serde_json::from_str::<Value>(f).unwrap()["payload"]["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn ledger_pages_and_horizon() {
        let mut l = Ledger::new(5, usize::MAX);
        for i in 0..8 {
            l.append("user.submitted", "t".into(), json!(i));
        }
        assert_eq!((l.last_sequence(), l.horizon(), l.len()), (8, 3, 5));
        let page: Vec<u64> = l.page(3, 2).map(|e| e.seq).collect();
        assert_eq!(page, vec![4, 5]);
        assert_eq!(l.page(8, 100).count(), 0);
    }

    #[test]
    fn ledger_byte_bound_evicts_but_keeps_the_newest() {
        let mut l = Ledger::new(1000, 1024);
        for _ in 0..10 {
            l.append("user.submitted", "t".into(), json!("x".repeat(300)));
        }
        assert!(l.bytes <= 1024, "{}", l.bytes);
        assert_eq!(l.last_sequence(), 10);
        assert_eq!(l.horizon(), 10 - l.len() as u64);
        // One entry larger than the bound is still kept: the newest stays.
        l.append("user.submitted", "t".into(), json!("y".repeat(5000)));
        assert_eq!((l.len(), l.horizon()), (1, 10));
    }

    #[test]
    fn ledger_restore_refuses_gaps() {
        let mut l = Ledger::new(10, usize::MAX);
        let ev = |seq| GguiSessionEvent {
            seq,
            event_type: "x".into(),
            timestamp: "t".into(),
            data: json!(null),
        };
        l.restore(ev(4)).unwrap();
        assert_eq!(l.horizon(), 3);
        l.restore(ev(5)).unwrap();
        assert!(l.restore(ev(7)).unwrap_err().contains("gap"));
        assert!(l.restore(ev(5)).is_err());
        assert_eq!(l.last_sequence(), 5);
    }

    #[test]
    fn latest_all_none_and_truncation() {
        let mut b = StreamBuffer::new(3, usize::MAX);
        let policy = |c: &str| match c {
            "a" => ReplayPolicy::All,
            "l" => ReplayPolicy::Latest,
            _ => ReplayPolicy::None,
        };
        for (i, c) in ["a", "l", "n", "l", "a", "a", "a"].iter().enumerate() {
            let e = env(&b, c, i as u64);
            b.record(e, policy(c));
        }
        assert_eq!(b.current_seq(), 7);
        let (all, truncated) = b.replay(Some(0), policy);
        // "a" at 1 was evicted (ring of 3 keeps 5, 6, 7); "l" keeps 4.
        assert_eq!(seqs(&all), vec![4, 5, 6, 7]);
        assert!(truncated);
        let (tail, truncated) = b.replay(Some(5), policy);
        assert_eq!(seqs(&tail), vec![6, 7]);
        assert!(!truncated);
        assert!(b.replay(None, policy).0.is_empty());
        // The policy at replay time wins: nothing for a channel now "none".
        assert!(b.replay(Some(0), |_| ReplayPolicy::None).0.is_empty());
    }

    #[test]
    fn reserved_channels_are_kept_as_all() {
        let mut b = StreamBuffer::new(10, usize::MAX);
        let e = env(&b, "_ggui:contract-error", 1);
        let r = b.record(e, ReplayPolicy::None);
        assert!(r.buffered);
        assert_eq!(b.replay(Some(0), |_| ReplayPolicy::None).0.len(), 1);
    }

    #[test]
    fn byte_bound_evicts() {
        let mut b = StreamBuffer::new(1000, 300);
        for i in 0..10 {
            let e = env(&b, "a", i);
            b.record(e, ReplayPolicy::All);
        }
        assert!(b.ring_bytes <= 300, "{}", b.ring_bytes);
        assert!(b.len() < 10);
    }
}
