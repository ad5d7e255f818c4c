//! linnet-testdns: the "internet's" DNS server in the integration tests.
//!
//! Serves the zone `upstream.test` over UDP and TCP on each `--listen
//! ADDR:PORT`, with one name per record type (A, AAAA, CNAME chain, MX,
//! SRV, TXT, SOA, PTR), NXDOMAIN for unknown names, NODATA for a known name
//! without the type asked, SERVFAIL for `fail.upstream.test`, and REFUSED
//! outside the zone. Tests ask it directly and through linnet and compare.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, MX, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

const ZONE: &str = "upstream.test.";
const TTL: u32 = 300;

fn name(s: &str) -> Name {
    Name::from_ascii(s).expect("a valid name")
}

fn soa() -> Record {
    Record::from_rdata(
        name(ZONE),
        TTL,
        RData::SOA(SOA::new(
            name("ns.upstream.test."),
            name("hostmaster.upstream.test."),
            2026112301,
            3600,
            600,
            86400,
            60,
        )),
    )
}

/// The zone's records, by owner name.
fn records(owner: &str) -> Option<Vec<RData>> {
    let web = || name("web.upstream.test.");
    Some(match owner {
        "upstream.test." => vec![soa().data],
        "web.upstream.test." => vec![
            RData::A(A(Ipv4Addr::new(203, 0, 113, 254))),
            RData::AAAA(AAAA(Ipv6Addr::new(0x2001, 0xdb8, 0x113, 0, 0, 0, 0, 0xfe))),
        ],
        "alias.upstream.test." => vec![RData::CNAME(CNAME(name("alias2.upstream.test.")))],
        "alias2.upstream.test." => vec![RData::CNAME(CNAME(web()))],
        "mail.upstream.test." => vec![RData::MX(MX::new(10, web()))],
        "_http._tcp.upstream.test." => vec![RData::SRV(SRV::new(0, 5, 80, web()))],
        "txt.upstream.test." => vec![RData::TXT(TXT::new(vec![
            "linnet passes TXT through".into(),
            "second string".into(),
        ]))],
        "254.113.0.203.in-addr.arpa." => vec![RData::PTR(PTR(web()))],
        _ => return None,
    })
}

fn answer(query: &Message) -> Message {
    let mut reply = Message::response(query.metadata.id, OpCode::Query);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.queries = query.queries.clone();
    let Some(q) = query.queries.first() else {
        reply.metadata.response_code = ResponseCode::FormErr;
        return reply;
    };
    let asked = q.name().to_lowercase().to_ascii();
    let in_zone = asked.ends_with(ZONE) || asked.ends_with(".in-addr.arpa.");
    if !in_zone {
        reply.metadata.response_code = ResponseCode::Refused;
        return reply;
    }
    if asked == format!("fail.{ZONE}") {
        reply.metadata.response_code = ResponseCode::ServFail;
        return reply;
    }
    reply.metadata.authoritative = true;
    // Follow CNAMEs, as an authoritative server does within its zone.
    let mut owner = asked;
    for _ in 0..8 {
        let Some(data) = records(&owner) else {
            reply.metadata.response_code = if reply.answers.is_empty() {
                ResponseCode::NXDomain
            } else {
                ResponseCode::NoError
            };
            reply.authorities.push(soa());
            return reply;
        };
        let matching: Vec<RData> = data
            .iter()
            .filter(|d| d.record_type() == q.query_type() || q.query_type() == RecordType::ANY)
            .cloned()
            .collect();
        if let (true, Some(RData::CNAME(target))) = (matching.is_empty(), data.first()) {
            reply
                .answers
                .push(Record::from_rdata(name(&owner), TTL, data[0].clone()));
            owner = target.0.to_ascii();
            continue;
        }
        if matching.is_empty() {
            reply.authorities.push(soa());
        }
        for d in matching {
            reply.answers.push(Record::from_rdata(name(&owner), TTL, d));
        }
        return reply;
    }
    reply.metadata.response_code = ResponseCode::ServFail;
    reply
}

fn respond(bytes: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(bytes).ok()?;
    if query.metadata.message_type != MessageType::Query {
        return None;
    }
    answer(&query).to_vec().ok()
}

fn serve_udp(socket: UdpSocket) {
    let mut buf = [0u8; 4096];
    loop {
        let Ok((len, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        if let Some(reply) = respond(&buf[..len]) {
            let _ = socket.send_to(&reply, from);
        }
    }
}

fn serve_tcp(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let mut stream = stream;
            loop {
                let mut len = [0u8; 2];
                if stream.read_exact(&mut len).is_err() {
                    return;
                }
                let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
                if stream.read_exact(&mut buf).is_err() {
                    return;
                }
                let Some(reply) = respond(&buf) else { return };
                let mut out = (reply.len() as u16).to_be_bytes().to_vec();
                out.extend_from_slice(&reply);
                if stream.write_all(&out).is_err() {
                    return;
                }
            }
        });
    }
}

fn main() {
    let mut listen: Vec<SocketAddr> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--listen", Some(addr)) => match addr.parse() {
                Ok(a) => listen.push(a),
                Err(_) => fail(&format!("--listen {addr}: not ADDR:PORT")),
            },
            _ => fail(&format!("unknown argument {arg}")),
        }
    }
    if listen.is_empty() {
        fail("give at least one --listen ADDR:PORT");
    }
    let mut threads = Vec::new();
    for addr in listen {
        let udp = UdpSocket::bind(addr).unwrap_or_else(|e| fail(&format!("udp {addr}: {e}")));
        let tcp = TcpListener::bind(addr).unwrap_or_else(|e| fail(&format!("tcp {addr}: {e}")));
        threads.push(std::thread::spawn(move || serve_udp(udp)));
        threads.push(std::thread::spawn(move || serve_tcp(tcp)));
    }
    eprintln!("linnet-testdns: serving {ZONE}");
    for t in threads {
        let _ = t.join();
    }
}

fn fail(message: &str) -> ! {
    eprintln!("linnet-testdns: {message}");
    eprintln!("usage: linnet-testdns --listen ADDR:PORT [--listen ADDR:PORT...]");
    std::process::exit(2);
}
