"""linnet's benchmark: linnet's datapaths against the kernel's limits and the
peers a user would pick instead, and the control plane's figures, in one run.

Run it through `make bench`, which runs it inside scripts/sandbox: every
namespace, link and process it makes vanishes when it ends.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

from . import control, docs, fabric, gate, names, operations, profile, report, secrets, soak
from .env import Env
from .host import BenchError, debian_version, memory_kib, wait_for
from .setups import DIRECTIONS, VM_TO_VM, Lan, all_setups, deepen_guest_queues, upstream
from .throughput import check_path, measure, summarize


RESULTS = "bench/results"  # a whole run's, committed, and the docs' figures
PARTIAL = "target/bench"   # a narrowed run's


def parse_args():
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, default=2, help="length of each iperf3 run (default 2)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the median is reported (default 3)")
    p.add_argument("--only", metavar="REGEX", help="only the setups whose name matches, e.g. 'linnet|passt'")
    p.add_argument("--mtu", type=int, choices=(1500, 9000, 65520),
                   help="only this MTU (9000: the LAN rows only)")
    p.add_argument("--no-control", action="store_true", help="skip the control-plane figures")
    p.add_argument("--no-fabric", action="store_true",
                   help="skip the figures across hosts (linnet_bench/fabric.py)")
    p.add_argument("--no-names", action="store_true",
                   help="skip the egress-by-name figures (linnet_bench/names.py)")
    p.add_argument("--no-gate", action="store_true",
                   help="skip the name check's figures (linnet-gate: linnet_bench/gate.py)")
    p.add_argument("--no-secrets", action="store_true",
                   help="skip the secrets proxy's figures (linnet-secrets: linnet_bench/secrets.py)")
    p.add_argument("--no-operations", action="store_true",
                   help="skip the operations figures: metrics, rate limits (linnet_bench/operations.py)")
    p.add_argument("--soak", type=float, metavar="MINUTES",
                   help=f"minutes of the churn soak (linnet_bench/soak.py); 0 skips it (default "
                        f"{soak.MINUTES} for a whole run, 0 for a narrowed one)")
    p.add_argument("--moves", type=int, default=10,
                   help="attaches and moves across hosts for those timings (default 10)")
    p.add_argument("--interfaces", type=int, default=1000, help="interfaces for the scale figure (default 1000)")
    p.add_argument("--attaches", type=int, default=200, help="attaches for the latency figure (default 200)")
    p.add_argument("--clones", type=int, default=100,
                   help="clones of one VM at once, against as many interfaces (default 100)")
    p.add_argument("--bin", default="target/release", help="where linnet and linnet-standin are")
    p.add_argument("--gvproxy", default="target/peers/gvproxy",
                   help="gvproxy's binary (default: where `scripts/install-deps bench` builds it, "
                        "else gvproxy on PATH)")
    p.add_argument("--out", help=f"where latest.{{md,json,svg}} go (default: {RESULTS} for a "
                                 f"whole run, which also rewrites the docs' benchmark blocks; "
                                 f"{PARTIAL} for one narrowed by --only, --mtu, --no-control, "
                                 f"fewer than 3 --runs or a --soak under {soak.MINUTES})")
    p.add_argument("--profile", metavar="SETUP",
                   help="measure nothing: sample the machine with perf while iperf3 runs through "
                        "this setup at --mtu (default 1500) in --direction, and print where the "
                        "time goes (linnet_bench/profile.py)")
    p.add_argument("--direction", choices=DIRECTIONS, default=DIRECTIONS[0],
                   help="for --profile (default vm_to_host)")
    p.add_argument("--render", metavar="JSON",
                   help="measure nothing: judge and write the report again from a results file "
                        "(after a change to the report's code); bench/results/latest.json also "
                        "rewrites the docs' blocks")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any setup failed (for the smoke check in `make test`)")
    return p.parse_args()


def linnet_commit():
    return subprocess.run(["git", "describe", "--always", "--dirty"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True).stdout.strip() or "unknown"


def machine(commit):
    """The machine and the tools every setup shares; each setup's own
    version (a peer's package or Go module) is in its throughput entry."""
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "unknown")
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "linnet_commit": commit,
        "tools": {"iperf3": debian_version("iperf3")},
    }


def find_gvproxy(path):
    """gvproxy as `scripts/install-deps bench` builds it, or on PATH."""
    for candidate in (path, shutil.which("gvproxy")):
        if candidate and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def describe(e):
    return str(e) if isinstance(e, BenchError) else f"{type(e).__name__}: {e}"


def measure_round(env, setup, mtu, seconds, entry, round_):
    """Brings the setup up, runs iperf3 once each way into `entry["runs"]`,
    and takes it down again. A run that fails (iperf3 hung or broke off) is
    recorded against its direction, and so are the directions after it,
    not run: the next round brings the setup up afresh. A setup that does
    not come up in the first round is an error and is not tried again; in a
    later round that round's runs are recorded as failed."""
    directions = [d for d in DIRECTIONS if d != VM_TO_VM or setup.vm_to_vm]
    fail = lambda d, why: entry["failures"].setdefault(d, []).append(why)
    try:
        try:
            topo = setup.up(env, mtu)
            if setup.emulated_vm_tap:
                deepen_guest_queues(topo)
        except Exception as e:  # noqa: BLE001 - one setup's failure must not lose the others' results
            if round_ == 0:
                entry["error"] = describe(e)
            else:
                for d in directions:
                    fail(d, f"the setup did not come up in round {round_ + 1}: {describe(e)}")
            log(f"  {setup.name} at MTU {mtu} failed to come up: {describe(e)}")
            return
        failed = None
        for direction in directions:
            if failed:
                fail(direction, f"not run in round {round_ + 1}: {failed}")
                continue
            if direction == VM_TO_VM:
                env.procs.start(f"iperf3-server-{topo.guests[1][0]}", ["iperf3", "--server"],
                                ns=topo.guests[1][0])
            try:
                check_path(topo, direction)
                run = measure(topo, direction, seconds)
            except BenchError as e:
                fail(direction, str(e))
                failed = f"{report.LABEL[direction]} failed before it"
                log(f"  {setup.name:<24} MTU {mtu:<5} {report.LABEL[direction]:<8} failed: {e}")
                continue
            run["round"] = round_
            entry["runs"].setdefault(direction, []).append(run)
            log(f"  {setup.name:<24} MTU {mtu:<5} {report.LABEL[direction]:<8} {run['gbps']:6.2f} Gbit/s"
                f"  {run['retransmits']} retransmits")
        if setup.group == "linnet" and setup.datapath != "tap":
            relays = [p for p in topo.net_pids if p != env.linnet.daemon.pid]
            peak = round(max(memory_kib(p, "VmHWM") for p in relays) / 1024, 2)
            entry["relay_peak_rss_mib"] = max(peak, entry.get("relay_peak_rss_mib", 0))
    except Exception as e:  # noqa: BLE001 - one setup's failure must not lose the others' results
        entry["error"] = describe(e)
        log(f"  {setup.name} at MTU {mtu} failed: {entry['error']}")
    finally:
        env.teardown()


def lan_latency(env, count):
    """Attach latency on each kind of LAN network, its LAN up for it alone."""
    out = {}
    for kind, network in (("bridged", "lan"), ("bridge", "lanbr")):
        try:
            Lan(env, kind, 1500, dhcp=False)
            out[kind] = control.latency(env.linnet.socket, network, count)
            # Gone from the daemon before its LAN goes.
            wait_for(lambda: control.interfaces_on(env.linnet.socket, network) == 0,
                     f"the interfaces on {network} to go")
        finally:
            env.teardown()
    return out


def rootless_control(env, count):
    """A rootless daemon's cold start and attach latency, measured as its
    user, with the way upstream pasta needs."""
    try:
        upstream(env)
        daemon = env.start_rootless()
        return {"cold_start_ms": daemon.cold_start_ms,
                "latency": daemon.control("latency", daemon.socket, "shared", count)}
    finally:
        env.teardown()


def control_plane(env, args, workdir):
    daemon = env.linnet.daemon.pid
    return {
        "rootless": rootless_control(env, args.attaches) if env.have("pasta") else None,
        "daemon_rss_mib_idle": round(memory_kib(daemon) / 1024, 2),
        "latency": control.latency(env.linnet.socket, "shared", args.attaches),
        "latency_contended": control.contended(env.linnet.socket, "shared", args.attaches),
        "latency_lan": lan_latency(env, args.attaches),
        "scale": control.scale(env.linnet.socket, "scale", daemon,
                               sorted({min(100, args.interfaces), args.interfaces}),
                               sorted({min(10, args.interfaces), args.interfaces})),
        "helper": control.helper_rss(env.linnet, workdir),
        "clones": control.clones(env.linnet.socket, "clones", daemon, args.clones),
    }


def throughput(env, args, results):
    """Every setup at every MTU, `args.runs` rounds: each round measures
    every setup once, so a slow spell of the machine hits all setups alike
    rather than the few measured during it."""
    plan = []
    for setup in all_setups():
        if args.only and not re.search(args.only, setup.name):
            continue
        why = setup.unavailable(env)
        if why:
            results["not_run"].append({"setup": setup.name, "why": why})
            continue
        if not setup.vm_to_vm:
            results["not_run"].append({"setup": setup.name, "direction": VM_TO_VM,
                                       "why": setup.why_no_vm_to_vm})
        if 65520 not in setup.mtus and args.mtu != 1500:
            results["not_run"].append({"setup": setup.name, "mtu": 65520, "why": setup.why_no_jumbo})
        for mtu in setup.mtus:
            if args.mtu in (None, mtu):
                entry = {"setup": setup.name, "group": setup.group, "version": setup.version(env),
                         "mtu": mtu, "runs": {}, "failures": {}}
                plan.append((setup, mtu, entry))
                results["throughput"].append(entry)
    for round_ in range(args.runs):
        log(f"throughput, round {round_ + 1} of {args.runs}")
        for setup, mtu, entry in plan:
            if not entry.get("error"):
                measure_round(env, setup, mtu, args.seconds, entry, round_)
    for _, _, entry in plan:
        runs, failures = entry.pop("runs"), entry.pop("failures")
        entry["directions"] = {d: summarize(runs.get(d, []), failures.get(d, []))
                               for d in DIRECTIONS if d in runs or d in failures}


def write(results, out):
    """latest.{md,json,svg} in `out`; the markdown, for printing."""
    os.makedirs(out, exist_ok=True)
    md = report.markdown(results)
    with open(os.path.join(out, "latest.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "latest.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "latest.svg"), "w") as f:
        f.write(report.svg(results))
    written = "latest.md, latest.json, latest.svg"
    if (results.get("soak") or {}).get("series"):
        with open(os.path.join(out, "latest-soak.svg"), "w") as f:
            f.write(report.soak_svg(results))
        written += ", latest-soak.svg"
    log(f"bench: wrote {written} in {out}")
    return md


def render(path):
    with open(path) as f:
        results = json.load(f)
    if results.get("format") != docs.FORMAT:
        sys.exit(f"bench: {path} is in format {results.get('format', 1)}, not {docs.FORMAT}")
    results["targets"] = report.targets(results)
    out = os.path.dirname(path) or "."
    write(results, out)
    if os.path.abspath(out) == os.path.abspath(RESULTS):
        docs.update(".", results)


def main():
    args = parse_args()
    if args.render:
        return render(args.render)
    if os.environ.get("LINNET_SANDBOX") != "1":
        sys.exit("bench: run it with `make bench` (it must run inside scripts/sandbox)")
    with open("/proc/self/mountinfo") as f:
        if not any(line.split(" ")[4] == "/etc/resolv.conf" for line in f):
            sys.exit("bench: /etc/resolv.conf is the machine's here (a guest's DHCP hook would "
                     "write it): run it in scripts/sandbox, which mounts a copy over it")
    started = time.monotonic()
    commit = linnet_commit()
    narrowed = bool(args.only or args.mtu or args.no_control or args.no_fabric or args.no_names
                    or args.no_gate or args.no_secrets or args.no_operations or args.runs < 3)
    # A narrowed run soaks only when asked to.
    soak_minutes = args.soak if args.soak is not None else 0 if narrowed else soak.MINUTES
    whole = not narrowed and soak_minutes >= soak.MINUTES
    out = args.out or (RESULTS if whole else PARTIAL)
    results = {
        "format": docs.FORMAT,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(commit),
        "settings": {"seconds": args.seconds, "runs": args.runs, "only": args.only, "mtu": args.mtu,
                     "soak_minutes": soak_minutes},
        "throughput": [], "not_run": [], "control": None, "fabric": None, "names": None,
        "gate": None, "secrets": None, "operations": None, "soak": None,
    }
    with tempfile.TemporaryDirectory(prefix="linnet-bench.") as workdir:
        env = Env(workdir, args.bin, find_gvproxy(args.gvproxy), commit)
        if args.profile:
            try:
                env.start_linnet()
                env.lasting.start("iperf3-server-host", ["iperf3", "--server"])
                return profile.run(env, args.profile, args.mtu or 1500, args.direction)
            finally:
                env.close()
        try:
            env.start_linnet()
            if not args.no_control:
                log("control plane")
                try:
                    results["control"] = control_plane(env, args, workdir)
                    log(f"  {json.dumps(results['control'])}")
                except Exception as e:  # noqa: BLE001 - the throughput figures still count
                    results["control_error"] = f"{type(e).__name__}: {e}"
                    log(f"  the control-plane figures failed: {results['control_error']}")
            env.lasting.start("iperf3-server-host", ["iperf3", "--server"])
            throughput(env, args, results)
            if not args.no_names and args.mtu in (None, 1500) and (
                    not args.only or re.search(args.only, names.SETUP)):
                log("egress by name")
                try:
                    results["names"] = names.measure_all(env, args.seconds, args.runs, log)
                    log(f"  {json.dumps({k: v for k, v in results['names'].items() if 'throughput' not in k})}")
                except BenchError as e:
                    results["names"] = {"error": str(e)}
                    log(f"  the egress-by-name figures failed: {e}")
            if not args.no_gate and args.mtu in (None, 1500) and (
                    not args.only or re.search(args.only, gate.SETUP)):
                log("the name check")
                try:
                    results["gate"] = gate.measure_all(env, args.seconds, args.runs, log)
                except BenchError as e:
                    results["gate"] = {"error": str(e)}
                    log(f"  the name check's figures failed: {e}")
            if not args.no_secrets and args.mtu in (None, 1500) and (
                    not args.only or re.search(args.only, secrets.SETUP)):
                log("the secrets proxy")
                try:
                    results["secrets"] = secrets.measure_all(env, args.seconds, args.runs, log)
                except BenchError as e:
                    results["secrets"] = {"error": str(e)}
                    log(f"  the secrets proxy's figures failed: {e}")
            if not args.no_operations and args.mtu in (None, 1500) and (
                    not args.only or re.search(args.only, operations.SETUP)):
                log("operations")
                try:
                    results["operations"] = operations.measure_all(env, args.seconds, args.runs, log)
                except BenchError as e:
                    results["operations"] = {"error": str(e)}
                    log(f"  the operations figures failed: {e}")
            if not args.no_fabric and args.mtu is None and (
                    not args.only or re.search(args.only, fabric.SETUP)):
                log("across hosts")
                results["fabric"] = fabric.measure_all(env, args.seconds, args.runs, args.moves, log)
                results["machine"]["tools"]["frr"] = fabric.version()
            if soak_minutes > 0:
                log("soak")
                try:
                    results["soak"] = soak.measure(env, soak_minutes, log)
                except Exception as e:  # noqa: BLE001 - after a long soak, the other figures still count
                    results["soak"] = {"error": describe(e)}
                    log(f"  the soak failed: {results['soak']['error']}")
        finally:
            env.close()
        left = env.leftovers()
        if left:
            log(f"bench: left behind: {', '.join(left)}")
    # Every rootless daemon's cold start: the control plane's, and each
    # round's of the rootless setup.
    if results["control"] and results["control"].get("rootless"):
        results["control"]["rootless"]["cold_starts_ms"] = env.rootless_cold_starts
    peaks = [r["relay_peak_rss_mib"] for r in results["throughput"] if "relay_peak_rss_mib" in r]
    if results["control"] and peaks:
        results["control"]["relay_peak_rss_mib"] = max(peaks)
    results["duration_s"] = round(time.monotonic() - started, 1)
    results["targets"] = report.targets(results)
    print(write(results, out))
    log(f"bench: the run took {results['duration_s']:.0f} s")
    if os.path.abspath(out) == os.path.abspath(RESULTS):
        if whole:
            docs.update(".", results)  # the docs' figures follow the committed results
            log("bench: rewrote the benchmark blocks in " + ", ".join(docs.DOCS))
        else:
            log("bench: a narrowed run: the docs' benchmark blocks were left as they are")
    problems = [f"{r['setup']} at MTU {r['mtu']} failed" for r in results["throughput"] if r.get("error")]
    problems += [f"{r['setup']} at MTU {r['mtu']}, {report.LABEL[d]}: {x['failed_runs'][0]}"
                 for r in results["throughput"] for d, x in r.get("directions", {}).items()
                 if x["failed_runs"]]
    if results.get("control_error"):
        problems.append("the control-plane figures failed")
    if (results.get("names") or {}).get("error"):
        problems.append(f"the egress-by-name figures failed: {results['names']['error']}")
    if (results.get("gate") or {}).get("error"):
        problems.append(f"the name check's figures failed: {results['gate']['error']}")
    if (results.get("secrets") or {}).get("error"):
        problems.append(f"the secrets proxy's figures failed: {results['secrets']['error']}")
    if (results.get("operations") or {}).get("error"):
        problems.append(f"the operations figures failed: {results['operations']['error']}")
    s = results.get("soak") or {}
    if s.get("error"):
        problems.append(f"the soak failed: {s['error']}")
    elif s.get("failures", {}).get("count"):
        problems.append(f"the soak had {s['failures']['count']} failures, the first: "
                        f"{s['failures']['messages'][0]}")
    f = results.get("fabric") or {}
    if f.get("error") or f.get("timings_error"):
        problems.append(f"the figures across hosts failed: {f.get('error') or f.get('timings_error')}")
    if left:
        problems.append(f"left behind: {', '.join(left)}")
    # A family whose figures failed fails the run, strict or not: its
    # targets are missing, not met.
    failed = [t for t in results["targets"] if t["target"] == "the figures" and t["status"] == "missed"]
    if failed:
        sys.exit("bench: " + "; ".join(f"{t['family']}: {t['detail']}" for t in failed))
    if args.strict and problems:
        sys.exit("bench: " + "; ".join(problems))


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        sys.exit(f"bench: {e}")
