#!/usr/bin/env python3
"""Test tooling: a VMM that misuses the TAP fd linnet gave it.

  hostile_vmm.py set-mac FD MAC
      sets the TAP's own MAC through the fd (SIOCSIFHWADDR, which a TAP fd
      allows without any capability), prints "set", then holds the fd
      until killed.
"""
import fcntl
import socket
import struct
import sys
import time

SIOCSIFHWADDR = 0x8924
ARPHRD_ETHER = 1


def set_mac(fd, text):
    mac = bytes.fromhex(text.replace(":", ""))
    # struct ifreq: the name (ignored on a TAP fd), then a sockaddr.
    ifreq = b"\0" * 16 + struct.pack("=H", ARPHRD_ETHER) + mac + b"\0" * 16
    fcntl.ioctl(fd, SIOCSIFHWADDR, ifreq.ljust(40, b"\0"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["set-mac"] and len(sys.argv) == 4:
        set_mac(int(sys.argv[2]), sys.argv[3])
        print("set", flush=True)
        while True:
            time.sleep(3600)
    sys.exit(__doc__)
