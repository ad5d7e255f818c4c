//! The daemon's event loop: the API socket, one task per client connection,
//! signals, and exit when idle. A client's interfaces live exactly as long as
//! its connection: when it closes (the client exited or was killed), they go.
//! Across a daemon restart they live on until their client re-claims them on
//! a new connection, or exits (`adoption`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr, sockopt};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Mutex;
use tracing::{debug, error, info, warn};

use super::host_ports::HostPorts;
use super::rootless::HostSide;
use super::state::{Client, Daemon, DaemonError};
use crate::api::{self, MAX_MESSAGE, Request, Response, SOCKET_NAME};
use crate::budget::{Budget, Permit};
use crate::config::Config;
use crate::host::netlink::{LinkSettings, Netlink};
use crate::host::process::Process;
use crate::host::seam::Host;
use crate::host::{egress, systemd};
use crate::services;
use crate::types::InterfaceId;

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
    /// Where the daemon runs.
    pub placement: Placement,
    /// The API socket, listening, when the service manager passed it
    /// (socket activation: linnet.socket); else the daemon binds its own.
    pub passed_socket: Option<OwnedFd>,
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

/// Large replies (over one packet) one uid other than root may have
/// waiting to be read, across its connections.
const LARGE_REPLIES_PER_UID: usize = 4;

type LargeReplies = Budget<u32>;

/// How long accepting pauses when the daemon is out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

pub fn run(opts: Options) -> anyhow::Result<()> {
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(opts))
}

async fn serve(opts: Options) -> anyhow::Result<()> {
    for dir in [&opts.run_dir, &opts.state_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let _lock = lock_run_dir(&opts.run_dir)?;
    let socket_path = opts.run_dir.join(SOCKET_NAME);
    let rootless = matches!(opts.placement, Placement::Rootless(_));
    // A socket the service manager passed is its own: it made the file,
    // keeps listening while the daemon is away, and removes it.
    let activated = opts.passed_socket.is_some();
    let listener = match opts.passed_socket {
        Some(fd) => register(fd)?,
        None => listen(&socket_path, rootless)?,
    };
    let remove_socket = || {
        if !activated {
            let _ = std::fs::remove_file(&socket_path);
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
    let mut daemon = Daemon::new(
        opts.config,
        opts.state_dir.clone(),
        opts.run_dir.clone(),
        Host::kernel(netlink),
        Arc::new(services::OnHost),
    );
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

    let sessions = Sessions {
        daemon: daemon.clone(),
        connections: Arc::new(AtomicUsize::new(0)),
        per_uid: Arc::new(Budget::new(opts.max_connections_per_uid, usize::MAX)),
        large: Arc::new(LargeReplies::new(LARGE_REPLIES_PER_UID, usize::MAX)),
        next_client: Arc::new(AtomicU64::new(1)),
        rootless,
    };
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
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
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
        .any(|n| n.lan.is_some());
    let learning = super::learning::spawn(daemon.clone(), any_lan);
    let tap_addresses = daemon.lock().await.tap_addresses.clone();
    let tap_watch = super::tap_watch::spawn(daemon.clone(), tap_addresses);
    let mut idle_since = tokio::time::Instant::now();

    loop {
        tokio::select! {
            conn = accept_next(&listener, "the API socket", &mut out_of_fds) => {
                let client = match identify(&conn, sessions.next_id()) {
                    Ok(client) => client,
                    Err(e) => {
                        warn!("cannot identify a client: {e}");
                        continue;
                    }
                };
                let permit = match sessions.admit(&client) {
                    Ok(permit) => permit,
                    Err(refusal) => {
                        refuse(&conn, refusal);
                        continue;
                    }
                };
                let sessions = sessions.clone();
                tokio::spawn(async move { sessions.serve(conn, client, permit).await });
            }
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break; }
            _ = sigint.recv() => { info!("SIGINT: stopping"); break; }
            _ = idle_ticks.tick() => {
                daemon.lock().await.reap_orphans().await;
                let Some(limit) = opts.idle_exit else { continue };
                let idle = sessions.connections.load(Ordering::SeqCst) == 0 && daemon.lock().await.is_idle();
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
    if let Some(learning) = learning {
        learning.abort();
    }
    tap_watch.abort();
    network_sockets.close();
    daemon.lock().await.stop().await;
    remove_socket();
    // Still held: a daemon starting meanwhile finds it locked, or a new one.
    let _ = std::fs::remove_file(opts.run_dir.join(LOCK_FILE));
    info!("stopped");
    Ok(())
}

/// What every client connection shares: the daemon, the count of open
/// connections (for the idle exit), and the budgets per uid.
#[derive(Clone)]
pub(super) struct Sessions {
    pub(super) daemon: Arc<Mutex<Daemon>>,
    connections: Arc<AtomicUsize>,
    per_uid: Arc<Budget<u32>>,
    large: Arc<LargeReplies>,
    next_client: Arc<AtomicU64>,
    /// A user's own daemon serves that user alone (root inside).
    rootless: bool,
}

impl Sessions {
    /// A new client's id, unique for the daemon's lifetime.
    pub(super) fn next_id(&self) -> u64 {
        self.next_client.fetch_add(1, Ordering::Relaxed)
    }

    /// A connection slot for `client`, or why it gets none: one uid other
    /// than root may hold only so many connections, whichever socket they
    /// came in on.
    pub(super) fn admit(&self, client: &Client) -> Result<Option<Permit<u32>>, String> {
        if self.rootless && client.uid != 0 {
            // Anyone unmapped shows as the overflow uid here; the socket's
            // directory is the user's alone anyway.
            return Err(
                "this is another user's rootless linnet daemon, which serves its user alone; use your own (`linnet run` starts it) or the system's".into(),
            );
        }
        if client.uid == 0 {
            return Ok(None);
        }
        let uid = client.uid;
        self.per_uid.try_take(uid).map(Some).map_err(|refused| {
            let limit = self.per_uid.per_key();
            if let Some(count) = refused.report {
                warn!(uid, pid = ?client.pid, refused = count, "uid {uid} holds {limit} connections to the daemon, its limit (linnet daemon --max-connections-per-uid): refusing more");
            }
            format!("uid {uid} holds {limit} connections to the linnet daemon, its limit; close some (each `linnet run`, `helper` and VM on a network's socket holds one) or ask the administrator to raise --max-connections-per-uid")
        })
    }

    /// Serves `conn` as `client`'s until it closes; then what the client
    /// attached goes.
    pub(super) async fn serve(
        &self,
        conn: AsyncFd<OwnedFd>,
        client: Client,
        permit: Option<Permit<u32>>,
    ) {
        self.connections.fetch_add(1, Ordering::SeqCst);
        serve_client(&self.daemon, conn, &client, &self.large).await;
        self.daemon.lock().await.client_gone(client.id).await;
        drop(permit);
        self.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers a connection the daemon will not serve, and closes it: the
/// client reads the reason as the reply to its first request.
fn refuse(conn: &AsyncFd<OwnedFd>, message: String) {
    let response = Response::Error {
        kind: api::ErrorKind::Busy,
        message,
    };
    let _ = api::send_message(conn.get_ref().as_fd(), &response, &[]);
    // A request already sent is read (and dropped): closing on unread data
    // would make the client's kernel report a reset before the reason.
    let mut scratch = [0u8; 512];
    let _ = socket::recv(
        conn.get_ref().as_raw_fd(),
        &mut scratch,
        socket::MsgFlags::MSG_DONTWAIT | socket::MsgFlags::MSG_TRUNC,
    );
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

/// The next connection on `listener` (`socket` names it in logs). Out of
/// file descriptors, or on any other failure, it waits a moment and tries
/// again: the connection waits in the backlog, and spinning on it would
/// only burn the CPU the others need. `waited` counts those waits across
/// calls, for one line when they start and one when they end.
pub(super) async fn accept_next(
    listener: &AsyncFd<OwnedFd>,
    socket: &str,
    waited: &mut u64,
) -> AsyncFd<OwnedFd> {
    loop {
        match accept(listener).await {
            Ok(conn) => {
                if *waited > 0 {
                    info!(
                        waited = *waited,
                        "file descriptors free again: accepting on {socket}"
                    );
                    *waited = 0;
                }
                return conn;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                if *waited == 0 {
                    warn!(
                        "out of file descriptors ({e}): new connections to {socket} wait until some close"
                    );
                }
                *waited += 1;
            }
            Err(e) => warn!("accept on {socket} failed: {e}"),
        }
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    }
}

/// A unix socket of `kind` bound at `path`, close-on-exec and
/// non-blocking; nobody can connect before the caller listens.
pub(super) fn bind_unix(path: &Path, kind: SockType) -> anyhow::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Unix,
        kind,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    let addr = UnixAddr::new(path)?;
    socket::bind(fd.as_raw_fd(), &addr)
        .with_context(|| format!("cannot bind {}", path.display()))?;
    Ok(fd)
}

async fn accept(listener: &AsyncFd<OwnedFd>) -> io::Result<AsyncFd<OwnedFd>> {
    loop {
        let mut ready = listener.readable().await?;
        match ready.try_io(|fd| {
            socket::accept4(
                fd.as_raw_fd(),
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            )
            .map_err(io::Error::from)
        }) {
            Ok(Ok(raw)) => {
                // SAFETY: accept4 returned a new descriptor that we now own.
                let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
                return register(fd);
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// Watches an fd we own exclusively (OwnedFd): nothing else can close it
/// behind tokio's back, which is the safety condition of `register`.
pub(super) fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the OwnedFd moves into the AsyncFd and is closed only by it.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// Who is at the other end of `conn`, in the kernel's word (SO_PEERCRED,
/// SO_PEERGROUPS): what they connected as, whatever they do since.
pub(super) fn identify(conn: &AsyncFd<OwnedFd>, id: u64) -> io::Result<Client> {
    let cred = socket::getsockopt(conn.get_ref(), sockopt::PeerCredentials)?;
    Ok(Client {
        id,
        pid: (cred.pid() > 0).then_some(cred.pid()),
        uid: cred.uid(),
        gid: cred.gid(),
        groups: peer_groups(conn.get_ref()).unwrap_or_else(|_| vec![cred.gid()]),
        process: (cred.pid() > 0).then(|| Process::of(cred.pid())).flatten(),
        network_socket: None,
    })
}

/// The peer's supplementary groups (SO_PEERGROUPS, Linux 4.13+).
fn peer_groups(fd: &OwnedFd) -> io::Result<Vec<u32>> {
    let mut groups = vec![0u32; 256];
    let mut len = (groups.len() * 4) as libc::socklen_t;
    // SAFETY: the buffer is `len` bytes long and outlives the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(len as usize / 4);
    Ok(groups)
}

async fn serve_client(
    daemon: &Mutex<Daemon>,
    conn: AsyncFd<OwnedFd>,
    client: &Client,
    large: &LargeReplies,
) {
    debug!(client = client.id, pid = ?client.pid, uid = client.uid, "connected");
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let received = conn
            .async_io(Interest::READABLE, |fd| {
                api::recv_request(fd.as_fd(), &mut buf)
            })
            .await;
        // Whatever a client sends, it gets an answer and the daemon carries
        // on: an oversized packet (its rest already discarded by the
        // kernel) or one that is not a request is refused, not fatal.
        let (response, fd) = match received {
            Ok(Some(len)) => match serde_json::from_slice::<Request>(&buf[..len]) {
                Err(e) => (bad_request(format!("cannot parse request: {e}")), None),
                Ok(request) => handle(daemon, client, request).await,
            },
            Ok(None) => break,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                debug!(client = client.id, "refused: {e}");
                (bad_request(format!("request refused: {e}")), None)
            }
            Err(e) => {
                debug!(client = client.id, "connection error: {e}");
                break;
            }
        };
        let fds: Vec<i32> = fd.iter().map(|f| f.as_raw_fd()).collect();
        let attached = match &response {
            Response::Attached { interface, .. } => Some(interface.interface_id),
            _ => None,
        };
        let mut sent = send_reply(&conn, &response, &fds, large, client.uid).await;
        // Our copy of the TAP fd closes here; the client holds its own.
        drop(fd);
        // A reply that could not be sent is an error for this request, not
        // the end of the connection: the client's interfaces live as long
        // as it does. (An attach whose reply did not go out is undone: no
        // one holds its TAP.)
        if let Err(Unsent::Before(e)) = &sent
            && !connection_gone(e)
        {
            warn!(
                client = client.id,
                uid = client.uid,
                "cannot send a reply: {e}"
            );
            if let Some(id) = attached {
                let _ = daemon.lock().await.handle_detach(client, id).await;
            }
            let error = Response::Error {
                kind: api::ErrorKind::Internal,
                message: format!("the daemon could not send its reply: {e}"),
            };
            sent = send_reply(&conn, &error, &[], large, client.uid).await;
        }
        match sent {
            Ok(()) => {}
            Err(Unsent::Before(e)) => {
                debug!(client = client.id, "cannot reply: {e}");
                break;
            }
            Err(Unsent::Midway(e)) => {
                // The client has part of a reply and cannot tell the rest.
                if connection_gone(&e) {
                    debug!(client = client.id, "gone in the middle of a reply: {e}");
                } else {
                    warn!(
                        client = client.id,
                        "a reply broke off midway, closing the connection: {e}"
                    );
                }
                break;
            }
        }
    }
    debug!(client = client.id, "disconnected");
}

async fn handle(
    lock: &Mutex<Daemon>,
    client: &Client,
    request: Request,
) -> (Response, Option<OwnedFd>) {
    if let Some(network) = &client.network_socket
        && !super::network_sockets::relay_may(&request)
    {
        // Its relay runs as the VM's user (or a uid of its own for root's):
        // whoever can take it over must not get more than that VM's port.
        let message = format!(
            "the relay of a connection to network \"{network}\"'s socket may attach its interface, report its counters and list; nothing else"
        );
        // The relay asking is told; a log line per refusal would let it
        // fill the log.
        debug!(uid = client.uid, pid = ?client.pid, "{message}");
        return (
            Response::Error {
                kind: api::ErrorKind::NotAllowed,
                message,
            },
            None,
        );
    }
    if let Request::WaitAddress {
        network,
        interface_id,
        timeout_ms,
    } = request
    {
        return (
            wait_address(lock, client, &network, interface_id, timeout_ms).await,
            None,
        );
    }
    let mut daemon = lock.lock().await;
    match request {
        Request::WaitAddress { .. } => unreachable!("answered above"),
        Request::Attach(req) => match daemon.handle_attach(client, req).await {
            Ok((interface, fd, reclaim_token)) => (
                Response::Attached {
                    interface: Box::new(interface),
                    reclaim_token,
                },
                Some(fd),
            ),
            Err(e) => {
                error!(uid = client.uid, pid = ?client.pid, "attach refused: {e}");
                (e.into_response(), None)
            }
        },
        Request::Detach { interface_id } => {
            match daemon.handle_detach(client, interface_id).await {
                Ok(()) => (Response::Detached { interface_id }, None),
                Err(e) => (e.into_response(), None),
            }
        }
        Request::Reclaim {
            interface_id,
            token,
        } => match daemon.handle_reclaim(client, interface_id, &token) {
            Ok(()) => (Response::Reclaimed { interface_id }, None),
            Err(e) => {
                // The client says why; a line each would let it fill the log.
                debug!(uid = client.uid, pid = ?client.pid, "re-claim refused: {e}");
                (e.into_response(), None)
            }
        },
        Request::Counters {
            interface_id,
            counters,
        } => match daemon.handle_counters(client, interface_id, counters) {
            Ok(()) => (Response::Ok, None),
            Err(e) => (e.into_response(), None),
        },
        Request::List => {
            // The link dump (all TAPs' counters) runs without the lock, so
            // a listing never holds up an attach.
            let links = daemon.host.links.clone();
            drop(daemon);
            let stats = super::state::link_stats(&*links).await;
            let mut daemon = lock.lock().await;
            let drops = daemon.guard_drops();
            (daemon.list(&stats, &drops), None)
        }
        Request::ForwardAdd(req) => reply(daemon.handle_forward_add(client, req)),
        Request::ForwardRemove(req) => reply(daemon.handle_forward_remove(client, req)),
        Request::ForwardList => (daemon.forward_list(), None),
        Request::PolicyShow(which) => match daemon.policy_show(client, &which) {
            Ok(r) => (r, None),
            Err(e) => (e.into_response(), None),
        },
        Request::PolicySet(req) => match daemon.policy_set(client, req) {
            Ok(r) => (r, None),
            Err(e) => (e.into_response(), None),
        },
        Request::Doctor { network } => (daemon.doctor(network.as_deref()), None),
    }
}

/// Answers once the interface has an address, or when the time is up;
/// the daemon's lock is held only to look.
async fn wait_address(
    lock: &Mutex<Daemon>,
    client: &Client,
    network: &str,
    id: InterfaceId,
    timeout_ms: u64,
) -> Response {
    let timeout = Duration::from_millis(timeout_ms).min(super::learning::MAX_WAIT);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut news = match lock.lock().await.address_of(client, network, id) {
            Ok(Ok(ip_address)) => {
                return Response::Address {
                    interface_id: id,
                    ip_address,
                };
            }
            Ok(Err(news)) => news,
            Err(e) => return e.into_response(),
        };
        match tokio::time::timeout_at(deadline, news.changed()).await {
            Ok(Ok(())) => continue,
            _ => {
                return DaemonError::Busy(format!(
                    "interface {id} has no IPv4 address linnet knows after {} s: on a LAN, is the VM's DHCP client running, and does the LAN's DHCP server answer it? (on a network with dhcp: false, linnet knows only static leases)",
                    timeout.as_secs()
                ))
                .into_response();
            }
        }
    }
}

/// Why a reply did not (wholly) go out.
enum Unsent {
    /// Nothing of it was sent.
    Before(io::Error),
    /// Some of its packets were.
    Midway(io::Error),
}

/// Sends a reply's packets (fds with the first), waiting for room between
/// them.
async fn send_reply(
    conn: &AsyncFd<OwnedFd>,
    response: &Response,
    fds: &[i32],
    large: &LargeReplies,
    uid: u32,
) -> Result<(), Unsent> {
    let reply = api::ReplyBytes::new(response).map_err(Unsent::Before)?;
    // A large reply waits in the daemon's memory until the client has read
    // it: a user other than root may have only so many waiting at once.
    let _permit = match (reply.is_large(), uid) {
        (false, _) | (true, 0) => None,
        (true, uid) => Some(large.try_take(uid).map_err(|_| {
            Unsent::Before(io::Error::other(format!(
                "uid {uid} has {LARGE_REPLIES_PER_UID} large replies unread; read them first"
            )))
        })?),
    };
    let piece = api::piece_size(conn.get_ref().as_fd());
    for (n, packet) in reply.packets(piece).enumerate() {
        let with = if n == 0 { fds } else { &[] };
        conn.async_io(Interest::WRITABLE, |c| {
            api::send_packet(c.as_fd(), packet, with)
        })
        .await
        .map_err(|e| {
            if n == 0 {
                Unsent::Before(e)
            } else {
                Unsent::Midway(e)
            }
        })?;
    }
    Ok(())
}

/// Whether a send failed because the client is no longer there.
fn connection_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN)
    )
}

fn reply(result: Result<(), DaemonError>) -> (Response, Option<OwnedFd>) {
    match result {
        Ok(()) => (Response::Ok, None),
        Err(e) => (e.into_response(), None),
    }
}

fn bad_request(message: String) -> Response {
    Response::Error {
        kind: api::ErrorKind::BadRequest,
        message,
    }
}

fn raise_fd_limit() {
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
}
