//! One PostgreSQL store call (`schema_version`, one prepared-less SELECT on
//! loopback) made on a thread of a tokio runtime's blocking pool, as
//! `hostwire serve` makes its store calls: in a blocking section, where
//! the synchronous client runs on that thread, and outside one, where each
//! call runs on a thread started for it.
//!
//! Then one write batch of one unit (a room's `open` flipped, as a relay
//! room's change is written), and one of 64 units (64 rooms' each), on a
//! thread outside any runtime, as the store writer commits them.
//!
//! `cargo bench -p hostwire-store --features testing --bench pg_call`
//! (a private PostgreSQL is started as the tests start one).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use hostwire_relay_records::{RoomChange, RoomRecord};
use hostwire_store::postgres::PgStore;
use hostwire_store::{RelayStore, Unit, UnitStore};
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
    let pin = "424242";
    store
        .apply(&[RoomChange::Created(room(pin))])
        .expect("a room");
    let mut open = false;
    g.bench_function("one unit of one write, committed", |b| {
        b.iter(|| {
            open = !open;
            let w = [RoomChange::Open {
                pin: pin.into(),
                open,
            }];
            let r = store.apply_units(&[Unit::new(pin, &w)]);
            assert!(r[0].is_ok(), "{r:?}");
        })
    });
    let pins: Vec<String> = (0..64).map(|i| format!("5{i:05}")).collect();
    for pin in &pins {
        store
            .apply(&[RoomChange::Created(room(pin))])
            .expect("a room");
    }
    g.bench_function("64 units of one write each, committed", |b| {
        b.iter(|| {
            open = !open;
            let writes: Vec<[RoomChange; 1]> = pins
                .iter()
                .map(|pin| {
                    [RoomChange::Open {
                        pin: pin.clone(),
                        open,
                    }]
                })
                .collect();
            let units: Vec<Unit<'_, RoomChange>> = pins
                .iter()
                .zip(&writes)
                .map(|(pin, w)| Unit::new(pin, w))
                .collect();
            let r = store.apply_units(&units);
            assert!(r.iter().all(Result::is_ok), "{r:?}");
        })
    });
    g.finish();
}

/// An open room with no players.
fn room(pin: &str) -> RoomRecord {
    RoomRecord {
        pin: pin.into(),
        host_token: "h".repeat(32),
        created_at_ms: 0,
        host_away_since_ms: None,
        open: true,
        players: vec![],
        kicked_tokens: vec![],
        bundle: None,
    }
}

criterion_group!(benches, pg_call);
criterion_main!(benches);
