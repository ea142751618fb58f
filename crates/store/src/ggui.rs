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
);
CREATE TABLE IF NOT EXISTS ggui_stream (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
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
    let mut ledger =
        conn.prepare_cached("SELECT event FROM ggui_ledger WHERE session_id = ?1 ORDER BY seq")?;
    for e in ledger.query_map(params![s.session_id], |r| r.get::<_, String>(0))? {
        s.ledger.push(e?);
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
            exec(
                tx,
                "INSERT OR REPLACE INTO ggui_ledger (session_id, seq, event) VALUES (?1, ?2, ?3)",
                params![session_id, *seq as i64, event],
            )?;
            exec(
                tx,
                "UPDATE ggui_sessions SET ledger_last = MAX(ledger_last, ?2) WHERE session_id = ?1",
                params![session_id, *seq as i64],
            )?;
        }
        GguiChange::TrimLedger {
            session_id,
            horizon,
        } => {
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
