//! Actions validated off the actor: a bounded number at once on blocking
//! threads, each coming back to the actor.

use hostwire_ggui::{ValidatedAction, ValidationJob};
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

/// Where the actor sends actions to validate: a bounded number run at once
/// on blocking threads, and each comes back on `done`. At most one per
/// session is under way, so `done` holds at most one per session.
pub(in crate::ggui) struct Validations {
    permits: Arc<Semaphore>,
    done: mpsc::UnboundedSender<ValidatedAction>,
}

impl Validations {
    /// At most `workers` validations at once; what they give back comes
    /// on the receiver (bounded by the sessions: each has at most one
    /// validation under way).
    pub(in crate::ggui) fn new(
        workers: usize,
    ) -> (Validations, mpsc::UnboundedReceiver<ValidatedAction>) {
        let (done, validated) = mpsc::unbounded_channel();
        let v = Validations {
            permits: Arc::new(Semaphore::new(workers.max(1))),
            done,
        };
        (v, validated)
    }

    pub(super) fn start(&self, job: ValidationJob) {
        let permits = Arc::clone(&self.permits);
        let done = self.done.clone();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            // The semaphore is never closed.
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            // `run` catches a panic of the validator itself.
            if let Ok(v) = tokio::task::spawn_blocking(move || job.run()).await {
                let _ = done.send(v);
            }
        }));
    }
}
