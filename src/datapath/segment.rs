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
    TCP_CHECKSUM, TCP_CWR, TCP_FIN, TCP_FLAGS, TCP_HEADER, TCP_PSH, TCP_SEQ, fold, ip_offset,
    set_ip_length, sum16, tcp_offset, tcp_pseudo_header,
};
use super::vnet;

/// The kernel's GSO frame being cut.
#[derive(Clone, Copy)]
struct Plan {
    v6: bool,
    /// Where the IP header starts (after a VLAN tag, if any).
    ip: usize,
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
    /// A frame with offload work linnet does not do: a GSO frame that is not
    /// TCP straight over IPv4/IPv6, or a checksum to finish out of bounds.
    Unsupported,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooLarge(len) => write!(
                f,
                "a {len}-byte frame, larger than the network's MTU allows"
            ),
            Refused::Unsupported => f.write_str(
                "a frame with offload work linnet does not do (segmenting anything but TCP straight over IPv4/IPv6, or a checksum out of bounds)",
            ),
        }
    }
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

    /// Takes the `n` bytes the TAP put in `buffer()` (`n` covers at least
    /// the header). `max_frame` is the largest frame the client takes: a
    /// frame within it passes whole (its checksum finished if the kernel
    /// left it), a TCP GSO frame is cut.
    pub fn load(&mut self, n: usize, max_frame: usize) -> Result<(), Refused> {
        let header = vnet::Header::read(&self.buf[..self.vnet_len]);
        let len = n - self.vnet_len;
        let frame = &mut self.buf[self.vnet_len..n];
        let gso_type = header.gso_type & !vnet::GSO_ECN;
        if gso_type == vnet::GSO_NONE {
            if len > max_frame {
                return Err(Refused::TooLarge(len));
            }
            if header.flags & vnet::F_NEEDS_CSUM != 0 {
                let (start, offset) = (header.csum_start as usize, header.csum_offset as usize);
                finish_checksum(frame, start, offset).ok_or(Refused::Unsupported)?;
            }
            self.len = len;
            self.plan = None;
            return Ok(());
        }
        let (ip, v6) = ip_offset(frame).ok_or(Refused::Unsupported)?;
        let l4 = tcp_offset(frame, ip, v6).ok_or(Refused::Unsupported)?;
        let tcp = frame.get(l4..l4 + TCP_HEADER).ok_or(Refused::Unsupported)?;
        let headers = l4 + (tcp[12] >> 4) as usize * 4;
        let mss = header.segment_size as usize;
        let expected = if v6 { vnet::GSO_TCPV6 } else { vnet::GSO_TCPV4 };
        if gso_type != expected
            || header.csum_start as usize != l4
            || headers < l4 + TCP_HEADER
            || headers >= len
            || mss == 0
            || headers + mss > max_frame
        {
            return Err(Refused::Unsupported);
        }
        self.len = len;
        self.plan = Some(Plan {
            v6,
            ip,
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
            let at = plan.ip + 4;
            let id = u16::from_be_bytes([out[at], out[at + 1]]).wrapping_add(plan.cut);
            out[at..at + 2].copy_from_slice(&id.to_be_bytes());
        }
        set_ip_length(out, plan.ip, plan.v6);
        let check = l4 + TCP_CHECKSUM;
        out[check..check + 2].fill(0);
        let sum = tcp_pseudo_header(out, plan.ip, plan.v6, seg_len - l4);
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
    use super::super::inet::testing::{TCP_WITH_OPTIONS, checksums_ok, tcp_frame};
    use super::super::inet::{ETH_HEADER, IPV4_HEADER, IPV6_HEADER, TCP_ACK};
    use super::*;

    const MAX_FRAME: usize = 1518;
    /// The MSS at MTU 1500 with timestamps.
    const MSS: usize = 1448;
    const MSS6: usize = 1428;

    fn mss(v6: bool) -> usize {
        if v6 { MSS6 } else { MSS }
    }

    /// A GSO frame as the kernel hands it: one TCP packet with `len` bytes
    /// of payload behind a virtio-net header, its checksum field holding
    /// the pseudo-header sum.
    fn gso_frame(v6: bool, len: usize, flags: u8) -> Vec<u8> {
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut frame = tcp_frame(v6, 1000, &payload, flags);
        let l4 = ETH_HEADER + if v6 { IPV6_HEADER } else { IPV4_HEADER };
        let pseudo = fold(tcp_pseudo_header(&frame, ETH_HEADER, v6, frame.len() - l4));
        frame[l4 + 16..l4 + 18].copy_from_slice(&pseudo.to_be_bytes());
        let mut out = vec![0u8; vnet::LEGACY_LEN];
        vnet::Header {
            flags: vnet::F_NEEDS_CSUM,
            gso_type: if v6 { vnet::GSO_TCPV6 } else { vnet::GSO_TCPV4 },
            header_len: (l4 + TCP_WITH_OPTIONS) as u16,
            segment_size: mss(v6) as u16,
            csum_start: l4 as u16,
            csum_offset: TCP_CHECKSUM as u16,
        }
        .write(&mut out);
        out.extend(frame);
        out
    }

    fn load(s: &mut Splitter, frame: &[u8]) -> Result<(), Refused> {
        s.buffer()[..frame.len()].copy_from_slice(frame);
        s.load(frame.len(), MAX_FRAME)
    }

    fn cut(v6: bool) {
        let mss = mss(v6);
        let payload = 3 * mss + 500;
        let original = gso_frame(v6, payload, TCP_ACK | TCP_PSH | TCP_FIN);
        let mut s = Splitter::new(vnet::LEGACY_LEN);
        load(&mut s, &original).expect("a TCP GSO frame");
        let mut segments = vec![];
        let mut out = [0u8; MAX_FRAME];
        while let Some(n) = s.next(&mut out) {
            segments.push(out[..n].to_vec());
        }
        assert!(!s.pending());
        let l4 = ETH_HEADER + if v6 { IPV6_HEADER } else { IPV4_HEADER };
        let headers = l4 + TCP_WITH_OPTIONS;
        assert_eq!(
            segments.iter().map(Vec::len).collect::<Vec<_>>(),
            [headers + mss, headers + mss, headers + mss, headers + 500]
        );
        for (i, seg) in segments.iter().enumerate() {
            let last = i == segments.len() - 1;
            assert!(checksums_ok(seg), "checksums of segment {i}");
            let flags = seg[l4 + TCP_FLAGS];
            assert_eq!(flags & (TCP_PSH | TCP_FIN) != 0, last);
            if !v6 {
                let id = u16::from_be_bytes([seg[ETH_HEADER + 4], seg[ETH_HEADER + 5]]);
                assert_eq!(id, 1000 + i as u16);
            }
        }
        // The coalescer, fed the segments, rebuilds the payload whole (FIN
        // keeps the last one out of the run, as in the kernel's GRO).
        let mut c = Coalescer::new(vnet::LEGACY_LEN);
        assert!(c.start(&segments[0]));
        assert!(c.append(&segments[1]));
        assert!(c.append(&segments[2]));
        assert!(!c.append(&segments[3]));
        let run = c.finish().expect("a run");
        assert_eq!(run.frames, 3);
        let at = vnet::LEGACY_LEN + headers;
        assert_eq!(&run.data[at..], &original[at..at + 3 * mss]);
    }

    #[test]
    fn an_ipv4_gso_frame_is_cut_into_segments_that_coalesce_back_into_it() {
        cut(false);
    }

    #[test]
    fn an_ipv6_gso_frame_is_cut_into_segments_that_coalesce_back_into_it() {
        cut(true);
    }

    #[test]
    fn a_vlan_tagged_gso_frame_is_cut_too() {
        let mut tagged = gso_frame(false, 2 * MSS, TCP_ACK);
        let at = vnet::LEGACY_LEN + 12;
        tagged.splice(at..at, [0x81, 0x00, 0x00, 0x07]);
        let l4 = 18 + IPV4_HEADER;
        let mut header = vnet::Header::read(&tagged);
        header.csum_start = l4 as u16;
        header.write(&mut tagged);
        let mut s = Splitter::new(vnet::LEGACY_LEN);
        load(&mut s, &tagged).expect("a tagged TCP GSO frame");
        let mut out = [0u8; MAX_FRAME + 4];
        let mut n = 0;
        while let Some(len) = s.next(&mut out) {
            let seg = &out[..len];
            let tcp_len = len - l4;
            let sum = sum16(&seg[l4..], tcp_pseudo_header(seg, 18, false, tcp_len));
            assert_eq!(fold(sum), 0xffff);
            n += 1;
        }
        assert_eq!(n, 2);
    }

    #[test]
    fn a_small_frame_passes_whole_with_its_checksum_finished() {
        let mut small = gso_frame(false, 200, TCP_ACK);
        small[1] = vnet::GSO_NONE;
        let mut s = Splitter::new(vnet::LEGACY_LEN);
        load(&mut s, &small).expect("fits");
        let mut out = [0u8; MAX_FRAME];
        let n = s.next(&mut out).expect("one frame");
        assert_eq!(n, small.len() - vnet::LEGACY_LEN);
        assert!(checksums_ok(&out[..n]));
        assert_eq!(s.next(&mut out), None);
    }

    #[test]
    fn frames_it_cannot_pass_on_are_refused_without_harm() {
        let mut s = Splitter::new(vnet::LEGACY_LEN);
        let mut big = gso_frame(false, 3000, TCP_ACK);
        big[..2].copy_from_slice(&[0, vnet::GSO_NONE]);
        assert_eq!(load(&mut s, &big), Err(Refused::TooLarge(big.len() - 10)));
        let mut udp = gso_frame(false, 3000, TCP_ACK);
        udp[1] = 5; // UDP_L4
        assert_eq!(load(&mut s, &udp), Err(Refused::Unsupported));
        let mut v6_claim = gso_frame(false, 3000, TCP_ACK);
        v6_claim[1] = vnet::GSO_TCPV6;
        assert_eq!(load(&mut s, &v6_claim), Err(Refused::Unsupported));
        // A header pointing into the IP header, with a tiny MSS.
        let mut lying = gso_frame(true, 3000, TCP_ACK);
        let mut header = vnet::Header::read(&lying);
        (header.csum_start, header.segment_size) = (20, 1);
        header.write(&mut lying);
        assert_eq!(load(&mut s, &lying), Err(Refused::Unsupported));
        let mut out_of_bounds = gso_frame(false, 100, TCP_ACK);
        let mut header = vnet::Header::read(&out_of_bounds);
        (header.gso_type, header.csum_start) = (vnet::GSO_NONE, 60000);
        header.write(&mut out_of_bounds);
        assert_eq!(load(&mut s, &out_of_bounds), Err(Refused::Unsupported));
        assert!(!s.pending());
    }
}
