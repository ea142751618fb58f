//! Any bytes as plugin HTML: reading the manifest must never panic, must
//! take time linear in the input (run with `-max_len` at the bundle limit,
//! 8 MiB, and `-timeout`, so a slow input is a failure), and a manifest
//! that validates must have a consistent runtime.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_memizy::manifest::{find_data_island, read_plugin_manifest, MANIFEST_MAX_BYTES};
use hostwire_memizy::policy::content_policy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(html) = std::str::from_utf8(data) else {
        return;
    };
    // Also exercise the validator directly on JSON-looking input.
    let wrapped = format!("<script type=\"application/oqse-manifest+json\">{html}</script>");
    for input in [html, wrapped.as_str()] {
        if let Ok(island) = find_data_island(input) {
            assert!(island.text.len() <= MANIFEST_MAX_BYTES);
            assert!(!island.text.trim().is_empty());
            // The parser counts `\r`, `\n` and `\r\n` each as one line end.
            let line_ends = input.matches('\n').count() + input.matches('\r').count();
            assert!(island.line >= 1 && island.line as usize <= 1 + line_ends);
        }
        if let Ok(m) = read_plugin_manifest(input) {
            let r = &m.runtime;
            assert!(r.solo || r.multiplayer.is_some());
            if let Some(mp) = &r.multiplayer {
                assert!(
                    1 <= mp.players.min
                        && mp.players.min <= mp.players.max
                        && mp.players.max <= 200
                );
                assert!(!mp.host_as.is_empty());
            }
            assert!(r.permissions.network.len() <= 20);
            let _ = content_policy(Some(r), Some("https://host.example"));
        }
    }
});
