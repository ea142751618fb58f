//! Actions validated off the channel's task: a bounded number at once on
//! blocking threads, each coming back to the task as a command.

use crate::ggui::Cmd;
use hostwire_ggui::ValidationJob;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

/// Where the task sends actions to validate: a bounded number run at once
/// on blocking threads, and each comes back through the task's command
/// queue (at most one per session is under way).
pub(in crate::ggui) struct Validations {
    permits: Arc<Semaphore>,
    /// Weak: the task ends once the server's handles are gone, whatever
    /// validations are still running.
    done: mpsc::WeakSender<Cmd>,
}

impl Validations {
    /// At most `workers` validations at once; what they give back comes
    /// to the task through `done`.
    pub(in crate::ggui) fn new(workers: usize, done: mpsc::WeakSender<Cmd>) -> Validations {
        Validations {
            permits: Arc::new(Semaphore::new(workers.max(1))),
            done,
        }
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
            if let Ok(v) = crate::blocking::spawn(move || job.run()).await {
                if let Some(tx) = done.upgrade() {
                    let _ = tx.send(Cmd::Validated(Box::new(v))).await;
                }
            }
        }));
    }
}
