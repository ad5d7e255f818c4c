//! DHCP snooping, the way a LAN network learns its VMs' addresses: the
//! LAN's DHCP server acknowledges a VM's lease (DHCPACK), and the frame
//! that carries the ACK to the VM's port says which address that VM now
//! has. Only frames on their way to the VM count (the daemon checks the
//! direction on the port): a VM could send itself any ACK it likes. Only
//! a reply from port 67 (privileged: no local user without it can send
//! one) whose sender is on the link of the address it gives, by the subnet
//! mask it gives (a server or relay on the VM's LAN, not a host far away
//! answering a request the VM sent it through the LAN's router), and not
//! the address it gives.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, HType, MessageType, Opcode};

use crate::types::MacAddr;

/// A lease the LAN's DHCP server acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The client's MAC (chaddr).
    pub mac: MacAddr,
    /// The address it got (yiaddr).
    pub ip: Ipv4Addr,
}

const ETHERNET: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const UDP: u8 = 17;
const UDP_HEADER: usize = 8;
const BOOTPS: u16 = 67;
const BOOTPC: u16 = 68;
/// The widest subnet an ACK may put its sender and the address it gives
/// in together.
const WIDEST_LINK: u32 = 8;

/// The DHCPACK an Ethernet frame carries, if it is one for an Ethernet
/// client with a unicast address to use. Anything else (another message,
/// a fragment, a cut-short or malformed frame) is None.
pub fn dhcp_ack(frame: &[u8]) -> Option<Acked> {
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?))
    };
    if u16_at(12)? != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = frame.get(ETHERNET..)?;
    let header = usize::from(ip.first()? & 0x0f) * 4;
    let fragment = u16_at(ETHERNET + 6)? & 0x3fff != 0;
    if ip.first()? >> 4 != 4 || header < 20 || *ip.get(9)? != UDP || fragment {
        return None;
    }
    let udp = ip.get(header..)?;
    let port = |at: usize| Some(u16::from_be_bytes([*udp.get(at)?, *udp.get(at + 1)?]));
    if port(0)? != BOOTPS || port(2)? != BOOTPC {
        return None;
    }
    let sender = Ipv4Addr::from(<[u8; 4]>::try_from(ip.get(12..16)?).ok()?);
    let msg = super::dhcp::decode(udp.get(UDP_HEADER..)?)?;
    let acked = matches!(
        msg.opts().get(dhcproto::v4::OptionCode::MessageType),
        Some(DhcpOption::MessageType(MessageType::Ack))
    );
    let yiaddr = msg.yiaddr();
    let usable = !(yiaddr.is_unspecified()
        || yiaddr.is_broadcast()
        || yiaddr.is_multicast()
        || yiaddr.is_loopback());
    if msg.opcode() != Opcode::BootReply || msg.htype() != HType::Eth || !acked || !usable {
        return None;
    }
    // The sender on the link of the address, by the ACK's own mask.
    let Some(DhcpOption::SubnetMask(mask)) = msg.opts().get(dhcproto::v4::OptionCode::SubnetMask)
    else {
        return None;
    };
    let mask = u32::from(*mask);
    let on_link = mask.leading_ones() >= WIDEST_LINK
        && mask.count_ones() == mask.leading_ones()
        && u32::from(sender) & mask == u32::from(yiaddr) & mask
        && sender != yiaddr;
    if !on_link {
        return None;
    }
    // A client's own MAC, never a group's (found by fuzzing: an ACK for a
    // multicast chaddr was believed; it could match no VM, but is no lease).
    let mac = super::dhcp::client_mac(&msg).filter(|m| m.0[0] & 1 == 0)?;
    Some(Acked { mac, ip: yiaddr })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v4::Message;
    use dhcproto::{Encodable, Encoder};

    const MAC: [u8; 6] = [0x52, 0x54, 0, 1, 2, 3];

    fn reply(kind: MessageType, yiaddr: Ipv4Addr) -> Vec<u8> {
        reply_from(kind, yiaddr, [10, 0, 0, 1], Some([255, 255, 255, 0]), 67)
    }

    fn reply_from(
        kind: MessageType,
        yiaddr: Ipv4Addr,
        sender: [u8; 4],
        mask: Option<[u8; 4]>,
        sport: u8,
    ) -> Vec<u8> {
        let mut msg = Message::default();
        msg.set_opcode(Opcode::BootReply)
            .set_yiaddr(yiaddr)
            .set_chaddr(&MAC);
        msg.opts_mut().insert(DhcpOption::MessageType(kind));
        if let Some(mask) = mask {
            msg.opts_mut()
                .insert(DhcpOption::SubnetMask(Ipv4Addr::from(mask)));
        }
        let mut bootp = Vec::new();
        msg.encode(&mut Encoder::new(&mut bootp)).unwrap();
        let mut frame = vec![0xff; 6];
        frame.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        let total = (20 + UDP_HEADER + bootp.len()) as u16;
        frame.extend_from_slice(&[
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0,
            0,
            64,
            UDP,
        ]);
        frame.extend_from_slice(&[0, 0]);
        frame.extend_from_slice(&sender);
        frame.extend_from_slice(&[255, 255, 255, 255]);
        let len = (UDP_HEADER + bootp.len()) as u16;
        frame.extend_from_slice(&[0, sport, 0, 68, (len >> 8) as u8, len as u8, 0, 0]);
        frame.extend_from_slice(&bootp);
        frame
    }

    #[test]
    fn an_ack_says_which_mac_has_which_address() {
        let ip = Ipv4Addr::new(10, 0, 0, 50);
        assert_eq!(
            dhcp_ack(&reply(MessageType::Ack, ip)),
            Some(Acked {
                mac: MacAddr(MAC),
                ip
            })
        );
    }

    #[test]
    fn an_ack_for_a_group_mac_teaches_nothing() {
        // Found by fuzzing (fuzz/corpus/lan_snoop/multicast_chaddr).
        let ip = Ipv4Addr::new(10, 0, 0, 50);
        let mut group = reply(MessageType::Ack, ip);
        group[ETHERNET + 20 + UDP_HEADER + 28] |= 1;
        assert_eq!(dhcp_ack(&group), None);
    }

    #[test]
    fn offers_naks_empty_addresses_fragments_and_scraps_teach_nothing() {
        let ip = Ipv4Addr::new(10, 0, 0, 50);
        assert_eq!(dhcp_ack(&reply(MessageType::Offer, ip)), None);
        assert_eq!(dhcp_ack(&reply(MessageType::Nak, ip)), None);
        assert_eq!(
            dhcp_ack(&reply(MessageType::Ack, Ipv4Addr::UNSPECIFIED)),
            None
        );
        assert_eq!(
            dhcp_ack(&reply(MessageType::Ack, Ipv4Addr::BROADCAST)),
            None
        );
        let mut fragment = reply(MessageType::Ack, ip);
        fragment[ETHERNET + 6] = 0x20; // more fragments
        assert_eq!(dhcp_ack(&fragment), None);
        let mut to_server = reply(MessageType::Ack, ip);
        to_server[ETHERNET + 20 + 3] = 67;
        assert_eq!(dhcp_ack(&to_server), None);
    }

    #[test]
    fn only_a_server_on_the_link_of_the_address_from_port_67_is_believed() {
        let ip = Ipv4Addr::new(10, 0, 0, 50);
        let mask = Some([255, 255, 255, 0]);
        let ack =
            |sender, mask, sport| dhcp_ack(&reply_from(MessageType::Ack, ip, sender, mask, sport));
        assert!(ack([10, 0, 0, 1], mask, 67).is_some());
        assert_eq!(ack([10, 0, 0, 1], mask, 68), None, "a user's port");
        assert_eq!(ack([10, 0, 0, 1], mask, 200), None);
        assert_eq!(ack([203, 0, 113, 9], mask, 67), None, "off the link");
        assert_eq!(ack([10, 0, 0, 1], None, 67), None, "no mask");
        assert_eq!(
            ack([10, 9, 0, 1], Some([0, 0, 0, 0]), 67),
            None,
            "a mask of everything"
        );
        assert_eq!(
            ack([10, 9, 0, 1], Some([255, 0, 255, 0]), 67),
            None,
            "not a mask"
        );
        assert!(
            ack([10, 9, 0, 1], Some([255, 0, 0, 0]), 67).is_some(),
            "a /8 link"
        );
        assert_eq!(
            ack([10, 0, 0, 50], mask, 67),
            None,
            "from the address it gives"
        );
        let whole = reply(MessageType::Ack, ip);
        for cut in [0, 13, 20, 40, 60, 250] {
            assert_eq!(dhcp_ack(&whole[..cut]), None, "cut at {cut}");
        }
    }
}
