//! Host-call decoding and display-set preparation.
//!
//! Fixtures are shared with the JavaScript baselines in `bench/peers/`:
//! each is `{method, args}` with `args` the JSON text a host receives.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use hostwire_memizy::{decode_host_call, prepare_display_set, DisplaySet};
use serde_json::{json, Value};

fn fixture(name: &str) -> (String, String) {
    let path = format!(
        "{}/../../bench/fixtures/memizy/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    (
        v["method"].as_str().unwrap().to_owned(),
        v["args"].as_str().unwrap().to_owned(),
    )
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_host_call");
    for name in ["send-2kb", "record-answer", "hello"] {
        let (method, args) = fixture(name);
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| {
            b.iter(|| {
                let call = decode_host_call(black_box(&method), black_box(&args)).unwrap();
                black_box(call);
            })
        });
        // Baseline in the same run: parsing the same text into a
        // serde_json::Value, with no validation at all.
        g.bench_function(format!("{name} (baseline: parse to Value)"), |b| {
            b.iter(|| black_box(serde_json::from_str::<Value>(black_box(&args)).unwrap()))
        });
    }
    g.finish();
}

/// A 200-item set mixing every shuffled type.
fn set_of_200() -> DisplaySet {
    let example: Value =
        serde_json::from_str(include_str!("../../../examples/every-type.oqse.json")).unwrap();
    let base = example["items"].as_array().unwrap();
    let items = (0..200)
        .map(|i| {
            let mut item = base[i % base.len()].clone();
            item["id"] = json!(format!("item-{i}"));
            item
        })
        .collect();
    DisplaySet {
        meta: example["meta"].clone(),
        items,
    }
}

fn display(c: &mut Criterion) {
    let set = set_of_200();
    let mut g = c.benchmark_group("prepare_display_set");
    g.throughput(Throughput::Elements(set.items.len() as u64));
    g.bench_function("200 items", |b| {
        b.iter(|| black_box(prepare_display_set(black_box(&set), Some("session-1"))))
    });
    g.finish();
}

/// Where the time of a `send` goes: the pre-scan and the serde pass alone.
fn components(c: &mut Criterion) {
    let (_, args) = fixture("send-2kb");
    let mut g = c.benchmark_group("send_components");
    g.bench_function("pre-scan (size, depth, big numbers)", |b| {
        b.iter(|| {
            black_box(hostwire_core::json::scan_structure(
                black_box(args.as_bytes()),
                68,
            ))
        })
    });
    // Baseline in the same run: the same scan byte by byte.
    g.bench_function("pre-scan byte by byte (baseline)", |b| {
        b.iter(|| {
            black_box(hostwire_core::json::scan_structure_bytewise(
                black_box(args.as_bytes()),
                68,
            ))
        })
    });
    g.bench_function("serde pass (typed, data as RawValue)", |b| {
        b.iter(|| {
            let v: (hostwire_memizy::OutgoingMessage,) =
                serde_json::from_str(black_box(&args)).unwrap();
            black_box(v)
        })
    });
    g.finish();
}

criterion_group!(benches, decode, display, components);
criterion_main!(benches);
