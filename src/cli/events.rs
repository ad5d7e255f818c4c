//! `linnet events`: what happens to the networks and their VMs, one JSON
//! object a line on stdout, for as long as the daemon runs.

use std::io::Write;

use anyhow::{Context, bail};
use clap::Args;

use super::Cli;
use crate::api::{Request, Response};

#[derive(Args)]
pub struct EventsArgs {
    /// Only this network's events (and the daemon's own, such as
    /// `dropped`).
    #[arg(long, value_name = "NETWORK")]
    network: Option<String>,
    /// First print the last events the daemon kept (up to 256; those of
    /// its start, such as the interfaces it adopted, among them).
    #[arg(long)]
    recent: bool,
}

pub fn main(cli: &Cli, args: &EventsArgs) -> anyhow::Result<()> {
    let channel = cli.connect()?;
    let request = Request::Events {
        network: args.network.clone(),
        recent: args.recent,
    };
    match channel.call(&request)?.0 {
        Response::Subscribed => {}
        Response::Error { message, .. } => bail!(message),
        other => bail!("unexpected reply from the daemon: {other:?}"),
    }
    let mut out = std::io::stdout().lock();
    loop {
        let Some((response, _)) = channel
            .recv::<Response>()
            .context("reading events from the linnet daemon")?
        else {
            bail!("the linnet daemon stopped (its events end here)");
        };
        let Response::Event(event) = response else {
            bail!("unexpected message from the daemon: {response:?}");
        };
        let line = serde_json::to_string(&event)?;
        // A reader that went away (a closed pipe) ends this quietly.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
    }
}
