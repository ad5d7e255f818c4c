//! `linnet ca --network NAME`: the network's secrets CA certificate, for
//! a guest's trust store (docs/secrets.md shows where each distribution
//! and runtime takes it).

use anyhow::bail;
use clap::Args;

use super::Cli;
use crate::api::{Request, Response};

#[derive(Args)]
pub struct CaArgs {
    /// The network whose CA to print (PEM, to standard output).
    #[arg(long, short = 'n', default_value = crate::config::DEFAULT_NETWORK)]
    network: String,
}

pub fn main(cli: &Cli, args: &CaArgs) -> anyhow::Result<()> {
    let request = Request::Ca {
        network: args.network.clone(),
    };
    match cli.connect()?.call(&request)?.0 {
        Response::Ca { certificate, .. } => {
            print!("{certificate}");
            Ok(())
        }
        Response::Error { message, .. } => bail!(message),
        other => bail!("unexpected reply from the daemon: {other:?}"),
    }
}
