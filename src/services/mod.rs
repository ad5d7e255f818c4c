//! The per-network services on the gateway address: DHCPv4, DNS and IPv6
//! router advertisements. Each is
//! a tokio task; sockets are bound before the network reports itself up, so
//! a port already in use fails the attach with a clear message instead of a
//! VM that silently gets no address.

pub mod dhcp;
pub mod dns;
pub mod name_gate;
pub mod ra;
pub mod snoop;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use thiserror::Error;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

use crate::config::{NetworkConfig, Own};
use crate::events::Bus;
use crate::host::netns::NetNs;
use crate::leases::SharedLeases;
use name_gate::NameGate;

/// Starts services on the host: the daemon's seam to them, which unit
/// tests replace (the real ones bind sockets to the network's bridge).
#[async_trait]
pub trait Starter: Send + Sync {
    /// Starts a network's services on its bridge.
    async fn start(&self, ctx: Arc<NetworkContext>) -> Result<Services, ServiceError>;
    /// The socket of a clone's DHCP server, on its TAP in its namespace.
    fn clone_dhcp_socket(&self, ns: &NetNs, tap: &str) -> std::io::Result<UdpSocket>;
}

/// The services as they run, on the host's sockets; their DNS asks
/// `names` about VMs with names in their policy.
pub struct OnHost {
    pub names: Arc<NameGate>,
    /// Where DHCP tells of the leases it gives.
    pub events: Bus,
}

#[async_trait]
impl Starter for OnHost {
    async fn start(&self, ctx: Arc<NetworkContext>) -> Result<Services, ServiceError> {
        Services::start(ctx, self.names.clone(), self.events.clone()).await
    }

    fn clone_dhcp_socket(&self, ns: &NetNs, tap: &str) -> std::io::Result<UdpSocket> {
        ns.enter(|| dhcp::clone_socket(tap))?
    }
}

/// What a network's services share with the daemon: the services are
/// those of a network on a bridge of linnet's (`Kind::Own`).
pub struct NetworkContext {
    config: NetworkConfig,
    pub bridge: String,
    pub bridge_index: u32,
    pub leases: SharedLeases,
    pub counters: Arc<ServiceCounters>,
}

/// What a network's services counted since it came up, for the daemon's
/// metrics.
#[derive(Debug, Default)]
pub struct ServiceCounters {
    /// DNS queries from its VMs (whatever became of them).
    pub dns_queries: AtomicU64,
    /// ...answered REFUSED: names a VM's policy does not allow.
    pub dns_refused: AtomicU64,
    /// ...dropped unanswered: over a VM's or the network's budget.
    pub dns_dropped: AtomicU64,
}

impl ServiceCounters {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn read(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

impl NetworkContext {
    /// None for a LAN network, which has none of linnet's services.
    pub fn new(
        config: NetworkConfig,
        bridge: String,
        bridge_index: u32,
        leases: SharedLeases,
        counters: Arc<ServiceCounters>,
    ) -> Option<NetworkContext> {
        config.own()?;
        Some(NetworkContext {
            config,
            bridge,
            bridge_index,
            leases,
            counters,
        })
    }

    pub fn config(&self) -> &NetworkConfig {
        &self.config
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// What the network has as linnet's own.
    pub fn own(&self) -> &Own {
        self.config
            .own()
            .expect("NetworkContext::new takes only linnet's own networks")
    }
}

#[derive(Debug, Error)]
pub enum ServiceError {
    #[error("network \"{network}\": cannot start {service} on {addr}: {source}")]
    Bind {
        network: String,
        service: &'static str,
        addr: String,
        source: std::io::Error,
    },
}

/// The running services of one network; dropping it stops them (and then
/// the farewells go out).
pub struct Services {
    tasks: Vec<JoinHandle<()>>,
    _farewells: Vec<ra::Farewell>,
}

impl Services {
    pub async fn start(
        ctx: Arc<NetworkContext>,
        names: Arc<NameGate>,
        events: Bus,
    ) -> Result<Services, ServiceError> {
        let mut tasks = Vec::new();
        let mut farewells = Vec::new();
        if ctx.own().dhcp.enabled {
            tasks.push(dhcp::start(ctx.clone(), events)?);
        }
        if ctx.own().dns.enabled {
            tasks.extend(dns::start(ctx.clone(), names)?);
        }
        let advertise = ctx.config.ipv6().is_some_and(|v6| v6.router_advertisement);
        if advertise && let Some((task, farewell)) = ra::start(ctx.clone())? {
            tasks.push(task);
            farewells.push(farewell);
        }
        Ok(Services {
            tasks,
            _farewells: farewells,
        })
    }
}

#[cfg(test)]
impl Services {
    /// None running: what a fake starter gives.
    pub fn none() -> Services {
        Services {
            tasks: Vec::new(),
            _farewells: Vec::new(),
        }
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Runs a network's service as a task. A panic in it (a bug: nothing a
/// guest sends should cause one) is logged with the service and network
/// named, instead of ending the task without a word.
fn spawn_service<F>(service: &'static str, network: &str, serve: F) -> JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    use futures::FutureExt;
    let network = network.to_string();
    tokio::spawn(async move {
        if let Err(panic) = std::panic::AssertUnwindSafe(serve).catch_unwind().await {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("?");
            tracing::error!(%network, "the {service} service stopped on a bug ({why}); restart the daemon to bring it back, and report it");
        }
    })
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_service_that_panics_ends_quietly_for_its_runtime() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ended = runtime.block_on(async {
            super::spawn_service("test", "net", async { panic!("a bug") }).await
        });
        assert!(ended.is_ok(), "the panic was caught and logged");
    }
}
