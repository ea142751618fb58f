//! Finding and checking the manifest in plugin HTML built to be slow to
//! parse: deep nesting and long runs of tags, at the bundle size limit.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hostwire_memizy::manifest::read_plugin_manifest;

const MIB: usize = 1024 * 1024;

fn example_island() -> &'static str {
    let quiz = include_str!("../../../examples/quiz-race.html");
    let start = quiz
        .find("<script TYPE=\"Application/OQSE-Manifest+JSON\"")
        .unwrap();
    let end = start + quiz[start..].find("</script>").unwrap() + "</script>".len();
    &quiz[start..end]
}

/// `tag` repeated to `size` bytes, with the example's manifest at the end.
fn page(tag: &str, size: usize) -> String {
    let island = example_island();
    let mut html = tag.repeat((size - island.len()) / tag.len());
    html.push_str(island);
    html
}

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("read_plugin_manifest");
    g.sample_size(10);
    for (name, tag, size) in [
        ("nested <div>", "<div>", MIB),
        ("nested <div>", "<div>", 8 * MIB),
        ("<b>", "<b>", 8 * MIB),
    ] {
        let html = page(tag, size);
        g.throughput(Throughput::Bytes(html.len() as u64));
        g.bench_with_input(
            BenchmarkId::new(name, format!("{} MiB", size / MIB)),
            &html,
            |b, html| b.iter(|| black_box(read_plugin_manifest(black_box(html)).unwrap())),
        );
    }
    g.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
