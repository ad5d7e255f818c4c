//! Whose account a connecting process is, for the daemon's budgets and its
//! `allow` by group. `SO_PEERCRED` gives a uid; a user with subordinate
//! uids (`/etc/subuid`, as podman and rootless containers use) can be many
//! of them, one per process, so every per-uid budget would be per uid of
//! the user's choosing. Here a uid in a subordinate range counts as the
//! range's owner, and a process in a user namespace of another user's as
//! that user (the namespace's owner, seen from the daemon's). And a uid's
//! groups are those the group database gives its account, not the
//! supplementary groups a process inherited (a subordinate uid keeps its
//! creator's, though it is no member of anything).
//!
//! The namespace is read through the peer's pidfd (`host::peer`): a
//! process that connects and exits before the daemon looks leaves none to
//! read, and its uid alone (one of thousands a user may hold, from any
//! source of subordinate uids: /etc/subuid, or NSS's as sssd and FreeIPA
//! give) is no account. Such a peer is charged to its uid only when that
//! uid is an account of the user database (or root); otherwise it is
//! refused (`PeerGone`).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::unistd::{Gid, Uid, User, getgrouplist};

use super::peer::PeerNamespace;

const SUBUID: &str = "/etc/subuid";

/// One line of /etc/subuid: `owner` holds `count` uids from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubordinateRange {
    pub owner: u32,
    pub first: u32,
    pub count: u32,
}

impl SubordinateRange {
    fn holds(&self, uid: u32) -> bool {
        uid >= self.first && u64::from(uid) < u64::from(self.first) + u64::from(self.count)
    }
}

/// The ranges of /etc/subuid's `text`; `uid_of` names an owner given by
/// name. Lines that say nothing valid are skipped, as shadow's tools do.
pub fn parse_subuid(text: &str, uid_of: impl Fn(&str) -> Option<u32>) -> Vec<SubordinateRange> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split(':');
            let (who, first, count) = (fields.next()?, fields.next()?, fields.next()?);
            let owner = who.parse::<u32>().ok().or_else(|| uid_of(who))?;
            Some(SubordinateRange {
                owner,
                first: first.parse().ok()?,
                count: count.parse().ok()?,
            })
        })
        .collect()
}

/// The account `uid` is charged to under `ranges`: a subordinate range's
/// owner, else itself.
pub fn owner_in(ranges: &[SubordinateRange], uid: u32) -> u32 {
    ranges
        .iter()
        .find(|r| r.holds(uid))
        .map_or(uid, |r| r.owner)
}

/// A peer whose account cannot be told: its uid is no account, and its
/// process exited before its user namespace was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerGone {
    pub uid: u32,
}

impl fmt::Display for PeerGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the process that connected as uid {} exited before the daemon could tell whose account it is (the uid is no account of its own); connect from the process that asks, and keep it running",
            self.uid
        )
    }
}

/// The account a peer with `uid` in user namespace `namespace` is charged
/// to, through the process's one `Accounts`.
pub fn account_of(uid: u32, namespace: &PeerNamespace) -> Result<u32, PeerGone> {
    static ACCOUNTS: Mutex<Accounts> = Mutex::new(Accounts { subuid: None });
    ACCOUNTS
        .lock()
        .expect("accounts lock")
        .account_of(uid, namespace, is_account)
}

fn is_account(uid: u32) -> bool {
    matches!(User::from_uid(Uid::from_raw(uid)), Ok(Some(_)))
}

/// The system's accounts, as the daemon reads them: /etc/subuid (read
/// again when it changes) and the user and group databases (NSS).
#[derive(Default)]
pub struct Accounts {
    subuid: Option<(i64, u64, Vec<SubordinateRange>)>,
}

impl Accounts {
    /// The account a peer with `uid` in user namespace `namespace` is
    /// charged to; `is_account` tells a uid of the user database.
    pub fn account_of(
        &mut self,
        uid: u32,
        namespace: &PeerNamespace,
        is_account: impl Fn(u32) -> bool,
    ) -> Result<u32, PeerGone> {
        let by_range = owner_in(self.ranges(), uid);
        if by_range != uid {
            return Ok(by_range);
        }
        let owner = match namespace {
            PeerNamespace::Ours => return Ok(uid),
            PeerNamespace::Other(ns) => namespace_owner(ns),
            PeerNamespace::Gone => None,
        };
        match owner {
            // A namespace root made is root's business: its uids count as
            // themselves, not as root's.
            Some(owner) if owner != 0 && owner != uid => Ok(owner_in(self.ranges(), owner)),
            Some(_) => Ok(uid),
            None if uid == 0 || is_account(uid) => Ok(uid),
            None => Err(PeerGone { uid }),
        }
    }

    fn ranges(&mut self) -> &[SubordinateRange] {
        let stamp = std::fs::metadata(SUBUID)
            .map(|m| (m.mtime(), m.ino()))
            .unwrap_or((0, 0));
        let fresh = matches!(&self.subuid, Some((t, i, _)) if (*t, *i) == stamp);
        if !fresh {
            let text = std::fs::read_to_string(SUBUID).unwrap_or_default();
            let ranges = parse_subuid(&text, |name| {
                User::from_name(name).ok().flatten().map(|u| u.uid.as_raw())
            });
            self.subuid = Some((stamp.0, stamp.1, ranges));
        }
        &self.subuid.as_ref().expect("just read").2
    }
}

/// How long a looked-up account's groups are reused: the group database
/// may be a directory (NSS over LDAP) that answers slowly, and the daemon
/// asks at every connection, on its one thread.
const GROUPS_FOR: Duration = Duration::from_secs(30);
/// The accounts whose groups are kept at once.
const GROUPS_KEPT: usize = 1024;

/// The groups `account` is a member of in the group database (its
/// primary group among them); none for a uid that is no account. Reused
/// for GROUPS_FOR.
pub fn member_groups(account: u32) -> Vec<u32> {
    static KEPT: Mutex<BTreeMap<u32, (Instant, Vec<u32>)>> = Mutex::new(BTreeMap::new());
    let now = Instant::now();
    if let Some((at, groups)) = KEPT.lock().expect("groups lock").get(&account)
        && now.duration_since(*at) < GROUPS_FOR
    {
        return groups.clone();
    }
    let groups = look_up_groups(account);
    let mut kept = KEPT.lock().expect("groups lock");
    if kept.len() >= GROUPS_KEPT {
        kept.retain(|_, (at, _)| now.duration_since(*at) < GROUPS_FOR);
    }
    if kept.len() < GROUPS_KEPT {
        kept.insert(account, (now, groups.clone()));
    }
    groups
}

fn look_up_groups(account: u32) -> Vec<u32> {
    let Ok(Some(user)) = User::from_uid(Uid::from_raw(account)) else {
        return Vec::new();
    };
    let Ok(name) = std::ffi::CString::new(user.name.clone()) else {
        return vec![user.gid.as_raw()];
    };
    getgrouplist(&name, user.gid)
        .map(|groups| groups.into_iter().map(Gid::as_raw).collect())
        .unwrap_or_else(|_| vec![user.gid.as_raw()])
}

/// `NS_GET_OWNER_UID` and `NS_GET_PARENT` (linux/nsfs.h).
const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;
const NS_GET_PARENT: libc::c_ulong = 0xb702;

/// The owner of user namespace `ns`, another than the daemon's, as the
/// daemon sees it: of the one just below the daemon's on the way to it
/// (whose owner is a uid of the daemon's namespace). None when it cannot
/// be told.
fn namespace_owner(ns: &File) -> Option<u32> {
    let ours = std::fs::metadata("/proc/self/ns/user").ok()?.ino();
    let mut ns = ns.try_clone().ok()?;
    // Up to the namespace whose parent is ours (at most 32 levels).
    for _ in 0..32 {
        // SAFETY: NS_GET_PARENT takes no argument and returns a new fd.
        let parent = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_PARENT) };
        if parent < 0 {
            return None;
        }
        // SAFETY: the ioctl returned a new descriptor that nothing else owns.
        let parent = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(parent) };
        if parent.metadata().ok()?.ino() == ours {
            let mut uid: libc::uid_t = 0;
            // SAFETY: NS_GET_OWNER_UID writes one uid_t to the pointer.
            let rc = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_OWNER_UID, &mut uid) };
            return (rc == 0).then_some(uid);
        }
        ns = parent;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subordinate_uids_count_as_their_ranges_owner() {
        let ranges = parse_subuid(
            "# podman's\nalice:200000:65536\n1001:300000:65536\nbogus\nnobody-known:400000:10\n\nbob:500000:x\n",
            |name| (name == "alice").then_some(1000),
        );
        assert_eq!(
            ranges,
            vec![
                SubordinateRange {
                    owner: 1000,
                    first: 200000,
                    count: 65536
                },
                SubordinateRange {
                    owner: 1001,
                    first: 300000,
                    count: 65536
                },
            ]
        );
        assert_eq!(owner_in(&ranges, 200000), 1000);
        assert_eq!(owner_in(&ranges, 265535), 1000);
        assert_eq!(owner_in(&ranges, 265536), 265536, "past the range");
        assert_eq!(owner_in(&ranges, 300001), 1001);
        assert_eq!(owner_in(&ranges, 1000), 1000);
        let edge = [SubordinateRange {
            owner: 7,
            first: u32::MAX - 1,
            count: 10,
        }];
        assert_eq!(owner_in(&edge, u32::MAX), 7, "no overflow at the top");
    }

    #[test]
    fn a_peer_whose_namespace_is_gone_counts_as_its_uid_only_if_that_is_an_account() {
        let mut accounts = Accounts::default();
        let known = |uid| uid == 1000;
        let gone = PeerNamespace::Gone;
        assert_eq!(accounts.account_of(1000, &gone, known), Ok(1000));
        assert_eq!(accounts.account_of(0, &gone, known), Ok(0));
        assert_eq!(
            accounts.account_of(4_000_000_000, &gone, known),
            Err(PeerGone { uid: 4_000_000_000 }),
            "a subordinate uid from a source other than /etc/subuid"
        );
        let ours = PeerNamespace::Ours;
        assert_eq!(
            accounts.account_of(4_000_000_000, &ours, known),
            Ok(4_000_000_000)
        );
    }
}
