//! The sending side of one relay connection, as its room holds it: the
//! connection's reader (`conn.rs`) and its room (`room.rs`) both use it,
//! and neither needs the other's file for it.

use super::metrics::RelayMetrics;
use crate::ws;
use crate::ws::Utf8Bytes;
use hostwire_memizy::relay::CLOSE_TOO_SLOW;
use std::sync::atomic::Ordering::Relaxed;

/// The sending side of one connection.
#[derive(Clone)]
pub(super) struct Outbound(pub(super) ws::Outbound);

pub(super) const TOO_SLOW: ws::Close = (CLOSE_TOO_SLOW, "too slow: outbound queue full");

impl Outbound {
    /// Sends a frame: at once when the connection is idle, else queued; a
    /// full queue closes the connection (1013).
    pub(super) fn frame(&self, frame: Utf8Bytes, metrics: &RelayMetrics) -> bool {
        match self.0.send(frame) {
            Ok(()) => true,
            Err(ws::Refused::Full) => {
                metrics.slow_consumers_closed.fetch_add(1, Relaxed);
                false
            }
            Err(ws::Refused::Closing) => false,
        }
    }
    /// Closes the connection after what is queued.
    pub(super) fn close(&self, code: u16, reason: &'static str) {
        self.0.close((code, reason));
    }
}
