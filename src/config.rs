//! networks.yaml: the built-in networks, the file that adds or overrides them,
//! and the validation that turns raw YAML into a `NetworkConfig` the daemon
//! can act on. Every refusal names the file, the network, the key and what is
//! allowed.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use thiserror::Error;

mod evpn;

pub use evpn::{Evpn, FrrConfig, VXLAN_OVERHEAD};

use crate::addr6;
use crate::ceiling::Ceiling;
use crate::forward::PortForward;
use crate::learned::{DEFAULT_TTL, TtlBounds};
use crate::policy::{Policy, PolicySpecError, SECRET_PORT, SecretRule};
use crate::rate::{Rate, RateLimits};
use crate::types::{self, InterfaceId, MacAddr};

pub const DEFAULT_CONFIG_PATH: &str = "/etc/linnet/networks.yaml";

/// The daemon's API socket in its run directory, where a network's own
/// socket must not take the name.
pub const SOCKET_NAME: &str = "linnet.sock";
pub const DEFAULT_NETWORK: &str = "shared";
const DEFAULT_LEASE_TIME: u32 = 3600;
pub const DEFAULT_MTU: u32 = 1500;
const DEFAULT_ALLOW_GROUP: &str = "linnet";
/// Why a policy with names is refused on a network without linnet's DNS.
pub const NO_NAMES_WITHOUT_DNS: &str = "names in a connect policy need linnet's DNS (dns.enabled: true): a VM reaches a name's addresses after asking linnet's DNS for it";

/// The longest `dns.learned_ttl.ceiling`: a week.
const MAX_LEARNED_TTL: u32 = 7 * 24 * 3600;

/// Why a connect/listen policy is refused on a network without anti-spoofing.
pub const NO_POLICY_WITHOUT_ANTI_SPOOFING: &str =
    "needs anti_spoofing: a policy knows a VM by its addresses, which without it any VM can take";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// NAT to the namespace's default route.
    Shared,
    /// Host-only: VMs reach the host and each other, nothing beyond.
    Host,
    /// On a LAN through a host NIC: a macvtap per VM (`uplink:`).
    Bridged,
    /// On a LAN through a bridge linnet does not own (`bridge:`): a TAP
    /// per VM on it, as libvirt's `<interface type='bridge'>`.
    Bridge,
}

impl Mode {
    /// Whether the network's VMs are on a LAN whose addresses are not
    /// linnet's (its own DHCP server gives them; linnet learns them).
    pub fn on_lan(self) -> bool {
        matches!(self, Mode::Bridged | Mode::Bridge)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Shared => "shared",
            Mode::Host => "host",
            Mode::Bridged => "bridged",
            Mode::Bridge => "bridge",
        })
    }
}

/// A validated network, ready for the daemon: what every kind has, and
/// its kind with what only that kind has (`Kind`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetworkConfig {
    pub name: String,
    pub kind: Kind,
    /// A VM may send only from its own MAC and addresses.
    pub anti_spoofing: bool,
    pub persistent: bool,
    pub allow: Allow,
    /// At most this many interfaces on the network (None: its addresses).
    pub max_interfaces: Option<u32>,
    /// At most this many per uid on the network (root included).
    pub max_interfaces_per_uid: Option<u32>,
    /// A socket_vmnet-compatible stream socket for the network, if any.
    pub socket: Option<NetworkSocket>,
    /// Each interface's rate limits when its attach sets none.
    pub rate_limit: RateLimits,
    /// Which of its policy and rate limits are also the most a VM may
    /// have (`enforced: true`).
    pub enforced: Enforced,
    /// Where its events, its VMs' policy decisions among them, are kept
    /// (`audit_log: PATH`; `daemon::audit`).
    pub audit_log: Option<PathBuf>,
    /// Certificates (PEM) the secrets proxy trusts an upstream's by,
    /// besides the host's trust store: a private service's CA
    /// (`upstream_ca: PATH`; docs/secrets.md).
    pub upstream_ca: Option<PathBuf>,
}

/// Which of a network's defaults are ceilings its VMs cannot lift.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Enforced {
    /// `policy: { …, enforced: true }`.
    pub policy: bool,
    /// `rate_limit: { …, enforced: true }`.
    pub rate_limit: bool,
}

/// A network's kind, as `mode:` says it.
// A handful per daemon, made once and cloned rarely: boxing `Own` would
// cost every reader a level of indirection for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `mode: shared` or `host`: a bridge of linnet's, with the addresses,
    /// DHCP, DNS, router advertisements, NAT, forwards and policies it
    /// gives its VMs.
    Own(Own),
    /// `mode: bridged` or `bridge`: VMs on a LAN whose addresses are not
    /// linnet's (its own DHCP server gives them; linnet learns them). Its
    /// MTU is its link's.
    Lan(Lan),
}

/// What a network on a bridge of linnet's has (`Kind::Own`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Own {
    /// `mode: host`: VMs reach the host and each other, nothing beyond
    /// (`nat44` is then false).
    pub host_only: bool,
    pub subnet: Ipv4Net,
    pub gateway: Ipv4Addr,
    pub dhcp: DhcpConfig,
    pub dns: DnsConfig,
    pub mtu: u32,
    pub nat44: bool,
    /// None with `ipv6: false`.
    pub ipv6: Option<Ipv6Config>,
    /// The network's VMs cannot reach each other.
    pub isolation: bool,
    /// Ports published while the matching interface is attached.
    pub forwards: Vec<StaticForward>,
    /// The connect/listen policy of interfaces that bring none of their own.
    pub policy: Policy,
    /// Where clones (`--clone-of`) get the unique addresses the host and
    /// other VMs reach them at.
    pub clone_subnet: Option<Ipv4Net>,
    /// The network spans hosts over VXLAN, with FRR's BGP EVPN (`evpn:`).
    pub evpn: Option<Evpn>,
}

/// The policy of a network that has none (a LAN's): open.
static OPEN: std::sync::LazyLock<Policy> = std::sync::LazyLock::new(Policy::default);

impl NetworkConfig {
    pub fn mode(&self) -> Mode {
        match &self.kind {
            Kind::Own(own) if own.host_only => Mode::Host,
            Kind::Own(_) => Mode::Shared,
            Kind::Lan(Lan::Macvtap(_)) => Mode::Bridged,
            Kind::Lan(Lan::Bridge(_)) => Mode::Bridge,
        }
    }

    /// What a network on a bridge of linnet's has; None on a LAN.
    pub fn own(&self) -> Option<&Own> {
        match &self.kind {
            Kind::Own(own) => Some(own),
            Kind::Lan(_) => None,
        }
    }

    pub fn own_mut(&mut self) -> Option<&mut Own> {
        match &mut self.kind {
            Kind::Own(own) => Some(own),
            Kind::Lan(_) => None,
        }
    }

    /// Where a LAN network's VMs join it; None for linnet's own bridges.
    pub fn lan(&self) -> Option<&Lan> {
        match &self.kind {
            Kind::Lan(lan) => Some(lan),
            Kind::Own(_) => None,
        }
    }

    /// Whether its VMs are kept from reaching each other (never on a LAN,
    /// whose switch carries their frames).
    pub fn isolation(&self) -> bool {
        self.own().is_some_and(|own| own.isolation)
    }

    /// The policy of its interfaces that bring none (open on a LAN).
    pub fn policy(&self) -> &Policy {
        self.own().map_or(&OPEN, |own| &own.policy)
    }

    /// What it holds its VMs to: its enforced policy and rate limits.
    pub fn ceiling(&self) -> Ceiling<'_> {
        Ceiling {
            rules: self.enforced.policy.then(|| self.policy()),
            rate: self.enforced.rate_limit.then_some(&self.rate_limit),
        }
    }

    /// Its static forwards (none on a LAN).
    pub fn forwards(&self) -> &[StaticForward] {
        self.own().map_or(&[], |own| &own.forwards)
    }

    /// Its IPv6 (none of linnet's on a LAN).
    pub fn ipv6(&self) -> Option<&Ipv6Config> {
        self.own()?.ipv6.as_ref()
    }
}

/// How a LAN network's VMs join the LAN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lan {
    /// `mode: bridged`: a macvtap per VM on a host NIC.
    Macvtap(MacvtapLan),
    /// `mode: bridge`: a TAP per VM on an existing bridge.
    Bridge(BridgeLan),
}

/// `mode: bridged`: a macvtap per VM on the host NIC `uplink`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MacvtapLan {
    pub uplink: String,
    pub mode: MacvtapMode,
    /// A macvlan for the host on the uplink, so the host reaches its own
    /// VMs (a macvtap's frames never come back up its NIC).
    pub host_access: bool,
}

/// `mode: bridge`: a TAP per VM on `bridge`, which linnet never changes
/// or deletes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BridgeLan {
    pub bridge: String,
}

impl Lan {
    /// The host NIC or the bridge.
    pub fn link(&self) -> &str {
        match self {
            Lan::Macvtap(m) => &m.uplink,
            Lan::Bridge(b) => &b.bridge,
        }
    }
}

/// The macvtap's mode (`macvtap_mode:`), as `ip link` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MacvtapMode {
    /// VMs on one uplink reach each other directly, and the LAN.
    #[default]
    Bridge,
    /// Everything goes out to the switch, which may send it back (a
    /// switch that does 802.1Qbg reflective relay).
    Vepa,
    /// VMs on one uplink never reach each other; only the LAN.
    Private,
    /// One VM owns the NIC (its MAC and promiscuity). Refused by the
    /// config: the VMM could change the NIC's own MAC through its fd.
    Passthru,
}

impl fmt::Display for MacvtapMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MacvtapMode::Bridge => "bridge",
            MacvtapMode::Vepa => "vepa",
            MacvtapMode::Private => "private",
            MacvtapMode::Passthru => "passthru",
        })
    }
}

/// Where a network's socket_vmnet-compatible socket is (`socket:`): each
/// connection to it is one VM port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkSocket {
    /// `socket: true`: NETWORK.sock in the daemon's run directory.
    RunDir,
    /// `socket: PATH`, an absolute path.
    Path(PathBuf),
}

impl NetworkSocket {
    pub fn path(&self, network: &str, run_dir: &Path) -> PathBuf {
        match self {
            NetworkSocket::RunDir => run_dir.join(format!("{network}.sock")),
            NetworkSocket::Path(path) => path.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ipv6Config {
    /// A /64: guests form their addresses in it by SLAAC.
    pub prefix: Ipv6Net,
    /// PREFIX::1 (the bridge also holds fe80::1).
    pub gateway: Ipv6Addr,
    pub router_advertisement: bool,
    /// Masquerade out of the namespace's IPv6 default route.
    pub nat66: bool,
}

/// A forward from the config: `{ name: web, publish: "8080:80" }` or with
/// `interface_id` instead of `name`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StaticForward {
    pub target: ForwardTarget,
    pub forward: PortForward,
}

/// Which interface a forward goes to: by id, or by the VM's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardTarget {
    InterfaceId(InterfaceId),
    Name(String),
}

impl fmt::Display for ForwardTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForwardTarget::InterfaceId(id) => write!(f, "interface {id}"),
            ForwardTarget::Name(name) => write!(f, "the interface named \"{name}\""),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DhcpConfig {
    pub enabled: bool,
    pub range_start: Ipv4Addr,
    pub range_end: Ipv4Addr,
    /// Seconds. Also how long a detached interface keeps its address reserved.
    pub lease_time: u32,
    pub static_leases: Vec<StaticLease>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StaticLease {
    pub ip: Ipv4Addr,
    pub mac: Option<MacAddr>,
    pub interface_id: Option<InterfaceId>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DnsConfig {
    pub enabled: bool,
    /// Empty: use the nameservers of /etc/resolv.conf at network start.
    pub upstream: Vec<SocketAddr>,
    /// VMs are answered as `<name>.<domain>`; defaults to `<network>.linnet`.
    pub domain: String,
    /// How long an address a VM with names in its policy learned from an
    /// answer stays its own.
    pub learned_ttl: TtlBounds,
}

/// Who may attach to a network. Names are resolved when the config is loaded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Allow {
    pub users: Vec<(String, u32)>,
    pub groups: Vec<(String, u32)>,
}

impl Allow {
    pub fn permits(&self, uid: u32, gids: &[u32]) -> bool {
        self.users.iter().any(|(_, u)| *u == uid)
            || self.groups.iter().any(|(_, g)| gids.contains(g))
    }

    pub fn describe(&self) -> String {
        let users = self.users.iter().map(|(n, _)| format!("user {n}"));
        let groups = self.groups.iter().map(|(n, _)| format!("group {n}"));
        let all: Vec<String> = users.chain(groups).collect();
        if all.is_empty() {
            "nobody".into()
        } else {
            all.join(", ")
        }
    }
}

/// How linnet deals with the host's other firewalls.
#[derive(Debug, Clone, PartialEq)]
pub struct FirewallConfig {
    /// Add accept rules for linnet's bridges to Docker's DOCKER-USER chain
    /// when it exists.
    pub docker_user: bool,
    /// Whether the file asked for it (`docker_user: true`), which a
    /// rootless daemon refuses rather than ignores.
    pub docker_user_asked: bool,
}

/// All networks the daemon knows, by name.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub networks: BTreeMap<String, NetworkConfig>,
    pub firewall: FirewallConfig,
    /// Where FRR (which carries the networks across hosts) answers.
    pub frr: FrrConfig,
    /// Where the networks came from, for messages.
    pub source: Option<PathBuf>,
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Syntax { file: String, message: String },
    #[error("{file}: network \"{network}\": {key}: {message}")]
    Invalid {
        file: String,
        network: String,
        key: String,
        message: String,
    },
}

// ---- the YAML as written -------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    networks: BTreeMap<String, NetworkSpec>,
    #[serde(default)]
    firewall: FirewallSpec,
    #[serde(default)]
    frr: evpn::FrrSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FirewallSpec {
    docker_user: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkSpec {
    mode: Option<Mode>,
    /// `mode: bridged`: the host NIC the macvtaps are on, and how.
    uplink: Option<String>,
    macvtap_mode: Option<MacvtapMode>,
    host_access: Option<bool>,
    /// `mode: bridge`: the existing bridge.
    bridge: Option<String>,
    subnet: Option<String>,
    gateway: Option<String>,
    /// `false`, `true`, or the keys of `DhcpSpec`.
    dhcp: Option<serde_norway::Value>,
    dns: Option<DnsSpec>,
    mtu: Option<u32>,
    nat44: Option<bool>,
    ipv6: Option<bool>,
    ipv6_prefix: Option<String>,
    router_advertisement: Option<bool>,
    nat66: Option<bool>,
    anti_spoofing: Option<bool>,
    isolation: Option<bool>,
    persistent: Option<bool>,
    allow: Option<AllowSpec>,
    max_interfaces: Option<u32>,
    max_interfaces_per_uid: Option<u32>,
    #[serde(default)]
    forwards: Vec<ForwardSpec>,
    policy: Option<PolicySpec>,
    /// `RATE[/BURST]` for both ways, or `{ in: …, out: … }`.
    rate_limit: Option<serde_norway::Value>,
    /// `true`, `false` or an absolute path.
    socket: Option<serde_norway::Value>,
    /// An absolute path: the network's audit log.
    audit_log: Option<String>,
    /// An absolute path: the CA its secrets' upstreams may be proven by.
    upstream_ca: Option<String>,
    clone_subnet: Option<String>,
    /// The network across hosts (`config::evpn`).
    evpn: Option<evpn::EvpnSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySpec {
    /// `--allow-connect` rules.
    #[serde(default)]
    egress: Vec<String>,
    /// `--allow-listen` rules.
    #[serde(default)]
    ingress: Vec<String>,
    /// `--secret` rules naming the network's secrets.
    #[serde(default)]
    secrets: Vec<String>,
    /// The most a VM may have, not only what it gets by default.
    #[serde(default)]
    enforced: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForwardSpec {
    name: Option<String>,
    interface_id: Option<String>,
    /// `[HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp]`
    publish: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DhcpSpec {
    enabled: Option<bool>,
    /// "FIRST-LAST", e.g. "192.168.105.10-192.168.105.99".
    range: Option<String>,
    lease_time: Option<u32>,
    #[serde(rename = "static", default)]
    static_leases: Vec<StaticSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticSpec {
    ip: String,
    mac: Option<String>,
    interface_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DnsSpec {
    enabled: Option<bool>,
    upstream: Option<Vec<String>>,
    domain: Option<String>,
    learned_ttl: Option<LearnedTtlSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LearnedTtlSpec {
    floor: Option<u32>,
    ceiling: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowSpec {
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
}

// ---- loading ---------------------------------------------------------------------

impl Config {
    /// The built-in `shared` and `host` networks, with no file.
    pub fn builtin() -> Config {
        Config::from_yaml("", "built-in defaults").expect("built-in networks are valid")
    }

    /// Loads `path`. A missing file at the default path means "built-ins only";
    /// a missing file the user named is an error.
    pub fn load(path: &Path, explicit: bool) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let mut cfg = Config::from_yaml(&text, &file)?;
                cfg.source = Some(path.to_path_buf());
                Ok(cfg)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                Ok(Config::builtin())
            }
            Err(source) => Err(ConfigError::Read { file, source }),
        }
    }

    pub fn from_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
        let spec: FileSpec = if text.trim().is_empty() {
            FileSpec::default()
        } else {
            serde_norway::from_str(text).map_err(|e| ConfigError::Syntax {
                file: file.into(),
                message: e.to_string(),
            })?
        };
        let mut specs = spec.networks;
        for builtin in ["shared", "host"] {
            specs.entry(builtin.into()).or_default();
        }
        let mut networks = BTreeMap::new();
        for (name, spec) in specs {
            let net = Validator {
                file,
                network: &name,
            }
            .network(&name, spec)?;
            networks.insert(name, net);
        }
        assign_clone_subnets(&mut networks);
        check_no_overlaps(&networks, file)?;
        evpn::check_across(&networks, file)?;
        let frr = FrrConfig::from_spec(spec.frr, file)?;
        Ok(Config {
            networks,
            firewall: FirewallConfig {
                docker_user: spec.firewall.docker_user.unwrap_or(true),
                docker_user_asked: spec.firewall.docker_user == Some(true),
            },
            frr,
            source: None,
        })
    }

    pub fn network(&self, name: &str) -> Option<&NetworkConfig> {
        self.networks.get(name)
    }

    /// The networks as a user's rootless daemon runs them: a network on a
    /// host NIC or bridge, or with a socket of its own, is refused (with
    /// what to run instead); each network is the user's alone (root
    /// inside the namespace); DNS goes upstream through `host_dns` (the
    /// egress tool's forwarder to the host's resolver) unless the file
    /// names servers; there is no Docker in the namespace to make room in.
    pub fn for_rootless(mut self, host_dns: Ipv4Addr) -> Result<Config, ConfigError> {
        let file = self.source_name();
        if self.firewall.docker_user_asked {
            return Err(ConfigError::Syntax {
                file,
                message: "firewall.docker_user: Docker's DOCKER-USER chain is the host's, which a rootless daemon cannot change (and Docker never sees the traffic of its namespace): remove the key, or run the networks on the system daemon".into(),
            });
        }
        for net in self.networks.values_mut() {
            let refuse = |key: &str, message: String| ConfigError::Invalid {
                file: file.clone(),
                network: net.name.clone(),
                key: key.into(),
                message,
            };
            let mode = net.mode();
            let Kind::Own(own) = &mut net.kind else {
                return Err(refuse(
                    "mode",
                    format!(
                        "{mode} puts VMs on the host's LAN, which a rootless daemon cannot reach from inside its namespaces (it would need root on the host's NIC or bridge); run this network on the system daemon (`sudo linnet daemon`), or use mode: shared"
                    ),
                ));
            };
            if own.evpn.is_some() {
                return Err(refuse(
                    "evpn",
                    "a network across hosts sends VXLAN from the host's own address and runs BGP there, which a rootless daemon's namespaces cannot; run it on the system daemon".into(),
                ));
            }
            if own.dns.upstream.is_empty() {
                own.dns.upstream = vec![SocketAddr::new(host_dns.into(), 53)];
            }
            if net.socket.is_some() {
                return Err(refuse(
                    "socket",
                    "a network's own socket is the system daemon's (each VM's relay runs as a user of its own); a rootless daemon has none: attach with `linnet run` or `linnet helper`, or run the network on the system daemon".into(),
                ));
            }
            net.allow = Allow {
                users: vec![("you".into(), 0)],
                groups: Vec::new(),
            };
        }
        self.firewall.docker_user = false;
        Ok(self)
    }

    pub fn source_name(&self) -> String {
        self.source
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "built-in networks".into())
    }
}

fn check_no_overlaps(
    networks: &BTreeMap<String, NetworkConfig>,
    file: &str,
) -> Result<(), ConfigError> {
    // A LAN network's addresses are the LAN's, not in its config.
    let list: Vec<(&NetworkConfig, &Own)> = networks
        .values()
        .filter_map(|n| Some((n, n.own()?)))
        .collect();
    for (a, own) in &list {
        let Some(clones) = &own.clone_subnet else {
            continue;
        };
        // Every network's subnet (its own too), and the others' clones.
        let others = list.iter().flat_map(|(b, theirs)| {
            let clones = theirs.clone_subnet.filter(|_| b.name != a.name);
            std::iter::once(("subnet", theirs.subnet, b))
                .chain(clones.map(|c| ("clone_subnet", c, b)))
        });
        for (key, other, b) in others {
            if types::subnets_overlap(clones, &other) {
                let whose = if b.name == a.name {
                    "the network's own subnet".to_string()
                } else {
                    format!("{key} {other} of network \"{}\"", b.name)
                };
                return Err(ConfigError::Invalid {
                    file: file.into(),
                    network: a.name.clone(),
                    key: "clone_subnet".into(),
                    message: format!(
                        "{clones} overlaps {whose}; give clones a range of their own (e.g. clone_subnet: 198.18.200.0/24)"
                    ),
                });
            }
        }
    }
    for (i, (a, own_a)) in list.iter().enumerate() {
        for (b, own_b) in &list[i + 1..] {
            if types::subnets_overlap(&own_a.subnet, &own_b.subnet) {
                return Err(ConfigError::Invalid {
                    file: file.into(),
                    network: b.name.clone(),
                    key: "subnet".into(),
                    message: format!(
                        "{} overlaps {} of network \"{}\"; give each network its own subnet",
                        own_b.subnet, own_a.subnet, a.name
                    ),
                });
            }
            if let (Some(v6a), Some(v6b)) = (&own_a.ipv6, &own_b.ipv6)
                && v6a.prefix == v6b.prefix
            {
                return Err(ConfigError::Invalid {
                    file: file.into(),
                    network: b.name.clone(),
                    key: "ipv6_prefix".into(),
                    message: format!(
                        "{} is also the prefix of network \"{}\"; give each network its own",
                        v6b.prefix, a.name
                    ),
                });
            }
            if let (Some(NetworkSocket::Path(pa)), Some(NetworkSocket::Path(pb))) =
                (&a.socket, &b.socket)
                && pa == pb
            {
                return Err(ConfigError::Invalid {
                    file: file.into(),
                    network: b.name.clone(),
                    key: "socket".into(),
                    message: format!(
                        "{} is also the socket of network \"{}\"; give each network its own",
                        pb.display(),
                        a.name
                    ),
                });
            }
            for fb in &own_b.forwards {
                if let Some(fa) = own_a
                    .forwards
                    .iter()
                    .find(|fa| fa.forward.clashes_with(&fb.forward))
                {
                    return Err(ConfigError::Invalid {
                        file: file.into(),
                        network: b.name.clone(),
                        key: "forwards".into(),
                        message: format!(
                            "host port {} is also forwarded by network \"{}\" ({} to {})",
                            fb.forward.host_port, a.name, fa.forward, fa.target
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Where clone addresses come from by default: 198.18.0.0/15, RFC 2544's
/// range for benchmarks, which LANs do not hand out (proxies' fake-IP
/// modes use it: set `clone_subnet` there), one /24 per network.
const CLONE_RANGE: (Ipv4Addr, u32) = (Ipv4Addr::new(198, 18, 0, 0), 512);

/// Gives each of linnet's own networks without a `clone_subnet` a /24 of
/// `CLONE_RANGE` that no other network's subnet or clone range touches:
/// the one numbered like the third byte of its subnet (so `shared`,
/// 192.168.105.0/24, gets 198.18.105.0/24) or the next free one.
fn assign_clone_subnets(networks: &mut BTreeMap<String, NetworkConfig>) {
    let mut taken: Vec<Ipv4Net> = networks
        .values()
        .filter_map(NetworkConfig::own)
        .flat_map(|own| std::iter::once(own.subnet).chain(own.clone_subnet))
        .collect();
    for own in networks.values_mut().filter_map(NetworkConfig::own_mut) {
        if own.clone_subnet.is_some() {
            continue;
        }
        let (base, slots) = CLONE_RANGE;
        let first = (u32::from(own.subnet.network()) >> 8) % slots;
        let free = (0..slots)
            .map(|i| {
                let slot = (first + i) % slots;
                Ipv4Net::new(Ipv4Addr::from(u32::from(base) + (slot << 8)), 24)
                    .expect("24 is a valid length")
            })
            .find(|c| !taken.iter().any(|t| types::subnets_overlap(c, t)));
        if let Some(clones) = free {
            taken.push(clones);
            own.clone_subnet = Some(clones);
        }
    }
}

/// Built-in defaults for a network, before the file's keys are applied.
fn builtin_defaults(name: &str) -> (Mode, Option<&'static str>) {
    match name {
        "shared" => (Mode::Shared, Some("192.168.105.0/24")),
        "host" => (Mode::Host, Some("192.168.106.0/24")),
        _ => (Mode::Shared, None),
    }
}

struct Validator<'a> {
    file: &'a str,
    network: &'a str,
}

impl Validator<'_> {
    fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.into(),
            network: self.network.into(),
            key: key.into(),
            message: message.into(),
        }
    }

    fn ipv4(&self, key: &str, text: &str) -> Result<Ipv4Addr, ConfigError> {
        text.trim().parse().map_err(|_| {
            self.err(
                key,
                format!("\"{text}\" is not an IPv4 address (expected e.g. 192.168.107.1)"),
            )
        })
    }

    fn network(&self, name: &str, mut spec: NetworkSpec) -> Result<NetworkConfig, ConfigError> {
        types::validate_network_name(name).map_err(|e| self.err("name", e.to_string()))?;
        let (default_mode, default_subnet) = builtin_defaults(name);
        let mode = spec.mode.unwrap_or(default_mode);
        if mode.on_lan() {
            return self.lan_network(name, mode, spec);
        }
        for (key, set) in [
            ("uplink", spec.uplink.is_some()),
            ("macvtap_mode", spec.macvtap_mode.is_some()),
            ("host_access", spec.host_access.is_some()),
            ("bridge", spec.bridge.is_some()),
        ] {
            if set {
                return Err(self.err(
                    key,
                    format!("is for mode: bridged or bridge, and this network is {mode}"),
                ));
            }
        }

        let subnet_text = spec.subnet.as_deref().or(default_subnet).ok_or_else(|| {
            self.err(
                "subnet",
                "is required for a new network (e.g. subnet: 192.168.107.0/24)",
            )
        })?;
        let subnet = self.subnet(subnet_text)?;
        let hosts = (
            u32::from(subnet.network()) + 1,
            u32::from(subnet.broadcast()) - 1,
        );
        let in_hosts = |ip: Ipv4Addr| (hosts.0..=hosts.1).contains(&u32::from(ip));

        let gateway = match &spec.gateway {
            Some(text) => self.ipv4("gateway", text)?,
            None => Ipv4Addr::from(hosts.0),
        };
        if !in_hosts(gateway) {
            return Err(self.err(
                "gateway",
                format!("{gateway} is not a host address of {subnet}"),
            ));
        }

        // Across hosts, VXLAN's wrapping must fit the usual underlay.
        let default_mtu = match spec.evpn {
            Some(_) => DEFAULT_MTU - VXLAN_OVERHEAD,
            None => DEFAULT_MTU,
        };
        let mtu = spec.mtu.unwrap_or(default_mtu);
        if !(576..=65535).contains(&mtu) {
            return Err(self.err(
                "mtu",
                format!("{mtu} is out of range; allowed 576 to 65535"),
            ));
        }
        let anti_spoofing = spec.anti_spoofing.unwrap_or(true);
        let isolation = spec.isolation.unwrap_or(false);
        if isolation && !anti_spoofing {
            return Err(self.err(
                "isolation",
                "needs anti_spoofing: without it a VM can take another's MAC and receive its traffic",
            ));
        }
        let (policy, policy_enforced) = self.policy(spec.policy.take().unwrap_or_default())?;
        if !policy.is_open() && !anti_spoofing {
            return Err(self.err("policy", NO_POLICY_WITHOUT_ANTI_SPOOFING));
        }
        let evpn = (spec.evpn.take())
            .map(|e| self.evpn(e, subnet))
            .transpose()?;
        let ipv6 = self.ipv6(name, mode, mtu, evpn.as_ref(), &spec)?;
        let forwards = self.forwards(&spec.forwards)?;
        let dhcp_spec = match spec.dhcp {
            None => DhcpSpec::default(),
            Some(serde_norway::Value::Bool(on)) => DhcpSpec {
                enabled: Some(on),
                ..DhcpSpec::default()
            },
            Some(v) => serde_norway::from_value(v).map_err(|e| self.err("dhcp", e.to_string()))?,
        };
        let dhcp = self.dhcp(dhcp_spec, subnet, gateway, hosts)?;
        let dns = self.dns(name, spec.dns.unwrap_or_default())?;
        if policy.has_names() && !dns.enabled {
            return Err(self.err("policy", NO_NAMES_WITHOUT_DNS));
        }
        let socket = self.socket(name, spec.socket.take())?;

        let clone_subnet = spec
            .clone_subnet
            .as_deref()
            .map(|text| self.clone_subnet(text))
            .transpose()?;

        let (rate_limit, rate_enforced) = self.rate_limit(spec.rate_limit.take())?;
        let nat44 = spec.nat44.unwrap_or(mode == Mode::Shared);
        if nat44 && mode == Mode::Host {
            return Err(self.err(
                "nat44",
                "a host network never forwards outward; remove nat44 or use mode: shared",
            ));
        }

        Ok(NetworkConfig {
            name: name.into(),
            kind: Kind::Own(Own {
                host_only: mode == Mode::Host,
                subnet,
                gateway,
                dhcp,
                dns,
                mtu,
                nat44,
                ipv6,
                isolation,
                forwards,
                policy,
                clone_subnet,
                evpn,
            }),
            anti_spoofing,
            persistent: spec.persistent.unwrap_or(false),
            allow: self.allow(spec.allow)?,
            max_interfaces: self.limit("max_interfaces", spec.max_interfaces)?,
            max_interfaces_per_uid: self
                .limit("max_interfaces_per_uid", spec.max_interfaces_per_uid)?,
            socket,
            rate_limit,
            enforced: Enforced {
                policy: policy_enforced,
                rate_limit: rate_enforced,
            },
            audit_log: self.file(
                "audit_log",
                spec.audit_log.take(),
                "/var/log/linnet/sandbox.jsonl",
            )?,
            upstream_ca: self.file(
                "upstream_ca",
                spec.upstream_ca.take(),
                "/etc/linnet/internal-ca.pem",
            )?,
        })
    }

    fn socket(
        &self,
        name: &str,
        spec: Option<serde_norway::Value>,
    ) -> Result<Option<NetworkSocket>, ConfigError> {
        let path = match spec {
            None | Some(serde_norway::Value::Bool(false)) => return Ok(None),
            Some(serde_norway::Value::Bool(true)) => {
                // linnet.sock in the run directory is the daemon's own.
                if format!("{name}.sock") == SOCKET_NAME {
                    return Err(self.err(
                        "socket",
                        format!(
                            "{name}.sock would be the daemon's own socket; give a path (socket: /run/linnet/{name}-vms.sock)"
                        ),
                    ));
                }
                return Ok(Some(NetworkSocket::RunDir));
            }
            Some(serde_norway::Value::String(path)) => PathBuf::from(path),
            Some(other) => {
                return Err(self.err(
                    "socket",
                    format!("{other:?} is neither true, false nor a path"),
                ));
            }
        };
        if !path.is_absolute() || path.file_name().is_none() {
            return Err(self.err(
                "socket",
                format!(
                    "\"{}\" is not an absolute path to a socket (e.g. /run/linnet/{name}.sock)",
                    path.display()
                ),
            ));
        }
        // sockaddr_un holds 108 bytes with the terminating NUL.
        if path.as_os_str().len() > 107 {
            return Err(self.err(
                "socket",
                format!(
                    "\"{}\" is longer than the 107 bytes a unix socket path may have",
                    path.display()
                ),
            ));
        }
        Ok(Some(NetworkSocket::Path(path)))
    }

    /// `rate_limit: 100mbit` (each way) or `rate_limit: { in: 1gbit, out:
    /// 100mbit }`, with `enforced: true` in the second form; and whether
    /// it is enforced.
    fn rate_limit(
        &self,
        spec: Option<serde_norway::Value>,
    ) -> Result<(RateLimits, bool), ConfigError> {
        let rate = |key: &str, v: serde_norway::Value| match v {
            serde_norway::Value::String(text) => text
                .parse::<Rate>()
                .map_err(|e| self.err(key, e.to_string())),
            // A bare number: refused for its missing unit.
            serde_norway::Value::Number(n) => (n.to_string())
                .parse::<Rate>()
                .map_err(|e| self.err(key, e.to_string())),
            other => Err(self.err(
                key,
                format!("{other:?} is not a rate: write it as text, e.g. 100mbit"),
            )),
        };
        match spec {
            None => Ok((RateLimits::default(), false)),
            Some(serde_norway::Value::Mapping(map)) => {
                let mut limits = RateLimits::default();
                let mut enforced = false;
                for (k, v) in map {
                    match k.as_str() {
                        Some("in") => limits.received = Some(rate("rate_limit.in", v)?),
                        Some("out") => limits.sent = Some(rate("rate_limit.out", v)?),
                        Some("enforced") => {
                            enforced = v.as_bool().ok_or_else(|| {
                                self.err("rate_limit.enforced", "is true or false")
                            })?
                        }
                        _ => {
                            return Err(self.err(
                                "rate_limit",
                                format!("unknown key {k:?}: expected in (what a VM receives), out (what it sends) and enforced"),
                            ));
                        }
                    }
                }
                if enforced && limits.is_none() {
                    return Err(self.err(
                        "rate_limit.enforced",
                        "holds VMs to no limit: give in, out or both, or remove enforced",
                    ));
                }
                Ok((limits, enforced))
            }
            Some(v) => Ok((RateLimits::both(rate("rate_limit", v)?), false)),
        }
    }

    /// `KEY: PATH`, absolute, a file's (`example` shows one).
    fn file(
        &self,
        key: &str,
        spec: Option<String>,
        example: &str,
    ) -> Result<Option<PathBuf>, ConfigError> {
        let Some(text) = spec else {
            return Ok(None);
        };
        let path = PathBuf::from(&text);
        if !path.is_absolute() || text.ends_with('/') {
            return Err(self.err(
                key,
                format!("\"{text}\" is not an absolute path of a file (e.g. {example})"),
            ));
        }
        Ok(Some(path))
    }

    /// The policy, and whether it is enforced.
    fn policy(&self, spec: PolicySpec) -> Result<(Policy, bool), ConfigError> {
        let mut policy = Policy::default();
        for (i, text) in spec.egress.iter().enumerate() {
            let rule = text.parse().map_err(|e: PolicySpecError| {
                self.err(&format!("policy.egress[{i}]"), e.to_string())
            })?;
            policy.egress.push(rule);
        }
        for (i, text) in spec.ingress.iter().enumerate() {
            let rule = text.parse().map_err(|e: PolicySpecError| {
                self.err(&format!("policy.ingress[{i}]"), e.to_string())
            })?;
            policy.ingress.push(rule);
        }
        for (i, text) in spec.secrets.iter().enumerate() {
            let key = format!("policy.secrets[{i}]");
            let rule: SecretRule = text
                .parse()
                .map_err(|e: PolicySpecError| self.err(&key, e.to_string()))?;
            if !policy.reaches_secret_host(&rule.host) {
                return Err(self.err(
                    &key,
                    format!(
                        "{rule}: no egress rule lets a VM reach {} on port {SECRET_PORT}/tcp by name",
                        rule.host
                    ),
                ));
            }
            policy.network_secrets.push(rule);
        }
        if spec.enforced && policy.is_open() {
            return Err(self.err(
                "policy.enforced",
                "holds VMs to nothing: give egress or ingress rules, or remove enforced",
            ));
        }
        Ok((policy, spec.enforced))
    }

    fn ipv6(
        &self,
        name: &str,
        mode: Mode,
        mtu: u32,
        evpn: Option<&Evpn>,
        spec: &NetworkSpec,
    ) -> Result<Option<Ipv6Config>, ConfigError> {
        if !spec.ipv6.unwrap_or(true) {
            let set = [
                ("ipv6_prefix", spec.ipv6_prefix.is_some()),
                (
                    "router_advertisement",
                    spec.router_advertisement == Some(true),
                ),
                ("nat66", spec.nat66 == Some(true)),
            ];
            if let Some((key, _)) = set.iter().find(|(_, on)| *on) {
                return Err(self.err(key, "needs ipv6: true; remove it or turn IPv6 on"));
            }
            return Ok(None);
        }
        if mtu < 1280 {
            return Err(self.err(
                "mtu",
                format!("{mtu} is below 1280, the least IPv6 allows; raise mtu or set ipv6: false"),
            ));
        }
        let prefix = match (&spec.ipv6_prefix, evpn) {
            (Some(text), _) => self.ipv6_prefix(text)?,
            // Every host's bridge is the same router for the same prefix.
            (None, Some(evpn)) => addr6::ula_prefix_across_hosts(name, evpn.vni),
            (None, None) => addr6::ula_prefix(name),
        };
        let nat66 = spec.nat66.unwrap_or(mode == Mode::Shared);
        if nat66 && mode == Mode::Host {
            return Err(self.err(
                "nat66",
                "a host network never forwards outward; remove nat66 or use mode: shared",
            ));
        }
        Ok(Some(Ipv6Config {
            prefix,
            gateway: addr6::gateway(prefix),
            router_advertisement: spec.router_advertisement.unwrap_or(true),
            nat66,
        }))
    }

    fn ipv6_prefix(&self, text: &str) -> Result<Ipv6Net, ConfigError> {
        let key = "ipv6_prefix";
        let net: Ipv6Net = text.trim().parse().map_err(|_| {
            self.err(
                key,
                format!("\"{text}\" is not an IPv6 prefix (expected e.g. fd00:1234:5678::/64)"),
            )
        })?;
        if net.prefix_len() != 64 {
            return Err(self.err(
                key,
                format!(
                    "prefix /{} is not allowed; SLAAC needs a /64",
                    net.prefix_len()
                ),
            ));
        }
        if net.addr() != net.network() {
            return Err(self.err(
                key,
                format!(
                    "\"{text}\" has host bits set; did you mean {}?",
                    net.trunc()
                ),
            ));
        }
        let first = net.network().segments()[0];
        let unicast = !(first & 0xffc0 == 0xfe80 || first >> 8 == 0xff || first == 0);
        if !unicast {
            return Err(self.err(
                key,
                format!(
                    "{net} is not a unicast prefix; use a unique local (fd00::/8) or global one"
                ),
            ));
        }
        Ok(net)
    }

    fn forwards(&self, specs: &[ForwardSpec]) -> Result<Vec<StaticForward>, ConfigError> {
        let mut out: Vec<StaticForward> = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let key = format!("forwards[{i}]");
            let target = match (&spec.name, &spec.interface_id) {
                (Some(name), None) => {
                    types::validate_hostname(name).map_err(|e| self.err(&key, e.to_string()))?;
                    ForwardTarget::Name(name.clone())
                }
                (None, Some(id)) => {
                    ForwardTarget::InterfaceId(id.parse().map_err(|_| {
                        self.err(&key, format!("interface_id \"{id}\" is not a UUID"))
                    })?)
                }
                _ => {
                    return Err(self.err(&key, "needs exactly one of name and interface_id"));
                }
            };
            let forward: PortForward = spec
                .publish
                .parse()
                .map_err(|e: crate::forward::ForwardSpecError| self.err(&key, e.to_string()))?;
            if let Some(other) = out.iter().find(|o| o.forward.clashes_with(&forward)) {
                return Err(self.err(
                    &key,
                    format!(
                        "host port {} is already forwarded to {} by \"{}\"",
                        forward.host_port, other.target, other.forward
                    ),
                ));
            }
            out.push(StaticForward { target, forward });
        }
        Ok(out)
    }

    /// A network on a LAN (`mode: bridged` or `bridge`): its addresses,
    /// DHCP, DNS and router are the LAN's, so the keys for linnet's own are
    /// refused rather than ignored.
    fn lan_network(
        &self,
        name: &str,
        mode: Mode,
        mut spec: NetworkSpec,
    ) -> Result<NetworkConfig, ConfigError> {
        let linnets_own = [
            ("subnet", spec.subnet.is_some()),
            ("gateway", spec.gateway.is_some()),
            ("dhcp", spec.dhcp.is_some()),
            ("dns", spec.dns.is_some()),
            ("nat44", spec.nat44.is_some()),
            ("ipv6", spec.ipv6.is_some()),
            ("ipv6_prefix", spec.ipv6_prefix.is_some()),
            ("router_advertisement", spec.router_advertisement.is_some()),
            ("nat66", spec.nat66.is_some()),
            ("isolation", spec.isolation.is_some()),
            ("forwards", !spec.forwards.is_empty()),
            ("policy", spec.policy.is_some()),
            ("upstream_ca", spec.upstream_ca.is_some()),
            ("clone_subnet", spec.clone_subnet.is_some()),
            ("evpn", spec.evpn.is_some()),
        ];
        if let Some((key, _)) = linnets_own.iter().find(|(_, set)| *set) {
            return Err(self.err(
                key,
                format!(
                    "a {mode} network is on a LAN, whose own DHCP server, DNS and router serve its VMs; remove {key} (it is for mode: shared or host)"
                ),
            ));
        }
        let lan = match mode {
            Mode::Bridged => {
                if spec.bridge.is_some() {
                    return Err(self.err(
                        "bridge",
                        "is for mode: bridge; a bridged network puts VMs on its uplink's NIC",
                    ));
                }
                let uplink = spec.uplink.take().ok_or_else(|| {
                    self.err(
                        "uplink",
                        "is required for mode: bridged: the host NIC the VMs join (e.g. uplink: eth0)",
                    )
                })?;
                let macvtap_mode = spec.macvtap_mode.unwrap_or_default();
                if macvtap_mode == MacvtapMode::Passthru {
                    return Err(self.err(
                        "macvtap_mode",
                        "passthru is refused: it gives one VM the NIC itself, and its VMM could change the NIC's own MAC through its fd; use bridge, vepa or private",
                    ));
                }
                let host_access = spec.host_access.unwrap_or(false);
                if host_access && macvtap_mode != MacvtapMode::Bridge {
                    return Err(self.err(
                        "host_access",
                        format!(
                            "needs macvtap_mode: bridge; in {macvtap_mode} mode the host's macvlan could not reach the VMs"
                        ),
                    ));
                }
                Lan::Macvtap(MacvtapLan {
                    uplink: self.ifname("uplink", uplink)?,
                    mode: macvtap_mode,
                    host_access,
                })
            }
            _ => {
                for (key, set) in [
                    ("uplink", spec.uplink.is_some()),
                    ("macvtap_mode", spec.macvtap_mode.is_some()),
                    ("host_access", spec.host_access.is_some()),
                ] {
                    if set {
                        return Err(self.err(
                            key,
                            "is for mode: bridged; a bridge network's VMs join the bridge",
                        ));
                    }
                }
                let bridge = spec.bridge.take().ok_or_else(|| {
                    self.err(
                        "bridge",
                        "is required for mode: bridge: the existing bridge the VMs join (e.g. bridge: br0)",
                    )
                })?;
                Lan::Bridge(BridgeLan {
                    bridge: self.ifname("bridge", bridge)?,
                })
            }
        };
        if spec.mtu.is_some() {
            return Err(self.err(
                "mtu",
                format!(
                    "a {mode} network's MTU is its {}'s; set it there (ip link set {} mtu N) and remove mtu",
                    if mode == Mode::Bridged { "uplink" } else { "bridge" },
                    lan.link()
                ),
            ));
        }
        let (rate_limit, rate_enforced) = self.rate_limit(spec.rate_limit.take())?;
        Ok(NetworkConfig {
            name: name.into(),
            kind: Kind::Lan(lan),
            anti_spoofing: spec.anti_spoofing.unwrap_or(true),
            persistent: spec.persistent.unwrap_or(false),
            allow: self.allow(spec.allow)?,
            max_interfaces: self.limit("max_interfaces", spec.max_interfaces)?,
            max_interfaces_per_uid: self
                .limit("max_interfaces_per_uid", spec.max_interfaces_per_uid)?,
            socket: self.socket(name, spec.socket.take())?,
            rate_limit,
            enforced: Enforced {
                policy: false,
                rate_limit: rate_enforced,
            },
            audit_log: self.file(
                "audit_log",
                spec.audit_log.take(),
                "/var/log/linnet/sandbox.jsonl",
            )?,
            upstream_ca: None,
        })
    }

    /// A host interface's name as the kernel takes it.
    fn ifname(&self, key: &str, name: String) -> Result<String, ConfigError> {
        let bad = name.is_empty()
            || name.len() > 15
            || name == "."
            || name == ".."
            || name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace());
        if bad {
            return Err(self.err(
                key,
                format!(
                    "\"{name}\" is not an interface name (1 to 15 bytes, no '/', ':' or spaces)"
                ),
            ));
        }
        Ok(name)
    }

    fn limit(&self, key: &str, value: Option<u32>) -> Result<Option<u32>, ConfigError> {
        match value {
            Some(0) => Err(self.err(
                key,
                "0 would refuse every attach; use at least 1, or leave it out for no limit",
            )),
            other => Ok(other),
        }
    }

    /// A range for clones' unique addresses: any IPv4 subnet with room for
    /// at least a few (the overlaps are checked across networks).
    fn clone_subnet(&self, text: &str) -> Result<Ipv4Net, ConfigError> {
        let net: Ipv4Net = text.trim().parse().map_err(|_| {
            self.err(
                "clone_subnet",
                format!("\"{text}\" is not an IPv4 subnet (expected e.g. 198.18.200.0/24)"),
            )
        })?;
        if !(8..=29).contains(&net.prefix_len()) || net.addr() != net.network() {
            return Err(self.err(
                "clone_subnet",
                format!(
                    "\"{text}\" is not a subnet of /8 to /29 without host bits (e.g. {}/24)",
                    net.network()
                ),
            ));
        }
        Ok(net)
    }

    fn subnet(&self, text: &str) -> Result<Ipv4Net, ConfigError> {
        let net: Ipv4Net = text.trim().parse().map_err(|_| {
            self.err(
                "subnet",
                format!("\"{text}\" is not an IPv4 subnet (expected e.g. 192.168.107.0/24)"),
            )
        })?;
        if !(8..=29).contains(&net.prefix_len()) {
            return Err(self.err(
                "subnet",
                format!("prefix /{} is not allowed; use /8 to /29", net.prefix_len()),
            ));
        }
        if net.addr() != net.network() {
            return Err(self.err(
                "subnet",
                format!(
                    "\"{text}\" has host bits set; did you mean {}?",
                    net.trunc()
                ),
            ));
        }
        Ok(net)
    }

    fn dhcp(
        &self,
        spec: DhcpSpec,
        subnet: Ipv4Net,
        gateway: Ipv4Addr,
        hosts: (u32, u32),
    ) -> Result<DhcpConfig, ConfigError> {
        let in_hosts = |ip: Ipv4Addr| (hosts.0..=hosts.1).contains(&u32::from(ip));
        let (range_start, range_end) = match &spec.range {
            None => {
                // Everything but the gateway, which sits at one end by default.
                let g = u32::from(gateway);
                let first = if g == hosts.0 { hosts.0 + 1 } else { hosts.0 };
                let last = if g == hosts.1 { hosts.1 - 1 } else { hosts.1 };
                (Ipv4Addr::from(first), Ipv4Addr::from(last))
            }
            Some(text) => {
                let (a, b) = text.split_once('-').ok_or_else(|| {
                    self.err(
                        "dhcp.range",
                        format!(
                            "\"{text}\" is not FIRST-LAST (e.g. 192.168.107.10-192.168.107.99)"
                        ),
                    )
                })?;
                (self.ipv4("dhcp.range", a)?, self.ipv4("dhcp.range", b)?)
            }
        };
        for ip in [range_start, range_end] {
            if !in_hosts(ip) {
                return Err(self.err(
                    "dhcp.range",
                    format!("{ip} is not a host address of {subnet}"),
                ));
            }
        }
        if range_start > range_end {
            return Err(self.err(
                "dhcp.range",
                format!("{range_start} comes after {range_end}"),
            ));
        }
        let lease_time = spec.lease_time.unwrap_or(DEFAULT_LEASE_TIME);
        if !(2..=7 * 86400).contains(&lease_time) {
            return Err(self.err(
                "dhcp.lease_time",
                format!("{lease_time} is out of range; allowed 2 to 604800 seconds"),
            ));
        }
        let mut static_leases: Vec<StaticLease> = Vec::new();
        for (i, s) in spec.static_leases.iter().enumerate() {
            let key = format!("dhcp.static[{i}]");
            let ip = self.ipv4(&key, &s.ip)?;
            if !in_hosts(ip) || ip == gateway {
                return Err(self.err(&key, format!("{ip} is not a free host address of {subnet}")));
            }
            let mac = match &s.mac {
                Some(m) => Some(
                    m.parse::<MacAddr>()
                        .map_err(|e| self.err(&key, e.to_string()))?,
                ),
                None => None,
            };
            let interface_id =
                match &s.interface_id {
                    Some(id) => Some(id.parse::<InterfaceId>().map_err(|_| {
                        self.err(&key, format!("interface_id \"{id}\" is not a UUID"))
                    })?),
                    None => None,
                };
            if mac.is_none() && interface_id.is_none() {
                return Err(self.err(&key, "needs a mac or an interface_id to match"));
            }
            if static_leases.iter().any(|other| other.ip == ip) {
                return Err(self.err(&key, format!("{ip} is given to two static leases")));
            }
            static_leases.push(StaticLease {
                ip,
                mac,
                interface_id,
            });
        }
        Ok(DhcpConfig {
            enabled: spec.enabled.unwrap_or(true),
            range_start,
            range_end,
            lease_time,
            static_leases,
        })
    }

    fn dns(&self, network: &str, spec: DnsSpec) -> Result<DnsConfig, ConfigError> {
        let mut upstream = Vec::new();
        for text in spec.upstream.unwrap_or_default() {
            let addr = match text.parse::<IpAddr>() {
                Ok(ip) => SocketAddr::new(ip, 53),
                Err(_) => text.parse::<SocketAddr>().map_err(|_| {
                    self.err(
                        "dns.upstream",
                        format!("\"{text}\" is not an IP address (optionally IP:PORT)"),
                    )
                })?,
            };
            upstream.push(addr);
        }
        let domain = spec.domain.unwrap_or_else(|| format!("{network}.linnet"));
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        for label in domain.split('.') {
            types::validate_hostname(label).map_err(|e| self.err("dns.domain", e.to_string()))?;
        }
        let ttl = spec.learned_ttl.unwrap_or_default();
        let learned_ttl = TtlBounds {
            floor: ttl.floor.unwrap_or(DEFAULT_TTL.floor),
            ceiling: ttl.ceiling.unwrap_or(DEFAULT_TTL.ceiling),
        };
        if learned_ttl.floor == 0 {
            return Err(self.err(
                "dns.learned_ttl.floor",
                "must be at least 1 second: an address learned for 0 seconds is gone before the VM connects",
            ));
        }
        if learned_ttl.ceiling < learned_ttl.floor {
            return Err(self.err(
                "dns.learned_ttl.ceiling",
                format!(
                    "{} is below the floor ({}): make the ceiling at least the floor",
                    learned_ttl.ceiling, learned_ttl.floor
                ),
            ));
        }
        if learned_ttl.ceiling > MAX_LEARNED_TTL {
            return Err(self.err(
                "dns.learned_ttl.ceiling",
                format!(
                    "{} is over a week ({MAX_LEARNED_TTL} seconds)",
                    learned_ttl.ceiling
                ),
            ));
        }
        Ok(DnsConfig {
            enabled: spec.enabled.unwrap_or(true),
            upstream,
            domain,
            learned_ttl,
        })
    }

    fn allow(&self, spec: Option<AllowSpec>) -> Result<Allow, ConfigError> {
        let Some(spec) = spec else {
            // Default: root, and the `linnet` group if the host has one.
            let groups = nix::unistd::Group::from_name(DEFAULT_ALLOW_GROUP)
                .ok()
                .flatten()
                .map(|g| vec![(g.name, g.gid.as_raw())])
                .unwrap_or_default();
            return Ok(Allow {
                users: vec![("root".into(), 0)],
                groups,
            });
        };
        let mut allow = Allow {
            users: Vec::new(),
            groups: Vec::new(),
        };
        for name in spec.users {
            let uid = match name.parse::<u32>() {
                Ok(uid) => uid,
                Err(_) => nix::unistd::User::from_name(&name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| {
                        self.err(
                            "allow.users",
                            format!("no user named \"{name}\" on this host"),
                        )
                    })?
                    .uid
                    .as_raw(),
            };
            allow.users.push((name, uid));
        }
        for name in spec.groups {
            let gid = match name.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => nix::unistd::Group::from_name(&name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| {
                        self.err(
                            "allow.groups",
                            format!("no group named \"{name}\" on this host"),
                        )
                    })?
                    .gid
                    .as_raw(),
            };
            allow.groups.push((name, gid));
        }
        Ok(allow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(yaml, "test.yaml")
    }

    fn message(yaml: &str) -> String {
        load(yaml)
            .expect_err("config should be refused")
            .to_string()
    }

    /// What network `name` of `cfg`, one of linnet's own, has as such.
    fn own<'a>(cfg: &'a Config, name: &str) -> &'a Own {
        cfg.network(name)
            .unwrap()
            .own()
            .expect("one of linnet's own")
    }

    #[test]
    fn clone_ranges_default_apart_and_are_checked_for_overlaps() {
        let cfg = load(
            "networks:\n  a:\n    subnet: 10.1.0.0/16\n  b:\n    subnet: 10.3.0.0/16\n  c:\n    subnet: 10.4.0.0/24\n    clone_subnet: 10.99.0.0/16\n",
        )
        .unwrap();
        let range = |n: &str| own(&cfg, n).clone_subnet.unwrap().to_string();
        // a's and b's preferred /24 is the same: b takes the next one.
        assert_eq!(range("a"), "198.19.0.0/24");
        assert_eq!(range("b"), "198.19.1.0/24");
        assert_eq!(range("c"), "10.99.0.0/16");
        let m = message("networks:\n  shared:\n    clone_subnet: 192.168.105.0/25\n");
        assert!(m.contains("overlaps the network's own subnet"), "{m}");
        let m = message("networks:\n  shared:\n    clone_subnet: 192.168.106.0/24\n");
        assert!(
            m.contains("overlaps subnet 192.168.106.0/24 of network \"host\""),
            "{m}"
        );
        let m = message(
            "networks:\n  shared:\n    clone_subnet: 10.5.0.0/16\n  host:\n    clone_subnet: 10.5.1.0/24\n",
        );
        assert!(m.contains("clone_subnet"), "{m}");
        let m = message("networks:\n  shared:\n    clone_subnet: 10.5.0.1/16\n");
        assert!(m.contains("without host bits"), "{m}");
        let m = message(
            "networks:\n  lan:\n    mode: bridge\n    bridge: br0\n    clone_subnet: 10.5.0.0/16\n",
        );
        assert!(m.contains("remove clone_subnet"), "{m}");
        let lan = load("networks:\n  lan:\n    mode: bridge\n    bridge: br0\n").unwrap();
        assert!(
            lan.network("lan").unwrap().own().is_none(),
            "no clone range"
        );
    }

    #[test]
    fn a_rootless_daemon_refuses_the_lan_and_sockets_and_serves_its_user_alone() {
        let dns = Ipv4Addr::new(10, 0, 2, 3);
        let cfg = Config::builtin().for_rootless(dns).unwrap();
        let shared = cfg.network("shared").unwrap();
        assert!(shared.allow.permits(0, &[]));
        assert!(!shared.allow.permits(1000, &[1000]));
        assert_eq!(
            own(&cfg, "shared").dns.upstream,
            vec!["10.0.2.3:53".parse().unwrap()]
        );
        assert!(!cfg.firewall.docker_user);
        let named = load("networks:\n  shared:\n    dns: { upstream: [192.0.2.53] }\n")
            .unwrap()
            .for_rootless(dns)
            .unwrap();
        assert_eq!(
            own(&named, "shared").dns.upstream,
            vec!["192.0.2.53:53".parse().unwrap()]
        );
        let lan = load("networks:\n  lan:\n    mode: bridge\n    bridge: br0\n").unwrap();
        let m = lan.for_rootless(dns).unwrap_err().to_string();
        assert!(
            m.contains("network \"lan\": mode: bridge puts VMs on the host's LAN"),
            "{m}"
        );
        assert!(m.contains("sudo linnet daemon"), "{m}");
        let docker = load("firewall:\n  docker_user: true\n").unwrap();
        let m = docker.for_rootless(dns).unwrap_err().to_string();
        assert!(
            m.contains("firewall.docker_user: Docker's DOCKER-USER chain is the host's"),
            "{m}"
        );
        let sock = load("networks:\n  shared:\n    socket: true\n").unwrap();
        let m = sock.for_rootless(dns).unwrap_err().to_string();
        assert!(
            m.contains("socket: a network's own socket is the system daemon's"),
            "{m}"
        );
    }

    #[test]
    fn dhcp_false_is_short_for_enabled_false() {
        let cfg = load("networks:\n  shared:\n    dhcp: false\n  host:\n    dhcp: { enabled: false, lease_time: 60 }\n").unwrap();
        assert!(!own(&cfg, "shared").dhcp.enabled);
        assert!(!own(&cfg, "host").dhcp.enabled);
        assert_eq!(own(&cfg, "host").dhcp.lease_time, 60);
        let m = message("networks:\n  shared:\n    dhcp: { enable: false }\n");
        assert!(
            m.contains("network \"shared\": dhcp: unknown field `enable`"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    dhcp: 3\n");
        assert!(m.contains("network \"shared\": dhcp:"), "{m}");
    }

    #[test]
    fn docker_user_is_on_unless_turned_off() {
        assert!(Config::builtin().firewall.docker_user);
        let cfg = load("firewall:\n  docker_user: false\n").unwrap();
        assert!(!cfg.firewall.docker_user);
        let m = message("firewall:\n  docker: false\n");
        assert!(m.contains("unknown field `docker`"), "{m}");
    }

    #[test]
    fn builtins_need_no_file() {
        let cfg = Config::builtin();
        let shared = cfg.network("shared").unwrap();
        assert_eq!(shared.mode(), Mode::Shared);
        let own_shared = own(&cfg, "shared");
        assert_eq!(own_shared.subnet.to_string(), "192.168.105.0/24");
        assert_eq!(own_shared.gateway, Ipv4Addr::new(192, 168, 105, 1));
        assert_eq!(own_shared.dhcp.range_start, Ipv4Addr::new(192, 168, 105, 2));
        assert_eq!(own_shared.dhcp.range_end, Ipv4Addr::new(192, 168, 105, 254));
        assert!(own_shared.nat44 && own_shared.dns.enabled && own_shared.dhcp.enabled);
        assert_eq!(own_shared.dns.domain, "shared.linnet");
        let host = cfg.network("host").unwrap();
        assert_eq!((host.mode(), own(&cfg, "host").nat44), (Mode::Host, false));
        assert_eq!(own(&cfg, "host").subnet.to_string(), "192.168.106.0/24");
        assert!(shared.allow.permits(0, &[]));
        assert!(!shared.allow.permits(1000, &[]));
    }

    #[test]
    fn file_overrides_and_adds_networks() {
        let cfg = load(
            "networks:
  shared:
    subnet: 10.10.0.0/24
    dhcp: { lease_time: 60, range: 10.10.0.100-10.10.0.120 }
    dns: { upstream: [9.9.9.9, '1.1.1.1:5353'], domain: lab.example }
  lab:
    mode: host
    subnet: 10.20.0.0/16
    gateway: 10.20.255.254
    mtu: 9000
    persistent: true
    allow: { users: [root, '1000'] }
    dhcp:
      static:
        - { mac: '52:54:00:00:00:01', ip: 10.20.0.5 }
",
        )
        .unwrap();
        let shared = own(&cfg, "shared");
        assert_eq!(shared.subnet.to_string(), "10.10.0.0/24");
        assert_eq!(shared.gateway.to_string(), "10.10.0.1");
        assert_eq!(shared.dhcp.lease_time, 60);
        assert_eq!(shared.dhcp.range_start.to_string(), "10.10.0.100");
        assert_eq!(shared.dns.upstream[1].to_string(), "1.1.1.1:5353");
        assert_eq!(shared.dns.domain, "lab.example");
        let lab_net = cfg.network("lab").unwrap();
        let lab = own(&cfg, "lab");
        assert_eq!(
            (lab_net.mode(), lab.mtu, lab_net.persistent),
            (Mode::Host, 9000, true)
        );
        assert_eq!(lab.dhcp.range_start.to_string(), "10.20.0.1");
        assert_eq!(lab.dhcp.range_end.to_string(), "10.20.255.253");
        assert_eq!(lab.dhcp.static_leases[0].ip.to_string(), "10.20.0.5");
        assert!(lab_net.allow.permits(1000, &[]));
        assert!(cfg.network("host").is_some(), "built-ins stay");
    }

    #[test]
    fn bad_values_name_file_network_key_and_fix() {
        let m = message("networks:\n  shared:\n    subnet: 10.0.0.1/24\n");
        assert_eq!(
            m,
            "test.yaml: network \"shared\": subnet: \"10.0.0.1/24\" has host bits set; did you mean 10.0.0.0/24?"
        );
        let m = message("networks:\n  lab:\n    mode: host\n");
        assert!(m.contains("network \"lab\": subnet: is required"), "{m}");
        let m = message("networks:\n  lab:\n    subnet: banana\n");
        assert!(m.contains("\"banana\" is not an IPv4 subnet"), "{m}");
        let m = message("networks:\n  shared:\n    gateway: 192.168.105.255\n");
        assert!(
            m.contains("gateway: 192.168.105.255 is not a host address"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    mtu: 100\n");
        assert!(m.contains("mtu: 100 is out of range"), "{m}");
        let m = message("networks:\n  shared:\n    isolation: true\n    anti_spoofing: false\n");
        assert!(m.contains("isolation: needs anti_spoofing"), "{m}");
        let m = message("networks:\n  shared:\n    max_interfaces_per_uid: 0\n");
        assert!(
            m.contains("max_interfaces_per_uid: 0 would refuse every attach"),
            "{m}"
        );
        let cfg =
            load("networks:\n  shared:\n    max_interfaces: 10\n    max_interfaces_per_uid: 2\n")
                .unwrap();
        let shared = cfg.network("shared").unwrap();
        assert_eq!(
            (shared.max_interfaces, shared.max_interfaces_per_uid),
            (Some(10), Some(2))
        );
        let m = message("networks:\n  shared:\n    mtu: 1000\n");
        assert!(
            m.contains("mtu: 1000 is below 1280, the least IPv6 allows"),
            "{m}"
        );
        assert!(load("networks:\n  shared:\n    mtu: 1000\n    ipv6: false\n").is_ok());
        let m = message("networks:\n  host:\n    nat44: true\n");
        assert!(m.contains("network \"host\": nat44:"), "{m}");
        let m = message("networks:\n  shared:\n    dhcp: { range: 192.168.105.9-192.168.105.3 }\n");
        assert!(
            m.contains("dhcp.range: 192.168.105.9 comes after 192.168.105.3"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    dhcp: { range: 10.0.0.1-10.0.0.5 }\n");
        assert!(
            m.contains("dhcp.range: 10.0.0.1 is not a host address of 192.168.105.0/24"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    dhcp: { static: [ { ip: 192.168.105.9 } ] }\n");
        assert!(
            m.contains("dhcp.static[0]: needs a mac or an interface_id"),
            "{m}"
        );
        let m = message(
            "networks:\n  shared:\n    dhcp: { static: [ { ip: 192.168.105.9, mac: 'zz' } ] }\n",
        );
        assert!(m.contains("is not a MAC address"), "{m}");
        let m = message("networks:\n  shared:\n    allow: { users: [no-such-user-here] }\n");
        assert!(
            m.contains("allow.users: no user named \"no-such-user-here\""),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    dns: { upstream: [resolver] }\n");
        assert!(
            m.contains("dns.upstream: \"resolver\" is not an IP address"),
            "{m}"
        );
        let m = message("networks:\n  wayyyyyytoolong:\n    subnet: 10.1.0.0/24\n");
        assert!(
            m.contains("network \"wayyyyyytoolong\": name:") && m.contains("at most 12"),
            "{m}"
        );
        let m = message("networks:\n  lab:\n    mode: bridged\n    subnet: 10.1.0.0/24\n");
        assert!(m.contains("subnet: a bridged network is on a LAN"), "{m}");
    }

    #[test]
    fn lan_networks_name_their_uplink_or_bridge_and_leave_addressing_to_the_lan() {
        let cfg = Config::from_yaml(
            "networks:
  lan:
    mode: bridged
    uplink: eth0
    macvtap_mode: private
  lan2:
    mode: bridged
    uplink: eth1
    host_access: true
  br:
    mode: bridge
    bridge: br0
",
            "t.yaml",
        )
        .unwrap();
        let lan = cfg.network("lan").unwrap();
        assert_eq!(
            lan.kind,
            Kind::Lan(Lan::Macvtap(MacvtapLan {
                uplink: "eth0".into(),
                mode: MacvtapMode::Private,
                host_access: false
            }))
        );
        assert!(lan.mode().on_lan() && lan.anti_spoofing);
        // None of linnet's DHCP, DNS, NAT, IPv6, forwards or policies.
        assert!(lan.own().is_none() && lan.ipv6().is_none() && lan.forwards().is_empty());
        assert!(lan.policy().is_open() && !lan.isolation());
        assert!(matches!(
            cfg.network("lan2").unwrap().lan(),
            Some(Lan::Macvtap(MacvtapLan {
                mode: MacvtapMode::Bridge,
                host_access: true,
                ..
            }))
        ));
        let br = cfg.network("br").unwrap();
        assert_eq!(
            (br.mode(), br.lan()),
            (
                Mode::Bridge,
                Some(&Lan::Bridge(BridgeLan {
                    bridge: "br0".into()
                }))
            )
        );
    }

    #[test]
    fn lan_networks_refuse_what_is_linnets_own_and_keys_of_the_other_kind() {
        let m = message("networks:\n  lan:\n    mode: bridged\n");
        assert!(m.contains("uplink: is required for mode: bridged"), "{m}");
        let m = message("networks:\n  br:\n    mode: bridge\n");
        assert!(m.contains("bridge: is required for mode: bridge"), "{m}");
        let m = message("networks:\n  br:\n    mode: bridge\n    bridge: br0\n    dhcp: true\n");
        assert!(m.contains("dhcp: a bridge network is on a LAN"), "{m}");
        let m = message("networks:\n  br:\n    mode: bridge\n    bridge: br0\n    uplink: eth0\n");
        assert!(m.contains("uplink: is for mode: bridged"), "{m}");
        let m =
            message("networks:\n  lan:\n    mode: bridged\n    uplink: eth0\n    bridge: br0\n");
        assert!(m.contains("bridge: is for mode: bridge"), "{m}");
        let m = message(
            "networks:\n  lan:\n    mode: bridged\n    uplink: eth0\n    macvtap_mode: vepa\n    host_access: true\n",
        );
        assert!(m.contains("host_access: needs macvtap_mode: bridge"), "{m}");
        let m = message("networks:\n  br:\n    mode: bridge\n    bridge: br0\n    mtu: 9000\n");
        assert!(
            m.contains("mtu: a bridge network's MTU is its bridge's"),
            "{m}"
        );
        let m = message(
            "networks:\n  lan:\n    mode: bridged\n    uplink: eth0\n    macvtap_mode: passthru\n",
        );
        assert!(m.contains("passthru is refused"), "{m}");
        let m = message("networks:\n  lan:\n    mode: bridged\n    uplink: a/b\n");
        assert!(m.contains("is not an interface name"), "{m}");
        let m = message(
            "networks:\n  lan:\n    mode: bridged\n    uplink: waytoolongname0\n    x: 1\n",
        );
        assert!(m.contains("unknown field `x`"), "{m}");
        let m = message("networks:\n  shared:\n    uplink: eth0\n");
        assert!(
            m.contains("uplink: is for mode: bridged or bridge, and this network is shared"),
            "{m}"
        );
    }

    #[test]
    fn unknown_keys_and_bad_yaml_are_refused_with_location() {
        let m = message("networks:\n  shared:\n    subnett: 10.0.0.0/24\n");
        assert!(
            m.starts_with("test.yaml: ") && m.contains("unknown field `subnett`"),
            "{m}"
        );
        let m = message("networks: [\n");
        assert!(m.starts_with("test.yaml: ") && m.contains("line"), "{m}");
        let m = message("networks:\n  shared:\n    mode: nat\n");
        assert!(m.contains("unknown variant `nat`"), "{m}");
    }

    #[test]
    fn ipv6_is_on_by_default_with_a_derived_prefix() {
        let cfg = Config::builtin();
        let shared = cfg.network("shared").unwrap().ipv6().unwrap().clone();
        assert_eq!(shared.prefix, addr6::ula_prefix("shared"));
        assert_eq!(shared.gateway, addr6::gateway(shared.prefix));
        assert!(shared.router_advertisement && shared.nat66);
        let host = cfg.network("host").unwrap().ipv6().unwrap().clone();
        assert!(
            host.router_advertisement && !host.nat66,
            "host never forwards out"
        );
        assert_ne!(host.prefix, shared.prefix);

        let cfg = load(
            "networks:
  shared:
    ipv6_prefix: fd00:1:2:3::/64
    router_advertisement: false
    nat66: false
  host:
    ipv6: false
",
        )
        .unwrap();
        let shared = cfg.network("shared").unwrap().ipv6().unwrap().clone();
        assert_eq!(shared.prefix.to_string(), "fd00:1:2:3::/64");
        assert_eq!(shared.gateway.to_string(), "fd00:1:2:3::1");
        assert!(!shared.router_advertisement && !shared.nat66);
        assert!(cfg.network("host").unwrap().ipv6().is_none());
    }

    #[test]
    fn bad_ipv6_settings_are_refused() {
        let m = message("networks:\n  shared:\n    ipv6_prefix: fd00::/48\n");
        assert!(
            m.contains("ipv6_prefix: prefix /48 is not allowed; SLAAC needs a /64"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    ipv6_prefix: fd00::1/64\n");
        assert!(
            m.contains("has host bits set; did you mean fd00::/64?"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    ipv6_prefix: fe80::/64\n");
        assert!(m.contains("is not a unicast prefix"), "{m}");
        let m = message("networks:\n  shared:\n    ipv6_prefix: 10.0.0.0/8\n");
        assert!(m.contains("is not an IPv6 prefix"), "{m}");
        let m = message("networks:\n  host:\n    nat66: true\n");
        assert!(
            m.contains("network \"host\": nat66: a host network never forwards"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    ipv6: false\n    nat66: true\n");
        assert!(m.contains("nat66: needs ipv6: true"), "{m}");
        let m = message(
            "networks:\n  host:\n    ipv6_prefix: fd00:1::/64\n  shared:\n    ipv6_prefix: fd00:1::/64\n",
        );
        assert!(m.contains("is also the prefix of network"), "{m}");
    }

    #[test]
    fn a_networks_rate_limit_is_one_rate_each_way_or_one_per_way() {
        let cfg = load("networks:\n  shared:\n    rate_limit: 100mbit/1mb\n").unwrap();
        let both = cfg.network("shared").unwrap().rate_limit;
        assert_eq!(both, RateLimits::both("100mbit/1mb".parse().unwrap()));
        let cfg = load("networks:\n  shared:\n    rate_limit: { out: 1gbit }\n").unwrap();
        let out = cfg.network("shared").unwrap().rate_limit;
        assert_eq!(
            (out.received, out.sent),
            (None, Some("1gbit".parse().unwrap()))
        );
        assert!(
            load("networks:\n  shared: {}\n")
                .unwrap()
                .network("shared")
                .unwrap()
                .rate_limit
                .is_none()
        );
        for (yaml, says) in [
            (
                "rate_limit: 100",
                "rate_limit: \"100\": rate \"100\" needs a unit",
            ),
            (
                "rate_limit: { in: 5 }",
                "rate_limit.in: \"5\": rate \"5\" needs a unit",
            ),
            ("rate_limit: { in: [1] }", "rate_limit.in: Sequence"),
            (
                "rate_limit: { in: 1kbit }",
                "rate_limit.in: \"1kbit\": the rate must be",
            ),
            ("rate_limit: { up: 1mbit }", "rate_limit: unknown key"),
        ] {
            let m = message(&format!("networks:\n  shared:\n    {yaml}\n"));
            assert!(m.contains(says), "{yaml}: {m}");
        }
    }

    #[test]
    fn a_networks_secret_rules_name_hosts_its_egress_reaches_on_443() {
        let cfg = load(
            "networks:\n  shared:\n    policy: { egress: ['*.example.com:443'], secrets: ['TOKEN@api.example.com'] }\n",
        )
        .unwrap();
        let policy = cfg.network("shared").unwrap().policy();
        assert_eq!(
            (policy.network_secrets.iter().map(|r| r.to_string())).collect::<Vec<_>>(),
            ["TOKEN@api.example.com"]
        );
        assert!(
            policy.secrets.is_empty(),
            "no owner's rule in a network's policy"
        );
        for (yaml, says) in [
            (
                "policy: { egress: ['api.example.com:8443'], secrets: ['TOKEN@api.example.com'] }",
                "policy.secrets[0]: TOKEN@api.example.com: no egress rule lets a VM reach api.example.com on port 443/tcp by name",
            ),
            (
                "policy: { egress: ['api.example.com:443'], secrets: ['TOKEN api.example.com'] }",
                "policy.secrets[0]: \"TOKEN api.example.com\": no '@'",
            ),
        ] {
            let m = message(&format!("networks:\n  shared:\n    {yaml}\n"));
            assert!(m.contains(says), "{yaml}: {m}");
        }
    }

    #[test]
    fn an_enforced_policy_and_rate_are_ceilings_and_must_hold_something() {
        let cfg = load(
            "networks:\n  shared:\n    policy: { egress: ['api.example.com:443/tcp'], enforced: true }\n    rate_limit: { out: 20mbit, enforced: true }\n",
        )
        .unwrap();
        let shared = cfg.network("shared").unwrap();
        assert_eq!(
            shared.enforced,
            Enforced {
                policy: true,
                rate_limit: true
            }
        );
        let ceiling = shared.ceiling();
        assert_eq!(ceiling.rules, Some(shared.policy()));
        assert_eq!(ceiling.rate, Some(&shared.rate_limit));
        // Not enforced unless said: a default only.
        let cfg = load(
            "networks:\n  shared:\n    policy: { ingress: ['22/tcp'] }\n    rate_limit: 20mbit\n",
        )
        .unwrap();
        assert!(!cfg.network("shared").unwrap().ceiling().is_set());
        for (yaml, says) in [
            (
                "policy: { enforced: true }",
                "policy.enforced: holds VMs to nothing",
            ),
            (
                "rate_limit: { enforced: true }",
                "rate_limit.enforced: holds VMs to no limit",
            ),
            (
                "rate_limit: { out: 1mbit, enforced: yes please }",
                "rate_limit.enforced: is true or false",
            ),
            (
                "policy: { egress: ['10.0.0.0/8'], enforced: maybe }",
                "policy.enforced: invalid type",
            ),
        ] {
            let m = message(&format!("networks:\n  shared:\n    {yaml}\n"));
            assert!(m.contains(says), "{yaml}: {m}");
        }
    }

    #[test]
    fn an_audit_log_is_an_absolute_path() {
        let cfg =
            load("networks:\n  shared:\n    audit_log: /var/log/linnet/shared.jsonl\n").unwrap();
        assert_eq!(
            cfg.network("shared").unwrap().audit_log.as_deref(),
            Some(Path::new("/var/log/linnet/shared.jsonl"))
        );
        assert_eq!(cfg.network("host").unwrap().audit_log, None);
        for bad in ["audit.jsonl", "/var/log/"] {
            let m = message(&format!("networks:\n  shared:\n    audit_log: {bad}\n"));
            assert!(m.contains("audit_log: \""), "{bad}: {m}");
            assert!(
                m.contains("is not an absolute path of a file"),
                "{bad}: {m}"
            );
        }
    }

    #[test]
    fn a_policy_needs_anti_spoofing() {
        let m = message(
            "networks:\n  shared:\n    anti_spoofing: false\n    policy: { ingress: ['22/tcp'] }\n",
        );
        assert!(
            m.contains("network \"shared\": policy: needs anti_spoofing"),
            "{m}"
        );
        assert!(load("networks:\n  shared:\n    anti_spoofing: false\n    policy: {}\n").is_ok());
    }

    #[test]
    fn policy_defaults_are_parsed_and_checked() {
        let cfg = load(
            "networks:\n  shared:\n    policy: { egress: ['198.51.100.1:8080/tcp'], ingress: ['8000/tcp'] }\n",
        )
        .unwrap();
        let p = &cfg.network("shared").unwrap().policy();
        assert_eq!(p.egress[0].to_string(), "198.51.100.1:8080/tcp");
        assert_eq!(p.ingress[0].to_string(), "8000/tcp");
        assert!(cfg.network("host").unwrap().policy().is_open());
        let m = message("networks:\n  shared:\n    policy: { ingress: ['0/tcp'] }\n");
        assert!(
            m.contains("policy.ingress[0]: \"0/tcp\": port 0 is out of range"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    policy: { egres: [] }\n");
        assert!(m.contains("unknown field `egres`"), "{m}");
    }

    #[test]
    fn names_in_a_default_policy_need_dns_and_learned_ttls_are_bounded() {
        let cfg = load(
            "networks:\n  shared:\n    policy: { egress: ['*.Example.com:443/tcp'] }\n    dns: { learned_ttl: { floor: 5 } }\n",
        )
        .unwrap();
        let shared = cfg.network("shared").unwrap();
        assert_eq!(
            shared.policy().egress[0].to_string(),
            "*.example.com:443/tcp"
        );
        let ttl = shared.own().unwrap().dns.learned_ttl;
        assert_eq!((ttl.floor, ttl.ceiling), (5, DEFAULT_TTL.ceiling));
        let host = cfg.network("host").unwrap().own().unwrap().dns.learned_ttl;
        assert_eq!(host, DEFAULT_TTL);
        let m = message(
            "networks:\n  shared:\n    policy: { egress: ['api.example.com'] }\n    dns: { enabled: false }\n",
        );
        assert!(
            m.contains("names in a connect policy need linnet's DNS"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    policy: { egress: ['a..b'] }\n");
        assert!(m.contains("policy.egress[0]: \"a..b\""), "{m}");
        let m = message("networks:\n  shared:\n    dns: { learned_ttl: { floor: 0 } }\n");
        assert!(
            m.contains("dns.learned_ttl.floor: must be at least 1 second"),
            "{m}"
        );
        let m =
            message("networks:\n  shared:\n    dns: { learned_ttl: { floor: 90, ceiling: 60 } }\n");
        assert!(m.contains("60 is below the floor (90)"), "{m}");
        let m = message("networks:\n  shared:\n    dns: { learned_ttl: { ceiling: 9999999 } }\n");
        assert!(m.contains("is over a week"), "{m}");
    }

    #[test]
    fn static_forwards_are_parsed_and_checked() {
        let cfg = load(
            "networks:
  shared:
    forwards:
      - { name: web, publish: '8080:80' }
      - { interface_id: 00000000-0000-0000-0000-000000000001, publish: '127.0.0.1:5353:53/udp' }
",
        )
        .unwrap();
        let f = &cfg.network("shared").unwrap().forwards();
        assert_eq!(f[0].target, ForwardTarget::Name("web".into()));
        assert_eq!(f[0].forward.to_string(), "8080:80/tcp");
        assert_eq!(f[1].forward.to_string(), "127.0.0.1:5353:53/udp");

        let m = message("networks:\n  shared:\n    forwards: [ { name: web, publish: '8080' } ]\n");
        assert!(
            m.contains("forwards[0]: \"8080\": needs both a host port"),
            "{m}"
        );
        let m = message("networks:\n  shared:\n    forwards: [ { publish: '80:80' } ]\n");
        assert!(
            m.contains("needs exactly one of name and interface_id"),
            "{m}"
        );
        let m = message(
            "networks:\n  shared:\n    forwards: [ { name: a, publish: '80:80' }, { name: b, publish: '80:81' } ]\n",
        );
        assert!(
            m.contains(
                "forwards[1]: host port 80 is already forwarded to the interface named \"a\""
            ),
            "{m}"
        );
        let m = message(
            "networks:\n  host:\n    forwards: [ { name: a, publish: '80:80' } ]\n  shared:\n    forwards: [ { name: b, publish: '80:81' } ]\n",
        );
        assert!(
            m.contains("host port 80 is also forwarded by network \"host\""),
            "{m}"
        );
    }

    #[test]
    fn overlapping_networks_are_refused() {
        let m = message("networks:\n  lab:\n    subnet: 192.168.105.128/25\n");
        assert!(
            m.contains("overlaps") && m.contains("\"lab\"") && m.contains("\"shared\""),
            "{m}"
        );
    }

    #[test]
    fn missing_default_file_means_builtins_but_named_file_must_exist() {
        let missing = Path::new("/nonexistent/linnet.yaml");
        assert_eq!(Config::load(missing, false).unwrap().networks.len(), 2);
        let e = Config::load(missing, true).unwrap_err().to_string();
        assert!(
            e.starts_with("/nonexistent/linnet.yaml: cannot read"),
            "{e}"
        );
    }

    #[test]
    fn a_network_socket_is_off_by_default_and_true_or_an_absolute_path_turns_it_on() {
        let cfg = load(
            "networks:\n  shared:\n    socket: true\n  host:\n    socket: /run/vms/host.sock\n  lab:\n    subnet: 10.9.0.0/24\n    socket: false\n",
        )
        .unwrap();
        let run_dir = Path::new("/run/linnet");
        let socket = |n: &str| {
            cfg.network(n)
                .unwrap()
                .socket
                .as_ref()
                .map(|s| s.path(n, run_dir))
        };
        assert_eq!(socket("shared"), Some("/run/linnet/shared.sock".into()));
        assert_eq!(socket("host"), Some("/run/vms/host.sock".into()));
        assert_eq!(socket("lab"), None);
        assert_eq!(Config::builtin().network("shared").unwrap().socket, None);
    }

    #[test]
    fn a_network_socket_that_cannot_work_is_refused_with_the_fix() {
        for (yaml, expected) in [
            (
                "networks:\n  shared:\n    socket: vms.sock\n",
                "socket: \"vms.sock\" is not an absolute path",
            ),
            (
                "networks:\n  shared:\n    socket: 3\n",
                "is neither true, false nor a path",
            ),
            (
                "networks:\n  linnet:\n    subnet: 10.9.0.0/24\n    socket: true\n",
                "linnet.sock would be the daemon's own socket; give a path",
            ),
            (
                "networks:\n  host:\n    socket: /run/a.sock\n  shared:\n    socket: /run/a.sock\n",
                "/run/a.sock is also the socket of network \"host\"",
            ),
        ] {
            let m = message(yaml);
            assert!(m.contains(expected), "{yaml}: {m}");
        }
        let long = format!("networks:\n  shared:\n    socket: /{}\n", "s".repeat(110));
        assert!(message(&long).contains("longer than the 107 bytes"));
    }
}
