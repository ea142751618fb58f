//! One PostgreSQL store call (`schema_version`, one prepared-less SELECT on
//! loopback) made on a thread of a tokio runtime's blocking pool, as
//! `hostwire serve` makes its store calls: in a blocking section, where
//! the synchronous client runs on that thread, and outside one, where each
//! call runs on a thread started for it.
//!
//! `cargo bench -p hostwire-store --features testing --bench pg_call`
//! (a private PostgreSQL is started as the tests start one).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use hostwire_store::postgres::PgStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pg_call(c: &mut Criterion) {
    let Some(url) = hostwire_store::testing::fresh_database("bench_pg_call") else {
        eprintln!("no PostgreSQL: nothing measured");
        return;
    };
    let store = Arc::new(PgStore::connect(&url).expect("store"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    // `iters` calls on one thread of the blocking pool, timed there.
    let on_pool = |marked: bool, iters: u64| -> Duration {
        let store = store.clone();
        rt.block_on(rt.spawn_blocking(move || {
            let run = || {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(store.schema_version().expect("a call"));
                }
                t.elapsed()
            };
            if marked {
                hostwire_store::blocking_section(run)
            } else {
                run()
            }
        }))
        .unwrap()
    };
    let mut g = c.benchmark_group("store/pg_call");
    g.bench_function("blocking pool, in a blocking section", |b| {
        b.iter_custom(|iters| on_pool(true, iters))
    });
    g.bench_function("blocking pool, a thread started per call", |b| {
        b.iter_custom(|iters| on_pool(false, iters))
    });
    g.finish();
}

criterion_group!(benches, pg_call);
criterion_main!(benches);
