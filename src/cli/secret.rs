//! `linnet secret set|rm|ls`: the secrets linnet holds for VMs, which use
//! them without holding them. A value is read from standard input, never
//! from the command line (where `ps` and the shell's history would show
//! it), and is never printed.

use std::io::{IsTerminal, Read};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::Cli;
use super::ls::{print_table, row};
use crate::api::{Request, Response};
use crate::secrets::{self, SecretOwner};

#[derive(Subcommand)]
pub enum SecretCommand {
    /// Set a secret, or give it a new value (the next request uses it).
    /// The value is read from standard input (one final newline dropped);
    /// typed at a terminal, it is not echoed. Example:
    /// `printf %s "$TOKEN" | linnet secret set GITHUB_TOKEN`.
    Set(SecretArgs),
    /// Remove a secret.
    Rm(SecretArgs),
    /// List the secrets you may see (yours, and those of the networks you
    /// may attach to; root: all): names, owners, when set. Never values.
    Ls(SecretLsArgs),
}

#[derive(Args)]
pub struct SecretArgs {
    /// The secret's name (letters, digits, '_', '-', '.'), as VMs write it
    /// in placeholders: {{secret:NAME}}.
    name: String,
    /// A network's secret (root only), instead of yours: the network's
    /// own secret rules name it (networks.yaml policy.secrets), no one
    /// else's.
    #[arg(long, short = 'n')]
    network: Option<String>,
}

#[derive(Args)]
pub struct SecretLsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn main(cli: &Cli, cmd: &SecretCommand) -> anyhow::Result<()> {
    let request = match cmd {
        SecretCommand::Set(a) => {
            // Checked before the value is asked for.
            secrets::check_name(&a.name)?;
            Request::SecretSet {
                name: a.name.clone(),
                value: read_value()?,
                network: a.network.clone(),
            }
        }
        SecretCommand::Rm(a) => Request::SecretRemove {
            name: a.name.clone(),
            network: a.network.clone(),
        },
        SecretCommand::Ls(_) => Request::SecretList,
    };
    let (response, _) = cli.connect()?.call(&request)?;
    match (response, cmd) {
        (Response::Ok, _) => Ok(()),
        (Response::Secrets { secrets }, SecretCommand::Ls(args)) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&secrets)?);
                return Ok(());
            }
            if secrets.is_empty() {
                println!("no secrets");
                return Ok(());
            }
            let now = now_ms();
            let mut rows = vec![row(&["NAME", "OWNER", "SET"])];
            for s in secrets {
                let owner = match s.owner {
                    SecretOwner::Uid(uid) => format!("uid {uid}"),
                    SecretOwner::Network(n) => format!("network {n}"),
                };
                rows.push(vec![s.name, owner, ago(now.saturating_sub(s.set_at_ms))]);
            }
            print_table(&rows);
            Ok(())
        }
        (Response::Error { message, .. }, _) => bail!(message),
        (other, _) => bail!("unexpected reply from the daemon: {other:?}"),
    }
}

/// The value from standard input: all of it from a pipe or file; one
/// line, not echoed, from a terminal.
fn read_value() -> anyhow::Result<secrets::SecretValue> {
    let stdin = std::io::stdin();
    let mut input = String::new();
    if stdin.is_terminal() {
        eprint!("value (not echoed): ");
        let _echo = EchoOff::new();
        stdin
            .read_line(&mut input)
            .context("cannot read the value")?;
        eprintln!();
    } else {
        stdin
            .lock()
            .take(secrets::MAX_VALUE as u64 + 3)
            .read_to_string(&mut input)
            .context("cannot read the value from standard input (it must be UTF-8)")?;
    }
    Ok(secrets::from_input(input)?)
}

/// The terminal's echo off while it lives.
struct EchoOff(Option<libc::termios>);

impl EchoOff {
    fn new() -> EchoOff {
        // SAFETY: tcgetattr fills the struct it is given; fd 0 is ours.
        let mut was: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(0, &mut was) } != 0 {
            return EchoOff(None);
        }
        let mut quiet = was;
        quiet.c_lflag &= !libc::ECHO;
        quiet.c_lflag |= libc::ECHONL;
        // SAFETY: a termios read above, changed in its flags only.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &quiet) };
        EchoOff(Some(was))
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(was) = &self.0 {
            // SAFETY: the terminal's settings as they were.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, was) };
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `ms` ago, roughly: "12s ago", "5m ago", "3h ago", "2d ago".
fn ago(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(ago(999), "0s ago");
        assert_eq!(ago(61_000), "1m ago");
        assert_eq!(ago(7_200_000), "2h ago");
        assert_eq!(ago(3 * 86_400_000), "3d ago");
    }
}
