//! `ProtocolError` (SPEC 8.2) and the error rules of `@memizy/protocol`:
//! messages are `[CODE] detail`; foreign errors keep a known `[CODE]`
//! prefix, `METHOD_NOT_FOUND` becomes `UNKNOWN_METHOD`, anything else
//! `INTERNAL_ERROR`.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! codes {
    ($($variant:ident => $wire:literal),* $(,)?) => {
        /// The error codes of SPEC 8.2.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ProtocolErrorCode {
            $(#[serde(rename = $wire)] $variant,)*
        }

        impl ProtocolErrorCode {
            /// Every code, in the order of the SPEC.
            pub const ALL: &'static [ProtocolErrorCode] = &[$(ProtocolErrorCode::$variant,)*];

            pub const fn as_str(self) -> &'static str {
                match self { $(ProtocolErrorCode::$variant => $wire,)* }
            }

            /// A known code, or `None` for a code this version does not know.
            pub fn from_wire(code: &str) -> Option<Self> {
                match code { $($wire => Some(ProtocolErrorCode::$variant),)* _ => None }
            }
        }
    };
}

codes! {
    UnsupportedProtocol => "UNSUPPORTED_PROTOCOL",
    InvalidArgument => "INVALID_ARGUMENT",
    NotAuthority => "NOT_AUTHORITY",
    NotAllowedInView => "NOT_ALLOWED_IN_VIEW",
    AuthorityUnavailable => "AUTHORITY_UNAVAILABLE",
    MessageTooLarge => "MESSAGE_TOO_LARGE",
    SnapshotTooLarge => "SNAPSHOT_TOO_LARGE",
    DataTooLarge => "DATA_TOO_LARGE",
    RateLimited => "RATE_LIMITED",
    AssetNotFound => "ASSET_NOT_FOUND",
    SessionEnded => "SESSION_ENDED",
    InternalError => "INTERNAL_ERROR",
    ServiceUnavailable => "SERVICE_UNAVAILABLE",
    UnknownMethod => "UNKNOWN_METHOD",
}

impl ProtocolErrorCode {
    /// How a receiver treats a code from the wire: unknown codes act like
    /// `INTERNAL_ERROR` (SPEC 8.2).
    pub fn treat_wire_code(code: &str) -> Self {
        Self::from_wire(code).unwrap_or(ProtocolErrorCode::InternalError)
    }
}

impl fmt::Display for ProtocolErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected call. `message` is the full `[CODE] detail` text, as the
/// reference puts it on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ProtocolError {
    pub code: ProtocolErrorCode,
    pub message: String,
}

impl ProtocolError {
    pub fn new(code: ProtocolErrorCode, detail: impl fmt::Display) -> Self {
        Self {
            code,
            message: format!("[{}] {}", code.as_str(), detail),
        }
    }

    pub fn invalid_argument(detail: impl fmt::Display) -> Self {
        Self::new(ProtocolErrorCode::InvalidArgument, detail)
    }

    /// The message without its `[CODE] ` prefix.
    pub fn detail(&self) -> &str {
        strip_code_prefix(&self.message).map_or(self.message.as_str(), |(_, rest)| rest)
    }

    /// Converts an error from elsewhere (a transport, a handler) given its
    /// message and, if it had one, its own `code` property.
    pub fn from_foreign(message: &str, foreign_code: Option<&str>) -> Self {
        if foreign_code == Some("METHOD_NOT_FOUND") {
            return Self::new(ProtocolErrorCode::UnknownMethod, message);
        }
        match strip_code_prefix(message) {
            Some((code, rest)) => {
                let code =
                    ProtocolErrorCode::from_wire(code).unwrap_or(ProtocolErrorCode::InternalError);
                Self::new(code, rest)
            }
            None => Self::new(ProtocolErrorCode::InternalError, message),
        }
    }
}

/// Splits `[CODE] rest` where CODE is `[A-Z_]+`; one optional whitespace
/// character after `]` belongs to the prefix.
fn strip_code_prefix(message: &str) -> Option<(&str, &str)> {
    let inner = message.strip_prefix('[')?;
    let end = inner.find(']')?;
    let code = &inner[..end];
    if code.is_empty() || !code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
        return None;
    }
    let mut rest = &inner[end + 1..];
    if let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
        }
    }
    Some((code, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProtocolErrorCode as C;

    #[test]
    fn there_are_fourteen_codes_and_they_round_trip() {
        assert_eq!(C::ALL.len(), 14);
        for &c in C::ALL {
            assert_eq!(C::from_wire(c.as_str()), Some(c));
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{c}\""));
        }
        assert_eq!(C::from_wire("NOPE"), None);
        assert_eq!(C::treat_wire_code("NOPE"), C::InternalError);
    }

    #[test]
    fn messages_carry_the_code_prefix() {
        let e = ProtocolError::new(C::RateLimited, "slow down");
        assert_eq!(e.message, "[RATE_LIMITED] slow down");
        assert_eq!(e.to_string(), "[RATE_LIMITED] slow down");
        assert_eq!(e.detail(), "slow down");
    }

    #[test]
    fn foreign_errors_keep_known_prefixes_only() {
        let e = ProtocolError::from_foreign("[DATA_TOO_LARGE] 5 MB", None);
        assert_eq!((e.code, e.detail()), (C::DataTooLarge, "5 MB"));
        let e = ProtocolError::from_foreign("[SOMETHING_NEW] x", None);
        assert_eq!((e.code, e.detail()), (C::InternalError, "x"));
        let e = ProtocolError::from_foreign("boom", None);
        assert_eq!(
            (e.code, e.message.as_str()),
            (C::InternalError, "[INTERNAL_ERROR] boom")
        );
        let e = ProtocolError::from_foreign("[lower] x", None);
        assert_eq!((e.code, e.detail()), (C::InternalError, "[lower] x"));
        let e = ProtocolError::from_foreign("no such method", Some("METHOD_NOT_FOUND"));
        assert_eq!((e.code, e.detail()), (C::UnknownMethod, "no such method"));
        let e = ProtocolError::from_foreign("[NOT_AUTHORITY]no space", None);
        assert_eq!((e.code, e.detail()), (C::NotAuthority, "no space"));
    }
}
