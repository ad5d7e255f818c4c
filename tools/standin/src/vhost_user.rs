//! The stand-in as a vhost-user front-end: a guest's virtio-net driver
//! without the guest. It owns the "guest memory" (a memfd shared with the
//! back-end), lays out the rx and tx split virtqueues in it (virtio 1.x,
//! section 2.7), and bridges them to the guest namespace's TAP: a frame
//! the TAP gives is read straight into a tx buffer and offered; frames the
//! back-end puts in rx buffers are written to the TAP from where they
//! landed. One thread per queue; notifications with event index, as
//! Linux's driver does. The protocol is rust-vmm's `vhost` front-end.
//!
//! `--hostile KIND` breaks the rules once the device runs, to show that
//! only the VM's own relay ends: a tx buffer outside the memory
//! (`outside`), a tx chain that loops (`loop`), a tx buffer the device
//! may write (`direction`), or rings outside the memory (`ring`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering, fence};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

/// Entries per ring (QEMU's default).
const QUEUE_SIZE: u16 = 256;
/// An rx buffer: a page, as Linux's driver posts with mergeable buffers.
const RX_BUFFER: u64 = 4096;
/// A tx buffer: the largest TSO frame and its header.
const TX_BUFFER: u64 = 65536 + 64;
const MEMORY: u64 = 32 << 20;
/// virtio-net's header with num_buffers (virtio 1.x).
pub const HEADER: usize = 12;

const RX: usize = 0;
const TX: usize = 1;

// Feature bits (virtio 1.x, 5.1.3; 6).
const F_CSUM: u64 = 1 << 0;
const F_GUEST_CSUM: u64 = 1 << 1;
const F_GUEST_TSO4: u64 = 1 << 7;
const F_GUEST_TSO6: u64 = 1 << 8;
const F_HOST_TSO4: u64 = 1 << 11;
const F_HOST_TSO6: u64 = 1 << 12;
const F_MRG_RXBUF: u64 = 1 << 15;
const F_EVENT_IDX: u64 = 1 << 29;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const F_VERSION_1: u64 = 1 << 32;
/// What this driver takes, of what the device offers.
const WANTED: u64 = F_CSUM
    | F_GUEST_CSUM
    | F_GUEST_TSO4
    | F_GUEST_TSO6
    | F_HOST_TSO4
    | F_HOST_TSO6
    | F_MRG_RXBUF
    | F_EVENT_IDX
    | F_PROTOCOL_FEATURES
    | F_VERSION_1;

// Descriptor flags.
const DESC_NEXT: u16 = 1;
const DESC_WRITE: u16 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostile {
    Outside,
    Loop,
    Direction,
    Ring,
}

impl Hostile {
    pub fn parse(kind: &str) -> Result<Hostile, String> {
        match kind {
            "outside" => Ok(Hostile::Outside),
            "loop" => Ok(Hostile::Loop),
            "direction" => Ok(Hostile::Direction),
            "ring" => Ok(Hostile::Ring),
            _ => Err(format!(
                "--hostile {kind}: give outside, loop, direction or ring"
            )),
        }
    }
}

/// The shared "guest memory": guest address 0 is `base`.
struct Memory {
    base: *mut u8,
    fd: OwnedFd,
}

// SAFETY: the memory is shared with the device anyway; each queue's
// thread writes only its own ring and buffers.
unsafe impl Send for Memory {}
unsafe impl Sync for Memory {}

impl Memory {
    fn new() -> io::Result<Memory> {
        // SAFETY: memfd_create with a constant name.
        let fd = unsafe { libc::memfd_create(c"linnet-standin-guest".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor memfd_create just gave us.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        if unsafe { libc::ftruncate(fd.as_raw_fd(), MEMORY as i64) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: mapping the whole memfd, shared.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEMORY as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Memory {
            base: base.cast(),
            fd,
        })
    }

    fn at(&self, addr: u64) -> *mut u8 {
        assert!(addr < MEMORY);
        // SAFETY: within the mapping (checked above).
        unsafe { self.base.add(addr as usize) }
    }

    fn u16_at(&self, addr: u64) -> &AtomicU16 {
        // SAFETY: aligned (ring fields are), within the mapping.
        unsafe { &*(self.at(addr) as *const AtomicU16) }
    }

    fn write_u16(&self, addr: u64, v: u16) {
        self.u16_at(addr).store(v.to_le(), Ordering::Relaxed);
    }

    fn read_u16(&self, addr: u64) -> u16 {
        u16::from_le(self.u16_at(addr).load(Ordering::Relaxed))
    }

    fn read_u32(&self, addr: u64) -> u32 {
        // SAFETY: aligned, within the mapping; the device wrote it before
        // the used index we read with acquire.
        u32::from_le(unsafe { std::ptr::read_volatile(self.at(addr) as *const u32) })
    }

    fn write_desc(&self, addr: u64, buffer: u64, len: u32, flags: u16, next: u16) {
        // SAFETY: a 16-byte descriptor slot within the mapping.
        unsafe {
            let p = self.at(addr);
            std::ptr::write_volatile(p as *mut u64, buffer.to_le());
            std::ptr::write_volatile(p.add(8) as *mut u32, len.to_le());
            std::ptr::write_volatile(p.add(12) as *mut u16, flags.to_le());
            std::ptr::write_volatile(p.add(14) as *mut u16, next.to_le());
        }
    }
}

/// One split virtqueue, the driver's side.
struct Queue {
    mem: Arc<Memory>,
    desc: u64,
    avail: u64,
    used: u64,
    /// Buffers' start: buffer `i` is at `buffers + i * buffer_size`.
    buffers: u64,
    buffer_size: u64,
    kick: EventFd,
    call: EventFd,
    /// The next avail index to publish, and the last the device was told.
    avail_idx: u16,
    kicked_idx: u16,
    last_used: u16,
}

impl Queue {
    fn new(mem: Arc<Memory>, at: u64, buffers: u64, buffer_size: u64) -> io::Result<Queue> {
        let q = u64::from(QUEUE_SIZE);
        Ok(Queue {
            mem,
            desc: at,
            avail: at + 16 * q,
            // The used ring is 4-byte aligned.
            used: (at + 16 * q + 6 + 2 * q + 3) & !3,
            buffers,
            buffer_size,
            kick: EventFd::new(EFD_NONBLOCK)?,
            call: EventFd::new(EFD_NONBLOCK)?,
            avail_idx: 0,
            kicked_idx: 0,
            last_used: 0,
        })
    }

    fn buffer(&self, id: u16) -> u64 {
        self.buffers + u64::from(id) * self.buffer_size
    }

    /// Offers descriptor `id` (its index is published by `publish`).
    fn offer(&mut self, id: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % QUEUE_SIZE);
        self.mem.write_u16(slot, id);
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Publishes what was offered and kicks if the device asked for it
    /// (its avail_event, after the used ring).
    fn publish(&mut self) -> io::Result<()> {
        if self.avail_idx == self.kicked_idx {
            return Ok(());
        }
        fence(Ordering::Release);
        self.mem
            .u16_at(self.avail + 2)
            .store(self.avail_idx.to_le(), Ordering::Release);
        fence(Ordering::SeqCst);
        let event = self.mem.read_u16(self.used + 4 + 8 * u64::from(QUEUE_SIZE));
        let (new, old) = (self.avail_idx, self.kicked_idx);
        self.kicked_idx = new;
        if new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old) {
            self.kick.write(1)?;
        }
        Ok(())
    }

    /// The next used element (id, len), if the device returned one.
    fn next_used(&mut self) -> Option<(u16, u32)> {
        let idx = u16::from_le(self.mem.u16_at(self.used + 2).load(Ordering::Acquire));
        if idx == self.last_used {
            return None;
        }
        let at = self.used + 4 + 8 * u64::from(self.last_used % QUEUE_SIZE);
        self.last_used = self.last_used.wrapping_add(1);
        Some((self.mem.read_u32(at) as u16, self.mem.read_u32(at + 4)))
    }

    /// Asks for a call on the next used element (used_event, after the
    /// avail ring), then says whether one came meanwhile.
    fn arm(&self) -> bool {
        self.mem
            .write_u16(self.avail + 4 + 2 * u64::from(QUEUE_SIZE), self.last_used);
        fence(Ordering::SeqCst);
        let idx = u16::from_le(self.mem.u16_at(self.used + 2).load(Ordering::Acquire));
        idx != self.last_used
    }

    /// Nothing used to take: publishes what was offered, then sleeps
    /// until the device returns something (or a second passes).
    fn wait_for_used(&mut self) -> io::Result<()> {
        self.publish()?;
        if !self.arm() {
            wait(&[self.call.as_raw_fd()])?;
            let _ = self.call.read();
        }
        Ok(())
    }

    fn config(&self) -> VringConfigData {
        let va = |gpa: u64| self.mem.base as u64 + gpa;
        VringConfigData {
            queue_max_size: QUEUE_SIZE,
            queue_size: QUEUE_SIZE,
            flags: 0,
            desc_table_addr: va(self.desc),
            used_ring_addr: va(self.used),
            avail_ring_addr: va(self.avail),
            log_addr: None,
        }
    }
}

/// A vhost-user-net device as a driver sees it, set up and running.
pub struct Device {
    _frontend: Frontend,
    rx: Queue,
    tx: Queue,
    hostile: Option<Hostile>,
}

fn vhost_error(what: &str, e: vhost::Error) -> io::Error {
    io::Error::other(format!("vhost-user {what}: {e}"))
}

impl Device {
    /// Connects to the back-end at `path`, negotiates, shares the memory
    /// and starts both queues.
    pub fn connect(path: &str, hostile: Option<Hostile>) -> io::Result<Device> {
        let mem = Arc::new(Memory::new()?);
        let q = u64::from(QUEUE_SIZE);
        let rx = Queue::new(mem.clone(), 0, 1 << 20, RX_BUFFER)?;
        let tx = Queue::new(mem.clone(), 32 << 10, (1 << 20) + q * RX_BUFFER, TX_BUFFER)?;
        assert!(tx.buffers + q * TX_BUFFER <= MEMORY);
        let mut frontend = Frontend::connect(path, 2).map_err(|e| vhost_error(path, e))?;
        let step = |what: &'static str| move |e| vhost_error(what, e);
        frontend.set_owner().map_err(step("SET_OWNER"))?;
        let offered = frontend.get_features().map_err(step("GET_FEATURES"))?;
        let acked = offered & WANTED;
        if acked & (F_VERSION_1 | F_MRG_RXBUF | F_EVENT_IDX)
            != F_VERSION_1 | F_MRG_RXBUF | F_EVENT_IDX
        {
            return Err(io::Error::other(format!(
                "the back-end offers {offered:#x}, without virtio 1, mergeable rx buffers or event index"
            )));
        }
        if acked & F_PROTOCOL_FEATURES != 0 {
            let protocol = frontend
                .get_protocol_features()
                .map_err(step("GET_PROTOCOL_FEATURES"))?;
            frontend
                .set_protocol_features(protocol & VhostUserProtocolFeatures::REPLY_ACK)
                .map_err(step("SET_PROTOCOL_FEATURES"))?;
        }
        frontend.set_features(acked).map_err(step("SET_FEATURES"))?;
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEMORY,
            userspace_addr: mem.base as u64,
            mmap_offset: 0,
            mmap_handle: mem.fd.as_raw_fd(),
        };
        frontend
            .set_mem_table(&[region])
            .map_err(step("SET_MEM_TABLE"))?;
        for (index, queue) in [(RX, &rx), (TX, &tx)] {
            let mut config = queue.config();
            if hostile == Some(Hostile::Ring) {
                config.avail_ring_addr = mem.base as u64 + 2 * MEMORY;
            }
            frontend
                .set_vring_num(index, QUEUE_SIZE)
                .map_err(step("SET_VRING_NUM"))?;
            frontend
                .set_vring_addr(index, &config)
                .map_err(step("SET_VRING_ADDR"))?;
            frontend
                .set_vring_base(index, 0)
                .map_err(step("SET_VRING_BASE"))?;
            frontend
                .set_vring_call(index, &queue.call)
                .map_err(step("SET_VRING_CALL"))?;
            frontend
                .set_vring_kick(index, &queue.kick)
                .map_err(step("SET_VRING_KICK"))?;
            if acked & F_PROTOCOL_FEATURES != 0 {
                frontend
                    .set_vring_enable(index, true)
                    .map_err(step("SET_VRING_ENABLE"))?;
            }
        }
        Ok(Device {
            _frontend: frontend,
            rx,
            tx,
            hostile,
        })
    }

    /// Bridges the queues to the guest's TAP (which carries the same
    /// 12-byte header) until either side fails.
    pub fn bridge(self, guest: OwnedFd) -> io::Result<()> {
        let guest = Arc::new(guest);
        let Device {
            _frontend: frontend,
            rx,
            tx,
            hostile,
        } = self;
        let g = guest.clone();
        let receiving = std::thread::spawn(move || to_guest(rx, &g));
        let sent = from_guest(tx, &guest, hostile);
        drop(frontend);
        let _ = receiving.join();
        sent
    }
}

/// Frames from the guest's TAP into tx buffers, read straight there.
fn from_guest(mut tx: Queue, guest: &OwnedFd, hostile: Option<Hostile>) -> io::Result<()> {
    let mem = tx.mem.clone();
    let mut free: Vec<u16> = (0..QUEUE_SIZE).rev().collect();
    loop {
        while let Some((id, _)) = tx.next_used() {
            free.push(id);
        }
        let Some(&id) = free.last() else {
            tx.wait_for_used()?;
            continue;
        };
        let buffer = tx.buffer(id);
        // SAFETY: the buffer is ours until offered, within the mapping.
        let n = unsafe { libc::read(guest.as_raw_fd(), mem.at(buffer).cast(), TX_BUFFER as usize) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => {
                    tx.publish()?;
                    wait(&[guest.as_raw_fd()])?;
                    continue;
                }
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        free.pop();
        let at = tx.desc + 16 * u64::from(id);
        match hostile {
            Some(Hostile::Outside) => mem.write_desc(at, MEMORY + 4096, n as u32, 0, 0),
            Some(Hostile::Loop) => mem.write_desc(at, buffer, n as u32, DESC_NEXT, id),
            Some(Hostile::Direction) => mem.write_desc(at, buffer, n as u32, DESC_WRITE, 0),
            _ => mem.write_desc(at, buffer, n as u32, 0, 0),
        }
        // Each frame is published as it is queued, as Linux's driver does
        // (the kick is still only when the device asked, by event index).
        // Holding 32 frames back (2 MiB of TSO frames) left the device
        // idle meanwhile: VM→VM at MTU 1500 went from 0.76-0.79x the TAP
        // datapath to 0.80-0.84x, two narrowed runs of each, alternated.
        tx.offer(id);
        tx.publish()?;
    }
}

/// Frames the device put in rx buffers, written to the guest's TAP from
/// there (a frame spans `num_buffers` of them); the buffers offered again.
fn to_guest(mut rx: Queue, guest: &OwnedFd) -> io::Result<()> {
    let mem = rx.mem.clone();
    for id in 0..QUEUE_SIZE {
        let at = rx.desc + 16 * u64::from(id);
        mem.write_desc(at, rx.buffer(id), RX_BUFFER as u32, DESC_WRITE, 0);
        rx.offer(id);
    }
    rx.publish()?;
    let mut pieces: Vec<libc::iovec> = Vec::with_capacity(QUEUE_SIZE as usize);
    let mut ids: Vec<u16> = Vec::with_capacity(QUEUE_SIZE as usize);
    loop {
        let Some((id, len)) = rx.next_used() else {
            rx.wait_for_used()?;
            continue;
        };
        let first = rx.buffer(id);
        let count = mem.read_u16(first + 10).max(1);
        pieces.clear();
        ids.clear();
        pieces.push(piece(&mem, first, len));
        ids.push(id);
        while ids.len() < count as usize {
            match rx.next_used() {
                Some((id, len)) => {
                    pieces.push(piece(&mem, rx.buffer(id), len));
                    ids.push(id);
                }
                // The device returns a frame's buffers one by one.
                None => std::hint::spin_loop(),
            }
        }
        // SAFETY: the pieces are the used buffers' bytes, in the mapping.
        let n = unsafe { libc::writev(guest.as_raw_fd(), pieces.as_ptr(), pieces.len() as i32) };
        if n < 0 {
            let e = io::Error::last_os_error();
            // A frame the guest's kernel refused is dropped, as a NIC would.
            if e.raw_os_error() == Some(libc::EBADFD) {
                return Err(e);
            }
        }
        for &id in &ids {
            rx.offer(id);
        }
        // Refilled buffers go back in batches, as a guest's driver refills
        // after each poll, not only once the ring runs dry.
        if rx.avail_idx.wrapping_sub(rx.kicked_idx) >= 32 {
            rx.publish()?;
        }
    }
}

fn piece(mem: &Memory, addr: u64, len: u32) -> libc::iovec {
    libc::iovec {
        iov_base: mem.at(addr).cast(),
        iov_len: len as usize,
    }
}

/// Waits (up to a second) for one of `fds` to be readable.
fn wait(fds: &[RawFd]) -> io::Result<()> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: a valid array of pollfds.
    let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 1000) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}
