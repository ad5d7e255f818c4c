//! `linnet ls`

use clap::Args;

use super::Cli;
use crate::api::{Request, Response};

#[derive(Args)]
pub struct LsArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn main(cli: &Cli, args: &LsArgs) -> anyhow::Result<()> {
    let (response, _) = cli.connect()?.call(&Request::List)?;
    let (networks, interfaces) = match response {
        Response::Listing {
            networks,
            interfaces,
        } => (networks, interfaces),
        Response::Error { message, .. } => anyhow::bail!(message),
        other => anyhow::bail!("unexpected reply from the daemon: {other:?}"),
    };
    if args.json {
        let doc = serde_json::json!({ "networks": networks, "interfaces": interfaces });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    if cli.place().rootless {
        println!(
            "your rootless daemon ({}): its networks live in your own namespaces; VMs on shared networks reach this host's 127.0.0.1 at {}, and published ports open on the host as you",
            cli.place().run_dir.display(),
            crate::host::egress::HOST_LOOPBACK
        );
    }
    let mut rows = vec![row(&[
        "NETWORK",
        "MODE",
        "SUBNET",
        "GATEWAY",
        "IPV6 PREFIX",
        "BRIDGE",
        "INTERFACES",
    ])];
    for n in &networks {
        rows.push(vec![
            n.name.clone(),
            n.mode.to_string(),
            n.subnet
                .map(|s| s.to_string())
                .or_else(|| n.lan.as_ref().map(|l| format!("LAN of {l}")))
                .unwrap_or_else(|| "-".into()),
            n.gateway
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into()),
            n.ipv6_prefix
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            n.bridge.clone().unwrap_or_else(|| "-".into()),
            n.interfaces.to_string(),
        ]);
    }
    print_table(&rows);
    for n in &networks {
        if let Some(socket) = &n.socket {
            println!(
                "network {}: VMs connect to {} (socket_vmnet protocol)",
                n.name,
                socket.display()
            );
        }
        for w in &n.warnings {
            println!("warning: network {}: {w}", n.name);
        }
    }
    println!();
    let mut rows = vec![row(&[
        "INTERFACE",
        "NAME",
        "NETWORK",
        "DATAPATH",
        "MAC",
        "IP",
        "CLONE AT",
        "IPV6",
        "FORWARDS",
        "TAP",
        "PID",
        "UID",
        "VM RX",
        "VM TX",
        "RELAY DROPS",
        "SPOOFED",
        "POLICY",
    ])];
    for i in &interfaces {
        rows.push(vec![
            i.interface_id.to_string(),
            i.name.clone().unwrap_or_else(|| "-".into()),
            i.network.clone(),
            i.datapath.to_string(),
            i.mac_address.to_string(),
            i.ip_address
                .map(|a| a.to_string())
                .unwrap_or_else(|| "-".into()),
            // A clone's own address; its IP is the guest's, which its
            // clones share.
            i.clone_address
                .map(|a| a.to_string())
                .unwrap_or_else(|| "-".into()),
            // The EUI-64 address, then those the VM formed itself.
            match (i.ipv6_address, i.ipv6_formed.is_empty()) {
                (None, true) => "-".into(),
                (eui64, _) => (eui64.iter().chain(&i.ipv6_formed))
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            },
            if i.forwards.is_empty() {
                "-".into()
            } else {
                let list: Vec<String> = i.forwards.iter().map(|f| f.to_string()).collect();
                list.join(",")
            },
            i.tap.clone(),
            i.client_pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            i.client_uid.to_string(),
            human_bytes(i.vm_rx_bytes),
            human_bytes(i.vm_tx_bytes),
            // Frames the relay dropped on their way to / from the VM.
            i.relay
                .map(|r| format!("{}/{}", r.to_vm.drops, r.from_vm.drops))
                .unwrap_or_else(|| "-".into()),
            // Frames from the VM that anti-spoofing dropped.
            i.spoofed_drops
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            policy_summary(&i.policy, i.refused_queries, i.refused_connections),
        ]);
    }
    if interfaces.is_empty() {
        println!("no interfaces attached");
    } else {
        print_table(&rows);
    }
    for i in interfaces.iter().filter(|i| i.cut_off.is_some()) {
        let why = i.cut_off.as_deref().unwrap_or_default();
        println!(
            "cut off: interface {} (TAP {}): {why}",
            i.interface_id, i.tap
        );
    }
    Ok(())
}

pub(super) fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

pub(super) fn print_table(rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// "connect 2 (3 refused), listen 1, rate 100mbit each way" or "-" when
/// nothing is restricted; with names, the DNS queries refused too.
fn policy_summary(
    p: &crate::policy::Policy,
    refused_queries: Option<u64>,
    refused_connections: Option<u64>,
) -> String {
    if p.is_empty() {
        return "-".into();
    }
    let mut parts = Vec::new();
    if !p.egress.is_empty() {
        let refused = refused_connections.map_or(String::new(), |n| format!(" ({n} refused)"));
        parts.push(format!("connect {}{refused}", p.egress.len()));
    }
    if let Some(n) = refused_queries {
        parts.push(format!("{n} names refused"));
    }
    if !p.ingress.is_empty() {
        parts.push(format!("listen {}", p.ingress.len()));
    }
    if !p.rate_limit.is_none() {
        parts.push(format!("rate {}", p.rate_limit));
    }
    parts.join(", ")
}
