//! The daemon's event loop: the API socket, one task per client connection,
//! signals, and exit when idle. A client's interfaces live exactly as long as
//! its connection: when it closes (the client exited or was killed), they go.
//! Across a daemon restart they live on until their client re-claims them on
//! a new connection, or exits (`adoption`).

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::socket::{self, SockType};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Mutex;
use tracing::{error, info, warn};

use super::host_ports::{HostPorts, HostSide};
use super::requests::lock_when_detached;
use super::sessions::{Sessions, refuse};
use super::sockets::{Unidentified, accept_next, bind_unix, identify, register};
use super::state::Daemon;
use crate::api::{ErrorKind, SOCKET_NAME};
use crate::budget::RateLimit;
use crate::config::Config;
use crate::events::Bus;
use crate::host::netlink::{LinkSettings, Links, Netlink};
use crate::host::seam::Host;
use crate::host::{egress, memory, systemd};
use crate::services;
use crate::services::name_gate::NameGate;

/// A network namespace's loopback is always its first link.
const LOOPBACK_INDEX: u32 = 1;

/// How often spoofed-frame drops are looked at and logged (one line per
/// interface and period at most).
const DROP_REPORT_PERIOD: Duration = Duration::from_secs(5);

pub struct Options {
    pub run_dir: PathBuf,
    pub state_dir: PathBuf,
    pub config: Config,
    /// Exit after this long with no interfaces and no connections.
    pub idle_exit: Option<Duration>,
    /// Connections one uid other than root may hold open at once.
    pub max_connections_per_uid: usize,
    /// ...and all of them together (root's always served).
    pub max_connections: usize,
    /// Where the daemon runs.
    pub placement: Placement,
    /// The API socket, listening, when the service manager passed it
    /// (socket activation: linnet.socket); else the daemon binds its own.
    pub passed_socket: Option<OwnedFd>,
    /// Where to serve Prometheus' scrapes (`--metrics`).
    pub metrics: Option<std::net::SocketAddr>,
}

/// The system's daemon, or a user's own in its namespaces (`rootless`).
#[derive(Default)]
pub enum Placement {
    #[default]
    System,
    /// In a user and network namespace of the user's: the user is root
    /// there, and nobody else may connect. The host's ports come through
    /// the supervisor.
    Rootless(HostSide),
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(opts))
}

async fn serve(opts: Options) -> anyhow::Result<()> {
    // Before anything else, and so long before READY=1: a SIGTERM or
    // SIGINT from here on stops the daemon cleanly (STOPPING=1, its socket
    // removed, its VMs kept). With the default action in place, one that
    // came before the handlers ended it on the spot.
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    for dir in [&opts.run_dir, &opts.state_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let _lock = lock_run_dir(&opts.run_dir)?;
    let socket_path = opts.run_dir.join(SOCKET_NAME);
    let rootless = matches!(opts.placement, Placement::Rootless(_));
    if !rootless {
        // It holds the secrets (`secrets`): no core dump of it. (A user's
        // rootless daemon holds only that user's.)
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    }
    // A socket the service manager passed is its own: it made the file,
    // keeps listening while the daemon is away, and removes it.
    let activated = opts.passed_socket.is_some();
    let listener = match opts.passed_socket {
        Some(fd) => register(fd)?,
        None => listen(&socket_path, rootless)?,
    };
    let remove_socket = || {
        if !activated {
            crate::files::remove_left(&socket_path);
        }
    };

    let netlink = Netlink::connect().context("cannot open rtnetlink")?;
    if rootless {
        // A new network namespace's loopback starts down.
        netlink
            .configure(
                LOOPBACK_INDEX,
                LinkSettings {
                    up: true,
                    ..Default::default()
                },
            )
            .await
            .context("cannot bring up the namespace's loopback")?;
    }
    let host = Host::kernel(netlink);
    let events = Bus::default();
    for (name, cfg) in &opts.config.networks {
        if let Some(path) = &cfg.audit_log {
            super::audit::follow(name.clone(), path.clone(), &events);
        }
    }
    let names = Arc::new(NameGate::new(host.tables.learned_sets(), events.clone()));
    let mut daemon = Daemon::new(
        opts.config,
        opts.state_dir.clone(),
        opts.run_dir.clone(),
        host,
        Arc::new(services::OnHost {
            names: names.clone(),
            events: events.clone(),
        }),
        names,
        events,
    );
    match super::gatekeeper::Gatekeeper::start(
        daemon.events.clone(),
        super::gatekeeper::run_as(rootless),
    ) {
        Ok(gatekeeper) => {
            daemon.names.tell(gatekeeper.clone());
            daemon.gatekeeper = Some(gatekeeper);
        }
        Err(e) => error!(
            "the name check cannot run: {e:#}; connections of VMs whose policy names DNS names go nowhere (only rules with /tcp/any or /udp reach their names)"
        ),
    }
    let secrets_run_as = (!rootless).then_some((
        super::secret_proxies::SECRETS_UID,
        super::secret_proxies::SECRETS_UID,
    ));
    match super::secret_proxies::SecretProxies::new(
        daemon.events.clone(),
        secrets_run_as,
        &opts.state_dir,
    ) {
        Ok(proxies) => {
            daemon.names.tell(proxies.clone());
            daemon.secret_proxies = Some(proxies);
        }
        Err(e) => error!(
            "the secrets proxies cannot run: {e:#}; VMs' placeholders for secrets go out as they wrote them"
        ),
    }
    if let Placement::Rootless(side) = opts.placement {
        daemon.host_ports = Some(HostPorts::new(side));
        daemon.host_loopback = Some(egress::HOST_LOOPBACK);
    }
    if let Err(e) = daemon.reconcile().await {
        remove_socket();
        bail!("start-up failed: {e}");
    }
    let daemon = Arc::new(Mutex::new(daemon));
    info!(socket = %socket_path.display(), state = %opts.state_dir.display(), activated, "linnet daemon ready");
    if let Err(e) = systemd::notify("READY=1") {
        warn!("cannot tell the service manager the daemon is ready: {e}");
    }

    let sessions = Sessions::new(
        daemon.clone(),
        (opts.max_connections_per_uid, opts.max_connections),
        rootless,
    );
    let mut out_of_fds = 0u64;
    let network_sockets = match super::network_sockets::open(&sessions, &opts.run_dir).await {
        Ok(sockets) => sockets,
        Err(e) => {
            // What it adopted stays for the next daemon.
            daemon.lock().await.stop().await;
            remove_socket();
            return Err(e);
        }
    };
    let metrics = match opts.metrics {
        Some(addr) => match super::metrics::spawn(addr, sessions.clone()).await {
            Ok(task) => Some(task),
            Err(e) => {
                network_sockets.close();
                daemon.lock().await.stop().await;
                remove_socket();
                return Err(e);
            }
        },
        None => None,
    };
    let mut idle_ticks = tokio::time::interval(Duration::from_millis(500));
    // Drop reports and the look for shadowed forwards run on their own,
    // so a long request never delays accepting clients or signals here.
    let reporter = daemon.clone();
    let drop_reports = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(DROP_REPORT_PERIOD);
        loop {
            ticks.tick().await;
            // Every link's counters, only while some interface is kept.
            let links = {
                let daemon = reporter.lock().await;
                daemon.any_kept().then(|| daemon.host.links.clone())
            };
            let stats = match links {
                Some(links) => Some(super::state::link_stats(&*links).await),
                None => None,
            };
            let mut daemon = reporter.lock().await;
            daemon.report_drops();
            daemon.check_shadowed_forwards();
            if let Some(stats) = stats {
                daemon.expire_kept(&stats).await;
            }
        }
    });
    let watch = super::watch::spawn(daemon.clone());
    let any_lan = daemon
        .lock()
        .await
        .config
        .networks
        .values()
        .any(|n| n.own().is_none());
    let learning = super::learning::spawn(daemon.clone(), any_lan);
    let any_guarded_ipv6 = daemon
        .lock()
        .await
        .config
        .networks
        .values()
        .any(|n| n.anti_spoofing && n.ipv6().is_some());
    let formed6 = super::formed6::spawn(daemon.clone(), any_guarded_ipv6);
    let tap_addresses = daemon.lock().await.tap_addresses.clone();
    let tap_watch = super::tap_watch::spawn(daemon.clone(), tap_addresses);
    let wanted = daemon.lock().await.spares_wanted.clone();
    let spares = super::spares::spawn(daemon.clone(), wanted);
    let mut idle_since = tokio::time::Instant::now();
    // Memory a mass detach freed goes back to the system.
    let mut trim = memory::Trim::default();
    // A refusal of a peer gone before it was read, logged once a minute
    // per uid however often it comes.
    let mut gone_logged: RateLimit<u32> = RateLimit::new(1, Duration::from_secs(60));

    loop {
        tokio::select! {
            conn = accept_next(&listener, "the API socket", &mut out_of_fds) => {
                let client = match identify(&conn, sessions.next_id()) {
                    Ok(client) => client,
                    Err(Unidentified::Gone(gone)) => {
                        if gone_logged.allow(&gone.uid, std::time::Instant::now()).is_ok() {
                            warn!(uid = gone.uid, "refused a connection: {gone} (more from uid {} in the next minute are not logged)", gone.uid);
                        }
                        refuse(&conn, ErrorKind::NotAllowed, gone.to_string());
                        continue;
                    }
                    Err(e) => {
                        warn!("cannot identify a client: {e}");
                        continue;
                    }
                };
                let permit = match sessions.admit(&client) {
                    Ok(permit) => permit,
                    Err(refusal) => {
                        refuse(&conn, ErrorKind::Busy, refusal);
                        continue;
                    }
                };
                let sessions = sessions.clone();
                tokio::spawn(async move { sessions.serve(conn, client, permit).await });
            }
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break; }
            _ = sigint.recv() => { info!("SIGINT: stopping"); break; }
            _ = idle_ticks.tick() => {
                {
                    let mut daemon = daemon.lock().await;
                    daemon.reap_orphans().await;
                    daemon.tidy().await;
                }
                if trim.due(daemon.lock().await.interfaces.len()) {
                    memory::give_back();
                }
                let Some(limit) = opts.idle_exit else { continue };
                let idle = sessions.open() == 0 && daemon.lock().await.is_idle();
                if !idle {
                    idle_since = tokio::time::Instant::now();
                } else if idle_since.elapsed() >= limit {
                    info!("idle for {}s: exiting", limit.as_secs());
                    break;
                }
            }
        }
    }
    let _ = systemd::notify("STOPPING=1");
    drop_reports.abort();
    watch.abort();
    if let Some(formed6) = formed6 {
        formed6.abort();
    }
    if let Some(learning) = learning {
        learning.abort();
    }
    tap_watch.abort();
    spares.abort();
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    network_sockets.close();
    let mut stopped = lock_when_detached(&daemon, Duration::from_secs(5)).await;
    stopped.stop().await;
    if let Some(gatekeeper) = stopped.gatekeeper.take() {
        gatekeeper.stop();
    }
    if let Some(proxies) = stopped.secret_proxies.take() {
        proxies.stop();
    }
    drop(stopped);
    remove_socket();
    // Still held: a daemon starting meanwhile finds it locked, or a new one.
    crate::files::remove_left(&opts.run_dir.join(LOCK_FILE));
    info!("stopped");
    Ok(())
}

/// One daemon per run directory, which holds a lock on this file.
pub(super) const LOCK_FILE: &str = "daemon.lock";

/// One daemon per run directory.
fn lock_run_dir(run_dir: &Path) -> anyhow::Result<Flock<std::fs::File>> {
    let path = run_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|_| {
        anyhow::anyhow!(
            "another linnet daemon is running with run directory {} (stop it, or use --run-dir)",
            run_dir.display()
        )
    })
}

fn listen(path: &Path, rootless: bool) -> anyhow::Result<AsyncFd<OwnedFd>> {
    // We hold the lock, so a socket file left here is from a dead daemon.
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(e)
                .with_context(|| format!("cannot remove stale socket {}", path.display()));
        }
        _ => {}
    }
    let fd = bind_unix(path, SockType::SeqPacket)?;
    // Anyone may connect to the system's daemon; every request is checked
    // against the network's `allow` list with the kernel's word on who is
    // asking (SO_PEERCRED). A user's own daemon is that user's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = if rootless { 0o600 } else { 0o666 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    socket::listen(&fd, socket::Backlog::new(128)?)?;
    Ok(register(fd)?)
}

fn raise_fd_limit() {
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
}
