//! The address book of one network: which interface (or, for a VM whose MAC
//! linnet did not hand out, which MAC) holds which IPv4 address, until when.
//!
//! An attached interface holds its address indefinitely. When it detaches, or
//! its client dies, the address stays reserved for its interface_id for
//! `lease_time` seconds and only then may go to someone else; until another
//! interface actually takes it, re-attaching the same id gets it back. Pure
//! logic: the daemon persists the table and the DHCP server consults it.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::Notify;

use crate::config::Own;
use crate::types::{InterfaceId, MacAddr, names_match};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Owner {
    /// An interface attached through linnet.
    Interface { id: InterfaceId },
    /// A DHCP client whose MAC is no linnet interface's (a VMM that ignored
    /// the MAC it was given, or a nested guest).
    Mac,
}

/// What an attach changed in a lease table: each address's lease as it
/// was before, in the order changed, for `LeaseTable::undo`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseChange(Vec<(Ipv4Addr, Option<Lease>)>);

impl LeaseChange {
    /// The lease at `addr` was `was` before a change.
    fn note(&mut self, addr: Ipv4Addr, was: Option<Lease>) {
        self.0.push((addr, was));
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub ip: Ipv4Addr,
    pub mac: MacAddr,
    pub owner: Owner,
    /// The name given at attach (`--name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The hostname the guest sent in DHCP (option 12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The uid that attached it (an interface's lease): while the lease
    /// lives, its id and name are that user's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// None while held indefinitely (attached); else unix seconds after which
    /// the address may go to someone else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until: Option<u64>,
}

impl Lease {
    fn is_live(&self, now: u64) -> bool {
        self.held_until.is_none_or(|t| t > now)
    }
}

/// What a clone took over, to be given back (`LeaseTable::give_back`).
#[derive(Debug, Clone, PartialEq)]
pub struct TakenOver {
    ip: Ipv4Addr,
    owner: Owner,
    held_until: Option<u64>,
}

#[derive(Debug, Error, PartialEq)]
pub enum LeaseError {
    #[error(
        "network \"{network}\": no free address left in {first}-{last}; detach unused interfaces or widen dhcp.range"
    )]
    PoolExhausted {
        network: String,
        first: Ipv4Addr,
        last: Ipv4Addr,
    },
    #[error("network \"{network}\": static address {ip} of interface {id} is held by MAC {holder}")]
    StaticTaken {
        network: String,
        ip: Ipv4Addr,
        id: InterfaceId,
        holder: MacAddr,
    },
    #[error(
        "network \"{network}\": interface {id} belongs to uid {holder}; only it or root may attach it (choose another --interface-id)"
    )]
    NotYours {
        network: String,
        id: InterfaceId,
        holder: u32,
    },
    #[error(
        "network \"{network}\": the name \"{name}\" is held by interface {holder_id} of uid {holder_uid}; choose another --name"
    )]
    NameTaken {
        network: String,
        name: String,
        holder_id: InterfaceId,
        holder_uid: u32,
    },
    #[error(
        "network \"{network}\": MAC {mac} is already used by interface {other}; choose another --mac"
    )]
    MacInUse {
        network: String,
        mac: MacAddr,
        other: String,
    },
}

/// Who claims an interface's lease: a uid, and whether it may take other
/// users' ids and released names (root's say). A bare uid is a user, with
/// that say when it is root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimant {
    pub uid: u32,
    pub overrides: bool,
}

impl From<u32> for Claimant {
    fn from(uid: u32) -> Claimant {
        Claimant {
            uid,
            overrides: uid == 0,
        }
    }
}

#[derive(Debug)]
pub struct LeaseTable {
    network: String,
    subnet: ipnet::Ipv4Net,
    first: u32,
    last: u32,
    gateway: Ipv4Addr,
    lease_time: u64,
    statics: Vec<crate::config::StaticLease>,
    leases: BTreeMap<Ipv4Addr, Lease>,
    /// Attached clones' names and unique addresses, which DNS answers
    /// like leases' (a clone holds no lease; not saved).
    clones: BTreeMap<InterfaceId, (String, Ipv4Addr)>,
    /// Clones holding the lease of the VM they carry on (`take_over`).
    held_by_clones: BTreeSet<InterfaceId>,
    path: Option<PathBuf>,
}

/// A network's lease table as the daemon and the network's services share
/// it. Changes are saved in the background, at most once per
/// `SAVE_EVERY`, written off the async runtime: a guest that floods DHCP
/// costs no synchronous disk writes on the path that serves attaches.
#[derive(Clone)]
pub struct SharedLeases {
    table: Arc<Mutex<LeaseTable>>,
    changed: Arc<Notify>,
    /// Held across taking a snapshot and writing it, so the file's last
    /// writer is always the one with the newest snapshot.
    writing: Arc<Mutex<()>>,
}

const SAVE_EVERY: Duration = Duration::from_secs(1);

impl SharedLeases {
    pub fn new(table: LeaseTable) -> SharedLeases {
        SharedLeases {
            table: Arc::new(Mutex::new(table)),
            changed: Arc::new(Notify::new()),
            writing: Arc::new(Mutex::new(())),
        }
    }

    /// Asks for the table to be saved soon.
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    /// Saves now, waiting for the disk (and for a background save under
    /// way): when the network goes down.
    pub fn save_now(&self) -> io::Result<()> {
        let _writing = self.writing.lock().expect("lease write lock");
        let snapshot = self.table.lock().expect("lease lock").snapshot();
        match snapshot {
            Some((path, bytes)) => crate::files::write_atomically(&path, &bytes),
            None => Ok(()),
        }
    }

    /// The task that saves after changes, on a blocking thread; it ends
    /// when aborted (what it had not saved yet is then `save_now`'s).
    pub fn spawn_saver(&self, network: String) -> tokio::task::JoinHandle<()> {
        let shared = self.clone();
        tokio::spawn(async move {
            loop {
                shared.changed.notified().await;
                let now = shared.clone();
                let written = tokio::task::spawn_blocking(move || now.save_now()).await;
                if let Ok(Err(e)) = written {
                    tracing::warn!(%network, "cannot save leases: {e}");
                }
                tokio::time::sleep(SAVE_EVERY).await;
            }
        })
    }
}

impl std::ops::Deref for SharedLeases {
    type Target = Mutex<LeaseTable>;

    fn deref(&self) -> &Mutex<LeaseTable> {
        &self.table
    }
}

#[derive(Serialize, Deserialize)]
struct LeaseFile {
    leases: Vec<Lease>,
}

impl LeaseTable {
    /// The table of `network`, one of linnet's own.
    pub fn new(network: &str, net: &Own) -> LeaseTable {
        LeaseTable {
            network: network.into(),
            subnet: net.subnet,
            first: net.dhcp.range_start.into(),
            last: net.dhcp.range_end.into(),
            gateway: net.gateway,
            lease_time: net.dhcp.lease_time as u64,
            statics: net.dhcp.static_leases.clone(),
            leases: BTreeMap::new(),
            clones: BTreeMap::new(),
            held_by_clones: BTreeSet::new(),
            path: None,
        }
    }

    /// Loads the table persisted at `path` (missing file: empty table). Leases
    /// that no longer fit the network's subnet are dropped. Nothing is attached
    /// to a network that is just coming up, so indefinite holds left by a
    /// previous daemon become ordinary reservations, held from `now`.
    pub fn open(network: &str, net: &Own, path: &Path, now: u64) -> io::Result<LeaseTable> {
        let mut table = LeaseTable::new(network, net);
        table.path = Some(path.to_path_buf());
        match std::fs::read(path) {
            Ok(bytes) => {
                let file: LeaseFile = match serde_json::from_slice(&bytes) {
                    Ok(file) => file,
                    Err(e) => {
                        // The reservations in it are lost; the network is not.
                        let aside = crate::files::move_aside(path)?;
                        tracing::error!(
                            network,
                            "{}: {e}; moved to {}, starting with no leases",
                            path.display(),
                            aside.display()
                        );
                        LeaseFile { leases: Vec::new() }
                    }
                };
                for mut lease in file.leases {
                    lease.held_until.get_or_insert(now + table.lease_time);
                    if net.subnet.contains(&lease.ip) && lease.ip != net.gateway {
                        table.leases.insert(lease.ip, lease);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(table)
    }

    /// Writes the table (atomically, fsynced) if it has a path.
    #[cfg(test)]
    pub fn save(&self) -> io::Result<()> {
        match self.snapshot() {
            Some((path, bytes)) => crate::files::write_atomically(&path, &bytes),
            None => Ok(()),
        }
    }

    /// What to write, and where (`SharedLeases` writes it).
    pub fn snapshot(&self) -> Option<(PathBuf, Vec<u8>)> {
        let path = self.path.clone()?;
        let file = LeaseFile {
            leases: self.leases.values().cloned().collect(),
        };
        let bytes = serde_json::to_vec_pretty(&file).expect("leases serialize");
        Some((path, bytes))
    }

    /// How many leases hold an address now: attached interfaces', and
    /// those of interfaces gone but not yet for the lease time.
    pub fn live(&self, now: u64) -> usize {
        self.leases.values().filter(|l| l.is_live(now)).count()
    }

    #[cfg(any(test, feature = "fuzzing"))]
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    /// Reserves an address for interface `id` and holds it until `detach`.
    /// The same id gets back the same MAC and address whenever it still can.
    #[cfg(test)]
    pub fn attach(
        &mut self,
        id: InterfaceId,
        mac: Option<MacAddr>,
        name: Option<String>,
        now: u64,
    ) -> Result<Lease, LeaseError> {
        self.attach_for(0, id, mac, name, now)
    }

    /// Interface `id`'s lease, for user `uid`: refused when the id or the
    /// name is another user's (root may take any id, not a held name).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn attach_for(
        &mut self,
        who: impl Into<Claimant>,
        id: InterfaceId,
        mac: Option<MacAddr>,
        name: Option<String>,
        now: u64,
    ) -> Result<Lease, LeaseError> {
        self.attach_noting(who, id, mac, name, now, &mut LeaseChange::default())
    }

    /// `attach_for`, noting in `change` what it changed (`undo` puts it
    /// back).
    pub fn attach_noting(
        &mut self,
        who: impl Into<Claimant>,
        id: InterfaceId,
        mac: Option<MacAddr>,
        name: Option<String>,
        now: u64,
        change: &mut LeaseChange,
    ) -> Result<Lease, LeaseError> {
        let who = who.into();
        let uid = who.uid;
        let owner = Owner::Interface { id };
        self.check_claim(who, id, name.as_deref(), now)?;
        let existing = self.held_by(&owner).map(|l| l.ip);
        let mac = self.choose_mac(id, mac, now)?;
        let ip = match self.static_for(Some(id), Some(mac)) {
            Some(ip) => {
                if let Some(holder) = self
                    .leases
                    .get(&ip)
                    .filter(|l| l.owner != owner && l.is_live(now))
                {
                    return Err(LeaseError::StaticTaken {
                        network: self.network.clone(),
                        ip,
                        id,
                        holder: holder.mac,
                    });
                }
                ip
            }
            None => match existing {
                Some(ip) => ip,
                None => self.free_address(now)?,
            },
        };
        // One lease per owner: drop a stale one at another address.
        let stale: Vec<Ipv4Addr> = (self.leases.iter())
            .filter(|(addr, l)| l.owner == owner && **addr != ip)
            .map(|(addr, _)| *addr)
            .collect();
        for addr in stale {
            change.note(addr, self.leases.remove(&addr));
        }
        // A detached interface gives its name up to this one (check_claim
        // said it may).
        if let Some(name) = &name {
            for (addr, other) in self.leases.iter_mut().filter(|(_, l)| l.owner != owner) {
                if names_match(other.name.as_deref(), name) {
                    change.note(*addr, Some(other.clone()));
                    other.name = None;
                }
            }
        }
        // The hostname the guest sent last time stays until it sends another.
        let hostname = self
            .leases
            .get(&ip)
            .filter(|l| l.owner == owner)
            .and_then(|l| l.hostname.clone());
        let lease = Lease {
            ip,
            mac,
            owner,
            name,
            hostname,
            uid: Some(uid),
            held_until: None,
        };
        change.note(ip, self.leases.insert(ip, lease.clone()));
        Ok(lease)
    }

    /// Puts back what an attach changed (`attach_noting`,
    /// `attach_without_address`): the attach failed.
    pub fn undo(&mut self, change: LeaseChange) {
        for (addr, was) in change.0.into_iter().rev() {
            match was {
                Some(lease) => self.leases.insert(addr, lease),
                None => self.leases.remove(&addr),
            };
        }
    }

    /// Whether `mac` is an attached interface's (or has a static lease).
    pub fn is_attached_mac(&self, mac: MacAddr) -> bool {
        self.static_for(None, Some(mac)).is_some()
            || self.leases.values().any(|l| {
                l.mac == mac && l.held_until.is_none() && matches!(l.owner, Owner::Interface { .. })
            })
    }

    /// Refuses `uid` an id whose live lease is another user's, and a name
    /// another interface's live lease holds.
    pub fn check_claim(
        &self,
        who: impl Into<Claimant>,
        id: InterfaceId,
        name: Option<&str>,
        now: u64,
    ) -> Result<(), LeaseError> {
        let Claimant { uid, overrides } = who.into();
        let owner = Owner::Interface { id };
        if let Some(holder) = self
            .held_by(&owner)
            .filter(|l| l.is_live(now))
            .and_then(|l| l.uid)
            && holder != uid
            && !overrides
        {
            return Err(LeaseError::NotYours {
                network: self.network.clone(),
                id,
                holder,
            });
        }
        let Some(name) = name else { return Ok(()) };
        // Held: by an attached interface, or by another user's detached
        // one whose address is still reserved. A user's own detached
        // interface (or, for root, anyone's) gives its name up.
        let held = self.leases.values().find(|l| {
            l.owner != owner
                && l.is_live(now)
                && names_match(l.name.as_deref(), name)
                && (l.held_until.is_none() || (l.uid != Some(uid) && !overrides))
        });
        match held {
            Some(Lease {
                owner: Owner::Interface { id: holder_id },
                uid,
                ..
            }) => Err(LeaseError::NameTaken {
                network: self.network.clone(),
                name: name.into(),
                holder_id: *holder_id,
                holder_uid: uid.unwrap_or(0),
            }),
            _ => Ok(()),
        }
    }

    /// Whether a static lease names interface `id` or `mac`.
    pub fn has_static(&self, id: InterfaceId, mac: Option<MacAddr>) -> bool {
        self.static_for(Some(id), mac).is_some()
    }

    /// The MAC of an interface that gets no address from linnet (a network
    /// without DHCP, and no static lease for it): the one asked for, the
    /// one its id had, or a new one. Any address it held is let go.
    pub fn attach_without_address(
        &mut self,
        id: InterfaceId,
        mac: Option<MacAddr>,
        now: u64,
        change: &mut LeaseChange,
    ) -> Result<MacAddr, LeaseError> {
        let mac = self.choose_mac(id, mac, now)?;
        let held: Vec<Ipv4Addr> = (self.leases.iter())
            .filter(|(_, l)| l.owner == Owner::Interface { id })
            .map(|(addr, _)| *addr)
            .collect();
        for addr in held {
            change.note(addr, self.leases.remove(&addr));
        }
        Ok(mac)
    }

    /// The lease `owner` holds, if any.
    fn held_by(&self, owner: &Owner) -> Option<&Lease> {
        self.leases.values().find(|l| l.owner == *owner)
    }

    /// Interface `id`'s MAC: the one asked for (refused if another holds
    /// it), the one its lease had, or a new one derived from its id.
    fn choose_mac(
        &self,
        id: InterfaceId,
        asked: Option<MacAddr>,
        now: u64,
    ) -> Result<MacAddr, LeaseError> {
        let owner = Owner::Interface { id };
        match asked.or(self.held_by(&owner).map(|l| l.mac)) {
            Some(mac) => {
                self.check_mac_free(mac, &owner, now)?;
                Ok(mac)
            }
            None => Ok(self.derive_free_mac(id, now)),
        }
    }

    /// An interface a previous daemon attached and this one adopts: held
    /// again at the address it has, as it was. Refused when the address
    /// is now another's (the file and the records disagree) or no longer
    /// in the network's subnet.
    pub fn readopt(&mut self, lease: Lease, now: u64) -> Result<(), String> {
        let Owner::Interface { id } = lease.owner else {
            return Err("not an interface's lease".into());
        };
        if !self.subnet.contains(&lease.ip) || lease.ip == self.gateway {
            return Err(format!(
                "its address {} is not in network \"{}\"'s subnet any more",
                lease.ip, self.network
            ));
        }
        if let Some(other) = self
            .leases
            .get(&lease.ip)
            .filter(|l| l.owner != lease.owner && l.is_live(now))
        {
            return Err(format!(
                "its address {} is held by MAC {} now",
                lease.ip, other.mac
            ));
        }
        // The hostname its guest sent last stays, as at any attach.
        let hostname = self
            .leases
            .get(&lease.ip)
            .filter(|l| l.owner == lease.owner)
            .and_then(|l| l.hostname.clone());
        self.leases
            .retain(|_, l| l.owner != Owner::Interface { id });
        self.leases.insert(
            lease.ip,
            Lease {
                held_until: None,
                hostname: hostname.or(lease.hostname.clone()),
                ..lease
            },
        );
        Ok(())
    }

    /// The interface left: its address stays reserved for `lease_time`.
    pub fn detach(&mut self, id: InterfaceId, now: u64) {
        self.clones.remove(&id);
        self.held_by_clones.remove(&id);
        let until = now + self.lease_time;
        for lease in self
            .leases
            .values_mut()
            .filter(|l| l.owner == Owner::Interface { id })
        {
            lease.held_until = Some(until);
        }
    }

    /// The address DHCP offers to `mac`: its interface's reservation, a static
    /// lease, its earlier dynamic lease, or a new dynamic one.
    pub fn offer(&mut self, mac: MacAddr, now: u64) -> Result<Ipv4Addr, LeaseError> {
        if let Some(lease) = self
            .leases
            .values()
            .find(|l| l.mac == mac && l.is_live(now))
        {
            return Ok(lease.ip);
        }
        let ip = match self.static_for(None, Some(mac)) {
            Some(ip) => ip,
            None => match self
                .leases
                .values()
                .find(|l| l.mac == mac && l.owner == Owner::Mac)
            {
                Some(old) if !self.is_taken(old.ip, now) => old.ip,
                _ => self.free_address(now)?,
            },
        };
        self.leases
            .retain(|_, l| !(l.mac == mac && l.owner == Owner::Mac));
        let held_until = Some(now + self.lease_time);
        self.leases.insert(
            ip,
            Lease {
                ip,
                mac,
                owner: Owner::Mac,
                name: None,
                hostname: None,
                uid: None,
                held_until,
            },
        );
        Ok(ip)
    }

    /// A DHCPREQUEST for `ip` from `mac` is acknowledged: records the guest's
    /// hostname and extends a dynamic lease. Returns false if `ip` is not `mac`'s.
    pub fn bind(&mut self, mac: MacAddr, ip: Ipv4Addr, hostname: Option<String>, now: u64) -> bool {
        let lease_time = self.lease_time;
        // A guest's hostname never takes a name that another VM holds, as
        // given at attach or sent first by its own DHCP client.
        let hostname = hostname.filter(|h| {
            !self.leases.values().any(|l| {
                l.ip != ip
                    && l.is_live(now)
                    && [&l.name, &l.hostname]
                        .into_iter()
                        .any(|n| names_match(n.as_deref(), h))
            })
        });
        match self.leases.get_mut(&ip) {
            Some(lease) if lease.mac == mac && lease.is_live(now) => {
                if hostname.is_some() {
                    lease.hostname = hostname;
                }
                if lease.owner == Owner::Mac {
                    lease.held_until = Some(now + lease_time);
                }
                true
            }
            _ => false,
        }
    }

    /// DHCPRELEASE: a dynamic lease ends now; an interface keeps its address.
    pub fn release(&mut self, mac: MacAddr, now: u64) {
        for lease in self
            .leases
            .values_mut()
            .filter(|l| l.mac == mac && l.owner == Owner::Mac)
        {
            lease.held_until = Some(now);
        }
    }

    /// The address of a live lease whose name or DHCP hostname is `name`.
    #[cfg(test)]
    pub fn resolve(&self, name: &str, now: u64) -> Option<Ipv4Addr> {
        self.resolve_name(name, now).map(|(ip, _)| ip)
    }

    /// Clone `id` of the guest at `ip` (MAC `mac`) takes over that guest's
    /// lease: its VM has stopped (its lease is held for it, not attached)
    /// and was `who`'s (or `who` is root). From now on the clone holds the
    /// address on the network, as the VM did. Returns what it took, for
    /// `give_back` should the clone's attach fail.
    pub fn take_over(
        &mut self,
        who: Claimant,
        id: InterfaceId,
        (ip, mac): (Ipv4Addr, MacAddr),
        now: u64,
    ) -> Option<TakenOver> {
        let lease = self.leases.get_mut(&ip)?;
        let held = lease.held_until.is_some_and(|t| t > now);
        let theirs = who.overrides || lease.uid == Some(who.uid);
        let a_vms = matches!(lease.owner, Owner::Interface { .. });
        if !(held && theirs && a_vms && lease.mac == mac) {
            return None;
        }
        let taken = TakenOver {
            ip,
            owner: std::mem::replace(&mut lease.owner, Owner::Interface { id }),
            held_until: lease.held_until.take(),
        };
        self.held_by_clones.insert(id);
        Some(taken)
    }

    /// Puts back a lease a clone took over (`take_over`) and never used.
    pub fn give_back(&mut self, taken: &TakenOver) {
        if let Some(lease) = self.leases.get_mut(&taken.ip) {
            if let Owner::Interface { id } = lease.owner {
                self.held_by_clones.remove(&id);
            }
            lease.owner = taken.owner.clone();
            lease.held_until = taken.held_until;
        }
    }

    /// The live lease of a VM of `who`'s (any, for root) that was called
    /// `name` at attach: a VM a clone may be made of by name.
    pub fn named_for(&self, who: Claimant, name: &str, now: u64) -> Option<&Lease> {
        self.leases.values().find(|l| {
            l.is_live(now)
                && names_match(l.name.as_deref(), name)
                && (who.overrides || l.uid == Some(who.uid))
        })
    }

    /// Clone `id`, called `name`, is at `ip` until it detaches.
    pub fn add_clone(&mut self, id: InterfaceId, name: String, ip: Ipv4Addr) {
        self.clones.insert(id, (name, ip));
    }

    /// The address of the VM called `name`, and its MAC when it has a
    /// lease (a clone's IPv6 is not NATed: it has only its IPv4).
    pub fn resolve_name(&self, name: &str, now: u64) -> Option<(Ipv4Addr, Option<MacAddr>)> {
        // A lease a clone holds has no IPv6 behind it.
        let by_lease = |l: &Lease| {
            let clone_held =
                matches!(l.owner, Owner::Interface { id } if self.held_by_clones.contains(&id));
            (l.ip, Some(l.mac).filter(|_| !clone_held))
        };
        let attach_name = |l: &&Lease| names_match(l.name.as_deref(), name);
        let live = || self.leases.values().filter(|l| l.is_live(now));
        // Names given at attach first (a lease's, a clone's): a hostname
        // never shadows one.
        live()
            .find(attach_name)
            .map(by_lease)
            .or_else(|| {
                self.clones
                    .values()
                    .find(|(n, _)| names_match(Some(n), name))
                    .map(|(_, ip)| (*ip, None))
            })
            .or_else(|| {
                live()
                    .find(|l| names_match(l.hostname.as_deref(), name))
                    .map(by_lease)
            })
    }

    pub fn lease_time(&self) -> u32 {
        self.lease_time as u32
    }

    fn is_taken(&self, ip: Ipv4Addr, now: u64) -> bool {
        ip == self.gateway || self.leases.get(&ip).is_some_and(|l| l.is_live(now))
    }

    fn static_for(&self, id: Option<InterfaceId>, mac: Option<MacAddr>) -> Option<Ipv4Addr> {
        self.statics
            .iter()
            .find(|s| (id.is_some() && s.interface_id == id) || (mac.is_some() && s.mac == mac))
            .map(|s| s.ip)
    }

    /// The lowest address never handed out; failing that, the one whose
    /// reservation ran out longest ago. Static addresses are never dynamic.
    fn free_address(&mut self, now: u64) -> Result<Ipv4Addr, LeaseError> {
        let reserved_static = |ip: Ipv4Addr| self.statics.iter().any(|s| s.ip == ip);
        let candidates = (self.first..=self.last)
            .map(Ipv4Addr::from)
            .filter(|&ip| ip != self.gateway);
        let mut oldest: Option<(u64, Ipv4Addr)> = None;
        for ip in candidates {
            if reserved_static(ip) {
                continue;
            }
            match self.leases.get(&ip) {
                None => return Ok(ip),
                Some(l) => {
                    if let Some(t) = l.held_until.filter(|&t| t <= now)
                        && oldest.is_none_or(|(o, _)| t < o)
                    {
                        oldest = Some((t, ip));
                    }
                }
            }
        }
        match oldest {
            Some((_, ip)) => {
                self.leases.remove(&ip);
                Ok(ip)
            }
            None => Err(LeaseError::PoolExhausted {
                network: self.network.clone(),
                first: self.first.into(),
                last: self.last.into(),
            }),
        }
    }

    fn check_mac_free(&self, mac: MacAddr, owner: &Owner, now: u64) -> Result<(), LeaseError> {
        match self
            .leases
            .values()
            .find(|l| l.mac == mac && &l.owner != owner && l.is_live(now))
        {
            Some(other) => Err(LeaseError::MacInUse {
                network: self.network.clone(),
                mac,
                other: match &other.owner {
                    Owner::Interface { id } => id.to_string(),
                    Owner::Mac => format!("(DHCP client at {})", other.ip),
                },
            }),
            None => Ok(()),
        }
    }

    fn derive_free_mac(&self, id: InterfaceId, now: u64) -> MacAddr {
        let owner = Owner::Interface { id };
        (0u8..)
            .map(|salt| {
                let mut seed = id.as_bytes().to_vec();
                if salt > 0 {
                    seed.push(salt);
                }
                MacAddr::derived(&seed)
            })
            .find(|&mac| self.check_mac_free(mac, &owner, now).is_ok())
            .expect("a free MAC exists")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn table(yaml: &str) -> LeaseTable {
        let cfg = Config::from_yaml(yaml, "t.yaml").unwrap();
        let net = cfg.network("shared").unwrap();
        LeaseTable::new(&net.name, net.own().unwrap())
    }

    fn small() -> LeaseTable {
        table(
            "networks:\n  shared:\n    dhcp: { range: 192.168.105.2-192.168.105.4, lease_time: 100 }\n",
        )
    }

    fn id(n: u8) -> InterfaceId {
        InterfaceId::from_bytes([n; 16])
    }

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(192, 168, 105, last)
    }

    #[test]
    fn a_clone_takes_over_its_stopped_vms_lease_and_names_resolve_to_clones() {
        let mut t = small();
        let vm = t
            .attach_for(1000, id(1), None, Some("web".into()), 0)
            .unwrap();
        let guest = (vm.ip, vm.mac);
        let user = Claimant::from(1000);
        assert!(t.named_for(user, "web", 0).is_some());
        assert!(
            t.named_for(1001.into(), "web", 0).is_none(),
            "another user's VM"
        );
        assert!(t.named_for(0.into(), "web", 0).is_some(), "root's say");
        assert!(
            t.take_over(user, id(2), guest, 1).is_none(),
            "not while the VM is attached"
        );
        t.detach(id(1), 2);
        assert!(
            t.take_over(1001.into(), id(2), guest, 3).is_none(),
            "not another user's"
        );
        let other_guest = (vm.ip, MacAddr([2, 0, 0, 0, 0, 9]));
        assert!(
            t.take_over(user, id(2), other_guest, 3).is_none(),
            "not for another guest"
        );
        // A clone whose attach fails gives it back as it was.
        let taken = t.take_over(user, id(2), guest, 3).unwrap();
        t.give_back(&taken);
        assert_eq!(
            t.held_by(&Owner::Interface { id: id(1) }).map(|l| l.ip),
            Some(vm.ip)
        );
        assert!(t.take_over(user, id(2), guest, 3).is_some());
        assert!(
            t.take_over(user, id(3), guest, 4).is_none(),
            "one clone holds it"
        );
        // The VM's id comes back to another address: the clone has its own.
        let back = t.attach_for(1000, id(1), None, None, 5).unwrap();
        assert_ne!(back.ip, vm.ip);
        // Its name goes with the address, without IPv6 (a clone has none);
        // a clone's own name is answered too.
        assert_eq!(t.resolve_name("web", 5), Some((vm.ip, None)));
        t.add_clone(id(3), "web-1".into(), "198.18.105.2".parse().unwrap());
        assert_eq!(
            t.resolve_name("WEB-1", 5),
            Some(("198.18.105.2".parse().unwrap(), None))
        );
        t.detach(id(3), 6);
        assert_eq!(t.resolve_name("web-1", 6), None, "gone with the clone");
        t.detach(id(2), 6);
        assert_eq!(t.resolve_name("web", 6), Some((vm.ip, Some(vm.mac))));
    }

    #[test]
    fn an_id_and_its_name_belong_to_the_user_who_attached_it_while_its_lease_lives() {
        let mut t = small();
        t.attach_for(1000, id(1), None, Some("web".into()), 0)
            .unwrap();
        t.detach(id(1), 10);
        let theft = t.attach_for(1001, id(1), None, None, 20);
        assert!(
            matches!(theft, Err(LeaseError::NotYours { holder: 1000, .. })),
            "{theft:?}"
        );
        let name = t.attach_for(1001, id(2), None, Some("WEB".into()), 20);
        let Err(e) = name else { panic!("{name:?}") };
        assert_eq!(
            e.to_string(),
            format!(
                "network \"shared\": the name \"WEB\" is held by interface {} of uid 1000; choose another --name",
                id(1)
            )
        );
        t.attach_for(1000, id(3), None, Some("web".into()), 25)
            .expect("its user may give the name to another interface of theirs");
        t.detach(id(3), 26);
        t.attach_for(1000, id(1), None, Some("web".into()), 30)
            .expect("its owner");
        assert!(
            t.attach_for(0, id(2), None, Some("web".into()), 35)
                .is_err(),
            "not even root takes a name an attached interface holds"
        );
        t.detach(id(1), 40);
        // Root's network socket relay speaks for a guest's choice of MAC,
        // not for root: it has no say over another user's id.
        let relay = Claimant {
            uid: 0,
            overrides: false,
        };
        let guest = t.attach_for(relay, id(1), None, None, 45);
        assert!(
            matches!(guest, Err(LeaseError::NotYours { holder: 1000, .. })),
            "{guest:?}"
        );
        t.attach_for(0, id(1), None, None, 50)
            .expect("root may take any id");
        t.detach(id(1), 60);
        // Once the lease ran out (lease_time 100), the id is anyone's.
        t.attach_for(1001, id(1), None, Some("web".into()), 200)
            .expect("expired");
    }

    #[test]
    fn a_dhcp_hostname_never_takes_a_name_another_vm_holds() {
        let mut t = small();
        let web = t
            .attach_for(1000, id(1), None, Some("web".into()), 0)
            .unwrap();
        let other = t.attach_for(1001, id(2), None, None, 0).unwrap();
        assert!(t.bind(other.mac, other.ip, Some("web".into()), 1));
        assert_eq!(
            t.resolve("web", 2),
            Some(web.ip),
            "the name given at attach wins"
        );
        assert!(t.bind(other.mac, other.ip, Some("db".into()), 3));
        assert_eq!(t.resolve("db", 4), Some(other.ip));
        let third = t.attach_for(1002, id(3), None, None, 5).unwrap();
        assert!(t.bind(third.mac, third.ip, Some("db".into()), 6));
        assert_eq!(
            t.resolve("db", 7),
            Some(other.ip),
            "first come, first named"
        );
    }

    #[test]
    fn an_adopted_interface_holds_its_address_again_unless_another_has_it() {
        let mut t = small();
        let lease = |n: u8, ip: Ipv4Addr| Lease {
            ip,
            mac: MacAddr([0x52, 0x54, 0, 0, 0, n]),
            owner: Owner::Interface { id: id(n) },
            name: None,
            hostname: None,
            uid: Some(1000),
            held_until: None,
        };
        t.readopt(lease(1, ip(7)), 100).unwrap();
        t.bind(lease(1, ip(7)).mac, ip(7), Some("vm1".into()), 100);
        t.readopt(lease(1, ip(7)), 100).unwrap();
        assert_eq!(
            t.resolve("vm1", 100),
            Some(ip(7)),
            "its guest's hostname stays"
        );
        assert_eq!(
            t.attach(id(1), None, None, 100).unwrap().ip,
            ip(7),
            "held as attached"
        );
        let other = t.attach(id(2), None, None, 100).unwrap();
        let err = t.readopt(lease(3, other.ip), 100).unwrap_err();
        assert!(err.contains("held by MAC"), "{err}");
        let err = t
            .readopt(lease(4, "10.9.9.9".parse().unwrap()), 100)
            .unwrap_err();
        assert!(err.contains("not in network"), "{err}");
    }

    #[test]
    fn same_id_gets_same_mac_and_ip_across_detach_and_attach() {
        let mut t = small();
        let a = t.attach(id(1), None, Some("vm1".into()), 0).unwrap();
        let b = t.attach(id(2), None, None, 0).unwrap();
        assert_eq!((a.ip, b.ip), (ip(2), ip(3)));
        assert_ne!(a.mac, b.mac);
        t.detach(id(1), 10);
        let again = t.attach(id(1), None, None, 20).unwrap();
        assert_eq!((again.ip, again.mac), (a.ip, a.mac));
    }

    #[test]
    fn detached_address_is_reused_only_after_lease_time() {
        let mut t = small();
        t.attach(id(1), None, None, 0).unwrap();
        t.attach(id(2), None, None, 0).unwrap();
        t.attach(id(3), None, None, 0).unwrap();
        t.detach(id(1), 10);
        let err = t.attach(id(4), None, None, 50).unwrap_err();
        assert!(
            matches!(err, LeaseError::PoolExhausted { .. }),
            "held for lease_time"
        );
        assert!(err.to_string().contains("widen dhcp.range"));
        let d = t.attach(id(4), None, None, 111).unwrap();
        assert_eq!(d.ip, ip(2), "expired reservation reused");
        // id(1) comes back later: its address went to id(4), so it gets another one once free.
        t.detach(id(2), 200);
        let a = t.attach(id(1), None, None, 400).unwrap();
        assert_eq!(a.ip, ip(3));
    }

    #[test]
    fn never_used_addresses_go_before_expired_ones() {
        let mut t = small();
        t.attach(id(1), None, None, 0).unwrap();
        t.detach(id(1), 0);
        let b = t.attach(id(2), None, None, 1000).unwrap();
        assert_eq!(
            b.ip,
            ip(3),
            "the expired .2 stays sticky while fresh addresses remain"
        );
        assert_eq!(t.attach(id(1), None, None, 1000).unwrap().ip, ip(2));
    }

    #[test]
    fn explicit_mac_is_kept_and_duplicates_refused() {
        let mut t = small();
        let mac: MacAddr = "52:54:00:00:00:07".parse().unwrap();
        assert_eq!(t.attach(id(1), Some(mac), None, 0).unwrap().mac, mac);
        let err = t.attach(id(2), Some(mac), None, 0).unwrap_err();
        assert!(
            err.to_string().contains("already used by interface"),
            "{err}"
        );
        t.detach(id(1), 0);
        assert_eq!(
            t.attach(id(1), None, None, 5).unwrap().mac,
            mac,
            "remembered MAC"
        );
    }

    #[test]
    fn static_leases_by_interface_id_and_mac() {
        let mut t = table(&format!(
            "networks:\n  shared:\n    dhcp:\n      static:\n        - {{ interface_id: '{}', ip: 192.168.105.50 }}\n        - {{ mac: '52:54:00:00:00:09', ip: 192.168.105.60 }}\n",
            id(7)
        ));
        assert_eq!(t.attach(id(7), None, None, 0).unwrap().ip, ip(50));
        assert_eq!(
            t.offer("52:54:00:00:00:09".parse().unwrap(), 0).unwrap(),
            ip(60)
        );
        assert_eq!(t.attach(id(8), None, None, 0).unwrap().ip, ip(2));
    }

    #[test]
    fn dhcp_offer_knows_interfaces_and_serves_unknown_macs_dynamically() {
        let mut t = small();
        let a = t.attach(id(1), None, None, 0).unwrap();
        assert_eq!(t.offer(a.mac, 0).unwrap(), a.ip);
        let stranger: MacAddr = "52:54:00:aa:bb:cc".parse().unwrap();
        let ip_s = t.offer(stranger, 0).unwrap();
        assert_eq!(ip_s, ip(3));
        assert!(t.bind(stranger, ip_s, Some("nested".into()), 10));
        assert!(!t.bind(stranger, a.ip, None, 10), "not its address");
        assert_eq!(t.resolve("NESTED", 10), Some(ip_s));
        t.release(stranger, 20);
        assert_eq!(t.resolve("nested", 21), None);
        assert_eq!(
            t.offer(stranger, 30).unwrap(),
            ip_s,
            "the same address when nobody took it"
        );
    }

    #[test]
    fn names_and_hostnames_resolve_only_while_live() {
        let mut t = small();
        let a = t.attach(id(1), None, Some("web".into()), 0).unwrap();
        assert!(t.bind(a.mac, a.ip, Some("debian".into()), 1));
        assert_eq!(t.resolve("web", 2), Some(a.ip));
        assert_eq!(t.resolve("debian", 2), Some(a.ip));
        t.detach(id(1), 3);
        assert_eq!(t.resolve("web", 3), Some(a.ip), "reserved, still answered");
        assert_eq!(t.resolve("web", 200), None);
        assert_eq!(
            t.attach(id(1), None, None, 300)
                .unwrap()
                .hostname
                .as_deref(),
            Some("debian")
        );
    }

    #[test]
    fn table_survives_a_round_trip_to_disk_and_a_bad_file_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared.json");
        let cfg = Config::builtin();
        let net = cfg.network("shared").unwrap();
        let mut t = LeaseTable::open(&net.name, net.own().unwrap(), &path, 0).unwrap();
        let a = t.attach(id(1), None, Some("vm".into()), 0).unwrap();
        t.save().unwrap();
        let mut back = LeaseTable::open(&net.name, net.own().unwrap(), &path, 10).unwrap();
        assert_eq!(
            back.leases().next().unwrap().held_until,
            Some(10 + 3600),
            "held from load time"
        );
        let again = back.attach(id(1), None, None, 11).unwrap();
        assert_eq!((again.mac, again.ip), (a.mac, a.ip));
        std::fs::write(&path, b"{not json").unwrap();
        let fresh = LeaseTable::open(&net.name, net.own().unwrap(), &path, 0)
            .expect("a network that still comes up");
        assert_eq!(fresh.leases().count(), 0);
        assert!(!path.exists(), "moved aside");
        let aside = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("shared.json.broken-")
            })
            .expect("kept for a look");
        assert_eq!(std::fs::read(aside.path()).unwrap(), b"{not json");
    }
}
