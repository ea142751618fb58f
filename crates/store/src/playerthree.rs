//! What PlayerThree matches keep across a restart: each match (its id, its
//! game, its operator token's SHA-256, when it was created) and the host's
//! records in the order they
//! happened (config, tokens with their principals, revocations,
//! controllers, policies, cards, the game's state at each recorded tick,
//! chat lines, commentary agents disclosed). A record with a slot keeps
//! only the newest of its slot (a seat's latest policy, the latest game
//! state), so what a match keeps, and what a restore reads, does not grow
//! with how often it was written. The records are stored as the JSON the protocol crate
//! writes, with their kind and tick beside them for queries; the store
//! does not depend on the protocol crate. No token is stored as text: the
//! protocol crate writes token records with the token's hash only. A
//! finished match is removed whole ([`PlayerThreeWrite::RemoveMatch`])
//! once it has expired.

use crate::{SqliteStore, StoreError, StoreWrite, Unit, UnitResults, UnitStore};
use rusqlite::{params, Connection};

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS playerthree_matches (
    id TEXT PRIMARY KEY,
    game TEXT NOT NULL,
    -- The operator token's SHA-256 in hex (never the token).
    operator_token TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS playerthree_records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    match_id TEXT NOT NULL REFERENCES playerthree_matches(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    tick INTEGER,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS playerthree_records_by_match ON playerthree_records (match_id, seq);
";

/// The slot column, added to a file from before it.
const SLOT_SCHEMA: &str = "
ALTER TABLE playerthree_records ADD COLUMN slot TEXT;
";
const SLOT_INDEX: &str = "
CREATE INDEX IF NOT EXISTS playerthree_records_by_slot ON playerthree_records (match_id, slot) WHERE slot IS NOT NULL;
CREATE INDEX IF NOT EXISTS playerthree_records_by_token ON playerthree_records (json_extract(body, '$.tokenHash')) WHERE kind = 'token';
";

/// Which match minted a token, by its hash: one lookup in
/// `playerthree_records_by_token` (a client presenting a token a node does
/// not know must not cost a scan of every token).
pub(crate) const MATCH_OF_TOKEN_SQL: &str = "SELECT match_id FROM playerthree_records WHERE kind = 'token' AND json_extract(body, '$.tokenHash') = ?1 LIMIT 1";

/// Creates the PlayerThree tables (the SQLite store calls it at open).
pub(crate) fn create_tables(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(SCHEMA)?;
    let has_slot: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('playerthree_records') WHERE name = 'slot'")?
        .exists([])?;
    if !has_slot {
        conn.execute_batch(SLOT_SCHEMA)?;
    }
    conn.execute_batch(SLOT_INDEX)?;
    Ok(())
}

/// Kinds of records kept for the record only (chat lines): a restore
/// does not read them, so [`PlayerThreeStore::load_matches`] leaves them
/// out.
pub const LOG_KINDS: &[&str] = &["chat"];

/// A match as loaded at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMatch {
    pub id: String,
    pub game: String,
    /// The SHA-256 (hex) of the match's operator token (the HTTP API).
    pub operator_token_hash: String,
    pub created_at_ms: u64,
    /// Each record's JSON text, oldest first.
    pub records: Vec<String>,
}

/// One durable change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlayerThreeWrite {
    /// A new match.
    Match {
        id: String,
        game: String,
        /// The SHA-256 (hex) of its operator token.
        operator_token_hash: String,
        created_at_ms: u64,
    },
    /// A record of a match, appended after the ones before it.
    Record {
        match_id: String,
        /// The record's kind (`token`, `state`, …).
        kind: String,
        tick: Option<u64>,
        /// A record with a slot (a seat's latest policy, the latest game
        /// state, a team's chat lines) replaces the match's oldest records
        /// of that slot past `keep`: what a match keeps stays bounded
        /// however often an owner writes.
        slot: Option<String>,
        /// Records of the slot kept, this one included (1: the latest
        /// alone). Ignored without a slot.
        keep: u32,
        body: String,
    },
    /// A match and every record of it, gone (an expired finished match).
    RemoveMatch { id: String },
}

impl PlayerThreeWrite {
    /// The match the write belongs to.
    pub fn match_id(&self) -> &str {
        match self {
            PlayerThreeWrite::Match { id, .. } | PlayerThreeWrite::RemoveMatch { id } => id,
            PlayerThreeWrite::Record { match_id, .. } => match_id,
        }
    }
}

impl StoreWrite for PlayerThreeWrite {
    fn bytes(&self) -> usize {
        match self {
            PlayerThreeWrite::Record { body, .. } => 96 + body.len(),
            _ => 160,
        }
    }
}

/// The durable state PlayerThree needs.
pub trait PlayerThreeStore: UnitStore<PlayerThreeWrite> {
    /// Every stored match with its records in order, but for the ones
    /// restore does not read ([`LOG_KINDS`]).
    fn load_matches(&self) -> Result<Vec<StoredMatch>, StoreError>;
    /// One stored match as [`load_matches`](Self::load_matches) has it
    /// (a node taking it over reads it alone).
    fn load_match(&self, id: &str) -> Result<Option<StoredMatch>, StoreError>;
    /// The match that minted the token with this hash (64 hex digits), if
    /// any: a node asked for a token of a match it does not run.
    fn match_of_token(&self, token_hash_hex: &str) -> Result<Option<String>, StoreError>;
    /// Applies writes in order, all or nothing.
    fn apply_playerthree(&self, writes: &[PlayerThreeWrite]) -> Result<(), StoreError>;
}

impl PlayerThreeStore for SqliteStore {
    fn load_matches(&self) -> Result<Vec<StoredMatch>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut stmt = conn.prepare(
            "SELECT id, game, operator_token, created_at_ms FROM playerthree_matches ORDER BY created_at_ms, id",
        )?;
        let mut matches = stmt
            .query_map([], |r| {
                Ok(StoredMatch {
                    id: r.get(0)?,
                    game: r.get(1)?,
                    operator_token_hash: r.get(2)?,
                    created_at_ms: r.get::<_, i64>(3)? as u64,
                    records: Vec::new(),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let logs: Vec<String> = LOG_KINDS.iter().map(|k| format!("'{k}'")).collect();
        let mut records = conn.prepare(&format!(
            "SELECT body FROM playerthree_records WHERE match_id = ?1 AND kind NOT IN ({}) ORDER BY seq",
            logs.join(", ")
        ))?;
        for m in &mut matches {
            m.records = records
                .query_map([&m.id], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
        }
        Ok(matches)
    }

    fn load_match(&self, id: &str) -> Result<Option<StoredMatch>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut stmt = conn.prepare(
            "SELECT id, game, operator_token, created_at_ms FROM playerthree_matches WHERE id = ?1",
        )?;
        let mut found = stmt
            .query_map([id], |r| {
                Ok(StoredMatch {
                    id: r.get(0)?,
                    game: r.get(1)?,
                    operator_token_hash: r.get(2)?,
                    created_at_ms: r.get::<_, i64>(3)? as u64,
                    records: Vec::new(),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let Some(mut m) = found.pop() else {
            return Ok(None);
        };
        let logs: Vec<String> = LOG_KINDS.iter().map(|k| format!("'{k}'")).collect();
        let mut records = conn.prepare(&format!(
            "SELECT body FROM playerthree_records WHERE match_id = ?1 AND kind NOT IN ({}) ORDER BY seq",
            logs.join(", ")
        ))?;
        m.records = records
            .query_map([&m.id], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        Ok(Some(m))
    }

    fn match_of_token(&self, token_hash_hex: &str) -> Result<Option<String>, StoreError> {
        if !is_hash_hex(token_hash_hex) {
            return Ok(None);
        }
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut stmt = conn.prepare_cached(MATCH_OF_TOKEN_SQL)?;
        let found = stmt
            .query_map([token_hash_hex], |r| r.get(0))?
            .next()
            .transpose()?;
        Ok(found)
    }

    fn apply_playerthree(&self, writes: &[PlayerThreeWrite]) -> Result<(), StoreError> {
        self.apply_all(writes, apply_playerthree)
    }
}

/// A token hash as records hold it: 64 lowercase hex digits (anything else
/// is never looked up).
pub(crate) fn is_hash_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl UnitStore<PlayerThreeWrite> for SqliteStore {
    fn apply_units(&self, units: &[Unit<'_, PlayerThreeWrite>]) -> UnitResults {
        self.apply_units_with(units, apply_playerthree)
    }

    fn try_apply_units_now(&self, units: &[Unit<'_, PlayerThreeWrite>]) -> Option<UnitResults> {
        self.try_apply_units_with(units, apply_playerthree)
    }
}

fn apply_playerthree(tx: &Connection, w: &PlayerThreeWrite) -> Result<(), StoreError> {
    match w {
        PlayerThreeWrite::Match {
            id,
            game,
            operator_token_hash,
            created_at_ms,
        } => {
            tx.prepare_cached(
                "INSERT OR IGNORE INTO playerthree_matches (id, game, operator_token, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![id, game, operator_token_hash, *created_at_ms as i64])?;
        }
        PlayerThreeWrite::RemoveMatch { id } => {
            // Records first: the cascade needs foreign keys on, and this
            // holds without them too.
            tx.prepare_cached("DELETE FROM playerthree_records WHERE match_id = ?1")?
                .execute(params![id])?;
            tx.prepare_cached("DELETE FROM playerthree_matches WHERE id = ?1")?
                .execute(params![id])?;
        }
        PlayerThreeWrite::Record {
            match_id,
            kind,
            tick,
            slot,
            keep,
            body,
        } => {
            if let Some(slot) = slot {
                // The slot's newest `keep - 1` stay beside this one; the
                // (match, slot) index finds them without a scan.
                tx.prepare_cached(
                    "DELETE FROM playerthree_records WHERE match_id = ?1 AND slot = ?2 AND seq NOT IN
                     (SELECT seq FROM playerthree_records WHERE match_id = ?1 AND slot = ?2 ORDER BY seq DESC LIMIT ?3)",
                )?
                .execute(params![match_id, slot, keep.saturating_sub(1)])?;
            }
            tx.prepare_cached(
                "INSERT INTO playerthree_records (match_id, kind, tick, slot, body) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![match_id, kind, tick.map(|t| t as i64), slot, body])?;
        }
    }
    Ok(())
}
