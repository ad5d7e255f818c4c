//! The virtio-net header (virtio 1.x, section 5.1.6) in front of each frame
//! on a TAP with IFF_VNET_HDR: checksum and segmentation offload metadata.
//! linnet's TAPs always carry it, with checksum and TCP segmentation
//! offloads on: the kernel hands over TCP frames of up to 64 KiB. A relay
//! passes the header through to a client that speaks it, so those frames
//! cross in one piece; for a client that takes bare frames it cuts them to
//! size (segment.rs) and coalesces the client's segments back into such
//! frames on the way in (coalesce.rs).

use std::io;
use std::os::fd::BorrowedFd;

use crate::host::tap;

/// `struct virtio_net_hdr`, the TAP's default.
pub const LEGACY_LEN: usize = 10;
/// With `num_buffers`, as virtio 1.x devices use it.
pub const VIRTIO1_LEN: usize = 12;
/// The largest frame the kernel hands a TAP with segmentation offload.
pub const GSO_MAX_FRAME: usize = 65536;
/// An all-zero header: no checksum to do, not a GSO frame.
pub const ZERO: [u8; VIRTIO1_LEN] = [0; VIRTIO1_LEN];
/// `flags`: the checksum from `csum_start` to the end is left to do.
pub const F_NEEDS_CSUM: u8 = 1;
/// `gso_type` values, and the ECN bit that may be or-ed into them.
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_ECN: u8 = 0x80;

/// The fields of a virtio-net header's first 10 bytes (`num_buffers`, if
/// there, is not read or written). A TAP reads and writes them in the
/// host's byte order unless told otherwise (TUNSETVNETLE/BE), and linnet
/// does not tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub flags: u8,
    pub gso_type: u8,
    /// Bytes of Ethernet, IP and TCP headers.
    pub header_len: u16,
    /// Payload bytes per segment (the MSS).
    pub segment_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl Header {
    pub fn read(bytes: &[u8]) -> Header {
        let field = |i: usize| u16::from_ne_bytes([bytes[i], bytes[i + 1]]);
        Header {
            flags: bytes[0],
            gso_type: bytes[1],
            header_len: field(2),
            segment_size: field(4),
            csum_start: field(6),
            csum_offset: field(8),
        }
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.header_len.to_ne_bytes());
        out[4..6].copy_from_slice(&self.segment_size.to_ne_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }
}

/// The header the client (the VMM's side of a relay) speaks, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientHeader {
    None,
    /// Passed through unchanged; 10 or 12 bytes.
    Virtio(usize),
}

impl ClientHeader {
    pub fn parse(len: usize) -> Result<ClientHeader, String> {
        match len {
            LEGACY_LEN | VIRTIO1_LEN => Ok(ClientHeader::Virtio(len)),
            _ => Err(format!(
                "a virtio-net header is {LEGACY_LEN} or {VIRTIO1_LEN} bytes, not {len}"
            )),
        }
    }

    /// Bytes in front of each frame on the client's socket.
    pub fn len(self) -> usize {
        match self {
            ClientHeader::None => 0,
            ClientHeader::Virtio(len) => len,
        }
    }

    /// Bytes in front of each frame on the TAP.
    pub fn tap_len(self) -> usize {
        match self {
            ClientHeader::None => LEGACY_LEN,
            ClientHeader::Virtio(len) => len,
        }
    }
}

/// Sets the TAP's header size and offloads for a relay to `client`.
pub fn configure_tap(fd: BorrowedFd<'_>, client: ClientHeader) -> io::Result<()> {
    tap::set_vnet_header_len(fd, client.tap_len())?;
    tap::set_offload(
        fd,
        tap::OFFLOAD_CSUM | tap::OFFLOAD_TSO4 | tap::OFFLOAD_TSO6,
    )
}
