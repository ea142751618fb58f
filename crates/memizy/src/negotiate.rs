//! Protocol version negotiation (SPEC 4.3).

use crate::errors::{ProtocolError, ProtocolErrorCode};
use hostwire_core::version::NegotiationFailure;
use hostwire_core::Version;

/// The versions hostwire's host side supports: one per MAJOR.
pub const HOST_SUPPORTED_VERSIONS: &[Version] = &[Version::new(1, 0)];

/// The negotiated version of a `hello`: the plugin's MAJOR and the lower of
/// both MINORs, or `UNSUPPORTED_PROTOCOL` saying whether the plugin is too
/// new or too old for this host.
pub fn negotiate_protocol_version(
    host_supported: &[Version],
    plugin: &str,
) -> Result<Version, ProtocolError> {
    let peer: Version = plugin.parse().map_err(|_| {
        ProtocolError::invalid_argument(format!(
            "protocol {:?} must be in MAJOR.MINOR format",
            short(plugin)
        ))
    })?;
    Version::negotiate(host_supported, peer).map_err(|f| unsupported(f, host_supported))
}

/// The check before loading (SPEC 4.3): the manifest's `protocol` is the
/// minimum the plugin needs, so a host with an older MINOR of that MAJOR
/// refuses it too.
pub fn check_manifest_protocol(
    host_supported: &[Version],
    needed: Version,
) -> Result<Version, ProtocolError> {
    let v =
        Version::negotiate(host_supported, needed).map_err(|f| unsupported(f, host_supported))?;
    if v.minor < needed.minor {
        return Err(ProtocolError::new(
            ProtocolErrorCode::UnsupportedProtocol,
            format!(
                "this plugin needs a newer host: it needs protocol {needed}, this host speaks {v}"
            ),
        ));
    }
    Ok(needed)
}

fn unsupported(f: NegotiationFailure, supported: &[Version]) -> ProtocolError {
    let list = supported
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let detail = match f {
        NegotiationFailure::PeerTooNew { peer, .. } => {
            format!("this plugin needs a newer host: it speaks protocol {peer}, this host supports {list}")
        }
        NegotiationFailure::PeerTooOld { peer, .. } => {
            format!("this plugin is too old: it speaks protocol {peer}, this host supports {list}")
        }
        NegotiationFailure::MajorNotSupported { peer } => {
            format!("protocol {peer} is not supported by this host, which supports {list}")
        }
        NegotiationFailure::NothingSupported => "this host supports no protocol version".to_owned(),
    };
    ProtocolError::new(ProtocolErrorCode::UnsupportedProtocol, detail)
}

fn short(s: &str) -> String {
    s.chars().take(32).collect()
}
