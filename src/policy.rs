//! Per-interface connect/listen policy as users write it (kvmserver's
//! `--allow-connect` / `--allow-listen`): what a VM may connect to, and on
//! which of its ports others may connect to it. No rule of a kind means
//! that kind is not restricted. A connect rule names addresses (a CIDR) or
//! a DNS name (`names`): a VM with names in its policy reaches what
//! linnet's DNS told it those names are, and asks no other resolver.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use hickory_proto::rr::Name;
use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use crate::forward::{Protocol, port_number, split_protocol};
use crate::names::NamePattern;
use crate::rate::RateLimits;

#[derive(Debug, Error, PartialEq)]
#[error("\"{spec}\": {problem} (expected {expected})")]
pub struct PolicySpecError {
    spec: String,
    problem: String,
    expected: &'static str,
}

const CONNECT_FORM: &str = "CIDR[:PORT[-PORT]][/tcp|/udp] or NAME[:PORT[-PORT]][/tcp[/any]|/udp], e.g. 198.51.100.1:8080/tcp, 10.0.0.0/8, [2001:db8::/32]:443, api.example.com:443, *.cdn.example.net:443/tcp, git.example.com:22/tcp/any";
const LISTEN_FORM: &str = "PORT[-PORT][/tcp|/udp], e.g. 8000/tcp or 5000-5010";

/// An inclusive range of ports, 1 to 65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ports {
    pub first: u16,
    pub last: u16,
}

/// Where a connect rule lets a VM go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    /// These addresses.
    Net(IpNet),
    /// The addresses linnet's DNS answers the VM for a name the pattern
    /// allows, while the answer lives.
    Name(NamePattern),
}

/// `--allow-connect`: the VM may open connections to `to`, on `ports`
/// (any when None), over `protocol`. To addresses: TCP and UDP when None;
/// with neither ports nor protocol, any traffic, ICMP included. To a name:
/// TCP only unless `/udp` says UDP (`Reach::protocol`), and each TCP
/// connection must show the name it is for in its first bytes (the gate,
/// `crate::gate`) unless `nameless` (`/tcp/any`) lets it show none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectRule {
    pub to: Destination,
    pub ports: Option<Ports>,
    pub protocol: Option<Protocol>,
    /// `/any`: a connection to the name's addresses need not show the
    /// name (SSH, SMTP, a database); only on a name rule over TCP.
    pub nameless: bool,
}

/// The ports and protocol of a connect rule: which connections to its
/// destination it allows, and whether they are held for their name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reach {
    pub ports: Option<Ports>,
    pub protocol: Option<Protocol>,
    pub nameless: bool,
}

impl ConnectRule {
    pub fn reach(&self) -> Reach {
        Reach {
            ports: self.ports,
            protocol: self.effective_protocol(),
            nameless: self.nameless,
        }
    }

    /// Its protocol as enforced: a name rule without one is TCP's. UDP to
    /// a name's addresses is not checked for the name (a QUIC Initial is
    /// not read), so it is allowed only where a rule says `/udp`.
    pub fn effective_protocol(&self) -> Option<Protocol> {
        match (&self.to, self.protocol) {
            (Destination::Name(_), None) => Some(Protocol::Tcp),
            (_, p) => p,
        }
    }
}

impl Reach {
    /// Whether its TCP connections are held until they show their name.
    pub fn checked(&self) -> bool {
        self.protocol == Some(Protocol::Tcp) && !self.nameless
    }

    /// Whether it allows `protocol` to `port`.
    pub fn allows(&self, protocol: Protocol, port: u16) -> bool {
        self.protocol.is_none_or(|p| p == protocol)
            && self
                .ports
                .is_none_or(|ports| (ports.first..=ports.last).contains(&port))
    }
}

/// `--allow-listen`: others may connect to the VM on `ports` over
/// `protocol` (TCP and UDP when None).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenRule {
    pub ports: Ports,
    pub protocol: Option<Protocol>,
}

/// The port a secret goes to: HTTPS's. A secret rule's host is reached
/// there, and only there is a connection to it opened by linnet.
pub const SECRET_PORT: u16 = 443;

/// `--secret NAME@HOST`: linnet may put the secret NAME where the VM wrote
/// `{{secret:NAME}}` in a header of an HTTPS request to HOST (a name, or
/// `*.SUFFIX`), on port 443. Whose secret NAME is depends on the list the
/// rule is in (`Policy::secrets`, `Policy::network_secrets`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretRule {
    pub secret: String,
    pub host: NamePattern,
}

/// An interface's policy. Empty lists: nothing restricted. Its rate
/// limits ride along (they change with `policy set`, and show with the
/// rules) but restrict no destination: a policy with limits alone is open.
/// So do its secret rules, which restrict nothing either: they say where
/// linnet may put a secret into the VM's requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<ConnectRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<ListenRule>,
    #[serde(default, skip_serializing_if = "RateLimits::is_none")]
    pub rate_limit: RateLimits,
    /// Secret rules naming the VM's owner's secrets (`--secret`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRule>,
    /// Secret rules naming the network's secrets: networks.yaml's
    /// `policy.secrets`, set by the daemon alone (what a request says here
    /// is replaced), so no VM's owner points a network's secret at a host
    /// of its choosing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_secrets: Vec<SecretRule>,
}

impl Policy {
    /// No connect or listen rule (whatever its rate limits).
    pub fn is_open(&self) -> bool {
        self.egress.is_empty() && self.ingress.is_empty()
    }

    /// No rule and no rate limit.
    pub fn is_empty(&self) -> bool {
        self.is_open() && self.rate_limit.is_none()
    }

    /// Whether it names DNS names: then linnet's DNS answers the VM only
    /// for those, and no other resolver answers it at all.
    pub fn has_names(&self) -> bool {
        self.egress
            .iter()
            .any(|r| matches!(r.to, Destination::Name(_)))
    }

    /// The distinct ports and protocols of its name rules, in order: the
    /// firewall keeps one set of learned addresses for each.
    pub fn name_reaches(&self) -> Vec<Reach> {
        let mut out: Vec<Reach> = Vec::new();
        for rule in &self.egress {
            if matches!(rule.to, Destination::Name(_)) && !out.contains(&rule.reach()) {
                out.push(rule.reach());
            }
        }
        out
    }

    /// Which of `name_reaches` a query for `name` opens (by index); empty
    /// when no name rule allows it.
    pub fn reaches_of(&self, name: &Name) -> Vec<usize> {
        let name = crate::names::normalise(name);
        let name = &name;
        let reaches = self.name_reaches();
        let mut out: Vec<usize> = self
            .egress
            .iter()
            .filter(|r| matches!(&r.to, Destination::Name(p) if p.allows(name)))
            .filter_map(|r| reaches.iter().position(|x| *x == r.reach()))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl Policy {
    /// Whether it has secret rules of either list.
    pub fn has_secrets(&self) -> bool {
        !self.secrets.is_empty() || !self.network_secrets.is_empty()
    }

    /// The learned set whose addresses are those learned for a secret
    /// rule's host: connections to them on port 443 are steered to the
    /// network's secrets proxy. After the name reaches' sets; None without
    /// secret rules.
    pub fn steered(&self) -> Option<usize> {
        self.has_secrets().then(|| self.name_reaches().len())
    }

    /// How many learned sets its names fill: a set per name reach, and the
    /// steered one.
    pub fn learned_sets(&self) -> usize {
        self.name_reaches().len() + usize::from(self.has_secrets())
    }

    /// Which learned sets an answer for `name` fills (by index): the
    /// reaches it opens (`reaches_of`), and the steered set when a secret
    /// rule names it. Empty when no name rule allows it.
    pub fn sets_of(&self, name: &Name) -> Vec<usize> {
        let mut sets = self.reaches_of(name);
        let normalised = crate::names::normalise(name);
        let secret_host =
            (self.secrets.iter().chain(&self.network_secrets)).any(|r| r.host.allows(&normalised));
        if let (false, true, Some(steered)) = (sets.is_empty(), secret_host, self.steered()) {
            sets.push(steered);
        }
        sets
    }

    /// Whether its connect rules let the VM reach `host` by name at port
    /// 443 over TCP: a secret rule for a host it does not reach could
    /// never be used.
    pub fn reaches_secret_host(&self, host: &NamePattern) -> bool {
        self.egress.iter().any(|r| {
            matches!(&r.to, Destination::Name(p) if p.covers(host))
                && r.reach().allows(Protocol::Tcp, SECRET_PORT)
        })
    }
}

const SECRET_FORM: &str =
    "NAME@HOST, e.g. TOKEN@api.example.com or REGISTRY_KEY@*.registry.example";

impl FromStr for SecretRule {
    type Err = PolicySpecError;

    fn from_str(spec: &str) -> Result<SecretRule, PolicySpecError> {
        let fail = |problem: String| PolicySpecError {
            spec: spec.into(),
            problem,
            expected: SECRET_FORM,
        };
        let (secret, host) = spec
            .split_once('@')
            .ok_or_else(|| fail("no '@' between the secret's name and the host".into()))?;
        crate::secrets::check_name(secret).map_err(|e| fail(e.to_string()))?;
        if host.contains(':') || host.contains('/') {
            return Err(fail(format!(
                "\"{host}\" is not a name: a secret goes to HTTPS's port {SECRET_PORT} only, and to no address"
            )));
        }
        let host = NamePattern::parse(host).map_err(fail)?;
        Ok(SecretRule {
            secret: secret.into(),
            host,
        })
    }
}

impl fmt::Display for SecretRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.secret, self.host)
    }
}

fn parse_ports(
    text: &str,
    fail: &dyn Fn(String) -> PolicySpecError,
) -> Result<Ports, PolicySpecError> {
    let port = |t: &str| port_number("port", t).map_err(fail);
    let (first, last) = match text.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => {
            let p = port(text)?;
            (p, p)
        }
    };
    if first > last {
        return Err(fail(format!("port range {first}-{last} is backwards")));
    }
    Ok(Ports { first, last })
}

impl FromStr for ConnectRule {
    type Err = PolicySpecError;

    fn from_str(spec: &str) -> Result<ConnectRule, PolicySpecError> {
        let fail = |problem: String| PolicySpecError {
            spec: spec.into(),
            problem,
            expected: CONNECT_FORM,
        };
        let (rest, nameless) = match spec.strip_suffix("/any") {
            Some(rest) => (rest, true),
            None => (spec, false),
        };
        let (rest, protocol) = split_protocol(rest).map_err(fail)?;
        // [V6NET]:PORTS, or V4NET:PORTS, or a bare network of either family.
        let (net_text, ports_text) = if let Some(inner) = rest.strip_prefix('[') {
            let (net, after) = inner
                .split_once(']')
                .ok_or_else(|| fail("a '[' without its ']'".into()))?;
            match after.strip_prefix(':') {
                Some(ports) => (net, Some(ports)),
                None if after.is_empty() => (net, None),
                None => return Err(fail(format!("\"{after}\" after the address"))),
            }
        } else if rest.matches(':').count() == 1 {
            let (net, ports) = rest.split_once(':').expect("one colon");
            (net, Some(ports))
        } else {
            (rest, None)
        };
        let to = destination(net_text).map_err(fail)?;
        let ports = ports_text.map(|p| parse_ports(p, &fail)).transpose()?;
        if nameless && !matches!(to, Destination::Name(_)) {
            return Err(fail(
                "\"/any\" is for a name rule (its connections need not show the name); an address rule's never have to".into(),
            ));
        }
        if nameless && protocol == Some(Protocol::Udp) {
            return Err(fail(
                "\"/any\" is for TCP: UDP to a name's addresses is never checked for the name"
                    .into(),
            ));
        }
        Ok(ConnectRule {
            to,
            ports,
            // `/any` is TCP's alone: said or not.
            protocol: if nameless {
                Some(Protocol::Tcp)
            } else {
                protocol
            },
            nameless,
        })
    }
}

/// An address, a network or a name.
fn destination(text: &str) -> Result<Destination, String> {
    let net = match (text.parse::<IpNet>(), text.parse::<IpAddr>()) {
        (Ok(net), _) => net,
        (_, Ok(addr)) => IpNet::from(addr),
        _ if text.contains('/') => {
            return Err(format!("\"{text}\" is not an IP address or network"));
        }
        _ => {
            return NamePattern::parse(text)
                .map(Destination::Name)
                .map_err(|why| {
                    format!("\"{text}\" is neither an IP address or network nor a name: {why}")
                });
        }
    };
    if net != net.trunc() {
        return Err(format!(
            "\"{text}\" has host bits set; did you mean {}?",
            net.trunc()
        ));
    }
    Ok(Destination::Net(net))
}

impl FromStr for ListenRule {
    type Err = PolicySpecError;

    fn from_str(spec: &str) -> Result<ListenRule, PolicySpecError> {
        let fail = |problem: String| PolicySpecError {
            spec: spec.into(),
            problem,
            expected: LISTEN_FORM,
        };
        let (rest, protocol) = split_protocol(spec).map_err(fail)?;
        Ok(ListenRule {
            ports: parse_ports(rest, &fail)?,
            protocol,
        })
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

fn write_protocol(f: &mut fmt::Formatter<'_>, protocol: Option<Protocol>) -> fmt::Result {
    match protocol {
        Some(p) => write!(f, "/{}", p.as_str()),
        None => Ok(()),
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Net(net) if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "{}", net.addr())
            }
            Destination::Net(net) => write!(f, "{net}"),
            Destination::Name(name) => write!(f, "{name}"),
        }
    }
}

impl fmt::Display for ConnectRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.to, self.ports) {
            (Destination::Net(IpNet::V6(_)), Some(ports)) => write!(f, "[{}]:{ports}", self.to)?,
            (_, Some(ports)) => write!(f, "{}:{ports}", self.to)?,
            (_, None) => write!(f, "{}", self.to)?,
        }
        match (self.protocol, self.nameless) {
            (_, true) => write!(f, "/tcp/any"),
            (p, false) => write_protocol(f, p),
        }
    }
}

impl fmt::Display for ListenRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ports)?;
        write_protocol(f, self.protocol)
    }
}

macro_rules! serde_as_string {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?
                    .parse()
                    .map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_as_string!(ConnectRule);
serde_as_string!(ListenRule);
serde_as_string!(SecretRule);

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(s: &str) -> ConnectRule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn listen(s: &str) -> ListenRule {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn connect_rules_parse_and_print_canonically() {
        let r = connect("198.51.100.1:8080/tcp");
        assert_eq!(r.to, Destination::Net("198.51.100.1/32".parse().unwrap()));
        assert_eq!(
            r.ports,
            Some(Ports {
                first: 8080,
                last: 8080
            })
        );
        assert_eq!(r.protocol, Some(Protocol::Tcp));
        for canonical in [
            "198.51.100.1:8080/tcp",
            "10.0.0.0/8",
            "10.0.0.0/8:1000-2000/udp",
            "[2001:db8::/32]:443/tcp",
            "2001:db8::1",
            "[2001:db8::1]:53",
            "192.0.2.0/24/udp",
            "api.example.com:443/tcp",
            "*.cdn.example.net:443",
            "xn--bcher-kva.example",
            "localhost:8000-8010/udp",
        ] {
            assert_eq!(connect(canonical).to_string(), canonical);
        }
        assert_eq!(connect("2001:db8::/32").ports, None);
    }

    #[test]
    fn listen_rules_parse_and_print_canonically() {
        assert_eq!(
            listen("8000/tcp"),
            ListenRule {
                ports: Ports {
                    first: 8000,
                    last: 8000
                },
                protocol: Some(Protocol::Tcp)
            }
        );
        let git = connect("git.example.com:22/any");
        assert!(git.nameless && git.reach().protocol == Some(Protocol::Tcp));
        assert_eq!(git.to_string(), "git.example.com:22/tcp/any");
        assert_eq!(connect("git.example.com:22/tcp/any"), git);
        assert!(!connect("api.example.com:443").reach().nameless);
        assert!(connect("api.example.com:443").reach().checked());
        assert!(!connect("api.example.com:443/udp").reach().checked());
        for canonical in ["8000/tcp", "5000-5010", "53/udp"] {
            assert_eq!(listen(canonical).to_string(), canonical);
        }
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        let bad = |s: &str| s.parse::<ConnectRule>().unwrap_err().to_string();
        assert!(bad("10.0.0.0/33").contains("\"10.0.0.0/33\" is not an IP address or network"));
        assert!(bad("exa mple.com:80").contains("is neither an IP address or network nor a name"));
        assert!(bad("www.*.example.com").contains("a wildcard is a whole first label"));
        assert!(bad("10.0.0.1/8").contains("has host bits set; did you mean 10.0.0.0/8?"));
        assert!(bad("10.0.0.1:0").contains("port 0 is out of range"));
        assert!(bad("10.0.0.1:90-80").contains("port range 90-80 is backwards"));
        assert!(bad("10.0.0.1:80/sctp").contains("unknown protocol \"sctp\""));
        assert!(bad("[2001:db8::1:80").contains("a '[' without its ']'"));
        assert!(bad("10.0.0.1:http").contains("expected CIDR[:PORT[-PORT]][/tcp|/udp] or NAME"));
        assert!(bad("10.0.0.1:22/tcp/any").contains("\"/any\" is for a name rule"));
        assert!(bad("git.example.com:22/udp/any").contains("\"/any\" is for TCP"));
        let bad = |s: &str| s.parse::<ListenRule>().unwrap_err().to_string();
        assert!(bad("70000").contains("port 70000 is out of range"));
        assert!(bad("ssh").contains("port \"ssh\" is not a number"));
        assert!(bad("22/icmp").contains("unknown protocol \"icmp\""));
    }

    #[test]
    fn policies_round_trip_as_json() {
        let p = Policy {
            egress: vec![connect("198.51.100.1:8080/tcp")],
            ingress: vec![listen("8000/tcp")],
            ..Default::default()
        };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(
            text,
            r#"{"egress":["198.51.100.1:8080/tcp"],"ingress":["8000/tcp"]}"#
        );
        assert_eq!(serde_json::from_str::<Policy>(&text).unwrap(), p);
        assert!(Policy::default().is_open());
    }

    #[test]
    fn secret_rules_parse_print_and_need_their_host_reached_on_443() {
        let rule: SecretRule = "TOKEN@API.Example.com".parse().unwrap();
        assert_eq!(rule.secret, "TOKEN");
        assert_eq!(rule.to_string(), "TOKEN@api.example.com");
        let wild: SecretRule = "key_2@*.registry.example".parse().unwrap();
        assert_eq!(wild.to_string(), "key_2@*.registry.example");
        let bad = |s: &str| s.parse::<SecretRule>().unwrap_err().to_string();
        assert!(bad("TOKEN").contains("no '@' between"), "{}", bad("TOKEN"));
        assert!(bad("1TOKEN@api.example.com").contains("1TOKEN"));
        assert!(bad("TOKEN@api.example.com:8443").contains("port 443 only"));
        assert!(bad("TOKEN@192.0.2.1").contains("is an address, not a name"));
        assert!(bad("TOKEN@").contains("an empty name"));
        let p = Policy {
            egress: vec![
                connect("api.example.com:443"),
                connect("*.registry.example:1-1000/tcp"),
                connect("ssh.example.com:22/tcp/any"),
                connect("10.0.0.0/8"),
                connect("quic.example.com:443/udp"),
            ],
            secrets: vec![rule.clone()],
            ..Default::default()
        };
        let reached = |h: &str| p.reaches_secret_host(&NamePattern::parse(h).unwrap());
        assert!(reached("api.example.com") && reached("a.b.registry.example"));
        assert!(reached("*.registry.example") && reached("*.x.registry.example"));
        assert!(!reached("other.example.com"), "no rule for it");
        assert!(!reached("*.example.com"), "wider than the rule");
        assert!(!reached("ssh.example.com"), "reached, but not on 443");
        assert!(!reached("quic.example.com"), "on 443, but UDP");
        let text = serde_json::to_string(&p).unwrap();
        assert!(
            text.contains(r#""secrets":["TOKEN@api.example.com"]"#),
            "{text}"
        );
        assert!(!text.contains("network_secrets"), "{text}");
        assert_eq!(serde_json::from_str::<Policy>(&text).unwrap(), p);
    }

    #[test]
    fn a_secret_hosts_addresses_fill_the_steered_set_too() {
        let mut p = Policy {
            egress: vec![connect("*.example.com:443"), connect("pypi.org:443")],
            ..Default::default()
        };
        let name = |s: &str| Name::from_utf8(s).unwrap();
        assert_eq!((p.steered(), p.learned_sets()), (None, 1));
        assert_eq!(p.sets_of(&name("api.example.com")), vec![0]);
        p.secrets = vec!["TOKEN@api.example.com".parse().unwrap()];
        assert_eq!((p.steered(), p.learned_sets()), (Some(1), 2));
        assert_eq!(p.sets_of(&name("API.example.com.")), vec![0, 1]);
        assert_eq!(
            p.sets_of(&name("www.example.com")),
            vec![0],
            "no secret's host"
        );
        assert_eq!(p.sets_of(&name("pypi.org")), vec![0]);
        assert!(p.sets_of(&name("evil.test")).is_empty());
        p.secrets.clear();
        p.network_secrets = vec!["NET@*.example.com".parse().unwrap()];
        assert_eq!(p.sets_of(&name("www.example.com")), vec![0, 1]);
    }

    #[test]
    fn name_rules_are_grouped_by_what_they_reach() {
        let p = Policy {
            egress: vec![
                connect("api.example.com:443/tcp"),
                connect("10.0.0.0/8"),
                connect("*.cdn.example.net:443/tcp"),
                connect("*.example.com:8080"),
            ],
            ingress: vec![],
            ..Default::default()
        };
        assert!(p.has_names());
        assert_eq!(p.name_reaches().len(), 2, "443/tcp once, 8080 once");
        let name = |s: &str| Name::from_utf8(s).unwrap();
        assert_eq!(p.reaches_of(&name("API.example.com")), vec![0, 1]);
        assert_eq!(p.reaches_of(&name("a.cdn.example.net")), vec![0]);
        assert_eq!(p.reaches_of(&name("www.example.com")), vec![1]);
        assert!(p.reaches_of(&name("example.com")).is_empty());
        let cidr_only = Policy {
            egress: vec![connect("10.0.0.0/8")],
            ingress: vec![],
            ..Default::default()
        };
        assert!(!cidr_only.has_names());
        assert!(cidr_only.name_reaches().is_empty());
    }
}
