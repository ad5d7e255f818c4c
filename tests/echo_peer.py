#!/usr/bin/env python3
"""Test tooling for port forwards.

  echo_peer.py serve TAG PORT   answer each TCP connection and UDP datagram on
                                PORT (IPv4 and IPv6) with "TAG from ADDR",
                                ADDR being the client's address as seen here
  echo_peer.py ask HOST PORT tcp|udp   print the answer (exit 1 on none)
"""
import socket
import sys
import threading


def peer(addr):
    host = addr[0]
    return host[7:] if host.startswith("::ffff:") else host


def serve(tag, port):
    tcp = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("::", port))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    udp.bind(("::", port))

    def udp_loop():
        while True:
            _, addr = udp.recvfrom(2048)
            udp.sendto(f"{tag} from {peer(addr)}\n".encode(), addr)

    threading.Thread(target=udp_loop, daemon=True).start()
    print("serving", flush=True)
    while True:
        conn, addr = tcp.accept()
        with conn:
            conn.sendall(f"{tag} from {peer(addr)}\n".encode())


def ask(host, port, proto):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family, kind) as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
            if proto == "udp":
                s.send(b"hello")
            print(s.recv(2048).decode().strip())
        except OSError as e:
            print(f"no answer: {e}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["ask"]:
        ask(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(__doc__)
