#!/usr/bin/env python3
"""The name check's benchmark peers (bench/linnet_bench/gate.py): a server
fast enough that it is not what the figures measure, and the clients
that time and count connections. A script of its own, run in the
server's and the guests' namespaces; tests/name_peer.py (one thread per
connection) is the integration suite's, too slow to open thousands of
connections a second against.

serve PEM [WORKERS]
    HTTP on ports 8000 to 8000 + PORTS - 1 of every address, in WORKERS
    processes (2) sharing them (SO_REUSEPORT), each one epoll loop: each
    request head is answered with "ok"; the server closes the connection
    after a request with "Connection: close", else waits for the next or
    for the client to close. TLS on port 443 (a thread per connection,
    the certificate of PEM): GET /bytes/N is answered with N bytes.
    Prints "serving" once all listen.

latency ADDRESS PORT HOST COUNT
    COUNT connections one after another, each: connect, send a request
    head with Host: HOST, read the answer to its end. Prints a line per
    connection: the microseconds connect() took, those from the request
    sent to the answer's first byte, and its source port.

rate ADDRESS PORT HOST SECONDS CONCURRENCY PROCESSES
    PROCESSES processes, each keeping CONCURRENCY connections going, for
    a warm-up of WARMUP s and then SECONDS: each connection to the next
    of the PORTS ports from PORT, a request (keep-alive) and its whole
    answer, then an abortive close (a reset: neither end keeps a
    TIME_WAIT, whose 4-tuple a later connection through the NAT could
    meet), then the next. Spreading the connections over PORTS ports
    keeps a guest's source port from coming back to the same port within
    seconds (the kernel picks them in turn, per destination). A
    connection not answered within STALLED s is given up. Prints
    "COMPLETED FAILED STALLED SECONDS": the connections completed,
    failed (refused, reset) and given up within those SECONDS.

hold ADDRESS PORT COUNT
    Opens COUNT connections, prints "connected", waits for a line on
    stdin, sends one byte ("G") on each and nothing more, prints "sent",
    then watches them for WATCH s and prints "HELD EARLY QUIET OTHER
    FIRST LAST": those reset WAIT_AT_LEAST s or more after their byte
    (held until the gate's timeout), those reset sooner, those never
    reset, those answered or closed, and the first and last of the held
    ones' resets in seconds after their byte.
"""

import errno
import os
import resource
import select
import socket
import ssl
import struct
import sys
import threading
import time

HTTP_PORT = 8000
PORTS = 8
TLS_PORT = 443
STALLED = 1.0
WARMUP = 0.5
WATCH = 12.0
WAIT_AT_LEAST = 4.5
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"


def request(host, close=True):
    return b"GET / HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
        host.encode(), b"Connection: close\r\n" if close else b"")


def more_files(count):
    """Room for `count` descriptors more than stdio's, within the hard
    limit (raising that takes a capability the sandbox may not have)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 64 if hard == resource.RLIM_INFINITY else min(count + 64, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < count + 64:
        print(f"gate_peer: room for {want} descriptors only (hard limit)", file=sys.stderr)


def listener(port, reuseport=False):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("0.0.0.0", port))
    s.listen(4096)
    return s


def serve_http(listens):
    """One worker's loop: accept, read request heads, answer each; close
    after "Connection: close" or when the client closes."""
    ep = select.epoll()
    by_fd = {}
    for listen in listens:
        listen.setblocking(False)
        ep.register(listen.fileno(), select.EPOLLIN)
        by_fd[listen.fileno()] = listen
    conns = {}  # fd: (socket, bytes so far)
    while True:
        for fd, events in ep.poll():
            if fd in by_fd:
                while True:
                    try:
                        conn, _ = by_fd[fd].accept()
                    except OSError:
                        break
                    conn.setblocking(False)
                    conns[conn.fileno()] = (conn, b"")
                    ep.register(conn.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
                continue
            conn, head = conns[fd]
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            head += data
            if data and b"\r\n\r\n" not in head:
                conns[fd] = (conn, head[-65536:])
                continue
            if data:
                try:
                    conn.send(ANSWER)
                except OSError:
                    pass
                if b"connection: close" not in head.lower():
                    conns[fd] = (conn, b"")
                    continue
            ep.unregister(fd)
            del conns[fd]
            conn.close()


def tls_one(conn, context):
    with conn:
        try:
            tls = context.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = tls.recv(4096)
                if not chunk:
                    return
                head += chunk
            path = head.split(b"\r\n", 1)[0].split()[1].decode("ascii", "replace")
            size = int(path[len("/bytes/"):]) if path.startswith("/bytes/") else 3
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
            block = b"x" * (1 << 20)
            while size > 0:
                n = min(size, len(block))
                tls.sendall(block[:n])
                size -= n
            tls.close()
        except (OSError, ssl.SSLError, ValueError, IndexError):
            pass


def serve(pem, workers=2):
    more_files(16000)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    tls = listener(TLS_PORT)
    http = [[listener(HTTP_PORT + i, reuseport=True) for i in range(PORTS)] for _ in range(workers)]
    for mine in http[1:]:
        if os.fork() == 0:
            tls.close()
            serve_http(mine)
            os._exit(0)
    print("serving", flush=True)

    def accept_tls():
        while True:
            conn, _ = tls.accept()
            threading.Thread(target=tls_one, args=(conn, context), daemon=True).start()
    threading.Thread(target=accept_tls, daemon=True).start()
    serve_http(http[0])


def latency(address, port, host, count):
    req = request(host)
    out = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(10)
        t0 = time.perf_counter_ns()
        s.connect((address, port))
        t1 = time.perf_counter_ns()
        port_of = s.getsockname()[1]
        s.sendall(req)
        first = s.recv(65536)
        t2 = time.perf_counter_ns()
        if not first:
            sys.exit(f"gate_peer: {address}:{port} closed without an answer")
        while s.recv(65536):
            pass
        s.close()
        out.append(f"{(t1 - t0) / 1000:.1f} {(t2 - t1) / 1000:.1f} {port_of}")
    print("\n".join(out))


ABORT = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close with a reset


def rate_loop(address, port, req, start, end, concurrency, first):
    """One process's connections: (completed, failed, stalled) within
    [start, end)."""
    ep = select.epoll()
    conns = {}  # fd: [socket, sent, answer so far, opened]
    counts = {"completed": 0, "failed": 0, "stalled": 0}
    turn = first

    def open_one():
        nonlocal turn
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, ABORT)
        turn = (turn + 1) % PORTS
        err = s.connect_ex((address, port + turn))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            count("failed")
            return
        conns[s.fileno()] = [s, False, b"", time.monotonic()]
        ep.register(s.fileno(), select.EPOLLOUT)

    def count(what):
        if start <= time.monotonic() < end:
            counts[what] += 1

    def finish(fd, what):
        s = conns.pop(fd)[0]
        ep.unregister(fd)
        s.close()
        count(what)
        open_one()

    for _ in range(concurrency):
        open_one()
    while time.monotonic() < end:
        for fd, events in ep.poll(0.05):
            c = conns.get(fd)
            if c is None:
                continue
            s, sent = c[0], c[1]
            if not sent:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    finish(fd, "failed")
                    continue
                try:
                    s.send(req)
                except OSError:
                    finish(fd, "failed")
                    continue
                c[1] = True
                ep.modify(fd, select.EPOLLIN)
                continue
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                finish(fd, "failed")
                continue
            c[2] += data
            if len(c[2]) >= len(ANSWER):
                finish(fd, "completed" if c[2] == ANSWER else "failed")
            elif not data:
                finish(fd, "failed")
        now = time.monotonic()
        for fd in [fd for fd, c in conns.items() if now - c[3] > STALLED]:
            finish(fd, "stalled")
    return counts["completed"], counts["failed"], counts["stalled"]


def rate(address, port, host, seconds, concurrency, processes):
    req = request(host, close=False)
    more_files(concurrency * 2)
    start = time.monotonic() + WARMUP
    end = start + seconds
    r, w = os.pipe()
    pids = []
    for i in range(processes):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            counts = rate_loop(address, port, req, start, end, concurrency, i)
            os.write(w, b"%d %d %d\n" % counts)
            os._exit(0)
        pids.append(pid)
    os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        lines = [[int(x) for x in line.split()] for line in f.read().splitlines()]
    if len(lines) != processes:
        sys.exit(f"gate_peer: {processes - len(lines)} of the client processes gave no count")
    print(*(sum(column) for column in zip(*lines)), seconds)


def hold(address, port, count):
    more_files(count)
    socks = []
    for _ in range(count):
        s = socket.create_connection((address, port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    print("connected", flush=True)
    sys.stdin.readline()
    sent = {}
    for s in socks:
        s.send(b"G")
        sent[s.fileno()] = time.monotonic()
    print("sent", flush=True)
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    held, early, other = [], 0, 0
    deadline = min(sent.values()) + WATCH
    while by_fd and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            s = by_fd.pop(fd)
            poller.unregister(fd)
            after = time.monotonic() - sent[fd]
            try:
                data = s.recv(1)
                other += 1  # answered, or closed by the server: not held
            except ConnectionResetError:
                if after >= WAIT_AT_LEAST:
                    held.append(after)
                else:
                    early += 1
            except OSError:
                other += 1
            s.close()
    first = min(held) if held else 0
    last = max(held) if held else 0
    print(len(held), early, len(by_fd), other, f"{first:.3f}", f"{last:.3f}", flush=True)


def main():
    a = sys.argv[1:]
    if a[:1] == ["serve"] and len(a) in (2, 3):
        serve(a[1], *(int(x) for x in a[2:]))
    elif a[:1] == ["latency"] and len(a) == 5:
        latency(a[1], int(a[2]), a[3], int(a[4]))
    elif a[:1] == ["rate"] and len(a) == 7:
        rate(a[1], int(a[2]), a[3], float(a[4]), int(a[5]), int(a[6]))
    elif a[:1] == ["hold"] and len(a) == 4:
        hold(a[1], int(a[2]), int(a[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
