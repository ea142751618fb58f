//! What the channel actor writes and how: records through the store
//! writer, one unit per session, host contexts coalesced (kept latest).

use crate::ggui::records::to_change;
use crate::ggui::{GguiMetrics, HOST_CONTEXT_COALESCE_COMMANDS};
use crate::store_writer::StoreWriter;
use hostwire_ggui::Record;
use hostwire_store::ggui::GguiChange;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What the actor writes: through the store writer (none without a
/// store), with host contexts coalesced per session.
pub(super) struct Persistence {
    pub(super) writer: Option<StoreWriter<GguiChange>>,
    pub(super) metrics: Arc<GguiMetrics>,
    /// The latest host context of each session not written yet.
    pub(super) host_contexts: HashMap<String, String>,
    /// Commands handled since the first of them was kept.
    pub(super) held_for: u32,
}

impl Persistence {
    /// Queues `records` behind the actor, one unit per session.
    pub(super) async fn write_behind(&mut self, records: Vec<Record>) {
        for (session, changes) in self.units(records) {
            if let Some(w) = &self.writer {
                w.write_behind(&session, changes).await;
            }
        }
    }

    /// Writes `records` and waits: `true` once every unit is durable.
    pub(super) async fn write_durable(&mut self, records: Vec<Record>) -> bool {
        let mut answers = Vec::new();
        for (session, changes) in self.units(records) {
            if let Some(w) = &self.writer {
                answers.push(w.queue_acked(&session, changes).await);
            }
        }
        let mut ok = true;
        for a in answers {
            ok &= a.wait().await;
        }
        if !ok {
            self.metrics.store_errors.fetch_add(1, Relaxed);
        }
        ok
    }

    /// Writes `records` as one unit per session (all or nothing each) and
    /// waits: the sessions whose unit failed.
    pub(super) async fn write_units(&mut self, records: Vec<Record>) -> HashSet<String> {
        let mut merged: Vec<(String, Vec<GguiChange>)> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for (session, changes) in self.units(records) {
            match at.get(&session) {
                Some(&i) => merged[i].1.extend(changes),
                None => {
                    at.insert(session.clone(), merged.len());
                    merged.push((session, changes));
                }
            }
        }
        let mut answers = Vec::new();
        for (session, changes) in merged {
            if let Some(w) = &self.writer {
                let durable = w.queue_acked(&session, changes).await;
                answers.push((session, durable));
            }
        }
        let mut failed = HashSet::new();
        for (session, a) in answers {
            if !a.wait().await {
                failed.insert(session);
            }
        }
        if !failed.is_empty() {
            self.metrics.store_errors.fetch_add(1, Relaxed);
        }
        failed
    }

    /// The records as store changes, one unit per session, in order; host
    /// contexts are kept aside (a session row written now carries its
    /// own).
    pub(super) fn units(&mut self, records: Vec<Record>) -> Vec<(String, Vec<GguiChange>)> {
        let mut units: Vec<(String, Vec<GguiChange>)> = Vec::new();
        for r in records {
            let Some(c) = to_change(r) else { continue };
            if let GguiChange::HostContext {
                session_id,
                host_context,
            } = c
            {
                if self.host_contexts.is_empty() {
                    self.held_for = 0;
                }
                self.host_contexts.insert(session_id, host_context);
                continue;
            }
            if matches!(c, GguiChange::PutSession { .. }) {
                self.host_contexts.remove(c.session_id());
            }
            match units.last_mut() {
                Some((s, changes)) if s == c.session_id() => changes.push(c),
                _ => units.push((c.session_id().to_owned(), vec![c])),
            }
        }
        units
    }

    /// Removes what the store keeps of an expired session (its host
    /// context kept aside is dropped: it would outlive the row).
    pub(super) async fn remove_session(&mut self, session_id: &str) {
        self.host_contexts.remove(session_id);
        if let Some(w) = &self.writer {
            let change = GguiChange::RemoveSession {
                session_id: session_id.to_owned(),
            };
            w.write_behind(session_id, vec![change]).await;
        }
    }

    /// Writes the host contexts kept aside when the actor is idle, or once
    /// they waited [`HOST_CONTEXT_COALESCE_COMMANDS`] commands.
    pub(super) async fn after_command(&mut self, idle: bool) {
        if self.host_contexts.is_empty() {
            return;
        }
        self.held_for += 1;
        if !idle && self.held_for < HOST_CONTEXT_COALESCE_COMMANDS {
            return;
        }
        for (session_id, host_context) in std::mem::take(&mut self.host_contexts) {
            if let Some(w) = &self.writer {
                let change = GguiChange::HostContext {
                    session_id: session_id.clone(),
                    host_context,
                };
                w.write_behind(&session_id, vec![change]).await;
            }
        }
    }
}
