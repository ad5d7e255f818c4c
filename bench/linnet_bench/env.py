"""The benchmark's world: the guest namespaces, host links and processes of
the setup under measurement (all removed between setups), and the linnet
daemon shared by the linnet setups and the control-plane figures."""
import os
import shutil
import signal
import time

from .host import BenchError, Processes, ip, link_exists, run, wait_for

# The networks the daemon serves: `shared` (MTU 1500) is built in; `open`
# and `openjumbo` are the same without anti-spoofing, `policed` and
# `policedjumbo` with anti-spoofing and a connect/listen policy that lets
# iperf3 through, to measure what they cost. `shared` and `jumbo` have
# their network socket (NETWORK.sock in the run directory). `clones` has
# 100 clones of one VM measured against 100 interfaces, on a pool no other
# figure uses. `named` is for egress by name (names.py): its DNS asks a
# dnsmasq of the benchmark's on 127.0.0.1:5353; `gated` is the name
# check's (gate.py), its DNS a dnsmasq of that module's on 5354;
# `secrets` the secrets proxy's (secrets.py), on 5355, trusting that
# module's server by `upstream_ca`. `lan` and
# `lanbr` are on a LAN (setups.Lan) whose links exist only while a setup
# or a latency figure uses them. `soak` (with its socket) and `soakhost`
# are the churn soak's (soak.py), with leases short enough that its guests
# renew all along and a churned interface's address is free again soon.
# `shared` has a /22: the latency figure's 200 attaches and every setup's
# guests, round after round, each hold a lease for the lease time (a /24
# ran out in round 3 once vhost-user's row came).
NETWORKS_YAML = """\
networks:
  shared:
    socket: true
    subnet: 10.90.0.0/22
  jumbo:
    mode: shared
    subnet: 192.168.120.0/24
    mtu: 65520
    socket: true
  open:
    mode: shared
    subnet: 192.168.121.0/24
    anti_spoofing: false
  openjumbo:
    mode: shared
    subnet: 192.168.122.0/24
    mtu: 65520
    anti_spoofing: false
  policed:
    mode: shared
    subnet: 192.168.123.0/24
    policy: { egress: ["192.168.123.0/24"], ingress: ["5201/tcp"] }
  policedjumbo:
    mode: shared
    subnet: 192.168.124.0/24
    mtu: 65520
    policy: { egress: ["192.168.124.0/24"], ingress: ["5201/tcp"] }
  scale:
    mode: host
    subnet: 10.80.0.0/20
  clones:
    mode: shared
    subnet: 10.81.0.0/24
  named:
    mode: shared
    subnet: 192.168.125.0/24
    dns: { upstream: ["127.0.0.1:5353"] }
  gated:
    mode: shared
    subnet: 192.168.128.0/24
    dns: { upstream: ["127.0.0.1:5354"] }
  secrets:
    mode: shared
    subnet: 192.168.129.0/24
    dns: { upstream: ["127.0.0.1:5355"] }
    upstream_ca: @WORKDIR@/secrets-upstream-ca.pem
  lan:
    mode: bridged
    uplink: blanup
  lanbr:
    mode: bridge
    bridge: bblan
  soak:
    mode: shared
    subnet: 192.168.126.0/24
    socket: true
    dhcp: { lease_time: 6 }
  soakhost:
    mode: host
    subnet: 10.84.0.0/24
    dhcp: { lease_time: 6 }
"""


class LinnetDaemon:
    """A linnet daemon with its run directory under the benchmark's."""

    def __init__(self, bindir, workdir, procs):
        self.bin = os.path.join(bindir, "linnet")
        config = os.path.join(workdir, "networks.yaml")
        with open(config, "w") as f:
            f.write(NETWORKS_YAML.replace("@WORKDIR@", workdir))
        self.env = {
            "LINNET_RUN_DIR": os.path.join(workdir, "run"),
            "LINNET_STATE_DIR": os.path.join(workdir, "state"),
            "LINNET_CONFIG": config,
        }
        self.socket = os.path.join(self.env["LINNET_RUN_DIR"], "linnet.sock")
        self.run_dir = self.env["LINNET_RUN_DIR"]
        self.procs = procs
        self.start()

    def start(self):
        """Starts the daemon on the run and state directories: after a
        stop, the next daemon adopts what the last one left."""
        # Metrics served all along (operations.py and soak.py scrape them).
        self.daemon = self.procs.start("linnet-daemon", [self.bin, "daemon", "--metrics", "9464"],
                                       env=self.env)
        wait_for(lambda: self.procs.check_alive() or os.path.exists(self.socket),
                 "the linnet daemon's socket")

    def stop(self):
        """SIGTERM, as systemd stops it: with VMs attached it leaves their
        ports and rules for the next daemon. Its socket goes with it."""
        self.procs.stop(self.daemon, timeout=30)

    def network_socket(self, network):
        """The socket_vmnet-compatible socket of `network`."""
        return os.path.join(self.run_dir, f"{network}.sock")

    def listing(self):
        """`linnet ls --json`, through the API."""
        from .control import call, connect
        sock = connect(self.socket)
        try:
            return call(sock, {"op": "list"})[0]
        finally:
            sock.close()

    @staticmethod
    def network_for(mtu, anti_spoofing=True, policy=False):
        if policy:
            return {1500: "policed", 65520: "policedjumbo"}[mtu]
        if anti_spoofing:
            return {1500: "shared", 65520: "jumbo"}[mtu]
        return {1500: "open", 65520: "openjumbo"}[mtu]


# The rootless daemon's user (a bare uid: nothing in /etc) and its networks:
# the built-in `shared`, and `jumbo` as the system daemon's.
ROOTLESS_UID = 4400
ROOTLESS_YAML = """\
networks:
  jumbo:
    mode: shared
    subnet: 192.168.120.0/24
    mtu: 65520
"""
# /dev/net/tun open to all, as distributions ship it, in a mount namespace
# of the command's own (this machine's is 0600 and stays so).
OWN_TUN = ("mount -t tmpfs none /dev/net && mknod -m 0666 /dev/net/tun c 10 200 "
           "&& exec \"$0\" \"$@\"")


class RootlessDaemon:
    """`linnet daemon --rootless` as ROOTLESS_UID, its home under the work
    directory; `cold_start_ms`: until its socket is there, and until the
    first attach (which brings the first network up) has returned."""

    def __init__(self, bindir, workdir, procs):
        self.bin = os.path.join(bindir, "linnet")
        home = os.path.join(workdir, "rootless-home")
        config = os.path.join(home, ".config", "linnet")
        os.makedirs(config, exist_ok=True)
        os.makedirs(os.path.join(home, "run"), exist_ok=True)
        with open(os.path.join(config, "networks.yaml"), "w") as f:
            f.write(ROOTLESS_YAML)
        for d in (home, os.path.join(home, ".config"), config, os.path.join(home, "run")):
            os.chown(d, ROOTLESS_UID, ROOTLESS_UID)
            os.chmod(d, 0o700)
        os.chmod(workdir, 0o755)  # the user goes through it to its home
        self.env = {"HOME": home, "XDG_RUNTIME_DIR": os.path.join(home, "run"),
                    "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                    "PYTHONPATH": os.path.abspath(os.path.join(os.path.dirname(__file__), "..")),
                    "PYTHONDONTWRITEBYTECODE": "1"}
        self.socket = os.path.join(home, "run", "linnet", "linnet.sock")
        if os.path.exists(self.socket):
            raise BenchError(f"{self.socket} is still there from the last rootless daemon")
        started = time.monotonic()
        self.process = procs.start("linnet-rootless", self.as_user(
            [self.bin, "daemon", "--rootless"], own_tun=True))
        wait_for(lambda: procs.check_alive() or os.path.exists(self.socket),
                 "the rootless daemon's socket")
        socket_ms = (time.monotonic() - started) * 1000
        first = self.control("first-attach", self.socket, "shared")
        self.cold_start_ms = {"socket": round(socket_ms, 1),
                              "first_attach": round(socket_ms + first["attach_ms"], 1)}

    def as_user(self, argv, own_tun=False):
        """`argv` as the daemon's user, with a fresh environment of theirs."""
        cmd = ["setpriv", "--reuid", ROOTLESS_UID, "--regid", ROOTLESS_UID, "--clear-groups",
               "env", "-i"] + [f"{k}={v}" for k, v in self.env.items()] + list(argv)
        if own_tun:
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", OWN_TUN] + cmd
        return [str(a) for a in cmd]

    def control(self, *args):
        """linnet_bench.control's figures measured as the daemon's user (it
        serves nobody else): its JSON."""
        import json
        return json.loads(run(*self.as_user(["/usr/bin/python3", "-m", "linnet_bench.control",
                                              *args])))


class Env:
    def __init__(self, workdir, bindir, gvproxy=None, linnet_commit="unknown"):
        self.workdir = workdir
        self.bindir = bindir
        self.gvproxy = gvproxy            # its binary, or None when it is not built
        self.linnet_commit = linnet_commit
        self.standin_bin = os.path.join(bindir, "linnet-standin")
        logdir = os.path.join(workdir, "logs")
        os.makedirs(logdir, exist_ok=True)
        self.lasting = Processes(logdir)   # the daemon and the host's iperf3 server
        self.procs = Processes(logdir)     # the current setup's
        self.namespaces = []
        self.links = []
        self.pids = []
        self.paths = 0
        self.linnet = None
        self.rootless_cold_starts = []  # each rootless daemon's (RootlessDaemon)

    def start_linnet(self):
        self.linnet = LinnetDaemon(self.bindir, self.workdir, self.lasting)

    def start_rootless(self):
        """A rootless daemon for the current setup, gone at its teardown."""
        daemon = RootlessDaemon(self.bindir, self.workdir, self.procs)
        self.rootless_cold_starts.append(daemon.cold_start_ms)
        return daemon

    def user_path(self, name):
        """A fresh path that the rootless daemon's user may write."""
        spool = os.path.join(self.workdir, "spool")
        os.makedirs(spool, exist_ok=True)
        os.chmod(spool, 0o1777)
        return os.path.join(spool, os.path.basename(self.fresh_path(name)))

    def adopt_ns(self, pid):
        """Names the network namespace that process `pid` (a user's) made,
        as a guest namespace (removed at teardown like the others)."""
        name = f"g{len(self.namespaces) + 1}"
        path = f"/run/netns/{name}"
        open(path, "w").close()
        run("mount", "--bind", f"/proc/{pid}/ns/net", path)
        return self._guest_ready(name)

    @staticmethod
    def have(tool):
        return shutil.which(tool) is not None

    def guest_ns(self, name=None):
        name = name or f"g{len(self.namespaces) + 1}"
        ip("netns", "add", name)
        return self._guest_ready(name)

    def _guest_ready(self, name):
        """Registers guest namespace `name` for teardown, with loopback up
        and a resolv.conf of its own for `ip netns exec` to put in place:
        what a DHCP client's hook writes in the guest stays the guest's."""
        os.makedirs(f"/etc/netns/{name}", exist_ok=True)
        with open(f"/etc/netns/{name}/resolv.conf", "w"):
            pass
        self.namespaces.append(name)
        ip("link", "set", "lo", "up", ns=name)
        return name

    def host_link(self, name):
        """Registers a host link the setup is about to create."""
        self.links.append(name)
        return name

    def fresh_path(self, name):
        """A path in the work directory no earlier setup has used."""
        self.paths += 1
        return os.path.join(self.workdir, f"{self.paths}-{name}")

    def kill_later(self, pid):
        self.pids.append(pid)

    def standin(self, name, args, ns):
        return self.procs.start(name, [self.standin_bin] + [str(a) for a in args]
                                + ["--netns", f"/run/netns/{ns}"])

    def wait_link(self, dev, ns=None):
        """Waits for a link the setup's processes create."""
        wait_for(lambda: self.procs.check_alive() or link_exists(dev, ns),
                 f"{dev} in {ns or 'the host namespace'}")

    def teardown(self):
        """Removes everything the current setup made, even after a failure."""
        self.procs.stop_all()
        for pid in self.pids:
            stop_daemonized(pid)
        self.pids.clear()
        for ns in self.namespaces:
            run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        self.namespaces.clear()
        for link in self.links:
            if link_exists(link):
                run("ip", "link", "del", link, check=False)
        self.links.clear()

    def close(self):
        self.teardown()
        self.lasting.stop_all()

    def leftovers(self):
        """Links on the host other than loopback, and namespaces: there
        should be none at the end."""
        out = ip("-o", "link", "show")
        links = [l.split(":")[1].strip().split("@")[0] for l in out.splitlines()
                 if l.split(":")[1].strip() != "lo"]
        namespaces = [f"netns {l.split()[0]}" for l in ip("netns", "list").splitlines() if l.strip()]
        return links + namespaces


def stop_daemonized(pid):
    """Stops a process that is not our child (it daemonized): SIGTERM, then
    SIGKILL if it is still there after 2 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            if not os.path.exists(f"/proc/{pid}"):
                return
            time.sleep(0.02)
