"""The name check (docs/security.md, `linnet-gate`): a VM whose policy names
`tls.bench.test:443` has each new TCP connection to an address it learned
for that name held, its packets queued (NFQUEUE) to the daemon, which
relays them to `linnet-gate`; the connection passes once its first bytes
show the name (TLS server name, HTTP Host), and never leaves the kernel
again. Guests on the network `gated` (`linnet run --datapath tap`, the
stand-in as VMM, MTU 1500), whose DNS asks a dnsmasq of this module's
(on 127.0.0.1:5354: `tls.bench.test` is the server's address); the server
in a namespace of its own behind a veth from the benchmark's namespace,
so the guests reach it through the FORWARD hook, where connections are
held (a name on the gateway's own address is not). It runs
gate_peer.py: HTTP on 8000-8007 in two epoll processes, TLS on 443
(Python's thread per connection in tests/name_peer.py could not open
thousands of connections a second). Four guests: no policy, a policy
by address (`10.205.0.2:443/tcp` and `:8000-8007/tcp`), the name
check (`tls.bench.test:443` and `:8000-8007`, resolved through linnet's
DNS first), and the design the name check was chosen over: a guest
without a policy whose connections to the server are redirected
(nftables `redirect`, a table of this module's) to a splicing proxy,
tools/spliceproxy (`linnet-spliceproxy`), which reads the name with the
gate's own reader, connects on and splices both ways. Measured:

- one TCP stream: a TLS download (curl, sized for about half of
  `--seconds` by a first download) from each guest, TLS_PER_ROUND times
  a round in turns (their median is the round's figure): the name check
  against the address policy and against no policy, and the proxy's
  beside them, with the CPU each spent per gigabyte. One guest's
  downloads spread from 4.6 to 8.7 Gbit/s one after another, with the
  machine 40% idle (a pipeline of the server, the kernel, the stand-in
  and curl, bound by their wake-ups across two cores, not by CPU), far
  more than the few percent judged: so the judgement takes the median
  of every download of each guest (report.judge_pooled). Measured so
  (24 alternating pairs), the name check was 1.02x the address policy
  with the same CPU a gigabyte, netfilter under 2% of the samples in
  either's profile; a round's median of three had said 0.90x;
- the time the check adds: LATENCY_CONNECTIONS connections one after
  another per round from the address guest and the name guest, in turns
  of LATENCY_TURN, each timed to connect and from its request head (with
  the Host) to the answer's first byte. The name guest's extra time to the first byte is
  the time from its first data byte to the verdict: the packet queued by
  the kernel, read by the daemon and relayed to the gate, the head read,
  the verdict back through the daemon to the kernel, which lets the
  packet and the connection go (the handshake's last ACK, which shows no
  data, takes the same way just before it, and is passed at once, as
  its SYN before it); the proxy's, the same measured through it (its
  connect is answered by the proxy, its first byte waits for the
  proxy's own connection to the server);
- new connections a second, RATE_SECONDS per round: RATE_PROCESSES
  client processes in the guest, each keeping RATE_CONCURRENCY
  connections going (request, whole answer, a reset, next) over the
  server's eight ports, against the address guest (and the proxy's)
  doing the same: a
  ceiling of the client, the server or the datapath shows in both. The
  ports and the resets keep a guest's 4-tuples from coming back within
  seconds: through the NAT a new connection could meet the server's
  TIME_WAIT of an earlier one (its SYN answered by an ACK, then sent
  again a second later);
- HOLD_GUESTS guests (the gate holds at most 1024 connections of one VM)
  each opening HOLD_PER_GUEST connections that send one byte ("G") and
  nothing more, so the gate holds them until its 5 s timeout: linnet-
  gate's RSS while it holds them and its peak, and how many it held
  (reset 4.5 s or more after their byte, by the timeout) against those
  refused sooner.
"""
import os
import re
import select
import statistics
import subprocess
import time
import urllib.request

from .host import BenchError, children, cpu_seconds, machine_busy_seconds, memory_kib, run, wait_for
from .gate_peer import PORTS
from .names import ASK, percentile
from .setups import run_guest, server_ns
from .throughput import summarize

SETUP = "linnet name check"
NETWORK = "gated"
DNS_PORT = 5354
NAME = "tls.bench.test"
SERVER_NET = "10.205.0"
SERVER = f"{SERVER_NET}.2"
SERVER_LINK = "bgate0"
HTTP_PORT = 8000
TLS_PORT = 443
# Downloads of each guest a round (its median is the round's figure).
TLS_PER_ROUND = 15
LATENCY_CONNECTIONS = 500
LATENCY_TURN = 50
RATE_SECONDS = 5
RATE_PROCESSES = 2
RATE_CONCURRENCY = 32
HOLD_GUESTS = 10
HOLD_PER_GUEST = 1000
# The first download, whose speed sizes the others.
PROBE_BYTES = 64 << 20
# Not measured: OpenSandbox's figure for its MITM egress proxy, per request.
OPENSANDBOX_MS = 290
METRICS = "http://127.0.0.1:9464/metrics"
HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "gate_peer.py")
PEM = os.path.join(HERE, "..", "..", "tests", "fixtures", "name_peer.pem")
NAME_PEER = os.path.join(HERE, "..", "..", "tests", "name_peer.py")
# The server's HTTP ports: the connection-rate client spreads its
# connections over them (gate_peer.py says why).
HTTP_PORTS = f"{HTTP_PORT}-{HTTP_PORT + PORTS - 1}"
GUESTS = {
    "open": [],
    "address": [f"{SERVER}:{TLS_PORT}/tcp", f"{SERVER}:{HTTP_PORTS}/tcp"],
    "name": [f"{NAME}:{TLS_PORT}", f"{NAME}:{HTTP_PORTS}"],
    "proxy": [],
}
# The guests measured one connection at a time and for connections a second.
TIMED = ("address", "name", "proxy")
# Where the splicing proxy listens in the benchmark's namespace, and the
# table that redirects the proxy guest's connections to it.
PROXY_PORT = 15443
PROXY_TABLE = "bench_splice"


def gate_pid(daemon):
    """The daemon's `linnet-gate`, or None."""
    for pid in children(daemon):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "linnet-gate":
                    return pid
        except FileNotFoundError:
            continue
    return None


def judged(keys):
    """{key: {"allowed": n, "refused": n}} from the daemon's metrics
    (linnet_vm_gate_connections_total), for the guests gate-KEY."""
    with urllib.request.urlopen(METRICS, timeout=10) as r:
        text = r.read().decode()
    out = {k: {"allowed": 0, "refused": 0} for k in keys}
    for line in text.splitlines():
        if not line.startswith("linnet_vm_gate_connections_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        key = labels.get("name", "").removeprefix("gate-")
        if key in out and labels.get("verdict") in out[key]:
            out[key][labels["verdict"]] = int(float(line.rsplit(" ", 1)[1]))
    return out


def delta(after, before):
    return {n: {k: after[n][k] - before[n][k] for k in after[n]} for n in after}


class Gated:
    """The server's namespace, the dnsmasq and the guests on `gated`."""

    def __init__(self, env):
        self.env = env
        self.gateway = None
        self.guests = {}  # key: (namespace, run's pid, the stand-ins' pids)
        self.proxy = None

    def start_server(self):
        ns = server_ns(self.env, "gatesrv", SERVER_LINK, SERVER_NET)
        self.env.procs.start("gate-peer", ["python3", PEER, "serve", PEM], ns=ns)

        def serving():
            self.env.procs.check_alive()
            return "LISTEN" in run("ss", "-Htln", f"sport = :{HTTP_PORT}", ns=ns) and \
                "LISTEN" in run("ss", "-Htln", f"sport = :{TLS_PORT}", ns=ns)
        wait_for(serving, "the name check's server")

    def start_dns(self):
        self.env.procs.start("gate-dnsmasq", [
            "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces",
            "--user=root", "--listen-address=127.0.0.1", f"--port={DNS_PORT}", "--local-ttl=3600",
            f"--host-record={NAME},{SERVER}", "--pid-file="])

    def start_proxy(self, guest_ip):
        """The splicing proxy, and the redirect of the proxy guest's
        connections to the server's ports to it (before linnet's own NAT)."""
        ports = f"{TLS_PORT}, {HTTP_PORTS}"
        run("nft", f"add table ip {PROXY_TABLE}")
        run("nft", f"add chain ip {PROXY_TABLE} to_proxy {{ type nat hook prerouting priority dstnat - 10 ; }}")
        run("nft", f"add rule ip {PROXY_TABLE} to_proxy ip saddr {guest_ip} ip daddr {SERVER} "
                   f"tcp dport {{ {ports} }} redirect to :{PROXY_PORT}")
        binary = os.path.join(self.env.bindir, "linnet-spliceproxy")
        self.proxy = self.env.procs.start("spliceproxy", [binary, str(PROXY_PORT), f"{NAME}={SERVER}"])

        def listening():
            self.env.procs.check_alive()
            return "LISTEN" in run("ss", "-Htln", f"sport = :{PROXY_PORT}")
        wait_for(listening, "the splicing proxy")

    def stop_proxy(self):
        run("nft", "delete", "table", "ip", PROXY_TABLE, check=False)

    def attach(self, key, rules):
        """A guest on `gated` called gate-KEY with the connect rules
        `rules`, its address configured, that has looked the name up
        through linnet's DNS: its namespace."""
        flags = ["--name", f"gate-{key}"] + [f for rule in rules for f in ("--allow-connect", rule)]
        ns, info, run_pid, standins = run_guest(self.env, NETWORK, flags)
        self.gateway = info["gateway"]
        if key == "proxy":
            self.start_proxy(info["ip_address"])
        self.guests[key] = (ns, run_pid, standins)
        # More source ports than the kernel's 28,232: the rate runs open
        # tens of thousands of connections to the same eight ports.
        run("sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535", ns=ns)
        # The answer is what the name check learns the address from.
        wait_for(lambda: self.lookup(ns) == SERVER, f"{NAME} through linnet's DNS in {ns}")
        return ns

    def lookup(self, ns):
        out = run("python3", "-c", ASK, self.gateway, NAME, ns=ns, check=False).split()
        return out[1] if len(out) >= 2 else None

    def peer(self, ns, *args, timeout=120):
        r = subprocess.run(["ip", "netns", "exec", ns, "python3", PEER, *map(str, args)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
        if r.returncode != 0:
            raise BenchError(f"gate_peer.py {args[0]} in {ns} failed: {r.stderr.strip()[-300:]}")
        return r.stdout

    def fetch(self, ns, host):
        """tests/name_peer.py's plain fetch showing `host`: the answer, or
        "refused" (a reset)."""
        r = subprocess.run(["ip", "netns", "exec", ns, "python3", NAME_PEER, "fetch", SERVER,
                            str(HTTP_PORT), "--plain", "--host", host],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        return r.stdout.strip() or r.stderr.strip()[-200:]

    def pids(self, name):
        """(the processes on this guest's path: linnet's daemon, gate and
        run, and the proxy's for its guest; its stand-ins)."""
        daemon = self.env.linnet.daemon.pid
        _, run_pid, standins = self.guests[name]
        proxy = self.proxy.pid if name == "proxy" else None
        return [p for p in (daemon, gate_pid(daemon), run_pid, proxy) if p], standins


def download(gated, name, size, round_):
    """One TLS download of `size` bytes by curl in guest `name`: a run as
    throughput.measure gives it (no retransmits: curl has none to say)."""
    ns = gated.guests[name][0]
    net, standins = gated.pids(name)
    cpu = lambda pids: sum(cpu_seconds(p) for p in pids)
    net0, standin0, all0 = cpu(net), cpu(standins), machine_busy_seconds()
    try:
        out = run("curl", "-k", "-s", "-S", "-o", "/dev/null", "--max-time", "120", "-w",
                  "%{speed_download} %{size_download}", "--resolve", f"{NAME}:{TLS_PORT}:{SERVER}",
                  f"https://{NAME}/bytes/{size}", ns=ns)
    except BenchError as e:
        raise BenchError(f"the TLS download in {name} failed: {e}")
    net1, standin1, all1 = cpu(net), cpu(standins), machine_busy_seconds()
    speed, got = (float(x) for x in out.split())
    if got != size:
        raise BenchError(f"the TLS download in {name} got {got:.0f} of {size} bytes")
    gigabytes = got / 1e9
    return {"gbps": speed * 8 / 1e9, "bytes": int(got), "retransmits": None, "round": round_,
            "net_cpu_s_per_gb": (net1 - net0) / gigabytes,
            "standin_cpu_s_per_gb": (standin1 - standin0) / gigabytes,
            "all_cpu_s_per_gb": (all1 - all0) / gigabytes}


def timings(samples):
    """p50 and p99 of each timing, in ms, from [(connect µs, first byte µs)]."""
    parts = {"connect": [c for c, _ in samples], "first_byte": [f for _, f in samples],
             "setup": [c + f for c, f in samples]}
    return {f"{k}_ms_{p}": round(percentile(v, 50 if p == "p50" else 99) / 1000, 3)
            for k, v in parts.items() for p in ("p50", "p99")}


def connection_rate(gated, name, round_):
    """Connections a second completed from guest `name`, with the CPU
    linnet's processes and the machine spent on each thousand."""
    ns = gated.guests[name][0]
    daemon = gated.env.linnet.daemon.pid
    gate = gate_pid(daemon)
    _, run_pid, standins = gated.guests[name]
    groups = {"daemon": [daemon], "gate": [gate] if gate else [], "run": [run_pid], "standin": standins,
              "proxy": [gated.proxy.pid]}
    before = {k: sum(cpu_seconds(p) for p in v) for k, v in groups.items()}
    all0 = machine_busy_seconds()
    out = gated.peer(ns, "rate", SERVER, HTTP_PORT, NAME, RATE_SECONDS, RATE_CONCURRENCY,
                     RATE_PROCESSES, timeout=RATE_SECONDS + 60)
    all1 = machine_busy_seconds()
    done, failed, stalled, seconds = out.split()
    done, failed, stalled, seconds = int(done), int(failed), int(stalled), float(seconds)
    if not done:
        raise BenchError(f"no connection from {name} completed in {seconds:g} s ({failed} failed, "
                         f"{stalled} given up)")
    # CPU from the clients' start (their warm-up included), per thousand
    # connections completed in the measured window: an overstatement,
    # alike for both guests.
    per_k = lambda s: round(s / done * 1000, 3)
    cpu = {k: per_k(sum(cpu_seconds(p) for p in v) - before[k]) for k, v in groups.items()}
    cpu["machine"] = per_k(all1 - all0)
    return {"round": round_, "per_s": round(done / seconds), "completed": done, "failed": failed,
            "stalled": stalled, "cpu_s_per_1000": cpu}


def hold(gated, names, rss_start):
    """HOLD_PER_GUEST connections from each guest of `names` that send one
    byte and nothing more: how many the gate held, and its memory (at the
    section's start, `rss_start` KiB; before, while and after)."""
    daemon = gated.env.linnet.daemon.pid
    gate = gate_pid(daemon)
    if not gate:
        raise BenchError("no linnet-gate under the daemon")
    rss_before = memory_kib(gate)
    clients = []
    try:
        for name in names:
            ns = gated.guests[name][0]
            clients.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "python3", PEER, "hold", SERVER, str(HTTP_PORT),
                 str(HOLD_PER_GUEST)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        started = time.monotonic()
        for c in clients:
            line = readline(c, 60)
            if line != "connected":
                raise BenchError(f"a holding client did not connect its {HOLD_PER_GUEST}: "
                                 f"{line or c.stderr.read()[-300:]}")
        connect_s = time.monotonic() - started
        before = judged(names)
        sent = time.monotonic()
        for c in clients:
            c.stdin.write("go\n")
            c.stdin.flush()
        for c in clients:
            if readline(c, 30) != "sent":
                raise BenchError(f"a holding client did not send: {c.stderr.read()[-300:]}")
        send_s = time.monotonic() - sent
        # Halfway to the gate's timeout, all of them held.
        time.sleep(max(0.0, sent + 2.5 - time.monotonic()))
        rss_held = memory_kib(gate)
        rows = []
        for c in clients:
            out, err = c.communicate(timeout=60)
            if c.returncode != 0 or not out.strip():
                raise BenchError(f"a holding client failed: {err.strip()[-300:]}")
            rows.append(out.split())
        peak = memory_kib(gate, "VmHWM")
        counted = delta(judged(names), before)
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.wait()
    if gate_pid(daemon) != gate:
        raise BenchError("linnet-gate was restarted while it held the connections")
    held = sum(int(r[0]) for r in rows)
    return {
        "guests": len(names), "per_guest": HOLD_PER_GUEST, "connections": len(names) * HOLD_PER_GUEST,
        "held": held, "refused_sooner": sum(int(r[1]) for r in rows),
        "never_reset": sum(int(r[2]) for r in rows), "answered": sum(int(r[3]) for r in rows),
        "reset_after_s": [round(min(float(r[4]) for r in rows if int(r[0])), 2) if held else None,
                          round(max(float(r[5]) for r in rows), 2) if held else None],
        "refused_by_gate": sum(c["refused"] for c in counted.values()),
        "connect_s": round(connect_s, 2), "send_s": round(send_s, 2),
        "gate_rss_mib_start": round(rss_start / 1024, 2),
        "gate_rss_mib_before": round(rss_before / 1024, 2),
        "gate_rss_mib_held": round(rss_held / 1024, 2),
        "gate_peak_rss_mib": round(peak / 1024, 2),
    }


def readline(proc, timeout):
    """The next line of `proc`'s stdout, stripped, or "" after `timeout` s."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else ""


def measure_all(env, seconds, runs, log):
    gated = Gated(env)
    gate = gate_pid(env.linnet.daemon.pid)
    if not gate:
        raise BenchError("no linnet-gate under the daemon (is it built beside linnet?)")
    rss_start = memory_kib(gate)
    try:
        gated.start_server()
        gated.start_dns()
        ns = {key: gated.attach(key, rules) for key, rules in GUESTS.items()}
        # The gate is in the path: the name guest's connection showing
        # another name is refused, the same from the address guest is not.
        # So is the proxy in the proxy guest's.
        for name, host, want in (("name", NAME, "ok"), ("name", "other.test", "refused"),
                                 ("address", "other.test", "ok"), ("proxy", NAME, "ok"),
                                 ("proxy", "other.test", "refused")):
            got = gated.fetch(ns[name], host)
            if got != want:
                raise BenchError(f"the {name} guest showing {host}: {got!r}, not {want!r}")
        # The size of a download that takes about half of `seconds`:
        # many downloads judge better than a few long ones (above).
        probe = download(gated, "open", PROBE_BYTES, None)
        size = max(16 << 20, int(probe["gbps"] * 1e9 / 8 * seconds / 2))
        log(f"  TLS downloads of {size >> 20} MiB ({probe['gbps']:.2f} Gbit/s at first)")
        rows = {k: [] for k in GUESTS}
        every = {k: [] for k in GUESTS}
        failures = {k: [] for k in GUESTS}
        samples = {k: [] for k in TIMED}
        rates = {k: [] for k in TIMED}
        rate_failures = {k: [] for k in TIMED}
        names = ["name"]
        for r in range(runs):
            # TLS_PER_ROUND downloads of each guest in a round, in turns
            # that each start with another guest (a slow spell hits each
            # in turn); the round's figure is each guest's median: one
            # download of a few seconds swings by a quarter on two cores.
            keys = list(GUESTS)
            got = {k: [] for k in GUESTS}
            for turn in range(TLS_PER_ROUND):
                at = (r + turn) % len(keys)
                for key in keys[at:] + keys[:at]:
                    try:
                        got[key].append(download(gated, key, size, r))
                    except BenchError as e:
                        failures[key].append(str(e))
            for key, downloads in got.items():
                every[key] += [d["gbps"] for d in downloads]
                if downloads:
                    rows[key].append(sorted(downloads, key=lambda d: d["gbps"])[len(downloads) // 2])
        latency_judged = {"allowed": 0, "refused": 0}
        for r in range(runs):
            before = judged(names)
            ports = []
            # In turns of LATENCY_TURN, each guest first in turn: a slow
            # spell of the machine hits all alike.
            for turn in range(LATENCY_CONNECTIONS // LATENCY_TURN):
                for key in TIMED[turn % len(TIMED):] + TIMED[:turn % len(TIMED)]:
                    out = gated.peer(ns[key], "latency", SERVER, HTTP_PORT, NAME, LATENCY_TURN)
                    lines = [line.split() for line in out.splitlines()]
                    samples[key] += [(float(c), float(f)) for c, f, _ in lines]
                    ports += [int(p) for _, _, p in lines] if key == "name" else []
            d = delta(judged(names), before)["name"]
            log(f"  round {r + 1}: the gate judged {d} of the name guest's {len(ports)}; its source "
                f"ports {min(ports)}-{max(ports)}, {len(ports) - len(set(ports))} twice")
            latency_judged = {k: latency_judged[k] + d[k] for k in d}
        lat = {k: timings(v) for k, v in samples.items()}
        log(f"  to the first byte, p50 / p99: address policy {lat['address']['first_byte_ms_p50']} / "
            f"{lat['address']['first_byte_ms_p99']} ms, name check {lat['name']['first_byte_ms_p50']} / "
            f"{lat['name']['first_byte_ms_p99']} ms, splicing proxy {lat['proxy']['first_byte_ms_p50']} / "
            f"{lat['proxy']['first_byte_ms_p99']} ms")
        before = judged(names)
        for r in range(runs):
            for key in TIMED:
                try:
                    rates[key].append(connection_rate(gated, key, r))
                except BenchError as e:
                    rate_failures[key].append(str(e))
        rate_judged = delta(judged(names), before)["name"]
        log(f"  connections a second: address policy {[x['per_s'] for x in rates['address']]}, "
            f"name check {[x['per_s'] for x in rates['name']]}, "
            f"splicing proxy {[x['per_s'] for x in rates['proxy']]}")
        holders = []
        for i in range(HOLD_GUESTS):
            gated.attach(f"hold{i}", [f"{NAME}:{HTTP_PORT}"])
            holders.append(f"hold{i}")
        log(f"  {HOLD_GUESTS} guests holding {HOLD_PER_GUEST} connections each")
        held = hold(gated, holders, rss_start)
        log(f"  held {held['held']} of {held['connections']}; linnet-gate RSS "
            f"{held['gate_rss_mib_held']} MiB, peak {held['gate_peak_rss_mib']} MiB")
        a, n, p = lat["address"], lat["name"], lat["proxy"]
        tls = {k: {**summarize(rows[k], failures[k]), "downloads_gbps": [round(x, 3) for x in every[k]]}
               for k in GUESTS}
        median_rate = lambda k: round(statistics.median(x["per_s"] for x in rates[k])) if rates[k] else None
        return {
            "mtu": 1500,
            "tls_bytes": size, "tls_per_round": TLS_PER_ROUND,
            "tls_open": tls["open"], "tls_address": tls["address"], "tls_name": tls["name"],
            "tls_proxy": tls["proxy"],
            "latency": {
                "connections": len(samples["name"]), "address": a, "name": n, "proxy": p,
                "judged": latency_judged,
                "extra_first_byte_ms_p50": round(n["first_byte_ms_p50"] - a["first_byte_ms_p50"], 3),
                "extra_first_byte_ms_p99": round(n["first_byte_ms_p99"] - a["first_byte_ms_p99"], 3),
                "extra_setup_ms_p50": round(n["setup_ms_p50"] - a["setup_ms_p50"], 3),
                "proxy_extra_setup_ms_p50": round(p["setup_ms_p50"] - a["setup_ms_p50"], 3),
            },
            "rate": {
                "seconds": RATE_SECONDS, "processes": RATE_PROCESSES, "concurrency": RATE_CONCURRENCY,
                "address_per_s": median_rate("address"), "name_per_s": median_rate("name"),
                "proxy_per_s": median_rate("proxy"),
                "address": rates["address"], "name": rates["name"], "proxy": rates["proxy"],
                "failures": rate_failures, "judged": rate_judged,
            },
            "hold": held,
            "peer_ms": {"opensandbox_mitm": OPENSANDBOX_MS},
        }
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        # A probe that hung, a metrics scrape that failed, an answer not
        # as expected: the section's failure, not the run's.
        raise BenchError(f"{type(e).__name__}: {e}") from e
    finally:
        gated.stop_proxy()
        env.teardown()
