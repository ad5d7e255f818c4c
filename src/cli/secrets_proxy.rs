//! `linnet-secrets`: one network's secrets proxy (`secret_proxy`). The
//! daemon starts one per network whose VMs have secret rules
//! (`daemon::secret_proxies`), as a user of its own with no capabilities,
//! with one end of a SOCK_SEQPACKET pair as fd 3 and the listening socket
//! its steered connections come to as fd 4. It reads what guests send
//! (TLS, HTTP), so it opens no file, and confines itself (seccomp) once
//! it has its CA and trust store, before it accepts a connection: it can
//! accept on that socket, connect out over TCP, and read and write what
//! it holds (docs/security.md, "The secrets proxy under seccomp").

use std::os::fd::FromRawFd;
use std::process::ExitCode;

use super::gate::socket_of;
use super::seccomp;
use crate::secret_proxy::process::{DAEMON_FD, EXECUTABLE, LISTENER_FD, serve, start};

const USAGE: &str = "usage: linnet-secrets

Started by the linnet daemon, never by hand: one network's secrets proxy,
which puts the secrets a VM may use into its HTTPS requests to the hosts
its secret rules name, over the sockets the daemon passes as fds 3 and 4.";

pub fn main() -> ExitCode {
    if std::env::args_os().len() > 1 {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    // Nothing of the same uid may reach into it: it holds a CA's key and
    // secrets' values.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if !socket_of(DAEMON_FD, libc::SOCK_SEQPACKET) || !socket_of(LISTENER_FD, libc::SOCK_STREAM) {
        eprintln!(
            "{EXECUTABLE}: fds {DAEMON_FD} and {LISTENER_FD} are not the daemon's sockets\n\n{USAGE}"
        );
        return ExitCode::from(2);
    }
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("{EXECUTABLE}: {e}");
        ExitCode::from(1)
    };
    let (network, proxy, records) = match start(DAEMON_FD) {
        Ok(started) => started,
        Err(e) => return fail(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&e),
    };
    if let Err(e) = seccomp::confine_secrets(EXECUTABLE) {
        return fail(&e);
    }
    // SAFETY: fd 4 is the listening socket the daemon passed, ours now.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(LISTENER_FD) };
    match runtime.block_on(serve(proxy, records, DAEMON_FD, listener)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("network {network}: {e}")),
    }
}
