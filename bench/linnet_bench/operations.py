"""Operations (docs/operations.md): what metrics and a rate limit that is
never reached cost, and how closely rate limits hold. Guests on `shared`
(`linnet run --datapath tap`, the stand-in as VMM), to the host's iperf3.
Measured, round by round:

- throughput VM→host while a scraper fetches /metrics every second (a
  Prometheus default is 15 s) against no scrapes, the same guest;
- throughput VM→host of a guest whose limit (100 Gbit/s each way) is never
  reached against one without a limit;
- for limits of 10, 100 and 1000 Mbit/s each way: TCP throughput each way
  (4 s, the first second left out: the burst and TCP's start) as a share
  of the limit, and how long `linnet policy set --rate-limit` takes until
  the new limit holds (the command returns once the kernel has it).
"""
import json
import statistics
import subprocess
import threading
import time
import urllib.request

from .host import BenchError
from .setups import HOST_TO_VM, VM_TO_HOST, Topology, run_guest
from .throughput import measure, summarize

SETUP = "linnet operations"
NETWORK = "shared"
METRICS = "http://127.0.0.1:9464/metrics"
SCRAPE_EVERY_S = 1.0
UNREACHED = "100gbit"
LIMITS_MBIT = (10, 100, 1000)
ACCURACY_SECONDS = 4


class Guests:
    """The guests, by name, and their stand-ins' processes."""

    def __init__(self, env):
        self.env = env
        self.gateway = None
        self.pids = {}

    def attach(self, name, extra=()):
        """A guest on `shared` called `name`, its address configured: its namespace."""
        ns, info, run_pid, standins = run_guest(self.env, NETWORK, ["--name", name, *extra])
        self.pids[ns] = ([run_pid], standins)
        self.gateway = info["gateway"]
        return ns

    def topology(self, ns):
        topo = Topology()
        topo.guests = [(ns, None)]
        topo.server = self.gateway
        topo.net_pids, topo.standin_pids = self.pids[ns]
        return topo


class Scraper:
    """Fetches /metrics every SCRAPE_EVERY_S while it runs."""

    def __init__(self):
        self.stop = threading.Event()
        self.scrapes, self.failures = 0, 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(SCRAPE_EVERY_S):
            try:
                with urllib.request.urlopen(METRICS, timeout=5) as r:
                    r.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        self.thread.join()


def limited_mbits(env, ns, gateway, reverse):
    """TCP Mbit/s over ACCURACY_SECONDS, the first second left out."""
    cmd = ["ip", "netns", "exec", ns, "iperf3", "--client", gateway, "--time", str(ACCURACY_SECONDS),
           "--omit", "1", "--json"]
    if reverse:
        cmd.append("--reverse")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=ACCURACY_SECONDS + 20)
    try:
        received = json.loads(r.stdout)["end"]["sum_received"]
    except (ValueError, KeyError, TypeError):
        raise BenchError(f"iperf3 through a rate limit gave no totals: {r.stderr.strip()[-200:]}")
    return received["bytes"] * 8 / received["seconds"] / 1e6


def set_rate(env, name, rate):
    """`linnet policy set --rate-limit RATE` for guest `name`: ms it took."""
    t = time.perf_counter()
    subprocess.run([env.linnet.bin, "policy", "set", "--network", NETWORK, "--name", name,
                    "--rate-limit", rate], env=env.linnet.env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)
    return (time.perf_counter() - t) * 1000


def measure_all(env, seconds, runs, log):
    guests = Guests(env)
    open_ns = guests.attach("ops-open")
    unreached_ns = guests.attach("ops-unreached", ["--rate-limit", UNREACHED])
    limited_ns = guests.attach("ops-limited")
    rows = {"scraped": [], "unscraped": [], "unreached": [], "open": []}
    failures = {k: [] for k in rows}
    scrapes = fails = 0
    for r in range(runs):
        for key, ns in (("unscraped", open_ns), ("scraped", open_ns),
                        ("open", open_ns), ("unreached", unreached_ns)):
            try:
                if key == "scraped":
                    with Scraper() as s:
                        result = measure(guests.topology(ns), VM_TO_HOST, seconds)
                    scrapes, fails = scrapes + s.scrapes, fails + s.failures
                else:
                    result = measure(guests.topology(ns), VM_TO_HOST, seconds)
                rows[key].append({**result, "round": r})
            except BenchError as e:
                failures[key].append(str(e))
    if fails or not scrapes:
        raise BenchError(f"the scraper fetched /metrics {scrapes} times and failed {fails} times")
    summary = {k: summarize(rows[k], failures[k]) for k in rows}
    accuracy = []
    for mbit in LIMITS_MBIT:
        set_ms = set_rate(env, "ops-limited", f"{mbit}mbit")
        ways = {}
        for way, reverse in ((VM_TO_HOST, False), (HOST_TO_VM, True)):
            got = [limited_mbits(env, limited_ns, guests.gateway, reverse) for _ in range(max(1, runs // 2))]
            ways[way] = {"mbit": round(statistics.median(got), 2), "runs_mbit": [round(x, 2) for x in got],
                         "share": round(statistics.median(got) / mbit, 3)}
        accuracy.append({"limit_mbit": mbit, "policy_set_ms": round(set_ms, 1), "ways": ways})
        log(f"  {mbit} Mbit/s: {ways[VM_TO_HOST]['mbit']} out, {ways[HOST_TO_VM]['mbit']} in")
    return {
        "scrape_every_s": SCRAPE_EVERY_S,
        "scrapes": scrapes,
        "unreached_limit": UNREACHED,
        "throughput_scraped": summary["scraped"],
        "throughput_unscraped": summary["unscraped"],
        "throughput_unreached": summary["unreached"],
        "throughput_open": summary["open"],
        "accuracy": accuracy,
    }
