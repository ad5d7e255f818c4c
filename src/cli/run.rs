//! `linnet run [options] -- CMD ARGS…`: attach an interface, start CMD with
//! the TAP fd inherited, wait, detach. The interface lives as long as this
//! process keeps its connection to the daemon.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use super::Cli;
use crate::api::{AttachRequest, InterfaceInfo, Request, Response};
use crate::types::{InterfaceId, MacAddr};

#[derive(Args)]
#[command(after_help = "\
CMD gets the TAP file descriptor. For qemu-system-* (unless its arguments use {fd}) linnet appends
  -netdev tap,id=lnet0,fd=FD -device virtio-net-pci,netdev=lnet0,mac=MAC
For any CMD these placeholders are replaced in its arguments:
  {fd} {mac} {ip} {tap} {gateway} {network} {interface_id}
and these are set in its environment:
  LINNET_FD LINNET_MAC LINNET_IP LINNET_TAP LINNET_GATEWAY LINNET_NETWORK LINNET_INTERFACE_ID

Examples:
  linnet run -- qemu-system-x86_64 -m 512 -nographic -kernel vmlinuz -initrd initrd.img
  linnet run --network host --name db -- cloud-hypervisor --net fd={fd},mac={mac} ...

Exit status: CMD's, or 125 when linnet itself failed.")]
pub struct RunArgs {
    /// Network to attach to.
    #[arg(long, short, default_value = crate::config::DEFAULT_NETWORK)]
    pub network: String,
    /// Interface id (a UUID); the same id always gets the same MAC and IP. Default: a new one.
    #[arg(long, value_name = "UUID")]
    pub interface_id: Option<InterfaceId>,
    /// MAC address for the VM. Default: derived from the interface id.
    #[arg(long)]
    pub mac: Option<MacAddr>,
    /// The VM's name: answered by the network's DNS as NAME.<network>.linnet.
    #[arg(long)]
    pub name: Option<String>,
    /// Write the interface JSON here (default: one line on stderr).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// The command to run, usually a VMM.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

/// Signals for CMD: delivered to it when sent to `linnet run`.
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

pub fn main(cli: &Cli, args: &RunArgs) -> anyhow::Result<u8> {
    if let Some(name) = &args.name {
        crate::types::validate_hostname(name)?;
    }
    let channel = cli.connect_or_start()?;
    let request = AttachRequest {
        network: Some(args.network.clone()),
        interface_id: args.interface_id,
        mac: args.mac,
        name: args.name.clone(),
    };
    let (response, fds) = channel.call(&Request::Attach(request))?;
    let info = match response {
        Response::Attached { interface } => *interface,
        Response::Error { message, .. } => bail!(message),
        other => bail!("unexpected reply from the daemon: {other:?}"),
    };
    let tap = fds
        .into_iter()
        .next()
        .context("the daemon sent no TAP file descriptor")?;
    publish(&info, args.json.as_deref())?;

    let mut signals = SigSet::empty();
    for s in FORWARDED {
        signals.add(s);
    }
    signals.thread_block().context("cannot block signals")?;
    let mut command = build_command(&args.command, &info, tap.as_raw_fd());
    let tap_fd = tap.as_raw_fd();
    // SAFETY: only async-signal-safe calls (fcntl, sigprocmask) run in the child.
    unsafe {
        command.pre_exec(move || {
            let flags = libc::fcntl(tap_fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(tap_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
            nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            eprintln!("linnet: cannot start {}: {e}", args.command[0]);
            return Ok(code);
        }
    };
    drop(tap);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || forward_signals(signals, pid));
    std::thread::spawn(move || watch_daemon(channel));

    let status = child.wait().context("waiting for the command")?;
    // Exiting closes the connection, which detaches the interface.
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128 + sig as u8,
        _ => 1,
    })
}

fn publish(info: &InterfaceInfo, path: Option<&Path>) -> anyhow::Result<()> {
    let json = serde_json::to_string(info)?;
    match path {
        Some(path) => std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("cannot write {}", path.display())),
        None => writeln!(io::stderr(), "{json}").context("cannot write the interface JSON"),
    }
}

/// Replaces placeholders, sets LINNET_* and, for QEMU, adds the NIC.
fn build_command(argv: &[String], info: &InterfaceInfo, fd: RawFd) -> Command {
    let values = [
        ("{fd}", fd.to_string()),
        ("{mac}", info.mac_address.to_string()),
        ("{ip}", info.ip_address.to_string()),
        ("{tap}", info.tap.clone()),
        ("{gateway}", info.gateway.to_string()),
        ("{network}", info.network.clone()),
        ("{interface_id}", info.interface_id.to_string()),
    ];
    let substitute = |arg: &str| {
        values
            .iter()
            .fold(arg.to_string(), |a, (k, v)| a.replace(k, v))
    };
    let mut args: Vec<String> = argv[1..].iter().map(|a| substitute(a)).collect();
    // QEMU reads IFF_VNET_HDR from the TAP itself (and refuses vnet_hdr= with fd=).
    if is_qemu(&argv[0]) && !argv.iter().any(|a| a.contains("{fd}")) {
        args.extend([
            "-netdev".into(),
            format!("tap,id=lnet0,fd={fd}"),
            "-device".into(),
            format!("virtio-net-pci,netdev=lnet0,mac={}", info.mac_address),
        ]);
    }
    let mut cmd = Command::new(&argv[0]);
    cmd.args(args);
    for (key, (_, value)) in [
        "LINNET_FD",
        "LINNET_MAC",
        "LINNET_IP",
        "LINNET_TAP",
        "LINNET_GATEWAY",
        "LINNET_NETWORK",
        "LINNET_INTERFACE_ID",
    ]
    .iter()
    .zip(&values)
    {
        cmd.env(key, value);
    }
    cmd
}

fn is_qemu(program: &str) -> bool {
    Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("qemu-system-"))
}

/// Passes on signals that someone sent to `linnet run`. Signals from the
/// terminal (Ctrl-C) already reach CMD, which shares our process group.
fn forward_signals(signals: SigSet, child: nix::unistd::Pid) {
    loop {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `signals` is a valid set and `info` a writable siginfo_t.
        let sig = unsafe { libc::sigwaitinfo(signals.as_ref(), &mut info) };
        if sig < 0 {
            continue;
        }
        if info.si_code == libc::SI_KERNEL {
            continue;
        }
        if let Ok(sig) = Signal::try_from(sig) {
            let _ = nix::sys::signal::kill(child, sig);
        }
    }
}

/// Holds the connection (our interface's lifeline) and reports if the daemon goes.
fn watch_daemon(channel: crate::api::Channel) {
    loop {
        match channel.recv::<Response>() {
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => {
                eprintln!("linnet: the linnet daemon went away: this VM's interface is gone");
                // Keep the socket open until we exit, so nothing else changes.
                loop {
                    std::thread::park();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> InterfaceInfo {
        serde_json::from_value(serde_json::json!({
            "vmnet_interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001",
            "vmnet_mac_address": "02:00:00:00:00:01", "vmnet_mtu": 1500, "vmnet_max_packet_size": 1514,
            "vmnet_start_address": "192.168.105.2", "vmnet_end_address": "192.168.105.254",
            "vmnet_subnet_mask": "255.255.255.0", "network": "shared", "mode": "shared", "datapath": "tap",
            "interface_id": "6b1c6b70-1111-4c4c-9c9c-000000000001", "mac_address": "02:00:00:00:00:01",
            "ip_address": "192.168.105.2", "gateway": "192.168.105.1", "dns": ["192.168.105.1"],
            "domain": "shared.linnet", "subnet": "192.168.105.0/24", "tap": "lnt0123456789ab", "mtu": 1500,
            "forwards": []
        }))
        .unwrap()
    }

    fn argv(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn qemu_gets_a_virtio_nic_on_the_fd() {
        let cmd = build_command(
            &[
                "/usr/bin/qemu-system-x86_64".into(),
                "-m".into(),
                "256".into(),
            ],
            &info(),
            7,
        );
        assert_eq!(
            argv(&cmd),
            [
                "-m",
                "256",
                "-netdev",
                "tap,id=lnet0,fd=7",
                "-device",
                "virtio-net-pci,netdev=lnet0,mac=02:00:00:00:00:01"
            ]
        );
    }

    #[test]
    fn placeholders_are_replaced_and_env_set_for_any_command() {
        let cmd = build_command(
            &[
                "vmm".into(),
                "--net".into(),
                "fd={fd},mac={mac}".into(),
                "{ip}/{tap}@{gateway}".into(),
            ],
            &info(),
            9,
        );
        assert_eq!(
            argv(&cmd),
            [
                "--net",
                "fd=9,mac=02:00:00:00:00:01",
                "192.168.105.2/lnt0123456789ab@192.168.105.1"
            ]
        );
        let env: Vec<_> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.unwrap().to_string_lossy().into_owned(),
                )
            })
            .collect();
        assert!(env.contains(&("LINNET_FD".into(), "9".into())));
        assert!(env.contains(&("LINNET_NETWORK".into(), "shared".into())));
    }

    #[test]
    fn qemu_with_its_own_fd_placeholder_is_left_alone() {
        let cmd = build_command(
            &[
                "qemu-system-aarch64".into(),
                "-netdev".into(),
                "tap,id=n,fd={fd}".into(),
            ],
            &info(),
            5,
        );
        assert_eq!(argv(&cmd), ["-netdev", "tap,id=n,fd=5"]);
    }
}
