//! Structural JSON delta on a game state of about 21 KB (a quiz match) with
//! five scores and one answer changed: diff, apply, and both, per second,
//! and the delta's size. The fixture files are shared with the JavaScript
//! baseline (`bench/peers/delta-libs.mjs`), which runs the same pair.
//!
//! The two states are parsed separately, so they share no allocation: the
//! diff compares every subtree, as it does for projections built afresh.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use hostwire_core::delta::{apply, diff, Json};
use std::time::Duration;

/// CPU time of this thread: on a machine shared with other work, wall time
/// also counts the time the thread waited for a core.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn fixture(name: &str) -> (String, Json) {
    let path = format!(
        "{}/../../bench/fixtures/delta/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    (text, json)
}

fn delta(c: &mut Criterion) {
    let (before_text, before) = fixture("before.json");
    let (_, after) = fixture("after.json");
    let d = diff(&before, &after);
    assert_eq!(apply(&before, &d).unwrap(), after);
    eprintln!(
        "delta: state {} bytes, delta {} bytes: {}",
        before_text.trim_end().len(),
        d.json_len(),
        d.to_json_string()
    );

    let mut g = c.benchmark_group("delta/quiz_21k_5_scores_1_answer");
    g.throughput(Throughput::Elements(1));
    g.bench_function("diff+apply", |b| {
        b.iter(|| {
            let d = diff(black_box(&before), black_box(&after));
            black_box(apply(&before, &d).unwrap())
        })
    });
    g.bench_function("diff", |b| {
        b.iter(|| black_box(diff(black_box(&before), black_box(&after))))
    });
    g.bench_function("apply", |b| {
        b.iter(|| black_box(apply(black_box(&before), black_box(&d)).unwrap()))
    });
    // Consecutive states built by apply share every unchanged subtree, so
    // diffing them back skips what is shared without reading it.
    let shared = apply(&before, &d).unwrap();
    g.bench_function("diff+apply, shared subtrees", |b| {
        b.iter(|| {
            let d = diff(black_box(&before), black_box(&shared));
            black_box(apply(&before, &d).unwrap())
        })
    });
    g.bench_function("diff, shared subtrees", |b| {
        b.iter(|| black_box(diff(black_box(&before), black_box(&shared))))
    });
    g.finish();

    // The same two runs in CPU time (the figure compared with the
    // JavaScript libraries' CPU time in bench/peers/delta-libs.mjs).
    let mut g = c.benchmark_group("delta_cpu/quiz_21k_5_scores_1_answer");
    g.throughput(Throughput::Elements(1));
    g.bench_function("diff+apply", |b| {
        b.iter_custom(|iters| {
            let t0 = thread_cpu_time();
            for _ in 0..iters {
                let d = diff(black_box(&before), black_box(&after));
                black_box(apply(&before, &d).unwrap());
            }
            thread_cpu_time() - t0
        })
    });
    g.bench_function("diff+apply, shared subtrees", |b| {
        b.iter_custom(|iters| {
            let t0 = thread_cpu_time();
            for _ in 0..iters {
                let d = diff(black_box(&before), black_box(&shared));
                black_box(apply(&before, &d).unwrap());
            }
            thread_cpu_time() - t0
        })
    });
    g.finish();
}

criterion_group!(benches, delta);
criterion_main!(benches);
