"""Networks across hosts (docs/multihost.md): hosts as namespaces on one
underlay bridge (192.0.2.1N), each with its linnet daemon and FRR's zebra
and bgpd running the configuration `linnet frr-config` prints, as
tests/integration/across_hosts.rs builds them. Measured:

- VM→VM across two hosts through linnet's fabric (`linnet run --datapath
  tap`, the stand-in as VMM) against the same guests on a plain kernel
  VXLAN between the same kind of namespaces, with no linnet and no FRR: a
  bridge and a VXLAN device per host, its far end set by hand, each guest
  a TAP on the bridge relayed by the same stand-in (so the two differ by
  linnet and EVPN alone). At an inner MTU of 1500 (underlay 1550) and
  8950 (underlay 9000); the round-trip time of pings beside;
- the time from the start of an attach on one host until a guest on
  another host has its first answer from the VM: the VMM starting, the
  attach, the guest's address, and EVPN carrying its MAC;
- a VM moving hosts with its MAC and address: from its stop on the old
  host until the first answer from the new one. linnet refuses a MAC
  another host still holds, so the attach there waits until that host's
  FRR has heard the VM left (its MAC gone from the VXLAN device's
  forwarding table), as a user moving a VM would.
"""
import os
import select
import statistics
import subprocess
import time

from .host import BenchError, children, ip, run, wait_for
from .setups import VM_TO_VM, Topology, configure, read_json
from .throughput import measure, summarize

# What `--only` matches to run these figures.
SETUP = "linnet across hosts"
UNDERLAY = "192.0.2"
VNI = 7700
SUBNET = "10.77.0"
INNER_MTUS = (1500, 8950)
# The VM that attaches and moves, reserved on every host.
MOVER_MAC = "02:77:00:00:00:05"
# ...under one interface id wherever it runs: what makes it the same VM to
# each host (its detached lease there is its own again).
MOVER_ID = "7a7e0000-0000-4000-8000-000000000005"
MOVER_IP = f"{SUBNET}.5"
# The plain VXLAN's guests.
PLAIN_SUBNET = "10.98.0"


def host_config(i, hosts, mtu, vty_socket):
    vtep = f"{UNDERLAY}.1{i}"
    peers = ", ".join(f"{UNDERLAY}.1{j}" for j in range(1, hosts + 1) if j != i)
    first = 10 * (i + 1)
    return (f"networks:\n  fabric:\n    mode: shared\n    subnet: {SUBNET}.0/24\n    mtu: {mtu}\n"
            f"    dhcp: {{ range: {SUBNET}.{first}-{SUBNET}.{first + 9}, "
            f"static: [{{ ip: {MOVER_IP}, mac: \"{MOVER_MAC}\" }}] }}\n"
            f"    evpn: {{ vni: {VNI}, vtep: {vtep}, asn: 65000, peers: [{peers}] }}\n"
            f"frr:\n  vty_socket: {vty_socket}\n")


class Underlay:
    """A bridge in a namespace of its own, each host's veth on it."""

    def __init__(self, env, mtu):
        self.env, self.mtu = env, mtu
        self.ns = env.guest_ns()
        ip("link", "add", "ub", "type", "bridge", ns=self.ns)
        ip("link", "set", "ub", "up", ns=self.ns)
        self.ports = 0

    def plug(self, host_ns, address):
        """`host_ns`'s `underlay` link on the bridge, with `address`."""
        self.ports += 1
        port = f"u{self.ports}"
        ip("link", "add", port, "mtu", self.mtu, "netns", self.ns, "type", "veth", "peer", "name",
           "underlay", "mtu", self.mtu, "netns", host_ns)
        ip("link", "set", port, "master", "ub", "up", ns=self.ns)
        configure(host_ns, "underlay", f"{address}/24")


class Fabric:
    """`hosts` hosts with linnet and FRR, at inner MTU `mtu`."""

    def __init__(self, env, hosts, mtu):
        self.env, self.mtu = env, mtu
        # FRR's daemons run as the frr user, who must reach their directory.
        os.chmod(env.workdir, 0o711)
        underlay = Underlay(env, mtu + 50)
        self.hosts = []
        for i in range(1, hosts + 1):
            ns = env.guest_ns()
            underlay.plug(ns, f"{UNDERLAY}.1{i}")
            work = env.fresh_path(f"fabric-{ns}")
            frr = os.path.join(work, "frr")
            os.makedirs(frr)
            config = os.path.join(work, "networks.yaml")
            with open(config, "w") as f:
                f.write(host_config(i, hosts, mtu, frr))
            linnet_env = {"LINNET_RUN_DIR": os.path.join(work, "run"),
                          "LINNET_STATE_DIR": os.path.join(work, "state"), "LINNET_CONFIG": config}
            self.start_frr(ns, frr, config, f"{UNDERLAY}.1{i}")
            daemon = env.procs.start(f"linnetd-{ns}", [env.linnet.bin, "daemon"], ns=ns, env=linnet_env)
            sock = os.path.join(linnet_env["LINNET_RUN_DIR"], "linnet.sock")
            wait_for(lambda: env.procs.check_alive() or os.path.exists(sock), f"{ns}'s linnet daemon")
            self.hosts.append({"ns": ns, "env": linnet_env, "daemon": daemon})

    def start_frr(self, ns, frr, config, vtep):
        conf = os.path.join(frr, "frr.conf")
        with open(conf, "w") as f:
            f.write(run(self.env.linnet.bin, "--config", config, "frr-config"))
        run("chown", "-R", "frr:frr", frr)
        zserv = os.path.join(frr, "zserv.api")
        for daemon in ("zebra", "bgpd"):
            args = [f"/usr/lib/frr/{daemon}", "-f", conf, "-i", os.path.join(frr, f"{daemon}.pid"),
                    "-z", zserv, "--vty_socket", frr, "-P", "0", "--log", "stdout"]
            if daemon == "bgpd":
                args += ["-l", vtep]
            self.env.procs.start(f"{daemon}-{ns}", args, ns=ns)
            if daemon == "zebra":
                wait_for(lambda: self.env.procs.check_alive() or os.path.exists(zserv), f"{ns}'s zebra")

    def guest(self, host, mac=None, interface_id=None):
        """A guest attached on host `host` (0-based) by `linnet run`, its
        address set: (namespace, address, the run process)."""
        h = self.hosts[host]
        ns = self.env.guest_ns()
        out = self.env.fresh_path(f"{ns}.json")
        args = [self.env.linnet.bin, "run", "--network", "fabric", "--json", out]
        if mac:
            args += ["--mac", mac]
        if interface_id:
            args += ["--interface-id", interface_id]
        proc = self.env.procs.start(f"run-{ns}", args + ["--", self.env.standin_bin, "--fd", "{fd}",
                                                         "--netns", f"/run/netns/{ns}"], env=h["env"])
        info = wait_for(lambda: self.env.procs.check_alive() or read_json(out), f"the attach of {ns}")
        self.env.wait_link("eth0", ns)
        configure(ns, "eth0", f"{info['ip_address']}/24", mtu=self.mtu)
        return ns, info["ip_address"], proc


def reach(client, target, timeout=30.0):
    """Waits until `client` gets an answer from `target` (BGP and EVPN
    converge meanwhile)."""
    wait_for(lambda: subprocess.run(["ip", "netns", "exec", client, "busybox", "ping", "-c", "1", "-W", "1",
                                     target], stdout=subprocess.DEVNULL).returncode == 0,
             f"{client} to reach {target}", timeout)


def rtt_ms(client, target):
    """The median round trip of 20 pings, 50 ms apart."""
    out = run("busybox", "ping", "-c", "20", "-i", "0.05", "-W", "1", target, ns=client)
    line = next(l for l in out.splitlines() if "min/avg/max" in l)
    return float(line.split("=")[1].split("/")[1])


def plain_vxlan(env, mtu):
    """Two hosts joined by a kernel VXLAN set up by hand, a TAP guest
    relayed by the stand-in on each: the topology's guests."""
    underlay = Underlay(env, mtu + 50)
    topo = Topology()
    for i in (1, 2):
        ns = env.guest_ns()
        underlay.plug(ns, f"{UNDERLAY}.2{i}")
        ip("link", "add", "br0", "mtu", mtu, "type", "bridge", ns=ns)
        ip("link", "add", "vx0", "mtu", mtu, "type", "vxlan", "id", VNI, "local", f"{UNDERLAY}.2{i}",
           "dstport", 4789, "nolearning", ns=ns)
        run("bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "vx0", "dst", f"{UNDERLAY}.2{3 - i}",
            ns=ns)
        ip("link", "set", "vx0", "master", "br0", "up", ns=ns)
        ip("link", "set", "br0", "up", ns=ns)
        guest = env.guest_ns()
        proc = env.procs.start(f"standin-{guest}", [env.standin_bin, "--tap", "btap", "--mtu", mtu,
                                                    "--netns", f"/run/netns/{guest}"], ns=ns)
        env.wait_link("btap", ns)
        env.wait_link("eth0", guest)
        ip("link", "set", "btap", "mtu", mtu, "master", "br0", "up", ns=ns)
        address = f"{PLAIN_SUBNET}.{i + 1}"
        configure(guest, "eth0", f"{address}/24", mtu=mtu)
        topo.guests.append((guest, address))
        topo.standin_pids.append(proc.pid)
    return topo


def linnet_fabric(env, mtu):
    fabric = Fabric(env, 2, mtu)
    topo = Topology()
    for host in (0, 1):
        ns, address, proc = fabric.guest(host)
        topo.guests.append((ns, address))
        topo.standin_pids += wait_for(lambda: children(proc.pid), f"the stand-in for {ns}")
    topo.net_pids = [h["daemon"].pid for h in fabric.hosts]
    return topo


def one_round(env, build, mtu, seconds, rtts):
    try:
        topo = build(env, mtu)
        client, (server, target) = topo.guests[0][0], topo.guests[1]
        reach(client, target)
        env.procs.start(f"iperf3-server-{server}", ["iperf3", "--server"], ns=server)
        rtts.append(rtt_ms(client, target))
        return measure(topo, VM_TO_VM, seconds)
    finally:
        env.teardown()


def throughput(env, seconds, runs, log):
    out = []
    for mtu in INNER_MTUS:
        entry = {"mtu": mtu, "underlay_mtu": mtu + 50}
        measured = {"linnet": ([], [], []), "plain": ([], [], [])}
        for round_ in range(runs):
            for name, build in (("linnet", linnet_fabric), ("plain", plain_vxlan)):
                done, failed, rtts = measured[name]
                try:
                    r = one_round(env, build, mtu, seconds, rtts)
                    r["round"] = round_
                    done.append(r)
                    log(f"  across hosts, {name:<6} MTU {mtu:<5} {r['gbps']:6.2f} Gbit/s  {rtts[-1]:.3f} ms")
                except Exception as e:  # noqa: BLE001 - recorded with the figure
                    failed.append(f"round {round_ + 1}: {e}")
                    log(f"  across hosts, {name} MTU {mtu} failed: {e}")
        for name, (done, failed, rtts) in measured.items():
            entry[name] = summarize(done, failed)
            entry[name]["rtt_ms"] = round(statistics.median(rtts), 3) if rtts else None
        out.append(entry)
    return out


class Pinger:
    """`busybox ping` every 10 ms from `client` to `target`, whose answers
    are read as they come."""

    def __init__(self, client, target):
        self.proc = subprocess.Popen(["ip", "netns", "exec", client, "busybox", "ping", "-i", "0.01", target],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.pending = b""

    def lines(self, wait):
        """The lines printed within `wait` seconds from now (at least one
        if any comes)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], wait)
        if not ready:
            return []
        self.pending += os.read(self.proc.stdout.fileno(), 1 << 16)
        *done, self.pending = self.pending.split(b"\n")
        return [l.decode(errors="replace") for l in done]

    def first_answer_after(self, start, timeout=10.0):
        """Seconds from `start` (time.monotonic) to the first answer read
        after it."""
        while (left := start + timeout - time.monotonic()) > 0:
            for line in self.lines(left):
                if "bytes from" in line and time.monotonic() >= start:
                    return time.monotonic() - start
        raise BenchError(f"no answer within {timeout:.0f} s")

    def drain(self):
        """Skips what was printed so far (answers from before)."""
        while self.lines(0):
            pass

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def stop_run(env, proc):
    """Stops a `linnet run` (its VM going), no longer one of the setup's
    processes that must stay alive."""
    proc.terminate()
    proc.wait(timeout=10)
    env.procs.procs.remove(proc)


def timings(env, count, log):
    """Attach-to-reachable across hosts and MAC-move convergence, `count`
    times each, on three hosts: a watcher on host 1 pings the VM that
    attaches on host 2, then moves between hosts 2 and 3."""
    fabric = Fabric(env, 3, 1500)
    try:
        watcher, _, _ = fabric.guest(0)
        # The watcher asks for an unanswered address again every 100 ms
        # rather than the kernel's 1 s: the figure is the fabric's, not
        # the watcher's ARP timer.
        run("sysctl", "-qw", "net.ipv4.neigh.eth0.retrans_time_ms=100", ns=watcher)
        # A guest on host 2 and 3 each, so the network is up there before
        # the measured attaches (the first attach on a host brings it up).
        for host in (1, 2):
            ns, address, _ = fabric.guest(host)
            reach(watcher, address)
        pinger = Pinger(watcher, MOVER_IP)
        attach_ms, move_ms = [], []
        try:
            for n in range(count):
                # Attach on host 2, from nothing: the VM was gone long
                # enough for every host to forget it.
                run("ip", "neigh", "flush", "all", ns=watcher)
                start = time.monotonic()
                _, _, proc = fabric.guest(1, MOVER_MAC, MOVER_ID)
                attach_ms.append(round(pinger.first_answer_after(start) * 1000, 1))
                # Moves to host 3: stopped here, then attached there once
                # host 3 no longer knows its MAC here.
                start = time.monotonic()
                stop_run(env, proc)
                pinger.drain()
                wait_for(lambda: MOVER_MAC not in run("bridge", "fdb", "show", "dev", "lx-fabric",
                                                      ns=fabric.hosts[2]["ns"]),
                         "host 3 to hear the VM left host 2", every=0.005)
                _, _, proc = fabric.guest(2, MOVER_MAC, MOVER_ID)
                move_ms.append(round(pinger.first_answer_after(start) * 1000, 1))
                stop_run(env, proc)
                log(f"  across hosts: attach to reachable {attach_ms[-1]} ms, move {move_ms[-1]} ms")
                time.sleep(2)
                pinger.drain()
        finally:
            pinger.stop()
    finally:
        env.teardown()
    return {"count": count, "attach_to_reachable_ms": spread(attach_ms), "mac_move_ms": spread(move_ms),
            "move_timed_from": "stop"}


def spread(values):
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 1), "max": ordered[-1], "runs": values}


def measure_all(env, seconds, runs, count, log):
    if not os.path.exists("/usr/lib/frr/bgpd"):
        return {"error": "FRR is not installed (scripts/install-deps bench installs it)"}
    out = {"throughput": throughput(env, seconds, runs, log)}
    try:
        out.update(timings(env, count, log))
    except Exception as e:  # noqa: BLE001 - the throughput figures still count
        out["timings_error"] = f"{type(e).__name__}: {e}"
        log(f"  across hosts: the timings failed: {out['timings_error']}")
    return out


def version():
    return run("dpkg-query", "-W", "-f", "${Version}", "frr", check=False).strip() or None
