#!/usr/bin/env python3
"""Test tooling: a local user flooding the daemon's socket.

  api_flood.py SOCKET N [SECONDS]
      opens N connections to the daemon and asks "list" on each, waiting
      SECONDS (default 5) for each reply; prints "answered A refused R
      silent S" (refused: the daemon said it would not serve the
      connection), then holds them all until killed.
"""
import json
import socket
import sys
import time


def main(path, count, wait):
    held, answered, refused, silent = [], 0, 0, 0
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(path)
            s.send(b'{"op": "list"}')
            s.settimeout(wait)
            reply = json.loads(s.recv(1 << 16) or b"{}")
        except socket.timeout:
            silent += 1
            held.append(s)
            continue
        except OSError:
            refused += 1
            continue
        if reply.get("reply") == "error":
            refused += 1
        else:
            answered += 1
        held.append(s)
    print(f"answered {answered} refused {refused} silent {silent}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) == 4 else 5.0)
