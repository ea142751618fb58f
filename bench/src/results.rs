//! One run's results as the report reads them: the JSON files the
//! scenarios wrote, and the server CPU each one measured.

use serde_json::Value;
use std::path::Path;

/// The JSON file `name` of the results in `dir`, if it is there and reads.
pub(crate) fn load(dir: &Path, name: &str) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(dir.join(name)).ok()?).ok()
}

/// A scenario's runs against one server: `{scenario}-{who}-1.json`, `-2`,
/// … (repeated runs, interleaved with the other servers'), or the one
/// `{scenario}-{who}.json`.
pub(crate) fn runs(dir: &Path, scenario: &str, who: &str) -> Vec<Value> {
    let repeated: Vec<Value> = (1..)
        .map_while(|i| load(dir, &format!("{scenario}-{who}-{i}.json")))
        .collect();
    if repeated.is_empty() {
        load(dir, &format!("{scenario}-{who}.json"))
            .into_iter()
            .collect()
    } else {
        repeated
    }
}

/// A scenario's server CPU: total, user and system, as percent of a core.
pub(crate) fn cpu_of(r: &Value) -> Option<(f64, f64, f64)> {
    let c = &r["server_cpu"];
    Some((
        c["total_pct"].as_f64()?,
        c["user_pct"].as_f64()?,
        c["system_pct"].as_f64()?,
    ))
}
