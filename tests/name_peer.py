#!/usr/bin/env python3
"""The name check's peers (tests/integration/gate.rs, bench/).

serve PEM [--bulk]
    Serves HTTP on port 8000 and TLS on port 443 of every address, each
    answering with the name the client showed (/reset: closing with a
    reset instead): "host=HOST" over HTTP,
    "sni=NAME host=HOST" over TLS (NAME "-" when the ClientHello had no
    server name). A request for /bytes/N is answered with N bytes instead.
    Prints "serving" once listening.

fetch ADDRESS PORT [--sni NAME | --no-sni] [--host NAME] [--plain]
      [--split segments|records] [--raw] [--times N]
      [--path /bytes/N --pause SECONDS] [--source-port PORT]
    One request from this namespace: TLS unless --plain (HTTP) or --raw
    (bytes that are neither). --split sends the ClientHello in two TCP
    segments, or as two TLS records in one. With --path, asks for that
    path, and with --pause reads a first piece of the answer, waits that
    long (its connection open and idle), then the rest, and prints
    "bytes=N" (the body's length). Otherwise prints the answer's first
    line. Exits 0 on an answer; prints "refused" and exits 3 on a TCP reset;
    "silent" and exits 4 when nothing comes in 3 s. Any other failure is
    the probe's own and exits 1 with the reason: never "no answer".

flood ADDRESS PORT N NAME
    N connections one after another, each sending a ClientHello for NAME
    and waiting for a first answer: prints "refused=R answered=A silent=S".
"""

import socket
import ssl
import struct
import sys
import threading
import time

ANSWER_TIMEOUT = 3.0
HTTP_PORT = 8000
TLS_PORT = 443


def read_head(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > 65536:
            break
    return data


def host_of(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            return value.strip().decode("ascii", "replace")
    return "-"


def respond(conn, head, prefix):
    first = head.split(b"\r\n", 1)[0].split()
    if len(first) < 3 or not first[2].startswith(b"HTTP/1."):
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbad\n")
        return
    path = first[1].decode("ascii", "replace")
    if path == "/reset":
        # Closed with a reset, as a server that gives up does.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raise ResetByUs()
    if path.startswith("/bytes/"):
        size = int(path[len("/bytes/"):])
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        block = b"x" * 65536
        while size > 0:
            n = min(size, len(block))
            conn.sendall(block[:n])
            size -= n
        return
    body = ("%shost=%s\n" % (prefix, host_of(head))).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)


class ResetByUs(Exception):
    pass


def serve_http(conn):
    with conn:
        try:
            respond(conn, read_head(conn), "")
        except (ResetByUs, OSError):
            pass


def serve_tls(conn, context):
    with conn:
        try:
            tls = context.wrap_socket(conn, server_side=True)
            sni = getattr(tls, "linnet_sni", None) or "-"
            respond(tls, read_head(tls), "sni=%s " % sni)
            tls.close()
        except ResetByUs:
            conn.close()
        except (OSError, ssl.SSLError):
            pass


def listen(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(4096)
    return s


def accept_loop(listener, handle):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def serve(pem):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)

    def remember(tls, name, _context):
        tls.linnet_sni = name

    context.sni_callback = remember
    http, tls = listen(HTTP_PORT), listen(TLS_PORT)
    threading.Thread(target=accept_loop, args=(http, serve_http), daemon=True).start()
    threading.Thread(
        target=accept_loop, args=(tls, lambda c: serve_tls(c, context)), daemon=True
    ).start()
    print("serving", flush=True)
    while True:
        time.sleep(3600)


class Refused(Exception):
    pass


class Silent(Exception):
    pass


def recv(sock):
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        raise Refused()
    except socket.timeout:
        raise Silent()


def send(sock, data):
    try:
        sock.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        raise Refused()


def first_line(data):
    body = data.split(b"\r\n\r\n", 1)[-1]
    return body.split(b"\n", 1)[0].decode("ascii", "replace")


def read_all(sock):
    data = b""
    while True:
        chunk = recv(sock)
        if not chunk:
            return data
        data += chunk


def as_records(hello):
    """The ClientHello record `hello` as two records, its body halved."""
    kind, version, body = hello[0:1], hello[1:3], hello[5:]
    half = len(body) // 2
    out = b""
    for part in (body[:half], body[half:]):
        out += kind + version + len(part).to_bytes(2, "big") + part
    return out


def fetch_tls(sock, sni, host, split, path="/", pause=0.0):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=sni)
    first = True
    while True:
        try:
            tls.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        out = outgoing.read()
        if out:
            if first and split == "segments":
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                send(sock, out[:100])
                time.sleep(0.2)
                send(sock, out[100:])
            elif first and split == "records":
                send(sock, as_records(out))
            else:
                send(sock, out)
            first = False
        if done:
            break
        data = recv(sock)
        if not data:
            raise Refused()
        incoming.write(data)
    tls.write(b"GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
              % (path.encode(), host.encode()))
    send(sock, outgoing.read())
    answer = b""
    paused = pause <= 0
    while True:
        if not paused and answer:
            time.sleep(pause)
            paused = True
        try:
            answer += tls.read(65536)
        except ssl.SSLWantReadError:
            data = recv(sock)
            if not data:
                break
            incoming.write(data)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            break
    return answer


def fetch(args):
    address, port = args[0], int(args[1])
    sni, host, split, mode, times, path, pause = None, None, None, "tls", 1, "/", 0.0
    source = None
    rest = args[2:]
    while rest:
        flag = rest.pop(0)
        if flag == "--sni":
            sni = rest.pop(0)
        elif flag == "--no-sni":
            sni = None
        elif flag == "--host":
            host = rest.pop(0)
        elif flag == "--split":
            split = rest.pop(0)
        elif flag == "--plain":
            mode = "plain"
        elif flag == "--raw":
            mode = "raw"
        elif flag == "--times":
            times = int(rest.pop(0))
        elif flag == "--path":
            path = rest.pop(0)
        elif flag == "--pause":
            pause = float(rest.pop(0))
        elif flag == "--source-port":
            source = ("0.0.0.0", int(rest.pop(0)))
        else:
            sys.exit("name_peer: unknown flag %s" % flag)
    host = host or sni or address
    for _ in range(times):
        if source:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.settimeout(ANSWER_TIMEOUT)
            sock.bind(source)
            sock.connect((address, port))
        else:
            sock = socket.create_connection((address, port), timeout=ANSWER_TIMEOUT)
        with sock:
            if mode == "raw":
                send(sock, b"\x00\x01 neither TLS nor HTTP\r\n\r\n")
                answer = read_all(sock)
            elif mode == "plain":
                send(sock, b"GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host.encode())
                answer = read_all(sock)
            else:
                answer = fetch_tls(sock, sni, host, split, path, pause)
    if not answer:
        # Closed without a word: neither an answer nor a reset.
        raise Silent()
    if path != "/":
        print("bytes=%d" % len(answer.split(b"\r\n\r\n", 1)[-1]))
    else:
        print(first_line(answer))


def flood(args):
    """N connections one after another, each sending a ClientHello for
    NAME: prints how many were reset, answered and left silent."""
    address, port, count, sni = args[0], int(args[1]), int(args[2]), args[3]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=sni)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = outgoing.read()
    counts = {"refused": 0, "answered": 0, "silent": 0}
    for _ in range(count):
        try:
            with socket.create_connection((address, port), timeout=ANSWER_TIMEOUT) as sock:
                send(sock, hello)
                counts["answered" if recv(sock) else "silent"] += 1
        except (Refused, ConnectionRefusedError):
            counts["refused"] += 1
        except Silent:
            counts["silent"] += 1
    print(" ".join("%s=%d" % kv for kv in counts.items()))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 6 and sys.argv[1] == "flood":
        flood(sys.argv[2:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "fetch":
        try:
            fetch(sys.argv[2:])
        except Refused:
            print("refused")
            sys.exit(3)
        except Silent:
            print("silent")
            sys.exit(4)
        except ConnectionRefusedError:
            print("refused")
            sys.exit(3)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
