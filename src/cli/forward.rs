//! `linnet forward add|rm|ls`: publish ports of attached VMs at runtime.

use anyhow::bail;
use clap::{Args, Subcommand};

use super::ls::{print_table, row};
use super::{Cli, InterfaceArgs};
use crate::api::{ForwardRequest, Request, Response};
use crate::forward::PortForward;

#[derive(Subcommand)]
pub enum ForwardCommand {
    /// Publish a port of an attached VM. It lasts until `forward rm`, also
    /// across detach (it comes back when the same interface id attaches)
    /// and daemon restarts.
    Add(ForwardArgs),
    /// Stop publishing a port.
    Rm(ForwardArgs),
    /// List the ports published to attached VMs.
    Ls(ForwardLsArgs),
}

#[derive(Args)]
pub struct ForwardArgs {
    #[command(flatten)]
    which: InterfaceArgs,
    /// Connections to HOST_PORT on the host's addresses (or only HOST_ADDR)
    /// go to GUEST_PORT of the VM; TCP unless /udp.
    #[arg(value_name = "[HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp]")]
    forward: PortForward,
}

#[derive(Args)]
pub struct ForwardLsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn main(cli: &Cli, cmd: &ForwardCommand) -> anyhow::Result<()> {
    let request = match cmd {
        ForwardCommand::Add(a) => Request::ForwardAdd(a.request()),
        ForwardCommand::Rm(a) => Request::ForwardRemove(a.request()),
        ForwardCommand::Ls(_) => Request::ForwardList,
    };
    let (response, _) = cli.connect()?.call(&request)?;
    match (response, cmd) {
        (Response::Ok, _) => Ok(()),
        (Response::Forwards { forwards }, ForwardCommand::Ls(args)) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&forwards)?);
                return Ok(());
            }
            if forwards.is_empty() {
                println!("no ports published");
                return Ok(());
            }
            let mut rows = vec![row(&[
                "NETWORK",
                "INTERFACE",
                "NAME",
                "HOST",
                "GUEST",
                "GUEST6",
                "ORIGIN",
            ])];
            for f in forwards {
                let host = match f.forward.host_addr {
                    Some(a) => std::net::SocketAddr::new(a, f.forward.host_port).to_string(),
                    None => format!("*:{}", f.forward.host_port),
                };
                rows.push(vec![
                    f.network,
                    f.interface_id.to_string(),
                    f.name.unwrap_or_else(|| "-".into()),
                    format!("{host}/{}", f.forward.protocol.as_str()),
                    f.guest.to_string(),
                    f.guest6
                        .map(|g| g.to_string())
                        .unwrap_or_else(|| "-".into()),
                    serde_json::to_value(f.origin)?
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ]);
            }
            print_table(&rows);
            Ok(())
        }
        (Response::Error { message, .. }, _) => bail!(message),
        (other, _) => bail!("unexpected reply from the daemon: {other:?}"),
    }
}

impl ForwardArgs {
    fn request(&self) -> ForwardRequest {
        let which = self.which.interface();
        ForwardRequest {
            network: which.network,
            interface_id: which.interface_id,
            name: which.name,
            forward: self.forward,
        }
    }
}
