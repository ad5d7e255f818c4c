//! `linnet connect`: connects to a network's socket_vmnet-compatible socket
//! and runs a command with the connection as fd 3, as socket_vmnet_client
//! does on macOS: `-netdev socket,id=net0,fd=3` in QEMU, minikube's and
//! lima's way to such a socket. The VM's interface appears on its first
//! frame and goes when the connection closes (the command exits).

use std::ffi::OsString;
use std::io;
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

use super::Cli;
use crate::api::{Request, Response};
use crate::host::privileges;

/// Where the connection is for the command.
const CONNECTION_FD: i32 = 3;

#[derive(Args)]
#[command(after_help = "\
Examples:
  # QEMU on the shared network's socket (networks.yaml: shared: { socket: true }):
  linnet connect shared -- qemu-system-x86_64 ... \\
      -netdev socket,id=net0,fd=3 -device virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56

The VM's MAC is its own (the first frame's source; anti-spoofing holds it to
that from then on); its address is the one linnet's DHCP reserves for that MAC
(`linnet ls` shows it). As root through sudo, it becomes SUDO_UID/SUDO_GID first,
so the connection and the command are that user's.")]
pub struct ConnectArgs {
    /// A network (its socket, as `linnet ls` shows it) or a socket's path.
    #[arg(value_name = "NETWORK|PATH")]
    pub target: String,
    /// The command, run with the connection as fd 3.
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

pub fn main(cli: &Cli, args: &ConnectArgs) -> anyhow::Result<()> {
    privileges::become_user(privileges::target(None)?)?;
    let path = socket_of(cli, &args.target)?;
    let conn = UnixStream::connect(&path).map_err(|e| refused(&path, e))?;
    // The connection becomes fd 3 of the command, and only that.
    let fd = conn.into_raw_fd();
    // SAFETY: dup2/fcntl on a descriptor we own; fd 3 is replaced or kept.
    unsafe {
        if fd != CONNECTION_FD {
            if libc::dup2(fd, CONNECTION_FD) < 0 {
                return Err(io::Error::last_os_error()).context("cannot place the connection");
            }
            libc::close(fd);
        } else if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
            return Err(io::Error::last_os_error()).context("cannot pass the connection");
        }
    }
    let (program, rest) = args.command.split_first().expect("clap requires one");
    let e = Command::new(program).args(rest).exec();
    Err(e).with_context(|| format!("cannot run {}", program.to_string_lossy()))
}

/// A path as given, or the socket the daemon lists for the network.
fn socket_of(cli: &Cli, target: &str) -> anyhow::Result<PathBuf> {
    if target.contains('/') {
        return Ok(PathBuf::from(target));
    }
    let (response, _) = cli.connect()?.call(&Request::List)?;
    let Response::Listing { networks, .. } = response else {
        bail!("unexpected reply from the daemon: {response:?}");
    };
    let Some(network) = networks.iter().find(|n| n.name == target) else {
        let known: Vec<&str> = networks.iter().map(|n| n.name.as_str()).collect();
        bail!(
            "unknown network \"{target}\"; known networks: {}",
            known.join(", ")
        );
    };
    network.socket.clone().with_context(|| {
        format!(
            "network \"{target}\" has no socket; set `socket: true` for it in networks.yaml and restart the daemon"
        )
    })
}

fn refused(path: &std::path::Path, e: io::Error) -> anyhow::Error {
    let fix = match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            "; is the daemon running, with `socket:` set for the network in networks.yaml?"
        }
        io::ErrorKind::PermissionDenied => {
            "; the network's `allow` list does not admit you (the socket's owner and group follow it)"
        }
        _ => "",
    };
    anyhow::anyhow!("cannot connect to {}: {e}{fix}", path.display())
}
