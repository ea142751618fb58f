//! Counters for `GET /metrics` (Prometheus text format). Atomics only: no
//! lock on the forwarding path.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Client frame types, as counted.
pub const FRAME_TYPES: &[&str] = &[
    "host", "join", "to", "open", "kick", "close", "up", "rename", "ping", "other", "invalid",
];
/// Server frame types, as counted.
pub const OUT_TYPES: &[&str] = &["data", "from", "control"];
pub const ERROR_CODES: &[&str] = &[
    "BAD_MESSAGE",
    "UNSUPPORTED_PROTOCOL",
    "ROOM_NOT_FOUND",
    "ROOM_CLOSED",
    "ROOM_FULL",
    "NOT_ALLOWED",
    "KICKED",
    "RATE_LIMITED",
    "TOO_LARGE",
];
/// Store write latency buckets, in microseconds.
const LATENCY_BUCKETS_US: &[u64] = &[
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

#[derive(Default)]
pub struct Metrics {
    pub rooms: AtomicI64,
    pub connections: AtomicI64,
    frames_in: [AtomicU64; 11],
    frames_out: [AtomicU64; 3],
    errors: [AtomicU64; 9],
    pub rate_limited: AtomicU64,
    pub bytes_forwarded: AtomicU64,
    pub slow_consumers_closed: AtomicU64,
    pub rooms_created: AtomicU64,
    pub rooms_expired: AtomicU64,
    store_latency: [AtomicU64; 13],
    store_latency_sum_us: AtomicU64,
    store_writes: AtomicU64,
    pub store_errors: AtomicU64,
}

fn index_of(list: &[&str], name: &str) -> usize {
    list.iter()
        .position(|n| *n == name)
        .unwrap_or(list.len() - 1)
}

impl Metrics {
    pub fn frame_in(&self, t: &str) {
        self.frames_in[index_of(FRAME_TYPES, t)].fetch_add(1, Relaxed);
    }

    pub fn frame_out(&self, t: &str) {
        self.frames_out[index_of(OUT_TYPES, t)].fetch_add(1, Relaxed);
    }

    pub fn error(&self, code: &str) {
        if let Some(i) = ERROR_CODES.iter().position(|c| *c == code) {
            self.errors[i].fetch_add(1, Relaxed);
        }
    }

    pub fn store_write(&self, micros: u64) {
        let i = LATENCY_BUCKETS_US
            .iter()
            .position(|b| micros <= *b)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.store_latency[i].fetch_add(1, Relaxed);
        self.store_latency_sum_us.fetch_add(micros, Relaxed);
        self.store_writes.fetch_add(1, Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let gauge = |s: &mut String, name: &str, help: &str, v: i64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut s,
            "hostwire_relay_rooms",
            "Live relay rooms.",
            self.rooms.load(Relaxed),
        );
        gauge(
            &mut s,
            "hostwire_relay_connections",
            "Open relay WebSocket connections.",
            self.connections.load(Relaxed),
        );
        let counter = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let _ = writeln!(s, "# HELP hostwire_relay_frames_in_total Client frames received, by type.\n# TYPE hostwire_relay_frames_in_total counter");
        for (i, t) in FRAME_TYPES.iter().enumerate() {
            let _ = writeln!(
                s,
                "hostwire_relay_frames_in_total{{type=\"{t}\"}} {}",
                self.frames_in[i].load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP hostwire_relay_frames_out_total Server frames queued, by type.\n# TYPE hostwire_relay_frames_out_total counter");
        for (i, t) in OUT_TYPES.iter().enumerate() {
            let _ = writeln!(
                s,
                "hostwire_relay_frames_out_total{{type=\"{t}\"}} {}",
                self.frames_out[i].load(Relaxed)
            );
        }
        let _ = writeln!(s, "# HELP hostwire_relay_errors_total Error frames sent, by code.\n# TYPE hostwire_relay_errors_total counter");
        for (i, c) in ERROR_CODES.iter().enumerate() {
            let _ = writeln!(
                s,
                "hostwire_relay_errors_total{{code=\"{c}\"}} {}",
                self.errors[i].load(Relaxed)
            );
        }
        counter(
            &mut s,
            "hostwire_relay_rate_limited_total",
            "Frames dropped by a rate limit.",
            self.rate_limited.load(Relaxed),
        );
        counter(
            &mut s,
            "hostwire_relay_forwarded_bytes_total",
            "Bytes of forwarded frames (to, up).",
            self.bytes_forwarded.load(Relaxed),
        );
        counter(
            &mut s,
            "hostwire_relay_slow_consumers_closed_total",
            "Connections closed because their outbound queue was full.",
            self.slow_consumers_closed.load(Relaxed),
        );
        counter(
            &mut s,
            "hostwire_relay_rooms_created_total",
            "Rooms created.",
            self.rooms_created.load(Relaxed),
        );
        counter(
            &mut s,
            "hostwire_relay_rooms_expired_total",
            "Rooms closed by expiry.",
            self.rooms_expired.load(Relaxed),
        );
        counter(
            &mut s,
            "hostwire_store_errors_total",
            "Failed store writes.",
            self.store_errors.load(Relaxed),
        );
        let _ = writeln!(s, "# HELP hostwire_store_write_seconds Latency of one store write batch.\n# TYPE hostwire_store_write_seconds histogram");
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS_US.iter().enumerate() {
            cumulative += self.store_latency[i].load(Relaxed);
            let _ = writeln!(
                s,
                "hostwire_store_write_seconds_bucket{{le=\"{}\"}} {cumulative}",
                *b as f64 / 1e6
            );
        }
        cumulative += self.store_latency[LATENCY_BUCKETS_US.len()].load(Relaxed);
        let _ = writeln!(
            s,
            "hostwire_store_write_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(
            s,
            "hostwire_store_write_seconds_sum {}",
            self.store_latency_sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            s,
            "hostwire_store_write_seconds_count {}",
            self.store_writes.load(Relaxed)
        );
        s
    }
}
