//! Port forwards as users write them, in Podman's `--publish` syntax:
//! `[HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp]`. Parsed once here; the
//! daemon keeps them per interface and the firewall turns them into DNAT.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// One published port. Without `host_addr` it answers on every address of
/// the host (IPv4 and, when the network has IPv6, IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortForward {
    pub host_addr: Option<IpAddr>,
    pub host_port: u16,
    pub guest_port: u16,
    pub protocol: Protocol,
}

#[derive(Debug, Error, PartialEq)]
#[error(
    "\"{spec}\": {problem} (expected [HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp], e.g. 8080:80 or 127.0.0.1:5353:53/udp)"
)]
pub struct ForwardSpecError {
    spec: String,
    problem: String,
}

impl PortForward {
    /// Whether the two would claim the same host port: same protocol and
    /// port, and addresses that meet (no address means all of them).
    pub fn clashes_with(&self, other: &PortForward) -> bool {
        self.protocol == other.protocol
            && self.host_port == other.host_port
            && match (self.host_addr, other.host_addr) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// Splits a trailing `/tcp` or `/udp` off `spec` (None: no protocol given).
/// Only a word after the last `/` is taken for a protocol, so a network's
/// `/8` stays where it is. The error is the problem, for the caller's type.
pub fn split_protocol(spec: &str) -> Result<(&str, Option<Protocol>), String> {
    match spec.rsplit_once('/') {
        Some((rest, "tcp")) => Ok((rest, Some(Protocol::Tcp))),
        Some((rest, "udp")) => Ok((rest, Some(Protocol::Udp))),
        Some((_, other)) if other.chars().all(|c| c.is_ascii_alphabetic()) => {
            Err(format!("unknown protocol \"{other}\"; use tcp or udp"))
        }
        _ => Ok((spec, None)),
    }
}

/// A port number 1–65535; `what` names it in the problem ("host port").
pub fn port_number(what: &str, text: &str) -> Result<u16, String> {
    match text.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Ok(p as u16),
        Ok(p) => Err(format!("{what} {p} is out of range; allowed 1 to 65535")),
        Err(_) => Err(format!("{what} \"{text}\" is not a number")),
    }
}

impl FromStr for PortForward {
    type Err = ForwardSpecError;

    fn from_str(spec: &str) -> Result<PortForward, ForwardSpecError> {
        let fail = |problem: String| ForwardSpecError {
            spec: spec.into(),
            problem,
        };
        let (ports, protocol) = split_protocol(spec).map_err(fail)?;
        let protocol = protocol.unwrap_or(Protocol::Tcp);
        // The address may itself hold colons: it is everything before the
        // last two fields, in brackets when it is IPv6.
        let mut fields = ports.rsplitn(3, ':');
        let guest = fields.next().unwrap_or_default();
        let host = fields
            .next()
            .ok_or_else(|| fail("needs both a host port and a guest port".into()))?;
        let host_addr = match fields.next() {
            None => None,
            Some(text) => {
                let bare = text
                    .strip_prefix('[')
                    .and_then(|t| t.strip_suffix(']'))
                    .unwrap_or(text);
                let addr: IpAddr = bare
                    .parse()
                    .map_err(|_| fail(format!("\"{text}\" is not an IP address")))?;
                if addr.is_ipv6() && bare == text {
                    return Err(fail(format!(
                        "write the IPv6 address in brackets: [{addr}]"
                    )));
                }
                if addr == IpAddr::V6(std::net::Ipv6Addr::LOCALHOST) {
                    return Err(fail(
                        "::1 cannot be forwarded: IPv6 packets from ::1 never leave the host; use 127.0.0.1 or one of the host's addresses".into(),
                    ));
                }
                if addr.is_multicast() || addr.is_unspecified() {
                    return Err(fail(format!(
                        "{addr} is not a host address; leave it out to forward on every address"
                    )));
                }
                Some(addr)
            }
        };
        Ok(PortForward {
            host_addr,
            host_port: port_number("host port", host).map_err(fail)?,
            guest_port: port_number("guest port", guest).map_err(fail)?,
            protocol,
        })
    }
}

impl fmt::Display for PortForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host_addr {
            Some(IpAddr::V6(a)) => write!(f, "[{a}]:")?,
            Some(IpAddr::V4(a)) => write!(f, "{a}:")?,
            None => {}
        }
        write!(
            f,
            "{}:{}/{}",
            self.host_port,
            self.guest_port,
            self.protocol.as_str()
        )
    }
}

impl Serialize for PortForward {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PortForward {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> PortForward {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn refused(s: &str) -> String {
        s.parse::<PortForward>()
            .expect_err("should be refused")
            .to_string()
    }

    #[test]
    fn podman_forms_parse_and_print_canonically() {
        let f = parse("8080:80");
        assert_eq!(
            f,
            PortForward {
                host_addr: None,
                host_port: 8080,
                guest_port: 80,
                protocol: Protocol::Tcp
            }
        );
        assert_eq!(f.to_string(), "8080:80/tcp");
        assert_eq!(parse("5353:53/udp").to_string(), "5353:53/udp");
        assert_eq!(
            parse("127.0.0.1:2222:22/tcp").host_addr,
            Some("127.0.0.1".parse().unwrap())
        );
        let v6 = parse("[2001:db8::1]:8443:443");
        assert_eq!(v6.host_addr, Some("2001:db8::1".parse().unwrap()));
        assert_eq!(v6.to_string(), "[2001:db8::1]:8443:443/tcp");
        for canonical in ["8080:80/tcp", "10.0.0.1:1:65535/udp", "[fd00::1]:80:80/tcp"] {
            assert_eq!(parse(canonical).to_string(), canonical);
        }
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        assert!(refused("8080").contains("needs both a host port and a guest port"));
        assert!(refused("0:80").contains("host port 0 is out of range"));
        assert!(refused("8080:70000").contains("guest port 70000 is out of range"));
        assert!(refused("http:80").contains("host port \"http\" is not a number"));
        assert!(refused("8080:80/sctp").contains("unknown protocol \"sctp\""));
        assert!(refused("banana:8080:80").contains("\"banana\" is not an IP address"));
        assert!(refused("::1:8080:80").contains("in brackets: [::1]"));
        assert!(refused("[::1]:8080:80").contains("::1 cannot be forwarded"));
        assert!(refused("0.0.0.0:8080:80").contains("leave it out"));
        assert!(refused("1:2:3:4").contains("expected [HOST_ADDR:]HOST_PORT:GUEST_PORT"));
        assert!(refused("").contains("needs both"));
    }

    #[test]
    fn clashes_need_same_protocol_port_and_meeting_addresses() {
        let any = parse("8080:80");
        assert!(any.clashes_with(&parse("8080:81")));
        assert!(any.clashes_with(&parse("127.0.0.1:8080:80")));
        assert!(!any.clashes_with(&parse("8080:80/udp")));
        assert!(!any.clashes_with(&parse("8081:80")));
        assert!(!parse("127.0.0.1:8080:80").clashes_with(&parse("10.0.0.1:8080:80")));
    }
}
