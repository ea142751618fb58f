//! The ggui session records as the store keeps them, and back.

use hostwire_ggui::channel::{RestoredSession, SessionRecord};
use hostwire_ggui::{GguiSessionEvent, Record};
use hostwire_ggui::{ReplayPolicy, StreamEnvelope};
use hostwire_store::ggui::{GguiChange, GguiStoredSession};
use serde::{Deserialize, Serialize};

/// A stored stream entry.
#[derive(Serialize, Deserialize)]
struct StoredStreamEntry {
    envelope: StreamEnvelope,
    policy: ReplayPolicy,
}

pub(super) fn to_change(r: Record) -> Option<GguiChange> {
    Some(match r {
        Record::Session(rec) => GguiChange::PutSession {
            session_id: rec.session_id.clone(),
            record: json(&rec)?,
        },
        Record::LedgerEvent { session_id, event } => GguiChange::PutLedger {
            session_id,
            seq: event.seq,
            event: json(&event)?,
        },
        Record::LedgerTrimmed {
            session_id,
            horizon,
        } => GguiChange::TrimLedger {
            session_id,
            horizon,
        },
        Record::StreamEntry {
            session_id,
            envelope,
            policy,
        } => GguiChange::PutStream {
            session_id,
            seq: envelope.seq.unwrap_or(0),
            entry: json(&StoredStreamEntry { envelope, policy })?,
        },
        Record::StreamSeq { session_id, seq } => GguiChange::StreamSeq { session_id, seq },
        Record::StreamEntriesDropped { session_id, seqs } => {
            GguiChange::DropStream { session_id, seqs }
        }
        Record::ActionsDrained { session_id, up_to } => GguiChange::Drained { session_id, up_to },
        Record::HostContext {
            session_id,
            host_context,
        } => GguiChange::HostContext {
            session_id,
            host_context: json(&host_context)?,
        },
        Record::SessionRemoved { session_id } => GguiChange::RemoveSession { session_id },
    })
}

/// Serializes a record part (never fails for these types).
pub(super) fn json<T: Serialize>(v: &T) -> Option<String> {
    serde_json::to_string(v).ok()
}

/// A stored session back into the core's input; `Err` names what is wrong.
pub(super) fn restored(s: GguiStoredSession) -> Result<RestoredSession, String> {
    let mut record: SessionRecord =
        serde_json::from_str(&s.record).map_err(|e| format!("session row: {e}"))?;
    if let Some(ctx) = &s.host_context {
        record.host_context =
            Some(serde_json::from_str(ctx).map_err(|e| format!("host context: {e}"))?);
    }
    let ledger = s
        .ledger
        .iter()
        .map(|e| serde_json::from_str::<GguiSessionEvent>(e))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("ledger entry: {e}"))?;
    let stream = s
        .stream
        .iter()
        .map(|e| serde_json::from_str::<StoredStreamEntry>(e).map(|x| (x.envelope, x.policy)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("stream entry: {e}"))?;
    Ok(RestoredSession {
        record: Some(record),
        ledger,
        ledger_last_sequence: s.ledger_last,
        stream,
        stream_seq: s.stream_seq,
        drained_up_to: s.drained_up_to,
    })
}
