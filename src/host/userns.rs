//! A user namespace and a network namespace of a user's own, for the
//! rootless daemon: the user is root inside (one id mapped: the user's
//! own; nothing linnet runs inside needs another), with every capability
//! over the new network namespace and none over the host's.

use std::io;

use nix::sched::{CloneFlags, unshare};

/// The id maps that make `uid`/`gid` root inside and map nothing else:
/// (`uid_map`, `gid_map`), as the kernel reads them.
pub fn single_id_maps(uid: u32, gid: u32) -> (String, String) {
    (format!("0 {uid} 1\n"), format!("0 {gid} 1\n"))
}

/// Moves the calling process (which must have one thread) into a new user
/// namespace and a new network namespace, and maps its own ids to root
/// there. An unprivileged process may map only itself, and may write its
/// gid map only once `setgroups` is denied (so it can never shed a group
/// to reach what that group is refused).
pub fn enter_own_namespaces() -> io::Result<()> {
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET).map_err(|e| {
        io::Error::other(format!(
            "cannot create a user namespace ({e}); user namespaces may be off on this host (user.max_user_namespaces, kernel.unprivileged_userns_clone, or an AppArmor/SELinux rule)"
        ))
    })?;
    let (uid_map, gid_map) = single_id_maps(uid, gid);
    let write = |file: &str, text: &str| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| io::Error::other(format!("cannot write /proc/self/{file}: {e}")))
    };
    write("setgroups", "deny")?;
    write("uid_map", &uid_map)?;
    write("gid_map", &gid_map)?;
    Ok(())
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
    fn the_user_is_root_inside_and_nobody_else_is_mapped() {
        let (u, g) = single_id_maps(1000, 100);
        assert_eq!(u, "0 1000 1\n");
        assert_eq!(g, "0 100 1\n");
    }
}
