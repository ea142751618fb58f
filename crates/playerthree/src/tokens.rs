//! Tokens and the principals they encode.
//!
//! A token is 24 random bytes as 32 base64url characters. Text presented by
//! a peer is checked against `TOKEN_RE` before any lookup; a token encodes
//! exactly one principal for its whole life, and a revoked token stays
//! refused (its record is kept so that a restart refuses it too).
//!
//! A match keeps no token text: only each token's SHA-256 ([`TokenHash`]),
//! in memory and in its records, so that a copy of the store hands out no
//! working token. A presented token is hashed, found by the first 8 bytes
//! of its hash, and its whole hash compared in constant time.

use crate::protocol::{token_shape_ok, Principal, ProtocolError, ServerErrorCode};
use hostwire_core::Token;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use subtle::ConstantTimeEq;

/// Most tokens one match holds (minted and revoked); minting past it is `busy`.
pub const MAX_TOKENS_PER_MATCH: usize = 4096;

/// The SHA-256 of a token's text: what a match stores and compares.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// The hash of token text.
    pub fn of(text: &str) -> TokenHash {
        TokenHash(Sha256::digest(text.as_bytes()).into())
    }

    /// Constant-time comparison.
    pub fn matches(&self, other: &TokenHash) -> bool {
        self.0.ct_eq(&other.0).into()
    }

    /// Lower-case hex, as records store it.
    pub fn to_hex(&self) -> String {
        use fmt::Write;
        let mut s = String::with_capacity(64);
        for b in self.0 {
            let _ = write!(s, "{b:02x}");
        }
        s
    }

    /// A stored hash (64 hex digits), or a token's text as records of
    /// earlier versions held it (hashed now).
    pub fn from_record(s: &str) -> Option<TokenHash> {
        if token_shape_ok(s) {
            return Some(TokenHash::of(s));
        }
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(TokenHash(out))
    }

    /// The lookup key: the first 8 bytes (not secret on their own: a
    /// match still compares the whole hash).
    fn prefix(&self) -> u64 {
        let mut p = [0u8; 8];
        p.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(p)
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenHash({})", &self.to_hex()[..12])
    }
}

impl serde::Serialize for TokenHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for TokenHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<TokenHash, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        TokenHash::from_record(&s)
            .ok_or_else(|| serde::de::Error::custom("tokenHash: not 64 hex digits"))
    }
}

#[derive(Debug, Clone)]
struct Entry {
    hash: TokenHash,
    principal: Principal,
    revoked: bool,
}

/// The tokens of one match, by hash.
#[derive(Debug, Default, Clone)]
pub struct TokenTable {
    /// By the first 8 bytes of the hash; a bucket holds more than one
    /// entry only for a 64-bit prefix collision.
    by_prefix: HashMap<u64, Vec<Entry>>,
    len: usize,
}

impl TokenTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh token for `principal`, with its hash.
    pub fn mint(&mut self, principal: Principal) -> Result<(Token, TokenHash), ProtocolError> {
        if self.len >= MAX_TOKENS_PER_MATCH {
            return Err(ProtocolError::new(
                ServerErrorCode::Busy,
                format!("match holds MAX_TOKENS_PER_MATCH ({MAX_TOKENS_PER_MATCH}) tokens"),
            ));
        }
        let token = Token::generate();
        let hash = TokenHash::of(token.as_str());
        self.put(hash, principal, false);
        Ok((token, hash))
    }

    fn put(&mut self, hash: TokenHash, principal: Principal, revoked: bool) {
        let bucket = self.by_prefix.entry(hash.prefix()).or_default();
        match bucket.iter_mut().find(|e| e.hash.matches(&hash)) {
            Some(e) => {
                e.principal = principal;
                e.revoked = revoked;
            }
            None => {
                bucket.push(Entry {
                    hash,
                    principal,
                    revoked,
                });
                self.len += 1;
            }
        }
    }

    fn entry(&self, hash: &TokenHash) -> Option<&Entry> {
        self.by_prefix
            .get(&hash.prefix())?
            .iter()
            .find(|e| e.hash.matches(hash))
    }

    /// Puts back a token read from the store.
    pub fn restore(&mut self, hash: TokenHash, principal: Principal, revoked: bool) {
        self.put(hash, principal, revoked);
    }

    /// Refuses the token of `hash` from now on; `false` if it was never issued.
    pub fn revoke(&mut self, hash: &TokenHash) -> bool {
        let Some(bucket) = self.by_prefix.get_mut(&hash.prefix()) else {
            return false;
        };
        match bucket.iter_mut().find(|e| e.hash.matches(hash)) {
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
        match self.entry(&TokenHash::of(text)) {
            Some(Entry {
                principal,
                revoked: false,
                ..
            }) => Ok(principal),
            _ => Err(ProtocolError::new(
                ServerErrorCode::BadToken,
                "token: not a live token of this match",
            )),
        }
    }

    pub fn is_revoked(&self, text: &str) -> bool {
        self.entry(&TokenHash::of(text)).is_some_and(|e| e.revoked)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
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
        let (tok, hash) = t.mint(seat()).unwrap();
        assert_eq!(tok.as_str().len(), 32);
        assert_eq!(hash, TokenHash::of(tok.as_str()));
        assert_eq!(t.lookup(tok.as_str()).unwrap(), &seat());
        assert!(t.revoke(&hash));
        assert_eq!(
            t.lookup(tok.as_str()).unwrap_err().code,
            ServerErrorCode::BadToken
        );
        assert!(!t.revoke(&TokenHash::of(&"A".repeat(32))));
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
        t.restore(TokenHash::of(&text), seat(), true);
        assert!(t.lookup(&text).is_err());
        assert!(t.is_revoked(&text));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_hash_is_stored_as_hex_and_never_as_the_token() {
        let text = "C".repeat(32);
        let h = TokenHash::of(&text);
        let hex = serde_json::to_string(&h).unwrap();
        assert_eq!(hex.len(), 66);
        assert!(!hex.contains(&text));
        let back: TokenHash = serde_json::from_str(&hex).unwrap();
        assert_eq!(back, h);
        // A record of an earlier version held the text: it reads as its hash.
        assert_eq!(TokenHash::from_record(&text), Some(h));
        assert!(TokenHash::from_record("zz").is_none());
        assert!(TokenHash::from_record(&"g".repeat(64)).is_none());
    }

    #[test]
    fn only_the_whole_hash_matches() {
        // Two hashes with the same 8-byte prefix are different tokens.
        let a = TokenHash::of("x");
        let mut b = a;
        b.0[31] ^= 1;
        assert_eq!(a.prefix(), b.prefix());
        let mut t = TokenTable::new();
        t.restore(a, seat(), false);
        assert!(!t.revoke(&b));
        t.restore(b, seat(), true);
        assert_eq!(t.len(), 2);
        assert!(t.entry(&a).is_some_and(|e| !e.revoked));
    }
}
