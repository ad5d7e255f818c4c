"""The benchmark's results: targets as ratios measured in the same run, a
markdown report, JSON, and an SVG chart of throughput."""
from xml.sax.saxutils import escape

from .setups import DIRECTIONS, HOST_TO_VM, VM_TO_HOST, VM_TO_VM

LABEL = {VM_TO_HOST: "VM→host", HOST_TO_VM: "host→VM", VM_TO_VM: "VM→VM"}
COLOR = {VM_TO_HOST: "#3b75af", HOST_TO_VM: "#ef8636", VM_TO_VM: "#529e3e"}


def find(results, setup, mtu):
    for r in results["throughput"]:
        if r["setup"] == setup and r["mtu"] == mtu and not r.get("error"):
            return r
    return None


def gbps(results, setup, mtu, direction):
    r = find(results, setup, mtu)
    d = r and r["directions"].get(direction)
    return d and d["gbps"]


def ratio_target(results, name, ours, theirs, mtu, direction, goal):
    a, b = gbps(results, ours, mtu, direction), gbps(results, theirs, mtu, direction)
    measured = round(a / b, 2) if a and b else None
    return {"target": name, "mtu": mtu, "direction": direction, "goal": f">= {goal}x",
            "measured": measured, "detail": f"{a} / {b} Gbit/s" if measured else "not measured",
            "met": measured is not None and measured >= goal}


def bound_target(name, value, limit, unit):
    return {"target": name, "goal": f"<= {limit} {unit}", "measured": value,
            "detail": f"{value} {unit}" if value is not None else "not measured",
            "met": value is not None and value <= limit}


def targets(results):
    out = []
    for mtu in (1500, 65520):
        for d in DIRECTIONS:
            out.append(ratio_target(results, "linnet tap vs tap relay", "linnet tap",
                                    "tap relay (no linnet)", mtu, d, 0.95))
    # What anti-spoofing (on by default) costs: at most 5% slower.
    for mtu in (1500, 65520):
        for d in DIRECTIONS:
            out.append(ratio_target(results, "anti-spoofing on vs off (tap)", "linnet tap",
                                    "linnet tap, no anti-spoofing", mtu, d, 0.95))
            out.append(ratio_target(results, "anti-spoofing + policy vs off (tap)",
                                    "linnet tap, anti-spoofing + policy",
                                    "linnet tap, no anti-spoofing", mtu, d, 0.95))
    for ours, goal in (("linnet dgram", 3), ("linnet stream", 3),
                       ("linnet dgram + vnet", 4), ("linnet stream + vnet", 4)):
        for peer in ("passt (stream)", "slirp4netns"):
            for d in (VM_TO_HOST, HOST_TO_VM):
                out.append(ratio_target(results, f"{ours} vs {peer}", ours, peer, 1500, d, goal))
    c = results.get("control") or {}
    lat = c.get("latency") or {}
    sc = c.get("scale") or {}
    get = lambda d, *keys: next((d[k] for k in keys if k in d), None)
    out.append(bound_target("attach p50", get(lat.get("attach_ms", {}), "p50"), 5, "ms"))
    out.append(bound_target("attach p99", get(lat.get("attach_ms", {}), "p99"), 20, "ms"))
    out.append(bound_target("attach 1000 interfaces", get(sc.get("attach_s", {}), 1000, "1000"), 5, "s"))
    out.append(bound_target("daemon RSS at 1000 interfaces",
                            get(sc.get("daemon_rss_mib", {}), 1000, "1000"), 32, "MiB"))
    out.append(bound_target("helper RSS", get(c.get("helper") or {}, "rss_mib"), 4, "MiB"))
    return out


def fmt(v, digits=2):
    return "—" if v is None else f"{v:.{digits}f}"


def markdown(results):
    m, s = results["machine"], results["settings"]
    lines = [
        "# linnet benchmark",
        "",
        f"{results['date']} · linnet {m['linnet_commit']} · {m['cores']} cores ({m['cpu']}) · "
        f"kernel {m['kernel']} · {s['runs']} runs of {s['seconds']} s each, medians · "
        f"{results['duration_s']:.0f} s in all",
        "",
        "Reproduce: `make bench` (as root; see bench/README.md).",
        "",
        "## Throughput, Gbit/s",
        "",
        "One iperf3 TCP stream, guest namespace ↔ host (or a second guest) through each setup.",
        "",
        "| setup | MTU | VM→host | host→VM | VM→VM |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results["throughput"]:
        cells = [fmt(r["directions"].get(d, {}).get("gbps")) if not r.get("error") else "failed"
                 for d in DIRECTIONS]
        lines.append(f"| {r['setup']} | {r['mtu']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## CPU seconds per GB moved",
        "",
        "Each cell: networking processes (linnet daemon and relay, passt, slirp4netns, vde) · "
        "the stand-in VMM · the whole machine (iperf3 and the kernel included). "
        "Kernel-only setups have no networking process.",
        "",
        "| setup | MTU | VM→host | host→VM | VM→VM |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results["throughput"]:
        if r.get("error"):
            continue
        cells = []
        for d in DIRECTIONS:
            x = r["directions"].get(d)
            cells.append("—" if not x else
                         f"{x['net_cpu_s_per_gb']:.2f} · {x['standin_cpu_s_per_gb']:.2f} · {x['all_cpu_s_per_gb']:.2f}")
        lines.append(f"| {r['setup']} | {r['mtu']} | " + " | ".join(cells) + " |")
    notes = [f"- {r['setup']} at MTU {r['mtu']}: {r['error']}" for r in results["throughput"] if r.get("error")]
    notes += [f"- {n['setup']}" + (f" at MTU {n['mtu']}" if n.get("mtu") else "")
              + (f", {LABEL[n['direction']]}" if n.get("direction") else "") + f": {n['why']}"
              for n in results["not_run"]]
    if notes:
        lines += ["", "Not measured:", ""] + notes
    if results.get("control_error"):
        lines += ["", f"The control-plane figures failed: {results['control_error']}"]
    c = results.get("control")
    if c:
        lat, sc, h = c["latency"], c["scale"], c["helper"]
        lines += [
            "",
            "## Control plane",
            "",
            "| figure | value |",
            "|---|---:|",
            f"| attach p50 / p99 ({lat['count']} attaches) | {lat['attach_ms']['p50']} / {lat['attach_ms']['p99']} ms |",
            f"| detach p50 / p99 | {lat['detach_ms']['p50']} / {lat['detach_ms']['p99']} ms |",
        ]
        for n, t in sc["attach_s"].items():
            lines.append(f"| attach {n} interfaces on one network | {t} s |")
        if "list_all_s" in sc:
            lines.append(f"| list them all (`list`, on their connection) | {sc['list_all_s']} s |")
        lines.append(f"| detach them all (client disconnects) | {sc['detach_all_s']} s |")
        lines.append(f"| daemon RSS at 0 interfaces | {c['daemon_rss_mib_idle']} MiB |")
        for n, rss in sc["daemon_rss_mib"].items():
            lines.append(f"| daemon RSS at {n} interfaces | {rss} MiB |")
        if "daemon_peak_rss_mib" in sc:
            lines.append(f"| daemon RSS after detaching them all / its peak | "
                         f"{sc['daemon_rss_mib_after_detach']} / {sc['daemon_peak_rss_mib']} MiB |")
        lines.append(f"| helper RSS (`linnet helper --socket`, attached, idle) | {h['rss_mib']} MiB |")
        lines.append(f"| helper PSS / private (its own share; code and libc are shared) | "
                     f"{h['pss_mib']} / {h['private_mib']} MiB |")
        if c.get("relay_peak_rss_mib") is not None:
            lines.append(f"| `linnet run` relay peak RSS under iperf3 | {c['relay_peak_rss_mib']} MiB |")
    lines += ["", "## Targets", "", "| target | MTU | direction | goal | measured | |", "|---|---:|---|---|---|---|"]
    for t in results["targets"]:
        measured = "—" if t["measured"] is None else (
            f"{t['measured']}x ({t['detail']})" if "x" in t["goal"] else t["detail"])
        lines.append(f"| {t['target']} | {t.get('mtu', '')} | {LABEL.get(t.get('direction'), '')} | "
                     f"{t['goal']} | {measured} | {'met' if t['met'] else '**missed**'} |")
    lines += ["", "![throughput per setup](latest.svg)", ""]
    return "\n".join(lines)


def svg(results):
    rows = [r for r in results["throughput"] if not r.get("error")]
    top = max([d["gbps"] for r in rows for d in r["directions"].values()] + [1])
    bar, gap, label_w, width = 9, 12, 230, 960
    plot_w = width - label_w - 70
    height = 60 + len(rows) * (3 * bar + gap) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="15">TCP throughput, Gbit/s (one iperf3 stream, '
           f'median of {results["settings"]["runs"]})</text>']
    for i, d in enumerate(DIRECTIONS):
        x = label_w + i * 110
        out.append(f'<rect x="{x}" y="32" width="12" height="12" fill="{COLOR[d]}"/>'
                   f'<text x="{x + 16}" y="42">{LABEL[d]}</text>')
    y = 60
    for r in rows:
        out.append(f'<text x="{label_w - 8}" y="{y + 1.5 * bar + 4}" text-anchor="end">'
                   f'{escape(r["setup"])} · {r["mtu"]}</text>')
        for k, d in enumerate(DIRECTIONS):
            x = r["directions"].get(d)
            if x:
                w = max(1, x["gbps"] / top * plot_w)
                out.append(f'<rect x="{label_w}" y="{y + k * bar}" width="{w:.1f}" height="{bar - 1}" '
                           f'fill="{COLOR[d]}"/><text x="{label_w + w + 4:.1f}" y="{y + k * bar + 8}" '
                           f'font-size="9">{x["gbps"]:.2f}</text>')
        y += 3 * bar + gap
    m = results["machine"]
    out.append(f'<text x="10" y="{height - 10}" font-size="10" fill="#555">{escape(results["date"])} · '
               f'linnet {escape(m["linnet_commit"])} · {m["cores"]} cores · kernel {escape(m["kernel"])} · '
               f'bench/results/latest.md has CPU per GB and the control plane</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
