//! Any bytes as the body of `POST /memizy/sessions`: its shape, its files
//! (`assets`, base64), the session's configuration (the manifest in the
//! plugin's HTML, the set, the timing) and the engine's new session. Never
//! a panic; a refusal is a 4xx with a message; an accepted body is JSON and
//! every file it decoded is named in it.
#![no_main]
#![forbid(unsafe_code)]

use hostwire::sessions::api::prepare_creation;
use hostwire::sessions::{Sessions, SessionsConfig};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

fn sessions() -> &'static Arc<Sessions> {
    static S: OnceLock<Arc<Sessions>> = OnceLock::new();
    S.get_or_init(|| {
        Sessions::new(
            SessionsConfig::default(),
            Arc::new(hostwire_core::ManualClock::new(1_700_000_000_000)),
            Arc::new(hostwire_store::SqliteStore::in_memory().expect("an in-memory store")),
            Arc::new(hostwire::metrics::StoreMetrics::default()),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    match prepare_creation(sessions(), "fuzz-session", data) {
        Ok(p) => {
            let v: serde_json::Value =
                serde_json::from_slice(data).expect("an accepted body is JSON");
            for file in p.files.keys() {
                assert!(
                    v["assets"].get(file).is_some(),
                    "decoded a file the body does not name: {file}"
                );
            }
        }
        Err((status, message)) => {
            assert!(status.is_client_error(), "{status}: {message}");
            assert!(!message.is_empty());
        }
    }
});
