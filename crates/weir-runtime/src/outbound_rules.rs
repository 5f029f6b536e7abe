//! Outbound rules: which hosts a guest's outgoing requests may name.
//!
//! Invariants owned here, for the check made before anything is sent
//! (how a request is then sent is [`crate::outbound`]'s):
//! - a host is reachable only when a configured pattern allows its
//!   scheme, host and port (nothing by default);
//! - no pattern makes Weir's own listen or admin addresses reachable
//!   ([`OutboundRules::is_own`], checked on every resolved address);
//! - a wildcard or a name never reaches this machine's loopback, a
//!   link-local address or a cloud's metadata service
//!   ([`OutboundRules::guards`], checked on every resolved address): only
//!   a pattern that names that very address (or `localhost`) does, so
//!   `http://*:*`, or a name whose DNS someone else controls, cannot read
//!   the metadata service or the listeners of this machine;
//! - no pattern makes a reserved internal domain the network's
//!   ([`OutboundRules::reserve`]).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::Uri;

/// A host a guest may reach: `scheme://host[:port]`, where host may be `*`
/// or `*.domain`, and port may be `*`; without a port, the scheme's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPattern {
    scheme: String,
    host: HostMatch,
    port: Option<u16>,
}

/// Metadata services' IPv4 addresses outside the link-local range
/// (Alibaba Cloud's).
const METADATA_V4: [std::net::Ipv4Addr; 1] = [std::net::Ipv4Addr::new(100, 100, 100, 200)];

/// Metadata services' IPv6 addresses (AWS's, outside the link-local range).
const METADATA_V6: [std::net::Ipv6Addr; 1] =
    [std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)];

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostMatch {
    Any,
    Exact(String),
    /// `*.example.com`: any subdomain (not the bare domain).
    Subdomain(String),
}

/// A pattern that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "`{pattern}` is not an outbound host pattern ({reason}); expected scheme://host[:port], e.g. \"https://api.example.com\" or \"http://127.0.0.1:*\""
)]
pub struct PatternError {
    pattern: String,
    reason: &'static str,
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl FromStr for HostPattern {
    type Err = PatternError;

    fn from_str(pattern: &str) -> Result<Self, PatternError> {
        let fail = |reason| PatternError {
            pattern: pattern.to_string(),
            reason,
        };
        let (scheme, rest) = pattern.split_once("://").ok_or_else(|| fail("no scheme"))?;
        let scheme = scheme.to_ascii_lowercase();
        if default_port(&scheme).is_none() {
            return Err(fail("scheme must be http or https"));
        }
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') {
            return Err(fail("a pattern names a host, not a path"));
        }
        let (host, port) = if rest.ends_with(']') {
            (rest, default_port(&scheme)) // a bracketed IPv6 address, no port
        } else {
            match rest.rsplit_once(':') {
                Some((host, "*")) => (host, None),
                Some((host, port)) => {
                    let port = port.parse::<u16>().map_err(|_| fail("bad port"))?;
                    (host, Some(port))
                }
                None => (rest, default_port(&scheme)),
            }
        };
        if host.is_empty() {
            return Err(fail("no host"));
        }
        let host = host.to_ascii_lowercase();
        let host = if host == "*" {
            HostMatch::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            HostMatch::Subdomain(domain.to_string())
        } else if host.contains('*') {
            return Err(fail(
                "`*` may only stand for the whole host or a leading label",
            ));
        } else {
            HostMatch::Exact(host)
        };
        Ok(HostPattern { scheme, host, port })
    }
}

impl HostPattern {
    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        scheme == self.scheme
            && self.port.is_none_or(|p| p == port)
            && match &self.host {
                HostMatch::Any => true,
                HostMatch::Exact(h) => h == host,
                HostMatch::Subdomain(d) => host
                    .strip_suffix(d.as_str())
                    .is_some_and(|prefix| prefix.ends_with('.') && prefix.len() > 1),
            }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostMatch::Any => "*".to_string(),
            HostMatch::Exact(h) => h.clone(),
            HostMatch::Subdomain(d) => format!("*.{d}"),
        };
        match self.port {
            Some(p) => write!(f, "{}://{}:{}", self.scheme, host, p),
            None => write!(f, "{}://{}:*", self.scheme, host),
        }
    }
}

/// The hosts an app's guests may reach. Empty: none.
#[derive(Clone, Debug, Default)]
pub struct OutboundRules {
    patterns: Vec<HostPattern>,
    /// Weir's own listening addresses: never reachable by guests.
    own: Vec<SocketAddr>,
    /// This machine's interface addresses, for own addresses bound to an
    /// unspecified IP (`0.0.0.0`, `::`).
    local_ips: Vec<IpAddr>,
    /// Domains of Weir's internal routers (`.name.internal`): never the
    /// network's.
    reserved: Vec<&'static str>,
}

impl OutboundRules {
    pub fn new(patterns: Vec<HostPattern>) -> Self {
        OutboundRules {
            patterns,
            own: Vec::new(),
            local_ips: Vec::new(),
            reserved: Vec::new(),
        }
    }

    /// Denies every request to hosts under these domain suffixes (each
    /// starting with `.`) that no internal router answers.
    pub fn reserve(&mut self, suffixes: &[&'static str]) {
        self.reserved = suffixes.to_vec();
    }

    /// True when `host` is under a reserved domain (or is one).
    fn is_reserved(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.reserved
            .iter()
            .any(|suffix| host.ends_with(suffix) || Some(host) == suffix.strip_prefix('.'))
    }

    /// Refuses every request to these addresses (Weir's own listeners).
    pub fn deny_own(&mut self, own: Vec<SocketAddr>) {
        self.local_ips = if_addrs::get_if_addrs()
            .map(|ifs| ifs.into_iter().map(|i| i.ip()).collect())
            .unwrap_or_default();
        self.own = own;
    }

    /// True when `target` would reach one of Weir's own listeners.
    pub fn is_own(&self, target: SocketAddr) -> bool {
        let ip = target.ip().to_canonical();
        let local = ip.is_loopback() || ip.is_unspecified() || self.local_ips.contains(&ip);
        self.own.iter().any(|own| {
            let own_ip = own.ip().to_canonical();
            own.port() == target.port()
                && (own_ip == ip
                    || (own_ip.is_unspecified() && local)
                    || (ip.is_unspecified()
                        && (own_ip.is_loopback() || self.local_ips.contains(&own_ip))))
        })
    }

    /// True when `ip` is an address of a kind only a pattern that names it
    /// literally reaches, and none does: loopback and unspecified
    /// addresses (this machine's other listeners), link-local ones
    /// (169.254.0.0/16 and fe80::/10, where clouds put their metadata
    /// services) and the metadata services' other addresses.
    pub fn guards(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let guarded = ip.is_loopback()
            || ip.is_unspecified()
            || match ip {
                IpAddr::V4(v4) => v4.is_link_local() || METADATA_V4.contains(&v4),
                IpAddr::V6(v6) => {
                    (v6.segments()[0] & 0xffc0) == 0xfe80 || METADATA_V6.contains(&v6)
                }
            };
        guarded && !self.names_literally(ip)
    }

    /// True when some pattern names `ip` itself (or `localhost`, for a
    /// loopback address).
    fn names_literally(&self, ip: IpAddr) -> bool {
        self.patterns.iter().any(|p| match &p.host {
            HostMatch::Exact(host) => {
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                bare.parse::<IpAddr>()
                    .is_ok_and(|named| named.to_canonical() == ip)
                    || (host == "localhost" && ip.is_loopback())
            }
            _ => false,
        })
    }

    /// True when some pattern allows the request's scheme, host and port.
    pub fn allows(&self, uri: &Uri) -> bool {
        let Some(scheme) = uri.scheme_str().map(str::to_ascii_lowercase) else {
            return false;
        };
        let Some(host) = uri.host() else { return false };
        let host = host.to_ascii_lowercase();
        let Some(port) = uri.port_u16().or_else(|| default_port(&scheme)) else {
            return false;
        };
        !self.is_reserved(&host) && self.patterns.iter().any(|p| p.allows(&scheme, &host, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(patterns: &[&str]) -> OutboundRules {
        OutboundRules::new(patterns.iter().map(|p| p.parse().unwrap()).collect())
    }

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn nothing_is_allowed_by_default() {
        assert!(!OutboundRules::default().allows(&uri("http://127.0.0.1/")));
    }

    #[test]
    fn scheme_host_and_port_must_all_match() {
        let r = rules(&["https://api.example.com", "http://127.0.0.1:*"]);
        assert!(r.allows(&uri("https://api.example.com/x")));
        assert!(r.allows(&uri("https://API.example.com:443/x")));
        assert!(!r.allows(&uri("http://api.example.com/x")), "scheme");
        assert!(!r.allows(&uri("https://api.example.com:8443/x")), "port");
        assert!(!r.allows(&uri("https://evil.example.com/x")), "host");
        assert!(r.allows(&uri("http://127.0.0.1:4567/")));
        assert!(!r.allows(&uri("http://127.0.0.2:4567/")));
    }

    #[test]
    fn reserved_domains_are_never_the_networks_whatever_the_patterns() {
        let mut r = rules(&["http://*:*", "http://a.b.actor.internal"]);
        assert!(r.allows(&uri("http://a.b.actor.internal/")));
        r.reserve(&[".actor.internal"]);
        for denied in [
            "http://a.b.actor.internal/",
            "http://A.B.Actor.Internal/",
            "http://a.b.actor.internal./",
            "http://a.b.actor.internal:8080/",
            "http://actor.internal/",
        ] {
            assert!(!r.allows(&uri(denied)), "{denied}");
        }
        assert!(r.allows(&uri("http://metadata.internal/")));
        assert!(r.allows(&uri("http://factor.internal/")));
    }

    #[test]
    fn subdomain_wildcards_do_not_match_the_bare_domain() {
        let r = rules(&["https://*.example.com"]);
        assert!(r.allows(&uri("https://a.example.com/")));
        assert!(!r.allows(&uri("https://example.com/")));
        assert!(!r.allows(&uri("https://aexample.com/")));
    }

    #[test]
    fn weirs_own_addresses_are_never_reachable() {
        let mut r = rules(&["http://*:*"]);
        r.deny_own(vec![
            "127.0.0.1:8080".parse().unwrap(),
            "0.0.0.0:9090".parse().unwrap(),
        ]);
        let own = |s: &str| r.is_own(s.parse().unwrap());
        assert!(own("127.0.0.1:8080"));
        assert!(own("0.0.0.0:8080"), "0.0.0.0 reaches loopback");
        assert!(own("[::ffff:127.0.0.1]:8080"), "v4-mapped");
        assert!(!own("127.0.0.1:8081"), "another port");
        assert!(!own("10.9.9.9:8080"), "another host, not ours");
        assert!(
            own("127.0.0.1:9090"),
            "bound to 0.0.0.0: loopback reaches it"
        );
        assert!(own("[::1]:9090"));
        for ip in &r.local_ips.clone() {
            assert!(
                r.is_own(SocketAddr::new(*ip, 9090)),
                "{ip}: a local interface"
            );
        }
    }

    #[test]
    fn loopback_link_local_and_metadata_addresses_need_a_pattern_that_names_them() {
        let any = rules(&["http://*:*"]);
        for ip in [
            "169.254.169.254",
            "169.254.1.1",
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "100.100.100.200",
            "::ffff:169.254.169.254",
        ] {
            assert!(any.guards(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "10.1.2.3",
            "192.168.1.1",
            "8.8.8.8",
            "2001:db8::1",
            "fd00::1",
        ] {
            assert!(!any.guards(ip.parse().unwrap()), "{ip}");
        }
        let named = rules(&[
            "http://169.254.169.254",
            "http://127.0.0.1:*",
            "http://[::1]:8080",
            "http://localhost:9000",
        ]);
        for ip in ["169.254.169.254", "127.0.0.1", "::1", "127.0.0.2"] {
            assert!(!named.guards(ip.parse().unwrap()), "{ip} is named");
        }
        assert!(named.guards("169.254.169.253".parse().unwrap()));
        assert!(named.guards("fe80::1".parse().unwrap()));
    }

    #[test]
    fn bad_patterns_are_refused_with_a_reason() {
        for bad in [
            "example.com",
            "ftp://x",
            "http://",
            "http://a/b",
            "http://a:99999",
            "http://a*b",
        ] {
            assert!(bad.parse::<HostPattern>().is_err(), "{bad}");
        }
    }
}
