//! The run's network: **none** (its own namespace, no interface up),
//! **allowlist** (its own namespace with loopback, one port relayed to the
//! daemon's proxy, which lets through only the listed `host:port`s) or
//! **full** (the host's network). What the proxy allows, and which
//! addresses it refuses whatever the list says, is decided here.

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The port inside the run's network namespace the proxy is reached at.
pub const PROXY_PORT: u16 = 3128;

/// The model gateway's address inside the run's network namespace: a
/// loopback address of its own (all of 127/8 is local on `lo`), so that
/// no proxy setting naming 127.0.0.1 ever covers it.
pub const GATEWAY_HOST: &str = "127.0.0.2";

/// The model gateway's port at [`GATEWAY_HOST`].
pub const GATEWAY_PORT: u16 = 3129;

/// The model gateway part of a driver run's sandbox spec: its listener
/// in the run's own network namespace, relayed to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewaySpec {
    /// The port at [`GATEWAY_HOST`].
    pub port: u16,
}

/// How a run reaches the network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// No network at all.
    #[default]
    None,
    /// Only the listed destinations, through the daemon's proxy.
    Allowlist,
    /// The host's network.
    Full,
}

impl NetworkMode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Allowlist => "allowlist",
            NetworkMode::Full => "full",
        }
    }
}

/// What the config gives a run whose tools grant the network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkTools {
    /// The host's network.
    #[default]
    Full,
    /// The run's allowlist only.
    Allowlist,
}

/// The mode of a run. `granted`: its tools (or switches) give it the
/// network; `switched_off`: the request or the definition said
/// `network: false`, which takes everything away; `listed`: its allowlist
/// has an entry.
pub fn mode(granted: bool, switched_off: bool, tools: NetworkTools, listed: bool) -> NetworkMode {
    if switched_off {
        NetworkMode::None
    } else if granted && tools == NetworkTools::Full {
        NetworkMode::Full
    } else if listed {
        NetworkMode::Allowlist
    } else {
        NetworkMode::None
    }
}

/// The allowlist part of a run's sandbox spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressSpec {
    /// The port the runner listens on inside the run (127.0.0.1 only).
    pub proxy_port: u16,
    /// The entries, as given (`host:port`), each checked by [`parse_entry`].
    pub allow: Vec<String>,
}

/// A host as an entry names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostPattern {
    /// One name, lowercase.
    Name(String),
    /// Every name beneath a domain: `*.example.com` holds `.example.com`.
    Beneath(String),
    /// One address, written literally.
    Ip(IpAddr),
}

/// One allowed destination.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AllowEntry {
    /// The host.
    pub host: HostPattern,
    /// The TCP port.
    pub port: u16,
}

/// An entry that is not `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry:?}: {why}")]
pub struct EntryError {
    /// The entry as given.
    pub entry: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Splits `host:port` (`[v6]:port` for an IPv6 address).
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return Some((host, after.strip_prefix(':')?));
    }
    s.rsplit_once(':')
}

/// Whether `name` is a DNS name: labels of letters, digits and hyphens,
/// none empty or over 63 bytes, not starting or ending with a hyphen.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// A host as a request names it (a name, lowercase, or an address).
pub fn parse_host(host: &str) -> Option<HostPattern> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some(HostPattern::Ip(ip));
    }
    let name = host.to_ascii_lowercase();
    valid_name(&name).then_some(HostPattern::Name(name))
}

/// Parses one `host:port` entry: an exact name, `*.domain`, or an address.
pub fn parse_entry(entry: &str) -> Result<AllowEntry, EntryError> {
    let bad = |why| EntryError {
        entry: entry.to_owned(),
        why,
    };
    let (host, port) = split_host_port(entry).ok_or_else(|| bad("expected host:port"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?;
    let host = match host.strip_prefix("*.") {
        Some(domain) => {
            let domain = domain.to_ascii_lowercase();
            if !valid_name(&domain) || domain.parse::<IpAddr>().is_ok() {
                return Err(bad("a wildcard must be `*.` and a domain name"));
            }
            HostPattern::Beneath(format!(".{domain}"))
        }
        None if entry.starts_with('[') => match host.parse::<Ipv6Addr>() {
            Ok(ip) => HostPattern::Ip(IpAddr::V6(ip)),
            Err(_) => return Err(bad("[...] must hold an IPv6 address")),
        },
        None => match host.parse::<Ipv4Addr>() {
            Ok(ip) => HostPattern::Ip(IpAddr::V4(ip)),
            Err(_) if host.contains('*') => {
                return Err(bad("a wildcard must be `*.` and a domain name"))
            }
            Err(_) => parse_host(host)
                .filter(|h| matches!(h, HostPattern::Name(_)))
                .ok_or_else(|| bad("the host must be a DNS name, an IPv4 address or [IPv6]"))?,
        },
    };
    Ok(AllowEntry { host, port })
}

/// Parses every entry; the first bad one is the error, with its index.
pub fn parse_list(list: &[String]) -> Result<Vec<AllowEntry>, (usize, EntryError)> {
    list.iter()
        .enumerate()
        .map(|(i, e)| parse_entry(e).map_err(|err| (i, err)))
        .collect()
}

impl AllowEntry {
    /// Whether a request for `host` (as [`parse_host`] gives it) and
    /// `port` matches this entry. A wildcard holds the names beneath its
    /// domain, not the domain itself.
    pub fn matches(&self, host: &HostPattern, port: u16) -> bool {
        if port != self.port {
            return false;
        }
        match (&self.host, host) {
            (HostPattern::Name(a), HostPattern::Name(b)) => a == b,
            (HostPattern::Beneath(d), HostPattern::Name(b)) => b.ends_with(d.as_str()),
            (HostPattern::Ip(a), HostPattern::Ip(b)) => same_address(*a, *b),
            _ => false,
        }
    }

    /// Whether every destination this entry allows is also allowed by
    /// `cap` (an audience's cap on what a parent may ask for).
    pub fn within(&self, cap: &AllowEntry) -> bool {
        if self.port != cap.port {
            return false;
        }
        match (&self.host, &cap.host) {
            (HostPattern::Beneath(a), HostPattern::Beneath(c)) => a.ends_with(c.as_str()),
            (h, _) => cap.matches(h, self.port),
        }
    }
}

/// The first entry of `list` that matches.
pub fn find<'a>(list: &'a [AllowEntry], host: &HostPattern, port: u16) -> Option<&'a AllowEntry> {
    list.iter().find(|e| e.matches(host, port))
}

/// Whether two addresses are the same host (an IPv4-mapped IPv6 address
/// is its IPv4 address).
fn same_address(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// What kind of address a destination resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrClass {
    /// A cloud metadata service.
    Metadata,
    /// Link-local (169.254.0.0/16, fe80::/10).
    LinkLocal,
    /// Multicast, broadcast and reserved ranges, and IPv6 forms that carry
    /// an IPv4 address to elsewhere (::/96, 2002::/16): never a server.
    Reserved,
    /// The host itself (127.0.0.0/8, ::1, 0.0.0.0/8, ::).
    Loopback,
    /// Private networks (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7,
    /// fec0::/10, 64:ff9b:1::/48) and special-use ranges (192.0.0.0/24,
    /// 192.0.2.0/24, 198.18.0.0/15, 198.51.100.0/24, 203.0.113.0/24).
    Private,
    /// Anything else.
    Public,
}

/// Metadata services reached at addresses outside the link-local ranges.
pub const METADATA: &[IpAddr] = &[
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
];

/// The IPv4 address an IPv6 one carries (mapped, translated
/// ::ffff:0:0/96, or NAT64's 64:ff9b::/96).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || s[..6] == [0, 0, 0, 0, 0xffff, 0]).then(|| {
        let o = ip.octets();
        Ipv4Addr::new(o[12], o[13], o[14], o[15])
    })
}

fn class_v4(ip: Ipv4Addr) -> AddrClass {
    let o = ip.octets();
    if o[0] == 169 && o[1] == 254 {
        AddrClass::LinkLocal
    } else if o[0] == 127 || o[0] == 0 {
        AddrClass::Loopback
    } else if o[0] == 10
        || (o[0] == 172 && (16..32).contains(&o[1]))
        || (o[0] == 192 && o[1] == 168)
        || (o[0] == 100 && (64..128).contains(&o[1]))
        || (o[0] == 192 && o[1] == 0 && (o[2] == 0 || o[2] == 2))
        || (o[0] == 198 && (o[1] == 18 || o[1] == 19))
        || (o[0] == 198 && o[1] == 51 && o[2] == 100)
        || (o[0] == 203 && o[1] == 0 && o[2] == 113)
    {
        AddrClass::Private
    } else if o[0] >= 224 {
        AddrClass::Reserved
    } else {
        AddrClass::Public
    }
}

/// The class of `ip`.
pub fn class(ip: IpAddr) -> AddrClass {
    if METADATA.iter().any(|m| same_address(*m, ip)) {
        return AddrClass::Metadata;
    }
    match ip {
        IpAddr::V4(v4) => class_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => class(IpAddr::V4(v4)),
            None => {
                let seg = v6.segments();
                let s0 = seg[0];
                if v6.is_loopback() || v6.is_unspecified() {
                    AddrClass::Loopback
                } else if seg[..6] == [0; 6] || s0 == 0x2002 {
                    AddrClass::Reserved
                } else if s0 & 0xffc0 == 0xfe80 {
                    AddrClass::LinkLocal
                } else if s0 & 0xfe00 == 0xfc00
                    || s0 & 0xffc0 == 0xfec0
                    || seg[..3] == [0x64, 0xff9b, 1]
                {
                    AddrClass::Private
                } else if s0 & 0xff00 == 0xff00 {
                    AddrClass::Reserved
                } else {
                    AddrClass::Public
                }
            }
        },
    }
}

/// Why the proxy refused a destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No entry of the run's list matches.
    #[error("not on the run's list")]
    NotListed,
    /// A metadata service: never.
    #[error("{0} is a cloud metadata address")]
    Metadata(IpAddr),
    /// Link-local or reserved: never.
    #[error("{0} is a link-local or reserved address")]
    LinkLocal(IpAddr),
    /// A loopback or private address reached by a name (DNS rebinding).
    #[error("{0} is a loopback or private address, allowed only when listed as that address")]
    PrivateByName(IpAddr),
}

/// Whether `entry`, which matched the request, lets the proxy connect to
/// `ip`, an address the request's host resolved to.
pub fn judge(entry: &AllowEntry, ip: IpAddr) -> Result<(), Refusal> {
    match class(ip) {
        AddrClass::Metadata => Err(Refusal::Metadata(ip)),
        AddrClass::LinkLocal | AddrClass::Reserved => Err(Refusal::LinkLocal(ip)),
        AddrClass::Loopback | AddrClass::Private => match entry.host {
            HostPattern::Ip(listed) if same_address(listed, ip) => Ok(()),
            _ => Err(Refusal::PrivateByName(ip)),
        },
        AddrClass::Public => Ok(()),
    }
}

/// The run's own loopback names, reached directly unless listed.
const RUN_LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Whether `no_proxy`, a host in `NO_PROXY`, would send a request for a
/// host of `entry` around the proxy: clients match it as the host or a
/// domain suffix of it, by name (no port: `NO_PROXY` is host-based).
fn hides(no_proxy: &str, entry: &AllowEntry) -> bool {
    let suffix = format!(".{no_proxy}");
    match &entry.host {
        HostPattern::Name(n) => n == no_proxy || n.ends_with(&suffix),
        HostPattern::Beneath(d) => d.ends_with(&suffix),
        HostPattern::Ip(ip) => no_proxy
            .parse::<IpAddr>()
            .is_ok_and(|n| same_address(n, *ip)),
    }
}

/// `NO_PROXY` of a run in allowlist mode: its own loopback names and
/// `local` (services inside the run, such as a driver's gateway), less
/// every one that names a host on `allow`, so that a listed destination
/// (a host's model server at 127.0.0.1:PORT, say) is always reached
/// through the proxy and never on the run's own loopback. A listed host
/// wins over a run-local one: `NO_PROXY` cannot tell ports apart.
pub fn no_proxy(allow: &[AllowEntry], local: &[&str]) -> String {
    let mut out: Vec<&str> = Vec::new();
    for h in RUN_LOOPBACK.iter().copied().chain(local.iter().copied()) {
        if !out.contains(&h) && !allow.iter().any(|e| hides(h, e)) {
            out.push(h);
        }
    }
    out.join(",")
}

/// The proxy variables a run in allowlist mode gets (upper and lower
/// case), and `NO_PROXY` for the run's own loopback less what `allow`
/// lists ([`no_proxy`]).
pub fn proxy_env(port: u16, allow: &[AllowEntry]) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut out = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        out.push((name.to_owned(), url.clone()));
        out.push((name.to_ascii_lowercase(), url.clone()));
    }
    let local = no_proxy(allow, &[]);
    out.push(("NO_PROXY".to_owned(), local.clone()));
    out.push(("no_proxy".to_owned(), local));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(s: &str) -> AllowEntry {
        parse_entry(s).unwrap()
    }

    fn host(s: &str) -> HostPattern {
        parse_host(s).unwrap()
    }

    #[test]
    fn the_mode_follows_grants_lists_and_the_config() {
        use NetworkMode::*;
        use NetworkTools as T;
        assert_eq!(mode(false, false, T::Full, false), None);
        assert_eq!(mode(false, false, T::Full, true), Allowlist);
        assert_eq!(mode(true, false, T::Full, false), Full);
        assert_eq!(mode(true, false, T::Full, true), Full);
        assert_eq!(mode(true, false, T::Allowlist, true), Allowlist);
        assert_eq!(mode(true, false, T::Allowlist, false), None);
        assert_eq!(mode(true, true, T::Full, true), None);
        assert_eq!(mode(false, true, T::Full, true), None);
    }

    #[test]
    fn entries_parse_and_bad_ones_say_why() {
        assert_eq!(
            entry("API.Example.com:443"),
            AllowEntry {
                host: HostPattern::Name("api.example.com".into()),
                port: 443
            }
        );
        assert_eq!(
            entry("*.example.com:443").host,
            HostPattern::Beneath(".example.com".into())
        );
        assert_eq!(
            entry("127.0.0.1:8080").host,
            HostPattern::Ip("127.0.0.1".parse().unwrap())
        );
        assert_eq!(
            entry("[::1]:8080").host,
            HostPattern::Ip("::1".parse().unwrap())
        );
        for bad in [
            "example.com",
            "example.com:0",
            "example.com:65536",
            "example.com:http",
            ":443",
            "*:443",
            "*.:443",
            "a.*.com:443",
            "*.1.2.3.4:443",
            "exa mple.com:443",
            "-bad.com:443",
            "[nothost]:443",
            "::1:443",
            "a..b:443",
        ] {
            assert!(parse_entry(bad).is_err(), "{bad}");
        }
        let (i, e) = parse_list(&["a.com:1".into(), "b".into()]).unwrap_err();
        assert_eq!((i, e.why), (1, "expected host:port"));
    }

    #[test]
    fn matching_is_exact_or_beneath_a_domain_and_port_exact() {
        let list = [entry("api.example.com:443"), entry("*.cdn.example.org:443")];
        assert!(find(&list, &host("api.example.com"), 443).is_some());
        assert!(find(&list, &host("API.EXAMPLE.COM"), 443).is_some());
        assert!(find(&list, &host("api.example.com"), 80).is_none());
        assert!(find(&list, &host("x.api.example.com"), 443).is_none());
        assert!(find(&list, &host("a.cdn.example.org"), 443).is_some());
        assert!(find(&list, &host("a.b.cdn.example.org"), 443).is_some());
        assert!(find(&list, &host("cdn.example.org"), 443).is_none());
        assert!(find(&list, &host("evilcdn.example.org"), 443).is_none());
        let ips = [entry("127.0.0.1:80")];
        assert!(find(&ips, &host("127.0.0.1"), 80).is_some());
        assert!(find(&ips, &host("[::ffff:127.0.0.1]"), 80).is_some());
        assert!(find(&ips, &host("localhost"), 80).is_none());
    }

    #[test]
    fn addresses_are_classed() {
        let c = |s: &str| class(s.parse().unwrap());
        assert_eq!(c("169.254.169.254"), AddrClass::Metadata);
        assert_eq!(c("::ffff:169.254.169.254"), AddrClass::Metadata);
        assert_eq!(c("fd00:ec2::254"), AddrClass::Metadata);
        assert_eq!(c("100.100.100.200"), AddrClass::Metadata);
        assert_eq!(c("169.254.1.1"), AddrClass::LinkLocal);
        assert_eq!(c("fe80::1"), AddrClass::LinkLocal);
        assert_eq!(c("64:ff9b::a9fe:a9fe"), AddrClass::Metadata);
        assert_eq!(c("127.0.0.1"), AddrClass::Loopback);
        assert_eq!(c("127.1.2.3"), AddrClass::Loopback);
        assert_eq!(c("0.0.0.0"), AddrClass::Loopback);
        assert_eq!(c("::1"), AddrClass::Loopback);
        assert_eq!(c("::"), AddrClass::Loopback);
        assert_eq!(c("::ffff:127.0.0.1"), AddrClass::Loopback);
        for p in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "fd12::1",
            "fc00::1",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "fec0::1",
            "64:ff9b:1::1",
            "::ffff:0:10.0.0.1",
        ] {
            assert_eq!(c(p), AddrClass::Private, "{p}");
        }
        for r in [
            "224.0.0.1",
            "255.255.255.255",
            "ff02::1",
            "::10.0.0.1",
            "::8.8.8.8",
            "2002:a00:1::1",
        ] {
            assert_eq!(c(r), AddrClass::Reserved, "{r}");
        }
        for p in [
            "93.184.216.34",
            "172.32.0.1",
            "2606:4700::1111",
            "100.128.0.1",
        ] {
            assert_eq!(c(p), AddrClass::Public, "{p}");
        }
    }

    #[test]
    fn private_addresses_only_when_listed_literally_metadata_never() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let by_name = entry("api.example.com:443");
        assert_eq!(judge(&by_name, ip("93.184.216.34")), Ok(()));
        assert_eq!(
            judge(&by_name, ip("127.0.0.1")),
            Err(Refusal::PrivateByName(ip("127.0.0.1")))
        );
        assert_eq!(
            judge(&by_name, ip("10.0.0.5")),
            Err(Refusal::PrivateByName(ip("10.0.0.5")))
        );
        assert_eq!(
            judge(&by_name, ip("169.254.169.254")),
            Err(Refusal::Metadata(ip("169.254.169.254")))
        );
        let literal = entry("127.0.0.1:8080");
        assert_eq!(judge(&literal, ip("127.0.0.1")), Ok(()));
        assert!(judge(&literal, ip("127.0.0.2")).is_err());
        let meta = entry("169.254.169.254:80");
        assert_eq!(
            judge(&meta, ip("169.254.169.254")),
            Err(Refusal::Metadata(ip("169.254.169.254")))
        );
        let ll = entry("[fe80::1]:80");
        assert!(judge(&ll, ip("fe80::1")).is_err());
    }

    #[test]
    fn a_cap_holds_what_it_covers() {
        let cap = entry("*.example.com:443");
        assert!(entry("api.example.com:443").within(&cap));
        assert!(entry("*.api.example.com:443").within(&cap));
        assert!(!entry("*.example.com:80").within(&cap));
        assert!(!entry("example.com:443").within(&cap));
        assert!(!entry("evil.com:443").within(&cap));
        assert!(entry("a.com:1").within(&entry("a.com:1")));
        assert!(!entry("*.a.com:1").within(&entry("b.a.com:1")));
    }

    #[test]
    fn the_child_gets_every_proxy_variable() {
        let env = proxy_env(3128, &[]);
        for name in ["HTTP_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
            assert!(env
                .iter()
                .any(|(k, v)| k == name && v == "http://127.0.0.1:3128"));
        }
        assert!(env
            .iter()
            .any(|(k, v)| k == "no_proxy" && v.contains("localhost")));
    }

    #[test]
    fn no_proxy_never_names_a_listed_host() {
        let list = |v: &[&str]| v.iter().map(|e| entry(e)).collect::<Vec<_>>();
        assert_eq!(no_proxy(&[], &[]), "localhost,127.0.0.1,::1");
        assert_eq!(no_proxy(&list(&["127.0.0.1:8080"]), &[]), "localhost,::1");
        assert_eq!(
            no_proxy(&list(&["[::ffff:127.0.0.1]:80", "[::1]:80"]), &[]),
            "localhost"
        );
        assert_eq!(no_proxy(&list(&["localhost:11434"]), &[]), "127.0.0.1,::1");
        // Clients match NO_PROXY as a domain suffix.
        assert_eq!(
            no_proxy(&list(&["api.localhost:80", "*.example.com:443"]), &[]),
            "127.0.0.1,::1"
        );
        assert_eq!(
            no_proxy(
                &list(&["api.example.com:443", "10.0.0.1:80"]),
                &["127.0.0.2"]
            ),
            "localhost,127.0.0.1,::1,127.0.0.2"
        );
        // A listed host wins over a run-local service on it.
        assert_eq!(
            no_proxy(&list(&["127.0.0.2:9000"]), &["127.0.0.2", "::1"]),
            "localhost,127.0.0.1,::1"
        );
        let env = proxy_env(3128, &list(&["127.0.0.1:8080"]));
        for name in ["NO_PROXY", "no_proxy"] {
            assert!(env.iter().any(|(k, v)| k == name && v == "localhost,::1"));
        }
    }
}
