//! The daemon's socket protocol, shared by the daemon and its clients.
//!
//! A unix SOCK_SEQPACKET socket: every message is one JSON object in one
//! packet, so no framing is needed; a TAP file descriptor travels with its
//! reply as SCM_RIGHTS. A reply larger than one packet (the listing of a
//! thousand interfaces) is announced by a small `{"large_message": N}` and
//! follows in packets of its raw bytes. docs/api.md is the reference for
//! other languages.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use ipnet::{Ipv4Net, Ipv6Net};
use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr,
};
use serde::{Deserialize, Serialize};

use crate::config::Mode;
use crate::datapath::{Datapath, RelayCounters};
use crate::events::Event;
use crate::forward::PortForward;
use crate::learned::LearnedAddress;
use crate::policy::Policy;
use crate::secrets::{SecretListed, SecretValue};
use crate::types::{InterfaceId, MacAddr};

/// Requests larger than this are refused; replies larger than this come
/// in pieces of this size.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// The largest reply a client takes.
const MAX_LARGE_MESSAGE: usize = 64 << 20;

/// Announces a reply of `large_message` bytes in the packets that follow.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LargeMessage {
    large_message: usize,
}
/// The API socket's name in the run directory (defined beside the
/// networks' sockets, which must not take it).
pub use crate::config::SOCKET_NAME;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Attach an interface; the reply carries the TAP fd.
    Attach(AttachRequest),
    /// Detach an interface this connection attached.
    Detach { interface_id: InterfaceId },
    /// After a daemon restart: make an interface that a previous daemon
    /// attached for this client this connection's again (it lives as long
    /// as the connection from then on). `token` is the attach reply's
    /// `reclaim_token`.
    Reclaim {
        interface_id: InterfaceId,
        token: String,
    },
    /// A relay's counters for an interface this connection attached
    /// (socket datapaths), shown by `linnet ls`.
    Counters {
        interface_id: InterfaceId,
        counters: RelayCounters,
    },
    /// Networks and interfaces.
    List,
    /// Publish a port of an attached interface; kept for its interface id
    /// across detach and daemon restarts until removed.
    ForwardAdd(ForwardRequest),
    /// Stop publishing a port.
    ForwardRemove(ForwardRequest),
    /// The forwards of all attached interfaces.
    ForwardList,
    /// An attached interface's connect/listen policy.
    PolicyShow(InterfaceRef),
    /// Replaces an attached interface's policy; new connections follow it.
    PolicySet(PolicySetRequest),
    /// The interface's IPv4 address, once linnet knows it: at once on
    /// linnet's own networks, on a LAN once linnet has seen the LAN's DHCP
    /// server give it. Its owner or root may ask.
    WaitAddress {
        network: String,
        interface_id: InterfaceId,
        /// Give up after this long (at most 600 000).
        timeout_ms: u64,
    },
    /// What the host's other firewalls and routes do to the networks
    /// (all, or the one named).
    Doctor {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
    },
    /// Sets (or replaces) a secret for VMs to use without holding it
    /// (`linnet secret set`): the caller's, or with `network` that
    /// network's (root only). Its value is never shown again.
    SecretSet {
        name: String,
        value: SecretValue,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
    },
    /// Removes one of the caller's secrets, or with `network` one of that
    /// network's (root only).
    SecretRemove {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
    },
    /// The secrets the caller may see (its own and those of the networks
    /// it may attach to; root all): names, owners, when set, never values.
    SecretList,
    /// The network's secrets CA certificate (PEM), made the first time:
    /// what its guests trust to have secrets put into their requests.
    /// Anyone who may attach to the network may have it.
    Ca { network: String },
    /// Follow what happens (of one network, or all): the reply is
    /// `subscribed`, then an `event` per change for as long as the
    /// connection lasts (it takes no other request). `recent`: first the
    /// last events the daemon kept (those of its start included).
    Events {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        recent: bool,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySetRequest {
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_id: Option<InterfaceId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub policy: Policy,
    /// Change only this part of the policy and keep the other (absent:
    /// the whole policy is replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only: Option<PolicyPart>,
}

/// A part of a policy that `policy set` can change alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyPart {
    /// The connect and listen rules.
    Rules,
    /// The rate limits.
    RateLimit,
}

impl PolicySetRequest {
    pub fn interface(&self) -> InterfaceRef {
        InterfaceRef {
            network: self.network.clone(),
            interface_id: self.interface_id,
            name: self.name.clone(),
        }
    }
}

impl ForwardRequest {
    pub fn interface(&self) -> InterfaceRef {
        InterfaceRef {
            network: self.network.clone(),
            interface_id: self.interface_id,
            name: self.name.clone(),
        }
    }
}

/// Names an attached interface: by `interface_id` or by `name`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceRef {
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_id: Option<InterfaceId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Names an attached interface (by `interface_id` or by `name`) and a port.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardRequest {
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_id: Option<InterfaceId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub forward: PortForward,
}

/// Where a forward came from: the config's `forwards:`, `run --publish`
/// (the attach request), or `forward add`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardOrigin {
    Config,
    Publish,
    Runtime,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardStatus {
    pub network: String,
    pub interface_id: InterfaceId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub forward: PortForward,
    /// Where the connections go: the guest's IPv4 address and port.
    pub guest: SocketAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest6: Option<SocketAddr>,
    pub origin: ForwardOrigin,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_id: Option<InterfaceId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// How the VMM will get frames; the TAP fd comes either way (for
    /// `dgram`/`stream` the client relays it). Default `tap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath: Option<Datapath>,
    /// Ports to publish for as long as the interface is attached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publish: Vec<PortForward>,
    /// Keep the interface when this connection closes (`linnet attach`),
    /// for a VMM started on its own that opens its TAP by name (`tap-name`
    /// only): until its owner or root detaches it, or, on linnet's own
    /// networks, until its VM has sent nothing for the network's
    /// lease_time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep: bool,
    /// What the VM may connect to and be connected on; default: the
    /// network's `policy:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
    /// Attach a clone of this guest: the VM keeps the MAC and address it
    /// was snapshotted with, and is reached at a unique address of the
    /// network's `clone_subnet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_of: Option<CloneOf>,
    /// Queues of the VM's TAP (virtio-net multi-queue): an fd for each
    /// comes with the reply (`tap`); a `tap-name` TAP is made with
    /// `IFF_MULTI_QUEUE` for its VMM to open that many by name. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
}

/// The guest a clone was made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CloneOf {
    /// An interface of the network by name: attached, or its lease still
    /// held (the VM that was snapshotted has stopped).
    Name(String),
    /// The guest's MAC and address as recorded (the snapshotted VM's
    /// interface JSON, `--like FILE`).
    Guest {
        mac_address: MacAddr,
        ip_address: Ipv4Addr,
        /// Its TAP's name, which the clone's TAP gets in its namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tap: Option<String>,
    },
}

/// Which parts of an interface's policy its network enforces: they are
/// the most its VM may have, which its owner may narrow and never widen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforcement {
    /// Its connect and listen rules (`policy.enforced`).
    #[serde(default)]
    pub policy: bool,
    /// Its rate limits (`rate_limit.enforced`).
    #[serde(default)]
    pub rate_limit: bool,
    /// The file that says so (root's networks.yaml).
    pub by: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Response {
    Attached {
        interface: Box<InterfaceInfo>,
        /// What the client re-claims the interface with once it has
        /// reconnected to a restarted daemon (`Request::Reclaim`). Keep it
        /// to yourself: it is the interface's lifeline.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reclaim_token: Option<String>,
    },
    /// The interface is this connection's now.
    Reclaimed {
        interface_id: InterfaceId,
    },
    Detached {
        interface_id: InterfaceId,
    },
    /// Done; nothing to say (counters recorded).
    Ok,
    Listing {
        networks: Vec<NetworkStatus>,
        interfaces: Vec<InterfaceStatus>,
    },
    Forwards {
        forwards: Vec<ForwardStatus>,
    },
    Policy {
        interface_id: InterfaceId,
        policy: Policy,
        /// The addresses it learned for its policy's names, now.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        learned: Vec<LearnedAddress>,
        /// What its network enforces of it, when anything.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        enforced: Option<Enforcement>,
    },
    Doctor {
        report: Box<DoctorReport>,
    },
    Address {
        interface_id: InterfaceId,
        ip_address: Ipv4Addr,
    },
    /// `Request::SecretList`'s answer.
    Secrets {
        secrets: Vec<SecretListed>,
    },
    /// `Request::Ca`'s answer.
    Ca {
        network: String,
        certificate: String,
    },
    /// Events follow (`Request::Events`).
    Subscribed,
    /// One change (docs/operations.md lists them).
    Event(Event),
    Error {
        kind: ErrorKind,
        message: String,
    },
}

/// Machine-readable class of an error; `message` says what and what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    BadRequest,
    UnknownNetwork,
    NotAllowed,
    Busy,
    Conflict,
    HostSetup,
    Internal,
}

impl ErrorKind {
    /// As the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::UnknownNetwork => "unknown_network",
            ErrorKind::NotAllowed => "not_allowed",
            ErrorKind::Busy => "busy",
            ErrorKind::Conflict => "conflict",
            ErrorKind::HostSetup => "host_setup",
            ErrorKind::Internal => "internal",
        }
    }
}

/// One interface as the VMM's side sees it. Carries vmnet-helper's keys so
/// tools that parse vmnet-helper output work unchanged, and linnet's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterfaceInfo {
    pub vmnet_interface_id: InterfaceId,
    pub vmnet_mac_address: MacAddr,
    pub vmnet_mtu: u32,
    pub vmnet_max_packet_size: u32,
    /// The DHCP range and subnet of a network whose addresses are
    /// linnet's; none on a LAN (as vmnet's bridged mode has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmnet_start_address: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmnet_end_address: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmnet_subnet_mask: Option<Ipv4Addr>,
    /// The IPv6 prefix guests are masqueraded from, when the network has NAT66.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmnet_nat66_prefix: Option<Ipv6Addr>,
    pub network: String,
    pub mode: Mode,
    pub datapath: Datapath,
    pub interface_id: InterfaceId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub mac_address: MacAddr,
    /// None on a network without DHCP, unless a static lease names the
    /// interface: the guest sets its own address. On a LAN, the address
    /// the LAN's DHCP server gave, once linnet has seen it (`--wait-ip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<Ipv4Addr>,
    /// The gateway and subnet of linnet's own networks; none on a LAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    /// The gateway's DNS addresses (IPv4, and IPv6 when the network has it).
    pub dns: Vec<IpAddr>,
    pub domain: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Ipv4Net>,
    /// The network's /64, when it has IPv6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_prefix: Option<Ipv6Net>,
    /// The address the guest forms by SLAAC from its MAC (EUI-64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_address: Option<Ipv6Addr>,
    /// The gateway's address in the prefix (its DNS server); the guest's
    /// default route is via fe80::1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<Ipv6Addr>,
    pub tap: String,
    /// The TAP's queues, when more than one: the reply carries an fd for
    /// each (`tap`), or the VMM opens that many by name with
    /// `IFF_MULTI_QUEUE` (`tap-name`).
    #[serde(default = "one_queue", skip_serializing_if = "is_one_queue")]
    pub queues: u16,
    pub mtu: u32,
    pub forwards: Vec<PortForward>,
    /// On a rootless daemon's network with NAT: the address at which the
    /// VM reaches the host's 127.0.0.1 (its own loopback is its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_loopback: Option<Ipv4Addr>,
    /// A clone's unique address: where the host, other VMs, its published
    /// ports and its DNS name reach it (`ip_address` is the guest's own,
    /// which its clones share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_address: Option<Ipv4Addr>,
    /// A clone's network namespace, with `--datapath tap-name`: where its
    /// VMM must run to open `tap` by name (`nsenter --net=PATH`,
    /// Firecracker's jailer `--netns PATH`; `linnet run` puts it there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<std::path::PathBuf>,
    /// Empty lists: nothing restricted.
    #[serde(default)]
    pub policy: Policy,
    /// What the host's other firewalls block of this network's traffic
    /// (`linnet doctor` has the details).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

fn one_queue() -> u16 {
    1
}

fn is_one_queue(queues: &u16) -> bool {
    *queues == 1
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetworkStatus {
    pub name: String,
    pub mode: Mode,
    /// Linnet's own networks' addresses; none on a LAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Ipv4Net>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    /// A LAN network's host NIC or bridge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lan: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_prefix: Option<Ipv6Net>,
    /// The bridge, while the network is up.
    pub bridge: Option<String>,
    pub interfaces: usize,
    pub persistent: bool,
    /// Its socket_vmnet-compatible socket, if it has one (`socket:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// What the host's other firewalls block of its traffic, while it is up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InterfaceStatus {
    pub interface_id: InterfaceId,
    pub name: Option<String>,
    pub network: String,
    pub mac_address: MacAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_address: Option<Ipv6Addr>,
    /// IPv6 addresses the VM formed itself (stable-privacy, temporary, set
    /// by hand), learned from its duplicate address detection: it may send
    /// from these too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv6_formed: Vec<Ipv6Addr>,
    pub tap: String,
    pub forwards: Vec<PortForward>,
    pub client_pid: Option<i32>,
    pub client_uid: u32,
    pub datapath: Datapath,
    /// What the client's relay reported last (socket datapaths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayCounters>,
    /// Bytes the VM received and sent (the TAP's tx and rx).
    pub vm_rx_bytes: u64,
    pub vm_tx_bytes: u64,
    #[serde(default, skip_serializing_if = "Policy::is_empty")]
    pub policy: Policy,
    /// Frames from the VM that anti-spoofing dropped (None: not guarded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoofed_drops: Option<u64>,
    /// DNS queries for names its policy does not allow, answered REFUSED
    /// (None: no names in its policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_queries: Option<u64>,
    /// Connections (each attempt's packet) its egress policy refused
    /// (None: no egress policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_connections: Option<u64>,
    /// Why its TAP is off the network (its VMM misbehaved); it stays so
    /// until detached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_off: Option<String>,
    /// A clone's unique address (`ip_address` is the guest's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_address: Option<Ipv4Addr>,
    /// A tap-name clone's network namespace (see `InterfaceInfo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<std::path::PathBuf>,
}

/// `linnet doctor`: the namespace as linnet sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DoctorReport {
    /// Default routes of the main table, lowest metric first
    /// ("interface (metric N)").
    pub uplinks_ipv4: Vec<String>,
    pub uplinks_ipv6: Vec<String>,
    /// The other firewalls found: "ip filter (docker)", "inet firewalld
    /// (firewalld)", "iptables-legacy filter", ...
    pub firewalls: Vec<String>,
    /// Whether Docker's DOCKER-USER chain exists (per family: ip, ip6),
    /// and whether linnet may add its rules there.
    pub docker_user_chain: Vec<String>,
    pub docker_user_enabled: bool,
    /// The forwarding sysctls as they are now.
    pub ipv4_forwarding: bool,
    pub ipv6_forwarding: bool,
    /// What could not be read (nftables, legacy iptables).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    pub networks: Vec<NetworkDoctor>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetworkDoctor {
    pub name: String,
    pub mode: Mode,
    pub bridge: String,
    pub up: bool,
    /// The interface its NAT goes out of, per family (None: no default
    /// route, so no way out).
    pub uplink_ipv4: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink_ipv6: Option<String>,
    /// Whether linnet's accept rules for it are in DOCKER-USER.
    pub docker_user_rules: bool,
    pub checks: Vec<crate::coexist::FlowCheck>,
    /// Other things worth knowing (no default route, DHCP off, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// A network across hosts: what FRR says of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<crate::frr::health::FabricHealth>,
}

// ---- transport ------------------------------------------------------------------

/// A connected SEQPACKET socket carrying JSON messages and, optionally, fds.
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    pub fn connect(path: &Path) -> io::Result<Channel> {
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        let addr = UnixAddr::new(path)?;
        socket::connect(fd.as_raw_fd(), &addr)?;
        Ok(Channel { fd })
    }

    /// A connection made by another process (`linnet helper` hands its own
    /// to `linnet-relay`).
    pub fn from_fd(fd: OwnedFd) -> Channel {
        Channel { fd }
    }

    /// Sends one message, with `fds` attached.
    pub fn send<T: Serialize>(&self, msg: &T, fds: &[RawFd]) -> io::Result<()> {
        send_message(self.fd.as_fd(), msg, fds)
    }

    /// Receives one message and the fds that came with it. `Ok(None)` when
    /// the peer closed the connection.
    pub fn recv<T: for<'de> Deserialize<'de>>(&self) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let Some((len, fds)) = recv_packet(self.fd.as_fd(), &mut buf)? else {
            return Ok(None);
        };
        let invalid = |e| io::Error::new(io::ErrorKind::InvalidData, e);
        if let Ok(large) = serde_json::from_slice::<LargeMessage>(&buf[..len]) {
            let bytes = self.recv_pieces(large.large_message, &mut buf)?;
            return Ok(Some((
                serde_json::from_slice(&bytes).map_err(invalid)?,
                fds,
            )));
        }
        let msg = serde_json::from_slice(&buf[..len]).map_err(invalid)?;
        Ok(Some((msg, fds)))
    }

    /// The `len` bytes of a large reply, from the packets that carry them.
    fn recv_pieces(&self, len: usize, buf: &mut [u8]) -> io::Result<Vec<u8>> {
        // One too large is still read to its end (and dropped), so the next
        // reply on this connection is read as one.
        let keep = len <= MAX_LARGE_MESSAGE;
        let mut bytes = Vec::with_capacity(if keep { len } else { 0 });
        let mut read = 0;
        while read < len {
            let Some((n, _)) = recv_packet(self.fd.as_fd(), buf)? else {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed in the middle of a reply",
                ));
            };
            read += n;
            if keep {
                bytes.extend_from_slice(&buf[..n]);
            }
        }
        if !keep {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a reply of {len} bytes is more than linnet reads"),
            ));
        }
        Ok(bytes)
    }

    /// Whether the daemon closed the connection (or sent something unasked,
    /// which it never does). Does not block.
    pub fn peer_closed(&self) -> bool {
        let mut fds = [nix::poll::PollFd::new(
            self.fd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
    }

    /// One request, one reply.
    pub fn call(&self, req: &Request) -> io::Result<(Response, Vec<OwnedFd>)> {
        // A daemon that will not serve this connection says why and closes
        // it, maybe before the request went out (EPIPE), maybe with it
        // unread (the kernel then reports ECONNRESET once before the why).
        let closed =
            |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET));
        let read_why = || match self.recv() {
            Err(e) if closed(&e) => self.recv(),
            other => other,
        };
        if let Err(e) = self.send(req, &[]) {
            return match closed(&e).then(read_why) {
                Some(Ok(Some(why))) => Ok(why),
                _ => Err(e),
            };
        }
        let reply = read_why();
        reply?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the linnet daemon closed the connection",
            )
        })
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

pub fn send_message<T: Serialize>(fd: BorrowedFd<'_>, msg: &T, fds: &[RawFd]) -> io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(io::Error::other)?;
    send_packet(fd, &bytes, fds)
}

/// A reply's bytes: one packet, or, when larger than a packet, a
/// `LargeMessage` announcing their size and then the bytes themselves in
/// pieces of `MAX_MESSAGE`. The sender waits for room between packets, so
/// a client that does not read holds up only its own connection, and what
/// it costs the daemon is the socket's buffer.
pub struct ReplyBytes {
    announce: Option<Vec<u8>>,
    body: Vec<u8>,
}

impl ReplyBytes {
    pub fn new<T: Serialize>(msg: &T) -> io::Result<ReplyBytes> {
        let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
        let announce = (body.len() > MAX_MESSAGE)
            .then(|| {
                serde_json::to_vec(&LargeMessage {
                    large_message: body.len(),
                })
            })
            .transpose()
            .map_err(io::Error::other)?;
        Ok(ReplyBytes { announce, body })
    }

    /// Whether it takes more than one packet.
    pub fn is_large(&self) -> bool {
        self.announce.is_some()
    }

    /// The packets, in order (fds go with the first); the pieces of a large
    /// one at most `piece` bytes (what the socket's buffer takes at once).
    pub fn packets(&self, piece: usize) -> impl Iterator<Item = &[u8]> {
        // A reply of one packet goes whole, whatever the piece size.
        let piece = match self.announce {
            Some(_) => piece.clamp(1, MAX_MESSAGE),
            None => self.body.len().max(1),
        };
        self.announce
            .as_deref()
            .into_iter()
            .chain(self.body.chunks(piece))
    }
}

/// How large the pieces of a large reply on `fd` may be: a quarter of its
/// send buffer as the kernel reports it (twice what was set; each packet
/// is charged more than its bytes), at most one packet's worth.
pub fn piece_size(fd: BorrowedFd<'_>) -> usize {
    socket::getsockopt(&fd, socket::sockopt::SndBuf)
        .map(|buf| (buf / 4).clamp(1024, MAX_MESSAGE))
        .unwrap_or(MAX_MESSAGE)
}

/// Sends one packet, with `fds` attached.
pub fn send_packet(fd: BorrowedFd<'_>, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if bytes.len() > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "message larger than 64 KiB",
        ));
    }
    let iov = [io::IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    // Sent again when a signal's handler interrupted it (EINTR).
    loop {
        match socket::sendmsg::<()>(fd.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            done => return done.map(drop).map_err(Into::into),
        }
    }
}

/// The daemon's side: receives one request into `buf`. No request carries
/// descriptors, so none is taken: with no room for them the kernel drops
/// any a client sends without closing them as ours (closing a descriptor
/// can block, on a FUSE file whose server never answers the flush). A
/// packet that did not fit is an error. `Ok(None)`: the peer closed.
pub fn recv_request(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<usize>> {
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(fd.as_raw_fd(), &mut iov, None, MsgFlags::empty())?;
    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message larger than 64 KiB",
        ));
    }
    Ok((msg.bytes > 0).then_some(msg.bytes))
}

/// Receives one packet into `buf`. A packet that did not fit is an error, not
/// a silently cut message.
pub fn recv_packet(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    // Room for as many fds as one message can carry (SCM_MAX_FD), so none
    // a client sends is cut off, and all are closed when dropped.
    let mut cmsg_space = nix::cmsg_space!([RawFd; 253]);
    let mut iov = [io::IoSliceMut::new(buf)];
    // A signal's handler may interrupt it (EINTR): read on, or the rest
    // of a large reply would be read as the next reply.
    let msg = loop {
        match socket::recvmsg::<()>(
            fd.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            done => break done?,
        }
    };
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: the kernel just installed these descriptors for us.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message larger than 64 KiB",
        ));
    }
    if msg.bytes == 0 {
        return Ok(None);
    }
    Ok(Some((msg.bytes, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair like the daemon's socket and a client's.
    fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn the_daemon_takes_no_descriptor_a_client_sends() {
        let (daemon, client) = seqpacket_pair();
        let open_fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let pipes: Vec<(OwnedFd, OwnedFd)> = (0..8).map(|_| nix::unistd::pipe().unwrap()).collect();
        let sent: Vec<RawFd> = pipes.iter().map(|(r, _)| r.as_raw_fd()).collect();
        send_message(client.as_fd(), &Request::List, &sent).unwrap();
        let before = open_fds();
        let mut buf = vec![0u8; MAX_MESSAGE];
        let len = recv_request(daemon.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!(&buf[..len], br#"{"op":"list"}"#);
        assert_eq!(open_fds(), before, "none installed, so none to close");
    }

    #[test]
    fn a_reply_above_one_packet_arrives_whole_in_pieces() {
        let (daemon, client) = seqpacket_pair();
        let big = Response::Error {
            kind: ErrorKind::Internal,
            message: "x".repeat(2 * MAX_MESSAGE + 7),
        };
        let client = Channel { fd: client };
        let sender = std::thread::spawn(move || {
            for reply in [
                ReplyBytes::new(&big).unwrap(),
                ReplyBytes::new(&Response::Ok).unwrap(),
            ] {
                for packet in reply.packets(piece_size(daemon.as_fd())) {
                    send_packet(daemon.as_fd(), packet, &[]).unwrap();
                }
            }
        });
        let ok = ReplyBytes::new(&Response::Ok).unwrap();
        assert_eq!(ok.packets(10).count(), 1, "a small reply is one packet");
        match client.recv::<Response>().unwrap().unwrap().0 {
            Response::Error { message, .. } => assert_eq!(message.len(), 2 * MAX_MESSAGE + 7),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            client.recv::<Response>().unwrap().unwrap().0,
            Response::Ok
        ));
        sender.join().unwrap();
    }

    /// Fuzzing found it (fuzz/corpus/api_reply/interrupted): a signal
    /// whose handler does not restart calls, arriving while a client
    /// waited for the pieces of a large reply, ended the read with EINTR
    /// half-way through.
    #[test]
    fn a_signal_in_the_middle_of_a_large_reply_does_not_cut_it() {
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: a handler that does nothing, without SA_RESTART, for a
        // signal only this test sends (to its own thread).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = nothing as *const () as usize;
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut());
        }
        let (daemon, client) = seqpacket_pair();
        let big = Response::Error {
            kind: ErrorKind::Internal,
            message: "y".repeat(3 * MAX_MESSAGE),
        };
        let (tell, reader) = std::sync::mpsc::channel();
        let reading = std::thread::spawn(move || {
            // SAFETY: the calling thread's own handle.
            tell.send(unsafe { libc::pthread_self() }).unwrap();
            Channel { fd: client }
                .recv::<Response>()
                .unwrap()
                .unwrap()
                .0
        });
        let thread = reader.recv().unwrap();
        let reply = ReplyBytes::new(&big).unwrap();
        for (n, packet) in reply.packets(4096).enumerate() {
            send_packet(daemon.as_fd(), packet, &[]).unwrap();
            if n % 8 == 1 {
                // The reader waits for the next piece: interrupt it there.
                std::thread::sleep(std::time::Duration::from_millis(2));
                // SAFETY: a live thread of ours, a signal it handles.
                unsafe { libc::pthread_kill(thread, libc::SIGUSR2) };
            }
        }
        match reading.join().unwrap() {
            Response::Error { message, .. } => assert_eq!(message.len(), 3 * MAX_MESSAGE),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_have_a_stable_wire_form() {
        let req = Request::Attach(AttachRequest {
            network: Some("shared".into()),
            ..Default::default()
        });
        assert_eq!(
            serde_json::to_string(&req).unwrap(),
            r#"{"op":"attach","network":"shared"}"#
        );
        let back: Request = serde_json::from_str(r#"{"op":"list"}"#).unwrap();
        assert!(matches!(back, Request::List));
        assert!(serde_json::from_str::<Request>(r#"{"op":"attach","netwrk":"x"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"explode"}"#).is_err());
    }

    #[test]
    fn messages_and_fds_cross_a_socketpair() {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (a, b) = (Channel { fd: a }, Channel { fd: b });
        let file = std::fs::File::open("/dev/null").unwrap();
        a.send(&Request::List, &[file.as_raw_fd()]).unwrap();
        let (req, fds): (Request, _) = b.recv().unwrap().unwrap();
        assert!(matches!(req, Request::List));
        assert_eq!(fds.len(), 1);
        drop(a);
        assert!(
            b.recv::<Request>().unwrap().is_none(),
            "closed peer reads as None"
        );
    }
}

#[cfg(test)]
mod decoder_properties {
    use super::*;
    use proptest::prelude::*;

    /// JSON leaves of every kind, for objects shaped like requests.
    fn leaf() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            ".{0,40}".prop_map(serde_json::Value::from),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever bytes arrive, decoding returns (a request or an error).
        #[test]
        fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = serde_json::from_slice::<Request>(&bytes);
        }

        /// Objects with real op names and random fields and values.
        #[test]
        fn request_shaped_objects_decode_without_panicking(
            op in prop_oneof![
                Just("attach"), Just("detach"), Just("counters"), Just("list"),
                Just("forward_add"), Just("forward_remove"), Just("forward_list"), Just("bogus"),
            ],
            fields in proptest::collection::btree_map(
                prop_oneof![
                    Just("network".to_string()), Just("interface_id".to_string()),
                    Just("mac".to_string()), Just("name".to_string()),
                    Just("datapath".to_string()), Just("publish".to_string()),
                    Just("forward".to_string()), Just("counters".to_string()),
                    "[a-z]{1,8}",
                ],
                leaf(),
                0..6,
            ),
        ) {
            let mut object = serde_json::Map::new();
            object.insert("op".into(), op.into());
            object.extend(fields);
            let bytes = serde_json::to_vec(&object).unwrap();
            let _ = serde_json::from_slice::<Request>(&bytes);
        }

        /// Requests that decode come back the same when encoded again.
        #[test]
        fn forward_requests_round_trip(
            host in 1u16.., guest in 1u16.., udp in any::<bool>(),
            network in "[a-z][a-z0-9_-]{0,11}",
        ) {
            let forward: crate::forward::PortForward =
                format!("{host}:{guest}/{}", if udp { "udp" } else { "tcp" }).parse().unwrap();
            let req = Request::ForwardAdd(ForwardRequest {
                network, interface_id: None, name: Some("web".into()), forward,
            });
            let text = serde_json::to_string(&req).unwrap();
            let back: Request = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(serde_json::to_string(&back).unwrap(), text);
        }
    }
}
