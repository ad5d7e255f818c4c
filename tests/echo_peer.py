#!/usr/bin/env python3
"""Test tooling for port forwards.

  echo_peer.py serve TAG PORT   answer each TCP connection and UDP datagram on
                                PORT (IPv4 and IPv6) with "TAG from ADDR",
                                ADDR being the client's address as seen here
  echo_peer.py ask HOST PORT tcp|udp [CHADDR]   print the answer; exit 3 when
                                nothing came back within 2 s, 2 when the
                                connection was refused (a TCP reset, an
                                ICMP unreachable); any other status is the
                                probe's own failure. With CHADDR, a UDP
                                datagram is shaped as a BOOTP request from
                                that MAC, so anti-spoofing lets it pass.
  echo_peer.py serve-lines PORT   answer each line of each TCP connection on
                                PORT with "echo LINE", keeping it open
  echo_peer.py chat HOST PORT   one TCP connection: each line of stdin goes
                                out, and its answer (or "no answer") is
                                printed
  echo_peer.py invalid SRC HOST PORT   send one TCP segment that conntrack
                                cannot place (SYN and FIN together) carrying
                                the marker "LINNET-invalid"
"""
import socket
import struct
import sys
import threading

from spoof import checksum  # the Internet checksum, beside this file


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


def ask(host, port, proto, chaddr=None):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family, kind) as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
            if proto == "udp":
                data = b"hello"
                if chaddr:
                    data = bytearray(240)
                    data[0] = 1
                    data[28:34] = bytes.fromhex(chaddr.replace(":", ""))
                s.send(bytes(data))
            print(s.recv(2048).decode().strip())
        except ConnectionRefusedError as e:
            print(f"refused: {e}", file=sys.stderr)
            sys.exit(2)
        except OSError as e:
            print(f"no answer: {e}", file=sys.stderr)
            sys.exit(3)


def serve_lines(port):
    tcp = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("::", port))
    tcp.listen(16)
    print("serving", flush=True)

    def lines(conn):
        with conn, conn.makefile("rwb", buffering=0) as f:
            for line in f:
                f.write(b"echo " + line)

    while True:
        conn, _ = tcp.accept()
        threading.Thread(target=lines, args=(conn,), daemon=True).start()


def chat(host, port):
    with socket.create_connection((host, port), timeout=3) as s:
        f = s.makefile("rwb", buffering=0)
        print("connected", flush=True)
        for line in sys.stdin:
            try:
                f.write(line.encode())
                print(f.readline().decode().strip() or "no answer", flush=True)
            except OSError as e:
                print(f"no answer: {e}", flush=True)


def invalid(src, host, port):
    syn_fin = 0x03
    payload = b"LINNET-invalid"
    tcp = struct.pack("!HHIIBBHHH", 40000, port, 1, 0, 5 << 4, syn_fin, 1024, 0, 0) + payload
    pseudo = socket.inet_aton(src) + socket.inet_aton(host) + struct.pack("!BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", checksum(pseudo + tcp)) + tcp[18:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP) as s:
        s.sendto(tcp, (host, 0))


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["ask"]:
        ask(sys.argv[2], int(sys.argv[3]), sys.argv[4], *sys.argv[5:6])
    elif sys.argv[1:2] == ["serve-lines"]:
        serve_lines(int(sys.argv[2]))
    elif sys.argv[1:2] == ["chat"]:
        chat(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["invalid"]:
        invalid(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
