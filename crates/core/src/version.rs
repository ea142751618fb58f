//! `MAJOR.MINOR` protocol versions: parse, compare, negotiate.

use std::fmt;
use std::str::FromStr;

/// A `MAJOR.MINOR` version. Ordered by MAJOR, then MINOR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a MAJOR.MINOR version (e.g. \"1.0\")")]
pub struct VersionParseError {
    pub input: String,
}

/// Why two sides could not agree on a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NegotiationFailure {
    /// The peer's MAJOR is above every MAJOR we support.
    PeerTooNew { peer: Version, newest: Version },
    /// The peer's MAJOR is below every MAJOR we support.
    PeerTooOld { peer: Version, oldest: Version },
    /// The peer's MAJOR lies between ours but is not one of them.
    MajorNotSupported { peer: Version },
    /// We support nothing at all.
    NothingSupported,
}

impl Version {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The version two sides speak: the same MAJOR, the lower MINOR.
    /// `supported` holds one version per MAJOR (the highest MINOR of it).
    pub fn negotiate(supported: &[Version], peer: Version) -> Result<Version, NegotiationFailure> {
        if let Some(ours) = supported.iter().find(|v| v.major == peer.major) {
            return Ok(Version::new(peer.major, ours.minor.min(peer.minor)));
        }
        let newest = supported.iter().max().copied();
        let oldest = supported.iter().min().copied();
        match (oldest, newest) {
            (Some(_), Some(newest)) if peer.major > newest.major => {
                Err(NegotiationFailure::PeerTooNew { peer, newest })
            }
            (Some(oldest), Some(_)) if peer.major < oldest.major => {
                Err(NegotiationFailure::PeerTooOld { peer, oldest })
            }
            (Some(_), Some(_)) => Err(NegotiationFailure::MajorNotSupported { peer }),
            _ => Err(NegotiationFailure::NothingSupported),
        }
    }
}

impl FromStr for Version {
    type Err = VersionParseError;

    /// Strict: digits only, one dot, no sign, no whitespace, no leading `+`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || VersionParseError {
            input: s.chars().take(64).collect(),
        };
        let (major, minor) = s.split_once('.').ok_or_else(err)?;
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return Err(err());
        }
        Ok(Version {
            major: major.parse().map_err(|_| err())?,
            minor: minor.parse().map_err(|_| err())?,
        })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    #[test]
    fn parses_major_minor_only() {
        assert_eq!(v("1.0"), Version::new(1, 0));
        assert_eq!(v("12.345"), Version::new(12, 345));
        for bad in [
            "1", "1.", ".1", "1.0.0", "v1.0", "+1.0", "1.-1", " 1.0", "1.0 ", "a.b", "",
        ] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn orders_by_major_then_minor() {
        assert!(v("1.10") > v("1.9"));
        assert!(v("2.0") > v("1.99"));
        assert_eq!(v("1.2").to_string(), "1.2");
    }

    #[test]
    fn negotiates_lower_minor_of_same_major() {
        let ours = [v("1.4"), v("2.1")];
        assert_eq!(Version::negotiate(&ours, v("1.2")), Ok(v("1.2")));
        assert_eq!(Version::negotiate(&ours, v("1.9")), Ok(v("1.4")));
        assert_eq!(Version::negotiate(&ours, v("2.0")), Ok(v("2.0")));
    }

    #[test]
    fn reports_too_new_and_too_old() {
        let ours = [v("2.1"), v("4.0")];
        assert!(matches!(
            Version::negotiate(&ours, v("5.0")),
            Err(NegotiationFailure::PeerTooNew { .. })
        ));
        assert!(matches!(
            Version::negotiate(&ours, v("1.3")),
            Err(NegotiationFailure::PeerTooOld { .. })
        ));
        assert!(matches!(
            Version::negotiate(&ours, v("3.0")),
            Err(NegotiationFailure::MajorNotSupported { .. })
        ));
        assert_eq!(
            Version::negotiate(&[], v("1.0")),
            Err(NegotiationFailure::NothingSupported)
        );
    }
}
