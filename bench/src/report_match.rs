//! The PlayerThree match section of docs/BENCHMARKS.md, from
//! `hostwire-bench match` (`match-hostwire.json`), beside the relay's
//! classroom run of the same `bench/run.sh` as the baseline.

use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// The section; `relay_us` is the relay classroom's server CPU per
/// delivered frame in the same run (the median run), if it ran.
pub fn section(results: &Path, relay_us: Option<f64>) -> Option<String> {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("match-hostwire.json")).ok()?)
            .ok()?;
    let r = &v["result"];
    let mut s = String::new();
    let _ = writeln!(s, "\n## PlayerThree match (hostwire-bench)\n");
    let _ = writeln!(s, "Command: `hostwire-bench match --spectators {} --observers {} --delay-ms {} --tick-ms {}` against `hostwire serve` (release, `PLAYERTHREE_TICK_MS={}`, pinned as the relay runs). Phase 1: one match of Ridge, its owner moving two units; every tick's red view goes to {} spectators of red as one frame built once and shared. Phase 2: a second match; every tick's recorded red frame is released to {} observers with a {} ms team grant. Server CPU is user + system from /proc over the window.\n",
        r["spectators"]["connections"], r["observers"]["connections"], r["delay_ms"], r["tick_ms"], r["tick_ms"], r["spectators"]["connections"], r["observers"]["connections"], r["delay_ms"]);
    let _ = writeln!(s, "| phase | delivered frames/s | bytes a frame | server CPU | CPU per delivered frame | ÷ relay classroom | timing p50 | timing p99 | max |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (what, key, timing) in [
        ("a view update to", "spectators", "first to last spectator"),
        ("observer frames to", "observers", "late after `releaseAt`"),
    ] {
        let p = &r[key];
        let name = format!("{what} {} {key}", p["connections"]);
        let us = p["server_cpu_us_per_frame"].as_f64();
        let ratio = match (us, relay_us) {
            (Some(a), Some(b)) => format!("{:.2}×", a / b.max(1e-9)),
            _ => "–".into(),
        };
        let ms = |f: &str| {
            p["latency"][f]
                .as_f64()
                .map_or("–".into(), |u| format!("{:.2} ms", u / 1000.0))
        };
        let _ = writeln!(
            s,
            "| {name} | {:.0} | {:.0} | {} | {} | {ratio} | {timing}: {} | {} | {} |",
            p["delivered_per_s"].as_f64().unwrap_or(0.0),
            p["mean_frame_bytes"].as_f64().unwrap_or(0.0),
            p["server_cpu"]["total_pct"]
                .as_f64()
                .map_or("–".into(), |c| format!("{c:.1} %")),
            us.map_or("–".into(), |u| format!("{u:.2} µs")),
            ms("p50_us"),
            ms("p99_us"),
            ms("max_us")
        );
    }
    if let Some(b) = relay_us {
        let _ = writeln!(s, "\nBaseline: the relay's classroom (the median run above) costs {b:.2} µs of server CPU per forwarded frame in this run.");
    }
    let early = r["observers"]["early"].as_u64().unwrap_or(0);
    let _ = writeln!(
        s,
        "{} updates reached every spectator in the window; {} observer frames arrived a millisecond or more before their `releaseAt`{}.",
        r["spectators"]["complete_updates"],
        early,
        if early == 0 { " (none may)" } else { " (a bug: none may)" }
    );
    for key in ["spectators", "observers"] {
        if let Some(e) = r[key]["errors"].as_array().filter(|e| !e.is_empty()) {
            let _ = writeln!(s, "\n{key}: {} errors, first: {}", e.len(), e[0]);
        }
    }
    Some(s)
}
