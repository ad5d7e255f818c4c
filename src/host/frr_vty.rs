//! Asking FRR: vtysh, pointed at the directory of FRR's vty sockets, one
//! command at a time, each within a few seconds (a hung FRR must not hang
//! `linnet doctor`). The answers are read by `frr::health`.

use std::io;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// How long one vtysh command may take.
const PATIENCE: Duration = Duration::from_secs(3);

/// The answers to `commands`, in order; or why FRR gave none, said for
/// `linnet doctor` with what to do.
pub async fn ask<const N: usize>(
    vty_socket: &Path,
    commands: &[String; N],
) -> Result<[String; N], String> {
    let mut answers = Vec::with_capacity(N);
    for command in commands {
        answers.push(ask_one(vty_socket, command).await?);
    }
    Ok(answers.try_into().expect("one answer per command"))
}

async fn ask_one(vty_socket: &Path, command: &str) -> Result<String, String> {
    let child = tokio::process::Command::new("vtysh")
        .arg("--vty_socket")
        .arg(vty_socket)
        .args(["-c", command])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(
                "FRR is not installed (no vtysh): install it (Debian: apt-get install frr) and load the configuration `linnet frr-config` prints".into(),
            );
        }
        Err(e) => return Err(format!("cannot run vtysh: {e}")),
    };
    let out = match tokio::time::timeout(PATIENCE, child.wait_with_output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("vtysh failed: {e}")),
        Err(_) => {
            return Err(format!(
                "FRR did not answer \"{command}\" within {} s: is it hung?",
                PATIENCE.as_secs()
            ));
        }
    };
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() && said.trim_start().starts_with('{') {
        return Ok(said);
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let why = err
        .lines()
        .chain(said.lines())
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains("vtysh.conf"))
        .collect::<Vec<_>>()
        .join("; ");
    Err(format!(
        "FRR does not answer at {} ({why}): is it running (zebra and bgpd), and is frr.vty_socket its vty socket directory?",
        vty_socket.display()
    ))
}
