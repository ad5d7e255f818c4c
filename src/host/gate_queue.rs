//! The rule that sends a held connection's packets to the gate's queue
//! (`firewall::gate` says which are held). nftables' own `queue`
//! statement is not in every kernel (this project's test machine lacks
//! it), while the `NFQUEUE` target through iptables' nft back-end is in
//! every kernel that has NFQUEUE at all: so it is one rule in
//! `security FORWARD` of each family (priority 150), after linnet's
//! forward chain (0) has marked a new connection pending, so that its
//! SYN is held too (the gate reads the stream from where the SYN says it
//! starts), and before linnet's gate chain (200) reads the verdict. It has no
//! `--queue-bypass`: with nobody reading the queue (the daemon restarting)
//! the kernel drops the packets, and a held connection waits for its
//! retransmission.
//!
//! The rule is there while some VM's connections are held, and is left
//! when the daemon stops with them still held (the next one reads the
//! queue); it goes with the last such VM.

use std::io;
use std::process::{Command, Stdio};

use super::firewall::gate::{MASK, PENDING};

/// iptables' table whose FORWARD chain runs after linnet's (150 > 0).
const TABLE: &str = "security";

/// The queue the daemon reads (one per network namespace).
pub const QUEUE: u16 = 4748;

/// What tells the rule from others' in `security FORWARD`.
const COMMENT: &str = "linnet gate: held connections";

/// The programs that change each family's rules, first found wins.
const PROGRAMS: [(&str, [&str; 2]); 2] = [
    ("IPv4", ["iptables-nft", "iptables"]),
    ("IPv6", ["ip6tables-nft", "ip6tables"]),
];

fn spec() -> Vec<String> {
    [
        "FORWARD",
        "-p",
        "tcp",
        "-m",
        "connmark",
        "--mark",
        &format!("{PENDING:#x}/{MASK:#x}"),
        "-m",
        "conntrack",
        "--ctdir",
        "ORIGINAL",
        "-m",
        "comment",
        "--comment",
        COMMENT,
        "-j",
        "NFQUEUE",
        "--queue-num",
        &QUEUE.to_string(),
    ]
    .map(String::from)
    .to_vec()
}

fn run(program: &str, verb: &str) -> io::Result<bool> {
    let mut args = vec!["-w".to_string(), "-t".into(), TABLE.into(), verb.into()];
    args.extend(spec());
    let out = Command::new(program)
        .args(&args)
        .stdin(Stdio::null())
        .output()?;
    Ok(out.status.success())
}

fn each_family(mut f: impl FnMut(&str) -> io::Result<()>) -> io::Result<()> {
    for (family, programs) in PROGRAMS {
        let program = programs
            .iter()
            .find(|p| super::egress::on_path(p).is_some())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "neither {} is installed, which holds {family} connections for their name (package iptables)",
                        programs.join(" nor ")
                    ),
                )
            })?;
        f(program)?;
    }
    Ok(())
}

/// Puts the rule in, once, in each family.
pub fn ensure() -> io::Result<()> {
    each_family(|program| {
        if run(program, "-C")? {
            return Ok(());
        }
        if run(program, "-A")? {
            return Ok(());
        }
        Err(io::Error::other(format!(
            "{program} could not add the rule that holds connections for their name to {TABLE} FORWARD (is the kernel's NFQUEUE there?)"
        )))
    })
}

/// Takes the rule out of each family, if it is there.
pub fn remove() -> io::Result<()> {
    each_family(|program| {
        while run(program, "-C")? {
            if !run(program, "-D")? {
                break;
            }
        }
        Ok(())
    })
}
