//! The host an HTTP/1.x request head names (RFC 9112 3, RFC 9110 7.2):
//! read from the first bytes of a TCP stream, again as more come, until
//! the head ends (an empty line). The Host header decides, whatever the
//! request target says: it is what the server routes by. Without one, or
//! with two, it names nothing a rule can allow.

/// What the bytes so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Head<'a> {
    /// Not an HTTP/1.x request (no method token and a space first).
    NotHttp,
    /// Its head has not ended yet.
    More,
    /// A whole head, and its Host header's host (no port), if it has
    /// exactly one.
    Host(Option<&'a str>),
    /// A head that breaks the format; why.
    Malformed(&'static str),
}

/// The longest method linnet takes a request's first word for.
const LONGEST_METHOD: usize = 16;

/// Reads `stream`, the first bytes a client sent.
pub fn request_head(stream: &[u8]) -> Head<'_> {
    // A method is a token (RFC 9110 9: uppercase by convention; any
    // tchar), then a space.
    let method = stream.iter().take_while(|b| is_tchar(**b)).count();
    match stream.get(method) {
        None if method == stream.len() && method <= LONGEST_METHOD => return Head::More,
        Some(b' ') if (1..=LONGEST_METHOD).contains(&method) => {}
        _ => return Head::NotHttp,
    }
    let Some(end) = find(stream, b"\r\n\r\n") else {
        return Head::More;
    };
    let head = &stream[..end + 2];
    let mut lines = head.split(|b| *b == b'\n');
    let request_line = lines.next().unwrap_or_default();
    let request_line = request_line.strip_suffix(b"\r").unwrap_or(request_line);
    if !(request_line.ends_with(b" HTTP/1.1") || request_line.ends_with(b" HTTP/1.0")) {
        return Head::Malformed("a request line without HTTP/1.0 or HTTP/1.1");
    }
    let mut host = None;
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            return Head::Malformed("a header line without a colon");
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|b| is_tchar(*b)) {
            return Head::Malformed("a header name that is not a token");
        }
        if !name.eq_ignore_ascii_case(b"host") {
            continue;
        }
        if host.is_some() {
            return Head::Malformed("two Host headers");
        }
        let value = trim(value);
        let Ok(value) = std::str::from_utf8(value) else {
            return Head::Malformed("a Host that is not ASCII");
        };
        host = Some(without_port(value));
    }
    match host {
        Some(Some(h)) => Head::Host(Some(h)),
        Some(None) => Head::Malformed("a Host that is no host[:port]"),
        None => Head::Host(None),
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn trim(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

/// `host[:port]` without its port; an IPv6 literal keeps its brackets
/// out. None for what is neither.
fn without_port(value: &str) -> Option<&str> {
    if let Some(inner) = value.strip_prefix('[') {
        let (literal, after) = inner.split_once(']')?;
        literal.parse::<std::net::Ipv6Addr>().ok()?;
        return (after.is_empty() || port(after.strip_prefix(':')?)).then_some(literal);
    }
    let (host, after) = match value.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (value, None),
    };
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    {
        return None;
    }
    after.is_none_or(port).then_some(host)
}

fn port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_is_read_once_the_head_is_whole() {
        let get = b"GET /v1/models HTTP/1.1\r\nUser-Agent: curl/8\r\nhOsT:  api.example.com:8443 \r\nAccept: */*\r\n\r\n";
        assert_eq!(request_head(get), Head::Host(Some("api.example.com")));
        for cut in 0..get.len() - 1 {
            assert_eq!(request_head(&get[..cut]), Head::More, "cut at {cut}");
        }
        // What follows the head (a body) changes nothing.
        let mut post = b"POST /x HTTP/1.0\r\nHost: [2001:db8::1]:80\r\n\r\n".to_vec();
        post.extend(b"Host: evil.test\r\n\r\n");
        assert_eq!(request_head(&post), Head::Host(Some("2001:db8::1")));
    }

    #[test]
    fn no_host_two_hosts_and_what_is_not_http_are_told_apart() {
        assert_eq!(request_head(b"GET / HTTP/1.0\r\n\r\n"), Head::Host(None));
        assert_eq!(
            request_head(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Head::Malformed("two Host headers")
        );
        for bad in ["a.test/x", "[]", "[a.test]:80", ":80", "a.test:"] {
            let head = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert_eq!(
                request_head(head.as_bytes()),
                Head::Malformed("a Host that is no host[:port]"),
                "{bad}"
            );
        }
        assert_eq!(
            request_head(b"GET / HTTP/2.0\r\n\r\n"),
            Head::Malformed("a request line without HTTP/1.0 or HTTP/1.1")
        );
        assert_eq!(request_head(b"\x16\x03\x01"), Head::NotHttp);
        assert_eq!(request_head(b"SSH-2.0-OpenSSH_9.2\r\n"), Head::NotHttp);
        assert_eq!(request_head(b"GE"), Head::More);
        assert_eq!(request_head(b"AVERYLONGMETHODNAMEX "), Head::NotHttp);
    }
}
