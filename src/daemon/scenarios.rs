//! The daemon's orchestration as scenarios over the fake host
//! (`host::fake`): attach, detach, undo, bring-up, adoption after a
//! restart, clones and the tables' repair, each checked on the host's
//! model and the steps it saw. They run as any user: no capability, no
//! namespace, no kernel state.

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Mutex;

use super::client::Client;
use super::errors::DaemonError;
use super::requests::{finish_unlocked, lock_for_attach};
use super::state::Daemon;
use crate::api::{AttachRequest, CloneOf, InterfaceInfo, InterfaceRef};
use crate::config::Config;
use crate::datapath::Datapath;
use crate::host;
use crate::host::fake::{FakeHost, Step};
use crate::host::guard::Hook;
use crate::host::netlink::LinkKind;
use crate::host::netns::NetNs;
use crate::host::process::Process;
use crate::leases::{LeaseError, Owner};
use crate::services::name_gate::NameGate;
use crate::services::{NetworkContext, ServiceError, Services, Starter};
use crate::types::{InterfaceId, MacAddr};

mod every_step;
mod secret_rules;
mod spares;

/// Services that start nothing but a step in the fake host's record
/// (so a scenario that changes nothing sees none started); a clone's DHCP
/// socket on loopback.
struct NoServices(FakeHost);

#[async_trait]
impl Starter for NoServices {
    async fn start(&self, ctx: Arc<NetworkContext>) -> Result<Services, ServiceError> {
        self.0
            .record_service_start(ctx.name())
            .map_err(|source| ServiceError::Bind {
                network: ctx.name().into(),
                service: "the scenario's services",
                addr: String::new(),
                source,
            })?;
        Ok(Services::none())
    }

    fn clone_dhcp_socket(&self, _ns: &NetNs, _tap: &str) -> std::io::Result<tokio::net::UdpSocket> {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
        socket.set_nonblocking(true)?;
        tokio::net::UdpSocket::from_std(socket)
    }
}

/// The networks most scenarios use: `shared` as built in, open to two
/// users besides root.
const USERS: &str = "networks:
  shared:
    allow: { users: [root, '1000', '1001'] }
";

/// A daemon over a fake host, with its directories.
struct Scene {
    daemon: Daemon,
    fake: FakeHost,
    dir: tempfile::TempDir,
    yaml: String,
}

/// An attach's reply: what the client gets.
struct Attached {
    info: InterfaceInfo,
    /// The port's fd, which the VMM holds: dropping it is the VMM exiting.
    fd: OwnedFd,
    token: Option<String>,
}

impl Scene {
    async fn new(yaml: &str) -> Scene {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let fake = FakeHost::new();
        let daemon = start(&fake, dir.path(), yaml).await;
        fake.clear_steps();
        Scene {
            daemon,
            fake,
            dir,
            yaml: yaml.into(),
        }
    }

    /// A net with a bridge of someone else's, for `mode: bridge`.
    async fn with_bridge(yaml: &str, bridge: &str) -> Scene {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let fake = FakeHost::new();
        fake.add_link(bridge, LinkKind::Bridge);
        let daemon = start(&fake, dir.path(), yaml).await;
        fake.clear_steps();
        Scene {
            daemon,
            fake,
            dir,
            yaml: yaml.into(),
        }
    }

    /// An attach that must be refused: the refusal.
    async fn refused(&mut self, client: &Client, req: AttachRequest) -> DaemonError {
        self.attach(client, req)
            .await
            .err()
            .expect("the attach is refused")
    }

    /// Attaches with the next step `which` matches failing: the refusal.
    async fn refused_when(
        &mut self,
        which: impl Fn(&Step) -> bool + Send + 'static,
        client: &Client,
        req: AttachRequest,
    ) -> DaemonError {
        self.fake.fail_on(which);
        self.attach(client, req)
            .await
            .err()
            .expect("the attach fails with its step")
    }

    async fn attach(
        &mut self,
        client: &Client,
        req: AttachRequest,
    ) -> Result<Attached, DaemonError> {
        let (info, mut fds, token) = self.daemon.handle_attach(client, req).await?;
        let fd = fds.remove(0);
        Ok(Attached { info, fd, token })
    }

    /// A client's connection closed.
    async fn client_gone(&mut self, client: u64) {
        let teardown = self.daemon.client_going(client);
        self.daemon
            .run_teardown(teardown)
            .await
            .expect("its links deleted");
    }

    /// Stops this daemon (as for a restart) and starts the next one over
    /// the same host and directories.
    async fn restart(&mut self) {
        self.restart_with(|| ()).await;
    }

    /// Restarts, with `meanwhile` happening while no daemon runs.
    async fn restart_with(&mut self, meanwhile: impl FnOnce()) {
        self.daemon.stop().await;
        meanwhile();
        self.daemon = start(&self.fake, self.dir.path(), &self.yaml).await;
    }

    /// The links linnet made, by their names' prefixes.
    fn linnet_links(&self) -> Vec<String> {
        linnet_links(&self.fake)
    }

    /// Nothing of linnet's is left on the host.
    fn assert_nothing_left(&self) {
        assert_eq!(self.linnet_links(), Vec::<String>::new(), "links left");
        assert_eq!(self.fake.guarded(), None, "a guard table left");
        assert!(self.fake.firewall().is_none(), "a firewall table left");
        assert!(!self.fake.forwarding(false), "IPv4 forwarding left on");
        assert!(!self.fake.forwarding(true), "IPv6 forwarding left on");
    }

    /// The lease of interface `id` on `network`.
    fn lease(&self, network: &str, id: InterfaceId) -> Option<crate::leases::Lease> {
        let leases = self.daemon.networks.get(network)?.leases()?;
        let table = leases.lock().expect("lease lock");
        table
            .leases()
            .find(|l| l.owner == Owner::Interface { id })
            .cloned()
    }
}

/// The links linnet made on `fake`, by their names' prefixes.
fn linnet_links(fake: &FakeHost) -> Vec<String> {
    let ours = [
        host::BRIDGE_PREFIX,
        host::TAP_PREFIX,
        host::MACVTAP_PREFIX,
        host::CLONE_PORT_PREFIX,
        host::HOST_ACCESS_PREFIX,
        host::VXLAN_PREFIX,
    ];
    fake.link_names()
        .into_iter()
        .filter(|n| ours.iter().any(|p| n.starts_with(p)))
        .collect()
}

async fn start(fake: &FakeHost, dir: &Path, yaml: &str) -> Daemon {
    let config = Config::from_yaml(yaml, "networks.yaml").expect("a valid config");
    // As the server makes them before the daemon starts.
    for made in ["state", "run"] {
        std::fs::create_dir_all(dir.join(made)).expect("a directory");
    }
    let host = fake.host();
    let events = crate::events::Bus::default();
    let names = Arc::new(NameGate::new(host.tables.learned_sets(), events.clone()));
    let mut daemon = Daemon::new(
        config,
        dir.join("state"),
        dir.join("run"),
        host,
        Arc::new(NoServices(fake.clone())),
        names,
        events,
    );
    daemon.reconcile().await.expect("start-up");
    daemon
}

/// A client of `uid`, whose process is this test's (so it is running).
fn user(uid: u32, connection: u64) -> Client {
    let pid = std::process::id() as i32;
    Client {
        id: connection,
        pid: Some(pid),
        uid,
        gid: uid,
        account: uid,
        groups: vec![uid],
        process: Process::of(pid),
        network_socket: None,
    }
}

fn id(n: u8) -> InterfaceId {
    InterfaceId::from_bytes([n; 16])
}

fn ip(text: &str) -> Ipv4Addr {
    text.parse().expect("an address")
}

fn request(n: u8) -> AttachRequest {
    AttachRequest {
        interface_id: Some(id(n)),
        ..AttachRequest::default()
    }
}

fn named(n: u8, name: &str) -> AttachRequest {
    AttachRequest {
        name: Some(name.into()),
        ..request(n)
    }
}

fn on(network: &str, n: u8) -> AttachRequest {
    AttachRequest {
        network: Some(network.into()),
        ..request(n)
    }
}

fn position(steps: &[Step], which: impl Fn(&Step) -> bool) -> usize {
    steps
        .iter()
        .position(which)
        .unwrap_or_else(|| panic!("no such step in {steps:#?}"))
}

#[tokio::test]
async fn an_attach_puts_a_guarded_tap_on_the_bridge_with_the_first_address() {
    let mut s = Scene::new(USERS).await;
    let vm = s.attach(&user(1000, 1), request(1)).await.unwrap();
    assert_eq!(vm.info.ip_address, Some(ip("192.168.105.2")));
    let bridge = s.fake.link("ln-shared").expect("the network's bridge");
    let tap = s.fake.link(&vm.info.tap).expect("the VM's TAP");
    assert_eq!((tap.kind, tap.master), (LinkKind::Tun, Some(bridge.index)));
    assert!(s.fake.is_up(&tap.name));
    assert_eq!(
        tap.alias.as_deref(),
        Some(format!("linnet:interface:{}", id(1)).as_str())
    );
    // Guarded before it joins the bridge, so no frame passes unchecked.
    let steps = s.fake.steps();
    let guarded = position(&steps, |st| *st == Step::AddGuardPort(tap.name.clone()));
    let joined = position(
        &steps,
        |st| matches!(st, Step::Configure { link, master: Some(_), .. } if *link == tap.name),
    );
    assert!(guarded < joined, "{steps:#?}");
    assert_eq!(s.fake.guarded(), Some(vec![tap.name.clone()]));
    let firewall = s.fake.firewall().expect("the firewall table");
    assert_eq!(firewall[0].bridge, "ln-shared");
    assert!(s.fake.forwarding(false), "NAT needs IPv4 forwarding");
    assert!(vm.token.is_some(), "a client's interface can be re-claimed");
    assert!(
        s.lease("shared", id(1))
            .is_some_and(|l| l.held_until.is_none()),
        "the lease is held while attached"
    );
}

#[tokio::test]
async fn a_guard_failure_undoes_the_port_then_the_lease_and_the_network_goes() {
    let mut s = Scene::new(USERS).await;
    let refused = s
        .refused_when(
            |st| matches!(st, Step::AddGuardPort(_)),
            &user(1000, 1),
            request(1),
        )
        .await;
    assert!(matches!(refused, DaemonError::Firewall(_)), "{refused:?}");
    // The TAP went with its fd, the network with its last interface.
    s.assert_nothing_left();
    // The lease was given back, its address kept for the id.
    let vm = s.attach(&user(1000, 1), request(1)).await.unwrap();
    assert_eq!(vm.info.ip_address, Some(ip("192.168.105.2")));
}

#[tokio::test]
async fn a_bring_up_that_fails_half_way_leaves_nothing() {
    let mut s = Scene::new(USERS).await;
    let bridge_address = |st: &Step| matches!(st, Step::AddAddress(link, _) if link == "ln-shared");
    let refused = s
        .refused_when(bridge_address, &user(1000, 1), request(1))
        .await;
    assert!(matches!(refused, DaemonError::Netlink(_)), "{refused:?}");
    assert!(
        s.fake
            .steps()
            .contains(&Step::CreateBridge("ln-shared".into())),
        "the bridge was made before the failure"
    );
    s.assert_nothing_left();
    assert!(s.daemon.networks.is_empty());
}

/// A network across hosts on the fake host, whose uplink eth0 has
/// 192.0.2.2 (its VTEP) and MTU 1500.
const ACROSS_HOSTS: &str = "networks:
  fabric:
    mode: shared
    subnet: 10.77.0.0/24
    allow: { users: [root, '1000'] }
    evpn: { vni: 7700, vtep: 192.0.2.2, asn: 65000, peers: [192.0.2.12] }
";

/// A network across hosts comes up with its VXLAN device as a fabric port
/// of its bridge; each VM's address goes into the bridge's neighbour
/// table (for FRR to advertise) and out at detach; the firewall knows the
/// fabric port; and the device goes with the network.
#[tokio::test]
async fn a_network_across_hosts_joins_the_fabric_and_advertises_its_vms() {
    let mut s = Scene::new(ACROSS_HOSTS).await;
    let vm = s.attach(&user(1000, 1), on("fabric", 1)).await.unwrap();
    let vxlan = s.fake.link("lx-fabric").expect("the VXLAN device");
    let bridge = s.fake.link("ln-fabric").expect("the bridge");
    assert_eq!(vxlan.kind, LinkKind::Vxlan);
    assert_eq!(vxlan.master, Some(bridge.index));
    assert_eq!(
        vxlan.vxlan,
        Some(crate::host::netlink::VxlanId {
            vni: 7700,
            local: Some("192.0.2.2".parse().unwrap())
        })
    );
    assert_eq!(
        (vxlan.mtu, bridge.mtu),
        (1450, 1450),
        "1500 less VXLAN's 50"
    );
    assert!(s.fake.is_fabric_port("lx-fabric") && s.fake.is_up("lx-fabric"));
    let ip = vm.info.ip_address.expect("an address");
    assert_eq!(s.fake.neighbours("ln-fabric"), [(ip, vm.info.mac_address)]);
    let firewall = s.fake.firewall().expect("the firewall");
    let port = firewall[0].fabric.as_ref().expect("the fabric port");
    assert_eq!(port.port, "lx-fabric");
    assert_eq!(port.gateway_mac, host::bridge_mac("fabric"));
    s.daemon.handle_detach(&user(1000, 1), id(1)).await.unwrap();
    assert!(
        s.fake.neighbours("ln-fabric").is_empty(),
        "taken out at detach"
    );
    drop(vm);
    assert!(s.fake.link("lx-fabric").is_none(), "gone with the network");
    s.assert_nothing_left();
}

/// An address that FRR learned is another host's VM's, with another MAC,
/// is refused with both MACs; with the same MAC (the VM moving here) it
/// is taken.
#[tokio::test]
async fn an_address_another_host_advertises_for_another_mac_is_refused() {
    let yaml = ACROSS_HOSTS.replace(
        "subnet: 10.77.0.0/24",
        "subnet: 10.77.0.0/24\n    dhcp: { static: [{ ip: 10.77.0.5, mac: '02:77:00:00:00:05' }] }",
    );
    let mut s = Scene::new(&yaml).await;
    let _first = s.attach(&user(1000, 1), on("fabric", 1)).await.unwrap();
    let ip: Ipv4Addr = "10.77.0.5".parse().unwrap();
    let (ours, theirs) = (
        "02:77:00:00:00:05".parse().unwrap(),
        "02:99:00:00:00:05".parse().unwrap(),
    );
    s.fake.learn_neighbour("ln-fabric", ip, theirs);
    let moving = AttachRequest {
        mac: Some(ours),
        ..on("fabric", 2)
    };
    let refused = s.refused(&user(1000, 1), moving.clone()).await;
    let message = refused.to_string();
    assert!(
        matches!(refused, DaemonError::AddressElsewhere { .. }),
        "{refused:?}"
    );
    assert!(
        message.contains("10.77.0.5 is taken on another host by the VM with MAC 02:99:00:00:00:05"),
        "{message}"
    );
    assert_eq!(
        s.fake.neighbours("ln-fabric").len(),
        1,
        "only the first VM's"
    );
    // The same MAC there: the VM itself, which moves here.
    s.fake.learn_neighbour("ln-fabric", ip, ours);
    let moved = s.attach(&user(1000, 1), moving).await.unwrap();
    assert_eq!(moved.info.ip_address, Some(ip));
}

/// A MAC that FRR knows behind another host's VTEP is refused, naming
/// it, whether asked for alone or with the address that host's VM holds;
/// once FRR no longer knows it there (the VM left that host), it is taken.
#[tokio::test]
async fn a_mac_another_host_advertises_is_refused_naming_its_vtep() {
    let mut s = Scene::new(ACROSS_HOSTS).await;
    let _first = s.attach(&user(1000, 1), on("fabric", 1)).await.unwrap();
    let theirs: MacAddr = "02:99:00:00:00:07".parse().unwrap();
    let vtep: std::net::IpAddr = "192.0.2.2".parse().unwrap();
    s.fake.learn_remote_mac("lx-fabric", theirs, vtep);
    let taking = AttachRequest {
        mac: Some(theirs),
        ..on("fabric", 2)
    };
    s.fake.clear_steps();
    let refused = s.refused(&user(1000, 1), taking.clone()).await;
    assert!(
        matches!(refused, DaemonError::MacElsewhere { .. }),
        "{refused:?}"
    );
    assert!(
        refused
            .to_string()
            .contains("MAC 02:99:00:00:00:07 is a VM's on another host (FRR learned it over EVPN behind VTEP 192.0.2.2)"),
        "{refused}"
    );
    assert_eq!(s.fake.steps(), [], "nothing made");
    assert_eq!(
        s.fake.neighbours("ln-fabric").len(),
        1,
        "only the first VM's"
    );
    // A positive control: another MAC on the same network is taken.
    let other = AttachRequest {
        mac: Some("02:99:00:00:00:08".parse().unwrap()),
        ..on("fabric", 3)
    };
    s.attach(&user(1000, 1), other).await.unwrap();
    // Gone from the other host: taken.
    s.fake.forget_remote_mac("lx-fabric", theirs);
    let moved = s.attach(&user(1000, 1), taking).await.unwrap();
    assert_eq!(moved.info.mac_address, theirs);
}

/// A restart adopts the VXLAN device with the VMs; a config that gives
/// the network another VNI makes it anew.
#[tokio::test]
async fn a_restart_adopts_the_vxlan_device_and_another_vni_makes_it_anew() {
    let mut s = Scene::new(ACROSS_HOSTS).await;
    let vm = s.attach(&user(1000, 1), on("fabric", 1)).await.unwrap();
    let before = s.fake.link("lx-fabric").expect("the VXLAN device").index;
    s.restart().await;
    s.fake.clear_steps();
    let vxlan = s.fake.link("lx-fabric").expect("kept across the restart");
    assert_eq!(vxlan.index, before, "adopted, not made anew");
    assert!(s.fake.is_fabric_port("lx-fabric"));
    s.yaml = s.yaml.replace("vni: 7700", "vni: 7701");
    s.restart().await;
    let vxlan = s.fake.link("lx-fabric").expect("made anew");
    assert_ne!(vxlan.index, before);
    assert_eq!(vxlan.vxlan.map(|v| v.vni), Some(7701));
    assert!(
        s.fake
            .steps()
            .contains(&Step::CreateVxlan("lx-fabric".into()))
    );
    drop(vm);
}

/// A VXLAN device a daemon made but died before marking (no alias) is
/// linnet's if it has the network's VNI and VTEP, and adopted; one with
/// another VNI is someone else's, and refused by name.
#[tokio::test]
async fn an_unmarked_vxlan_device_is_adopted_only_with_the_networks_vni_and_vtep() {
    let mut s = Scene::new(ACROSS_HOSTS).await;
    let index = s.fake.add_link("lx-fabric", LinkKind::Vxlan);
    let id = |vni| crate::host::netlink::VxlanId {
        vni,
        local: Some("192.0.2.2".parse().unwrap()),
    };
    s.fake.set_vxlan("lx-fabric", id(7700));
    let _vm = s.attach(&user(1000, 1), on("fabric", 1)).await.unwrap();
    assert_eq!(s.fake.link("lx-fabric").unwrap().index, index, "adopted");

    let mut s = Scene::new(ACROSS_HOSTS).await;
    s.fake.add_link("lx-fabric", LinkKind::Vxlan);
    s.fake.set_vxlan("lx-fabric", id(4242));
    let refused = s.refused(&user(1000, 1), on("fabric", 1)).await;
    assert!(
        matches!(&refused, DaemonError::ForeignLink { link, .. } if link == "lx-fabric"),
        "{refused:?}"
    );
    assert!(
        s.fake.link("ln-fabric").is_none(),
        "nothing of the network is left"
    );
}

/// An attach whose neighbour entry cannot be made is undone, the network
/// with it.
#[tokio::test]
async fn an_attach_across_hosts_that_cannot_advertise_is_undone() {
    let mut s = Scene::new(ACROSS_HOSTS).await;
    let neighbour = |st: &Step| matches!(st, Step::Neighbour(_, _, Some(_)));
    let refused = s
        .refused_when(neighbour, &user(1000, 1), on("fabric", 1))
        .await;
    assert!(matches!(refused, DaemonError::Netlink(_)), "{refused:?}");
    s.assert_nothing_left();
}

/// A VTEP that is no address of the host, and an MTU that with VXLAN's 50
/// bytes does not fit the underlay, are refused with the reason and the
/// fitting value; nothing is left of the network.
#[tokio::test]
async fn a_network_across_hosts_is_refused_with_a_vtep_elsewhere_or_too_large_an_mtu() {
    let elsewhere = ACROSS_HOSTS.replace("vtep: 192.0.2.2", "vtep: 192.0.2.99");
    let mut s = Scene::new(&elsewhere).await;
    let refused = s.refused(&user(1000, 1), on("fabric", 1)).await;
    let message = refused.to_string();
    assert!(
        matches!(refused, DaemonError::VtepNotHere { .. }),
        "{refused:?}"
    );
    assert!(message.contains("192.0.2.2 on eth0"), "{message}");
    s.assert_nothing_left();

    let large = ACROSS_HOSTS.replace(
        "subnet: 10.77.0.0/24",
        "subnet: 10.77.0.0/24\n    mtu: 1480",
    );
    let mut s = Scene::new(&large).await;
    let refused = s.refused(&user(1000, 1), on("fabric", 1)).await;
    let message = refused.to_string();
    assert!(
        matches!(refused, DaemonError::UnderlayMtu { .. }),
        "{refused:?}"
    );
    assert!(
        message.contains("set networks.fabric.mtu to 1450"),
        "{message}"
    );
    assert!(message.contains("raise eth0's MTU to 1530"), "{message}");
    s.assert_nothing_left();
}

#[tokio::test]
async fn a_firewall_that_cannot_be_made_takes_the_network_down_again() {
    let mut s = Scene::new(USERS).await;
    let firewall = |st: &Step| matches!(st, Step::Firewall(b) if !b.is_empty());
    let refused = s.refused_when(firewall, &user(1000, 1), request(1)).await;
    assert!(matches!(refused, DaemonError::Firewall(_)), "{refused:?}");
    s.assert_nothing_left();
}

#[tokio::test]
async fn another_user_cannot_take_a_held_name_while_attached_or_after() {
    let mut s = Scene::new(USERS).await;
    let web = s.attach(&user(1000, 1), named(1, "web")).await.unwrap();
    let taps = s.linnet_links();
    let refused = s.refused(&user(1001, 2), named(2, "WEB")).await;
    assert!(
        matches!(&refused, DaemonError::NameHeld { network, holder, uid: 1000, .. } if network == "shared" && *holder == id(1)),
        "{refused:?}"
    );
    assert_eq!(s.linnet_links(), taps, "refused before the host changed");
    // After a detach the name is still its user's, with the lease.
    s.daemon.handle_detach(&user(1000, 1), id(1)).await.unwrap();
    drop(web);
    let refused = s.refused(&user(1001, 2), named(2, "web")).await;
    assert!(
        matches!(refused, DaemonError::Lease(LeaseError::NameTaken { .. })),
        "{refused:?}"
    );
    // Its own user takes it again, at the same address.
    let again = s.attach(&user(1000, 3), named(1, "web")).await.unwrap();
    assert_eq!(again.info.ip_address, Some(ip("192.168.105.2")));
}

#[tokio::test]
async fn another_users_interface_id_is_refused() {
    let mut s = Scene::new(USERS).await;
    let _vm = s.attach(&user(1000, 1), request(1)).await.unwrap();
    let refused = s.attach(&user(1001, 2), request(1)).await.err().unwrap();
    assert!(
        matches!(&refused, DaemonError::Attached { id: held, network, .. } if *held == id(1) && network == "shared"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_detach_leaves_nothing_once_the_last_interface_goes() {
    let mut s = Scene::new(USERS).await;
    let client = user(1000, 1);
    let vm = s.attach(&client, request(1)).await.unwrap();
    s.daemon.handle_detach(&client, id(1)).await.unwrap();
    s.assert_nothing_left();
    // The address stays the id's for the lease time.
    drop(vm);
    let held = s.daemon.networks.get("shared");
    assert!(held.is_none(), "the network is down");
    let again = s.attach(&client, request(1)).await.unwrap();
    assert_eq!(again.info.ip_address, Some(ip("192.168.105.2")));
}

#[tokio::test]
async fn a_client_that_goes_takes_only_its_own_interfaces() {
    let mut s = Scene::new(USERS).await;
    let one = s.attach(&user(1000, 1), request(1)).await.unwrap();
    let two = s.attach(&user(1001, 2), request(2)).await.unwrap();
    s.client_gone(1).await;
    let left = s.linnet_links();
    assert!(left.contains(&two.info.tap), "{left:?}");
    assert!(!left.contains(&one.info.tap), "{left:?}");
    assert_eq!(s.fake.guarded(), Some(vec![two.info.tap.clone()]));
    s.client_gone(2).await;
    s.assert_nothing_left();
}

#[tokio::test]
async fn a_persistent_network_stays_up_without_interfaces() {
    let mut s = Scene::new(
        "networks:
  lab:
    mode: host
    subnet: 10.20.0.0/24
    persistent: true
",
    )
    .await;
    assert!(s.fake.link("ln-lab").is_some(), "up from the start");
    let admin = user(0, 1);
    let _vm = s.attach(&admin, on("lab", 1)).await.unwrap();
    s.daemon.handle_detach(&admin, id(1)).await.unwrap();
    assert!(
        s.fake.link("ln-lab").is_some(),
        "up after its last interface"
    );
}

#[tokio::test]
async fn a_tap_name_port_outlives_its_fd_until_detached() {
    let mut s = Scene::new(USERS).await;
    let client = user(1000, 1);
    let req = AttachRequest {
        datapath: Some(Datapath::TapName),
        ..request(1)
    };
    let vm = s.attach(&client, req).await.unwrap();
    assert!(
        s.fake
            .steps()
            .contains(&Step::MakePersistent(vm.info.tap.clone()))
    );
    drop(vm.fd);
    assert!(
        s.fake.link(&vm.info.tap).is_some(),
        "a VMM opens it by name"
    );
    s.daemon.handle_detach(&client, id(1)).await.unwrap();
    s.assert_nothing_left();
}

#[tokio::test]
async fn a_tap_that_cannot_be_made_persistent_is_not_left() {
    let mut s = Scene::new(USERS).await;
    let req = AttachRequest {
        datapath: Some(Datapath::TapName),
        ..request(1)
    };
    let persist = |st: &Step| matches!(st, Step::MakePersistent(_));
    let refused = s.refused_when(persist, &user(1000, 1), req).await;
    assert!(
        matches!(refused, DaemonError::HostStep { .. }),
        "{refused:?}"
    );
    s.assert_nothing_left();
}

#[tokio::test]
async fn a_kept_interface_outlives_its_clients_connection() {
    let mut s = Scene::new(USERS).await;
    let req = AttachRequest {
        datapath: Some(Datapath::TapName),
        keep: true,
        ..request(1)
    };
    let vm = s.attach(&user(1000, 1), req).await.unwrap();
    assert!(vm.token.is_none(), "no client re-claims a kept interface");
    s.client_gone(1).await;
    assert!(s.fake.link(&vm.info.tap).is_some());
    // Another user may not detach it; its own user may.
    let refused = s.daemon.handle_detach(&user(1001, 2), id(1)).await;
    assert!(
        matches!(refused, Err(DaemonError::NotOwner { owner: 1000, .. })),
        "{refused:?}"
    );
    s.daemon.handle_detach(&user(1000, 3), id(1)).await.unwrap();
    s.assert_nothing_left();
}

#[tokio::test]
async fn keep_is_only_for_a_tap_opened_by_name() {
    let mut s = Scene::new(USERS).await;
    let req = AttachRequest {
        keep: true,
        ..request(1)
    };
    let refused = s.attach(&user(1000, 1), req).await.err().unwrap();
    assert!(
        matches!(refused, DaemonError::KeepNeedsTapName),
        "{refused:?}"
    );
    assert!(s.fake.steps().is_empty(), "{:?}", s.fake.steps());
    // Kept with a TAP opened by name, it attaches.
    let by_name = AttachRequest {
        datapath: Some(Datapath::TapName),
        keep: true,
        ..request(1)
    };
    s.attach(&user(1000, 1), by_name).await.unwrap();
    assert!(!s.fake.steps().is_empty());
}

#[tokio::test]
async fn another_clients_interface_is_not_its_to_detach() {
    let mut s = Scene::new(USERS).await;
    let _vm = s.attach(&user(1000, 1), request(1)).await.unwrap();
    let refused = s.daemon.handle_detach(&user(1000, 2), id(1)).await;
    assert!(
        matches!(refused, Err(DaemonError::HeldByAnother { .. })),
        "{refused:?}"
    );
    let unknown = s.daemon.handle_detach(&user(1000, 1), id(9)).await;
    assert!(
        matches!(unknown, Err(DaemonError::NotAttached { network: None, .. })),
        "{unknown:?}"
    );
    assert_eq!(
        unknown.unwrap_err().to_string(),
        format!("interface {} is not attached", id(9))
    );
}

#[tokio::test]
async fn a_limit_per_user_refuses_before_the_host_changes() {
    let mut s = Scene::new(
        "networks:
  shared:
    allow: { users: [root, '1000', '1001'] }
    max_interfaces_per_uid: 1
",
    )
    .await;
    let _one = s.attach(&user(1000, 1), request(1)).await.unwrap();
    s.fake.clear_steps();
    let refused = s.attach(&user(1000, 1), request(2)).await.err().unwrap();
    assert!(
        matches!(
            &refused,
            DaemonError::Limit {
                limit: 1,
                per_uid: Some(1000),
                ..
            }
        ),
        "{refused:?}"
    );
    assert_eq!(
        refused.to_string(),
        "uid 1000 has 1 interfaces on network \"shared\", its limit (networks.shared.max_interfaces_per_uid); detach one or raise the limit"
    );
    assert!(s.fake.steps().is_empty(), "{:?}", s.fake.steps());
    // Another user has a budget of its own.
    s.attach(&user(1001, 2), request(3)).await.unwrap();
}

#[tokio::test]
async fn a_user_the_network_does_not_allow_changes_nothing() {
    let mut s = Scene::new(USERS).await;
    let refused = s.attach(&user(2000, 1), request(1)).await.err().unwrap();
    assert!(
        matches!(&refused, DaemonError::NotAllowed { uid: 2000, network, .. } if network == "shared"),
        "{refused:?}"
    );
    assert!(s.fake.steps().is_empty(), "{:?}", s.fake.steps());
    // The same request from a user it allows changes the host.
    s.attach(&user(1000, 2), request(1)).await.unwrap();
    assert!(!s.fake.steps().is_empty());
}

#[tokio::test]
async fn an_unknown_network_is_refused_with_the_known_ones() {
    let mut s = Scene::new(USERS).await;
    let refused = s.attach(&user(0, 1), on("nope", 1)).await.err().unwrap();
    match refused {
        DaemonError::UnknownNetwork { name, known, .. } => {
            assert_eq!(name, "nope");
            assert!(
                known.contains("shared") && known.contains("host"),
                "{known}"
            );
        }
        other => panic!("{other:?}"),
    }
}

const BRIDGED: &str = "networks:
  lan:
    mode: bridged
    uplink: eth0
";

#[tokio::test]
async fn a_bridged_network_gives_each_vm_a_macvtap_guarded_on_its_way_out() {
    let mut s = Scene::new(BRIDGED).await;
    let admin = user(0, 1);
    let vm = s.attach(&admin, on("lan", 1)).await.unwrap();
    let port = s.fake.link(&vm.info.tap).expect("the macvtap");
    assert_eq!(port.kind, LinkKind::Macvtap);
    assert_eq!(port.address, Some(vm.info.mac_address), "the VM's MAC");
    assert!(s.fake.link("ln-lan").is_none(), "no bridge");
    let guard = s.fake.guard_of(&vm.info.tap).expect("guarded");
    assert_eq!(guard.hook, Hook::Egress);
    assert_eq!(vm.info.ip_address, None, "the LAN's DHCP server gives it");
    s.daemon.handle_detach(&admin, id(1)).await.unwrap();
    // The macvtap goes down before its hook and the link go.
    let steps = s.fake.steps();
    let down = position(&steps, |st| *st == Step::CutOff(vm.info.tap.clone()));
    let unhooked = position(&steps, |st| matches!(st, Step::UnhookGuardPorts(_)));
    assert!(down < unhooked, "{steps:#?}");
    s.assert_nothing_left();
}

/// Between a macvtap's unhook and its link's delete (which runs without
/// the lock, and while the kernel waits lets the daemon's other tasks
/// run), the guard linnet expects has no hook for it: a look at the
/// tables then must not take the missing hook for damage, hold every
/// guarded port and rebuild the guard (which it did, costing every
/// bridged attach a rebuild).
#[tokio::test]
async fn a_macvtap_unhooked_for_its_detach_is_not_expected_in_the_guard() {
    let mut s = Scene::new(BRIDGED).await;
    let admin = user(0, 1);
    let going = s.attach(&admin, on("lan", 1)).await.unwrap();
    let staying = s.attach(&admin, on("lan", 2)).await.unwrap();
    let expected = |d: &Daemon| -> Vec<String> {
        let mut taps: Vec<String> = d.guarded_ports().into_iter().map(|p| p.tap).collect();
        taps.sort();
        taps
    };
    let both = expected(&s.daemon);
    assert_eq!(both.len(), 2, "both guarded while attached: {both:?}");
    let teardown = s.daemon.detach_request(&admin, id(1)).unwrap();
    assert_eq!(
        expected(&s.daemon),
        both,
        "detaching but still hooked: its hook is expected"
    );
    teardown.cut_off().await;
    s.daemon.unhook_detaching(&teardown);
    assert_eq!(
        expected(&s.daemon),
        vec![staying.info.tap.clone()],
        "once unhooked, only the other macvtap's hook is expected"
    );
    s.daemon.run_teardown(teardown).await.unwrap();
    assert!(s.daemon.unhooked.is_empty(), "forgotten once detached");
    assert!(s.fake.link(&going.info.tap).is_none());
    assert_eq!(expected(&s.daemon), vec![staying.info.tap.clone()]);
}

#[tokio::test]
async fn a_macvtap_whose_device_cannot_be_opened_is_deleted() {
    let mut s = Scene::new(BRIDGED).await;
    let open = |st: &Step| matches!(st, Step::OpenMacvtap(_));
    let refused = s.refused_when(open, &user(0, 1), on("lan", 1)).await;
    assert!(
        matches!(refused, DaemonError::HostStep { .. }),
        "{refused:?}"
    );
    s.assert_nothing_left();
}

#[tokio::test]
async fn a_bridged_network_on_a_missing_nic_says_so() {
    let mut s = Scene::new(
        "networks:
  lan:
    mode: bridged
    uplink: eth9
",
    )
    .await;
    let refused = s.attach(&user(0, 1), on("lan", 1)).await.err().unwrap();
    assert!(
        matches!(&refused, DaemonError::LanLink { network, problem } if network == "lan" && problem.starts_with("there is no interface eth9")),
        "{refused:?}"
    );
    s.assert_nothing_left();
}

#[tokio::test]
async fn a_bridge_network_adds_taps_to_the_bridge_and_leaves_the_bridge() {
    let mut s = Scene::with_bridge(
        "networks:
  lab:
    mode: bridge
    bridge: br0
",
        "br0",
    )
    .await;
    let admin = user(0, 1);
    let vm = s.attach(&admin, on("lab", 1)).await.unwrap();
    let br0 = s.fake.link("br0").unwrap();
    assert_eq!(s.fake.link(&vm.info.tap).unwrap().master, Some(br0.index));
    s.daemon.handle_detach(&admin, id(1)).await.unwrap();
    assert!(s.fake.link("br0").is_some(), "not linnet's to remove");
    s.assert_nothing_left();
}

#[tokio::test]
async fn adoption_drops_a_record_whose_port_vanished_and_keeps_the_rest() {
    let mut s = Scene::new(USERS).await;
    let kept = s.attach(&user(1000, 1), request(1)).await.unwrap();
    let gone = s.attach(&user(1000, 2), request(2)).await.unwrap();
    s.restart_with(|| drop(gone.fd)).await;
    // The one whose VMM is still there is adopted, as it was.
    let adopted = &s.daemon.interfaces[&id(1)];
    assert_eq!(adopted.ip, kept.info.ip_address);
    assert_eq!(adopted.tap, kept.info.tap);
    assert!(s.fake.link(&kept.info.tap).is_some());
    assert_eq!(s.fake.guarded(), Some(vec![kept.info.tap.clone()]));
    // The other's record and lease hold go.
    assert!(!s.daemon.interfaces.contains_key(&id(2)));
    assert!(
        s.daemon
            .records
            .load()
            .iter()
            .all(|r| r.interface_id != id(2))
    );
    assert!(
        s.lease("shared", id(2))
            .is_none_or(|l| l.held_until.is_some()),
        "its address is no longer held as attached"
    );
    // A new port's name follows the adopted ones.
    let next = s.attach(&user(1000, 3), request(3)).await.unwrap();
    assert_ne!(next.info.tap, kept.info.tap);
}

#[tokio::test]
async fn a_restart_keeps_the_tables_and_links_in_place() {
    let mut s = Scene::new(USERS).await;
    let vm = s.attach(&user(1000, 1), request(1)).await.unwrap();
    s.fake.clear_steps();
    s.daemon.stop().await;
    let stopped = s.fake.steps();
    assert!(
        !stopped.iter().any(|st| matches!(
            st,
            Step::DeleteLink(_)
                | Step::RemoveGuard
                | Step::Firewall(_)
                | Step::Forwarding(_, false)
        )),
        "a stop with VMs attached leaves their network: {stopped:#?}"
    );
    s.daemon = start(&s.fake, s.dir.path(), USERS).await;
    assert!(s.fake.link(&vm.info.tap).is_some());
    assert!(s.fake.forwarding(false));
    assert_eq!(s.fake.guarded(), Some(vec![vm.info.tap.clone()]));
}

#[tokio::test]
async fn a_reclaim_takes_the_token_and_the_user() {
    let mut s = Scene::new(USERS).await;
    let vm = s.attach(&user(1000, 1), request(1)).await.unwrap();
    let token = vm.token.clone().unwrap();
    s.restart().await;
    let wrong = s
        .daemon
        .handle_reclaim(&user(1000, 5), id(1), "not-the-token");
    assert!(
        matches!(wrong, Err(DaemonError::NotReclaimable { .. })),
        "{wrong:?}"
    );
    let other = s.daemon.handle_reclaim(&user(1001, 6), id(1), &token);
    assert!(
        matches!(other, Err(DaemonError::NotReclaimable { .. })),
        "{other:?}"
    );
    s.daemon
        .handle_reclaim(&user(1000, 7), id(1), &token)
        .unwrap();
    let twice = s.daemon.handle_reclaim(&user(1000, 8), id(1), &token);
    assert!(
        matches!(twice, Err(DaemonError::AlreadyReclaimed { .. })),
        "{twice:?}"
    );
    // From now on it lives as long as that connection.
    s.client_gone(7).await;
    s.assert_nothing_left();
}

#[tokio::test]
async fn a_flushed_ruleset_is_put_back_with_every_guarded_port() {
    let mut s = Scene::new(USERS).await;
    let vm = s.attach(&user(1000, 1), request(1)).await.unwrap();
    s.fake.flush_tables();
    s.daemon.check_host();
    assert_eq!(s.fake.guarded(), Some(vec![vm.info.tap.clone()]));
    assert!(s.fake.firewall().is_some());
}

/// `bridge linnet_fabric` deleted alone (DHCP would cross hosts) is seen
/// and put back with the firewall.
#[tokio::test]
async fn a_deleted_fabric_table_is_put_back() {
    let mut s = Scene::new(ACROSS_HOSTS).await;
    let _vm = s.attach(&user(1000, 1), on("fabric", 1)).await.unwrap();
    assert!(!s.daemon.own_tables_damaged(), "as linnet made them");
    s.fake.delete_fabric_table();
    assert!(s.daemon.own_tables_damaged());
    s.fake.clear_steps();
    s.daemon.check_host();
    assert!(
        s.fake
            .steps()
            .contains(&Step::Firewall(vec!["ln-fabric".into()])),
        "{:#?}",
        s.fake.steps()
    );
    assert!(!s.daemon.own_tables_damaged(), "back");
}

#[tokio::test]
async fn a_vmm_that_changes_its_taps_mac_is_cut_off() {
    let mut s = Scene::new(USERS).await;
    let vm = s.attach(&user(1000, 1), request(1)).await.unwrap();
    let tap = s.fake.link(&vm.info.tap).unwrap();
    let was = tap.address.expect("linnet set the TAP's MAC");
    s.fake
        .set_mac(&tap.name, "02:00:00:00:00:99".parse().unwrap());
    s.daemon.tap_address_changed(tap.index, was).await;
    let now = s.fake.link(&tap.name).unwrap();
    assert_eq!(now.master, None, "off the bridge");
    assert!(!s.fake.is_up(&tap.name));
    assert!(s.daemon.interfaces[&id(1)].cut_off.is_some());
}

#[tokio::test]
async fn a_clone_refused_for_its_published_port_gives_the_lease_back() {
    let mut s = Scene::new(USERS).await;
    let owner = user(1000, 1);
    let port = "18080:80".parse().unwrap();
    let _other = s
        .attach(
            &owner,
            AttachRequest {
                publish: vec![port],
                ..request(2)
            },
        )
        .await
        .unwrap();
    // The VM that was snapshotted stops; its lease is held meanwhile.
    let web = s.attach(&owner, named(1, "web")).await.unwrap();
    s.daemon.handle_detach(&owner, id(1)).await.unwrap();
    drop(web.fd);
    let held = s.lease("shared", id(1)).expect("the stopped VM's lease");
    let clone = |n| AttachRequest {
        clone_of: Some(CloneOf::Name("web".into())),
        ..request(n)
    };
    let refused = s
        .attach(
            &owner,
            AttachRequest {
                publish: vec![port],
                ..clone(3)
            },
        )
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&refused, DaemonError::PortForwarded { holder, .. } if *holder == id(2)),
        "{refused:?}"
    );
    assert_eq!(
        s.lease("shared", id(1)).as_ref(),
        Some(&held),
        "given back as it was"
    );
    assert!(
        !s.linnet_links().iter().any(|l| l.starts_with("lnc")),
        "the clone's port went: {:?}",
        s.linnet_links()
    );
    // The next clone takes the VM's address over again, as the first.
    s.fake.clear_steps();
    let first = s.attach(&owner, clone(4)).await.unwrap();
    assert_eq!(first.info.ip_address, Some(held.ip));
    assert!(
        s.fake
            .steps()
            .iter()
            .any(|st| matches!(st, Step::AnnounceClone(_))),
        "it holds the guest's address: {:#?}",
        s.fake.steps()
    );
}

#[tokio::test]
async fn a_subnet_that_meets_a_route_of_the_host_is_refused_naming_its_link() {
    let mut s = Scene::new(USERS).await;
    s.fake.add_link("virbr1", LinkKind::Bridge);
    s.fake.add_route("192.168.105.0/24", "virbr1");
    let refused = s.attach(&user(1000, 1), request(1)).await.err().unwrap();
    assert!(
        matches!(&refused, DaemonError::Overlap { key: "subnet", link, .. } if link == "virbr1"),
        "{refused:?}"
    );
    assert!(
        !s.fake
            .steps()
            .iter()
            .any(|st| matches!(st, Step::CreateBridge(_))),
        "refused before the bridge was made"
    );
    s.assert_nothing_left();
}

#[tokio::test]
async fn a_kept_port_deleted_while_no_daemon_ran_is_not_adopted() {
    let mut s = Scene::new(USERS).await;
    let admin = user(0, 1);
    let kept = |n| AttachRequest {
        datapath: Some(Datapath::TapName),
        keep: true,
        ..request(n)
    };
    let gone = s.attach(&admin, kept(1)).await.unwrap();
    let stays = s.attach(&admin, kept(2)).await.unwrap();
    let fake = s.fake.clone();
    s.restart_with(|| fake.remove_link(&gone.info.tap)).await;
    assert!(!s.daemon.interfaces.contains_key(&id(1)));
    assert!(
        s.daemon.interfaces.contains_key(&id(2)),
        "the other is adopted"
    );
    assert_eq!(s.fake.guarded(), Some(vec![stays.info.tap.clone()]));
}

#[tokio::test]
async fn a_tap_name_clone_that_fails_takes_its_namespaces_name_away() {
    let mut s = Scene::new(USERS).await;
    let owner = user(1000, 1);
    let _web = s.attach(&owner, named(1, "web")).await.unwrap();
    let clone = AttachRequest {
        clone_of: Some(CloneOf::Name("web".into())),
        datapath: Some(Datapath::TapName),
        ..request(2)
    };
    let persist = |st: &Step| matches!(st, Step::MakePersistent(_));
    let refused = s.refused_when(persist, &owner, clone).await;
    assert!(
        matches!(&refused, DaemonError::HostStep { source, .. } if source.to_string().starts_with("injected failure of MakePersistent")),
        "{refused:?}"
    );
    let steps = s.fake.steps();
    let mounted = position(&steps, |st| matches!(st, Step::MountNamespace(_)));
    let unmounted = position(&steps, |st| matches!(st, Step::UnmountNamespace(_)));
    assert!(mounted < unmounted, "{steps:#?}");
    assert!(
        !s.linnet_links().iter().any(|l| l.starts_with("lnc")),
        "the clone's port went: {:?}",
        s.linnet_links()
    );
}

#[tokio::test]
async fn a_forward_the_firewall_refuses_is_not_kept_and_one_it_takes_goes_with_rm() {
    let mut s = Scene::new(USERS).await;
    let owner = user(1000, 1);
    let _vm = s.attach(&owner, named(1, "web")).await.unwrap();
    let forward = |spec: &str| crate::api::ForwardRequest {
        network: "shared".into(),
        interface_id: None,
        name: Some("web".into()),
        forward: spec.parse().unwrap(),
    };
    let published = |s: &Scene| -> Vec<u16> {
        let firewall = s.fake.firewall().expect("the firewall table");
        firewall[0]
            .forwards
            .iter()
            .map(|f| f.forward.host_port)
            .collect()
    };
    s.fake
        .fail_on(|st| matches!(st, Step::Firewall(b) if !b.is_empty()));
    let refused = s.daemon.handle_forward_add(&owner, forward("18081:80"));
    assert!(
        matches!(refused, Err(DaemonError::Firewall(_))),
        "{refused:?}"
    );
    assert!(s.daemon.interfaces[&id(1)].forwards.is_empty(), "not kept");
    assert_eq!(published(&s), Vec::<u16>::new(), "the table put back");
    s.daemon
        .handle_forward_add(&owner, forward("18082:80"))
        .unwrap();
    assert_eq!(published(&s), [18082]);
    // Another user may not change its forwards; its owner removes it.
    let other = s
        .daemon
        .handle_forward_remove(&user(1001, 2), forward("18082:80"));
    assert!(
        matches!(other, Err(DaemonError::NotOwner { owner: 1000, .. })),
        "{other:?}"
    );
    // One it does not have is named with those it has.
    match s.daemon.handle_forward_remove(&owner, forward("18083:80")) {
        Err(DaemonError::NoSuchForward {
            id: which,
            forward,
            has,
        }) => {
            assert_eq!((which, forward.host_port), (id(1), 18083));
            assert_eq!(has.iter().map(|f| f.host_port).collect::<Vec<_>>(), [18082]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(published(&s), [18082], "nothing changed");
    s.daemon
        .handle_forward_remove(&owner, forward("18082:80"))
        .unwrap();
    assert_eq!(published(&s), Vec::<u16>::new());
}

#[tokio::test]
async fn a_detach_waiting_on_the_kernel_holds_up_no_other_request_and_keeps_what_it_holds() {
    let mut s = Scene::new(USERS).await;
    let (one, two) = (user(1000, 1), user(1001, 2));
    let first = s.attach(&one, named(1, "web")).await.unwrap();
    let Scene { daemon, fake, .. } = s;
    let lock = Arc::new(Mutex::new(daemon));
    let open = fake.hold_deletes();
    let detach = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let teardown = lock.lock().await.detach_request(&one, id(1))?;
            finish_unlocked(&lock, teardown).await
        })
    };
    while lock.lock().await.detaching.is_empty() {
        tokio::task::yield_now().await;
    }
    // Another user's attach goes on while the TAP is being deleted; the
    // detaching interface keeps its lease, and so its network.
    let (info, _fd, _) = lock_for_attach(&lock, &request(2))
        .await
        .handle_attach(&two, request(2))
        .await
        .unwrap();
    assert_ne!(info.ip_address, first.info.ip_address);
    assert!(linnet_links(&fake).contains(&first.info.tap));
    assert!(!detach.is_finished());
    // What asks for what it still holds (its id, its name) waits for it.
    let again = |req: AttachRequest| {
        let lock = lock.clone();
        tokio::spawn(async move {
            let mut daemon = lock_for_attach(&lock, &req).await;
            daemon
                .handle_attach(&user(1000, 3), req)
                .await
                .map(|(info, fd, _)| (info, fd))
        })
    };
    let (same_id, same_name) = (again(request(1)), again(named(3, "web")));
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(!same_id.is_finished() && !same_name.is_finished());
    // The kernel lets go: the detach ends, then the waiting attaches.
    open.send(true).unwrap();
    detach.await.unwrap().unwrap();
    let (info, _fd1) = same_id.await.unwrap().unwrap();
    assert_eq!(info.ip_address, first.info.ip_address, "its lease, again");
    let (named_again, _fd3) = same_name.await.unwrap().unwrap();
    assert_eq!(named_again.name.as_deref(), Some("web"));
    assert!(!linnet_links(&fake).contains(&first.info.tap));
    assert!(lock.lock().await.detaching.is_empty());
}

#[tokio::test]
async fn requests_that_name_no_one_interface_or_wait_where_they_hold_are_refused_as_such() {
    let mut scene = Scene::new(USERS).await;
    let owner = user(1000, 1);
    let web = scene.attach(&owner, named(1, "web")).await.unwrap();
    let both = InterfaceRef {
        network: "shared".into(),
        interface_id: Some(id(1)),
        name: Some("web".into()),
    };
    let named_by = |which: &InterfaceRef| {
        scene
            .daemon
            .interface_named(&owner, which, "change its policy")
    };
    assert!(matches!(named_by(&both), Err(DaemonError::WhichInterface)));
    let by_name = InterfaceRef {
        interface_id: None,
        ..both.clone()
    };
    assert_eq!(
        named_by(&by_name).unwrap(),
        Some(id(1)),
        "the same, by name alone"
    );
    // Its address, asked on the connection that holds it, would leave
    // the connection unwatched while it waits; on another, it is known.
    let refused = scene.daemon.address_of(&owner, "shared", id(1));
    assert!(
        matches!(refused, Err(DaemonError::WaitHolds)),
        "{refused:?}"
    );
    let known = scene.daemon.address_of(&user(1000, 2), "shared", id(1));
    assert_eq!(known.unwrap().ok(), web.info.ip_address);
}

#[tokio::test]
async fn a_policy_is_refused_before_anything_is_made_on_a_host_without_br_netfilter() {
    let policed = || AttachRequest {
        policy: Some(crate::policy::Policy {
            egress: vec!["10.0.0.0/8".parse().unwrap()],
            ingress: vec![],
            ..Default::default()
        }),
        ..request(1)
    };
    let mut with = Scene::new(USERS).await;
    let attached = with.attach(&user(0, 1), policed()).await;
    assert!(attached.is_ok(), "{:?}", attached.err());
    let mut without = Scene::new(USERS).await;
    without.fake.without_bridge_netfilter();
    let refused = without.attach(&user(0, 1), policed()).await.err();
    assert!(
        matches!(refused, Some(DaemonError::NoBrNetfilter)),
        "{refused:?}"
    );
    assert_eq!(without.fake.steps(), Vec::new(), "nothing made");
    without.assert_nothing_left();
}

#[tokio::test]
async fn names_in_a_policy_gate_the_vms_dns_and_what_it_learned_follows_the_policy_and_a_restart() {
    use crate::api::PolicySetRequest;
    use crate::policy::Policy;
    use crate::services::name_gate::Verdict;
    use hickory_proto::rr::Name;
    let policy = |rules: &[&str]| Policy {
        egress: rules.iter().map(|r| r.parse().unwrap()).collect(),
        ingress: vec![],
        ..Default::default()
    };
    let name = |s: &str| Name::from_utf8(s).unwrap();
    let mut scene = Scene::new(USERS).await;
    let root = user(0, 1);
    let vm = scene
        .attach(
            &root,
            AttachRequest {
                policy: Some(policy(&["api.example.com:443/tcp"])),
                ..named(1, "agent")
            },
        )
        .await
        .expect("attached");
    let (tap, addr) = (
        vm.info.tap.clone(),
        std::net::IpAddr::V4(vm.info.ip_address.unwrap()),
    );
    let names = scene.daemon.names.clone();
    assert_eq!(
        names.ask("shared", addr, &name("api.example.com")),
        Verdict::Allowed(tap.clone())
    );
    assert_eq!(
        names.ask("shared", addr, &name("evil.test")),
        Verdict::Refused
    );
    names
        .learn(
            &tap,
            &name("api.example.com"),
            &[("192.0.2.7".parse().unwrap(), 300)],
        )
        .unwrap();
    // A rebuild (another VM attaching with a policy) keeps it.
    let _other = scene
        .attach(
            &root,
            AttachRequest {
                policy: Some(policy(&["10.0.0.0/8"])),
                ..request(2)
            },
        )
        .await
        .expect("attached");
    let policed = |fake: &FakeHost| -> Vec<crate::learned::Element> {
        (fake
            .firewall()
            .unwrap()
            .iter()
            .flat_map(|n| n.policies.clone()))
        .flat_map(|p| p.learned)
        .collect()
    };
    assert_eq!(
        policed(&scene.fake).len(),
        1,
        "rebuilt with what it learned"
    );
    // The next daemon finds it in the kernel's sets and gives it back.
    scene.restart().await;
    let names = scene.daemon.names.clone();
    let shown = names.shown(&tap);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].address.to_string(), "192.0.2.7");
    assert_eq!(policed(&scene.fake).len(), 1);
    // A new policy drops it.
    let vm_id = vm.info.interface_id;
    let mut set = |rules: &[&str]| {
        let req = PolicySetRequest {
            network: "shared".into(),
            interface_id: Some(vm_id),
            name: None,
            policy: policy(rules),
            only: None,
        };
        scene.daemon.policy_set(&root, req).expect("policy set");
    };
    set(&["*.other.test:443"]);
    assert!(names.shown(&tap).is_empty());
    assert_eq!(
        names.ask("shared", addr, &name("api.example.com")),
        Verdict::Refused
    );
    // Without names the VM is not gated at all.
    set(&["10.0.0.0/8"]);
    assert_eq!(names.ask("shared", addr, &name("evil.test")), Verdict::Open);
    assert!(
        policed(&scene.fake).is_empty(),
        "nothing learned in the table"
    );
}

/// A network whose policy and rate are enforced: users 1000 and 1001 may
/// attach; VMs reach one name and one network, and send at 20 Mbit/s.
const ENFORCED: &str = "networks:
  shared:
    allow: { users: [root, '1000', '1001'] }
    policy: { egress: ['api.example.com:443/tcp', '10.0.0.0/8'], enforced: true }
    rate_limit: { out: 20mbit, enforced: true }
";

/// A policy of `egress` rules, sending at most at `out` when given.
fn egress(rules: &[&str], out: Option<&str>) -> crate::policy::Policy {
    crate::policy::Policy {
        egress: rules.iter().map(|r| r.parse().unwrap()).collect(),
        rate_limit: crate::rate::RateLimits {
            received: None,
            sent: out.map(|r| r.parse().unwrap()),
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn an_enforced_policy_is_the_most_a_vms_owner_can_have_by_attach_or_policy_set() {
    use crate::api::PolicySetRequest;
    let mut scene = Scene::new(ENFORCED).await;
    let owner = user(1000, 1);
    // Bringing nothing, a VM gets the network's; narrower is its own.
    let plain = scene.attach(&owner, request(1)).await.expect("attached");
    let narrow = egress(&["api.example.com:443/tcp"], Some("10mbit"));
    let attach = |n, policy| AttachRequest {
        policy: Some(policy),
        ..request(n)
    };
    scene
        .attach(&owner, attach(2, narrow.clone()))
        .await
        .expect("a narrower policy is attached");
    assert_eq!(scene.daemon.interfaces[&id(2)].policy, narrow);
    // A rate alone keeps the network's rules: narrower too.
    scene
        .attach(&owner, attach(4, egress(&[], Some("1mbit"))))
        .await
        .expect("a lower rate is attached");
    assert_eq!(
        scene.daemon.interfaces[&id(4)].policy,
        egress(&["api.example.com:443/tcp", "10.0.0.0/8"], Some("1mbit"))
    );
    let links = scene.linnet_links();
    // Wider, any way: refused before anything is made, naming the part.
    for (wider, says) in [
        (
            egress(&["evil.example.com:443/tcp"], None),
            "network \"shared\" holds its VMs to its policy (networks.yaml: policy.enforced): connecting to evil.example.com:443/tcp is not within its connect rules (api.example.com:443/tcp, 10.0.0.0/8)",
        ),
        (egress(&[], None), "connecting anywhere (no connect rule)"),
        (
            egress(&["10.0.0.0/8"], Some("50mbit")),
            "its rate_limit (networks.yaml: rate_limit.enforced): out 50mbit",
        ),
    ] {
        let refused = scene.refused(&owner, attach(3, wider.clone())).await;
        assert!(
            matches!(refused, DaemonError::AboveCeiling { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains(says), "{refused}");
        assert_eq!(scene.linnet_links(), links, "nothing made for {wider:?}");
    }
    // `policy set` alike: narrowing passes, widening is refused and
    // changes nothing.
    let set = |policy| PolicySetRequest {
        network: "shared".into(),
        interface_id: Some(plain.info.interface_id),
        name: None,
        policy,
        only: None,
    };
    let wider = scene
        .daemon
        .policy_set(&owner, set(egress(&["0.0.0.0/0"], Some("20mbit"))))
        .expect_err("widened by policy set");
    assert!(
        wider
            .to_string()
            .contains("connecting to 0.0.0.0/0 is not within"),
        "{wider}"
    );
    assert_eq!(
        scene.daemon.interfaces[&id(1)].policy,
        egress(&["api.example.com:443/tcp", "10.0.0.0/8"], Some("20mbit")),
        "still the network's"
    );
    scene
        .daemon
        .policy_set(&owner, set(narrow.clone()))
        .expect("narrowed by policy set");
    assert_eq!(scene.daemon.interfaces[&id(1)].policy, narrow);
    // Where the network does not enforce it, the same change is made.
    let mut open = Scene::new(USERS).await;
    let vm = open.attach(&owner, request(1)).await.expect("attached");
    open.daemon
        .policy_set(
            &owner,
            PolicySetRequest {
                interface_id: Some(vm.info.interface_id),
                ..set(egress(&["0.0.0.0/0"], None))
            },
        )
        .expect("a policy set on a network that enforces nothing");
}

#[tokio::test]
async fn a_restart_under_a_new_ceiling_holds_a_wider_vm_to_the_networks_policy() {
    let mut scene = Scene::new(USERS).await;
    let owner = user(1000, 1);
    let wide = egress(&["0.0.0.0/0"], None);
    let _vm = scene
        .attach(
            &owner,
            AttachRequest {
                policy: Some(wide.clone()),
                ..request(1)
            },
        )
        .await
        .expect("attached");
    assert_eq!(scene.daemon.interfaces[&id(1)].policy, wide);
    // Root enforces a policy in networks.yaml and restarts the daemon.
    scene.yaml = ENFORCED.into();
    scene.restart().await;
    assert_eq!(
        scene.daemon.interfaces[&id(1)].policy,
        egress(&["api.example.com:443/tcp", "10.0.0.0/8"], Some("20mbit")),
        "adopted, and held to the network's policy"
    );
}

#[tokio::test]
async fn an_ipv6_address_a_vm_probes_is_learned_policed_kept_across_a_restart_and_refused_to_others()
 {
    use crate::formed6::Probe;
    use crate::host::packet::Seen;
    use crate::policy::Policy;
    use std::net::{IpAddr, Ipv6Addr};
    let mut s = Scene::new(USERS).await;
    let policy = Policy {
        egress: vec!["10.0.0.0/8".parse().unwrap()],
        ..Default::default()
    };
    let vm = s
        .attach(
            &user(1000, 1),
            AttachRequest {
                policy: Some(policy),
                ..request(1)
            },
        )
        .await
        .unwrap();
    let other = s.attach(&user(1000, 2), request(2)).await.unwrap();
    let (tap, mac) = (vm.info.tap.clone(), vm.info.mac_address);
    let index = s.fake.link(&tap).unwrap().index;
    let prefix = vm.info.ipv6_prefix.unwrap();
    let formed = Ipv6Addr::from(u128::from(prefix.network()) | 0x1c2d_3e4f_5a6b_7c8d);
    let from_vm = Seen {
        index,
        outgoing: false,
        len: 78,
    };
    let may_send = |s: &Scene, port: &str, a: Ipv6Addr| {
        s.fake.guard_of(port).expect("guarded").ipv6.contains(&a)
    };
    let policed = |s: &Scene, a: Ipv6Addr| {
        let firewall = s.fake.firewall().expect("a firewall");
        let vm = firewall
            .iter()
            .flat_map(|n| &n.policies)
            .find(|p| p.tap == tap)
            .expect("the VM's policy");
        vm.addrs.contains(&IpAddr::V6(a))
    };

    // Not from the VM: another MAC on its port, or a frame on its way to it.
    let probe = |mac| Probe {
        mac,
        target: formed,
    };
    s.daemon
        .address6_probed(from_vm, probe(other.info.mac_address));
    let toward_vm = Seen {
        outgoing: true,
        ..from_vm
    };
    s.daemon.address6_probed(toward_vm, probe(mac));
    assert!(!may_send(&s, &tap, formed) && !policed(&s, formed));

    // Its own probe, with its guard failing: not learned.
    s.fake.fail_on(|st| matches!(st, Step::UpdateGuardPort(_)));
    s.daemon.address6_probed(from_vm, probe(mac));
    assert!(!may_send(&s, &tap, formed));
    assert!(!policed(&s, formed), "the policy put back as it was");

    // Then: its policy holds on it before its guard lets it through.
    s.fake.clear_steps();
    s.daemon.address6_probed(from_vm, probe(mac));
    assert!(may_send(&s, &tap, formed) && policed(&s, formed));
    let steps = s.fake.steps();
    let firewall = position(&steps, |st| matches!(st, Step::Firewall(_)));
    let guard = position(&steps, |st| *st == Step::UpdateGuardPort(tap.clone()));
    assert!(firewall < guard, "{steps:#?}");

    // The other VM may not have it.
    let other_index = s.fake.link(&other.info.tap).unwrap().index;
    s.daemon.address6_probed(
        Seen {
            index: other_index,
            ..from_vm
        },
        probe(other.info.mac_address),
    );
    assert!(!may_send(&s, &other.info.tap, formed));

    // A daemon after this one keeps it.
    s.restart().await;
    assert!(may_send(&s, &tap, formed) && policed(&s, formed));
}
