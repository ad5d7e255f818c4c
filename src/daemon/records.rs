//! What the daemon keeps on disk of each attached interface, so that a
//! daemon started after it (a restart, an upgrade, a crash) adopts the
//! interface instead of cutting its VM off: one file per interface in
//! `RUN_DIR/interfaces/` (which, like the TAPs, lasts until the machine
//! stops), written before the attach is answered and removed at detach. `verdict` decides, as plain data, whether a record
//! found at start-up is adopted or removed.
//!
//! A file is written whole (a temporary renamed over it) but not fsynced:
//! it must outlive the daemon's process, not the machine, whose reboot
//! takes the TAPs with it.

use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Mode;
use crate::datapath::Datapath;
use crate::forward::PortForward;
use crate::host::ALIAS_INTERFACE;
use crate::host::netlink::Link;
use crate::host::process::Process;
use crate::policy::Policy;
use crate::types::{InterfaceId, MacAddr};

/// An attached interface as a new daemon needs it to adopt it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceRecord {
    pub interface_id: InterfaceId,
    pub network: String,
    /// The network's mode then: a port is not adopted into a network
    /// whose kind changed (its port would be on the wrong link).
    pub mode: Mode,
    pub mac: MacAddr,
    pub ip: Option<Ipv4Addr>,
    pub name: Option<String>,
    /// Its port: TAP or macvtap, by name and index, and the MAC of its
    /// host side as linnet set it (a VMM that changed it meanwhile is cut
    /// off, as it would have been with the daemon there).
    pub port: String,
    pub port_index: u32,
    pub port_mac: MacAddr,
    pub uid: u32,
    /// Kept past its connection (`linnet attach`): no client holds it.
    pub kept: bool,
    /// The process whose connection holds the interface (none if it could
    /// not be read then).
    pub client: Option<Process>,
    pub datapath: Datapath,
    pub policy: Policy,
    /// The forwards asked for at attach (kept and configured ones come
    /// back by themselves).
    pub publish: Vec<PortForward>,
    /// What its client re-claims it with after a restart.
    pub token: String,
    pub cut_off: Option<String>,
    /// IPv6 addresses its VM formed itself (`formed6`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub formed6: Vec<std::net::Ipv6Addr>,
}

/// What a new daemon does with a record it found.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Adopt it; `Some`: cut off, for this reason.
    Adopt { cut_off: Option<String> },
    /// Remove what is left of it, for this reason.
    Remove(String),
}

/// Decides a record's fate from the link with its port's index (if any),
/// whether its client still runs, and whether its network is still
/// configured and adoptable there.
pub fn verdict(
    record: &InterfaceRecord,
    link: Option<&Link>,
    client_running: bool,
    network: Result<(), String>,
) -> Verdict {
    if let Err(why) = network {
        return Verdict::Remove(why);
    }
    let alias = format!("{ALIAS_INTERFACE}{}", record.interface_id);
    let Some(link) = link.filter(|l| l.name == record.port && l.alias.as_deref() == Some(&alias))
    else {
        return Verdict::Remove(format!(
            "its port {} is gone (its VMM closed it)",
            record.port
        ));
    };
    match (record.kept, &record.client) {
        (true, _) => {}
        (false, Some(client)) if !client_running => {
            return Verdict::Remove(format!(
                "its client (pid {}) exited while no daemon ran",
                client.pid
            ));
        }
        (false, Some(_)) => {}
        (false, None) => {
            return Verdict::Remove("its client's process was not known".into());
        }
    }
    let cut_off = match link.address {
        _ if record.cut_off.is_some() => record.cut_off.clone(),
        Some(now) if now != record.port_mac => Some(format!(
            "its VMM changed the TAP's MAC from {} to {now} while no daemon ran; off the network until detached",
            record.port_mac
        )),
        _ => None,
    };
    Verdict::Adopt { cut_off }
}

/// The records' directory (root's alone: it holds the tokens).
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(run_dir: &Path) -> Records {
        Records {
            dir: run_dir.join("interfaces"),
        }
    }

    fn path(&self, id: InterfaceId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes (or replaces) an interface's record.
    pub fn save(&self, record: &InterfaceRecord) -> io::Result<()> {
        crate::files::private_dir(&self.dir)?;
        let bytes = serde_json::to_vec_pretty(record).expect("records serialize");
        crate::files::replace_private(&self.path(record.interface_id), &bytes)
    }

    pub fn remove(&self, id: InterfaceId) {
        match std::fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(interface = %id, "cannot remove the interface's record: {e}")
            }
            _ => {}
        }
    }

    /// Takes the directory away when no record is in it (a daemon that
    /// stops with nothing attached leaves nothing behind).
    pub fn remove_dir_if_empty(&self) {
        // Fails, as it should, when a record is there.
        let _ = std::fs::remove_dir(&self.dir);
    }

    /// Every record there; one that cannot be read is moved aside (its
    /// interface's port goes at start-up like any left without one).
    pub fn load(&self) -> Vec<InterfaceRecord> {
        // Temporaries a killed daemon left.
        crate::files::remove_temporaries(&self.dir);
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for path in entries.flatten().map(|e| e.path()) {
            if path.extension().is_none_or(|e| e != "json") {
                // One set aside, for an operator to look at.
                continue;
            }
            let read = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
            match read {
                Ok(record) => records.push(record),
                Err(e) => {
                    let aside = crate::files::move_aside(&path);
                    tracing::error!(
                        "cannot read interface record {}: {e}; moved aside ({aside:?}), its interface is not adopted",
                        path.display()
                    );
                }
            }
        }
        records
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::netlink::LinkKind;

    fn record() -> InterfaceRecord {
        InterfaceRecord {
            interface_id: "6a0f2c57-3c41-4b5e-9a1b-6d3c2f1e0a11".parse().unwrap(),
            network: "shared".into(),
            mode: Mode::Shared,
            mac: "52:54:00:12:34:56".parse().unwrap(),
            ip: Some("192.168.105.2".parse().unwrap()),
            name: Some("web".into()),
            port: "lnt3".into(),
            port_index: 42,
            port_mac: "02:00:00:00:00:03".parse().unwrap(),
            uid: 1000,
            kept: false,
            client: Some(Process {
                pid: 777,
                started: 12345,
            }),
            datapath: Datapath::Tap,
            policy: Policy::default(),
            publish: vec!["8080:80".parse().unwrap()],
            token: "t".into(),
            cut_off: None,
            formed6: Vec::new(),
        }
    }

    fn link(r: &InterfaceRecord) -> Link {
        Link {
            index: r.port_index,
            name: r.port.clone(),
            group: 0,
            kind: LinkKind::Tun,
            alias: Some(format!("{ALIAS_INTERFACE}{}", r.interface_id)),
            master: Some(7),
            address: Some(r.port_mac),
            mtu: 1500,
            rx_bytes: 0,
            tx_bytes: 0,
            rx_packets: 0,
            tx_packets: 0,
            vxlan: None,
        }
    }

    #[test]
    fn an_interface_is_adopted_only_while_its_port_and_client_are_there() {
        let r = record();
        let l = link(&r);
        assert_eq!(
            verdict(&r, Some(&l), true, Ok(())),
            Verdict::Adopt { cut_off: None }
        );
        let gone = |v: Verdict, why: &str| match v {
            Verdict::Remove(reason) => assert!(reason.contains(why), "{reason}"),
            v => panic!("{v:?}"),
        };
        gone(verdict(&r, None, true, Ok(())), "port lnt3 is gone");
        gone(verdict(&r, Some(&l), false, Ok(())), "(pid 777) exited");
        gone(
            verdict(&r, Some(&l), true, Err("no network".into())),
            "no network",
        );
        // Another link took the index, or the name: not ours.
        let other = Link {
            name: "lnt9".into(),
            ..l.clone()
        };
        gone(verdict(&r, Some(&other), true, Ok(())), "gone");
        let unmarked = Link {
            alias: None,
            ..l.clone()
        };
        gone(verdict(&r, Some(&unmarked), true, Ok(())), "gone");
        // Kept past its connection: no client to outlive.
        let kept = InterfaceRecord {
            kept: true,
            client: None,
            ..r.clone()
        };
        assert_eq!(
            verdict(&kept, Some(&l), false, Ok(())),
            Verdict::Adopt { cut_off: None }
        );
        let unknown = InterfaceRecord {
            client: None,
            ..r.clone()
        };
        gone(verdict(&unknown, Some(&l), false, Ok(())), "not known");
    }

    #[test]
    fn a_port_whose_mac_changed_while_no_daemon_ran_is_adopted_cut_off() {
        let r = record();
        let changed = Link {
            address: Some("02:00:00:00:00:99".parse().unwrap()),
            ..link(&r)
        };
        match verdict(&r, Some(&changed), true, Ok(())) {
            Verdict::Adopt { cut_off: Some(why) } => {
                assert!(why.contains("02:00:00:00:00:99"), "{why}")
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn records_are_written_read_and_removed_and_a_broken_one_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(dir.path());
        assert!(records.load().is_empty(), "no directory yet");
        let r = record();
        records.save(&r).unwrap();
        records.save(&r).unwrap();
        assert_eq!(records.load(), std::slice::from_ref(&r));
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join("interfaces")), 0o700);
        assert_eq!(mode(&records.path(r.interface_id)), 0o600);
        std::fs::write(dir.path().join("interfaces/bad.json"), "{").unwrap();
        std::fs::write(dir.path().join("interfaces/x.tmp.1.2"), "{").unwrap();
        assert_eq!(records.load(), std::slice::from_ref(&r));
        records.remove(r.interface_id);
        records.remove(r.interface_id);
        assert!(records.load().is_empty());
        records.remove_dir_if_empty();
        assert!(
            dir.path().join("interfaces").exists(),
            "a file set aside stays"
        );
        let left: Vec<String> = std::fs::read_dir(dir.path().join("interfaces"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            left.len() == 1 && left[0].starts_with("bad.json.broken-"),
            "{left:?}"
        );
    }
}
