//! One batch of ggui writes as the writer applies it after a burst of
//! actions: 64 ledger entries and 64 stream entries of one session, with
//! their sequence updates, in one transaction on a SQLite file.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use hostwire_store::ggui::{GguiChange, GguiStore};
use hostwire_store::{SqliteStore, SqliteSync, Unit, UnitStore};

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

/// `store` with the row of session `sid`, the size of a small contract's,
/// as a live session has.
fn with_session(store: SqliteStore, sid: &str) -> SqliteStore {
    let record = format!(
        r#"{{"sessionId":"{sid}","contract":"{}"}}"#,
        "x".repeat(1500)
    );
    store
        .ggui_apply(&[GguiChange::PutSession {
            session_id: sid.to_owned(),
            record,
        }])
        .expect("session row");
    store
}

/// One action's ledger entry.
fn ledger_entry(sid: &str, seq: u64) -> [GguiChange; 1] {
    [GguiChange::PutLedger {
        session_id: sid.to_owned(),
        seq,
        event: format!(r#"{{"type":"action","seq":{seq},"payload":{{"choice":3}}}}"#),
    }]
}

/// A spaced action's write: one ledger entry committed alone, as the
/// store writer commits a lone unit on its caller's task, beside the floor
/// of one SQLite commit (one small row in a table of its own, same file
/// settings, prepared statements) measured in the same run.
fn lone_action(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("bench.sqlite")).expect("store");
    let sid = "s-lone";
    let store = with_session(store, sid);
    let full = with_session(
        SqliteStore::open_with(&dir.path().join("full.sqlite"), SqliteSync::Full)
            .expect("store, full"),
        sid,
    );
    let mut g = c.benchmark_group("store/lone_action");
    // The same write on a file whose commits are fsynced
    // (`--sqlite-synchronous full`), which the store never commits on
    // the caller's task: the blocking path, as in the server.
    for (name, store) in [
        ("one ledger entry, one commit", &store),
        ("one ledger entry, one commit, synchronous=FULL", &full),
    ] {
        let mut seq = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                seq += 1;
                let w = ledger_entry(sid, seq);
                let u = [Unit::new(sid, &w[..])];
                // Past the WAL's bound the store takes the blocking path
                // once, with its checkpoint: part of the cost, as in the
                // server.
                let r = store
                    .try_apply_units_now(&u)
                    .unwrap_or_else(|| store.apply_units(&u));
                assert!(r.iter().all(Result::is_ok));
            })
        });
    }
    let floor = rusqlite::Connection::open(dir.path().join("floor.sqlite")).expect("floor");
    floor
        .execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
             CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL);",
        )
        .expect("floor schema");
    let mut k = 0i64;
    g.bench_function("floor: one row, one commit", |b| {
        b.iter(|| {
            k += 1;
            floor
                .prepare_cached("BEGIN IMMEDIATE")
                .unwrap()
                .execute([])
                .unwrap();
            floor
                .prepare_cached("INSERT INTO t (k, v) VALUES (?1, ?2)")
                .unwrap()
                .execute(rusqlite::params![k, "{\"type\":\"action\"}"])
                .unwrap();
            floor.prepare_cached("COMMIT").unwrap().execute([]).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, ggui_apply, lone_action);
criterion_main!(benches);
