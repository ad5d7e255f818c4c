//! DHCPv4 server (RFC 2131, options RFC 2132) for one network's bridge.
//!
//! Every interface's address is reserved at attach, so the server mostly
//! confirms what linnet already decided: DISCOVER gets the reservation,
//! REQUEST for it is ACKed, anything else NAKed. A MAC that no interface
//! has (a VMM that ignored the MAC it was given) gets a dynamic lease.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::{NetworkContext, ServiceError, unix_now};
use crate::budget::RateLimit;
use crate::config::{NetworkConfig, Own};
use crate::events::{Bus, What};
use crate::leases::LeaseTable;
use crate::types::MacAddr;

const SERVER_PORT: u16 = 67;
const CLIENT_PORT: u16 = 68;

pub fn start(ctx: Arc<NetworkContext>, events: Bus) -> Result<JoinHandle<()>, ServiceError> {
    let addr = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, SERVER_PORT);
    let bind_err = |source| ServiceError::Bind {
        network: ctx.name().into(),
        service: "DHCP",
        addr: format!("{addr} on {}", ctx.bridge),
        source,
    };
    let socket = bind(&ctx.bridge, addr).map_err(bind_err)?;
    let network = ctx.name().to_string();
    Ok(super::spawn_service(
        "DHCP",
        &network,
        serve(ctx, socket, events),
    ))
}

/// One socket per bridge: bound to the device, so several networks can each
/// own port 67, and broadcast replies leave through the right bridge.
fn bind(bridge: &str, addr: SocketAddrV4) -> std::io::Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    socket.set_broadcast(true)?;
    socket.bind_device(Some(bridge.as_bytes()))?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

/// DHCP messages one client (by MAC) may have answered per second: a
/// client sends a few per lease; more is a VM hammering the server.
const MESSAGES_PER_SECOND: u32 = 20;

async fn serve(ctx: Arc<NetworkContext>, socket: UdpSocket, events: Bus) {
    answer_each(&socket, ctx.name(), |request| {
        let mut leases = ctx.leases.lock().expect("lease table lock");
        let reply = respond(ctx.config(), &mut leases, request, unix_now());
        if let Some(reply) = &reply {
            ctx.leases.changed();
            if let Some(lease) = acked(request, reply) {
                events.emit(Some(ctx.name()), lease);
            }
        }
        reply
    })
    .await
}

/// The lease an ACK gives, as an event.
fn acked(request: &Message, reply: &Message) -> Option<What> {
    if reply.opts().msg_type()? != MessageType::Ack {
        return None;
    }
    let hostname = match request.opts().get(OptionCode::Hostname) {
        Some(DhcpOption::Hostname(h)) => Some(h.clone()),
        _ => None,
    };
    Some(What::Lease {
        mac_address: client_mac(request)?,
        ip_address: reply.yiaddr(),
        hostname,
    })
}

/// Receives DHCP messages on `socket` for ever and sends what `respond`
/// makes of each, within the per-client rate.
async fn answer_each(
    socket: &UdpSocket,
    network: &str,
    mut respond: impl FnMut(&Message) -> Option<Message>,
) {
    let mut buf = vec![0u8; 1500];
    let mut out = Vec::with_capacity(600);
    let mut rate = RateLimit::new(MESSAGES_PER_SECOND, Duration::from_secs(1));
    loop {
        let len = match socket.recv_from(&mut buf).await {
            Ok((len, _)) => len,
            Err(e) => {
                warn!(network, "DHCP receive failed: {e}");
                continue;
            }
        };
        let Some(request) = decode(&buf[..len]) else {
            debug!(network, "ignored a packet that is not DHCP");
            continue;
        };
        let Some(client) = client_mac(&request) else {
            debug!(
                network,
                hlen = request.hlen(),
                "ignored a DHCP message without an Ethernet chaddr"
            );
            continue;
        };
        if let Err(refused) = rate.allow(&client, Instant::now()) {
            if let Some(count) = refused.report {
                warn!(
                    network,
                    refused = count,
                    "DHCP: a client sent more than {MESSAGES_PER_SECOND} messages in a second; ignoring the rest"
                );
            }
            continue;
        }
        let Some(reply) = respond(&request) else {
            continue;
        };
        out.clear();
        if reply.encode(&mut Encoder::new(&mut out)).is_err() {
            continue;
        }
        let dest = destination(&request, &reply);
        if let Err(e) = socket.send_to(&out, dest).await {
            warn!(network, "DHCP reply to {dest} failed: {e}");
        }
    }
}

/// A clone's DHCP socket: port 67 on its TAP, in its namespace (call it
/// there).
pub fn clone_socket(tap: &str) -> std::io::Result<UdpSocket> {
    bind(tap, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, SERVER_PORT))
}

/// Serves a clone's guest from `socket` (`clone_socket`): the address it
/// was snapshotted with, so a guest that renews or asks again keeps it.
pub fn serve_clone(
    net: NetworkConfig,
    guest: (MacAddr, Ipv4Addr),
    socket: UdpSocket,
) -> JoinHandle<()> {
    let name = net.name.clone();
    super::spawn_service("clone DHCP", &name, async move {
        answer_each(&socket, &net.name, |request| {
            respond_to_clone(&net, guest, request)
        })
        .await
    })
}

/// The answer a clone's DHCP gives its guest (`guest`: its MAC and the
/// address it had): that address, with the network's options; another
/// address is NAKed; other MACs get nothing (there are none on its TAP
/// but the guest's own).
pub fn respond_to_clone(
    net: &NetworkConfig,
    (mac, ip): (MacAddr, Ipv4Addr),
    req: &Message,
) -> Option<Message> {
    // linnet's DHCP serves its own networks only.
    let own = net.own()?;
    if req.opcode() != Opcode::BootRequest || client_mac(req)? != mac {
        return None;
    }
    let lease_time = own.dhcp.lease_time;
    match req.opts().msg_type()? {
        MessageType::Discover => Some(reply(own, lease_time, req, MessageType::Offer, ip)),
        MessageType::Request => {
            if let Some(DhcpOption::ServerIdentifier(id)) =
                req.opts().get(OptionCode::ServerIdentifier)
                && *id != own.gateway
            {
                return None;
            }
            let asked = match req.opts().get(OptionCode::RequestedIpAddress) {
                Some(DhcpOption::RequestedIpAddress(asked)) => *asked,
                _ => req.ciaddr(),
            };
            if asked == ip {
                Some(reply(own, lease_time, req, MessageType::Ack, ip))
            } else {
                Some(nak(own, req))
            }
        }
        MessageType::Inform => Some(reply(
            own,
            lease_time,
            req,
            MessageType::Ack,
            Ipv4Addr::UNSPECIFIED,
        )),
        _ => None,
    }
}

/// RFC 2131 4.1: renewing clients (ciaddr set) get unicast; everyone else a
/// broadcast, which every client accepts before it has an address.
fn destination(request: &Message, reply: &Message) -> SocketAddrV4 {
    let nak = reply.opts().has_msg_type(MessageType::Nak);
    if !request.ciaddr().is_unspecified() && !nak {
        SocketAddrV4::new(request.ciaddr(), CLIENT_PORT)
    } else {
        SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT)
    }
}

/// A DHCP message from the wire, or None for one that is not, or whose
/// options are cut short or of a length their kind never has. (dhcproto
/// reads some fixed-size options by their size, not their length, and
/// asserts the length only in debug builds, where a guest's message made
/// it panic: found by fuzzing, `fuzz/corpus/dhcp_request/fqdn_short`.)
pub fn decode(bytes: &[u8]) -> Option<Message> {
    if !options_well_formed(bytes) {
        return None;
    }
    Message::decode(&mut Decoder::new(bytes)).ok()
}

/// Where a BOOTP message's options begin: after its fixed part (236
/// bytes) and the magic cookie.
const OPTIONS_AT: usize = 240;

/// Whether every option after the magic cookie fits in the message and
/// has a length its kind allows. An option repeated back to back is one
/// option of their lengths together (RFC 3396 long options, as dhcproto
/// reads them), so the length checked is the run's. Options overloaded
/// into `sname`/`file` are not read by dhcproto, so not looked at here.
fn options_well_formed(bytes: &[u8]) -> bool {
    let allowed = |code: u8, len: usize| match code {
        // Rapid commit: empty.
        80 => len == 0,
        // Client FQDN: flags, two rcodes, then the name.
        81 => len >= 3,
        // Client network interface: type, major, minor.
        94 => len == 3,
        // Bulk lease query times: a u32 each.
        152..=155 => len == 4,
        _ => true,
    };
    // The option being read, and its length so far.
    let mut run: Option<(u8, usize)> = None;
    let mut at = OPTIONS_AT;
    while let Some(&code) = bytes.get(at) {
        if let Some((last, len)) = run
            && last != code
        {
            if !allowed(last, len) {
                return false;
            }
            run = None;
        }
        match code {
            0 => at += 1,
            255 => return true,
            _ => {
                let Some(&len) = bytes.get(at + 1) else {
                    return false;
                };
                let len = usize::from(len);
                if at + 2 + len > bytes.len() {
                    return false;
                }
                let so_far = run.map_or(0, |(_, l)| l);
                run = Some((code, so_far + len));
                at += 2 + len;
            }
        }
    }
    run.is_none_or(|(code, len)| allowed(code, len))
}

/// The client's MAC: the first 6 bytes of chaddr, when `hlen` says they
/// are there. (`hlen` comes from the wire, and dhcproto's `chaddr()` slices
/// by it: a value above 16 would panic.)
pub(super) fn client_mac(req: &Message) -> Option<MacAddr> {
    if !(6..=16).contains(&req.hlen()) {
        return None;
    }
    Some(MacAddr(req.chaddr()[..6].try_into().ok()?))
}

/// The server's answer to one client message, or None to stay silent.
pub fn respond(
    net: &NetworkConfig,
    leases: &mut LeaseTable,
    req: &Message,
    now: u64,
) -> Option<Message> {
    let own = net.own()?;
    if req.opcode() != Opcode::BootRequest || !req.giaddr().is_unspecified() {
        return None;
    }
    // Leases are by MAC, not by client identifier (RFC 2131 4.2 prefers
    // it): the lease is the interface's, reserved at attach for the MAC
    // linnet gave it before the guest sends anything, and anti-spoofing
    // binds the MAC to the VM's port. A VM whose identifier changes (a
    // DUID made from a machine id its clone or its initrd has another
    // of) keeps its address; two clients behind one MAC share one.
    let mac = client_mac(req)?;
    // With anti-spoofing each VM can only ask for its own MAC, so a MAC
    // that is no attached interface's is someone draining the pool (the
    // guard stops that on the wire; this holds whatever reaches us): one
    // lease per interface.
    if net.anti_spoofing && !leases.is_attached_mac(mac) {
        debug!(network = %net.name, %mac, "DHCP from a MAC that is no attached interface's: ignored");
        return None;
    }
    let requested = match req.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
        _ => None,
    };
    let hostname = match req.opts().get(OptionCode::Hostname) {
        Some(DhcpOption::Hostname(h)) if crate::types::validate_hostname(h).is_ok() => {
            Some(h.to_ascii_lowercase())
        }
        _ => None,
    };
    let for_us = match req.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(id)) => *id == own.gateway,
        _ => true,
    };
    match req.opts().msg_type()? {
        MessageType::Discover => match leases.offer(mac, now) {
            Ok(ip) => {
                debug!(network = %net.name, %mac, %ip, "DHCPOFFER");
                Some(reply(own, leases.lease_time(), req, MessageType::Offer, ip))
            }
            Err(e) => {
                warn!("{e}");
                None
            }
        },
        MessageType::Request => {
            if !for_us {
                return None; // the client chose another server
            }
            let ip = requested.unwrap_or(req.ciaddr());
            // A client we have never offered to (INIT-REBOOT) gets its reservation.
            let _ = leases.offer(mac, now);
            if leases.bind(mac, ip, hostname.clone(), now) {
                info!(network = %net.name, %mac, %ip, hostname = hostname.as_deref().unwrap_or("-"), "DHCPACK");
                Some(reply(own, leases.lease_time(), req, MessageType::Ack, ip))
            } else {
                info!(network = %net.name, %mac, %ip, "DHCPNAK: not this client's address");
                Some(nak(own, req))
            }
        }
        MessageType::Release => {
            leases.release(mac, now);
            None
        }
        MessageType::Decline => {
            warn!(network = %net.name, %mac, ip = ?requested, "DHCPDECLINE: the guest found the address in use; is another DHCP server or a static address on this network?");
            None
        }
        MessageType::Inform => Some(reply(
            own,
            leases.lease_time(),
            req,
            MessageType::Ack,
            Ipv4Addr::UNSPECIFIED,
        )),
        _ => None,
    }
}

fn base(net: &Own, req: &Message, kind: MessageType) -> Message {
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootReply)
        .set_xid(req.xid())
        .set_flags(req.flags())
        .set_chaddr(req.chaddr())
        .set_siaddr(Ipv4Addr::UNSPECIFIED);
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(kind));
    opts.insert(DhcpOption::ServerIdentifier(net.gateway));
    // RFC 6842: the client's identifier back, as it sent it. It names
    // the client but not its lease: that is its interface's, by MAC (see
    // `respond`).
    if let Some(id) = req.opts().get(OptionCode::ClientIdentifier) {
        opts.insert(id.clone());
    }
    msg
}

fn reply(net: &Own, lease_time: u32, req: &Message, kind: MessageType, ip: Ipv4Addr) -> Message {
    let mut msg = base(net, req, kind);
    msg.set_yiaddr(ip).set_ciaddr(req.ciaddr());
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::SubnetMask(net.subnet.netmask()));
    opts.insert(DhcpOption::BroadcastAddr(net.subnet.broadcast()));
    if !net.host_only {
        opts.insert(DhcpOption::Router(vec![net.gateway]));
    }
    if net.dns.enabled {
        opts.insert(DhcpOption::DomainNameServer(vec![net.gateway]));
        opts.insert(DhcpOption::DomainName(net.dns.domain.clone()));
    }
    if net.mtu != 1500 {
        opts.insert(DhcpOption::InterfaceMtu(net.mtu.min(u16::MAX as u32) as u16));
    }
    if kind != MessageType::Ack || !ip.is_unspecified() {
        opts.insert(DhcpOption::AddressLeaseTime(lease_time));
        opts.insert(DhcpOption::Renewal(lease_time / 2));
        opts.insert(DhcpOption::Rebinding(lease_time / 8 * 7));
    }
    msg
}

fn nak(net: &Own, req: &Message) -> Message {
    let mut msg = base(net, req, MessageType::Nak);
    msg.set_flags(Flags::default().set_broadcast());
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::types::InterfaceId;

    fn setup() -> (NetworkConfig, LeaseTable) {
        let cfg = Config::from_yaml("networks:\n  shared:\n    dhcp: { lease_time: 600 }\n", "t")
            .unwrap();
        let net = cfg.network("shared").unwrap().clone();
        let table = LeaseTable::new(&net.name, net.own().unwrap());
        (net, table)
    }

    fn client(kind: MessageType, mac: MacAddr, requested: Option<Ipv4Addr>) -> Message {
        let mut msg = Message::new(
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &mac.0,
        );
        msg.opts_mut().insert(DhcpOption::MessageType(kind));
        msg.opts_mut()
            .insert(DhcpOption::Hostname("guest-a".into()));
        if let Some(ip) = requested {
            msg.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
        }
        msg
    }

    /// A discover with these options after its type.
    fn discover_with(options: &[u8]) -> Vec<u8> {
        let req = client(
            MessageType::Discover,
            "52:54:00:12:34:56".parse().unwrap(),
            None,
        );
        let mut bytes = Vec::new();
        req.encode(&mut Encoder::new(&mut bytes)).unwrap();
        // Its options end with 255: these go before it.
        let end = bytes.iter().rposition(|b| *b == 255).unwrap();
        bytes.splice(end..end, options.iter().copied());
        bytes
    }

    #[test]
    fn options_of_a_length_their_kind_never_has_are_refused_before_dhcproto_reads_them() {
        // Found by fuzzing: a client FQDN shorter than its fixed part
        // panicked dhcproto (a debug assertion) in a debug build.
        for bad in [
            &[81, 1, 0][..],
            &[80, 1, 0],
            &[94, 2, 1, 2],
            &[152, 2, 0, 0],
            &[12, 40, 97],
            // Found by fuzzing too: one repeated back to back is read as
            // one of their lengths together (RFC 3396).
            &[155, 4, 0, 0, 0, 0, 155, 4, 0, 0, 0, 0],
            &[80, 0, 80, 1, 0],
        ] {
            assert!(decode(&discover_with(bad)).is_none(), "{bad:?}");
        }
        for good in [
            &[81, 5, 0, 0, 0, 1, 97][..],
            &[80, 0],
            &[94, 3, 1, 2, 0],
            &[12, 2, 118, 109],
            &[81, 1, 0, 81, 2, 0, 97],
            // A pad between them: two options (the last one kept).
            &[155, 4, 0, 0, 0, 0, 0, 155, 4, 0, 0, 0, 0],
        ] {
            assert!(decode(&discover_with(good)).is_some(), "{good:?}");
        }
        assert!(decode(&[1, 2, 3]).is_none());
    }

    fn encode_decode(msg: &Message) -> Message {
        let mut out = Vec::new();
        msg.encode(&mut Encoder::new(&mut out)).unwrap();
        Message::decode(&mut Decoder::new(&out)).unwrap()
    }

    #[test]
    fn a_clones_guest_gets_the_address_it_was_snapshotted_with_and_nobody_else_anything() {
        let (net, _) = setup();
        let mac = MacAddr([0x52, 0x54, 0, 1, 2, 3]);
        let ip: Ipv4Addr = "192.168.105.9".parse().unwrap();
        let answer =
            |msg: &Message| respond_to_clone(&net, (mac, ip), msg).map(|m| encode_decode(&m));
        let offer = answer(&client(MessageType::Discover, mac, None)).unwrap();
        assert!(offer.opts().has_msg_type(MessageType::Offer));
        assert_eq!(offer.yiaddr(), ip);
        assert_eq!(
            offer.opts().get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(net.own().unwrap().gateway)),
            "it answers as the gateway"
        );
        assert_eq!(
            offer.opts().get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(600))
        );
        let ack = answer(&client(MessageType::Request, mac, Some(ip))).unwrap();
        assert!(ack.opts().has_msg_type(MessageType::Ack));
        // A renewal names its address in ciaddr.
        let mut renewal = client(MessageType::Request, mac, None);
        renewal.set_ciaddr(ip);
        assert!(
            answer(&renewal)
                .unwrap()
                .opts()
                .has_msg_type(MessageType::Ack)
        );
        let other = "192.168.105.10".parse().unwrap();
        let nak = answer(&client(MessageType::Request, mac, Some(other))).unwrap();
        assert!(nak.opts().has_msg_type(MessageType::Nak));
        let stranger = MacAddr([0x52, 0x54, 0, 9, 9, 9]);
        assert!(answer(&client(MessageType::Discover, stranger, None)).is_none());
        let mut elsewhere = client(MessageType::Request, mac, Some(ip));
        elsewhere
            .opts_mut()
            .insert(DhcpOption::ServerIdentifier("10.9.9.9".parse().unwrap()));
        assert!(
            answer(&elsewhere).is_none(),
            "the guest chose another server"
        );
    }

    #[test]
    fn the_lease_is_the_macs_whatever_client_identifier_comes_and_each_is_echoed() {
        // systemd-networkd sends a DUID-based identifier made from the
        // machine id, which a cloned image or the initrd may have another
        // of: the same VM (its MAC, its interface) keeps its address.
        let (net, mut leases) = setup();
        let lease = leases
            .attach(InterfaceId::from_bytes([1; 16]), None, None, 0)
            .unwrap();
        for (n, id) in [b"\xffduid-one".as_slice(), b"\xffduid-two", b"\x01mac"]
            .into_iter()
            .enumerate()
        {
            let mut req = client(MessageType::Request, lease.mac, Some(lease.ip));
            req.opts_mut()
                .insert(DhcpOption::ClientIdentifier(id.to_vec()));
            let ack = encode_decode(&respond(&net, &mut leases, &req, n as u64 + 1).unwrap());
            assert!(ack.opts().has_msg_type(MessageType::Ack));
            assert_eq!(ack.yiaddr(), lease.ip);
            assert_eq!(
                ack.opts().get(OptionCode::ClientIdentifier),
                Some(&DhcpOption::ClientIdentifier(id.to_vec())),
                "RFC 6842"
            );
        }
    }

    #[test]
    fn attached_interface_is_offered_and_acked_its_reservation() {
        let (net, mut leases) = setup();
        let lease = leases
            .attach(InterfaceId::from_bytes([1; 16]), None, None, 0)
            .unwrap();
        let offer = respond(
            &net,
            &mut leases,
            &client(MessageType::Discover, lease.mac, None),
            1,
        )
        .unwrap();
        let offer = encode_decode(&offer);
        assert!(offer.opts().has_msg_type(MessageType::Offer));
        assert_eq!(offer.yiaddr(), lease.ip);
        assert_eq!(
            offer.opts().get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![net.own().unwrap().gateway]))
        );
        assert_eq!(
            offer.opts().get(OptionCode::DomainNameServer),
            Some(&DhcpOption::DomainNameServer(vec![
                net.own().unwrap().gateway
            ]))
        );
        assert_eq!(
            offer.opts().get(OptionCode::DomainName),
            Some(&DhcpOption::DomainName("shared.linnet".into()))
        );
        assert_eq!(
            offer.opts().get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(600))
        );
        let ack = respond(
            &net,
            &mut leases,
            &client(MessageType::Request, lease.mac, Some(lease.ip)),
            2,
        )
        .unwrap();
        assert!(ack.opts().has_msg_type(MessageType::Ack));
        assert_eq!(ack.yiaddr(), lease.ip);
        assert_eq!(
            leases.resolve("guest-a", 3),
            Some(lease.ip),
            "hostname recorded"
        );
    }

    #[test]
    fn request_for_another_address_is_naked_by_broadcast() {
        let (net, mut leases) = setup();
        let lease = leases
            .attach(InterfaceId::from_bytes([1; 16]), None, None, 0)
            .unwrap();
        let wrong = Ipv4Addr::new(192, 168, 105, 200);
        let req = client(MessageType::Request, lease.mac, Some(wrong));
        let nak = respond(&net, &mut leases, &req, 1).unwrap();
        assert!(nak.opts().has_msg_type(MessageType::Nak));
        assert!(nak.flags().broadcast());
        assert_eq!(destination(&req, &nak).ip(), &Ipv4Addr::BROADCAST);
    }

    #[test]
    fn requests_for_other_servers_relays_and_garbage_are_ignored() {
        let (net, mut leases) = setup();
        let mac: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let mut other = client(MessageType::Request, mac, None);
        other
            .opts_mut()
            .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 0, 1)));
        assert!(respond(&net, &mut leases, &other, 0).is_none());
        let mut relayed = client(MessageType::Discover, mac, None);
        relayed.set_giaddr(Ipv4Addr::new(10, 0, 0, 1));
        assert!(respond(&net, &mut leases, &relayed, 0).is_none());
        let mut reply = client(MessageType::Discover, mac, None);
        reply.set_opcode(Opcode::BootReply);
        assert!(respond(&net, &mut leases, &reply, 0).is_none());
        assert!(Message::decode(&mut Decoder::new(&[1, 2, 3])).is_err());
    }

    #[test]
    fn without_anti_spoofing_an_unknown_mac_gets_a_dynamic_lease_renewed_by_unicast() {
        let (mut net, mut leases) = setup();
        net.anti_spoofing = false;
        let mac: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let offer = respond(
            &net,
            &mut leases,
            &client(MessageType::Discover, mac, None),
            0,
        )
        .unwrap();
        let ip = offer.yiaddr();
        assert_eq!(ip, Ipv4Addr::new(192, 168, 105, 2));
        let mut renew = client(MessageType::Request, mac, None);
        renew.set_ciaddr(ip);
        let ack = respond(&net, &mut leases, &renew, 10).unwrap();
        assert!(ack.opts().has_msg_type(MessageType::Ack));
        assert_eq!(
            destination(&renew, &ack),
            SocketAddrV4::new(ip, CLIENT_PORT)
        );
    }

    #[test]
    fn with_anti_spoofing_a_mac_that_is_no_interfaces_gets_nothing() {
        let (net, mut leases) = setup();
        assert!(net.anti_spoofing, "the default");
        for n in 0..50u8 {
            let made_up: MacAddr = MacAddr([0x52, 0x54, 0, 0, 9, n]);
            let discover = client(MessageType::Discover, made_up, None);
            assert!(respond(&net, &mut leases, &discover, 0).is_none());
            let request = client(
                MessageType::Request,
                made_up,
                Some(Ipv4Addr::new(192, 168, 105, 9)),
            );
            assert!(respond(&net, &mut leases, &request, 0).is_none());
        }
        assert_eq!(leases.leases().count(), 0, "the pool is not drained");
        let id = InterfaceId::from_bytes([7; 16]);
        let lease = leases.attach(id, None, None, 0).unwrap();
        let offer = respond(
            &net,
            &mut leases,
            &client(MessageType::Discover, lease.mac, None),
            0,
        );
        assert_eq!(
            offer.unwrap().yiaddr(),
            lease.ip,
            "an attached interface is served"
        );
    }

    #[test]
    fn a_hardware_address_length_from_the_wire_never_panics() {
        let (net, mut leases) = setup();
        let lease = leases
            .attach(InterfaceId::from_bytes([1; 16]), None, None, 0)
            .unwrap();
        let mut bytes = Vec::new();
        client(MessageType::Discover, lease.mac, None)
            .encode(&mut Encoder::new(&mut bytes))
            .unwrap();
        for hlen in [0u8, 5, 17, 255] {
            bytes[2] = hlen;
            let msg = Message::decode(&mut Decoder::new(&bytes)).unwrap();
            assert!(client_mac(&msg).is_none(), "hlen {hlen}");
            assert!(respond(&net, &mut leases, &msg, 0).is_none(), "hlen {hlen}");
        }
        bytes[2] = 6;
        let msg = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(client_mac(&msg), Some(lease.mac));
    }

    #[test]
    fn host_network_gives_no_router() {
        let cfg = Config::builtin();
        let net = cfg.network("host").unwrap().clone();
        let mut leases = LeaseTable::new(&net.name, net.own().unwrap());
        let mac = leases
            .attach(InterfaceId::from_bytes([1; 16]), None, None, 0)
            .unwrap()
            .mac;
        let offer = respond(
            &net,
            &mut leases,
            &client(MessageType::Discover, mac, None),
            0,
        )
        .unwrap();
        assert!(offer.opts().get(OptionCode::Router).is_none());
        assert!(offer.opts().get(OptionCode::DomainNameServer).is_some());
    }
}
