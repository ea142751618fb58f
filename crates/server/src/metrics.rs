//! Counters for `GET /metrics` (Prometheus text format), fed with typed
//! events where they happen. Atomics only: no lock on the forwarding path.
//!
//! The building blocks know no protocol: a protocol module keeps its own
//! counters (labelled by its own enums through [`Label`]) and renders them
//! with [`Render`]; the store writer's are [`StoreMetrics`].
//!
//! Why not `prometheus-client`: its encoder writes OpenMetrics (counters
//! renamed with a `_total` suffix, a closing `# EOF`), which would rename
//! every series dashboards read today, and it would not make this file
//! smaller (the counters here are closed enums of atomics, rendered in a
//! few lines).

use std::fmt::Write as _;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Something that writes its part of the exposition.
pub trait Render: Send + Sync {
    fn render(&self, out: &mut String);
}

/// A label's values, as a closed enum: every value has a counter from the
/// start, so a scrape shows zeros instead of missing series.
pub trait Label: Copy + 'static {
    /// Every value, in the order they are rendered.
    const ALL: &'static [Self];
    /// The value's name in the exposition.
    fn name(self) -> &'static str;
    /// The value's position in [`Label::ALL`].
    fn index(self) -> usize;
}

/// One counter per value of a label.
pub struct Counters<L: Label> {
    counts: Box<[AtomicU64]>,
    label: PhantomData<L>,
}

impl<L: Label> Default for Counters<L> {
    fn default() -> Self {
        Self {
            counts: L::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            label: PhantomData,
        }
    }
}

impl<L: Label> Counters<L> {
    pub fn add(&self, l: L, n: u64) {
        self.counts[l.index()].fetch_add(n, Relaxed);
    }

    pub fn get(&self, l: L) -> u64 {
        self.counts[l.index()].load(Relaxed)
    }

    /// `# HELP`, `# TYPE` and one line per value: `name{key="value"} n`.
    pub fn render(&self, out: &mut String, name: &str, help: &str, key: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for l in L::ALL {
            let _ = writeln!(out, "{name}{{{key}=\"{}\"}} {}", l.name(), self.get(*l));
        }
    }
}

/// `# HELP`, `# TYPE gauge` and the value.
pub fn write_gauge(out: &mut String, name: &str, help: &str, v: i64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// `# HELP`, `# TYPE counter` and the value.
pub fn write_counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

/// Store write latency buckets, in microseconds.
const LATENCY_BUCKETS_US: &[u64] = &[
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// The store writer's counters.
#[derive(Default)]
pub struct StoreMetrics {
    latency: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    latency_sum_us: AtomicU64,
    writes: AtomicU64,
    errors: Counters<StoreProtocol>,
}

/// Whose records a store writer writes (the `protocol` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreProtocol {
    Relay,
    Ggui,
    PlayerThree,
    Sessions,
}

impl Label for StoreProtocol {
    const ALL: &'static [Self] = &[
        StoreProtocol::Relay,
        StoreProtocol::Ggui,
        StoreProtocol::PlayerThree,
        StoreProtocol::Sessions,
    ];
    fn name(self) -> &'static str {
        match self {
            StoreProtocol::Relay => "relay",
            StoreProtocol::Ggui => "ggui",
            StoreProtocol::PlayerThree => "playerthree",
            StoreProtocol::Sessions => "memizy_session",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

impl StoreMetrics {
    /// One batch written in `micros`.
    pub fn write(&self, micros: u64) {
        let i = LATENCY_BUCKETS_US
            .iter()
            .position(|b| micros <= *b)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.latency[i].fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(micros, Relaxed);
        self.writes.fetch_add(1, Relaxed);
    }

    /// One unit of `protocol` failed.
    pub fn error(&self, protocol: StoreProtocol) {
        self.errors.add(protocol, 1);
    }

    pub fn errors(&self, protocol: StoreProtocol) -> u64 {
        self.errors.get(protocol)
    }
}

impl Render for StoreMetrics {
    fn render(&self, s: &mut String) {
        self.errors.render(
            s,
            "hostwire_store_errors_total",
            "Failed store writes (units), by protocol.",
            "protocol",
        );
        write_counter(
            s,
            "hostwire_store_pg_thread_hops_total",
            "PostgreSQL store calls run on a thread started for the call (made on an async thread, outside a blocking section); start-up makes a few, serving none (0 on SQLite).",
            hostwire_store::postgres::thread_hops(),
        );
        let _ = writeln!(s, "# HELP hostwire_store_write_seconds Latency of one store write batch.\n# TYPE hostwire_store_write_seconds histogram");
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS_US.iter().enumerate() {
            cumulative += self.latency[i].load(Relaxed);
            let _ = writeln!(
                s,
                "hostwire_store_write_seconds_bucket{{le=\"{}\"}} {cumulative}",
                *b as f64 / 1e6
            );
        }
        cumulative += self.latency[LATENCY_BUCKETS_US.len()].load(Relaxed);
        let _ = writeln!(
            s,
            "hostwire_store_write_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(
            s,
            "hostwire_store_write_seconds_sum {}",
            self.latency_sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            s,
            "hostwire_store_write_seconds_count {}",
            self.writes.load(Relaxed)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    enum Colour {
        Red,
        Blue,
    }

    impl Label for Colour {
        const ALL: &'static [Self] = &[Colour::Red, Colour::Blue];
        fn name(self) -> &'static str {
            match self {
                Colour::Red => "red",
                Colour::Blue => "blue",
            }
        }
        fn index(self) -> usize {
            self as usize
        }
    }

    #[test]
    fn every_label_value_is_rendered_with_its_count() {
        let c = Counters::<Colour>::default();
        c.add(Colour::Blue, 2);
        let mut s = String::new();
        c.render(&mut s, "x_total", "X.", "colour");
        assert!(s.contains("x_total{colour=\"red\"} 0\n"), "{s}");
        assert!(s.contains("x_total{colour=\"blue\"} 2\n"), "{s}");
    }

    #[test]
    fn store_latency_lands_in_its_bucket() {
        let m = StoreMetrics::default();
        m.write(300);
        m.write(2_000_000);
        let mut s = String::new();
        m.render(&mut s);
        assert!(s.contains("hostwire_store_write_seconds_bucket{le=\"0.00025\"} 0"));
        assert!(s.contains("hostwire_store_write_seconds_bucket{le=\"0.0005\"} 1"));
        assert!(s.contains("hostwire_store_write_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(s.contains("hostwire_store_write_seconds_count 2"));
    }
}
