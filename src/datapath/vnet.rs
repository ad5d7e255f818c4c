//! The virtio-net header (virtio 1.x, section 5.1.6) in front of each frame
//! on a TAP with IFF_VNET_HDR: checksum and segmentation offload metadata.
//! linnet's TAPs always carry it. A relay either passes it through to a
//! client that speaks it (offloads on: 64 KiB TCP segments cross in one
//! piece) or strips it (offloads off: the kernel hands over plain frames
//! with their checksums done, and takes frames behind an all-zero header).

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
    let offloads = match client {
        ClientHeader::None => 0,
        ClientHeader::Virtio(_) => tap::OFFLOAD_CSUM | tap::OFFLOAD_TSO4 | tap::OFFLOAD_TSO6,
    };
    tap::set_offload(fd, offloads)
}
