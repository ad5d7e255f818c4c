//! Notices when the namespace changes under linnet: nftables changes (the
//! kernel's nf_tables notifications: `nft flush ruleset`, a table deleted,
//! a firewall reloaded, Docker recreating its chains) and route or
//! forwarding-sysctl changes (rtnetlink's route and netconf groups). Changes
//! are gathered for a moment, then the daemon looks at the host again and
//! puts back what is gone. Notifications about linnet's own set elements,
//! and its own table being rebuilt, do not count, so linnet does not chase
//! its own changes.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{self, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::Mutex;
use tracing::{debug, warn};

use super::state::Daemon;

/// How long changes are gathered before acting: Docker or a firewall
/// manager makes many changes one by one. Not when linnet's own tables were
/// deleted: while they are gone, guests have no NAT.
const SETTLE: Duration = Duration::from_millis(100);
/// Legacy iptables sends no notifications: it is looked at this often.
const POLL: Duration = Duration::from_secs(30);

const NFNLGRP_NFTABLES: u32 = 7;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// nf_tables message types (`enum nf_tables_msg_types`).
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWGEN: u16 = 16;
/// NFT_MSG_DESTROY* (kernels 6.3+) mean delete too.
const NFT_MSG_DESTROYTABLE: u16 = 26;
const NFPROTO_INET: u8 = 1;
const NFPROTO_BRIDGE: u8 = 7;
/// The table's name is attribute 1 of table, chain, rule and set messages.
const NFTA_TABLE: u16 = 1;

const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_ROUTE: u32 = 11;
const RTNLGRP_IPV4_NETCONF: u32 = 24;
const RTNLGRP_IPV6_NETCONF: u32 = 25;

/// What a batch of nf_tables notifications is about, least urgent first.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    #[default]
    None,
    /// Someone else's tables (or an overflow).
    Foreign,
    /// Something of linnet's own tables was deleted.
    OwnDeleted,
}

/// What the notifications so far ask for.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Wake {
    netfilter: Change,
    routes: bool,
}

/// Watches until the daemon stops. Errors opening the sockets are logged:
/// the daemon works without the watch, it only stops repairing.
pub fn spawn(daemon: Arc<Mutex<Daemon>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let nft = open(libc::NETLINK_NETFILTER, &[NFNLGRP_NFTABLES]);
        let rt = open(
            libc::NETLINK_ROUTE,
            &[
                RTNLGRP_IPV4_ROUTE,
                RTNLGRP_IPV6_ROUTE,
                RTNLGRP_IPV4_NETCONF,
                RTNLGRP_IPV6_NETCONF,
            ],
        );
        let (nft, rt) = match (nft, rt) {
            (Ok(nft), Ok(rt)) => (nft, rt),
            (Err(e), _) | (_, Err(e)) => {
                warn!(
                    "cannot watch nftables and route changes ({e}): linnet will not put back its rules if something removes them"
                );
                return;
            }
        };
        let (mut nft_buf, mut rt_buf) = (vec![0u8; 64 * 1024], vec![0u8; 8 * 1024]);
        let mut poll = tokio::time::interval(POLL);
        poll.tick().await;
        loop {
            let mut wake = Wake::default();
            tokio::select! {
                n = read(&nft, &mut nft_buf) => wake.netfilter = netfilter_change(&nft_buf[..n]),
                _ = read(&rt, &mut rt_buf) => wake.routes = true,
                _ = poll.tick() => wake.netfilter = Change::Foreign,
            }
            if wake == Wake::default() {
                continue;
            }
            // Gather what follows for a moment.
            let settle = tokio::time::sleep(if wake.netfilter == Change::OwnDeleted {
                Duration::ZERO
            } else {
                SETTLE
            });
            tokio::pin!(settle);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut settle => break,
                    n = read(&nft, &mut nft_buf) => wake.netfilter = wake.netfilter.max(netfilter_change(&nft_buf[..n])),
                    _ = read(&rt, &mut rt_buf) => wake.routes = true,
                }
            }
            debug!(?wake, "the namespace changed");
            let mut d = daemon.lock().await;
            if d.is_idle() {
                continue;
            }
            if wake.routes {
                d.refresh_uplinks().await;
            }
            // Routes name the uplinks the checks use; netconf is forwarding.
            d.check_host();
        }
    })
}

fn open(protocol: libc::c_int, groups: &[u32]) -> io::Result<AsyncFd<OwnedFd>> {
    let proto = match protocol {
        libc::NETLINK_NETFILTER => SockProtocol::NetlinkNetFilter,
        _ => SockProtocol::NetlinkRoute,
    };
    let fd = socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        proto,
    )?;
    let mask = groups.iter().fold(0u32, |m, g| m | 1 << (g - 1));
    socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, mask))?;
    // A burst (a flushed ruleset with many rules) may overflow the buffer:
    // that still wakes us (ENOBUFS), which is all that is needed.
    let _ = socket::setsockopt(&fd, socket::sockopt::RcvBuf, &(1 << 20));
    // SAFETY: the fd is owned by the AsyncFd for as long as it is registered.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)
}

/// The length of the next datagram; 0 for an overflow (ENOBUFS), which
/// counts as a change. Other errors are logged and waited out.
async fn read(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> usize {
    loop {
        let mut guard = match fd.readable().await {
            Ok(guard) => guard,
            Err(e) => return failed(e).await,
        };
        match guard.try_io(|fd| {
            socket::recv(fd.get_ref().as_raw_fd(), buf, socket::MsgFlags::empty())
                .map_err(io::Error::from)
        }) {
            Ok(Ok(n)) => return n,
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => return 0,
            Ok(Err(e)) => return failed(e).await,
            Err(_would_block) => continue,
        }
    }
}

async fn failed(e: io::Error) -> usize {
    warn!("reading netlink notifications failed: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    0
}

/// What the nf_tables messages in `buf` are about. linnet's own set
/// elements and its own tables being made do not count; an empty buffer
/// (an overflow) does.
fn netfilter_change(buf: &[u8]) -> Change {
    if buf.is_empty() {
        return Change::Foreign;
    }
    let mut change = Change::None;
    let mut at = 0;
    while at + 20 <= buf.len() {
        let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().expect("2 bytes"));
        if len < 20 || at + len > buf.len() {
            return change.max(Change::Foreign);
        }
        let msg = &buf[at..at + len];
        at += (len + 3) & !3;
        if kind >> 8 != NFNL_SUBSYS_NFTABLES {
            continue;
        }
        let op = kind & 0xff;
        if matches!(
            op,
            NFT_MSG_NEWSETELEM | NFT_MSG_GETSETELEM | NFT_MSG_DELSETELEM | NFT_MSG_NEWGEN
        ) {
            continue;
        }
        let family = msg[16];
        let ours = matches!(family, NFPROTO_INET | NFPROTO_BRIDGE)
            && table_name(&msg[20..]) == Some(b"linnet");
        let deletes = matches!(
            op,
            NFT_MSG_DELTABLE | NFT_MSG_DELCHAIN | NFT_MSG_DELRULE | NFT_MSG_DELSET
        ) || op >= NFT_MSG_DESTROYTABLE;
        change = change.max(match (ours, deletes) {
            (true, true) => Change::OwnDeleted,
            (true, false) => Change::None,
            (false, _) => Change::Foreign,
        });
    }
    change
}

/// The table name attribute of an nf_tables message body, without its NUL.
fn table_name(mut attrs: &[u8]) -> Option<&[u8]> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NFTA_TABLE {
            let value = &attrs[4..len];
            return Some(value.strip_suffix(&[0]).unwrap_or(value));
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(op: u16, family: u8, table: &str) -> Vec<u8> {
        let mut name = table.as_bytes().to_vec();
        name.push(0);
        let attr_len = 4 + name.len();
        let padded = (attr_len + 3) & !3;
        let len = 16 + 4 + padded;
        let mut m = Vec::new();
        m.extend((len as u32).to_ne_bytes());
        m.extend(((NFNL_SUBSYS_NFTABLES << 8) | op).to_ne_bytes());
        m.extend([0u8; 10]); // flags, seq, pid
        m.extend([family, 0, 0, 0]);
        m.extend((attr_len as u16).to_ne_bytes());
        m.extend(NFTA_TABLE.to_ne_bytes());
        m.extend(name);
        m.resize(len, 0);
        m
    }

    #[test]
    fn own_changes_do_not_count_but_deletes_do() {
        let new_rule = 6;
        let change = |op, family, table| netfilter_change(&message(op, family, table));
        assert_eq!(change(new_rule, NFPROTO_INET, "linnet"), Change::None);
        assert_eq!(
            change(NFT_MSG_NEWSETELEM, NFPROTO_BRIDGE, "linnet"),
            Change::None
        );
        assert_eq!(
            change(NFT_MSG_DELTABLE, NFPROTO_INET, "linnet"),
            Change::OwnDeleted
        );
        assert_eq!(
            change(NFT_MSG_DELCHAIN, NFPROTO_BRIDGE, "linnet"),
            Change::OwnDeleted
        );
        // Someone else's table, even if it is called linnet.
        assert_eq!(change(new_rule, 2, "linnet"), Change::Foreign);
        assert_eq!(change(new_rule, 2, "filter"), Change::Foreign);
        // A batch counts as its most urgent message.
        let mut batch = message(new_rule, NFPROTO_INET, "linnet");
        batch.extend(message(0, 2, "filter"));
        batch.extend(message(NFT_MSG_DELTABLE, NFPROTO_BRIDGE, "linnet"));
        assert_eq!(netfilter_change(&batch), Change::OwnDeleted);
        assert_eq!(netfilter_change(&[]), Change::Foreign, "an overflow");
    }
}
