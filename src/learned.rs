//! What a VM with names in its policy learned from linnet's DNS: each
//! address an allowed answer gave it, for which name, until when. The
//! firewall lets the VM connect to an address while it is learned, on the
//! ports of the rules that allowed the name (one set per `Reach` of the
//! policy: `Policy::name_reaches`; and with secret rules one more, of the
//! addresses of their hosts: `Policy::steered`); the kernel expires each element on
//! its own, and this is the daemon's account of the same, to show, to
//! rebuild the table from, and to forget names a new policy no longer
//! allows.
//!
//! Plain data: the DNS forwarder learns through `services::name_gate`,
//! which puts the elements this returns into the kernel before the answer
//! is released.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hickory_proto::rr::Name;
use serde::{Deserialize, Serialize};

use crate::names;
use crate::policy::Policy;

/// How long a learned address stays: the answer's TTL, at least `floor`,
/// at most `ceiling` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtlBounds {
    pub floor: u32,
    pub ceiling: u32,
}

/// The defaults. A floor of a minute: resolvers and runtimes reuse an
/// answer a little past its TTL (the JVM caches 30 s, browsers about a
/// minute, happy eyeballs retries the other family), and CDNs answer with
/// TTLs of 0 to 60 s; a shorter floor would refuse those connections. A
/// ceiling of an hour: how long an address a name no longer has stays
/// reachable. Answers reach the VM with their TTLs cut to the ceiling, so
/// its cache never outlives its rule.
pub const DEFAULT_TTL: TtlBounds = TtlBounds {
    floor: 60,
    ceiling: 3600,
};

impl TtlBounds {
    pub fn clamp(&self, ttl: u32) -> u32 {
        ttl.clamp(self.floor, self.ceiling)
    }
}

/// The most (name, address) pairs one VM holds: past them an answer's new
/// addresses are not learned (and not reachable) until others expire, so
/// a zone that answers with ever new addresses cannot grow a VM's sets,
/// and the table every rebuild carries, without bound.
pub const MAX_LEARNED: usize = 4096;

/// One address in one of the firewall's sets of a VM, with the seconds it
/// has left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Element {
    /// Index into the policy's learned sets (`Policy::sets_of`: its
    /// `name_reaches`, then the steered set).
    pub reach: usize,
    pub addr: IpAddr,
    pub seconds: u32,
}

/// An address learned for a name, as `linnet policy show` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LearnedAddress {
    /// The name the VM asked for; None for an address found in the
    /// kernel's sets after a daemon restart (the sets keep no names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub address: IpAddr,
    /// Seconds until it expires.
    pub expires_in: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// Unix seconds.
    expires: u64,
    /// The reaches the name opens under the current policy.
    reaches: Vec<usize>,
}

/// One VM's learned addresses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Learned {
    /// (name asked, normalised; address) → entry.
    entries: BTreeMap<(Name, IpAddr), Entry>,
    /// Found in the kernel after a restart: (reach, address) → expiry.
    restored: BTreeMap<(usize, IpAddr), u64>,
    /// Addresses not learned because the VM held MAX_LEARNED.
    pub over_limit: u64,
}

impl Learned {
    /// Learns the addresses of an answer to a query for `name` (each with
    /// its TTL) at `now` (unix seconds): the elements to put into the
    /// firewall's sets, each with its whole lifetime (the longest of what
    /// it had and what it gets). Nothing when the policy allows no such
    /// name.
    pub fn learn(
        &mut self,
        policy: &Policy,
        name: &Name,
        answers: &[(IpAddr, u32)],
        bounds: TtlBounds,
        now: u64,
    ) -> Vec<Element> {
        let reaches = policy.sets_of(name);
        if reaches.is_empty() {
            return Vec::new();
        }
        let name = names::normalise(name);
        self.expire(now);
        let mut out = Vec::new();
        for &(addr, ttl) in answers {
            let expires = now + u64::from(bounds.clamp(ttl));
            let key = (name.clone(), addr);
            if !self.entries.contains_key(&key) && self.entries.len() >= MAX_LEARNED {
                self.over_limit += 1;
                continue;
            }
            let entry = self.entries.entry(key).or_insert_with(|| Entry {
                expires,
                reaches: reaches.clone(),
            });
            entry.expires = entry.expires.max(expires);
            for &reach in &reaches {
                if let Some(seconds) = self.left(reach, addr, now) {
                    out.push(Element {
                        reach,
                        addr,
                        seconds,
                    });
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The seconds `addr` has left in reach `reach`'s set: as long as its
    /// longest-lived name there (or what came back after a restart).
    fn left(&self, reach: usize, addr: IpAddr, now: u64) -> Option<u32> {
        let named = (self.entries.iter())
            .filter(|((_, a), e)| *a == addr && e.reaches.contains(&reach))
            .map(|(_, e)| e.expires);
        let expires = named
            .chain(self.restored.get(&(reach, addr)).copied())
            .max()?;
        (expires > now).then(|| u32::try_from(expires - now).unwrap_or(u32::MAX))
    }

    /// Forgets what expired by `now`.
    pub fn expire(&mut self, now: u64) {
        self.entries.retain(|_, e| e.expires > now);
        self.restored.retain(|_, expires| *expires > now);
    }

    /// Keeps what `policy` still allows (after `policy set`), with the
    /// reaches it now opens. What came back from the kernel after a
    /// restart has no name to check, and goes: the VM asks again.
    pub fn follow(&mut self, policy: &Policy) {
        self.restored.clear();
        self.entries.retain(|(name, _), entry| {
            entry.reaches = policy.sets_of(name);
            !entry.reaches.is_empty()
        });
    }

    /// Takes back an element found in the kernel's sets after a restart.
    pub fn restore(&mut self, element: Element, now: u64) {
        let expires = now + u64::from(element.seconds);
        let at = self
            .restored
            .entry((element.reach, element.addr))
            .or_insert(expires);
        *at = (*at).max(expires);
    }

    /// Every element of the VM's sets at `now`: an address in a reach's
    /// set for as long as its longest-lived name there.
    pub fn elements(&self, now: u64) -> Vec<Element> {
        let mut longest: BTreeMap<(usize, IpAddr), u64> = BTreeMap::new();
        let named = self.entries.iter().flat_map(|((_, addr), entry)| {
            entry
                .reaches
                .iter()
                .map(move |&r| ((r, *addr), entry.expires))
        });
        let restored = self.restored.iter().map(|(&key, &at)| (key, at));
        for (key, expires) in named.chain(restored) {
            let at = longest.entry(key).or_insert(expires);
            *at = (*at).max(expires);
        }
        longest
            .into_iter()
            .filter(|(_, expires)| *expires > now)
            .map(|((reach, addr), expires)| Element {
                reach,
                addr,
                seconds: u32::try_from(expires - now).unwrap_or(u32::MAX),
            })
            .collect()
    }

    /// What it holds at `now`, for `linnet policy show`.
    pub fn shown(&self, now: u64) -> Vec<LearnedAddress> {
        let named = self.entries.iter().map(|((name, addr), e)| LearnedAddress {
            name: Some(names::shown(name)),
            address: *addr,
            expires_in: e.expires.saturating_sub(now),
        });
        let restored = self
            .restored
            .iter()
            .map(|(&(_, addr), &at)| LearnedAddress {
                name: None,
                address: addr,
                expires_in: at.saturating_sub(now),
            });
        let mut out: Vec<LearnedAddress> =
            named.chain(restored).filter(|l| l.expires_in > 0).collect();
        out.dedup();
        out
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.restored.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rules: &[&str]) -> Policy {
        Policy {
            egress: rules.iter().map(|r| r.parse().unwrap()).collect(),
            ingress: vec![],
            ..Default::default()
        }
    }

    fn name(s: &str) -> Name {
        Name::from_utf8(s).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const BOUNDS: TtlBounds = TtlBounds {
        floor: 5,
        ceiling: 100,
    };

    #[test]
    fn an_allowed_answer_is_learned_for_its_reaches_within_the_bounds() {
        let p = policy(&["allowed.test:8080/tcp", "*.svc.test:8080/tcp", "*.test:53"]);
        let mut l = Learned::default();
        let got = l.learn(
            &p,
            &name("Allowed.TEST."),
            &[(ip("192.0.2.1"), 3), (ip("2001:db8::1"), 1000)],
            BOUNDS,
            1000,
        );
        assert_eq!(
            got,
            vec![
                Element {
                    reach: 0,
                    addr: ip("192.0.2.1"),
                    seconds: 5
                },
                Element {
                    reach: 0,
                    addr: ip("2001:db8::1"),
                    seconds: 100
                },
                Element {
                    reach: 1,
                    addr: ip("192.0.2.1"),
                    seconds: 5
                },
                Element {
                    reach: 1,
                    addr: ip("2001:db8::1"),
                    seconds: 100
                },
            ],
            "the floor and the ceiling; both rules' sets"
        );
        assert!(
            l.learn(
                &p,
                &name("other.example"),
                &[(ip("192.0.2.9"), 60)],
                BOUNDS,
                1000
            )
            .is_empty()
        );
        assert_eq!(l.shown(1000).len(), 2);
        assert_eq!(l.shown(1000)[0].name.as_deref(), Some("allowed.test"));
    }

    #[test]
    fn asking_again_extends_never_shortens_and_entries_expire() {
        let p = policy(&["a.test:443"]);
        let mut l = Learned::default();
        l.learn(&p, &name("a.test"), &[(ip("192.0.2.1"), 50)], BOUNDS, 1000);
        let again = l.learn(&p, &name("a.test"), &[(ip("192.0.2.1"), 10)], BOUNDS, 1020);
        assert_eq!(again[0].seconds, 30, "what it had left: 1050 - 1020");
        let longer = l.learn(&p, &name("a.test"), &[(ip("192.0.2.1"), 90)], BOUNDS, 1030);
        assert_eq!(longer[0].seconds, 90);
        assert_eq!(l.elements(1119).len(), 1);
        assert!(l.elements(1120).is_empty(), "expired at 1120");
        l.expire(1120);
        assert!(l.is_empty());
    }

    #[test]
    fn an_address_two_names_share_lives_as_long_as_the_longer() {
        let p = policy(&["a.test:443", "b.test:443"]);
        let mut l = Learned::default();
        l.learn(&p, &name("a.test"), &[(ip("192.0.2.1"), 10)], BOUNDS, 0);
        l.learn(&p, &name("b.test"), &[(ip("192.0.2.1"), 80)], BOUNDS, 0);
        assert_eq!(
            l.elements(0),
            vec![Element {
                reach: 0,
                addr: ip("192.0.2.1"),
                seconds: 80
            }]
        );
        // The new policy no longer allows b.test: a.test's lifetime is left.
        l.follow(&policy(&["a.test:443"]));
        assert_eq!(l.elements(0)[0].seconds, 10);
        l.follow(&policy(&["c.test:443"]));
        assert!(l.is_empty(), "a.test went too");
    }

    #[test]
    fn a_new_policy_moves_names_to_its_reaches() {
        let mut l = Learned::default();
        l.learn(
            &policy(&["a.test:443"]),
            &name("a.test"),
            &[(ip("192.0.2.1"), 60)],
            BOUNDS,
            0,
        );
        l.follow(&policy(&["x.test:22", "a.test:8443"]));
        assert_eq!(
            l.elements(0)[0].reach,
            1,
            "a.test now opens 8443, the second reach"
        );
    }

    #[test]
    fn a_vm_holds_at_most_max_learned_and_asking_again_still_extends() {
        let p = policy(&["*.test:443"]);
        let mut l = Learned::default();
        let many: Vec<(IpAddr, u32)> = (0..MAX_LEARNED as u32 + 10)
            .map(|i| (IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)), 60))
            .collect();
        let got = l.learn(&p, &name("big.test"), &many, BOUNDS, 0);
        assert_eq!(got.len(), MAX_LEARNED);
        assert_eq!(l.over_limit, 10);
        let again = l.learn(
            &p,
            &name("big.test"),
            &many[..1],
            TtlBounds {
                floor: 90,
                ceiling: 100,
            },
            0,
        );
        assert_eq!(again[0].seconds, 90, "one it holds is still extended");
        l.expire(100);
        assert_eq!(
            l.learn(&p, &name("new.test"), &many[..1], BOUNDS, 100)
                .len(),
            1,
            "room again"
        );
    }

    #[test]
    fn restored_elements_live_until_their_expiry_and_go_with_a_new_policy() {
        let mut l = Learned::default();
        let e = Element {
            reach: 2,
            addr: ip("192.0.2.7"),
            seconds: 40,
        };
        l.restore(e, 100);
        assert_eq!(l.elements(110), vec![Element { seconds: 30, ..e }]);
        assert_eq!(l.shown(110)[0].name, None);
        l.follow(&policy(&["a.test"]));
        assert!(l.is_empty());
    }
}
