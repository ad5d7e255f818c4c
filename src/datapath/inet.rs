//! Just enough of Ethernet, IPv4, IPv6 and TCP for the relay's offloads
//! (coalesce.rs, segment.rs): where the IP header is, lengths and
//! checksums. Callers check a frame's lengths before using these.

pub const ETH_HEADER: usize = 14;
/// With one 802.1Q tag.
pub const ETH_HEADER_TAGGED: usize = 18;
pub const IPV4_HEADER: usize = 20;
pub const IPV6_HEADER: usize = 40;
pub const PROTO_TCP: u8 = 6;
pub const TCP_HEADER: usize = 20;
/// Offsets in the TCP header.
pub const TCP_SEQ: usize = 4;
pub const TCP_FLAGS: usize = 13;
pub const TCP_CHECKSUM: usize = 16;
/// TCP flags.
pub const TCP_FIN: u8 = 0x01;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_CWR: u8 = 0x80;
/// An IP packet's length field tops out here.
pub const MAX_IP_PACKET: usize = 65535;

/// Where a frame's IP header starts and whether it is IPv6: after the
/// Ethernet header, or after one 802.1Q tag.
pub fn ip_offset(frame: &[u8]) -> Option<(usize, bool)> {
    let (at, ethertype) = match frame.get(12..14)? {
        [0x81, 0x00] => (ETH_HEADER_TAGGED, frame.get(16..18)?),
        ethertype => (ETH_HEADER, ethertype),
    };
    match ethertype {
        [0x08, 0x00] => Some((at, false)),
        [0x86, 0xdd] => Some((at, true)),
        _ => None,
    }
}

/// Where the TCP header starts if the IP header at `ip` (complete in the
/// frame) carries TCP directly: IPv4 with any options, IPv6 without
/// extension headers.
pub fn tcp_offset(frame: &[u8], ip: usize, v6: bool) -> Option<usize> {
    if v6 {
        let header = frame.get(ip..ip + IPV6_HEADER)?;
        (header[0] >> 4 == 6 && header[6] == PROTO_TCP).then_some(ip + IPV6_HEADER)
    } else {
        let first = *frame.get(ip)?;
        let len = (first & 0x0f) as usize * 4;
        let header = frame.get(ip..ip + len)?;
        (first >> 4 == 4 && len >= IPV4_HEADER && header[9] == PROTO_TCP).then_some(ip + len)
    }
}

/// Sets the length field of the IP header at `ip` for the frame's size and,
/// for IPv4, recomputes the header checksum.
pub fn set_ip_length(frame: &mut [u8], ip: usize, v6: bool) {
    if v6 {
        let payload = (frame.len() - ip - IPV6_HEADER) as u16;
        frame[ip + 4..ip + 6].copy_from_slice(&payload.to_be_bytes());
    } else {
        let total = (frame.len() - ip) as u16;
        frame[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
        frame[ip + 10..ip + 12].fill(0);
        let len = (frame[ip] & 0x0f) as usize * 4;
        let sum = !fold(sum16(&frame[ip..ip + len], 0));
        frame[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
    }
}

/// The one's-complement sum of the TCP pseudo-header (addresses of the IP
/// header at `ip`, protocol, `tcp_len`), unfolded.
pub fn tcp_pseudo_header(frame: &[u8], ip: usize, v6: bool, tcp_len: usize) -> u64 {
    let addresses = if v6 {
        &frame[ip + 8..ip + 40]
    } else {
        &frame[ip + 12..ip + 20]
    };
    sum16(addresses, PROTO_TCP as u64 + tcp_len as u64)
}

/// Adds `data` as big-endian 16-bit words (a trailing byte padded with zero)
/// to `sum`, without folding.
pub fn sum16(data: &[u8], mut sum: u64) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        // Two 32-bit halves: 2^16 = 1 in one's-complement arithmetic, so
        // they add up to the same as their four 16-bit words.
        let word = u64::from_be_bytes(c.try_into().expect("8 bytes"));
        sum += (word >> 32) + (word & 0xffff_ffff);
    }
    let mut rest = chunks.remainder().chunks_exact(2);
    for pair in &mut rest {
        sum += u16::from_be_bytes([pair[0], pair[1]]) as u64;
    }
    if let [last] = rest.remainder() {
        sum += (*last as u64) << 8;
    }
    sum
}

/// Folds a one's-complement sum to 16 bits.
pub fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Frames for the offloads' tests.
#[cfg(test)]
pub mod testing {
    use super::*;

    /// The TCP header's length in these frames: with a timestamp option.
    pub const TCP_WITH_OPTIONS: usize = 32;

    /// An untagged TCP segment over IPv4 or IPv6 with right checksums, a
    /// timestamp option and `payload`.
    pub fn tcp_frame(v6: bool, seq: u32, payload: &[u8], flags: u8) -> Vec<u8> {
        let ip = ETH_HEADER;
        let l4 = ip + if v6 { IPV6_HEADER } else { IPV4_HEADER };
        let mut f = vec![0u8; l4 + TCP_WITH_OPTIONS + payload.len()];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        if v6 {
            f[12..14].copy_from_slice(&[0x86, 0xdd]);
            f[ip] = 0x60;
            f[ip + 6] = PROTO_TCP;
            f[ip + 7] = 64;
            f[ip + 8..ip + 24]
                .copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            f[ip + 24..ip + 40]
                .copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        } else {
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[ip] = 0x45;
            f[ip + 4..ip + 6].copy_from_slice(&(seq as u16).to_be_bytes());
            f[ip + 6] = 0x40; // DF
            f[ip + 8] = 64;
            f[ip + 9] = PROTO_TCP;
            f[ip + 12..ip + 16].copy_from_slice(&[192, 168, 105, 2]);
            f[ip + 16..ip + 20].copy_from_slice(&[192, 168, 105, 1]);
        }
        set_ip_length(&mut f, ip, v6);
        f[l4..l4 + 4].copy_from_slice(&[0xc0, 0x00, 0x14, 0x51]);
        f[l4 + TCP_SEQ..l4 + TCP_SEQ + 4].copy_from_slice(&seq.to_be_bytes());
        f[l4 + 8..l4 + 12].copy_from_slice(&7u32.to_be_bytes());
        f[l4 + 12] = ((TCP_WITH_OPTIONS / 4) as u8) << 4;
        f[l4 + TCP_FLAGS] = flags;
        f[l4 + 14..l4 + 16].copy_from_slice(&502u16.to_be_bytes());
        f[l4 + 20..l4 + 32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3]);
        f[l4 + TCP_WITH_OPTIONS..].copy_from_slice(payload);
        fix_tcp_checksum(&mut f);
        f
    }

    /// Recomputes an untagged frame's TCP checksum.
    pub fn fix_tcp_checksum(f: &mut [u8]) {
        let (ip, v6) = ip_offset(f).expect("IP");
        let l4 = tcp_offset(f, ip, v6).expect("TCP");
        f[l4 + TCP_CHECKSUM..l4 + TCP_CHECKSUM + 2].fill(0);
        let sum = !fold(sum16(&f[l4..], tcp_pseudo_header(f, ip, v6, f.len() - l4)));
        f[l4 + TCP_CHECKSUM..l4 + TCP_CHECKSUM + 2].copy_from_slice(&sum.to_be_bytes());
    }

    /// Whether an untagged frame's IP (v4) and TCP checksums are right.
    pub fn checksums_ok(f: &[u8]) -> bool {
        let (ip, v6) = ip_offset(f).expect("IP");
        let l4 = tcp_offset(f, ip, v6).expect("TCP");
        let ip_ok = v6 || fold(sum16(&f[ip..l4], 0)) == 0xffff;
        ip_ok && fold(sum16(&f[l4..], tcp_pseudo_header(f, ip, v6, f.len() - l4))) == 0xffff
    }

    pub fn payload(n: usize, fill: u8) -> Vec<u8> {
        (0..n).map(|i| fill.wrapping_add(i as u8)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_match_a_word_by_word_sum_at_every_alignment() {
        let data: Vec<u8> = (0..1001u32).map(|i| (i * 7) as u8).collect();
        for start in 0..8 {
            let mut expect = 0u64;
            for pair in data[start..].chunks(2) {
                expect += u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]) as u64;
            }
            assert_eq!(fold(sum16(&data[start..], 0)), fold(expect));
        }
    }

    #[test]
    fn ip_and_tcp_headers_are_found_with_and_without_a_vlan_tag() {
        let mut f = testing::tcp_frame(false, 1, b"x", TCP_ACK);
        assert_eq!(ip_offset(&f), Some((ETH_HEADER, false)));
        assert_eq!(
            tcp_offset(&f, ETH_HEADER, false),
            Some(ETH_HEADER + IPV4_HEADER)
        );
        f.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
        assert_eq!(ip_offset(&f), Some((ETH_HEADER_TAGGED, false)));
        let v6 = testing::tcp_frame(true, 1, b"x", TCP_ACK);
        assert_eq!(
            tcp_offset(&v6, ETH_HEADER, true),
            Some(ETH_HEADER + IPV6_HEADER)
        );
        let mut udp = v6.clone();
        udp[ETH_HEADER + 6] = 17;
        assert_eq!(tcp_offset(&udp, ETH_HEADER, true), None);
        assert_eq!(tcp_offset(&v6[..40], ETH_HEADER, true), None, "cut short");
    }
}
