//! Any bytes as the body of `PUT /api/rooms/:pin/bundle`: never a panic; a
//! bundle is accepted only when it is `{pluginHtml: string, set: object}`,
//! refused as invalid JSON only when it is not JSON (JSON text is UTF-8:
//! invalid UTF-8 inside a string is not JSON either); an `appName` is never
//! empty.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_memizy::relay::{parse_bundle, BundleError};
use libfuzzer_sys::fuzz_target;
use serde::de::IgnoredAny;

fuzz_target!(|data: &[u8]| {
    match parse_bundle(data) {
        Ok(bundle) => {
            let v: serde_json::Value =
                serde_json::from_slice(data).expect("an accepted bundle is JSON");
            assert!(v["pluginHtml"].is_string() && v["set"].is_object(), "{v}");
            assert!(bundle.app_name.is_none_or(|n| !n.is_empty()));
        }
        Err(BundleError::InvalidJson) => {
            // `IgnoredAny` skips strings without checking their UTF-8.
            assert!(
                std::str::from_utf8(data).is_err()
                    || serde_json::from_slice::<IgnoredAny>(data).is_err()
            );
        }
        Err(BundleError::WrongShape) => {}
    }
});
