//! Hosted Memizy sessions on PostgreSQL (see [`crate::sessions`]).

use super::{ms, PgStore, Tx};
use crate::sessions::{
    SessionStore, SessionWrite, StoredBatch, StoredPluginData, StoredRecording, StoredSession,
};
use crate::{StoreError, Unit, UnitResults, UnitStore};

impl UnitStore<SessionWrite> for PgStore {
    fn apply_units(&self, units: &[Unit<'_, SessionWrite>]) -> UnitResults {
        self.apply_units_with(crate::lease::UnitKind::HostedSession, units, apply_session)
    }
}

fn apply_session(tx: &mut Tx<'_, '_>, w: &SessionWrite) -> Result<(), StoreError> {
    match w {
        SessionWrite::Session(s) => {
            tx.execute(
                "INSERT INTO memizy_sessions (id, host_token, created_at_ms, spec) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (id) DO UPDATE SET host_token = EXCLUDED.host_token,
                     created_at_ms = EXCLUDED.created_at_ms, spec = EXCLUDED.spec",
                &[&s.id, &s.host_token, &ms(s.created_at_ms), &s.spec],
            )?;
        }
        SessionWrite::Snapshot {
            session_id,
            snapshot,
            game_time_ms,
        } => {
            tx.execute(
                "INSERT INTO memizy_snapshots (session_id, snapshot, game_time_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (session_id) DO UPDATE SET snapshot = EXCLUDED.snapshot,
                     game_time_ms = EXCLUDED.game_time_ms",
                &[session_id, snapshot, &game_time_ms.map(ms)],
            )?;
        }
        SessionWrite::State { session_id, state } => {
            tx.execute(
                "INSERT INTO memizy_session_state (session_id, state) VALUES ($1, $2)
                 ON CONFLICT (session_id) DO UPDATE SET state = EXCLUDED.state",
                &[session_id, state],
            )?;
        }
        SessionWrite::SnapshotDiscarded { session_id } => {
            tx.execute(
                "DELETE FROM memizy_snapshots WHERE session_id = $1",
                &[session_id],
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
                "INSERT INTO memizy_plugin_data (user_id, plugin_id, scope, set_id, value) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (user_id, plugin_id, scope, set_id) DO UPDATE SET value = EXCLUDED.value",
                &[user, plugin_id, scope, set_id, value],
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
                "INSERT INTO memizy_answers (session_id, user_id, item_id, body) VALUES ($1, $2, $3, $4)",
                &[session_id, user, item_id, body],
            )?;
            if let Some(p) = progress {
                tx.execute(
                    "INSERT INTO memizy_progress (user_id, set_id, item_id, record) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (user_id, set_id, item_id) DO UPDATE SET record = EXCLUDED.record",
                    &[user, set_id, item_id, p],
                )?;
            }
        }
        SessionWrite::Recording {
            session_id,
            body,
            at_ms,
        } => {
            tx.execute(
                "INSERT INTO memizy_recordings (session_id, body, at_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (session_id) DO UPDATE SET body = EXCLUDED.body, at_ms = EXCLUDED.at_ms",
                &[session_id, body, &ms(*at_ms)],
            )?;
        }
        SessionWrite::RecordingEntries {
            session_id,
            first_seq,
            entries,
        } => {
            tx.execute(
                "INSERT INTO memizy_recording_batches (session_id, first_seq, count, entries) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (session_id, first_seq) DO UPDATE SET count = EXCLUDED.count, entries = EXCLUDED.entries",
                &[
                    session_id,
                    &ms(*first_seq),
                    &(entries.len() as i64),
                    &entries.join(","),
                ],
            )?;
        }
        SessionWrite::Result {
            session_id,
            result,
            at_ms,
        } => {
            tx.execute(
                "INSERT INTO memizy_results (session_id, result, at_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (session_id) DO UPDATE SET result = EXCLUDED.result, at_ms = EXCLUDED.at_ms",
                &[session_id, result, &ms(*at_ms)],
            )?;
        }
        SessionWrite::SavedGame { session_id, body } => {
            tx.execute(
                "INSERT INTO memizy_saved_games (session_id, body) VALUES ($1, $2)
                 ON CONFLICT (session_id) DO UPDATE SET body = EXCLUDED.body",
                &[session_id, body],
            )?;
        }
        SessionWrite::PlayerToken {
            session_id,
            player_id,
            token,
        } => {
            // A player that has a token keeps it.
            tx.execute(
                "INSERT INTO memizy_player_tokens (session_id, player_id, token) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                &[session_id, player_id, token],
            )?;
        }
        SessionWrite::Asset {
            session_id,
            file,
            bytes,
        } => {
            tx.execute(
                "INSERT INTO memizy_assets (session_id, file, bytes) VALUES ($1, $2, $3)
                 ON CONFLICT (session_id, file) DO UPDATE SET bytes = EXCLUDED.bytes",
                &[session_id, file, bytes],
            )?;
        }
        SessionWrite::Removed { session_id } => {
            tx.execute("DELETE FROM memizy_sessions WHERE id = $1", &[session_id])?;
            for sql in [
                "DELETE FROM memizy_snapshots WHERE session_id = $1",
                "DELETE FROM memizy_answers WHERE session_id = $1",
                "DELETE FROM memizy_results WHERE session_id = $1",
                "DELETE FROM memizy_recordings WHERE session_id = $1",
                "DELETE FROM memizy_recording_batches WHERE session_id = $1",
                "DELETE FROM memizy_saved_games WHERE session_id = $1",
                "DELETE FROM memizy_player_tokens WHERE session_id = $1",
                "DELETE FROM memizy_assets WHERE session_id = $1",
                "DELETE FROM memizy_session_state WHERE session_id = $1",
            ] {
                tx.execute(sql, &[session_id])?;
            }
        }
    }
    Ok(())
}

impl PgStore {
    fn one_text(&self, sql: &'static str, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.query(sql, &[&key])?.first().map(|r| r.get(0)))
    }
}

impl SessionStore for PgStore {
    fn apply_sessions(&self, writes: &[SessionWrite]) -> Result<(), StoreError> {
        self.apply_all(writes, apply_session)
    }

    fn list_session_ids(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .query("SELECT id FROM memizy_sessions ORDER BY ord", &[])?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    fn load_session(&self, id: &str) -> Result<Option<StoredSession>, StoreError> {
        Ok(self
            .query(
                "SELECT id, host_token, created_at_ms, spec FROM memizy_sessions WHERE id = $1",
                &[&id],
            )?
            .first()
            .map(|r| StoredSession {
                id: r.get(0),
                host_token: r.get(1),
                created_at_ms: r.get::<_, i64>(2) as u64,
                spec: r.get(3),
            }))
    }

    fn load_snapshot(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        self.one_text(
            "SELECT snapshot FROM memizy_snapshots WHERE session_id = $1",
            session_id,
        )
    }

    fn load_snapshot_at(
        &self,
        session_id: &str,
    ) -> Result<Option<(String, Option<u64>)>, StoreError> {
        Ok(self
            .query(
                "SELECT snapshot, game_time_ms FROM memizy_snapshots WHERE session_id = $1",
                &[&session_id],
            )?
            .first()
            .map(|r| {
                (
                    r.get(0),
                    r.get::<_, Option<i64>>(1).map(|t| t.max(0) as u64),
                )
            }))
    }

    fn load_state(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        self.one_text(
            "SELECT state FROM memizy_session_state WHERE session_id = $1",
            session_id,
        )
    }

    fn load_saved_game(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        self.one_text(
            "SELECT body FROM memizy_saved_games WHERE session_id = $1",
            session_id,
        )
    }

    fn load_result(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        self.one_text(
            "SELECT result FROM memizy_results WHERE session_id = $1",
            session_id,
        )
    }

    fn load_recording(&self, session_id: &str) -> Result<Option<StoredRecording>, StoreError> {
        // The head and the entries from one snapshot.
        self.read(|tx| {
            let head = tx
                .query_opt(
                    "SELECT body FROM memizy_recordings WHERE session_id = $1",
                    &[&session_id],
                )?
                .map(|r| r.get::<_, String>(0));
            let batches: Vec<StoredBatch> = tx
                .query(
                    "SELECT first_seq, count, entries FROM memizy_recording_batches
                     WHERE session_id = $1 ORDER BY first_seq",
                    &[&session_id],
                )?
                .iter()
                .map(|r| StoredBatch {
                    first_seq: r.get::<_, i64>(0).max(0) as u64,
                    count: r.get::<_, i64>(1).max(0) as u64,
                    entries: r.get(2),
                })
                .collect();
            Ok(
                (head.is_some() || !batches.is_empty())
                    .then_some(StoredRecording { head, batches }),
            )
        })
    }

    fn load_plugin_data(
        &self,
        user: &str,
        plugin_id: &str,
        set_id: &str,
    ) -> Result<StoredPluginData, StoreError> {
        self.read(|tx| {
            let stmt = tx.prepare(
                "SELECT value FROM memizy_plugin_data
                 WHERE user_id = $1 AND plugin_id = $2 AND scope = $3 AND set_id = $4",
            )?;
            let mut get = |scope: &str, set: &str| -> Result<Option<String>, StoreError> {
                Ok(tx
                    .query_opt(&stmt, &[&user, &plugin_id, &scope, &set])?
                    .map(|r| r.get(0)))
            };
            Ok(StoredPluginData {
                plugin: get("plugin", "")?,
                set: get("set", set_id)?,
            })
        })
    }

    fn load_progress(&self, user: &str, set_id: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(self
            .query(
                "SELECT item_id, record FROM memizy_progress WHERE user_id = $1 AND set_id = $2 ORDER BY item_id",
                &[&user, &set_id],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    fn count_answers(&self, session_id: &str) -> Result<u64, StoreError> {
        let rows = self.query(
            "SELECT COUNT(*) FROM memizy_answers WHERE session_id = $1",
            &[&session_id],
        )?;
        Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0)) as u64)
    }

    fn load_player_tokens(&self, session_id: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(self
            .query(
                "SELECT player_id, token FROM memizy_player_tokens WHERE session_id = $1 ORDER BY player_id",
                &[&session_id],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    fn list_assets(&self, session_id: &str) -> Result<Vec<(String, usize)>, StoreError> {
        Ok(self
            .query(
                "SELECT file, octet_length(bytes)::BIGINT FROM memizy_assets WHERE session_id = $1 ORDER BY file",
                &[&session_id],
            )?
            .iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1).max(0) as usize))
            .collect())
    }

    fn load_asset(&self, session_id: &str, file: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .query(
                "SELECT bytes FROM memizy_assets WHERE session_id = $1 AND file = $2",
                &[&session_id, &file],
            )?
            .first()
            .map(|r| r.get(0)))
    }
}
