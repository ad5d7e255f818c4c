//! An attach as plain data: `plan` decides what the interface will be (its
//! lease, MAC, name, policy, whether it is guarded, its link settings)
//! from the request, the network and its leases, before the kernel is
//! touched; `Daemon::attach_on` then carries the plan out step by step,
//! recording each step in `Done`, and on a failure undoes exactly what was
//! done, newest first. The decisions are unit-tested here without a kernel.

use std::net::Ipv4Addr;

use super::guarding::port_guard;
use super::policies::no_address_for_policy;
use super::state::DaemonError;
use crate::api::AttachRequest;
use crate::config::NetworkConfig;
use crate::datapath::Datapath;
use crate::host::guard::PortGuard;
use crate::host::netlink::LinkSettings;
use crate::leases::{Claimant, LeaseTable};
use crate::policy::Policy;
use crate::types::{InterfaceId, MacAddr};

/// What an interface will be.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct AttachPlan {
    pub id: InterfaceId,
    pub mac: MacAddr,
    /// None on a network without DHCP and without a static lease for it.
    pub ip: Option<Ipv4Addr>,
    pub name: Option<String>,
    pub datapath: Datapath,
    pub policy: Policy,
    /// Anti-spoofing or isolation: guard entries before the port joins
    /// its bridge, and before the VM has its fd.
    pub guarded: bool,
    pub mtu: u32,
}

/// Decides an attach on `cfg`'s network and takes its lease in `leases`
/// (`Done::Lease` gives it back). Refused: the id or name is another
/// user's, the MAC another interface's, or a policy needs an address
/// linnet cannot know.
pub(super) fn plan(
    cfg: &NetworkConfig,
    leases: &mut LeaseTable,
    who: Claimant,
    id: InterfaceId,
    req: &AttachRequest,
    now: u64,
) -> Result<AttachPlan, DaemonError> {
    let policy = req.policy.clone().unwrap_or_else(|| cfg.policy.clone());
    // Without DHCP only a static lease gives an address linnet knows.
    let addressed = cfg.dhcp.enabled || leases.has_static(id, req.mac);
    if !addressed && !policy.is_open() {
        return Err(no_address_for_policy(&cfg.name));
    }
    let (mac, ip) = if addressed {
        let lease = leases.attach_for(who, id, req.mac, req.name.clone(), now)?;
        (lease.mac, Some(lease.ip))
    } else {
        leases.check_claim(who, id, req.name.as_deref(), now)?;
        (leases.attach_without_address(id, req.mac, now)?, None)
    };
    Ok(AttachPlan {
        id,
        mac,
        ip,
        name: req.name.clone(),
        datapath: req.datapath.unwrap_or_default(),
        policy,
        guarded: cfg.anti_spoofing || cfg.isolation,
        mtu: cfg.mtu,
    })
}

impl AttachPlan {
    /// The port's guard entries, once its TAP has a name.
    pub fn guard(&self, cfg: &NetworkConfig, tap: &str) -> PortGuard {
        port_guard(cfg, tap, (self.mac, self.ip), &self.policy)
    }

    /// The TAP's link settings: on `bridge`, unless guarded ports are held
    /// off their bridges (linnet's tables damaged), when a new one waits
    /// with them.
    pub fn link<'a>(&self, bridge: u32, ports_held: bool, alias: &'a str) -> LinkSettings<'a> {
        LinkSettings {
            master: (!(self.guarded && ports_held)).then_some(bridge),
            mtu: Some(self.mtu),
            alias: Some(alias),
            up: true,
        }
    }
}

/// A step of an attach that was carried out, and so is undone if a later
/// one fails.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Done {
    /// The lease was taken (undo: detach it, keeping the reservation).
    Lease,
    /// The TAP was made (undo: close its fd, and it goes; making it
    /// persistent for tap-name is the last step that can fail, so a TAP is
    /// never left behind persistent).
    Tap,
    /// The port's guard entries were added (undo: remove them).
    Guard(PortGuard),
}

/// The order in which the steps done are undone: newest first.
pub(super) fn undo_order(done: Vec<Done>) -> impl Iterator<Item = Done> {
    done.into_iter().rev()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::leases::LeaseError;

    fn network(yaml: &str) -> NetworkConfig {
        Config::from_yaml(yaml, "t.yaml")
            .unwrap()
            .network("shared")
            .unwrap()
            .clone()
    }

    fn id(n: u8) -> InterfaceId {
        InterfaceId::from_bytes([n; 16])
    }

    /// `yaml`'s `shared` network, and a plan for root's interface 1 on it.
    fn planned(yaml: &str) -> (NetworkConfig, LeaseTable, AttachPlan) {
        let cfg = network(yaml);
        let mut leases = LeaseTable::new(&cfg);
        let plan = plan(&cfg, &mut leases, 0.into(), id(1), &request(None), 0).unwrap();
        (cfg, leases, plan)
    }

    fn request(name: Option<&str>) -> AttachRequest {
        AttachRequest {
            name: name.map(String::from),
            ..AttachRequest::default()
        }
    }

    #[test]
    fn a_plan_takes_a_lease_and_says_what_the_interface_will_be() {
        let cfg = network("");
        let mut leases = LeaseTable::new(&cfg);
        let plan = plan(
            &cfg,
            &mut leases,
            1000.into(),
            id(1),
            &request(Some("web")),
            0,
        )
        .unwrap();
        assert_eq!(plan.ip, Some("192.168.105.2".parse().unwrap()));
        assert_eq!(
            (plan.name.as_deref(), plan.datapath),
            (Some("web"), Datapath::Tap)
        );
        assert!(plan.guarded, "anti-spoofing is on by default");
        assert_eq!(plan.mtu, 1500);
        // The same id gets the same MAC and address again.
        leases.detach(id(1), 1);
        let again = super::plan(
            &cfg,
            &mut leases,
            1000.into(),
            id(1),
            &request(Some("web")),
            2,
        )
        .unwrap();
        assert_eq!((again.mac, again.ip), (plan.mac, plan.ip));
        // Another user's VM cannot take its name while it is attached.
        let taken = super::plan(
            &cfg,
            &mut leases,
            1001.into(),
            id(2),
            &request(Some("WEB")),
            3,
        );
        assert!(
            matches!(taken, Err(DaemonError::Lease(LeaseError::NameTaken { .. }))),
            "{taken:?}"
        );
    }

    #[test]
    fn a_network_without_dhcp_plans_no_address_and_refuses_a_policy_it_cannot_hold() {
        let (cfg, mut leases, open) = planned("networks:\n  shared:\n    dhcp: false\n");
        assert_eq!(open.ip, None);
        let mut policed = request(None);
        policed.policy = Some(Policy {
            egress: vec!["10.0.0.0/8".parse().unwrap()],
            ingress: vec![],
        });
        let refused = plan(&cfg, &mut leases, 0.into(), id(2), &policed, 0).unwrap_err();
        assert!(refused.to_string().contains("has DHCP off"), "{refused}");
    }

    #[test]
    fn guard_entries_and_link_settings_follow_the_plan() {
        let (cfg, _, plan) = planned("networks:\n  shared:\n    isolation: true\n");
        let guard = plan.guard(&cfg, "lnt7");
        assert_eq!(
            (guard.tap.as_str(), guard.mac, guard.isolated),
            ("lnt7", plan.mac, true)
        );
        let on = plan.link(42, false, "alias");
        assert_eq!((on.master, on.mtu, on.up), (Some(42), Some(1500), true));
        assert_eq!(
            plan.link(42, true, "alias").master,
            None,
            "held off its bridge"
        );
        let (_, _, unguarded) = planned(
            "networks:
  shared:
    anti_spoofing: false
",
        );
        assert!(!unguarded.guarded);
        assert_eq!(
            unguarded.link(42, true, "a").master,
            Some(42),
            "only guarded ports wait"
        );
    }

    #[test]
    fn steps_are_undone_newest_first() {
        let (cfg, _, plan) = planned("");
        let guard = plan.guard(&cfg, "lnt0");
        let undone: Vec<Done> =
            undo_order(vec![Done::Lease, Done::Tap, Done::Guard(guard.clone())]).collect();
        assert_eq!(undone, vec![Done::Guard(guard), Done::Tap, Done::Lease]);
    }
}
