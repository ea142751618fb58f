//! One relay connection before and after it attaches: the frame cap, the
//! rate limit, decoding, `ping`, where a frame goes next, and which room the
//! connection is attached to (tracked here and nowhere else).

use super::protocol::*;
use crate::limits::RelayLimits;
use hostwire_core::TokenBucket;

/// A connection's id, unique within one server process.
pub type ConnId = u64;

/// A close code and its reason.
pub type CloseWith = (u16, &'static str);

/// What the driver does with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnStep {
    /// Answer the sender with this frame and go on. `received` is what the
    /// frame was.
    Reply {
        received: ClientFrameKind,
        frame: RelayServerMessage,
    },
    /// Answer with this frame, then close the connection.
    Fatal {
        received: ClientFrameKind,
        frame: RelayServerMessage,
        close: CloseWith,
    },
    /// `host` / `join`: find the room by PIN (none: [`ConnectionState::room_not_found`])
    /// and attach there. A connection that is already attached is still
    /// sent to the room, which answers in the reference's order (a wrong
    /// host token first).
    Attach {
        pin: String,
        msg: RelayClientMessage,
        already_attached: bool,
    },
    /// Hand the frame to the room the connection is attached to.
    Forward(RelayClientMessage),
    /// Dropped by the rate limit (the frame says so).
    RateLimited(RelayServerMessage),
}

/// One connection's rules. `R` is how the driver reaches the room the
/// connection is attached to (a handle to the room's task, or its PIN).
#[derive(Debug)]
pub struct ConnectionState<R = String> {
    limiter: TokenBucket,
    attached: Option<Attached<R>>,
    limits: ConnLimits,
}

/// What a connection keeps of [`RelayLimits`]: a server holds one state per
/// connection for the connection's life, so not the whole table.
#[derive(Debug, Clone, Copy)]
struct ConnLimits {
    frame_bytes: usize,
    host_frames_per_second: u32,
    host_frame_burst: u32,
}

#[derive(Debug)]
struct Attached<R> {
    room: R,
    host: bool,
}

fn fatal(received: ClientFrameKind, code: RelayErrorCode, message: String) -> ConnStep {
    ConnStep::Fatal {
        received,
        frame: RelayServerMessage::error(code, message, true),
        close: (CLOSE_POLICY, code.as_str()),
    }
}

impl<R> ConnectionState<R> {
    pub fn new(now_ms: u64, limits: RelayLimits) -> Self {
        Self {
            limiter: TokenBucket::new(
                f64::from(limits.player_frames_per_second),
                limits.player_frame_burst,
                now_ms,
            ),
            attached: None,
            limits: ConnLimits {
                frame_bytes: limits.frame_bytes,
                host_frames_per_second: limits.host_frames_per_second,
                host_frame_burst: limits.host_frame_burst,
            },
        }
    }

    /// The room this connection is attached to.
    pub fn room(&self) -> Option<&R> {
        self.attached.as_ref().map(|a| &a.room)
    }

    /// Whether it is attached as the host.
    pub fn is_host(&self) -> bool {
        self.attached.as_ref().is_some_and(|a| a.host)
    }

    /// The connection ends: the room it leaves, if any.
    pub fn detach(&mut self) -> Option<R> {
        self.attached.take().map(|a| a.room)
    }

    /// The room accepted the connection. A host gets the host's rate limit.
    pub fn on_attached(&mut self, room: R, host: bool, now_ms: u64) {
        self.attached = Some(Attached { room, host });
        if host {
            self.limiter = TokenBucket::new(
                f64::from(self.limits.host_frames_per_second),
                self.limits.host_frame_burst,
                now_ms,
            );
        }
    }

    /// No live room has the PIN of this `host` / `join`.
    pub fn room_not_found(&self, msg: &RelayClientMessage) -> ConnStep {
        let message = if matches!(msg, RelayClientMessage::Host { .. }) {
            "The room does not exist (anymore)."
        } else {
            "No game with this PIN."
        };
        fatal(msg.kind(), RelayErrorCode::RoomNotFound, message.into())
    }

    /// This `host` / `join` is over its client IP's attach rate (shared by
    /// every connection from that IP, so the server keeps it): not fatal,
    /// the frame is dropped and the connection closed with 1013 "try again
    /// later", which a client answers by reconnecting with its backoff and
    /// sending its `host` / `join` again.
    pub fn attach_rate_limited(&self, msg: &RelayClientMessage, retry_after_s: u64) -> ConnStep {
        ConnStep::Fatal {
            received: msg.kind(),
            frame: RelayServerMessage::error(
                RelayErrorCode::RateLimited,
                format!("Too many joins from this network; try again in {retry_after_s} s."),
                false,
            ),
            close: (CLOSE_TOO_SLOW, "try again later"),
        }
    }

    /// The WebSocket layer refused a frame beyond twice the cap: the
    /// connection cannot go on reading (1009).
    pub fn on_oversized(&self) -> ConnStep {
        ConnStep::Fatal {
            received: ClientFrameKind::Invalid,
            frame: RelayServerMessage::error(RelayErrorCode::TooLarge, "Frame too large.", true),
            close: (CLOSE_TOO_BIG, "frame too large"),
        }
    }

    /// A binary frame that is not UTF-8 text.
    pub fn on_not_text(&self) -> ConnStep {
        ConnStep::Reply {
            received: ClientFrameKind::Invalid,
            frame: RelayServerMessage::error(RelayErrorCode::BadMessage, "Invalid JSON.", false),
        }
    }

    pub fn on_frame(&mut self, text: &str, now_ms: u64) -> ConnStep {
        if text.len() > self.limits.frame_bytes {
            return ConnStep::Reply {
                received: ClientFrameKind::Invalid,
                frame: RelayServerMessage::error(
                    RelayErrorCode::TooLarge,
                    format!("Frames are limited to {} bytes.", self.limits.frame_bytes),
                    false,
                ),
            };
        }
        if !self.limiter.try_take(now_ms) {
            return ConnStep::RateLimited(RelayServerMessage::error(
                RelayErrorCode::RateLimited,
                "Too many messages.",
                false,
            ));
        }
        let msg = match decode_client_frame(text) {
            Ok(m) => m,
            Err(e) => {
                return ConnStep::Reply {
                    received: ClientFrameKind::Invalid,
                    frame: RelayServerMessage::error(e.code, e.message, false),
                }
            }
        };
        match &msg {
            RelayClientMessage::Ping => ConnStep::Reply {
                received: ClientFrameKind::Ping,
                frame: RelayServerMessage::Pong { time: now_ms },
            },
            RelayClientMessage::Host {
                protocol_ok, pin, ..
            }
            | RelayClientMessage::Join {
                protocol_ok, pin, ..
            } => {
                if !protocol_ok {
                    return fatal(
                        msg.kind(),
                        RelayErrorCode::UnsupportedProtocol,
                        format!("This server speaks relay protocol {RELAY_PROTOCOL}."),
                    );
                }
                match pin.as_deref().filter(|p| is_pin(p)) {
                    Some(p) => ConnStep::Attach {
                        pin: p.to_owned(),
                        already_attached: self.attached.is_some(),
                        msg,
                    },
                    None => self.room_not_found(&msg),
                }
            }
            _ if self.attached.is_none() => ConnStep::Reply {
                received: msg.kind(),
                frame: RelayServerMessage::error(
                    RelayErrorCode::NotAllowed,
                    "Send \"host\" or \"join\" first.",
                    false,
                ),
            },
            _ => ConnStep::Forward(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim::{World, T0};
    use super::*;
    use crate::limits::RELAY_LIMITS;
    use hostwire_core::{Clock, ManualClock};
    use serde_json::json;

    fn state(clock: &ManualClock) -> ConnectionState<&'static str> {
        ConnectionState::new(clock.now_ms(), RELAY_LIMITS)
    }

    fn error_of(step: &ConnStep) -> (RelayErrorCode, bool) {
        let frame = match step {
            ConnStep::Reply { frame, .. }
            | ConnStep::Fatal { frame, .. }
            | ConnStep::RateLimited(frame) => frame,
            other => panic!("not an answer: {other:?}"),
        };
        match frame {
            RelayServerMessage::Error { code, fatal, .. } => (*code, *fatal),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn a_frame_over_the_cap_is_refused_and_the_connection_lives() {
        let clock = ManualClock::new(T0);
        let mut s = state(&clock);
        let big = format!(
            r#"{{"t":"up","data":"{}"}}"#,
            "x".repeat(RELAY_LIMITS.frame_bytes)
        );
        let step = s.on_frame(&big, clock.now_ms());
        assert_eq!(error_of(&step), (RelayErrorCode::TooLarge, false));
        assert!(matches!(
            step,
            ConnStep::Reply {
                received: ClientFrameKind::Invalid,
                ..
            }
        ));
        // Beyond what the WebSocket layer takes: fatal, closed with 1009.
        let step = s.on_oversized();
        assert_eq!(error_of(&step), (RelayErrorCode::TooLarge, true));
        assert!(matches!(
            step,
            ConnStep::Fatal {
                close: (CLOSE_TOO_BIG, _),
                ..
            }
        ));
    }

    #[test]
    fn an_attach_over_the_ip_rate_is_not_fatal_and_closes_1013() {
        let clock = ManualClock::new(T0);
        let s = state(&clock);
        let msg =
            decode_client_frame(r#"{"t":"join","protocol":1,"pin":"123456","name":"A"}"#).unwrap();
        let step = s.attach_rate_limited(&msg, 3);
        assert_eq!(error_of(&step), (RelayErrorCode::RateLimited, false));
        let ConnStep::Fatal {
            received,
            frame,
            close,
        } = step
        else {
            panic!("{step:?}")
        };
        assert_eq!(received, ClientFrameKind::Join);
        assert_eq!(close, (CLOSE_TOO_SLOW, "try again later"));
        assert!(frame.encode("").contains("try again in 3 s"));
    }

    #[test]
    fn a_player_is_limited_to_its_burst_and_refilled_by_the_clock() {
        let clock = ManualClock::new(T0);
        let mut s = state(&clock);
        let ping = r#"{"t":"ping"}"#;
        for i in 0..RELAY_LIMITS.player_frame_burst {
            let step = s.on_frame(ping, clock.now_ms());
            assert!(
                matches!(step, ConnStep::Reply { .. }),
                "frame {i}: {step:?}"
            );
        }
        let step = s.on_frame(ping, clock.now_ms());
        assert!(matches!(step, ConnStep::RateLimited(_)));
        assert_eq!(error_of(&step), (RelayErrorCode::RateLimited, false));
        // One second gives back the rate: 60 frames.
        clock.advance_ms(1_000);
        for _ in 0..RELAY_LIMITS.player_frames_per_second {
            assert!(matches!(
                s.on_frame(ping, clock.now_ms()),
                ConnStep::Reply { .. }
            ));
        }
        assert!(matches!(
            s.on_frame(ping, clock.now_ms()),
            ConnStep::RateLimited(_)
        ));
    }

    #[test]
    fn a_host_gets_the_hosts_rate() {
        let clock = ManualClock::new(T0);
        let mut s = state(&clock);
        s.on_attached("123456", true, clock.now_ms());
        assert!(s.is_host());
        let ping = r#"{"t":"ping"}"#;
        for _ in 0..RELAY_LIMITS.host_frame_burst {
            assert!(matches!(
                s.on_frame(ping, clock.now_ms()),
                ConnStep::Reply { .. }
            ));
        }
        assert!(matches!(
            s.on_frame(ping, clock.now_ms()),
            ConnStep::RateLimited(_)
        ));
        // A player attached keeps the player's rate.
        let mut p = state(&clock);
        p.on_attached("123456", false, clock.now_ms());
        let taken = (0..RELAY_LIMITS.host_frame_burst)
            .take_while(|_| matches!(p.on_frame(ping, clock.now_ms()), ConnStep::Reply { .. }))
            .count();
        assert_eq!(taken, RELAY_LIMITS.player_frame_burst as usize);
    }

    #[test]
    fn ping_is_answered_with_the_time_and_counted_as_ping() {
        let clock = ManualClock::new(T0);
        let mut s = state(&clock);
        clock.advance_ms(42);
        assert_eq!(
            s.on_frame(r#"{"t":"ping"}"#, clock.now_ms()),
            ConnStep::Reply {
                received: ClientFrameKind::Ping,
                frame: RelayServerMessage::Pong { time: T0 + 42 }
            }
        );
    }

    #[test]
    fn a_frame_that_does_not_decode_is_bad_message_and_counted_invalid() {
        let clock = ManualClock::new(T0);
        let mut s = state(&clock);
        for bad in ["{", "[]", r#"{"t":1}"#] {
            let step = s.on_frame(bad, clock.now_ms());
            assert_eq!(
                error_of(&step),
                (RelayErrorCode::BadMessage, false),
                "{bad}"
            );
            assert!(matches!(
                step,
                ConnStep::Reply {
                    received: ClientFrameKind::Invalid,
                    ..
                }
            ));
        }
        assert_eq!(
            error_of(&s.on_not_text()),
            (RelayErrorCode::BadMessage, false)
        );
    }

    #[test]
    fn a_wrong_protocol_or_pin_is_fatal() {
        let clock = ManualClock::new(T0);
        let mut s = state(&clock);
        let step = s.on_frame(
            r#"{"t":"join","protocol":2,"pin":"123456"}"#,
            clock.now_ms(),
        );
        assert_eq!(error_of(&step), (RelayErrorCode::UnsupportedProtocol, true));
        assert!(matches!(
            step,
            ConnStep::Fatal {
                close: (CLOSE_POLICY, "UNSUPPORTED_PROTOCOL"),
                ..
            }
        ));
        for pin in [r#""12345""#, r#""abcdef""#, "123456", "null"] {
            let step = s.on_frame(
                &format!(r#"{{"t":"join","protocol":1,"pin":{pin}}}"#),
                clock.now_ms(),
            );
            assert_eq!(
                error_of(&step),
                (RelayErrorCode::RoomNotFound, true),
                "{pin}"
            );
        }
    }

    #[test]
    fn no_room_with_the_pin_is_told_as_the_reference_tells_it() {
        let clock = ManualClock::new(T0);
        let s = state(&clock);
        let message = |msg: RelayClientMessage| match s.room_not_found(&msg) {
            ConnStep::Fatal {
                frame:
                    RelayServerMessage::Error {
                        code,
                        message,
                        fatal,
                    },
                close,
                ..
            } => {
                assert_eq!(
                    (code, fatal, close),
                    (
                        RelayErrorCode::RoomNotFound,
                        true,
                        (CLOSE_POLICY, "ROOM_NOT_FOUND")
                    )
                );
                message
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(RelayClientMessage::Join {
                protocol_ok: true,
                pin: Some("123456".into()),
                name: None,
                token: None
            }),
            "No game with this PIN."
        );
        assert_eq!(
            message(RelayClientMessage::Host {
                protocol_ok: true,
                pin: Some("123456".into()),
                host_token: None
            }),
            "The room does not exist (anymore)."
        );
        // In the whole relay: a PIN no room has.
        let mut w = World::new();
        let c = w.connect();
        w.send(c, json!({"t": "join", "protocol": 1, "pin": "999999"}));
        let e = w.expect_error(c, RelayErrorCode::RoomNotFound, true);
        assert_eq!(e["message"], "No game with this PIN.");
        assert_eq!(w.closed(c), Some((CLOSE_POLICY, "ROOM_NOT_FOUND")));
    }

    #[test]
    fn frames_before_attaching_are_not_allowed_and_after_it_go_to_the_room() {
        let clock = ManualClock::new(T0);
        let mut s = state(&clock);
        let up = r#"{"t":"up","data":1}"#;
        let step = s.on_frame(up, clock.now_ms());
        assert_eq!(error_of(&step), (RelayErrorCode::NotAllowed, false));
        assert!(matches!(
            step,
            ConnStep::Reply {
                received: ClientFrameKind::Up,
                ..
            }
        ));
        s.on_attached("123456", false, clock.now_ms());
        assert!(matches!(
            s.on_frame(up, clock.now_ms()),
            ConnStep::Forward(RelayClientMessage::Up { .. })
        ));
    }

    #[test]
    fn attachment_is_tracked_by_the_connection() {
        let clock = ManualClock::new(T0);
        let mut s = state(&clock);
        let join = r#"{"t":"join","protocol":1,"pin":"123456"}"#;
        assert!(matches!(
            s.on_frame(join, clock.now_ms()),
            ConnStep::Attach { already_attached: false, ref pin, .. } if pin == "123456"
        ));
        assert_eq!(s.room(), None);
        s.on_attached("123456", false, clock.now_ms());
        assert_eq!(s.room(), Some(&"123456"));
        assert!(matches!(
            s.on_frame(join, clock.now_ms()),
            ConnStep::Attach {
                already_attached: true,
                ..
            }
        ));
        assert_eq!(s.detach(), Some("123456"));
        assert_eq!(s.detach(), None);
        assert!(matches!(
            s.on_frame(r#"{"t":"up"}"#, clock.now_ms()),
            ConnStep::Reply { .. }
        ));
    }
}
