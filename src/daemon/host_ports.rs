//! A rootless daemon's published ports. Its firewall lives in its own
//! network namespace, which the host's traffic never enters; so the host
//! side of each forward is a socket the supervisor opened in the host's
//! namespace, as the user ([`HostSide::listen`]), and a relay here
//! carries each connection (TCP) or each peer's datagrams (UDP) to the VM
//! from inside the namespace, where the VM sees it come from its gateway
//! as a forwarded connection from the host's loopback does on the system
//! daemon.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::errors::DaemonError;
use crate::api::Channel;
use crate::forward::{PortForward, Protocol};
use crate::host::firewall::ForwardRule;

/// A UDP peer's relay ends after this long without a datagram either way
/// (conntrack's default for an unreplied UDP flow is 30 s, a replied one
/// 120 s).
const UDP_IDLE: Duration = Duration::from_secs(120);
/// UDP peers relayed at once per forward; datagrams of more are dropped.
const UDP_PEERS: usize = 1024;
/// TCP connections relayed at once per forward; more are closed at once
/// (each holds two sockets of the daemon's).
const TCP_CONNECTIONS: usize = 4096;
/// How long a relay pauses after its host socket fails, rather than spin.
const ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What the daemon asks of the supervisor.
#[derive(Debug, Serialize, Deserialize)]
pub enum HostRequest {
    /// A socket listening (TCP) or bound (UDP) on the host for `forward`'s
    /// host side.
    Listen(PortForward),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum HostReply {
    /// The socket comes with it.
    Listening,
    Refused {
        message: String,
    },
}

/// The daemon's side of the supervisor: the host's ports, asked for.
pub struct HostSide {
    channel: std::sync::Mutex<Channel>,
}

impl HostSide {
    /// Over `channel`, the supervisor's end of which answers.
    pub fn new(channel: Channel) -> HostSide {
        HostSide {
            channel: std::sync::Mutex::new(channel),
        }
    }

    /// A socket on the host for `forward`'s host side, or why there is none
    /// (a privileged port, one another program holds).
    ///
    /// A blocking round trip on a socketpair to a process that answers at
    /// once (one bind), taken while the daemon decides a forward.
    pub fn listen(&self, forward: &PortForward) -> Result<OwnedFd, String> {
        let channel = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        let gone = |e: io::Error| format!("the rootless supervisor is gone ({e})");
        channel
            .send(&HostRequest::Listen(*forward), &[])
            .map_err(gone)?;
        match channel.recv::<HostReply>().map_err(gone)? {
            Some((HostReply::Listening, mut fds)) if fds.len() == 1 => Ok(fds.remove(0)),
            Some((HostReply::Refused { message }, _)) => Err(message),
            _ => Err("the rootless supervisor answered out of turn".into()),
        }
    }
}

pub(super) struct HostPorts {
    side: HostSide,
    open: BTreeMap<PortForward, Forwarder>,
}

/// One forward's host socket, and its relay once it has a target.
struct Forwarder {
    socket: OwnedFd,
    relay: Option<(SocketAddr, JoinHandle<()>)>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some((_, task)) = self.relay.take() {
            task.abort();
        }
    }
}

impl HostPorts {
    pub fn new(side: HostSide) -> HostPorts {
        HostPorts {
            side,
            open: BTreeMap::new(),
        }
    }

    /// Opens `forward`'s host side now, so that a port the user may not
    /// have, or another program holds, refuses the forward with the reason.
    pub fn reserve(&mut self, forward: &PortForward) -> Result<(), DaemonError> {
        if self.open.contains_key(forward) {
            return Ok(());
        }
        let socket = self.side.listen(forward).map_err(DaemonError::Forbidden)?;
        self.open.insert(
            *forward,
            Forwarder {
                socket,
                relay: None,
            },
        );
        Ok(())
    }

    /// Relays each forward of `rules` to its VM, and closes the host side
    /// of every other.
    pub fn sync(&mut self, rules: &[ForwardRule]) {
        let wanted: BTreeMap<PortForward, SocketAddr> = rules
            .iter()
            .map(|r| {
                let target = SocketAddr::new(r.guest.into(), r.forward.guest_port);
                (r.forward, target)
            })
            .collect();
        self.open.retain(|f, _| wanted.contains_key(f));
        for (forward, target) in wanted {
            if !self.open.contains_key(&forward)
                && let Err(e) = self.reserve(&forward)
            {
                warn!(%forward, "port not published on the host: {e}");
                continue;
            }
            let fwd = self.open.get_mut(&forward).expect("reserved");
            if fwd.relay.as_ref().is_some_and(|(t, _)| *t == target) {
                continue;
            }
            match start(&fwd.socket, forward.protocol, target) {
                Ok(task) => {
                    if let Some((_, old)) = fwd.relay.replace((target, task)) {
                        old.abort();
                    }
                    debug!(%forward, %target, "relaying the host's port");
                }
                Err(e) => warn!(%forward, "cannot relay the host's port: {e}"),
            }
        }
    }
}

fn start(
    socket: &OwnedFd,
    protocol: Protocol,
    target: SocketAddr,
) -> std::io::Result<JoinHandle<()>> {
    let socket = socket.try_clone()?;
    Ok(match protocol {
        Protocol::Tcp => {
            let listener = TcpListener::from_std(std::net::TcpListener::from(socket))?;
            tokio::spawn(relay_tcp(listener, target))
        }
        Protocol::Udp => {
            let socket = UdpSocket::from_std(std::net::UdpSocket::from(socket))?;
            tokio::spawn(relay_udp(Arc::new(socket), target))
        }
    })
}

async fn relay_tcp(listener: TcpListener, target: SocketAddr) {
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        let (mut from_host, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                warn!(%target, "accept on a published port failed: {e}");
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        if open.load(Ordering::Relaxed) >= TCP_CONNECTIONS {
            debug!(%peer, %target, "a published port's connection refused: {TCP_CONNECTIONS} open");
            continue;
        }
        let slot = Slot::take(&open);
        tokio::spawn(async move {
            let _slot = slot;
            match TcpStream::connect(target).await {
                Ok(mut to_vm) => {
                    let _ = from_host.set_nodelay(true);
                    let _ = to_vm.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut from_host, &mut to_vm).await;
                }
                Err(e) => debug!(%peer, %target, "forwarded connection refused by the VM: {e}"),
            }
        });
    }
}

/// One of a forward's open connections, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(count: &Arc<AtomicUsize>) -> Slot {
        count.fetch_add(1, Ordering::Relaxed);
        Slot(count.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

type Peers = Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>>;

/// Each host peer gets a socket of its own toward the VM, so the VM's
/// replies find their way back to that peer.
async fn relay_udp(host: Arc<UdpSocket>, target: SocketAddr) {
    let peers: Peers = Arc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let (len, peer) = match host.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                debug!(%target, "receive on a published port failed: {e}");
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        let known = peers.lock().unwrap().get(&peer).cloned();
        let toward_vm = match known {
            Some(sock) => sock,
            None => {
                if peers.lock().unwrap().len() >= UDP_PEERS {
                    continue;
                }
                let Ok(sock) = peer_socket(target).await else {
                    continue;
                };
                peers.lock().unwrap().insert(peer, sock.clone());
                tokio::spawn(udp_replies(sock.clone(), host.clone(), peer, peers.clone()));
                sock
            }
        };
        let _ = toward_vm.send(&buf[..len]).await;
    }
}

async fn peer_socket(target: SocketAddr) -> std::io::Result<Arc<UdpSocket>> {
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("address"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("address"),
    };
    let sock = UdpSocket::bind(local).await?;
    sock.connect(target).await?;
    Ok(Arc::new(sock))
}

/// The VM's replies to one host peer, until the flow is idle.
async fn udp_replies(
    toward_vm: Arc<UdpSocket>,
    host: Arc<UdpSocket>,
    peer: SocketAddr,
    peers: Peers,
) {
    let mut buf = vec![0u8; 65536];
    while let Ok(Ok(len)) = tokio::time::timeout(UDP_IDLE, toward_vm.recv(&mut buf)).await {
        let _ = host.send_to(&buf[..len], peer).await;
    }
    peers.lock().unwrap().remove(&peer);
}
