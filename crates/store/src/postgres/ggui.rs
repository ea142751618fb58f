//! The ggui live channel on PostgreSQL (see [`crate::ggui`]).

use super::{PgStore, Tx};
use crate::ggui::{GguiChange, GguiStore, GguiStoredSession};
use crate::{StoreError, Unit, UnitResults, UnitStore};

fn seq(s: u64) -> i64 {
    s as i64
}

fn ensure_row(tx: &mut Tx<'_, '_>, session_id: &str) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO ggui_sessions (session_id) VALUES ($1) ON CONFLICT (session_id) DO NOTHING",
        &[&session_id],
    )?;
    Ok(())
}

/// The columns every load reads of a session row.
const SESSION_COLUMNS: &str =
    "session_id, record, ledger_last, stream_seq, drained_up_to, host_context";

fn session_row(r: &::postgres::Row) -> GguiStoredSession {
    GguiStoredSession {
        session_id: r.get(0),
        record: r.get(1),
        ledger_last: r.get::<_, i64>(2) as u64,
        stream_seq: r.get::<_, i64>(3) as u64,
        drained_up_to: r.get::<_, i64>(4) as u64,
        host_context: r.get(5),
        ..Default::default()
    }
}

/// Reads a session's ledger and stream buffer into it.
fn load_children(
    tx: &mut ::postgres::Transaction<'_>,
    s: &mut GguiStoredSession,
) -> Result<(), StoreError> {
    let ledger = tx.query(
        "SELECT seq, event FROM ggui_ledger WHERE session_id = $1 ORDER BY seq",
        &[&s.session_id],
    )?;
    for r in &ledger {
        // The row's counter is raised only when entries are trimmed: the
        // last entry kept says the rest.
        s.ledger_last = s.ledger_last.max(r.get::<_, i64>(0) as u64);
        s.ledger.push(r.get(1));
    }
    s.stream = tx
        .query(
            "SELECT entry FROM ggui_stream WHERE session_id = $1 ORDER BY seq",
            &[&s.session_id],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(())
}

impl GguiStore for PgStore {
    fn ggui_load(&self) -> Result<Vec<GguiStoredSession>, StoreError> {
        self.read(|tx| {
            let mut sessions: Vec<GguiStoredSession> = tx
                .query(
                    &format!(
                        "SELECT {SESSION_COLUMNS} FROM ggui_sessions WHERE record IS NOT NULL ORDER BY ord"
                    ),
                    &[],
                )?
                .iter()
                .map(session_row)
                .collect();
            for s in &mut sessions {
                load_children(tx, s)?;
            }
            Ok(sessions)
        })
    }

    fn ggui_load_session(&self, session_id: &str) -> Result<Option<GguiStoredSession>, StoreError> {
        self.read(|tx| {
            let rows = tx.query(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM ggui_sessions WHERE record IS NOT NULL AND session_id = $1"
                ),
                &[&session_id],
            )?;
            let Some(mut s) = rows.first().map(session_row) else {
                return Ok(None);
            };
            load_children(tx, &mut s)?;
            Ok(Some(s))
        })
    }

    fn ggui_apply(&self, changes: &[GguiChange]) -> Result<(), StoreError> {
        self.apply_all(changes, apply_ggui)
    }
}

impl UnitStore<GguiChange> for PgStore {
    fn apply_units(&self, units: &[Unit<'_, GguiChange>]) -> UnitResults {
        self.apply_units_with(crate::lease::UnitKind::GguiSession, units, apply_ggui)
    }
}

fn apply_ggui(tx: &mut Tx<'_, '_>, c: &GguiChange) -> Result<(), StoreError> {
    match c {
        GguiChange::PutSession { session_id, record } => {
            // The row carries its host context: a separate one is older.
            tx.execute(
                "INSERT INTO ggui_sessions (session_id, record) VALUES ($1, $2)
                 ON CONFLICT (session_id) DO UPDATE SET record = EXCLUDED.record, host_context = NULL",
                &[session_id, record],
            )?;
        }
        GguiChange::HostContext {
            session_id,
            host_context,
        } => {
            tx.execute(
                "UPDATE ggui_sessions SET host_context = $2 WHERE session_id = $1",
                &[session_id, host_context],
            )?;
        }
        GguiChange::PutLedger {
            session_id,
            seq: s,
            event,
        } => {
            ensure_row(tx, session_id)?;
            tx.execute(
                "INSERT INTO ggui_ledger (session_id, seq, event) VALUES ($1, $2, $3)
                 ON CONFLICT (session_id, seq) DO UPDATE SET event = EXCLUDED.event",
                &[session_id, &seq(*s), event],
            )?;
        }
        GguiChange::TrimLedger {
            session_id,
            horizon,
        } => {
            // `ledger_last` is raised when entries leave, not for each
            // entry (the row holds the contract; an update copies it).
            tx.execute(
                "UPDATE ggui_sessions SET ledger_last = GREATEST(ledger_last, COALESCE(
                     (SELECT MAX(seq) FROM ggui_ledger WHERE session_id = $1 AND seq <= $2), 0))
                 WHERE session_id = $1",
                &[session_id, &seq(*horizon)],
            )?;
            tx.execute(
                "DELETE FROM ggui_ledger WHERE session_id = $1 AND seq <= $2",
                &[session_id, &seq(*horizon)],
            )?;
        }
        GguiChange::PutStream {
            session_id,
            seq: s,
            entry,
        } => {
            ensure_row(tx, session_id)?;
            tx.execute(
                "INSERT INTO ggui_stream (session_id, seq, entry) VALUES ($1, $2, $3)
                 ON CONFLICT (session_id, seq) DO UPDATE SET entry = EXCLUDED.entry",
                &[session_id, &seq(*s), entry],
            )?;
            tx.execute(
                "UPDATE ggui_sessions SET stream_seq = GREATEST(stream_seq, $2) WHERE session_id = $1",
                &[session_id, &seq(*s)],
            )?;
        }
        GguiChange::StreamSeq { session_id, seq: s } => {
            ensure_row(tx, session_id)?;
            tx.execute(
                "UPDATE ggui_sessions SET stream_seq = GREATEST(stream_seq, $2) WHERE session_id = $1",
                &[session_id, &seq(*s)],
            )?;
        }
        GguiChange::DropStream { session_id, seqs } => {
            let seqs: Vec<i64> = seqs.iter().map(|s| seq(*s)).collect();
            tx.execute(
                "DELETE FROM ggui_stream WHERE session_id = $1 AND seq = ANY($2)",
                &[session_id, &seqs],
            )?;
        }
        GguiChange::Drained { session_id, up_to } => {
            ensure_row(tx, session_id)?;
            tx.execute(
                "UPDATE ggui_sessions SET drained_up_to = GREATEST(drained_up_to, $2) WHERE session_id = $1",
                &[session_id, &seq(*up_to)],
            )?;
        }
        GguiChange::RemoveSession { session_id } => {
            for sql in [
                "DELETE FROM ggui_sessions WHERE session_id = $1",
                "DELETE FROM ggui_ledger WHERE session_id = $1",
                "DELETE FROM ggui_stream WHERE session_id = $1",
            ] {
                tx.execute(sql, &[session_id])?;
            }
        }
    }
    Ok(())
}
