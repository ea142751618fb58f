//! How this server protects itself while it serves the relay: timeouts,
//! per-IP tables, caches and the room cap. The relay protocol's own rules
//! (frame and bundle sizes, players, rates, expiries) are
//! `hostwire_memizy::RELAY_LIMITS`; nothing here is seen by a client that
//! keeps to them.

use crate::http::serve::ServeLimits;
use hostwire_memizy::RELAY_LIMITS;
use std::time::Duration;

/// The relay server's settings (`serve`'s options set most of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Live rooms on one server; a creation beyond it is refused (503).
    pub max_rooms: usize,
    /// Bytes queued for one connection before it is closed as too slow
    /// (1013). One frame is always taken into an empty queue.
    pub outbound_queue_bytes: usize,
    /// Bytes the WebSocket layer may hold unsent for one connection (its
    /// replies to pings included); beyond it the connection is closed.
    pub ws_write_buffer_bytes: usize,
    /// Time for a client to send a request's header, and for an idle
    /// keep-alive connection to start its next one.
    pub header_read_timeout_ms: u64,
    /// Time for a client to send a whole request body.
    pub body_read_timeout_ms: u64,
    /// Open connections from one client IP.
    pub connections_per_ip: usize,
    /// How long a stopping server waits for its connections to end.
    pub shutdown_grace_ms: u64,
    /// Bundle uploads read and checked at the same time.
    pub concurrent_uploads: usize,
    /// CPU time one bundle's check may take before it is refused.
    pub bundle_check_timeout_ms: u64,
    /// Reverse proxies in front of the server that append to
    /// `X-Forwarded-For` (when the proxy is trusted): the client IP is the
    /// entry this many in from the right.
    pub trusted_proxy_hops: usize,
    /// `GET /api/rooms/:pin` per client IP: a token bucket of this rate and
    /// burst (PIN guessing); beyond it 429.
    pub lookups_per_ip_per_second: u32,
    pub lookup_burst_per_ip: u32,
    /// `join` and `host` frames per client IP, over all its connections: a
    /// token bucket of this rate and burst (join floods, PIN guessing over
    /// the socket); beyond it `RATE_LIMITED` and close 1013.
    pub joins_per_ip_per_second: u32,
    pub join_burst_per_ip: u32,
    /// Client IPs each of those buckets is kept for at most; idle buckets
    /// are dropped first (see the server's per-IP table).
    pub rate_limited_ips: usize,
    /// Bundle bytes the server holds in memory at once, cached or being
    /// sent (at least the protocol's `bundle_bytes`); bundles are otherwise
    /// read from the store when asked for.
    pub bundle_cache_bytes: usize,
}

/// The defaults (`serve`'s option defaults are these).
pub const SERVER_LIMITS: ServerLimits = ServerLimits {
    max_rooms: 100_000,
    outbound_queue_bytes: 8 * 1024 * 1024,
    // Two of the protocol's largest frames and a margin for pings.
    ws_write_buffer_bytes: 2 * RELAY_LIMITS.frame_bytes + 64 * 1024,
    header_read_timeout_ms: 10_000,
    body_read_timeout_ms: 30_000,
    connections_per_ip: 1_000,
    shutdown_grace_ms: 10_000,
    concurrent_uploads: 4,
    bundle_check_timeout_ms: 5_000,
    trusted_proxy_hops: 1,
    lookups_per_ip_per_second: 10,
    lookup_burst_per_ip: 200,
    joins_per_ip_per_second: 10,
    join_burst_per_ip: 200,
    rate_limited_ips: 65_536,
    bundle_cache_bytes: 64 * 1024 * 1024,
};

// The default cache holds at least one bundle of the protocol's largest.
const _: () = assert!(SERVER_LIMITS.bundle_cache_bytes >= RELAY_LIMITS.bundle_bytes);

impl ServerLimits {
    /// The accept loop's share of these limits.
    pub fn serve(&self) -> ServeLimits {
        ServeLimits {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(self.body_read_timeout_ms),
            connections_per_ip: self.connections_per_ip,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_kept_when_they_left_the_protocol_crate() {
        assert_eq!(
            SERVER_LIMITS.ws_write_buffer_bytes,
            6 * 1024 * 1024 + 64 * 1024
        );
        assert_eq!(SERVER_LIMITS.outbound_queue_bytes, 8 * 1024 * 1024);
        assert_eq!(SERVER_LIMITS.bundle_cache_bytes, 64 * 1024 * 1024);
        assert_eq!(
            (
                SERVER_LIMITS.header_read_timeout_ms,
                SERVER_LIMITS.body_read_timeout_ms
            ),
            (10_000, 30_000)
        );
        assert_eq!(SERVER_LIMITS.rate_limited_ips, 65_536);
    }
}
