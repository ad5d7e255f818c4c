"""Egress by name (docs/security.md, `--allow-connect NAME`): a guest whose
policy names 1000 names (`n0000.bench.test`..., each its own address, and
`iperf.bench.test`, the gateway) against a guest on the same network with
no policy, both `linnet run --datapath tap` with the stand-in as VMM, on
the network `named`, whose DNS asks a dnsmasq of the benchmark's.
Measured:

- throughput VM→host (iperf3 to the gateway by the address its name gave)
  with the 1000-name policy and its 1000 learned addresses, against no
  policy, round by round;
- the time a guest waits for an answer from linnet's DNS, for each of the
  1000 names, with the policy (the forwarder checks the name, learns the
  addresses and puts them into the VM's set before it releases the
  answer) and without it (forwarded as is): the difference at the median
  is what the policy costs a lookup;
- that the rule precedes the answer: for each of 100 names on addresses
  of their own with a listener, the guest connects the moment its answer
  arrives, once, with no retry.
"""
import os
import socket
import statistics
import subprocess
import threading

from .host import BenchError, ip, run, wait_for
from .setups import VM_TO_HOST, Topology, run_guest
from .throughput import measure, summarize

SETUP = "linnet egress by name"
NETWORK = "named"
NAMES = 1000
RACES = 100
DNS_PORT = 5353
RACE_PORT = 5202
RACE_NET = "198.18.1"

# In the guest: asks every name of argv (one query each, UDP, A) of the
# gateway, prints the milliseconds each answer took and its first address;
# with --connect PORT, connects to that address at once and says whether
# the first attempt went through.
ASK = r"""
import socket, struct, sys, time
gateway, names = sys.argv[1], sys.argv[2].split(",")
port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
for i, name in enumerate(names):
    labels = b"".join(bytes([len(l)]) + l.encode() for l in name.split("."))
    q = struct.pack("!HHHHHH", i, 0x100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", 1, 1)
    t = time.perf_counter()
    s.sendto(q, (gateway, 53))
    a = s.recv(4096)
    ms = (time.perf_counter() - t) * 1000
    ip = socket.inet_ntoa(a[-4:]) if struct.unpack("!H", a[6:8])[0] else "-"
    ok = "-"
    if port and ip != "-":
        c = socket.socket()
        c.settimeout(2)
        try:
            c.connect((ip, port)); ok = "ok"
        except OSError as e:
            ok = "failed:" + type(e).__name__
        c.close()
    print(f"{ms:.4f} {ip} {ok}", flush=True)
"""


def name_of(i):
    return f"n{i:04d}.bench.test"


def race_name(i):
    return f"r{i:03d}.bench.test"


def address_of(i):
    return f"198.18.{100 + i // 250}.{1 + i % 250}"


class Named:
    """The dnsmasq, the listener on the race addresses, and the guests."""

    def __init__(self, env):
        self.env = env
        self.topo = Topology()
        self.gateway = None

    def start_dns(self, gateway):
        hosts = self.env.fresh_path("bench-names.hosts")
        with open(hosts, "w") as f:
            for i in range(NAMES):
                f.write(f"{address_of(i)} {name_of(i)}\n")
            for i in range(RACES):
                f.write(f"{RACE_NET}.{i + 1} {race_name(i)}\n")
            f.write(f"{gateway} iperf.bench.test\n")
        self.env.procs.start("bench-dnsmasq", [
            "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces",
            "--user=root", "--listen-address=127.0.0.1", f"--port={DNS_PORT}", "--local-ttl=3600",
            f"--addn-hosts={hosts}", "--cache-size=10000", "--pid-file="])
        # The race names' addresses, on the benchmark's own loopback (its
        # namespace is the sandbox's), with one listener for them all.
        for i in range(RACES):
            ip("addr", "add", f"{RACE_NET}.{i + 1}/32", "dev", "lo")
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", RACE_PORT))
        listener.listen(128)

        def accept():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                conn.close()
        threading.Thread(target=accept, daemon=True).start()
        self.listener = listener

    def attach(self, policy):
        """A guest on `named`, its address configured: (namespace, ip)."""
        flags = [f for rule in policy for f in ("--allow-connect", rule)]
        ns, info, run_pid, standins = run_guest(self.env, NETWORK, flags)
        self.topo.net_pids.append(run_pid)
        self.topo.standin_pids += standins
        self.gateway = info["gateway"]
        return ns, info["ip_address"]

    def ask(self, ns, names, connect=None):
        """[(ms, address, connected)] for each of `names`, asked in turn."""
        args = ["ip", "netns", "exec", ns, "python3", "-c", ASK, self.gateway, ",".join(names)]
        if connect:
            args.append(str(connect))
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        if r.returncode != 0:
            raise BenchError(f"the lookups in {ns} failed: {r.stderr.strip()[-300:]}")
        rows = [line.split() for line in r.stdout.splitlines()]
        return [(float(ms), addr, ok) for ms, addr, ok in rows]

    def close(self):
        if getattr(self, "listener", None):
            self.listener.close()
        for i in range(RACES):
            run("ip", "addr", "del", f"{RACE_NET}.{i + 1}/32", "dev", "lo", check=False)


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))]


def measure_all(env, seconds, runs, log):
    named = Named(env)
    try:
        # The gateway's address is the network's; the open guest tells it.
        open_ns, _ = named.attach([])
        named.start_dns(named.gateway)
        wait_for(lambda: named.ask(open_ns, ["iperf.bench.test"])[0][1] == named.gateway,
                 "the benchmark's dnsmasq")
        policy = [f"{name_of(i)}:443/tcp" for i in range(NAMES)]
        policy += [f"{race_name(i)}:{RACE_PORT}/tcp" for i in range(RACES)]
        policy.append("iperf.bench.test:5201/tcp")
        named_ns, _ = named.attach(policy)
        names = [name_of(i) for i in range(NAMES)]
        log(f"  {NAMES} lookups without a policy, then with {len(policy)} names")
        plain = named.ask(open_ns, names)
        gated = named.ask(named_ns, names)
        if any(addr == "-" for _, addr, _ in gated):
            raise BenchError("a lookup of an allowed name had no address")
        races = named.ask(named_ns, [race_name(i) for i in range(RACES)], connect=RACE_PORT)
        first_try = sum(1 for _, _, ok in races if ok == "ok")
        if named.ask(named_ns, ["iperf.bench.test"])[0][1] != named.gateway:
            raise BenchError("iperf.bench.test did not resolve to the gateway")
        rows = {"with": [], "without": []}
        failures = {"with": [], "without": []}
        for r in range(runs):
            for key, ns in (("without", open_ns), ("with", named_ns)):
                named.topo.guests = [(ns, None)]
                named.topo.server = named.gateway
                try:
                    rows[key].append({**measure(named.topo, VM_TO_HOST, seconds), "round": r})
                except BenchError as e:
                    failures[key].append(str(e))
        with_, without = summarize(rows["with"], failures["with"]), summarize(rows["without"], failures["without"])
        p50 = lambda rows: statistics.median(ms for ms, _, _ in rows)
        return {
            "names": len(policy),
            "learned_addresses": NAMES + RACES + 1,
            "throughput_with": with_,
            "throughput_without": without,
            "throughput_ratio": (with_["gbps"] / without["gbps"]
                                 if with_.get("gbps") and without.get("gbps") else None),
            "dns_ms_p50_without": p50(plain),
            "dns_ms_p50_with": p50(gated),
            "dns_ms_p99_without": percentile([ms for ms, _, _ in plain], 99),
            "dns_ms_p99_with": percentile([ms for ms, _, _ in gated], 99),
            "dns_extra_ms_p50": p50(gated) - p50(plain),
            "races": RACES,
            "first_connection_ok": first_try,
        }
    finally:
        named.close()
