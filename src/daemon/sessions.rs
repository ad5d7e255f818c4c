//! One task per client connection: the API's requests read, answered by
//! the daemon, and the replies sent (large ones within a budget per uid);
//! when the connection closes, what the client attached goes.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::socket;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::Mutex;
use tracing::{debug, error, warn};

use super::client::Client;
use super::errors::DaemonError;
use super::requests::{finish_unlocked, lock_for_attach};
use super::secrets::SecretRequest;
use super::state::Daemon;
use crate::api::{self, MAX_MESSAGE, Request, Response};
use crate::budget::{Budget, LogBudget, LogTurn, Permit, RateLimit};
use crate::datapath::Datapath;
use crate::events::{Event, What, wanted};
use crate::metrics::Histogram;
use crate::types::InterfaceId;
use tokio::sync::broadcast::error::RecvError;

/// Large replies (over one packet) one uid other than root may have
/// waiting to be read, across its connections.
const LARGE_REPLIES_PER_UID: usize = 4;
/// Lines logged about what one account's clients cause (refused attaches,
/// what its relays say), and all accounts', in each LOG_WINDOW.
const LOG_LINES_PER_ACCOUNT: u32 = 20;
const LOG_LINES_IN_ALL: u32 = 200;
const LOG_WINDOW: Duration = Duration::from_secs(10);
/// Relays started a second for users other than root on all network
/// sockets together (each user has its own ten a second on each).
const RELAYS_PER_SECOND_IN_ALL: u32 = 50;

type LargeReplies = Budget<u32>;

/// Upper bounds of the attach latency histogram's buckets, in seconds.
const ATTACH_SECONDS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// What the daemon's requests came to, for its metrics: how long attaches
/// that succeeded took, and the errors it answered, by kind.
#[derive(Debug)]
pub(super) struct RequestStats {
    pub attach_seconds: Histogram,
    pub errors: std::collections::BTreeMap<&'static str, u64>,
}

impl RequestStats {
    fn new() -> RequestStats {
        RequestStats {
            attach_seconds: Histogram::new(&ATTACH_SECONDS),
            errors: Default::default(),
        }
    }

    /// A request's reply; `attach`: the time an attach took.
    fn note(&mut self, response: &Response, attach: Option<Duration>) {
        match response {
            Response::Error { kind, .. } => *self.errors.entry(kind.as_str()).or_default() += 1,
            Response::Attached { .. } => {
                if let Some(took) = attach {
                    self.attach_seconds.observe_duration(took);
                }
            }
            _ => {}
        }
    }
}

/// What every client connection shares: the daemon, the count of open
/// connections (for the idle exit), and the budgets per uid.
#[derive(Clone)]
pub(super) struct Sessions {
    pub(super) daemon: Arc<Mutex<Daemon>>,
    connections: Arc<AtomicUsize>,
    /// Connections per account (`Client::account`), and in all.
    per_uid: Arc<Budget<u32>>,
    /// Relays started for users other than root, on every network socket.
    relay_starts: Arc<std::sync::Mutex<RateLimit<()>>>,
    /// Lines logged about what clients cause, per account and in all.
    pub(super) logs: Arc<std::sync::Mutex<LogBudget>>,
    large: Arc<LargeReplies>,
    pub(super) requests: Arc<std::sync::Mutex<RequestStats>>,
    next_client: Arc<AtomicU64>,
    /// A user's own daemon serves that user alone (root inside).
    rootless: bool,
}

impl Sessions {
    /// For `daemon`: at most `per_account` connections for an account
    /// other than root's, and `in_all` for all of them together; a
    /// rootless daemon serves its user alone.
    pub(super) fn new(
        daemon: Arc<Mutex<Daemon>>,
        (per_account, in_all): (usize, usize),
        rootless: bool,
    ) -> Sessions {
        Sessions {
            daemon,
            connections: Arc::new(AtomicUsize::new(0)),
            per_uid: Arc::new(Budget::new(per_account, in_all)),
            relay_starts: Arc::new(std::sync::Mutex::new(RateLimit::new(
                RELAYS_PER_SECOND_IN_ALL,
                Duration::from_secs(1),
            ))),
            logs: Arc::new(std::sync::Mutex::new(LogBudget::new(
                LOG_LINES_PER_ACCOUNT,
                LOG_LINES_IN_ALL,
                LOG_WINDOW,
            ))),
            large: Arc::new(LargeReplies::new(LARGE_REPLIES_PER_UID, usize::MAX)),
            requests: Arc::new(std::sync::Mutex::new(RequestStats::new())),
            next_client: Arc::new(AtomicU64::new(1)),
            rootless,
        }
    }

    /// How many connections are open.
    pub(super) fn open(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

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
        let (uid, account) = (client.uid, client.account);
        let whose = if account == uid {
            format!("uid {uid}")
        } else {
            format!("uid {uid}'s account {account} (whose subordinate or namespaced uid it is)")
        };
        self.per_uid.try_take(account).map(Some).map_err(|refused| {
            if !refused.per_key {
                if let Some(count) = refused.report {
                    warn!(uid, account, pid = ?client.pid, refused = count, "users other than root hold the daemon's most connections in all (linnet daemon --max-connections): refusing more; root's are still served");
                }
                return "the linnet daemon holds its most connections from users other than root (--max-connections); try again later, or ask the administrator to raise it".to_string();
            }
            let limit = self.per_uid.per_key();
            if let Some(count) = refused.report {
                warn!(uid, account, pid = ?client.pid, refused = count, "{whose} holds {limit} connections to the daemon, its limit (linnet daemon --max-connections-per-uid): refusing more");
            }
            format!("{whose} holds {limit} connections to the linnet daemon, its limit; close some (each `linnet run`, `helper` and VM on a network's socket holds one) or ask the administrator to raise --max-connections-per-uid")
        })
    }

    /// Whether another relay may start now for a user other than root:
    /// at most RELAYS_PER_SECOND_IN_ALL a second on all network sockets
    /// together, whoever asks (each is a fork).
    pub(super) fn may_start_relay(&self) -> bool {
        let mut starts = self.relay_starts.lock().expect("relay starts lock");
        starts.allow(&(), Instant::now()).is_ok()
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
        serve_client(self, conn, &client).await;
        let teardown = self.daemon.lock().await.client_going(client.id);
        if let Err(e) = finish_unlocked(&self.daemon, teardown).await {
            warn!(client = client.id, "detaching its interfaces failed: {e}");
        }
        drop(permit);
        self.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers a connection the daemon will not serve, and closes it: the
/// client reads the reason as the reply to its first request.
pub(super) fn refuse(conn: &AsyncFd<OwnedFd>, kind: api::ErrorKind, message: String) {
    let response = Response::Error { kind, message };
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

async fn serve_client(sessions: &Sessions, conn: AsyncFd<OwnedFd>, client: &Client) {
    let (daemon, large, logs) = (&*sessions.daemon, &*sessions.large, &*sessions.logs);
    debug!(client = client.id, pid = ?client.pid, uid = client.uid, "connected");
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let received = conn
            .async_io(Interest::READABLE, |fd| {
                api::recv_request(fd.as_fd(), &mut buf)
            })
            .await;
        let mut took = None;
        // Whatever a client sends, it gets an answer and the daemon carries
        // on: an oversized packet (its rest already discarded by the
        // kernel) or one that is not a request is refused, not fatal.
        let (response, fd) = match received {
            Ok(Some(len)) => match serde_json::from_slice::<Request>(&buf[..len]) {
                Err(e) => (bad_request(format!("cannot parse request: {e}")), None),
                // The connection is the subscription's from now on.
                Ok(Request::Events { network, recent }) if client.network_socket.is_none() => {
                    follow_events(sessions, &conn, client, network, recent).await;
                    break;
                }
                Ok(request) => {
                    let attach = matches!(request, Request::Attach(_));
                    let started = Instant::now();
                    let answered = handle(daemon, client, request, logs).await;
                    took = attach.then(|| started.elapsed());
                    answered
                }
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
        (sessions.requests.lock())
            .expect("request stats lock")
            .note(&response, took);
        let fds: Vec<i32> = fd.iter().flatten().map(|f| f.as_raw_fd()).collect();
        let attached = match &response {
            Response::Attached { interface, .. } => Some(interface.interface_id),
            _ => None,
        };
        let mut sent = send_reply(&conn, &response, &fds, large, client.uid).await;
        // Our copies of the TAP's fds close here; the client holds its own.
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
            if let Some(id) = attached
                && let Err(e) = daemon.lock().await.handle_detach(client, id).await
            {
                warn!(interface = %id, "cannot detach the interface whose reply was not sent: {e}");
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

/// Sends `client` the events of `network` (all: None) until it goes: a
/// task of its own, so a reader that does not keep up only misses events
/// (it is told how many), never holds the daemon up.
async fn follow_events(
    sessions: &Sessions,
    conn: &AsyncFd<OwnedFd>,
    client: &Client,
    network: Option<String>,
    recent: bool,
) {
    let bus = {
        let daemon = sessions.daemon.lock().await;
        if let Some(name) = &network
            && daemon.config.network(name).is_none()
        {
            let refused = daemon.unknown_network(name).into_response();
            let _ = send_reply(conn, &refused, &[], &sessions.large, client.uid).await;
            return;
        }
        daemon.events.clone()
    };
    let (first, mut events) = bus.subscribe(recent);
    let send = |r: Response| async move { send_patiently(conn, &r).await.is_ok() };
    if !send(Response::Subscribed).await {
        return;
    }
    for event in first.into_iter().filter(|e| wanted(e, network.as_deref())) {
        if !send(Response::Event(event)).await {
            return;
        }
    }
    debug!(client = client.id, ?network, "following events");
    let mut scratch = vec![0u8; MAX_MESSAGE];
    loop {
        let event = tokio::select! {
            received = events.recv() => match received {
                Ok(event) if wanted(&event, network.as_deref()) => event,
                Ok(_) => continue,
                Err(RecvError::Lagged(count)) => Event::now(None, What::Dropped { count }),
                Err(RecvError::Closed) => return,
            },
            // Anything the client sends now is ignored; its end is the end.
            read = conn.async_io(Interest::READABLE, |fd| api::recv_request(fd.as_fd(), &mut scratch)) => match read {
                Ok(Some(_)) => continue,
                _ => return,
            },
        };
        if !send(Response::Event(event)).await {
            return;
        }
    }
}

/// How long an event waits at first, then at most, for room in a
/// subscriber's socket.
const EVENT_RETRY_FIRST: Duration = Duration::from_millis(5);
const EVENT_RETRY_MOST: Duration = Duration::from_secs(1);

/// Sends `response` once the peer has room, trying again after a pause
/// that grows, rather than waiting for writability: a connected unix
/// datagram socket reports itself writable by its own buffer while its
/// peer's queue is full (the send then fails again), so waiting could
/// spin. A subscriber that never reads costs a wake-up a second at most.
async fn send_patiently(conn: &AsyncFd<OwnedFd>, response: &Response) -> io::Result<()> {
    let reply = api::ReplyBytes::new(response)?;
    let piece = api::piece_size(conn.get_ref().as_fd());
    for packet in reply.packets(piece) {
        let mut pause = EVENT_RETRY_FIRST;
        loop {
            match api::send_packet(conn.get_ref().as_fd(), packet, &[]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(EVENT_RETRY_MOST);
                }
                other => {
                    other?;
                    break;
                }
            }
        }
    }
    Ok(())
}

async fn handle(
    lock: &Mutex<Daemon>,
    client: &Client,
    request: Request,
    logs: &std::sync::Mutex<LogBudget>,
) -> (Response, Option<Vec<OwnedFd>>) {
    if let Some(network) = &client.network_socket
        && !super::client::relay_may(&request)
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
    let mut daemon = match &request {
        Request::Attach(req) => lock_for_attach(lock, req).await,
        _ => lock.lock().await,
    };
    match request {
        Request::WaitAddress { .. } => unreachable!("answered above"),
        Request::Events { .. } => unreachable!("followed by serve_client, refused to relays above"),
        Request::Attach(req) => match daemon.handle_attach(client, req).await {
            Ok((interface, fd, reclaim_token)) => {
                // A TAP opened by name takes one opener at a time: ours
                // closes before the reply goes out, so the VMM the client
                // starts on it finds it free (closed after the send, the
                // VMM could come first: EBUSY). The client gets none.
                let fd = (interface.datapath != Datapath::TapName).then_some(fd);
                (
                    Response::Attached {
                        interface: Box::new(interface),
                        reclaim_token,
                    },
                    fd,
                )
            }
            Err(e) => {
                let turn = logs
                    .lock()
                    .expect("log budget lock")
                    .turn(client.account, Instant::now());
                if let Some(turn) = turn {
                    error!(uid = client.uid, account = client.account, pid = ?client.pid, suppressed = turn.suppressed, suppressed_in_all = turn.suppressed_in_all, "attach refused: {e}{}", held_back(&turn));
                }
                (e.into_response(), None)
            }
        },
        Request::Detach { interface_id } => {
            // Replied once the TAP is gone; other requests go on meanwhile.
            let detached = match daemon.detach_request(client, interface_id) {
                Ok(teardown) => {
                    drop(daemon);
                    finish_unlocked(lock, teardown).await
                }
                Err(e) => Err(e),
            };
            match detached {
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
            daemon.policy_refusals();
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
        Request::SecretSet {
            name,
            value,
            network,
        } => secret(
            &mut daemon,
            client,
            SecretRequest::Set {
                name,
                value,
                network,
            },
        ),
        Request::SecretRemove { name, network } => {
            secret(&mut daemon, client, SecretRequest::Remove { name, network })
        }
        Request::SecretList => secret(&mut daemon, client, SecretRequest::List),
        Request::Ca { network } => match super::secret_proxies::ca_request(
            &daemon.config,
            &daemon.state_dir,
            client,
            &network,
        ) {
            Ok(r) => (r, None),
            Err(e) => (e.into_response(), None),
        },
        Request::Doctor { network } => {
            let mut report = daemon.doctor(network.as_deref());
            let across = daemon.across_hosts(network.as_deref());
            let vty_socket = daemon.config.frr.vty_socket.clone();
            drop(daemon);
            super::requests::add_fabric_health(&mut report, across, &vty_socket).await;
            (report, None)
        }
    }
}

/// A `linnet secret` request, carried out by the daemon's secrets.
fn secret(
    daemon: &mut Daemon,
    client: &Client,
    request: SecretRequest,
) -> (Response, Option<Vec<OwnedFd>>) {
    let Daemon {
        secrets, config, ..
    } = daemon;
    let changes = !matches!(request, SecretRequest::List);
    let response = match secrets.handle(client, config, request) {
        Ok(r) => r,
        Err(e) => return (e.into_response(), None),
    };
    if changes {
        // A rotated or removed secret holds for the next request.
        daemon.sync_secret_proxies();
    }
    (response, None)
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
                return DaemonError::NoAddressYet {
                    id,
                    seconds: timeout.as_secs(),
                }
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

fn reply(result: Result<(), DaemonError>) -> (Response, Option<Vec<OwnedFd>>) {
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

/// What a log line adds about the lines held back before it.
pub(super) fn held_back(turn: &LogTurn) -> String {
    match (turn.suppressed, turn.suppressed_in_all) {
        (0, 0) => String::new(),
        (0, all) => format!(" ({all} messages about clients suppressed before this)"),
        (mine, all) => format!(
            " ({mine} messages about this account's clients suppressed before this, {all} in all)"
        ),
    }
}
