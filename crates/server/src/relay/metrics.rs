//! The relay's counters, labelled by the protocol's own enums: frame types
//! in and out and error codes come from `hostwire_memizy::relay`, so no list
//! here can drift from the protocol.

use crate::metrics::{write_counter, write_gauge, Counters, Label, Render};
use hostwire_memizy::relay::{
    ClientFrameKind, RelayErrorCode, RelayServerMessage, ServerFrameKind,
};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

impl Label for ClientFrameKind {
    const ALL: &'static [Self] = ClientFrameKind::ALL;
    fn name(self) -> &'static str {
        self.as_str()
    }
    fn index(self) -> usize {
        self as usize
    }
}

impl Label for ServerFrameKind {
    const ALL: &'static [Self] = ServerFrameKind::ALL;
    fn name(self) -> &'static str {
        self.as_str()
    }
    fn index(self) -> usize {
        self as usize
    }
}

impl Label for RelayErrorCode {
    const ALL: &'static [Self] = RelayErrorCode::ALL;
    fn name(self) -> &'static str {
        self.as_str()
    }
    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Default)]
pub struct RelayMetrics {
    pub rooms: AtomicI64,
    pub connections: AtomicI64,
    pub frames_in: Counters<ClientFrameKind>,
    pub frames_out: Counters<ServerFrameKind>,
    pub errors: Counters<RelayErrorCode>,
    pub rate_limited: AtomicU64,
    /// `GET /api/rooms/:pin` answered 429 (`LOOKUPS_PER_IP_PER_SECOND`).
    pub lookups_rate_limited: AtomicU64,
    pub bytes_forwarded: AtomicU64,
    pub slow_consumers_closed: AtomicU64,
    pub rooms_created: AtomicU64,
    pub rooms_expired: AtomicU64,
}

impl RelayMetrics {
    /// A client frame was read.
    pub fn frame_in(&self, kind: ClientFrameKind) {
        self.frames_in.add(kind, 1);
    }

    /// `frame`, encoded into `len` bytes, was queued for `copies`
    /// connections.
    pub fn frame_out(&self, frame: &RelayServerMessage, len: usize, copies: usize) {
        let copies = copies as u64;
        let kind = frame.kind();
        self.frames_out.add(kind, copies);
        if let Some(code) = frame.error_code() {
            self.errors.add(code, copies);
        }
        if kind.is_forwarded() {
            self.bytes_forwarded.fetch_add(len as u64 * copies, Relaxed);
        }
    }
}

impl Render for RelayMetrics {
    fn render(&self, s: &mut String) {
        write_gauge(
            s,
            "hostwire_relay_rooms",
            "Live relay rooms.",
            self.rooms.load(Relaxed),
        );
        write_gauge(
            s,
            "hostwire_relay_connections",
            "Open relay WebSocket connections.",
            self.connections.load(Relaxed),
        );
        self.frames_in.render(
            s,
            "hostwire_relay_frames_in_total",
            "Client frames received, by type.",
            "type",
        );
        self.frames_out.render(
            s,
            "hostwire_relay_frames_out_total",
            "Server frames queued, by type.",
            "type",
        );
        self.errors.render(
            s,
            "hostwire_relay_errors_total",
            "Error frames sent, by code.",
            "code",
        );
        write_counter(
            s,
            "hostwire_relay_rate_limited_total",
            "Frames dropped by a rate limit.",
            self.rate_limited.load(Relaxed),
        );
        write_counter(
            s,
            "hostwire_relay_lookups_rate_limited_total",
            "Room lookups answered 429 by the per-IP limit.",
            self.lookups_rate_limited.load(Relaxed),
        );
        write_counter(
            s,
            "hostwire_relay_forwarded_bytes_total",
            "Bytes of forwarded frames (data, from).",
            self.bytes_forwarded.load(Relaxed),
        );
        write_counter(
            s,
            "hostwire_relay_slow_consumers_closed_total",
            "Connections closed because their outbound queue was full.",
            self.slow_consumers_closed.load(Relaxed),
        );
        write_counter(
            s,
            "hostwire_relay_rooms_created_total",
            "Rooms created.",
            self.rooms_created.load(Relaxed),
        );
        write_counter(
            s,
            "hostwire_relay_rooms_expired_total",
            "Rooms closed by expiry.",
            self.rooms_expired.load(Relaxed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indices_match<L: Label>() {
        for (i, l) in L::ALL.iter().enumerate() {
            assert_eq!(l.index(), i, "{}", l.name());
        }
    }

    #[test]
    fn every_label_indexes_its_own_counter() {
        indices_match::<ClientFrameKind>();
        indices_match::<ServerFrameKind>();
        indices_match::<RelayErrorCode>();
    }

    #[test]
    fn frames_out_are_counted_by_type_code_and_forwarded_bytes() {
        let m = RelayMetrics::default();
        let err = RelayServerMessage::error(RelayErrorCode::RoomFull, "The game is full.", true);
        m.frame_out(&err, 80, 1);
        m.frame_out(&RelayServerMessage::Data { data: None }, 12, 3);
        assert_eq!(m.frames_out.get(ServerFrameKind::Error), 1);
        assert_eq!(m.errors.get(RelayErrorCode::RoomFull), 1);
        assert_eq!(m.frames_out.get(ServerFrameKind::Data), 3);
        assert_eq!(m.bytes_forwarded.load(Relaxed), 36);
        let mut s = String::new();
        m.render(&mut s);
        assert!(
            s.contains("hostwire_relay_errors_total{code=\"ROOM_FULL\"} 1"),
            "{s}"
        );
        assert!(s.contains("hostwire_relay_frames_out_total{type=\"host-presence\"} 0"));
    }
}
