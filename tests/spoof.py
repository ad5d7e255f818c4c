#!/usr/bin/env python3
"""Test tooling for anti-spoofing: raw Ethernet frames from a guest.

  spoof.py send IFACE KIND [KEY=VALUE...]
      sends one frame of KIND out of IFACE, broadcast (or all-nodes
      multicast), carrying the marker "LINNET-<KIND>" inside its payload
      (UDP data, ICMPv6 echo data, an ignored ND option, the DHCP sname; in
      ARP, whose fields are all fixed, a 6-byte tag as target MAC) so a
      capture can tell it apart. Keys: mac, ip, ip6, ll (the sender's own
      MAC, IPv4, global and link-local IPv6), gw, gw6 (the gateway's
      IPv4/IPv6), other_ip, other_mac, other_ip6 (someone else's), chaddr
      (dhcp-frag's made-up MAC), count (send it this many times).
  spoof.py capture IFACE SECONDS
      prints the markers of the frames IFACE receives (or sends)
      meanwhile; SIGTERM ends it early, printing what it saw so far.

Kinds: honest (UDP broadcast to port 9999), honest-8000 (to port 8000),
honest6 (UDP to ff02::1 port 9999, from its link-local address),
bcast-in-unicast (UDP to 255.255.255.255 in a frame to other_mac), other-mac,
other-ip, garp-gateway, arp-reply-other,
other-ip6, na-gateway, ra, dhcp-offer, dhcp-offer-port (from another source
port), dhcp-other-mac (a DISCOVER for someone else's MAC), frag-ra (an
IPv6 first fragment without its ICMPv6 header, RFC 7113), vlan (a tagged
frame hiding another source address), qinq (an 802.1ad tag), ll-other-mac
(to the 802.1 link-local group, which the bridge does not forward but could
learn from), arp-probe-other (an address probe for someone else's IPv4,
which would make it decline its lease), arp-probe-own (one for its own,
which passes), frag6-short (an IPv6 first fragment from its own global
address, its transport header left for a later fragment; to other_mac),
dhcp-discover (an honest DISCOVER for its own MAC, the marker in its
sname), dhcp-in-unicast (the same in a frame to other_mac), arp-padded (an
honest request for gw, the marker after the ARP body), ns-padded (a
neighbour solicitation for gw6 to all nodes, the marker in options), dhcp-hlen (the same
as dhcp-discover with a hardware address length of 255), dhcp-frag (the first
fragment of a DHCP request from its own address whose
chaddr would come in the second; sent with the second, which carries
chaddr=CHADDR). Checksums
are right, so a frame that got through would be acted upon (neighbour
caches, SLAAC, DHCP clients).
"""
import signal
import socket
import struct
import sys
import time

BROADCAST = b"\xff" * 6
ALL_NODES_MAC = bytes.fromhex("333300000001")
ALL_NODES = socket.inet_pton(socket.AF_INET6, "ff02::1")


def mac(text):
    return bytes.fromhex(text.replace(":", ""))


def v4(text):
    return socket.inet_aton(text)


def v6(text):
    return socket.inet_pton(socket.AF_INET6, text)


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ether(dst, src, ethertype, payload):
    return dst + src + struct.pack("!H", ethertype) + payload


def nd_option(marker):
    """An ND option of an unassigned type carrying the marker; receivers
    ignore options they do not know (RFC 4861 4.6)."""
    body = marker + b"\0" * (-(len(marker) + 2) % 8)
    return struct.pack("!BB", 253, (len(body) + 2) // 8) + body


# ARP frames carry one of these as target MAC instead of a marker.
ARP_TAGS = {
    "garp-gateway": b"LNgarp",
    "arp-reply-other": b"LNarpr",
    "arp-probe-other": b"LNprbo",
    "arp-probe-own": b"LNprbs",
}


def ipv4_udp(src, dst, sport, dport, data):
    udp = struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, src, dst)
    header = header[:10] + struct.pack("!H", checksum(header)) + header[12:]
    return header + udp


def arp(op, sender_mac, sender_ip, target_mac, target_ip):
    return struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, op, sender_mac, sender_ip, target_mac, target_ip)


def ipv6_icmp(src, dst, icmp):
    pseudo = src + dst + struct.pack("!I3xB", len(icmp), 58)
    icmp = icmp[:2] + struct.pack("!H", checksum(pseudo + icmp)) + icmp[4:]
    return struct.pack("!IHBB16s16s", 0x60000000, len(icmp), 58, 255, src, dst) + icmp


def bootp(op, chaddr, yiaddr, marker, options):
    message = bytearray(240)
    message[0] = op
    message[1], message[2] = 1, 6
    message[16:20] = yiaddr
    message[28:34] = chaddr
    message[44 : 44 + len(marker)] = marker  # sname
    message[236:240] = b"\x63\x82\x53\x63"
    return bytes(message) + options


def frame(kind, k):
    marker = f"LINNET-{kind}".encode()
    own_mac, own_ip = mac(k["mac"]), v4(k["ip"])
    everyone = v4("255.255.255.255")
    offer_options = bytes([53, 1, 2, 54, 4]) + own_ip + bytes([3, 4]) + own_ip + b"\xff"
    if kind == "honest":
        return ether(BROADCAST, own_mac, 0x0800, ipv4_udp(own_ip, everyone, 9999, 9999, marker))
    if kind == "bcast-in-unicast":
        # A broadcast address inside a frame to one VM's own MAC.
        return ether(mac(k["other_mac"]), own_mac, 0x0800, ipv4_udp(own_ip, everyone, 9999, 9999, marker))
    if kind == "honest-8000":
        return ether(BROADCAST, own_mac, 0x0800, ipv4_udp(own_ip, everyone, 9999, 8000, marker))
    if kind == "honest6":
        src, dst = v6(k["ll"]), ALL_NODES
        udp = struct.pack("!HHHH", 9999, 9999, 8 + len(marker), 0) + marker
        pseudo = src + dst + struct.pack("!I3xB", len(udp), 17)
        udp = udp[:6] + struct.pack("!H", checksum(pseudo + udp)) + udp[8:]
        ip6 = struct.pack("!IHBB16s16s", 0x60000000, len(udp), 17, 64, src, dst)
        return ether(ALL_NODES_MAC, own_mac, 0x86DD, ip6 + udp)
    if kind == "other-mac":
        return ether(BROADCAST, mac(k["other_mac"]), 0x0800, ipv4_udp(own_ip, everyone, 9999, 9999, marker))
    if kind == "other-ip":
        return ether(BROADCAST, own_mac, 0x0800, ipv4_udp(v4(k["other_ip"]), everyone, 9999, 9999, marker))
    if kind == "garp-gateway":
        gw = v4(k["gw"])
        return ether(BROADCAST, own_mac, 0x0806, arp(1, own_mac, gw, ARP_TAGS[kind], gw))
    if kind == "arp-reply-other":
        return ether(BROADCAST, own_mac, 0x0806, arp(2, own_mac, v4(k["other_ip"]), ARP_TAGS[kind], v4(k["gw"])))
    if kind == "other-ip6":
        echo = struct.pack("!BBHHH", 128, 0, 0, 1, 1) + marker
        return ether(ALL_NODES_MAC, own_mac, 0x86DD, ipv6_icmp(v6(k["other_ip6"]), ALL_NODES, echo))
    if kind == "na-gateway":
        # Override flag set, target the gateway, our MAC as its link address.
        na = struct.pack("!BBHI16s", 136, 0, 0, 0x20000000, v6(k["gw6"]))
        na += struct.pack("!BB6s", 2, 1, own_mac) + nd_option(marker)
        return ether(ALL_NODES_MAC, own_mac, 0x86DD, ipv6_icmp(v6(k["ll"]), ALL_NODES, na))
    if kind == "ra":
        prefix = struct.pack("!BBBBIII16s", 3, 4, 64, 0xC0, 86400, 14400, 0, v6("2001:db8:bad::"))
        ra = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0) + prefix + nd_option(marker)
        return ether(ALL_NODES_MAC, own_mac, 0x86DD, ipv6_icmp(v6(k["ll"]), ALL_NODES, ra))
    if kind in ("dhcp-offer", "dhcp-offer-port"):
        offer = bootp(2, mac(k["other_mac"]), v4(k["other_ip"]), marker, offer_options)
        sport = 67 if kind == "dhcp-offer" else 1234
        return ether(BROADCAST, own_mac, 0x0800, ipv4_udp(own_ip, everyone, sport, 68, offer))
    if kind in ("dhcp-discover", "dhcp-hlen"):
        discover = bytearray(bootp(1, own_mac, b"\0" * 4, marker, bytes([53, 1, 1, 255])))
        if kind == "dhcp-hlen":
            discover[2] = 255  # a hardware address length no chaddr holds
        discover = bytes(discover)
        return ether(BROADCAST, own_mac, 0x0800, ipv4_udp(v4("0.0.0.0"), everyone, 68, 67, discover))
    if kind == "dhcp-in-unicast":
        # An honest DISCOVER, in a frame to one VM's own MAC.
        discover = bootp(1, own_mac, b"\0" * 4, marker, bytes([53, 1, 1, 255]))
        return ether(mac(k["other_mac"]), own_mac, 0x0800, ipv4_udp(v4("0.0.0.0"), everyone, 68, 67, discover))
    if kind == "arp-padded":
        # An honest request for the gateway with data after the ARP body.
        request = arp(1, own_mac, own_ip, b"\0" * 6, v4(k["gw"]))
        return ether(BROADCAST, own_mac, 0x0806, request + (marker + b" ") * 16)
    if kind == "ns-padded":
        # A solicitation for the gateway to all nodes, its own link-layer
        # address, and the marker in options past what any VM needs.
        ns = struct.pack("!BBHI16s", 135, 0, 0, 0, v6(k["gw6"])) + struct.pack("!BB6s", 1, 1, own_mac)
        ns += nd_option(marker) * 4
        return ether(ALL_NODES_MAC, own_mac, 0x86DD, ipv6_icmp(v6(k["ll"]), ALL_NODES, ns))
    if kind == "dhcp-other-mac":
        discover = bootp(1, mac(k["other_mac"]), b"\0" * 4, marker, bytes([53, 1, 1, 255]))
        return ether(BROADCAST, own_mac, 0x0800, ipv4_udp(v4("0.0.0.0"), everyone, 68, 67, discover))
    if kind == "frag-ra":
        # Fragment header (more fragments follow), then destination options
        # whose PadN carries the marker; the RA would be in the next fragment.
        pad = marker + b"\0" * (-(len(marker) + 4) % 8)
        dstopts = struct.pack("!BBBB", 58, (len(pad) + 4) // 8 - 1, 1, len(pad)) + pad
        frag = struct.pack("!BBHI", 60, 0, 0x0001, 0x4C4E)
        payload = frag + dstopts
        ip6 = struct.pack("!IHBB16s16s", 0x60000000, len(payload), 44, 255, v6(k["ll"]), ALL_NODES)
        return ether(ALL_NODES_MAC, own_mac, 0x86DD, ip6 + payload)
    if kind == "vlan":
        inner = ipv4_udp(v4(k["other_ip"]), everyone, 9999, 9999, marker)
        return BROADCAST + own_mac + struct.pack("!HHH", 0x8100, 5, 0x0800) + inner
    if kind == "qinq":
        inner = ipv4_udp(own_ip, everyone, 9999, 9999, marker)
        return BROADCAST + own_mac + struct.pack("!HHH", 0x88A8, 5, 0x0800) + inner
    if kind in ("arp-probe-other", "arp-probe-own"):
        target = v4(k["other_ip"] if kind == "arp-probe-other" else k["ip"])
        return ether(BROADCAST, own_mac, 0x0806, arp(1, own_mac, v4("0.0.0.0"), ARP_TAGS[kind], target))
    if kind == "frag6-short":
        # Destination options before the fragment header (they are in every
        # fragment) carry the marker; the UDP header is not in this one.
        pad = marker + b"\0" * (-(len(marker) + 4) % 8)
        dstopts = struct.pack("!BBBB", 44, (len(pad) + 4) // 8 - 1, 1, len(pad)) + pad
        frag = struct.pack("!BBHI", 17, 0, 0x0001, 0x4C4F)
        payload = dstopts + frag
        ip6 = struct.pack("!IHBB16s16s", 0x60000000, len(payload), 60, 64, v6(k["ip6"]), v6(k["other_ip6"]))
        return ether(mac(k["other_mac"]), own_mac, 0x86DD, ip6 + payload)
    if kind == "ll-other-mac":
        lldp = struct.pack("!HH", 0x0207, 0) + marker
        return ether(bytes.fromhex("0180c200000e"), mac(k["other_mac"]), 0x88CC, lldp)
    sys.exit(f"unknown kind {kind}")


def dhcp_fragments(k):
    """A DHCPDISCOVER for k["chaddr"] from the sender's own address, cut
    after 24 bytes of BOOTP (chaddr is at 28): two IPv4 fragments."""
    discover = bootp(1, mac(k["chaddr"]), b"\0" * 4, b"LINNET-dhcp-frag", bytes([53, 1, 1, 255]))
    udp = struct.pack("!HHHH", 68, 67, 8 + len(discover), 0) + discover
    own_mac, src, dst = mac(k["mac"]), v4(k["ip"]), v4("255.255.255.255")
    frames = []
    for offset, piece, more in ((0, udp[:32], 0x2000), (32, udp[32:], 0)):
        header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(piece), 0x4C4E, more | (offset // 8), 64, 17, 0, src, dst)
        header = header[:10] + struct.pack("!H", checksum(header)) + header[12:]
        frames.append(ether(BROADCAST, own_mac, 0x0800, header + piece))
    return frames


def send(iface, kind, keys):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    frames = dhcp_fragments(keys) if kind == "dhcp-frag" else [frame(kind, keys)]
    for _ in range(int(keys.get("count", "1"))):
        for f in frames:
            s.send(f)


def capture(iface, seconds):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.bind((iface, 0))
    s.settimeout(0.1)
    print("capturing", flush=True)
    seen = set()
    end = time.monotonic() + seconds
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    while time.monotonic() < end and not stopped:
        try:
            data = s.recv(65535)
        except socket.timeout:
            continue
        at = data.find(b"LINNET-")
        if at >= 0:
            stop = at + 7
            while stop < len(data) and (chr(data[stop]).isalnum() or data[stop] == ord("-")):
                stop += 1
            seen.add(data[at:stop].decode())
        if data[12:14] == b"\x08\x06":
            for kind, tag in ARP_TAGS.items():
                if data[32:38] == tag:
                    seen.add(f"LINNET-{kind}")
    for marker in sorted(seen):
        print(marker)


if __name__ == "__main__":
    if sys.argv[1:2] == ["send"]:
        keys = dict(arg.split("=", 1) for arg in sys.argv[4:])
        send(sys.argv[2], sys.argv[3], keys)
    elif sys.argv[1:2] == ["capture"]:
        capture(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit(__doc__)
