//! What hosted Memizy sessions keep across a restart: each session's bundle
//! (plugin HTML, set, how it was created), the authority's latest snapshot,
//! plugin data per user and plugin id per scope, learning progress per user,
//! set and item, the statistics row of every answer, results, saved
//! games, the token each player's device attaches with, and the bundle's
//! asset files. Values are stored as the JSON text the protocol crate writes; the
//! store does not depend on the protocol crate.

use crate::{SqliteStore, StoreError, StoreWrite, Unit, UnitResults, UnitStore};
use rusqlite::{params, Connection, OptionalExtension};

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS memizy_sessions (
    id TEXT PRIMARY KEY,
    host_token TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS memizy_snapshots (
    session_id TEXT PRIMARY KEY,
    snapshot TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS memizy_plugin_data (
    user TEXT NOT NULL,
    plugin_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    set_id TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (user, plugin_id, scope, set_id)
);
CREATE TABLE IF NOT EXISTS memizy_progress (
    user TEXT NOT NULL,
    set_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (user, set_id, item_id)
);
CREATE TABLE IF NOT EXISTS memizy_answers (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    user TEXT NOT NULL,
    item_id TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS memizy_results (
    session_id TEXT PRIMARY KEY,
    result TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS memizy_recordings (
    session_id TEXT PRIMARY KEY,
    body TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS memizy_recording_batches (
    session_id TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    count INTEGER NOT NULL,
    entries TEXT NOT NULL,
    PRIMARY KEY (session_id, first_seq)
);
CREATE TABLE IF NOT EXISTS memizy_saved_games (
    session_id TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS memizy_player_tokens (
    session_id TEXT NOT NULL,
    player_id TEXT NOT NULL,
    token TEXT NOT NULL,
    PRIMARY KEY (session_id, player_id)
);
CREATE TABLE IF NOT EXISTS memizy_assets (
    session_id TEXT NOT NULL,
    file TEXT NOT NULL,
    bytes BLOB NOT NULL,
    PRIMARY KEY (session_id, file)
);
CREATE TABLE IF NOT EXISTS memizy_session_state (
    session_id TEXT PRIMARY KEY,
    state TEXT NOT NULL
);
";

/// The game time of the latest snapshot, added to a file from before it
/// (its rows read as NULL: no game time known).
const SNAPSHOT_GAME_TIME: &str = "
ALTER TABLE memizy_snapshots ADD COLUMN game_time_ms INTEGER;
";

/// Creates the hosted-session tables (the SQLite store calls it at open).
pub(crate) fn create_tables(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(SCHEMA)?;
    let has: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('memizy_snapshots') WHERE name = 'game_time_ms'")?
        .exists([])?;
    if !has {
        conn.execute_batch(SNAPSHOT_GAME_TIME)?;
    }
    Ok(())
}

/// A session as created through the HTTP API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSession {
    pub id: String,
    pub host_token: String,
    pub created_at_ms: u64,
    /// The creation request (bundle, settings, players) as JSON text.
    pub spec: String,
}

/// One durable change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionWrite {
    Session(StoredSession),
    /// The authority's latest snapshot and the game time when it was
    /// written (a game brought back by a restart resumes from both).
    Snapshot {
        session_id: String,
        snapshot: String,
        game_time_ms: Option<u64>,
    },
    SnapshotDiscarded {
        session_id: String,
    },
    /// Plugin data of a user for a plugin; `set_id` is empty for scope
    /// `plugin`.
    PluginData {
        user: String,
        plugin_id: String,
        scope: String,
        set_id: String,
        value: String,
    },
    /// An answer's statistics row and, for a set item, the new progress
    /// record.
    Answer {
        session_id: String,
        user: String,
        set_id: String,
        item_id: String,
        body: String,
        progress: Option<String>,
    },
    Result {
        session_id: String,
        result: String,
        at_ms: u64,
    },
    /// The head of the session's recording for a replay (SPEC 10,
    /// `replay`): one JSON object (the authority's `InitPayload`, the
    /// display seed, whether the record was truncated), replaced as a
    /// whole. A head written before the entries were kept apart holds
    /// its entries too.
    Recording {
        session_id: String,
        body: String,
        at_ms: u64,
    },
    /// A batch of the recording's entries (each an action, start, pause,
    /// resume or end as JSON text), numbered from `first_seq`: one row,
    /// its entries joined by commas. A batch written again from the same
    /// `first_seq` replaces the row.
    RecordingEntries {
        session_id: String,
        first_seq: u64,
        entries: Vec<String>,
    },
    SavedGame {
        session_id: String,
        body: String,
    },
    /// The token a player's device attaches with. A player that has one
    /// keeps it (a re-added or continued player's device still works).
    PlayerToken {
        session_id: String,
        player_id: String,
        token: String,
    },
    /// One file of the session's bundle, served by `getAsset`.
    Asset {
        session_id: String,
        file: String,
        bytes: Vec<u8>,
    },
    /// What a restart brings the session back as (its phase, roster and
    /// settings, as JSON text the server writes); replaced on each change.
    State {
        session_id: String,
        state: String,
    },
    /// The session expired: every row keyed by it goes (its bundle,
    /// snapshot, answers, result, saved game, player tokens, assets).
    /// Plugin data and progress are the learner's, keyed by user, and stay.
    Removed {
        session_id: String,
    },
}

/// A kept recording: its head (`None` if only entries were written) and
/// its batches of entries by `first_seq`. A batch written again from an
/// earlier entry (after a refused write) may overlap later rows: the
/// record is the chain of batches that start where the one before ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredRecording {
    pub head: Option<String>,
    pub batches: Vec<StoredBatch>,
}

/// One batch of a recording's entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredBatch {
    pub first_seq: u64,
    pub count: u64,
    /// The entries' JSON texts joined by commas.
    pub entries: String,
}

/// Plugin data of one user for one plugin: scope `plugin` and scope `set`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredPluginData {
    pub plugin: Option<String>,
    pub set: Option<String>,
}

impl StoreWrite for SessionWrite {
    fn bytes(&self) -> usize {
        128 + match self {
            SessionWrite::Session(s) => s.spec.len(),
            SessionWrite::Snapshot { snapshot, .. } => snapshot.len(),
            SessionWrite::PluginData { value, .. } => value.len(),
            SessionWrite::Answer { body, progress, .. } => {
                body.len() + progress.as_ref().map_or(0, String::len)
            }
            SessionWrite::Result { result, .. } => result.len(),
            SessionWrite::Recording { body, .. } => body.len(),
            SessionWrite::RecordingEntries { entries, .. } => {
                entries.iter().map(|e| e.len() + 16).sum()
            }
            SessionWrite::SavedGame { body, .. } => body.len(),
            SessionWrite::State { state, .. } => state.len(),
            SessionWrite::Asset { bytes, .. } => bytes.len(),
            SessionWrite::SnapshotDiscarded { .. }
            | SessionWrite::PlayerToken { .. }
            | SessionWrite::Removed { .. } => 0,
        }
    }
}

/// The durable state hosted sessions need.
pub trait SessionStore: UnitStore<SessionWrite> {
    /// Applies writes in order, all or nothing; `Ok` means durable.
    fn apply_sessions(&self, writes: &[SessionWrite]) -> Result<(), StoreError>;
    fn load_session(&self, id: &str) -> Result<Option<StoredSession>, StoreError>;
    fn load_snapshot(&self, session_id: &str) -> Result<Option<String>, StoreError>;
    /// The latest snapshot and the game time it was written at (`None`
    /// for a row from before game times were kept).
    fn load_snapshot_at(
        &self,
        session_id: &str,
    ) -> Result<Option<(String, Option<u64>)>, StoreError>;
    /// What a restart brings the session back as (`None`: a session from
    /// before this was kept, or none).
    fn load_state(&self, session_id: &str) -> Result<Option<String>, StoreError>;
    fn load_saved_game(&self, session_id: &str) -> Result<Option<String>, StoreError>;
    fn load_result(&self, session_id: &str) -> Result<Option<String>, StoreError>;
    /// The session's recording (`SessionWrite::Recording` and
    /// `SessionWrite::RecordingEntries`), read together; `None` if nothing
    /// of it was kept.
    fn load_recording(&self, session_id: &str) -> Result<Option<StoredRecording>, StoreError>;
    fn load_plugin_data(
        &self,
        user: &str,
        plugin_id: &str,
        set_id: &str,
    ) -> Result<StoredPluginData, StoreError>;
    /// The user's progress records for a set: (item id, record JSON).
    fn load_progress(&self, user: &str, set_id: &str) -> Result<Vec<(String, String)>, StoreError>;
    /// How many answers a session recorded.
    fn count_answers(&self, session_id: &str) -> Result<u64, StoreError>;
    /// The players' tokens of a session: (player id, token).
    fn load_player_tokens(&self, session_id: &str) -> Result<Vec<(String, String)>, StoreError>;
    /// The bundle's files of a session and their sizes: (file, bytes).
    fn list_assets(&self, session_id: &str) -> Result<Vec<(String, usize)>, StoreError>;
    /// One file of a session's bundle.
    fn load_asset(&self, session_id: &str, file: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// The id of every stored session.
    fn list_session_ids(&self) -> Result<Vec<String>, StoreError>;
}

impl UnitStore<SessionWrite> for SqliteStore {
    fn apply_units(&self, units: &[Unit<'_, SessionWrite>]) -> UnitResults {
        self.apply_units_with(units, apply_session)
    }

    fn try_apply_units_now(&self, units: &[Unit<'_, SessionWrite>]) -> Option<UnitResults> {
        self.try_apply_units_with(units, apply_session)
    }
}

fn apply_session(tx: &Connection, w: &SessionWrite) -> Result<(), StoreError> {
    match w {
        SessionWrite::Session(s) => {
            tx.execute(
                "INSERT OR REPLACE INTO memizy_sessions (id, host_token, created_at_ms, spec) VALUES (?1, ?2, ?3, ?4)",
                params![s.id, s.host_token, s.created_at_ms as i64, s.spec],
            )?;
        }
        SessionWrite::Snapshot {
            session_id,
            snapshot,
            game_time_ms,
        } => {
            tx.execute(
                "INSERT OR REPLACE INTO memizy_snapshots (session_id, snapshot, game_time_ms) VALUES (?1, ?2, ?3)",
                params![session_id, snapshot, game_time_ms.map(|t| t as i64)],
            )?;
        }
        SessionWrite::State { session_id, state } => {
            tx.execute(
                "INSERT OR REPLACE INTO memizy_session_state (session_id, state) VALUES (?1, ?2)",
                params![session_id, state],
            )?;
        }
        SessionWrite::SnapshotDiscarded { session_id } => {
            tx.execute(
                "DELETE FROM memizy_snapshots WHERE session_id = ?1",
                params![session_id],
            )?;
        }
        SessionWrite::PluginData {
            user,
            plugin_id,
            scope,
            set_id,
            value,
        } => {
            tx.execute(
                "INSERT OR REPLACE INTO memizy_plugin_data (user, plugin_id, scope, set_id, value) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![user, plugin_id, scope, set_id, value],
            )?;
        }
        SessionWrite::Answer {
            session_id,
            user,
            set_id,
            item_id,
            body,
            progress,
        } => {
            tx.execute(
                "INSERT INTO memizy_answers (session_id, user, item_id, body) VALUES (?1, ?2, ?3, ?4)",
                params![session_id, user, item_id, body],
            )?;
            if let Some(p) = progress {
                tx.execute(
                    "INSERT OR REPLACE INTO memizy_progress (user, set_id, item_id, record) VALUES (?1, ?2, ?3, ?4)",
                    params![user, set_id, item_id, p],
                )?;
            }
        }
        SessionWrite::Recording {
            session_id,
            body,
            at_ms,
        } => {
            tx.execute(
                "INSERT OR REPLACE INTO memizy_recordings (session_id, body, at_ms) VALUES (?1, ?2, ?3)",
                params![session_id, body, *at_ms as i64],
            )?;
        }
        SessionWrite::RecordingEntries {
            session_id,
            first_seq,
            entries,
        } => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO memizy_recording_batches (session_id, first_seq, count, entries) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                session_id,
                *first_seq as i64,
                entries.len() as i64,
                entries.join(",")
            ])?;
        }
        SessionWrite::Result {
            session_id,
            result,
            at_ms,
        } => {
            tx.execute(
                "INSERT OR REPLACE INTO memizy_results (session_id, result, at_ms) VALUES (?1, ?2, ?3)",
                params![session_id, result, *at_ms as i64],
            )?;
        }
        SessionWrite::SavedGame { session_id, body } => {
            tx.execute(
                "INSERT OR REPLACE INTO memizy_saved_games (session_id, body) VALUES (?1, ?2)",
                params![session_id, body],
            )?;
        }
        SessionWrite::PlayerToken {
            session_id,
            player_id,
            token,
        } => {
            tx.execute(
                "INSERT OR IGNORE INTO memizy_player_tokens (session_id, player_id, token) VALUES (?1, ?2, ?3)",
                params![session_id, player_id, token],
            )?;
        }
        SessionWrite::Asset {
            session_id,
            file,
            bytes,
        } => {
            tx.execute(
                "INSERT OR REPLACE INTO memizy_assets (session_id, file, bytes) VALUES (?1, ?2, ?3)",
                params![session_id, file, bytes],
            )?;
        }
        SessionWrite::Removed { session_id } => {
            tx.execute(
                "DELETE FROM memizy_sessions WHERE id = ?1",
                params![session_id],
            )?;
            for table in [
                "memizy_snapshots",
                "memizy_answers",
                "memizy_results",
                "memizy_recordings",
                "memizy_recording_batches",
                "memizy_saved_games",
                "memizy_player_tokens",
                "memizy_assets",
                "memizy_session_state",
            ] {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE session_id = ?1"),
                    params![session_id],
                )?;
            }
        }
    }
    Ok(())
}

impl SessionStore for SqliteStore {
    fn apply_sessions(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        self.apply_all(writes, apply_session)
    }

    fn list_session_ids(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut st = conn.prepare("SELECT id FROM memizy_sessions ORDER BY rowid")?;
        let ids = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ids)
    }

    fn load_session(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        Ok(conn
            .query_row(
                "SELECT id, host_token, created_at_ms, spec FROM memizy_sessions WHERE id = ?1",
                [id],
                |r| {
                    Ok(StoredSession {
                        id: r.get(0)?,
                        host_token: r.get(1)?,
                        created_at_ms: r.get::<_, i64>(2)? as u64,
                        spec: r.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    fn load_snapshot(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        one_text(
            self,
            "SELECT snapshot FROM memizy_snapshots WHERE session_id = ?1",
            session_id,
        )
    }

    fn load_snapshot_at(
        &self,
        session_id: &str,
    ) -> Result<Option<(String, Option<u64>)>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        Ok(conn
            .query_row(
                "SELECT snapshot, game_time_ms FROM memizy_snapshots WHERE session_id = ?1",
                [session_id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Option<i64>>(1)?.map(|t| t.max(0) as u64),
                    ))
                },
            )
            .optional()?)
    }

    fn load_state(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        one_text(
            self,
            "SELECT state FROM memizy_session_state WHERE session_id = ?1",
            session_id,
        )
    }

    fn load_saved_game(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        one_text(
            self,
            "SELECT body FROM memizy_saved_games WHERE session_id = ?1",
            session_id,
        )
    }

    fn load_result(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        one_text(
            self,
            "SELECT result FROM memizy_results WHERE session_id = ?1",
            session_id,
        )
    }

    fn load_recording(&self, session_id: &str) -> Result<Option<StoredRecording>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let head = conn
            .query_row(
                "SELECT body FROM memizy_recordings WHERE session_id = ?1",
                [session_id],
                |r| r.get::<_, String>(0),
            )
            .optional()?;
        let batches = conn
            .prepare_cached(
                "SELECT first_seq, count, entries FROM memizy_recording_batches WHERE session_id = ?1 ORDER BY first_seq",
            )?
            .query_map([session_id], |r| {
                Ok(StoredBatch {
                    first_seq: r.get::<_, i64>(0)?.max(0) as u64,
                    count: r.get::<_, i64>(1)?.max(0) as u64,
                    entries: r.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok((head.is_some() || !batches.is_empty()).then_some(StoredRecording { head, batches }))
    }

    fn load_plugin_data(
        &self,
        user: &str,
        plugin_id: &str,
        set_id: &str,
    ) -> Result<StoredPluginData, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let get = |scope: &str, set: &str| {
            conn.query_row(
                "SELECT value FROM memizy_plugin_data WHERE user = ?1 AND plugin_id = ?2 AND scope = ?3 AND set_id = ?4",
                params![user, plugin_id, scope, set],
                |r| r.get::<_, String>(0),
            )
            .optional()
        };
        Ok(StoredPluginData {
            plugin: get("plugin", "")?,
            set: get("set", set_id)?,
        })
    }

    fn load_progress(&self, user: &str, set_id: &str) -> Result<Vec<(String, String)>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut stmt = conn.prepare(
            "SELECT item_id, record FROM memizy_progress WHERE user = ?1 AND set_id = ?2 ORDER BY item_id",
        )?;
        let rows = stmt
            .query_map(params![user, set_id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    fn count_answers(&self, session_id: &str) -> Result<u64, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let n: i64 = conn.query_row(
            "SELECT COUNT(*) FROM memizy_answers WHERE session_id = ?1",
            [session_id],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    fn load_player_tokens(&self, session_id: &str) -> Result<Vec<(String, String)>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut stmt = conn.prepare(
            "SELECT player_id, token FROM memizy_player_tokens WHERE session_id = ?1 ORDER BY player_id",
        )?;
        let rows = stmt
            .query_map([session_id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    fn list_assets(&self, session_id: &str) -> Result<Vec<(String, usize)>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut stmt = conn.prepare(
            "SELECT file, length(bytes) FROM memizy_assets WHERE session_id = ?1 ORDER BY file",
        )?;
        let rows = stmt
            .query_map([session_id], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as usize))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    fn load_asset(&self, session_id: &str, file: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        Ok(conn
            .query_row(
                "SELECT bytes FROM memizy_assets WHERE session_id = ?1 AND file = ?2",
                params![session_id, file],
                |r| r.get(0),
            )
            .optional()?)
    }
}

fn one_text(store: &SqliteStore, sql: &str, key: &str) -> Result<Option<String>, StoreError> {
    let conn = store.conn.lock().map_err(|_| StoreError::Poisoned)?;
    Ok(conn.query_row(sql, [key], |r| r.get(0)).optional()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_from_before_game_times_and_states_opens_and_keeps_its_snapshot() {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-store-sessions-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("old.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE memizy_snapshots (session_id TEXT PRIMARY KEY, snapshot TEXT NOT NULL);
                 INSERT INTO memizy_snapshots VALUES ('s', '{\"round\":3}');",
            )
            .unwrap();
        }
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(
            s.load_snapshot_at("s").unwrap(),
            Some(("{\"round\":3}".to_owned(), None))
        );
        assert_eq!(s.load_state("s").unwrap(), None);
        s.apply_sessions(&[SessionWrite::State {
            session_id: "s".into(),
            state: "{\"phase\":\"lobby\"}".into(),
        }])
        .unwrap();
        assert_eq!(
            s.load_state("s").unwrap().as_deref(),
            Some("{\"phase\":\"lobby\"}")
        );
        s.apply_sessions(&[SessionWrite::Removed {
            session_id: "s".into(),
        }])
        .unwrap();
        assert_eq!(s.load_state("s").unwrap(), None);
        assert_eq!(s.load_snapshot_at("s").unwrap(), None);
        drop(s);
        // Opened a second time: the column is there, nothing is added twice.
        SqliteStore::open(&path).unwrap();
    }
}
