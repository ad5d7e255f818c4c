//! Receive coalescing for VMMs that send bare frames (no virtio-net header):
//! a run of TCP segments of one flow, in order, within one batch from the
//! VMM becomes one GSO frame behind a virtio-net header, so the host's stack
//! handles one packet of up to 64 KiB instead of forty MTU-sized ones. This
//! is what GRO does for a NIC; a VMM that speaks the header sends such
//! frames itself, and everything that is not a plain TCP data segment
//! passes untouched.
//!
//! A segment joins the run only if its checksum is right (the kernel will
//! not check a GSO frame's again), it follows the previous one exactly
//! (sequence number), and every header field but the length, IP ID,
//! checksums and PSH matches, options (timestamps) included. A short segment
//! or one with PSH ends the run, as the kernel's GRO does.

use super::inet::{
    ETH_HEADER, ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPV4_HEADER, IPV6_HEADER, MAX_IP_PACKET, PROTO_TCP,
    TCP_ACK, TCP_CHECKSUM, TCP_FLAGS, TCP_HEADER, TCP_PSH, TCP_SEQ, fold, set_ip_length, sum16,
    tcp_pseudo_header,
};
use super::vnet;

/// One TCP data segment, located in its frame.
#[derive(Clone, Copy)]
struct Segment {
    v6: bool,
    /// Start of the TCP header; the IP header starts at ETH_HEADER.
    l4: usize,
    /// End of the TCP header: the payload starts here.
    headers: usize,
    seq: u32,
    psh: bool,
}

impl Segment {
    /// A TCP segment with data and only ACK (and PSH) set, in an IPv4 packet
    /// without options or fragmentation or an IPv6 packet without extension
    /// headers, filling the frame exactly (no Ethernet padding).
    fn parse(frame: &[u8]) -> Option<Segment> {
        let ip = frame.get(ETH_HEADER..)?;
        let (v6, l4) = match [frame[12], frame[13]] {
            ETHERTYPE_IPV4 => {
                let header = ip.get(..IPV4_HEADER)?;
                let total = u16::from_be_bytes([header[2], header[3]]) as usize;
                let fragment = u16::from_be_bytes([header[6], header[7]]) & 0x3fff;
                if header[0] != 0x45 || header[9] != PROTO_TCP || fragment != 0 || total != ip.len()
                {
                    return None;
                }
                (false, ETH_HEADER + IPV4_HEADER)
            }
            ETHERTYPE_IPV6 => {
                let header = ip.get(..IPV6_HEADER)?;
                let payload = u16::from_be_bytes([header[4], header[5]]) as usize;
                if header[0] >> 4 != 6
                    || header[6] != PROTO_TCP
                    || payload + IPV6_HEADER != ip.len()
                {
                    return None;
                }
                (true, ETH_HEADER + IPV6_HEADER)
            }
            _ => return None,
        };
        let tcp = frame.get(l4..l4 + TCP_HEADER)?;
        let headers = l4 + (tcp[12] >> 4) as usize * 4;
        let flags = tcp[TCP_FLAGS];
        if headers < l4 + TCP_HEADER
            || frame.len() <= headers
            || flags & !(TCP_ACK | TCP_PSH) != 0
            || flags & TCP_ACK == 0
        {
            return None;
        }
        Some(Segment {
            v6,
            l4,
            headers,
            seq: u32::from_be_bytes(tcp[TCP_SEQ..TCP_SEQ + 4].try_into().expect("4 bytes")),
            psh: flags & TCP_PSH != 0,
        })
    }
}

/// The run being built: a virtio-net header, then the first segment's
/// headers, then every segment's payload.
pub struct Coalescer {
    buf: Box<[u8]>,
    /// The TAP's virtio-net header length, in front of the frame in `buf`.
    vnet_len: usize,
    /// The run's frame length (0: no run).
    len: usize,
    first: Option<Segment>,
    /// Payload bytes of the first segment: every segment but the last has
    /// exactly this many.
    mss: usize,
    next_seq: u32,
    /// No segment may join: the last one was short or had PSH.
    closed: bool,
    segments: u64,
    /// The original frames' bytes, for the counters.
    bytes: u64,
}

/// What a finished run writes to the TAP, and what it stands for.
pub struct Run<'a> {
    /// The virtio-net header and the frame.
    pub data: &'a [u8],
    pub frames: u64,
    pub bytes: u64,
}

impl Coalescer {
    pub fn new(vnet_len: usize) -> Coalescer {
        Coalescer {
            buf: vec![0; vnet_len + ETH_HEADER + MAX_IP_PACKET].into_boxed_slice(),
            vnet_len,
            len: 0,
            first: None,
            mss: 0,
            next_seq: 0,
            closed: false,
            segments: 0,
            bytes: 0,
        }
    }

    /// Starts a run with `frame` if it is a TCP data segment that may begin
    /// one; `false` leaves the frame to the caller.
    pub fn start(&mut self, frame: &[u8]) -> bool {
        debug_assert!(self.first.is_none(), "finish the run first");
        let Some(seg) = Segment::parse(frame) else {
            return false;
        };
        if !checksum_ok(frame, &seg) {
            return false;
        }
        let payload = frame.len() - seg.headers;
        self.buf[self.vnet_len..self.vnet_len + frame.len()].copy_from_slice(frame);
        self.len = frame.len();
        self.first = Some(seg);
        self.mss = payload;
        self.next_seq = seg.seq.wrapping_add(payload as u32);
        self.closed = seg.psh;
        self.segments = 1;
        self.bytes = frame.len() as u64;
        true
    }

    /// Adds `frame` to the run if it continues it; `false` when there is no
    /// run or the frame does not belong to it.
    pub fn append(&mut self, frame: &[u8]) -> bool {
        let Some(first) = self.first else {
            return false;
        };
        if self.closed || frame.len() <= first.headers {
            return false;
        }
        let Some(seg) = Segment::parse(frame) else {
            return false;
        };
        let payload = frame.len() - seg.headers;
        if seg.headers != first.headers
            || seg.seq != self.next_seq
            || payload > self.mss
            || self.len + payload > ETH_HEADER + MAX_IP_PACKET
            || !self.same_headers(frame, &first)
            || !checksum_ok(frame, &seg)
        {
            return false;
        }
        let at = self.vnet_len + self.len;
        self.buf[at..at + payload].copy_from_slice(&frame[seg.headers..]);
        self.len += payload;
        self.next_seq = seg.seq.wrapping_add(payload as u32);
        self.closed = seg.psh || payload < self.mss;
        if seg.psh {
            // The merged segment carries the last one's PSH.
            self.buf[self.vnet_len + first.l4 + TCP_FLAGS] |= TCP_PSH;
        }
        self.segments += 1;
        self.bytes += frame.len() as u64;
        true
    }

    /// Whether `frame`'s headers match the run's first segment's in every
    /// byte but those that differ between segments of one flow.
    fn same_headers(&self, frame: &[u8], first: &Segment) -> bool {
        let run = &self.buf[self.vnet_len..self.vnet_len + first.headers];
        let frame = &frame[..first.headers];
        let ip = ETH_HEADER;
        let l4 = first.l4;
        let varying: &[(usize, usize)] = if first.v6 {
            // payload length
            &[(ip + 4, ip + 6)]
        } else {
            // total length, identification, header checksum
            &[(ip + 2, ip + 6), (ip + 10, ip + 12)]
        };
        let tcp_varying = [
            (l4 + TCP_SEQ, l4 + TCP_SEQ + 4),
            (l4 + TCP_FLAGS, l4 + TCP_FLAGS + 1),
            (l4 + TCP_CHECKSUM, l4 + TCP_CHECKSUM + 2),
        ];
        let mut from = 0;
        for &(start, end) in varying.iter().chain(&tcp_varying) {
            if run[from..start] != frame[from..start] {
                return false;
            }
            from = end;
        }
        run[from..] == frame[from..]
            && run[l4 + TCP_FLAGS] & !TCP_PSH == frame[l4 + TCP_FLAGS] & !TCP_PSH
    }

    /// Ends the run: the frame to write, with its virtio-net header. A run
    /// of one segment is the original frame behind an all-zero header.
    pub fn finish(&mut self) -> Option<Run<'_>> {
        let first = self.first.take()?;
        let header = &mut self.buf[..self.vnet_len];
        header.fill(0);
        if self.segments > 1 {
            let frame = &mut self.buf[self.vnet_len..self.vnet_len + self.len];
            seal(frame, &first);
            let gso = vnet::GsoHeader {
                gso_type: if first.v6 {
                    vnet::GSO_TCPV6
                } else {
                    vnet::GSO_TCPV4
                },
                header_len: first.headers as u16,
                segment_size: self.mss as u16,
                csum_start: first.l4 as u16,
                csum_offset: TCP_CHECKSUM as u16,
            };
            gso.write(&mut self.buf[..self.vnet_len]);
        }
        Some(Run {
            data: &self.buf[..self.vnet_len + self.len],
            frames: self.segments,
            bytes: self.bytes,
        })
    }
}

/// Fixes the merged frame's lengths and checksums: the IP length (and
/// IPv4 header checksum), and in the TCP checksum field the pseudo-header
/// sum the kernel expects of a frame whose checksum it completes
/// (CHECKSUM_PARTIAL).
fn seal(frame: &mut [u8], first: &Segment) {
    set_ip_length(frame, first.v6);
    let pseudo = fold(tcp_pseudo_header(frame, first.v6, frame.len() - first.l4));
    let at = first.l4 + TCP_CHECKSUM;
    frame[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
}

/// Whether a segment's TCP checksum is right.
fn checksum_ok(frame: &[u8], seg: &Segment) -> bool {
    let tcp_len = frame.len() - seg.l4;
    fold(sum16(
        &frame[seg.l4..],
        tcp_pseudo_header(frame, seg.v6, tcp_len),
    )) == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: usize = 1448;

    /// A TCP/IPv4 frame with a right checksum and a timestamp option.
    fn segment4(seq: u32, payload: &[u8], flags: u8) -> Vec<u8> {
        let mut f = vec![0u8; ETH_HEADER + IPV4_HEADER + 32 + payload.len()];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4);
        let ip = ETH_HEADER;
        f[ip] = 0x45;
        let total = (f.len() - ip) as u16;
        f[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
        f[ip + 4..ip + 6].copy_from_slice(&(seq as u16).to_be_bytes());
        f[ip + 6] = 0x40; // DF
        f[ip + 8] = 64;
        f[ip + 9] = PROTO_TCP;
        f[ip + 12..ip + 16].copy_from_slice(&[192, 168, 105, 2]);
        f[ip + 16..ip + 20].copy_from_slice(&[192, 168, 105, 1]);
        let sum = !fold(sum16(&f[ip..ip + IPV4_HEADER], 0));
        f[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
        let l4 = ip + IPV4_HEADER;
        f[l4..l4 + 4].copy_from_slice(&[0xc0, 0x00, 0x14, 0x51]);
        f[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        f[l4 + 8..l4 + 12].copy_from_slice(&7u32.to_be_bytes());
        f[l4 + 12] = 8 << 4;
        f[l4 + 13] = flags;
        f[l4 + 14..l4 + 16].copy_from_slice(&502u16.to_be_bytes());
        f[l4 + 20..l4 + 32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3]);
        f[l4 + 32..].copy_from_slice(payload);
        fix_tcp_checksum(&mut f, l4);
        f
    }

    fn fix_tcp_checksum(f: &mut [u8], l4: usize) {
        let seg = Segment::parse(f).unwrap_or(Segment {
            v6: false,
            l4,
            headers: l4 + 20,
            seq: 0,
            psh: false,
        });
        f[l4 + 16..l4 + 18].fill(0);
        let sum = !fold(sum16(&f[l4..], tcp_pseudo_header(f, seg.v6, f.len() - l4)));
        f[l4 + 16..l4 + 18].copy_from_slice(&sum.to_be_bytes());
    }

    fn payload(n: usize, fill: u8) -> Vec<u8> {
        (0..n).map(|i| fill.wrapping_add(i as u8)).collect()
    }

    /// Splits a coalesced frame back into segments the way the kernel's GSO
    /// does, checking the header it got.
    fn header_of(run: &Run) -> (u8, u8, u16, u16, u16, u16) {
        let h = &run.data[..10];
        let n = |i: usize| u16::from_ne_bytes([h[i], h[i + 1]]);
        (h[0], h[1], n(2), n(4), n(6), n(8))
    }

    #[test]
    fn a_run_of_segments_becomes_one_gso_frame() {
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        let parts: Vec<Vec<u8>> = (0..4).map(|i| payload(MSS, i as u8)).collect();
        let last = payload(100, 9);
        assert!(c.start(&segment4(1000, &parts[0], TCP_ACK)));
        for (i, p) in parts.iter().enumerate().skip(1) {
            assert!(c.append(&segment4(1000 + (i * MSS) as u32, p, TCP_ACK)));
        }
        assert!(c.append(&segment4(1000 + 4 * MSS as u32, &last, TCP_ACK | TCP_PSH)));
        // The short segment closed the run.
        assert!(!c.append(&segment4(1000 + 4 * MSS as u32 + 100, &last, TCP_ACK)));
        let run = c.finish().expect("a run");
        assert_eq!(run.frames, 5);
        let l4 = ETH_HEADER + IPV4_HEADER;
        assert_eq!(
            header_of(&run),
            (
                1,
                vnet::GSO_TCPV4,
                (l4 + 32) as u16,
                MSS as u16,
                l4 as u16,
                16
            )
        );
        let frame = &run.data[10..];
        let all: Vec<u8> = parts.concat().into_iter().chain(last).collect();
        assert_eq!(&frame[l4 + 32..], &all[..]);
        assert_eq!(
            u16::from_be_bytes([frame[16], frame[17]]) as usize,
            frame.len() - ETH_HEADER
        );
        assert_eq!(
            fold(sum16(&frame[14..34], 0)),
            0xffff,
            "IPv4 header checksum"
        );
        assert_eq!(frame[l4 + 13], TCP_ACK | TCP_PSH);
        // The TCP checksum field holds the pseudo-header sum: adding the
        // segment's bytes (with that field as is) completes it.
        let seg = Segment::parse(frame).expect("still a segment");
        let pseudo = fold(tcp_pseudo_header(frame, seg.v6, frame.len() - l4));
        assert_eq!(u16::from_be_bytes([frame[l4 + 16], frame[l4 + 17]]), pseudo);
        assert!(c.finish().is_none());
    }

    #[test]
    fn a_lone_segment_goes_out_unchanged_behind_a_zero_header() {
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        let f = segment4(5, &payload(MSS, 1), TCP_ACK);
        assert!(c.start(&f));
        let run = c.finish().expect("a run");
        assert_eq!(run.frames, 1);
        assert_eq!(&run.data[..10], &[0; 10]);
        assert_eq!(&run.data[10..], &f[..]);
    }

    #[test]
    fn segments_that_do_not_continue_the_run_are_refused() {
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        assert!(c.start(&segment4(0, &payload(MSS, 0), TCP_ACK)));
        // A gap in the sequence.
        assert!(!c.append(&segment4(2 * MSS as u32, &payload(MSS, 0), TCP_ACK)));
        // Larger than the first.
        assert!(!c.append(&segment4(MSS as u32, &payload(MSS + 1, 0), TCP_ACK)));
        // Another ACK number.
        let mut other = segment4(MSS as u32, &payload(MSS, 0), TCP_ACK);
        other[ETH_HEADER + IPV4_HEADER + 11] ^= 1;
        fix_tcp_checksum(&mut other, ETH_HEADER + IPV4_HEADER);
        assert!(!c.append(&other));
        // Another timestamp.
        let mut other = segment4(MSS as u32, &payload(MSS, 0), TCP_ACK);
        other[ETH_HEADER + IPV4_HEADER + 27] ^= 1;
        fix_tcp_checksum(&mut other, ETH_HEADER + IPV4_HEADER);
        assert!(!c.append(&other));
        // A bad checksum.
        let mut bad = segment4(MSS as u32, &payload(MSS, 0), TCP_ACK);
        bad[100] ^= 0xff;
        assert!(!c.append(&bad));
        // FIN.
        assert!(!c.append(&segment4(MSS as u32, &payload(MSS, 0), TCP_ACK | 0x01)));
        // The right one still joins.
        assert!(c.append(&segment4(MSS as u32, &payload(MSS, 0), TCP_ACK)));
        assert_eq!(c.finish().expect("a run").frames, 2);
    }

    #[test]
    fn only_tcp_data_segments_start_a_run() {
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        assert!(!c.start(&segment4(0, &[], TCP_ACK)), "a bare ACK");
        assert!(
            !c.start(&segment4(0, &payload(10, 0), TCP_ACK | 0x02)),
            "SYN"
        );
        let mut udp = segment4(0, &payload(10, 0), TCP_ACK);
        udp[ETH_HEADER + 9] = 17;
        assert!(!c.start(&udp));
        let mut arp = segment4(0, &payload(10, 0), TCP_ACK);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!c.start(&arp));
        let mut padded = segment4(0, &payload(10, 0), TCP_ACK);
        padded.extend_from_slice(&[0; 4]);
        assert!(
            !c.start(&padded),
            "Ethernet padding: the IP length disagrees"
        );
        assert!(c.finish().is_none());
    }
}
