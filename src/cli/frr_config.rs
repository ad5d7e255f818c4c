//! `linnet frr-config`: FRR's configuration (zebra and bgpd) for this
//! host's networks across hosts, from the networks file (`frr`).

use super::Cli;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Prints one frr.conf for this host: one `router bgp` (the AS and the VTEP that \
every network with an evpn: section shares, the VTEP as its router id), the \
other hosts' VTEPs as iBGP neighbours, and the EVPN address family with every \
VNI advertised. Load it with `vtysh -f FILE`, or write it to /etc/frr/frr.conf \
with bgpd=yes in /etc/frr/daemons. docs/multihost.md walks through three hosts.")]
pub struct FrrConfigArgs {}

pub fn main(cli: &Cli, _args: &FrrConfigArgs) -> anyhow::Result<()> {
    let config = cli.load_config()?;
    print!("{}", crate::frr::config(&config)?);
    Ok(())
}
