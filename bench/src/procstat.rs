//! CPU time and memory of a process, from /proc.

use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ProcSample {
    /// Seconds of user and system CPU time so far.
    pub user_s: f64,
    pub system_s: f64,
    pub rss_kb: u64,
    /// The anonymous part of `rss_kb` (`RssAnon`): the heap and stacks,
    /// without the binary's file pages, whose count moves with what the
    /// page cache holds of it.
    pub anon_kb: u64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) in parentheses.
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = clock_ticks();
    let user = f.get(11)?.parse::<f64>().ok()? / ticks;
    let system = f.get(12)?.parse::<f64>().ok()? / ticks;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |field: &str| {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(ProcSample {
        user_s: user,
        system_s: system,
        rss_kb: kb("VmRSS:"),
        anon_kb: kb("RssAnon:"),
    })
}

/// The sum of every process of `pids` (the nodes of a cluster): `None`
/// for no pids, or when one of them cannot be read (a sum that silently
/// left a node out would flatter it).
pub fn sample_all(pids: &[u32]) -> Option<ProcSample> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().try_fold(ProcSample::default(), |sum, &pid| {
        let s = sample(pid)?;
        Some(ProcSample {
            user_s: sum.user_s + s.user_s,
            system_s: sum.system_s + s.system_s,
            rss_kb: sum.rss_kb + s.rss_kb,
            anon_kb: sum.anon_kb + s.anon_kb,
        })
    })
}

/// CPU use between two samples, in percent of one core.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuUse {
    pub user_pct: f64,
    pub system_pct: f64,
    pub total_pct: f64,
}

pub fn cpu_between(a: ProcSample, b: ProcSample, seconds: f64) -> CpuUse {
    let user = (b.user_s - a.user_s) / seconds * 100.0;
    let system = (b.system_s - a.system_s) / seconds * 100.0;
    CpuUse {
        user_pct: user,
        system_pct: system,
        total_pct: user + system,
    }
}

/// Pins every thread of `pid` (0 = this process) to `core`.
pub fn pin(pid: u32, core: usize) -> std::io::Result<()> {
    let pid = if pid == 0 { std::process::id() } else { pid };
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))?;
    for t in tasks.flatten() {
        // Threads come and go; one gone by now is not an error.
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(core, &mut set);
            if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                let e = std::io::Error::last_os_error();
                // A thread that ended since the directory was read.
                if e.raw_os_error() != Some(libc::ESRCH) {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Raises this process's open-file limit as far as allowed.
pub fn raise_fd_limit() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            return l.rlim_cur;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_of_processes_adds_each_and_refuses_a_missing_one() {
        let me = std::process::id();
        let one = sample(me).unwrap();
        let two = sample_all(&[me, me]).unwrap();
        assert!(
            two.rss_kb >= 2 * one.rss_kb.saturating_sub(1024),
            "{one:?} {two:?}"
        );
        assert!(two.user_s + two.system_s >= 2.0 * (one.user_s + one.system_s) - 0.1);
        assert!(sample_all(&[]).is_none());
        // PIDs above the kernel's pid_max (at most 2^22) name no process.
        assert!(sample_all(&[me, u32::MAX]).is_none());
    }
}
