//! What the fuzz targets (fuzz/) run: each parser of untrusted bytes fed
//! with the fuzzer's input, and what must hold of its result checked, not
//! only that it does not panic. Compiled with the `fuzzing` feature only;
//! the regression tests in this module run the same checks on the inputs
//! that once failed them and on the corpora's seeds.

use std::net::Ipv4Addr;
use std::sync::OnceLock;

use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use hickory_proto::op::{Message, MessageType};

use crate::config::{Config, NetworkConfig};
use crate::daemon::InterfaceRecord;
use crate::datapath::coalesce::{Coalescer, Run};
use crate::datapath::framing::{Deframer, LENGTH_BYTES};
use crate::datapath::segment::Splitter;
use crate::datapath::vnet;
use crate::leases::LeaseTable;
use crate::services::{dhcp, dns, snoop};
use crate::types::MacAddr;

/// The network every target serves: the default `shared`, with a VM
/// attached (so there is a lease, a name and a static entry to find).
fn network() -> &'static NetworkConfig {
    static NET: OnceLock<NetworkConfig> = OnceLock::new();
    NET.get_or_init(|| {
        let yaml = "networks:\n  shared:\n    dhcp: { static: [{ ip: 192.168.105.9, mac: '52:54:00:00:00:09' }] }\n";
        let cfg = Config::from_yaml(yaml, "fuzz.yaml").expect("a valid config");
        cfg.network("shared").expect("shared").clone()
    })
}

fn leases() -> LeaseTable {
    let net = network();
    let mut table = LeaseTable::new(&net.name, net.own().expect("own"));
    let mac: MacAddr = "52:54:00:12:34:56".parse().expect("a MAC");
    let id = "4f0e5c2a-3d6b-4c1e-9a7f-1b2c3d4e5f60"
        .parse()
        .expect("an id");
    table
        .attach_for(0u32, id, Some(mac), Some("vm".into()), 0)
        .expect("a lease");
    table
}

/// A DHCP message from a VM: the server's reply, if any, is a BOOTREPLY
/// for the same transaction and client hardware address, that encodes and
/// decodes again, with an address of the network (or none).
pub fn dhcp_request(bytes: &[u8]) {
    let Some(request) = dhcp::decode(bytes) else {
        return;
    };
    let net = network();
    let mut table = leases();
    for now in [0, 1_000_000] {
        let Some(reply) = dhcp::respond(net, &mut table, &request, now) else {
            continue;
        };
        assert_eq!(reply.opcode(), dhcproto::v4::Opcode::BootReply);
        assert_eq!(reply.xid(), request.xid());
        assert_eq!(reply.chaddr(), request.chaddr());
        let own = net.own().expect("own");
        let yiaddr = reply.yiaddr();
        assert!(
            yiaddr == Ipv4Addr::UNSPECIFIED || own.subnet.contains(&yiaddr),
            "an address outside the network: {yiaddr}"
        );
        let mut out = Vec::new();
        reply
            .encode(&mut Encoder::new(&mut out))
            .expect("a reply encodes");
        let again = dhcproto::v4::Message::decode(&mut Decoder::new(&out)).expect("and decodes");
        assert_eq!(again.xid(), request.xid());
    }
}

/// A DNS query from a VM about the network's names: an answer, if the
/// zone gives one, is a response to this query (its id, its question)
/// that encodes.
pub fn dns_query(bytes: &[u8]) {
    if let Some(answer) = zone_answer(bytes) {
        Message::from_vec(&answer).expect("an answer decodes");
    }
}

/// DNS over TCP: queries in the 2-byte length framing, answered in turn
/// as the server does until one is not a query it answers; every answer
/// goes out framed, and read back it is the answer to its query.
pub fn dns_tcp(bytes: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let (queries, out) = rt.block_on(async {
        let mut stream = bytes;
        let mut out = Vec::new();
        let mut queries = Vec::new();
        while let Ok(query) = dns::read_framed(&mut stream).await {
            let Some(answer) = zone_answer(&query) else {
                break;
            };
            dns::write_framed(&mut out, &answer)
                .await
                .expect("into memory");
            queries.push(query);
        }
        (queries, out)
    });
    let mut answers = &out[..];
    for query in queries {
        let answer = rt
            .block_on(dns::read_framed(&mut answers))
            .expect("every answer framed whole");
        let (query, answer) = (
            Message::from_vec(&query).expect("answered, so it parsed"),
            Message::from_vec(&answer).expect("an answer decodes"),
        );
        assert_eq!(answer.metadata.id, query.metadata.id);
        assert_eq!(answer.queries, query.queries);
    }
    assert!(answers.is_empty(), "nothing but the answers");
}

/// The zone's answer to a query, encoded; None for anything it does not
/// answer (not a query, not its name).
fn zone_answer(bytes: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(bytes).ok()?;
    if query.metadata.message_type != MessageType::Query {
        return None;
    }
    let own = network().own().expect("own");
    let zone = dns::Zone {
        domain: &own.dns.domain,
        prefix: own.ipv6.as_ref().map(|v6| v6.prefix),
    };
    let answer = zone.answer(&leases(), &query, 0)?;
    assert_eq!(answer.metadata.id, query.metadata.id);
    assert_eq!(answer.metadata.message_type, MessageType::Response);
    assert_eq!(answer.queries, query.queries, "answers only what was asked");
    Some(answer.to_vec().expect("an answer encodes"))
}

/// A reply in the API's packets, as the daemon sends it (one packet, or
/// a large one announced and cut into pieces of the size the input's
/// first two bytes give), read by a client: the client reads exactly
/// what was sent. Then the same client on packets straight from the
/// input (a daemon, or whatever sits on the socket, that lies about the
/// size it announces, or stops half-way): an error, or the message the
/// packets make, never a panic or more memory than a reply may take.
pub fn api_reply(bytes: &[u8]) {
    use std::os::fd::AsFd;
    let Some((piece, rest)) = bytes.split_first_chunk::<2>() else {
        return;
    };
    // At least what the daemon cuts (`api::piece_size`): smaller ones are
    // read the same way, only more of them.
    let piece = usize::from(u16::from_be_bytes(*piece)).max(1024);
    // Repeated past one packet, so a large reply is made of the input.
    let text = String::from_utf8_lossy(rest);
    let times = (crate::api::MAX_MESSAGE / text.len().max(1) + 2).min(4096);
    let sent = serde_json::Value::String(text.repeat(if rest.first() == Some(&b'L') {
        times
    } else {
        1
    }));
    let reply = crate::api::ReplyBytes::new(&sent).expect("a string serialises");
    let (ours, theirs) = packet_pair();
    // A panic of the writer's comes out of the scope.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for packet in reply.packets(piece) {
                crate::api::send_packet(theirs.as_fd(), packet, &[]).expect("sent");
            }
        });
        let client = crate::api::Channel::from_fd(ours);
        let (got, _) = client
            .recv::<serde_json::Value>()
            .expect("read whole")
            .expect("not closed");
        assert_eq!(got, sent);
    });

    // Packets from the input: each a byte of length (times 256) and its
    // bytes; a first that announces a large reply of any size.
    let (ours, theirs) = packet_pair();
    let mut input = rest;
    let mut packets: Vec<Vec<u8>> = Vec::new();
    if let Some((size, tail)) = input.split_first_chunk::<4>() {
        let announced = u32::from_be_bytes(*size);
        packets.push(format!("{{\"large_message\":{announced}}}").into_bytes());
        input = tail;
    }
    while let Some((&len, tail)) = input.split_first() {
        let len = (usize::from(len) * 256).min(crate::api::MAX_MESSAGE);
        let (packet, tail) = tail.split_at(tail.len().min(len.max(1)));
        packets.push(packet.to_vec());
        input = tail;
    }
    std::thread::scope(|scope| {
        scope.spawn(move || {
            for packet in &packets {
                // A reader that gave up closes its end: the rest is moot.
                if crate::api::send_packet(theirs.as_fd(), packet, &[]).is_err() {
                    break;
                }
            }
            drop(theirs);
        });
        let client = crate::api::Channel::from_fd(ours);
        let _ = client.recv::<serde_json::Value>();
    });
}

/// A connected pair of the API's kind of socket.
fn packet_pair() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .expect("a socketpair")
}

/// A VMM's stream in the 4-byte length framing, read in pieces whose
/// sizes the input's first byte picks: every frame handed out is within
/// the buffer and at most the largest frame; an error ends the stream.
pub fn stream_framing(bytes: &[u8]) {
    const MAX_FRAME: usize = 1518;
    let Some((&step, stream)) = bytes.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut d = Deframer::new(MAX_FRAME, 4096);
    let mut delivered = 0;
    for piece in stream.chunks(step) {
        let spare = d.spare();
        assert!(spare.len() >= piece.len().min(LENGTH_BYTES + MAX_FRAME));
        let n = piece.len().min(spare.len());
        spare[..n].copy_from_slice(&piece[..n]);
        d.filled(n);
        loop {
            match d.next_frame() {
                None => break,
                Some(Ok(frame)) => {
                    assert!(!frame.is_empty() && frame.len() <= MAX_FRAME);
                    assert!(frame.end <= d.buffer().len());
                    delivered += frame.len() + LENGTH_BYTES;
                }
                Some(Err(_)) => return,
            }
        }
    }
    assert!(delivered <= stream.len());
}

/// A request on the API socket: what parses serialises and parses to the
/// same request again.
pub fn api_request(bytes: &[u8]) {
    let Ok(request) = serde_json::from_slice::<crate::api::Request>(bytes) else {
        return;
    };
    let text = serde_json::to_vec(&request).expect("a request serialises");
    let again: crate::api::Request = serde_json::from_slice(&text).expect("and parses again");
    assert_eq!(
        serde_json::to_value(&again).expect("serialises"),
        serde_json::to_value(&request).expect("serialises")
    );
}

/// An interface record a killed daemon left (or someone edited): read or
/// refused; what reads writes and reads back as the same record.
pub fn interface_record(bytes: &[u8]) {
    let Ok(record) = serde_json::from_slice::<InterfaceRecord>(bytes) else {
        return;
    };
    let text = serde_json::to_vec(&record).expect("a record serialises");
    let again: InterfaceRecord = serde_json::from_slice(&text).expect("and reads back");
    assert_eq!(again, record);
}

/// A networks.yaml: valid or refused with a message, never a panic; a
/// valid one names every network it gives.
pub fn networks_yaml(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match Config::from_yaml(text, "fuzz.yaml") {
        Ok(cfg) => {
            for (name, net) in &cfg.networks {
                assert_eq!(name, &net.name);
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// A frame on a LAN network's uplink, as the snooper sees it: a DHCPACK
/// it believes is one from a server to an Ethernet client, with a unicast
/// address to use.
pub fn lan_snoop(bytes: &[u8]) {
    let Some(acked) = snoop::dhcp_ack(bytes) else {
        return;
    };
    let ip = acked.ip;
    assert!(
        !(ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback()),
        "a unicast address: {ip}"
    );
    assert_eq!(acked.mac.0[0] & 1, 0, "a unicast MAC: {}", acked.mac);
}

/// A frame the TAP gives the relay, with its virtio-net header, for a VMM
/// that takes bare frames of at most 1514 bytes: every frame handed on is
/// at most that, and a TCP frame cut into segments loses no payload.
pub fn tap_segmentation(bytes: &[u8]) {
    const MAX_FRAME: usize = 1514;
    let mut splitter = Splitter::new(vnet::VIRTIO1_LEN);
    let buf = splitter.buffer();
    let n = bytes.len().min(buf.len());
    if n < vnet::VIRTIO1_LEN {
        return;
    }
    buf[..n].copy_from_slice(&bytes[..n]);
    if splitter.load(n, MAX_FRAME).is_err() {
        assert!(
            !splitter.pending(),
            "a refused frame leaves nothing to pass on"
        );
        return;
    }
    let mut out = vec![0u8; MAX_FRAME];
    let mut frames = 0;
    while let Some(len) = splitter.next(&mut out) {
        assert!(len <= MAX_FRAME, "a frame of {len} bytes");
        frames += 1;
        assert!(frames <= vnet::GSO_MAX_FRAME, "it ends");
    }
    assert!(!splitter.pending());
}

/// Frames from a VMM that sends bare frames, cut from the input at the
/// sizes its first bytes give, coalesced into runs for the TAP: a run is
/// at most a GSO frame behind its header, and stands for the frames and
/// bytes that went into it.
pub fn coalescing(bytes: &[u8]) {
    let mut coalescer = Coalescer::new(vnet::VIRTIO1_LEN);
    let Some((&count, rest)) = bytes.split_first() else {
        return;
    };
    let count = usize::from(count % 8) + 1;
    let size = rest.len() / count;
    if size == 0 {
        return;
    }
    let frames: Vec<&[u8]> = rest.chunks(size).take(count).collect();
    let mut sent = (0u64, 0u64);
    let mut check = |run: Run| {
        assert!(run.data.len() <= vnet::VIRTIO1_LEN + vnet::GSO_MAX_FRAME + 64);
        assert!(run.frames >= 1);
        sent = (sent.0 + run.frames, sent.1 + run.bytes);
    };
    let mut running = false;
    for frame in &frames {
        if running && coalescer.append(frame) {
            continue;
        }
        if running {
            check(coalescer.finish().expect("a run"));
        }
        running = coalescer.start(frame);
    }
    if running {
        check(coalescer.finish().expect("a run"));
    }
    let taken: u64 = frames.len() as u64;
    assert!(sent.0 <= taken);
}

/// A lease file a crash or an editor left: read, or set aside, and only
/// the network's own addresses (never its gateway's) kept.
pub fn lease_file(bytes: &[u8]) {
    let net = network();
    let own = net.own().expect("own");
    let dir = std::env::temp_dir().join(format!("linnet-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("shared.json");
    if std::fs::write(&path, bytes).is_err() {
        return;
    }
    let table = LeaseTable::open(&net.name, own, &path, 0).expect("read or set aside");
    for ip in table.leases().map(|l| l.ip) {
        assert!(own.subnet.contains(&ip) && ip != own.gateway, "{ip}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection's first bytes, as the gate reads them: whatever they
/// show is decided for good (more bytes after them change nothing), a
/// name is non-empty ASCII, and until decided every prefix wants more.
pub fn first_bytes(bytes: &[u8]) {
    use crate::gate::{Shown, shown};
    let mut scratch = Vec::new();
    let verdict = format!("{:?}", shown(bytes, &mut scratch));
    if let Shown::Name(name) = shown(bytes, &mut scratch) {
        assert!(!name.is_empty() && name.is_ascii(), "{name:?}");
    }
    if verdict == "More" {
        return;
    }
    let mut longer = bytes.to_vec();
    longer.extend_from_slice(b"GET / HTTP/1.1\r\nHost: x.test\r\n\r\n\x16\x03\x01\x00\x01\x01");
    let mut again = Vec::new();
    assert_eq!(
        format!("{:?}", shown(&longer, &mut again)),
        verdict,
        "decided for good"
    );
}

/// Packets of one VM's connections through the gate, made of `data`
/// (each: a source port, a sequence number, TCP flags, whether it comes
/// back from a recheck, bytes): every packet gets exactly one verdict, at
/// once or once its connection is judged, and nothing is held past the
/// time a connection has to show its name.
pub fn held_packets(data: &[u8]) {
    use crate::gate::held::{Gate, Out, WAIT};
    use crate::gate::wire::GatedVm;
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::{Duration, Instant};
    const VM: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const SERVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    let id = crate::types::InterfaceId::from_u128(1);
    let mut gate = Gate::default();
    gate.vms.set(vec![GatedVm {
        interface_id: id,
        addrs: vec![IpAddr::V4(VM)],
        policy: crate::policy::Policy {
            egress: vec!["a.test:443".parse().expect("a rule")],
            ..Default::default()
        },
    }]);
    let now = Instant::now();
    gate.vms
        .learned(id, "a.test", &[(IpAddr::V4(SERVER), 60)], now);
    let mut out = Out::default();
    let mut given = 0u32;
    let mut rest = data;
    while rest.len() >= 8 {
        let (head, tail) = rest.split_at(8);
        let len = usize::from(head[7]).min(tail.len());
        let (payload, tail) = tail.split_at(len);
        rest = tail;
        let mut packet = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
        packet.extend(VM.octets());
        packet.extend(SERVER.octets());
        packet.extend([0x80, head[0], 1, 187]);
        packet.extend(&head[1..5]);
        packet.extend([0, 0, 0, 0, 0x50, head[5], 0xff, 0xff, 0, 0, 0, 0]);
        packet.extend(payload);
        let total = packet.len() as u16;
        packet[2..4].copy_from_slice(&total.to_be_bytes());
        gate.packet(given, &packet, head[6] & 1 == 1, now, &mut out);
        given += 1;
    }
    gate.tick(now + WAIT + Duration::from_secs(1), &mut out);
    assert_eq!(
        out.verdicts.len() as u32,
        given,
        "one verdict each, never two"
    );
    let mut ids: Vec<u32> = out.verdicts.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..given).collect::<Vec<_>>(), "one verdict each");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fuzz target: its name (its corpus's folder) and its entry point.
    type Target = (&'static str, fn(&[u8]));

    /// Every target on every seed of its corpus (fuzz/corpus/TARGET).
    #[test]
    fn every_target_holds_on_its_corpus() {
        let targets: [Target; 14] = [
            ("dhcp_request", dhcp_request),
            ("dns_query", dns_query),
            ("dns_tcp", dns_tcp),
            ("api_reply", api_reply),
            ("stream_framing", stream_framing),
            ("api_request", api_request),
            ("networks_yaml", networks_yaml),
            ("lan_snoop", lan_snoop),
            ("tap_segmentation", tap_segmentation),
            ("coalescing", coalescing),
            ("lease_file", lease_file),
            ("interface_record", interface_record),
            ("first_bytes", first_bytes),
            ("held_packets", held_packets),
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        for (name, target) in targets {
            let dir = root.join(name);
            let seeds: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .map(|e| e.unwrap().path())
                .collect();
            assert!(!seeds.is_empty(), "{name} has seeds");
            for seed in seeds {
                target(&std::fs::read(&seed).unwrap());
            }
        }
    }
}
