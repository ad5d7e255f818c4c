//! A user namespace and a network namespace of a user's own, for the
//! rootless daemon: the user is root inside, with every capability over
//! the new network namespace and none over the host's. The user's own ids
//! are mapped to root; when /etc/subuid and /etc/subgid give the user
//! ranges and `newuidmap`/`newgidmap` (package `uidmap`) are installed,
//! ids 1 and up map to those ranges too, as podman does.

use std::io;
use std::process::Command;

use nix::sched::{CloneFlags, unshare};

/// The id maps that make `uid`/`gid` root inside and map nothing else:
/// (`uid_map`, `gid_map`), as the kernel reads them.
pub fn single_id_maps(uid: u32, gid: u32) -> (String, String) {
    (format!("0 {uid} 1\n"), format!("0 {gid} 1\n"))
}

/// Moves the calling process (which must have one thread) into a new user
/// namespace and a new network namespace, with no ids mapped yet.
pub fn unshare_user_and_net() -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET).map_err(|e| {
        io::Error::other(format!(
            "cannot create a user namespace ({e}); user namespaces may be off on this host (user.max_user_namespaces, kernel.unprivileged_userns_clone, or an AppArmor/SELinux rule)"
        ))
    })
}

/// Maps the calling process's own ids to root in the namespace it just
/// made. An unprivileged process may map only itself, and may write its
/// gid map only once `setgroups` is denied (so it can never shed a group
/// to reach what that group is refused).
pub fn map_self(uid: u32, gid: u32) -> io::Result<()> {
    let (uid_map, gid_map) = single_id_maps(uid, gid);
    let write = |file: &str, text: &str| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| io::Error::other(format!("cannot write /proc/self/{file}: {e}")))
    };
    write("setgroups", "deny")?;
    write("uid_map", &uid_map)?;
    write("gid_map", &gid_map)
}

/// A user's first range in a /etc/subuid or /etc/subgid text
/// (`NAME:START:COUNT` or `ID:START:COUNT` lines): (start, count).
pub fn sub_ids(text: &str, name: Option<&str>, id: u32) -> Option<(u32, u32)> {
    text.lines().find_map(|line| {
        let mut f = line.trim().split(':');
        let (who, start, count) = (f.next()?, f.next()?, f.next()?);
        let ours = Some(who) == name || who.parse() == Ok(id);
        let range = (start.parse().ok()?, count.parse::<u32>().ok()?);
        (ours && range.1 > 0).then_some(range)
    })
}

/// The arguments of newuidmap/newgidmap for process `pid`: `id` to root,
/// the subordinate range from 1.
pub fn subid_map_args(pid: u32, id: u32, (start, count): (u32, u32)) -> Vec<String> {
    [pid, 0, id, 1, 1, start, count]
        .iter()
        .map(u32::to_string)
        .collect()
}

/// Maps process `pid`'s new namespace with the user's subordinate ranges
/// as well, through the setuid helpers. `Ok(false)` when the user has no
/// ranges or the helpers are missing: the process then maps itself.
pub fn map_with_sub_ids(pid: u32, uid: u32, gid: u32) -> io::Result<bool> {
    let name = nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map(|u| u.name);
    let ranges = |file: &str, id: u32| {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|t| sub_ids(&t, name.as_deref(), id))
    };
    let (Some(subuids), Some(subgids)) = (ranges("/etc/subuid", uid), ranges("/etc/subgid", gid))
    else {
        return Ok(false);
    };
    let helpers = [("newuidmap", uid, subuids), ("newgidmap", gid, subgids)];
    if helpers
        .iter()
        .any(|(tool, ..)| super::egress::on_path(tool).is_none())
    {
        return Ok(false);
    }
    for (tool, id, range) in helpers {
        let out = Command::new(tool)
            .args(subid_map_args(pid, id, range))
            .output()
            .map_err(|e| io::Error::other(format!("cannot run {tool}: {e}")))?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{tool} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(true)
}

/// Whether this user may open the TUN device, which the namespace's TAPs
/// (and pasta) need; distributions ship it open to all (0666).
pub fn check_tun() -> io::Result<()> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(super::TUN_DEVICE)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(io::Error::other(format!(
            "cannot open {}: {e}; a rootless linnet needs it open to every user, as distributions ship it (mode 0666): ask root to run `chmod 0666 {}`",
            super::TUN_DEVICE,
            super::TUN_DEVICE
        ))),
        Err(e) => Err(io::Error::other(format!(
            "cannot open {}: {e}; the kernel needs TUN/TAP support (CONFIG_TUN)",
            super::TUN_DEVICE
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_subordinate_range_is_found_by_name_or_id() {
        let text = "alice:100000:65536\n4312:200000:1000\nbob:300000:0\n";
        assert_eq!(sub_ids(text, Some("alice"), 1000), Some((100000, 65536)));
        assert_eq!(sub_ids(text, None, 4312), Some((200000, 1000)));
        assert_eq!(sub_ids(text, Some("bob"), 1001), None, "an empty range");
        assert_eq!(sub_ids(text, Some("carol"), 1002), None);
        assert_eq!(
            subid_map_args(77, 4312, (200000, 1000)),
            ["77", "0", "4312", "1", "1", "200000", "1000"]
        );
    }

    #[test]
    fn the_user_is_root_inside_and_nobody_else_is_mapped() {
        let (u, g) = single_id_maps(1000, 100);
        assert_eq!(u, "0 1000 1\n");
        assert_eq!(g, "0 100 1\n");
    }
}
