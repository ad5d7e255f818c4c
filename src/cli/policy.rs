//! `linnet policy show|set`: an attached VM's connect/listen policy and
//! rate limits.

use anyhow::bail;
use clap::{Args, Subcommand};

use super::{Cli, InterfaceArgs, RateArgs};
use crate::api::{PolicyPart, PolicySetRequest, Request, Response};
use crate::policy::{ConnectRule, ListenRule, Policy, SecretRule};
use crate::rate::{Rate, RateLimits};

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Show what a VM may connect to and be connected on, and its rate
    /// limits.
    Show(Which),
    /// Replace a VM's rules (--allow-*, --secret), its rate limits (--rate-limit*),
    /// or both: what is not given is kept, unless nothing is, which lifts
    /// every restriction. New connections follow the rules at once; a new
    /// rate holds for every frame from then on. On a network that
    /// enforces its policy or rate (networks.yaml `enforced: true`), a
    /// change may only narrow them: asking for more is refused.
    Set(SetArgs),
}

#[derive(Args)]
pub struct Which {
    #[command(flatten)]
    interface: InterfaceArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SetArgs {
    #[command(flatten)]
    which: Which,
    /// Let the VM connect only to these destinations (repeatable): an
    /// address or network, or a DNS name (`*.SUFFIX`: any name one label
    /// or more below SUFFIX) whose addresses the VM gets from linnet's DNS;
    /// its connections must show the name (`/tcp/any`: they need not).
    #[arg(long, value_name = "CIDR|NAME[:PORT[-PORT]][/tcp[/any]|/udp]")]
    allow_connect: Vec<ConnectRule>,
    /// Accept connections to the VM only on these ports (repeatable).
    /// With --allow-connect and none of these, no other VM connects to it
    /// (the host and its published ports do).
    #[arg(long, value_name = "PORT[-PORT][/tcp|/udp]")]
    allow_listen: Vec<ListenRule>,
    /// Let linnet put your secret NAME into the VM's HTTPS requests to
    /// HOST where a header says {{secret:NAME}} (repeatable; a rule as the
    /// --allow-* ones are: given with them, or gone).
    #[arg(long = "secret", value_name = "NAME@HOST")]
    secrets: Vec<SecretRule>,
    #[command(flatten)]
    rate: RateArgs,
}

impl SetArgs {
    /// Which part the options change: the rules, the rate limits, or
    /// (both or neither given) the whole policy.
    fn only(&self) -> Option<PolicyPart> {
        let rules = !self.allow_connect.is_empty()
            || !self.allow_listen.is_empty()
            || !self.secrets.is_empty();
        match (rules, self.rate.limits().is_none()) {
            (true, true) => Some(PolicyPart::Rules),
            (false, false) => Some(PolicyPart::RateLimit),
            _ => None,
        }
    }
}

pub fn main(cli: &Cli, cmd: &PolicyCommand) -> anyhow::Result<()> {
    let (request, which) = match cmd {
        PolicyCommand::Show(w) => (Request::PolicyShow(w.interface.interface()), w),
        PolicyCommand::Set(a) => {
            let i = a.which.interface.interface();
            let req = PolicySetRequest {
                network: i.network,
                interface_id: i.interface_id,
                name: i.name,
                policy: Policy {
                    egress: a.allow_connect.clone(),
                    ingress: a.allow_listen.clone(),
                    rate_limit: a.rate.limits(),
                    secrets: a.secrets.clone(),
                    network_secrets: Vec::new(),
                },
                only: a.only(),
            };
            (Request::PolicySet(req), &a.which)
        }
    };
    let (response, _) = cli.connect()?.call(&request)?;
    match response {
        Response::Policy {
            interface_id,
            policy,
            learned,
            enforced,
        } => {
            if which.json {
                let doc = serde_json::json!({"interface_id": interface_id, "policy": policy, "learned": learned, "enforced": enforced});
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!("interface {interface_id}");
                println!("  connect: {}", describe(&policy.egress, "anywhere"));
                println!("  listen:  {}", describe(&policy.ingress, "any port"));
                println!("  rate:    {}", shown_rate(&policy.rate_limit));
                if !policy.secrets.is_empty() {
                    println!(
                        "  secrets: {} (the VM's owner's)",
                        describe(&policy.secrets, "")
                    );
                }
                if !policy.network_secrets.is_empty() {
                    println!(
                        "  secrets: {} (the network's)",
                        describe(&policy.network_secrets, "")
                    );
                }
                if let Some(enforced) = &enforced {
                    let parts = match (enforced.policy, enforced.rate_limit) {
                        (true, true) => "its connect and listen rules and its rate",
                        (true, false) => "its connect and listen rules",
                        _ => "its rate",
                    };
                    println!(
                        "  enforced: {parts} are the most it may have (the network's, in {}, root's to change)",
                        enforced.by
                    );
                }
                if policy.has_names() {
                    println!("  DNS:     only linnet's, and only for the names above");
                    if learned.is_empty() {
                        println!(
                            "  learned: nothing yet (the VM reaches a name's addresses once it has asked for it)"
                        );
                    }
                    for l in &learned {
                        let name = l.name.as_deref().unwrap_or("(before the daemon restarted)");
                        println!(
                            "  learned: {} for {name}, {} s left",
                            l.address, l.expires_in
                        );
                    }
                }
            }
            Ok(())
        }
        Response::Error { message, .. } => bail!(message),
        other => bail!("unexpected reply from the daemon: {other:?}"),
    }
}

/// Rate limits as `policy show` and `ls` print them.
pub fn shown_rate(limits: &RateLimits) -> String {
    let way = |r: Option<Rate>| {
        r.map_or("unlimited".to_string(), |r| {
            format!("{r} (burst {} bytes)", r.burst_bytes())
        })
    };
    format!("in {}, out {}", way(limits.received), way(limits.sent))
}

fn describe<T: ToString>(rules: &[T], open: &str) -> String {
    if rules.is_empty() {
        open.to_string()
    } else {
        rules
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
