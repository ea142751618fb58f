//! One batch of ggui writes as the writer applies it after a burst of
//! actions: 64 ledger entries and 64 stream entries of one session, with
//! their sequence updates, in one transaction on a SQLite file.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use hostwire_store::ggui::{GguiChange, GguiStore};
use hostwire_store::SqliteStore;

const BATCH: u64 = 64;

fn batch(from: u64) -> Vec<GguiChange> {
    let sid = "s-bench".to_owned();
    let mut v = Vec::new();
    for seq in from..from + BATCH {
        v.push(GguiChange::PutLedger {
            session_id: sid.clone(),
            seq,
            event: format!(r#"{{"type":"action","seq":{seq},"payload":{{"choice":3}}}}"#),
        });
        v.push(GguiChange::PutStream {
            session_id: sid.clone(),
            seq,
            entry: format!(r#"{{"seq":{seq},"envelope":{{"kind":"ack"}}}}"#),
        });
    }
    v.push(GguiChange::TrimLedger {
        session_id: sid,
        horizon: from.saturating_sub(1024),
    });
    v
}

fn ggui_apply(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("bench.sqlite")).expect("store");
    let mut g = c.benchmark_group("store/ggui_apply");
    g.throughput(Throughput::Elements(2 * BATCH + 1));
    let mut next = 1;
    g.bench_function("64 ledger + 64 stream entries", |b| {
        b.iter_batched(
            || {
                let v = batch(next);
                next += BATCH;
                v
            },
            |v| store.ggui_apply(black_box(&v)).expect("apply"),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, ggui_apply);
criterion_main!(benches);
