//! The heartbeat a node publishes and the table of peers it keeps from the
//! heartbeats of others: no I/O, time given by the caller (the server's
//! clock), so every rule is tested without waiting.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The largest heartbeat accepted (and sent): a node's id, address, start
/// time and the ids of the units it owns fit in it many times over.
pub const MAX_HEARTBEAT_BYTES: usize = 4 * 1024;

/// The most peers one node keeps: a heartbeat from one more is ignored
/// (and counted) until a peer is dropped.
pub const MAX_PEERS: usize = 64;

/// The longest node id (`--node-id`).
pub const MAX_NODE_ID_LEN: usize = 64;

/// What a node says of itself every heartbeat interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// The node's id (`--node-id`).
    pub node: String,
    /// Where it serves HTTP and WebSocket (`host:port`).
    pub addr: String,
    /// When it started, milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// The units it owns (none until units move between nodes).
    #[serde(default)]
    pub units: Vec<String>,
}

/// Why a heartbeat was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Over [`MAX_HEARTBEAT_BYTES`].
    TooLarge,
    /// Not JSON of a heartbeat's shape, or a node id that is no id.
    Malformed,
    /// A new peer while [`MAX_PEERS`] are known.
    Full,
}

impl crate::metrics::Label for Rejection {
    const ALL: &'static [Self] = &[Rejection::TooLarge, Rejection::Malformed, Rejection::Full];
    fn name(self) -> &'static str {
        match self {
            Rejection::TooLarge => "too_large",
            Rejection::Malformed => "malformed",
            Rejection::Full => "full",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// Whether `id` can name a node: 1 to [`MAX_NODE_ID_LEN`] ASCII letters,
/// digits, `-`, `_` or `.` (it is shown in logs, health and metrics).
pub fn is_node_id(id: &str) -> bool {
    (1..=MAX_NODE_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Heartbeat {
    /// The heartbeat in `payload`, its size checked before it is parsed.
    pub fn decode(payload: &[u8]) -> Result<Heartbeat, Rejection> {
        if payload.len() > MAX_HEARTBEAT_BYTES {
            return Err(Rejection::TooLarge);
        }
        let hb: Heartbeat = serde_json::from_slice(payload).map_err(|_| Rejection::Malformed)?;
        if !is_node_id(&hb.node) || hb.units.iter().any(|u| u.is_empty()) {
            return Err(Rejection::Malformed);
        }
        Ok(hb)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a heartbeat is plain JSON")
    }
}

/// A node seen lately.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub heartbeat: Heartbeat,
    /// When its last heartbeat arrived (the receiving node's clock).
    pub last_seen_ms: u64,
}

/// What a heartbeat did to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// A node not known before.
    New,
    /// A known node, seen again.
    Refreshed,
    /// This node's own heartbeat (NATS echoes it to its own subscription).
    Own,
}

/// The peers seen within the expiry, at most [`MAX_PEERS`].
#[derive(Debug)]
pub struct Peers {
    own: String,
    expiry_ms: u64,
    seen: HashMap<String, Peer>,
}

impl Peers {
    /// The peers of node `own`; one unseen for more than `expiry_ms` is
    /// dropped.
    pub fn new(own: &str, expiry_ms: u64) -> Peers {
        Peers {
            own: own.to_owned(),
            expiry_ms,
            seen: HashMap::new(),
        }
    }

    /// A heartbeat received at `now_ms`.
    pub fn observe(&mut self, hb: Heartbeat, now_ms: u64) -> Result<Observed, Rejection> {
        if hb.node == self.own {
            return Ok(Observed::Own);
        }
        if let Some(p) = self.seen.get_mut(&hb.node) {
            p.heartbeat = hb;
            p.last_seen_ms = p.last_seen_ms.max(now_ms);
            return Ok(Observed::Refreshed);
        }
        if self.seen.len() >= MAX_PEERS {
            // Room may be made by peers that are already gone.
            self.expire(now_ms);
            if self.seen.len() >= MAX_PEERS {
                return Err(Rejection::Full);
            }
        }
        self.seen.insert(
            hb.node.clone(),
            Peer {
                heartbeat: hb,
                last_seen_ms: now_ms,
            },
        );
        Ok(Observed::New)
    }

    fn alive(&self, p: &Peer, now_ms: u64) -> bool {
        now_ms.saturating_sub(p.last_seen_ms) <= self.expiry_ms
    }

    /// Drops the peers unseen for longer than the expiry; their ids.
    pub fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let gone: Vec<String> = self
            .seen
            .values()
            .filter(|p| !self.alive(p, now_ms))
            .map(|p| p.heartbeat.node.clone())
            .collect();
        for id in &gone {
            self.seen.remove(id);
        }
        gone
    }

    /// The peers alive at `now_ms` but unheard for longer than `after_ms`.
    pub fn late(&self, now_ms: u64, after_ms: u64) -> Vec<String> {
        self.seen
            .values()
            .filter(|p| self.alive(p, now_ms) && now_ms.saturating_sub(p.last_seen_ms) > after_ms)
            .map(|p| p.heartbeat.node.clone())
            .collect()
    }

    /// Drops peer `id` now (it was found gone); whether it was there.
    pub fn forget(&mut self, id: &str) -> bool {
        self.seen.remove(id).is_some()
    }

    /// The peers alive at `now_ms`, by id.
    pub fn list(&self, now_ms: u64) -> Vec<Peer> {
        let mut v: Vec<Peer> = self
            .seen
            .values()
            .filter(|p| self.alive(p, now_ms))
            .cloned()
            .collect();
        v.sort_by(|a, b| a.heartbeat.node.cmp(&b.heartbeat.node));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(node: &str) -> Heartbeat {
        Heartbeat {
            node: node.to_owned(),
            addr: "127.0.0.1:1".to_owned(),
            started_ms: 5,
            units: vec![],
        }
    }

    #[test]
    fn a_late_peer_is_listed_until_its_expiry_and_one_found_gone_is_forgotten() {
        let mut p = Peers::new("me", 3_000);
        p.observe(hb("a"), 1_000).unwrap();
        p.observe(hb("b"), 2_000).unwrap();
        assert!(p.late(2_400, 1_500).is_empty());
        assert_eq!(p.late(2_600, 1_500), ["a"]);
        // Past the expiry it is the expiry's, not late.
        assert_eq!(p.late(4_100, 1_500), ["b"]);
        assert!(p.forget("b"));
        assert!(!p.forget("b"));
        assert_eq!(p.list(2_600).len(), 1);
    }

    #[test]
    fn a_peer_unseen_past_the_expiry_is_dropped_and_a_fresh_one_kept() {
        let mut p = Peers::new("me", 3_000);
        assert_eq!(p.observe(hb("a"), 1_000), Ok(Observed::New));
        assert_eq!(p.observe(hb("b"), 1_000), Ok(Observed::New));
        assert_eq!(p.observe(hb("me"), 1_000), Ok(Observed::Own));
        assert_eq!(p.observe(hb("a"), 3_500), Ok(Observed::Refreshed));
        assert_eq!(p.list(4_000).len(), 2);
        // b last seen at 1 000: alive at 4 000, gone at 4 001.
        assert!(p.expire(4_000).is_empty());
        let listed: Vec<String> = p
            .list(4_001)
            .into_iter()
            .map(|p| p.heartbeat.node)
            .collect();
        assert_eq!(listed, ["a"]);
        assert_eq!(p.expire(4_001), ["b"]);
        assert_eq!(p.list(4_001)[0].last_seen_ms, 3_500);
    }

    #[test]
    fn the_table_holds_at_most_max_peers_and_makes_room_from_the_gone() {
        let mut p = Peers::new("me", 3_000);
        for i in 0..MAX_PEERS {
            assert_eq!(p.observe(hb(&format!("n{i}")), 0), Ok(Observed::New));
        }
        assert_eq!(p.observe(hb("late"), 10), Err(Rejection::Full));
        // A known one is still refreshed.
        assert_eq!(p.observe(hb("n0"), 10), Ok(Observed::Refreshed));
        assert_eq!(p.list(10).len(), MAX_PEERS);
        // Once the others expire, there is room.
        assert_eq!(p.observe(hb("late"), 3_005), Ok(Observed::New));
        assert_eq!(p.list(3_005).len(), 2);
    }

    #[test]
    fn malformed_and_oversized_heartbeats_are_rejected() {
        assert_eq!(Heartbeat::decode(&hb("a").encode()), Ok(hb("a")));
        let big = vec![b' '; MAX_HEARTBEAT_BYTES + 1];
        assert_eq!(Heartbeat::decode(&big), Err(Rejection::TooLarge));
        for bad in [
            &b"not json"[..],
            br#"{"node":"a"}"#,
            br#"{"node":"","addr":"x","startedMs":1}"#,
            br#"{"node":"a b","addr":"x","startedMs":1}"#,
            br#"{"node":"a","addr":"x","startedMs":-1}"#,
            br#"{"node":"a","addr":"x","startedMs":1,"units":[""]}"#,
        ] {
            assert_eq!(Heartbeat::decode(bad), Err(Rejection::Malformed), "{bad:?}");
        }
        // Fields a newer node adds are ignored.
        let newer = br#"{"node":"a","addr":"x","startedMs":1,"zone":"eu"}"#;
        assert_eq!(Heartbeat::decode(newer).unwrap().node, "a");
        assert!(!is_node_id(&"x".repeat(MAX_NODE_ID_LEN + 1)));
    }
}
