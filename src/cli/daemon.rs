//! `linnet daemon`

use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use super::Cli;
use crate::daemon::{self, Options, Placement};
use crate::host::egress::{self, Egress};
use crate::host::systemd;

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
    /// Connections all users other than root may hold at once together
    /// (root's are always served): what no set of users, however many
    /// uids they hold, can take from the daemon.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_connections: usize,
    /// With --rootless: what carries the namespace's traffic out to the
    /// host [default: pasta if installed, else slirp4netns].
    #[arg(long, value_name = "TOOL")]
    pub egress: Option<Egress>,
    /// Serve Prometheus' text format at http://ADDR:PORT/metrics: every
    /// interface's traffic and drops, every network's leases and DNS, the
    /// daemon's connections, attach latency and errors (docs/operations.md).
    /// A PORT alone binds 127.0.0.1; another address shows every VM's id
    /// and name to whoever reaches it. A daemon that serves metrics does
    /// not exit when idle (--idle-exit is ignored), so the numbers stay.
    /// The service reads it from LINNET_METRICS in /etc/default/linnet.
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = metrics_address, env = "LINNET_METRICS")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Only check the networks file (--config, or the default one) and say
    /// which networks it gives; start nothing. Exits 0 when it is valid
    /// (for a unit's ExecStartPre, or before a restart).
    #[arg(long)]
    pub check_config: bool,
}

pub fn main(cli: &Cli, args: &DaemonArgs) -> anyhow::Result<()> {
    if args.check_config {
        return check_config(cli);
    }
    // A daemon that `linnet run` started inherits the signals it blocks
    // (it forwards them to its VMM): SIGTERM would never arrive.
    nix::sys::signal::SigSet::all()
        .thread_unblock()
        .context("cannot unblock signals")?;
    let place = cli.place();
    if !place.rootless && !nix::unistd::geteuid().is_root() {
        bail!(
            "the system daemon needs root (CAP_NET_ADMIN) to create bridges and TAPs: run it with sudo, or run `linnet daemon --rootless` for networks of your own (`linnet run` starts that one by itself)"
        );
    }
    if args.metrics.is_some() && place.rootless {
        bail!(
            "--metrics is for the system daemon: a rootless daemon runs in a network namespace of its own, where no scraper reaches it"
        );
    }
    if args.egress.is_some() && !place.rootless {
        bail!(
            "--egress is for a rootless daemon (--rootless); the system daemon NATs through the host's own routes"
        );
    }
    let config = daemon_config(cli)?;
    // Taken (and its variables unset) before any thread starts.
    let passed_socket =
        systemd::passed_socket().context("cannot take the socket the service manager passed")?;
    if passed_socket.is_some() && place.rootless {
        bail!("a rootless daemon binds its own socket; socket activation is for the system daemon");
    }
    let opts = Options {
        run_dir: place.run_dir.clone(),
        state_dir: place.state_dir.clone(),
        config,
        // A scraper is no client: served metrics keep the daemon up.
        idle_exit: (args.idle_exit)
            .filter(|_| args.metrics.is_none())
            .map(Duration::from_secs),
        max_connections_per_uid: args.max_connections_per_uid,
        max_connections: args.max_connections,
        placement: Placement::System,
        passed_socket,
        metrics: args.metrics,
    };
    if !place.rootless {
        return daemon::run(opts);
    }
    let egress = match args.egress {
        Some(e) => e,
        None => Egress::find().context(
            "a rootless daemon needs pasta (package passt) or slirp4netns for its way out, and neither is on PATH: install one",
        )?,
    };
    daemon::rootless::run(opts, egress)
}

/// `--metrics`: `PORT` (on loopback) or `ADDR:PORT`.
fn metrics_address(text: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok((std::net::Ipv4Addr::LOCALHOST, port).into());
    }
    text.parse().map_err(|_| {
        format!("\"{text}\" is not PORT or ADDR:PORT (e.g. 9464, 127.0.0.1:9464 or [::1]:9464)")
    })
}

/// `--check-config`: the file as the daemon would read it (as a rootless
/// one reads it, with --rootless), and what it gives.
fn check_config(cli: &Cli) -> anyhow::Result<()> {
    let config = daemon_config(cli)?;
    let source = config.source_name();
    println!("{source}: valid");
    for net in config.networks.values() {
        let addresses = match &net.kind {
            crate::config::Kind::Lan(lan) => format!("on the LAN of {}", lan.link()),
            crate::config::Kind::Own(own) => format!("{} (gateway {})", own.subnet, own.gateway),
        };
        println!("  {}: {} {addresses}", net.name, net.mode());
    }
    Ok(())
}

/// The networks as this daemon runs them: the file's, and for a rootless
/// daemon as `Config::for_rootless` makes them.
fn daemon_config(cli: &Cli) -> anyhow::Result<crate::config::Config> {
    let config = cli.load_config()?;
    if cli.place().rootless {
        return Ok(config.for_rootless(egress::HOST_DNS)?);
    }
    Ok(config)
}
