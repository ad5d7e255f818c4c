//! `linnet daemon`

use std::time::Duration;

use anyhow::bail;
use clap::Args;

use super::Cli;
use crate::daemon::{self, Options};

#[derive(Args)]
pub struct DaemonArgs {
    /// Exit after SECONDS with no interface attached and no client connected
    /// (used when `linnet run` starts a daemon on demand).
    #[arg(long, value_name = "SECONDS")]
    pub idle_exit: Option<u64>,
    /// Connections to the daemon one user other than root may hold at once
    /// (each `linnet run` and `linnet helper` holds one while its VM runs).
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_connections_per_uid: usize,
}

pub fn main(cli: &Cli, args: &DaemonArgs) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the daemon needs root (CAP_NET_ADMIN) to create bridges and TAPs: run it with sudo");
    }
    let config = cli.load_config()?;
    daemon::run(Options {
        run_dir: cli.run_dir.clone(),
        state_dir: cli.state_dir.clone(),
        config,
        idle_exit: args.idle_exit.map(Duration::from_secs),
        max_connections_per_uid: args.max_connections_per_uid,
    })
}
