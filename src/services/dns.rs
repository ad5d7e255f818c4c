//! DNS on the gateway address (UDP and TCP, RFC 1035 / RFC 7766).
//!
//! Listens on the gateway's IPv4 address and, with IPv6, on PREFIX::1.
//! Names of the network's VMs (`<name>.<domain>`, and a bare `<name>`) are
//! answered from the lease table: A with the leased address, AAAA with the
//! SLAAC address the VM forms from its MAC. Everything else is passed
//! unchanged to the upstream resolvers (dns.upstream, or /etc/resolv.conf at
//! network start) and the upstream's answer is returned unchanged, whatever
//! its type or code.
//!
//! Except for a VM whose policy names DNS names (`name_gate`): its query
//! goes upstream only when its name is one the policy allows, and is
//! answered REFUSED here otherwise. REFUSED rather than NXDOMAIN: the name
//! may well exist, and a resolver in the VM caches an NXDOMAIN for the
//! zone's negative TTL (RFC 2308), often minutes, past a `policy set` that
//! allows the name; a refusal says nothing of the name, and a resolver
//! holds it briefly if at all (RFC 9520: seconds). The
//! addresses of an allowed answer (A and AAAA, the queried name's and
//! those its CNAMEs lead to) are in the VM's firewall sets before the
//! answer is sent; its TTLs are cut to what the rule lives at most.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType, rdata::A, rdata::AAAA};
use ipnet::Ipv6Net;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tracing::{debug, warn};

use socket2::{Domain, Protocol, Socket, Type};

use super::name_gate::{NameGate, Verdict};
use super::{NetworkContext, ServiceCounters, ServiceError, unix_now};
use crate::addr6;
use crate::budget::{Budget, Refused};
use crate::leases::LeaseTable;

const PORT: u16 = 53;
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Answers about VMs change as they come and go: keep caches short.
const LOCAL_TTL: u32 = 5;
const MAX_UDP: usize = 4096;
/// Queries one VM (by address) may have waiting for an upstream answer, and
/// the network in all; past them a query is dropped, as a busy resolver
/// would, and the client retries.
const QUERIES_PER_CLIENT: usize = 32;
const QUERIES_IN_ALL: usize = 512;
/// TCP connections one VM may hold open, and the network in all.
const TCP_PER_CLIENT: usize = 4;
const TCP_IN_ALL: usize = 64;
/// How long accepting pauses after a failure (out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How many CNAMEs an answer's chain may have for its addresses to count.
const MAX_CHAIN: usize = 16;

pub fn start(
    ctx: Arc<NetworkContext>,
    names: Arc<NameGate>,
) -> Result<Vec<JoinHandle<()>>, ServiceError> {
    let mut addrs = vec![IpAddr::V4(ctx.own().gateway)];
    addrs.extend(ctx.own().ipv6.as_ref().map(|v6| IpAddr::V6(v6.gateway)));
    let upstream = Arc::new(upstreams(&ctx));
    if upstream.is_empty() {
        warn!(network = %ctx.name(), "no upstream DNS server (dns.upstream is empty and /etc/resolv.conf names none): only VM names will resolve");
    }
    let mut tasks = Vec::new();
    let queries = Arc::new(Budget::new(QUERIES_PER_CLIENT, QUERIES_IN_ALL));
    let streams = Arc::new(Budget::new(TCP_PER_CLIENT, TCP_IN_ALL));
    for ip in addrs {
        let (udp, tcp) = bind(&ctx, SocketAddr::new(ip, PORT))?;
        tasks.push(super::spawn_service(
            "DNS",
            ctx.name(),
            serve_udp(
                Resolver {
                    ctx: ctx.clone(),
                    names: names.clone(),
                    upstream: upstream.clone(),
                },
                Arc::new(udp),
                queries.clone(),
            ),
        ));
        tasks.push(super::spawn_service(
            "DNS",
            ctx.name(),
            serve_tcp(
                Resolver {
                    ctx: ctx.clone(),
                    names: names.clone(),
                    upstream: upstream.clone(),
                },
                tcp,
                streams.clone(),
            ),
        ));
    }
    Ok(tasks)
}

/// Logs a refusal when its budget says to.
fn refused(ctx: &NetworkContext, what: &str, client: IpAddr, refusal: &Refused) {
    if let Some(count) = refusal.report {
        let whose = if refusal.per_key {
            format!("{client} has its")
        } else {
            "the network has its".to_string()
        };
        warn!(network = %ctx.name(), %client, refused = count, "DNS: {whose} most {what} at once; dropping more");
    }
}

fn bind(ctx: &NetworkContext, addr: SocketAddr) -> Result<(UdpSocket, TcpListener), ServiceError> {
    let bind_err = |source| ServiceError::Bind {
        network: ctx.name().into(),
        service: "DNS",
        addr: addr.to_string(),
        source,
    };
    // Bound to the bridge: the network's VMs ask here, nobody else (not
    // another network's VMs, not the outside through a route to the
    // gateway's address) finds an open resolver.
    let socket = |kind: Type, protocol: Protocol| -> std::io::Result<Socket> {
        let socket = Socket::new(Domain::for_address(addr), kind, Some(protocol))?;
        // TCP only: a listener restarts over connections in TIME_WAIT; a
        // UDP socket would let another share the port.
        socket.set_reuse_address(kind == Type::STREAM)?;
        socket.bind_device(Some(ctx.bridge.as_bytes()))?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        Ok(socket)
    };
    let udp = socket(Type::DGRAM, Protocol::UDP).map_err(bind_err)?;
    let tcp = socket(Type::STREAM, Protocol::TCP).map_err(bind_err)?;
    tcp.listen(128).map_err(bind_err)?;
    Ok((
        UdpSocket::from_std(udp.into()).map_err(bind_err)?,
        TcpListener::from_std(tcp.into()).map_err(bind_err)?,
    ))
}

fn upstreams(ctx: &NetworkContext) -> Vec<SocketAddr> {
    let own_v6 = ctx.own().ipv6.as_ref().map(|v6| IpAddr::V6(v6.gateway));
    let own = |ip: IpAddr| ip == IpAddr::V4(ctx.own().gateway) || Some(ip) == own_v6;
    let list = if ctx.own().dns.upstream.is_empty() {
        std::fs::read_to_string("/etc/resolv.conf")
            .map(|t| resolv_conf_servers(&t))
            .unwrap_or_default()
    } else {
        ctx.own().dns.upstream.clone()
    };
    list.into_iter().filter(|a| !own(a.ip())).collect()
}

pub fn resolv_conf_servers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, PORT))
        .collect()
}

/// What a network's DNS answers with: its zone, the gate, the upstreams.
#[derive(Clone)]
struct Resolver {
    ctx: Arc<NetworkContext>,
    names: Arc<NameGate>,
    upstream: Arc<Vec<SocketAddr>>,
}

async fn serve_udp(resolver: Resolver, socket: Arc<UdpSocket>, budget: Arc<Budget<IpAddr>>) {
    let mut buf = vec![0u8; MAX_UDP];
    loop {
        let Ok((len, client)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        // The network's own names, and refusals, are answered at once,
        // budget or not: only what waits for an upstream counts.
        let forward = match resolver.plan(client.ip(), &buf[..len]) {
            Plan::Answer(answer) => {
                let _ = socket.send_to(&answer, client).await;
                continue;
            }
            Plan::Nothing => continue,
            Plan::Forward(forward) => forward,
        };
        let permit = match budget.try_take(client.ip()) {
            Ok(permit) => permit,
            Err(refusal) => {
                ServiceCounters::count(&resolver.ctx.counters.dns_dropped);
                refused(&resolver.ctx, "queries", client.ip(), &refusal);
                continue;
            }
        };
        let query = buf[..len].to_vec();
        let (socket, resolver) = (socket.clone(), resolver.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(answer) = resolver.forward(forward, &query, Transport::Udp).await {
                let _ = socket.send_to(&answer, client).await;
            }
        });
    }
}

async fn serve_tcp(resolver: Resolver, listener: TcpListener, budget: Arc<Budget<IpAddr>>) {
    loop {
        let (mut stream, client) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: the connection waits in the
                // backlog, and spinning on it would starve the daemon.
                debug!(network = %resolver.ctx.name(), "DNS over TCP: accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let permit = match budget.try_take(client.ip()) {
            Ok(permit) => permit,
            Err(refusal) => {
                refused(&resolver.ctx, "TCP connections", client.ip(), &refusal);
                continue;
            }
        };
        let resolver = resolver.clone();
        tokio::spawn(async move {
            let _permit = permit;
            while let Ok(Ok(query)) = timeout(TCP_IDLE, read_framed(&mut stream)).await {
                let answer = match resolver.plan(client.ip(), &query) {
                    Plan::Answer(answer) => Some(answer),
                    Plan::Nothing => None,
                    Plan::Forward(f) => resolver.forward(f, &query, Transport::Tcp).await,
                };
                let Some(answer) = answer else {
                    break;
                };
                if write_framed(&mut stream, &answer).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// What to do with a packet from a VM.
enum Plan {
    /// Answered here: a name of the network's, or a refusal.
    Answer(Vec<u8>),
    /// Not a DNS query at all: no answer.
    Nothing,
    Forward(Forward),
}

/// A query for the upstream resolvers.
struct Forward {
    msg: Box<Message>,
    /// A VM with names in its policy (its TAP) and the name it asked:
    /// the answer's addresses become its own before it is released.
    learn: Option<(String, Name)>,
}

impl Resolver {
    fn plan(&self, client: IpAddr, query: &[u8]) -> Plan {
        let counters = &self.ctx.counters;
        let msg = match local_answer(&self.ctx, query) {
            Local::NotAQuery => return Plan::Nothing,
            Local::Answer(answer) => {
                ServiceCounters::count(&counters.dns_queries);
                return Plan::Answer(answer);
            }
            Local::Forward(msg) => msg,
        };
        ServiceCounters::count(&counters.dns_queries);
        // A query of any other count of questions is no name to judge.
        let verdict = match msg.queries.as_slice() {
            [q] => self.names.ask(self.ctx.name(), client, q.name()),
            _ => match self.names.ask(self.ctx.name(), client, &Name::root()) {
                Verdict::Open => Verdict::Open,
                _ => Verdict::Refused,
            },
        };
        match verdict {
            Verdict::Open => Plan::Forward(Forward { msg, learn: None }),
            Verdict::Allowed(tap) => {
                let name = msg.queries[0].name().clone();
                Plan::Forward(Forward {
                    msg,
                    learn: Some((tap, name)),
                })
            }
            Verdict::Refused => {
                ServiceCounters::count(&counters.dns_refused);
                match error_answer(&msg, ResponseCode::Refused) {
                    Some(answer) => Plan::Answer(answer),
                    None => Plan::Nothing,
                }
            }
        }
    }

    /// The upstream's answer, released once what it gives a gated VM is
    /// in its sets; SERVFAIL when no upstream answered or the sets could
    /// not take it.
    async fn forward(&self, f: Forward, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let answer = forward(&f.msg, query, &self.upstream, transport).await?;
        let Some((tap, name)) = f.learn else {
            return Some(answer);
        };
        let Ok(mut parsed) = Message::from_vec(&answer) else {
            return error_answer(&f.msg, ResponseCode::ServFail);
        };
        let addrs = answered_addresses(&parsed, &name);
        if addrs.is_empty() {
            return Some(answer);
        }
        match self.names.learn(&tap, &name, &addrs) {
            Ok(ceiling) if cap_ttls(&mut parsed, ceiling) => parsed.to_vec().ok(),
            Ok(_) => Some(answer),
            Err(e) => {
                warn!(network = %self.ctx.name(), tap, "DNS: cannot let the VM reach what its answer gives ({e}); answering SERVFAIL");
                error_answer(&f.msg, ResponseCode::ServFail)
            }
        }
    }
}

/// The addresses an answer gives for `name`: its A and AAAA records, and
/// those of the names its CNAME chain leads to, each with its TTL.
pub fn answered_addresses(answer: &Message, name: &Name) -> Vec<(IpAddr, u32)> {
    if answer.metadata.response_code != ResponseCode::NoError {
        return Vec::new();
    }
    let mut chain = vec![crate::names::normalise(name)];
    for _ in 0..MAX_CHAIN {
        let next = answer.answers.iter().find_map(|r| match &r.data {
            RData::CNAME(target)
                if chain.contains(&crate::names::normalise(&r.name))
                    && !chain.contains(&crate::names::normalise(&target.0)) =>
            {
                Some(crate::names::normalise(&target.0))
            }
            _ => None,
        });
        match next {
            Some(target) => chain.push(target),
            None => break,
        }
    }
    answer
        .answers
        .iter()
        .filter(|r| chain.contains(&crate::names::normalise(&r.name)))
        .filter_map(|r| match &r.data {
            RData::A(a) => Some((IpAddr::V4(a.0), r.ttl)),
            RData::AAAA(a) => Some((IpAddr::V6(a.0), r.ttl)),
            _ => None,
        })
        .collect()
}

/// Cuts every TTL above `ceiling` to it; whether any was.
fn cap_ttls(msg: &mut Message, ceiling: u32) -> bool {
    let mut cut = false;
    for r in (msg.answers.iter_mut())
        .chain(msg.authorities.iter_mut())
        .chain(msg.additionals.iter_mut())
    {
        if r.ttl > ceiling && r.record_type() != RecordType::OPT {
            r.ttl = ceiling;
            cut = true;
        }
    }
    cut
}

/// An answer to `msg` with `code` and no records.
fn error_answer(msg: &Message, code: ResponseCode) -> Option<Vec<u8>> {
    let mut reply = Message::error_msg(msg.metadata.id, msg.metadata.op_code, code);
    reply.queries = msg.queries.clone();
    reply.metadata.recursion_desired = msg.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.to_vec().ok()
}

#[derive(Clone, Copy)]
enum Transport {
    Udp,
    Tcp,
}

/// What the network's own zone makes of a packet.
enum Local {
    Answer(Vec<u8>),
    /// Not a DNS query at all: no answer.
    NotAQuery,
    /// A name the zone does not hold: for the upstream resolvers.
    Forward(Box<Message>),
}

fn local_answer(ctx: &NetworkContext, query: &[u8]) -> Local {
    let Ok(msg) = Message::from_vec(query) else {
        return Local::NotAQuery;
    };
    if msg.metadata.message_type != MessageType::Query {
        return Local::NotAQuery;
    }
    let leases = ctx.leases.lock().expect("lease table lock");
    let zone = Zone {
        domain: &ctx.own().dns.domain,
        prefix: ctx.own().ipv6.as_ref().map(|v6| v6.prefix),
    };
    match zone.answer(&leases, &msg, unix_now()).map(|a| a.to_vec()) {
        Some(Ok(answer)) => Local::Answer(answer),
        Some(Err(_)) => Local::NotAQuery,
        None => Local::Forward(Box::new(msg)),
    }
}

/// The upstream's answer to `query` (parsed: `msg`), or SERVFAIL when no
/// upstream answered.
async fn forward(
    msg: &Message,
    query: &[u8],
    upstream: &[SocketAddr],
    transport: Transport,
) -> Option<Vec<u8>> {
    for server in upstream {
        let result = match transport {
            Transport::Udp => timeout(UPSTREAM_TIMEOUT, forward_udp(*server, query)).await,
            Transport::Tcp => timeout(UPSTREAM_TIMEOUT, forward_tcp(*server, query)).await,
        };
        match result {
            Ok(Ok(answer)) if answer.len() >= 2 && answer[..2] == query[..2] => {
                return Some(answer);
            }
            Ok(Err(e)) => debug!(%server, "upstream DNS failed: {e}"),
            _ => debug!(%server, "upstream DNS did not answer in time"),
        }
    }
    error_answer(msg, ResponseCode::ServFail)
}

async fn forward_udp(server: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let socket = UdpSocket::bind(bind).await?;
    socket.connect(server).await?;
    socket.send(query).await?;
    let mut buf = vec![0u8; MAX_UDP];
    loop {
        let len = socket.recv(&mut buf).await?;
        // Anything but the answer to our id is noise (or spoofing): keep waiting.
        if len >= 2 && buf[..2] == query[..2] {
            buf.truncate(len);
            return Ok(buf);
        }
    }
}

async fn forward_tcp(server: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(server).await?;
    write_framed(&mut stream, query).await?;
    read_framed(&mut stream).await
}

/// One DNS message off a TCP stream: a 2-byte big-endian length, then
/// that many bytes (RFC 1035 4.2.2; at most 64 KiB, so at most that is
/// allocated, whatever a VM sends).
pub(crate) async fn read_framed(stream: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
    let len = stream.read_u16().await? as usize;
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

pub(crate) async fn write_framed(
    stream: &mut (impl AsyncWrite + Unpin),
    msg: &[u8],
) -> std::io::Result<()> {
    let len =
        u16::try_from(msg.len()).map_err(|_| std::io::Error::other("DNS message over 64 KiB"))?;
    let mut out = Vec::with_capacity(2 + msg.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(msg);
    stream.write_all(&out).await
}

/// The network's own names.
pub struct Zone<'a> {
    pub domain: &'a str,
    /// With IPv6, the prefix VMs form their SLAAC addresses in.
    pub prefix: Option<Ipv6Net>,
}

impl Zone<'_> {
    /// Answers a query about this network's own names; None to forward it.
    /// `<vm>.<domain>` is ours (unknown names are NXDOMAIN); a bare `<vm>` is
    /// answered when a VM has that name and forwarded otherwise.
    pub fn answer(&self, leases: &LeaseTable, query: &Message, now: u64) -> Option<Message> {
        if query.metadata.op_code != OpCode::Query || query.queries.len() != 1 {
            return None;
        }
        let q = &query.queries[0];
        let name = q.name().to_lowercase().to_ascii();
        let name = name.trim_end_matches('.');
        let (label, in_zone) = match name
            .strip_suffix(self.domain)
            .and_then(|rest| rest.strip_suffix('.'))
        {
            Some(label) => (label, true),
            None if !name.contains('.') && !name.is_empty() => (name, false),
            None => return None,
        };
        let found = if label.contains('.') {
            None
        } else {
            leases.resolve_name(label, now)
        };
        if found.is_none() && !in_zone {
            return None;
        }
        let mut reply = Message::response(query.metadata.id, OpCode::Query);
        reply.metadata.authoritative = true;
        reply.metadata.recursion_desired = query.metadata.recursion_desired;
        reply.metadata.recursion_available = true;
        reply.queries = query.queries.clone();
        let Some((ip, mac)) = found else {
            reply.metadata.response_code = ResponseCode::NXDomain;
            return Some(reply);
        };
        // A name that exists but has no record of the type asked for gets
        // NOERROR with no answer.
        let kind = q.query_type();
        let record = |data| Record::from_rdata(q.name().clone(), LOCAL_TTL, data);
        if matches!(kind, RecordType::A | RecordType::ANY) {
            reply.answers.push(record(RData::A(A(ip))));
        }
        if matches!(kind, RecordType::AAAA | RecordType::ANY)
            && let (Some(prefix), Some(mac)) = (self.prefix, mac)
        {
            let ip = addr6::slaac_address(prefix, mac);
            reply.answers.push(record(RData::AAAA(AAAA(ip))));
        }
        Some(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::types::InterfaceId;
    use hickory_proto::op::Query;
    use hickory_proto::rr::rdata::CNAME;

    fn zone(prefix: Option<&str>) -> Zone<'static> {
        Zone {
            domain: "shared.linnet",
            prefix: prefix.map(|p| p.parse().unwrap()),
        }
    }

    #[test]
    fn aaaa_is_the_slaac_address_of_the_vm_mac() {
        let (t, ip) = leases();
        let mac = t.leases().find(|l| l.ip == ip).unwrap().mac;
        let prefix: Ipv6Net = "fd00:1:2::/64".parse().unwrap();
        let z = zone(Some("fd00:1:2::/64"));
        let a = z
            .answer(&t, &query("web.shared.linnet", RecordType::AAAA), 1)
            .unwrap();
        assert_eq!(
            a.answers[0].data,
            RData::AAAA(AAAA(addr6::slaac_address(prefix, mac)))
        );
        let any = z.answer(&t, &query("web", RecordType::ANY), 1).unwrap();
        assert_eq!(any.answers.len(), 2, "A and AAAA");
        let mx = z
            .answer(&t, &query("web.shared.linnet", RecordType::MX), 1)
            .unwrap();
        assert_eq!(
            (mx.metadata.response_code, mx.answers.len()),
            (ResponseCode::NoError, 0)
        );
    }

    fn leases() -> (LeaseTable, std::net::Ipv4Addr) {
        let cfg = Config::builtin();
        let mut t = LeaseTable::new("shared", cfg.network("shared").unwrap().own().unwrap());
        let lease = t
            .attach(
                InterfaceId::from_bytes([1; 16]),
                None,
                Some("web".into()),
                0,
            )
            .unwrap();
        (t, lease.ip)
    }

    fn query(name: &str, kind: RecordType) -> Message {
        let mut m = Message::query();
        m.metadata.id = 77;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        // Through the wire format and back, as the server sees it.
        Message::from_vec(&m.to_vec().unwrap()).unwrap()
    }

    #[test]
    fn vm_names_are_answered_in_the_zone_and_bare() {
        let (t, ip) = leases();
        for name in ["web.shared.linnet.", "WEB.shared.linnet", "web"] {
            let a = zone(None)
                .answer(&t, &query(name, RecordType::A), 1)
                .unwrap();
            assert_eq!(a.metadata.id, 77);
            assert_eq!(a.metadata.response_code, ResponseCode::NoError);
            assert_eq!(a.answers.len(), 1, "{name}");
            assert_eq!(a.answers[0].data, RData::A(A(ip)));
        }
    }

    #[test]
    fn unknown_names_in_the_zone_are_nxdomain_and_others_are_forwarded() {
        let (t, _) = leases();
        let a = zone(None)
            .answer(&t, &query("nope.shared.linnet", RecordType::A), 1)
            .unwrap();
        assert_eq!(a.metadata.response_code, ResponseCode::NXDomain);
        assert!(
            zone(None)
                .answer(&t, &query("example.com", RecordType::A), 1)
                .is_none()
        );
        assert!(
            zone(None)
                .answer(&t, &query("localhost", RecordType::A), 1)
                .is_none()
        );
        let aaaa = zone(None)
            .answer(&t, &query("web.shared.linnet", RecordType::AAAA), 1)
            .unwrap();
        assert_eq!(
            (aaaa.metadata.response_code, aaaa.answers.len()),
            (ResponseCode::NoError, 0)
        );
    }

    #[test]
    fn resolv_conf_nameservers_are_read() {
        let text = "# comment\nsearch lan\nnameserver 10.0.0.53\nnameserver fe80::1%eth0\noptions edns0\nnameserver bogus\n";
        let got = resolv_conf_servers(text);
        assert_eq!(
            got,
            vec![
                "10.0.0.53:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
    }

    #[test]
    fn an_answers_addresses_are_the_names_and_its_cname_chains_only() {
        let name = |s: &str| Name::from_utf8(s).unwrap();
        let mut answer = Message::response(7, OpCode::Query);
        let rec = |owner: &str, ttl, data| Record::from_rdata(name(owner), ttl, data);
        answer.answers = vec![
            rec(
                "WWW.example.com.",
                300,
                RData::CNAME(CNAME(name("edge.cdn.test."))),
            ),
            rec(
                "edge.cdn.test.",
                20,
                RData::CNAME(CNAME(name("e1.cdn.test."))),
            ),
            rec("e1.cdn.test.", 5, RData::A(A("192.0.2.1".parse().unwrap()))),
            rec(
                "e1.cdn.test.",
                7,
                RData::AAAA(AAAA("2001:db8::1".parse().unwrap())),
            ),
            // Not on the chain: an upstream's extra, never learned.
            rec(
                "elsewhere.test.",
                60,
                RData::A(A("198.51.100.9".parse().unwrap())),
            ),
        ];
        let got = answered_addresses(&answer, &name("www.EXAMPLE.com"));
        assert_eq!(
            got,
            vec![
                ("192.0.2.1".parse().unwrap(), 5),
                ("2001:db8::1".parse().unwrap(), 7)
            ]
        );
        answer.metadata.response_code = ResponseCode::ServFail;
        assert!(answered_addresses(&answer, &name("www.example.com")).is_empty());
    }

    #[test]
    fn ttls_over_the_ceiling_are_cut() {
        let mut answer = Message::response(7, OpCode::Query);
        let a = |ttl| {
            Record::from_rdata(
                Name::from_utf8("a.test.").unwrap(),
                ttl,
                RData::A(A("192.0.2.1".parse().unwrap())),
            )
        };
        answer.answers = vec![a(30), a(7200)];
        assert!(cap_ttls(&mut answer, 3600));
        assert_eq!(answer.answers[1].ttl, 3600);
        assert_eq!(answer.answers[0].ttl, 30);
        assert!(!cap_ttls(&mut answer, 3600), "nothing more to cut");
    }
}
