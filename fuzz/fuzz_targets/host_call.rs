//! Any method name and argument text: decoding never panics, and every
//! rejection carries a `[CODE] ` message.
#![no_main]
#![forbid(unsafe_code)]

use hostwire_memizy::calls::{decode_host_call, decode_plugin_call, HOST_METHODS, PLUGIN_METHODS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(args) = std::str::from_utf8(rest) else {
        return;
    };
    let methods: Vec<&str> = HOST_METHODS
        .iter()
        .chain(PLUGIN_METHODS)
        .copied()
        .chain(["exit", "x"])
        .collect();
    let method = methods[usize::from(selector) % methods.len()];
    match decode_host_call(method, args) {
        Ok(call) => assert_eq!(call.method(), method),
        Err(e) => assert!(e.message.starts_with(&format!("[{}] ", e.code))),
    }
    if let Err(e) = decode_plugin_call(method, args) {
        assert!(e.message.starts_with(&format!("[{}] ", e.code)));
    }
});
