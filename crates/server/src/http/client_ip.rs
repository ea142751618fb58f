//! The client's IP address, for limits that count per client.

use axum::http::HeaderMap;
use std::net::SocketAddr;

/// The peer's address, or behind trusted reverse proxies the address the
/// outermost of them saw: the entry of `X-Forwarded-For` `hops` in from the
/// right (`TRUSTED_PROXY_HOPS`, each proxy appends the address it saw).
/// Entries to its left were written by the client and prove nothing.
pub fn client_ip(headers: &HeaderMap, peer: SocketAddr, trust_proxy: bool, hops: usize) -> String {
    if trust_proxy {
        if let Some(ip) = forwarded_for(headers, hops) {
            return ip;
        }
    }
    peer.ip().to_string()
}

/// The entry `hops` in from the right of every `X-Forwarded-For` header
/// (in order), or the leftmost when there are fewer.
fn forwarded_for(headers: &HeaderMap, hops: usize) -> Option<String> {
    let entries: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let i = entries.len().saturating_sub(hops.max(1));
    entries.get(i).map(|e| (*e).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_counts_only_when_trusted() {
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "10.0.0.1, 10.9.9.9".parse().unwrap());
        assert_eq!(client_ip(&h, peer, true, 1), "10.9.9.9");
        assert_eq!(client_ip(&h, peer, true, 2), "10.0.0.1");
        assert_eq!(client_ip(&h, peer, false, 1), "127.0.0.1");
        assert_eq!(client_ip(&HeaderMap::new(), peer, true, 1), "127.0.0.1");
    }

    #[test]
    fn the_entry_the_trusted_proxy_wrote_counts_not_the_clients() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "6.6.6.6, 7.7.7.7".parse().unwrap());
        h.append("x-forwarded-for", "10.1.2.3".parse().unwrap());
        assert_eq!(forwarded_for(&h, 1).as_deref(), Some("10.1.2.3"));
        assert_eq!(forwarded_for(&h, 2).as_deref(), Some("7.7.7.7"));
        assert_eq!(forwarded_for(&h, 9).as_deref(), Some("6.6.6.6"));
    }
}
