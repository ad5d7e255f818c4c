//! The connections the gate holds: each held TCP connection's first bytes
//! gathered from its packets in sequence order until they show a name
//! (`super::shown`), then one verdict for every packet held meanwhile.
//! Plain data, driven by `process`: a packet in (`packet`), the time
//! passing (`tick`), verdicts and records out.
//!
//! Bounded: `MAX_BYTES` of a stream and `WAIT` to show a name; at most
//! `PER_VM` connections held for one VM and `IN_ALL` for all, and
//! `BYTES_IN_ALL` bytes of theirs. A connection that sends nothing is not
//! held at all (its packets go by; only its sequence start is noted), so
//! a VM that opens thousands and sends nothing takes no one's place.

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
/// Connections whose start is noted (no bytes yet), at most.
const NOTED: usize = 65536;
/// How long a noted start, and a verdict for stragglers, are kept.
const NOTED_FOR: Duration = Duration::from_secs(60);
const JUDGED_FOR: Duration = Duration::from_secs(10);

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
        data: tcp.get(offset..)?,
    })
}

struct Held {
    interface_id: InterfaceId,
    /// The sequence number of its first byte.
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

#[derive(Default)]
pub struct Gate {
    pub vms: Vms,
    held: HashMap<Flow, Held>,
    /// Connections held with bytes: in all, by VM; their bytes.
    with_bytes: usize,
    by_vm: HashMap<InterfaceId, usize>,
    bytes: usize,
    /// Verdicts given, for packets of the connection queued before them.
    judged: HashMap<Flow, (Judged, Instant)>,
    scratch: Vec<u8>,
}

impl Gate {
    /// Connections held with bytes now.
    #[cfg(test)]
    pub fn holding(&self) -> usize {
        self.with_bytes
    }

    /// Judges packet `id`; its verdict, and those of the packets held
    /// with it once its connection is judged, go to `out`.
    pub fn packet(&mut self, id: u32, bytes: &[u8], now: Instant, out: &mut Out) {
        let Some(segment) = segment(bytes) else {
            out.verdicts.push((id, Judged::Refuse));
            return;
        };
        let flow = segment.flow;
        if let Some(&(judged, _)) = self.judged.get(&flow) {
            out.verdicts.push((id, judged));
            return;
        }
        let Some(vm) = self.vms.of(flow.source) else {
            out.verdicts.push((id, Judged::Refuse));
            self.refuse_record(flow, None, Refusal::Unknown, InterfaceId::nil(), out);
            return;
        };
        let interface_id = self.vms.interface_id(vm);
        if segment.data.is_empty() {
            // The handshake's last ACK (or a FIN): it shows where the
            // stream starts.
            if self.held.len() < NOTED {
                self.held.entry(flow).or_insert_with(|| Held {
                    interface_id,
                    start: segment.seq,
                    stream: Vec::new(),
                    packets: Vec::new(),
                    since: None,
                    noted: now,
                });
            }
            out.verdicts.push((id, Judged::Pass));
            return;
        }
        let held = match self.held.entry(flow) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(Held {
                interface_id,
                start: segment.seq,
                stream: Vec::new(),
                packets: Vec::new(),
                since: None,
                noted: now,
            }),
        };
        if held.since.is_none() {
            let by_vm = self.by_vm.get(&interface_id).copied().unwrap_or(0);
            if by_vm >= PER_VM || self.with_bytes >= IN_ALL || self.bytes >= BYTES_IN_ALL {
                self.held.remove(&flow);
                out.verdicts.push((id, Judged::Refuse));
                self.remember(flow, Judged::Refuse, now);
                self.refuse_record(flow, None, Refusal::TooMany, interface_id, out);
                return;
            }
            held.since = Some(now);
            self.with_bytes += 1;
            *self.by_vm.entry(interface_id).or_default() += 1;
        }
        // Where this segment's bytes fall in the stream so far.
        let offset = segment.seq.wrapping_sub(held.start) as usize;
        let end = held.stream.len();
        if offset > end || offset > MAX_BYTES {
            // Past a gap (or before the start, wrapped): held, its bytes
            // read when the sender sends them again in order.
            held.packets.push(id);
            return;
        }
        let fresh = &segment.data[(end - offset).min(segment.data.len())..];
        if fresh.is_empty() {
            // A copy of what is held already: the original goes on.
            out.verdicts.push((id, Judged::Drop));
            return;
        }
        let room = MAX_BYTES - end.min(MAX_BYTES);
        let taken = fresh.len().min(room);
        held.stream.extend_from_slice(&fresh[..taken]);
        self.bytes += taken;
        held.packets.push(id);
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
        self.decide(flow, decision, now, out);
    }

    /// Gives the verdict on `flow`: its held packets' and its record.
    fn decide(
        &mut self,
        flow: Flow,
        decision: Result<String, (Option<String>, Refusal)>,
        now: Instant,
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
        self.remember(flow, judged, now);
        match decision {
            Ok(name) => out.judgements.push(Judgement {
                interface_id: held.interface_id,
                destination: flow.destination,
                port: flow.port,
                shown: Some(name),
                allowed: true,
                why: None,
            }),
            Err((name, why)) => self.refuse_record(flow, name, why, held.interface_id, out),
        }
    }

    fn refuse_record(
        &self,
        flow: Flow,
        shown: Option<String>,
        why: Refusal,
        interface_id: InterfaceId,
        out: &mut Out,
    ) {
        out.judgements.push(Judgement {
            interface_id,
            destination: flow.destination,
            port: flow.port,
            shown,
            allowed: false,
            why: Some(why.why().into()),
        });
    }

    /// Takes `flow` out of what is held, and out of the counts.
    fn release(&mut self, flow: Flow) -> Option<Held> {
        let held = self.held.remove(&flow)?;
        if held.since.is_some() {
            self.with_bytes -= 1;
            self.bytes -= held.stream.len();
            if let Entry::Occupied(mut e) = self.by_vm.entry(held.interface_id) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        Some(held)
    }

    fn remember(&mut self, flow: Flow, judged: Judged, now: Instant) {
        if self.judged.len() >= NOTED {
            self.judged
                .retain(|_, (_, at)| now.duration_since(*at) < JUDGED_FOR);
        }
        if self.judged.len() < NOTED {
            self.judged.insert(flow, (judged, now));
        }
    }

    /// Refuses what waited too long to show a name, and forgets what is
    /// old.
    pub fn tick(&mut self, now: Instant, out: &mut Out) {
        let late: Vec<Flow> = (self.held.iter())
            .filter(|(_, h)| {
                h.since
                    .is_some_and(|since| now.duration_since(since) >= WAIT)
            })
            .map(|(flow, _)| *flow)
            .collect();
        for flow in late {
            self.decide(flow, Err((None, Refusal::TooSlow)), now, out);
        }
        self.held
            .retain(|_, h| h.since.is_some() || now.duration_since(h.noted) < NOTED_FOR);
        self.judged
            .retain(|_, (_, at)| now.duration_since(*at) < JUDGED_FOR);
        self.vms.expire(now);
    }
}

#[cfg(test)]
mod tests {
    use super::super::hello::tests::{hello, records};
    use super::super::wire::GatedVm;
    use super::*;
    use crate::policy::Policy;

    const VM: &str = "10.0.0.2";
    const SERVER: &str = "192.0.2.1";

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
    fn tcp(port: u16, seq: u32, data: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
        p.extend(ip(VM).to_string().parse::<Ipv4Addr>().unwrap().octets());
        p.extend(SERVER.parse::<Ipv4Addr>().unwrap().octets());
        p.extend(port.to_be_bytes());
        p.extend(443u16.to_be_bytes());
        p.extend(seq.to_be_bytes());
        p.extend([0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        p.extend(data);
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p
    }

    #[test]
    fn a_client_hello_in_two_segments_is_read_whole_and_both_pass() {
        let mut gate = gate(&["a.test:443"]);
        let now = Instant::now();
        let mut out = Out::default();
        let stream = records(&hello(Some("a.test"), 2000), 1 << 14);
        gate.packet(1, &tcp(5000, 101, &[]), now, &mut out);
        gate.packet(2, &tcp(5000, 101, &stream[..1400]), now, &mut out);
        assert_eq!(out.verdicts, vec![(1, Judged::Pass)], "the first held");
        // The first again (retransmitted): a copy.
        gate.packet(3, &tcp(5000, 101, &stream[..1400]), now, &mut out);
        gate.packet(4, &tcp(5000, 1501, &stream[1400..]), now, &mut out);
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
        // A straggler queued before the verdict gets the same.
        gate.packet(
            5,
            &tcp(5000, 101 + stream.len() as u32, b"more"),
            now,
            &mut out,
        );
        assert_eq!(out.verdicts.last(), Some(&(5, Judged::Allow)));
    }

    #[test]
    fn another_name_no_name_and_a_slow_one_are_refused() {
        let mut gate = gate(&["a.test:443"]);
        let now = Instant::now();
        let mut out = Out::default();
        let other = records(&hello(Some("b.test"), 0), 1 << 14);
        gate.packet(1, &tcp(5001, 1, &other), now, &mut out);
        gate.packet(2, &tcp(5002, 1, b"SSH-2.0-x\r\n"), now, &mut out);
        gate.packet(3, &tcp(5003, 1, b"GET / HTTP/1.1\r\n"), now, &mut out);
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
    fn a_vm_holds_at_most_its_share_and_nothing_for_silent_connections() {
        let mut gate = gate(&["a.test:443"]);
        let now = Instant::now();
        let mut out = Out::default();
        for port in 0..5000u16 {
            gate.packet(port.into(), &tcp(port, 7, &[]), now, &mut out);
        }
        assert_eq!(gate.holding(), 0, "nothing sent, nothing held");
        for port in 0..PER_VM as u16 + 1 {
            gate.packet(10_000 + u32::from(port), &tcp(port, 8, b"G"), now, &mut out);
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
    }

    #[test]
    fn packets_of_no_known_vm_or_no_tcp_are_refused() {
        let mut gate = gate(&["a.test:443"]);
        let mut out = Out::default();
        let mut stranger = tcp(1, 1, b"x");
        stranger[12..16].copy_from_slice(&[10, 0, 0, 9]);
        gate.packet(1, &stranger, Instant::now(), &mut out);
        gate.packet(2, b"\x45\x00", Instant::now(), &mut out);
        assert_eq!(out.verdicts, vec![(1, Judged::Refuse), (2, Judged::Refuse)]);
    }
}
