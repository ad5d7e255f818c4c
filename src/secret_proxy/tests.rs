//! The proxy whole, on loopback: a guest's TLS client, the proxy, and an
//! upstream serving `api.example` and `other.example` on one address,
//! which records the headers it receives and echoes none of them.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::ca::{Ca, CaFiles};
use super::grants::Grant;
use super::{ProxiedVm, Proxy, Record};
use crate::gate::wire::GatedVm;
use crate::secrets::SecretValue;
use crate::types::InterfaceId;

const SECRET: &str = "s3cret-value-1";
const ROTATED: &str = "s3cret-value-2";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(files: &CaFiles) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(files.cert_pem.as_bytes()).unwrap())
        .unwrap();
    roots
}

/// What the upstream received: per request, its host and Authorization.
/// Every request's query must come as the guest wrote it, placeholder and
/// all (else the upstream drops the request, and the guest's unwrap fails).
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

#[derive(Debug)]
struct BySni(Ca);

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.leaf(hello.server_name()?, SystemTime::now()).ok()
    }
}

/// An upstream under its own CA, speaking HTTP/2 and HTTP/1.1.
async fn upstream(ca: &CaFiles) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(BySni(Ca::new("upstream", ca).unwrap())));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let seen: Seen = Arc::default();
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                let service = hyper::service::service_fn(move |req: Request<_>| {
                    let host = match req.uri().authority() {
                        Some(a) => a.to_string(),
                        None => req.headers()["host"].to_str().unwrap().to_string(),
                    };
                    let auth = (req.headers().get("authorization"))
                        .map(|v| v.to_str().unwrap().to_string());
                    let query = req.uri().query().unwrap_or("").to_string();
                    assert_eq!(query, "key={{secret:TOKEN}}", "a query is never rewritten");
                    seen.lock().unwrap().push((host, auth));
                    async {
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"hello from upstream"),
                        )))
                    }
                });
                let io = TokioIo::new(tls);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                }
            });
        }
    });
    (addr, kept)
}

struct World {
    proxy: Arc<Proxy>,
    proxy_addr: SocketAddr,
    network_ca: CaFiles,
    upstream_ca: CaFiles,
    seen: Seen,
    records: mpsc::Receiver<Record>,
    id: InterfaceId,
}

fn vm(id: InterfaceId, port: u16, token: Option<&str>) -> ProxiedVm {
    let egress = [
        format!("api.example:{port}"),
        format!("other.example:{port}"),
    ];
    ProxiedVm {
        vm: GatedVm {
            interface_id: id,
            addrs: vec!["127.0.0.1".parse().unwrap()],
            policy: crate::policy::Policy {
                egress: egress.iter().map(|r| r.parse().unwrap()).collect(),
                ..Default::default()
            },
        },
        grants: vec![Grant {
            rule: "TOKEN@api.example".parse().unwrap(),
            value: token.map(|t| SecretValue::new(t.into()).unwrap()),
        }],
    }
}

/// The world; `trusted`: whether the proxy trusts the upstream's CA.
async fn world(trusted: bool) -> World {
    let now = SystemTime::now();
    let network_ca = CaFiles::make("sandbox", now).unwrap();
    let upstream_ca = CaFiles::make("upstream", now).unwrap();
    let (upstream_addr, seen) = upstream(&upstream_ca).await;
    let trust_ca = match trusted {
        true => upstream_ca.clone(),
        false => CaFiles::make("someone else", now).unwrap(),
    };
    let client = super::trust::client_config(provider(), &[trust_ca.cert_pem.as_bytes()]).unwrap();
    let (sender, records) = mpsc::channel(super::MAX_RECORDS);
    let mut proxy = Proxy::new(
        Ca::new("sandbox", &network_ca).unwrap(),
        client,
        provider(),
        sender,
    );
    proxy.port = upstream_addr.port();
    let proxy = Arc::new(proxy);
    let id = InterfaceId::new_v4();
    proxy.set_vms(vec![vm(id, upstream_addr.port(), Some(SECRET))]);
    for name in ["api.example", "other.example"] {
        proxy.learned(id, name, &[(upstream_addr.ip(), 60)]);
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = listener.local_addr().unwrap();
    let serving = proxy.clone();
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            // Steered here from `upstream_addr` (what SO_ORIGINAL_DST says).
            tokio::spawn(super::connection::serve(
                serving.clone(),
                stream,
                peer,
                upstream_addr,
            ));
        }
    });
    World {
        proxy,
        proxy_addr,
        network_ca,
        upstream_ca,
        seen,
        records,
        id,
    }
}

/// A guest's TLS connection for `sni`, trusting `ca`, offering `alpn`.
async fn guest_tls(
    w: &World,
    sni: &str,
    ca: &CaFiles,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(w.proxy_addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(sni.to_string()).unwrap(), tcp)
        .await
}

/// Sends GETs with `headers` over HTTP/1.1 on one connection, or HTTP/2;
/// each answer's status and body.
async fn requests(
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    each: Vec<Vec<(&'static str, String)>>,
) -> Vec<(u16, String)> {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let mut out = Vec::new();
    if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        for headers in each {
            out.push(send(&mut sender, headers, true).await);
        }
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        for headers in each {
            sender.ready().await.unwrap();
            out.push(send(&mut sender, headers, false).await);
        }
    }
    out
}

trait Sender {
    fn send(
        &mut self,
        req: Request<Empty<Bytes>>,
    ) -> impl Future<Output = hyper::Result<Response<hyper::body::Incoming>>>;
}

impl Sender for hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    fn send(
        &mut self,
        req: Request<Empty<Bytes>>,
    ) -> impl Future<Output = hyper::Result<Response<hyper::body::Incoming>>> {
        self.send_request(req)
    }
}

impl Sender for hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    fn send(
        &mut self,
        req: Request<Empty<Bytes>>,
    ) -> impl Future<Output = hyper::Result<Response<hyper::body::Incoming>>> {
        self.send_request(req)
    }
}

async fn send(
    sender: &mut impl Sender,
    headers: Vec<(&'static str, String)>,
    h2: bool,
) -> (u16, String) {
    let host = headers
        .iter()
        .find(|(k, _)| *k == "host")
        .map(|(_, v)| v.clone())
        .unwrap();
    let mut req = Request::builder();
    req = if h2 {
        req.uri(format!("https://{host}/v1/models?key={{{{secret:TOKEN}}}}"))
    } else {
        req.uri("/v1/models?key={{secret:TOKEN}}")
    };
    for (k, v) in headers {
        if !(h2 && k == "host") {
            req = req.header(k, v);
        }
    }
    let response = sender.send(req.body(Empty::new()).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn bearer(host: &str) -> Vec<(&'static str, String)> {
    vec![
        ("host", host.to_string()),
        ("authorization", "Bearer {{secret:TOKEN}}".to_string()),
    ]
}

fn drain(records: &mut mpsc::Receiver<Record>) -> Vec<Record> {
    let mut out = Vec::new();
    while let Ok(r) = records.try_recv() {
        out.push(r);
    }
    out
}

#[tokio::test]
async fn a_placeholder_becomes_the_secret_over_http1_and_http2_and_nowhere_else() {
    let mut w = world(true).await;
    for alpn in [&[&b"http/1.1"[..]][..], &[b"h2", b"http/1.1"]] {
        let tls = guest_tls(&w, "api.example", &w.network_ca, alpn)
            .await
            .expect("the guest trusts its network's CA");
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        assert_eq!(h2, alpn.len() == 2, "the upstream's choice, passed on");
        // Two requests on one connection; the secret is rotated between.
        let first = requests(tls, vec![bearer("api.example")]).await;
        assert_eq!(first, [(200, "hello from upstream".into())]);
        w.proxy.set_vms(vec![vm(w.id, w.proxy.port, Some(ROTATED))]);
        let tls = guest_tls(&w, "api.example", &w.network_ca, alpn)
            .await
            .unwrap();
        let answers = requests(tls, vec![bearer("api.example"), bearer("api.example")]).await;
        assert!(answers.iter().all(|a| a.0 == 200), "{answers:?}");
        let seen: Vec<_> = w.seen.lock().unwrap().drain(..).collect();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0].1.as_deref(), Some(&*format!("Bearer {SECRET}")));
        assert_eq!(seen[1].1.as_deref(), Some(&*format!("Bearer {ROTATED}")));
        assert_eq!(seen[2].1.as_deref(), Some(&*format!("Bearer {ROTATED}")));
        w.proxy.set_vms(vec![vm(w.id, w.proxy.port, Some(SECRET))]);
        let records = drain(&mut w.records);
        let substituted = records
            .iter()
            .filter(|r| matches!(r, Record::Substituted { secret, host, .. } if secret == "TOKEN" && host == "api.example"))
            .count();
        assert_eq!(substituted, 3, "{records:?}");
        let text = serde_json::to_string(&records).unwrap();
        assert!(!text.contains(SECRET) && !text.contains(ROTATED), "{text}");
        assert!(text.contains(r#""terminated":true"#), "{text}");
    }
}

#[tokio::test]
async fn the_secret_is_not_sent_to_another_host_nor_past_a_refusal() {
    let mut w = world(true).await;
    // The Host differs from the server name: refused, nothing sent.
    let tls = guest_tls(&w, "api.example", &w.network_ca, &[b"http/1.1"])
        .await
        .unwrap();
    let answers = requests(tls, vec![bearer("other.example"), bearer("api.example")]).await;
    assert_eq!(answers[0].0, 421, "{answers:?}");
    assert!(
        answers[0]
            .1
            .contains("its host (other.example) is not api.example")
    );
    assert_eq!(
        answers[1].0, 200,
        "the same connection's next request, as it should"
    );
    // A secret with no rule for this host, and one not set.
    let no_rule = vec![
        ("host", "api.example".to_string()),
        ("x-api-key", "{{secret:OTHER}}".to_string()),
    ];
    let tls = guest_tls(&w, "api.example", &w.network_ca, &[b"h2"])
        .await
        .unwrap();
    let answers = requests(tls, vec![no_rule]).await;
    assert_eq!(answers[0].0, 403);
    assert!(
        answers[0]
            .1
            .contains("no secret rule of this VM lets the secret OTHER go to api.example")
    );
    w.proxy.set_vms(vec![vm(w.id, w.proxy.port, None)]);
    let tls = guest_tls(&w, "api.example", &w.network_ca, &[b"h2"])
        .await
        .unwrap();
    let answers = requests(tls, vec![bearer("api.example")]).await;
    assert_eq!(answers[0].0, 403);
    assert!(
        answers[0].1.contains("the secret TOKEN is not set"),
        "{answers:?}"
    );
    let seen: Vec<_> = w.seen.lock().unwrap().drain(..).collect();
    assert_eq!(
        seen,
        [("api.example".to_string(), Some(format!("Bearer {SECRET}")))],
        "only the control request reached the upstream"
    );
    // other.example is no secret rule's: spliced, never decrypted. The
    // guest sees the upstream's own certificate, and the placeholder goes
    // on as it wrote it.
    w.proxy.set_vms(vec![vm(w.id, w.proxy.port, Some(SECRET))]);
    assert!(
        guest_tls(&w, "other.example", &w.network_ca, &[b"h2"])
            .await
            .is_err(),
        "the network's CA does not vouch for a spliced connection"
    );
    let tls = guest_tls(&w, "other.example", &w.upstream_ca, &[b"h2"])
        .await
        .expect("the upstream's own certificate");
    let answers = requests(tls, vec![bearer("other.example")]).await;
    assert_eq!(answers[0].0, 200);
    let seen: Vec<_> = w.seen.lock().unwrap().drain(..).collect();
    assert_eq!(
        seen,
        [(
            "other.example".to_string(),
            Some("Bearer {{secret:TOKEN}}".to_string())
        )]
    );
    let records = drain(&mut w.records);
    assert!(
        records.iter().any(|r| matches!(r, Record::Connection { judgement, terminated: false } if judgement.allowed && judgement.shown.as_deref() == Some("other.example"))),
        "{records:?}"
    );
    assert!(
        !records
            .iter()
            .any(|r| matches!(r, Record::Substituted { host, .. } if host == "other.example")),
        "{records:?}"
    );
}

/// One request written by hand over a guest's HTTP/1.1 connection for
/// api.example: the answer's status line.
async fn by_hand(w: &World, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = guest_tls(w, "api.example", &w.network_ca, &[b"http/1.1"])
        .await
        .unwrap();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = vec![0; 4096];
    let n = tls.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    answer.lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn every_host_a_request_names_must_be_the_server_name() {
    let w = world(true).await;
    let auth = "Authorization: Bearer {{secret:TOKEN}}\r\n";
    // The control: a request naming its host the one way and the other.
    let fine = by_hand(
        &w,
        &format!(
            "GET /v1/models?key={{{{secret:TOKEN}}}} HTTP/1.1\r\nHost: api.example\r\n{auth}\r\n"
        ),
    )
    .await;
    assert!(fine.contains(" 200 "), "{fine}");
    // Absolute form naming another host (a shared server may believe it
    // over Host), two Host headers, none at all: refused, nothing sent.
    for request in [
        format!(
            "GET https://other.example/v1/models?key={{{{secret:TOKEN}}}} HTTP/1.1\r\nHost: api.example\r\n{auth}\r\n"
        ),
        format!(
            "GET /v1/models?key={{{{secret:TOKEN}}}} HTTP/1.1\r\nHost: api.example\r\nHost: other.example\r\n{auth}\r\n"
        ),
        format!("GET /v1/models?key={{{{secret:TOKEN}}}} HTTP/1.0\r\n{auth}\r\n"),
    ] {
        let status = by_hand(&w, &request).await;
        assert!(
            status.contains(" 421 ") || status.contains(" 400 "),
            "{request:?}: {status}"
        );
    }
    let seen: Vec<_> = w.seen.lock().unwrap().drain(..).collect();
    assert_eq!(
        seen.len(),
        1,
        "the control alone reached the upstream: {seen:?}"
    );
}

#[tokio::test]
async fn an_upstream_not_proven_to_be_the_host_gets_no_request_and_a_name_not_allowed_is_reset() {
    let mut w = world(false).await;
    // The proxy does not trust the upstream's CA: the guest's handshake
    // is never finished, so it sends nothing.
    let refused = guest_tls(&w, "api.example", &w.network_ca, &[b"h2"]).await;
    assert!(refused.is_err(), "no handshake with an unproven upstream");
    assert!(w.seen.lock().unwrap().is_empty());
    let records = drain(&mut w.records);
    assert!(
        records.iter().any(|r| matches!(r, Record::Connection { judgement, .. } if !judgement.allowed && judgement.why.as_deref().is_some_and(|w| w.contains("for api.example")))),
        "{records:?}"
    );
    // A name the VM may not reach: reset at its hello, as the gate does.
    let refused = guest_tls(&w, "evil.example", &w.upstream_ca, &[b"h2"]).await;
    assert!(refused.is_err());
    let records = drain(&mut w.records);
    assert!(
        records.iter().any(|r| matches!(r, Record::Connection { judgement, .. } if !judgement.allowed && judgement.shown.as_deref() == Some("evil.example"))),
        "{records:?}"
    );
    // The control: the spliced name still passes through this proxy.
    guest_tls(&w, "other.example", &w.upstream_ca, &[b"h2"])
        .await
        .expect("an allowed name is spliced");
}
