//! The connections the gate holds: each held TCP connection's first bytes
//! gathered from its packets in sequence order until they show a name
//! (`super::shown`), then one verdict for every packet held meanwhile.
//! Plain data, driven by `process`: a packet in (`packet`), the time
//! passing (`tick`), verdicts and records out.
//!
//! The stream starts where the connection's SYN says (its sequence number
//! plus one, with what a SYN carries itself: TCP Fast Open), as the
//! server will read it: a VM cannot have the gate read one thing and the
//! server another. A connection whose SYN the gate did not see is refused.
//! A packet that comes without its connection held (queued before its
//! connection's verdict, or of a new connection on a reused address and
//! port) is sent back through the queue's rule once (`Judged::Recheck`):
//! conntrack, not a table of the gate's, says whether its connection was
//! allowed meanwhile; if it comes back, it is refused.
//!
//! Bounded: `MAX_BYTES` of a stream and `WAIT` to show a name; at most
//! `PER_VM` connections held with bytes for one VM and `IN_ALL` for all,
//! and `BYTES_IN_ALL` bytes of theirs; `STARTED_PER_VM` and `STARTED`
//! connections noted before their first byte. A VM over its share has its
//! own new connections refused, nobody else's.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use super::vms::{Refusal, Vms};
use super::wire::{Judged, Judgement};
use super::{MAX_BYTES, Shown, shown};
use crate::types::InterfaceId;

/// How long a connection may take to show its name, from its first byte.
pub const WAIT: Duration = Duration::from_secs(5);
/// Connections held with bytes, per VM and in all, and their bytes.
pub const PER_VM: usize = 1024;
pub const IN_ALL: usize = 16384;
pub const BYTES_IN_ALL: usize = 48 << 20;
/// Connections noted at their SYN (bytes or not), per VM and in all.
pub const STARTED_PER_VM: usize = 4096;
pub const STARTED: usize = 65536;
/// How long a connection that sent nothing stays noted.
const NOTED_FOR: Duration = Duration::from_secs(60);

const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const RST: u8 = 0x04;

/// A TCP connection, as the VM sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    pub source: IpAddr,
    pub destination: IpAddr,
    pub source_port: u16,
    pub port: u16,
}

/// A packet's TCP segment.
#[derive(Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    pub flow: Flow,
    pub seq: u32,
    pub flags: u8,
    pub data: &'a [u8],
}

/// The TCP segment of an IPv4 or IPv6 packet; None for anything else (a
/// fragment, an extension header, a short or inconsistent header).
pub fn segment(packet: &[u8]) -> Option<Segment<'_>> {
    let (source, destination, tcp) = match packet.first()? >> 4 {
        4 => {
            let header = usize::from(packet[0] & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
            let fragment = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]) & 0x3fff;
            if header < 20 || *packet.get(9)? != 6 || fragment != 0 {
                return None;
            }
            // A GSO packet's length field may be 0; its bytes are all there.
            let end = if total == 0 {
                packet.len()
            } else {
                total.min(packet.len())
            };
            let source: [u8; 4] = packet.get(12..16)?.try_into().ok()?;
            let destination: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
            (
                IpAddr::V4(Ipv4Addr::from(source)),
                IpAddr::V4(Ipv4Addr::from(destination)),
                packet.get(header..end)?,
            )
        }
        6 => {
            if *packet.get(6)? != 6 {
                return None;
            }
            let payload = usize::from(u16::from_be_bytes([*packet.get(4)?, *packet.get(5)?]));
            let end = if payload == 0 {
                packet.len()
            } else {
                (40 + payload).min(packet.len())
            };
            let source: [u8; 16] = packet.get(8..24)?.try_into().ok()?;
            let destination: [u8; 16] = packet.get(24..40)?.try_into().ok()?;
            (
                IpAddr::V6(Ipv6Addr::from(source)),
                IpAddr::V6(Ipv6Addr::from(destination)),
                packet.get(40..end)?,
            )
        }
        _ => return None,
    };
    let offset = usize::from(tcp.get(12)? >> 4) * 4;
    if offset < 20 {
        return None;
    }
    Some(Segment {
        flow: Flow {
            source,
            destination,
            source_port: u16::from_be_bytes([tcp[0], tcp[1]]),
            port: u16::from_be_bytes([tcp[2], tcp[3]]),
        },
        seq: u32::from_be_bytes(tcp[4..8].try_into().ok()?),
        flags: tcp[13],
        data: tcp.get(offset..)?,
    })
}

struct Held {
    interface_id: InterfaceId,
    /// The sequence number of its first byte: its SYN's, plus one.
    start: u32,
    stream: Vec<u8>,
    /// Its packets waiting for the verdict.
    packets: Vec<u32>,
    /// When its first byte came; None while it has sent none.
    since: Option<Instant>,
    noted: Instant,
}

/// What the gate decided, for the process to send.
#[derive(Default)]
pub struct Out {
    pub verdicts: Vec<(u32, Judged)>,
    pub judgements: Vec<Judgement>,
}

/// Counts of one kind of connection, in all and by VM.
#[derive(Default)]
struct Shares {
    in_all: usize,
    by_vm: HashMap<InterfaceId, usize>,
}

impl Shares {
    fn of(&self, vm: InterfaceId) -> usize {
        self.by_vm.get(&vm).copied().unwrap_or(0)
    }

    fn add(&mut self, vm: InterfaceId) {
        self.in_all += 1;
        *self.by_vm.entry(vm).or_default() += 1;
    }

    fn remove(&mut self, vm: InterfaceId) {
        self.in_all -= 1;
        if let Entry::Occupied(mut e) = self.by_vm.entry(vm) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

#[derive(Default)]
pub struct Gate {
    pub vms: Vms,
    held: HashMap<Flow, Held>,
    /// Connections noted, and those of them held with bytes; their bytes.
    started: Shares,
    with_bytes: Shares,
    bytes: usize,
    scratch: Vec<u8>,
}

impl Gate {
    /// Connections held with bytes now.
    #[cfg(test)]
    pub fn holding(&self) -> usize {
        self.with_bytes.in_all
    }

    /// Judges packet `id` (that came with the gate's mark bits `again`
    /// set: it was sent back once already); its verdict, and those of the
    /// packets held with it once its connection is judged, go to `out`.
    pub fn packet(&mut self, id: u32, bytes: &[u8], again: bool, now: Instant, out: &mut Out) {
        let Some(segment) = segment(bytes) else {
            out.verdicts.push((id, Judged::Refuse));
            return;
        };
        let flow = segment.flow;
        let Some(vm) = self.vms.of(flow.source) else {
            out.verdicts.push((id, Judged::Refuse));
            refuse_record(flow, None, Refusal::Unknown, InterfaceId::nil(), out);
            return;
        };
        let interface_id = self.vms.interface_id(vm);
        if segment.flags & SYN != 0 {
            self.syn(id, &segment, interface_id, now, out);
            if segment.data.is_empty() || !self.held.contains_key(&flow) {
                return;
            }
        } else if !self.held.contains_key(&flow) {
            // Queued before its connection was judged, or of a connection
            // the gate did not see start: conntrack says which, once.
            let judged = if segment.data.is_empty() && segment.flags & (FIN | RST) != 0 {
                Judged::Pass
            } else if again {
                refuse_record(flow, None, Refusal::Unseen, interface_id, out);
                Judged::Refuse
            } else {
                Judged::Recheck
            };
            out.verdicts.push((id, judged));
            return;
        } else if segment.data.is_empty() {
            // An ACK, a FIN, a RST: nothing to read. One that ends a
            // connection with nothing sent lets it go.
            if segment.flags & (FIN | RST) != 0 && self.held[&flow].since.is_none() {
                self.release(flow);
            }
            out.verdicts.push((id, Judged::Pass));
            return;
        }
        self.data(id, &segment, now, out);
    }

    /// A SYN: the connection starts at its sequence number plus one.
    fn syn(
        &mut self,
        id: u32,
        segment: &Segment<'_>,
        interface_id: InterfaceId,
        now: Instant,
        out: &mut Out,
    ) {
        let flow = segment.flow;
        let start = segment.seq.wrapping_add(1);
        match self.held.get(&flow) {
            // Sent again.
            Some(held) if held.start == start => {
                if segment.data.is_empty() {
                    out.verdicts.push((id, Judged::Pass));
                }
                return;
            }
            // A new connection on the same address and port: the old one
            // is over (conntrack opened a new one); what it held, refused.
            Some(held) if held.since.is_none() => {
                self.release(flow);
            }
            Some(_) => self.decide(flow, Err((None, Refusal::Unseen)), out),
            None => {}
        }
        if self.started.of(interface_id) >= STARTED_PER_VM || self.started.in_all >= STARTED {
            out.verdicts.push((id, Judged::Refuse));
            refuse_record(flow, None, Refusal::TooMany, interface_id, out);
            return;
        }
        self.started.add(interface_id);
        self.held.insert(
            flow,
            Held {
                interface_id,
                start,
                stream: Vec::new(),
                packets: Vec::new(),
                since: None,
                noted: now,
            },
        );
        if segment.data.is_empty() {
            out.verdicts.push((id, Judged::Pass));
        }
    }

    /// Bytes of a held connection (a SYN's own among them).
    fn data(&mut self, id: u32, segment: &Segment<'_>, now: Instant, out: &mut Out) {
        let flow = segment.flow;
        let held = self.held.get_mut(&flow).expect("a held connection");
        let interface_id = held.interface_id;
        if held.since.is_none() {
            if self.with_bytes.of(interface_id) >= PER_VM
                || self.with_bytes.in_all >= IN_ALL
                || self.bytes >= BYTES_IN_ALL
            {
                held.packets.push(id);
                self.decide(flow, Err((None, Refusal::TooMany)), out);
                return;
            }
            held.since = Some(now);
            self.with_bytes.add(interface_id);
        }
        // Where this segment's bytes fall in the stream so far (a SYN's
        // sequence number is its own, one before the stream's).
        let seq = if segment.flags & SYN != 0 {
            segment.seq.wrapping_add(1)
        } else {
            segment.seq
        };
        let offset = seq.wrapping_sub(held.start) as usize;
        let end = held.stream.len();
        if offset > end {
            // Past a gap (or before the start): held, its bytes read when
            // the sender sends them again in order.
            held.packets.push(id);
            return;
        }
        let fresh = &segment.data[(end - offset).min(segment.data.len())..];
        if fresh.is_empty() {
            // A copy of what is held already: the original goes on.
            out.verdicts.push((id, Judged::Drop));
            return;
        }
        let taken = fresh.len().min(MAX_BYTES - end.min(MAX_BYTES));
        held.stream.extend_from_slice(&fresh[..taken]);
        self.bytes += taken;
        held.packets.push(id);
        let Some(vm) = self.vms.of(flow.source) else {
            self.decide(flow, Err((None, Refusal::Unknown)), out);
            return;
        };
        let decision = match shown(&held.stream, &mut self.scratch) {
            Shown::More => return,
            Shown::Name(name) => {
                let name = name.to_string();
                match self.vms.judge(vm, flow.destination, flow.port, &name, now) {
                    Ok(()) => Ok(name),
                    Err(why) => Err((Some(name), why)),
                }
            }
            Shown::Nameless => Err((None, Refusal::Nameless)),
            Shown::Neither => Err((None, Refusal::Neither)),
            Shown::Malformed(why) => Err((None, Refusal::Malformed(why))),
        };
        self.decide(flow, decision, out);
    }

    /// Gives the verdict on `flow`: its held packets' and its record.
    fn decide(
        &mut self,
        flow: Flow,
        decision: Result<String, (Option<String>, Refusal)>,
        out: &mut Out,
    ) {
        let Some(held) = self.release(flow) else {
            return;
        };
        let judged = if decision.is_ok() {
            Judged::Allow
        } else {
            Judged::Refuse
        };
        out.verdicts
            .extend(held.packets.iter().map(|&id| (id, judged)));
        match decision {
            Ok(name) => out.judgements.push(Judgement {
                interface_id: held.interface_id,
                source: flow.source,
                source_port: flow.source_port,
                destination: flow.destination,
                port: flow.port,
                shown: Some(name),
                allowed: true,
                why: None,
            }),
            Err((name, why)) => refuse_record(flow, name, why, held.interface_id, out),
        }
    }

    /// Takes `flow` out of what is held, and out of the counts.
    fn release(&mut self, flow: Flow) -> Option<Held> {
        let held = self.held.remove(&flow)?;
        self.started.remove(held.interface_id);
        if held.since.is_some() {
            self.with_bytes.remove(held.interface_id);
            self.bytes -= held.stream.len();
        }
        Some(held)
    }

    /// Refuses what waited too long to show a name, and forgets what is
    /// old.
    pub fn tick(&mut self, now: Instant, out: &mut Out) {
        let late: Vec<Flow> = (self.held.iter())
            .filter(|(_, h)| match h.since {
                Some(since) => now.duration_since(since) >= WAIT,
                None => now.duration_since(h.noted) >= NOTED_FOR,
            })
            .map(|(flow, _)| *flow)
            .collect();
        for flow in late {
            if self.held[&flow].since.is_some() {
                self.decide(flow, Err((None, Refusal::TooSlow)), out);
            } else {
                self.release(flow);
            }
        }
        self.vms.expire(now);
    }
}

fn refuse_record(
    flow: Flow,
    shown: Option<String>,
    why: Refusal,
    interface_id: InterfaceId,
    out: &mut Out,
) {
    out.judgements.push(Judgement {
        interface_id,
        source: flow.source,
        source_port: flow.source_port,
        destination: flow.destination,
        port: flow.port,
        shown,
        allowed: false,
        why: Some(why.why().into()),
    });
}

#[cfg(test)]
mod tests {
    use super::super::hello::tests::{hello, records};
    use super::super::wire::GatedVm;
    use super::*;
    use crate::policy::Policy;

    const VM: &str = "10.0.0.2";
    const SERVER: &str = "192.0.2.1";
    const ACK: u8 = 0x10;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn gate(rules: &[&str]) -> Gate {
        let mut gate = Gate::default();
        let id = InterfaceId::from_u128(1);
        gate.vms.set(vec![GatedVm {
            interface_id: id,
            addrs: vec![ip(VM)],
            policy: Policy {
                egress: rules.iter().map(|r| r.parse().unwrap()).collect(),
                ..Default::default()
            },
        }]);
        gate.vms
            .learned(id, "a.test", &[(ip(SERVER), 60)], Instant::now());
        gate
    }

    /// An IPv4 TCP packet from the VM's `port` to SERVER:443.
    fn tcp(port: u16, seq: u32, flags: u8, data: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
        p.extend(VM.parse::<Ipv4Addr>().unwrap().octets());
        p.extend(SERVER.parse::<Ipv4Addr>().unwrap().octets());
        p.extend(port.to_be_bytes());
        p.extend(443u16.to_be_bytes());
        p.extend(seq.to_be_bytes());
        p.extend([0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        p.extend(data);
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p
    }

    /// A connection from `port` whose SYN has sequence number 100.
    fn started(gate: &mut Gate, port: u16, now: Instant, out: &mut Out) {
        gate.packet(0, &tcp(port, 100, SYN, &[]), false, now, out);
        gate.packet(0, &tcp(port, 101, ACK, &[]), false, now, out);
        out.verdicts.clear();
    }

    #[test]
    fn a_client_hello_in_two_segments_is_read_whole_and_both_pass() {
        let mut gate = gate(&["a.test:443"]);
        let now = Instant::now();
        let mut out = Out::default();
        let stream = records(&hello(Some("a.test"), 2000), 1 << 14);
        gate.packet(1, &tcp(5000, 100, SYN, &[]), false, now, &mut out);
        gate.packet(
            2,
            &tcp(5000, 101, ACK, &stream[..1400]),
            false,
            now,
            &mut out,
        );
        assert_eq!(out.verdicts, vec![(1, Judged::Pass)], "the first held");
        // The first again (retransmitted): a copy.
        gate.packet(
            3,
            &tcp(5000, 101, ACK, &stream[..1400]),
            false,
            now,
            &mut out,
        );
        gate.packet(
            4,
            &tcp(5000, 1501, ACK, &stream[1400..]),
            false,
            now,
            &mut out,
        );
        assert_eq!(
            out.verdicts,
            vec![
                (1, Judged::Pass),
                (3, Judged::Drop),
                (2, Judged::Allow),
                (4, Judged::Allow)
            ]
        );
        assert!(out.judgements[0].allowed);
        assert_eq!(gate.holding(), 0);
        // A packet queued before the verdict: conntrack says, once.
        let later = tcp(5000, 101 + stream.len() as u32, ACK, b"more");
        gate.packet(5, &later, false, now, &mut out);
        assert_eq!(out.verdicts.last(), Some(&(5, Judged::Recheck)));
        gate.packet(6, &later, true, now, &mut out);
        assert_eq!(
            out.verdicts.last(),
            Some(&(6, Judged::Refuse)),
            "back again: its connection is still pending, and not one the gate holds"
        );
    }

    #[test]
    fn the_stream_is_read_from_where_the_syn_says_not_where_the_vm_would_like() {
        let mut gate = gate(&["a.test:443"]);
        let now = Instant::now();
        let mut out = Out::default();
        let allowed = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";
        let other = b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n";
        gate.packet(1, &tcp(6000, 100, SYN, &[]), false, now, &mut out);
        // An ACK that claims the stream starts later, the allowed request
        // there, and another name's at the true start.
        gate.packet(2, &tcp(6000, 1000, ACK, &[]), false, now, &mut out);
        gate.packet(3, &tcp(6000, 1000, ACK, allowed), false, now, &mut out);
        assert_eq!(
            out.verdicts,
            vec![(1, Judged::Pass), (2, Judged::Pass)],
            "past the start: held, not read"
        );
        gate.packet(4, &tcp(6000, 101, ACK, other), false, now, &mut out);
        assert_eq!(
            &out.verdicts[2..],
            &[(3, Judged::Refuse), (4, Judged::Refuse)]
        );
        assert_eq!(out.judgements[0].shown.as_deref(), Some("b.test"));
        // TCP Fast Open: what a SYN carries is the stream's start.
        gate.packet(5, &tcp(6001, 100, SYN, other), false, now, &mut out);
        assert_eq!(out.verdicts.last(), Some(&(5, Judged::Refuse)));
        gate.packet(6, &tcp(6002, 100, SYN, allowed), false, now, &mut out);
        assert_eq!(out.verdicts.last(), Some(&(6, Judged::Allow)));
    }

    #[test]
    fn a_new_connection_on_a_used_address_and_port_is_judged_anew() {
        let mut gate = gate(&["a.test:443"]);
        let now = Instant::now();
        let mut out = Out::default();
        let allowed = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";
        let other = b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n";
        gate.packet(1, &tcp(7000, 100, SYN, &[]), false, now, &mut out);
        gate.packet(2, &tcp(7000, 101, ACK, allowed), false, now, &mut out);
        assert_eq!(out.verdicts.last(), Some(&(2, Judged::Allow)));
        gate.packet(3, &tcp(7000, 5000, SYN, &[]), false, now, &mut out);
        gate.packet(4, &tcp(7000, 5001, ACK, other), false, now, &mut out);
        assert_eq!(out.verdicts.last(), Some(&(4, Judged::Refuse)));
        // Data of a connection whose SYN the gate never saw: refused once
        // conntrack says it is still pending.
        gate.packet(5, &tcp(7001, 9, ACK, allowed), false, now, &mut out);
        gate.packet(6, &tcp(7001, 9, ACK, allowed), true, now, &mut out);
        assert_eq!(
            &out.verdicts[out.verdicts.len() - 2..],
            &[(5, Judged::Recheck), (6, Judged::Refuse)]
        );
    }

    #[test]
    fn another_name_no_name_and_a_slow_one_are_refused() {
        let mut gate = gate(&["a.test:443"]);
        let now = Instant::now();
        let mut out = Out::default();
        for port in [5001, 5002, 5003] {
            started(&mut gate, port, now, &mut out);
        }
        let other = records(&hello(Some("b.test"), 0), 1 << 14);
        gate.packet(1, &tcp(5001, 101, ACK, &other), false, now, &mut out);
        gate.packet(
            2,
            &tcp(5002, 101, ACK, b"SSH-2.0-x\r\n"),
            false,
            now,
            &mut out,
        );
        gate.packet(
            3,
            &tcp(5003, 101, ACK, b"GET / HTTP/1.1\r\n"),
            false,
            now,
            &mut out,
        );
        assert_eq!(out.verdicts, vec![(1, Judged::Refuse), (2, Judged::Refuse)]);
        let whys: Vec<_> = out.judgements.iter().map(|j| j.why.clone()).collect();
        assert_eq!(
            whys,
            vec![
                Some(Refusal::NotAllowed.why().into()),
                Some(Refusal::Neither.why().into())
            ]
        );
        gate.tick(now + WAIT, &mut out);
        assert_eq!(out.verdicts.last(), Some(&(3, Judged::Refuse)));
        assert_eq!(gate.holding(), 0);
    }

    #[test]
    fn a_vm_holds_at_most_its_share_and_silent_connections_only_their_start() {
        let mut gate = gate(&["a.test:443"]);
        let now = Instant::now();
        let mut out = Out::default();
        for port in 0..STARTED_PER_VM as u16 {
            gate.packet(port.into(), &tcp(port, 7, SYN, &[]), false, now, &mut out);
        }
        assert_eq!(gate.holding(), 0, "nothing sent, nothing held");
        assert!(out.verdicts.iter().all(|(_, j)| *j == Judged::Pass));
        let over = STARTED_PER_VM as u16;
        gate.packet(1, &tcp(over, 7, SYN, &[]), false, now, &mut out);
        assert_eq!(
            out.verdicts.last(),
            Some(&(1, Judged::Refuse)),
            "over its share"
        );
        out.verdicts.clear();
        for port in 0..PER_VM as u16 + 1 {
            gate.packet(
                10_000 + u32::from(port),
                &tcp(port, 8, ACK, b"G"),
                false,
                now,
                &mut out,
            );
        }
        assert_eq!(gate.holding(), PER_VM);
        assert_eq!(
            out.verdicts.last(),
            Some(&(10_000 + PER_VM as u32, Judged::Refuse))
        );
        assert_eq!(
            out.judgements.last().unwrap().why.as_deref(),
            Some(Refusal::TooMany.why())
        );
        // Those that sent nothing are forgotten in time; the held are
        // refused sooner.
        gate.tick(now + NOTED_FOR, &mut out);
        assert_eq!(gate.holding(), 0);
        assert!(gate.held.is_empty());
    }

    #[test]
    fn packets_of_no_known_vm_or_no_tcp_are_refused() {
        let mut gate = gate(&["a.test:443"]);
        let mut out = Out::default();
        let mut stranger = tcp(1, 1, SYN, b"");
        stranger[12..16].copy_from_slice(&[10, 0, 0, 9]);
        gate.packet(1, &stranger, false, Instant::now(), &mut out);
        gate.packet(2, b"\x45\x00", false, Instant::now(), &mut out);
        assert_eq!(out.verdicts, vec![(1, Judged::Refuse), (2, Judged::Refuse)]);
    }
}
