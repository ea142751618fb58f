//! The hosted-sessions section of docs/BENCHMARKS.md: `sessions-hostwire.json`
//! (`hostwire-bench sessions`) beside the relay's classroom measured right
//! before and after it (`sessions-baseline-N.json`), as a ratio.

use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// A step is saturated past this share of a core, or when fewer than this
/// share of the offered messages were routed.
const CPU_BOUND_PCT: f64 = 95.0;
const ROUTED_SHARE: f64 = 0.95;

fn load(dir: &Path, name: &str) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(dir.join(name)).ok()?).ok()
}

fn total_cpu(r: &Value, key: &str) -> Option<f64> {
    r[key]["total_pct"].as_f64()
}

/// The relay's server CPU µs per forwarded frame in one classroom result.
fn us_per_frame(r: &Value) -> Option<f64> {
    Some(total_cpu(r, "server_cpu")? / 100.0 * 1e6 / r["delivered_per_s"].as_f64()?.max(1.0))
}

/// A latency in µs, in ms from 10 ms on.
fn fmt_us(v: &Value) -> String {
    match v.as_f64() {
        Some(us) if us >= 10_000.0 => format!("{:.0} ms", us / 1000.0),
        Some(us) => format!("{us:.0} µs"),
        None => "–".into(),
    }
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "–".into())
}

/// The section, or nothing when the run has no sessions result.
pub fn section(results: &Path) -> String {
    let Some(run) = load(results, "sessions-hostwire.json") else {
        return String::new();
    };
    let r = &run["result"];
    let baselines: Vec<f64> = (1..)
        .map_while(|i| load(results, &format!("sessions-baseline-{i}.json")))
        .filter_map(|v| us_per_frame(&v["result"]))
        .collect();
    let base =
        (!baselines.is_empty()).then(|| baselines.iter().sum::<f64>() / baselines.len() as f64);
    let steps: Vec<&Value> = r["steps"].as_array().into_iter().flatten().collect();
    let board_to = steps
        .first()
        .and_then(|s| s["board_to"].as_str())
        .unwrap_or("each");
    let mut s = String::new();
    let _ = writeln!(s, "\n## Hosted Memizy sessions (hostwire-bench sessions)\n");
    let _ = writeln!(s, "Command: `hostwire-bench sessions --sessions {} --controllers {} --rates {} --board-to {board_to} --pin 0,1` against `hostwire serve` on core 1 (bench/run.sh), the generator on core 0; the baseline is `hostwire-bench classroom` (the relay, 50 rooms × 40 players) on a fresh server right before and right after it.\n",
        r["sessions"], r["controllers"],
        steps.iter().filter_map(|s| s["rate_hz"].as_f64()).map(|h| format!("{h}")).collect::<Vec<_>>().join(","));
    let per_device = match (
        r["server_rss_kb_before"].as_f64(),
        r["server_rss_kb_attached"].as_f64(),
        r["devices"].as_f64(),
    ) {
        (Some(a), Some(b), Some(n)) if n > 0.0 => format!(
            "; server RSS {a:.0} → {b:.0} KiB once attached, {:.0} KiB a device",
            (b - a) / n
        ),
        _ => String::new(),
    };
    let answer = if board_to == "all" {
        "the board `send`s to `\"all\"` at the same rate"
    } else {
        "the board sends each controller its own view (`to: [id]`) at the same rate, as SPEC 8.1 expects of an authority (30 messages/s per other instance)"
    };
    let _ = writeln!(s, "{} sessions of a board and {} controllers, created over `POST /memizy/sessions` with a small plugin bundle and played by the headless device client: {} WebSocket devices, attached (`hello`, `ready`, `start()` on the board) in {:.1} s{per_device}. Each controller `send`s to the authority at the step's rate (SPEC 8.1 guarantees 30/s); {answer}. Each message carries {} bytes of data. A **routed call** is one message delivered: a `deliver` its recipient read, with the `send`'s answer, the `deliver` request and the device's response to it on the wire. A device keeps at most {} ticks of `send`s unanswered and skips a tick past that (counted as held back), so a server that falls behind slows its devices down as a plugin waiting for its calls would, and latency stays bounded by that backlog. Latency is from the `send` call on the generator to the moment the recipient's device read the `deliver` (send time embedded in the data); CPU is the server's user + system time over the measured window.\n",
        r["sessions"], r["controllers"], r["devices"], r["setup_seconds"].as_f64().unwrap_or(0.0), r["payload"], crate::sessions::TICKS_IN_FLIGHT);
    let _ = writeln!(s, "| rate per instance | offered msgs/s | routed/s | to boards | to controllers | p50 → board | p99 → board | p99 → controllers | server CPU | CPU per routed call | ÷ relay's CPU per forwarded frame | generator CPU | cores busy (by anyone) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut notes = Vec::new();
    for st in &steps {
        let rate = st["rate_hz"].as_f64().unwrap_or(0.0);
        let offered = st["offered_per_s"].as_f64().unwrap_or(0.0);
        let routed = st["routed_per_s"].as_f64().unwrap_or(0.0);
        let us = st["server_us_per_routed"].as_f64();
        let cpu = total_cpu(st, "server_cpu");
        let gen = total_cpu(st, "generator_cpu");
        let cores: Vec<f64> = st["cores_busy_pct"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .collect();
        let busy = cores
            .iter()
            .map(|b| format!("{b:.0} %"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "| {rate}/s | {offered:.0} | {routed:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
            st["to_board_per_s"].as_f64().unwrap_or(0.0),
            st["to_controllers_per_s"].as_f64().unwrap_or(0.0),
            fmt_us(&st["latency_to_board"]["p50_us"]),
            fmt_us(&st["latency_to_board"]["p99_us"]),
            fmt_us(&st["latency_to_controllers"]["p99_us"]),
            or_dash(cpu.map(|c| format!("{c:.1} %"))),
            or_dash(us.map(|u| format!("{u:.2} µs"))),
            or_dash(us.zip(base).map(|(u, b)| format!("{:.2}×", u / b))),
            or_dash(gen.map(|c| format!("{c:.1} %"))),
            or_dash((!busy.is_empty()).then_some(busy)),
        );
        let mut why = Vec::new();
        if cpu.is_some_and(|c| c >= CPU_BOUND_PCT) {
            why.push(format!(
                "the server used {:.0} % of its core",
                cpu.unwrap_or(0.0)
            ));
        }
        if gen.is_some_and(|c| c >= CPU_BOUND_PCT) {
            why.push(format!(
                "the generator used {:.0} % of its core",
                gen.unwrap_or(0.0)
            ));
        }
        if routed < ROUTED_SHARE * offered {
            why.push(format!(
                "{:.0} % of the offered messages were routed",
                100.0 * routed / offered.max(1.0)
            ));
        }
        let mut trouble = Vec::new();
        for (key, what) in [("errors", "errors"), ("closes", "devices closed")] {
            if let Some(m) = st[key].as_object().filter(|m| !m.is_empty()) {
                let list: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v}")).collect();
                trouble.push(format!("{what}: {}", list.join(", ")));
            }
        }
        if st["unanswered"].as_u64().is_some_and(|n| n > 0) {
            trouble.push(format!("{} sends unanswered", st["unanswered"]));
        }
        if st["held_back"].as_u64().is_some_and(|n| n > 0) {
            trouble.push(format!(
                "{} sends held back by devices with {} ticks unanswered",
                st["held_back"],
                crate::sessions::TICKS_IN_FLIGHT
            ));
        }
        // Saturated or not, a core busy with other work makes every
        // process on it wait: said beside the verdict.
        if !cores.is_empty() && cores.iter().all(|b| *b >= CPU_BOUND_PCT) {
            trouble.push(format!(
                "every core was at least {:.0} % busy while the server used {:.0} % of its own: the rest was other work on the machine, and the server and the generator waited for a core",
                cores.iter().copied().fold(f64::INFINITY, f64::min),
                cpu.unwrap_or(0.0)
            ));
        }
        if !why.is_empty() || !trouble.is_empty() {
            let verdict = if why.is_empty() {
                "not saturated".to_owned()
            } else {
                format!("saturated: {}", why.join("; "))
            };
            let rest: String = trouble.iter().map(|t| format!("; {t}")).collect();
            notes.push(format!("- at {rate}/s: {verdict}{rest}"));
        }
    }
    match base {
        Some(b) => {
            let list: Vec<String> = baselines.iter().map(|u| format!("{u:.2}")).collect();
            let _ = writeln!(s, "\nThe baseline, the relay's classroom in the same run: {} µs of server CPU per forwarded frame (before and after; mean {b:.2} µs). A forwarded frame is one frame in and one out; a routed call is two in (the `send`, the response to `deliver`) and two out (the answer, the `deliver`), and the engine's rules between.", list.join(" and "));
        }
        None => {
            let _ = writeln!(
                s,
                "\nNo relay baseline in this run: the ratio column is empty."
            );
        }
    }
    // The last step (the SPEC's rate): what one core carries at its cost.
    let last = steps.last().and_then(|l| {
        Some((
            l["rate_hz"].as_f64()?,
            l["server_us_per_routed"].as_f64()?,
            l["offered_per_s"].as_f64()?,
        ))
    });
    if let Some((rate, us, offered)) = last {
        let core = 1e6 / us.max(1e-9);
        let ratio = base
            .map(|b| format!(", {:.2}× the relay's per forwarded frame", us / b))
            .unwrap_or_default();
        let _ = writeln!(s, "\nAt {rate}/s per instance the server spent {us:.2} µs of CPU per routed call{ratio}: at that cost one core carries about {core:.0} routed calls a second, {:.0} % of the {offered:.0} a second that {} sessions offer at that rate ({:.1} cores' worth).",
            100.0 * core / offered.max(1.0), r["sessions"], offered * us / 1e6);
    }
    if !notes.is_empty() {
        let _ = writeln!(s, "\n{}", notes.join("\n"));
    }
    s
}
