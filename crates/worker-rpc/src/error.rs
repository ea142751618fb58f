//! Errors as callers see them, rebuilt from the wire envelope with a bounded
//! cause chain, and error chains turned into envelopes without looping.

use crate::frame::{ErrorEnvelope, Payload};
use std::fmt;

/// Error codes this implementation produces.
pub mod codes {
    /// The peer speaks another MAJOR version.
    pub const VERSION_MISMATCH: &str = "VERSION_MISMATCH";
    /// No handler for the method.
    pub const UNKNOWN_METHOD: &str = "UNKNOWN_METHOD";
    /// The call was cancelled by its caller.
    pub const CANCELLED: &str = "CANCELLED";
    /// The call's deadline passed.
    pub const TIMEOUT: &str = "TIMEOUT";
    /// The peer said goodbye with calls or streams still open.
    pub const PEER_GOODBYE: &str = "PEER_GOODBYE";
    /// This side said goodbye; nothing more can be sent.
    pub const GOODBYE: &str = "GOODBYE";
    /// The transport closed without a goodbye.
    pub const TRANSPORT_CLOSED: &str = "TRANSPORT_CLOSED";
    /// A frame broke the protocol (malformed, wrong direction, reused id).
    pub const PROTOCOL_ERROR: &str = "PROTOCOL_ERROR";
    /// A stream chunk arrived beyond the credit the receiver granted.
    pub const STREAM_CREDIT_EXCEEDED: &str = "STREAM_CREDIT_EXCEEDED";
    /// Too many calls in flight: the peer's limit (`PeerConfig::max_inbound_calls`)
    /// or this side's (`PeerConfig::max_outbound_calls`).
    pub const TOO_MANY_CALLS: &str = "TOO_MANY_CALLS";
    /// A frame would be over the frame size or depth limit: the one call,
    /// chunk or progress fails; the connection stays.
    pub const FRAME_TOO_LARGE: &str = "FRAME_TOO_LARGE";
    /// The peer did not read what this side wrote within the write timeout.
    pub const WRITE_TIMEOUT: &str = "WRITE_TIMEOUT";
    /// A handler failed without an error of its own.
    pub const INTERNAL_ERROR: &str = "INTERNAL_ERROR";
    /// Marks where a cause chain was cut at the depth bound.
    pub const CAUSE_TRUNCATED: &str = "CAUSE_TRUNCATED";
    /// Marks where an error chain looped back on itself.
    pub const CAUSE_CYCLE: &str = "CAUSE_CYCLE";
}

/// Default bound of a rebuilt cause chain.
pub const DEFAULT_MAX_CAUSE_DEPTH: usize = 8;

/// An error of a call or stream.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: String,
    pub message: String,
    /// Raw JSON, passed through as it came.
    pub data: Option<Payload>,
    pub cause: Option<Box<RpcError>>,
    /// Causes beyond the depth bound were dropped; the last kept cause says
    /// how many.
    pub truncated: bool,
}

impl RpcError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            data: None,
            cause: None,
            truncated: false,
        }
    }

    pub fn with_data(mut self, data: impl Into<Payload>) -> Self {
        self.data = Some(data.into());
        self
    }

    pub fn with_cause(mut self, cause: RpcError) -> Self {
        self.cause = Some(Box::new(cause));
        self
    }

    /// Rebuilds an error from the wire, keeping at most `max_depth` links
    /// (the error itself counts as one). What was cut is marked by a last
    /// cause with code `CAUSE_TRUNCATED`, and `truncated` on the error.
    pub fn from_envelope(env: &ErrorEnvelope, max_depth: usize) -> RpcError {
        let max_depth = max_depth.max(1);
        let mut links: Vec<&ErrorEnvelope> = Vec::new();
        let mut cur = Some(env);
        let mut dropped = 0usize;
        while let Some(e) = cur {
            if links.len() < max_depth {
                links.push(e);
            } else {
                dropped += 1;
            }
            cur = e.cause.as_deref();
        }
        let mut out: Option<RpcError> = if dropped > 0 {
            Some(RpcError::new(
                codes::CAUSE_TRUNCATED,
                format!("{dropped} more cause(s) cut at depth {max_depth}"),
            ))
        } else {
            None
        };
        for e in links.into_iter().rev() {
            out = Some(RpcError {
                code: e.code.clone(),
                message: e.message.clone(),
                data: e.data.clone(),
                cause: out.map(Box::new),
                truncated: dropped > 0,
            });
        }
        out.unwrap_or_else(|| RpcError::new(codes::INTERNAL_ERROR, "empty error"))
    }

    /// The wire form.
    pub fn to_envelope(&self) -> ErrorEnvelope {
        self.to_envelope_bounded(usize::MAX)
    }

    /// The wire form with at most `max_depth` links; a cut chain ends in a
    /// `CAUSE_TRUNCATED` cause.
    pub fn to_envelope_bounded(&self, max_depth: usize) -> ErrorEnvelope {
        let max_depth = max_depth.max(1);
        let mut chain: Vec<&RpcError> = Vec::new();
        let mut cur = Some(self);
        let mut dropped = 0usize;
        while let Some(e) = cur {
            if chain.len() < max_depth {
                chain.push(e);
            } else {
                dropped += 1;
            }
            cur = e.cause.as_deref();
        }
        let mut out: Option<ErrorEnvelope> = (dropped > 0).then(|| {
            ErrorEnvelope::new(
                codes::CAUSE_TRUNCATED,
                format!("{dropped} more cause(s) cut at depth {max_depth}"),
            )
        });
        for e in chain.into_iter().rev() {
            out = Some(ErrorEnvelope {
                code: e.code.clone(),
                message: e.message.clone(),
                data: e.data.clone(),
                cause: out.map(Box::new),
            });
        }
        out.unwrap_or_else(|| ErrorEnvelope::new(codes::INTERNAL_ERROR, "empty error"))
    }

    /// An envelope from any Rust error and its `source()` chain, bounded by
    /// `max_depth` and safe against a chain that loops back on itself.
    pub fn from_std(
        err: &(dyn std::error::Error + 'static),
        code: &str,
        max_depth: usize,
    ) -> RpcError {
        // Fat pointers: a struct and its first field share an address but
        // not a type, so the vtable takes part in the comparison.
        let mut seen: Vec<*const dyn std::error::Error> = Vec::new();
        let mut links: Vec<String> = Vec::new();
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
        let mut end: Option<RpcError> = None;
        while let Some(e) = cur {
            let ptr = e as *const dyn std::error::Error;
            #[allow(ambiguous_wide_pointer_comparisons)]
            if seen.iter().any(|p| std::ptr::eq(*p, ptr)) {
                end = Some(RpcError::new(
                    codes::CAUSE_CYCLE,
                    "the cause chain loops back here",
                ));
                break;
            }
            if links.len() >= max_depth.max(1) {
                end = Some(RpcError::new(
                    codes::CAUSE_TRUNCATED,
                    format!("causes cut at depth {max_depth}"),
                ));
                break;
            }
            seen.push(ptr);
            links.push(e.to_string());
            cur = e.source();
        }
        let truncated = end.is_some();
        let mut out = end;
        for (i, message) in links.into_iter().enumerate().rev() {
            let c = if i == 0 {
                code.to_owned()
            } else {
                codes::INTERNAL_ERROR.to_owned()
            };
            out = Some(RpcError {
                code: c,
                message,
                data: None,
                cause: out.map(Box::new),
                truncated,
            });
        }
        out.unwrap_or_else(|| RpcError::new(code, "error"))
    }

    /// The depth of the cause chain (1 = no cause).
    pub fn depth(&self) -> usize {
        let mut n = 1;
        let mut cur = self.cause.as_deref();
        while let Some(c) = cur {
            n += 1;
            cur = c.cause.as_deref();
        }
        n
    }

    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.code, self.message)
    }
}

impl std::error::Error for RpcError {}
