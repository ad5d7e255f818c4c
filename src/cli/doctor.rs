//! `linnet doctor`: what the host's other firewalls and routes do to the
//! networks, and how to fix what blocks them.

use anyhow::bail;
use clap::Args;

use crate::api::{DoctorReport, Request, Response};
use crate::coexist::{Family, Status};
use crate::frr::health::FabricHealth;

use super::Cli;

#[derive(Args)]
pub struct DoctorArgs {
    /// Only this network.
    #[arg(long)]
    pub network: Option<String>,
    /// Print JSON (docs/coexistence.md describes it).
    #[arg(long)]
    pub json: bool,
}

/// Exit status 1 when some traffic of a network is blocked, or FRR
/// reports a problem with a network across hosts.
pub fn main(cli: &Cli, args: &DoctorArgs) -> anyhow::Result<u8> {
    let request = Request::Doctor {
        network: args.network.clone(),
    };
    let (response, _) = cli.connect()?.call(&request)?;
    let report = match response {
        Response::Doctor { report } => *report,
        Response::Error { message, .. } => bail!(message),
        other => bail!("unexpected reply from the daemon: {other:?}"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
    }
    let blocked = report
        .networks
        .iter()
        .flat_map(|n| &n.checks)
        .any(|c| c.status == Status::Blocked);
    let fabric_problems = report
        .networks
        .iter()
        .filter_map(|n| n.fabric.as_ref())
        .any(|f| !f.problems.is_empty());
    Ok(u8::from(blocked || fabric_problems))
}

fn print(r: &DoctorReport) {
    let list = |items: &[String], none: &str| {
        if items.is_empty() {
            none.to_string()
        } else {
            items.join(", ")
        }
    };
    println!("uplink IPv4: {}", list(&r.uplinks_ipv4, "no default route"));
    println!("uplink IPv6: {}", list(&r.uplinks_ipv6, "no default route"));
    println!("other firewalls: {}", list(&r.firewalls, "none"));
    if !r.docker_user_chain.is_empty() {
        println!(
            "Docker's DOCKER-USER chain: in {} ({})",
            r.docker_user_chain.join(", "),
            if r.docker_user_enabled {
                "linnet adds its accept rules there"
            } else {
                "firewall.docker_user is false: linnet adds nothing"
            }
        );
    }
    let on = |b: bool| if b { "on" } else { "off" };
    println!(
        "forwarding: IPv4 {}, IPv6 {}",
        on(r.ipv4_forwarding),
        on(r.ipv6_forwarding)
    );
    for e in &r.errors {
        println!("could not read: {e}");
    }
    for n in &r.networks {
        println!();
        let state = if n.up { "up" } else { "down" };
        println!(
            "network {} ({}, bridge {}, {state})",
            n.name, n.mode, n.bridge
        );
        if n.mode == crate::config::Mode::Shared {
            println!(
                "  uplink: IPv4 {}, IPv6 {}",
                n.uplink_ipv4.as_deref().unwrap_or("none"),
                n.uplink_ipv6.as_deref().unwrap_or("none")
            );
        }
        if n.docker_user_rules {
            println!("  DOCKER-USER: linnet's accept rules in place");
        }
        for c in &n.checks {
            let family = match c.family {
                Family::Ipv4 => "IPv4",
                Family::Ipv6 => "IPv6",
            };
            let status = match c.status {
                Status::Passes => "passes",
                Status::MayBeBlocked => "MAY BE BLOCKED",
                Status::Blocked => "BLOCKED",
            };
            println!("  {status:<14} {} ({family})", c.flow.describe());
            for b in &c.blockers {
                println!(
                    "                 by {} chain {} ({}, hook {}, {}): {}",
                    b.table, b.chain, b.verdict, b.hook, b.owner, b.fix
                );
            }
        }
        if let Some(f) = &n.fabric {
            print_fabric(f);
        }
        for note in &n.notes {
            println!("  note: {note}");
        }
    }
}

/// A network across hosts as FRR sees it.
fn print_fabric(f: &FabricHealth) {
    let vteps: Vec<String> = f.remote_vteps.iter().map(|v| v.to_string()).collect();
    println!(
        "  across hosts: VNI {} from VTEP {}; zebra {}; {} remote MACs; other hosts: {}",
        f.vni,
        f.vtep,
        if f.vni_known {
            "knows it"
        } else {
            "does NOT know it"
        },
        f.remote_macs,
        if vteps.is_empty() {
            "none".into()
        } else {
            vteps.join(", ")
        }
    );
    for s in &f.sessions {
        let state = if s.established() {
            "Established".into()
        } else {
            s.state.to_uppercase()
        };
        println!("    BGP with {}: {state}", s.peer);
    }
    for p in &f.problems {
        println!("    PROBLEM: {p}");
    }
}
