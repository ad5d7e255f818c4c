//! Small value types shared by the config, the API and the daemon: MAC
//! addresses, interface ids and the rules for names that reach the kernel or DNS.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// An interface is identified by a UUID, chosen by the caller or generated.
/// The same id always gets the same MAC and IP on a network.
pub type InterfaceId = uuid::Uuid;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

#[derive(Debug, Error, PartialEq)]
pub enum NameError {
    #[error("{what} \"{name}\" is empty")]
    Empty { what: &'static str, name: String },
    #[error("{what} \"{name}\" is {len} bytes long; at most {max} are allowed")]
    TooLong {
        what: &'static str,
        name: String,
        len: usize,
        max: usize,
    },
    #[error("{what} \"{name}\" has the character {ch:?}; {allowed}")]
    BadChar {
        what: &'static str,
        name: String,
        ch: char,
        allowed: &'static str,
    },
    #[error("\"{0}\" is not a MAC address (expected six hex pairs such as 52:54:00:12:34:56)")]
    BadMac(String),
    #[error(
        "MAC address {0} is multicast; a VM needs a unicast MAC (the lowest bit of the first byte clear)"
    )]
    MulticastMac(String),
}

impl MacAddr {
    /// A locally administered unicast MAC derived from `seed`, stable across runs.
    pub fn derived(seed: &[u8]) -> MacAddr {
        let h = stable_hash(seed).to_be_bytes();
        MacAddr([(h[0] & 0xfc) | 0x02, h[1], h[2], h[3], h[4], h[5]])
    }

    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        let bad = || NameError::BadMac(s.to_string());
        let parts: Vec<&str> = s.split([':', '-']).collect();
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(parts) {
            if part.len() != 2 {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        let mac = MacAddr(mac);
        if mac.is_multicast() {
            return Err(NameError::MulticastMac(s.to_string()));
        }
        Ok(mac)
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The first bytes of every id `socket_interface_id` makes ("lnsk"): what
/// tells them from ids the ordinary API may be given.
const SOCKET_ID_MARK: [u8; 4] = *b"lnsk";

/// The interface id of `owner`'s VM with `mac` on `network`'s socket: the
/// same for every connection it makes, so a VM that reconnects (restarted,
/// or the daemon restarted) takes up its lease again, and its address with
/// it, where a new id would find the MAC held by the last one's
/// reservation. With the owner in it, two users' VMs with one MAC never
/// meet on one id. A UUID of version 8 (custom): SOCKET_ID_MARK, then
/// stable hashes of the three.
pub fn socket_interface_id(network: &str, mac: MacAddr, owner: u32) -> InterfaceId {
    let mut seed = b"linnet network socket\0".to_vec();
    seed.extend_from_slice(network.as_bytes());
    seed.push(0);
    seed.extend_from_slice(&mac.0);
    seed.extend_from_slice(&owner.to_be_bytes());
    let first = stable_hash(&seed);
    seed.extend_from_slice(&first.to_be_bytes());
    let second = stable_hash(&seed);
    let mut bytes = [0u8; 16];
    bytes[..4].copy_from_slice(&SOCKET_ID_MARK);
    bytes[4..8].copy_from_slice(&first.to_be_bytes()[4..]);
    bytes[8..].copy_from_slice(&second.to_be_bytes());
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// Whether `id` is of the kind `socket_interface_id` makes, which only a
/// network socket's relay attaches (the ordinary API refuses it: nobody
/// takes a socket VM's id before it comes).
pub fn is_socket_interface_id(id: InterfaceId) -> bool {
    id.get_version_num() == 8 && id.as_bytes()[..4] == SOCKET_ID_MARK
}

/// FNV-1a, 64 bit: a hash that never changes between releases, for names and
/// MACs derived from ids (std's hasher is randomly seeded per process).
pub fn stable_hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether two IPv4 subnets share an address (one holds the other).
pub fn subnets_overlap(a: &ipnet::Ipv4Net, b: &ipnet::Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Whether a VM's name (given at attach, or sent by its DHCP client) is
/// `name`: DNS names, so without regard to case.
pub fn names_match(held: Option<&str>, name: &str) -> bool {
    held.is_some_and(|held| held.eq_ignore_ascii_case(name))
}

/// Network names become part of kernel interface names (the bridge is
/// `ln-<name>`, at most 15 bytes), so they are short and plain.
pub const NETWORK_NAME_MAX: usize = 12;

pub fn validate_network_name(name: &str) -> Result<(), NameError> {
    const ALLOWED: &str = "use letters, digits, '-' and '_', starting with a letter or digit";
    check_chars("network name", name, NETWORK_NAME_MAX, ALLOWED, |i, c| {
        c.is_ascii_alphanumeric() || (i > 0 && (c == '-' || c == '_'))
    })
}

/// A VM's name is a DNS label (RFC 1123): it is answered by the network's DNS.
pub fn validate_hostname(name: &str) -> Result<(), NameError> {
    const ALLOWED: &str =
        "a name is a DNS label: letters, digits and '-', not starting or ending with '-'";
    let last = name.len().saturating_sub(1);
    check_chars("name", name, 63, ALLOWED, |i, c| {
        c.is_ascii_alphanumeric() || (c == '-' && i != 0 && i != last)
    })
}

fn check_chars(
    what: &'static str,
    name: &str,
    max: usize,
    allowed: &'static str,
    ok: impl Fn(usize, char) -> bool,
) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty {
            what,
            name: name.into(),
        });
    }
    if name.len() > max {
        return Err(NameError::TooLong {
            what,
            name: name.into(),
            len: name.len(),
            max,
        });
    }
    match name.char_indices().find(|&(i, c)| !ok(i, c)) {
        Some((_, ch)) => Err(NameError::BadChar {
            what,
            name: name.into(),
            ch,
            allowed,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_vm_keeps_its_interface_id_per_network_and_mac() {
        let mac: MacAddr = "52:55:55:12:34:56".parse().unwrap();
        let other: MacAddr = "52:55:55:12:34:57".parse().unwrap();
        let id = socket_interface_id("shared", mac, 1000);
        assert_eq!(id, socket_interface_id("shared", mac, 1000), "stable");
        assert_ne!(id, socket_interface_id("shared", other, 1000));
        assert_ne!(id, socket_interface_id("host", mac, 1000));
        assert_ne!(
            id,
            socket_interface_id("shared", mac, 1001),
            "two users' VMs with one MAC never meet on one id"
        );
        assert_eq!(id.get_version_num(), 8);
        assert!(is_socket_interface_id(id));
        assert!(!is_socket_interface_id(InterfaceId::new_v4()));
        // Fixed from now on: leases on disk are kept under it across
        // upgrades. (It gained the owner and the mark in issue 33: a socket
        // VM's lease under the id before is given up at its lease time.)
        assert_eq!(id.to_string(), "6c6e736b-f218-8842-9f69-523db934d97d");
    }

    #[test]
    fn mac_parses_and_prints_both_separators() {
        let mac: MacAddr = "52:54:00:AB:cd:0f".parse().unwrap();
        assert_eq!(mac.to_string(), "52:54:00:ab:cd:0f");
        assert_eq!("52-54-00-ab-cd-0f".parse::<MacAddr>().unwrap(), mac);
    }

    #[test]
    fn mac_rejects_garbage_and_multicast() {
        for bad in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:0g",
            "525400abcd0f",
            "52:54:00:ab:cd:0f:11",
        ] {
            assert!(
                matches!(bad.parse::<MacAddr>(), Err(NameError::BadMac(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            "01:00:5e:00:00:01".parse::<MacAddr>(),
            Err(NameError::MulticastMac(_))
        ));
    }

    #[test]
    fn derived_mac_is_stable_local_unicast() {
        let a = MacAddr::derived(b"id-1");
        assert_eq!(a, MacAddr::derived(b"id-1"));
        assert_ne!(a, MacAddr::derived(b"id-2"));
        assert_eq!(a.0[0] & 0x03, 0x02, "locally administered, unicast");
    }

    #[test]
    fn network_names_fit_the_kernel() {
        assert!(validate_network_name("shared").is_ok());
        assert!(validate_network_name("lab_2-a").is_ok());
        assert!(matches!(
            validate_network_name("averyveryverylongname"),
            Err(NameError::TooLong { .. })
        ));
        assert!(matches!(
            validate_network_name("a b"),
            Err(NameError::BadChar { ch: ' ', .. })
        ));
        assert!(matches!(
            validate_network_name("-x"),
            Err(NameError::BadChar { ch: '-', .. })
        ));
        assert!(matches!(
            validate_network_name("a/b"),
            Err(NameError::BadChar { ch: '/', .. })
        ));
        assert!(matches!(
            validate_network_name(""),
            Err(NameError::Empty { .. })
        ));
    }

    #[test]
    fn hostnames_are_dns_labels() {
        assert!(validate_hostname("vm-1").is_ok());
        assert!(validate_hostname("-vm").is_err());
        assert!(validate_hostname("vm-").is_err());
        assert!(validate_hostname("vm.1").is_err());
        assert!(validate_hostname(&"a".repeat(64)).is_err());
    }
}
