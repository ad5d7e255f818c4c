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
//! or one with PSH ends the run, as the kernel's GRO does. A segment with no
//! room behind it for another as large (at MTU 65520, every full one) starts
//! no run: it passes untouched, its checksum left to the kernel, at the
//! price of never merging a short tail into it.

use super::inet::{
    ETH_HEADER, IPV4_HEADER, IPV6_HEADER, MAX_IP_PACKET, TCP_ACK, TCP_CHECKSUM, TCP_FLAGS,
    TCP_HEADER, TCP_PSH, TCP_SEQ, fold, ip_offset, set_ip_length, sum16, tcp_offset,
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
    /// A TCP segment with data and only ACK (and PSH) set, in an untagged
    /// frame: IPv4 without options or fragmentation and with a right header
    /// checksum, or IPv6 without extension headers; the IP length matching
    /// the frame's (no Ethernet padding).
    fn parse(frame: &[u8]) -> Option<Segment> {
        let (ip, v6) = ip_offset(frame)?;
        if ip != ETH_HEADER {
            return None;
        }
        let l4 = tcp_offset(frame, ip, v6)?;
        let field = |at: usize| u16::from_be_bytes([frame[ip + at], frame[ip + at + 1]]) as usize;
        let ip_ok = if v6 {
            field(4) + IPV6_HEADER == frame.len() - ip
        } else {
            l4 == ip + IPV4_HEADER
                && field(6) & 0x3fff == 0
                && field(2) == frame.len() - ip
                && fold(sum16(&frame[ip..l4], 0)) == 0xffff
        };
        let tcp = frame.get(l4..l4 + TCP_HEADER)?;
        let headers = l4 + (tcp[12] >> 4) as usize * 4;
        let flags = tcp[TCP_FLAGS];
        if !ip_ok
            || headers < l4 + TCP_HEADER
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
        let payload = frame.len() - seg.headers;
        // A segment with no room behind it for another as large (at MTU
        // 65520 every full one) would be a run of one: leave it as it is,
        // without summing 64 KiB for a checksum the kernel checks anyway.
        if frame.len() + payload > ETH_HEADER + MAX_IP_PACKET || !checksum_ok(frame, &seg) {
            return false;
        }
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
            let gso = vnet::Header {
                flags: vnet::F_NEEDS_CSUM,
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
    set_ip_length(frame, ETH_HEADER, first.v6);
    let pseudo = fold(tcp_pseudo_header(
        frame,
        ETH_HEADER,
        first.v6,
        frame.len() - first.l4,
    ));
    let at = first.l4 + TCP_CHECKSUM;
    frame[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
}

/// Whether a segment's TCP checksum is right.
fn checksum_ok(frame: &[u8], seg: &Segment) -> bool {
    let tcp_len = frame.len() - seg.l4;
    fold(sum16(
        &frame[seg.l4..],
        tcp_pseudo_header(frame, ETH_HEADER, seg.v6, tcp_len),
    )) == 0xffff
}

#[cfg(test)]
mod tests {
    use super::super::inet::testing::{TCP_WITH_OPTIONS, fix_tcp_checksum, payload, tcp_frame};
    use super::*;

    const MSS: usize = 1448;

    /// The fields of a run's virtio-net header.
    fn header_of(run: &Run) -> vnet::Header {
        vnet::Header::read(&run.data[..vnet::LEGACY_LEN])
    }

    fn a_run_of_segments_becomes_one_gso_frame(v6: bool) {
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        let parts: Vec<Vec<u8>> = (0..4).map(|i| payload(MSS, i as u8)).collect();
        let last = payload(100, 9);
        let seq = |i: usize| 1000 + (i * MSS) as u32;
        assert!(c.start(&tcp_frame(v6, seq(0), &parts[0], TCP_ACK)));
        for (i, p) in parts.iter().enumerate().skip(1) {
            assert!(c.append(&tcp_frame(v6, seq(i), p, TCP_ACK)));
        }
        assert!(c.append(&tcp_frame(v6, seq(4), &last, TCP_ACK | TCP_PSH)));
        // The short segment closed the run.
        assert!(!c.append(&tcp_frame(v6, seq(4) + 100, &last, TCP_ACK)));
        let run = c.finish().expect("a run");
        assert_eq!(run.frames, 5);
        let l4 = ETH_HEADER + if v6 { IPV6_HEADER } else { IPV4_HEADER };
        let header = header_of(&run);
        assert_eq!(
            (
                header.flags,
                header.gso_type,
                header.header_len,
                header.segment_size
            ),
            (
                vnet::F_NEEDS_CSUM,
                if v6 { vnet::GSO_TCPV6 } else { vnet::GSO_TCPV4 },
                (l4 + TCP_WITH_OPTIONS) as u16,
                MSS as u16
            )
        );
        assert_eq!(
            (header.csum_start, header.csum_offset),
            (l4 as u16, TCP_CHECKSUM as u16)
        );
        let frame = &run.data[vnet::LEGACY_LEN..];
        let all: Vec<u8> = parts.concat().into_iter().chain(last).collect();
        assert_eq!(&frame[l4 + TCP_WITH_OPTIONS..], &all[..]);
        let ip_len = u16::from_be_bytes(if v6 {
            [frame[18], frame[19]]
        } else {
            [frame[16], frame[17]]
        }) as usize;
        let expected_len = frame.len() - ETH_HEADER - if v6 { IPV6_HEADER } else { 0 };
        assert_eq!(ip_len, expected_len);
        if !v6 {
            assert_eq!(
                fold(sum16(&frame[14..34], 0)),
                0xffff,
                "IPv4 header checksum"
            );
        }
        assert_eq!(frame[l4 + TCP_FLAGS], TCP_ACK | TCP_PSH);
        // The TCP checksum field holds the pseudo-header sum: adding the
        // segment's bytes (with that field as is) completes it.
        let pseudo = fold(tcp_pseudo_header(frame, ETH_HEADER, v6, frame.len() - l4));
        assert_eq!(u16::from_be_bytes([frame[l4 + 16], frame[l4 + 17]]), pseudo);
        assert!(c.finish().is_none());
    }

    #[test]
    fn a_run_of_ipv4_segments_becomes_one_gso_frame() {
        a_run_of_segments_becomes_one_gso_frame(false);
    }

    #[test]
    fn a_run_of_ipv6_segments_becomes_one_gso_frame() {
        a_run_of_segments_becomes_one_gso_frame(true);
    }

    #[test]
    fn a_lone_segment_goes_out_unchanged_behind_a_zero_header() {
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        let f = tcp_frame(false, 5, &payload(MSS, 1), TCP_ACK);
        assert!(c.start(&f));
        let run = c.finish().expect("a run");
        assert_eq!(run.frames, 1);
        assert_eq!(&run.data[..10], &[0; 10]);
        assert_eq!(&run.data[10..], &f[..]);
    }

    #[test]
    fn segments_that_do_not_continue_the_run_are_refused() {
        let l4 = ETH_HEADER + IPV4_HEADER;
        let next = |change: &dyn Fn(&mut Vec<u8>)| {
            let mut f = tcp_frame(false, MSS as u32, &payload(MSS, 0), TCP_ACK);
            change(&mut f);
            fix_tcp_checksum(&mut f);
            f
        };
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        assert!(c.start(&tcp_frame(false, 0, &payload(MSS, 0), TCP_ACK)));
        let gap = tcp_frame(false, 2 * MSS as u32, &payload(MSS, 0), TCP_ACK);
        assert!(!c.append(&gap), "a gap in the sequence");
        let larger = tcp_frame(false, MSS as u32, &payload(MSS + 1, 0), TCP_ACK);
        assert!(!c.append(&larger), "larger than the first");
        assert!(!c.append(&next(&|f| f[l4 + 11] ^= 1)), "another ACK number");
        assert!(!c.append(&next(&|f| f[l4 + 27] ^= 1)), "another timestamp");
        assert!(!c.append(&next(&|f| f[l4 + 13] |= 0x01)), "FIN");
        let mut bad = next(&|_| {});
        bad[100] ^= 0xff;
        assert!(!c.append(&bad), "a bad TCP checksum");
        let mut bad_ip = next(&|_| {});
        bad_ip[ETH_HEADER + 8] ^= 1;
        assert!(!c.append(&bad_ip), "a bad IPv4 header checksum");
        assert!(c.append(&next(&|_| {})), "the right one still joins");
        assert_eq!(c.finish().expect("a run").frames, 2);
    }

    #[test]
    fn a_segment_too_large_for_another_to_join_starts_no_run() {
        // The largest payload that leaves room for a second as large.
        let half = (MAX_IP_PACKET - IPV4_HEADER - TCP_WITH_OPTIONS) / 2;
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        assert!(!c.start(&tcp_frame(false, 0, &payload(half + 1, 0), TCP_ACK)));
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        assert!(c.start(&tcp_frame(false, 0, &payload(half, 0), TCP_ACK)));
        let second = tcp_frame(false, half as u32, &payload(half, 1), TCP_ACK);
        assert!(c.append(&second), "a second as large fits");
        assert_eq!(c.finish().expect("a run").frames, 2);
    }

    #[test]
    fn only_tcp_data_segments_start_a_run() {
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        assert!(!c.start(&tcp_frame(false, 0, &[], TCP_ACK)), "a bare ACK");
        let syn = tcp_frame(false, 0, &payload(10, 0), TCP_ACK | 0x02);
        assert!(!c.start(&syn), "SYN");
        let mut udp = tcp_frame(false, 0, &payload(10, 0), TCP_ACK);
        udp[ETH_HEADER + 9] = 17;
        assert!(!c.start(&udp));
        let mut arp = tcp_frame(false, 0, &payload(10, 0), TCP_ACK);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!c.start(&arp));
        let mut padded = tcp_frame(false, 0, &payload(10, 0), TCP_ACK);
        padded.extend_from_slice(&[0; 4]);
        assert!(
            !c.start(&padded),
            "Ethernet padding: the IP length disagrees"
        );
        let mut tagged = tcp_frame(false, 0, &payload(10, 0), TCP_ACK);
        tagged.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
        assert!(!c.start(&tagged), "VLAN-tagged frames pass as they are");
        assert!(c.finish().is_none());
    }
}
