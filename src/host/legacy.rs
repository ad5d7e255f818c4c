//! Legacy iptables (x_tables, not nftables): the built-in chains' policies
//! and rule counts of the tables loaded in this namespace, read from the
//! kernel with the getsockopt calls iptables-legacy itself uses
//! (`IPT_SO_GET_INFO`/`IPT_SO_GET_ENTRIES`). Only tables the namespace
//! already has are asked for (`/proc/net/ip{,6}_tables_names`): asking for
//! another would create it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A built-in chain of a legacy iptables table.
#[derive(Debug, Clone, PartialEq)]
pub struct LegacyChain {
    /// "ip" (iptables) or "ip6" (ip6tables).
    pub family: &'static str,
    pub table: String,
    /// INPUT, FORWARD, OUTPUT, ...
    pub name: String,
    pub policy_accepts: bool,
    /// User rules in the chain (the policy not counted).
    pub rules: usize,
}

/// `IPT_SO_GET_INFO` and `IPT_SO_GET_ENTRIES` (the same numbers for IPv6).
const SO_GET_INFO: libc::c_int = 64;
const SO_GET_ENTRIES: libc::c_int = 65;
const TABLE_NAME_LEN: usize = 32;
/// `struct ipt_getinfo`: name, valid_hooks, hook_entry[5], underflow[5],
/// num_entries, size.
const GETINFO_LEN: usize = TABLE_NAME_LEN + 4 * 13;
/// `struct ipt_get_entries` up to its entry table (8-byte aligned).
const ENTRIES_HEADER: usize = 40;
/// The built-in chains, in hook order (NF_INET_PRE_ROUTING ... POST_ROUTING).
const CHAINS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
/// `xt_entry_target`'s header before a standard target's verdict.
const TARGET_HEADER: usize = 32;
/// A standard target's verdict for NF_ACCEPT (-NF_ACCEPT - 1).
const VERDICT_ACCEPT: i32 = -2;

struct Layout {
    family: &'static str,
    names: &'static str,
    domain: libc::c_int,
    level: libc::c_int,
    /// Offsets of `target_offset` and `next_offset` in `struct ipt_entry`
    /// (or `ip6t_entry`).
    target_offset_at: usize,
}

const LAYOUTS: [Layout; 2] = [
    Layout {
        family: "ip",
        names: "/proc/net/ip_tables_names",
        domain: libc::AF_INET,
        level: libc::IPPROTO_IP,
        target_offset_at: 88,
    },
    Layout {
        family: "ip6",
        names: "/proc/net/ip6_tables_names",
        domain: libc::AF_INET6,
        level: libc::IPPROTO_IPV6,
        target_offset_at: 140,
    },
];

/// The built-in chains of every legacy table loaded in this namespace.
/// None loaded (the usual case on nftables hosts): empty.
pub fn chains() -> io::Result<Vec<LegacyChain>> {
    let mut out = Vec::new();
    for layout in &LAYOUTS {
        let names = match std::fs::read_to_string(layout.names) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let tables: Vec<&str> = names
            .lines()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        if tables.is_empty() {
            continue;
        }
        // SAFETY: plain socket(2); the fd is owned at once.
        let fd = unsafe {
            libc::socket(
                layout.domain,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_RAW,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new, valid descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        for table in tables {
            // EAGAIN: the table changed between the two calls; ENOENT: it
            // went away.
            let mut tries = 0;
            let chains = loop {
                match read_table(&fd, layout, table) {
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < 3 => tries += 1,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break Vec::new(),
                    other => break other?,
                }
            };
            out.extend(chains);
        }
    }
    Ok(out)
}

fn getsockopt(
    fd: &OwnedFd,
    level: libc::c_int,
    opt: libc::c_int,
    buf: &mut [u8],
) -> io::Result<()> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf is valid for len bytes and len is passed by reference.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

fn named(table: &str) -> io::Result<[u8; TABLE_NAME_LEN]> {
    let mut name = [0u8; TABLE_NAME_LEN];
    if table.len() >= TABLE_NAME_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("table name {table} too long"),
        ));
    }
    name[..table.len()].copy_from_slice(table.as_bytes());
    Ok(name)
}

fn read_table(fd: &OwnedFd, layout: &Layout, table: &str) -> io::Result<Vec<LegacyChain>> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("legacy table {table}: short answer from the kernel"),
        )
    };
    let mut info = [0u8; GETINFO_LEN];
    info[..TABLE_NAME_LEN].copy_from_slice(&named(table)?);
    getsockopt(fd, layout.level, SO_GET_INFO, &mut info)?;
    let valid_hooks = u32_at(&info, 32).ok_or_else(bad)?;
    let hook_entry = |h: usize| u32_at(&info, 36 + 4 * h);
    let underflow = |h: usize| u32_at(&info, 56 + 4 * h);
    let size = u32_at(&info, 80).ok_or_else(bad)? as usize;

    let mut entries = vec![0u8; ENTRIES_HEADER + size];
    entries[..TABLE_NAME_LEN].copy_from_slice(&named(table)?);
    entries[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&(size as u32).to_ne_bytes());
    getsockopt(fd, layout.level, SO_GET_ENTRIES, &mut entries)?;
    let table_bytes = &entries[ENTRIES_HEADER..];

    let mut out = Vec::new();
    for (hook, name) in CHAINS.iter().enumerate() {
        if valid_hooks & (1 << hook) == 0 {
            continue;
        }
        let (start, end) = (
            hook_entry(hook).ok_or_else(bad)? as usize,
            underflow(hook).ok_or_else(bad)? as usize,
        );
        let mut rules = 0;
        let mut at = start;
        while at < end {
            let next = u16_at(table_bytes, at + layout.target_offset_at + 2).ok_or_else(bad)?;
            if next == 0 {
                return Err(bad());
            }
            at += next as usize;
            rules += 1;
        }
        let target = u16_at(table_bytes, end + layout.target_offset_at).ok_or_else(bad)? as usize;
        let verdict = u32_at(table_bytes, end + target + TARGET_HEADER).ok_or_else(bad)? as i32;
        out.push(LegacyChain {
            family: layout.family,
            table: table.into(),
            name: (*name).into(),
            policy_accepts: verdict == VERDICT_ACCEPT,
            rules,
        });
    }
    Ok(out)
}
