"""The network setups the benchmark compares.

Each setup builds one network with up to two guests (network namespaces that
play the VMs) and says where the host side is. Guests behind a datapath get
their frames through linnet-standin, the same stand-in VMM for every setup,
so its cost is equal for all; setups whose peer brings its own VMM side
(slirp4netns, vde_plug2tap) say so.
"""
import json
import os

from .host import children, debian_version, go_module_version, ip, link_exists, run, wait_for

VM_TO_HOST, HOST_TO_VM, VM_TO_VM = "vm_to_host", "host_to_vm", "vm_to_vm"
DIRECTIONS = (VM_TO_HOST, HOST_TO_VM, VM_TO_VM)
MIXED_VNET = "linnet dgram, mixed: the + vnet client"
# The back-end in the VM's relay, the stand-in as its front-end (a guest's
# virtio-net driver, its memory shared).
VHOST_USER = "linnet vhost-user"
MIXED_BARE = "linnet dgram, mixed: the bare client"
NETWORK_SOCKET = "linnet network socket"
LAN_BRIDGED = "linnet bridged (macvtap)"
LAN_BRIDGE = "linnet bridge (existing bridge)"
ROOTLESS = "linnet rootless"
# Multi-queue: one guest's TAP with two queues (the stand-in a thread pair
# on each, as a VMM a vCPU) against one queue, two TCP streams through each.
TWO_STREAMS = "linnet tap, 2 streams"
TWO_QUEUES = "linnet tap, 2 queues, 2 streams"
QUEUES_WHY = "multi-queue is judged at MTU 1500, where frames, not bytes, are the work"
MIXED_WHY = "at MTU 65520 a bare frame is as large as an offloaded segment: nothing to mix"


class Topology:
    """What a running setup offers the measurements."""

    def __init__(self):
        self.guests = []        # [(namespace, address)]; the first is the iperf3 client
        self.server = None      # the host's address as the guests reach it
        self.net_pids = []      # networking processes: daemon, relay, peer
        self.standin_pids = []  # the stand-in VMMs
        self.streams = 1        # iperf3's parallel TCP streams


class Setup:
    group = ""              # kernel | baseline | linnet | peer
    mtus = (1500, 65520)
    vm_to_vm = True
    why_no_vm_to_vm = ""
    why_no_jumbo = ""
    # The guest's TAP plays a VM's NIC (a stand-in or vde_plug2tap reads it)
    # rather than being the setup's own (pasta's, slirp4netns's).
    emulated_vm_tap = True

    def __init__(self, name):
        self.name = name

    def unavailable(self, env):
        """Why this setup cannot run on this machine, or None."""
        return None

    def version(self, env):
        """The exact version of what this setup measures, when it is not the
        kernel's (which the machine's record names)."""
        return None

    def guests(self):
        return 2 if self.vm_to_vm else 1

    def up(self, env, mtu):
        raise NotImplementedError


# A guest's TAP that plays a VM's NIC drops what the guest sends while its
# queue is full, where a virtio-net ring would make the guest wait: with
# the default 1000 frames, a stand-in a moment late on 2 busy cores cost
# TCP losses that had nothing to do with the setup under test (passt's
# VM→host at MTU 1500 spread over 10x, with thousands of retransmits). Those
# TAPs get a deeper queue; pasta's and slirp4netns's own TAPs, which are
# what their users run, keep theirs.
GUEST_TXQUEUELEN = 5000


def deepen_guest_queues(topo):
    for ns, _ in topo.guests:
        for link in json.loads(ip("-j", "-d", "link", "show", ns=ns)):
            if link.get("linkinfo", {}).get("info_kind") == "tun":
                ip("link", "set", link["ifname"], "txqueuelen", GUEST_TXQUEUELEN, ns=ns)


def configure(ns, dev, cidr, mtu=None, gateway=None):
    if mtu:
        ip("link", "set", dev, "mtu", mtu, ns=ns)
    ip("addr", "add", cidr, "dev", dev, ns=ns)
    ip("link", "set", dev, "up", ns=ns)
    if gateway:
        ip("route", "add", "default", "via", gateway, ns=ns)


class Veth(Setup):
    """The kernel's limit: a veth pair straight into each guest; VM to VM
    over a second pair between the guests."""
    group = "kernel"

    def up(self, env, mtu):
        topo = Topology()
        g1 = env.guest_ns()
        env.host_link("bvh1")
        ip("link", "add", "bvh1", "mtu", mtu, "type", "veth", "peer", "name", "eth0",
           "mtu", mtu, "netns", g1)
        configure(None, "bvh1", "10.200.0.1/24")
        configure(g1, "eth0", "10.200.0.2/24")
        topo.server = "10.200.0.1"
        topo.guests.append((g1, "10.200.0.2"))
        g2 = env.guest_ns()
        ip("link", "add", "eth1", "mtu", mtu, "netns", g1, "type", "veth", "peer", "name",
           "eth0", "mtu", mtu, "netns", g2)
        configure(g1, "eth1", "10.200.1.1/24")
        configure(g2, "eth0", "10.200.1.2/24")
        topo.guests.append((g2, "10.200.1.2"))
        return topo


class Bridge(Setup):
    """The kernel's limit with a switch: a bridge on the host, a veth pair
    per guest."""
    group = "kernel"
    bridge = "bbr0"
    subnet = "10.201.0"

    def up(self, env, mtu):
        topo = Topology()
        bridge = env.host_link(self.bridge)
        ip("link", "add", bridge, "type", "bridge")
        for i in range(self.guests()):
            ns = env.guest_ns()
            port = self.plug(env, topo, i, ns, mtu)
            ip("link", "set", port, "mtu", mtu, "master", bridge, "up")
            addr = f"{self.subnet}.{i + 2}"
            configure(ns, "eth0", f"{addr}/24")
            topo.guests.append((ns, addr))
        ip("link", "set", bridge, "mtu", mtu)
        configure(None, bridge, f"{self.subnet}.1/24")
        topo.server = f"{self.subnet}.1"
        return topo

    def plug(self, env, topo, i, ns, mtu):
        """Gives guest `ns` its eth0 and returns the host's end of it."""
        port = env.host_link(f"bbv{i}")
        ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "mtu", mtu, "netns", ns)
        return port


class TapRelay(Bridge):
    """The baseline for linnet's tap datapath: a TAP on a plain bridge, its
    fd relayed to the guest by the same stand-in, with no linnet at all."""
    group = "baseline"
    bridge = "bbr1"
    subnet = "10.202.0"

    def plug(self, env, topo, i, ns, mtu):
        tap = env.host_link(f"btap{i}")
        proc = env.standin(f"standin-{ns}", ["--tap", tap, "--mtu", mtu], ns)
        topo.standin_pids.append(proc.pid)
        env.wait_link(tap)
        env.wait_link("eth0", ns)
        return tap


class Linnet(Setup):
    """linnet: `linnet run --datapath D [--vnet-hdr] -- linnet-standin …`,
    with or without the virtio-net header per guest (`vnet_hdr`: one bool
    for each). With `measured_joins_last`, the first guest, the one the
    measurements start from, attaches after the second."""
    group = "linnet"
    # How the stand-in takes what `linnet run` gives it: an fd, or (for
    # vhost-user) the back-end's socket, the stand-in its front-end.
    STANDIN_ARGS = {"tap": ["--fd", "{fd}"], "dgram": ["--dgram-fd", "{fd}"],
                    "stream": ["--stream-fd", "{fd}"], "vhost-user": ["--vhost-user", "{socket}"]}

    def __init__(self, name, datapath, vnet_hdr=(False, False), anti_spoofing=True, policy=False,
                 mtus=(1500, 65520), why_no_jumbo="", measured_joins_last=False, queues=1,
                 streams=1):
        super().__init__(name)
        self.queues = queues
        self.streams = streams
        self.datapath = datapath
        self.vnet_hdr = vnet_hdr
        self.anti_spoofing = anti_spoofing
        self.policy = policy
        self.mtus = mtus
        self.why_no_jumbo = why_no_jumbo
        self.measured_joins_last = measured_joins_last

    def version(self, env):
        return f"linnet {env.linnet_commit}"

    def up(self, env, mtu):
        topo = Topology()
        network = env.linnet.network_for(mtu, self.anti_spoofing, self.policy)
        namespaces = [env.guest_ns() for _ in range(self.guests())]
        order = list(range(len(namespaces)))
        if self.measured_joins_last:
            order.reverse()
        guests = {}
        for i in order:
            ns, vnet_hdr = namespaces[i], self.vnet_hdr[i]
            out = env.fresh_path(f"{ns}.json")
            standin = self.STANDIN_ARGS[self.datapath] + ["--netns", f"/run/netns/{ns}"]
            if self.queues > 1:
                standin = ["--fds", "{fds}", "--netns", f"/run/netns/{ns}"]
            if vnet_hdr:
                standin += ["--vnet-hdr", "12"]
            args = [env.linnet.bin, "run", "--network", network, "--datapath", self.datapath,
                    "--json", out, "--queues", str(self.queues)]
            if vnet_hdr:
                args.append("--vnet-hdr")
            proc = env.procs.start(f"run-{ns}", args + ["--", env.standin_bin] + standin,
                                   env=env.linnet.env)
            info = wait_for(lambda: env.procs.check_alive() or read_json(out),
                            f"`linnet run` for {ns} to attach")
            env.wait_link("eth0", ns)
            prefix = info["subnet"].split("/")[1]
            configure(ns, "eth0", f"{info['ip_address']}/{prefix}")
            guests[i] = (ns, info["ip_address"])
            topo.net_pids.append(proc.pid)
            topo.standin_pids += wait_for(lambda: children(proc.pid),
                                          f"the stand-in under `linnet run` for {ns}")
        topo.guests = [guests[i] for i in range(len(namespaces))]
        topo.server = info["gateway"]
        topo.net_pids.append(env.linnet.daemon.pid)
        topo.streams = self.streams
        return topo


class NetworkSocket(Setup):
    """linnet's per-network socket (`socket: true`), as lima and socket_vmnet
    clients use it: each stand-in connects to NETWORK.sock with a MAC of
    its own, the daemon starts a relay for the connection, which attaches
    on the first frame. The same stream framing as `linnet stream`, which
    it is measured against."""
    group = "linnet"
    datapath = "stream"

    def version(self, env):
        return f"linnet {env.linnet_commit}"

    def up(self, env, mtu):
        topo = Topology()
        network = env.linnet.network_for(mtu)
        sock = env.linnet.network_socket(network)
        listing = env.linnet.listing()
        net = next(n for n in listing["networks"] if n["name"] == network)
        prefix = net["subnet"].split("/")[1]
        for i in range(self.guests()):
            ns = env.guest_ns()
            mac = f"52:54:00:5e:{mtu % 256:02x}:{i + 1:02x}"
            proc = env.standin(f"standin-{ns}", ["--stream-socket", sock, "--mtu", mtu,
                                                 "--mac", mac], ns)
            topo.standin_pids.append(proc.pid)
            env.wait_link("eth0", ns)
            # The interface is attached on the guest's first frame (eth0
            # coming up sends IPv6's).
            info = wait_for(lambda: env.procs.check_alive() or next(
                (i for i in env.linnet.listing()["interfaces"] if i["mac_address"] == mac), None),
                f"the interface of {mac} on {network}'s socket")
            configure(ns, "eth0", f"{info['ip_address']}/{prefix}")
            topo.guests.append((ns, info["ip_address"]))
        topo.server = net["gateway"]
        topo.net_pids.append(env.linnet.daemon.pid)
        # The relays the daemon started for these connections (one of an
        # earlier setup's may still be on its way out).
        topo.net_pids += wait_for(lambda: relays_on(env.linnet.daemon.pid, network, self.guests()),
                                  f"one relay per connection to {network}'s socket")
        return topo


class Lan:
    """A LAN in the host namespace for linnet's LAN networks: a veth pair
    whose near end is the bridged network's uplink (`blanup`), or a port of
    a bridge that linnet does not own (`bblan`), and whose far end holds
    the LAN peer's address (10.210.0.1, where the host's iperf3 server
    answers) and, with `dhcp`, the LAN's DHCP server (dnsmasq), from which
    the guests lease as on a real LAN (so anti-spoofing lets them send)."""
    UPLINK, BRIDGE, PEER, PORT = "blanup", "bblan", "blanpeer", "blanport"
    SUBNET = "10.210.0"

    def __init__(self, env, kind, mtu, dhcp=True):
        near = env.host_link(self.UPLINK if kind == "bridged" else self.PORT)
        peer = env.host_link(self.PEER)
        ip("link", "add", near, "mtu", mtu, "type", "veth", "peer", "name", peer, "mtu", mtu)
        if kind == "bridge":
            bridge = env.host_link(self.BRIDGE)
            ip("link", "add", bridge, "mtu", mtu, "type", "bridge")
            ip("link", "set", near, "master", bridge)
            ip("link", "set", bridge, "up")
        ip("link", "set", near, "up")
        configure(None, peer, f"{self.SUBNET}.1/24")
        self.peer = f"{self.SUBNET}.1"
        if dhcp:
            env.procs.start("dnsmasq-lan", [
                "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--port=0",
                f"--interface={peer}", "--bind-interfaces", "--user=root",
                f"--dhcp-range={self.SUBNET}.100,{self.SUBNET}.200,12h",
                f"--dhcp-leasefile={env.fresh_path('lan.leases')}",
                f"--pid-file={env.fresh_path('lan-dnsmasq.pid')}"])


UDHCPC_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "guest",
                             "udhcpc.script")


class LinnetLan(Setup):
    """linnet on a LAN (`Lan`): `mode: bridged`, a macvtap per guest on the
    uplink (no bridge), or `mode: bridge`, TAPs on a bridge linnet does not
    own; `linnet run -- linnet-standin --fd {fd}` as for `linnet tap`. The
    guests lease from the LAN's DHCP server (busybox udhcpc) and linnet
    learns their addresses; the host's side is the LAN peer at the far end
    of the veth."""
    group = "linnet"
    datapath = "tap"
    # The paper's jumbo frames (9000) too, as well as the table's two.
    mtus = (1500, 9000, 65520)

    def __init__(self, name, kind):
        super().__init__(name)
        self.kind = kind

    def unavailable(self, env):
        return None if env.have("dnsmasq") else "dnsmasq is not installed (apt-get install dnsmasq-base)"

    def version(self, env):
        return f"linnet {env.linnet_commit}"

    def up(self, env, mtu):
        topo = Topology()
        lan = Lan(env, self.kind, mtu)
        network = "lan" if self.kind == "bridged" else "lanbr"
        for _ in range(self.guests()):
            ns = env.guest_ns()
            out = env.fresh_path(f"{ns}.json")
            args = [env.linnet.bin, "run", "--network", network, "--json", out, "--",
                    env.standin_bin, "--fd", "{fd}", "--netns", f"/run/netns/{ns}"]
            proc = env.procs.start(f"run-{ns}", args, env=env.linnet.env)
            info = wait_for(lambda: env.procs.check_alive() or read_json(out),
                            f"`linnet run` for {ns} to attach")
            env.wait_link("eth0", ns)
            run("busybox", "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "5", "-T", "1",
                "-s", UDHCPC_SCRIPT, ns=ns)
            learned = wait_for(lambda: env.procs.check_alive() or next(
                (i.get("ip_address") for i in env.linnet.listing()["interfaces"]
                 if i["interface_id"] == info["interface_id"] and i.get("ip_address")), None),
                f"linnet to learn {ns}'s address from the LAN's DHCP server")
            topo.guests.append((ns, learned))
            topo.net_pids.append(proc.pid)
            topo.standin_pids += wait_for(lambda: children(proc.pid),
                                          f"the stand-in under `linnet run` for {ns}")
        topo.server = lan.peer
        topo.net_pids.append(env.linnet.daemon.pid)
        return topo


class LinnetRootless(Setup):
    """A user's own daemon (`linnet daemon --rootless`, env.RootlessDaemon),
    started afresh for the setup: its networks in a user and network
    namespace of the user's, pasta as its way out. `linnet run -- linnet-
    standin --fd {fd}` as that user, as for `linnet tap`; each stand-in
    makes its guest in namespaces of its own (a user cannot enter root's),
    which the benchmark then names. VM to VM stays on the namespace's
    bridge; the host is reached through pasta at its own address
    (10.203.0.1), as pasta's own guest reaches it: the VM's way upstream."""
    group = "linnet"
    datapath = "tap"

    def unavailable(self, env):
        return None if env.have("pasta") else "pasta is not installed (apt-get install passt)"

    def version(self, env):
        return f"linnet {env.linnet_commit}, {debian_version('pasta')}"

    def up(self, env, mtu):
        topo = Topology()
        host, _ = upstream(env)
        daemon = env.start_rootless()
        network = {1500: "shared", 65520: "jumbo"}[mtu]
        for _ in range(self.guests()):
            out, pid_file = env.user_path("json"), env.user_path("pid")
            standin = [env.standin_bin, "--fd", "{fd}", "--netns", f"own:{pid_file}"]
            proc = env.procs.start(f"run-rootless-{len(topo.guests)}", daemon.as_user(
                [daemon.bin, "run", "--network", network, "--json", out, "--"] + standin,
                own_tun=True))  # the stand-in makes its guest's TAP
            info = wait_for(lambda: env.procs.check_alive() or read_json(out),
                            "`linnet run` as the rootless user to attach")
            pid = wait_for(lambda: env.procs.check_alive() or read_pid(pid_file),
                           "the stand-in's own namespaces")
            ns = env.adopt_ns(pid)
            prefix = info["subnet"].split("/")[1]
            configure(ns, "eth0", f"{info['ip_address']}/{prefix}", gateway=info["gateway"])
            topo.guests.append((ns, info["ip_address"]))
            topo.standin_pids.append(pid)
        topo.server = host
        topo.net_pids += [daemon.process.pid] + children(daemon.process.pid)
        return topo


def relays_on(daemon, network, count):
    """The daemon's relays for `network`'s socket, once there are `count`."""
    mine = []
    for pid in children(daemon):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except FileNotFoundError:
            continue
        if b"--attach-on-first-frame" in args and network.encode() in args:
            mine.append(pid)
    return mine if len(mine) == count else None


def run_guest(env, network, flags):
    """`linnet run --datapath tap FLAGS` on `network` with the stand-in as
    VMM in a new guest namespace, its address configured: (namespace, the
    attach JSON, run's pid, the stand-in's pids)."""
    ns = env.guest_ns()
    out = env.fresh_path(f"{ns}.json")
    args = [env.linnet.bin, "run", "--network", network, "--datapath", "tap", "--json", out, *flags]
    proc = env.procs.start(f"run-{ns}", args + ["--", env.standin_bin, "--fd", "{fd}",
                                                 "--netns", f"/run/netns/{ns}"], env=env.linnet.env)
    info = wait_for(lambda: env.procs.check_alive() or read_json(out), f"`linnet run` for {ns}")
    env.wait_link("eth0", ns)
    prefix = info["subnet"].split("/")[1]
    configure(ns, "eth0", f"{info['ip_address']}/{prefix}", gateway=info["gateway"])
    return ns, info, proc.pid, wait_for(lambda: children(proc.pid), f"the stand-in for {ns}")


def server_ns(env, name, link, net):
    """A namespace `name` behind a veth from the benchmark's (its end
    `link`, NET.1/24; the namespace's eth0 NET.2/24, routed by NET.1):
    a server's, whose clients on linnet's networks cross the FORWARD hook."""
    ns = env.guest_ns(name)
    env.host_link(link)
    ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
    configure(None, link, f"{net}.1/24")
    configure(ns, "eth0", f"{net}.2/24", gateway=f"{net}.1")
    return ns


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def upstream(env):
    """A veth to an `upstream` namespace holding the default route: passt and
    pasta need an uplink with one. They give the guest the host's own
    address (10.203.0.1) and gateway (10.203.0.254), which they map to the
    host itself: the guest reaches the host's iperf3 server there."""
    ns = env.guest_ns("upstream")
    uplink = env.host_link("bup0")
    ip("link", "add", uplink, "type", "veth", "peer", "name", "eth0", "netns", ns)
    configure(None, uplink, "10.203.0.1/24")
    configure(ns, "eth0", "10.203.0.254/24")
    ip("route", "add", "default", "via", "10.203.0.254")
    # passt and pasta answer the guest's pings through ICMP ping sockets,
    # which a user may open only if its group is in this range (root's, and
    # the rootless daemon's user's). This is the sandbox's own namespace,
    # gone when the benchmark ends.
    run("sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")
    return "10.203.0.1", "10.203.0.254"


def standin_on_socket(env, topo, sock, mtu, address, gateway, server):
    """One guest whose stand-in connects to a peer's stream socket (QEMU's
    `-netdev stream` framing), configured as the peer expects."""
    ns = env.guest_ns()
    proc = env.standin(f"standin-{ns}", ["--stream-socket", sock, "--mtu", mtu], ns)
    env.wait_link("eth0", ns)
    configure(ns, "eth0", address, gateway=gateway)
    topo.guests.append((ns, address.split("/")[0]))
    topo.server = server
    topo.standin_pids.append(proc.pid)


class Passt(Setup):
    """passt on its stream socket (QEMU's `-netdev stream` framing), the
    stand-in connected to it."""
    group = "peer"
    vm_to_vm = False
    why_no_vm_to_vm = "a passt instance serves one VM; two VMs cannot share its network"

    def unavailable(self, env):
        return None if env.have("passt") else "passt is not installed (apt-get install passt)"

    def version(self, env):
        return debian_version("passt")

    def up(self, env, mtu):
        topo = Topology()
        guest, host = upstream(env)
        sock = env.fresh_path("passt.sock")
        passt = env.procs.start("passt", ["passt", "--foreground", "--quiet", "--runas", "0",
                                          "--mtu", mtu, "--socket", sock])
        wait_for(lambda: env.procs.check_alive() or os.path.exists(sock), "passt's socket")
        topo.net_pids.append(passt.pid)
        standin_on_socket(env, topo, sock, mtu, f"{guest}/24", host, host)
        return topo


class Pasta(Setup):
    """pasta (passt's namespace mode; podman's and fcvm's rootless default):
    its own TAP in the guest namespace, so no stand-in, as for slirp4netns."""
    group = "peer"
    emulated_vm_tap = False
    vm_to_vm = False
    why_no_vm_to_vm = "a pasta instance serves one namespace; two cannot share its network"

    def unavailable(self, env):
        return None if env.have("pasta") else "pasta is not installed (apt-get install passt)"

    def version(self, env):
        return debian_version("pasta")

    def up(self, env, mtu):
        topo = Topology()
        guest, host = upstream(env)
        ns = env.guest_ns()
        pasta = env.procs.start("pasta", ["pasta", "--foreground", "--quiet", "--runas", "0",
                                          "--config-net", "--ns-ifname", "eth0", "--mtu", mtu,
                                          "--netns", f"/run/netns/{ns}"])

        def configured():
            env.procs.check_alive()
            return link_exists("eth0", ns) and guest in ip("addr", "show", "eth0", ns=ns)
        wait_for(configured, "pasta to configure eth0")
        topo.guests.append((ns, guest))
        topo.server = host
        topo.net_pids.append(pasta.pid)
        return topo


class Gvproxy(Setup):
    """gvisor-tap-vsock's gvproxy (lima's user-v2 network, podman machine) on
    its QEMU stream socket, the stand-in connected to it. The guest takes
    gvproxy's 192.168.127.2; 192.168.127.254 is NATed to the host's
    127.0.0.1, where the host's iperf3 server also listens."""
    group = "peer"
    vm_to_vm = False
    why_no_vm_to_vm = "gvproxy's -listen-qemu socket accepts one VM (a second one joins " \
        "through its HTTP API's /connect, as lima's usernet does)"

    def unavailable(self, env):
        return None if env.gvproxy else \
            "gvproxy is not built (scripts/install-deps bench builds it from the Go module proxy)"

    def version(self, env):
        return go_module_version(env.gvproxy)

    def up(self, env, mtu):
        topo = Topology()
        sock = env.fresh_path("gvproxy.sock")
        gvproxy = env.procs.start("gvproxy", [env.gvproxy, "-listen-qemu", f"unix://{sock}",
                                              "-mtu", mtu])
        wait_for(lambda: env.procs.check_alive() or os.path.exists(sock), "gvproxy's socket")
        topo.net_pids.append(gvproxy.pid)
        standin_on_socket(env, topo, sock, mtu, "192.168.127.2/24", "192.168.127.1", "192.168.127.254")
        return topo


class Slirp(Setup):
    """slirp4netns: its own TAP in the guest namespace, so no stand-in (the
    stand-in's share of the work is not there to count)."""
    group = "peer"
    emulated_vm_tap = False
    vm_to_vm = False
    why_no_vm_to_vm = "a slirp4netns instance serves one namespace; two cannot share its network"

    def unavailable(self, env):
        return None if env.have("slirp4netns") else "slirp4netns is not installed (apt-get install slirp4netns)"

    def version(self, env):
        return debian_version("slirp4netns")

    def up(self, env, mtu):
        topo = Topology()
        ns = env.guest_ns()
        slirp = env.procs.start("slirp4netns", ["slirp4netns", "--netns-type=path", "--mtu", mtu,
                                                "--configure", f"/run/netns/{ns}", "tap0"])

        def configured():
            env.procs.check_alive()
            return link_exists("tap0", ns) and "10.0.2.100" in ip("addr", "show", "tap0", ns=ns)
        wait_for(configured, "slirp4netns to configure tap0")
        topo.guests.append((ns, "10.0.2.100"))
        topo.server = "10.0.2.2"
        topo.net_pids.append(slirp.pid)
        return topo


class Vde(Setup):
    """A VDE switch with the host's TAP on it (vde_switch -t) and each guest
    plugged in by vde_plug2tap, which plays the VMM side (no stand-in)."""
    group = "peer"
    mtus = (1500,)
    why_no_jumbo = "vde_switch carries frames of at most 1514 bytes"

    def unavailable(self, env):
        return None if env.have("vde_switch") and env.have("vde_plug2tap") else \
            "vde2 is not installed (apt-get install vde2)"

    def version(self, env):
        return debian_version("vde_switch")

    def up(self, env, mtu):
        topo = Topology()
        sock = env.fresh_path("vde")
        tap = env.host_link("bvde0")
        pidfile = env.fresh_path("vde_switch.pid")
        run("vde_switch", "--sock", sock, "--tap", tap, "--daemon", "--pidfile", pidfile)
        pid = wait_for(lambda: read_pid(pidfile), "vde_switch's pid file")
        env.kill_later(pid)
        env.wait_link(tap)
        configure(None, tap, "10.204.0.1/24", mtu=mtu)
        topo.server = "10.204.0.1"
        topo.net_pids.append(pid)
        for i in range(self.guests()):
            ns = env.guest_ns()
            plug = env.procs.start(f"vde_plug2tap-{ns}", ["vde_plug2tap", "--sock", sock, "eth0"], ns=ns)
            env.wait_link("eth0", ns)
            addr = f"10.204.0.{i + 2}"
            configure(ns, "eth0", f"{addr}/24", mtu=mtu)
            topo.guests.append((ns, addr))
            topo.net_pids.append(plug.pid)
        return topo


def read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def all_setups():
    return [
        Veth("veth"),
        Bridge("bridge + veth"),
        TapRelay("tap relay (no linnet)"),
        Linnet("linnet tap", "tap"),
        Linnet("linnet tap, no anti-spoofing", "tap", anti_spoofing=False),
        Linnet("linnet tap, anti-spoofing + policy", "tap", policy=True),
        LinnetLan(LAN_BRIDGED, "bridged"),
        LinnetLan(LAN_BRIDGE, "bridge"),
        LinnetRootless(ROOTLESS),
        Linnet("linnet dgram", "dgram"),
        Linnet("linnet stream", "stream"),
        NetworkSocket(NETWORK_SOCKET),
        Linnet("linnet dgram + vnet", "dgram", vnet_hdr=(True, True)),
        Linnet("linnet stream + vnet", "stream", vnet_hdr=(True, True)),
        Linnet(VHOST_USER, "vhost-user"),
        Linnet(TWO_STREAMS, "tap", streams=2, mtus=(1500,), why_no_jumbo=QUEUES_WHY),
        Linnet(TWO_QUEUES, "tap", queues=2, streams=2, mtus=(1500,), why_no_jumbo=QUEUES_WHY),
        # One network, a client with the virtio-net header and one without,
        # measured from each; the measured one joins a network that already
        # has the other kind.
        Linnet(MIXED_VNET, "dgram", vnet_hdr=(True, False), mtus=(1500,), why_no_jumbo=MIXED_WHY,
               measured_joins_last=True),
        Linnet(MIXED_BARE, "dgram", vnet_hdr=(False, True), mtus=(1500,), why_no_jumbo=MIXED_WHY,
               measured_joins_last=True),
        Passt("passt (stream)"),
        Pasta("pasta"),
        Gvproxy("gvproxy (stream)"),
        Slirp("slirp4netns"),
        Vde("vde_switch"),
    ]
