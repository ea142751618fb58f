//! Room creation: the PIN a new room gets (random, unique among live
//! rooms) and how many rooms one client IP may create per hour.

use std::collections::{HashMap, VecDeque};

/// The smallest PIN: PINs are six digits, 100000–999999.
pub const PIN_MIN: u32 = 100_000;
/// How many PINs there are.
pub const PIN_COUNT: u32 = 900_000;
/// Random PINs tried before giving up: all of them taken means the server
/// holds nearly every PIN there is, and the client is told to try again.
pub const PIN_ATTEMPTS: usize = 1_000;
/// The window `rooms_per_ip_per_hour` counts in.
pub const ROOM_CREATION_WINDOW_MS: u64 = 3_600_000;

/// A PIN for a new room: `random` gives the random numbers (injected, so
/// that tests choose them), `taken` says whether a live room has a PIN.
/// `None` after [`PIN_ATTEMPTS`] taken PINs.
pub fn choose_pin(mut random: impl FnMut() -> u32, taken: impl Fn(&str) -> bool) -> Option<String> {
    (0..PIN_ATTEMPTS)
        .map(|_| (PIN_MIN + random() % PIN_COUNT).to_string())
        .find(|pin| !taken(pin))
}

/// Room creations per client IP in the last hour. Holds at most
/// `per_hour` times per IP, and only IPs that created a room in the last
/// hour (once [`RoomCreationLimit::sweep`] has run).
#[derive(Debug)]
pub struct RoomCreationLimit {
    per_hour: u32,
    by_ip: HashMap<String, VecDeque<u64>>,
}

impl RoomCreationLimit {
    pub fn new(per_hour: u32) -> Self {
        Self {
            per_hour,
            by_ip: HashMap::new(),
        }
    }

    fn forget_old(times: &mut VecDeque<u64>, now_ms: u64) {
        while times
            .front()
            .is_some_and(|t| t.saturating_add(ROOM_CREATION_WINDOW_MS) <= now_ms)
        {
            times.pop_front();
        }
    }

    /// Whether `ip` may create a room now; if so, the creation is counted.
    pub fn try_create(&mut self, ip: &str, now_ms: u64) -> bool {
        self.create_or_wait(ip, now_ms).is_ok()
    }

    /// [`Self::try_create`], saying when it is refused how many
    /// milliseconds remain until `ip` may create one again: until its
    /// oldest creation in the window leaves it (`u64::MAX` with a limit
    /// of 0, which never allows one).
    pub fn create_or_wait(&mut self, ip: &str, now_ms: u64) -> Result<(), u64> {
        if self.per_hour == 0 {
            return Err(u64::MAX);
        }
        let times = self.by_ip.entry(ip.to_owned()).or_default();
        Self::forget_old(times, now_ms);
        if times.len() >= self.per_hour as usize {
            let oldest = times.front().copied().unwrap_or(now_ms);
            return Err(oldest
                .saturating_add(ROOM_CREATION_WINDOW_MS)
                .saturating_sub(now_ms));
        }
        times.push_back(now_ms);
        Ok(())
    }

    /// Forgets creations older than the window, and the IPs left with none.
    pub fn sweep(&mut self, now_ms: u64) {
        self.by_ip.retain(|_, times| {
            Self::forget_old(times, now_ms);
            !times.is_empty()
        });
    }

    /// IPs with a creation in the window (as of the last sweep).
    pub fn tracked_ips(&self) -> usize {
        self.by_ip.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_pin_is_six_digits_and_not_taken() {
        let taken: HashSet<String> = ["100007".to_owned(), "100042".to_owned()].into();
        // The random source is injected: 7 and 42 give taken PINs, so the
        // third number is used.
        let mut numbers = [7, PIN_COUNT + 42, 899_999].into_iter();
        let pin = choose_pin(|| numbers.next().unwrap(), |p| taken.contains(p));
        assert_eq!(pin.as_deref(), Some("999999"));
        assert_eq!(
            choose_pin(|| 0, |_| false).as_deref(),
            Some("100000"),
            "the smallest PIN"
        );
    }

    #[test]
    fn choosing_a_pin_ends_when_every_pin_is_taken() {
        let mut calls = 0;
        let pin = choose_pin(
            || {
                calls += 1;
                calls
            },
            |_| true,
        );
        assert_eq!(pin, None);
        assert_eq!(calls as usize, PIN_ATTEMPTS);
    }

    #[test]
    fn rooms_per_ip_are_counted_over_an_hour() {
        let mut limit = RoomCreationLimit::new(3);
        let t0 = 1_000_000;
        for i in 0..3 {
            assert!(limit.try_create("10.0.0.1", t0 + i), "creation {i}");
        }
        assert!(
            !limit.try_create("10.0.0.1", t0 + 10),
            "the fourth in the hour"
        );
        assert!(
            limit.try_create("10.0.0.2", t0 + 10),
            "another IP counts apart"
        );
        // The first creation leaves the window exactly an hour later.
        assert!(!limit.try_create("10.0.0.1", t0 + ROOM_CREATION_WINDOW_MS - 1));
        assert!(limit.try_create("10.0.0.1", t0 + ROOM_CREATION_WINDOW_MS));
        assert!(!limit.try_create("10.0.0.1", t0 + ROOM_CREATION_WINDOW_MS));
        assert!(!RoomCreationLimit::new(0).try_create("10.0.0.1", t0));
    }

    #[test]
    fn a_refusal_says_when_the_oldest_creation_leaves_the_window() {
        let mut limit = RoomCreationLimit::new(2);
        let t0 = 5_000_000;
        assert_eq!(limit.create_or_wait("10.0.0.1", t0), Ok(()));
        assert_eq!(limit.create_or_wait("10.0.0.1", t0 + 1_000), Ok(()));
        assert_eq!(
            limit.create_or_wait("10.0.0.1", t0 + 60_000),
            Err(ROOM_CREATION_WINDOW_MS - 60_000)
        );
        assert_eq!(
            limit.create_or_wait("10.0.0.1", t0 + ROOM_CREATION_WINDOW_MS - 1),
            Err(1)
        );
        assert_eq!(
            RoomCreationLimit::new(0).create_or_wait("x", t0),
            Err(u64::MAX)
        );
    }

    #[test]
    fn a_sweep_forgets_ips_without_a_recent_creation() {
        let mut limit = RoomCreationLimit::new(60);
        limit.try_create("10.0.0.1", 0);
        limit.try_create("10.0.0.2", ROOM_CREATION_WINDOW_MS / 2);
        limit.sweep(ROOM_CREATION_WINDOW_MS);
        assert_eq!(limit.tracked_ips(), 1);
        limit.sweep(2 * ROOM_CREATION_WINDOW_MS);
        assert_eq!(limit.tracked_ips(), 0);
    }
}
