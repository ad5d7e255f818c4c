#!/usr/bin/env python3
"""Attach/detach latency against a running linnet daemon, through the raw API.

Speaks the protocol of docs/api.md directly (SOCK_SEQPACKET, JSON, the TAP fd
arriving as SCM_RIGHTS), so it measures the daemon, not a CLI's start-up.

    attach_latency.py [--socket PATH] [--count N] [--network NAME]
"""
import argparse, array, json, os, socket, statistics, time

def call(sock, request):
    sock.send(json.dumps(request).encode())
    fds = array.array("i")
    msg, anc, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return json.loads(msg), list(fds)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", default=os.path.join(os.environ.get("LINNET_RUN_DIR", "/run/linnet"), "linnet.sock"))
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--network", default="shared")
    args = ap.parse_args()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(args.socket)
    # One interface held for the whole run, so the network stays up and each
    # sample is an interface attach, not a network start.
    anchor, fds = call(sock, {"op": "attach", "network": args.network})
    assert anchor["reply"] == "attached", anchor
    attach, detach = [], []
    for _ in range(args.count):
        t0 = time.perf_counter()
        reply, fds = call(sock, {"op": "attach", "network": args.network})
        t1 = time.perf_counter()
        assert reply["reply"] == "attached" and len(fds) == 1, reply
        for fd in fds:
            os.close(fd)
        iid = reply["interface"]["interface_id"]
        reply, _ = call(sock, {"op": "detach", "interface_id": iid})
        t2 = time.perf_counter()
        assert reply["reply"] == "detached", reply
        attach.append((t1 - t0) * 1000)
        detach.append((t2 - t1) * 1000)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(len(xs) * p))]
    print(json.dumps({
        "count": args.count,
        "attach_ms": {"p50": round(statistics.median(attach), 3), "p99": round(q(attach, 0.99), 3)},
        "detach_ms": {"p50": round(statistics.median(detach), 3), "p99": round(q(detach, 0.99), 3)},
    }))

if __name__ == "__main__":
    main()
