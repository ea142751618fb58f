//! The client's IP address, for limits that count per client.

use axum::http::HeaderMap;
use std::net::SocketAddr;

/// The peer's address, or behind a trusted reverse proxy the first address
/// of `X-Forwarded-For` (the one the proxy saw).
pub fn client_ip(headers: &HeaderMap, peer: SocketAddr, trust_proxy: bool) -> String {
    if trust_proxy {
        if let Some(first) = headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .and_then(|f| f.split(',').next())
            .map(str::trim)
            .filter(|f| !f.is_empty())
        {
            return first.to_owned();
        }
    }
    peer.ip().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_counts_only_when_trusted() {
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.0.0.1, 10.9.9.9".parse().unwrap());
        assert_eq!(client_ip(&h, peer, true), "10.0.0.1");
        assert_eq!(client_ip(&h, peer, false), "127.0.0.1");
        assert_eq!(client_ip(&HeaderMap::new(), peer, true), "127.0.0.1");
    }
}
