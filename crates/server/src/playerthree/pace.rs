//! How fast `/playerthree/ws` reads what a match's connections send.
//!
//! Every inbound message costs the server's async workers its parsing,
//! the match's handling and, for an owner's write, its record serialized
//! for the store: a flood of the largest `mandate`s took the workers from
//! every other protocol (docs/BENCHMARKS.md). So each message read is
//! charged its bytes to two budgets in bytes, its token's and its match's,
//! and once either is spent the connection reads nothing more until it is
//! repaid: the sender's TCP window fills and its own sends wait, at no cost
//! to the server. The token's budget is kept by the match, so a client that
//! reconnects does not start afresh; the match's budget bounds what an owner
//! gets by minting more tokens.

use hostwire_playerthree::tokens::{TokenHash, MAX_TOKENS_PER_MATCH};
use hostwire_playerthree::MAX_MESSAGE_BYTES;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Bytes per second read from the connections of one token: one message
/// of the largest size (`MAX_MESSAGE_BYTES`) a second.
pub const INBOUND_BYTES_PER_SECOND_PER_TOKEN: u64 = MAX_MESSAGE_BYTES as u64;
/// Bytes one token's connections may send at once before the rate holds
/// them: four messages of the largest size.
pub const INBOUND_BYTE_BURST_PER_TOKEN: u64 = 4 * MAX_MESSAGE_BYTES as u64;
/// Bytes per second read from all the connections of one match.
pub const INBOUND_BYTES_PER_SECOND_PER_MATCH: u64 = 1024 * 1024;
/// Bytes all the connections of one match may send at once.
pub const INBOUND_BYTE_BURST_PER_MATCH: u64 = 4 * 1024 * 1024;

/// A budget in bytes: `rate` a second, at most `burst` saved; it may go
/// into debt by one message, which the reader then waits out.
#[derive(Debug, Clone)]
struct Budget {
    rate: f64,
    burst: f64,
    balance: f64,
    at: Instant,
}

impl Budget {
    fn new(rate: u64, burst: u64, now: Instant) -> Budget {
        Budget {
            rate: rate.max(1) as f64,
            burst: burst as f64,
            balance: burst as f64,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.balance = (self.balance + elapsed * self.rate).min(self.burst);
        self.at = self.at.max(now);
    }

    /// Charges `bytes`; how long until the budget is no longer in debt.
    fn charge(&mut self, bytes: usize, now: Instant) -> Duration {
        self.refill(now);
        self.balance -= bytes as f64;
        if self.balance >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.balance / self.rate)
        }
    }

    fn full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.balance >= self.burst
    }
}

/// The inbound byte budgets of one match: its own and its tokens'.
pub struct InboundPace {
    inner: Mutex<Budgets>,
}

struct Budgets {
    by_match: Budget,
    /// Only tokens that joined this match have one: at most
    /// `MAX_TOKENS_PER_MATCH`, and full ones are let go.
    by_token: HashMap<TokenHash, Budget>,
}

impl InboundPace {
    pub fn new() -> InboundPace {
        let now = Instant::now();
        InboundPace {
            inner: Mutex::new(Budgets {
                by_match: Budget::new(
                    INBOUND_BYTES_PER_SECOND_PER_MATCH,
                    INBOUND_BYTE_BURST_PER_MATCH,
                    now,
                ),
                by_token: HashMap::new(),
            }),
        }
    }

    /// Charges a message of `bytes` read from a connection of `token`;
    /// how long that connection reads nothing more.
    pub fn charge(&self, token: &TokenHash, bytes: usize, now: Instant) -> Duration {
        let Ok(mut b) = self.inner.lock() else {
            return Duration::ZERO;
        };
        if b.by_token.len() >= MAX_TOKENS_PER_MATCH && !b.by_token.contains_key(token) {
            // Tokens whose budget is whole again owe nothing: forgetting
            // them keeps the table within the match's tokens.
            b.by_token.retain(|_, t| !t.full(now));
        }
        let by_token = b
            .by_token
            .entry(*token)
            .or_insert_with(|| {
                Budget::new(
                    INBOUND_BYTES_PER_SECOND_PER_TOKEN,
                    INBOUND_BYTE_BURST_PER_TOKEN,
                    now,
                )
            })
            .charge(bytes, now);
        by_token.max(b.by_match.charge(bytes, now))
    }
}

impl Default for InboundPace {
    fn default() -> Self {
        Self::new()
    }
}

/// Waits out `wait` (what a connection's last read owes, from
/// [`InboundPace::charge`]), or until the connection is closed (a shutdown
/// does not wait for it).
pub async fn wait(wait: Duration, out: &crate::ws::Outbound) {
    tokio::select! {
        () = tokio::time::sleep(wait) => {}
        _ = std::future::poll_fn(|cx| out.poll_killed(cx)) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = MAX_MESSAGE_BYTES;

    #[test]
    fn a_token_sends_its_burst_then_waits_for_its_rate() {
        let pace = InboundPace::new();
        let t0 = Instant::now();
        let a = TokenHash::of("a");
        for _ in 0..4 {
            assert_eq!(pace.charge(&a, MAX, t0), Duration::ZERO);
        }
        // The fifth message of the largest size: a second of debt.
        assert_eq!(pace.charge(&a, MAX, t0), Duration::from_secs(1));
        // Another token of the match has its own budget.
        assert_eq!(pace.charge(&TokenHash::of("b"), MAX, t0), Duration::ZERO);
        // Two seconds later the debt is repaid and one more message fits.
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(pace.charge(&a, MAX, t2), Duration::ZERO);
    }

    #[test]
    fn a_match_bounds_what_all_its_tokens_send() {
        let pace = InboundPace::new();
        let t0 = Instant::now();
        let burst = (INBOUND_BYTE_BURST_PER_MATCH / INBOUND_BYTE_BURST_PER_TOKEN) as usize;
        // Each token within its own burst, until the match's is spent.
        for i in 0..burst {
            let t = TokenHash::of(&format!("t{i}"));
            assert_eq!(pace.charge(&t, 4 * MAX, t0), Duration::ZERO);
        }
        let wait = pace.charge(&TokenHash::of("one more"), MAX, t0);
        let expected = MAX as f64 / INBOUND_BYTES_PER_SECOND_PER_MATCH as f64;
        assert!((wait.as_secs_f64() - expected).abs() < 1e-6, "{wait:?}");
    }
}
