//! Giving up privileges: after attaching, `linnet helper` needs only the
//! TAP fd and its socket. Root via sudo becomes the invoking user; every
//! capability goes, and no_new_privs keeps them from coming back on exec.

use std::ffi::CString;
use std::io;

use nix::unistd::{Gid, Uid, User};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PrivilegeError {
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

/// Drops to SUDO_UID/SUDO_GID when root through sudo, then clears all
/// capabilities (effective, permitted, inheritable, ambient) and sets
/// no_new_privs. Returns the uid switched to. Call it before starting
/// threads: capabilities belong to each thread.
pub fn drop_privileges() -> Result<Option<u32>, PrivilegeError> {
    let mut became = None;
    if Uid::effective().is_root()
        && let Some((uid, gid)) = sudo_ids()?
        && uid != 0
    {
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
        became = Some(uid);
    }
    clear_capabilities().map_err(PrivilegeError::Capabilities)?;
    Ok(became)
}

fn sudo_ids() -> Result<Option<(u32, u32)>, PrivilegeError> {
    let (Ok(uid), Ok(gid)) = (std::env::var("SUDO_UID"), std::env::var("SUDO_GID")) else {
        return Ok(None);
    };
    match (uid.parse(), gid.parse()) {
        (Ok(u), Ok(g)) => Ok(Some((u, g))),
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

fn clear_capabilities() -> io::Result<()> {
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
