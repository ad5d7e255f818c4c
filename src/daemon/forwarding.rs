//! IP forwarding as linnet changed it: on while a network needs it, put
//! back as it was when none does, and kept in a file for the next daemon.

use std::path::PathBuf;

use tracing::warn;

use super::errors::DaemonError;
use crate::host::seam::Devices;
use crate::host::{firewall, sysctl};

/// IP forwarding, which linnet's NAT and forwards need: turned on where it
/// is off when a network needs it, and put back as it was when none does.
/// Only this part changes it. What it changed is kept in a file, so that a
/// daemon that stops with VMs attached (or is killed) leaves it to the next
/// one to put back.
#[derive(Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Forwarding {
    /// Whether linnet turned IPv4 forwarding on (and so turns it off).
    enabled4: bool,
    /// What it changed to turn IPv6 forwarding on (to put back).
    changed6: Option<sysctl::Ipv6Forwarding>,
    /// Where that is kept for a daemon after this one (`open`).
    #[serde(skip)]
    file: Option<PathBuf>,
}

impl Forwarding {
    /// Turns on the forwarding the networks need where it is off now, and
    /// records what that changed. Returns the families it turned on.
    pub fn turn_on(
        &mut self,
        devices: &dyn Devices,
        needs4: bool,
        needs6: bool,
    ) -> Result<Vec<&'static str>, DaemonError> {
        let failed = |family: &str, source: std::io::Error| DaemonError::HostStep {
            what: format!("cannot enable {family} forwarding"),
            source,
        };
        let mut turned = Vec::new();
        if needs4 && !devices.forwarding_on(false) {
            devices
                .enable_ipv4_forwarding()
                .map_err(|e| failed("IPv4", e))?;
            self.enabled4 = true;
            turned.push("IPv4");
        }
        if needs6 && !devices.forwarding_on(true) {
            let changed = devices
                .enable_ipv6_forwarding()
                .map_err(|e| failed("IPv6", e))?;
            match &mut self.changed6 {
                Some(before) => before.merge(changed),
                None => self.changed6 = Some(changed),
            }
            turned.push("IPv6");
        }
        if !turned.is_empty() {
            self.remember();
        }
        Ok(turned)
    }

    /// Takes on what an earlier daemon changed and did not put back (it
    /// stopped with VMs attached, or was killed), and keeps what this one
    /// changes in the same file from now on.
    pub fn open(&mut self, run_dir: &std::path::Path) {
        // In the run dir: the sysctls it describes do not outlive the
        // machine's stop either.
        let path = run_dir.join(FORWARDING_FILE);
        if let Ok(text) = std::fs::read(&path) {
            match serde_json::from_slice(&text) {
                Ok(was) => *self = was,
                Err(e) => warn!(
                    "cannot read {}: {e}; forwarding stays as it is",
                    path.display()
                ),
            }
        }
        self.file = Some(path);
    }

    /// Writes down what is changed now (nothing: no file).
    fn remember(&self) {
        let Some(path) = &self.file else {
            return;
        };
        let written = if !self.enabled4 && self.changed6.is_none() {
            std::fs::remove_file(path).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
        } else {
            crate::files::write_atomically(path, &serde_json::to_vec(self).expect("serializes"))
        };
        if let Err(e) = written {
            warn!(
                "cannot keep {}: {e}; a daemon after this one may not put forwarding back",
                path.display()
            );
        }
    }

    /// Puts back what `turn_on` changed for a family no network needs now.
    /// False: some of it failed (logged), and is still to put back.
    pub fn turn_off_unneeded(&mut self, devices: &dyn Devices, needs4: bool, needs6: bool) -> bool {
        let (mut restored, mut done) = (false, true);
        if !needs4 && self.enabled4 {
            match devices.disable_ipv4_forwarding() {
                Ok(()) => {
                    self.enabled4 = false;
                    restored = true;
                }
                // Still on as linnet turned it: tried again (`tidy`).
                Err(e) => {
                    warn!("cannot restore IPv4 forwarding to off: {e}");
                    done = false;
                }
            }
        }
        if !needs6 && let Some(changed) = self.changed6.take() {
            match devices.disable_ipv6_forwarding(&changed) {
                Ok(()) => restored = true,
                Err(e) => {
                    warn!("cannot restore IPv6 forwarding to off: {e}");
                    self.changed6 = Some(changed);
                    done = false;
                }
            }
        }
        if restored {
            self.remember();
        }
        done
    }
}

/// What linnet changed of IP forwarding and has not put back yet.
const FORWARDING_FILE: &str = "forwarding.json";

/// Whether the networks need IPv4 and IPv6 forwarding.
pub(super) fn forwarding_needs(rules: &[firewall::FirewallNetwork]) -> (bool, bool) {
    let forwards4 = rules.iter().any(|r| !r.forwards.is_empty());
    let forwards6 = rules
        .iter()
        .any(|r| r.forwards.iter().any(|f| f.covers_ipv6()));
    (
        forwards4 || rules.iter().any(|r| r.nat44),
        forwards6 || rules.iter().any(|r| r.nat66),
    )
}
