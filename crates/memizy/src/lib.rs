//! hostwire-memizy: the Memizy Plugin Protocol v1 as a host needs it,
//! without I/O. Names follow the SPEC (`HostCall`, `InitPayload`, …).

// No unsafe code here: what needs it lives in hostwire-core, where Miri
// checks it.
#![forbid(unsafe_code)]

pub mod calls;
pub mod compat;
pub mod errors;
pub mod items;
pub mod limits;
pub mod manifest;
pub mod negotiate;
pub mod policy;
pub mod settings;
pub mod types;

pub use calls::{
    decode_host_call, decode_host_call_with, decode_plugin_call, HostCall, PluginCall,
};
pub use compat::{check_compatibility, Compatibility};
pub use errors::{ProtocolError, ProtocolErrorCode};
pub use items::{prepare_display_set, prepare_set_text, public_item, PreparedSet, PreparedText};
pub use limits::{Limits, RelayLimits, LIMITS, RELAY_LIMITS};
pub use manifest::{read_plugin_manifest, ManifestError, PluginManifest, PluginRuntime};
pub use negotiate::{negotiate_protocol_version, HOST_SUPPORTED_VERSIONS};
pub use settings::{resolve_settings, SettingDefinition};
pub use types::*;
pub mod relay;
pub mod session;
