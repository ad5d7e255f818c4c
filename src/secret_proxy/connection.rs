//! One connection a VM opened to port 443 of an address learned for a host
//! of its secret rules, steered here at its SYN. Its ClientHello decides:
//!
//! - a server name the VM may not reach at that address (the gate's own
//!   judgement, `gate::vms`), or no TLS: reset, and recorded;
//! - a name no secret rule of the VM's names: spliced to where the VM
//!   sent it, bytes unchanged, never decrypted (the guest sees the
//!   upstream's own certificate);
//! - a name a secret rule names: the upstream is dialled first, with the
//!   guest's ALPN offer, and its certificate checked for that name against
//!   the host's trust store; only then is the guest's handshake completed,
//!   with a leaf certificate of the network's CA and the protocol the
//!   upstream chose. Each request then goes upstream as it came, but for
//!   its placeholders (`request`).
//!
//! An upstream whose certificate is not valid for the name, or that cannot
//! be reached, ends the guest's handshake unfinished: the guest never sends
//! a request, so never a placeholder, to a server not proven to be its
//! host.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::ServerName;
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use super::replayed::Replayed;
use super::request::{self, Exchange, Protocol};
use super::{Proxy, Record};
use crate::gate::hello::{self, Hello};
use crate::gate::vms::Refusal;
use crate::gate::wire::Judgement;

/// How long a connection may take to show its ClientHello, and the
/// upstream to answer.
const HELLO_WAIT: Duration = Duration::from_secs(5);
const UPSTREAM_WAIT: Duration = Duration::from_secs(10);

/// Serves one connection from `source` that was bound for `destination`.
pub async fn serve(
    proxy: Arc<Proxy>,
    mut stream: TcpStream,
    source: SocketAddr,
    destination: SocketAddr,
) {
    let mut judged = Judgement {
        interface_id: crate::types::InterfaceId::nil(),
        source: source.ip(),
        source_port: source.port(),
        destination: destination.ip(),
        port: destination.port(),
        shown: None,
        allowed: false,
        why: None,
    };
    let (interface_id, _slot) = match proxy.admit(source) {
        Ok(admitted) => admitted,
        Err((interface_id, refusal)) => {
            judged.interface_id = interface_id.unwrap_or_default();
            judged.why = Some(refusal.why().into());
            return refuse(&proxy, stream, judged);
        }
    };
    judged.interface_id = interface_id;
    // A handshake's flights go out whole, not held for the guest's ACKs.
    let _ = stream.set_nodelay(true);
    let mut head = Vec::with_capacity(2048);
    let name = match tokio::time::timeout(HELLO_WAIT, read_hello(&mut stream, &mut head)).await {
        Ok(Ok(name)) => name,
        Ok(Err(refusal)) => {
            judged.why = Some(refusal.why().into());
            return refuse(&proxy, stream, judged);
        }
        Err(_) => {
            judged.why = Some(Refusal::TooSlow.why().into());
            return refuse(&proxy, stream, judged);
        }
    };
    judged.shown = Some(name.clone());
    let intercept = match proxy.judge(interface_id, source, destination, &name) {
        Ok(intercept) => intercept,
        Err(refusal) => {
            judged.why = Some(refusal.why().into());
            return refuse(&proxy, stream, judged);
        }
    };
    judged.allowed = true;
    if !intercept {
        proxy.record(Record::Connection {
            judgement: judged,
            terminated: false,
        });
        return splice(stream, &head, destination).await;
    }
    let replayed = Replayed::new(head, stream);
    match terminate(&proxy, replayed, &name, destination).await {
        Ok((exchange, protocol)) => {
            proxy.record(Record::Connection {
                judgement: judged,
                terminated: true,
            });
            request::serve(exchange, protocol, proxy.clone(), interface_id, name).await;
        }
        Err(why) => {
            judged.allowed = false;
            judged.why = Some(why);
            proxy.record(Record::Connection {
                judgement: judged,
                terminated: false,
            });
        }
    }
}

/// Reads the ClientHello into `head`; the server name it shows.
async fn read_hello(stream: &mut TcpStream, head: &mut Vec<u8>) -> Result<String, Refusal> {
    let mut scratch = Vec::new();
    loop {
        match hello::client_hello(head, &mut scratch) {
            Hello::More => {}
            Hello::Name(Some(name)) => return Ok(name.to_ascii_lowercase()),
            Hello::Name(None) => return Err(Refusal::Nameless),
            Hello::NotTls => return Err(Refusal::Neither),
            Hello::Malformed(why) => return Err(Refusal::Malformed(why)),
        }
        if head.len() >= crate::gate::MAX_BYTES {
            return Err(Refusal::Malformed("no name in its first 16 KiB"));
        }
        let room = crate::gate::MAX_BYTES - head.len();
        let mut chunk = vec![0; room.min(4096)];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                return Err(Refusal::Malformed("it ended before its ClientHello did"));
            }
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Records a refused connection and resets it.
fn refuse(proxy: &Proxy, stream: TcpStream, judgement: Judgement) {
    proxy.record(Record::Connection {
        judgement,
        terminated: false,
    });
    reset(&stream);
}

/// Makes the close of `stream` a reset, as the gate's refusals are
/// (SO_LINGER 0: the kernel sends RST at once, never blocking).
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Carries the connection on to `destination` as it is.
async fn splice(mut stream: TcpStream, head: &[u8], destination: SocketAddr) {
    let Ok(Ok(mut upstream)) =
        tokio::time::timeout(UPSTREAM_WAIT, TcpStream::connect(destination)).await
    else {
        return reset(&stream);
    };
    let _ = upstream.set_nodelay(true);
    if upstream.write_all(head).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
    }
}

/// The upstream dialled and checked, then the guest's handshake finished
/// with the protocol the upstream chose.
async fn terminate(
    proxy: &Proxy,
    replayed: Replayed,
    name: &str,
    destination: SocketAddr,
) -> Result<(Exchange, Protocol), String> {
    let start = tokio::time::timeout(
        HELLO_WAIT,
        LazyConfigAcceptor::new(Acceptor::default(), replayed),
    )
    .await
    .map_err(|_| "its ClientHello did not come whole".to_string())?
    .map_err(|e| format!("its ClientHello: {e}"))?;
    let offered = offered(&start.client_hello())?;
    let server_name = ServerName::try_from(name.to_string())
        .map_err(|_| format!("\"{name}\" is not a server name"))?;
    let mut config = (*proxy.upstream).clone();
    config.alpn_protocols = offered.clone();
    let upstream = tokio::time::timeout(UPSTREAM_WAIT, async {
        let tcp = TcpStream::connect(destination)
            .await
            .map_err(|e| format!("the upstream {destination}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("the upstream {destination} for {name}: {e}"))
    })
    .await
    .map_err(|_| format!("the upstream {destination} did not answer in time"))??;
    let protocol = match upstream.get_ref().1.alpn_protocol() {
        Some(b"h2") => Protocol::Http2,
        _ => Protocol::Http1,
    };
    let leaf = proxy
        .ca
        .leaf(name, SystemTime::now())
        .map_err(|e| e.to_string())?;
    let mut server = rustls::ServerConfig::builder_with_provider(proxy.provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Leaf(leaf)));
    if !offered.is_empty() {
        server.alpn_protocols = vec![protocol.alpn().to_vec()];
    }
    let guest = start
        .into_stream(Arc::new(server))
        .await
        .map_err(|e| format!("the guest's handshake: {e}"))?;
    Ok((Exchange { guest, upstream }, protocol))
}

/// The protocols the guest offers that the proxy speaks: HTTP/2 and
/// HTTP/1.1 (none offered: HTTP/1.1). An offer of others alone is refused.
fn offered(hello: &ClientHello<'_>) -> Result<Vec<Vec<u8>>, String> {
    let Some(alpn) = hello.alpn() else {
        return Ok(Vec::new());
    };
    let all: Vec<&[u8]> = alpn.collect();
    let ours: Vec<Vec<u8>> = all
        .iter()
        .filter(|p| [Protocol::Http2.alpn(), Protocol::Http1.alpn()].contains(p))
        .map(|p| p.to_vec())
        .collect();
    if ours.is_empty() && !all.is_empty() {
        return Err(
            "it offers neither HTTP/2 nor HTTP/1.1 (ALPN), the protocols a secret goes over".into(),
        );
    }
    Ok(ours)
}

/// The one certificate shown to the guest.
#[derive(Debug)]
struct Leaf(Arc<CertifiedKey>);

impl ResolvesServerCert for Leaf {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}
