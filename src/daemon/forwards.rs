//! Port forwards of attached interfaces, as a part of the daemon: the
//! checks before one is taken (a clash with another forward, a socket
//! listening on the port, a privileged port, IPv6 on a network without
//! it), the firewall rules they become, the published ports a host service
//! listens on too, and the runtime forwards kept per interface id in the
//! state dir, so they come back when the interface attaches again, also
//! after a daemon restart. The requests that change them are
//! `requests::forward`.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{error, warn};

use super::errors::DaemonError;
use super::host_ports::HostPorts;
use super::interface::{Interface, Published};
use crate::api::ForwardOrigin;
use crate::config::NetworkConfig;
use crate::forward::PortForward;
use crate::host::firewall::ForwardRule;
use crate::host::listeners::{self, Listening};
use crate::leases::Claimant;
use crate::types::InterfaceId;

const UNPRIVILEGED_PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";

/// Another interface's forward, as the clash check sees it.
pub struct Holder<'a> {
    pub forward: &'a PortForward,
    pub interface: InterfaceId,
    pub name: Option<&'a str>,
    pub network: &'a str,
}

/// Why no port is published to a VM on a LAN.
fn lan_refusal(forward: &PortForward, net: &NetworkConfig) -> DaemonError {
    DaemonError::ForwardImpossible {
        network: net.name.clone(),
        why: format!(
            "{forward}: network \"{}\" is on a LAN, where its VMs are reached at their own addresses; ports are published from linnet's own networks (shared, host) only",
            net.name
        ),
    }
}

/// Refuses a forward that cannot work or would take what is not free.
pub fn check<'a>(
    forward: &PortForward,
    net: &NetworkConfig,
    uid: u32,
    mut held: impl Iterator<Item = Holder<'a>>,
) -> Result<(), DaemonError> {
    let port = format!("{}/{}", forward.host_port, forward.protocol.as_str());
    if net.own().is_none() {
        return Err(lan_refusal(forward, net));
    }
    if matches!(forward.host_addr, Some(IpAddr::V6(_))) && net.ipv6().is_none() {
        return Err(DaemonError::ForwardImpossible {
            network: net.name.clone(),
            why: format!(
                "{forward}: network \"{}\" has no IPv6, so nothing can be forwarded from an IPv6 address; use an IPv4 address or turn ipv6 on",
                net.name
            ),
        });
    }
    let first_unprivileged = std::fs::read_to_string(UNPRIVILEGED_PORT_START)
        .ok()
        .and_then(|t| t.trim().parse::<u16>().ok())
        .unwrap_or(1024);
    if uid != 0 && forward.host_port < first_unprivileged {
        return Err(DaemonError::PrivilegedPort {
            port,
            first: first_unprivileged,
        });
    }
    if let Some(h) = held.find(|h| h.forward.clashes_with(forward)) {
        return Err(DaemonError::PortForwarded {
            port,
            holder: h.interface,
            holder_name: h.name.map(String::from),
            network: h.network.into(),
            forward: *h.forward,
        });
    }
    if let Some(l) = listeners::on_port(forward.protocol, forward.host_port, forward.host_addr)
        .into_iter()
        .next()
    {
        return Err(DaemonError::PortBound {
            port,
            addr: l.addr.to_string(),
            // Which process holds it is for root's eyes only.
            owner: l.owner.filter(|_| uid == 0).map(|o| o.to_string()),
        });
    }
    Ok(())
}

/// Where in the state directory the kept forwards are saved.
pub(super) const FORWARDS_FILE: &str = "forwards.json";

/// The forwards' own state, which only this part changes: the runtime
/// forwards kept per interface id (on disk), and the published ports a host
/// service listens on too, with what was said about them.
#[derive(Default)]
pub(super) struct Forwards {
    store: Option<ForwardStore>,
    shadowed: BTreeMap<(InterfaceId, PortForward), (String, String)>,
}

impl Forwards {
    /// Reads the kept forwards (at start-up).
    pub fn open(&mut self, path: &Path) -> io::Result<()> {
        self.store = Some(ForwardStore::open(path)?);
        Ok(())
    }

    /// Looks for host services that started listening on a published port
    /// after it was published (the check at publish time cannot see them):
    /// the forward takes their connections from outside (and its owner's
    /// from the host), so that is said — once in the log, and for as long
    /// as it lasts in the network's warnings (`linnet ls`, the attach reply).
    pub fn check_shadowed(&mut self, interfaces: &BTreeMap<InterfaceId, Interface>) {
        if interfaces.values().all(|i| i.forwards.is_empty()) {
            self.shadowed.clear();
            return;
        }
        // One read of the tables per pass, and no look for the listener's
        // owner (a walk through every process's fds, which a local user
        // could make long): `ss -lnp` names it.
        let listening = Listening::read();
        let mut now = BTreeMap::new();
        for (id, iface) in interfaces {
            for p in &iface.forwards {
                let f = p.forward;
                let Some((addr, _)) = listening
                    .on_port(f.protocol, f.host_port, f.host_addr)
                    .next()
                else {
                    continue;
                };
                if let Some(known) = self.shadowed.get(&(*id, f)) {
                    now.insert((*id, f), known.clone());
                    continue;
                }
                let local = if iface.uid == 0 {
                    "every local user's"
                } else {
                    "its owner's local"
                };
                let text = format!(
                    "host port {} is published to interface {id} but a host service now listens on {addr} (`ss -lnp` names it): connections from outside, and {local} connections, go to the VM, not to the service; `linnet forward rm` gives the port back",
                    f.host_port
                );
                warn!(network = %iface.network, "{text}");
                now.insert((*id, f), (iface.network.clone(), text));
            }
        }
        self.shadowed = now;
    }

    /// What `check_shadowed` found on `network`.
    pub fn shadow_warnings(&self, network: &str) -> Vec<String> {
        self.shadowed
            .values()
            .filter(|(n, _)| n == network)
            .map(|(_, text)| text.clone())
            .collect()
    }

    /// The forwards kept for interface `id` on `network`, if `who` may
    /// have them.
    pub fn kept_for(&mut self, id: InterfaceId, network: &str, who: Claimant) -> Vec<PortForward> {
        self.store().get(id, network, who)
    }

    /// Keeps `forward` for interface `id` (of `owner`) past its detach.
    pub fn keep(
        &mut self,
        id: InterfaceId,
        network: &str,
        owner: u32,
        forward: PortForward,
    ) -> io::Result<()> {
        self.store().add(id, network, owner, forward)
    }

    /// No longer keeps `forward` for interface `id`; whether it was kept.
    pub fn forget(
        &mut self,
        id: InterfaceId,
        network: &str,
        forward: &PortForward,
    ) -> io::Result<bool> {
        self.store().remove(id, network, forward)
    }

    fn store(&mut self) -> &mut ForwardStore {
        self.store
            .as_mut()
            .expect("reconcile opens the forward store")
    }
}

/// Runtime forwards by interface id: `<state>/forwards.json`.
pub struct ForwardStore {
    path: PathBuf,
    saved: BTreeMap<InterfaceId, Saved>,
}

/// An interface id's kept forwards. Interface ids are chosen by clients and
/// shown by `ls`, so they are no secret: the forwards come back only to the
/// uid that had the interface when they were added (or to root).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Saved {
    network: String,
    owner_uid: u32,
    forwards: Vec<PortForward>,
}

impl ForwardStore {
    /// Reads the store; none yet is an empty one. An unreadable one is
    /// moved aside (the forwards in it are lost, the VMs' networks are not).
    pub fn open(path: &Path) -> io::Result<ForwardStore> {
        let saved = match std::fs::read(path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(saved) => saved,
                Err(e) => {
                    let aside = crate::files::move_aside(path)?;
                    error!(
                        "{}: {e}; moved to {}, starting without kept forwards",
                        path.display(),
                        aside.display()
                    );
                    BTreeMap::new()
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        };
        Ok(ForwardStore {
            path: path.to_path_buf(),
            saved,
        })
    }

    /// The kept forwards of `id` on `network`, for `who` (a uid, or a
    /// `Claimant`: root has them all).
    pub fn get(
        &self,
        id: InterfaceId,
        network: &str,
        who: impl Into<Claimant>,
    ) -> Vec<PortForward> {
        let who = who.into();
        self.saved
            .get(&id)
            .filter(|s| s.network == network && (who.overrides || who.uid == s.owner_uid))
            .map(|s| s.forwards.clone())
            .unwrap_or_default()
    }

    /// Keeps `forward` for `id`, whose interface `owner_uid` attached.
    pub fn add(
        &mut self,
        id: InterfaceId,
        network: &str,
        owner_uid: u32,
        forward: PortForward,
    ) -> io::Result<()> {
        let fresh = || Saved {
            network: network.into(),
            owner_uid,
            forwards: Vec::new(),
        };
        let entry = self.saved.entry(id).or_insert_with(fresh);
        if entry.network != network || entry.owner_uid != owner_uid {
            // The id is someone else's now, or on another network: what
            // it had before is moot.
            *entry = fresh();
        }
        entry.forwards.push(forward);
        self.save()
    }

    /// Removes `forward` of `id` on `network`; whether it was there.
    pub fn remove(
        &mut self,
        id: InterfaceId,
        network: &str,
        forward: &PortForward,
    ) -> io::Result<bool> {
        let Some(entry) = self.saved.get_mut(&id).filter(|s| s.network == network) else {
            return Ok(false);
        };
        let before = entry.forwards.len();
        entry.forwards.retain(|f| f != forward);
        let removed = entry.forwards.len() != before;
        if entry.forwards.is_empty() {
            self.saved.remove(&id);
        }
        if removed {
            self.save()?;
        }
        Ok(removed)
    }

    fn save(&self) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(&self.saved).map_err(io::Error::other)?;
        crate::files::write_atomically(&self.path, &bytes)
    }
}

/// The DNAT targets of a network's forwards.
pub(super) fn rules<'a>(
    cfg: &NetworkConfig,
    interfaces: impl Iterator<Item = &'a Interface>,
) -> Vec<ForwardRule> {
    interfaces
        .filter(|i| i.network == cfg.name)
        .filter_map(|i| Some((i, i.ip?)))
        .flat_map(|(i, guest)| {
            let guest6 = i.ipv6_address(cfg);
            i.forwards.iter().map(move |p| ForwardRule {
                forward: p.forward,
                guest,
                guest6,
                // By the VM's owner, config forwards too: a name in the
                // config is taken by whoever attaches under it first.
                local_uid: (i.uid != 0).then_some(i.uid),
            })
        })
        .collect()
}

/// Checks `forward` (on `cfg`'s network, for `uid`) and gives it to
/// interface `id` (the firewall is not updated here).
pub(super) fn take(
    interfaces: &mut BTreeMap<InterfaceId, Interface>,
    cfg: &NetworkConfig,
    host_ports: Option<&mut HostPorts>,
    (id, forward, origin): (InterfaceId, PortForward, ForwardOrigin),
    uid: u32,
) -> Result<(), DaemonError> {
    let iface = &interfaces[&id];
    if cfg.own().is_none() {
        return Err(lan_refusal(&forward, cfg));
    }
    if iface.ip.is_none() {
        return Err(DaemonError::ForwardImpossible {
            network: cfg.name.clone(),
            why: format!(
                "interface {id} has no IPv4 address linnet knows (network \"{}\" has dhcp off): give it a static lease (dhcp.static with its interface_id or MAC) to publish ports",
                cfg.name
            ),
        });
    }
    let held = interfaces.iter().flat_map(|(other, i)| {
        i.forwards.iter().map(move |p| Holder {
            forward: &p.forward,
            interface: *other,
            name: i.name.as_deref(),
            network: &i.network,
        })
    });
    check(&forward, cfg, uid, held)?;
    if let Some(ports) = host_ports {
        ports.reserve(&forward)?;
    }
    let iface = interfaces.get_mut(&id).expect("attached");
    iface.forwards.push(Published { forward, origin });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn fwd(s: &str) -> PortForward {
        s.parse().unwrap()
    }

    #[test]
    fn store_keeps_runtime_forwards_per_interface_and_network() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("forwards.json");
        let id = InterfaceId::from_bytes([7; 16]);
        let mut store = ForwardStore::open(&path).unwrap();
        store.add(id, "shared", 1000, fwd("8080:80")).unwrap();
        store.add(id, "shared", 1000, fwd("5353:53/udp")).unwrap();
        let store = ForwardStore::open(&path).unwrap();
        assert_eq!(
            store.get(id, "shared", 1000),
            vec![fwd("8080:80"), fwd("5353:53/udp")]
        );
        assert_eq!(store.get(id, "shared", 0).len(), 2, "root may have them");
        let relay = Claimant {
            uid: 0,
            overrides: false,
        };
        assert!(
            store.get(id, "shared", relay).is_empty(),
            "not a relay of root's network socket connection"
        );
        assert!(
            store.get(id, "shared", 1001).is_empty(),
            "another user attaching with the id gets none"
        );
        assert!(
            store.get(id, "host", 1000).is_empty(),
            "only on its network"
        );
        let mut store = store;
        assert!(store.remove(id, "shared", &fwd("8080:80/tcp")).unwrap());
        assert!(!store.remove(id, "shared", &fwd("8080:80")).unwrap());
        assert_eq!(
            ForwardStore::open(&path).unwrap().get(id, "shared", 1000),
            vec![fwd("5353:53/udp")]
        );
        std::fs::write(&path, "{not json").unwrap();
        let store = ForwardStore::open(&path).unwrap();
        assert!(store.get(id, "shared", 1000).is_empty());
        let aside = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("forwards.json.broken-")
            });
        assert!(aside, "a broken store is moved aside, not fatal");
    }

    #[test]
    fn checks_name_the_holder_and_the_limit() {
        let cfg = Config::from_yaml("networks:\n  host:\n    ipv6: false\n", "t").unwrap();
        let shared = cfg.network("shared").unwrap();
        let other = InterfaceId::from_bytes([9; 16]);
        let held = fwd("8080:80");
        let holders = || {
            std::iter::once(Holder {
                forward: &held,
                interface: other,
                name: Some("web"),
                network: "shared",
            })
        };
        let e = check(&fwd("8080:81"), shared, 0, holders()).unwrap_err();
        assert!(
            matches!(&e, DaemonError::PortForwarded { holder, holder_name: Some(n), .. } if *holder == other && n == "web"),
            "{e:?}"
        );
        assert!(
            e.to_string().contains(&format!(
                "host port 8080/tcp is already forwarded to interface {other} (web)"
            )),
            "{e}"
        );
        assert!(check(&fwd("8080:81/udp"), shared, 0, holders()).is_ok());
        let e = check(&fwd("80:80"), shared, 1000, std::iter::empty()).unwrap_err();
        assert!(
            matches!(&e, DaemonError::PrivilegedPort { port, .. } if port == "80/tcp"),
            "{e:?}"
        );
        let e = check(
            &fwd("[2001:db8::1]:8080:80"),
            cfg.network("host").unwrap(),
            0,
            std::iter::empty(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("network \"host\" has no IPv6"),
            "{e}"
        );
        let busy = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = busy.local_addr().unwrap().port();
        let e = check(
            &fwd(&format!("{port}:53/udp")),
            shared,
            0,
            std::iter::empty(),
        )
        .unwrap_err();
        assert!(
            matches!(&e, DaemonError::PortBound { addr, .. } if *addr == format!("127.0.0.1:{port}")),
            "{e:?}"
        );
        assert!(
            e.to_string().contains(&format!(
                "already bound by a listening socket on 127.0.0.1:{port}"
            )),
            "{e}"
        );
    }
}
