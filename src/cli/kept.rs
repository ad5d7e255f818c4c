//! `linnet attach` and `linnet detach`: an interface that outlives the
//! command that made it, for a VMM started on its own (a Firecracker
//! `host_dev_name`, Cloud Hypervisor `--net tap=`, crosvm `--tap-name`)
//! that opens its TAP by name as the attaching user. The daemon keeps it
//! until `linnet detach`, or, on linnet's own networks, until its VM has
//! sent nothing for the network's lease_time.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use super::{AttachArgs, Cli};
use crate::api::{Request, Response};
use crate::datapath::Datapath;
use crate::types::InterfaceId;

#[derive(Args)]
#[command(after_help = "\
The TAP is persistent, owned by the attaching user (under sudo, or with --user, that user),
and named in the JSON (\"tap\"); a VMM running as that user opens it by name:
  linnet attach --name fc1 --json fc1.json
  firecracker ... (network-interfaces: host_dev_name = the JSON's tap, guest_mac = its mac_address)
  linnet detach --name fc1")]
pub struct AttachCmd {
    #[command(flatten)]
    pub attach: AttachArgs,
    /// Write the interface JSON here (default: stdout).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

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
    let (channel, daemon) = cli.connect_as_user(args.attach.user.as_deref())?;
    if let Some(mut daemon) = daemon {
        // Detached from us: an on-demand daemon stays while it has work.
        std::thread::spawn(move || daemon.wait());
    }
    // The TAP fd that comes back is dropped here: the TAP stays, persistent.
    let info = super::attach(&channel, &args.attach, Datapath::TapName, true)?.info;
    let json = serde_json::to_string(&info)?;
    match &args.json {
        Some(path) => std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => println!("{json}"),
    }
    Ok(())
}

pub fn detach(cli: &Cli, args: &DetachCmd) -> anyhow::Result<()> {
    let channel = cli.connect()?;
    let interface_id = match (args.interface_id, &args.name) {
        (Some(id), _) => id,
        (None, Some(name)) => find(&channel, &args.network, name)?,
        (None, None) => unreachable!("clap requires one"),
    };
    match channel.call(&Request::Detach { interface_id })?.0 {
        Response::Detached { .. } => Ok(()),
        Response::Error { message, .. } => bail!(message),
        other => bail!("unexpected reply from the daemon: {other:?}"),
    }
}

/// The id of the interface named `name` on `network`.
fn find(channel: &crate::api::Channel, network: &str, name: &str) -> anyhow::Result<InterfaceId> {
    let Response::Listing { interfaces, .. } = channel.call(&Request::List)?.0 else {
        bail!("the daemon did not list its interfaces");
    };
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
