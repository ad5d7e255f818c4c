//! What the daemon and `linnet-gate` say to each other over their socket
//! pair (SOCK_SEQPACKET: one message per send, never split or merged).
//! The daemon sends what the gate judges by (`Control`, JSON: the VMs
//! whose connections are held and the names they learned) and each held
//! packet as it came from the queue; the gate sends back verdicts, many
//! to a message, and a record of each connection it judged. Packets and
//! verdicts are fixed binary layouts: they are the hot path.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::policy::Policy;
use crate::types::InterfaceId;

/// The most a message may be: a queued packet (64 KiB, its GSO whole)
/// and its header.
pub const MAX_MESSAGE: usize = (64 << 10) + 64;

const PACKET: u8 = b'P';
const CONTROL: u8 = b'C';
const VERDICTS: u8 = b'V';
const RECORD: u8 = b'R';

/// A VM whose connections the gate judges.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatedVm {
    pub interface_id: InterfaceId,
    /// Its addresses: how its packets are known.
    pub addrs: Vec<IpAddr>,
    pub policy: Policy,
}

/// The daemon's word on what the gate judges by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Control {
    /// These are the VMs now (the others are forgotten, with their pins).
    Vms(Vec<GatedVm>),
    /// The VM learned these addresses for `name` (as DNS compares names),
    /// each for so many seconds from now.
    Learned {
        interface_id: InterfaceId,
        name: String,
        addrs: Vec<(IpAddr, u32)>,
    },
    /// A previous daemon's VM had learned these for some name of its
    /// policy's reach `reach` (`Policy::name_reaches`): after a restart,
    /// until the VM asks again, any name that reach allows passes at them.
    Restored {
        interface_id: InterfaceId,
        reach: usize,
        addrs: Vec<(IpAddr, u32)>,
    },
}

/// The gate's word on one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// On its way; its connection is still held (it showed nothing yet).
    Pass,
    /// Its connection showed an allowed name at an address it learned
    /// for it: it and the rest of the connection pass.
    Allow,
    /// Its connection is refused (the VM gets a reset).
    Refuse,
    /// A copy of a packet still held (a retransmission).
    Drop,
    /// Its connection is not held: through the queue's rule once more,
    /// which lets it by if conntrack says its connection was allowed
    /// meanwhile, and queues it again (`again`) if it is still pending.
    Recheck,
}

impl Judged {
    fn code(self) -> u8 {
        match self {
            Judged::Pass => 0,
            Judged::Allow => 1,
            Judged::Refuse => 2,
            Judged::Drop => 3,
            Judged::Recheck => 4,
        }
    }

    fn from_code(code: u8) -> Option<Judged> {
        Some(match code {
            0 => Judged::Pass,
            1 => Judged::Allow,
            2 => Judged::Refuse,
            3 => Judged::Drop,
            4 => Judged::Recheck,
            _ => return None,
        })
    }
}

/// A connection the gate judged, for the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judgement {
    pub interface_id: InterfaceId,
    /// The connection: the VM's address and port, where it went.
    pub source: IpAddr,
    pub source_port: u16,
    pub destination: IpAddr,
    pub port: u16,
    /// The name it showed, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown: Option<String>,
    pub allowed: bool,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl Judgement {
    /// The `connection` event that records it, for the VM called `name`
    /// (`decrypted`: by the secrets proxy).
    pub fn event(
        self,
        name: Option<String>,
        decrypted: bool,
        held_back: u64,
    ) -> crate::events::What {
        crate::events::What::Connection {
            interface_id: self.interface_id,
            name,
            destination: self.destination,
            port: self.port,
            protocol: "tcp".into(),
            shown: self.shown,
            allowed: self.allowed,
            why: self.why,
            decrypted,
            held_back,
        }
    }
}

/// What comes to the gate.
#[derive(Debug, PartialEq)]
pub enum ToGate<'a> {
    /// A held packet; `again` when it was sent back once (`Recheck`).
    Packet {
        id: u32,
        again: bool,
        bytes: &'a [u8],
    },
    Control(Control),
}

/// What comes from the gate.
#[derive(Debug, PartialEq)]
pub enum FromGate<'a> {
    /// (packet id, verdict) pairs, `VERDICT_LEN` bytes each.
    Verdicts(&'a [u8]),
    Judgement(Judgement),
}

/// Bytes of one (id, verdict) pair.
pub const VERDICT_LEN: usize = 5;

/// `out` becomes the message for a held packet.
pub fn packet(out: &mut Vec<u8>, id: u32, again: bool, bytes: &[u8]) {
    out.clear();
    out.push(PACKET);
    out.extend_from_slice(&id.to_le_bytes());
    out.push(u8::from(again));
    out.extend_from_slice(bytes);
}

pub fn control(control: &Control) -> Vec<u8> {
    let mut out = vec![CONTROL];
    serde_json::to_writer(&mut out, control).expect("a control message serialises");
    out
}

/// Starts a message of verdicts in `out`.
pub fn verdicts(out: &mut Vec<u8>) {
    out.clear();
    out.push(VERDICTS);
}

/// Adds one verdict to a message `verdicts` started.
pub fn add_verdict(out: &mut Vec<u8>, id: u32, judged: Judged) {
    out.extend_from_slice(&id.to_le_bytes());
    out.push(judged.code());
}

pub fn judgement(judgement: &Judgement) -> Vec<u8> {
    let mut out = vec![RECORD];
    serde_json::to_writer(&mut out, judgement).expect("a record serialises");
    out
}

pub fn to_gate(message: &[u8]) -> Result<ToGate<'_>, String> {
    match message.split_first() {
        Some((&PACKET, rest)) if rest.len() >= 5 && rest[4] <= 1 => Ok(ToGate::Packet {
            id: u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")),
            again: rest[4] == 1,
            bytes: &rest[5..],
        }),
        Some((&CONTROL, rest)) => serde_json::from_slice(rest)
            .map(ToGate::Control)
            .map_err(|e| format!("a control message the gate cannot read: {e}")),
        _ => Err("a message of no kind the gate knows".into()),
    }
}

pub fn from_gate(message: &[u8]) -> Result<FromGate<'_>, String> {
    match message.split_first() {
        Some((&VERDICTS, rest)) if rest.len() % VERDICT_LEN == 0 => Ok(FromGate::Verdicts(rest)),
        Some((&RECORD, rest)) => serde_json::from_slice(rest)
            .map(FromGate::Judgement)
            .map_err(|e| format!("a record the daemon cannot read: {e}")),
        _ => Err("a message of no kind the daemon knows".into()),
    }
}

/// The (id, verdict) pairs of a `FromGate::Verdicts`; None for a pair
/// with a verdict of no kind known.
pub fn each_verdict(pairs: &[u8]) -> impl Iterator<Item = (u32, Option<Judged>)> + '_ {
    pairs.chunks_exact(VERDICT_LEN).map(|pair| {
        (
            u32::from_le_bytes(pair[..4].try_into().expect("4 bytes")),
            Judged::from_code(pair[4]),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_reads_back_as_it_was_written() {
        let mut out = Vec::new();
        packet(&mut out, 7, true, b"\x45abc");
        assert_eq!(
            to_gate(&out),
            Ok(ToGate::Packet {
                id: 7,
                again: true,
                bytes: b"\x45abc"
            })
        );
        let learned = Control::Learned {
            interface_id: InterfaceId::from_u128(1),
            name: "api.example.com".into(),
            addrs: vec![("192.0.2.1".parse().unwrap(), 60)],
        };
        assert_eq!(to_gate(&control(&learned)), Ok(ToGate::Control(learned)));
        verdicts(&mut out);
        add_verdict(&mut out, 1, Judged::Allow);
        add_verdict(&mut out, u32::MAX, Judged::Drop);
        let Ok(FromGate::Verdicts(pairs)) = from_gate(&out) else {
            panic!("verdicts");
        };
        assert_eq!(
            each_verdict(pairs).collect::<Vec<_>>(),
            vec![(1, Some(Judged::Allow)), (u32::MAX, Some(Judged::Drop))]
        );
        let record = Judgement {
            interface_id: InterfaceId::from_u128(1),
            source: "10.0.0.2".parse().unwrap(),
            source_port: 40000,
            destination: "192.0.2.1".parse().unwrap(),
            port: 443,
            shown: None,
            allowed: false,
            why: Some("it showed no name".into()),
        };
        assert_eq!(
            from_gate(&judgement(&record)),
            Ok(FromGate::Judgement(record))
        );
    }

    #[test]
    fn what_is_no_message_is_refused_not_misread() {
        assert!(to_gate(b"").is_err());
        assert!(to_gate(b"P\x01").is_err(), "a packet without its id");
        assert!(
            to_gate(b"P\x01\x00\x00\x00\x02").is_err(),
            "neither once nor again"
        );
        assert!(to_gate(b"X").is_err());
        assert!(from_gate(b"V\x01\x00").is_err(), "half a verdict");
        assert!(from_gate(b"R{").is_err());
    }
}
