//! Any bytes as plugin HTML: reading the manifest must never panic, and a
//! manifest that validates must have a consistent runtime.
#![no_main]

use hostwire_memizy::manifest::read_plugin_manifest;
use hostwire_memizy::policy::content_policy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(html) = std::str::from_utf8(data) else { return };
    // Also exercise the validator directly on JSON-looking input.
    let wrapped = format!("<script type=\"application/oqse-manifest+json\">{html}</script>");
    for input in [html, wrapped.as_str()] {
        if let Ok(m) = read_plugin_manifest(input) {
            let r = &m.runtime;
            assert!(r.solo || r.multiplayer.is_some());
            if let Some(mp) = &r.multiplayer {
                assert!(1 <= mp.players.min && mp.players.min <= mp.players.max && mp.players.max <= 200);
                assert!(!mp.host_as.is_empty());
            }
            assert!(r.permissions.network.len() <= 20);
            let _ = content_policy(Some(r), Some("https://host.example"));
        }
    }
});
