#!/usr/bin/env python3
"""Test tooling: a peer of the daemon's socket that is gone before the
daemon looks at it (tests/integration/tenant.rs). Run as root.

  gone_peer.py SOCKET UID [--userns OUTER] (live | gone)
      A child becomes UID; with --userns it makes a user namespace of
      its own, whose root this process maps to OUTER (a subordinate uid
      from no /etc/subuid, as NSS's sssd gives them), and becomes that
      root. Then it connects to SOCKET and asks "list":
      live: prints the reply's "reply" (and its message when it is an
        error), and exits.
      gone: it forks a grandchild that keeps the connection, and exits;
        reaped, this prints "gone" (the daemon, stopped by the test
        meanwhile, has not accepted yet); the grandchild then prints the
        reply as live does, once the daemon answers.
"""
import ctypes
import json
import os
import socket
import sys
import time

CLONE_NEWUSER = 0x10000000


def ask(s):
    s.settimeout(30)
    reply = json.loads(s.recv(1 << 16) or b"{}")
    said = reply.get("reply", "closed")
    if said == "error":
        said += ": " + reply.get("message", "")
    print(said, flush=True)


def main(path, uid, outer, mode):
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if outer is not None:
            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER) != 0:
                sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            os.setgid(0)
            os.setuid(0)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(path)
        try:
            s.send(b'{"op": "list"}')
        except BrokenPipeError:
            # Refused at once (over a budget): the refusal the daemon sent
            # before it closed is there to read all the same.
            pass
        if mode == "live":
            ask(s)
            os._exit(0)
        if os.fork() == 0:
            ask(s)
            os._exit(0)
        os._exit(0)
    if outer is not None:
        os.read(ready_r, 1)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{name}", "w") as f:
                f.write(f"0 {outer} 1\n")
        os.write(go_w, b"x")
    os.waitpid(child, 0)
    if mode == "gone":
        print("gone", flush=True)
        # The grandchild prints the reply; this waits to be killed.
        time.sleep(3600)


if __name__ == "__main__":
    args = sys.argv[1:]
    outer = None
    if "--userns" in args:
        i = args.index("--userns")
        outer = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 3 or args[2] not in ("live", "gone"):
        sys.exit(__doc__)
    main(args[0], int(args[1]), outer, args[2])
