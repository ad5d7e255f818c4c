//! The virtio-net device behind vhost-user (virtio 1.x, section 5.1): the
//! guest's rx and tx virtqueues, in the guest's own memory, moved to and
//! from the interface's TAP. rust-vmm's `vhost-user-backend` runs the
//! protocol and calls `handle_event` on a kick or when the TAP has frames;
//! `virtio-queue` reads the rings; `vm-memory` maps the guest's memory.
//!
//! No copy but the kernel's: a frame the guest sends is written to the TAP
//! with one `writev` over its descriptors, where the guest put it, virtio
//! header first (the TAP takes the same header, so checksum and TSO
//! offloads pass through). A frame for the guest is read from the TAP with
//! one `readv` straight into the guest's rx buffers; with mergeable rx
//! buffers a 64 KiB TSO frame spans as many as it takes, and `num_buffers`
//! says how many. Used buffers are returned, and the guest notified, once
//! per batch (with event index, only when it asked to be). Notifying after
//! each frame instead, so the guest could start on the first while the
//! rest are read, lost in one narrowed benchmark run each way at MTU 1500
//! (VM→VM 10.7 → 8.0 Gbit/s, with more CPU per GB): the guest's wake-ups
//! take the cores the copies need.
//!
//! The worker sleeps in epoll once both queues are drained; it does not
//! poll. A window of 50 µs polling the tx ring (yielding between looks)
//! was measured and lost: on a machine whose cores the guest, the VMM and
//! the traffic's ends already share, the poll takes the time the guest
//! needed to queue more (host→VM 13.3 → 10.8 Gbit/s, VM→VM 9.7 → 7.2 at
//! MTU 1500, one narrowed benchmark run without and one with).
//!
//! Everything is allocated in `Net::new`. A guest that breaks the rings'
//! rules (a buffer outside its memory, the wrong direction, too many
//! pieces) stops the device: `Fault` says what, and the relay ends with it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackendMut, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{
    Address, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::super::vnet::{self, GSO_MAX_FRAME, LEGACY_LEN, VIRTIO1_LEN};
use super::super::{Counters, FRAME_OVERHEAD};
use crate::host::tap;

/// The rx and tx queues (one pair: linnet's TAPs have one queue).
pub const RX: u16 = 0;
pub const TX: u16 = 1;
const QUEUES: usize = 2;
/// Events of our own; the back-end keeps 0..=QUEUES for the queues and
/// its exit.
pub const TAP_READABLE: u16 = QUEUES as u16 + 1;
pub const RX_AGAIN: u16 = QUEUES as u16 + 2;
/// Ring sizes up to QEMU's largest.
const MAX_QUEUE_SIZE: usize = 1024;
/// Frames taken from the TAP before the other queue gets its turn.
const RX_BUDGET: usize = 64;
/// Pieces of guest memory one frame may take (the kernel's IOV_MAX).
const MAX_PIECES: usize = 1024;

/// The virtio features offered; the guest acks a subset.
pub const FEATURES: u64 = 1 << VIRTIO_F_VERSION_1
    | 1 << VIRTIO_NET_F_CSUM
    | 1 << VIRTIO_NET_F_GUEST_CSUM
    | 1 << VIRTIO_NET_F_GUEST_TSO4
    | 1 << VIRTIO_NET_F_GUEST_TSO6
    | 1 << VIRTIO_NET_F_GUEST_ECN
    | 1 << VIRTIO_NET_F_HOST_TSO4
    | 1 << VIRTIO_NET_F_HOST_TSO6
    | 1 << VIRTIO_NET_F_HOST_ECN
    | 1 << VIRTIO_NET_F_MRG_RXBUF
    | 1 << VIRTIO_RING_F_EVENT_IDX
    | 1 << VIRTIO_RING_F_INDIRECT_DESC
    | vhost::vhost_user::VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// How a guest broke the rings' rules. Fatal to its device.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Fault {
    #[error(
        "its {queue} queue has a buffer at guest address {addr:#x} of {len} bytes, outside the VM's memory"
    )]
    OutsideMemory {
        queue: &'static str,
        addr: u64,
        len: u32,
    },
    #[error(
        "its {queue} queue has a buffer the device may {wrong}, where virtio-net's may only be {right}"
    )]
    WrongDirection {
        queue: &'static str,
        wrong: &'static str,
        right: &'static str,
    },
    #[error("its {queue} queue has a frame in more than {MAX_PIECES} pieces")]
    TooManyPieces { queue: &'static str },
    #[error("its {queue} queue has a chain of descriptors as long as the ring (a loop?)")]
    ChainTooLong { queue: &'static str },
    #[error("its rx queue has a buffer of {0} bytes, too small for the virtio-net header")]
    ShortRxBuffer(usize),
    #[error("its {queue} queue is broken: {detail}")]
    Queue { queue: &'static str, detail: String },
    #[error("the TAP failed (was the interface detached?): {0}")]
    Tap(String),
}

/// The first fault of a device, for the relay to report, and what ends
/// the connection when one comes.
#[derive(Default)]
pub struct Faults {
    first: Mutex<Option<Fault>>,
    stop: Mutex<Option<Box<dyn Fn() + Send>>>,
}

impl Faults {
    pub fn first(&self) -> Option<Fault> {
        self.first.lock().expect("not poisoned").clone()
    }

    /// What to do when a fault comes: end the connection.
    pub fn on_fault(&self, stop: impl Fn() + Send + 'static) {
        *self.stop.lock().expect("not poisoned") = Some(Box::new(stop));
    }

    fn report(&self, fault: Fault) {
        self.first
            .lock()
            .expect("not poisoned")
            .get_or_insert(fault);
        if let Some(stop) = self.stop.lock().expect("not poisoned").as_ref() {
            stop();
        }
    }
}

/// A queue's error (virtio-queue's: a ring it cannot read) as a fault.
fn broken(queue: &'static str) -> impl Fn(virtio_queue::Error) -> Fault + Copy {
    move |e| Fault::Queue {
        queue,
        detail: e.to_string(),
    }
}

/// What the guest acked that changes how frames move.
#[derive(Debug, Clone, Copy)]
struct Acked {
    /// The virtio-net header in front of each frame: 12 bytes with
    /// `num_buffers` (virtio 1.x, or mergeable buffers), else 10.
    header_len: usize,
    mergeable: bool,
    /// The largest frame for the guest, header included.
    max_rx: usize,
}

/// Host addresses of guest buffers, for one readv or writev. Pointers
/// into the guest's memory, valid while the memory snapshot they came
/// from is held (within one call of `handle_event`).
struct Pieces(Vec<libc::iovec>);

// SAFETY: the pointers are only used by the thread that holds the
// backend's lock, within the call that made them.
unsafe impl Send for Pieces {}
// SAFETY: as above: `&Pieces` reads no pointer.
unsafe impl Sync for Pieces {}

/// An rx chain taken from the ring and not yet used.
#[derive(Debug, Clone, Copy)]
struct Taken {
    head: u16,
    capacity: usize,
    pieces: usize,
}

pub struct Net {
    tap: Arc<OwnedFd>,
    mtu: u32,
    counters: Arc<Counters>,
    faults: Arc<Faults>,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    acked: Acked,
    /// The TAP may have frames: set on its edge, cleared on EAGAIN.
    tap_readable: bool,
    again: EventFd,
    /// What ends the back-end's worker thread, once its connection is
    /// over (rust-vmm's back-end asks the device for it).
    exit: (EventConsumer, EventNotifier),
    pieces: Pieces,
    taken: Vec<Taken>,
    used: Vec<(u16, u32)>,
}

impl Net {
    pub fn new(
        tap: Arc<OwnedFd>,
        mtu: u32,
        counters: Arc<Counters>,
        faults: Arc<Faults>,
    ) -> io::Result<Net> {
        let mut net = Net {
            tap,
            mtu,
            counters,
            faults,
            mem: GuestMemoryAtomic::new(GuestMemoryMmap::new()),
            acked: Acked {
                header_len: LEGACY_LEN,
                mergeable: false,
                max_rx: 0,
            },
            tap_readable: true,
            again: EventFd::new(EFD_NONBLOCK)?,
            exit: new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)?,
            pieces: Pieces(Vec::with_capacity(MAX_PIECES)),
            taken: Vec::with_capacity(MAX_QUEUE_SIZE),
            used: Vec::with_capacity(MAX_QUEUE_SIZE),
        };
        net.acked_features(0);
        Ok(net)
    }

    /// The descriptor that wakes the device when it has more to read from
    /// the TAP than one turn takes: registered as `RX_AGAIN`.
    pub fn again_fd(&self) -> i32 {
        self.again.as_raw_fd()
    }

    /// Guest to TAP: every frame the guest has queued, one writev each.
    fn transmit(&mut self, vring: &VringRwLock) -> Result<(), Fault> {
        let mem = self.mem.memory();
        let mut state = vring.get_mut();
        if !state.get_queue().ready() {
            return Ok(());
        }
        let broken = broken("tx");
        let ring_size = state.get_queue().size();
        let (mut frames, mut bytes, mut drops) = (0u64, 0u64, 0u64);
        loop {
            state.disable_notification().map_err(broken)?;
            self.used.clear();
            {
                let queue = state.get_queue_mut();
                let chains = queue.iter(mem.clone()).map_err(broken)?;
                for chain in chains {
                    self.pieces.0.clear();
                    let head = chain.head_index();
                    let mut len = 0usize;
                    for (count, desc) in chain.enumerate() {
                        // virtio-queue ends a chain at the ring's size; a
                        // chain that long is a loop, or as bad.
                        if count + 1 >= usize::from(ring_size) {
                            return Err(Fault::ChainTooLong { queue: "tx" });
                        }
                        if desc.is_write_only() {
                            return Err(Fault::WrongDirection {
                                queue: "tx",
                                wrong: "write",
                                right: "read",
                            });
                        }
                        self.pieces.map(&mem, "tx", desc.addr(), desc.len())?;
                        len += desc.len() as usize;
                    }
                    self.used.push((head, 0));
                    // The TAP refuses what no frame can be; so do we,
                    // before the kernel copies it.
                    if len > self.acked.header_len + GSO_MAX_FRAME + FRAME_OVERHEAD
                        || len < self.acked.header_len
                    {
                        drops += 1;
                        continue;
                    }
                    match write_tap(&self.tap, &self.pieces.0) {
                        Ok(()) => {
                            frames += 1;
                            bytes += (len - self.acked.header_len) as u64;
                        }
                        Err(e) if e.raw_os_error() == Some(libc::EBADFD) => {
                            return Err(Fault::Tap(e.to_string()));
                        }
                        // A frame the kernel refused (a bad header, no
                        // buffers): dropped, as a NIC would.
                        Err(_) => drops += 1,
                    }
                }
            }
            for &(head, len) in &self.used {
                state.add_used(head, len).map_err(broken)?;
            }
            if !state.enable_notification().map_err(broken)? {
                break;
            }
        }
        self.counters.from_vm.add(frames, bytes);
        self.counters.from_vm.drop_frames(drops);
        if state.needs_notification().map_err(broken)? {
            state.signal_used_queue().map_err(|e| Fault::Queue {
                queue: "tx",
                detail: format!("cannot signal the guest: {e}"),
            })?;
        }
        Ok(())
    }

    /// TAP to guest: frames until the TAP is empty, the guest has no room,
    /// or the turn is over, each read straight into the guest's buffers.
    fn receive(&mut self, vring: &VringRwLock) -> Result<(), Fault> {
        if !self.tap_readable {
            return Ok(());
        }
        let mem = self.mem.memory();
        let mut state = vring.get_mut();
        if !state.is_enabled() || !state.get_queue().ready() {
            return Ok(());
        }
        let broken = broken("rx");
        let ring_size = state.get_queue().size();
        let acked = self.acked;
        // Room for a frame: buffers for the largest (mergeable), or a chain.
        let room = |capacity: usize, chains: usize| {
            if acked.mergeable {
                capacity >= acked.max_rx
            } else {
                chains > 0
            }
        };
        self.pieces.0.clear();
        self.taken.clear();
        let mut capacity = 0usize;
        let (mut frames, mut bytes, mut drops) = (0u64, 0u64, 0u64);
        state.disable_notification().map_err(broken)?;
        let outcome = loop {
            if frames as usize == RX_BUDGET {
                // More next turn, after the tx queue's.
                let _ = self.again.write(1);
                break Ok(());
            }
            while !room(capacity, self.taken.len()) {
                let Some(chain) = state.get_queue_mut().pop_descriptor_chain(mem.clone()) else {
                    break;
                };
                let head = chain.head_index();
                let before = self.pieces.0.len();
                let mut chain_capacity = 0usize;
                for (count, desc) in chain.enumerate() {
                    if count + 1 >= usize::from(ring_size) {
                        return Err(Fault::ChainTooLong { queue: "rx" });
                    }
                    if !desc.is_write_only() {
                        return Err(Fault::WrongDirection {
                            queue: "rx",
                            wrong: "only read",
                            right: "written",
                        });
                    }
                    self.pieces.map(&mem, "rx", desc.addr(), desc.len())?;
                    chain_capacity += desc.len() as usize;
                }
                if chain_capacity < acked.header_len {
                    return Err(Fault::ShortRxBuffer(chain_capacity));
                }
                self.taken.push(Taken {
                    head,
                    capacity: chain_capacity,
                    pieces: self.pieces.0.len() - before,
                });
                capacity += chain_capacity;
            }
            // No room for the largest frame: wait for the guest's kick,
            // unless buffers came meanwhile, or unless the whole ring is
            // already taken (a ring too small for a 64 KiB frame: frames
            // larger than it holds are dropped, below).
            let whole_ring = self.taken.len() >= usize::from(ring_size);
            if !room(capacity, self.taken.len()) && !whole_ring {
                if state.enable_notification().map_err(broken)? {
                    state.disable_notification().map_err(broken)?;
                    continue;
                }
                break Ok(());
            }
            let n = match read_tap(&self.tap, &self.pieces.0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.tap_readable = false;
                    break Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A frame larger than the buffers: the TAP drops it.
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    drops += 1;
                    continue;
                }
                Err(e) => break Err(Fault::Tap(e.to_string())),
            };
            if n < acked.header_len {
                continue;
            }
            // The buffers the frame took, in order.
            let (mut left, mut chains, mut pieces) = (n, 0usize, 0usize);
            self.used.clear();
            while left > 0 {
                let taken = self.taken[chains];
                let len = left.min(taken.capacity);
                self.used.push((taken.head, len as u32));
                left -= len;
                chains += 1;
                pieces += taken.pieces;
            }
            if acked.mergeable {
                set_num_buffers(&self.pieces.0, chains as u16);
            }
            for &(head, len) in &self.used {
                state.add_used(head, len).map_err(broken)?;
            }
            capacity -= self
                .taken
                .drain(..chains)
                .map(|t| t.capacity)
                .sum::<usize>();
            self.pieces.0.drain(..pieces);
            frames += 1;
            bytes += (n - acked.header_len) as u64;
        };
        // Chains taken and not used go back to the ring, to be taken again.
        let queue = state.get_queue_mut();
        queue.set_next_avail(queue.next_avail().wrapping_sub(self.taken.len() as u16));
        self.taken.clear();
        self.counters.to_vm.add(frames, bytes);
        self.counters.to_vm.drop_frames(drops);
        if frames > 0 && state.needs_notification().map_err(broken)? {
            state.signal_used_queue().map_err(|e| Fault::Queue {
                queue: "rx",
                detail: format!("cannot signal the guest: {e}"),
            })?;
        }
        outcome
    }
}

impl Pieces {
    /// Appends the host addresses of `len` bytes of guest memory at `addr`.
    fn map(
        &mut self,
        mem: &GuestMemoryMmap,
        queue: &'static str,
        addr: GuestAddress,
        len: u32,
    ) -> Result<(), Fault> {
        // Nearly every buffer lies in one region: its host address is the
        // region's plus the offset. One that spans regions (or lies outside
        // the memory) takes the general way, which says which.
        if let Some((region, at)) = mem.to_region_addr(addr)
            && at.raw_value() + u64::from(len) <= region.len()
            && let Ok(host) = region.get_host_address(at)
        {
            return self.push(queue, host, len as usize);
        }
        for slice in GuestMemoryBackend::get_slices(mem, addr, len as usize) {
            let slice = slice.map_err(|_| Fault::OutsideMemory {
                queue,
                addr: addr.0,
                len,
            })?;
            self.push(queue, slice.ptr_guard_mut().as_ptr(), slice.len())?;
        }
        Ok(())
    }

    fn push(&mut self, queue: &'static str, host: *mut u8, len: usize) -> Result<(), Fault> {
        if self.0.len() == MAX_PIECES {
            return Err(Fault::TooManyPieces { queue });
        }
        self.0.push(libc::iovec {
            iov_base: host.cast(),
            iov_len: len,
        });
        Ok(())
    }
}

/// Writes `num_buffers` (bytes 10 and 11 of the virtio 1.x header, little
/// endian) where the frame's header landed in guest memory.
fn set_num_buffers(pieces: &[libc::iovec], count: u16) {
    for (i, byte) in count.to_le_bytes().into_iter().enumerate() {
        let mut at = LEGACY_LEN + i;
        for piece in pieces {
            if at < piece.iov_len {
                // SAFETY: within a piece of guest memory mapped for this
                // call; volatile, as the guest shares it.
                unsafe { std::ptr::write_volatile(piece.iov_base.cast::<u8>().add(at), byte) };
                break;
            }
            at -= piece.iov_len;
        }
    }
}

fn write_tap(tap: &OwnedFd, pieces: &[libc::iovec]) -> io::Result<()> {
    loop {
        // SAFETY: the pieces point into mapped guest memory.
        let n = unsafe { libc::writev(tap.as_raw_fd(), pieces.as_ptr(), pieces.len() as i32) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn read_tap(tap: &OwnedFd, pieces: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: the pieces point into mapped guest memory the guest gave
    // the device to write.
    let n = unsafe { libc::readv(tap.as_raw_fd(), pieces.as_ptr(), pieces.len() as i32) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

impl VhostUserBackendMut for Net {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        FEATURES
    }

    fn acked_features(&mut self, features: u64) {
        let has = |bit: u32| features & (1 << bit) != 0;
        let mergeable = has(VIRTIO_NET_F_MRG_RXBUF);
        let header_len = if has(VIRTIO_F_VERSION_1) || mergeable {
            VIRTIO1_LEN
        } else {
            LEGACY_LEN
        };
        // The TAP hands over what the guest takes: checksums left to do,
        // TSO frames of up to 64 KiB.
        let mut offload = 0;
        if has(VIRTIO_NET_F_GUEST_CSUM) {
            offload |= tap::OFFLOAD_CSUM;
            if has(VIRTIO_NET_F_GUEST_TSO4) {
                offload |= tap::OFFLOAD_TSO4;
            }
            if has(VIRTIO_NET_F_GUEST_TSO6) {
                offload |= tap::OFFLOAD_TSO6;
            }
            if has(VIRTIO_NET_F_GUEST_ECN) && offload & (tap::OFFLOAD_TSO4 | tap::OFFLOAD_TSO6) != 0
            {
                offload |= tap::OFFLOAD_TSO_ECN;
            }
        }
        let gso = offload & (tap::OFFLOAD_TSO4 | tap::OFFLOAD_TSO6) != 0;
        let largest = if gso {
            GSO_MAX_FRAME
        } else {
            self.mtu as usize
        };
        self.acked = Acked {
            header_len,
            mergeable,
            max_rx: header_len + largest + FRAME_OVERHEAD,
        };
        let tap = std::os::fd::AsFd::as_fd(&*self.tap);
        let configured =
            tap::set_vnet_header_len(tap, header_len).and_then(|()| tap::set_offload(tap, offload));
        if let Err(e) = configured {
            self.faults
                .report(Fault::Tap(format!("cannot set its offloads: {e}")));
        }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::REPLY_ACK
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = &self.exit;
        Some((consumer.try_clone().ok()?, notifier.try_clone().ok()?))
    }

    fn set_event_idx(&mut self, _enabled: bool) {
        // The rings keep it (virtio-queue's notification calls).
    }

    fn update_memory(&mut self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        self.mem = mem;
        Ok(())
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        let done = match device_event {
            RX => self.receive(&vrings[RX as usize]),
            TX => self.transmit(&vrings[TX as usize]),
            TAP_READABLE => {
                self.tap_readable = true;
                self.receive(&vrings[RX as usize])
            }
            RX_AGAIN => {
                let _ = self.again.read();
                self.receive(&vrings[RX as usize])
            }
            _ => Ok(()),
        };
        done.map_err(|fault| {
            let e = io::Error::other(fault.to_string());
            self.faults.report(fault);
            e
        })
    }
}

// The header length constants must agree with what the TAP takes.
const _: () = assert!(vnet::VIRTIO1_LEN == 12 && vnet::LEGACY_LEN == 10);

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(bufs: &mut [Vec<u8>]) -> Vec<libc::iovec> {
        bufs.iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect()
    }

    #[test]
    fn num_buffers_lands_in_the_header_however_the_buffers_split_it() {
        for split in [
            vec![12, 100],
            vec![11, 1, 100],
            vec![10, 2],
            vec![4, 4, 2, 1, 1, 50],
        ] {
            let mut bufs: Vec<Vec<u8>> = split.iter().map(|&n| vec![0xee; n]).collect();
            set_num_buffers(&pieces(&mut bufs), 0x0302);
            let flat: Vec<u8> = bufs.concat();
            assert_eq!(&flat[10..12], &[0x02, 0x03], "{split:?}");
            assert!(flat[..10].iter().all(|&b| b == 0xee), "{split:?}");
            assert!(flat[12..].iter().all(|&b| b == 0xee), "{split:?}");
        }
    }

    #[test]
    fn guest_buffers_map_to_one_piece_per_region_and_never_past_memory() {
        // Two regions side by side, as a VMM with a hole-less split gives.
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ])
        .unwrap();
        let host = |addr: u64| mem.get_host_address(GuestAddress(addr)).unwrap() as usize;
        let mut pieces = Pieces(Vec::new());
        pieces.map(&mem, "tx", GuestAddress(0x100), 0x200).unwrap();
        pieces.map(&mem, "tx", GuestAddress(0xf00), 0x200).unwrap();
        pieces.map(&mem, "tx", GuestAddress(0x1e00), 0x200).unwrap();
        let got: Vec<(usize, usize)> = pieces
            .0
            .iter()
            .map(|p| (p.iov_base as usize, p.iov_len))
            .collect();
        assert_eq!(
            got,
            [
                (host(0x100), 0x200),
                (host(0xf00), 0x100),
                (host(0x1000), 0x100),
                (host(0x1e00), 0x200),
            ]
        );
        for (addr, len) in [(0x1f00, 0x101), (0x2000, 1), (u64::MAX - 4, 0x10)] {
            assert_eq!(
                pieces.map(&mem, "rx", GuestAddress(addr), len),
                Err(Fault::OutsideMemory {
                    queue: "rx",
                    addr,
                    len
                }),
                "{addr:#x}+{len:#x}"
            );
        }
        // A frame in more pieces than one system call takes.
        pieces.0.resize(MAX_PIECES, pieces.0[0]);
        assert_eq!(
            pieces.map(&mem, "tx", GuestAddress(0x100), 1),
            Err(Fault::TooManyPieces { queue: "tx" })
        );
    }

    #[test]
    fn a_device_keeps_its_first_fault_and_ends_its_connection_at_once() {
        let faults = Faults::default();
        let stopped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = stopped.clone();
        faults.on_fault(move || {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        faults.report(Fault::ShortRxBuffer(4));
        faults.report(Fault::ChainTooLong { queue: "tx" });
        assert_eq!(faults.first(), Some(Fault::ShortRxBuffer(4)));
        assert_eq!(stopped.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(
            Fault::OutsideMemory {
                queue: "tx",
                addr: 0x4000_0000,
                len: 60
            }
            .to_string(),
            "its tx queue has a buffer at guest address 0x40000000 of 60 bytes, outside the VM's memory"
        );
    }

    #[test]
    fn the_features_offered_are_what_the_device_does() {
        for bit in [
            VIRTIO_F_VERSION_1,
            VIRTIO_NET_F_MRG_RXBUF,
            VIRTIO_RING_F_EVENT_IDX,
            VIRTIO_NET_F_GUEST_TSO4,
            VIRTIO_NET_F_HOST_TSO4,
        ] {
            assert_ne!(FEATURES & (1 << bit), 0, "bit {bit}");
        }
        // Nothing the device does not do: no control queue, no multiqueue,
        // no MTU or MAC of its own (QEMU keeps those), no packed rings.
        for bit in [3u32, 5, 17, 22, 34] {
            assert_eq!(FEATURES & (1 << bit), 0, "bit {bit}");
        }
    }
}
