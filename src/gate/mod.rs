//! The name check's own part, what `linnet-gate` runs (docs/architecture.md,
//! "The name check"): the name a connection shows in its first bytes, the
//! server name of a TLS ClientHello (`hello`) or the Host of an HTTP/1.x
//! request head (`http`), read here (`shown`); the connections held until
//! they show one (`held`); what each VM may reach and learned (`vms`);
//! what the gate and the daemon say to each other (`wire`); and the loop
//! that serves the daemon (`process`). A connection passes only when the
//! name it shows is one its VM may reach, at an address it learned for
//! that name. Plain data and functions, but `process`'s loop: the daemon
//! holds the queue (`daemon::gatekeeper`).

pub mod held;
pub mod hello;
pub mod http;
pub mod process;
pub mod vms;
pub mod wire;

use self::hello::Hello;
use self::http::Head;

/// The most of a stream read for its name (16 KiB: a ClientHello with a
/// post-quantum key share is about 1.8 KiB; a request head rarely 8).
pub const MAX_BYTES: usize = 16 << 10;

/// What a connection's first bytes show.
#[derive(Debug, PartialEq, Eq)]
pub enum Shown<'a> {
    /// Not enough yet to tell.
    More,
    /// This name (a TLS server name or an HTTP host, as sent).
    Name(&'a str),
    /// TLS without a server name, or HTTP without a Host.
    Nameless,
    /// Neither TLS nor HTTP/1.x.
    Neither,
    /// TLS or HTTP that breaks its format, or shows nothing in
    /// `MAX_BYTES`; why.
    Malformed(&'static str),
}

/// Reads `stream`, the first bytes a client sent on a connection;
/// `scratch` gathers a ClientHello that spans records.
pub fn shown<'a>(stream: &'a [u8], scratch: &'a mut Vec<u8>) -> Shown<'a> {
    let stream = &stream[..stream.len().min(MAX_BYTES)];
    let more = || {
        if stream.len() >= MAX_BYTES {
            Shown::Malformed("no name in its first 16 KiB")
        } else {
            Shown::More
        }
    };
    match hello::client_hello(stream, scratch) {
        Hello::NotTls => {}
        Hello::More => return more(),
        Hello::Name(Some(name)) => return Shown::Name(name),
        Hello::Name(None) => return Shown::Nameless,
        Hello::Malformed(why) => return Shown::Malformed(why),
    }
    match http::request_head(stream) {
        Head::NotHttp => Shown::Neither,
        Head::More => more(),
        Head::Host(Some(host)) => Shown::Name(host),
        Head::Host(None) => Shown::Nameless,
        Head::Malformed(why) => Shown::Malformed(why),
    }
}

#[cfg(test)]
mod tests {
    use super::hello::tests::{hello, records};
    use super::*;

    fn read(stream: &[u8]) -> Shown<'_> {
        let scratch = Box::leak(Box::new(Vec::new()));
        shown(stream, scratch)
    }

    #[test]
    fn tls_and_http_name_a_host_and_anything_else_names_nothing() {
        let tls = records(&hello(Some("api.example.com"), 2000), 1200);
        assert_eq!(read(&tls), Shown::Name("api.example.com"));
        assert_eq!(read(&records(&hello(None, 0), 1 << 14)), Shown::Nameless);
        assert_eq!(
            read(b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n"),
            Shown::Name("api.example.com")
        );
        assert_eq!(read(b"GET / HTTP/1.0\r\n\r\n"), Shown::Nameless);
        assert_eq!(read(b"SSH-2.0-OpenSSH_9.2\r\n"), Shown::Neither);
        assert_eq!(read(&[0u8; 64]), Shown::Neither);
        assert_eq!(read(b"GET / HTTP/1.1\r\nX: y\r\n"), Shown::More);
    }

    #[test]
    fn a_stream_that_names_nothing_in_16_kib_is_refused() {
        let mut slow = b"GET / HTTP/1.1\r\n".to_vec();
        while slow.len() < MAX_BYTES {
            slow.extend(b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert_eq!(read(&slow[..MAX_BYTES - 1]), Shown::More);
        assert_eq!(read(&slow), Shown::Malformed("no name in its first 16 KiB"));
    }
}
