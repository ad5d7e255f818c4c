//! Segmentation for VMMs that take bare frames (no virtio-net header): the
//! TAP keeps its offloads on, so the host's stack hands over TCP frames of
//! up to 64 KiB with a checksum left to do, as it would to a NIC with TSO.
//! The relay cuts each into MTU-sized segments with their own headers and
//! checksums, and finishes the checksum of frames that only need that. The
//! host's stack then does its per-packet work once per 64 KiB, not once per
//! segment.
//!
//! The cut follows what the kernel's own GSO does: every segment carries the
//! original headers with its sequence number, IP length and ID advanced;
//! FIN and PSH stay on the last segment, CWR on the first.

use super::inet::{
    ETH_HEADER, TCP_CHECKSUM, TCP_CWR, TCP_FIN, TCP_FLAGS, TCP_HEADER, TCP_PSH, TCP_SEQ, fold,
    is_ipv6, set_ip_length, sum16, tcp_pseudo_header,
};
use super::vnet;

/// The kernel's GSO frame being cut.
#[derive(Clone, Copy)]
struct Plan {
    v6: bool,
    l4: usize,
    /// Ethernet, IP and TCP headers: the payload starts here.
    headers: usize,
    mss: usize,
    /// The next segment's payload offset in the frame.
    next: usize,
    /// Segments cut so far.
    cut: u16,
}

/// Why a frame from the TAP cannot be passed on.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Larger than the client's frames, and not a GSO frame to cut.
    TooLarge(usize),
    /// A GSO frame linnet does not cut (not TCP, or its headers do not fit).
    Unsupported,
}

/// One frame read from the TAP, with its virtio-net header in front, and
/// what is left to pass on of it.
pub struct Splitter {
    buf: Box<[u8]>,
    vnet_len: usize,
    /// The frame's length after the header; 0 when all of it was passed on.
    len: usize,
    plan: Option<Plan>,
}

impl Splitter {
    pub fn new(vnet_len: usize) -> Splitter {
        Splitter {
            buf: vec![0; vnet_len + vnet::GSO_MAX_FRAME + 64].into_boxed_slice(),
            vnet_len,
            len: 0,
            plan: None,
        }
    }

    /// Whether segments of the last frame are still to be passed on.
    pub fn pending(&self) -> bool {
        self.len > 0
    }

    /// Where the next read from the TAP goes: header, then frame.
    pub fn buffer(&mut self) -> &mut [u8] {
        debug_assert!(!self.pending(), "pass on the last frame first");
        &mut self.buf
    }

    /// Takes the `n` bytes the TAP put in `buffer()`. `max_frame` is the
    /// largest frame the client takes: a frame within it passes whole (its
    /// checksum finished if the kernel left it), a TCP GSO frame is cut.
    pub fn load(&mut self, n: usize, max_frame: usize) -> Result<(), Refused> {
        let header = &self.buf[..self.vnet_len];
        let flags = header[0];
        let gso_type = header[1] & !vnet::GSO_ECN;
        let field = |i: usize| u16::from_ne_bytes([header[i], header[i + 1]]) as usize;
        let (mss, csum_start, csum_offset) = (field(4), field(6), field(8));
        let len = n - self.vnet_len;
        let frame = &mut self.buf[self.vnet_len..n];
        if gso_type == vnet::GSO_NONE {
            if len > max_frame {
                return Err(Refused::TooLarge(len));
            }
            if flags & vnet::F_NEEDS_CSUM != 0 {
                finish_checksum(frame, csum_start, csum_offset).ok_or(Refused::Unsupported)?;
            }
            self.len = len;
            self.plan = None;
            return Ok(());
        }
        let v6 = is_ipv6(frame).ok_or(Refused::Unsupported)?;
        let expected = if v6 { vnet::GSO_TCPV6 } else { vnet::GSO_TCPV4 };
        let l4 = csum_start;
        let doff = frame.get(l4 + 12).ok_or(Refused::Unsupported)? >> 4;
        let headers = l4 + doff as usize * 4;
        if gso_type != expected
            || l4 < ETH_HEADER
            || doff < (TCP_HEADER / 4) as u8
            || mss == 0
            || headers >= len
            || headers + mss > max_frame
        {
            return Err(Refused::Unsupported);
        }
        self.len = len;
        self.plan = Some(Plan {
            v6,
            l4,
            headers,
            mss,
            next: headers,
            cut: 0,
        });
        Ok(())
    }

    /// Writes the next frame to pass on into `out` and returns its length,
    /// or `None` when the loaded frame is done. `out` holds `max_frame`.
    pub fn next(&mut self, out: &mut [u8]) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let frame = &self.buf[self.vnet_len..self.vnet_len + self.len];
        let Some(plan) = self.plan.as_mut() else {
            out[..frame.len()].copy_from_slice(frame);
            let len = frame.len();
            self.len = 0;
            return Some(len);
        };
        let take = plan.mss.min(frame.len() - plan.next);
        let seg_len = plan.headers + take;
        let out = &mut out[..seg_len];
        out[..plan.headers].copy_from_slice(&frame[..plan.headers]);
        out[plan.headers..].copy_from_slice(&frame[plan.next..plan.next + take]);
        let first = plan.cut == 0;
        let last = plan.next + take == frame.len();
        let l4 = plan.l4;
        let seq = u32::from_be_bytes(out[l4 + TCP_SEQ..l4 + TCP_SEQ + 4].try_into().expect("4"))
            .wrapping_add((plan.next - plan.headers) as u32);
        out[l4 + TCP_SEQ..l4 + TCP_SEQ + 4].copy_from_slice(&seq.to_be_bytes());
        if !last {
            out[l4 + TCP_FLAGS] &= !(TCP_FIN | TCP_PSH);
        }
        if !first {
            out[l4 + TCP_FLAGS] &= !TCP_CWR;
        }
        if !plan.v6 {
            let at = ETH_HEADER + 4;
            let id = u16::from_be_bytes([out[at], out[at + 1]]).wrapping_add(plan.cut);
            out[at..at + 2].copy_from_slice(&id.to_be_bytes());
        }
        set_ip_length(out, plan.v6);
        let check = l4 + TCP_CHECKSUM;
        out[check..check + 2].fill(0);
        let sum = tcp_pseudo_header(out, plan.v6, seg_len - l4);
        let sum = !fold(sum16(&out[l4..], sum));
        out[check..check + 2].copy_from_slice(&sum.to_be_bytes());
        plan.next += take;
        plan.cut = plan.cut.wrapping_add(1);
        if last {
            self.len = 0;
            self.plan = None;
        }
        Some(seg_len)
    }
}

/// Completes a checksum the kernel left to do: the one's-complement sum
/// from `start` to the end, into the field at `start + offset` (which holds
/// the pseudo-header's sum already). `None` if those point outside.
fn finish_checksum(frame: &mut [u8], start: usize, offset: usize) -> Option<()> {
    let at = start.checked_add(offset)?;
    if at + 2 > frame.len() {
        return None;
    }
    // A sum of 0 goes out as 0xffff, as the kernel sends it (UDP reads 0 as
    // "no checksum").
    let sum = match !fold(sum16(&frame[start..], 0)) {
        0 => 0xffff,
        sum => sum,
    };
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Some(())
}

#[cfg(test)]
mod tests {
    use super::super::coalesce::Coalescer;
    use super::super::inet::{ETHERTYPE_IPV4, IPV4_HEADER, PROTO_TCP, TCP_ACK};
    use super::*;

    const MSS: usize = 1448;
    const MAX_FRAME: usize = 1518;

    /// A GSO frame as the kernel hands it: one TCP/IPv4 packet with `len`
    /// bytes of payload, its checksum field holding the pseudo-header sum.
    fn gso_frame(len: usize, flags: u8) -> Vec<u8> {
        let l4 = ETH_HEADER + IPV4_HEADER;
        let mut f = vec![0u8; 10 + l4 + TCP_HEADER + len];
        let mut header = [0u8; 10];
        vnet::GsoHeader {
            gso_type: vnet::GSO_TCPV4,
            header_len: (l4 + TCP_HEADER) as u16,
            segment_size: MSS as u16,
            csum_start: l4 as u16,
            csum_offset: TCP_CHECKSUM as u16,
        }
        .write(&mut header);
        f[..10].copy_from_slice(&header);
        let frame = &mut f[10..];
        frame[12..14].copy_from_slice(&ETHERTYPE_IPV4);
        let ip = ETH_HEADER;
        frame[ip] = 0x45;
        frame[ip + 4..ip + 6].copy_from_slice(&100u16.to_be_bytes());
        frame[ip + 8] = 64;
        frame[ip + 9] = PROTO_TCP;
        frame[ip + 12..ip + 16].copy_from_slice(&[192, 168, 105, 1]);
        frame[ip + 16..ip + 20].copy_from_slice(&[192, 168, 105, 2]);
        set_ip_length(frame, false);
        frame[l4 + 4..l4 + 8].copy_from_slice(&1000u32.to_be_bytes());
        frame[l4 + 12] = 5 << 4;
        frame[l4 + TCP_FLAGS] = flags;
        for (i, b) in frame[l4 + TCP_HEADER..].iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let tcp_len = frame.len() - l4;
        let pseudo = fold(tcp_pseudo_header(frame, false, tcp_len));
        frame[l4 + 16..l4 + 18].copy_from_slice(&pseudo.to_be_bytes());
        f
    }

    fn load(s: &mut Splitter, frame: &[u8]) -> Result<(), Refused> {
        s.buffer()[..frame.len()].copy_from_slice(frame);
        s.load(frame.len(), MAX_FRAME)
    }

    #[test]
    fn a_gso_frame_is_cut_into_segments_that_coalesce_back_into_it() {
        let payload = 3 * MSS + 500;
        let original = gso_frame(payload, TCP_ACK | TCP_PSH | TCP_FIN);
        let mut s = Splitter::new(10);
        load(&mut s, &original).expect("a TCP GSO frame");
        let mut segments = vec![];
        let mut out = [0u8; MAX_FRAME];
        while let Some(n) = s.next(&mut out) {
            segments.push(out[..n].to_vec());
        }
        assert!(!s.pending());
        assert_eq!(
            segments.iter().map(Vec::len).collect::<Vec<_>>(),
            [1502, 1502, 1502, 554]
        );
        let l4 = ETH_HEADER + IPV4_HEADER;
        for (i, seg) in segments.iter().enumerate() {
            let last = i == segments.len() - 1;
            assert_eq!(fold(sum16(&seg[ETH_HEADER..l4], 0)), 0xffff, "IP checksum");
            let tcp_len = seg.len() - l4;
            let sum = sum16(&seg[l4..], tcp_pseudo_header(seg, false, tcp_len));
            assert_eq!(fold(sum), 0xffff, "TCP checksum of segment {i}");
            let flags = seg[l4 + TCP_FLAGS];
            assert_eq!(flags & (TCP_PSH | TCP_FIN) != 0, last);
            let id = u16::from_be_bytes([seg[ETH_HEADER + 4], seg[ETH_HEADER + 5]]);
            assert_eq!(id, 100 + i as u16);
        }
        // The coalescer, fed the segments, rebuilds the payload whole (FIN
        // keeps the last one out of the run, as in the kernel's GRO).
        let mut c = Coalescer::new(10);
        assert!(c.start(&segments[0]));
        assert!(c.append(&segments[1]));
        assert!(c.append(&segments[2]));
        assert!(!c.append(&segments[3]));
        let run = c.finish().expect("a run");
        assert_eq!(run.frames, 3);
        assert_eq!(
            &run.data[10 + l4 + 20..],
            &original[10 + l4 + 20..10 + l4 + 20 + 3 * MSS]
        );
    }

    #[test]
    fn a_small_frame_passes_whole_with_its_checksum_finished() {
        let original = gso_frame(200, TCP_ACK);
        let mut small = original.clone();
        small[1] = vnet::GSO_NONE;
        let mut s = Splitter::new(10);
        load(&mut s, &small).expect("fits");
        let mut out = [0u8; MAX_FRAME];
        let n = s.next(&mut out).expect("one frame");
        assert_eq!(n, small.len() - 10);
        let l4 = ETH_HEADER + IPV4_HEADER;
        let sum = sum16(&out[l4..n], tcp_pseudo_header(&out[..n], false, n - l4));
        assert_eq!(fold(sum), 0xffff);
        assert_eq!(s.next(&mut out), None);
    }

    #[test]
    fn frames_it_cannot_pass_on_are_refused() {
        let mut s = Splitter::new(10);
        let mut big = gso_frame(3000, TCP_ACK);
        big[1] = vnet::GSO_NONE;
        big[0] = 0;
        assert_eq!(load(&mut s, &big), Err(Refused::TooLarge(big.len() - 10)));
        let mut udp = gso_frame(3000, TCP_ACK);
        udp[1] = 5; // UDP_L4
        assert_eq!(load(&mut s, &udp), Err(Refused::Unsupported));
        let mut v6_claim = gso_frame(3000, TCP_ACK);
        v6_claim[1] = vnet::GSO_TCPV6;
        assert_eq!(load(&mut s, &v6_claim), Err(Refused::Unsupported));
        assert!(!s.pending());
    }
}
