//! Tokens and the principals they encode.
//!
//! A token is 24 random bytes as 32 base64url characters. Text presented by
//! a peer is checked against `TOKEN_RE` before any lookup; a token encodes
//! exactly one principal for its whole life, and a revoked token stays
//! refused (its record is kept so that a restart refuses it too).

use crate::protocol::{token_shape_ok, Principal, ProtocolError, ServerErrorCode};
use hostwire_core::Token;
use std::collections::HashMap;

/// Most tokens one match holds (minted and revoked); minting past it is `busy`.
pub const MAX_TOKENS_PER_MATCH: usize = 4096;

#[derive(Debug, Clone)]
struct Entry {
    principal: Principal,
    revoked: bool,
}

/// The tokens of one match.
#[derive(Debug, Default, Clone)]
pub struct TokenTable {
    by_text: HashMap<String, Entry>,
}

impl TokenTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh token for `principal`.
    pub fn mint(&mut self, principal: Principal) -> Result<Token, ProtocolError> {
        if self.by_text.len() >= MAX_TOKENS_PER_MATCH {
            return Err(ProtocolError::new(
                ServerErrorCode::Busy,
                format!("match holds MAX_TOKENS_PER_MATCH ({MAX_TOKENS_PER_MATCH}) tokens"),
            ));
        }
        let token = Token::generate();
        self.by_text.insert(
            token.as_str().to_owned(),
            Entry {
                principal,
                revoked: false,
            },
        );
        Ok(token)
    }

    /// Puts back a token read from the store.
    pub fn restore(&mut self, token: &str, principal: Principal, revoked: bool) {
        if token_shape_ok(token) {
            self.by_text
                .insert(token.to_owned(), Entry { principal, revoked });
        }
    }

    /// Refuses `token` from now on; `false` if it was never issued.
    pub fn revoke(&mut self, token: &str) -> bool {
        match self.by_text.get_mut(token) {
            Some(e) => {
                e.revoked = true;
                true
            }
            None => false,
        }
    }

    /// The principal of presented token text: `bad_token` for a malformed,
    /// unknown or revoked token (the message does not say which).
    pub fn lookup(&self, text: &str) -> Result<&Principal, ProtocolError> {
        if !token_shape_ok(text) {
            return Err(ProtocolError::new(
                ServerErrorCode::BadToken,
                "token: not 32 base64url characters",
            ));
        }
        match self.by_text.get(text) {
            Some(Entry {
                principal,
                revoked: false,
            }) => Ok(principal),
            _ => Err(ProtocolError::new(
                ServerErrorCode::BadToken,
                "token: not a live token of this match",
            )),
        }
    }

    pub fn is_revoked(&self, text: &str) -> bool {
        self.by_text.get(text).is_some_and(|e| e.revoked)
    }

    pub fn len(&self) -> usize {
        self.by_text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_text.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat() -> Principal {
        Principal::Seat {
            r#match: "m".into(),
            role: "r".into(),
            team: "t".into(),
        }
    }

    #[test]
    fn minted_tokens_look_up_until_revoked() {
        let mut t = TokenTable::new();
        let tok = t.mint(seat()).unwrap();
        assert_eq!(tok.as_str().len(), 32);
        assert_eq!(t.lookup(tok.as_str()).unwrap(), &seat());
        assert!(t.revoke(tok.as_str()));
        assert_eq!(
            t.lookup(tok.as_str()).unwrap_err().code,
            ServerErrorCode::BadToken
        );
        assert!(!t.revoke(&"A".repeat(32)));
    }

    #[test]
    fn malformed_and_unknown_tokens_are_bad_token() {
        let t = TokenTable::new();
        for text in [
            "",
            "short",
            &"a".repeat(33),
            &"+".repeat(32),
            &"a".repeat(32),
        ] {
            assert_eq!(t.lookup(text).unwrap_err().code, ServerErrorCode::BadToken);
        }
    }

    #[test]
    fn restored_revocations_hold() {
        let mut t = TokenTable::new();
        let text = "B".repeat(32);
        t.restore(&text, seat(), true);
        assert!(t.lookup(&text).is_err());
        t.restore("bad shape", seat(), false);
        assert_eq!(t.len(), 1);
    }
}
