"""The churn soak (issue 34): for `--soak MINUTES`, clients attach and
detach interfaces without pause on two networks (`soak`, shared with its
socket, and `soakhost`, host-only; both with 6 s leases), through every
way in: `linnet run --datapath tap|dgram|stream|tap-name`, `linnet helper`,
the network's socket, `linnet attach`/`detach` and clones of a long-lived
guest, each with the stand-in as its VMM and a DHCP exchange through it.
Meanwhile three long-lived guests (tap, stream and helper datapaths) ping
their gateway five times a second and renew their leases (busybox
udhcpc), their forwards and policies change, and the daemon is restarted
(SIGTERM, then a new one on the same directories) every few minutes.
Sampled all along into `series`: the daemon's descriptors and RSS,
nftables' elements and rules, the host's links, the leases held, the
interfaces attached, the daemon's connections and the relays running;
and each attach's time, from the command's start to its interface JSON
(for the network's socket: to the interface listed), per window.

Comparing like with like. A figure taken while interfaces come and go
says how many happened to be attached, so each figure that judges growth
is taken in one quiet state: churn stopped, forwards removed and policies
lifted, every churned interface gone from the daemon and its lease run
out (a detached interface's address is held for the lease time), only the
long-lived guests attached and re-claimed, and the figures read until
they hold still. A daemon's start figure is taken after a warm-up in
which every way in has attached to it and forwards and policies have
changed, so what a daemon sets up at a first use and keeps (a network's
masquerade for its clones, the allocator's arenas) is in its start as in
its end.

What catches a leak. A restart resets the daemon's descriptors and
memory, so the soak's end against its start alone would miss a leak that
each daemon builds and its successor drops. Each daemon's life is
therefore measured on its own as well (`per_daemon`): a quiet figure after
its warm-up and another right before it is stopped; its restart happens
under churn, with churned interfaces attached. nftables' elements and
rules, links and leases outlive a daemon (the next one adopts them), so
for them the whole soak's growth is what counts; for descriptors and RSS,
both the soak's and the worst daemon's.

The CLI's calls that attach are held while the daemon restarts: run as
root, `linnet run`, `helper` and `attach` start a daemon of their own when
none answers, which would race the restart. The calls held are counted;
what a restart ends by design (clones, connections to a network's socket:
docs/service.md) is counted apart from failures.
"""
import contextlib
import json
import os
import random
import re
import select
import signal
import statistics
import subprocess
import threading
import time
import urllib.request

from .host import BenchError, Processes, link_exists, memory_kib, run, wait_for
from .setups import read_json

NETWORK = "soak"            # shared, with its socket; the clones' original is on it
OTHER = "soakhost"          # host-only
NETWORKS = (NETWORK, OTHER)
LEASE_S = 6                 # env.NETWORKS_YAML's dhcp.lease_time on both
MINUTES = 30                # a whole run's soak
LIFE_S = 300                # a daemon's life: restarted every 5 minutes
WORKERS = 3                 # churning clients at once
HOLD_S = (0.5, 3.0)         # how long a churned interface stays attached
METRICS = "http://127.0.0.1:9464/metrics"
# The ways in. `socket`'s time is until its first frame attached it, not
# an attach request's: it is kept apart from the attach series.
KINDS = ("tap", "dgram", "stream", "tap-name", "helper", "socket", "kept", "clone")
STANDIN_DATAPATH = {"tap": ["--fd", "{fd}"], "dgram": ["--dgram-fd", "{fd}"],
                    "stream": ["--stream-fd", "{fd}"], "tap-name": ["--tap", "{tap}"]}
# The long-lived guests: name, network, way in.
LONG_LIVED = (("soak-tap", NETWORK, "tap"), ("soak-stream", OTHER, "stream"),
              ("soak-helper", OTHER, "helper"))
CLONED = "soak-tap"
FORWARD_PORTS = range(18080, 18084)
# udhcpc's hook for the soak's guests: keeps the address across a renewal
# (guest/udhcpc.script flushes it first, and busybox ping exits when a
# send fails in that moment) and logs each event, to count the renewals.
UDHCPC_SCRIPT = """#!/bin/sh
case "$1" in
    bound|renew)
        ip addr replace "$ip/${mask:-24}" dev "$interface"
        echo "soak-guest: $1 $ip"
        ;;
esac
exit 0
"""


def plan(minutes):
    """How `minutes` of churn are cut: daemon lives of about LIFE_S, at
    least two so that even a short soak restarts once, each beginning with
    a warm-up; sampling and the attach windows scaled to the length."""
    churn_s = minutes * 60
    lives = max(2, round(churn_s / LIFE_S))
    life_s = churn_s / lives
    return {"minutes": minutes, "lives": lives, "life_s": round(life_s, 1),
            "warmup_s": round(min(60.0, life_s / 4), 1),
            "sample_every_s": round(min(10.0, max(2.0, churn_s / 60)), 1),
            "window_s": round(min(60.0, max(10.0, churn_s / 12)), 1)}


# Pure summaries (bench/tests), from the records the soak keeps.

GROWN = (("fds", "fd_growth"), ("nft_elements", "nft_element_growth"),
         ("nft_rules", "nft_rule_growth"), ("links", "link_growth"), ("leases", "lease_growth"))


def growth(start, end):
    """End against start: the difference of each count, RSS as a ratio."""
    out = {key: end[field] - start[field] for field, key in GROWN}
    out["rss_growth_ratio"] = round(end["rss_mib"] / start["rss_mib"], 3)
    return out


def per_daemon(quiets):
    """Each daemon's life, from its quiet figures (`daemon` and `phase`:
    start or end): its start, its end and what grew between them."""
    out = []
    for daemon in sorted({q["daemon"] for q in quiets}):
        mine = {q["phase"]: q for q in quiets if q["daemon"] == daemon}
        if "start" in mine and "end" in mine:
            out.append({"daemon": daemon, "start": mine["start"], "end": mine["end"],
                        **growth(mine["start"], mine["end"])})
    return out


def percentiles(ms):
    ordered = sorted(ms)
    return {"count": len(ordered), "p50": round(statistics.median(ordered), 1),
            "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1)}


def windows(attaches, window_s):
    """p50 and p99 of the attaches (`t`, `ms`) in each window of
    `window_s` seconds that had any; `t` is the window's start."""
    by = {}
    for a in attaches:
        by.setdefault(int(a["t"] // window_s), []).append(a["ms"])
    return [{"t": round(i * window_s, 1), **percentiles(ms)} for i, ms in sorted(by.items())]


# Fewer attaches than this in a third of the soak: p99 is not judged.
FLAT_MIN = 20


def thirds(attaches, since):
    """The attaches after `since` s (the first warm-up), in order, cut in
    three: the first and the last third's percentiles, or None when a third
    has fewer than FLAT_MIN."""
    after = sorted((a for a in attaches if a["t"] >= since), key=lambda a: a["t"])
    third = len(after) // 3
    if third < FLAT_MIN:
        return None
    return {"first": percentiles([a["ms"] for a in after[:third]]),
            "last": percentiles([a["ms"] for a in after[-third:]])}


def summarize(plan_, quiets, attaches, failures, extra):
    """The results' `soak` object from what the soak recorded."""
    start = next(q for q in quiets if q["daemon"] == 1 and q["phase"] == "start")
    end = quiets[-1]
    timed = [a for a in attaches if a["kind"] != "socket"]
    by_kind = {k: percentiles([a["ms"] for a in attaches if a["kind"] == k])
               for k in KINDS if any(a["kind"] == k for a in attaches)}
    return {
        **plan_, "restarts": plan_["lives"] - 1, "attaches": len(attaches),
        "attach_ms_by_kind": by_kind,
        "failures": {"count": len(failures), "messages": failures[:5]},
        **growth(start, end), "start": start, "end": end,
        "per_daemon": per_daemon(quiets),
        "attach_ms": {"windows": windows(timed, plan_["window_s"]),
                      "thirds": thirds(timed, plan_["warmup_s"])},
        **extra,
    }


# What the soak reads of the daemon and the host.

METRIC_LINE = re.compile(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$")


def metric(text, name, networks=None):
    """The sum of metric `name`'s samples (those of `networks` only, when given)."""
    total = 0.0
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if m and m.group(1) == name and (
                networks is None or any(f'network="{n}"' in (m.group(2) or "") for n in networks)):
            total += float(m.group(3))
    return total


def nft_counts(ruleset):
    """Elements of every set and map, and rules, in `nft -j list ruleset`."""
    items = ruleset["nftables"]
    elements = sum(len(o[kind].get("elem", [])) for o in items for kind in ("set", "map") if kind in o)
    return elements, sum(1 for o in items if "rule" in o)


def relays_running():
    """linnet-relay processes alive (the sandbox's pid 1, this benchmark,
    does not reap what a stopped daemon leaves: zombies are not counted)."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                comm, rest = f.read().split(") ", 1)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            continue
        count += comm.endswith("(linnet-relay") and not rest.startswith("Z")
    return count


def scrape():
    with urllib.request.urlopen(METRICS, timeout=5) as r:
        return r.read().decode()


def leases_held():
    return int(metric(scrape(), "linnet_network_dhcp_leases", NETWORKS))


def figures(daemon_pid):
    """One reading of everything the soak follows."""
    text = scrape()
    elements, rules = nft_counts(json.loads(run("nft", "-j", "list", "ruleset")))
    return {
        "fds": len(os.listdir(f"/proc/{daemon_pid}/fd")),
        "rss_mib": round(memory_kib(daemon_pid) / 1024, 2),
        "nft_elements": elements, "nft_rules": rules,
        "links": len(run("ip", "-o", "link", "show").splitlines()),
        "leases": int(metric(text, "linnet_network_dhcp_leases", NETWORKS)),
        "interfaces": int(metric(text, "linnet_network_interfaces")),
        "connections": int(metric(text, "linnet_connections")),
        "relays": relays_running(),
    }


class Gate:
    """The CLI's calls to the daemon share it; a restart has it alone,
    once the calls in flight are done, and holds new ones until the new
    daemon has its interfaces back."""

    def __init__(self):
        self.cond = threading.Condition()
        self.calls = 0
        self.closed = False
        self.held = 0

    @contextlib.contextmanager
    def call(self, counted=True):
        """A call to the daemon; `counted`: one the CLI makes (a sample is not)."""
        with self.cond:
            self.held += self.closed and counted
            while self.closed:
                self.cond.wait()
            self.calls += 1
        try:
            yield
        finally:
            with self.cond:
                self.calls -= 1
                self.cond.notify_all()

    @contextlib.contextmanager
    def alone(self):
        with self.cond:
            self.closed = True
            while self.calls:
                self.cond.wait()
        try:
            yield
        finally:
            with self.cond:
                self.closed = False
                self.cond.notify_all()


class Workers:
    """Threads that each repeat a step while the churn is on; `pause`
    returns once every step under way has finished."""

    def __init__(self):
        self.cond = threading.Condition()
        self.on = False
        self.done = False
        self.active = 0
        self.threads = []

    def add(self, step):
        t = threading.Thread(target=self.loop, args=(step,), daemon=True)
        self.threads.append(t)
        t.start()

    def loop(self, step):
        while True:
            with self.cond:
                while not (self.on or self.done):
                    self.cond.wait()
                if self.done:
                    return
                self.active += 1
            try:
                step()
            finally:
                with self.cond:
                    self.active -= 1
                    self.cond.notify_all()

    def idle(self, seconds):
        """Waits `seconds`, less if the churn pauses meanwhile."""
        with self.cond:
            self.cond.wait_for(lambda: not self.on or self.done, timeout=seconds)

    def resume(self):
        with self.cond:
            self.on = True
            self.cond.notify_all()

    def pause(self):
        with self.cond:
            self.on = False
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.active == 0, timeout=120)

    def stop(self):
        with self.cond:
            self.done = True
        self.pause()
        for t in self.threads:
            t.join(timeout=30)


class Soak:
    def __init__(self, env, plan_, log):
        self.env, self.plan, self.log = env, plan_, log
        self.linnet = env.linnet
        self.dir = os.path.join(env.workdir, "soak")
        os.makedirs(self.dir, exist_ok=True)
        self.script = os.path.join(self.dir, "udhcpc.script")
        with open(self.script, "w") as f:
            f.write(UDHCPC_SCRIPT)
        os.chmod(self.script, 0o755)
        self.logs = os.path.join(env.workdir, "logs")
        self.gate = Gate()
        self.workers = Workers()
        self.lock = threading.Lock()        # the records below
        self.reading = threading.Lock()     # one reading of the figures at a time
        self.started = time.monotonic()
        self.daemon = 1                     # which daemon's life this is
        self.attaches, self.failures, self.quiets, self.series, self.restarts = [], [], [], [], []
        self.ended_by_restart = 0
        self.changes = {"forwards": 0, "policies": 0}
        self.live = {}                      # worker: the kind it has attached now
        self.long_lived = {}                # name: {ns, holder, interface_id, gateway, ...}
        self.forwards = set()
        self.policed = set()
        self.cycles = 0
        self.sampling = threading.Event()

    def now(self):
        return round(time.monotonic() - self.started, 2)

    def fail(self, what):
        with self.lock:
            self.failures.append(f"{self.now():.0f} s: {what}")
        self.log(f"  soak: {what}")

    def path(self, name):
        return os.path.join(self.dir, name)

    # The long-lived guests.

    def start_long_lived(self):
        for name, network, way in LONG_LIVED:
            ns = self.env.guest_ns(name)
            procs = self.env.procs
            if way == "helper":
                sock = self.path(f"{name}.sock")
                holder = procs.start(name, [self.linnet.bin, "helper", "--network", network, "--name",
                                            name, "--socket", sock], env=self.linnet.env, pipe_stdout=True)
                info = json.loads(first_line(holder, f"`linnet helper` for {name}"))
                procs.start(f"{name}-vm", [self.env.standin_bin, "--dgram-socket", sock, "--mac",
                                           info["mac_address"], "--netns", f"/run/netns/{ns}"])
            else:
                out = self.path(f"{name}.json")
                holder = procs.start(name, [self.linnet.bin, "run", "--network", network, "--name", name,
                                            "--datapath", way, "--json", out, "--", self.env.standin_bin,
                                            *STANDIN_DATAPATH[way], "--netns", f"/run/netns/{ns}"],
                                     env=self.linnet.env)
                info = wait_for(lambda: procs.check_alive() or read_json(out), f"`linnet run` for {name}")
            self.env.wait_link("eth0", ns)
            udhcpc = procs.start(f"{name}-udhcpc", ["busybox", "udhcpc", "-i", "eth0", "-f", "-t", "5",
                                                    "-T", "1", "-A", "1", "-s", self.script], ns=ns)
            wait_for(lambda: procs.check_alive() or info["ip_address"] in run("ip", "-4", "addr", "show",
                                                                              "eth0", ns=ns),
                     f"{name}'s lease")
            ping = procs.start(f"{name}-ping", ["busybox", "ping", "-q", "-i", "0.2", info["gateway"]], ns=ns)
            self.long_lived[name] = {"ns": ns, "network": network, "holder": holder.pid,
                                     "interface_id": info["interface_id"], "udhcpc": udhcpc, "ping": ping,
                                     "subnet": info["subnet"]}

    def long_lived_reclaimed(self):
        """Whether every long-lived guest is listed, held by its client."""
        listed = {i["interface_id"]: i.get("client_pid") for i in self.linnet.listing()["interfaces"]}
        return all(listed.get(g["interface_id"]) == g["holder"] for g in self.long_lived.values())

    def traffic(self):
        """Each long-lived guest's pings (stopped with SIGINT for busybox's
        totals) and lease events."""
        out = []
        for name, g in self.long_lived.items():
            ping = g["ping"]
            if ping.poll() is None:
                ping.send_signal(signal.SIGINT)
                ping.wait(timeout=10)
            with open(self.env.procs.log(ping)) as f:
                m = re.search(r"(\d+) packets transmitted, (\d+) packets received", f.read())
            with open(self.env.procs.log(g["udhcpc"])) as f:
                renewals = f.read().count("soak-guest: renew")
            out.append({"guest": name, "network": g["network"],
                        "pings_sent": int(m.group(1)) if m else None,
                        "pings_received": int(m.group(2)) if m else None,
                        "lease_renewals": renewals})
        return out

    # Churn: one worker's cycle, attach, hold, detach.

    def churner(self, worker):
        rng = random.Random(worker)
        order = []

        def step():
            if not order:
                order.extend(rng.sample(KINDS, len(KINDS)))
            kind = order.pop()
            with self.lock:
                self.cycles += 1
                n = self.cycles
            network = NETWORK if kind in ("socket", "clone") or n % 2 else OTHER
            try:
                self.cycle(worker, kind, network, n, rng)
            except Exception as e:  # noqa: BLE001 - a worker that died would churn no more, unseen
                self.fail(f"{kind} on {network}: {describe(e)}")
                self.workers.idle(1)  # not a tight loop of failures
        return step

    def cycle(self, worker, kind, network, n, rng):
        ns = self.churn_ns[worker]
        # The last cycle's TAP in the guest goes with its stand-in.
        wait_for(lambda: not link_exists("eth0", ns), f"the last eth0 in {ns} to go")
        procs = Processes(self.logs)
        kept, ok = None, False
        try:
            daemon, ms, kept = self.attach(procs, worker, kind, network, ns, n)
            with self.lock:
                self.attaches.append({"t": self.now(), "kind": kind, "ms": round(ms, 2), "daemon": daemon})
                self.live[worker] = kind
            try:
                wait_for(lambda: procs.check_alive() or link_exists("eth0", ns), f"eth0 in {ns}")
                run("busybox", "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "4", "-T", "1", "-s",
                    self.script, ns=ns)
                time.sleep(rng.uniform(*HOLD_S))
                procs.check_alive()
            except BenchError:
                # A clone and a connection to a network's socket end with
                # their daemon (docs/service.md); anything else is a failure.
                if daemon == self.daemon or kind not in ("clone", "socket"):
                    raise
                with self.lock:
                    self.ended_by_restart += 1
            ok = True
        finally:
            with self.lock:
                self.live.pop(worker, None)
            logs = [procs.log(p) for p in procs.procs]
            procs.stop_all()
            if kept:
                with self.gate.call():
                    self.linnet_cli("detach", "--network", network, "--name", kept)
            if ok:  # a failed cycle's logs stay, with the work directory
                for log in set(logs):
                    os.unlink(log)

    def attach(self, procs, worker, kind, network, ns, n):
        """Attaches one interface of `kind` with its stand-in: (the daemon
        it attached to, ms from the command's start to the interface's
        JSON, or to it being listed for the network's socket, the name of a
        `linnet attach`ed one for its detach)."""
        name, netns = f"soak-{n}-{kind}", f"/run/netns/{ns}"
        standin = self.env.standin_bin
        with self.gate.call():
            daemon, start = self.daemon, time.perf_counter()
            elapsed = lambda: (time.perf_counter() - start) * 1000
            if kind == "helper":
                sock = self.path(f"w{worker}.sock")
                for path in (sock, sock + ".client"):  # the last cycle's, helper's and stand-in's
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                proc = procs.start(name, [self.linnet.bin, "helper", "--network", network, "--socket", sock],
                                   env=self.linnet.env, pipe_stdout=True)
                info = json.loads(first_line(proc, "`linnet helper`"))
                ms = elapsed()
                procs.start(name, [standin, "--dgram-socket", sock, "--mac", info["mac_address"],
                                   "--netns", netns])
                return daemon, ms, None
            if kind == "socket":
                mac = "52:54:00:%02x:%02x:%02x" % (0x80 | worker, n >> 8 & 0xff, n & 0xff)
                procs.start(name, [standin, "--stream-socket", self.linnet.network_socket(network),
                                   "--mac", mac, "--netns", netns])
                wait_for(lambda: procs.check_alive() or any(
                    i["mac_address"] == mac for i in self.linnet.listing()["interfaces"]),
                    f"the interface of {mac} on {network}'s socket", every=0.005)
                return daemon, elapsed(), None
            out = self.path(f"w{worker}.json")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(out)
            if kind == "kept":
                kept = f"soak-kept-{n}"
                self.linnet_cli("attach", "--network", network, "--name", kept, "--json", out)
                ms = elapsed()
                info = read_json(out)
                procs.start(name, [standin, "--tap", info["tap"], "--mac", info["mac_address"],
                                   "--netns", netns])
                return daemon, ms, kept
            datapath, extra = (("tap", ["--clone-of", CLONED]) if kind == "clone" else (kind, []))
            procs.start(name, [self.linnet.bin, "run", "--network", network, "--datapath", datapath,
                               "--json", out, *extra, "--", standin, *STANDIN_DATAPATH[datapath],
                               "--netns", netns], env=self.linnet.env)
            wait_for(lambda: procs.check_alive() or read_json(out), f"`linnet run` ({kind}) to attach",
                     timeout=15, every=0.002)
            return daemon, elapsed(), None

    def linnet_cli(self, *args):
        r = subprocess.run([self.linnet.bin, *args], env={**os.environ, **self.linnet.env},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=30)
        if r.returncode != 0:
            raise BenchError(f"`linnet {' '.join(args[:2])}` failed: {r.stderr.strip()[-300:]}")

    # Forwards and policies on the long-lived guests.

    def tuner(self):
        rng = random.Random(99)

        def step():
            try:
                with self.gate.call():
                    if rng.random() < 0.4:
                        self.change_forward(rng)
                    else:
                        self.change_policy(rng)
            except Exception as e:  # noqa: BLE001 - as the churners'
                self.fail(describe(e))
            self.workers.idle(rng.uniform(0.5, 2.0))
        return step

    def change_forward(self, rng):
        """Publishes a port of the tap guest, or withdraws one."""
        free = [p for p in FORWARD_PORTS if p not in self.forwards]
        if free and (not self.forwards or rng.random() < 0.5):
            port = rng.choice(free)
            self.linnet_cli("forward", "add", "--network", NETWORK, "--name", CLONED, f"{port}:80")
            self.forwards.add(port)
        else:
            port = rng.choice(sorted(self.forwards))
            self.linnet_cli("forward", "rm", "--network", NETWORK, "--name", CLONED, f"{port}:80")
            self.forwards.discard(port)
        self.changes["forwards"] += 1

    def change_policy(self, rng):
        """Sets rules, a rate limit, both, or lifts them, on a guest."""
        name = rng.choice([CLONED, "soak-stream"])
        g = self.long_lived[name]
        args = rng.choice([["--allow-connect", g["subnet"]], ["--rate-limit", "50mbit"],
                           ["--allow-connect", g["subnet"], "--allow-listen", "80/tcp",
                            "--rate-limit", "20mbit"], []])
        self.linnet_cli("policy", "set", "--network", g["network"], "--name", name, *args)
        (self.policed.add if args else self.policed.discard)(name)
        self.changes["policies"] += 1

    def untune(self):
        """No forward and no policy: the state every quiet figure has."""
        with self.gate.call():
            for port in sorted(self.forwards):
                self.linnet_cli("forward", "rm", "--network", NETWORK, "--name", CLONED, f"{port}:80")
            self.forwards.clear()
            for name in sorted(self.policed):
                self.linnet_cli("policy", "set", "--network", self.long_lived[name]["network"],
                                "--name", name)
            self.policed.clear()

    # Readings.

    def sampler(self):
        while not self.sampling.wait(self.plan["sample_every_s"]):
            try:
                with self.gate.call(counted=False), self.reading:
                    sample = figures(self.linnet.daemon.pid)
            except Exception as e:  # noqa: BLE001 - the next sample may do
                self.fail(f"a sample failed: {describe(e)}")
                continue
            with self.lock:
                self.series.append({"t": self.now(), "daemon": self.daemon,
                                    "quiet": not self.workers.on, **sample})

    def quiet(self, phase):
        """Stops the churn and reads the figures once only the long-lived
        guests are attached, their leases alone held and the figures still."""
        self.workers.pause()
        self.untune()
        self.env.procs.check_alive()  # every long-lived guest and its ping and udhcpc
        long_ids = {g["interface_id"] for g in self.long_lived.values()}
        try:
            wait_for(lambda: {i["interface_id"] for i in self.linnet.listing()["interfaces"]} == long_ids,
                     "the churned interfaces to go", timeout=30)
        except BenchError:
            left = [i.get("name") or i["interface_id"] for i in self.linnet.listing()["interfaces"]
                    if i["interface_id"] not in long_ids]
            self.fail(f"still attached 30 s after their clients stopped: {', '.join(left)}")
        started = time.monotonic()
        with self.gate.call():
            try:
                # The churned interfaces' leases run out LEASE_S after they go.
                wait_for(lambda: leases_held() == len(self.long_lived),
                         "the churned interfaces' leases to run out", timeout=LEASE_S + 10, every=0.5)
            except BenchError:
                pass  # lease_growth says so
            with self.reading:
                last, steady = figures(self.linnet.daemon.pid), False
                for _ in range(20):
                    time.sleep(0.5)
                    now = figures(self.linnet.daemon.pid)
                    steady = all(now[k] == last[k] for k in ("fds", "nft_elements", "links", "relays"))
                    last = now
                    if steady:
                        break
        q = {"t": self.now(), "daemon": self.daemon, "phase": phase, "steady": steady,
             "wait_s": round(time.monotonic() - started, 1), **last}
        self.quiets.append(q)
        self.log(f"  daemon {self.daemon} {phase}: {q['fds']} fds, {q['rss_mib']} MiB, nft "
                 f"{q['nft_elements']} elements / {q['nft_rules']} rules, {q['links']} links, "
                 f"{q['leases']} leases, {q['relays']} relays")
        return q

    def warm_up(self, seconds):
        """Churns for `seconds`, and on until every way in has attached to
        this daemon and forwards and policies have changed: what a daemon
        sets up at a first use (a network's masquerade for its clones, say)
        is then in its start figure as in its end figure."""
        time.sleep(seconds)

        def cold():
            with self.lock:
                attached = {a["kind"] for a in self.attaches if a["daemon"] == self.daemon}
            return [k for k in KINDS if k not in attached] + [k for k, n in self.changes.items() if not n]
        try:
            wait_for(lambda: not cold(), "every way in to attach once", timeout=120, every=0.5)
        except BenchError:
            self.fail(f"daemon {self.daemon} had no {', '.join(cold())} after 2 minutes of churn")

    def restart(self):
        """Stops the daemon under churn and starts the next, which adopts
        the interfaces; returns once the long-lived guests are re-claimed."""
        with self.gate.alone():
            with self.lock:
                live = sorted(self.live.values())
                self.daemon += 1
            t0 = time.perf_counter()
            self.linnet.stop()
            t1 = time.perf_counter()
            self.linnet.start()
            wait_for(self.serving, "the new daemon to answer")
            t2 = time.perf_counter()
            wait_for(self.long_lived_reclaimed, "the long-lived guests to be re-claimed", timeout=30)
            t3 = time.perf_counter()
        ms = lambda a, b: round((b - a) * 1000, 1)
        r = {"t": self.now(), "churned_attached": len(live), "churned_kinds": live,
             "stop_ms": ms(t0, t1), "serving_ms": ms(t1, t2), "reclaimed_ms": ms(t1, t3)}
        self.restarts.append(r)
        self.log(f"  restart {len(self.restarts)}: stopped in {r['stop_ms']} ms with {len(live)} churned "
                 f"interfaces attached, the next answered in {r['serving_ms']} ms, re-claimed in "
                 f"{r['reclaimed_ms']} ms")

    def serving(self):
        try:
            return self.linnet.listing() is not None
        except (OSError, BenchError):
            return False

    # The whole soak.

    def run(self):
        p = self.plan
        self.churn_ns = [self.env.guest_ns(f"soak-w{w}") for w in range(WORKERS)]
        self.start_long_lived()
        for w in range(WORKERS):
            self.workers.add(self.churner(w))
        self.workers.add(self.tuner())
        threading.Thread(target=self.sampler, daemon=True).start()
        for life in range(p["lives"]):
            self.workers.resume()
            if life:
                # Under churn, with churned interfaces attached.
                time.sleep(min(3.0, p["warmup_s"]))
                self.restart()
            self.warm_up(p["warmup_s"])
            self.quiet("start")
            self.workers.resume()
            time.sleep(p["life_s"] - p["warmup_s"])
            self.quiet("end")

    def close(self):
        """Stops the churn and the sampler; detaches what `linnet attach`
        kept (no client detaches it), so nothing outlives the soak."""
        self.workers.stop()
        self.sampling.set()
        with contextlib.suppress(OSError, BenchError):
            for i in self.linnet.listing()["interfaces"]:
                if (i.get("name") or "").startswith("soak-kept-"):
                    with contextlib.suppress(BenchError):
                        self.linnet_cli("detach", "--network", i["network"], "--name", i["name"])

    def results(self):
        with self.lock:
            extra = {"workers": WORKERS, "lease_time_s": LEASE_S,
                     "wall_s": self.now(), "ended_by_restart": self.ended_by_restart,
                     "calls_held_by_restarts": self.gate.held, "changes": dict(self.changes),
                     "restart_figures": list(self.restarts), "traffic": self.traffic(),
                     "series": list(self.series)}
            return summarize(self.plan, self.quiets, list(self.attaches), list(self.failures), extra)


def describe(e):
    return str(e) if isinstance(e, BenchError) else f"{type(e).__name__}: {e}"


def first_line(proc, what, timeout=15):
    """The first line a process prints on its stdout pipe."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else b""
    if not line:
        raise BenchError(f"{what} printed no interface within {timeout} s"
                         + (f" (exited with {proc.poll()})" if proc.poll() is not None else ""))
    return line


def measure(env, minutes, log):
    """The soak, on a daemon of its own: what earlier figures left goes
    first (egress by name and operations keep their guests to the end),
    then the daemon, with nothing attached, and a new one starts."""
    env.teardown()
    env.linnet.stop()
    env.linnet.start()
    soak = Soak(env, plan(minutes), log)
    log(f"  {minutes:g} min of churn: {soak.plan['lives']} daemons of {soak.plan['life_s']:.0f} s, "
        f"{WORKERS} churning clients")
    try:
        soak.run()
        soak.close()
        return soak.results()
    finally:
        soak.close()
        env.teardown()
