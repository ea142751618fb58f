//! One relay connection before and after it attaches: the frame cap, the
//! rate limit, decoding, `ping`, and where the frame goes next.

use super::protocol::*;
use crate::limits::RelayLimits;
use bytes::Bytes;
use hostwire_core::TokenBucket;

/// A connection's id, unique within one server process.
pub type ConnId = u64;

/// What the driver does with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnStep {
    /// Answer the sender with this frame and go on.
    Reply(Bytes),
    /// Answer with this frame, then close the connection (4000).
    Fatal(Bytes, RelayErrorCode),
    /// `host` / `join`: find the room by PIN and attach there.
    Attach {
        pin: String,
        msg: RelayClientMessage,
    },
    /// Hand the frame to the room the connection is attached to.
    Forward(RelayClientMessage),
    /// Dropped by the rate limit (the reply says so).
    RateLimited(Bytes),
}

#[derive(Debug)]
pub struct ConnectionState {
    limiter: TokenBucket,
    attached_pin: Option<String>,
    limits: RelayLimits,
}

fn fatal(code: RelayErrorCode, message: &str) -> ConnStep {
    ConnStep::Fatal(frames::error(code, message, true), code)
}

impl ConnectionState {
    pub fn new(now_ms: u64, limits: RelayLimits) -> Self {
        Self {
            limiter: TokenBucket::new(
                f64::from(limits.player_frames_per_second),
                limits.player_frame_burst,
                now_ms,
            ),
            attached_pin: None,
            limits,
        }
    }

    pub fn attached_pin(&self) -> Option<&str> {
        self.attached_pin.as_deref()
    }

    /// The room accepted the connection.
    pub fn on_attached(&mut self, pin: &str, host: bool, now_ms: u64) {
        self.attached_pin = Some(pin.to_owned());
        if host {
            self.limiter = TokenBucket::new(
                f64::from(self.limits.host_frames_per_second),
                self.limits.host_frame_burst,
                now_ms,
            );
        }
    }

    pub fn on_frame(&mut self, text: &str, now_ms: u64) -> ConnStep {
        if text.len() > self.limits.frame_bytes {
            return ConnStep::Reply(frames::error(
                RelayErrorCode::TooLarge,
                &format!("Frames are limited to {} bytes.", self.limits.frame_bytes),
                false,
            ));
        }
        if !self.limiter.try_take(now_ms) {
            return ConnStep::RateLimited(frames::error(
                RelayErrorCode::RateLimited,
                "Too many messages.",
                false,
            ));
        }
        let msg = match decode_client_frame(text) {
            Ok(m) => m,
            Err(e) => return ConnStep::Reply(frames::error(e.code, &e.message, false)),
        };
        match &msg {
            RelayClientMessage::Ping => ConnStep::Reply(frames::pong(now_ms)),
            RelayClientMessage::Host {
                protocol_ok, pin, ..
            }
            | RelayClientMessage::Join {
                protocol_ok, pin, ..
            } => {
                if !protocol_ok {
                    return fatal(
                        RelayErrorCode::UnsupportedProtocol,
                        &format!("This server speaks relay protocol {RELAY_PROTOCOL}."),
                    );
                }
                match pin.as_deref().filter(|p| is_pin(p)) {
                    Some(p) => ConnStep::Attach {
                        pin: p.to_owned(),
                        msg: msg.clone(),
                    },
                    None => fatal(RelayErrorCode::RoomNotFound, "No game with this PIN."),
                }
            }
            _ if self.attached_pin.is_none() => ConnStep::Reply(frames::error(
                RelayErrorCode::NotAllowed,
                "Send \"host\" or \"join\" first.",
                false,
            )),
            _ => ConnStep::Forward(msg),
        }
    }
}
