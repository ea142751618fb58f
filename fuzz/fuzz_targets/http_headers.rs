//! Any bytes as the headers every protocol's HTTP side reads before a
//! handler: `Authorization` (the one bearer parser), `X-Forwarded-For`
//! (the client IP behind trusted proxies, and the key per-IP limits count
//! it by), `Content-Length` (the server-wide body budget's charge). Never a
//! panic; a bearer token is a trimmed, non-empty part of the header; a
//! client IP is the peer's or one of the forwarded entries.
#![no_main]
#![forbid(unsafe_code)]

use axum::http::{header, HeaderMap, HeaderValue};
use hostwire::http::{bearer, client_ip, client_ip::limit_key, same_secret};
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let auth = parts.next().unwrap_or_default();
    let forwarded = parts.next().unwrap_or_default();
    let length = parts.next().unwrap_or_default();
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_bytes(auth) {
        h.insert(header::AUTHORIZATION, v);
    }
    if let Ok(v) = HeaderValue::from_bytes(forwarded) {
        h.insert("x-forwarded-for", v);
    }
    if let Ok(v) = HeaderValue::from_bytes(length) {
        h.insert(header::CONTENT_LENGTH, v);
    }
    if let Some(t) = bearer(&h) {
        assert!(!t.is_empty() && t == t.trim());
        let text = std::str::from_utf8(auth).expect("a bearer token comes from UTF-8");
        assert!(text.contains(t));
        assert!(same_secret(t, t));
        assert!(!same_secret(t, &format!("{t}x")));
    }
    let peer: SocketAddr = "192.0.2.7:4000".parse().unwrap();
    assert_eq!(client_ip(&h, peer, false, 1), "192.0.2.7");
    for hops in 1..=3 {
        let ip = client_ip(&h, peer, true, hops);
        let fwd = String::from_utf8_lossy(forwarded);
        assert!(
            ip == "192.0.2.7" || fwd.contains(ip.trim()),
            "{ip:?} from {fwd:?}"
        );
        let _ = limit_key(&ip);
    }
    assert!(hostwire::http::body_budget::charge_of(&h) <= hostwire::http::LARGEST_REQUEST_BODY);
});
