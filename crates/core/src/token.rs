//! Opaque bearer tokens: 24 random bytes, base64url without padding.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use std::fmt;
use subtle::ConstantTimeEq;

/// Number of random bytes in a token.
pub const TOKEN_BYTES: usize = 24;
/// Length of a token's text: 24 bytes in base64url without padding.
pub const TOKEN_TEXT_LEN: usize = 32;

/// An opaque secret. Equality is constant-time; `Debug` does not print it.
/// Its text as a `Box<str>`, not a `String`: a token is never grown, and
/// a server holds one per player, device and seat for their lives.
#[derive(Clone)]
pub struct Token(Box<str>);

impl Token {
    /// A fresh token from the operating system's random source.
    pub fn generate() -> Self {
        Token(URL_SAFE_NO_PAD.encode(random_bytes::<TOKEN_BYTES>()).into())
    }

    /// Wraps token text received from a peer or read from storage, if it has
    /// the shape of a token (32 base64url characters).
    pub fn parse(text: &str) -> Option<Self> {
        let ok = text.len() == TOKEN_TEXT_LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        ok.then(|| Token(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison with text received from a peer.
    pub fn matches(&self, candidate: &str) -> bool {
        self.0.as_bytes().ct_eq(candidate.as_bytes()).into()
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.matches(&other.0)
    }
}
impl Eq for Token {}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(…)")
    }
}

/// `N` bytes from the operating system's random source. A system that
/// cannot give them cannot mint credentials: that is a panic, as it is in
/// every random number crate's `OsRng`.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    fill_random(&mut bytes);
    bytes
}

fn fill_random(bytes: &mut [u8]) {
    if let Err(e) = getrandom::fill(bytes) {
        panic!("the operating system's random source failed: {e}");
    }
}

/// `n` random bytes in base64url without padding (ids that are not secrets).
pub fn random_base64url(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    fill_random(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_have_the_wire_shape_and_differ() {
        let a = Token::generate();
        let b = Token::generate();
        assert_eq!(a.as_str().len(), TOKEN_TEXT_LEN);
        assert_eq!(
            URL_SAFE_NO_PAD.decode(a.as_str()).unwrap().len(),
            TOKEN_BYTES
        );
        assert!(!a.as_str().contains('='));
        assert_ne!(a, b);
        assert!(Token::parse(a.as_str()).is_some());
    }

    #[test]
    fn matches_only_the_same_text() {
        let a = Token::generate();
        assert!(a.matches(a.as_str()));
        let mut other = a.as_str().to_owned();
        other.replace_range(0..1, if other.starts_with('A') { "B" } else { "A" });
        assert!(!a.matches(&other));
        assert!(!a.matches(""));
        assert!(!a.matches(&a.as_str()[..31]));
    }

    #[test]
    fn parse_rejects_wrong_shapes() {
        assert!(Token::parse("short").is_none());
        assert!(Token::parse(&"a".repeat(33)).is_none());
        assert!(Token::parse(&format!("{}=", "a".repeat(31))).is_none());
        assert!(Token::parse(&"+".repeat(32)).is_none());
    }

    #[test]
    fn debug_hides_the_secret() {
        let t = Token::generate();
        assert!(!format!("{t:?}").contains(t.as_str()));
    }

    #[test]
    fn random_ids_have_expected_length() {
        assert_eq!(random_base64url(6).len(), 8);
    }
}
