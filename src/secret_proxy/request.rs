//! The requests of a terminated connection (`connection`), over HTTP/1.1
//! (every request of a kept-alive connection) or HTTP/2 (every stream),
//! each sent upstream on the connection dialled for it, as it came but for
//! the secrets put in:
//!
//! - its host (HTTP/1.1 `Host`, HTTP/2 `:authority`) must be the server
//!   name the connection was made for; else 421, nothing sent upstream;
//! - CONNECT and `Upgrade` (WebSocket and the like) are refused with 501:
//!   another protocol would carry bytes no one reads for placeholders;
//! - each `{{secret:NAME}}` in a header value is replaced by the value of
//!   NAME when a secret rule of the VM's lets NAME go to this host and the
//!   secret is set; else the request is refused with 403 saying which and
//!   why, and nothing is sent upstream. Placeholders in the request line
//!   (path, query) and the body are never replaced: they go on as written.
//!
//! A header a secret went into is marked sensitive (HTTP/2: never indexed
//! by HPACK). Each secret put in is recorded (VM, host, name: never the
//! value), and so is each refusal.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderValue, UPGRADE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::grants;
use super::placeholder;
use super::replayed::Replayed;
use super::{Proxy, Record};
use crate::types::InterfaceId;

/// A request head the guest takes longer than this to send ends its
/// connection (HTTP/1.1).
const HEAD_WAIT: Duration = Duration::from_secs(30);

/// The protocol both sides of a terminated connection speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

impl Protocol {
    pub fn alpn(self) -> &'static [u8] {
        match self {
            Protocol::Http1 => b"http/1.1",
            Protocol::Http2 => b"h2",
        }
    }
}

/// Both ends of a terminated connection.
pub struct Exchange {
    pub guest: tokio_rustls::server::TlsStream<Replayed>,
    pub upstream: tokio_rustls::client::TlsStream<TcpStream>,
}

type Body = BoxBody<Bytes, hyper::Error>;

/// What one request is judged and sent by.
struct Context {
    proxy: Arc<Proxy>,
    interface_id: InterfaceId,
    /// The server name the connection was made for (lower case).
    host: String,
}

/// Serves the guest's requests until either side ends the connection.
pub async fn serve(
    exchange: Exchange,
    protocol: Protocol,
    proxy: Arc<Proxy>,
    interface_id: InterfaceId,
    host: String,
) {
    let context = Arc::new(Context {
        proxy,
        interface_id,
        host,
    });
    let guest = TokioIo::new(exchange.guest);
    let upstream = TokioIo::new(exchange.upstream);
    match protocol {
        Protocol::Http1 => {
            let Ok((sender, connection)) = hyper::client::conn::http1::handshake(upstream).await
            else {
                return;
            };
            tokio::spawn(connection);
            let sender = Arc::new(Mutex::new(sender));
            let service = service_fn(move |req: Request<Incoming>| {
                let (context, sender) = (context.clone(), sender.clone());
                async move {
                    let req = match judged(&context, req) {
                        Ok(req) => req,
                        Err(refused) => return Ok::<_, Infallible>(*refused),
                    };
                    let mut sender = sender.lock().await;
                    let sent = match sender.ready().await {
                        Ok(()) => sender.send_request(req).await,
                        Err(e) => Err(e),
                    };
                    Ok(answered(&context, sent))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_WAIT)
                .serve_connection(guest, service)
                .await;
        }
        Protocol::Http2 => {
            let Ok((sender, connection)) =
                hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .handshake(upstream)
                    .await
            else {
                return;
            };
            tokio::spawn(connection);
            let service = service_fn(move |req: Request<Incoming>| {
                let (context, mut sender) = (context.clone(), sender.clone());
                async move {
                    let req = match judged(&context, req) {
                        Ok(req) => req,
                        Err(refused) => return Ok::<_, Infallible>(*refused),
                    };
                    Ok(answered(&context, sender.send_request(req).await))
                }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .serve_connection(guest, service)
                .await;
        }
    }
}

/// `req` as it goes upstream, secrets put in; or the answer that refuses
/// it.
fn judged(
    context: &Context,
    mut req: Request<Incoming>,
) -> Result<Request<Incoming>, Box<Response<Body>>> {
    let refuse = |status: StatusCode, why: String| {
        context.proxy.record(Record::Refused {
            interface_id: context.interface_id,
            host: context.host.clone(),
            why: why.clone(),
        });
        Err(Box::new(local(status, &why)))
    };
    if let Some(other) = misdirected(&req, &context.host) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "its host ({other}) is not {}, the server name its connection was made for",
                context.host
            ),
        );
    }
    if req.method() == Method::CONNECT || req.headers().contains_key(UPGRADE) {
        return refuse(
            StatusCode::NOT_IMPLEMENTED,
            "CONNECT and Upgrade are refused on a connection linnet reads for secrets".into(),
        );
    }
    if !req
        .headers()
        .values()
        .any(|v| placeholder::mentions(v.as_bytes()))
    {
        return Ok(req);
    }
    let Some(grants) = context.proxy.grants_of(context.interface_id) else {
        return refuse(StatusCode::FORBIDDEN, "its VM is gone".into());
    };
    let host = grants::host_name(&context.host).expect("a server name rustls took");
    let mut used: Vec<String> = Vec::new();
    for value in req.headers_mut().values_mut() {
        if !placeholder::mentions(value.as_bytes()) {
            continue;
        }
        for name in placeholder::names(value.as_bytes()) {
            if let Err(unusable) = grants::value_for(&grants, &host, name) {
                return refuse(StatusCode::FORBIDDEN, unusable.why(name, &context.host));
            }
            if !used.iter().any(|u| u == name) {
                used.push(name.to_string());
            }
        }
        let filled = placeholder::replaced(value.as_bytes(), |name| {
            grants::value_for(&grants, &host, name)
                .map(|v| v.expose())
                .expect("judged above")
        });
        // A value is checked when set for what a header may not carry,
        // so this holds; refused, not sent, if it ever did not.
        let Ok(mut filled) = HeaderValue::from_bytes(&filled) else {
            return refuse(
                StatusCode::FORBIDDEN,
                "a secret's value cannot go into this header".into(),
            );
        };
        filled.set_sensitive(true);
        *value = filled;
    }
    for secret in used {
        context.proxy.record(Record::Substituted {
            interface_id: context.interface_id,
            host: context.host.clone(),
            secret,
        });
    }
    Ok(req)
}

/// The upstream's answer, or 502 saying it gave none.
fn answered(context: &Context, sent: Result<Response<Incoming>, hyper::Error>) -> Response<Body> {
    match sent {
        Ok(response) => response.map(BodyExt::boxed),
        Err(e) => {
            let why = format!("the upstream for {}: {e}", context.host);
            context.proxy.record(Record::Refused {
                interface_id: context.interface_id,
                host: context.host.clone(),
                why: why.clone(),
            });
            local(StatusCode::BAD_GATEWAY, &why)
        }
    }
}

/// An answer of linnet's own: the status and why, as text.
fn local(status: StatusCode, why: &str) -> Response<Body> {
    let body = Full::new(Bytes::from(format!("linnet: {why}\n")))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The host `req` names that is not `server_name` ("none" when it names
/// none); None when every one it names is. A request may name its host
/// in its target (HTTP/1.1's absolute form, HTTP/2's `:authority`) and in
/// `Host`; servers differ in which they believe, so each must be the
/// server name, and `Host` may be given once.
fn misdirected(req: &Request<Incoming>, server_name: &str) -> Option<String> {
    let target = req.uri().authority().map(|a| a.as_str());
    let hosts: Vec<&HeaderValue> = req.headers().get_all(HOST).iter().collect();
    if hosts.len() > 1 {
        return Some(format!("{} Host headers", hosts.len()));
    }
    let host = match hosts.first() {
        Some(value) => Some(value.to_str().unwrap_or("an unreadable Host")),
        None => None,
    };
    if target.is_none() && host.is_none() {
        return Some("none".into());
    }
    target
        .into_iter()
        .chain(host)
        .find(|asked| !same_host(asked, server_name))
        .map(str::to_string)
}

/// Whether a request's host (`name` or `name:443`, any case, a trailing
/// dot or none) is `server_name`.
fn same_host(asked: &str, server_name: &str) -> bool {
    let name = match asked.rsplit_once(':') {
        Some((name, "443")) => name,
        Some(_) => return false,
        None => asked,
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case(server_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_host_is_its_connections_server_name_or_not_at_all() {
        assert!(same_host("api.example", "api.example"));
        assert!(same_host("API.Example.:443", "api.example"));
        assert!(!same_host("api.example:8443", "api.example"));
        assert!(!same_host("other.example", "api.example"));
        assert!(!same_host("api.example.evil", "api.example"));
        assert!(!same_host("[::1]:443", "api.example"));
    }
}
