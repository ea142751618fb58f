//! What the ggui live channel keeps across a restart: each session's row
//! (app, action spec, stream spec, host context, props, version override),
//! its event ledger, its stream buffer and three counters (the ledger's last
//! `seq`, the stream's last `seq`, the drained cursor).
//!
//! Rows are opaque JSON written by the server (this crate knows no protocol
//! crate); the counters are columns so that a restart resumes them even
//! when the entries they cover were trimmed.

use crate::{SqliteStore, StoreError, StoreWrite, Unit, UnitResults, UnitStore};
use rusqlite::{params, Connection};

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS ggui_sessions (
    session_id TEXT PRIMARY KEY,
    record TEXT,
    -- The host context (JSON) when it changed after the row was written;
    -- NULL: the row's own.
    host_context TEXT,
    ledger_last INTEGER NOT NULL DEFAULT 0,
    stream_seq INTEGER NOT NULL DEFAULT 0,
    drained_up_to INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ggui_ledger (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ggui_stream (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
";

/// Creates the ggui tables (the SQLite store calls this at open).
pub(crate) fn create_tables(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(SCHEMA)?;
    // A file from before the host context had its own column.
    let has: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('ggui_sessions') WHERE name = 'host_context'")?
        .exists([])?;
    if !has {
        conn.execute_batch("ALTER TABLE ggui_sessions ADD COLUMN host_context TEXT")?;
    }
    for (table, value) in [("ggui_ledger", "event"), ("ggui_stream", "entry")] {
        without_rowid(conn, table, value)?;
    }
    Ok(())
}

/// A file from before schema version 2 keeps the ledger and the stream in
/// tables with a rowid: their rows are copied into the clustered form (one
/// b-tree keyed by session and `seq`, so an entry's commit writes one page
/// where it wrote two).
fn without_rowid(conn: &Connection, table: &str, value: &str) -> Result<(), StoreError> {
    let sql: String = conn.query_row(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1",
        params![table],
        |r| r.get(0),
    )?;
    if sql.contains("WITHOUT ROWID") {
        return Ok(());
    }
    conn.execute_batch(&format!(
        "CREATE TABLE {table}_v2 (
             session_id TEXT NOT NULL,
             seq INTEGER NOT NULL,
             {value} TEXT NOT NULL,
             PRIMARY KEY (session_id, seq)
         ) WITHOUT ROWID;
         INSERT INTO {table}_v2 SELECT session_id, seq, {value} FROM {table};
         DROP TABLE {table};
         ALTER TABLE {table}_v2 RENAME TO {table};"
    ))?;
    Ok(())
}

/// One change to what is kept, applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GguiChange {
    /// Insert or replace the session's row (JSON).
    PutSession { session_id: String, record: String },
    /// The session's host context alone (JSON object): a frame that only
    /// changes it does not rewrite the row with its props.
    HostContext {
        session_id: String,
        host_context: String,
    },
    /// Append a ledger entry (JSON) with its `seq`.
    PutLedger {
        session_id: String,
        seq: u64,
        event: String,
    },
    /// Ledger entries up to `horizon` left the ledger.
    TrimLedger { session_id: String, horizon: u64 },
    /// Keep a stream buffer entry (JSON) with its `seq`.
    PutStream {
        session_id: String,
        seq: u64,
        entry: String,
    },
    /// The stream's `seq` advanced to this.
    StreamSeq { session_id: String, seq: u64 },
    /// These stream entries left the buffer.
    DropStream { session_id: String, seqs: Vec<u64> },
    /// Actions were drained up to this ledger `seq`.
    Drained { session_id: String, up_to: u64 },
    /// The session expired: its row, ledger and stream buffer go.
    RemoveSession { session_id: String },
}

/// A session as loaded at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GguiStoredSession {
    pub session_id: String,
    /// The session's row (JSON).
    pub record: String,
    /// The host context (JSON object) written after the row, which
    /// replaces the row's own; `None`: the row's own holds.
    pub host_context: Option<String>,
    /// Retained ledger entries (JSON), ascending `seq`.
    pub ledger: Vec<String>,
    pub ledger_last: u64,
    /// Retained stream entries (JSON), ascending `seq`.
    pub stream: Vec<String>,
    pub stream_seq: u64,
    pub drained_up_to: u64,
}

impl GguiChange {
    /// The session the change belongs to.
    pub fn session_id(&self) -> &str {
        match self {
            GguiChange::PutSession { session_id, .. }
            | GguiChange::HostContext { session_id, .. }
            | GguiChange::PutLedger { session_id, .. }
            | GguiChange::TrimLedger { session_id, .. }
            | GguiChange::PutStream { session_id, .. }
            | GguiChange::StreamSeq { session_id, .. }
            | GguiChange::DropStream { session_id, .. }
            | GguiChange::Drained { session_id, .. }
            | GguiChange::RemoveSession { session_id } => session_id,
        }
    }
}

impl StoreWrite for GguiChange {
    fn bytes(&self) -> usize {
        64 + match self {
            GguiChange::PutSession { record, .. } => record.len(),
            GguiChange::HostContext { host_context, .. } => host_context.len(),
            GguiChange::PutLedger { event, .. } => event.len(),
            GguiChange::PutStream { entry, .. } => entry.len(),
            GguiChange::DropStream { seqs, .. } => 8 * seqs.len(),
            _ => 0,
        }
    }
}

/// The ggui channel's durable state.
pub trait GguiStore: UnitStore<GguiChange> {
    /// Every session, with its ledger and stream buffer.
    fn ggui_load(&self) -> Result<Vec<GguiStoredSession>, StoreError>;
    /// One session, with its ledger and stream buffer (`None`: no such
    /// session, or a row without its record): what a node taking the
    /// session over reads.
    fn ggui_load_session(&self, session_id: &str) -> Result<Option<GguiStoredSession>, StoreError>;
    /// Applies changes in order, all or nothing.
    fn ggui_apply(&self, changes: &[GguiChange]) -> Result<(), StoreError>;
}

/// Runs a statement through the connection's statement cache: the
/// appliers run the same few statements for every change, and parsing
/// one each time costs more than running it.
fn exec(tx: &Connection, sql: &str, p: impl rusqlite::Params) -> Result<usize, StoreError> {
    Ok(tx.prepare_cached(sql)?.execute(p)?)
}

fn ensure_row(tx: &Connection, session_id: &str) -> Result<(), StoreError> {
    exec(
        tx,
        "INSERT INTO ggui_sessions (session_id) VALUES (?1) ON CONFLICT(session_id) DO NOTHING",
        params![session_id],
    )?;
    Ok(())
}

/// The columns every load reads of a session row.
const SESSION_COLUMNS: &str =
    "session_id, record, ledger_last, stream_seq, drained_up_to, host_context";

fn session_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<GguiStoredSession> {
    Ok(GguiStoredSession {
        session_id: r.get(0)?,
        record: r.get(1)?,
        ledger_last: r.get::<_, i64>(2)? as u64,
        stream_seq: r.get::<_, i64>(3)? as u64,
        drained_up_to: r.get::<_, i64>(4)? as u64,
        host_context: r.get(5)?,
        ..Default::default()
    })
}

/// Reads a session's ledger and stream buffer into it.
fn load_children(conn: &Connection, s: &mut GguiStoredSession) -> Result<(), StoreError> {
    let mut ledger = conn
        .prepare_cached("SELECT seq, event FROM ggui_ledger WHERE session_id = ?1 ORDER BY seq")?;
    let rows = ledger.query_map(params![s.session_id], |r| {
        Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?))
    })?;
    for e in rows {
        let (seq, event) = e?;
        // The row's counter is raised only when entries are trimmed: the
        // last entry kept says the rest.
        s.ledger_last = s.ledger_last.max(seq);
        s.ledger.push(event);
    }
    let mut stream =
        conn.prepare_cached("SELECT entry FROM ggui_stream WHERE session_id = ?1 ORDER BY seq")?;
    for e in stream.query_map(params![s.session_id], |r| r.get::<_, String>(0))? {
        s.stream.push(e?);
    }
    Ok(())
}

impl GguiStore for SqliteStore {
    fn ggui_load(&self) -> Result<Vec<GguiStoredSession>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let mut sessions = conn
            .prepare(&format!(
                "SELECT {SESSION_COLUMNS} FROM ggui_sessions WHERE record IS NOT NULL ORDER BY rowid"
            ))?
            .query_map([], session_row)?
            .collect::<Result<Vec<_>, _>>()?;
        for s in &mut sessions {
            load_children(&conn, s)?;
        }
        Ok(sessions)
    }

    fn ggui_load_session(&self, session_id: &str) -> Result<Option<GguiStoredSession>, StoreError> {
        let conn = self.conn.lock().map_err(|_| StoreError::Poisoned)?;
        let found = conn
            .prepare(&format!(
                "SELECT {SESSION_COLUMNS} FROM ggui_sessions WHERE record IS NOT NULL AND session_id = ?1"
            ))?
            .query_map(params![session_id], session_row)?
            .next()
            .transpose()?;
        let Some(mut s) = found else {
            return Ok(None);
        };
        load_children(&conn, &mut s)?;
        Ok(Some(s))
    }

    fn ggui_apply(&self, changes: &[GguiChange]) -> Result<(), StoreError> {
        self.apply_all(changes, apply_ggui)
    }
}

impl UnitStore<GguiChange> for SqliteStore {
    fn apply_units(&self, units: &[Unit<'_, GguiChange>]) -> UnitResults {
        self.apply_units_with(units, apply_ggui)
    }

    fn try_apply_units_now(&self, units: &[Unit<'_, GguiChange>]) -> Option<UnitResults> {
        self.try_apply_units_with(units, apply_ggui)
    }
}

fn apply_ggui(tx: &Connection, c: &GguiChange) -> Result<(), StoreError> {
    match c {
        GguiChange::PutSession { session_id, record } => {
            // The row carries its host context: a separate one is older.
            exec(
                tx,
                "INSERT INTO ggui_sessions (session_id, record) VALUES (?1, ?2)
                 ON CONFLICT(session_id) DO UPDATE SET record = excluded.record, host_context = NULL",
                params![session_id, record],
            )?;
        }
        GguiChange::HostContext {
            session_id,
            host_context,
        } => {
            exec(
                tx,
                "UPDATE ggui_sessions SET host_context = ?2 WHERE session_id = ?1",
                params![session_id, host_context],
            )?;
        }
        GguiChange::PutLedger {
            session_id,
            seq,
            event,
        } => {
            ensure_row(tx, session_id)?;
            // The session row is not rewritten for each entry (it holds the
            // contract): its `ledger_last` is raised when entries leave.
            exec(
                tx,
                "INSERT OR REPLACE INTO ggui_ledger (session_id, seq, event) VALUES (?1, ?2, ?3)",
                params![session_id, *seq as i64, event],
            )?;
        }
        GguiChange::TrimLedger {
            session_id,
            horizon,
        } => {
            exec(
                tx,
                "UPDATE ggui_sessions SET ledger_last = MAX(ledger_last, COALESCE(
                     (SELECT MAX(seq) FROM ggui_ledger WHERE session_id = ?1 AND seq <= ?2), 0))
                 WHERE session_id = ?1",
                params![session_id, *horizon as i64],
            )?;
            exec(
                tx,
                "DELETE FROM ggui_ledger WHERE session_id = ?1 AND seq <= ?2",
                params![session_id, *horizon as i64],
            )?;
        }
        GguiChange::PutStream {
            session_id,
            seq,
            entry,
        } => {
            ensure_row(tx, session_id)?;
            exec(
                tx,
                "INSERT OR REPLACE INTO ggui_stream (session_id, seq, entry) VALUES (?1, ?2, ?3)",
                params![session_id, *seq as i64, entry],
            )?;
            exec(
                tx,
                "UPDATE ggui_sessions SET stream_seq = MAX(stream_seq, ?2) WHERE session_id = ?1",
                params![session_id, *seq as i64],
            )?;
        }
        GguiChange::StreamSeq { session_id, seq } => {
            ensure_row(tx, session_id)?;
            exec(
                tx,
                "UPDATE ggui_sessions SET stream_seq = MAX(stream_seq, ?2) WHERE session_id = ?1",
                params![session_id, *seq as i64],
            )?;
        }
        GguiChange::DropStream { session_id, seqs } => {
            let mut del =
                tx.prepare_cached("DELETE FROM ggui_stream WHERE session_id = ?1 AND seq = ?2")?;
            for s in seqs {
                del.execute(params![session_id, *s as i64])?;
            }
        }
        GguiChange::Drained { session_id, up_to } => {
            ensure_row(tx, session_id)?;
            exec(
                tx,
                "UPDATE ggui_sessions SET drained_up_to = MAX(drained_up_to, ?2) WHERE session_id = ?1",
                params![session_id, *up_to as i64],
            )?;
        }
        GguiChange::RemoveSession { session_id } => {
            for sql in [
                "DELETE FROM ggui_sessions WHERE session_id = ?1",
                "DELETE FROM ggui_ledger WHERE session_id = ?1",
                "DELETE FROM ggui_stream WHERE session_id = ?1",
            ] {
                exec(tx, sql, params![session_id])?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file written by a hostwire of schema version 1 (the ledger and
    /// the stream with rowids) opens with its entries, in the clustered
    /// tables, at the current version.
    #[test]
    fn a_version_1_file_keeps_its_entries_in_tables_without_rowid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        {
            let conn = Connection::open(&path).unwrap();
            let v1 = SCHEMA.replace(") WITHOUT ROWID;", ");");
            conn.execute_batch(&v1).unwrap();
            conn.execute_batch(
                "INSERT INTO ggui_sessions (session_id, record, ledger_last) VALUES ('s', '{}', 2);
                 INSERT INTO ggui_ledger VALUES ('s', 1, 'e1'), ('s', 2, 'e2');
                 INSERT INTO ggui_stream VALUES ('s', 7, 'x7');
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let s = &store.ggui_load().unwrap()[0];
        assert_eq!(s.ledger, vec!["e1".to_owned(), "e2".to_owned()]);
        assert_eq!(s.stream, vec!["x7".to_owned()]);
        assert_eq!(s.ledger_last, 2);
        drop(store);
        let conn = Connection::open(&path).unwrap();
        for table in ["ggui_ledger", "ggui_stream"] {
            let sql: String = conn
                .query_row(
                    "SELECT sql FROM sqlite_master WHERE name = ?1",
                    params![table],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(sql.contains("WITHOUT ROWID"), "{table}: {sql}");
        }
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, crate::SQLITE_SCHEMA_VERSION);
    }
}
