//! What a replay of a hosted session needs (SPEC 10, feature `replay`,
//! reserved): the authority's `InitPayload` (with the set in display
//! order) and the display seed, every action with its sender and game
//! time, the start, the pauses and the end. The replayer can wait; the
//! record is kept from now on.
//!
//! An action is a `send` the session accepted from an instance that is not
//! the authority: the authority's own messages (its state, reveals) follow
//! from the actions, since game logic is deterministic (SPEC 3.1), and are
//! left out. The record is bounded by [`MAX_RECORDING_ENTRIES`] and
//! [`MAX_RECORDING_BYTES`]; past either it says `truncated: true` and keeps
//! nothing more.
//!
//! The store keeps it as a head (`memizy_recordings`: the `InitPayload`,
//! the seed, whether it was truncated) and batches of entries appended
//! (`memizy_recording_batches`, a row each), written behind. A batch goes once
//! [`WRITE_AFTER_ENTRIES`] entries or [`WRITE_AFTER_BYTES`] bytes wait, or
//! [`WRITE_AFTER_MS`] after the oldest of them came, and at each pause, at
//! the end, when the recording is asked for and when the session's task
//! stops. The session's task holds only the entries the store has not
//! acknowledged: a long game costs memory by its last batches, not by its
//! length (a refused write keeps its entries until the store takes them,
//! tried again at most once a second, within the record's bounds). A
//! restart loses at most the batch that was waiting.

use foldhash::HashMap;
use hostwire_memizy::session::{CallId, InstanceId};
use hostwire_store::sessions::{StoredBatch, StoredRecording};
use serde_json::{json, value::RawValue, Value};
use std::collections::VecDeque;

/// Entries (actions, start, pauses, end) one recording keeps.
pub const MAX_RECORDING_ENTRIES: usize = 20_000;
/// Bytes of entries one recording keeps (its `InitPayload` apart, which the
/// session's own bounds hold).
pub const MAX_RECORDING_BYTES: usize = 8 * 1024 * 1024;
/// Entries waiting that make a batch for the store.
pub const WRITE_AFTER_ENTRIES: u64 = 256;
/// Bytes of entries waiting that make a batch for the store.
pub const WRITE_AFTER_BYTES: usize = 64 * 1024;
/// The longest an entry waits for its batch while the session runs. A
/// batch is one commit, and a commit alone costs about as much as a
/// hundred entries in it: a second made a session of 30 players at one
/// action a second each commit every second (4 % of the server's CPU in
/// that game); five make it one commit per about 150 entries.
pub const WRITE_AFTER_MS: u64 = 5_000;
/// After a refused write, the next batch waits this long (unless it is
/// forced: a pause, the end, the recording asked for, the task's stop).
const RETRY_AFTER_MS: u64 = 1_000;

#[derive(Debug, Default)]
pub struct Recorder {
    init: Option<String>,
    seed: Option<String>,
    truncated: bool,
    /// The head changed since it was last handed to the store.
    head_dirty: bool,
    /// Entries recorded: the next entry's sequence number.
    count: u64,
    /// Bytes of every entry recorded (the bound's count).
    bytes: usize,
    /// Entries below this sequence number are durable.
    durable: u64,
    /// The entries from `durable` on, as JSON text.
    tail: VecDeque<String>,
    /// Entries below this were handed to the store.
    handed: u64,
    /// Bytes of the entries not handed yet.
    waiting_bytes: usize,
    /// When the oldest entry not handed yet was first seen waiting.
    waiting_since: Option<u64>,
    /// No batch is handed out before this, unless forced.
    retry_at: u64,
    /// A batch was refused: what it held goes again at `retry_at`, even
    /// if the session has gone quiet.
    retry: bool,
    /// Writes in flight: the write's id → what it holds.
    in_flight: HashMap<u64, Batch>,
    /// `send` calls waiting for their answer: the arguments' text.
    sends: HashMap<(InstanceId, CallId), String>,
    /// Each attached instance's address.
    addresses: HashMap<InstanceId, String>,
}

/// What one write to the store holds of the recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub first_seq: u64,
    /// One past the last entry's sequence number.
    pub end_seq: u64,
    pub head: bool,
}

/// A batch for the store: the head if it changed, and entries from
/// `first_seq` on.
pub struct Handed {
    pub head: Option<String>,
    pub first_seq: u64,
    pub entries: Vec<String>,
}

/// The head as the store keeps it. A head written before the entries were
/// kept apart is the whole document, entries included.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredHead {
    display_seed: Option<String>,
    #[serde(default)]
    truncated: bool,
    init: Option<Box<RawValue>>,
    #[serde(default)]
    entries: Vec<Box<RawValue>>,
}

/// A kept recording as one document, and how many entries it holds.
pub struct Document {
    pub text: String,
    pub entries: usize,
}

impl StoredHead {
    fn of(stored: &StoredRecording) -> Result<StoredHead, String> {
        match &stored.head {
            Some(h) => serde_json::from_str(h).map_err(|e| format!("recording head: {e}")),
            None => Ok(StoredHead {
                display_seed: None,
                truncated: false,
                init: None,
                entries: Vec::new(),
            }),
        }
    }

    fn init(&self) -> Option<&str> {
        self.init
            .as_deref()
            .map(RawValue::get)
            .filter(|i| *i != "null")
    }
}

/// The whole record as one JSON document, from its head and entries.
fn compose<'e>(
    session_id: &str,
    seed: Option<&str>,
    truncated: bool,
    init: Option<&str>,
    entries: impl Iterator<Item = &'e str>,
    bytes: usize,
) -> String {
    let mut text = String::with_capacity(bytes + init.map_or(0, str::len) + 512);
    text.push_str(&format!(
        "{{\"format\":\"hostwire-memizy-recording\",\"version\":1,\"sessionId\":{},\"displaySeed\":{},\"truncated\":{},\"limits\":{{\"entries\":{MAX_RECORDING_ENTRIES},\"bytes\":{MAX_RECORDING_BYTES}}},\"init\":{},\"entries\":[",
        json!(session_id),
        json!(seed),
        truncated,
        init.unwrap_or("null"),
    ));
    for (i, e) in entries.enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(e);
    }
    text.push_str("]}");
    text
}

/// The batches that make the record, in order: from entry `from` on,
/// each starting where the one before ended. A row left over from before
/// a refused write was written again (it starts inside the chain) is
/// passed over; the chain ends at a gap.
fn chain(stored: &StoredRecording, from: u64) -> impl Iterator<Item = &StoredBatch> {
    let mut next = from;
    stored.batches.iter().filter(move |b| {
        let on = b.first_seq == next && b.count > 0;
        if on {
            next += b.count;
        }
        on
    })
}

/// The kept recording of session `session_id` as one document.
pub fn document(session_id: &str, stored: &StoredRecording) -> Result<Document, String> {
    let head = StoredHead::of(stored)?;
    let old: Vec<&str> = head.entries.iter().map(|e| e.get()).collect();
    let batches: Vec<&StoredBatch> = chain(stored, old.len() as u64).collect();
    let bytes = batches.iter().map(|b| b.entries.len()).sum::<usize>()
        + old.iter().map(|e| e.len()).sum::<usize>();
    let text = compose(
        session_id,
        head.display_seed.as_deref(),
        head.truncated,
        head.init(),
        old.iter()
            .copied()
            .chain(batches.iter().map(|b| b.entries.as_str())),
        bytes,
    );
    let entries = old.len() + batches.iter().map(|b| b.count as usize).sum::<usize>();
    Ok(Document { text, entries })
}

impl Recorder {
    /// The recorder of a session brought back after a restart: it goes on
    /// from the record the store kept (its `InitPayload`, seed and count
    /// of entries), so that what follows the restart is appended to it.
    /// `None` if the head cannot be read.
    pub fn restored(stored: &StoredRecording) -> Option<Recorder> {
        let head = StoredHead::of(stored).ok()?;
        let init = head.init().map(str::to_owned);
        let seed = init.as_ref().and(head.display_seed);
        let mut r = Recorder {
            init,
            seed,
            truncated: head.truncated,
            ..Default::default()
        };
        if head.entries.is_empty() {
            for b in chain(stored, 0) {
                r.count += b.count;
                // The batch's text less the commas between its entries.
                r.bytes += b.entries.len() + 1 - b.count as usize;
            }
            r.durable = r.count;
            r.handed = r.count;
        } else {
            // A head from before the entries were kept apart: its entries
            // are written again as entries, and the head without them.
            r.tail = head.entries.iter().map(|e| e.get().to_owned()).collect();
            r.count = r.tail.len() as u64;
            r.bytes = r.tail.iter().map(String::len).sum();
            r.waiting_bytes = r.bytes;
            r.head_dirty = true;
        }
        Some(r)
    }

    pub fn attached(&mut self, instance: InstanceId, address: &str) {
        self.addresses.insert(instance, address.to_owned());
    }

    pub fn detached(&mut self, instance: InstanceId) {
        self.addresses.remove(&instance);
        self.sends.retain(|(i, _), _| *i != instance);
    }

    /// A `send` call of `instance` arrived (recorded once it is accepted,
    /// unless the instance is the authority).
    pub fn send_called(
        &mut self,
        instance: InstanceId,
        call: CallId,
        params: &str,
        authority: Option<&str>,
    ) {
        let from = self.addresses.get(&instance).map(String::as_str);
        if self.truncated || from.is_none() || from == authority {
            return;
        }
        // One waiting send per attached instance and call: the engine
        // answers a send before the next command, so this stays small.
        if self.sends.len() < 4 * hostwire_memizy::session::MAX_INSTANCES_PER_SESSION {
            self.sends.insert((instance, call), params.to_owned());
        }
    }

    /// A call of `instance` was answered; an accepted `send` becomes an
    /// action.
    pub fn answered(&mut self, instance: InstanceId, call: CallId, ok: bool, times: (f64, f64)) {
        let Some(params) = self.sends.remove(&(instance, call)) else {
            return;
        };
        if !ok || self.truncated {
            return;
        }
        let Some(from) = self.addresses.get(&instance) else {
            return;
        };
        // `send(message)`: params is `[{"to": …, "data": …}]`, an array of
        // exactly one value (the engine accepted the call, and it refuses a
        // `send` with any other count), so the message is what its brackets
        // hold, without reading it once more.
        let Some(message) = params
            .trim_ascii()
            .strip_prefix('[')
            .and_then(|p| p.strip_suffix(']'))
            .map(str::trim_ascii)
        else {
            return;
        };
        // The entry's text written once (one of these per action).
        let mut e = Vec::with_capacity(message.len() + from.len() + 112);
        e.extend_from_slice(b"{\"type\":\"action\",\"from\":");
        let _ = serde_json::to_writer(&mut e, from);
        e.extend_from_slice(b",\"message\":");
        e.extend_from_slice(message.as_bytes());
        e.extend_from_slice(b",\"sessionTimeMs\":");
        let _ = serde_json::to_writer(&mut e, &times.0);
        e.extend_from_slice(b",\"gameTimeMs\":");
        let _ = serde_json::to_writer(&mut e, &times.1);
        e.push(b'}');
        if let Ok(text) = String::from_utf8(e) {
            self.push(text);
        }
    }

    /// The authority got its `InitPayload` (the first one is kept).
    pub fn init(&mut self, payload: &impl serde::Serialize, seed: &str) {
        if self.init.is_none() {
            self.init = serde_json::to_string(payload).ok();
            self.seed = Some(seed.to_owned());
            self.head_dirty = true;
        }
    }

    /// `start`, `pause`, `resume`, `end`: an entry of its own.
    pub fn event(&mut self, kind: &str, times: (f64, f64), extra: Option<Value>) {
        let mut e = json!({"type": kind, "sessionTimeMs": times.0, "gameTimeMs": times.1});
        if let (Some(x), Some(o)) = (extra, e.as_object_mut()) {
            o.insert("result".into(), x);
        }
        self.push(e.to_string());
    }

    fn push(&mut self, text: String) {
        if self.truncated {
            return;
        }
        if self.count as usize >= MAX_RECORDING_ENTRIES
            || self.bytes + text.len() > MAX_RECORDING_BYTES
        {
            self.truncated = true;
            self.head_dirty = true;
            self.sends.clear();
            return;
        }
        self.bytes += text.len();
        self.waiting_bytes += text.len();
        self.count += 1;
        self.tail.push_back(text);
    }

    /// Entries recorded so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Entries held in memory (not yet acknowledged by the store).
    pub fn held(&self) -> usize {
        self.tail.len()
    }

    pub fn has_init(&self) -> bool {
        self.init.is_some()
    }

    /// Whether a batch should go to the store now.
    pub fn due(&mut self, now: u64) -> bool {
        if now < self.retry_at {
            return false;
        }
        if self.handed == self.count {
            return self.head_dirty;
        }
        let since = *self.waiting_since.get_or_insert(now);
        self.head_dirty
            || self.retry
            || self.count - self.handed >= WRITE_AFTER_ENTRIES
            || self.waiting_bytes >= WRITE_AFTER_BYTES
            || now.saturating_sub(since) >= WRITE_AFTER_MS
    }

    /// When the waiting entries are due at the latest.
    pub fn deadline(&self) -> Option<u64> {
        if self.retry {
            return Some(self.retry_at);
        }
        let since = self.waiting_since.filter(|_| self.handed < self.count)?;
        Some((since + WRITE_AFTER_MS).max(self.retry_at))
    }

    /// The batch for the store: the head if it changed, the entries not
    /// handed out yet. `None` if there is nothing to write.
    pub fn take_batch(&mut self) -> Option<Handed> {
        if self.handed == self.count && !self.head_dirty {
            return None;
        }
        let from = (self.handed - self.durable) as usize;
        let batch = Handed {
            head: self.head_dirty.then(|| self.head()),
            first_seq: self.handed,
            entries: self.tail.range(from..).cloned().collect(),
        };
        self.handed = self.count;
        self.head_dirty = false;
        self.waiting_bytes = 0;
        self.waiting_since = None;
        self.retry = false;
        Some(batch)
    }

    /// Everything the store has not acknowledged (the head if it may not
    /// be kept yet), for the last write when the session's task stops.
    pub fn take_unsaved(&mut self) -> Option<Handed> {
        let head_pending = self.head_dirty || self.in_flight.values().any(|b| b.head);
        if self.durable == self.count && !head_pending {
            return None;
        }
        self.handed = self.durable;
        self.head_dirty = head_pending;
        self.in_flight.clear();
        self.take_batch()
    }

    /// The batch of write `id` was handed to the store.
    pub fn in_flight(&mut self, id: u64, batch: Batch) {
        self.in_flight.insert(id, batch);
    }

    /// The store answered write `id`: acknowledged entries leave memory;
    /// a refused batch is handed out again, not before a second.
    pub fn acked(&mut self, id: u64, durable: bool, now: u64) {
        let Some(b) = self.in_flight.remove(&id) else {
            return;
        };
        if !durable {
            // Everything from the first entry not durable goes again.
            self.handed = self.durable;
            self.waiting_bytes = self.tail.iter().map(String::len).sum();
            self.head_dirty |= b.head;
            self.retry_at = now + RETRY_AFTER_MS;
            self.retry = true;
            return;
        }
        // A batch after a refused one (a gap below it) counts once the
        // gap is written again.
        if b.first_seq <= self.durable && b.end_seq > self.durable {
            let n = (b.end_seq - self.durable) as usize;
            self.tail.drain(..n.min(self.tail.len()));
            self.durable = b.end_seq;
            self.handed = self.handed.max(self.durable);
        }
    }

    /// The head as the store keeps it.
    fn head(&self) -> String {
        format!(
            "{{\"displaySeed\":{},\"truncated\":{},\"init\":{}}}",
            json!(self.seed),
            self.truncated,
            self.init.as_deref().unwrap_or("null"),
        )
    }
}

#[cfg(test)]
mod tests;
