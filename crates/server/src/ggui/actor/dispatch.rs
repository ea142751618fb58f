//! The core's outputs carried out in their order: frames to connections,
//! closes, records written behind or, before a durable answer, waited for.

use super::persistence::Persistence;
use super::validations::Validations;
use crate::ggui::{to_text, ws, Core, GguiMetrics};
use hostwire_ggui::{ConnId, Output};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

pub(super) fn close(core: &Core, conn: ConnId, code: u16) {
    if let Some(out) = core.conns.get(&conn) {
        out.close(code, hostwire_ggui::channel::close_reason(code));
    }
}

pub(super) fn wake(core: &mut Core, session_id: &str) {
    for w in core.waiters.remove(session_id).unwrap_or_default() {
        let _ = w.send(());
    }
}

/// Carries out what the core asked for, in its order. Records are written
/// behind, except those before a `Durable` output: the actor waits for
/// them before it acknowledges (and goes on with the next command).
/// Returns `false` if a change had to be taken back.
pub(super) async fn dispatch(
    core: &mut Core,
    metrics: &GguiMetrics,
    persistence: &mut Persistence,
    validations: &Validations,
) -> bool {
    let mut records = Vec::new();
    // The session whose change was just taken back: its wake-up goes too.
    let mut taken_back: Option<String> = None;
    // A props update that was not stored: what told of it is dropped.
    let mut dropping = false;
    let mut stored = true;
    while let Some(o) = core.channel.poll_output() {
        match o {
            Output::Send { .. } | Output::ActionsAvailable { .. } if dropping => {}
            Output::Send { conn, frame } => send(core, metrics, conn, frame),
            Output::Close { conn, code, .. } => close(core, conn, code),
            Output::Persist(r) => records.push(*r),
            Output::Validate(job) => validations.start(*job),
            Output::Durable {
                conn,
                frame,
                otherwise,
                undo,
            } => {
                if persistence
                    .write_durable(std::mem::take(&mut records))
                    .await
                {
                    send(core, metrics, conn, frame);
                } else {
                    stored = false;
                    taken_back = Some(undo.session_id().to_owned());
                    core.channel.not_stored(undo);
                    send(core, metrics, conn, otherwise);
                }
            }
            Output::Commit { undo } => {
                if !persistence
                    .write_durable(std::mem::take(&mut records))
                    .await
                {
                    stored = false;
                    dropping = true;
                    core.channel.not_stored(undo);
                }
            }
            Output::ActionsAvailable { session_id } => {
                if taken_back.as_ref() == Some(&session_id) {
                    taken_back = None;
                    continue;
                }
                wake(core, &session_id);
            }
        }
    }
    if !records.is_empty() {
        persistence.write_behind(records).await;
    }
    stored
}

pub(super) fn send(core: &Core, metrics: &GguiMetrics, conn: ConnId, frame: Arc<str>) {
    if let Some(out) = core.conns.get(&conn) {
        metrics.frames_out.fetch_add(1, Relaxed);
        if out.frame(to_text(frame)) == ws::Pushed::TooSlow {
            metrics.slow_consumers_closed.fetch_add(1, Relaxed);
        }
    }
}
