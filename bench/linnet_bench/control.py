"""Control-plane figures, through linnet's raw API (docs/api.md): JSON over
SOCK_SEQPACKET, each TAP fd arriving as SCM_RIGHTS. Measuring the daemon,
not a CLI's start-up."""
import array
import json
import os
import resource
import select
import socket
import statistics
import subprocess
import threading
import time
import uuid

from .host import BenchError, children, memory_kib, wait_for

# How long the daemon may take, once every interface is gone, to give
# their memory back (it looks twice a second).
RSS_SETTLE_S = 3.0


def connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    return sock


def call(sock, request):
    sock.send(json.dumps(request).encode())
    fds = array.array("i")
    msg, ancillary, _flags, _addr = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    reply = json.loads(msg)
    if "large_message" in reply:
        # A reply above 64 KiB: its bytes follow in packets (docs/api.md).
        body = b""
        while len(body) < reply["large_message"]:
            piece = sock.recv(1 << 16)
            if not piece:
                raise BenchError("linnet closed the connection in the middle of a reply")
            body += piece
        reply = json.loads(body)
    if reply.get("reply") == "error":
        raise BenchError(f"linnet refused {request['op']}: {reply}")
    return reply, list(fds)


def attach(sock, network, **more):
    """Attaches an interface (`more`: the request's other keys, e.g. name,
    clone_of): its id and TAP fd. Like a VMM, the caller holds the fd
    while the interface is in use (the last close of a TAP destroys it,
    and that would be timed as the attach's)."""
    reply, fds = call(sock, {"op": "attach", "network": network, **more})
    if len(fds) != 1:
        raise BenchError(f"attach sent {len(fds)} fds, expected one TAP fd")
    return reply["interface"]["interface_id"], fds[0]


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def summary(xs):
    return {"p50": round(statistics.median(xs), 3), "p99": round(percentile(xs, 0.99), 3)}


def cycles(sock, network, count, **more):
    """Attach then detach one interface `count` times (`more`: the
    request's other keys): the times in ms."""
    attach_ms, detach_ms = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        iid, tap = attach(sock, network, **more)
        t1 = time.perf_counter()
        try:
            call(sock, {"op": "detach", "interface_id": iid})
        finally:
            t2 = time.perf_counter()
            os.close(tap)
        attach_ms.append((t1 - t0) * 1000)
        detach_ms.append((t2 - t1) * 1000)
    return attach_ms, detach_ms


def latency(socket_path, network, count):
    """Attach then detach one interface, `count` times, on a network kept up
    by one more interface: p50 and p99 in ms."""
    with connect(socket_path) as sock:
        _, anchor = attach(sock, network)
        try:
            attach_ms, detach_ms = cycles(sock, network, count)
        finally:
            os.close(anchor)
    return {"count": count, "attach_ms": summary(attach_ms), "detach_ms": summary(detach_ms)}


def contended(socket_path, network, count):
    """Attach latency while another client attaches and detaches on the
    same network without pause (each detach waits for the kernel to let go
    of its TAP): p50 and p99 in ms, and the other client's cycles. Each
    client attaches one interface id again and again, which takes its
    lease again rather than the network's every address."""
    stop, other = threading.Event(), {"cycles": 0, "error": None}

    def churn():
        try:
            with connect(socket_path) as sock:
                theirs = str(uuid.uuid4())
                while not stop.is_set():
                    cycles(sock, network, 1, interface_id=theirs)
                    other["cycles"] += 1
        except Exception as e:  # noqa: BLE001 - reported with the figure
            other["error"] = str(e)

    with connect(socket_path) as sock:
        _, anchor = attach(sock, network)
        thread = threading.Thread(target=churn, daemon=True)
        thread.start()
        try:
            wait_for(lambda: other["cycles"] > 0 or other["error"], "the other client's first cycle")
            attach_ms, _ = cycles(sock, network, count, interface_id=str(uuid.uuid4()))
        finally:
            stop.set()
            thread.join(timeout=30)
            os.close(anchor)
    if other["error"]:
        raise BenchError(f"the other client failed: {other['error']}")
    return {"count": count, "attach_ms": summary(attach_ms), "other_cycles": other["cycles"]}


def interfaces_on(socket_path, network):
    sock = connect(socket_path)
    listing, _ = call(sock, {"op": "list"})
    sock.close()
    return sum(1 for i in listing["interfaces"] if i["network"] == network)


def links_named(prefix):
    """Links whose names start with `prefix`, but for the spare TAPs a
    network keeps ready (on its bridge and down, no VM's)."""
    out = subprocess.run(["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True).stdout
    return sum(1 for line in out.splitlines()
               if line.split(":")[1].strip().startswith(prefix) and "alias linnet:spare:" not in line)


def taps_on_host():
    return links_named("lnt")


# How the Nth attach is timed, for whether attaching stays flat as a
# network fills: PROBES times in each of FLAT_ROUNDS rounds, the rounds
# taking turns between the counts (one count timed in one spell of the
# machine and the other in another differed by more than the growth judged).
PROBES = 20
FLAT_ROUNDS = 3


def scale(socket_path, network, daemon_pid, marks, flat_at):
    """Attaches max(marks) interfaces on one network from one connection:
    the time and the daemon's RSS at each mark, then the time for the daemon
    to remove them all when the connection closes. The TAP fds stay open
    meanwhile, as a VMM's would, so the daemon does the removing. Between
    the two, the Nth attach for each N in `flat_at`: with N-1 interfaces
    held (detached or attached to that many), one attached and detached
    again PROBES times, in FLAT_ROUNDS rounds that go through every N in
    turn: p50 and max in ms over all rounds, and each round's p50."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits[1], limits[1]))
    out = {"attach_s": {}, "daemon_rss_mib": {}, "attach_at": {},
           "daemon_rss_mib_before": round(memory_kib(daemon_pid) / 1024, 2)}
    held, put_down = [], []  # (interface id, TAP fd); interface ids
    try:
        with connect(socket_path) as sock:

            def hold(count):
                # An interface detached here is attached again by its id,
                # taking its address again: the network's are not used up.
                while len(held) > count:
                    iid, tap = held.pop()
                    call(sock, {"op": "detach", "interface_id": iid})
                    os.close(tap)
                    put_down.append(iid)
                while len(held) < count:
                    held.append(attach(sock, network, interface_id=put_down.pop()))

            start = time.perf_counter()
            for n in range(1, max(marks) + 1):
                held.append(attach(sock, network))
                if n in marks:
                    out["attach_s"][n] = round(time.perf_counter() - start, 3)
                    out["daemon_rss_mib"][n] = round(memory_kib(daemon_pid) / 1024, 2)
            rounds = {n: [] for n in flat_at}
            for _ in range(FLAT_ROUNDS):
                for n in sorted(flat_at, reverse=True):
                    hold(n - 1)
                    rounds[n].append(cycles(sock, network, PROBES)[0])
            for n, times in rounds.items():
                every = [t for r in times for t in r]
                out["attach_at"][n] = {"count": len(every), "p50": round(statistics.median(every), 3),
                                       "max": round(max(every), 3),
                                       "rounds_p50": [round(statistics.median(r), 3) for r in times]}
            hold(max(marks))
            # The listing of them all, on the connection that holds them (a
            # reply above 64 KiB once cost a client its interfaces).
            listed_at = time.perf_counter()
            listing, _ = call(sock, {"op": "list"})
            out["list_all_s"] = round(time.perf_counter() - listed_at, 3)
            listed = sum(1 for i in listing["interfaces"] if i["network"] == network)
            if listed != max(marks):
                raise BenchError(f"linnet ls listed {listed} of {max(marks)} interfaces")
            start = time.perf_counter()
        wait_for(lambda: interfaces_on(socket_path, network) == 0 and taps_on_host() == 0,
                 f"the daemon to remove {max(marks)} interfaces", timeout=120)
        out["detach_all_s"] = round(time.perf_counter() - start, 3)
        # What the daemon holds once they are gone: the least in the next
        # RSS_SETTLE_S (it gives memory back on its next tick).
        settled = time.monotonic() + RSS_SETTLE_S
        least = memory_kib(daemon_pid)
        while time.monotonic() < settled:
            time.sleep(0.1)
            least = min(least, memory_kib(daemon_pid))
        out["daemon_rss_mib_after_detach"] = round(least / 1024, 2)
        out["daemon_peak_rss_mib"] = round(memory_kib(daemon_pid, "VmHWM") / 1024, 2)
    finally:
        for _, tap in held:
            os.close(tap)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    return out


def namespaces_held(pid):
    """The network namespaces `pid` holds open (a clone's, for the daemon)."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("net:[")
        except OSError:
            pass
    return held


def clones(socket_path, network, daemon_pid, count):
    """`count` clones of one VM at once (each in a network namespace of its
    own, NATed to an address of its own), then `count` ordinary interfaces,
    each lot attached from one connection with their TAP fds held as VMMs
    hold them: each attach's time (p50, p99), what the daemon's RSS grew by
    for the lot, and, once the connection closes, how long the daemon takes
    to remove them and what it leaves (ports, namespaces it holds)."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits[1], limits[1]))
    out = {"count": count}
    try:
        with connect(socket_path) as holder:
            # The snapshotted VM, still attached: every clone is NATed.
            _, original = attach(holder, network, name="bench-snap")
            try:
                held_before = namespaces_held(daemon_pid)
                for kind, more in (("clones", {"clone_of": "bench-snap"}), ("interfaces", {})):
                    taps, times = [], []
                    rss_before = memory_kib(daemon_pid)
                    try:
                        with connect(socket_path) as sock:
                            for _ in range(count):
                                start = time.perf_counter()
                                taps.append(attach(sock, network, **more)[1])
                                times.append((time.perf_counter() - start) * 1000)
                            rss_after = memory_kib(daemon_pid)
                            gone_from = time.perf_counter()
                        wait_for(lambda: interfaces_on(socket_path, network) == 1
                                 and links_named("lnc") == 0 and taps_on_host() == 1
                                 and namespaces_held(daemon_pid) == held_before,
                                 f"the daemon to remove {count} {kind}", timeout=120)
                        out[kind] = {"attach_ms": summary(times),
                                     "daemon_rss_growth_mib": round((rss_after - rss_before) / 1024, 2),
                                     "detach_all_s": round(time.perf_counter() - gone_from, 3)}
                    finally:
                        for tap in taps:
                            os.close(tap)
                out["left"] = {"ports": links_named("lnc"),
                               "namespaces_held": namespaces_held(daemon_pid) - held_before}
            finally:
                os.close(original)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    return out


def smaps_rollup(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return {k.rstrip(":"): int(v) for k, v, *_ in (l.split() for l in f) if k.endswith(":")}


def helper_rss(linnet, workdir):
    """RSS of an idle `linnet helper --socket`, attached and serving."""
    path = os.path.join(workdir, "helper.sock")
    proc = subprocess.Popen([linnet.bin, "helper", "--socket", path], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, **linnet.env})
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        if not ready or not proc.stdout.readline():
            raise BenchError("`linnet helper --socket` printed no interface within 10 s")
        mib = lambda kib: round(kib / 1024, 2)
        rollup = smaps_rollup(proc.pid)
        private = lambda r: r["Private_Clean"] + r["Private_Dirty"]
        # Its connector (cli/connector.rs), forked before it confined
        # itself: a process of its own, counted with it.
        kids = [smaps_rollup(k) for k in children(proc.pid)]
        return {"rss_mib": mib(memory_kib(proc.pid)),
                "peak_rss_mib": mib(memory_kib(proc.pid, "VmHWM")),
                # What this helper alone costs: its code pages and libc's
                # are shared with the daemon and every other helper.
                "pss_mib": mib(rollup["Pss"]),
                "private_mib": mib(private(rollup)),
                "children": len(kids),
                "children_pss_mib": mib(sum(k["Pss"] for k in kids)),
                "children_private_mib": mib(sum(private(k) for k in kids))}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def first_attach(socket_path, network):
    """One attach on a daemon that has no network up yet (it brings the
    network up), and its detach: the attach's time in ms."""
    with connect(socket_path) as sock:
        start = time.perf_counter()
        iid, tap = attach(sock, network)
        elapsed = (time.perf_counter() - start) * 1000
        try:
            call(sock, {"op": "detach", "interface_id": iid})
        finally:
            os.close(tap)
    return {"attach_ms": round(elapsed, 3)}


def main(argv):
    """For a daemon that serves one user alone (a rootless one): the
    figures measured in a process of that user's, printed as JSON.
      first-attach SOCKET NETWORK | latency SOCKET NETWORK COUNT"""
    import sys
    what, args = argv[0], argv[1:]
    if what == "first-attach":
        out = first_attach(args[0], args[1])
    elif what == "latency":
        out = latency(args[0], args[1], int(args[2]))
    else:
        sys.exit(f"linnet_bench.control: unknown figure {what!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
