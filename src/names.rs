//! DNS names in connect policies (`--allow-connect api.example.com:443`,
//! `*.cdn.example.net:443`): what a name pattern is, how it is written
//! and normalised, and which names it allows. linnet's DNS forwards only
//! the names a VM's patterns allow (`services::dns`), and the addresses in
//! their answers become the VM's to connect to (`learned`).
//!
//! A pattern is normalised as DNS compares names: IDNA (UTS #46, so
//! `Bücher.example` is `xn--bcher-kva.example`), lower case, no trailing
//! dot. `*.SUFFIX` allows every name one label or more below SUFFIX
//! (`a.SUFFIX`, `a.b.SUFFIX`), never SUFFIX itself: list both to allow
//! both.

use std::fmt;

use hickory_proto::rr::Name;

/// The longest name DNS carries, without its trailing dot (RFC 1035).
const MAX_NAME: usize = 253;

/// A name a VM may connect to: exactly `name`, or with `wildcard` every
/// name below it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NamePattern {
    /// Lower case, IDNA-encoded, fully qualified.
    name: Name,
    wildcard: bool,
}

impl NamePattern {
    /// `text` as a pattern; the problem, said for the user, when it is
    /// none.
    pub fn parse(text: &str) -> Result<NamePattern, String> {
        let body = text.strip_suffix('.').unwrap_or(text);
        if body.is_empty() {
            return Err("an empty name".into());
        }
        if body.parse::<std::net::IpAddr>().is_ok() {
            return Err(format!("{body} is an address, not a name"));
        }
        let (wildcard, rest) = match body.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, body),
        };
        if rest.contains('*') || rest.is_empty() {
            return Err("a wildcard is a whole first label before a name: *.example.com".into());
        }
        if rest.split('.').any(str::is_empty) {
            return Err(format!("\"{rest}\" has an empty label"));
        }
        let too_long = |len: usize| len + if wildcard { 2 } else { 0 } > MAX_NAME;
        let long = || format!("\"{body}\" is longer than DNS allows ({MAX_NAME} characters)");
        if too_long(rest.len()) {
            return Err(long());
        }
        let name = Name::from_utf8(rest)
            .map_err(|e| format!("\"{rest}\" is not a DNS name: {e}"))?
            .to_lowercase();
        // IDNA may have made it longer.
        if too_long(name.to_ascii().trim_end_matches('.').len()) {
            return Err(long());
        }
        let mut name = name;
        name.set_fqdn(true);
        Ok(NamePattern { name, wildcard })
    }

    /// Whether a query for `name` is one this pattern allows; `name` as
    /// `normalise` made it.
    pub fn allows(&self, name: &Name) -> bool {
        if self.wildcard {
            name.num_labels() > self.name.num_labels() && self.name.zone_of(name)
        } else {
            *name == self.name
        }
    }
}

impl NamePattern {
    /// Whether every name `other` allows, this allows too: a name by
    /// itself or a wildcard above it; a wildcard by a wildcard at or
    /// above its own name.
    pub fn covers(&self, other: &NamePattern) -> bool {
        match (self.wildcard, other.wildcard) {
            (false, false) => self.name == other.name,
            (false, true) => false,
            (true, false) => self.allows(&other.name),
            (true, true) => self.name.zone_of(&other.name),
        }
    }
}

/// `name` as patterns compare it: lower case, fully qualified.
pub fn normalise(name: &Name) -> Name {
    let mut name = name.to_lowercase();
    name.set_fqdn(true);
    name
}

/// A name as users read it: IDNA-encoded, no trailing dot.
pub fn shown(name: &Name) -> String {
    let ascii = name.to_ascii();
    match ascii.strip_suffix('.') {
        Some(bare) if !bare.is_empty() => bare.to_string(),
        _ => ascii,
    }
}

impl fmt::Display for NamePattern {
    /// As normalised, IDNA-encoded: the form DNS compares.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ascii = shown(&self.name);
        if self.wildcard {
            write!(f, "*.{ascii}")
        } else {
            f.write_str(&ascii)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> Name {
        normalise(&Name::from_utf8(text).unwrap())
    }

    fn pattern(text: &str) -> NamePattern {
        NamePattern::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn a_pattern_covers_what_allows_no_more_than_it() {
        let covers = |a: &str, b: &str| pattern(a).covers(&pattern(b));
        assert!(covers("api.example.com", "API.example.com"));
        assert!(!covers("api.example.com", "www.example.com"));
        assert!(!covers("api.example.com", "*.api.example.com"));
        assert!(covers("*.example.com", "api.example.com"));
        assert!(covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(covers("*.example.com", "*.example.com"));
        assert!(covers("*.example.com", "*.cdn.example.com"));
        assert!(!covers("*.cdn.example.com", "*.example.com"));
        assert!(!covers("*.example.com", "api.example.com.evil.test"));
    }

    #[test]
    fn names_are_normalised_as_dns_compares_them() {
        assert_eq!(pattern("API.Example.COM.").to_string(), "api.example.com");
        assert_eq!(
            pattern("Bücher.example").to_string(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            pattern("*.CDN.example.net").to_string(),
            "*.cdn.example.net"
        );
        assert_eq!(pattern("localhost").to_string(), "localhost");
        assert_eq!(pattern("bücher.example"), pattern("xn--bcher-kva.example."));
    }

    #[test]
    fn a_name_allows_itself_in_any_case_and_a_wildcard_one_label_or_more_below() {
        let exact = pattern("api.example.com");
        assert!(exact.allows(&name("api.example.com")));
        assert!(exact.allows(&name("API.EXAMPLE.COM.")));
        assert!(!exact.allows(&name("www.api.example.com")));
        assert!(!exact.allows(&name("example.com")));
        assert!(!exact.allows(&name("api.example.com.evil.test")));
        let below = pattern("*.cdn.example.net");
        assert!(below.allows(&name("a.cdn.example.net")));
        assert!(below.allows(&name("a.b.CDN.example.net.")));
        assert!(
            !below.allows(&name("cdn.example.net")),
            "not the suffix itself"
        );
        assert!(
            !below.allows(&name("xcdn.example.net")),
            "whole labels only"
        );
        assert!(!below.allows(&name("a.cdn.example.net.evil.test")));
        assert!(pattern("bücher.example").allows(&name("XN--BCHER-KVA.example")));
    }

    #[test]
    fn what_is_no_name_is_refused_with_the_reason() {
        let refused = |text: &str, says: &str| {
            let e = NamePattern::parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        };
        refused("", "an empty name");
        refused(".", "an empty name");
        refused("192.0.2.1", "is an address, not a name");
        refused("2001:db8::1", "is an address, not a name");
        refused("*", "a wildcard is a whole first label");
        refused("*.", "a wildcard is a whole first label");
        refused("a*.example.com", "a wildcard is a whole first label");
        refused("www.*.example.com", "a wildcard is a whole first label");
        refused("www..example.com", "has an empty label");
        refused("exa mple.com", "is not a DNS name");
        refused(&format!("{}.com", "a".repeat(64)), "is not a DNS name");
        let long = vec!["a".repeat(63); 4].join(".");
        refused(&long, "longer than DNS allows");
        let just = format!("{}.{}", vec!["a".repeat(63); 3].join("."), "a".repeat(61));
        assert_eq!(
            pattern(&just).to_string().len(),
            253,
            "the longest name DNS carries"
        );
        refused(&format!("*.{just}"), "longer than DNS allows");
    }
}
