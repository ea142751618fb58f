//! Rate limits with an injected time: every method takes `now_ms`, so the
//! caller's clock (real or manual) decides what time it is.

/// A token bucket: `rate` tokens per second, at most `burst` stored; starts full.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_ms: f64,
    burst: f64,
    tokens: f64,
    last_ms: u64,
}

impl TokenBucket {
    pub fn new(rate_per_second: f64, burst: u32, now_ms: u64) -> Self {
        Self {
            rate_per_ms: rate_per_second.max(0.0) / 1000.0,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        // A clock that goes backwards refills nothing rather than panicking.
        let elapsed = now_ms.saturating_sub(self.last_ms) as f64;
        self.tokens = (self.tokens + elapsed * self.rate_per_ms).min(self.burst);
        self.last_ms = self.last_ms.max(now_ms);
    }

    /// Takes one token; `false` when the limit is exceeded (nothing is taken).
    pub fn try_take(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    /// Tokens available at `now_ms` (for metrics and tests).
    pub fn available(&mut self, now_ms: u64) -> f64 {
        self.refill(now_ms);
        self.tokens
    }
}

/// Keep-latest coalescing: at most one write per `interval_ms`; a value
/// offered too soon replaces any value still waiting, and the caller is told
/// when to flush it.
#[derive(Debug, Clone)]
pub struct Coalescer<T> {
    interval_ms: u64,
    last_write_ms: Option<u64>,
    pending: Option<T>,
}

/// What the caller does with an offered value.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer<T> {
    /// Write this value now.
    WriteNow(T),
    /// The value waits; call [`Coalescer::poll`] at `flush_at_ms`.
    Deferred { flush_at_ms: u64 },
}

impl<T> Coalescer<T> {
    pub fn new(interval_ms: u64) -> Self {
        Self {
            interval_ms,
            last_write_ms: None,
            pending: None,
        }
    }

    /// Builds one from a rate such as "2 per second".
    pub fn per_second(writes_per_second: u32) -> Self {
        Self::new(1000 / u64::from(writes_per_second.max(1)))
    }

    fn next_slot(&self) -> u64 {
        self.last_write_ms
            .map_or(0, |t| t.saturating_add(self.interval_ms))
    }

    pub fn offer(&mut self, value: T, now_ms: u64) -> Offer<T> {
        if self.pending.is_none() && now_ms >= self.next_slot() {
            self.last_write_ms = Some(now_ms);
            return Offer::WriteNow(value);
        }
        self.pending = Some(value);
        Offer::Deferred {
            flush_at_ms: self.next_slot().max(now_ms),
        }
    }

    /// The waiting value, if its time has come.
    pub fn poll(&mut self, now_ms: u64) -> Option<T> {
        if self.pending.is_some() && now_ms >= self.next_slot() {
            self.last_write_ms = Some(now_ms);
            return self.pending.take();
        }
        None
    }

    /// When [`poll`](Self::poll) will next return a value, if one waits.
    pub fn flush_at_ms(&self) -> Option<u64> {
        self.pending.as_ref().map(|_| self.next_slot())
    }

    /// The waiting value regardless of time (shutdown: nothing is lost).
    pub fn take_pending(&mut self) -> Option<T> {
        self.pending.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bucket_allows_burst_then_refills_at_rate() {
        let mut b = TokenBucket::new(10.0, 20, 0);
        for _ in 0..20 {
            assert!(b.try_take(0));
        }
        assert!(!b.try_take(0));
        assert!(!b.try_take(99)); // 0.99 tokens
        assert!(b.try_take(100));
        assert!(!b.try_take(100));
        // A long pause refills only up to the burst.
        let taken = (0..100).filter(|_| b.try_take(1_000_000)).count();
        assert_eq!(taken, 20);
    }

    #[test]
    fn bucket_survives_clock_going_back() {
        let mut b = TokenBucket::new(1.0, 1, 1_000);
        assert!(b.try_take(1_000));
        assert!(!b.try_take(10));
        assert!(b.try_take(2_000));
    }

    proptest! {
        #[test]
        fn bucket_never_grants_more_than_burst_plus_rate_times_time(
            steps in proptest::collection::vec(0u64..500, 1..300),
            rate in 1u32..100, burst in 1u32..50,
        ) {
            let mut b = TokenBucket::new(f64::from(rate), burst, 0);
            let mut now = 0;
            let mut granted = 0u64;
            for s in steps {
                now += s;
                if b.try_take(now) { granted += 1; }
            }
            let bound = u64::from(burst) + (u64::from(rate) * now) / 1000 + 1;
            prop_assert!(granted <= bound, "granted {} > bound {}", granted, bound);
        }
    }

    #[test]
    fn coalescer_writes_first_then_keeps_latest() {
        let mut c = Coalescer::per_second(2); // 500 ms
        assert_eq!(c.offer(1, 0), Offer::WriteNow(1));
        assert_eq!(c.offer(2, 100), Offer::Deferred { flush_at_ms: 500 });
        assert_eq!(c.offer(3, 200), Offer::Deferred { flush_at_ms: 500 });
        assert_eq!(c.flush_at_ms(), Some(500));
        assert_eq!(c.poll(499), None);
        assert_eq!(c.poll(500), Some(3));
        assert_eq!(c.poll(501), None);
        assert_eq!(c.flush_at_ms(), None);
        // The slot after a flush counts from the flush.
        assert_eq!(c.offer(4, 700), Offer::Deferred { flush_at_ms: 1000 });
        assert_eq!(c.offer(5, 1_000), Offer::Deferred { flush_at_ms: 1000 });
        assert_eq!(c.poll(1_000), Some(5));
        assert_eq!(c.offer(6, 5_000), Offer::WriteNow(6));
    }

    #[test]
    fn coalescer_gives_up_pending_on_shutdown() {
        let mut c = Coalescer::new(1_000);
        assert_eq!(c.offer("a", 0), Offer::WriteNow("a"));
        let _ = c.offer("b", 1);
        assert_eq!(c.take_pending(), Some("b"));
        assert_eq!(c.poll(10_000), None);
    }
}
