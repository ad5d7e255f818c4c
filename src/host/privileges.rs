//! Giving up privileges: `linnet run` and `linnet helper` need root only to
//! start a daemon; the VMM and the relay need only the TAP fd and a socket.
//! Root via sudo (or with --user) becomes the invoking user before it asks
//! the daemon for anything, so the daemon sees who really asks and the TAP
//! is that user's; every capability goes, and no_new_privs keeps them from
//! coming back on exec.

use std::ffi::CString;
use std::io;

use nix::unistd::{Gid, Group, Uid, User};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PrivilegeError {
    #[error("--user {0}: no such user (give a name, a uid, or UID:GID)")]
    UnknownUser(String),
    #[error("--user {0}: no such group")]
    UnknownGroup(String),
    #[error("--user needs root: only root can become another user")]
    NotRoot,
    #[error("SUDO_UID/SUDO_GID are not numbers ({0}); unset them or run without sudo")]
    BadSudoIds(String),
    #[error("cannot become uid {uid} gid {gid}: {source}")]
    Switch {
        uid: u32,
        gid: u32,
        source: io::Error,
    },
    #[error("cannot drop capabilities: {0}")]
    Capabilities(io::Error),
}

/// A user to become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

/// Whom a root client becomes: `user` (NAME, UID, NAME:GROUP or UID:GID),
/// else SUDO_UID/SUDO_GID. None: stay who we are (root without sudo, or
/// with `--user root`, or not root at all).
pub fn target(user: Option<&str>) -> Result<Option<Identity>, PrivilegeError> {
    let root = Uid::effective().is_root();
    let Some(spec) = user else {
        return Ok(if root { sudo_ids()? } else { None }.filter(|t| t.uid != 0));
    };
    if !root {
        return Err(PrivilegeError::NotRoot);
    }
    let (who, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let unknown = || PrivilegeError::UnknownUser(spec.into());
    let user = match who.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| (uid, u.gid.as_raw()))
            .or(group.map(|_| (uid, uid))),
        Err(_) => User::from_name(who)
            .ok()
            .flatten()
            .map(|u| (u.uid.as_raw(), u.gid.as_raw())),
    };
    let (uid, primary) = user.ok_or_else(unknown)?;
    let gid = match group {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => Group::from_name(g)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
                .ok_or_else(|| PrivilegeError::UnknownGroup(g.into()))?,
        },
    };
    Ok((uid != 0).then_some(Identity { uid, gid }))
}

/// Becomes `who` (when given), then clears all capabilities (effective,
/// permitted, inheritable, ambient) and sets no_new_privs. Call it before
/// starting threads: capabilities belong to each thread.
pub fn become_user(who: Option<Identity>) -> Result<(), PrivilegeError> {
    if let Some(Identity { uid, gid }) = who {
        let err = |source: nix::Error| PrivilegeError::Switch {
            uid,
            gid,
            source: source.into(),
        };
        let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
        match User::from_uid(u).ok().flatten() {
            Some(user) => {
                let name = CString::new(user.name).expect("user names have no NUL");
                nix::unistd::initgroups(&name, g).map_err(err)?;
            }
            None => nix::unistd::setgroups(&[g]).map_err(err)?,
        }
        nix::unistd::setresgid(g, g, g).map_err(err)?;
        nix::unistd::setresuid(u, u, u).map_err(err)?;
    }
    clear_capabilities().map_err(PrivilegeError::Capabilities)
}

fn sudo_ids() -> Result<Option<Identity>, PrivilegeError> {
    let (Ok(uid), Ok(gid)) = (std::env::var("SUDO_UID"), std::env::var("SUDO_GID")) else {
        return Ok(None);
    };
    match (uid.parse(), gid.parse()) {
        (Ok(uid), Ok(gid)) => Ok(Some(Identity { uid, gid })),
        _ => Err(PrivilegeError::BadSudoIds(format!("{uid}/{gid}"))),
    }
}

// From <linux/capability.h>.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Clears every capability and sets no_new_privs: async-signal-safe (two
/// prctl calls and capset), so a child may call it between fork and exec.
pub fn clear_capabilities() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // Ambient capabilities need kernel 4.3; older kernels have none to clear.
    // SAFETY: as above.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: header and two data structs, as capset(2) wants for version 3.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
