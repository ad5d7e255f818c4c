//! The server name a TLS ClientHello shows (RFC 8446 4.1.2, the
//! server_name extension of RFC 6066 3), read from the first bytes of a TCP
//! stream: the handshake may span several records (RFC 8446 5.1: a
//! post-quantum key share makes a ClientHello larger than one segment) and
//! each record several segments. Parsed from the bytes so far, again as
//! more come, with no state between: the caller bounds how many it keeps.
//!
//! With Encrypted Client Hello the server name here is the outer one (the
//! client-facing server's); the inner one is encrypted and not seen.
//! Whatever breaks the format, or says a name twice, is `Malformed`: a
//! connection that shows it is refused, never let through as nameless.

/// What the bytes so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello<'a> {
    /// Not a TLS handshake (its first byte is not a handshake record's).
    NotTls,
    /// A ClientHello, maybe, that is not whole yet.
    More,
    /// A whole ClientHello, and the host name of its server_name
    /// extension (None: it has none).
    Name(Option<&'a str>),
    /// A handshake that breaks the format; why.
    Malformed(&'static str),
}

const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const RECORD_HEADER: usize = 5;
const MAX_RECORD: usize = 1 << 14;
const SERVER_NAME: u16 = 0;
const HOST_NAME: u8 = 0;

/// Reads `stream`, the first bytes a client sent. A ClientHello in one
/// record is read where it lies; one over several records is gathered
/// into `scratch` first (the name, then, is a slice of `scratch`).
pub fn client_hello<'a>(stream: &'a [u8], scratch: &'a mut Vec<u8>) -> Hello<'a> {
    match stream.first() {
        None => return Hello::More,
        Some(&HANDSHAKE) => {}
        Some(_) => return Hello::NotTls,
    }
    // The records' fragments, until the handshake message is whole.
    let mut at = 0;
    let mut fragments: Vec<&[u8]> = Vec::new();
    let mut gathered = 0usize;
    let mut wanted: Option<usize> = None;
    loop {
        let Some(header) = stream.get(at..at + RECORD_HEADER) else {
            return Hello::More;
        };
        if header[0] != HANDSHAKE {
            return Hello::Malformed("a record other than a handshake before the ClientHello ends");
        }
        if header[1] != 3 {
            return Hello::Malformed("a record version that is not TLS's");
        }
        let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if length == 0 || length > MAX_RECORD {
            return Hello::Malformed("a record length out of range");
        }
        let start = at + RECORD_HEADER;
        let Some(fragment) = stream.get(start..start + length) else {
            return Hello::More;
        };
        fragments.push(fragment);
        gathered += length;
        at = start + length;
        if wanted.is_none() && gathered >= 4 {
            let first = gathered_prefix::<4>(&fragments);
            if first[0] != CLIENT_HELLO {
                return Hello::Malformed("the first handshake message is not a ClientHello");
            }
            wanted = Some(4 + u32::from_be_bytes([0, first[1], first[2], first[3]]) as usize);
        }
        if let Some(total) = wanted
            && gathered >= total
        {
            let message = if fragments.len() == 1 {
                &fragments[0][..total]
            } else {
                scratch.clear();
                for f in &fragments {
                    scratch.extend_from_slice(f);
                }
                scratch.truncate(total);
                &scratch[..]
            };
            return match server_name(&message[4..]) {
                Ok(name) => Hello::Name(name),
                Err(why) => Hello::Malformed(why),
            };
        }
    }
}

/// The first `N` bytes of the fragments, which hold at least that many.
fn gathered_prefix<const N: usize>(fragments: &[&[u8]]) -> [u8; N] {
    let mut out = [0; N];
    for (slot, byte) in out.iter_mut().zip(fragments.iter().flat_map(|f| f.iter())) {
        *slot = *byte;
    }
    out
}

/// A cursor over a message whose every length is checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], &'static str> {
        if self.bytes.len() < n {
            return Err(what);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, &'static str> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, &'static str> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], &'static str> {
        let n = self.u8(what)?;
        self.take(usize::from(n), what)
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], &'static str> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }

    fn done(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The host name of a ClientHello body's server_name extension.
fn server_name(body: &[u8]) -> Result<Option<&str>, &'static str> {
    let mut r = Reader { bytes: body };
    r.take(2 + 32, "a ClientHello cut short before its random")?;
    let session = r.vec8("a session id cut short")?;
    if session.len() > 32 {
        return Err("a session id over 32 bytes");
    }
    let suites = r.vec16("cipher suites cut short")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err("cipher suites of an odd or no length");
    }
    if r.vec8("compression methods cut short")?.is_empty() {
        return Err("no compression method");
    }
    if r.done() {
        // TLS 1.2 and before may send no extensions at all.
        return Ok(None);
    }
    let mut extensions = Reader {
        bytes: r.vec16("extensions cut short")?,
    };
    if !r.done() {
        return Err("bytes after the extensions");
    }
    let mut seen: Vec<u16> = Vec::new();
    let mut name = None;
    while !extensions.done() {
        let kind = extensions.u16("an extension cut short")?;
        let data = extensions.vec16("an extension's data cut short")?;
        if seen.contains(&kind) {
            return Err("an extension given twice");
        }
        seen.push(kind);
        if kind == SERVER_NAME {
            name = Some(host_name(data)?);
        }
    }
    Ok(name)
}

/// The one host_name of a server_name extension (RFC 6066 3: at most one
/// of each name type).
fn host_name(data: &[u8]) -> Result<&str, &'static str> {
    let mut r = Reader { bytes: data };
    let mut list = Reader {
        bytes: r.vec16("a server name list cut short")?,
    };
    if !r.done() {
        return Err("bytes after the server name list");
    }
    let mut found = None;
    while !list.done() {
        let kind = list.u8("a server name cut short")?;
        let name = list.vec16("a server name cut short")?;
        if kind != HOST_NAME {
            continue;
        }
        if found.is_some() {
            return Err("two host names");
        }
        if name.is_empty() {
            return Err("an empty host name");
        }
        let text = std::str::from_utf8(name).map_err(|_| "a host name that is not ASCII")?;
        if !text.is_ascii() {
            return Err("a host name that is not ASCII");
        }
        found = Some(text);
    }
    found.ok_or("a server_name extension without a host name")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello naming `name` (none: no server_name), with `padding`
    /// bytes of another extension (as a large key share would be).
    pub(crate) fn hello(name: Option<&str>, padding: usize) -> Vec<u8> {
        let mut extensions = Vec::new();
        if let Some(name) = name {
            let mut entry = vec![HOST_NAME];
            entry.extend((name.len() as u16).to_be_bytes());
            entry.extend(name.as_bytes());
            let mut list = (entry.len() as u16).to_be_bytes().to_vec();
            list.extend(entry);
            extensions.extend(SERVER_NAME.to_be_bytes());
            extensions.extend((list.len() as u16).to_be_bytes());
            extensions.extend(list);
        }
        extensions.extend(21u16.to_be_bytes()); // padding (RFC 7685)
        extensions.extend((padding as u16).to_be_bytes());
        extensions.extend(std::iter::repeat_n(0, padding));
        let mut body = vec![3, 3];
        body.extend([7; 32]);
        body.push(0); // no session id
        body.extend([0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
        body.extend([1, 0]); // null compression
        body.extend((extensions.len() as u16).to_be_bytes());
        body.extend(extensions);
        let mut message = vec![CLIENT_HELLO];
        message.extend(&(body.len() as u32).to_be_bytes()[1..]);
        message.extend(body);
        message
    }

    /// `message` in handshake records of at most `per_record` bytes.
    pub(crate) fn records(message: &[u8], per_record: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in message.chunks(per_record) {
            out.extend([HANDSHAKE, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    fn read(stream: &[u8]) -> Hello<'_> {
        // A scratch that lives as long as the stream, for the test.
        let scratch = Box::leak(Box::new(Vec::new()));
        client_hello(stream, scratch)
    }

    #[test]
    fn the_server_name_is_read_in_one_record_or_many_and_waited_for_until_whole() {
        let one = records(&hello(Some("api.example.com"), 40), MAX_RECORD);
        assert_eq!(read(&one), Hello::Name(Some("api.example.com")));
        // A ClientHello larger than a segment, in two records, as a
        // post-quantum key share makes it.
        let big = records(&hello(Some("api.example.com"), 1500), 1000);
        assert_eq!(read(&big), Hello::Name(Some("api.example.com")));
        // Every prefix (a segment boundary anywhere) wants more.
        for cut in 0..big.len() {
            assert_eq!(read(&big[..cut]), Hello::More, "cut at {cut}");
        }
        // Bytes after it (the client's next message) change nothing.
        let mut more = one.clone();
        more.extend([23, 3, 3, 0, 1, 0]);
        assert_eq!(read(&more), Hello::Name(Some("api.example.com")));
    }

    #[test]
    fn a_real_clients_hello_is_read() {
        // Written by OpenSSL (Python's ssl) to a listener on loopback.
        let seed = |name: &str| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz/corpus/first_bytes")
                .join(name);
            std::fs::read(path).unwrap()
        };
        assert_eq!(read(&seed("tls_sni")), Hello::Name(Some("api.example.com")));
        assert_eq!(read(&seed("tls_no_sni")), Hello::Name(None));
    }

    #[test]
    fn no_name_not_tls_and_broken_handshakes_are_told_apart() {
        assert_eq!(
            read(&records(&hello(None, 10), MAX_RECORD)),
            Hello::Name(None)
        );
        assert_eq!(read(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(read(b""), Hello::More);
        let mut two_names = hello(Some("a.test"), 0);
        // Append a second server_name extension: a duplicate.
        let ext_len_at = 4 + 2 + 32 + 1 + 4 + 2;
        let extra = {
            let mut e = SERVER_NAME.to_be_bytes().to_vec();
            e.extend([0, 9, 0, 7, HOST_NAME, 0, 4]);
            e.extend(b"b.ts");
            e
        };
        two_names.extend(&extra);
        let len = u16::from_be_bytes([two_names[ext_len_at], two_names[ext_len_at + 1]]) as usize
            + extra.len();
        two_names[ext_len_at..ext_len_at + 2].copy_from_slice(&(len as u16).to_be_bytes());
        let body_len = two_names.len() - 4;
        two_names[1..4].copy_from_slice(&(body_len as u32).to_be_bytes()[1..]);
        assert_eq!(
            read(&records(&two_names, MAX_RECORD)),
            Hello::Malformed("an extension given twice")
        );
        let mut not_hello = hello(Some("a.test"), 0);
        not_hello[0] = 2;
        assert!(matches!(
            read(&records(&not_hello, MAX_RECORD)),
            Hello::Malformed(_)
        ));
        let mut alert = records(&hello(Some("a.test"), 200), 100);
        alert[105] = 21; // the second record is an alert
        assert!(matches!(read(&alert), Hello::Malformed(_)));
        let mut long = records(&hello(Some("a.test"), 0), MAX_RECORD);
        long[3..5].copy_from_slice(&((MAX_RECORD + 1) as u16).to_be_bytes());
        assert_eq!(
            read(&long),
            Hello::Malformed("a record length out of range")
        );
    }
}
