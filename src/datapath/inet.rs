//! Just enough of Ethernet, IPv4, IPv6 and TCP for the relay's offloads
//! (coalesce.rs, segment.rs): header offsets, lengths and checksums. Frames
//! are untagged Ethernet with the IP header right after it.

pub const ETH_HEADER: usize = 14;
pub const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
pub const ETHERTYPE_IPV6: [u8; 2] = [0x86, 0xdd];
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

/// The IP version of an untagged frame: `Some(true)` for IPv6.
pub fn is_ipv6(frame: &[u8]) -> Option<bool> {
    match frame.get(12..14)? {
        [0x08, 0x00] => Some(false),
        [0x86, 0xdd] => Some(true),
        _ => None,
    }
}

/// Sets the IP header's length field for the frame's size and, for IPv4,
/// recomputes the header checksum.
pub fn set_ip_length(frame: &mut [u8], v6: bool) {
    let ip = ETH_HEADER;
    if v6 {
        let payload = (frame.len() - ip - IPV6_HEADER) as u16;
        frame[ip + 4..ip + 6].copy_from_slice(&payload.to_be_bytes());
    } else {
        let total = (frame.len() - ip) as u16;
        frame[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
        frame[ip + 10..ip + 12].fill(0);
        let sum = !fold(sum16(&frame[ip..ip + IPV4_HEADER], 0));
        frame[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
    }
}

/// The one's-complement sum of the TCP pseudo-header (addresses, protocol,
/// `tcp_len`), unfolded.
pub fn tcp_pseudo_header(frame: &[u8], v6: bool, tcp_len: usize) -> u64 {
    let ip = ETH_HEADER;
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
}
