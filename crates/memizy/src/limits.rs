//! Every limit of SPEC 8.1 and of the relay, named as `@memizy/protocol`
//! names them. The SPEC's values are guaranteed minimums: a host may only
//! raise them.

/// The limits of SPEC 8.1 (and the package CHANGELOG 1.0.0-rc.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Max serialized size of one `send` message.
    pub message_bytes: usize,
    pub messages_per_second: u32,
    pub message_burst: u32,
    pub snapshot_bytes: usize,
    /// Snapshots stored per second; more are coalesced.
    pub snapshots_per_second: u32,
    /// Plugin data per scope.
    pub data_bytes: usize,
    /// Plugin data writes stored per second and scope; more are coalesced.
    pub data_writes_per_second: u32,
    pub hello_timeout_ms: u64,
    /// `recordAnswer` answer.
    pub answer_bytes: usize,
    /// `recordAnswer` generated item.
    pub generated_item_bytes: usize,
    pub answers_per_second: u32,
    pub answer_burst: u32,
    pub assets_per_second: u32,
    pub asset_burst: u32,
    pub asset_bytes: usize,
    pub error_reports_per_second: u32,
    pub error_report_burst: u32,
    pub service_request_bytes: usize,
    pub service_result_bytes: usize,
    pub service_calls_per_minute: u32,
}

/// The guaranteed minimums.
pub const LIMITS: Limits = Limits {
    message_bytes: 64 * 1024,
    messages_per_second: 30,
    message_burst: 60,
    snapshot_bytes: 1024 * 1024,
    snapshots_per_second: 2,
    data_bytes: 256 * 1024,
    data_writes_per_second: 1,
    hello_timeout_ms: 10_000,
    answer_bytes: 4 * 1024,
    generated_item_bytes: 32 * 1024,
    answers_per_second: 10,
    answer_burst: 20,
    assets_per_second: 10,
    asset_burst: 20,
    asset_bytes: 2 * 1024 * 1024,
    error_reports_per_second: 5,
    error_report_burst: 10,
    service_request_bytes: 64 * 1024,
    service_result_bytes: 256 * 1024,
    service_calls_per_minute: 30,
};

impl Limits {
    /// `self` with every value at least the guaranteed minimum: a
    /// configuration may raise a limit, never lower it.
    pub fn at_least_minimums(self) -> Limits {
        let m = LIMITS;
        Limits {
            message_bytes: self.message_bytes.max(m.message_bytes),
            messages_per_second: self.messages_per_second.max(m.messages_per_second),
            message_burst: self.message_burst.max(m.message_burst),
            snapshot_bytes: self.snapshot_bytes.max(m.snapshot_bytes),
            snapshots_per_second: self.snapshots_per_second.max(m.snapshots_per_second),
            data_bytes: self.data_bytes.max(m.data_bytes),
            data_writes_per_second: self.data_writes_per_second.max(m.data_writes_per_second),
            hello_timeout_ms: self.hello_timeout_ms.max(m.hello_timeout_ms),
            answer_bytes: self.answer_bytes.max(m.answer_bytes),
            generated_item_bytes: self.generated_item_bytes.max(m.generated_item_bytes),
            answers_per_second: self.answers_per_second.max(m.answers_per_second),
            answer_burst: self.answer_burst.max(m.answer_burst),
            assets_per_second: self.assets_per_second.max(m.assets_per_second),
            asset_burst: self.asset_burst.max(m.asset_burst),
            asset_bytes: self.asset_bytes.max(m.asset_bytes),
            error_reports_per_second: self
                .error_reports_per_second
                .max(m.error_reports_per_second),
            error_report_burst: self.error_report_burst.max(m.error_report_burst),
            service_request_bytes: self.service_request_bytes.max(m.service_request_bytes),
            service_result_bytes: self.service_result_bytes.max(m.service_result_bytes),
            service_calls_per_minute: self
                .service_calls_per_minute
                .max(m.service_calls_per_minute),
        }
    }

    /// The largest argument text a host call may have under these limits:
    /// the largest payload plus room for the other arguments.
    pub fn max_call_bytes(&self) -> usize {
        let largest = self
            .message_bytes
            .max(self.snapshot_bytes)
            .max(self.data_bytes)
            .max(self.service_request_bytes)
            .max(self.answer_bytes + self.generated_item_bytes);
        largest + CALL_ENVELOPE_BYTES
    }
}

/// Room for the non-payload parts of a call (addresses, field names).
pub const CALL_ENVELOPE_BYTES: usize = 64 * 1024;

/// How deep a value may nest: the reference's `findNonJson` bound, plus
/// the levels of the call's own envelope.
pub const MAX_JSON_DEPTH: usize = 64;
pub const CALL_ENVELOPE_DEPTH: usize = 4;

/// The limits of the relay protocol 1: the rules a client of the protocol
/// meets, as the reference relay documents them. How a server protects
/// itself (timeouts, per-IP tables, caches, room cap) is the server's
/// setting, not the protocol's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayLimits {
    /// One WebSocket frame; 3 MB so that a 2 MB asset fits as base64.
    pub frame_bytes: usize,
    /// One uploaded bundle (`PUT /api/rooms/:pin/bundle`).
    pub bundle_bytes: usize,
    pub players_per_room: usize,
    pub name_length: usize,
    pub host_frames_per_second: u32,
    pub host_frame_burst: u32,
    pub player_frames_per_second: u32,
    pub player_frame_burst: u32,
    pub rooms_per_ip_per_hour: u32,
    pub host_away_ms: u64,
    pub room_max_age_ms: u64,
    pub sweep_interval_ms: u64,
    pub idle_timeout_ms: u64,
}

pub const RELAY_LIMITS: RelayLimits = RelayLimits {
    frame_bytes: 3 * 1024 * 1024,
    bundle_bytes: 8 * 1024 * 1024,
    players_per_room: 100,
    name_length: 32,
    host_frames_per_second: 3000,
    host_frame_burst: 6000,
    player_frames_per_second: 60,
    player_frame_burst: 120,
    rooms_per_ip_per_hour: 60,
    host_away_ms: 10 * 60 * 1000,
    room_max_age_ms: 6 * 60 * 60 * 1000,
    sweep_interval_ms: 30_000,
    idle_timeout_ms: 60_000,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_values() {
        assert_eq!(LIMITS.message_bytes, 65_536);
        assert_eq!(LIMITS.answer_bytes, 4_096);
        assert_eq!(LIMITS.generated_item_bytes, 32_768);
        assert_eq!(LIMITS.asset_bytes, 2_097_152);
        assert_eq!(LIMITS.service_result_bytes, 262_144);
        assert_eq!((LIMITS.answers_per_second, LIMITS.answer_burst), (10, 20));
        assert_eq!((LIMITS.assets_per_second, LIMITS.asset_burst), (10, 20));
        assert_eq!(
            (LIMITS.error_reports_per_second, LIMITS.error_report_burst),
            (5, 10)
        );
        assert_eq!(RELAY_LIMITS.frame_bytes, 3_145_728);
    }

    #[test]
    fn configuration_cannot_lower_a_minimum() {
        let lowered = Limits {
            message_bytes: 10,
            asset_burst: 1,
            ..LIMITS
        };
        assert_eq!(lowered.at_least_minimums(), LIMITS);
        let raised = Limits {
            message_bytes: 1 << 20,
            ..LIMITS
        };
        assert_eq!(raised.at_least_minimums().message_bytes, 1 << 20);
    }
}
