//! The ggui live channel's section of docs/BENCHMARKS.md: the socket-level
//! run (`ggui-live.json`, written by `cargo bench -p hostwire-bench --bench
//! ggui_live -- --json …`) against its bare WebSocket baseline, and the
//! sans-IO criterion benches (`cargo bench -p hostwire-ggui --bench ggui`)
//! against a parse of the same frame.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len().checked_sub(1)? / 2).copied()
}

/// `runs[*][key]`'s median, and the median and range of `key ÷ base` over
/// the paired runs.
fn paired(runs: &[Value], key: &str, base: &str) -> Option<(f64, f64, f64, f64, f64)> {
    let ours = median(runs.iter().filter_map(|r| r[key].as_f64()).collect())?;
    let theirs = median(runs.iter().filter_map(|r| r[base].as_f64()).collect())?;
    let mut ratios: Vec<f64> = runs
        .iter()
        .filter_map(|r| Some(r[key].as_f64()? / r[base].as_f64()?))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let (lo, hi) = (*ratios.first()?, *ratios.last()?);
    Some((ours, theirs, median(ratios)?, lo, hi))
}

fn rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k/s", r / 1e3)
    } else {
        format!("{r:.0}/s")
    }
}

fn time(ns: f64) -> String {
    if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// The section, or nothing when neither result is there. `crit` maps a
/// criterion id to its median ns and elements per iteration.
pub fn section(results: &Path, crit: &BTreeMap<String, (f64, f64)>) -> String {
    let live: Option<Value> = std::fs::read_to_string(results.join("ggui-live.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let get = |id: &str| crit.get(&format!("ggui_actions/{id}")).map(|c| c.0);
    let fan = crit
        .get("ggui_fan_out/envelope_to_100_subscribers")
        .map(|c| c.0);
    if live.is_none() && get("validated_and_acked").is_none() {
        return String::new();
    }
    let mut s = String::new();
    let _ = writeln!(s, "\n## ggui live channel\n");
    if let Some(v) = &live {
        let a = &v["actions"];
        let f = &v["fan_out"];
        let none = Vec::new();
        let (ar, fr) = (
            a["runs"].as_array().unwrap_or(&none),
            f["runs"].as_array().unwrap_or(&none),
        );
        let _ = writeln!(s, "Command: `cargo bench -p hostwire-bench --bench ggui_live -- {} {} --repeat {} --json target/bench-results/ggui-live.json`. Real sockets on 127.0.0.1, the server in the bench's process with its SQLite store in a temporary directory (every action is persisted, as in production), the per-connection rate limit raised so that the channel is measured, not the limiter. The baseline is a bare WebSocket server on the same stack (axum, tokio, TCP_NODELAY, one writer task per connection, the live channel's buffer sizes) that answers every frame with a fixed ack of the same size and forwards every emitted body to its subscribers: no parsing, validation, ledger, buffer or store. The two take turns; each ratio is the median over the paired runs.\n", a["total"], f["envelopes"], ar.len());
        let _ = writeln!(
            s,
            "| measurement | hostwire | bare WebSocket (same run) | hostwire ÷ bare |\n| --- | --- | --- | --- |"
        );
        if let Some((ours, base, m, lo, hi)) = paired(ar, "ggui_per_s", "bare_per_s") {
            let _ = writeln!(
                s,
                "| actions validated (JSON Schema), appended and acked: one socket, {} pipelined per batch ({} actions; the bare server {}) | {} | {} | {m:.3}× ({lo:.3}–{hi:.3}×) |",
                a["batch"], a["total"], a["bare_total"], rate(ours), rate(base)
            );
        }
        if let Some((ours, base, m, lo, hi)) =
            paired(fr, "ggui_deliveries_per_s", "bare_deliveries_per_s")
        {
            let _ = writeln!(
                s,
                "| stream envelopes fanned out to {} subscribers ({} envelopes emitted through the HTTP API, {} in flight): deliveries | {} | {} | {m:.2}× ({lo:.2}–{hi:.2}×) |",
                f["subscribers"], f["envelopes"], f["in_flight"], rate(ours), rate(base)
            );
        }
        if let Some((ours, base, m, _, _)) = paired(fr, "ggui_emits_per_s", "bare_emits_per_s") {
            let _ = writeln!(
                s,
                "| the same run: emits (HTTP requests) | {} | {} | {m:.2}× |",
                rate(ours),
                rate(base)
            );
        }
        let _ = writeln!(s, "\nWhat the ratios say: an action costs far more than its transport, because each is decoded into a tree, checked, appended to the ledger, queued for the agent and written to SQLite behind the channel (in a perf profile of this run the store's thread is the largest consumer of CPU), where the bare server copies a constant reply. Fan-out is much closer to its transport: the envelope is serialized once and the same bytes go to every subscriber's queue, and the HTTP emit bounds both servers.");
    }
    if let Some(ours) = get("validated_and_acked") {
        let _ = writeln!(s, "\n**Sans-IO** (`cargo bench -p hostwire-ggui --bench ggui`, criterion medians; the same action frame throughout):\n\n| benchmark | median | rate |\n| --- | --- | --- |");
        for (id, label) in [
            (
                "validated_and_acked",
                "decoded, validated, appended to the ledger, acked",
            ),
            ("decode only", "decoded (size, depth, JSON, shape)"),
            ("validate only", "validated against the declared schema"),
            (
                "baseline: parse to Value",
                "baseline: `serde_json` parse to `Value`, no checks",
            ),
        ] {
            if let Some(ns) = get(id) {
                let _ = writeln!(s, "| {label} | {} | {} |", time(ns), rate(1e9 / ns));
            }
        }
        if let Some(ns) = fan {
            let _ = writeln!(
                s,
                "| one envelope emitted and queued for 100 subscribers | {} | {} deliveries |",
                time(ns),
                rate(100.0 * 1e9 / ns)
            );
        }
        if let Some((ns, n)) = crit.get("store/ggui_apply/64 ledger + 64 stream entries") {
            let _ = writeln!(
                s,
                "| the store: one batch of 64 ledger and 64 stream entries, one transaction on a SQLite file (`cargo bench -p hostwire-store --bench ggui_apply`) | {} | {} changes |",
                time(*ns),
                rate(n * 1e9 / ns)
            );
        }
        if let Some(base) = get("baseline: parse to Value") {
            let _ = writeln!(s, "\nA whole action costs {:.2}× a bare parse of its frame: the ledger keeps each entry's serialized frame (not a copy of its tree), and the envelope moves into its entry.", ours / base);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_both_parts_with_paired_ratios() {
        let dir = std::env::temp_dir().join(format!("report-ggui-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let live = json!({
            "actions": {"total": 10, "bare_total": 50, "batch": 5, "runs": [
                {"ggui_per_s": 100.0, "bare_per_s": 1000.0},
                {"ggui_per_s": 300.0, "bare_per_s": 1000.0},
                {"ggui_per_s": 200.0, "bare_per_s": 1000.0}]},
            "fan_out": {"envelopes": 3, "subscribers": 100, "in_flight": 4, "runs": [
                {"ggui_deliveries_per_s": 50.0, "bare_deliveries_per_s": 100.0,
                 "ggui_emits_per_s": 1.0, "bare_emits_per_s": 2.0}]}
        });
        std::fs::write(dir.join("ggui-live.json"), live.to_string()).unwrap();
        let mut crit = BTreeMap::new();
        crit.insert("ggui_actions/validated_and_acked".to_owned(), (3000.0, 1.0));
        crit.insert(
            "ggui_actions/baseline: parse to Value".to_owned(),
            (1500.0, 1.0),
        );
        let s = section(&dir, &crit);
        assert!(
            s.contains("| 200/s | 1.0k/s | 0.200× (0.100–0.300×) |"),
            "{s}"
        );
        assert!(s.contains("| 50/s | 100/s | 0.50× (0.50–0.50×) |"), "{s}");
        assert!(s.contains("costs 2.00× a bare parse"), "{s}");
        assert!(section(&dir.join("none"), &BTreeMap::new()).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
