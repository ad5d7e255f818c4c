"""One iperf3 TCP stream (or the setup's few, in parallel) through a
running setup, with the CPU the networking processes, the stand-in and the
whole machine spent on it."""
import json
import statistics
import subprocess
import time

from .host import BenchError, cpu_seconds, machine_busy_seconds
from .setups import HOST_TO_VM, VM_TO_VM


# Connects to iperf3's port (what every setup carries, a policed network's
# listen rule among them; a policed VM answers no neighbour's ping) for up
# to 3 s, the server perhaps still starting.
CONNECT = r"""
import socket, sys, time
deadline = time.monotonic() + 3
while True:
    try:
        socket.create_connection((sys.argv[1], 5201), timeout=1).close()
        break
    except OSError as e:
        if time.monotonic() > deadline:
            sys.exit(f"no TCP connection to {sys.argv[1]}:5201: {e}")
        time.sleep(0.1)
"""


def check_path(topo, direction):
    client, target = endpoints(topo, direction)
    r = subprocess.run(["ip", "netns", "exec", client, "python3", "-c", CONNECT, target],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise BenchError(f"{client} cannot reach {target}, the setup is broken: {r.stdout.strip()}")


def endpoints(topo, direction):
    client = topo.guests[0][0]
    target = topo.guests[1][1] if direction == VM_TO_VM else topo.server
    return client, target


def cpu(pids):
    return sum(cpu_seconds(p) for p in pids)


def iperf3(client, target, seconds, reverse, streams=1):
    cmd = ["ip", "netns", "exec", client, "iperf3", "--client", target, "--time", str(seconds), "--json"]
    if reverse:
        cmd.append("--reverse")
    if streams > 1:
        cmd += ["--parallel", str(streams)]
    for attempt in range(5):
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=seconds + 20)
        except subprocess.TimeoutExpired:
            raise BenchError(f"iperf3 from {client} to {target} hung for {seconds + 20} s")
        try:
            data = json.loads(r.stdout)
        except ValueError:
            raise BenchError(f"iperf3 from {client} to {target} printed no JSON: {r.stderr.strip()}")
        error = data.get("error")
        if error and "connect" in error and attempt < 4:
            time.sleep(0.3)  # the server is still starting
            continue
        if error:
            raise BenchError(f"iperf3 from {client} to {target}: {error}")
        try:
            received, sent = data["end"]["sum_received"], data["end"]["sum_sent"]
        except (KeyError, TypeError):
            raise BenchError(f"iperf3 from {client} to {target} gave no totals: {r.stdout[-200:]!r}")
        if not received.get("bytes") or not received.get("seconds"):
            raise BenchError(f"iperf3 from {client} to {target} moved nothing")
        # The sender's TCP retransmits (iperf3 reports the server's when it
        # sends, with --reverse): frames the path lost or delivered too late.
        return received, sent.get("retransmits")
    raise BenchError("unreachable")


def measure(topo, direction, seconds):
    """One run: Gbit/s and CPU seconds per GB moved."""
    client, target = endpoints(topo, direction)
    net0, standin0, all0 = cpu(topo.net_pids), cpu(topo.standin_pids), machine_busy_seconds()
    received, retransmits = iperf3(client, target, seconds, direction == HOST_TO_VM, topo.streams)
    net1, standin1, all1 = cpu(topo.net_pids), cpu(topo.standin_pids), machine_busy_seconds()
    gigabytes = received["bytes"] / 1e9
    return {
        "gbps": received["bytes"] * 8 / received["seconds"] / 1e9,
        "bytes": received["bytes"],
        "retransmits": retransmits,
        # Processes' CPU counts from the start of iperf3's connection setup,
        # so it slightly overstates the cost per GB; equally for every setup.
        "net_cpu_s_per_gb": (net1 - net0) / gigabytes,
        "standin_cpu_s_per_gb": (standin1 - standin0) / gigabytes,
        "all_cpu_s_per_gb": (all1 - all0) / gigabytes,
    }


# A cell whose fastest round is more than this many times its slowest is
# not a measurement of the setup but of something that went wrong in it
# (losses, stalls): it is marked unstable and no target is judged on it.
UNSTABLE_SPREAD = 2.0


def summarize(runs, failures=()):
    """Medians over the runs that finished, every run (with its round, so
    that two setups compare round by round), their spread, and the runs
    that failed or were not run. A cell with a failed run or a spread above
    UNSTABLE_SPREAD is unstable."""
    out = {"runs_gbps": [round(r["gbps"], 3) for r in runs],
           "runs_round": [r.get("round") for r in runs],
           "runs_retransmits": [r["retransmits"] for r in runs],
           "failed_runs": list(failures)}
    if runs:
        for k in ("gbps", "net_cpu_s_per_gb", "standin_cpu_s_per_gb", "all_cpu_s_per_gb"):
            out[k] = round(statistics.median(r[k] for r in runs), 3)
        retransmits = [r["retransmits"] for r in runs if r["retransmits"] is not None]
        out["retransmits"] = round(statistics.median(retransmits)) if retransmits else None
        slowest = min(r["gbps"] for r in runs)  # above 0: iperf3() refuses a run that moved nothing
        out["spread"] = round(max(r["gbps"] for r in runs) / slowest, 2)
    else:
        out["gbps"] = out["retransmits"] = out["spread"] = None
    reasons = []
    if failures:
        reasons.append(f"{len(failures)} of {len(runs) + len(failures)} runs failed or were not run")
    if out["spread"] is not None and out["spread"] > UNSTABLE_SPREAD:
        reasons.append(f"its runs spread {out['spread']}x "
                       f"({min(out['runs_gbps'])}–{max(out['runs_gbps'])} Gbit/s)")
    out["unstable"] = "; ".join(reasons) or None
    return out
