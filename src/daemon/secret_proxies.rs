//! The daemon's side of the secrets proxies (`secret_proxy`): one
//! `linnet-secrets` per network whose VMs have secret rules, started as
//! a user of its own with no capabilities (`confined`), and kept running.
//! For each the daemon:
//!
//! - binds the listening socket on the network's IPv4 gateway (a port the
//!   kernel picks) and keeps a copy, so connections steered there while a
//!   proxy restarts wait in its backlog rather than fail;
//! - makes the network's CA the first time (`ca/NETWORK.key`, 0600, and
//!   `ca/NETWORK.pem` in the state directory) and hands it over with the
//!   trust store's bytes: the proxy opens no file;
//! - tells it the network's VMs with their grants (each secret rule with
//!   the value of the secret it names, resolved here: the owner's for the
//!   owner's rules, the network's for the network's), again at every
//!   change of policy or secret, so a rotation holds for the next request;
//! - tells it what the VMs learn by name (`Pins`), as the gate is told;
//! - turns its records into events (`connection`, `secret`), within a
//!   budget per VM, as the gate's are.
//!
//! A proxy that dies is started again (50 ms, doubling to 1 s) and told
//! everything again. Without a proxy the steered connections find no one
//! accepting and time out: none is carried on unchecked.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hickory_proto::rr::Name;
use nix::sys::socket::MsgFlags;
use tracing::{error, info, warn};

use super::client::Client;
use super::errors::DaemonError;
use crate::api::Response;
use crate::budget::RateLimit;
use crate::config::Config;
use crate::events::{Bus, What};
use crate::gate::wire::Control;
use crate::secret_proxy::ca::CaFiles;
use crate::secret_proxy::process::{DAEMON_FD, EXECUTABLE, LISTENER_FD, MAX_MESSAGE, ToProxy};
use crate::secret_proxy::{ProxiedVm, Record, trust};
use crate::services::name_gate::{NamedVm, Pins};
use crate::types::InterfaceId;

/// The root daemon's secrets proxies run as this uid and gid, owned by no
/// one, which linnet's table holds to HTTPS out.
pub use crate::host::SECRETS_UID;
const RESTART_FIRST: Duration = Duration::from_millis(50);
const RESTART_AT_MOST: Duration = Duration::from_secs(1);
const STEADY: Duration = Duration::from_secs(10);
/// Records of one VM's at most in each window, as the gate's.
const RECORDS_PER_WINDOW: u32 = 100;
const RECORD_WINDOW: Duration = Duration::from_secs(10);
/// Messages that may wait for a running proxy's room, at most; and how
/// often the keeper sends them.
const MAX_PENDING: usize = 4096;
const FLUSH: Duration = Duration::from_secs(1);
/// Names learned kept to tell a restarted proxy, past which the expired
/// are forgotten at the next one learned.
const MAX_PINS: usize = 4096;
/// The directory of the networks' CAs, in the state directory.
const CA_DIR: &str = "ca";

/// A network whose VMs have secret rules, as the daemon sees it now.
pub struct ProxiedNetwork {
    pub network: String,
    pub gateway: Ipv4Addr,
    pub upstream_ca: Option<PathBuf>,
    /// Its VMs with secret rules, and their names.
    pub vms: Vec<(ProxiedVm, Option<String>)>,
}

pub struct SecretProxies {
    executable: PathBuf,
    run_as: Option<(u32, u32)>,
    ca_dir: PathBuf,
    events: Bus,
    kept: Mutex<BTreeMap<String, Arc<Kept>>>,
}

/// One network's proxy.
struct Kept {
    network: String,
    port: u16,
    listener: TcpListener,
    /// `ToProxy::Start`, as sent.
    start: Vec<u8>,
    stopping: AtomicBool,
    live: Mutex<Live>,
}

#[derive(Default)]
struct Live {
    socket: Option<UnixDatagram>,
    child: Option<Child>,
    /// `ToProxy::Vms`, as last told.
    vms: Vec<u8>,
    names: HashMap<InterfaceId, Option<String>>,
    /// What its VMs learned, to tell a proxy started again.
    pins: HashMap<(InterfaceId, String), Vec<(IpAddr, Instant)>>,
    /// Messages the running proxy had no room for yet, in order.
    pending: VecDeque<Vec<u8>>,
}

impl Live {
    /// Tells the proxy running now `message`, never waiting on it (the
    /// daemon's thread calls this): what finds no room waits in `pending`,
    /// sent before anything newer, by the next `tell` or the keeper's
    /// second. A proxy too far behind is stopped, to start again and be
    /// told everything afresh. With no proxy running, its start tells it.
    fn tell(&mut self, message: Vec<u8>) {
        if self.socket.is_none() {
            return;
        }
        self.pending.push_back(message);
        self.flush();
    }

    fn flush(&mut self) {
        let Some(socket) = &self.socket else {
            self.pending.clear();
            return;
        };
        while let Some(message) = self.pending.front() {
            match nix::sys::socket::send(
                socket.as_raw_fd(),
                message,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(_) => {
                    self.pending.pop_front();
                }
                Err(nix::errno::Errno::EAGAIN) if self.pending.len() < MAX_PENDING => return,
                Err(e) => {
                    warn!(
                        "{EXECUTABLE} cannot be told what it needs ({e}; {} messages waiting): it is stopped, to start again and be told all",
                        self.pending.len()
                    );
                    self.pending.clear();
                    if let Some(child) = &mut self.child {
                        let _ = child.kill();
                    }
                    return;
                }
            }
        }
    }
}

impl SecretProxies {
    /// `run_as`: the uid and gid its proxies run as (None: the daemon's
    /// own, a rootless daemon's user).
    pub fn new(
        events: Bus,
        run_as: Option<(u32, u32)>,
        state_dir: &Path,
    ) -> anyhow::Result<Arc<SecretProxies>> {
        let executable =
            super::confined::beside_me(EXECUTABLE, "it puts secrets into VMs' requests")?;
        Ok(Arc::new(SecretProxies {
            executable,
            run_as,
            ca_dir: state_dir.join(CA_DIR),
            events,
            kept: Mutex::default(),
        }))
    }

    /// The port `network`'s proxy listens on, while it is kept.
    pub fn port(&self, network: &str) -> Option<u16> {
        let kept = self.kept.lock().expect("not poisoned");
        kept.get(network).map(|k| k.port)
    }

    /// These networks have VMs with secret rules now: a proxy is started
    /// for each that has none and told its VMs; the others' are stopped.
    /// Returns the networks whose proxy could not be started, and why.
    pub fn sync(self: &Arc<Self>, networks: Vec<ProxiedNetwork>) -> Vec<(String, String)> {
        let mut failed = Vec::new();
        let mut kept = self.kept.lock().expect("not poisoned");
        let wanted: Vec<String> = networks.iter().map(|n| n.network.clone()).collect();
        kept.retain(|network, proxy| {
            let keep = wanted.contains(network);
            if !keep {
                proxy.stop();
                info!(
                    network,
                    "{EXECUTABLE} stopped: no VM of the network has a secret rule"
                );
            }
            keep
        });
        for net in networks {
            let proxy = match kept.get(&net.network) {
                Some(proxy) => proxy.clone(),
                None => match self.keep(&net) {
                    Ok(proxy) => {
                        kept.insert(net.network.clone(), proxy.clone());
                        proxy
                    }
                    Err(e) => {
                        failed.push((net.network.clone(), e.to_string()));
                        continue;
                    }
                },
            };
            let mut live = proxy.live.lock().expect("not poisoned");
            live.names = (net.vms.iter())
                .map(|(v, name)| (v.vm.interface_id, name.clone()))
                .collect();
            let ids: Vec<InterfaceId> = live.names.keys().copied().collect();
            live.pins.retain(|(id, _), _| ids.contains(id));
            let vms: Vec<ProxiedVm> = net.vms.into_iter().map(|(v, _)| v).collect();
            let message = encode(&ToProxy::Vms(vms));
            if message != live.vms {
                live.vms = message.clone();
                live.tell(message);
            }
        }
        failed
    }

    /// Binds `net`'s socket, reads its CA and trust store, and starts its
    /// proxy's keeper.
    fn keep(self: &Arc<Self>, net: &ProxiedNetwork) -> io::Result<Arc<Kept>> {
        let ca = network_ca(&self.ca_dir, &net.network)?;
        let mut trust = Vec::new();
        let host = trust::host_bundle();
        for path in host.iter().chain(&net.upstream_ca) {
            let pem = std::fs::read_to_string(path).map_err(|e| {
                io::Error::new(e.kind(), format!("the trust store {}: {e}", path.display()))
            })?;
            trust.push(pem);
        }
        if trust.is_empty() {
            return Err(io::Error::other(
                "no trust store to check upstreams by: the host has none of /etc/ssl/certs/ca-certificates.crt, /etc/pki/tls/certs/ca-bundle.crt, /etc/ssl/ca-bundle.pem (SSL_CERT_FILE names another), and the network no upstream_ca",
            ));
        }
        let listener = TcpListener::bind(SocketAddr::from((net.gateway, 0)))?;
        let port = listener.local_addr()?.port();
        let start = encode(&ToProxy::Start {
            network: net.network.clone(),
            ca,
            trust,
        });
        if start.len() > MAX_MESSAGE {
            return Err(io::Error::other(format!(
                "the trust store is {} bytes, more than the proxy takes ({MAX_MESSAGE})",
                start.len()
            )));
        }
        let kept = Arc::new(Kept {
            network: net.network.clone(),
            port,
            listener,
            start,
            stopping: AtomicBool::new(false),
            live: Mutex::default(),
        });
        let (proxies, keeping) = (self.clone(), kept.clone());
        std::thread::Builder::new()
            .name(format!("secrets-{}", net.network))
            .spawn(move || proxies.run(&keeping))?;
        info!(network = %net.network, port, "the network's secrets proxy listens on its gateway");
        Ok(kept)
    }

    /// Keeps `kept`'s proxy running until it is stopped.
    fn run(&self, kept: &Kept) {
        let mut wait = RESTART_FIRST;
        let mut records = RateLimit::new(RECORDS_PER_WINDOW, RECORD_WINDOW);
        let mut held_back: HashMap<InterfaceId, u64> = HashMap::new();
        let mut buf = vec![0u8; MAX_MESSAGE];
        while !kept.stopping.load(Ordering::SeqCst) {
            match self.spawn(kept) {
                Ok(reader) => {
                    let started = Instant::now();
                    info!(network = %kept.network, "{EXECUTABLE} started");
                    loop {
                        match reader.recv(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => self.record(kept, &buf[..n], &mut records, &mut held_back),
                            // Its second: what waits for room is sent.
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                                ) =>
                            {
                                kept.live.lock().expect("not poisoned").flush();
                            }
                            Err(_) => break,
                        }
                    }
                    let status = {
                        let mut live = kept.live.lock().expect("not poisoned");
                        live.socket = None;
                        live.child.take().map(|mut child| {
                            let _ = child.kill();
                            child.wait()
                        })
                    };
                    if kept.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    if started.elapsed() >= STEADY {
                        wait = RESTART_FIRST;
                    }
                    warn!(network = %kept.network, "{EXECUTABLE} stopped ({status:?}): steered connections wait until it starts again in {wait:?}");
                }
                Err(e) => error!(
                    network = %kept.network,
                    "cannot start {}: {e}; its steered connections wait until it runs",
                    self.executable.display()
                ),
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(RESTART_AT_MOST);
        }
    }

    /// Starts `kept`'s proxy and tells it all it needs; returns the end
    /// its records come from.
    fn spawn(&self, kept: &Kept) -> io::Result<UnixDatagram> {
        // Room for the first message, the trust store's bundle in it.
        let (ours, theirs) = super::confined::pair(MAX_MESSAGE)?;
        let child = super::confined::spawn(
            &self.executable,
            self.run_as,
            &[
                (theirs.as_fd(), DAEMON_FD),
                (kept.listener.as_fd(), LISTENER_FD),
            ],
        )?;
        drop(theirs);
        let reader = ours.try_clone()?;
        reader.set_read_timeout(Some(FLUSH))?;
        let mut live = kept.live.lock().expect("not poisoned");
        ours.send(&kept.start)?;
        if !live.vms.is_empty() {
            ours.send(&live.vms)?;
        }
        let now = Instant::now();
        live.pins
            .retain(|_, addrs| addrs.iter().any(|(_, until)| *until > now));
        for ((interface_id, name), addrs) in &live.pins {
            ours.send(&encode(&ToProxy::Pins(Control::Learned {
                interface_id: *interface_id,
                name: name.clone(),
                addrs: left(addrs, now),
            })))?;
        }
        live.socket = Some(ours);
        live.child = Some(child);
        live.pending.clear();
        Ok(reader)
    }

    /// A record of `kept`'s proxy, as an event.
    fn record(
        &self,
        kept: &Kept,
        message: &[u8],
        budget: &mut RateLimit<InterfaceId>,
        held_back: &mut HashMap<InterfaceId, u64>,
    ) {
        let Ok(record) = serde_json::from_slice::<Record>(message) else {
            warn!(network = %kept.network, "{EXECUTABLE} sent a record the daemon cannot read");
            return;
        };
        let interface_id = match &record {
            Record::Connection { judgement, .. } => judgement.interface_id,
            Record::Substituted { interface_id, .. } | Record::Refused { interface_id, .. } => {
                *interface_id
            }
        };
        if budget.allow(&interface_id, Instant::now()).is_err() {
            *held_back.entry(interface_id).or_default() += 1;
            return;
        }
        let held_back = held_back.remove(&interface_id).unwrap_or(0);
        let name = {
            let live = kept.live.lock().expect("not poisoned");
            live.names.get(&interface_id).cloned().flatten()
        };
        let what = match record {
            Record::Connection {
                judgement,
                terminated,
            } => judgement.event(name, terminated, held_back),
            Record::Substituted { host, secret, .. } => What::Secret {
                interface_id,
                name,
                host,
                secret: Some(secret),
                substituted: true,
                why: None,
                held_back,
            },
            Record::Refused { host, why, .. } => What::Secret {
                interface_id,
                name,
                host,
                secret: None,
                substituted: false,
                why: Some(why),
                held_back,
            },
        };
        self.events.emit(Some(&kept.network), what);
    }

    /// Stops every proxy (the daemon stops).
    pub fn stop(&self) {
        let mut kept = self.kept.lock().expect("not poisoned");
        for proxy in kept.values() {
            proxy.stop();
        }
        kept.clear();
    }

    fn kept_of(&self, interface_id: InterfaceId) -> Option<Arc<Kept>> {
        let kept = self.kept.lock().expect("not poisoned");
        kept.values()
            .find(|k| {
                let live = k.live.lock().expect("not poisoned");
                live.names.contains_key(&interface_id)
            })
            .cloned()
    }
}

impl Kept {
    fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let mut live = self.live.lock().expect("not poisoned");
        if let Some(socket) = live.socket.take() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
        if let Some(child) = &mut live.child {
            let _ = child.kill();
        }
    }
}

impl Pins for SecretProxies {
    /// Its VMs come with their grants (`sync`), after this.
    fn vms(&self, _: &[NamedVm]) {}

    fn learned(&self, interface_id: InterfaceId, name: &Name, addrs: &[(IpAddr, u32)]) {
        let Some(kept) = self.kept_of(interface_id) else {
            return;
        };
        let name = crate::names::shown(&crate::names::normalise(name));
        let now = Instant::now();
        let mut live = kept.live.lock().expect("not poisoned");
        let until: Vec<(IpAddr, Instant)> = (addrs.iter())
            .map(|&(a, s)| (a, now + Duration::from_secs(s.into())))
            .collect();
        live.tell(encode(&ToProxy::Pins(Control::Learned {
            interface_id,
            name: name.clone(),
            addrs: addrs.to_vec(),
        })));
        // What the proxy already let expire is forgotten here too, now and
        // then: a VM asking name after name under a wildcard grows it.
        if live.pins.len() >= MAX_PINS {
            live.pins
                .retain(|_, addrs| addrs.iter().any(|(_, until)| *until > now));
        }
        let pins = live.pins.entry((interface_id, name)).or_default();
        for (addr, until) in until {
            match pins.iter_mut().find(|(a, _)| *a == addr) {
                Some(pin) => pin.1 = pin.1.max(until),
                None => pins.push((addr, until)),
            }
        }
    }

    fn restored(&self, interface_id: InterfaceId, reach: usize, addrs: &[(IpAddr, u32)]) {
        if let Some(kept) = self.kept_of(interface_id) {
            let mut live = kept.live.lock().expect("not poisoned");
            live.tell(encode(&ToProxy::Pins(Control::Restored {
                interface_id,
                reach,
                addrs: addrs.to_vec(),
            })));
        }
    }
}

fn encode(message: &ToProxy) -> Vec<u8> {
    serde_json::to_vec(message).expect("a message serialises")
}

/// The seconds each address has left, at least one.
fn left(addrs: &[(IpAddr, Instant)], now: Instant) -> Vec<(IpAddr, u32)> {
    (addrs.iter())
        .map(|(a, until)| {
            let secs = until.saturating_duration_since(now).as_secs();
            (*a, u32::try_from(secs).unwrap_or(u32::MAX).max(1))
        })
        .collect()
}

/// `linnet ca`: `network`'s secrets CA certificate (made the first time,
/// in `state_dir`), for one who may attach to it.
pub(super) fn ca_request(
    config: &Config,
    state_dir: &Path,
    client: &Client,
    network: &str,
) -> Result<Response, DaemonError> {
    let cfg = config
        .network(network)
        .ok_or_else(|| DaemonError::unknown_network(config, network))?;
    client.may_use(cfg)?;
    let dir = state_dir.join(CA_DIR);
    let ca = network_ca(&dir, network).map_err(|source| DaemonError::StateFile {
        what: "cannot read or make the network's secrets CA",
        path: dir.clone(),
        source,
    })?;
    Ok(Response::Ca {
        network: network.into(),
        certificate: ca.cert_pem,
    })
}

/// `network`'s CA from `dir`: its key (`NETWORK.key`, 0600) and
/// certificate (`NETWORK.pem`), made and written the first time.
pub(super) fn network_ca(dir: &Path, network: &str) -> io::Result<CaFiles> {
    let key_path = dir.join(format!("{network}.key"));
    let cert_path = dir.join(format!("{network}.pem"));
    match (
        std::fs::read_to_string(&key_path),
        std::fs::read_to_string(&cert_path),
    ) {
        (Ok(key_pem), Ok(cert_pem)) => return Ok(CaFiles { cert_pem, key_pem }),
        (Err(e), _) | (_, Err(e)) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io::Error::new(
                e.kind(),
                format!("the network's CA in {}: {e}", dir.display()),
            ));
        }
        _ => {}
    }
    crate::files::private_dir(dir)?;
    let made = CaFiles::make(network, SystemTime::now()).map_err(io::Error::other)?;
    crate::files::write_private_durably(&key_path, made.key_pem.as_bytes())?;
    crate::files::write_atomically(&cert_path, made.cert_pem.as_bytes())?;
    info!(network, certificate = %cert_path.display(), "made the network's secrets CA");
    Ok(made)
}
