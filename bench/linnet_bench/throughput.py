"""One iperf3 TCP stream through a running setup, with the CPU the
networking processes, the stand-in and the whole machine spent on it."""
import json
import statistics
import subprocess
import time

from .host import BenchError, cpu_seconds, machine_busy_seconds
from .setups import HOST_TO_VM, VM_TO_VM


def check_path(topo, direction):
    client, target = endpoints(topo, direction)
    r = subprocess.run(["ip", "netns", "exec", client, "busybox", "ping", "-c", "1", "-W", "3", target],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise BenchError(f"{client} cannot ping {target}, the setup is broken: {r.stdout.strip()}")


def endpoints(topo, direction):
    client = topo.guests[0][0]
    target = topo.guests[1][1] if direction == VM_TO_VM else topo.server
    return client, target


def cpu(pids):
    return sum(cpu_seconds(p) for p in pids)


def iperf3(client, target, seconds, reverse):
    cmd = ["ip", "netns", "exec", client, "iperf3", "--client", target, "--time", str(seconds), "--json"]
    if reverse:
        cmd.append("--reverse")
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
        return data["end"]["sum_received"]
    raise BenchError("unreachable")


def measure(topo, direction, seconds):
    """One run: Gbit/s and CPU seconds per GB moved."""
    client, target = endpoints(topo, direction)
    net0, standin0, all0 = cpu(topo.net_pids), cpu(topo.standin_pids), machine_busy_seconds()
    received = iperf3(client, target, seconds, direction == HOST_TO_VM)
    net1, standin1, all1 = cpu(topo.net_pids), cpu(topo.standin_pids), machine_busy_seconds()
    gigabytes = received["bytes"] / 1e9
    return {
        "gbps": received["bytes"] * 8 / received["seconds"] / 1e9,
        "bytes": received["bytes"],
        # Processes' CPU counts from the start of iperf3's connection setup,
        # so it slightly overstates the cost per GB; equally for every setup.
        "net_cpu_s_per_gb": (net1 - net0) / gigabytes,
        "standin_cpu_s_per_gb": (standin1 - standin0) / gigabytes,
        "all_cpu_s_per_gb": (all1 - all0) / gigabytes,
    }


def summarize(runs):
    """Medians over runs, and the runs themselves."""
    keys = ("gbps", "net_cpu_s_per_gb", "standin_cpu_s_per_gb", "all_cpu_s_per_gb")
    out = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    out["runs_gbps"] = [round(r["gbps"], 3) for r in runs]
    return out
