//! The client's IP address, for limits that count per client.

use axum::http::HeaderMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

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

/// What per-IP limits count a client address as: an IPv6 address by its
/// /64 (one end network gets a /64, so a single client has 2^64 addresses
/// to rotate through), an IPv4 address (mapped into IPv6 or not) as itself.
pub fn limit_addr(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

/// [`limit_addr`] of a client IP as text (an IPv6 network with its `/64`);
/// what is not an address is kept as written.
pub fn limit_key(ip: &str) -> String {
    match ip.parse::<IpAddr>().map(limit_addr) {
        Ok(IpAddr::V6(net)) => format!("{net}/64"),
        Ok(v4) => v4.to_string(),
        Err(_) => ip.to_owned(),
    }
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
    fn an_ipv6_client_counts_as_its_64() {
        assert_eq!(limit_key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(limit_key("2001:db8:1:2:bbbb::9"), "2001:db8:1:2::/64");
        assert_eq!(limit_key("2001:db8:1:3::1"), "2001:db8:1:3::/64");
        assert_eq!(limit_key("::ffff:10.0.0.1"), "10.0.0.1");
        assert_eq!(limit_key("10.0.0.1"), "10.0.0.1");
        assert_eq!(limit_key("unknown"), "unknown");
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(limit_addr(a), limit_addr(b));
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(limit_addr(v4), v4);
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
