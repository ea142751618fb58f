//! Rate limits per client IP over all its requests and connections: one
//! token bucket (`hostwire_core::rate`) per IP, in a table of bounded size.
//!
//! A hostile client with many addresses must not grow the table without
//! bound. A bucket that has refilled to its burst is the same as a new one,
//! so dropping it forgets nothing: those go first when the table is full
//! (and at every sweep). If every bucket is still draining, an eighth of
//! the table (in hash order, which a client cannot predict) makes room at
//! once: the pass over the table is paid once per that many new IPs, not
//! by each of them, under the table's lock.

use hostwire_core::TokenBucket;
use std::collections::HashMap;
use std::sync::Mutex;

/// The longest `Retry-After` given, in seconds (also what a limit that
/// never refills answers).
pub const MAX_RETRY_AFTER_S: u64 = 3_600;

/// A request refused by the limit: when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter {
    /// Whole seconds until the IP's bucket holds a token again (≥ 1).
    pub seconds: u64,
}

impl RetryAfter {
    /// Milliseconds to wait, rounded up to whole seconds, at least 1 and
    /// at most [`MAX_RETRY_AFTER_S`].
    pub fn from_ms(ms: u64) -> Self {
        RetryAfter {
            seconds: ms.div_ceil(1000).clamp(1, MAX_RETRY_AFTER_S),
        }
    }
}

/// Token buckets per client IP, at most `max_ips` of them.
#[derive(Debug)]
pub struct PerIpRate {
    per_second: u32,
    burst: u32,
    max_ips: usize,
    table: Mutex<HashMap<String, TokenBucket>>,
}

impl PerIpRate {
    /// `per_second` tokens a second, `burst` at most, for each IP. A rate
    /// of 0 turns the limit off.
    pub fn new(per_second: u32, burst: u32, max_ips: usize) -> Self {
        Self {
            per_second,
            burst,
            max_ips: max_ips.max(1),
            table: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TokenBucket>> {
        // Every change is to one bucket: a poisoned table is still whole.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_idle(&self, b: &mut TokenBucket, now_ms: u64) -> bool {
        b.available(now_ms) >= f64::from(self.burst)
    }

    /// Takes a token of `ip`'s bucket, or says when one will be there.
    pub fn try_take(&self, ip: &str, now_ms: u64) -> Result<(), RetryAfter> {
        if self.per_second == 0 {
            return Ok(());
        }
        let mut t = self.lock();
        if !t.contains_key(ip) {
            if t.len() >= self.max_ips {
                t.retain(|_, b| !self.is_idle(b, now_ms));
                let keep = (self.max_ips - self.max_ips.div_ceil(8)).min(self.max_ips - 1);
                if t.len() > keep {
                    let excess = t.len() - keep;
                    let dropped: Vec<String> = t.keys().take(excess).cloned().collect();
                    for k in dropped {
                        t.remove(&k);
                    }
                }
            }
            let bucket = TokenBucket::new(f64::from(self.per_second), self.burst, now_ms);
            t.insert(ip.to_owned(), bucket);
        }
        let Some(b) = t.get_mut(ip) else {
            return Ok(());
        };
        if b.try_take(now_ms) {
            return Ok(());
        }
        let missing = 1.0 - b.available(now_ms);
        let seconds = (missing / f64::from(self.per_second)).ceil() as u64;
        Err(RetryAfter {
            seconds: seconds.clamp(1, MAX_RETRY_AFTER_S),
        })
    }

    /// Whether `ip`'s bucket holds a token now, without taking it.
    pub fn peek(&self, ip: &str, now_ms: u64) -> Result<(), RetryAfter> {
        if self.per_second == 0 {
            return Ok(());
        }
        let mut t = self.lock();
        let Some(b) = t.get_mut(ip) else {
            return Ok(());
        };
        let available = b.available(now_ms);
        if available >= 1.0 {
            return Ok(());
        }
        let seconds = ((1.0 - available) / f64::from(self.per_second)).ceil() as u64;
        Err(RetryAfter {
            seconds: seconds.clamp(1, MAX_RETRY_AFTER_S),
        })
    }

    /// Drops the buckets that have refilled (the sweep timer calls it).
    pub fn sweep(&self, now_ms: u64) {
        let mut t = self.lock();
        t.retain(|_, b| !self.is_idle(b, now_ms));
    }

    /// IPs with a bucket (for tests and metrics).
    pub fn tracked_ips(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ip_has_its_burst_then_its_rate() {
        let r = PerIpRate::new(2, 3, 100);
        for _ in 0..3 {
            assert_eq!(r.try_take("10.0.0.1", 0), Ok(()));
        }
        assert_eq!(r.try_take("10.0.0.1", 0), Err(RetryAfter { seconds: 1 }));
        assert_eq!(r.try_take("10.0.0.2", 0), Ok(()), "another IP counts apart");
        assert_eq!(r.try_take("10.0.0.1", 500), Ok(()), "2 a second");
        assert!(r.try_take("10.0.0.1", 500).is_err());
        assert!(PerIpRate::new(0, 0, 1).try_take("x", 0).is_ok(), "off");
    }

    #[test]
    fn retry_after_is_the_whole_seconds_to_the_next_token() {
        let r = PerIpRate::new(1, 1, 10);
        r.try_take("a", 0).unwrap();
        assert_eq!(r.try_take("a", 0), Err(RetryAfter { seconds: 1 }));
        assert_eq!(r.try_take("a", 999), Err(RetryAfter { seconds: 1 }));
        assert_eq!(r.try_take("a", 1_000), Ok(()));
    }

    #[test]
    fn the_table_never_holds_more_than_its_bound() {
        let r = PerIpRate::new(1, 5, 100);
        for i in 0..10_000u32 {
            // Every address drains its bucket a little and never comes back.
            let _ = r.try_take(&format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255), 0);
            assert!(r.tracked_ips() <= 100);
        }
        assert!(r.tracked_ips() >= 100 - 100 / 8, "{}", r.tracked_ips());
        // Refilled buckets are forgotten: nothing is lost by it.
        r.sweep(10_000);
        assert_eq!(r.tracked_ips(), 0);
    }

    #[test]
    fn a_full_table_drops_refilled_buckets_before_draining_ones() {
        let r = PerIpRate::new(1, 10, 4);
        for ip in ["a", "b"] {
            for _ in 0..10 {
                r.try_take(ip, 0).unwrap();
            }
        }
        r.try_take("c", 0).unwrap();
        r.try_take("d", 0).unwrap();
        // A second later c and d are full again, a and b hold one token.
        r.try_take("e", 1_000).unwrap();
        assert_eq!(r.tracked_ips(), 3, "c and d dropped, e added");
        for ip in ["a", "b"] {
            r.try_take(ip, 1_000).unwrap();
            assert!(r.try_take(ip, 1_000).is_err(), "{ip} was forgotten");
        }
    }

    #[test]
    fn a_table_of_draining_buckets_makes_room_for_many_at_once() {
        let r = PerIpRate::new(1, 10, 80);
        for i in 0..80 {
            r.try_take(&i.to_string(), 0).unwrap();
        }
        // Full of draining buckets: one pass drops an eighth.
        r.try_take("new", 0).unwrap();
        assert_eq!(r.tracked_ips(), 71);
        // The next nine fit without another pass.
        for i in 0..9 {
            r.try_take(&format!("n{i}"), 0).unwrap();
        }
        assert_eq!(r.tracked_ips(), 80);
    }
}
