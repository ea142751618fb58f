//! The cluster section of docs/BENCHMARKS.md (`bench/cluster.sh`): one
//! node against three in the same run: classroom CPU per delivered frame
//! and latency, a `kill -9` of the owner, and idle connections.

use crate::results::{load, runs};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// The target: three nodes spend at most this many times one node's CPU
/// per delivered frame.
pub const CPU_RATIO_TARGET: f64 = 1.5;

/// A classroom run that delivered less than this share of its offered
/// frames is shown but left out of the ratios: its generator did not offer
/// the load (a shared machine), so its CPU per frame measured something else.
pub const DELIVERED_SHARE: f64 = 0.95;

/// The target: every client has a frame again within the lease plus this.
pub const FAILOVER_MARGIN_S: f64 = 1.0;

/// Microseconds of CPU per delivered frame: `pct` percent of a core over
/// `per_s` frames a second.
pub fn us_per_frame(pct: f64, per_s: f64) -> Option<f64> {
    (per_s > 0.0).then(|| pct / 100.0 * 1e6 / per_s)
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn ms(us: &Value) -> String {
    format!("{:.2} ms", f(us) / 1e3)
}

fn s_of(us: &Value) -> String {
    format!("{:.2} s", f(us) / 1e6)
}

/// A classroom result's row; its CPU per frame (servers, and with the
/// processes beside them).
fn classroom_row(s: &mut String, what: &str, r: &Value, base: Option<f64>) -> Option<f64> {
    let per_s = f(&r["delivered_per_s"]);
    let cpu = f(&r["server_cpu"]["total_pct"]);
    let side = r["side_cpu"]["total_pct"].as_f64();
    let us = us_per_frame(cpu, per_s);
    let us_all = us_per_frame(cpu + side.unwrap_or(0.0), per_s);
    let ratio = |x: Option<f64>| match (x, base) {
        (Some(x), Some(b)) if b > 0.0 => format!("{:.2}×", x / b),
        _ => "1 (baseline)".into(),
    };
    let _ = writeln!(
        s,
        "| {what} | {:.0} of {:.0} | {cpu:.1} % | {} | {} | {} | {} | {} | {} |",
        per_s,
        f(&r["offered_per_s"]),
        side.map_or("–".into(), |c| format!("{c:.1} %")),
        us.map_or("–".into(), |u| format!("{u:.2} µs")),
        ratio(us),
        if side.is_some() {
            format!(
                "{} ({})",
                us_all.map_or("–".into(), |u| format!("{u:.2} µs")),
                ratio(us_all)
            )
        } else {
            "–".into()
        },
        ms(&r["latency"]["p50_us"]),
        ms(&r["latency"]["p99_us"]),
    );
    us
}

/// The median of `v` (the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// ", runs 1.1–1.3×" for several ratios; nothing for one.
fn spread_of(v: &[f64]) -> String {
    if v.len() < 2 {
        return String::new();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(" (runs {lo:.2}–{hi:.2}×)")
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "missed"
    }
}

/// The section, or nothing without the cluster's results.
pub fn section(results: &Path, command: &str) -> String {
    let setup = load(results, "cluster-setup.json").unwrap_or(Value::Null);
    let pairs: Vec<(Value, Value)> = runs(results, "cluster-classroom", "one")
        .into_iter()
        .zip(runs(results, "cluster-classroom", "three"))
        .collect();
    let failover = load(results, "cluster-failover.json");
    let idle_one = load(results, "cluster-one-idle.json");
    let idle_three = load(results, "cluster-three-idle.json");
    if pairs.is_empty() && failover.is_none() && idle_three.is_none() {
        return String::new();
    }
    let mut s = String::new();
    let lease = f(&setup["lease_ttl_s"]);
    let _ = writeln!(
        s,
        "\n## Cluster: three nodes against one (issue 24)\n\nCommand: `{command}` ({}). One run: a private PostgreSQL ({}) and `nats-server` ({}) on loopback ports; every `hostwire serve` on core 1, the generator on core 0. The one node is `--postgres-url` alone (no NATS): the same store as the three, so that the ratio is what the cross-node hop costs. The three nodes (A, B, C) share that PostgreSQL and NATS, leases of {lease} s (`--lease-ttl`); rooms are created on A and hosted there, players connect to B and C in turn, so every frame crosses from one node to another over NATS.\n",
        setup["date"].as_str().unwrap_or("date not recorded"),
        setup["postgres"].as_str().unwrap_or("version not recorded"),
        setup["nats"].as_str().unwrap_or("version not recorded"),
    );
    if !pairs.is_empty() {
        let o0 = &pairs[0].0["result"];
        let _ = writeln!(
            s,
            "**Classroom** ({} rooms × {} players, host {} Hz to each player, players {} Hz; {} paired run{}, one node then three; CPU from /proc over the measured window, summed over the nodes; nats-server's CPU apart, then added):\n\n| run | set-up | delivered of offered frames/s | server CPU (summed) | nats-server CPU | server CPU per frame | ratio | with nats-server (ratio) | p50 | p99 |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            o0["rooms"], o0["players"], o0["host_hz"], o0["player_hz"], pairs.len(),
            if pairs.len() == 1 { "" } else { "s" }
        );
        let (mut ratios, mut with_nats, mut hops, mut hops50) = (vec![], vec![], vec![], vec![]);
        let (mut user, mut system, mut left_out) = (vec![], vec![], vec![]);
        for (i, (one, three)) in pairs.iter().enumerate() {
            let (o, t) = (&one["result"], &three["result"]);
            let run = i + 1;
            let base = classroom_row(&mut s, &format!("{run} | one node"), o, None);
            let us = classroom_row(
                &mut s,
                &format!("{run} | three nodes: hosts on A, players on B and C"),
                t,
                base,
            );
            // A run whose generator could not offer the load (the machine
            // was taken by something else) measured another thing.
            let short: Vec<String> = [("one node", o), ("three nodes", t)]
                .iter()
                .filter(|(_, r)| {
                    f(&r["delivered_per_s"]) < DELIVERED_SHARE * f(&r["offered_per_s"])
                })
                .map(|(who, r)| {
                    format!(
                        "{who} delivered {:.0} % of the offered frames",
                        100.0 * f(&r["delivered_per_s"]) / f(&r["offered_per_s"]).max(1.0)
                    )
                })
                .collect();
            if !short.is_empty() {
                left_out.push(format!("run {run} ({})", short.join(", ")));
                continue;
            }
            if let Some((u, b)) = us.zip(base).filter(|(_, b)| *b > 0.0) {
                ratios.push(u / b);
                let all = us_per_frame(
                    f(&t["server_cpu"]["total_pct"]) + f(&t["side_cpu"]["total_pct"]),
                    f(&t["delivered_per_s"]),
                );
                with_nats.extend(all.map(|a| a / b));
            }
            // Per frame, user and system time apart: where the extra goes.
            let per =
                |r: &Value, k: &str| us_per_frame(f(&r["server_cpu"][k]), f(&r["delivered_per_s"]));
            for (k, v) in [("user_pct", &mut user), ("system_pct", &mut system)] {
                if let Some((x, b)) = per(t, k).zip(per(o, k)).filter(|(_, b)| *b > 0.0) {
                    v.push(x / b);
                }
            }
            hops.push(f(&t["latency"]["p99_us"]) - f(&o["latency"]["p99_us"]));
            hops50.push(f(&t["latency"]["p50_us"]) - f(&o["latency"]["p50_us"]));
        }
        let ratio = median(&ratios);
        if !left_out.is_empty() {
            let _ = writeln!(
                s,
                "\nLeft out of the figures below: {}.",
                left_out.join("; ")
            );
        }
        let errors: Vec<String> = pairs
            .iter()
            .flat_map(|(o, t)| [&o["result"]["errors"], &t["result"]["errors"]])
            .filter(|e| e.as_object().is_some_and(|m| !m.is_empty()))
            .map(Value::to_string)
            .collect();
        let _ = writeln!(
            s,
            "\nThree nodes spend {} the one node's CPU per delivered frame{} ({} with nats-server's): target ≤ {CPU_RATIO_TARGET}×, {}. Of it, user time {} and system time {} the one node's. The cross-node hop adds {} to p99 and {} to p50{}. Errors: {}.\n",
            ratio.map_or("–".into(), |r| format!("{r:.2}×")),
            spread_of(&ratios),
            median(&with_nats).map_or("–".into(), |r| format!("{r:.2}×")),
            ratio.map_or("not measured", |r| verdict(r <= CPU_RATIO_TARGET)),
            median(&user).map_or("–".into(), |r| format!("{r:.2}×")),
            median(&system).map_or("–".into(), |r| format!("{r:.2}×")),
            median(&hops).map_or("–".into(), |h| format!("{:.2} ms", h / 1e3)),
            median(&hops50).map_or("–".into(), |h| format!("{:.2} ms", h / 1e3)),
            if ratios.len() > 1 { " (medians of the paired runs)" } else { "" },
            if errors.is_empty() { "none".into() } else { errors.join(", ") },
        );
    }
    if let Some(v) = &failover {
        let r = &v["result"];
        let target = lease + FAILOVER_MARGIN_S;
        let p99 = f(&r["first_frame"]["p99_us"]) / 1e6;
        let _ = writeln!(
            s,
            "**Failover** (`hostwire-bench failover`): {} rooms × {} players on A, players through B and C, traffic as above; A is killed with SIGKILL; each host reconnects to B or C (by room, in turn), each player to the node it used, and rejoins with its token (`hostToken`, the player's `token`), retrying every {} ms while refused. From the kill, per client:\n\n| from the kill to | clients | p50 | p99 | max |\n| --- | --- | --- | --- | --- |",
            r["rooms"], r["players"], crate::failover::RETRY.as_millis()
        );
        for (what, l) in [
            (
                "the `hosting` / `joined` answer, every client",
                &r["rejoined"],
            ),
            ("… hosts (were on A)", &r["rejoined_hosts"]),
            (
                "… players (carried through B and C)",
                &r["rejoined_players"],
            ),
            ("the first frame after it, every client", &r["first_frame"]),
            ("… hosts (a player's `up`)", &r["first_frame_hosts"]),
            ("… players (the host's `to`)", &r["first_frame_players"]),
        ] {
            if l.is_null() {
                continue;
            }
            let _ = writeln!(
                s,
                "| {what} | {} | {} | {} | {} |",
                l["samples"],
                s_of(&l["p50_us"]),
                s_of(&l["p99_us"]),
                s_of(&l["max_us"])
            );
        }
        let _ = writeln!(
            s,
            "\n{} of {} clients had a frame again; p99 {p99:.2} s against the target of the lease + {FAILOVER_MARGIN_S} s = {target:.1} s: {}. Attempts {} (refused: {}; a refusal took p50 {:.1} ms, p99 {:.1} ms){}.\n",
            r["recovered"],
            r["clients"],
            verdict(p99 <= target && r["recovered"] == r["clients"]),
            r["attempts"],
            r["refusals"],
            f(&r["refusal_time"]["p50_us"]) / 1e3,
            f(&r["refusal_time"]["p99_us"]) / 1e3,
            match r["failures"].as_object() {
                Some(m) if !m.is_empty() => format!("; failures {}", r["failures"]),
                _ => String::new(),
            }
        );
    }
    if let (Some(one), Some(three)) = (&idle_one, &idle_three) {
        let (o, t) = (&one["result"], &three["result"]);
        let _ = writeln!(
            s,
            "**Idle connections** (`hostwire-bench idle`, joined and silent, rooms of 100 created on A; on three nodes the connections go to A, B and C in turn, so two in three are carried to A, and the RSS growth is summed over the three):\n\n| set-up | connections (still answering) | RSS growth | per connection | ratio |\n| --- | --- | --- | --- | --- |"
        );
        let per = |r: &Value| f(&r["bytes_per_connection"]);
        for (what, r) in [("one node", o), ("three nodes", t)] {
            let _ = writeln!(
                s,
                "| {what} | {} ({}) | {:.1} MiB | {:.0} B | {} |",
                r["connections"],
                r["still_open"],
                (f(&r["rss_kb_after"]) - f(&r["rss_kb_before"])) / 1024.0,
                per(r),
                if std::ptr::eq(r, o) {
                    "1 (baseline)".into()
                } else {
                    format!("{:.2}×", per(r) / per(o).max(1.0))
                }
            );
        }
        let _ = writeln!(
            s,
            "\nA connection carried to another node is held twice: its socket on the node it reached, and the owner's end of its tunnel.\n"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn classroom(delivered: f64, cpu: f64, side: Option<f64>, p99: u64) -> Value {
        let mut r = json!({"scenario": "classroom", "result": {
            "rooms": 10, "players": 20, "host_hz": 20.0, "player_hz": 5.0,
            "offered_per_s": 5000.0, "delivered_per_s": delivered,
            "latency": {"p50_us": 300, "p99_us": p99, "max_us": p99 * 2, "samples": 10},
            "server_cpu": {"total_pct": cpu, "user_pct": cpu / 2.0, "system_pct": cpu / 2.0},
            "errors": {}, "servers": 1}});
        if let Some(c) = side {
            r["result"]["side_cpu"] = json!({"total_pct": c});
        }
        r
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn cpu_per_frame_is_a_share_of_a_core_over_the_frames() {
        assert_eq!(us_per_frame(10.0, 5000.0), Some(20.0));
        assert_eq!(us_per_frame(10.0, 0.0), None);
    }

    #[test]
    fn the_section_compares_three_nodes_with_one_and_judges_the_targets() {
        let dir = tempfile::tempdir().unwrap();
        let w =
            |name: &str, v: Value| std::fs::write(dir.path().join(name), v.to_string()).unwrap();
        assert_eq!(section(dir.path(), "x"), "", "no results, no section");
        w(
            "cluster-setup.json",
            json!({"lease_ttl_s": 2, "postgres": "17", "nats": "2.10"}),
        );
        w(
            "cluster-classroom-one.json",
            classroom(5000.0, 10.0, None, 1000),
        );
        // 20 µs a frame against 80: 4×, and nats-server adds 10 µs.
        w(
            "cluster-classroom-three.json",
            classroom(5000.0, 40.0, Some(5.0), 3500),
        );
        w(
            "cluster-failover.json",
            json!({"result": {"rooms": 2, "players": 3, "clients": 8, "recovered": 8,
                "rejoined": {"p50_us": 1_000_000, "p99_us": 2_000_000, "max_us": 2_100_000, "samples": 8},
                "first_frame": {"p50_us": 1_500_000, "p99_us": 2_900_000, "max_us": 2_950_000, "samples": 8},
                "first_frame_hosts": {"p50_us": 1, "p99_us": 1, "max_us": 1, "samples": 2},
                "first_frame_players": {"p50_us": 1, "p99_us": 1, "max_us": 1, "samples": 6},
                "rejoined_hosts": {"p50_us": 1_200_000, "p99_us": 1_400_000, "max_us": 1_400_000, "samples": 2},
                "attempts": 30, "refusals": {"close 1013": 22}, "failures": {}}}),
        );
        let idle = |before: u64, after: u64, per: f64| json!({"result": {"connections": 100, "still_open": 100, "rss_kb_before": before, "rss_kb_after": after, "bytes_per_connection": per}});
        w("cluster-one-idle.json", idle(1000, 1400, 4096.0));
        w("cluster-three-idle.json", idle(3000, 4200, 12288.0));
        let s = section(dir.path(), "CLUSTER=1 bench/run.sh");
        assert!(s.contains("`CLUSTER=1 bench/run.sh`"), "{s}");
        assert!(s.contains("| 1 | one node |"), "{s}");
        assert!(s.contains("| 20.00 µs | 1 (baseline) |"), "{s}");
        assert!(s.contains("| 80.00 µs | 4.00× | 90.00 µs (4.50×) |"), "{s}");
        assert!(
            s.contains("target ≤ 1.5×, missed. Of it, user time 4.00× and system time 4.00×"),
            "{s}"
        );
        assert!(s.contains("adds 2.50 ms to p99"), "{s}");
        assert!(
            s.contains("p99 2.90 s against the target of the lease + 1 s = 3.0 s: met"),
            "{s}"
        );
        assert!(
            s.contains("| … hosts (were on A) | 2 | 1.20 s | 1.40 s | 1.40 s |"),
            "{s}"
        );
        assert!(
            !s.contains("… players (carried through B and C)"),
            "no row without its figures: {s}"
        );
        assert!(s.contains("| 12288 B | 3.00× |"), "{s}");
        assert!(s.contains("| 1.2 MiB |"), "{s}");
        // Paired runs: the median ratio and their range.
        for (i, cpu) in [(1, 20.0), (2, 40.0), (3, 30.0)] {
            w(
                &format!("cluster-classroom-one-{i}.json"),
                classroom(5000.0, 10.0, None, 1000),
            );
            w(
                &format!("cluster-classroom-three-{i}.json"),
                classroom(5000.0, cpu, None, 2000),
            );
        }
        // A run that did not deliver its load is shown, not counted.
        w(
            "cluster-classroom-one-4.json",
            classroom(3000.0, 10.0, None, 1000),
        );
        w(
            "cluster-classroom-three-4.json",
            classroom(5000.0, 90.0, None, 2000),
        );
        let s = section(dir.path(), "x");
        assert!(
            s.contains("spend 3.00× the one node's CPU per delivered frame (runs 2.00–4.00×)"),
            "run 4 is not counted: {s}"
        );
        assert!(s.contains("| 4 | three nodes"), "{s}");
        assert!(s.contains("Left out of the figures below: run 4 (one node delivered 60 % of the offered frames)."), "{s}");
        assert!(
            s.contains("spend 3.00× the one node's CPU per delivered frame (runs 2.00–4.00×)"),
            "{s}"
        );
        assert!(s.contains("adds 1.00 ms to p99"), "{s}");
        // A client that never came back misses the target whatever p99 says.
        w(
            "cluster-failover.json",
            json!({"result": {"clients": 8, "recovered": 7, "first_frame": {"p99_us": 100}, "failures": {"not rejoined": 1}}}),
        );
        let s = section(dir.path(), "x");
        assert!(s.contains(": missed. "), "{s}");
        assert!(s.contains("failures {\"not rejoined\":1}"), "{s}");
    }
}
