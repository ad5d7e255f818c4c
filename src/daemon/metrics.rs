//! `linnet daemon --metrics ADDR:PORT`: Prometheus' text format at
//! `/metrics`, over plain HTTP/1.1, one request per connection. Each scrape
//! takes the numbers then: the links' counters from the kernel (without
//! the daemon's lock, as `ls` does), the guard's and firewall's drops, the
//! services' counts and the requests' (`sessions::RequestStats`).
//!
//! What a scrape shows is what `linnet ls` shows anyone allowed to list
//! (networks, interface ids, names, counters), to anyone who can reach the
//! address: the daemon binds loopback unless told another address.
//!
//! Anyone who can reach it can also open connections and say nothing, so
//! no connection waits on another's request: each is read on its own,
//! for REQUEST_TIMEOUT at most, and past READING_AT_ONCE connections still
//! to send their request the oldest is dropped; only taking the numbers
//! is done SCRAPES_AT_ONCE at a time, and the answer is written within
//! ANSWER_TIMEOUT.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinHandle};
use tracing::{debug, info, warn};

use super::drivers::TowardVm;
use super::sessions::Sessions;
use super::state::Daemon;
use crate::host::guard::RateDrops;
use crate::host::netlink::Link;
use crate::metrics::{Family, Kind, render};
use crate::services::ServiceCounters;

/// Scrapes whose numbers are taken at once; more wait for their turn.
const SCRAPES_AT_ONCE: usize = 4;
/// Connections still to send their request; a new one drops the oldest.
const READING_AT_ONCE: usize = 64;
/// How long a scraper may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a scraper may take to read its answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a request read: a GET line and headers.
const MAX_REQUEST: usize = 8192;

/// Binds `addr` now (so a port in use fails the start) and serves scrapes
/// until aborted.
pub(super) async fn spawn(addr: SocketAddr, sessions: Sessions) -> anyhow::Result<JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await.with_context(|| {
        format!("cannot serve metrics on {addr} (--metrics): is the port in use?")
    })?;
    if addr.ip().is_loopback() {
        info!(%addr, "serving metrics at http://{addr}/metrics");
    } else {
        warn!(%addr, "serving metrics at http://{addr}/metrics to anyone who can reach it: they show every network's interfaces, their ids and names");
    }
    let turns = Arc::new(Semaphore::new(SCRAPES_AT_ONCE));
    let reading = Arc::new(Mutex::new(Reading::default()));
    Ok(tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    debug!("metrics: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (sessions, turns, done) = (sessions.clone(), turns.clone(), reading.clone());
            // Held until the task is listed: it cannot be done before.
            let mut open = reading.lock().expect("metrics readers");
            let id = open.next_id();
            let read = move || done.lock().expect("metrics readers").done(id);
            let task = tokio::spawn(async move {
                if let Err(e) = answer(stream, &sessions, &turns, read).await {
                    debug!(%peer, "metrics: {e}");
                }
            });
            open.add(id, task.abort_handle());
            drop(open);
        }
    }))
}

/// The connections still to send their request, oldest first.
#[derive(Default)]
struct Reading {
    last_id: u64,
    open: VecDeque<(u64, AbortHandle)>,
}

impl Reading {
    fn next_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// One more; past READING_AT_ONCE, the oldest is dropped.
    fn add(&mut self, id: u64, task: AbortHandle) {
        if self.open.len() >= READING_AT_ONCE
            && let Some((_, oldest)) = self.open.pop_front()
        {
            oldest.abort();
        }
        self.open.push_back((id, task));
    }

    /// `id` sent its request (or is gone).
    fn done(&mut self, id: u64) {
        self.open.retain(|(open, _)| *open != id);
    }
}

/// Reads one request and answers it: the numbers taken in a turn, the
/// answer written after; `read` is called once the request is in.
async fn answer(
    mut stream: TcpStream,
    sessions: &Sessions,
    turns: &Semaphore,
    read: impl FnOnce(),
) -> std::io::Result<()> {
    let request = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await;
    read();
    let request = request.unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))?;
    let (status, body) = match route(&request) {
        Route::Metrics => {
            let _turn = turns.acquire().await.map_err(std::io::Error::other)?;
            ("200 OK", scrape(sessions).await)
        }
        Route::NotFound => ("404 Not Found", "linnet serves /metrics only\n".into()),
        Route::BadMethod => ("405 Method Not Allowed", "GET /metrics\n".into()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    tokio::time::timeout(ANSWER_TIMEOUT, write)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// The request's head: up to its empty line, or MAX_REQUEST bytes.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[derive(Debug, PartialEq)]
enum Route {
    Metrics,
    NotFound,
    BadMethod,
}

/// What a request's first line asks for.
fn route(request: &str) -> Route {
    let mut words = request.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next(), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        (Some("GET"), "/metrics") => Route::Metrics,
        (Some("GET"), _) => Route::NotFound,
        _ => Route::BadMethod,
    }
}

/// Every metric now, in the text format.
pub(super) async fn scrape(sessions: &Sessions) -> String {
    let links = sessions.daemon.lock().await.host.links.clone();
    let links: BTreeMap<u32, Link> = match links.links().await {
        Ok(links) => links.into_iter().map(|l| (l.index, l)).collect(),
        Err(e) => {
            warn!("metrics: cannot read the links' counters: {e}");
            BTreeMap::new()
        }
    };
    let mut daemon = sessions.daemon.lock().await;
    let counts = Counts {
        spoofed: daemon.guard_drops(),
        limited: daemon.rate_drops(),
        refused: daemon.policy_refusals().clone(),
        refused_queries: daemon.names.refused_queries(),
        gate: (daemon.gatekeeper.as_ref())
            .map(|g| g.counts())
            .unwrap_or_default(),
    };
    let mut families = daemon.metrics(&links, &counts);
    drop(daemon);
    families.extend(session_metrics(sessions));
    render(&families)
}

/// The guard's and firewall's counts, by TAP.
pub(super) struct Counts {
    pub spoofed: BTreeMap<String, u64>,
    pub limited: RateDrops,
    pub refused: BTreeMap<String, u64>,
    pub refused_queries: BTreeMap<String, u64>,
    /// The name check's connections, by interface.
    pub gate: BTreeMap<crate::types::InterfaceId, super::gatekeeper::Counts>,
}

/// The connections and what their requests came to.
fn session_metrics(sessions: &Sessions) -> Vec<Family> {
    let mut connections = Family::new(
        "linnet_connections",
        Kind::Gauge,
        "Client connections open to the daemon's API and network sockets.",
    );
    connections.add(&[], sessions.open() as f64);
    let stats = sessions.requests.lock().expect("request stats lock");
    let mut attach = Family::new(
        "linnet_attach_duration_seconds",
        Kind::Histogram,
        "How long attaches that succeeded took, from request to reply.",
    );
    attach.add_histogram(&[], &stats.attach_seconds);
    let mut errors = Family::new(
        "linnet_errors_total",
        Kind::Counter,
        "Requests the daemon refused or failed, by the API's error kind.",
    );
    for (kind, n) in &stats.errors {
        errors.add(&[("kind", kind)], *n as f64);
    }
    vec![connections, attach, errors]
}

impl Daemon {
    /// The networks' and interfaces' metrics, from the links' counters and
    /// `counts`.
    pub(super) fn metrics(&self, links: &BTreeMap<u32, Link>, counts: &Counts) -> Vec<Family> {
        let mut f = InterfaceFamilies::new();
        for (interface_id, i) in &self.interfaces {
            let id = interface_id.to_string();
            let labels = [
                ("network", i.network.as_str()),
                ("interface_id", id.as_str()),
                ("name", i.name.as_deref().unwrap_or("")),
            ];
            if let Some(link) = links.get(&i.tap_index) {
                let toward =
                    (self.networks.get(&i.network)).map_or(TowardVm::Sent, |n| n.toward_vm());
                let (received, sent) = toward.vm_ways((
                    (link.rx_bytes, link.rx_packets),
                    (link.tx_bytes, link.tx_packets),
                ));
                f.received_bytes.add(&labels, received.0 as f64);
                f.received_packets.add(&labels, received.1 as f64);
                f.sent_bytes.add(&labels, sent.0 as f64);
                f.sent_packets.add(&labels, sent.1 as f64);
            }
            let cfg = self.config.network(&i.network);
            if i.guarded && cfg.is_some_and(|c| c.anti_spoofing) {
                let n = counts.spoofed.get(&i.tap).copied().unwrap_or(0);
                f.spoofed.add(&labels, n as f64);
            }
            for (way, rate, drops) in [
                ("sent", i.policy.rate_limit.sent, &counts.limited.sent),
                (
                    "received",
                    i.policy.rate_limit.received,
                    &counts.limited.received,
                ),
            ] {
                if rate.is_some() {
                    let n = drops.get(&i.tap).copied().unwrap_or(0);
                    f.rate_limited.add(&with(&labels, ("way", way)), n as f64);
                }
            }
            if !i.policy.egress.is_empty() {
                let n = counts.refused.get(&i.tap).copied().unwrap_or(0);
                f.refused_connections.add(&labels, n as f64);
            }
            if i.policy.has_names() {
                let n = counts.refused_queries.get(&i.tap).copied().unwrap_or(0);
                f.refused_queries.add(&labels, n as f64);
            }
            if i.policy.name_reaches().iter().any(|r| r.checked()) {
                let gate = counts.gate.get(interface_id).copied().unwrap_or_default();
                for (verdict, n) in [("allowed", gate.allowed), ("refused", gate.refused)] {
                    f.checked
                        .add(&with(&labels, ("verdict", verdict)), n as f64);
                }
            }
            if let Some(relay) = &i.relay {
                for (way, flow) in [("to_vm", relay.to_vm), ("from_vm", relay.from_vm)] {
                    let labels = with(&labels, ("way", way));
                    f.relay_drops.add(&labels, flow.drops as f64);
                }
            }
        }
        let mut families = f.into_vec();
        families.extend(self.network_metrics());
        families
    }

    /// Per network: its interfaces, leases and DNS.
    fn network_metrics(&self) -> Vec<Family> {
        let mut interfaces = Family::new(
            "linnet_network_interfaces",
            Kind::Gauge,
            "Interfaces attached to the network.",
        );
        let mut leases = Family::new(
            "linnet_network_dhcp_leases",
            Kind::Gauge,
            "Addresses the network's DHCP holds for interfaces: attached, or gone within the lease time.",
        );
        let mut queries = Family::new(
            "linnet_network_dns_queries_total",
            Kind::Counter,
            "DNS queries the network's VMs sent its gateway, since the network came up.",
        );
        let mut refused = Family::new(
            "linnet_network_dns_refused_total",
            Kind::Counter,
            "DNS queries answered REFUSED: names a VM's policy does not allow.",
        );
        let mut dropped = Family::new(
            "linnet_network_dns_dropped_total",
            Kind::Counter,
            "DNS queries dropped unanswered: over a VM's or the network's budget of queries waiting upstream.",
        );
        let now = crate::services::unix_now();
        for (name, net) in &self.networks {
            let labels = [("network", name.as_str())];
            let attached = (self.interfaces.values())
                .filter(|i| &i.network == name)
                .count();
            interfaces.add(&labels, attached as f64);
            if let Some(table) = net.leases() {
                let live = table.lock().expect("lease table lock").live(now);
                leases.add(&labels, live as f64);
            }
            if let Some(c) = net.service_counters() {
                queries.add(&labels, ServiceCounters::read(&c.dns_queries) as f64);
                refused.add(&labels, ServiceCounters::read(&c.dns_refused) as f64);
                dropped.add(&labels, ServiceCounters::read(&c.dns_dropped) as f64);
            }
        }
        vec![interfaces, leases, queries, refused, dropped]
    }
}

/// `labels` and one more.
fn with<'a>(
    labels: &[(&'static str, &'a str)],
    extra: (&'static str, &'a str),
) -> Vec<(&'static str, &'a str)> {
    let mut out = labels.to_vec();
    out.push(extra);
    out
}

/// The families with a sample per interface.
struct InterfaceFamilies {
    received_bytes: Family,
    received_packets: Family,
    sent_bytes: Family,
    sent_packets: Family,
    spoofed: Family,
    rate_limited: Family,
    refused_connections: Family,
    refused_queries: Family,
    checked: Family,
    relay_drops: Family,
}

impl InterfaceFamilies {
    fn new() -> InterfaceFamilies {
        InterfaceFamilies {
            received_bytes: Family::new(
                "linnet_vm_received_bytes_total",
                Kind::Counter,
                "Bytes that reached the VM through its port (the kernel's count).",
            ),
            received_packets: Family::new(
                "linnet_vm_received_packets_total",
                Kind::Counter,
                "Frames that reached the VM through its port.",
            ),
            sent_bytes: Family::new(
                "linnet_vm_sent_bytes_total",
                Kind::Counter,
                "Bytes the VM sent into its port.",
            ),
            sent_packets: Family::new(
                "linnet_vm_sent_packets_total",
                Kind::Counter,
                "Frames the VM sent into its port.",
            ),
            spoofed: Family::new(
                "linnet_vm_spoofed_drops_total",
                Kind::Counter,
                "Frames from the VM that anti-spoofing dropped (another MAC or address, a DHCP server, a router advertisement).",
            ),
            rate_limited: Family::new(
                "linnet_vm_rate_limited_drops_total",
                Kind::Counter,
                "Frames past the VM's rate limit dropped, by way (sent by it, or on their way to it).",
            ),
            refused_connections: Family::new(
                "linnet_vm_policy_refused_total",
                Kind::Counter,
                "Connection attempts (packets) the VM's egress policy refused.",
            ),
            refused_queries: Family::new(
                "linnet_vm_dns_refused_total",
                Kind::Counter,
                "DNS queries of the VM for names its policy does not allow.",
            ),
            checked: Family::new(
                "linnet_vm_gate_connections_total",
                Kind::Counter,
                "The VM's connections held for the name they show, by verdict (allowed: an allowed name at an address the VM learned for it).",
            ),
            relay_drops: Family::new(
                "linnet_vm_relay_drops_total",
                Kind::Counter,
                "Frames a socket datapath's relay dropped, by way, as it last reported.",
            ),
        }
    }

    fn into_vec(self) -> Vec<Family> {
        vec![
            self.received_bytes,
            self.received_packets,
            self.sent_bytes,
            self.sent_packets,
            self.spoofed,
            self.rate_limited,
            self.refused_connections,
            self.refused_queries,
            self.checked,
            self.relay_drops,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn past_its_cap_the_oldest_connection_still_to_send_is_dropped() {
        let mut reading = Reading::default();
        let mut tasks: Vec<_> = (0..=READING_AT_ONCE)
            .map(|_| tokio::spawn(std::future::pending::<()>()))
            .collect();
        let ids: Vec<u64> = tasks
            .iter()
            .map(|task| {
                let id = reading.next_id();
                reading.add(id, task.abort_handle());
                id
            })
            .collect();
        assert!(tasks.remove(0).await.unwrap_err().is_cancelled());
        assert!(tasks.iter().all(|t| !t.is_finished()), "only the oldest");
        assert_eq!(reading.open.len(), READING_AT_ONCE);
        // One that sent its request leaves the count: the next new one
        // drops nobody.
        reading.done(ids[1]);
        let id = reading.next_id();
        let extra = tokio::spawn(std::future::pending::<()>());
        reading.add(id, extra.abort_handle());
        tokio::task::yield_now().await;
        assert!(tasks.iter().all(|t| !t.is_finished()));
        assert_eq!(reading.open.len(), READING_AT_ONCE);
    }

    #[test]
    fn only_get_of_metrics_is_served() {
        assert_eq!(
            route("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics
        );
        assert_eq!(route("GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(route("GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route("POST /metrics HTTP/1.1\r\n\r\n"), Route::BadMethod);
        assert_eq!(route(""), Route::BadMethod);
        assert_eq!(route("\u{0}\u{1}garbage"), Route::BadMethod);
    }
}
