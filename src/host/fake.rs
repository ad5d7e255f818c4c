//! A recording fake of the host seam (`seam`), for unit tests that run as
//! any user with no kernel state of their own: a model of the links
//! (name, index, kind, bridge, up, alias, MAC), addresses, routes, IP
//! forwarding and linnet's tables, every effect recorded as a `Step`, and
//! any step made to fail on demand (`fail_on`).
//!
//! A TAP's fd is the writing end of a pipe whose reading end the fake
//! keeps: as with a real TAP, one that is not persistent vanishes once
//! every copy of its fd is closed (the VMM exited, or the daemon dropped
//! it on a failed attach).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::clone_ns::{CloneNetwork, CloneNsError, MadeClone};
use super::docker_user::{Changes, Wanted};
use super::firewall::{self, FirewallNetwork};
use super::guard::{PortGuard, RateDrops};
use super::legacy::LegacyChain;
use super::netlink::{Link, LinkKind, LinkSettings, NetlinkError, Route, VxlanId};
use super::netns::NetNs;
use super::nft::NftError;
use super::ruleset::{Ruleset, Shape};
use super::seam::{Devices, Host, LearnedSets, Links, Tables};
use super::sysctl::Ipv6Forwarding;
use super::tap::TapError;
use crate::config::MacvtapMode;
use crate::learned::Element;
use crate::types::MacAddr;

/// One effect on the host, as the fake saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CreateBridge(String),
    CreateMacvtap(String),
    CreateMacvlan(String),
    CreateTap(String),
    CreateVxlan(String),
    /// Neighbour suppression on, learning off, on this bridge port.
    FabricPort(String),
    /// `ip` at `mac` on this link (`None`: the entry removed).
    Neighbour(String, Ipv4Addr, Option<MacAddr>),
    /// A link's settings; `master` and `up` as asked (None: unchanged).
    Configure {
        link: String,
        master: Option<u32>,
        up: bool,
    },
    CutOff(String),
    SetMaster(String, Option<u32>),
    SetAddress(String),
    AddAddress(String, IpNet),
    DeleteLink(String),
    AddRoute(String),
    DeleteRoute(String),
    /// `family link key=value`.
    Sysctl(String),
    MakePersistent(String),
    /// A TAP given to (uid, gid).
    GiveTap(String, u32, u32),
    OpenMacvtap(String),
    /// `ipv4`/`ipv6` forwarding turned on (true) or back off.
    Forwarding(&'static str, bool),
    /// The firewall table replaced, with these bridges' networks in it.
    Firewall(Vec<String>),
    /// The guard tables made anew with these ports.
    CreateGuard(Vec<String>),
    RemoveGuard,
    AddGuardPort(String),
    UpdateGuardPort(String),
    UnhookGuardPorts(Vec<String>),
    RemoveGuardPorts(Vec<String>),
    MakeClone(String),
    AnnounceClone(String),
    DeleteCloneTap(String),
    MountNamespace(PathBuf),
    UnmountNamespace(PathBuf),
    /// A network's services (DHCP, DNS, RA) started, by the scenarios'
    /// starter (`record_service_start`).
    StartServices(String),
}

type Failure = Box<dyn Fn(&Step) -> bool + Send>;

#[derive(Default)]
struct Model {
    links: BTreeMap<u32, Link>,
    up: BTreeSet<u32>,
    next_index: u32,
    addresses: Vec<(u32, IpNet)>,
    routes: Vec<(IpNet, Option<u32>)>,
    /// Each fd-held device's link, by the inode of its pipe, and the
    /// reading end that tells when the last copy of its fd closed.
    held: BTreeMap<u32, (u64, OwnedFd)>,
    persistent: BTreeSet<u32>,
    /// Clones' TAPs, in their namespaces: by the inode of their fd's pipe.
    clone_taps: BTreeMap<u64, String>,
    forwarding: [bool; 2],
    /// br_netfilter is not loaded (`without_bridge_netfilter`).
    no_bridge_netfilter: bool,
    /// `bridge linnet_fabric` was deleted behind linnet's back, until the
    /// firewall is applied again (`delete_fabric_table`).
    no_fabric_table: bool,
    firewall: Option<Vec<FirewallNetwork>>,
    /// The learned sets' elements, by TAP: as the last firewall had them
    /// and as put since.
    learned_sets: Vec<(String, Element)>,
    /// Neighbour entries linnet made: (link, address) -> MAC.
    neighbours: BTreeMap<(u32, Ipv4Addr), MacAddr>,
    /// Neighbour entries FRR made (`learn_neighbour`).
    learned: BTreeMap<(u32, Ipv4Addr), MacAddr>,
    /// Forwarding entries to other VTEPs FRR made (`learn_remote_mac`).
    remote_macs: BTreeMap<(u32, MacAddr), IpAddr>,
    /// Bridge ports made fabric ports.
    fabric_ports: BTreeSet<u32>,
    guard: Option<BTreeMap<String, PortGuard>>,
    steps: Vec<Step>,
    failures: Vec<Failure>,
    /// While set and false, link deletes wait (`hold_deletes`).
    delete_gate: Option<tokio::sync::watch::Receiver<bool>>,
}

/// The fake host; clones share one model.
#[derive(Clone)]
pub struct FakeHost {
    model: Arc<Mutex<Model>>,
}

/// The uplink every fake host has: `eth0`, 192.0.2.2/24, the default route.
pub const UPLINK: &str = "eth0";

impl FakeHost {
    /// A host with a loopback and an uplink with the default route.
    pub fn new() -> FakeHost {
        let fake = FakeHost {
            model: Arc::new(Mutex::new(Model::default())),
        };
        fake.add_link("lo", LinkKind::Loopback);
        let eth0 = fake.add_link(UPLINK, LinkKind::Other);
        let mut m = fake.model();
        m.addresses
            .push((eth0, "192.0.2.2/24".parse().expect("an address")));
        m.routes
            .push(("0.0.0.0/0".parse().expect("a net"), Some(eth0)));
        m.routes
            .push(("192.0.2.0/24".parse().expect("a net"), Some(eth0)));
        drop(m);
        fake
    }

    /// The seam over this fake.
    pub fn host(&self) -> Host {
        Host {
            links: Arc::new(self.clone()),
            tables: Box::new(self.clone()),
            devices: Arc::new(self.clone()),
        }
    }

    fn model(&self) -> std::sync::MutexGuard<'_, Model> {
        self.model.lock().expect("fake host lock")
    }

    /// A link that someone else made (a NIC, a bridge, a route's link).
    pub fn add_link(&self, name: &str, kind: LinkKind) -> u32 {
        self.model().add(name, kind, None)
    }

    /// Takes a link away behind linnet's back.
    pub fn remove_link(&self, name: &str) {
        let mut m = self.model();
        if let Some(index) = m.index_of(name) {
            m.remove(index);
        }
    }

    /// Adds a route of the host's own.
    pub fn add_route(&self, net: &str, link: &str) {
        let mut m = self.model();
        let index = m.index_of(link);
        m.routes.push((net.parse().expect("a net"), index));
    }

    /// The next step that `which` matches fails (once), changing nothing.
    pub fn fail_on(&self, which: impl Fn(&Step) -> bool + Send + 'static) {
        self.model().failures.push(Box::new(which));
    }

    /// Holds every link delete until the returned sender sends `true`: a
    /// kernel slow to let go of devices.
    pub fn hold_deletes(&self) -> tokio::sync::watch::Sender<bool> {
        let (open, gate) = tokio::sync::watch::channel(false);
        self.model().delete_gate = Some(gate);
        open
    }

    /// Every step so far, oldest first.
    pub fn steps(&self) -> Vec<Step> {
        self.model().steps.clone()
    }

    pub fn clear_steps(&self) {
        self.model().steps.clear();
    }

    /// The names of the links there now.
    pub fn link_names(&self) -> Vec<String> {
        let mut m = self.model();
        m.prune();
        m.links.values().map(|l| l.name.clone()).collect()
    }

    pub fn link(&self, name: &str) -> Option<Link> {
        let mut m = self.model();
        m.prune();
        m.index_of(name).map(|i| m.links[&i].clone())
    }

    /// Gives link `name` a VXLAN device's VNI and VTEP, as the kernel
    /// reports them.
    pub fn set_vxlan(&self, name: &str, id: VxlanId) {
        let mut m = self.model();
        let index = m.index_of(name).expect("the link");
        m.links.get_mut(&index).expect("found").vxlan = Some(id);
    }

    /// Changes a link's MAC behind linnet's back (as a VMM may).
    pub fn set_mac(&self, name: &str, mac: MacAddr) {
        let mut m = self.model();
        if let Some(index) = m.index_of(name) {
            m.links.get_mut(&index).expect("found").address = Some(mac);
        }
    }

    /// The neighbour entries linnet made on link `name`: address, MAC.
    pub fn neighbours(&self, name: &str) -> Vec<(Ipv4Addr, MacAddr)> {
        let m = self.model();
        let index = m.index_of(name);
        m.neighbours
            .iter()
            .filter(|((i, _), _)| Some(*i) == index)
            .map(|((_, ip), mac)| (*ip, *mac))
            .collect()
    }

    /// FRR puts another host's VM, `ip` at `mac`, in link `name`'s
    /// neighbour table (from an EVPN route).
    pub fn learn_neighbour(&self, name: &str, ip: Ipv4Addr, mac: MacAddr) {
        let mut m = self.model();
        let index = m.index_of(name).expect("the link");
        m.learned.insert((index, ip), mac);
    }

    /// As FRR learning over EVPN that `mac` is behind `vtep`: an entry in
    /// link `name`'s (a VXLAN device's) forwarding table.
    pub fn learn_remote_mac(&self, name: &str, mac: MacAddr, vtep: IpAddr) {
        let mut m = self.model();
        let index = m.index_of(name).expect("the link");
        m.remote_macs.insert((index, mac), vtep);
    }

    /// As FRR withdrawing `mac` from link `name`'s forwarding table.
    pub fn forget_remote_mac(&self, name: &str, mac: MacAddr) {
        let mut m = self.model();
        let index = m.index_of(name).expect("the link");
        m.remote_macs.remove(&(index, mac));
    }

    /// Whether link `name` is a fabric port (`make_fabric_port`).
    pub fn is_fabric_port(&self, name: &str) -> bool {
        let m = self.model();
        m.index_of(name)
            .is_some_and(|i| m.fabric_ports.contains(&i))
    }

    pub fn is_up(&self, name: &str) -> bool {
        let m = self.model();
        m.index_of(name).is_some_and(|i| m.up.contains(&i))
    }

    /// The ports in the guard tables; None: there are none.
    pub fn guarded(&self) -> Option<Vec<String>> {
        self.model()
            .guard
            .as_ref()
            .map(|g| g.keys().cloned().collect())
    }

    /// A port's guard entries, if it has some.
    pub fn guard_of(&self, port: &str) -> Option<PortGuard> {
        self.model().guard.as_ref()?.get(port).cloned()
    }

    /// The bridges whose networks are in the firewall table; None: no
    /// table.
    pub fn firewall(&self) -> Option<Vec<FirewallNetwork>> {
        self.model().firewall.clone()
    }

    /// Whether IPv4 (or IPv6) forwarding is on.
    /// The host as one without br_netfilter.
    pub fn without_bridge_netfilter(&self) {
        self.model().no_bridge_netfilter = true;
    }

    pub fn forwarding(&self, ipv6: bool) -> bool {
        self.model().forwarding[usize::from(ipv6)]
    }

    /// Drops linnet's tables behind its back (`nft flush ruleset`).
    /// Deletes `bridge linnet_fabric` alone, as `nft delete table` would.
    pub fn delete_fabric_table(&self) {
        self.model().no_fabric_table = true;
    }

    pub fn flush_tables(&self) {
        let mut m = self.model();
        m.firewall = None;
        m.guard = None;
    }

    /// Records that a network's services started (the scenarios' starter
    /// says so); an error if that was made to fail.
    pub fn record_service_start(&self, network: &str) -> io::Result<()> {
        self.record(Step::StartServices(network.into()))
    }

    /// Records `step`; an error if it was made to fail.
    fn record(&self, step: Step) -> io::Result<()> {
        let mut m = self.model();
        m.steps.push(step.clone());
        if let Some(at) = m.failures.iter().position(|f| f(&step)) {
            drop(m.failures.remove(at));
            return Err(io::Error::other(format!("injected failure of {step:?}")));
        }
        Ok(())
    }

    fn name_of(&self, index: u32) -> String {
        let m = self.model();
        m.links
            .get(&index)
            .map_or_else(|| format!("#{index}"), |l| l.name.clone())
    }

    fn netlink(&self, step: Step) -> Result<(), NetlinkError> {
        self.record(step.clone()).map_err(|source| NetlinkError {
            what: format!("{step:?}"),
            source,
        })
    }

    fn nft(&self, step: Step) -> Result<(), NftError> {
        self.record(step)
            .map_err(|e| NftError::Refused(e.to_string()))
    }

    /// A device held by an fd: the writing end of a pipe, for its user.
    fn held_device(&self, index: u32) -> io::Result<OwnedFd> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let inode = inode(write.as_fd())?;
        self.model().held.insert(index, (inode, read));
        Ok(write)
    }
}

impl Default for FakeHost {
    fn default() -> FakeHost {
        FakeHost::new()
    }
}

impl Drop for Model {
    /// A failure armed for a step that never came is a test that tests
    /// something else than it says.
    fn drop(&mut self) {
        if !self.failures.is_empty() && !std::thread::panicking() {
            panic!(
                "{} failure(s) armed with fail_on were never met; steps: {:#?}",
                self.failures.len(),
                self.steps
            );
        }
    }
}

impl Model {
    fn add(&mut self, name: &str, kind: LinkKind, mac: Option<MacAddr>) -> u32 {
        // Link indexes start at 1, the loopback's.
        self.next_index += 1;
        let index = self.next_index;
        self.links.insert(
            index,
            Link {
                index,
                name: name.into(),
                group: 0,
                kind,
                alias: None,
                master: None,
                address: mac,
                mtu: 1500,
                rx_bytes: 0,
                tx_bytes: 0,
                rx_packets: 0,
                tx_packets: 0,
                vxlan: None,
            },
        );
        index
    }

    fn index_of(&self, name: &str) -> Option<u32> {
        self.links
            .values()
            .find(|l| l.name == name)
            .map(|l| l.index)
    }

    fn remove(&mut self, index: u32) {
        self.links.remove(&index);
        self.up.remove(&index);
        self.held.remove(&index);
        self.persistent.remove(&index);
        self.addresses.retain(|(i, _)| *i != index);
        self.neighbours.retain(|(i, _), _| *i != index);
        self.learned.retain(|(i, _), _| *i != index);
        self.fabric_ports.remove(&index);
        self.routes.retain(|(_, i)| *i != Some(index));
        for link in self.links.values_mut() {
            if link.master == Some(index) {
                link.master = None;
            }
        }
    }

    /// TAPs that are not persistent go with the last copy of their fd.
    fn prune(&mut self) {
        let closed: Vec<u32> = self
            .held
            .iter()
            .filter(|(index, (_, read))| !self.persistent.contains(index) && hung_up(read))
            .map(|(index, _)| *index)
            .filter(|index| {
                self.links
                    .get(index)
                    .is_some_and(|l| l.kind == LinkKind::Tun)
            })
            .collect();
        for index in closed {
            self.remove(index);
        }
    }

    fn exists(&mut self, index: u32) -> Result<(), NetlinkError> {
        self.prune();
        if self.links.contains_key(&index) {
            Ok(())
        } else {
            Err(NetlinkError {
                what: format!("link {index}"),
                source: io::Error::from_raw_os_error(libc::ENODEV),
            })
        }
    }
}

/// Whether every writing end of the pipe `read` reads from is closed.
fn hung_up(read: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: read.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut poll, 1, 0) };
    n > 0 && poll.revents & libc::POLLHUP != 0
}

/// The inode of the pipe `fd` is an end of: the same for both ends.
fn inode(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(nix::sys::stat::fstat(fd)?.st_ino)
}

#[async_trait]
impl Links for FakeHost {
    async fn links(&self) -> Result<Vec<Link>, NetlinkError> {
        let mut m = self.model();
        m.prune();
        Ok(m.links.values().cloned().collect())
    }

    async fn link(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        Ok(FakeHost::link(self, name))
    }

    async fn create_bridge(&self, name: &str, mtu: u32, mac: MacAddr) -> Result<u32, NetlinkError> {
        self.netlink(Step::CreateBridge(name.into()))?;
        let mut m = self.model();
        let index = m.add(name, LinkKind::Bridge, Some(mac));
        m.links.get_mut(&index).expect("just added").mtu = mtu;
        Ok(index)
    }

    async fn create_macvtap(
        &self,
        name: &str,
        uplink: u32,
        _mode: MacvtapMode,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError> {
        self.netlink(Step::CreateMacvtap(name.into()))?;
        let mut m = self.model();
        m.exists(uplink)?;
        Ok(m.add(name, LinkKind::Macvtap, Some(mac)))
    }

    async fn create_macvlan(
        &self,
        name: &str,
        uplink: u32,
        mac: MacAddr,
    ) -> Result<u32, NetlinkError> {
        self.netlink(Step::CreateMacvlan(name.into()))?;
        let mut m = self.model();
        m.exists(uplink)?;
        Ok(m.add(name, LinkKind::Macvlan, Some(mac)))
    }

    async fn create_vxlan(&self, name: &str, id: VxlanId, mtu: u32) -> Result<u32, NetlinkError> {
        self.netlink(Step::CreateVxlan(name.into()))?;
        let mut m = self.model();
        let index = m.add(name, LinkKind::Vxlan, None);
        let link = m.links.get_mut(&index).expect("just added");
        (link.mtu, link.vxlan) = (mtu, Some(id));
        Ok(index)
    }

    async fn make_fabric_port(&self, index: u32) -> Result<(), NetlinkError> {
        self.netlink(Step::FabricPort(self.name_of(index)))?;
        let mut m = self.model();
        m.exists(index)?;
        m.fabric_ports.insert(index);
        Ok(())
    }

    async fn set_neighbour(
        &self,
        index: u32,
        ip: Ipv4Addr,
        mac: MacAddr,
    ) -> Result<(), NetlinkError> {
        self.netlink(Step::Neighbour(self.name_of(index), ip, Some(mac)))?;
        let mut m = self.model();
        m.exists(index)?;
        m.neighbours.insert((index, ip), mac);
        Ok(())
    }

    async fn delete_neighbour(&self, index: u32, ip: Ipv4Addr) -> Result<(), NetlinkError> {
        self.netlink(Step::Neighbour(self.name_of(index), ip, None))?;
        self.model().neighbours.remove(&(index, ip));
        Ok(())
    }

    async fn learned_neighbours(
        &self,
        index: u32,
    ) -> Result<Vec<(Ipv4Addr, MacAddr)>, NetlinkError> {
        let m = self.model();
        Ok(m.learned
            .iter()
            .filter(|((i, _), _)| *i == index)
            .map(|((_, ip), mac)| (*ip, *mac))
            .collect())
    }

    async fn remote_macs(&self, index: u32) -> Result<Vec<(MacAddr, IpAddr)>, NetlinkError> {
        let m = self.model();
        Ok(m.remote_macs
            .iter()
            .filter(|((i, _), _)| *i == index)
            .map(|((_, mac), vtep)| (*mac, *vtep))
            .collect())
    }

    async fn configure(&self, index: u32, settings: LinkSettings<'_>) -> Result<(), NetlinkError> {
        let link = self.name_of(index);
        self.netlink(Step::Configure {
            link,
            master: settings.master,
            up: settings.up,
        })?;
        let mut m = self.model();
        m.exists(index)?;
        if settings.up {
            m.up.insert(index);
        }
        let link = m.links.get_mut(&index).expect("exists");
        if let Some(master) = settings.master {
            link.master = Some(master);
        }
        if let Some(mtu) = settings.mtu {
            link.mtu = mtu;
        }
        if let Some(alias) = settings.alias {
            link.alias = Some(alias.into());
        }
        Ok(())
    }

    async fn cut_off(&self, index: u32) -> Result<(), NetlinkError> {
        self.netlink(Step::CutOff(self.name_of(index)))?;
        let mut m = self.model();
        m.exists(index)?;
        m.up.remove(&index);
        m.links.get_mut(&index).expect("exists").master = None;
        Ok(())
    }

    async fn set_master(&self, index: u32, master: Option<u32>) -> Result<(), NetlinkError> {
        self.netlink(Step::SetMaster(self.name_of(index), master))?;
        let mut m = self.model();
        m.exists(index)?;
        m.links.get_mut(&index).expect("exists").master = master;
        Ok(())
    }

    async fn set_address(&self, index: u32, mac: MacAddr) -> Result<(), NetlinkError> {
        self.netlink(Step::SetAddress(self.name_of(index)))?;
        let mut m = self.model();
        m.exists(index)?;
        m.links.get_mut(&index).expect("exists").address = Some(mac);
        Ok(())
    }

    async fn add_address(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        self.netlink(Step::AddAddress(self.name_of(index), net))?;
        let mut m = self.model();
        m.exists(index)?;
        if !m.addresses.contains(&(index, net)) {
            m.addresses.push((index, net));
            m.routes.push((net.trunc(), Some(index)));
        }
        Ok(())
    }

    async fn delete_link(&self, index: u32) -> Result<(), NetlinkError> {
        let gate = self.model().delete_gate.clone();
        if let Some(mut gate) = gate {
            // A sender dropped opens it too.
            let _ = gate.wait_for(|open| *open).await;
        }
        self.netlink(Step::DeleteLink(self.name_of(index)))?;
        self.model().remove(index);
        Ok(())
    }

    async fn delete_links(&self, indexes: &[u32]) -> Result<(), NetlinkError> {
        for &index in indexes {
            Links::delete_link(self, index).await?;
        }
        Ok(())
    }

    async fn ipv4_addresses(&self) -> Result<Vec<(u32, Ipv4Net)>, NetlinkError> {
        Ok(self
            .model()
            .addresses
            .iter()
            .filter_map(|(i, net)| match net {
                IpNet::V4(net) => Some((*i, *net)),
                IpNet::V6(_) => None,
            })
            .collect())
    }

    async fn ipv4_routes(&self) -> Result<Vec<(Ipv4Net, Option<u32>)>, NetlinkError> {
        Ok(self
            .model()
            .routes
            .iter()
            .filter_map(|(net, i)| match net {
                IpNet::V4(net) => Some((*net, *i)),
                IpNet::V6(_) => None,
            })
            .collect())
    }

    async fn ipv6_routes(&self) -> Result<Vec<(Ipv6Net, Option<u32>)>, NetlinkError> {
        Ok(self
            .model()
            .routes
            .iter()
            .filter_map(|(net, i)| match net {
                IpNet::V6(net) => Some((*net, *i)),
                IpNet::V4(_) => None,
            })
            .collect())
    }

    async fn add_link_route(&self, net: Ipv4Net, index: u32) -> Result<(), NetlinkError> {
        let link = self.name_of(index);
        self.netlink(Step::AddRoute(format!("{net} dev {link}")))?;
        self.model().routes.push((net.into(), Some(index)));
        Ok(())
    }

    async fn add_host_route(
        &self,
        ip: Ipv4Addr,
        index: u32,
        src: Ipv4Addr,
    ) -> Result<(), NetlinkError> {
        let link = self.name_of(index);
        self.netlink(Step::AddRoute(format!("{ip} dev {link} src {src}")))?;
        let net = Ipv4Net::new(ip, 32).expect("a /32");
        self.model().routes.push((net.into(), Some(index)));
        Ok(())
    }

    async fn delete_host_route(&self, ip: Ipv4Addr, index: u32) -> Result<(), NetlinkError> {
        let link = self.name_of(index);
        self.netlink(Step::DeleteRoute(format!("{ip} dev {link}")))?;
        let net = IpNet::from(Ipv4Net::new(ip, 32).expect("a /32"));
        self.model().routes.retain(|r| *r != (net, Some(index)));
        Ok(())
    }

    async fn route_to(&self, dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
        let m = self.model();
        Ok(m.routes
            .iter()
            .filter(|(net, _)| net.contains(&dst))
            .max_by_key(|(net, _)| net.prefix_len())
            .and_then(|(_, i)| *i))
    }

    async fn default_routes(&self, ipv6: bool) -> Result<Vec<Route>, NetlinkError> {
        Ok(self
            .model()
            .routes
            .iter()
            .filter(|(net, _)| net.prefix_len() == 0 && net.addr().is_ipv6() == ipv6)
            .map(|(dst, oif)| Route {
                dst: *dst,
                oif: *oif,
                metric: 0,
            })
            .collect())
    }
}

fn names(ports: &[PortGuard]) -> Vec<String> {
    ports.iter().map(|p| p.tap.clone()).collect()
}

impl LearnedSets for FakeHost {
    fn put(&self, tap: &str, elements: &[Element]) -> Result<(), NftError> {
        let mut m = self.model();
        for e in elements {
            m.learned_sets
                .retain(|(t, old)| !(t == tap && old.reach == e.reach && old.addr == e.addr));
            m.learned_sets.push((tap.to_string(), *e));
        }
        Ok(())
    }
    fn read(&self) -> Result<Vec<(String, Element)>, NftError> {
        Ok(self.model().learned_sets.clone())
    }
}

impl Tables for FakeHost {
    fn apply_firewall(&mut self, networks: &[FirewallNetwork]) -> Result<(), NftError> {
        self.nft(Step::Firewall(
            networks.iter().map(|n| n.bridge.clone()).collect(),
        ))?;
        let mut m = self.model();
        m.firewall = (!networks.is_empty()).then(|| networks.to_vec());
        m.learned_sets = (networks.iter().flat_map(|n| &n.policies))
            .flat_map(|p| p.learned.iter().map(|e| (p.tap.clone(), *e)))
            .collect();
        m.no_fabric_table = false;
        Ok(())
    }

    fn learned_sets(&self) -> Arc<dyn LearnedSets> {
        Arc::new(self.clone())
    }

    fn create_guard(&mut self, ports: &[PortGuard]) -> Result<(), NftError> {
        self.nft(Step::CreateGuard(names(ports)))?;
        self.model().guard = Some(ports.iter().map(|p| (p.tap.clone(), p.clone())).collect());
        Ok(())
    }

    fn remove_guard(&mut self) -> Result<(), NftError> {
        self.nft(Step::RemoveGuard)?;
        self.model().guard = None;
        Ok(())
    }

    fn add_guard_port(&mut self, port: &PortGuard) -> Result<(), NftError> {
        self.nft(Step::AddGuardPort(port.tap.clone()))?;
        let mut m = self.model();
        let guard = m
            .guard
            .as_mut()
            .ok_or_else(|| NftError::Refused("no guard table".into()))?;
        guard.insert(port.tap.clone(), port.clone());
        Ok(())
    }

    fn update_guard_port(&mut self, old: &PortGuard, new: &PortGuard) -> Result<(), NftError> {
        self.nft(Step::UpdateGuardPort(new.tap.clone()))?;
        let mut m = self.model();
        let guard = m
            .guard
            .as_mut()
            .ok_or_else(|| NftError::Refused("no guard table".into()))?;
        guard.remove(&old.tap);
        guard.insert(new.tap.clone(), new.clone());
        Ok(())
    }

    fn unhook_guard_ports(&mut self, ports: &[PortGuard]) -> Result<(), NftError> {
        self.nft(Step::UnhookGuardPorts(names(ports)))
    }

    fn remove_guard_ports(&mut self, ports: &[PortGuard]) -> Result<(), NftError> {
        self.nft(Step::RemoveGuardPorts(names(ports)))?;
        if let Some(guard) = self.model().guard.as_mut() {
            for port in ports {
                guard.remove(&port.tap);
            }
        }
        Ok(())
    }

    fn guard_drops(&mut self) -> Result<BTreeMap<String, u64>, NftError> {
        Ok(BTreeMap::new())
    }

    fn guard_rate_drops(&mut self) -> Result<RateDrops, NftError> {
        Ok(RateDrops::default())
    }

    fn policy_refusals(&mut self) -> Result<BTreeMap<String, u64>, NftError> {
        let m = self.model();
        Ok((m.firewall.iter().flatten().flat_map(|n| &n.policies))
            .filter(|p| !p.policy.egress.is_empty())
            .map(|p| (p.tap.clone(), p.refused))
            .collect())
    }

    fn ruleset(&mut self) -> Result<Ruleset, NftError> {
        Ok(Ruleset::default())
    }

    fn table_shape(&mut self, family: &str, table: &str) -> Result<Option<Shape>, NftError> {
        let m = self.model();
        let fabric = m.firewall.as_deref().map(firewall::fabric_shape);
        Ok(match (family, table) {
            ("inet", "linnet") => m.firewall.as_deref().map(firewall::shape),
            ("bridge", "linnet") => m.guard.as_ref().map(|_| Shape::default()),
            ("bridge", super::FABRIC_TABLE) if !m.no_fabric_table => {
                fabric.filter(|s| !s.is_empty())
            }
            _ => None,
        })
    }

    fn sync_docker_user(&mut self, _rs: &Ruleset, _wanted: &[Wanted]) -> Result<Changes, NftError> {
        Ok(Changes::default())
    }

    fn legacy_chains(&mut self) -> io::Result<Vec<LegacyChain>> {
        Ok(Vec::new())
    }
}

#[async_trait]
impl Devices for FakeHost {
    fn create_tap(
        &self,
        next: &mut u32,
        _uid: u32,
        _gid: u32,
        queues: u16,
    ) -> Result<(String, Vec<OwnedFd>), TapError> {
        let name = loop {
            let name = super::tap_name(*next);
            *next = next.wrapping_add(1);
            if self.link(&name).is_none() {
                break name;
            }
        };
        let failed = |source| TapError::Create {
            name: name.clone(),
            source,
        };
        self.record(Step::CreateTap(name.clone())).map_err(failed)?;
        let index = self.model().add(&name, LinkKind::Tun, None);
        let fd = self.held_device(index).map_err(failed)?;
        // Each queue's fd holds the device as the first does: it goes when
        // the last closes.
        let mut fds = Vec::new();
        for _ in 1..queues {
            fds.push(fd.try_clone().map_err(failed)?);
        }
        fds.insert(0, fd);
        Ok((name, fds))
    }

    fn make_persistent(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let inode = inode(fd)?;
        let clone_tap = self.model().clone_taps.get(&inode).cloned();
        if let Some(tap) = clone_tap {
            return self.record(Step::MakePersistent(tap));
        }
        let index = self
            .model()
            .held
            .iter()
            .find(|(_, (i, _))| *i == inode)
            .map(|(index, _)| *index)
            .ok_or_else(|| io::Error::other("not a TAP's fd"))?;
        self.record(Step::MakePersistent(self.name_of(index)))?;
        self.model().persistent.insert(index);
        Ok(())
    }

    fn give_tap(&self, fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
        let inode = inode(fd)?;
        let index = (self.model().held.iter())
            .find(|(_, (i, _))| *i == inode)
            .map(|(index, _)| *index)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADFD))?;
        self.record(Step::GiveTap(self.name_of(index), uid, gid))
    }

    fn open_macvtap(&self, name: &str, index: u32, _scratch: &Path) -> io::Result<OwnedFd> {
        self.record(Step::OpenMacvtap(name.into()))?;
        self.held_device(index)
    }

    fn set_link_sysctl(&self, family: &str, link: &str, key: &str, value: &str) -> io::Result<()> {
        self.record(Step::Sysctl(format!("{family} {link} {key}={value}")))
    }

    fn forwarding_on(&self, ipv6: bool) -> bool {
        self.forwarding(ipv6)
    }

    fn bridge_netfilter(&self) -> bool {
        !self.model().no_bridge_netfilter
    }

    fn enable_ipv4_forwarding(&self) -> io::Result<()> {
        self.record(Step::Forwarding("ipv4", true))?;
        self.model().forwarding[0] = true;
        Ok(())
    }

    fn disable_ipv4_forwarding(&self) -> io::Result<()> {
        self.record(Step::Forwarding("ipv4", false))?;
        self.model().forwarding[0] = false;
        Ok(())
    }

    fn enable_ipv6_forwarding(&self) -> io::Result<Ipv6Forwarding> {
        self.record(Step::Forwarding("ipv6", true))?;
        self.model().forwarding[1] = true;
        Ok(Ipv6Forwarding {
            was_off: true,
            accept_ra_raised: Vec::new(),
        })
    }

    fn disable_ipv6_forwarding(&self, _changed: &Ipv6Forwarding) -> io::Result<()> {
        self.record(Step::Forwarding("ipv6", false))?;
        self.model().forwarding[1] = false;
        Ok(())
    }

    async fn make_clone(
        &self,
        spec: &CloneNetwork,
        next: &mut u32,
        _owner: (u32, u32),
    ) -> Result<MadeClone, CloneNsError> {
        let port_name = super::clone_port_name(*next);
        *next = next.wrapping_add(1);
        self.record(Step::MakeClone(spec.tap.clone()))
            .map_err(CloneNsError::Namespace)?;
        let port = self
            .model()
            .add(&port_name, LinkKind::Veth, Some(spec.uplink_mac));
        let (ns, tap) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| CloneNsError::Namespace(e.into()))?;
        let tap_inode = inode(tap.as_fd()).map_err(CloneNsError::Namespace)?;
        self.model().clone_taps.insert(tap_inode, spec.tap.clone());
        Ok(MadeClone {
            ns: NetNs::fake(ns),
            tap,
            port,
            port_name,
        })
    }

    fn announce_clone(&self, _ns: &NetNs, spec: &CloneNetwork) -> io::Result<()> {
        self.record(Step::AnnounceClone(spec.guest_ip.to_string()))
    }

    async fn delete_clone_tap(&self, _ns: &NetNs, tap: &str) -> Result<(), CloneNsError> {
        self.record(Step::DeleteCloneTap(tap.into()))
            .map_err(CloneNsError::Namespace)
    }

    fn mount_namespace(&self, _ns: &NetNs, path: &Path) -> io::Result<()> {
        self.record(Step::MountNamespace(path.into()))
    }

    fn unmount_namespace(&self, path: &Path) -> io::Result<()> {
        self.record(Step::UnmountNamespace(path.into()))
    }
}
