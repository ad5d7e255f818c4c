//! `linnet attach` and `linnet detach`: an interface that outlives the
//! command that made it, for a VMM started on its own (a Firecracker
//! `host_dev_name`, Cloud Hypervisor `--net tap=`, crosvm `--tap-name`)
//! that opens its TAP by name as the attaching user. The daemon keeps it
//! until `linnet detach`, or, on linnet's own networks, until its VM has
//! sent nothing for the network's lease_time.
//!
//! With `--vhost-user PATH` the interface needs a back-end running: a
//! process of its own (`linnet helper --vhost-user`'s, in a session of its
//! own) serves it until `linnet detach` stops it.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use super::{AttachArgs, Cli};
use crate::api::{InterfaceStatus, Request, Response};
use crate::datapath::Datapath;
use crate::types::InterfaceId;

#[derive(Args)]
#[command(after_help = "\
The TAP is persistent, owned by the attaching user (under sudo, or with --user, that user),
and named in the JSON (\"tap\"); a VMM running as that user opens it by name:
  linnet attach --name fc1 --json fc1.json
  firecracker ... (network-interfaces: host_dev_name = the JSON's tap, guest_mac = its mac_address)
  linnet detach --name fc1
With --vhost-user PATH, a vhost-user-net back-end listens at PATH instead, in a process of its
own (a session of its own; what it says until it serves goes to this command's stderr, later
messages nowhere: for a log, run `linnet helper --vhost-user` under a service manager),
until `linnet detach`:
  linnet attach --name vm1 --vhost-user /run/user/1000/vm1.vhost
  qemu-system-x86_64 ... -chardev socket,id=c0,path=/run/user/1000/vm1.vhost,reconnect=1 \\
      -netdev vhost-user,id=n0,chardev=c0 -device virtio-net-pci,netdev=n0,mac=MAC
  linnet detach --name vm1")]
pub struct AttachCmd {
    #[command(flatten)]
    pub attach: AttachArgs,
    /// Write the interface JSON here (default: stdout).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// The datapath `vhost-user`: a vhost-user-net back-end listening at PATH for a VMM
    /// started on its own (QEMU, libvirt), until `linnet detach`.
    #[arg(long, value_name = "PATH")]
    pub vhost_user: Option<PathBuf>,
}

/// Set for the process `linnet attach --vhost-user` starts: it attaches and
/// becomes the back-end (`linnet helper`'s way), its JSON on the pipe that
/// is its stdout.
const AS_BACKEND: &str = "LINNET_ATTACH_AS_BACKEND";

#[derive(Args)]
pub struct DetachCmd {
    /// The network the interface is on.
    #[arg(long, short, default_value = crate::config::DEFAULT_NETWORK)]
    pub network: String,
    /// The interface, by the name it was attached with.
    #[arg(
        long,
        conflicts_with = "interface_id",
        required_unless_present = "interface_id"
    )]
    pub name: Option<String>,
    /// The interface, by its id.
    #[arg(long, value_name = "UUID")]
    pub interface_id: Option<InterfaceId>,
}

pub fn attach(cli: &Cli, args: &AttachCmd) -> anyhow::Result<()> {
    if let Some(path) = &args.vhost_user {
        if std::env::var_os(AS_BACKEND).is_some() {
            let socket = super::relay::VmmSocket::VhostUserPath(path.clone());
            let header = crate::datapath::vnet::ClientHeader::None;
            return super::helper::serve(cli, &args.attach, socket, None, header);
        }
        let json = start_backend()?;
        return publish(&json, args.json.as_deref());
    }
    let (channel, daemon) = cli.connect_as_user(args.attach.user.as_deref())?;
    if let Some(mut daemon) = daemon {
        // Detached from us: an on-demand daemon stays while it has work.
        std::thread::spawn(move || daemon.wait());
    }
    // The TAP fd that comes back is dropped here: the TAP stays, persistent.
    let info = super::attach(&channel, &args.attach, Datapath::TapName, true)?.info;
    publish(&serde_json::to_string(&info)?, args.json.as_deref())
}

fn publish(json: &str, path: Option<&std::path::Path>) -> anyhow::Result<()> {
    match path {
        Some(path) => std::fs::write(path, format!("{}\n", json.trim_end()))
            .with_context(|| format!("cannot write {}", path.display())),
        None => {
            println!("{}", json.trim_end());
            Ok(())
        }
    }
}

/// This command again, in a session of its own, as the back-end: the
/// interface JSON it prints once it serves. What it says until then is
/// passed on to our stderr; after that it has nobody to say it to (a
/// caller that captures our output must not wait on the back-end's).
fn start_backend() -> anyhow::Result<String> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find the linnet executable")?;
    let (reader, writer) = std::io::pipe().context("cannot make a pipe")?;
    let mut command = std::process::Command::new(exe);
    command
        .args(std::env::args_os().skip(1))
        .env(AS_BACKEND, "1")
        .stdin(std::process::Stdio::null())
        .stdout(writer.try_clone().context("cannot make a pipe")?)
        .stderr(writer);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .context("cannot start the vhost-user back-end")?;
    drop(command);
    for line in std::io::BufReader::new(reader).lines() {
        let line = line.context("cannot read the back-end's output")?;
        if line.starts_with('{') {
            return Ok(line);
        }
        eprintln!("{line}");
    }
    let status = child.wait()?;
    bail!("the vhost-user back-end did not start ({status})")
}

pub fn detach(cli: &Cli, args: &DetachCmd) -> anyhow::Result<()> {
    let channel = cli.connect()?;
    let interface_id = match (args.interface_id, &args.name) {
        (Some(id), _) => id,
        (None, Some(name)) => find(&channel, &args.network, name)?,
        (None, None) => unreachable!("clap requires one"),
    };
    if let Some(relay) = vhost_user_relay(&channel, interface_id)? {
        return stop_relay(&channel, interface_id, relay);
    }
    match channel.call(&Request::Detach { interface_id })?.0 {
        Response::Detached { .. } => Ok(()),
        Response::Error { message, .. } => bail!(message),
        other => bail!("unexpected reply from the daemon: {other:?}"),
    }
}

/// The pid of the relay that serves `interface_id` as its vhost-user
/// back-end (`linnet attach --vhost-user`, `linnet helper --vhost-user`),
/// if it is one.
fn vhost_user_relay(
    channel: &crate::api::Channel,
    interface_id: InterfaceId,
) -> anyhow::Result<Option<i32>> {
    let interfaces = interfaces(channel)?;
    Ok(interfaces
        .iter()
        .find(|i| i.interface_id == interface_id && i.datapath == Datapath::VhostUser)
        .and_then(|i| i.client_pid)
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == super::relay::EXECUTABLE)
        }))
}

/// Stops the back-end `pid` (its own user's, or root may), which detaches
/// its interface; waits until it has.
fn stop_relay(
    channel: &crate::api::Channel,
    interface_id: InterfaceId,
    pid: i32,
) -> anyhow::Result<()> {
    use nix::sys::signal::{Signal, kill};
    kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM).map_err(|e| match e {
        nix::errno::Errno::EPERM => anyhow::anyhow!(
            "interface {interface_id} is served by another user's vhost-user back-end (pid {pid}); only that user or root can detach it"
        ),
        e => anyhow::anyhow!("cannot stop the vhost-user back-end of interface {interface_id} (pid {pid}): {e}"),
    })?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if !interfaces(channel)?
            .iter()
            .any(|i| i.interface_id == interface_id)
        {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "interface {interface_id}: its vhost-user back-end (pid {pid}) was asked to stop and has not detached it within 5 s"
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The daemon's interfaces, as `linnet ls` lists them.
fn interfaces(channel: &crate::api::Channel) -> anyhow::Result<Vec<InterfaceStatus>> {
    let Response::Listing { interfaces, .. } = channel.call(&Request::List)?.0 else {
        bail!("the daemon did not list its interfaces");
    };
    Ok(interfaces)
}

/// The id of the interface named `name` on `network`.
fn find(channel: &crate::api::Channel, network: &str, name: &str) -> anyhow::Result<InterfaceId> {
    let interfaces = interfaces(channel)?;
    interfaces
        .iter()
        .find(|i| {
            i.network == network && crate::types::names_match(i.name.as_deref(), name)
        })
        .map(|i| i.interface_id)
        .with_context(|| {
            format!(
                "no interface named \"{name}\" is attached to network \"{network}\"; `linnet ls` lists them"
            )
        })
}
