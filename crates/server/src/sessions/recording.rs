//! What a replay of a hosted session needs (SPEC 10, feature `replay`,
//! reserved): the authority's `InitPayload` (with the set in display
//! order) and the display seed, every action with its sender and game
//! time, the start, the pauses and the end. The replayer can wait; the
//! record is kept from now on.
//!
//! An action is a `send` the session accepted from an instance that is not
//! the authority: the authority's own messages (its state, reveals) follow
//! from the actions, since game logic is deterministic (SPEC 3.1), and are
//! left out. The record is one JSON document, bounded by
//! [`MAX_RECORDING_ENTRIES`] and [`MAX_RECORDING_BYTES`]; past either it
//! says `truncated: true` and keeps nothing more. It is kept in the store
//! (`memizy_recordings`, replaced as a whole) when it has doubled since it
//! was last written, at each pause, at the end and when the session's task
//! stops, so what is written over a game is at most about twice its size;
//! a restart loses at most what came after the last write.

use hostwire_memizy::session::{CallId, InstanceId};
use serde_json::{json, value::RawValue, Value};
use std::collections::HashMap;

/// Entries (actions, start, pauses, end) one recording keeps.
pub const MAX_RECORDING_ENTRIES: usize = 20_000;
/// Bytes of entries one recording keeps (its `InitPayload` apart, which the
/// session's own bounds hold).
pub const MAX_RECORDING_BYTES: usize = 8 * 1024 * 1024;
/// Entries recorded before the first write to the store.
const FIRST_WRITE_ENTRIES: usize = 64;

#[derive(Debug, Default)]
pub struct Recorder {
    init: Option<String>,
    seed: Option<String>,
    /// Each entry as JSON text.
    entries: Vec<String>,
    bytes: usize,
    truncated: bool,
    /// `send` calls waiting for their answer: the arguments' text.
    sends: HashMap<(InstanceId, CallId), String>,
    /// Each attached instance's address.
    addresses: HashMap<InstanceId, String>,
    /// How many entries the last write to the store held.
    written: usize,
    /// Something changed since the last write.
    dirty: bool,
}

/// What a stored recording brings back: its parts, entries as text.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredRecording {
    display_seed: Option<String>,
    #[serde(default)]
    truncated: bool,
    init: Option<Box<RawValue>>,
    #[serde(default)]
    entries: Vec<Box<RawValue>>,
}

impl Recorder {
    /// The recorder of a session brought back after a restart: it goes on
    /// from the record the store kept (its `InitPayload`, seed and
    /// entries), so the next write does not replace it with only what
    /// came after the restart. `None` if the document cannot be read.
    pub fn restored(document: &str) -> Option<Recorder> {
        let stored: StoredRecording = serde_json::from_str(document).ok()?;
        let init = stored
            .init
            .filter(|i| i.get() != "null")
            .map(|i| i.get().to_owned());
        let entries: Vec<String> = stored
            .entries
            .into_iter()
            .map(|e| e.get().to_owned())
            .collect();
        let bytes = entries.iter().map(String::len).sum();
        Some(Recorder {
            seed: if init.is_some() {
                stored.display_seed
            } else {
                None
            },
            init,
            written: entries.len(),
            entries,
            bytes,
            truncated: stored.truncated,
            ..Default::default()
        })
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
        if !ok {
            return;
        }
        let Some(from) = self.addresses.get(&instance).cloned() else {
            return;
        };
        // `send(message)`: params is `[{"to": …, "data": …}]`.
        let message = serde_json::from_str::<Vec<Box<RawValue>>>(&params)
            .ok()
            .and_then(|mut v| (!v.is_empty()).then(|| v.swap_remove(0)));
        let Some(message) = message else {
            return;
        };
        self.push(json!({
            "type": "action",
            "from": from,
            "message": message,
            "sessionTimeMs": times.0,
            "gameTimeMs": times.1,
        }));
    }

    /// The authority got its `InitPayload` (the first one is kept).
    pub fn init(&mut self, payload: &impl serde::Serialize, seed: &str) {
        if self.init.is_none() {
            self.init = serde_json::to_string(payload).ok();
            self.seed = Some(seed.to_owned());
            self.dirty = true;
        }
    }

    /// `start`, `pause`, `resume`, `end`: an entry of its own.
    pub fn event(&mut self, kind: &str, times: (f64, f64), extra: Option<Value>) {
        let mut e = json!({"type": kind, "sessionTimeMs": times.0, "gameTimeMs": times.1});
        if let (Some(x), Some(o)) = (extra, e.as_object_mut()) {
            o.insert("result".into(), x);
        }
        self.push(e);
    }

    fn push(&mut self, entry: Value) {
        if self.truncated {
            return;
        }
        let text = entry.to_string();
        if self.entries.len() >= MAX_RECORDING_ENTRIES
            || self.bytes + text.len() > MAX_RECORDING_BYTES
        {
            self.truncated = true;
            self.dirty = true;
            self.sends.clear();
            return;
        }
        self.bytes += text.len();
        self.entries.push(text);
        self.dirty = true;
    }

    /// Whether the record has grown enough to be written again.
    pub fn due(&self) -> bool {
        self.dirty && self.entries.len() >= (2 * self.written).max(FIRST_WRITE_ENTRIES)
    }

    pub fn dirty(&self) -> bool {
        self.dirty
    }

    /// The document, and from now on it counts as written.
    pub fn take_document(&mut self, session_id: &str) -> String {
        self.written = self.entries.len();
        self.dirty = false;
        self.document(session_id)
    }

    pub fn has_init(&self) -> bool {
        self.init.is_some()
    }

    /// The whole record as one JSON document.
    pub fn document(&self, session_id: &str) -> String {
        let mut s =
            String::with_capacity(self.bytes + self.init.as_ref().map_or(0, String::len) + 512);
        s.push_str(&format!(
            "{{\"format\":\"hostwire-memizy-recording\",\"version\":1,\"sessionId\":{},\"displaySeed\":{},\"truncated\":{},\"limits\":{{\"entries\":{MAX_RECORDING_ENTRIES},\"bytes\":{MAX_RECORDING_BYTES}}},\"init\":{},\"entries\":[",
            json!(session_id),
            json!(self.seed),
            self.truncated,
            self.init.as_deref().unwrap_or("null"),
        ));
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(e);
        }
        s.push_str("]}");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_sends_of_others_are_actions_and_the_record_is_bounded() {
        let mut r = Recorder::default();
        r.attached(1, "board");
        r.attached(2, "p1");
        r.init(&json!({"set": {"items": []}}), "seed-1");
        r.event("start", (10.0, 0.0), None);
        // The authority's own message is not an action.
        r.send_called(1, 1, r#"[{"to":"all","data":{"s":1}}]"#, Some("board"));
        r.answered(1, 1, true, (11.0, 1.0));
        // A refused send is not recorded; an accepted one is.
        r.send_called(2, 1, r#"[{"to":"authority","data":"x"}]"#, Some("board"));
        r.answered(2, 1, false, (12.0, 2.0));
        r.send_called(
            2,
            2,
            r#"[{"to":"authority","data":{"a":"j"}}]"#,
            Some("board"),
        );
        r.answered(2, 2, true, (13.0, 3.0));
        let doc: Value = serde_json::from_str(&r.document("s")).unwrap();
        assert_eq!(doc["displaySeed"], "seed-1");
        assert_eq!(doc["init"]["set"]["items"], json!([]));
        let entries = doc["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 2, "{doc}");
        assert_eq!(entries[1]["from"], "p1");
        assert_eq!(entries[1]["message"]["data"]["a"], "j");
        assert_eq!(entries[1]["gameTimeMs"], 3.0);
        // Past the bound: truncated, nothing more kept.
        for i in 0..MAX_RECORDING_ENTRIES {
            r.event("pause", (i as f64, 0.0), None);
        }
        let doc: Value = serde_json::from_str(&r.document("s")).unwrap();
        assert_eq!(doc["truncated"], true);
        assert_eq!(
            doc["entries"].as_array().unwrap().len(),
            MAX_RECORDING_ENTRIES
        );
        r.send_called(2, 3, r#"[{"to":"authority","data":1}]"#, Some("board"));
        assert!(r.sends.is_empty());
    }

    #[test]
    fn a_restored_record_goes_on_from_what_was_kept() {
        let mut r = Recorder::default();
        r.init(&json!({"set": {"items": [1]}}), "seed-1");
        r.event("start", (1.0, 0.0), None);
        r.event("pause", (2.0, 1.0), None);
        let kept = r.take_document("s");
        let mut back = Recorder::restored(&kept).unwrap();
        assert!(!back.dirty(), "nothing new to write yet");
        // The continued authority's InitPayload does not replace the first.
        back.init(&json!({"set": {"items": [2]}}), "seed-2");
        back.event("resume", (3.0, 1.0), None);
        let doc: Value = serde_json::from_str(&back.document("s")).unwrap();
        assert_eq!(doc["init"]["set"]["items"], json!([1]));
        assert_eq!(doc["displaySeed"], "seed-1");
        let kinds: Vec<&str> = doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["start", "pause", "resume"]);
        assert_eq!(back.bytes, r.bytes + doc["entries"][2].to_string().len());
        assert!(Recorder::restored("not json").is_none());
    }

    #[test]
    fn writes_come_when_the_record_doubled() {
        let mut r = Recorder::default();
        for i in 0..FIRST_WRITE_ENTRIES - 1 {
            r.event("pause", (i as f64, 0.0), None);
        }
        assert!(!r.due());
        r.event("pause", (0.0, 0.0), None);
        assert!(r.due());
        r.take_document("s");
        assert!(!r.due());
        for _ in 0..FIRST_WRITE_ENTRIES - 1 {
            r.event("pause", (0.0, 0.0), None);
        }
        assert!(!r.due(), "not yet twice what was written");
        r.event("pause", (0.0, 0.0), None);
        assert!(r.due());
    }
}
