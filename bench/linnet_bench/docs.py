"""The benchmark's figures in the docs, never typed by hand: a block
between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` in a doc is
rendered from bench/results/latest.json. `bench/run` rewrites the blocks
after a run that writes bench/results; `make lint` runs

    python3 -m linnet_bench.docs --check

which fails when a block differs from what the committed results render
(a hand-edited figure, or results committed without their docs)."""
import argparse
import json
import os
import re
import statistics
import sys

from .report import (ANTI_SPOOFING, FABRIC, GATE, LABEL, MTUS, POLICY, ROOTLESS_UPSTREAM, ROOTLESS_VM_TO_VM,
                     NAMES, OPERATIONS, SECRETS, SOAK, STATUS, cell, clone_rows, fabric_rows, gate_rows,
                     is_ratio, names_rows, operations_rows, secrets_rows, soak_rows, target_counts)
from .setups import DIRECTIONS, NETWORK_SOCKET, ROOTLESS, VHOST_USER, VM_TO_HOST, VM_TO_VM

# The results' layout this module reads (bench/linnet_bench/__main__.py).
FORMAT = 2

DOCS = ("README.md", "docs/security.md", "docs/vmms.md", "docs/lima.md", "docs/rootless.md",
        "docs/clones.md", "docs/multihost.md", "docs/operations.md", "docs/architecture.md",
        "docs/secrets.md")
BLOCK = re.compile(r"(<!-- bench:([a-z-]+) -->\n)(.*?)(<!-- /bench:\2 -->)", re.S)


def source(results):
    m = results["machine"]
    return (f"From [the benchmark's results](bench/results/latest.md) "
            f"(linnet {m['linnet_commit']}, {results['date']}, {results['settings']['runs']} "
            f"rounds of {results['settings']['seconds']} s runs, {results['duration_s'] / 60:.0f} "
            f"minutes in all).")


def ratio(t):
    if t is None:
        return "—"
    if t["status"] == "missed" and t["measured"] is None:
        return "unstable (missed)"
    if t["status"] in ("met", "missed"):
        noise = f", rounds {t['rounds'][0]}–{t['rounds'][1]}x" if t.get("noise") else ""
        return f"{t['measured']}x" + ("" if t["status"] == "met" else " (missed)") + noise
    return STATUS[t["status"]]


def find_target(results, target, mtu, direction):
    return next((t for t in results["targets"] if t["target"] == target and t.get("mtu") == mtu
                 and t.get("direction") == direction), None)


def by_mtu_and_direction(columns, cells):
    """A table with a row per MTU and direction: `cells(mtu, d)` gives the
    row's cells under `columns`."""
    lines = ["| MTU | direction | " + " | ".join(columns) + " |",
             "|---:|---|" + "---:|" * len(columns)]
    for mtu in MTUS:
        for d in DIRECTIONS:
            lines.append(f"| {mtu} | {LABEL[d]} | " + " | ".join(cells(mtu, d)) + " |")
    return lines


def anti_spoofing(results):
    return by_mtu_and_direction(
        ("anti-spoofing on / off", "anti-spoofing + policy / off"),
        lambda mtu, d: [ratio(find_target(results, target, mtu, d)) for target in (ANTI_SPOOFING, POLICY)])


def gain(results, with_header, without, mtu, d):
    a, b = cell(results, with_header, mtu, d), cell(results, without, mtu, d)
    if not (a and b and a.get("gbps") and b.get("gbps")):
        return "—"
    if a.get("unstable") or b.get("unstable"):
        return "unstable"
    return f"{a['gbps'] / b['gbps']:.1f}x ({a['gbps']:.1f} vs {b['gbps']:.1f} Gbit/s)"


def vnet_hdr(results):
    return by_mtu_and_direction(
        ("dgram: with the header / without", "stream: with / without"),
        lambda mtu, d: [gain(results, f"linnet {dp} + vnet", f"linnet {dp}", mtu, d)
                        for dp in ("dgram", "stream")])


def vhost_user(results):
    """vhost-user against the TAP datapath, the stream datapath with the
    header and passt's stream socket, in Gbit/s; then linnet's own CPU per
    GB moved (its relay, or `linnet run`, and the daemon)."""
    speeds = (VHOST_USER, "linnet tap", "linnet stream + vnet", "passt (stream)")
    cpus = (VHOST_USER, "linnet stream + vnet")

    def cells(mtu, d):
        out = []
        for setup in speeds:
            c = cell(results, setup, mtu, d)
            out.append(f"{c['gbps']:.1f}" if c and c.get("gbps") else "—")
        for setup in cpus:
            c = cell(results, setup, mtu, d)
            cpu = c and c.get("net_cpu_s_per_gb")
            out.append(f"{cpu:.2f}" if cpu is not None and c.get("gbps") else "—")
        return out

    return by_mtu_and_direction(
        ("vhost-user", "tap", "stream + vnet", "passt (stream)",
         "CPU s/GB: vhost-user", "stream + vnet"), cells)


def network_socket(results):
    target = f"{NETWORK_SOCKET} vs linnet stream"

    def cells(mtu, d):
        speed = [cell(results, setup, mtu, d) for setup in (NETWORK_SOCKET, "linnet stream")]
        shown = [f"{c['gbps']:.1f}" if c and c.get("gbps") else "—" for c in speed]
        return shown + [ratio(find_target(results, target, mtu, d))]

    return by_mtu_and_direction(
        ("network socket, Gbit/s", "`linnet stream`, Gbit/s", "ratio (goal >= 0.95x)"), cells)


def rootless(results):
    """Rootless against root's daemon and the user-mode stacks, in Gbit/s,
    then its targets and control-plane figures."""
    setups = (ROOTLESS, "linnet tap", "pasta", "slirp4netns", "passt (stream)")

    def speed(setup, mtu, d):
        c = cell(results, setup, mtu, d)
        return f"{c['gbps']:.2f}" if c and c.get("gbps") else "—"
    lines = by_mtu_and_direction(
        ("rootless", "root (`linnet tap`)", "pasta", "slirp4netns", "passt"),
        lambda mtu, d: [speed(s, mtu, d) for s in setups])
    lines += ["", "| MTU | VM→VM: rootless / root (goal >= 0.9x) | "
              "VM→host through pasta: rootless / pasta alone (goal >= 1x) |", "|---:|---:|---:|"]
    for mtu in MTUS:
        lines.append(f"| {mtu} | {ratio(find_target(results, ROOTLESS_VM_TO_VM, mtu, VM_TO_VM))} | "
                     f"{ratio(find_target(results, ROOTLESS_UPSTREAM, mtu, VM_TO_HOST))} |")
    r = (results.get("control") or {}).get("rootless")
    if r:
        starts = r.get("cold_starts_ms") or [r["cold_start_ms"]]
        median = lambda key: round(statistics.median(x[key] for x in starts), 1)
        lines += ["", f"Attach p50 on a rootless daemon, as its user: "
                  f"{r['latency']['attach_ms']['p50']} ms (goal <= 5 ms). Cold start: "
                  f"{median('socket')} ms until its namespaces, pasta and socket are there, "
                  f"{median('first_attach')} ms until the first network is up and attached "
                  f"(median of {len(starts)} starts)."]
    return lines


def clones(results):
    """The clone figures and their targets."""
    c = (results.get("control") or {}).get("clones")
    if not c:
        return ["The clone figures were not measured in this run."]
    lines = ["| figure | value |", "|---|---:|"] + clone_rows(c)
    found = [t for t in results["targets"] if t["family"] == "control plane"
             and (t["target"].startswith("clone ") or "clones vs" in t["target"])]
    lines += [""] + [f"- {t['target']} (goal {t['goal']}): {t['detail']}, {STATUS[t['status']]}."
                     for t in found]
    return lines


def rows_and_targets(rows, results, family, mtu_label):
    """A family's figures (`rows`), then its targets as a list."""
    found = [t for t in results["targets"] if t["family"] == family]
    lines = rows + ([""] if found else [])
    for t in found:
        where = f" at {mtu_label} {t['mtu']}" if mtu_label and t.get("mtu") else ""
        lines.append(f"- {t['target']}{where} (goal {t['goal']}): {t['detail']}, {STATUS[t['status']]}.")
    return lines


def across_hosts(results):
    """The figures across hosts and their targets."""
    return rows_and_targets(fabric_rows(results.get("fabric")), results, FABRIC, "inner MTU")


def egress_by_name(results):
    """The egress-by-name figures and their targets."""
    return rows_and_targets(names_rows(results.get("names")), results, NAMES, None)


def name_check(results):
    """The name check's figures (linnet-gate) and their targets."""
    return rows_and_targets(gate_rows(results.get("gate")), results, GATE, None)


def secrets(results):
    """The secrets proxy's figures (linnet-secrets) and their targets."""
    return rows_and_targets(secrets_rows(results.get("secrets")), results, SECRETS, None)


def operations(results):
    """The operations figures and their targets."""
    return rows_and_targets(operations_rows(results.get("operations")), results, OPERATIONS, None)


def soak(results):
    """The soak's start and end figures and their targets."""
    return rows_and_targets(soak_rows(results.get("soak")), results, SOAK, None)


def targets(results):
    lines = [f"Targets: {target_counts(results)}. Missed:", ""]
    for t in results["targets"]:
        if t["status"] == "missed":
            where = f" at MTU {t['mtu']}" if t.get("mtu") else ""
            where += f", {LABEL[t['direction']]}" if t.get("direction") else ""
            measured = f"{t['measured']}x" if is_ratio(t) and t["measured"] is not None else t["detail"]
            lines.append(f"- {t['target']}{where}: {measured} (goal {t['goal']})")
    return lines


RENDER = {"anti-spoofing": anti_spoofing, "vnet-hdr": vnet_hdr, "vhost-user": vhost_user,
          "targets": targets,
          "network-socket": network_socket, "rootless": rootless, "clones": clones,
          "across-hosts": across_hosts, "egress-by-name": egress_by_name, "name-check": name_check,
          "secrets": secrets, "operations": operations,
          "soak": soak}


def render(name, results, doc):
    """The block's text; links are made relative to the doc's folder."""
    text = "\n".join(RENDER[name](results) + ["", source(results)]) + "\n"
    up = "../" * doc.count("/")
    return text.replace("](bench/", f"]({up}bench/")


def update(root, results, check=False):
    """Rewrites (or with `check`, compares) every block in DOCS; returns
    the blocks that differ, as "doc: name"."""
    stale = []
    for doc in DOCS:
        path = os.path.join(root, doc)
        with open(path) as f:
            text = f.read()

        def fill(m):
            name = m.group(2)
            if name not in RENDER:
                raise SystemExit(f"{doc}: unknown bench block {name!r} (known: {', '.join(RENDER)})")
            new = render(name, results, doc)
            if new != m.group(3):
                stale.append(f"{doc}: {name}")
            return m.group(1) + new + m.group(4)
        new_text = BLOCK.sub(fill, text)
        if not check and new_text != text:
            with open(path, "w") as f:
                f.write(new_text)
    return stale


def main():
    p = argparse.ArgumentParser(prog="python3 -m linnet_bench.docs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only compare; exit 1 if a block differs")
    p.add_argument("--results", default="bench/results/latest.json")
    args = p.parse_args()
    with open(args.results) as f:
        results = json.load(f)
    if results.get("format") != FORMAT:
        sys.exit(f"docs: {args.results} is in format {results.get('format', 1)}, this reads {FORMAT}: "
                 "run the benchmark (make bench) to write results in the current one")
    stale = update(".", results, check=args.check)
    if stale and args.check:
        sys.exit("docs: these blocks differ from what bench/results/latest.json renders "
                 "(run `PYTHONPATH=bench python3 -m linnet_bench.docs` after a benchmark run): "
                 + ", ".join(stale))


if __name__ == "__main__":
    main()
