//! The churn section of docs/BENCHMARKS.md (`hostwire-bench churn`).

use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

fn row(s: &mut String, what: &str, l: &Value) {
    let _ = writeln!(
        s,
        "| {what} | {} | {} µs | {} µs | {} µs | {} µs |",
        l["samples"], l["p50_us"], l["p90_us"], l["p99_us"], l["p999_us"]
    );
}

fn ratio(a: &Value, b: &Value, key: &str) -> f64 {
    a[key].as_f64().unwrap_or(0.0) / b[key].as_f64().unwrap_or(0.0).max(1.0)
}

/// The section, or nothing without `churn-hostwire.json`.
pub fn section(results: &Path) -> String {
    let Some(v) = std::fs::read_to_string(results.join("churn-hostwire.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        return String::new();
    };
    let r = &v["result"];
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n**Churn** (`hostwire-bench churn`): {} quiet and {} churning rooms of {} players; every player sends `up` {} times a second, and in churning rooms also `rename` to a new name {} times a second: a change the room acknowledges only once it is stored ({:.0} renames a second in all). The host of each room measures, in the same run, from the player's send:\n\n| what | samples | p50 | p90 | p99 | p99.9 |\n| --- | --- | --- | --- | --- | --- |",
        r["rooms"], r["rooms"], r["players"], r["up_hz"], r["rename_hz"],
        r["renames_per_s"].as_f64().unwrap_or(0.0)
    );
    row(
        &mut s,
        "`up` → `from`, quiet rooms (baseline)",
        &r["quiet_up"],
    );
    row(&mut s, "`up` → `from`, churning rooms", &r["churn_up"]);
    row(&mut s, "`rename` → `presence` (stored first)", &r["rename"]);
    let _ = writeln!(
        s,
        "\nForwarding in churning rooms: p50 {:.2}×, p99 {:.2}× the quiet rooms'. A stored change: p50 {:.2}×, p99 {:.2}× forwarding in quiet rooms. Server CPU {:.1} % of a core. Errors: {}.",
        ratio(&r["churn_up"], &r["quiet_up"], "p50_us"),
        ratio(&r["churn_up"], &r["quiet_up"], "p99_us"),
        ratio(&r["rename"], &r["quiet_up"], "p50_us"),
        ratio(&r["rename"], &r["quiet_up"], "p99_us"),
        r["server_cpu"]["total_pct"].as_f64().unwrap_or(0.0),
        r["errors"]
    );
    s
}
