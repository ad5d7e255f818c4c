//! The daemon's side of the name check: it holds the gate's queue
//! (`host::nfqueue`: only a privileged process may give verdicts), keeps
//! `linnet-gate` running (`gate::process`, unprivileged and confined),
//! passes it every held packet and what it judges by, and turns its
//! answers into verdicts, events and counts. It never reads a packet's
//! bytes itself.
//!
//! Fail closed: while no gate runs, every held packet is refused (its
//! connection reset), and the packets a gate held when it died are
//! refused too; a new gate is started within a second and given the VMs
//! and their learned names again. Without the daemon the queue has no
//! reader and the kernel drops held packets. Connections judged before
//! are marked in conntrack and never come here again, so a restart of
//! either cuts none.
//!
//! One thread of its own (the queue and the gate's socket, polled
//! together), fed by the daemon through a channel; what the DNS learns
//! reaches the gate before the answer is released, so before the VM can
//! use it.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::rr::Name;
use nix::sys::eventfd::{EfdFlags, EventFd};
use tracing::{error, info, warn};

use crate::budget::RateLimit;
use crate::events::{Bus, What};
use crate::gate::process::{DAEMON_FD, EXECUTABLE};
use crate::gate::wire::{self, Control, FromGate, GatedVm, Judged, Judgement};
use crate::host::conntrack_events::{self, Events, Told, Tuple};
use crate::host::firewall::gate::{ALLOWED, MASK, PASS, REFUSED, holds};
use crate::host::gate_queue::QUEUE;
use crate::host::nfqueue::{self, Queue, Verdict};
use crate::names;
use crate::services::name_gate::{NamedVm, Pins};
use crate::types::InterfaceId;

/// Packets the kernel keeps waiting for verdicts, at most: past them it
/// drops new ones (their senders retransmit).
const QUEUE_LENGTH: u32 = 65536;
/// How soon a gate that died is started again, at first and at most.
const RESTART_FIRST: Duration = Duration::from_millis(50);
const RESTART_AT_MOST: Duration = Duration::from_secs(1);
/// A gate that ran this long without dying starts the wait over.
const STEADY: Duration = Duration::from_secs(10);
/// Allowed connections followed to their end, at most (past them, their
/// ends are not on record).
const MAX_OPEN: usize = 1 << 18;
/// How often expired addresses are forgotten.
const TIDY: Duration = Duration::from_secs(10);
/// Records of one VM's connections at most in each window; the rest are
/// counted (`held_back`) in the next that goes out.
const RECORDS_PER_WINDOW: u32 = 100;
const RECORD_WINDOW: Duration = Duration::from_secs(10);
/// The root daemon's gate runs as this uid and gid, just below the root
/// relays' (`network_sockets`), owned by no one.
pub const GATE_UID: u32 = 0x7f6b_ffff;

/// A VM's connections the gate judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub allowed: u64,
    pub refused: u64,
}

enum Message {
    Vms(Vec<NamedVm>),
    /// What a VM learned (`Control::Learned`, `Control::Restored`).
    Tell(Control),
    Stop,
}

/// The handle the daemon keeps.
pub struct Gatekeeper {
    messages: Mutex<Sender<Message>>,
    wake: Arc<EventFd>,
    counts: Arc<Mutex<BTreeMap<InterfaceId, Counts>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Gatekeeper {
    /// Binds the queue and starts the gate; `run_as` the uid and gid it
    /// runs as (None: the daemon's own, a rootless daemon's user).
    pub fn start(events: Bus, run_as: Option<(u32, u32)>) -> anyhow::Result<Arc<Gatekeeper>> {
        let executable = super::confined::beside_me(
            EXECUTABLE,
            "connections of VMs whose policy names DNS names are checked by it",
        )?;
        let queue = Queue::open(QUEUE, QUEUE_LENGTH).map_err(|e| {
            anyhow::anyhow!(
                "cannot read netfilter queue {QUEUE} for the name check ({e}): is the kernel's nfnetlink_queue there?"
            )
        })?;
        let wake = Arc::new(EventFd::from_value_and_flags(
            0,
            EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
        )?);
        let (sender, receiver) = channel();
        let counts = Arc::new(Mutex::new(BTreeMap::new()));
        let keeper = Keeper {
            queue,
            executable,
            run_as,
            events,
            messages: receiver,
            wake: wake.clone(),
            counts: counts.clone(),
            gate: None,
            restart_at: Some(Instant::now()),
            restart_wait: RESTART_FIRST,
            outstanding: HashMap::new(),
            vms: Vec::new(),
            pins: HashMap::new(),
            restored: HashMap::new(),
            records: RateLimit::new(RECORDS_PER_WINDOW, RECORD_WINDOW),
            held_back: HashMap::new(),
            batch: Vec::with_capacity(64 << 10),
            message: Vec::with_capacity(wire::MAX_MESSAGE),
            backlog: VecDeque::new(),
            ends: open_ends(),
            open: HashMap::new(),
            counting: false,
        };
        let thread = std::thread::Builder::new()
            .name("gatekeeper".into())
            .spawn(move || keeper.run())?;
        Ok(Arc::new(Gatekeeper {
            messages: Mutex::new(sender),
            wake,
            counts,
            thread: Mutex::new(Some(thread)),
        }))
    }

    fn send(&self, message: Message) {
        let _ = self.messages.lock().expect("gatekeeper lock").send(message);
        let _ = self.wake.write(1);
    }

    /// Each VM's connections allowed and refused so far.
    pub fn counts(&self) -> BTreeMap<InterfaceId, Counts> {
        self.counts.lock().expect("gate counts lock").clone()
    }

    /// Stops the gate and lets go of the queue.
    pub fn stop(&self) {
        self.send(Message::Stop);
        if let Some(thread) = self.thread.lock().expect("gatekeeper lock").take() {
            let _ = thread.join();
        }
    }
}

impl Pins for Gatekeeper {
    fn vms(&self, vms: &[NamedVm]) {
        self.send(Message::Vms(vms.to_vec()));
    }

    fn learned(&self, interface_id: InterfaceId, name: &Name, addrs: &[(IpAddr, u32)]) {
        self.send(Message::Tell(Control::Learned {
            interface_id,
            name: names::shown(&names::normalise(name)),
            addrs: addrs.to_vec(),
        }));
    }

    fn restored(&self, interface_id: InterfaceId, reach: usize, addrs: &[(IpAddr, u32)]) {
        self.send(Message::Tell(Control::Restored {
            interface_id,
            reach,
            addrs: addrs.to_vec(),
        }));
    }
}

struct Running {
    child: Child,
    socket: UnixDatagram,
    started: Instant,
}

/// A message for the gate that waits for room: a packet's (with its id
/// and mark) or the daemon's word.
type Waiting = (Option<(u32, u32)>, Vec<u8>);

struct Keeper {
    queue: Queue,
    executable: PathBuf,
    run_as: Option<(u32, u32)>,
    events: Bus,
    messages: Receiver<Message>,
    wake: Arc<EventFd>,
    counts: Arc<Mutex<BTreeMap<InterfaceId, Counts>>>,
    gate: Option<Running>,
    /// When to start a gate (None while one runs).
    restart_at: Option<Instant>,
    restart_wait: Duration,
    /// Packets the gate has and has not answered, with their marks.
    outstanding: HashMap<u32, u32>,
    /// What the gate is told again when it starts again.
    vms: Vec<NamedVm>,
    /// (VM, name) → address → until when.
    pins: HashMap<(InterfaceId, String), HashMap<IpAddr, Instant>>,
    /// (VM, reach) → address → until when: a previous daemon's.
    restored: HashMap<(InterfaceId, usize), HashMap<IpAddr, Instant>>,
    records: RateLimit<InterfaceId>,
    held_back: HashMap<InterfaceId, u64>,
    /// Verdicts to send the kernel, and a message to the gate.
    batch: Vec<u8>,
    message: Vec<u8>,
    /// Messages the gate's socket had no room for yet, in order (with the
    /// packet each is, if one): while there are any, the queue is not
    /// read, so held packets wait in the kernel, not here.
    backlog: VecDeque<Waiting>,
    /// Conntrack's word on allowed connections' ends (None: not to be
    /// had), and those connections until then.
    ends: Option<Events>,
    open: HashMap<Tuple, Open>,
    /// Whether conntrack's byte counts were asked for: once a VM's
    /// connections are held, not before (they cost every connection of
    /// the namespace a little).
    counting: bool,
}

/// Conntrack's events of allowed connections; None (said in the log)
/// where they cannot be had.
fn open_ends() -> Option<Events> {
    match Events::open() {
        Ok(events) => Some(events),
        Err(e) => {
            warn!(
                "cannot follow conntrack's events ({e}): allowed connections' ends are not on record"
            );
            None
        }
    }
}

/// Turns conntrack's byte counts on, for allowed connections' records.
fn count_bytes() {
    match conntrack_events::enable_accounting() {
        Ok(true) => {}
        Ok(false) => info!(
            "turned conntrack's accounting on (net.netfilter.nf_conntrack_acct), for the bytes of allowed connections' records"
        ),
        Err(e) => warn!(
            "cannot turn conntrack's accounting on ({e}): allowed connections' records come without their bytes"
        ),
    }
}

fn gated(vms: &[NamedVm]) -> Vec<GatedVm> {
    vms.iter()
        .map(|vm| GatedVm {
            interface_id: vm.interface_id,
            addrs: vm.addrs.clone(),
            policy: vm.policy.clone(),
        })
        .collect()
}

/// Keeps `addrs` (each for so many seconds from now) in `entry`, with
/// what it had that has not expired.
fn remember<K>(
    entry: std::collections::hash_map::Entry<'_, K, HashMap<IpAddr, Instant>>,
    addrs: &[(IpAddr, u32)],
) {
    let now = Instant::now();
    let pins = entry.or_default();
    for &(addr, seconds) in addrs {
        let until = now + Duration::from_secs(seconds.into());
        let at = pins.entry(addr).or_insert(until);
        *at = (*at).max(until);
    }
    pins.retain(|_, until| *until > now);
}

/// The addresses still live at `now`, with the seconds each has left.
fn left(addrs: &HashMap<IpAddr, Instant>, now: Instant) -> Vec<(IpAddr, u32)> {
    (addrs.iter())
        .filter(|(_, until)| **until > now)
        .map(|(addr, until)| (*addr, until.duration_since(now).as_secs().max(1) as u32))
        .collect()
}

/// send(2) that never waits (nor raises SIGPIPE).
fn send_now(socket: &UnixDatagram, message: &[u8]) -> io::Result<()> {
    // SAFETY: send(2) of our buffer on our socket.
    let n = unsafe {
        libc::send(
            socket.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The verdict on a packet that came with `mark`: the gate's bits of it
/// say what the firewall does next (`host::firewall::gate`), the others
/// stay as they were.
fn verdict(judged: Judged, mark: u32) -> Verdict {
    let ours = |bits: u32| mark & !MASK | bits;
    match judged {
        Judged::Pass => Verdict::Accept(ours(PASS)),
        Judged::Allow => Verdict::Accept(ours(ALLOWED)),
        Judged::Refuse => Verdict::Accept(ours(REFUSED)),
        Judged::Drop => Verdict::Drop,
        // Marked as passed once: if it comes back, the gate knows.
        Judged::Recheck => Verdict::Repeat(ours(PASS)),
    }
}

impl Keeper {
    fn run(mut self) {
        let mut buf = vec![0u8; 256 << 10];
        let mut tidied = Instant::now();
        loop {
            if !self.take_messages() {
                break;
            }
            if tidied.elapsed() >= TIDY {
                self.forget_expired();
                tidied = Instant::now();
            }
            if self.gate.is_none() && self.restart_at.is_some_and(|at| Instant::now() >= at) {
                self.start_gate();
            }
            let timeout = match self.restart_at {
                Some(at) => at.saturating_duration_since(Instant::now()).as_millis() as i32,
                None => 1000,
            };
            // Behind on the gate: the packets wait in the kernel's queue.
            let backlogged = !self.backlog.is_empty();
            let mut fds = vec![
                libc::pollfd {
                    fd: self.queue.as_fd().as_raw_fd(),
                    events: if backlogged { 0 } else { libc::POLLIN },
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.wake.as_fd().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            fds.push(libc::pollfd {
                fd: self.ends.as_ref().map_or(-1, |e| e.as_fd().as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            });
            if let Some(gate) = &self.gate {
                fds.push(libc::pollfd {
                    fd: gate.socket.as_raw_fd(),
                    events: libc::POLLIN | if backlogged { libc::POLLOUT } else { 0 },
                    revents: 0,
                });
            }
            // SAFETY: poll(2) of our pollfds.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    error!("the gatekeeper cannot wait on its queue: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            if fds[1].revents != 0 {
                let _ = self.wake.read();
            }
            // What the daemon said before these packets were sent.
            if !self.take_messages() {
                break;
            }
            if fds[2].revents != 0 {
                self.read_ends(&mut buf);
            }
            if fds.len() > 3 && fds[3].revents & libc::POLLOUT != 0 {
                self.send_backlog();
            }
            if fds.len() > 3 && fds[3].revents & !libc::POLLOUT != 0 {
                self.read_gate(&mut buf);
            }
            if fds[0].revents != 0 {
                self.read_queue(&mut buf);
            }
            self.flush_verdicts();
        }
        if let Some(mut gate) = self.gate.take() {
            let _ = gate.child.kill();
            let _ = gate.child.wait();
        }
    }

    /// Forgets the names' addresses that expired (the gate does the same).
    fn forget_expired(&mut self) {
        let now = Instant::now();
        let live = |addrs: &mut HashMap<IpAddr, Instant>| {
            addrs.retain(|_, until| *until > now);
            !addrs.is_empty()
        };
        self.pins.retain(|_, addrs| live(addrs));
        self.restored.retain(|_, addrs| live(addrs));
        // Conntrack forgets an established connection idle for 5 days: an
        // end it told while the daemon was behind is not waited for longer.
        self.open
            .retain(|_, open| open.at.elapsed() < Duration::from_secs(6 * 24 * 3600));
    }

    /// Takes in what the daemon sent; false once it says stop.
    fn take_messages(&mut self) -> bool {
        loop {
            match self.messages.try_recv() {
                Ok(Message::Vms(vms)) => {
                    if !self.counting && vms.iter().any(|vm| holds(&vm.policy)) {
                        self.counting = true;
                        count_bytes();
                    }
                    let ids: HashSet<InterfaceId> = vms.iter().map(|v| v.interface_id).collect();
                    self.pins.retain(|(id, _), _| ids.contains(id));
                    self.held_back.retain(|id, _| ids.contains(id));
                    (self.counts.lock().expect("gate counts lock"))
                        .retain(|id, _| ids.contains(id));
                    // As the gate does: a VM gone, or with a new policy,
                    // loses what came back by reach.
                    let same: HashSet<InterfaceId> = (vms.iter())
                        .filter(|v| {
                            (self.vms.iter()).any(|old| {
                                old.interface_id == v.interface_id && old.policy == v.policy
                            })
                        })
                        .map(|v| v.interface_id)
                        .collect();
                    self.restored.retain(|(id, _), _| same.contains(id));
                    self.vms = vms;
                    self.tell(&Control::Vms(gated(&self.vms)));
                }
                Ok(Message::Tell(control)) => {
                    match &control {
                        Control::Learned {
                            interface_id,
                            name,
                            addrs,
                        } => remember(self.pins.entry((*interface_id, name.clone())), addrs),
                        Control::Restored {
                            interface_id,
                            reach,
                            addrs,
                        } => remember(self.restored.entry((*interface_id, *reach)), addrs),
                        Control::Vms(_) => {}
                    }
                    self.tell(&control);
                }
                Ok(Message::Stop) | Err(TryRecvError::Disconnected) => return false,
                Err(TryRecvError::Empty) => return true,
            }
        }
    }

    /// Sends the gate `control`, if one runs.
    fn tell(&mut self, control: &Control) {
        if self.gate.is_some() {
            self.send_gate(None, &wire::control(control));
        }
    }

    /// Sends `message` to the gate (a packet's, with its id and mark),
    /// after what waits before it; what finds no room waits its turn.
    fn send_gate(&mut self, packet: Option<(u32, u32)>, message: &[u8]) {
        let Some(gate) = &self.gate else {
            return;
        };
        if self.backlog.is_empty() {
            match send_now(&gate.socket, message) {
                Ok(()) => {
                    if let Some((id, mark)) = packet {
                        self.outstanding.insert(id, mark);
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    if let Some((id, mark)) = packet {
                        self.queue
                            .verdict(&mut self.batch, id, verdict(Judged::Refuse, mark));
                    }
                    self.gate_died(&format!("cannot write to it: {e}"));
                    return;
                }
            }
        }
        self.backlog.push_back((packet, message.to_vec()));
    }

    /// Sends what waited, as far as the gate's socket has room.
    fn send_backlog(&mut self) {
        while let Some((packet, message)) = self.backlog.front() {
            let Some(gate) = &self.gate else {
                return;
            };
            match send_now(&gate.socket, message) {
                Ok(()) => {
                    if let Some((id, mark)) = *packet {
                        self.outstanding.insert(id, mark);
                    }
                    self.backlog.pop_front();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.gate_died(&format!("cannot write to it: {e}"));
                    return;
                }
            }
        }
    }

    fn start_gate(&mut self) {
        match self.spawn() {
            Ok(gate) => {
                info!(pid = gate.child.id(), "linnet-gate started");
                self.gate = Some(gate);
                self.restart_at = None;
                self.tell(&Control::Vms(gated(&self.vms)));
                let now = Instant::now();
                let restored = (self.restored.iter()).map(|((interface_id, reach), addrs)| {
                    Control::Restored {
                        interface_id: *interface_id,
                        reach: *reach,
                        addrs: left(addrs, now),
                    }
                });
                let pins =
                    (self.pins.iter()).map(|((interface_id, name), addrs)| Control::Learned {
                        interface_id: *interface_id,
                        name: name.clone(),
                        addrs: left(addrs, now),
                    });
                let controls: Vec<Control> = restored.chain(pins).collect();
                for control in controls {
                    self.tell(&control);
                }
            }
            Err(e) => {
                error!(
                    "cannot start {}: {e}; connections held for their name are refused until it runs",
                    self.executable.display()
                );
                self.restart_at = Some(Instant::now() + self.restart_wait);
                self.restart_wait = (self.restart_wait * 2).min(RESTART_AT_MOST);
            }
        }
    }

    fn spawn(&self) -> io::Result<Running> {
        // Room for bursts of held packets: what finds none waits its turn.
        let (ours, theirs) = super::confined::pair(4 << 20)?;
        let child = super::confined::spawn(
            &self.executable,
            self.run_as,
            &[(theirs.as_fd(), DAEMON_FD)],
        )?;
        drop(theirs);
        Ok(Running {
            child,
            socket: ours,
            started: Instant::now(),
        })
    }

    /// The gate is gone: what it held is refused, and another starts soon.
    fn gate_died(&mut self, why: &str) {
        let Some(mut gate) = self.gate.take() else {
            return;
        };
        let _ = gate.child.kill();
        let status = gate.child.wait();
        if gate.started.elapsed() >= STEADY {
            self.restart_wait = RESTART_FIRST;
        }
        warn!(
            held = self.outstanding.len(),
            "linnet-gate stopped ({why}; {status:?}): the connections it held are refused, and it starts again in {:?}",
            self.restart_wait
        );
        let waiting = std::mem::take(&mut self.backlog).into_iter();
        let waiting = waiting.filter_map(|(packet, _)| packet);
        for (id, mark) in std::mem::take(&mut self.outstanding)
            .into_iter()
            .chain(waiting)
        {
            self.queue
                .verdict(&mut self.batch, id, verdict(Judged::Refuse, mark));
        }
        self.restart_at = Some(Instant::now() + self.restart_wait);
        self.restart_wait = (self.restart_wait * 2).min(RESTART_AT_MOST);
    }

    fn read_queue(&mut self, buf: &mut [u8]) {
        // While the gate's socket has room: past it, the rest of one
        // read waits here, and the kernel's queue holds what follows.
        while self.backlog.is_empty() {
            let n = match self.queue.recv(buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) => {
                    // ENOBUFS: the kernel dropped packets we did not read
                    // in time; their senders retransmit.
                    warn!("reading the gate's queue: {e}");
                    return;
                }
            };
            for packet in nfqueue::packets(&buf[..n]) {
                if self.gate.is_none() {
                    // No gate: refused, never let through unjudged.
                    let refused = verdict(Judged::Refuse, packet.mark);
                    self.queue.verdict(&mut self.batch, packet.id, refused);
                    continue;
                }
                let again = packet.mark & MASK == PASS;
                let mut message = std::mem::take(&mut self.message);
                wire::packet(&mut message, packet.id, again, packet.bytes);
                self.send_gate(Some((packet.id, packet.mark)), &message);
                self.message = message;
            }
        }
    }

    fn read_gate(&mut self, buf: &mut [u8]) {
        loop {
            let Some(gate) = &self.gate else {
                return;
            };
            // SAFETY: recv(2) into our buffer.
            let n = unsafe {
                libc::recv(
                    gate.socket.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    self.gate_died(&format!("cannot read from it: {e}"));
                }
                return;
            }
            if n == 0 {
                self.gate_died("it closed its socket");
                return;
            }
            match wire::from_gate(&buf[..n as usize]) {
                Ok(FromGate::Verdicts(pairs)) => {
                    for (id, judged) in wire::each_verdict(pairs) {
                        // Only packets it was given, once each.
                        let Some(mark) = self.outstanding.remove(&id) else {
                            continue;
                        };
                        let judged = judged.unwrap_or(Judged::Refuse);
                        self.queue
                            .verdict(&mut self.batch, id, verdict(judged, mark));
                    }
                }
                Ok(FromGate::Judgement(judgement)) => self.record(judgement),
                Err(e) => {
                    self.gate_died(&e);
                    return;
                }
            }
            if self.batch.len() >= 32 << 10 {
                self.flush_verdicts();
            }
        }
    }

    fn flush_verdicts(&mut self) {
        if let Err(e) = self.queue.send_batch(&mut self.batch) {
            warn!("cannot give the queue its verdicts: {e}");
        }
    }

    /// Counts a judged connection and puts it on record, within its
    /// VM's budget.
    fn record(&mut self, judgement: Judgement) {
        let Some(vm) = self
            .vms
            .iter()
            .find(|vm| vm.interface_id == judgement.interface_id)
        else {
            return;
        };
        let (interface_id, network, name) = (vm.interface_id, vm.network.clone(), vm.name.clone());
        {
            let mut counts = self.counts.lock().expect("gate counts lock");
            let counts = counts.entry(interface_id).or_default();
            if judgement.allowed {
                counts.allowed += 1;
            } else {
                counts.refused += 1;
            }
        }
        if judgement.allowed && self.ends.is_some() && self.open.len() < MAX_OPEN {
            let tuple = Tuple {
                source: judgement.source,
                destination: judgement.destination,
                source_port: judgement.source_port,
                port: judgement.port,
            };
            self.open.insert(
                tuple,
                Open {
                    interface_id,
                    network: network.clone(),
                    name: name.clone(),
                    shown: judgement.shown.clone().unwrap_or_default(),
                    at: Instant::now(),
                },
            );
        }
        let Some(held_back) = self.within_budget(interface_id) else {
            return;
        };
        self.events
            .emit(Some(&network), judgement.event(name, false, held_back));
    }

    /// Whether a record of the VM's may go out now (with the count of
    /// those held back before it), or is held back itself.
    fn within_budget(&mut self, interface_id: InterfaceId) -> Option<u64> {
        if self.records.allow(&interface_id, Instant::now()).is_err() {
            *self.held_back.entry(interface_id).or_default() += 1;
            return None;
        }
        Some(self.held_back.remove(&interface_id).unwrap_or(0))
    }

    /// What conntrack tells of the connections the gate allowed: when
    /// each ended, and once it is forgotten, its record with its bytes.
    fn read_ends(&mut self, buf: &mut [u8]) {
        loop {
            let Some(ends) = &self.ends else {
                return;
            };
            let n = match ends.recv(buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) => {
                    // ENOBUFS: events lost while the daemon was behind;
                    // those connections' ends go unrecorded.
                    warn!("reading conntrack's events: {e}");
                    return;
                }
            };
            let (tuple, bytes) = match conntrack_events::told(&buf[..n]) {
                // Ended: its bytes so far are all it moved.
                Some(Told::Ended(tuple)) if self.open.contains_key(&tuple) => {
                    let counted = ends.counted(&tuple).unwrap_or_else(|e| {
                        warn!("asking conntrack for a connection's bytes: {e}");
                        None
                    });
                    (tuple, counted)
                }
                // Forgotten without having said it ended (an idle timeout).
                Some(Told::Forgotten(tuple, bytes)) => (tuple, bytes),
                _ => continue,
            };
            let Some(open) = self.open.remove(&tuple) else {
                continue;
            };
            let Some(held_back) = self.within_budget(open.interface_id) else {
                continue;
            };
            let what = What::ConnectionEnd {
                interface_id: open.interface_id,
                name: open.name,
                destination: tuple.destination,
                port: tuple.port,
                protocol: "tcp".into(),
                shown: open.shown,
                sent: bytes.map(|(sent, _)| sent),
                received: bytes.map(|(_, received)| received),
                duration_ms: open.at.elapsed().as_millis() as u64,
                held_back,
            };
            self.events.emit(Some(&open.network), what);
        }
    }
}

/// A connection the gate allowed, until conntrack forgets it.
struct Open {
    interface_id: InterfaceId,
    network: String,
    name: Option<String>,
    shown: String,
    at: Instant,
}

/// The uid and gid the gate runs as: its own for a root daemon, the
/// user's own for a rootless one (which has no other to give).
pub fn run_as(rootless: bool) -> Option<(u32, u32)> {
    (!rootless).then_some((GATE_UID, GATE_UID))
}
