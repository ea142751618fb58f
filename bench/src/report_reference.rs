//! hostwire against the reference relay (the Memizy relay, TypeScript on
//! Bun), as issue 25's table reads: the relay scenarios of one
//! `bench/run.sh` (classroom runs taken in turns, max, idle), medians over
//! the runs and ratios over the paired runs. The reference runs when the
//! operator gives its path (`REFERENCE_RELAY`, bench/README.md); without
//! it the Bun forwarder is the baseline.

use crate::results::{cpu_of, load, runs};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// The reference relay's limit on rooms created from one address in an
/// hour (`roomsPerIpPerHour`, 60 by default, not settable from its
/// environment): every client of the bench is 127.0.0.1.
pub const REFERENCE_ROOMS_PER_IP_PER_HOUR: u64 = 60;

/// One classroom figure of a run's result.
type Metric = fn(&Value) -> Option<f64>;

fn per_frame(r: &Value, pct: f64) -> Option<f64> {
    Some(pct / 100.0 * 1e6 / r["delivered_per_s"].as_f64()?.max(1.0))
}
fn cpu_us(r: &Value) -> Option<f64> {
    per_frame(r, cpu_of(r)?.0)
}
fn user_us(r: &Value) -> Option<f64> {
    per_frame(r, cpu_of(r)?.1)
}
fn p50_ms(r: &Value) -> Option<f64> {
    Some(r["latency"]["p50_us"].as_f64()? / 1000.0)
}
fn p99_ms(r: &Value) -> Option<f64> {
    Some(r["latency"]["p99_us"].as_f64()? / 1000.0)
}
fn rss_mb(r: &Value) -> Option<f64> {
    Some(r["server_rss_kb"].as_f64()? / 1024.0)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len().checked_sub(1)? / 2).copied()
}

/// The median of a metric over a server's runs.
fn median_of(runs: &[Value], m: Metric) -> Option<f64> {
    median(runs.iter().filter_map(|v| m(&v["result"])).collect())
}

/// Median, lowest and highest of `ours ÷ theirs` over paired runs (run i of
/// each was measured back to back), and how many pairs.
fn paired(ours: &[Value], theirs: &[Value], m: Metric) -> Option<(f64, f64, f64, usize)> {
    let mut r: Vec<f64> = ours
        .iter()
        .zip(theirs)
        .filter_map(|(a, b)| Some(m(&a["result"])? / m(&b["result"])?.max(1e-9)))
        .collect();
    r.sort_by(f64::total_cmp);
    Some((median(r.clone())?, r[0], r[r.len() - 1], r.len()))
}

fn fmt_paired((m, lo, hi, n): (f64, f64, f64, usize)) -> String {
    if n > 1 {
        format!("{m:.2}×, {lo:.2}–{hi:.2}")
    } else {
        format!("{m:.2}×")
    }
}

/// The highest delivered rate of a max run's steps that passed (its
/// `last_good`), and whether the run stopped on its own bound.
fn max_load(v: &Value) -> Option<(f64, bool)> {
    let d = v["last_good"]["delivered_per_s"].as_f64()?;
    let stopped = v["stop_reason"].as_str() != Some("every step passed");
    Some((d, stopped))
}

fn idle_bytes(v: &Value) -> Option<(f64, u64)> {
    let r = &v["result"];
    Some((
        r["bytes_per_connection"].as_f64()?,
        r["connections"].as_u64()?,
    ))
}

/// One server's figures for the table.
struct Server {
    name: String,
    runs: Vec<Value>,
    max: Option<Value>,
    idle: Option<Value>,
}

impl Server {
    fn read(results: &Path, who: &str, name: String) -> Self {
        Server {
            name,
            runs: runs(results, "classroom", who),
            max: load(results, &format!("max-{who}.json")),
            idle: load(results, &format!("idle-{who}.json")),
        }
    }
}

fn cell(value: Option<String>, ratio: Option<String>) -> String {
    match (value, ratio) {
        (Some(v), Some(r)) => format!("{v} ({r})"),
        (Some(v), None) => v,
        _ => "–".into(),
    }
}

/// The section: a table of hostwire, the baseline and (when the reference
/// ran) the Bun forwarder; empty when neither baseline ran.
pub fn section(results: &Path) -> String {
    let meta = load(results, "reference-relay.json");
    let reference = Server::read(
        results,
        "reference",
        format!(
            "reference relay{}",
            meta.as_ref()
                .and_then(|m| m["bun"].as_str())
                .map(|b| format!(" (Bun {b})"))
                .unwrap_or_default()
        ),
    );
    let bun = Server::read(results, "bun", "Bun bare forwarder".into());
    let hw = Server::read(results, "hostwire", "hostwire".into());
    let have_reference = !reference.runs.is_empty();
    if hw.runs.is_empty() || (!have_reference && bun.runs.is_empty()) {
        return String::new();
    }
    // The columns after hostwire: the baseline first, then the Bun
    // forwarder beside the reference.
    let (base, others): (&Server, Vec<&Server>) = if have_reference {
        (&reference, vec![&bun])
    } else {
        (&bun, vec![])
    };
    let mut s = String::new();
    if have_reference {
        let _ = writeln!(s, "\n## Against the reference relay\n");
        let _ = writeln!(s, "The reference Memizy relay (TypeScript on Bun, built from the path given as `REFERENCE_RELAY`: bench/README.md) took its turns with hostwire and the forwarders in this run, on the same core. Each cell is the median over the server's runs; in brackets, the ratio to the reference relay: the median over the paired runs (run i of each server back to back) and their range.\n");
    } else {
        let _ = writeln!(
            s,
            "\n## Against the Bun forwarder (the reference relay was not run)\n"
        );
        let _ = writeln!(s, "The reference Memizy relay was not run (`REFERENCE_RELAY` unset: bench/README.md says how to give it), so the Bun forwarder (`bench/peers/bun-forwarder.mjs`, bare forwarding on the reference's runtime) is the baseline. Each cell is the median over the server's runs; in brackets, the ratio to the Bun forwarder: the median over the paired runs and their range.\n");
    }
    let mut head = format!("| workload | {} | {} |", hw.name, base.name);
    let mut rule = "| --- | --- | --- |".to_owned();
    for o in &others {
        head += &format!(" {} |", o.name);
        rule += " --- |";
    }
    let _ = writeln!(s, "{head}\n{rule}");
    let row = |s: &mut String,
               label: &str,
               fig: &dyn Fn(&Server) -> Option<String>,
               ratio: &dyn Fn(&Server) -> Option<String>| {
        let mut line = format!(
            "| {label} | {} | {} |",
            cell(fig(&hw), ratio(&hw)),
            cell(fig(base), None)
        );
        for o in &others {
            line += &format!(" {} |", cell(fig(o), ratio(o)));
        }
        let _ = writeln!(s, "{line}");
    };
    let n = match hw.runs.len() {
        1 => "1 run".to_owned(),
        n => format!("{n} runs"),
    };
    let classroom: [(String, Metric, &str, usize); 5] = [
        (
            format!("classroom 50×40, server CPU per delivered frame ({n})"),
            cpu_us,
            "µs",
            2,
        ),
        ("same, user CPU per frame".into(), user_us, "µs", 2),
        ("same, p50 one-way latency".into(), p50_ms, "ms", 2),
        ("same, p99 one-way latency".into(), p99_ms, "ms", 2),
        ("same, server RSS".into(), rss_mb, "MB", 0),
    ];
    for (label, m, unit, digits) in classroom {
        row(
            &mut s,
            &label,
            &|sv: &Server| median_of(&sv.runs, m).map(|v| format!("{v:.digits$} {unit}")),
            &|sv: &Server| paired(&sv.runs, &base.runs, m).map(fmt_paired),
        );
    }
    row(
        &mut s,
        "max load (frames/s delivered at the last step that passed)",
        &|sv: &Server| {
            let v = sv.max.as_ref()?;
            Some(match max_load(v) {
                Some((d, stopped)) => {
                    format!("{}{:.1}k", if stopped { "" } else { "≥ " }, d / 1000.0)
                }
                // The first step already failed (a loaded machine, or a
                // server that cannot carry it).
                None => "no step passed".into(),
            })
        },
        &|sv: &Server| {
            let (a, _) = sv.max.as_ref().and_then(max_load)?;
            let (b, _) = base.max.as_ref().and_then(max_load)?;
            Some(format!("{:.2}×", a / b.max(1.0)))
        },
    );
    row(
        &mut s,
        "RSS per idle joined connection",
        &|sv: &Server| {
            sv.idle
                .as_ref()
                .and_then(idle_bytes)
                .map(|(b, c)| format!("{b:.0} B of {c}"))
        },
        &|sv: &Server| {
            let (a, _) = sv.idle.as_ref().and_then(idle_bytes)?;
            let (b, _) = base.idle.as_ref().and_then(idle_bytes)?;
            Some(format!("{:.2}×", a / b.max(1.0)))
        },
    );
    if have_reference {
        let _ = writeln!(s, "\nThe reference lets one address create {REFERENCE_ROOMS_PER_IP_PER_HOUR} rooms an hour (`roomsPerIpPerHour`, not settable from its environment), and every client here is 127.0.0.1: `bench/run.sh` starts it afresh for each classroom run (50 rooms), for each max step (rooms of 20 players; steps above {REFERENCE_ROOMS_PER_IP_PER_HOUR} rooms cannot run against it, and a \"≥\" marks a max that reached that cap before the core saturated) and for the idle run (rooms of 100 players, so at most {} connections). The flood, sessions, churn, match and ggui scenarios are hostwire's own and do not run against it.", REFERENCE_ROOMS_PER_IP_PER_HOUR * 100);
        if let (Some(a), Some(b)) = (
            reference
                .max
                .as_ref()
                .and_then(|v| v["stop_reason"].as_str()),
            hw.max.as_ref().and_then(|v| v["stop_reason"].as_str()),
        ) {
            let _ = writeln!(
                s,
                "\nmax: the reference stopped because {a}; hostwire because {b}."
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn classroom(cpu: f64, user: f64, p99_us: u64) -> Value {
        json!({"scenario": "classroom", "result": {
            "delivered_per_s": 50000.0,
            "latency": {"p50_us": 1000, "p99_us": p99_us},
            "server_cpu": {"total_pct": cpu, "user_pct": user, "system_pct": cpu - user},
            "server_rss_kb": 30720
        }})
    }

    fn write(dir: &Path, name: &str, v: &Value) {
        std::fs::write(dir.join(name), v.to_string()).unwrap();
    }

    fn results(with_reference: bool) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        // hostwire 50, 60 and 54 % of a core; the reference 50 %; Bun 40 %.
        for (i, (hw, rf, bun)) in [(50.0, 50.0, 40.0), (60.0, 50.0, 40.0), (54.0, 50.0, 40.0)]
            .into_iter()
            .enumerate()
        {
            write(
                d,
                &format!("classroom-hostwire-{}.json", i + 1),
                &classroom(hw, 20.0, 4000),
            );
            write(
                d,
                &format!("classroom-bun-{}.json", i + 1),
                &classroom(bun, 10.0, 1000),
            );
            if with_reference {
                write(
                    d,
                    &format!("classroom-reference-{}.json", i + 1),
                    &classroom(rf, 10.0, 2000),
                );
            }
        }
        let max = |d: f64, stop: &str| json!({"scenario": "max", "last_good": {"delivered_per_s": d}, "stop_reason": stop});
        write(
            d,
            "max-hostwire.json",
            &max(120_000.0, "the server used 99 % of its core"),
        );
        write(
            d,
            "max-bun.json",
            &max(100_000.0, "the server used 98 % of its core"),
        );
        let idle = |b: f64, n: u64| json!({"scenario": "idle", "result": {"bytes_per_connection": b, "connections": n}});
        write(d, "idle-hostwire.json", &idle(4000.0, 2000));
        write(d, "idle-bun.json", &idle(2000.0, 2000));
        if with_reference {
            write(
                d,
                "max-reference.json",
                &max(100_000.0, "every step passed"),
            );
            write(d, "idle-reference.json", &idle(2500.0, 2000));
            write(d, "reference-relay.json", &json!({"bun": "1.3.5"}));
        }
        tmp
    }

    #[test]
    fn the_reference_is_the_baseline_when_it_ran() {
        let tmp = results(true);
        let s = section(tmp.path());
        assert!(s.contains("## Against the reference relay"), "{s}");
        assert!(
            s.contains(
                "| workload | hostwire | reference relay (Bun 1.3.5) | Bun bare forwarder |"
            ),
            "{s}"
        );
        // CPU per frame: 10, 12, 10.8 µs against 10 µs each: median 1.08×.
        assert!(
            s.contains("| 10.80 µs (1.08×, 1.00–1.20) | 10.00 µs | 8.00 µs (0.80×, 0.80–0.80) |"),
            "{s}"
        );
        // User CPU: 4 µs against 2 µs.
        assert!(
            s.contains("| 4.00 µs (2.00×, 2.00–2.00) | 2.00 µs |"),
            "{s}"
        );
        assert!(
            s.contains("| 4.00 ms (2.00×, 2.00–2.00) | 2.00 ms | 1.00 ms (0.50×, 0.50–0.50) |"),
            "{s}"
        );
        // The reference reached its room cap before the core saturated.
        assert!(
            s.contains("| 120.0k (1.20×) | ≥ 100.0k | 100.0k (1.00×) |"),
            "{s}"
        );
        assert!(
            s.contains("| 4000 B of 2000 (1.60×) | 2500 B of 2000 | 2000 B of 2000 (0.80×) |"),
            "{s}"
        );
        assert!(s.contains("60 rooms an hour"), "{s}");
    }

    #[test]
    fn the_bun_forwarder_is_the_baseline_without_the_reference() {
        let tmp = results(false);
        // A max whose first step failed has no load to compare.
        write(
            tmp.path(),
            "max-bun.json",
            &json!({"scenario": "max", "last_good": null, "stop_reason": "p99 passed the bound"}),
        );
        let s = section(tmp.path());
        assert!(
            s.contains("server CPU per delivered frame (3 runs) | 10.80 µs"),
            "{s}"
        );
        assert!(s.contains("| 120.0k | no step passed |"), "{s}");
        assert!(s.contains("the reference relay was not run"), "{s}");
        assert!(
            s.contains("| workload | hostwire | Bun bare forwarder |\n| --- | --- | --- |\n"),
            "{s}"
        );
        assert!(
            s.contains("| 10.80 µs (1.35×, 1.25–1.50) | 8.00 µs |"),
            "{s}"
        );
        assert!(!s.contains("rooms an hour"), "{s}");
    }

    #[test]
    fn nothing_without_a_baseline() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "classroom-hostwire-1.json",
            &classroom(50.0, 20.0, 1000),
        );
        assert!(section(tmp.path()).is_empty());
    }
}
