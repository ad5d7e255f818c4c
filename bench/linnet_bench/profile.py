"""Where one setup's time goes: `bench/run --profile SETUP --mtu M
--direction D` brings the setup up, runs iperf3 through it and samples the
whole machine with perf (software clock: this machine has no hardware
counters), then prints the CPU by process and the hottest kernel and user
functions of each. The benchmark's explanations of a missed target come
from here; the profile itself is written to target/bench/perf.data for
`perf report`."""
import json
import os
import subprocess
import time

from .host import BenchError
from .setups import HOST_TO_VM, VM_TO_VM, all_setups, deepen_guest_queues
from .throughput import endpoints


def report(data, *args):
    r = subprocess.run(["perf", "report", "-i", data, "--stdio", "-g", "none", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [line for line in r.stdout.splitlines() if line.strip() and not line.startswith("#")]


def run(env, name, mtu, direction, seconds=6, out="target/bench/perf.data"):
    setup = next((s for s in all_setups() if s.name == name), None)
    if setup is None:
        raise BenchError(f"no setup named {name!r}; `bench/run --help` and bench/README.md list them")
    if direction == VM_TO_VM and not setup.vm_to_vm:
        raise BenchError(f"{name} has no VM→VM: {setup.why_no_vm_to_vm}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    try:
        topo = setup.up(env, mtu)
        if setup.emulated_vm_tap:
            deepen_guest_queues(topo)
        client, target = endpoints(topo, direction)
        if direction == VM_TO_VM:
            env.procs.start("iperf3-server-guest", ["iperf3", "--server"], ns=topo.guests[1][0])
            time.sleep(0.5)
        cmd = ["ip", "netns", "exec", client, "iperf3", "--client", target, "--time", str(seconds), "--json"]
        iperf = subprocess.Popen(cmd + (["--reverse"] if direction == HOST_TO_VM else []),
                                 stdout=subprocess.PIPE, text=True)
        time.sleep(1)  # past the connection's start
        subprocess.run(["perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", "1999", "-o", out,
                        "--", "sleep", str(seconds - 2)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True)
        received = json.loads(iperf.communicate()[0])["end"]["sum_received"]
    finally:
        env.teardown()
    print(f"{name} at MTU {mtu}, {direction}: {received['bits_per_second'] / 1e9:.2f} Gbit/s "
          f"while sampled; {out}")
    print("\nCPU by process and where (kernel or user):")
    print("\n".join(report(out, "--no-children", "--sort", "comm,dso")[:12]))
    for comm in dict.fromkeys(line.split()[1] for line in report(out, "--no-children", "--sort", "comm")[:4]):
        print(f"\n{comm}: the functions it spends in, callees included:")
        print("\n".join(report(out, "--children", "--comm", comm, "--sort", "sym")[:15]))
