//! The hosted sessions' counters and how `/metrics` shows them.

use super::services::ServiceMetrics;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Counters of hosted sessions.
#[derive(Debug, Default)]
pub struct SessionMetrics {
    pub sessions: AtomicU64,
    pub devices: AtomicU64,
    pub host_calls: AtomicU64,
    pub plugin_calls: AtomicU64,
    pub malformed_frames: AtomicU64,
    pub oversized_frames: AtomicU64,
    pub slow_devices: AtomicU64,
    pub store_failures: AtomicU64,
    pub unauthorized: AtomicU64,
    pub services: Arc<ServiceMetrics>,
}

impl crate::metrics::Render for SessionMetrics {
    fn render(&self, out: &mut String) {
        use std::fmt::Write;
        for (name, v, help) in [
            (
                "hostwire_memizy_sessions",
                &self.sessions,
                "hosted sessions live",
            ),
            (
                "hostwire_memizy_session_devices",
                &self.devices,
                "devices attached",
            ),
            (
                "hostwire_memizy_session_host_calls_total",
                &self.host_calls,
                "Host API calls received",
            ),
            (
                "hostwire_memizy_session_plugin_calls_total",
                &self.plugin_calls,
                "Plugin API calls sent",
            ),
            (
                "hostwire_memizy_session_malformed_frames_total",
                &self.malformed_frames,
                "frames refused as malformed",
            ),
            (
                "hostwire_memizy_session_oversized_frames_total",
                &self.oversized_frames,
                "frames over the size limit",
            ),
            (
                "hostwire_memizy_session_slow_devices_total",
                &self.slow_devices,
                "devices closed for a full outbound queue",
            ),
            (
                "hostwire_memizy_session_store_failures_total",
                &self.store_failures,
                "writes the store refused",
            ),
            (
                "hostwire_memizy_session_unauthorized_total",
                &self.unauthorized,
                "attaches refused for a wrong or missing token",
            ),
            (
                "hostwire_memizy_service_calls_total",
                &self.services.calls,
                "service calls sent to workers",
            ),
            (
                "hostwire_memizy_service_failures_total",
                &self.services.failures,
                "service calls that failed",
            ),
            (
                "hostwire_memizy_service_worker_starts_total",
                &self.services.worker_starts,
                "service worker processes started",
            ),
            (
                "hostwire_memizy_service_workers_hung_total",
                &self.services.workers_killed_hung,
                "service workers killed for answering nothing in time",
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n{name} {}", v.load(Relaxed));
        }
    }
}
