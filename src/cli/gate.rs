//! `linnet-gate`: the process that judges held connections by the name
//! their first bytes show (`gate::process::serve`). The daemon starts one
//! (`daemon::gatekeeper`) as a user of its own with no capabilities,
//! hands it one end of a SOCK_SEQPACKET pair as fd 3, and relays it each
//! held packet; it answers with verdicts and records. It parses what
//! guests send, so it opens nothing, and confines itself (seccomp) before
//! reading a byte: it can read and write that socket and stderr, and
//! little else (docs/security.md, "The gate under seccomp").

use std::os::fd::RawFd;
use std::process::ExitCode;

use super::seccomp;
use crate::gate::process::{DAEMON_FD, EXECUTABLE, serve};

const USAGE: &str = "usage: linnet-gate

Started by the linnet daemon, never by hand: judges the connections of VMs
whose policy names DNS names by the name their first bytes show, over the
socket the daemon passes as fd 3.";

pub fn main() -> ExitCode {
    if std::env::args_os().len() > 1 {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    // Nothing of the same uid may reach into it.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if !socket_of(DAEMON_FD, libc::SOCK_SEQPACKET) {
        eprintln!("{EXECUTABLE}: fd {DAEMON_FD} is not the daemon's socket\n\n{USAGE}");
        return ExitCode::from(2);
    }
    if let Err(e) = seccomp::confine_gate(EXECUTABLE) {
        eprintln!("{EXECUTABLE}: {e}");
        return ExitCode::from(1);
    }
    match serve(DAEMON_FD) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{EXECUTABLE}: {e}");
            ExitCode::from(1)
        }
    }
}

/// Whether `fd` is a socket of type `kind` (SOCK_SEQPACKET, ...).
pub(super) fn socket_of(fd: RawFd, kind: libc::c_int) -> bool {
    let mut got: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt of an int into ours.
    let ok = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    ok == 0 && got == kind
}
