//! A connected client, as the kernel identified it, and what it may do as
//! whom: the claimant of leases and forwards, the holder of what it
//! attaches.

use super::holder::Holder;
use crate::api::{AttachRequest, Request};
use crate::config::{Allow, DEFAULT_NETWORK};
use crate::datapath::Datapath;
use crate::host::process::Process;
use crate::leases::Claimant;

/// A connected client, as the kernel identified it (SO_PEERCRED).
#[derive(Debug, Clone)]
pub struct Client {
    pub id: u64,
    pub pid: Option<i32>,
    pub uid: u32,
    pub gid: u32,
    /// The account its budgets are charged to, and whose groups it has
    /// (`host::accounts`): its uid's, a subordinate uid's owner's, or its
    /// user namespace's owner's.
    pub account: u32,
    /// The groups the group database gives `account` (not the process's
    /// inherited supplementary groups).
    pub groups: Vec<u32>,
    /// Its process as it was when it connected (pid and start time), which
    /// a next daemon checks is still there.
    pub process: Option<Process>,
    /// The network whose socket the client came in on (through the relay
    /// the daemon started for it): it may attach one stream interface
    /// there and nothing else.
    pub network_socket: Option<String>,
}

impl Client {
    /// Ok when `cfg`'s network lets it on (`allowed_by`); else the refusal
    /// naming who may.
    pub fn may_use(
        &self,
        cfg: &crate::config::NetworkConfig,
    ) -> Result<(), super::errors::DaemonError> {
        if self.allowed_by(&cfg.allow) {
            return Ok(());
        }
        Err(super::errors::DaemonError::NotAllowed {
            uid: self.uid,
            network: cfg.name.clone(),
            allow: cfg.allow.describe(),
        })
    }

    /// Whether `allow` lets it on a network: its uid or its account named
    /// there, or its account a member of a group named there.
    pub fn allowed_by(&self, allow: &Allow) -> bool {
        allow.permits(self.uid, &self.groups) || allow.permits(self.account, &[])
    }

    /// Who the client claims leases and kept forwards as. Root's say over
    /// other users' interface ids, names and forwards is not for a network
    /// socket's relay, even one of root's: its interface id follows from
    /// the MAC the guest chose, and a guest may choose any.
    pub fn claimant(&self) -> Claimant {
        Claimant {
            uid: self.uid,
            overrides: self.uid == 0 && self.network_socket.is_none(),
        }
    }

    /// What holds an interface this client attaches (`keep`: none, past
    /// its connection).
    pub(super) fn holder(&self, keep: bool) -> Holder {
        match (keep, &self.network_socket) {
            (true, _) => Holder::Kept {
                rx: 0,
                since: std::time::Instant::now(),
            },
            (false, Some(_)) => Holder::NetworkSocket {
                connection: self.id,
                process: self.process,
            },
            (false, None) => Holder::Client {
                connection: self.id,
                process: self.process,
            },
        }
    }
}

/// What the API connection of a network socket's relay may ask: its VM's
/// port and what any local user may see; no forwards or policies (a relay
/// runs as its VM's user, or for root's VM as a uid of its own).
pub fn relay_may(request: &Request) -> bool {
    matches!(
        request,
        Request::Attach(_) | Request::Counters { .. } | Request::Detach { .. } | Request::List
    )
}

/// Why the relay of a connection to `bound`'s socket may not make this
/// attach, if it may not: one stream interface on its network, with its
/// VM's MAC and the id that follows from it, and nothing else.
pub fn attach_refusal(bound: &str, req: &AttachRequest) -> Option<String> {
    let network = req.network.as_deref().unwrap_or(DEFAULT_NETWORK);
    if network != bound {
        return Some(format!("may not attach to network \"{network}\""));
    }
    if req.datapath != Some(Datapath::Stream)
        || !req.publish.is_empty()
        || req.name.is_some()
        || req.policy.is_some()
        || req.clone_of.is_some()
    {
        return Some(
            "attaches only its stream interface, with no name, published ports, policy or clone"
                .into(),
        );
    }
    if req.mac.is_none() {
        return Some("attaches with its VM's MAC".into());
    }
    // The daemon gives the id, from the MAC and the owner
    // (`types::socket_interface_id`): a VM coming back takes up its lease,
    // and no relay picks another's id.
    if req.interface_id.is_some() {
        return Some("attaches with the id the daemon gives it, not one of its own".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_may_attach_report_detach_and_list_only() {
        let parse = |json: &str| serde_json::from_str::<Request>(json).unwrap();
        for allowed in [
            r#"{"op": "attach", "network": "shared", "datapath": "stream"}"#,
            r#"{"op": "detach", "interface_id": "11111111-2222-4333-8444-555555555555"}"#,
            r#"{"op": "list"}"#,
        ] {
            assert!(relay_may(&parse(allowed)), "{allowed}");
        }
        assert!(relay_may(&Request::Counters {
            interface_id: crate::types::InterfaceId::new_v4(),
            counters: Default::default(),
        }));
        for refused in [
            r#"{"op": "forward_add", "network": "shared", "name": "web", "forward": "8080:80"}"#,
            r#"{"op": "forward_remove", "network": "shared", "name": "web", "forward": "8080:80"}"#,
            r#"{"op": "policy_set", "network": "shared", "name": "web", "policy": {}}"#,
            r#"{"op": "forward_list"}"#,
            r#"{"op": "doctor"}"#,
        ] {
            assert!(!relay_may(&parse(refused)), "{refused}");
        }
    }

    #[test]
    fn a_relay_attaches_its_vm_by_its_mac_and_nothing_more() {
        let mac: crate::types::MacAddr = "52:55:55:00:00:01".parse().unwrap();
        let good = AttachRequest {
            network: Some("shared".into()),
            interface_id: None,
            mac: Some(mac),
            datapath: Some(Datapath::Stream),
            ..AttachRequest::default()
        };
        assert_eq!(attach_refusal("shared", &good), None);
        let refusal = |req: AttachRequest| attach_refusal("shared", &req).unwrap();
        assert!(
            refusal(AttachRequest {
                network: Some("host".into()),
                ..good.clone()
            })
            .contains("may not attach to network \"host\"")
        );
        // No network is the default one, which is this one.
        assert_eq!(
            attach_refusal(
                "shared",
                &AttachRequest {
                    network: None,
                    ..good.clone()
                }
            ),
            None
        );
        for bad in [
            AttachRequest {
                datapath: Some(Datapath::Tap),
                ..good.clone()
            },
            AttachRequest {
                name: Some("web".into()),
                ..good.clone()
            },
            AttachRequest {
                publish: vec!["8080:80".parse().unwrap()],
                ..good.clone()
            },
            AttachRequest {
                policy: Some(Default::default()),
                ..good.clone()
            },
        ] {
            assert!(refusal(bad).starts_with("attaches only its stream interface"));
        }
        assert_eq!(
            refusal(AttachRequest {
                mac: None,
                ..good.clone()
            }),
            "attaches with its VM's MAC"
        );
        // Any id of its own: another VM's, or a made-up one.
        let other: crate::types::MacAddr = "52:55:55:00:00:02".parse().unwrap();
        for id in [
            crate::types::socket_interface_id("shared", other, 1000),
            crate::types::InterfaceId::new_v4(),
        ] {
            assert!(
                refusal(AttachRequest {
                    interface_id: Some(id),
                    ..good.clone()
                })
                .starts_with("attaches with the id the daemon gives it")
            );
        }
    }
}
