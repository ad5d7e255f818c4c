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
use tracing::{debug, info, warn};

use crate::host::netlink::LinkSettings;

use super::state::Daemon;

/// How long changes are gathered before acting: Docker or a firewall
/// manager makes many changes one by one. Not when linnet's own tables were
/// deleted: while they are gone, guests have no NAT.
const SETTLE: Duration = Duration::from_millis(100);
/// Legacy iptables sends no notifications, nor does the kernel when routes
/// go with their link: the host is looked at this often too.
const POLL: Duration = Duration::from_secs(30);
/// How often the host is looked at while guarded ports are held.
const HELD_RECHECK: Duration = Duration::from_secs(1);

const NFNLGRP_NFTABLES: u32 = libc::NFNLGRP_NFTABLES as u32;
const NFNL_SUBSYS_NFTABLES: u16 = libc::NFNL_SUBSYS_NFTABLES as u16;
/// nf_tables message types that never count: set elements (linnet's own
/// change at every attach; others' are data, not rules), the generation
/// message that ends every transaction, traces.
const IGNORED: [i32; 6] = [
    libc::NFT_MSG_NEWSETELEM,
    libc::NFT_MSG_GETSETELEM,
    libc::NFT_MSG_DELSETELEM,
    libc::NFT_MSG_NEWGEN,
    libc::NFT_MSG_GETGEN,
    libc::NFT_MSG_TRACE,
];
/// Deletions: DELTABLE, DELCHAIN, DELRULE, DELSET, and (kernels 6.3+)
/// DESTROYTABLE, DESTROYCHAIN, DESTROYRULE, DESTROYSET.
const DELETES: [i32; 8] = [
    libc::NFT_MSG_DELTABLE,
    libc::NFT_MSG_DELCHAIN,
    libc::NFT_MSG_DELRULE,
    libc::NFT_MSG_DELSET,
    26,
    27,
    28,
    29,
];
/// NFT_MSG_DESTROYSETELEM: set elements again.
const DESTROYSETELEM: i32 = 30;
const NFPROTO_INET: u8 = libc::NFPROTO_INET as u8;
const NFPROTO_BRIDGE: u8 = libc::NFPROTO_BRIDGE as u8;
const NFPROTO_NETDEV: u8 = libc::NFPROTO_NETDEV as u8;
/// The table's name is attribute 1 of table, chain, rule and set messages.
const NFTA_TABLE: u16 = 1;

/// Route messages, netconf (forwarding) messages and policy rules.
const RTM_NEWROUTE: u16 = libc::RTM_NEWROUTE;
const RTM_DELROUTE: u16 = libc::RTM_DELROUTE;
const RTM_NEWNETCONF: u16 = libc::RTM_NEWNETCONF;
const RTM_DELNETCONF: u16 = 81;
const RTM_NEWRULE: u16 = libc::RTM_NEWRULE;
const RTM_DELRULE: u16 = libc::RTM_DELRULE;
const RT_TABLE_LOCAL: u8 = libc::RT_TABLE_LOCAL;
const ROUTE_GROUPS: [u32; 6] = [
    libc::RTNLGRP_IPV4_ROUTE,
    libc::RTNLGRP_IPV6_ROUTE,
    libc::RTNLGRP_IPV4_RULE,
    libc::RTNLGRP_IPV6_RULE,
    libc::RTNLGRP_IPV4_NETCONF,
    libc::RTNLGRP_IPV6_NETCONF,
];

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
        let rt = open(libc::NETLINK_ROUTE, &ROUTE_GROUPS);
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
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll.tick().await;
        let mut held = false;
        loop {
            let mut wake = Wake::default();
            tokio::select! {
                n = read(&nft, &mut nft_buf) => wake.netfilter = netfilter_change(&nft_buf[..n]),
                n = read(&rt, &mut rt_buf) => wake.routes = route_change(&rt_buf[..n]),
                // Legacy iptables, and routes gone with a link (the kernel
                // sends no notification for those).
                _ = poll.tick() => (wake.netfilter, wake.routes) = (Change::Foreign, true),
                // Held ports wait for linnet's tables: look again soon (a
                // table that goes with its owner's socket sends nothing).
                _ = tokio::time::sleep(HELD_RECHECK), if held => wake.netfilter = Change::OwnDeleted,
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
                    n = read(&rt, &mut rt_buf) => wake.routes |= route_change(&rt_buf[..n]),
                }
            }
            debug!(?wake, "the namespace changed");
            let mut d = daemon.lock().await;
            if d.is_idle() {
                held = false;
                continue;
            }
            if wake.netfilter == Change::OwnDeleted {
                d.hold_guarded_ports().await;
            }
            if wake.routes {
                d.refresh_uplinks().await;
            }
            // Routes name the uplinks the checks use; netconf is forwarding.
            d.check_host();
            d.release_held_ports().await;
            held = d.guard.held();
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
/// counts as a change. Other errors are logged and waited out, and then
/// read as a datagram too short to mean anything.
async fn read(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> usize {
    loop {
        let mut guard = match fd.readable().await {
            Ok(guard) => guard,
            Err(e) => return failed(e, buf).await,
        };
        match guard.try_io(|fd| {
            socket::recv(fd.get_ref().as_raw_fd(), buf, socket::MsgFlags::empty())
                .map_err(io::Error::from)
        }) {
            Ok(Ok(n)) => return n,
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => return 0,
            Ok(Err(e)) => return failed(e, buf).await,
            Err(_would_block) => continue,
        }
    }
}

async fn failed(e: io::Error, buf: &mut [u8]) -> usize {
    warn!("reading netlink notifications failed: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    // One byte: no message in it, so no change.
    buf[0] = 0;
    1
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
        let op = i32::from(kind & 0xff);
        if IGNORED.contains(&op) || op == DESTROYSETELEM {
            continue;
        }
        let family = msg[16];
        let ours = matches!(family, NFPROTO_INET | NFPROTO_BRIDGE | NFPROTO_NETDEV)
            && table_name(&msg[20..]) == Some(b"linnet");
        let deletes = DELETES.contains(&op);
        change = change.max(match (ours, deletes) {
            (true, true) => Change::OwnDeleted,
            (true, false) => Change::None,
            (false, _) => Change::Foreign,
        });
    }
    change
}

/// Whether rtnetlink messages in `buf` change a default route of the main
/// table or a forwarding sysctl (netconf). The routes every TAP and bridge
/// brings (link-local, multicast, local) do not: with a thousand TAPs, a
/// look at the host for each would cost more than the attaches themselves.
fn route_change(buf: &[u8]) -> bool {
    if buf.is_empty() {
        return true; // an overflow
    }
    let mut at = 0;
    while at + 16 <= buf.len() {
        let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().expect("2 bytes"));
        if len < 16 || at + len > buf.len() {
            return true;
        }
        let body = &buf[at + 16..at + len];
        at += (len + 3) & !3;
        match kind {
            RTM_NEWNETCONF | RTM_DELNETCONF if all_forwarding(body) => return true,
            // Policy routing (wg-quick, VPNs) decides the uplink too.
            RTM_NEWRULE | RTM_DELRULE => return true,
            // struct rtmsg: family, dst_len, src_len, tos, table, ...: a
            // default route in any table but the local one, or the two
            // halves VPNs use instead (0.0.0.0/1 and 128.0.0.0/1).
            RTM_NEWROUTE | RTM_DELROUTE
                if body.len() >= 5 && body[1] <= 1 && body[4] != RT_TABLE_LOCAL =>
            {
                return true;
            }
            _ => {}
        }
    }
    false
}

/// Whether a netconf message (`struct netconfmsg`, padded to 4 bytes, then
/// attributes) is about forwarding of "all" interfaces: what linnet turns on.
/// Every new TAP brings netconf messages of its own, which do not count.
fn all_forwarding(body: &[u8]) -> bool {
    const NETCONFA_IFINDEX: u16 = 1;
    const NETCONFA_FORWARDING: u16 = 2;
    const NETCONFA_IFINDEX_ALL: i32 = -1;
    let (mut all, mut forwarding) = (false, false);
    let mut attrs = body.get(4..).unwrap_or_default();
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            break;
        }
        match kind {
            NETCONFA_IFINDEX if len >= 8 => {
                all = i32::from_ne_bytes(attrs[4..8].try_into().expect("4 bytes"))
                    == NETCONFA_IFINDEX_ALL;
            }
            NETCONFA_FORWARDING => forwarding = true,
            _ => {}
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    all && forwarding
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

impl Daemon {
    /// Holds every guarded port — off its bridge, or a macvtap down: nothing
    /// in or out, and nothing its VMM can undo (either needs CAP_NET_ADMIN)
    /// — while linnet's tables are damaged, as after `nft
    /// flush ruleset`: until the guard and the policies are back, a VM could
    /// plant neighbour entries and routes, or reach the host's 127.0.0.1
    /// through route_localnet. Fails closed: a port stays held until they
    /// are back.
    pub async fn hold_guarded_ports(&mut self) {
        if self.guard.held() || !self.own_tables_damaged() {
            return;
        }
        let ports = self.live_guarded_ports();
        warn!(
            interfaces = ports.len(),
            "linnet's tables are damaged: guarded interfaces forward nothing until they are back"
        );
        for (tap, index, bridge) in ports {
            let held = match bridge {
                Some(_) => self.host.links.set_master(index, None).await,
                None => self.host.links.cut_off(index).await,
            };
            if let Err(e) = held {
                warn!(%tap, "cannot hold the port: {e}");
            }
        }
        self.guard.set_held(true);
    }
    /// Puts held ports back on their bridges once linnet's tables are whole.
    pub async fn release_held_ports(&mut self) {
        if !self.guard.held() || self.own_tables_damaged() {
            return;
        }
        let ports = self.live_guarded_ports();
        for (tap, index, bridge) in &ports {
            let back = match bridge {
                Some(bridge) => self.host.links.set_master(*index, Some(*bridge)).await,
                None => {
                    let up = LinkSettings {
                        up: true,
                        ..Default::default()
                    };
                    self.host.links.configure(*index, up).await
                }
            };
            if let Err(e) = back {
                warn!(%tap, "cannot put the port back on its network: {e}");
            }
        }
        info!(
            interfaces = ports.len(),
            "linnet's tables are back: guarded interfaces forward again"
        );
        self.guard.set_held(false);
    }
    /// (port, its index, its bridge's index; none for a macvtap) of each
    /// guarded interface that was not cut off.
    fn live_guarded_ports(&self) -> Vec<(String, u32, Option<u32>)> {
        self.interfaces
            .values()
            .filter(|i| i.guarded && i.cut_off.is_none())
            .filter_map(|i| {
                let bridge = self.networks.get(&i.network)?.bridge().map(|(_, b)| b);
                Some((i.tap.clone(), i.tap_index, bridge))
            })
            .collect()
    }
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

    fn route(kind: u16, dst_len: u8, table: u8) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(28u32.to_ne_bytes());
        m.extend(kind.to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend([10, dst_len, 0, 0, table, 0, 0, 0, 0, 0, 0, 0]);
        m
    }

    #[test]
    fn only_default_routes_and_forwarding_count() {
        assert!(route_change(&route(RTM_NEWROUTE, 0, libc::RT_TABLE_MAIN)));
        assert!(route_change(&route(RTM_DELROUTE, 0, libc::RT_TABLE_MAIN)));
        assert!(
            !route_change(&route(RTM_NEWROUTE, 64, libc::RT_TABLE_MAIN)),
            "a prefix route"
        );
        assert!(
            !route_change(&route(RTM_NEWROUTE, 0, 255)),
            "the local table"
        );
        let netconf = |ifindex: i32| {
            let mut m = Vec::new();
            m.extend(36u32.to_ne_bytes());
            m.extend(RTM_NEWNETCONF.to_ne_bytes());
            m.extend([0u8; 10]);
            m.extend([2u8, 0, 0, 0]);
            m.extend([8u8, 0, 1, 0]);
            m.extend(ifindex.to_ne_bytes());
            m.extend([8u8, 0, 2, 0]);
            m.extend(1i32.to_ne_bytes());
            m
        };
        assert!(route_change(&netconf(-1)), "forwarding of all");
        assert!(!route_change(&netconf(7)), "a new TAP's settings");
        let mut batch = route(RTM_NEWROUTE, 8, 255);
        batch.extend(route(RTM_NEWROUTE, 0, libc::RT_TABLE_MAIN));
        assert!(route_change(&batch));
        assert!(route_change(&[]), "an overflow");
    }

    #[test]
    fn own_changes_do_not_count_but_deletes_do() {
        let new_rule = 6;
        let change = |op, family, table| netfilter_change(&message(op, family, table));
        assert_eq!(change(new_rule, NFPROTO_INET, "linnet"), Change::None);
        assert_eq!(
            change(libc::NFT_MSG_NEWSETELEM as u16, NFPROTO_BRIDGE, "linnet"),
            Change::None
        );
        assert_eq!(
            change(libc::NFT_MSG_DELTABLE as u16, NFPROTO_INET, "linnet"),
            Change::OwnDeleted
        );
        assert_eq!(
            change(libc::NFT_MSG_DELCHAIN as u16, NFPROTO_BRIDGE, "linnet"),
            Change::OwnDeleted
        );
        // Someone else's table, even if it is called linnet.
        assert_eq!(change(new_rule, 2, "linnet"), Change::Foreign);
        assert_eq!(change(new_rule, 2, "filter"), Change::Foreign);
        // A batch counts as its most urgent message.
        let mut batch = message(new_rule, NFPROTO_INET, "linnet");
        batch.extend(message(0, 2, "filter"));
        batch.extend(message(
            libc::NFT_MSG_DELTABLE as u16,
            NFPROTO_BRIDGE,
            "linnet",
        ));
        assert_eq!(netfilter_change(&batch), Change::OwnDeleted);
        assert_eq!(netfilter_change(&[]), Change::Foreign, "an overflow");
    }
}
