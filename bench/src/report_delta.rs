//! The PlayerThree JSON delta section of docs/BENCHMARKS.md: hostwire's
//! criterion bench `delta` beside the JavaScript libraries of
//! `bench/peers/delta-libs.mjs`, run in the same `bench/run.sh` on the same
//! fixture pair (`bench/fixtures/delta/`), compared as ratios.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

const GROUP: &str = "quiz_21k_5_scores_1_answer";
/// The target: this many times the fastest library's rate.
const TARGET_RATIO: f64 = 5.0;

/// hostwire's delta of the fixture pair, in bytes of compact JSON (the
/// same code as the bench; computed here, so the page always shows the
/// size of the delta whose speed it reports).
fn hostwire_delta_bytes(fixtures: &Path) -> Option<usize> {
    use hostwire_core::delta::{diff, Json};
    let read = |n: &str| -> Option<Json> {
        serde_json::from_str(&std::fs::read_to_string(fixtures.join(n)).ok()?).ok()
    };
    Some(diff(&read("before.json")?, &read("after.json")?).json_len())
}

fn rate(ns: f64) -> f64 {
    1e9 / ns
}

fn fmt_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M/s", r / 1e6)
    } else {
        format!("{:.1}k/s", r / 1e3)
    }
}

fn fmt_us(ns: f64) -> String {
    format!("{:.2} µs", ns / 1e3)
}

/// The section, or `None` when the run measured neither side.
pub fn section(
    results: &Path,
    crit: &BTreeMap<String, (f64, f64)>,
    fixtures: &Path,
) -> Option<String> {
    let js: Option<Value> = std::fs::read_to_string(results.join("delta-libs.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let get = |group: &str, id: &str| crit.get(&format!("{group}/{GROUP}/{id}")).map(|c| c.0);
    let full_cpu = get("delta_cpu", "diff+apply");
    let shared_cpu = get("delta_cpu", "diff+apply, shared subtrees");
    let full_wall = get("delta", "diff+apply");
    let shared_wall = get("delta", "diff+apply, shared subtrees");
    if js.is_none() && full_cpu.is_none() {
        return None;
    }
    let ours_bytes = hostwire_delta_bytes(fixtures);
    let libs: Vec<&Value> = js
        .as_ref()
        .and_then(|j| j["results"].as_array())
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    // CPU time on both sides: the machine is shared, and wall time also
    // counts the time a thread waited for a core.
    let lib_cpu_ns = |l: &Value| l["perCpuSecond"].as_f64().map(|r| 1e9 / r.max(1.0));
    let lib_wall_ns = |l: &Value| l["perSecond"].as_f64().map(|r| 1e9 / r.max(1.0));
    // Which of hostwire's two paths does the same work as a library run:
    // the separately parsed pair against `full`, the derived state
    // against `shared` (identity skips) and `edit` (mutative's replay).
    let ours_for = |l: &Value| {
        if l["pair"] == "full" {
            full_cpu
        } else {
            shared_cpu
        }
    };
    let pair_label = |l: &Value| match l["pair"].as_str() {
        Some("full") => "two separately parsed states",
        Some("shared") => "the state derived by the edit",
        Some("edit") => "the edit replayed",
        _ => "?",
    };
    let fastest = libs
        .iter()
        .filter_map(|l| Some((*l, lib_cpu_ns(l)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let smallest = libs.iter().filter_map(|l| l["deltaBytes"].as_u64()).min();

    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n## PlayerThree JSON delta (criterion, and the JavaScript libraries in Node on the same fixtures)\n"
    );
    let _ = writeln!(s, "Commands: `cargo bench -p hostwire-core --bench delta`, `node bench/peers/delta-libs.mjs` (in `bench/run.sh`, one after the other). Fixtures: `bench/fixtures/delta/` (a {}-byte quiz state, then the same state with five scores and one answer changed). Each figure is one diff (or edit) plus one apply, and dropping what they made; CPU time of the measuring thread on both sides. Two pairs: the two fixture files parsed separately (nothing shared, every member compared), and `after` derived from `before` by the edit as an immutable update makes it (hostwire: `apply`; JavaScript: mutative's `create`), whose unchanged subtrees are the same objects, skipped by identity on both sides.\n", js.as_ref().and_then(|j| j["fixture"]["bytes"].as_u64()).map_or("21 KB".into(), |b| b.to_string()));
    let _ = writeln!(s, "| who | pair | what it does | diff+apply (CPU) | rate | wall | delta bytes |\n| --- | --- | --- | --- | --- | --- | --- |");
    let bytes = ours_bytes.map_or("–".into(), |b| b.to_string());
    if let Some(ns) = full_cpu {
        let _ = writeln!(s, "| hostwire | two separately parsed states | full comparison, immutable apply | {} | {} | {} | {bytes} |", fmt_us(ns), fmt_rate(rate(ns)), full_wall.map_or("–".into(), fmt_us));
    }
    if let Some(ns) = shared_cpu {
        let _ = writeln!(s, "| hostwire | the state derived by the edit | shared subtrees skipped unread, immutable apply | {} | {} | {} | {bytes} |", fmt_us(ns), fmt_rate(rate(ns)), shared_wall.map_or("–".into(), fmt_us));
    }
    for l in &libs {
        let (Some(cpu), Some(wall)) = (lib_cpu_ns(l), lib_wall_ns(l)) else {
            continue;
        };
        let _ = writeln!(
            s,
            "| {} {} | {} | {} | {} | {} | {} | {} |",
            l["name"].as_str().unwrap_or("?"),
            l["version"].as_str().unwrap_or(""),
            pair_label(l),
            l["work"].as_str().unwrap_or(""),
            fmt_us(cpu),
            fmt_rate(rate(cpu)),
            fmt_us(wall),
            l["deltaBytes"]
        );
    }
    if let Some(node) = js.as_ref().and_then(|j| j["node"].as_str()) {
        let _ = writeln!(s, "\nNode {node}.");
    }

    // Ratios: hostwire's rate on the same work ÷ each library's.
    if !libs.is_empty() && (full_cpu.is_some() || shared_cpu.is_some()) {
        let _ = writeln!(s, "\n| library | pair | hostwire on the same pair ÷ it | its delta ÷ hostwire's |\n| --- | --- | --- | --- |");
        for l in &libs {
            let Some(cpu) = lib_cpu_ns(l) else { continue };
            let r = ours_for(l).map_or("–".into(), |o| format!("{:.1}×", cpu / o));
            let size = match (l["deltaBytes"].as_f64(), ours_bytes) {
                (Some(t), Some(o)) => format!("{:.2}×", t / o as f64),
                _ => "–".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {r} | {size} |",
                l["name"].as_str().unwrap_or("?"),
                pair_label(l),
            );
        }
    }

    // The target: the fastest library run of all, against hostwire doing
    // the same work; and, strictest, hostwire comparing two separately
    // parsed states against that same best case.
    if let (Some((f, f_ns)), Some(small)) = (fastest, smallest) {
        let name = f["name"].as_str().unwrap_or("?");
        let size_ok = ours_bytes.is_some_and(|b| b as u64 <= small);
        let size = format!(
            "delta {} bytes against the smallest library's {small}",
            ours_bytes.map_or("–".into(), |b| b.to_string())
        );
        let verdict = |ratio: f64| {
            if ratio >= TARGET_RATIO && size_ok {
                "met".to_owned()
            } else if ratio >= TARGET_RATIO {
                "speed met; size missed".to_owned()
            } else {
                format!("missed: {ratio:.1}× of {TARGET_RATIO}×")
            }
        };
        let _ = writeln!(s, "\n**Target** (≥ {TARGET_RATIO}× the fastest library's diff+apply rate, with a delta no larger than the smallest): the fastest library run here is {name} on {} ({}).", pair_label(f), fmt_rate(rate(f_ns)));
        if let Some(ns) = ours_for(f) {
            let ratio = f_ns / ns;
            let _ = writeln!(
                s,
                "- Like for like (hostwire on the same pair): **{ratio:.1}×**, {size}: **{}**.",
                verdict(ratio)
            );
        }
        if let (Some(ns), true) = (full_cpu, f["pair"] != "full") {
            let ratio = f_ns / ns;
            let same_pair = libs
                .iter()
                .filter(|l| l["pair"] == "full")
                .filter_map(|l| Some((l["name"].as_str()?, lib_cpu_ns(l)?)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let _ = writeln!(s, "- Strictest (hostwire comparing two separately parsed states, against {name}'s best case on shared subtrees): **{ratio:.1}×**: **{}**{}.", verdict(ratio), same_pair.map(|(n, c)| format!("; against the fastest library on the separately parsed pair ({n}), {:.1}×", c / ns)).unwrap_or_default());
        }
    }
    Some(s)
}
