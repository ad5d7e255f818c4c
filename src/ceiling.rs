//! A network's enforced policy: the most its VMs may have. With
//! `policy: { …, enforced: true }` in networks.yaml, a VM on the network
//! gets at most the connect and listen rules the network's policy gives;
//! with `rate_limit: { …, enforced: true }`, at most its rate each way. An
//! attach or `policy set` may narrow either, never widen it. Plain data,
//! checked on attach, on `policy set` and when a restarted daemon adopts
//! what it left.
//!
//! "At most" is judged rule by rule: each rule the VM asks for must lie
//! inside one rule of the network's (its addresses or names, its ports,
//! its protocol). No rule of a kind means "not restricted", so a VM asking
//! for no connect rule under a ceiling with some asks for everything.

use thiserror::Error;

use crate::policy::{ConnectRule, Destination, ListenRule, Policy, Ports};
use crate::rate::{Rate, RateLimits};

/// What a network holds its VMs to; `None` parts are not enforced.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ceiling<'a> {
    /// The network's connect and listen rules, when enforced.
    pub rules: Option<&'a Policy>,
    /// The network's rate limits, when enforced.
    pub rate: Option<&'a RateLimits>,
}

/// Where a VM's policy goes past its network's ceiling: the first part
/// found, said for the user.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Widening {
    #[error("connecting to {rule} is not within its connect rules ({allowed})")]
    Connect { rule: String, allowed: String },
    #[error("connecting anywhere (no connect rule) is not within its connect rules ({allowed})")]
    ConnectAnywhere { allowed: String },
    #[error("listening on {rule} is not within its listen rules ({allowed})")]
    Listen { rule: String, allowed: String },
    #[error("listening on any port (no listen rule) is not within its listen rules ({allowed})")]
    ListenAnywhere { allowed: String },
    #[error("{way} {asked} is over its rate_limit.{way} ({allowed})")]
    Rate {
        way: &'static str,
        asked: String,
        allowed: String,
    },
    #[error("no rate limit {way} is over its rate_limit.{way} ({allowed})")]
    Unlimited { way: &'static str, allowed: String },
}

impl Widening {
    /// The networks.yaml key whose `enforced` this goes past.
    pub fn key(&self) -> &'static str {
        match self {
            Widening::Rate { .. } | Widening::Unlimited { .. } => "rate_limit",
            _ => "policy",
        }
    }
}

impl Ceiling<'_> {
    /// Whether anything is enforced.
    pub fn is_set(&self) -> bool {
        self.rules.is_some() || self.rate.is_some()
    }

    /// Ok when `policy` stays under this ceiling; else the first part that
    /// does not.
    pub fn admits(&self, policy: &Policy) -> Result<(), Widening> {
        if let Some(ceiling) = self.rules {
            rules_within(policy, ceiling)?;
        }
        if let Some(ceiling) = self.rate {
            rate_within("in", policy.rate_limit.received, ceiling.received)?;
            rate_within("out", policy.rate_limit.sent, ceiling.sent)?;
        }
        Ok(())
    }
}

fn listed<T: ToString>(rules: &[T]) -> String {
    rules
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn rules_within(asked: &Policy, ceiling: &Policy) -> Result<(), Widening> {
    each_within(
        &asked.egress,
        &ceiling.egress,
        connect_covers,
        |allowed| Widening::ConnectAnywhere { allowed },
        |rule, allowed| Widening::Connect { rule, allowed },
    )?;
    each_within(
        &asked.ingress,
        &ceiling.ingress,
        listen_covers,
        |allowed| Widening::ListenAnywhere { allowed },
        |rule, allowed| Widening::Listen { rule, allowed },
    )
}

/// Each of the `asked` rules of one kind inside one of `ceiling`'s; an
/// empty list (not restricted) only under an empty one.
fn each_within<R: ToString>(
    asked: &[R],
    ceiling: &[R],
    covers: fn(&R, &R) -> bool,
    anywhere: fn(String) -> Widening,
    outside: fn(String, String) -> Widening,
) -> Result<(), Widening> {
    if ceiling.is_empty() {
        return Ok(());
    }
    if asked.is_empty() {
        return Err(anywhere(listed(ceiling)));
    }
    match asked.iter().find(|r| !ceiling.iter().any(|c| covers(c, r))) {
        Some(rule) => Err(outside(rule.to_string(), listed(ceiling))),
        None => Ok(()),
    }
}

/// `inner`'s ports within `outer`'s (None: every port).
fn ports_cover(outer: Option<Ports>, inner: Option<Ports>) -> bool {
    match (outer, inner) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(o), Some(i)) => o.first <= i.first && i.last <= o.last,
    }
}

/// `inner`'s protocol within `outer`'s (None: TCP and UDP, or with no
/// ports any traffic, ICMP too).
fn protocol_covers<P: PartialEq>(outer: Option<P>, inner: Option<P>) -> bool {
    match (outer, inner) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(o), Some(i)) => o == i,
    }
}

fn connect_covers(outer: &ConnectRule, inner: &ConnectRule) -> bool {
    let to = match (&outer.to, &inner.to) {
        (Destination::Net(o), Destination::Net(i)) => o.contains(i),
        (Destination::Name(o), Destination::Name(i)) => o.covers(i),
        // A name's addresses are what DNS says, not known beforehand: a
        // network rule never covers a name rule, nor a name one a network.
        _ => false,
    };
    // A rule with neither ports nor protocol is any traffic, ICMP too; one
    // with a protocol alone is every port of that protocol (a name rule's
    // is TCP when it names none). A rule whose connections must show the
    // name does not cover one whose need not.
    to && ports_cover(outer.ports, inner.ports)
        && protocol_covers(outer.effective_protocol(), inner.effective_protocol())
        && (outer.nameless || !inner.nameless)
}

fn listen_covers(outer: &ListenRule, inner: &ListenRule) -> bool {
    ports_cover(Some(outer.ports), Some(inner.ports))
        && protocol_covers(outer.protocol, inner.protocol)
}

fn rate_within(
    way: &'static str,
    asked: Option<Rate>,
    ceiling: Option<Rate>,
) -> Result<(), Widening> {
    let Some(ceiling) = ceiling else {
        return Ok(());
    };
    let Some(asked) = asked else {
        return Err(Widening::Unlimited {
            way,
            allowed: ceiling.to_string(),
        });
    };
    if asked.bits_per_second > ceiling.bits_per_second
        || asked.burst_bytes() > ceiling.burst_bytes()
    {
        return Err(Widening::Rate {
            way,
            asked: format!("{asked} (burst {} bytes)", asked.burst_bytes()),
            allowed: format!("{ceiling} (burst {} bytes)", ceiling.burst_bytes()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(egress: &[&str], ingress: &[&str]) -> Policy {
        Policy {
            egress: egress.iter().map(|r| r.parse().unwrap()).collect(),
            ingress: ingress.iter().map(|r| r.parse().unwrap()).collect(),
            ..Policy::default()
        }
    }

    fn rules(ceiling: &Policy) -> Ceiling<'_> {
        Ceiling {
            rules: Some(ceiling),
            rate: None,
        }
    }

    #[test]
    fn narrower_connect_rules_pass_and_wider_ones_say_which() {
        let net = policy(
            &[
                "api.example.com:443/tcp",
                "*.pkg.example.org:443",
                "10.0.0.0/8",
            ],
            &[],
        );
        let ceiling = rules(&net);
        for ok in [
            &["api.example.com:443/tcp"][..],
            &[
                "mirror.pkg.example.org:443/tcp",
                "*.eu.pkg.example.org:443/tcp",
            ],
            &["10.1.0.0/16:22/tcp", "10.0.0.1"],
            &[
                "api.example.com:443/tcp",
                "*.pkg.example.org:443",
                "10.0.0.0/8",
            ],
        ] {
            assert_eq!(ceiling.admits(&policy(ok, &[])), Ok(()), "{ok:?}");
        }
        let widening = |egress: &[&str]| {
            ceiling
                .admits(&policy(egress, &[]))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            widening(&["api.example.com:443/tcp", "evil.example.com:443/tcp"]),
            "connecting to evil.example.com:443/tcp is not within its connect rules (api.example.com:443/tcp, *.pkg.example.org:443, 10.0.0.0/8)"
        );
        assert!(widening(&["api.example.com"]).contains("connecting to api.example.com is not"));
        assert_eq!(
            ceiling.admits(&policy(&["api.example.com:443"], &[])),
            Ok(()),
            "a name rule without a protocol is TCP's"
        );
        assert!(widening(&["api.example.com:80/tcp"]).contains("api.example.com:80/tcp"));
        assert!(widening(&["*.example.com:443/tcp"]).contains("*.example.com:443/tcp"));
        assert!(widening(&["pkg.example.org:443"]).contains("pkg.example.org:443"));
        // A name rule without a protocol is TCP's, each connection held for
        // its name: neither UDP nor connections that show none are within.
        assert!(widening(&["mirror.pkg.example.org:443/udp"]).contains("/udp"));
        assert!(widening(&["mirror.pkg.example.org:443/tcp/any"]).contains("/tcp/any"));
        assert!(widening(&["0.0.0.0/0"]).contains("0.0.0.0/0"));
        assert!(widening(&["11.0.0.0/8"]).contains("11.0.0.0/8"));
        // A name is not an address: neither covers the other.
        assert!(widening(&["10.0.0.0/8", "localhost"]).contains("localhost"));
        assert!(widening(&[]).starts_with("connecting anywhere (no connect rule)"));
    }

    #[test]
    fn listen_rules_and_an_open_side_are_judged_alike() {
        let net = policy(&[], &["8000-8010/tcp", "53"]);
        let ceiling = rules(&net);
        assert_eq!(
            ceiling.admits(&policy(&[], &["8001/tcp", "53/udp"])),
            Ok(())
        );
        // The network restricts no connection: any connect rule is narrower.
        assert_eq!(ceiling.admits(&policy(&["10.0.0.0/8"], &["53"])), Ok(()));
        let widening = |ingress: &[&str]| ceiling.admits(&policy(&[], ingress)).unwrap_err();
        assert_eq!(
            widening(&["8000-8011/tcp"]).to_string(),
            "listening on 8000-8011/tcp is not within its listen rules (8000-8010/tcp, 53)"
        );
        assert!(
            widening(&["8005"]).to_string().contains("8005"),
            "TCP and UDP, over TCP's"
        );
        assert!(matches!(widening(&[]), Widening::ListenAnywhere { .. }));
        assert_eq!(widening(&[]).key(), "policy");
    }

    #[test]
    fn rates_may_be_lower_never_higher_nor_unlimited() {
        let limits = RateLimits {
            received: Some("100mbit".parse().unwrap()),
            sent: Some("20mbit".parse().unwrap()),
        };
        let ceiling = Ceiling {
            rules: None,
            rate: Some(&limits),
        };
        let with = |received: &str, sent: &str| Policy {
            rate_limit: RateLimits {
                received: (!received.is_empty()).then(|| received.parse().unwrap()),
                sent: (!sent.is_empty()).then(|| sent.parse().unwrap()),
            },
            ..Policy::default()
        };
        assert_eq!(ceiling.admits(&with("100mbit", "10mbit")), Ok(()));
        // Rules are not enforced here: an open policy is fine.
        assert_eq!(ceiling.admits(&with("1mbit", "1mbit")), Ok(()));
        let over = ceiling.admits(&with("100mbit", "30mbit")).unwrap_err();
        assert_eq!(over.key(), "rate_limit");
        assert!(over.to_string().starts_with("out 30mbit"), "{over}");
        assert!(
            over.to_string().contains("rate_limit.out (20mbit"),
            "{over}"
        );
        let burst = ceiling
            .admits(&with("100mbit/100mb", "20mbit"))
            .unwrap_err();
        assert!(burst.to_string().starts_with("in 100mbit"), "{burst}");
        assert_eq!(
            ceiling.admits(&with("", "20mbit")).unwrap_err().to_string(),
            "no rate limit in is over its rate_limit.in (100mbit)"
        );
        assert!(!Ceiling::default().is_set());
        assert_eq!(Ceiling::default().admits(&with("", "")), Ok(()));
    }
}
