//! The secrets proxy's own part, what `linnet-secrets` runs, one process
//! per network with secret rules (docs/secrets.md, docs/architecture.md
//! "Secrets"): the network's CA and the leaves it issues (`ca`), where a
//! placeholder is (`placeholder`), which secret may go where (`grants`),
//! what upstream certificates are checked against (`trust`), one steered
//! connection (`connection`) and its requests (`request`).
//!
//! The proxy judges a connection's name as the gate does (`gate::vms`,
//! fed the same VMs and learned names), so a connection steered here is
//! held to no less than one the gate checks.

pub mod ca;
pub mod connection;
pub mod grants;
pub mod placeholder;
pub mod process;
pub mod replayed;
pub mod request;
pub mod trust;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use rustls::crypto::CryptoProvider;
use serde::{Deserialize, Serialize};

use self::ca::Ca;
use self::grants::Grant;
use crate::gate::vms::{Refusal, Vms};
use crate::gate::wire::{GatedVm, Judgement};
use crate::policy::SECRET_PORT;
use crate::types::InterfaceId;

/// Connections the proxy serves at once, in all and of one VM.
const MAX_OPEN: usize = 4096;
const MAX_OPEN_PER_VM: usize = 256;
/// Records waiting to go to the daemon, at most; past them they are
/// dropped (and counted).
pub const MAX_RECORDS: usize = 4096;

/// A VM of the network: as the gate knows it, and its grants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxiedVm {
    pub vm: GatedVm,
    pub grants: Vec<Grant>,
}

/// What the proxy puts on record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A connection judged by the name it showed; `terminated` when it
    /// was decrypted for its requests (else spliced, or refused).
    Connection {
        judgement: Judgement,
        terminated: bool,
    },
    /// A secret went into a request to `host`.
    Substituted {
        interface_id: InterfaceId,
        host: String,
        secret: String,
    },
    /// A request to `host` was refused, or got no answer; why.
    Refused {
        interface_id: InterfaceId,
        host: String,
        why: String,
    },
}

#[derive(Default)]
struct State {
    vms: Vms,
    grants: HashMap<InterfaceId, Arc<[Grant]>>,
}

/// The proxy of one network.
pub struct Proxy {
    pub ca: Ca,
    /// What upstreams are checked against.
    pub upstream: Arc<rustls::ClientConfig>,
    pub provider: Arc<CryptoProvider>,
    /// The port whose connections to a secret rule's host are terminated:
    /// `SECRET_PORT` (a test's upstream listens elsewhere).
    port: u16,
    state: RwLock<State>,
    open: Arc<Mutex<HashMap<InterfaceId, usize>>>,
    records: tokio::sync::mpsc::Sender<Record>,
}

/// A connection being served: counted until dropped.
pub struct Slot {
    open: Arc<Mutex<HashMap<InterfaceId, usize>>>,
    interface_id: InterfaceId,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().expect("not poisoned");
        if let Some(n) = open.get_mut(&self.interface_id) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.interface_id);
            }
        }
    }
}

impl Proxy {
    pub fn new(
        ca: Ca,
        upstream: rustls::ClientConfig,
        provider: Arc<CryptoProvider>,
        records: tokio::sync::mpsc::Sender<Record>,
    ) -> Proxy {
        Proxy {
            ca,
            upstream: Arc::new(upstream),
            provider,
            port: SECRET_PORT,
            state: RwLock::default(),
            open: Arc::default(),
            records,
        }
    }

    /// These are the network's VMs now.
    pub fn set_vms(&self, vms: Vec<ProxiedVm>) {
        let mut state = self.state.write().expect("not poisoned");
        state.grants = vms
            .iter()
            .map(|v| (v.vm.interface_id, v.grants.clone().into()))
            .collect();
        state.vms.set(vms.into_iter().map(|v| v.vm).collect());
    }

    /// What the gate is told of learned names, told here too.
    pub fn learned(&self, interface_id: InterfaceId, name: &str, addrs: &[(IpAddr, u32)]) {
        let mut state = self.state.write().expect("not poisoned");
        state.vms.learned(interface_id, name, addrs, Instant::now());
    }

    pub fn restored(&self, interface_id: InterfaceId, reach: usize, addrs: &[(IpAddr, u32)]) {
        let mut state = self.state.write().expect("not poisoned");
        state
            .vms
            .restored(interface_id, reach, addrs, Instant::now());
    }

    pub fn expire(&self) {
        self.state
            .write()
            .expect("not poisoned")
            .vms
            .expire(Instant::now());
    }

    /// The VM a connection from `source` is of, and its place among the
    /// connections served; refused when it is no VM's, or past the
    /// limits (the VM's or all).
    fn admit(
        &self,
        source: SocketAddr,
    ) -> Result<(InterfaceId, Slot), (Option<InterfaceId>, Refusal)> {
        let interface_id = {
            let state = self.state.read().expect("not poisoned");
            let vm = state.vms.of(source.ip()).ok_or((None, Refusal::Unknown))?;
            state.vms.interface_id(vm)
        };
        let mut open = self.open.lock().expect("not poisoned");
        let all: usize = open.values().sum();
        let mine = open.entry(interface_id).or_default();
        if all >= MAX_OPEN || *mine >= MAX_OPEN_PER_VM {
            return Err((Some(interface_id), Refusal::TooMany));
        }
        *mine += 1;
        let slot = Slot {
            open: self.open.clone(),
            interface_id,
        };
        Ok((interface_id, slot))
    }

    /// Whether the VM may open this connection showing `name` (the gate's
    /// judgement), and if so whether a secret rule names it (then it is
    /// terminated).
    fn judge(
        &self,
        interface_id: InterfaceId,
        source: SocketAddr,
        destination: SocketAddr,
        name: &str,
    ) -> Result<bool, Refusal> {
        let state = self.state.read().expect("not poisoned");
        let vm = state.vms.of(source.ip()).ok_or(Refusal::Unknown)?;
        if state.vms.interface_id(vm) != interface_id {
            return Err(Refusal::Unknown);
        }
        let port = destination.port();
        state
            .vms
            .judge(vm, destination.ip(), port, name, Instant::now())?;
        let host = grants::host_name(name).ok_or(Refusal::NotAllowed)?;
        let grants = state.grants.get(&interface_id);
        Ok(port == self.port && grants.is_some_and(|g| grants::intercepts(g, &host)))
    }

    /// The grants of `interface_id`'s VM as they are now (a rotated
    /// secret's new value for the next request).
    fn grants_of(&self, interface_id: InterfaceId) -> Option<Arc<[Grant]>> {
        let state = self.state.read().expect("not poisoned");
        state.grants.get(&interface_id).cloned()
    }

    fn record(&self, record: Record) {
        // Full: the daemon is behind, and the record is dropped.
        let _ = self.records.try_send(record);
    }
}
