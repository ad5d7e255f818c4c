//! Rate limits, in the guard's tables: a `limit` object per port and way
//! (a token bucket that says "over" once the port's frames exceed its
//! rate), found through the maps `sent` and `received` by the port's name.
//! The fixed rules drop what is over:
//!
//! - a TAP's frames as they enter its bridge (`sent`, prerouting) and
//!   leave it for the TAP (`received`, postrouting): whatever they are to
//!   or from, other VMs, the host or the world. A socket datapath's relay
//!   writes to and reads from such a TAP, so its VM is limited the same.
//! - a macvtap's frames at its own hooks: egress is what its VM sends (as
//!   for anti-spoofing), ingress what reaches it.
//!
//! A policer, not a shaper: what exceeds the rate is dropped, not queued,
//! and TCP at either end slows to the rate. (A shaper needs a queue each
//! way: TBF on the TAP's egress would do what the VM receives, but what it
//! sends enters through the TAP's ingress, where only an IFB device per
//! port could queue it.) Measured through a bridge: 10.1, 98 and 980
//! Mbit/s of TCP under 10, 100 and 1000 Mbit/s limits.
//!
//! Changing a rate is one transaction: the old object's element out, a new
//! object (named by its rate, so both exist within the transaction) and
//! its element in.

use std::fmt;

use super::{Hook, PortGuard, TABLE};
use crate::rate::Rate;

/// Which of a port's frames a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// What its VM sends.
    Sent,
    /// What reaches its VM.
    Received,
}

impl Way {
    fn map(self) -> &'static str {
        match self {
            Way::Sent => "sent",
            Way::Received => "received",
        }
    }
}

/// The maps from port name to its limit object, in either table, and
/// the frames each port's limits dropped.
pub(super) const MAPS: &str = r#"
    # Each rate-limited port's limit object, by way (`limits`).
    map sent { type ifname : limit; }
    map received { type ifname : limit; }
    set limited_sent { type ifname; flags dynamic; counter; size 65535; }
    set limited_received { type ifname; flags dynamic; counter; size 65535; }
"#;

/// The rules that drop a port's frames past its rate, counting them.
const SENT_BY_IN: &str = "limit name iifname map @sent update @limited_sent { iifname } drop";
const SENT_BY_OUT: &str = "limit name oifname map @sent update @limited_sent { oifname } drop";
const RECEIVED_BY_OUT: &str =
    "limit name oifname map @received update @limited_received { oifname } drop";
const RECEIVED_BY_IN: &str =
    "limit name iifname map @received update @limited_received { iifname } drop";

/// The bridge table's rule for what TAPs send: before anything else
/// judges a frame.
pub(super) const BRIDGE_SENT_RULE: &str = SENT_BY_IN;

/// The bridge table's chain for what TAPs receive.
pub(super) fn bridge_received_chain() -> String {
    format!(
        r#"
    # What leaves the bridge for a rate-limited TAP, past its rate.
    chain postrouting {{
        type filter hook postrouting priority filter; policy accept;
        {RECEIVED_BY_OUT}
    }}
"#
    )
}

/// One way's limit of one port: its object and its map element.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Limit<'a> {
    hook: Hook,
    way: Way,
    port: &'a str,
    rate: Rate,
}

impl Limit<'_> {
    /// `sent_lnt7_12500000_131072`: named by its rate too, so a new rate's
    /// object goes in beside the old one's in one transaction.
    fn object(&self) -> String {
        format!(
            "{}_{}_{}_{}",
            self.way.map(),
            self.port,
            self.rate.bytes_per_second(),
            self.rate.burst_bytes()
        )
    }

    /// `add limit …`: the object.
    pub(super) fn add_object(&self) -> String {
        format!(
            "add limit {} {TABLE} {} {{ rate over {} bytes/second burst {} bytes; }}",
            self.hook.family(),
            self.object(),
            self.rate.bytes_per_second(),
            self.rate.burst_bytes()
        )
    }

    pub(super) fn delete_object(&self) -> String {
        format!(
            "delete limit {} {TABLE} {}",
            self.hook.family(),
            self.object()
        )
    }
}

/// The map element: `bridge linnet sent { "lnt7" : "sent_lnt7_…" }`.
impl fmt::Display for Limit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {TABLE} {} {{ \"{}\" : \"{}\" }}",
            self.hook.family(),
            self.way.map(),
            self.port,
            self.object()
        )
    }
}

/// A port's limits, sent first.
pub(super) fn limits(port: &PortGuard) -> Vec<Limit<'_>> {
    [
        (Way::Sent, port.rate_limit.sent),
        (Way::Received, port.rate_limit.received),
    ]
    .into_iter()
    .filter_map(|(way, rate)| {
        Some(Limit {
            hook: port.hook,
            way,
            port: &port.tap,
            rate: rate?,
        })
    })
    .collect()
}

/// A macvtap's base chain that takes its frames, with its rules.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct HookChain {
    pub name: String,
    /// `egress` or `ingress`.
    pub hook: &'static str,
    pub device: String,
    pub rules: Vec<&'static str>,
}

pub(super) const EGRESS_PREFIX: &str = "port_";
pub(super) const INGRESS_PREFIX: &str = "in_";

/// The chains a macvtap is hooked by: at its egress, with anti-spoofing or
/// a rate limit (what its VM sends: over its rate, then the checks); at
/// its ingress, with a rate limit (what reaches its VM). The rules are the
/// same whatever the rates, so a new rate changes only elements.
pub(super) fn hook_chains(port: &PortGuard) -> Vec<HookChain> {
    if port.hook != Hook::Egress {
        return Vec::new();
    }
    let limited = !port.rate_limit.is_none();
    let mut out = Vec::new();
    if port.anti_spoofing || limited {
        let mut rules = vec![SENT_BY_OUT];
        if port.anti_spoofing {
            rules.push("jump guard");
        }
        out.push(HookChain {
            name: format!("{EGRESS_PREFIX}{}", port.tap),
            hook: "egress",
            device: port.tap.clone(),
            rules,
        });
    }
    if limited {
        out.push(HookChain {
            name: format!("{INGRESS_PREFIX}{}", port.tap),
            hook: "ingress",
            device: port.tap.clone(),
            rules: vec![RECEIVED_BY_IN],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::port;
    use super::*;
    use crate::rate::RateLimits;

    #[test]
    fn a_limit_is_an_object_named_by_its_rate_and_its_ports_element() {
        let mut p = port();
        p.rate_limit = RateLimits {
            received: Some("1gbit".parse().unwrap()),
            sent: Some("10mbit/1mb".parse().unwrap()),
        };
        let l = limits(&p);
        assert_eq!(l.len(), 2);
        assert_eq!(
            l[0].add_object(),
            "add limit bridge linnet sent_lnt0123456789ab_1250000_1000000 { rate over 1250000 bytes/second burst 1000000 bytes; }"
        );
        assert_eq!(
            l[0].to_string(),
            "bridge linnet sent { \"lnt0123456789ab\" : \"sent_lnt0123456789ab_1250000_1000000\" }"
        );
        assert_eq!(
            l[1].delete_object(),
            "delete limit bridge linnet received_lnt0123456789ab_125000000_2500000"
        );
        p.rate_limit.received = None;
        assert_eq!(limits(&p).len(), 1);
    }

    #[test]
    fn a_macvtap_is_hooked_at_egress_and_with_a_limit_at_ingress_too() {
        let mut p = port();
        assert!(hook_chains(&p).is_empty(), "a TAP is the bridge's");
        p.hook = Hook::Egress;
        let chains = hook_chains(&p);
        assert_eq!(chains.len(), 1);
        assert_eq!(chains[0].rules, [SENT_BY_OUT, "jump guard"]);
        p.anti_spoofing = false;
        assert!(hook_chains(&p).is_empty());
        p.rate_limit.received = Some("5mbit".parse().unwrap());
        let chains = hook_chains(&p);
        assert_eq!(
            chains
                .iter()
                .map(|c| (c.name.as_str(), c.hook, c.rules.len()))
                .collect::<Vec<_>>(),
            [
                ("port_lnt0123456789ab", "egress", 1),
                ("in_lnt0123456789ab", "ingress", 1)
            ]
        );
    }
}
