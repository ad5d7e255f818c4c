//! Secret rules in policies (`--secret NAME@HOST`, networks.yaml's
//! `policy.secrets`): the owner's rules are the VM's own; the network's
//! are set by the daemon alone, kept through a `policy set` where the
//! network enforces its policy, and only for hosts the VM reaches.

use super::*;
use crate::api::{PolicySetRequest, Response};
use crate::policy::{Policy, SecretRule};

const ENFORCED_SECRETS: &str = "networks:
  shared:
    allow: { users: [root, '1000', '1001'] }
    policy:
      egress: ['api.example.com:443/tcp', 'other.example.com:443/tcp']
      secrets: ['NET_TOKEN@api.example.com']
      enforced: true
";

const DEFAULT_SECRETS: &str = "networks:
  shared:
    allow: { users: [root, '1000', '1001'] }
    policy:
      egress: ['api.example.com:443/tcp']
      secrets: ['NET_TOKEN@api.example.com']
";

fn policy(egress: &[&str], secrets: &[&str], network_secrets: &[&str]) -> Policy {
    Policy {
        egress: egress.iter().map(|r| r.parse().unwrap()).collect(),
        secrets: rules(secrets),
        network_secrets: rules(network_secrets),
        ..Default::default()
    }
}

fn rules(rules: &[&str]) -> Vec<SecretRule> {
    rules.iter().map(|r| r.parse().unwrap()).collect()
}

fn attach(n: u8, policy: Policy) -> AttachRequest {
    AttachRequest {
        policy: Some(policy),
        ..request(n)
    }
}

#[tokio::test]
async fn a_networks_enforced_secret_rules_stay_and_no_owner_points_them_elsewhere() {
    let mut s = Scene::new(ENFORCED_SECRETS).await;
    let owner = user(1000, 1);
    let net = &["NET_TOKEN@api.example.com"];
    // The owner's rule is its own; the network's rides along.
    let asked = policy(
        &["api.example.com:443/tcp"],
        &["TOKEN@api.example.com"],
        &[],
    );
    let _vm1 = s.attach(&owner, attach(1, asked.clone())).await.unwrap();
    let got = &s.daemon.interfaces[&id(1)].policy;
    assert_eq!(
        *got,
        policy(
            &["api.example.com:443/tcp"],
            &["TOKEN@api.example.com"],
            net
        )
    );
    // A request that names network rules of its own has them replaced:
    // the network's secret goes nowhere the network did not say.
    let forged = policy(
        &["other.example.com:443/tcp", "api.example.com:443/tcp"],
        &[],
        &["NET_TOKEN@other.example.com"],
    );
    let _vm2 = s.attach(&owner, attach(2, forged)).await.unwrap();
    assert_eq!(
        s.daemon.interfaces[&id(2)].policy.network_secrets,
        rules(net)
    );
    // A VM that does not reach the network rule's host gets no such rule.
    let elsewhere = policy(&["other.example.com:443/tcp"], &[], &[]);
    let _vm3 = s
        .attach(&owner, attach(3, elsewhere.clone()))
        .await
        .unwrap();
    assert_eq!(s.daemon.interfaces[&id(3)].policy, elsewhere);

    // `policy set` without it, or naming another: the network's stays.
    let set = |policy| PolicySetRequest {
        network: "shared".into(),
        interface_id: Some(id(1)),
        name: None,
        policy,
        only: None,
    };
    let after = s
        .daemon
        .policy_set(&owner, set(policy(&["api.example.com:443/tcp"], &[], &[])))
        .expect("narrowed");
    let Response::Policy { policy: shown, .. } = after else {
        panic!("{after:?}")
    };
    assert_eq!(shown, policy(&["api.example.com:443/tcp"], &[], net));
    assert_eq!(s.daemon.interfaces[&id(1)].policy, shown);
    s.daemon
        .policy_set(
            &owner,
            set(policy(
                &["api.example.com:443/tcp"],
                &[],
                &["NET_TOKEN@evil.example"],
            )),
        )
        .expect("set");
    assert_eq!(
        s.daemon.interfaces[&id(1)].policy.network_secrets,
        rules(net)
    );
}

#[tokio::test]
async fn a_secret_rule_for_a_host_the_vm_cannot_reach_is_refused_before_anything_is_made() {
    let mut s = Scene::new(USERS).await;
    let owner = user(1000, 1);
    let links = s.linnet_links();
    for (asked, says) in [
        (
            policy(
                &["api.example.com:443/tcp"],
                &["TOKEN@other.example.com"],
                &[],
            ),
            "the secret rule TOKEN@other.example.com names a host the VM's connect rules do not let it reach by name on port 443/tcp: add --allow-connect other.example.com:443",
        ),
        (
            policy(&[], &["TOKEN@api.example.com"], &[]),
            "the secret rule TOKEN@api.example.com names a host",
        ),
        (
            policy(
                &["api.example.com:8443/tcp"],
                &["TOKEN@api.example.com"],
                &[],
            ),
            "add --allow-connect api.example.com:443",
        ),
    ] {
        let refused = s.refused(&owner, attach(1, asked.clone())).await;
        assert!(
            matches!(refused, DaemonError::PolicyImpossible { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains(says), "{asked:?}: {refused}");
        assert_eq!(s.linnet_links(), links, "nothing made for {asked:?}");
    }
    // The same rule with its host reached is attached (the control).
    let fine = policy(
        &["api.example.com:443/tcp"],
        &["TOKEN@api.example.com"],
        &[],
    );
    s.attach(&owner, attach(1, fine.clone())).await.unwrap();
    assert_eq!(s.daemon.interfaces[&id(1)].policy, fine);
}

#[tokio::test]
async fn where_the_network_does_not_enforce_its_secret_rules_come_with_its_policy_alone() {
    let mut s = Scene::new(DEFAULT_SECRETS).await;
    let owner = user(1000, 1);
    // Held: a VM's session ending detaches it.
    let _first = s.attach(&owner, request(1)).await.unwrap();
    assert_eq!(
        s.daemon.interfaces[&id(1)].policy,
        policy(
            &["api.example.com:443/tcp"],
            &[],
            &["NET_TOKEN@api.example.com"]
        ),
        "the network's policy, its secret rules with it"
    );
    // A policy of its own replaces the network's, secret rules and all.
    let own = policy(
        &["api.example.com:443/tcp"],
        &["TOKEN@api.example.com"],
        &[],
    );
    let _second = s.attach(&owner, attach(2, own.clone())).await.unwrap();
    assert_eq!(s.daemon.interfaces[&id(2)].policy, own);
    // Root drops the rule from networks.yaml and restarts: it is gone from
    // the VM that had it.
    s.yaml = DEFAULT_SECRETS.replace("      secrets: ['NET_TOKEN@api.example.com']\n", "");
    s.restart().await;
    assert_eq!(
        s.daemon.interfaces[&id(1)].policy,
        policy(&["api.example.com:443/tcp"], &[], &[])
    );
    assert_eq!(s.daemon.interfaces[&id(2)].policy, own, "its own kept");
}
