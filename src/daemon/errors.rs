//! The daemon's errors: what was refused or failed, rendered to the API's
//! kind and message in one place (`into_response`).

use thiserror::Error;

use crate::api::{ErrorKind, Response};
use crate::config::{Config, Mode};
use crate::forward::PortForward;
use crate::host::clone_ns::CloneNsError;
use crate::host::netlink::NetlinkError;
use crate::host::nft::NftError;
use crate::host::tap::TapError;
use crate::leases::LeaseError;
use crate::secrets::SecretError;
use crate::services::ServiceError;
use crate::types::{InterfaceId, MacAddr, NameError};

#[derive(Debug, Error)]
pub enum DaemonError {
    /// The interface's name is no DNS label.
    #[error(transparent)]
    BadName(#[from] NameError),
    #[error("{mac} is a multicast MAC; a VM's must be unicast")]
    MulticastMac { mac: MacAddr },
    /// A universally administered MAC asked for on a LAN.
    #[error(
        "network \"{network}\" is on a LAN, where a VM takes a locally administered MAC (the second-lowest bit of the first byte set, as QEMU's 52:54:00:…): {mac} is a vendor's, maybe another host's on the LAN; leave --mac out or choose a locally administered one"
    )]
    VendorMac { network: String, mac: MacAddr },
    /// A request names an interface by both its id and its name, or by
    /// neither.
    #[error("name the interface with exactly one of --interface-id and --name")]
    WhichInterface,
    /// A wait for an address on a connection that holds interfaces.
    #[error("wait for an address on a connection of its own, not the one that holds interfaces")]
    WaitHolds,
    #[error("unknown network \"{name}\"; known networks: {known} (add it to {file})")]
    UnknownNetwork {
        name: String,
        known: String,
        file: String,
    },
    #[error(
        "uid {uid} may not attach to network \"{network}\": it allows {allow}; add the user to networks.{network}.allow or to one of those groups"
    )]
    NotAllowed {
        uid: u32,
        network: String,
        allow: String,
    },
    /// The name is another interface's on the network.
    #[error(
        "network \"{network}\": the name \"{name}\" is held by interface {holder} of uid {uid}; choose another --name"
    )]
    NameHeld {
        network: String,
        name: String,
        holder: InterfaceId,
        uid: u32,
    },
    /// The interface id is attached already.
    #[error(
        "interface {id} is already attached to network \"{network}\" by pid {}; detach it first or use another --interface-id",
        shown_pid(*pid)
    )]
    Attached {
        id: InterfaceId,
        network: String,
        pid: Option<i32>,
    },
    /// Another user's interface: only its user or root may `what` it.
    #[error("interface {id} belongs to uid {owner}; only it or root may {what}")]
    NotOwner {
        id: InterfaceId,
        owner: u32,
        what: &'static str,
    },
    /// Held by another client's connection, which alone detaches it.
    #[error(
        "interface {id} belongs to another client (pid {}); only it can detach it",
        shown_pid(*pid)
    )]
    HeldByAnother { id: InterfaceId, pid: Option<i32> },
    /// A network's limit of interfaces (`per_uid`: of this uid's).
    #[error("{}", limit_message(network, *limit, *per_uid))]
    Limit {
        network: String,
        limit: u32,
        per_uid: Option<u32>,
    },
    /// An id of the kind linnet derives for a network socket's VM, asked
    /// for through the ordinary API.
    #[error(
        "interface id {id} is of the kind linnet derives for a VM on a network's socket (it begins 6c6e736b); only that socket's relay attaches it: choose another --interface-id, or none"
    )]
    SocketInterfaceId { id: InterfaceId },
    /// The MAC is another interface's on the network.
    #[error("network \"{network}\": MAC {mac} is another interface's; choose another --mac")]
    MacTaken { network: String, mac: MacAddr },
    /// A re-claim with a wrong token, or by another user.
    #[error("interface {id} is not this client's to re-claim")]
    NotReclaimable { id: InterfaceId },
    /// A re-claim of an interface a connection holds already.
    #[error("interface {id} is held by a connection already")]
    AlreadyReclaimed { id: InterfaceId },
    /// A host port another interface's forward has.
    #[error(
        "host port {port} is already forwarded to interface {holder}{} on network \"{network}\" ({forward}); choose another host port, or remove that one with `linnet forward rm`",
        holder_name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
    )]
    PortForwarded {
        port: String,
        holder: InterfaceId,
        holder_name: Option<String>,
        network: String,
        forward: PortForward,
    },
    /// A host port a socket in the namespace is bound to (`owner`: its
    /// process, for root's eyes only).
    #[error(
        "host port {port} is already bound by a listening socket on {addr}{} in linnet's network namespace; choose another host port or stop that service",
        owner.as_ref().map(|o| format!(" of {o}")).unwrap_or_default()
    )]
    PortBound {
        port: String,
        addr: String,
        owner: Option<String>,
    },
    /// A privileged host port asked for by a user other than root.
    #[error(
        "host port {port} is privileged (below net.ipv4.ip_unprivileged_port_start = {first}): only root may publish it; choose a host port of {first} or more"
    )]
    PrivilegedPort { port: String, first: u16 },
    /// A link with a name linnet gives is someone else's.
    #[error(
        "network \"{network}\": a link named {link} exists and was not made by linnet; rename or delete it (ip link del {link})"
    )]
    ForeignLink { network: String, link: String },
    /// A range of the network's config meets an address or route of the
    /// host's (`key`: subnet, clone_subnet, ipv6_prefix; `found`: "address
    /// …" or "route …"; `link`: whose).
    #[error(
        "network \"{network}\": {key} {range} overlaps {found} on interface {link}; set networks.{network}.{key} to a free {}",
        overlap_advice(key)
    )]
    Overlap {
        network: String,
        key: &'static str,
        range: String,
        found: String,
        link: String,
    },
    /// The LAN link a network names is not there, or not what its mode
    /// needs (`problem` says which and what to set).
    #[error("network \"{network}\": {problem}")]
    LanLink { network: String, problem: String },
    /// A `bridge` network names one of linnet's own bridges.
    #[error(
        "network \"{network}\": {bridge} is the bridge of linnet's network \"{owner}\"; attach to that network instead"
    )]
    LinnetsBridge {
        network: String,
        bridge: String,
        owner: String,
    },
    /// A network's clone range is full, or it has none.
    #[error("{}", clone_range_message(network, subnet.as_ref()))]
    CloneRange {
        network: String,
        subnet: Option<ipnet::Ipv4Net>,
    },
    /// What a network socket's relay may not ask.
    #[error("the relay of a connection to network \"{network}\"'s socket {why}")]
    RelayRefused { network: String, why: String },
    /// Nothing told linnet the interface's address in time.
    #[error(
        "interface {id} has no IPv4 address linnet knows after {seconds} s: on a LAN, is the VM's DHCP client running, and does the LAN's DHCP server answer it? (on a network with dhcp: false, linnet knows only static leases)"
    )]
    NoAddressYet { id: InterfaceId, seconds: u64 },
    /// `--datapath tap-name` on a network whose ports have no name to open.
    #[error(
        "network \"{network}\" is a {mode} network, whose VMs' macvtaps are opened through their fd, not by name; use --datapath tap"
    )]
    NotOpenedByName { network: String, mode: Mode },
    /// `keep` without `--datapath tap-name`.
    #[error(
        "an interface kept past its client's connection is for a VMM that opens its TAP by name: attach it with --datapath tap-name"
    )]
    KeepNeedsTapName,
    /// Queues an attach cannot have.
    #[error("{queues} queues: {why}")]
    Queues { queues: u16, why: String },
    /// A forward to remove that the interface does not have.
    #[error("interface {id} has no forward {forward}; it has: {}", listed(has))]
    NoSuchForward {
        id: InterfaceId,
        forward: PortForward,
        has: Vec<PortForward>,
    },
    /// A forward to remove that the network's config declares.
    #[error(
        "{forward} of interface {id} is declared in networks.{network}.forwards; remove it there"
    )]
    DeclaredForward {
        id: InterfaceId,
        forward: PortForward,
        network: String,
    },
    /// A kernel step failed (`what` it was).
    #[error("{what}: {source}")]
    HostStep {
        what: String,
        source: std::io::Error,
    },
    /// No such interface is attached (`which`: "interface ID", "an
    /// interface named \"web\""; `network`: where it was looked for).
    #[error("{}", not_attached_message(which, network.as_deref()))]
    NotAttached {
        which: String,
        network: Option<String>,
    },
    /// The interface is not this connection's.
    #[error("interface {id} is not attached by this connection")]
    NotThisConnections { id: InterfaceId },
    /// A restarted daemon did not adopt the interface a client re-claims.
    #[error("interface {id} is not attached: this daemon did not adopt it (its log says why)")]
    NotAdopted { id: InterfaceId },
    /// A VM's policy goes past what its network enforces.
    #[error(
        "network \"{network}\" holds its VMs to its {key} (networks.yaml: {key}.enforced): {widening}; ask for that or less, or have root change networks.yaml and restart the daemon",
        key = widening.key()
    )]
    AboveCeiling {
        network: String,
        widening: crate::ceiling::Widening,
    },
    /// A connect/listen policy the network cannot hold (`why`).
    #[error("{why}")]
    PolicyImpossible { network: String, why: String },
    /// A forward the network cannot publish (`why`).
    #[error("{why}")]
    ForwardImpossible { network: String, why: String },
    /// A clone that cannot be made as asked (`why`).
    #[error("{why}")]
    CloneImpossible { network: String, why: String },
    /// A file of the daemon's state that cannot be read or made.
    #[error("{what} {}: {source}", path.display())]
    StateFile {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// An adopted interface's lease cannot be held again (`why`: its
    /// address is another's now, or outside the subnet).
    #[error("{why}")]
    LeaseNotReadopted { id: InterfaceId, why: String },
    /// An adopted port is on another bridge than its network's now.
    #[error("its port is on another bridge than network \"{network}\"'s now")]
    PortElsewhere { network: String },
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Firewall(#[from] NftError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// A connect/listen policy without br_netfilter.
    #[error(
        "a connect/listen policy needs the br_netfilter module, so that traffic between VMs of one network passes linnet's firewall: run `modprobe br_netfilter` (and add it to /etc/modules-load.d)"
    )]
    NoBrNetfilter,
    /// `host_access`: the uplink has no IPv4 address to reach a VM from.
    #[error(
        "host_access: {uplink} has no IPv4 address to reach the VM at {vm} from; give the host its LAN address on {uplink}"
    )]
    NoUplinkAddress {
        uplink: String,
        vm: std::net::Ipv4Addr,
    },
    /// A network across hosts names a VTEP that is none of this host's
    /// addresses (`have`: those it has, with their links).
    #[error(
        "network \"{network}\": evpn.vtep {vtep} is no address of this host ({have}); set networks.{network}.evpn.vtep to this host's address on the underlay, the one the other hosts reach"
    )]
    VtepNotHere {
        network: String,
        vtep: std::net::Ipv4Addr,
        have: String,
    },
    /// A network across hosts: the address an attach would take is held
    /// by a VM with another MAC on another host (advertised over EVPN).
    #[error(
        "network \"{network}\": {ip} is taken on another host by the VM with MAC {other} (FRR learned it over EVPN), and this VM's MAC is {mac}; give one of them another address (dhcp.static), and give each host a DHCP range of its own in the subnet"
    )]
    AddressElsewhere {
        network: String,
        ip: std::net::Ipv4Addr,
        mac: MacAddr,
        other: MacAddr,
    },
    /// A network across hosts: the MAC an attach asks for is a VM's
    /// behind another host's VTEP (advertised over EVPN). Taken here too,
    /// EVPN's MAC mobility could send that VM's traffic here.
    #[error(
        "network \"{network}\": MAC {mac} is a VM's on another host (FRR learned it over EVPN behind VTEP {vtep}); choose another MAC (or none, for one of linnet's), or detach that VM there first if it is moving here"
    )]
    MacElsewhere {
        network: String,
        mac: MacAddr,
        vtep: std::net::IpAddr,
    },
    /// A network across hosts whose MTU, with VXLAN's 50 bytes, is more
    /// than the underlay link carries.
    #[error(
        "network \"{network}\": mtu {mtu} does not fit the underlay: {link} carries {link_mtu} bytes and VXLAN takes {overhead}; set networks.{network}.mtu to {} or less, or raise {link}'s MTU to {} or more",
        link_mtu.saturating_sub(*overhead),
        mtu + overhead
    )]
    UnderlayMtu {
        network: String,
        mtu: u32,
        link: String,
        link_mtu: u32,
        overhead: u32,
    },
    /// A link linnet made is gone before it was set up.
    #[error("{what} {link} vanished after creation")]
    Vanished { what: &'static str, link: String },
    #[error(transparent)]
    CloneNamespace(CloneNsError),
    /// linnet's own mistake: what it found that should not be.
    #[error("{0}")]
    Internal(String),
}

impl DaemonError {
    /// `name` is no network of `config`'s: which are, and where to add it.
    pub fn unknown_network(config: &Config, name: &str) -> DaemonError {
        DaemonError::UnknownNetwork {
            name: name.into(),
            known: config
                .networks
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            file: config
                .source
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| crate::config::DEFAULT_CONFIG_PATH.into()),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            DaemonError::BadName(_)
            | DaemonError::MulticastMac { .. }
            | DaemonError::VendorMac { .. }
            | DaemonError::WhichInterface
            | DaemonError::WaitHolds
            | DaemonError::NotOpenedByName { .. }
            | DaemonError::KeepNeedsTapName
            | DaemonError::Queues { .. }
            | DaemonError::NoSuchForward { .. }
            | DaemonError::DeclaredForward { .. }
            | DaemonError::NotAttached { .. }
            | DaemonError::NotThisConnections { .. }
            | DaemonError::NotAdopted { .. }
            | DaemonError::PolicyImpossible { .. }
            | DaemonError::ForwardImpossible { .. }
            | DaemonError::CloneImpossible { .. } => ErrorKind::BadRequest,
            DaemonError::UnknownNetwork { .. } => ErrorKind::UnknownNetwork,
            DaemonError::NotAllowed { .. }
            | DaemonError::AboveCeiling { .. }
            | DaemonError::NotOwner { .. }
            | DaemonError::NotReclaimable { .. }
            | DaemonError::PrivilegedPort { .. }
            | DaemonError::RelayRefused { .. }
            | DaemonError::SocketInterfaceId { .. }
            | DaemonError::Forbidden(_)
            | DaemonError::Lease(LeaseError::NotYours { .. }) => ErrorKind::NotAllowed,
            DaemonError::Attached { .. }
            | DaemonError::HeldByAnother { .. }
            | DaemonError::AlreadyReclaimed { .. }
            | DaemonError::Limit { .. }
            | DaemonError::CloneRange { .. }
            | DaemonError::NoAddressYet { .. } => ErrorKind::Busy,
            DaemonError::PortElsewhere { .. }
            | DaemonError::LeaseNotReadopted { .. }
            | DaemonError::NameHeld { .. }
            | DaemonError::MacTaken { .. }
            | DaemonError::PortForwarded { .. }
            | DaemonError::PortBound { .. }
            | DaemonError::ForeignLink { .. }
            | DaemonError::AddressElsewhere { .. }
            | DaemonError::MacElsewhere { .. }
            | DaemonError::Overlap { .. }
            | DaemonError::LinnetsBridge { .. }
            | DaemonError::Lease(_) => ErrorKind::Conflict,
            DaemonError::Tap(_)
            | DaemonError::Netlink(_)
            | DaemonError::Firewall(_)
            | DaemonError::Service(_)
            | DaemonError::LanLink { .. }
            | DaemonError::HostStep { .. }
            | DaemonError::NoBrNetfilter
            | DaemonError::VtepNotHere { .. }
            | DaemonError::UnderlayMtu { .. }
            | DaemonError::NoUplinkAddress { .. }
            | DaemonError::Vanished { .. }
            | DaemonError::CloneNamespace(_) => ErrorKind::HostSetup,
            DaemonError::Internal(_) | DaemonError::StateFile { .. } => ErrorKind::Internal,
            DaemonError::Secret(SecretError::NetworkRootOnly(_)) => ErrorKind::NotAllowed,
            DaemonError::Secret(_) => ErrorKind::BadRequest,
        }
    }

    pub fn into_response(self) -> Response {
        Response::Error {
            kind: self.kind(),
            message: self.to_string(),
        }
    }
}

/// A client's pid in a message ("?" when unknown).
fn shown_pid(pid: Option<i32>) -> String {
    pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into())
}

fn not_attached_message(which: &str, network: Option<&str>) -> String {
    match network {
        Some(network) => format!(
            "unknown interface: {which} is not attached to network \"{network}\"; `linnet ls` lists the attached interfaces"
        ),
        None => format!("{which} is not attached"),
    }
}

fn overlap_advice(key: &str) -> String {
    match key {
        "subnet" => format!("range in {}", crate::config::DEFAULT_CONFIG_PATH),
        "ipv6_prefix" => format!("/64 in {}", crate::config::DEFAULT_CONFIG_PATH),
        _ => "range".into(),
    }
}

fn clone_range_message(network: &str, subnet: Option<&ipnet::Ipv4Net>) -> String {
    match subnet {
        None => format!(
            "network \"{network}\" has no clone_subnet (no free /24 was left for it in 198.18.0.0/15); set networks.{network}.clone_subnet"
        ),
        Some(subnet) => format!(
            "network \"{network}\": every address of clone_subnet {subnet} is a clone's; detach one or widen networks.{network}.clone_subnet"
        ),
    }
}

fn limit_message(network: &str, limit: u32, per_uid: Option<u32>) -> String {
    match per_uid {
        None => format!(
            "network \"{network}\" has {limit} interfaces, its limit (networks.{network}.max_interfaces); detach one or raise the limit"
        ),
        Some(uid) => format!(
            "uid {uid} has {limit} interfaces on network \"{network}\", its limit (networks.{network}.max_interfaces_per_uid); detach one or raise the limit"
        ),
    }
}

impl From<CloneNsError> for DaemonError {
    fn from(e: CloneNsError) -> DaemonError {
        match e {
            CloneNsError::Tap(e) => DaemonError::Tap(e),
            CloneNsError::Netlink(e) => DaemonError::Netlink(e),
            CloneNsError::Firewall(e) => DaemonError::Firewall(e),
            other => DaemonError::CloneNamespace(other),
        }
    }
}

/// Forwards as a message lists them: "none", or each, by commas.
fn listed(forwards: &[PortForward]) -> String {
    if forwards.is_empty() {
        return "none".into();
    }
    let each: Vec<String> = forwards.iter().map(ToString::to_string).collect();
    each.join(", ")
}
