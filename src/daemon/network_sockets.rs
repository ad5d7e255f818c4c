//! Network sockets: a socket_vmnet-compatible unix stream socket per network
//! that asks for one (`socket:` in networks.yaml), for lima, minikube and
//! plain QEMU (`-netdev stream` / `-netdev socket,fd=`). Each connection is
//! one VM port, its frames after a 4-byte big-endian length.
//!
//! The daemon never reads those frames. It checks who connected
//! (SO_PEERCRED against the network's `allow`), then starts `linnet-relay`
//! as that user, with no capabilities, holding the accepted connection and
//! one end of a socketpair that the daemon serves as that user's API
//! connection. The relay waits for the VM's first frame, attaches on its
//! source MAC (socket_vmnet lets the VM choose its MAC; anti-spoofing locks
//! it from then on), and relays as `linnet helper --stream-fd` does. When
//! the VM's connection closes the relay exits, its API connection closes,
//! and the interface goes like any client's.
//!
//! Attaching after the first frame, rather than before with the MAC to be
//! filled in, keeps the interface, its lease and its guard entries exactly
//! those of an ordinary attach: nothing is re-keyed later.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType};
use tokio::io::unix::AsyncFd;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::sessions::Sessions;
use super::sockets::{Unidentified, accept_next, bind_unix, identify, register};
use crate::budget::{LogBudget, RateLimit};
use crate::config::{Allow, DEFAULT_MTU, NetworkConfig};
use crate::host::privileges;

/// The executable started per connection, next to the daemon's.
const RELAY: &str = "linnet-relay";
/// Where the relay finds the VM's connection and its API connection.
const RELAY_STREAM_FD: i32 = 3;
const RELAY_DAEMON_FD: i32 = 4;
/// The relay of a connection root made runs as a uid of its own, one per
/// live relay, from these 65536: as `nobody`, any service running as
/// nobody could take over the relay, its VM's port and its API connection.
/// (Other users' relays run as that user: only the user can reach them,
/// and gets no more than they have.) 0x7f6c0000 ("\x7fl") is in the range
/// systemd leaves to others (0x70000000-0x7ffdffff), outside its container
/// and foreign ranges; the daemon warns when /etc/subuid hands any of it
/// out.
const ROOT_RELAY_UIDS: u32 = 0x7f6c_0000;
const ROOT_RELAY_COUNT: u32 = 0x1_0000;
/// What a relay may write to the daemon's log: this many lines of at
/// most this many bytes (the relay runs as the VM's user, who must not be
/// able to fill the log).
const RELAY_LINES: usize = 20;
const RELAY_LINE: usize = 400;
/// Relays one uid other than root may have started per second and
/// network: a user connecting in a loop costs the daemon a fork each.
const RELAYS_PER_UID_PER_SECOND: u32 = 10;
/// A refused user's connections are logged once in this long.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// Who may open a network's socket file, as far as file permissions can
/// say it; SO_PEERCRED at accept is the real check, with supplementary
/// groups and several users that one mode and group cannot express.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    pub mode: u32,
    pub owner: u32,
    pub group: u32,
}

impl SocketAccess {
    pub fn for_allow(allow: &Allow) -> SocketAccess {
        let users: Vec<u32> = allow
            .users
            .iter()
            .map(|(_, uid)| *uid)
            .filter(|&u| u != 0)
            .collect();
        let groups: Vec<u32> = allow.groups.iter().map(|(_, gid)| *gid).collect();
        match (users.as_slice(), groups.as_slice()) {
            // Root only (root passes file permissions anyway).
            ([], []) => SocketAccess {
                mode: 0o600,
                owner: 0,
                group: 0,
            },
            ([], [group]) => SocketAccess {
                mode: 0o660,
                owner: 0,
                group: *group,
            },
            ([user], []) => SocketAccess {
                mode: 0o600,
                owner: *user,
                group: 0,
            },
            _ => SocketAccess {
                mode: 0o666,
                owner: 0,
                group: 0,
            },
        }
    }
}

/// The uids of root's relays that are in use: each live relay its own.
#[derive(Clone, Default)]
struct RelayUids(Arc<Mutex<UidPool>>);

#[derive(Default)]
struct UidPool {
    taken: BTreeSet<u32>,
    /// Where the search for a free one starts: after the last one given,
    /// so a uid is not given again soon after its relay ended.
    next: u32,
    /// Taken by relays an earlier daemon started, still running at start.
    left_over: BTreeSet<u32>,
}

/// The real uids of the processes running now.
fn uids_running() -> BTreeSet<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        e.file_name().to_str()?.parse::<u32>().ok()?;
        let status = std::fs::read_to_string(e.path().join("status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("Uid:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    })
    .collect()
}

impl RelayUids {
    /// The pool of a starting daemon: relays of an earlier one may still
    /// run for a moment (they end once they see it gone), so the search
    /// starts after the highest of their uids (`running`), never at one of
    /// them, and they are held until their processes are gone.
    fn after(running: &BTreeSet<u32>) -> RelayUids {
        let ours = ROOT_RELAY_UIDS..ROOT_RELAY_UIDS + ROOT_RELAY_COUNT;
        let mut pool = UidPool::default();
        pool.taken = running
            .iter()
            .copied()
            .filter(|u| ours.contains(u))
            .collect();
        pool.next =
            (pool.taken.last()).map_or(0, |last| (last - ROOT_RELAY_UIDS + 1) % ROOT_RELAY_COUNT);
        pool.left_over = pool.taken.clone();
        RelayUids(Arc::new(Mutex::new(pool)))
    }

    /// A free one, held until the returned guard drops.
    fn take(&self) -> Option<RelayUid> {
        let mut pool = self.0.lock().expect("relay uid lock");
        // An earlier daemon's relays, once gone, free their uids.
        if !pool.left_over.is_empty() {
            let running = uids_running();
            let gone: Vec<u32> = pool.left_over.difference(&running).copied().collect();
            for uid in gone {
                pool.left_over.remove(&uid);
                pool.taken.remove(&uid);
            }
        }
        let start = pool.next;
        let offset = (0..ROOT_RELAY_COUNT)
            .map(|i| (start + i) % ROOT_RELAY_COUNT)
            .find(|o| !pool.taken.contains(&(ROOT_RELAY_UIDS + o)))?;
        pool.taken.insert(ROOT_RELAY_UIDS + offset);
        pool.next = (offset + 1) % ROOT_RELAY_COUNT;
        Some(RelayUid {
            uid: ROOT_RELAY_UIDS + offset,
            set: self.clone(),
        })
    }
}

/// A root relay's uid, free again when dropped (once the relay is reaped).
struct RelayUid {
    uid: u32,
    set: RelayUids,
}

impl Drop for RelayUid {
    fn drop(&mut self) {
        self.set
            .0
            .lock()
            .expect("relay uid lock")
            .taken
            .remove(&self.uid);
    }
}

/// The /etc/subuid ranges (`name:first:count` lines) that overlap root's
/// relays' uids.
fn subuid_overlaps(subuid: &str) -> Vec<&str> {
    let ours = ROOT_RELAY_UIDS as u64..(ROOT_RELAY_UIDS + ROOT_RELAY_COUNT) as u64;
    subuid
        .lines()
        .filter(|line| {
            let mut fields = line.trim().split(':').skip(1);
            let (Some(Ok(first)), Some(Ok(count))) = (
                fields.next().map(str::parse::<u64>),
                fields.next().map(str::parse::<u64>),
            ) else {
                return false;
            };
            first < ours.end && ours.start < first + count
        })
        .collect()
}

/// The network sockets the daemon listens on.
pub struct NetworkSockets {
    listeners: Vec<(PathBuf, JoinHandle<()>)>,
}

impl NetworkSockets {
    /// Stops accepting and removes the socket files. Relays already
    /// started go when the daemon's end of their connection closes.
    pub fn close(self) {
        for (path, task) in self.listeners {
            task.abort();
            crate::files::remove_left(&path);
        }
    }
}

/// Binds every network's socket and starts accepting on it. A socket that
/// cannot be bound stops the daemon from starting: it was asked for.
pub async fn open(sessions: &Sessions, run_dir: &Path) -> anyhow::Result<NetworkSockets> {
    let networks: Vec<NetworkConfig> = (sessions.daemon.lock().await.config.networks.values())
        .filter(|n| n.socket.is_some())
        .cloned()
        .collect();
    let mut sockets = NetworkSockets {
        listeners: Vec::new(),
    };
    if networks.is_empty() {
        return Ok(sockets);
    }
    let relay = relay_executable()?;
    if let Ok(subuid) = std::fs::read_to_string("/etc/subuid") {
        for line in subuid_overlaps(&subuid) {
            warn!(
                "/etc/subuid gives out uids that root's relays use ({ROOT_RELAY_UIDS:#x} and the 65535 after it): \"{line}\"; a process of that range could reach root's VMs' relays"
            );
        }
    }
    let root_uids = RelayUids::after(&uids_running());
    let paths: Vec<PathBuf> = (networks.iter())
        .map(|n| n.socket.as_ref().expect("filtered").path(&n.name, run_dir))
        .collect();
    if let Some(clash) = socket_clash(&paths, &networks, run_dir) {
        bail!(clash);
    }
    for network in networks {
        let path = network
            .socket
            .as_ref()
            .expect("filtered")
            .path(&network.name, run_dir);
        let listener = match bind(&path, SocketAccess::for_allow(&network.allow)) {
            Ok(listener) => listener,
            Err(e) => {
                sockets.close();
                return Err(e.context(format!("network \"{}\": socket", network.name)));
            }
        };
        info!(network = %network.name, socket = %path.display(), allow = %network.allow.describe(), "network socket ready");
        let task = tokio::spawn(accept_loop(
            sessions.clone(),
            listener,
            network,
            root_uids.clone(),
            relay.clone(),
        ));
        sockets.listeners.push((path, task));
    }
    Ok(sockets)
}

/// Two networks' sockets at one path, or one at the daemon's own socket,
/// as the run directory resolves them (the config cannot tell: it does not
/// know the run directory).
fn socket_clash(paths: &[PathBuf], networks: &[NetworkConfig], run_dir: &Path) -> Option<String> {
    let api = run_dir.join(crate::api::SOCKET_NAME);
    for (i, path) in paths.iter().enumerate() {
        let name = &networks[i].name;
        if *path == api {
            return Some(format!(
                "network \"{name}\": socket {} is the daemon's own socket; give the network another path",
                path.display()
            ));
        }
        if let Some(j) = paths[..i].iter().position(|p| p == path) {
            return Some(format!(
                "networks \"{}\" and \"{name}\" both have their socket at {}; give each its own",
                networks[j].name,
                path.display()
            ));
        }
    }
    None
}

/// `linnet-relay`, next to this executable.
fn relay_executable() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("cannot find the linnet executable")?;
    let relay = me.with_file_name(RELAY);
    if !relay.is_file() {
        bail!(
            "{} is missing: network sockets (socket: in networks.yaml) relay through it; install it next to {}",
            relay.display(),
            me.display()
        );
    }
    Ok(relay)
}

fn bind(path: &Path, access: SocketAccess) -> anyhow::Result<AsyncFd<OwnedFd>> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // chown and chmod below follow links: were the directory, or any above
    // it, another user's to change, the socket could be swapped for a link
    // to any file between bind and them.
    if let Some(open) = writable_by_others(dir)? {
        bail!(
            "{} may be changed by users other than root: the socket there could be swapped for a link; use a directory only root controls (e.g. /run/linnet)",
            open.display()
        );
    }
    remove_stale(path)?;
    let fd = bind_unix(path, SockType::Stream)?;
    // Nobody can connect before listen(), so the owner and mode are set
    // before anyone can use the socket.
    let ready = (|| {
        std::os::unix::fs::chown(path, Some(access.owner), Some(access.group))
            .with_context(|| format!("cannot set the owner of {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(access.mode))
            .with_context(|| format!("cannot set the mode of {}", path.display()))?;
        socket::listen(&fd, socket::Backlog::new(128)?)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        Ok(register(fd)?)
    })();
    if ready.is_err() {
        crate::files::remove_left(path);
    }
    ready
}

/// The first directory on the way to `dir` (as written, and with links
/// resolved) that a user other than root may change, if any.
fn writable_by_others(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let resolved =
        std::fs::canonicalize(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    for path in [dir, resolved.as_path()] {
        for step in path.ancestors() {
            let meta = std::fs::symlink_metadata(step)
                .with_context(|| format!("cannot look at {}", step.display()))?;
            let ok = if meta.file_type().is_symlink() {
                meta.uid() == 0
            } else {
                only_root_changes(meta.uid(), meta.mode())
            };
            if !ok {
                return Ok(Some(step.to_path_buf()));
            }
        }
    }
    Ok(None)
}

/// Whether only root may replace, remove or rename root's entries in a
/// directory: root's, and writable by no one else, or sticky (/tmp).
fn only_root_changes(owner: u32, mode: u32) -> bool {
    owner == 0 && (mode & 0o022 == 0 || mode & 0o1000 != 0)
}

/// A socket file left by a dead daemon goes; anything else at the path
/// (a live socket_vmnet, a file) is the administrator's to move.
fn remove_stale(path: &Path) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot look at {}", path.display())),
        Ok(meta) => meta,
    };
    if !meta.file_type().is_socket() {
        bail!(
            "{} exists and is not a socket; remove it or choose another path",
            path.display()
        );
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!(
            "something is listening on {} already (socket_vmnet?); stop it or choose another path",
            path.display()
        );
    }
    std::fs::remove_file(path)
        .with_context(|| format!("cannot remove the stale socket {}", path.display()))
}

async fn accept_loop(
    sessions: Sessions,
    listener: AsyncFd<OwnedFd>,
    network: NetworkConfig,
    root_uids: RelayUids,
    relay: PathBuf,
) {
    let socket = format!("network \"{}\"'s socket", network.name);
    let mut out_of_fds = 0;
    // Per uid: relays started, and lines about refused connections.
    let mut starts = RateLimit::new(RELAYS_PER_UID_PER_SECOND, Duration::from_secs(1));
    let mut refusals_logged = RateLimit::new(1, REFUSAL_LOG_PERIOD);
    loop {
        let conn = accept_next(&listener, &socket, &mut out_of_fds).await;
        let limits = Limits {
            starts: &mut starts,
            refusals_logged: &mut refusals_logged,
            root_uids: &root_uids,
        };
        if let Err(e) = admit(&sessions, conn, &network, &relay, limits) {
            warn!(network = %network.name, "a connection to the network socket failed: {e:#}");
        }
    }
}

/// What one user may cost a network socket's accept loop.
struct Limits<'a> {
    starts: &'a mut RateLimit<u32>,
    refusals_logged: &'a mut RateLimit<u32>,
    root_uids: &'a RelayUids,
}

/// Checks who connected and starts their relay; the connection is closed
/// (the VM sees its network go) when they may not attach.
fn admit(
    sessions: &Sessions,
    conn: AsyncFd<OwnedFd>,
    network: &NetworkConfig,
    relay: &Path,
    limits: Limits<'_>,
) -> anyhow::Result<()> {
    let name = &network.name;
    let now = Instant::now();
    let mut client = match identify(&conn, sessions.next_id()) {
        Ok(client) => client,
        Err(Unidentified::Gone(gone)) => {
            if limits.refusals_logged.allow(&gone.uid, now).is_ok() {
                warn!(network = %name, uid = gone.uid, "refused a connection to the network socket: {gone} (more from uid {} in the next {} s are not logged)", gone.uid, REFUSAL_LOG_PERIOD.as_secs());
            }
            return Ok(());
        }
        Err(e) => return Err(e).context("cannot identify the peer"),
    };
    // A refused user is told nothing (the protocol has no word for it) and
    // logged once a period, however often they try.
    let mut refuse = |why: String| {
        if limits.refusals_logged.allow(&client.account, now).is_ok() {
            warn!(network = %name, uid = client.uid, pid = ?client.pid, "refused a connection to the network socket: {why} (more from uid {} in the next {} s are not logged)", client.uid, REFUSAL_LOG_PERIOD.as_secs());
        }
        Ok(())
    };
    if !client.allowed_by(&network.allow) {
        return refuse(format!(
            "uid {} is not allowed on network \"{name}\" (it allows {}); add the user to networks.{name}.allow or to one of those groups",
            client.uid,
            network.allow.describe()
        ));
    }
    if client.uid != 0 && limits.starts.allow(&client.account, now).is_err() {
        return refuse(format!(
            "uid {} (account {}) connected more than {RELAYS_PER_UID_PER_SECOND} times in a second",
            client.uid, client.account
        ));
    }
    if client.uid != 0 && !sessions.may_start_relay() {
        return refuse(
            "users other than root started the most relays in all this second; it may connect again in a moment".into(),
        );
    }
    let permit = match sessions.admit(&client) {
        Ok(permit) => permit,
        Err(refusal) => return refuse(refusal),
    };
    // Blocking for the relay, which waits for each reply.
    let (ours, theirs) = socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("cannot make the relay's connection")?;
    crate::datapath::port::set_nonblocking(ours.as_raw_fd())
        .context("cannot make the relay's connection")?;
    let (identity, root_uid) = match client.uid {
        0 => {
            let Some(own) = limits.root_uids.take() else {
                return refuse(format!(
                    "all {ROOT_RELAY_COUNT} uids of root's relays are in use"
                ));
            };
            ((own.uid, own.uid), Some(own))
        }
        uid => ((uid, client.gid), None),
    };
    let vm: OwnedFd = conn.into_inner();
    let mut child = start_relay(relay, network, identity, vm, theirs)?;
    debug!(network = %name, uid = client.uid, pid = ?client.pid, relay = ?child.id(), "network socket connection: relay started");
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(log_relay_output(
            stderr,
            name.clone(),
            (client.uid, client.account),
            client.pid,
            sessions.logs.clone(),
        ));
    }
    client.network_socket = Some(name.clone());
    let ours = register(ours).context("cannot watch the relay's connection")?;
    let sessions = sessions.clone();
    tokio::spawn(async move {
        sessions.serve(ours, client, permit).await;
        let _ = child.wait().await;
        drop(root_uid);
    });
    Ok(())
}

/// Logs what a relay says (a refused attach, a broken stream), with whose
/// connection it was: at most RELAY_LINES lines of RELAY_LINE bytes.
async fn log_relay_output(
    stderr: tokio::process::ChildStderr,
    network: String,
    (uid, account): (u32, u32),
    pid: Option<i32>,
    logs: Arc<std::sync::Mutex<LogBudget>>,
) {
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::with_capacity(RELAY_LINE);
    for _ in 0..RELAY_LINES {
        line.clear();
        match read_line_capped(&mut reader, &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        // Within the account's log budget: a user's many relays together
        // say no more than it may.
        let turn = logs
            .lock()
            .expect("log budget lock")
            .turn(account, Instant::now());
        if let Some(turn) = turn {
            let more = super::sessions::held_back(&turn);
            warn!(%network, uid, account, ?pid, "relay: {}{more}", text.trim_end());
        }
    }
    // Dropping the pipe: the relay's further lines go nowhere.
    use tokio::io::AsyncBufReadExt;
    if reader.fill_buf().await.is_ok_and(|more| !more.is_empty()) {
        warn!(%network, uid, ?pid, "the relay says more; the rest is not logged");
    }
}

/// Reads one line (or what is left), keeping at most RELAY_LINE bytes of
/// it: a line without end cannot grow the daemon's memory. The bytes read.
async fn read_line_capped(
    reader: &mut (impl tokio::io::AsyncBufRead + Unpin),
    line: &mut Vec<u8>,
) -> io::Result<usize> {
    use tokio::io::AsyncBufReadExt;
    let mut read = 0;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(read);
        }
        let (n, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (buf.len(), false),
        };
        let room = RELAY_LINE.saturating_sub(line.len());
        line.extend_from_slice(&buf[..n.min(room)]);
        reader.consume(n);
        read += n;
        if done {
            return Ok(read);
        }
    }
}

/// `linnet-relay` as the connecting user (a uid of its own for root), with no
/// capabilities and nothing else of the daemon's: the VM's connection as
/// fd 3, its API connection as fd 4, an empty environment.
fn start_relay(
    relay: &Path,
    network: &NetworkConfig,
    (uid, gid): (u32, u32),
    vm: OwnedFd,
    api: OwnedFd,
) -> anyhow::Result<tokio::process::Child> {
    let mut cmd = std::process::Command::new(relay);
    cmd.args([
        "--attach-on-first-frame",
        &network.name,
        "--stream-fd",
        &RELAY_STREAM_FD.to_string(),
        "--daemon",
        &RELAY_DAEMON_FD.to_string(),
        "--mtu",
        // A LAN's is its link's, known once it is up: Ethernet's till then.
        &network.own().map_or(DEFAULT_MTU, |own| own.mtu).to_string(),
    ])
    .env_clear()
    .current_dir("/")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    // Its few lines (a refused attach, a broken stream) go to the
    // daemon's log, through `log_relay_output`.
    .stderr(Stdio::piped())
    // As root, std drops the supplementary groups before setuid.
    .uid(uid)
    .gid(gid);
    let (vm_fd, api_fd) = (vm.as_raw_fd(), api.as_raw_fd());
    // SAFETY: between fork and exec the closure makes only async-signal-safe
    // system calls (fcntl, dup2, prctl, capset) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // Both copied above 4 first, then placed: placing the first
            // cannot overwrite the second even when it sits at 3 or 4.
            // dup2 clears close-on-exec on fds 3 and 4.
            let high = [
                libc::fcntl(vm_fd, libc::F_DUPFD_CLOEXEC, RELAY_DAEMON_FD + 1),
                libc::fcntl(api_fd, libc::F_DUPFD_CLOEXEC, RELAY_DAEMON_FD + 1),
            ];
            for (from, to) in high.into_iter().zip([RELAY_STREAM_FD, RELAY_DAEMON_FD]) {
                if from < 0 || libc::dup2(from, to) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            privileges::clear_capabilities()
        });
    }
    let child = tokio::process::Command::from(cmd)
        .spawn()
        .with_context(|| format!("cannot start {}", relay.display()))?;
    // Our copies close here; the relay holds its own.
    drop((vm, api));
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_goes_only_where_root_alone_changes_entries() {
        assert!(only_root_changes(0, 0o40755));
        assert!(only_root_changes(0, 0o40700));
        assert!(
            only_root_changes(0, 0o41777),
            "/tmp: sticky, others cannot move root's entries"
        );
        assert!(!only_root_changes(0, 0o40777), "world-writable");
        assert!(!only_root_changes(0, 0o40775), "group-writable");
        assert!(!only_root_changes(1000, 0o40755), "a user's own directory");
    }

    #[test]
    fn each_live_root_relay_has_a_uid_of_its_own_given_back_when_it_ends() {
        let uids = RelayUids::default();
        let a = uids.take().unwrap();
        let b = uids.take().unwrap();
        assert_eq!((a.uid, b.uid), (ROOT_RELAY_UIDS, ROOT_RELAY_UIDS + 1));
        drop(a);
        assert_eq!(
            uids.take().unwrap().uid,
            ROOT_RELAY_UIDS + 2,
            "not at once again"
        );
        let mut held: Vec<RelayUid> = (0..ROOT_RELAY_COUNT - 1)
            .map(|_| uids.take().unwrap())
            .collect();
        assert!(uids.take().is_none(), "all in use");
        let freed = held.swap_remove(1000).uid;
        assert_eq!(uids.take().unwrap().uid, freed, "free again");
        drop(b);
    }

    #[test]
    fn a_restarted_daemon_gives_root_relays_uids_after_those_still_running() {
        let running = BTreeSet::from([1000, ROOT_RELAY_UIDS, ROOT_RELAY_UIDS + 7]);
        let uids = RelayUids::after(&running);
        // (Processes of the test's own uid run; the earlier relays' do not
        // here, so they are free again once looked for.)
        assert_eq!(uids.take().unwrap().uid, ROOT_RELAY_UIDS + 8);
        let last = BTreeSet::from([ROOT_RELAY_UIDS + ROOT_RELAY_COUNT - 1]);
        assert_eq!(RelayUids::after(&last).0.lock().unwrap().next, 0, "wraps");
        let none = RelayUids::after(&BTreeSet::from([0, 1000]));
        assert_eq!(none.take().unwrap().uid, ROOT_RELAY_UIDS);
    }

    #[test]
    fn two_networks_or_the_daemon_at_one_socket_are_refused_by_name() {
        let cfg = crate::config::Config::from_yaml(
            "networks:\n  shared:\n    socket: true\n  host:\n    socket: /run/linnet/shared.sock\n  lab:\n    subnet: 10.9.0.0/24\n    socket: /run/linnet/linnet.sock\n",
            "t.yaml",
        )
        .unwrap();
        let run_dir = Path::new("/run/linnet");
        let pick = |names: &[&str]| {
            let nets: Vec<NetworkConfig> = names
                .iter()
                .map(|n| cfg.network(n).unwrap().clone())
                .collect();
            let paths: Vec<PathBuf> = nets
                .iter()
                .map(|n| n.socket.as_ref().unwrap().path(&n.name, run_dir))
                .collect();
            socket_clash(&paths, &nets, run_dir)
        };
        assert_eq!(
            pick(&["shared", "host"]).unwrap(),
            "networks \"shared\" and \"host\" both have their socket at /run/linnet/shared.sock; give each its own"
        );
        assert_eq!(
            pick(&["lab"]).unwrap(),
            "network \"lab\": socket /run/linnet/linnet.sock is the daemon's own socket; give the network another path"
        );
        assert_eq!(pick(&["shared"]), None);
    }

    #[test]
    fn subuid_ranges_over_root_relays_uids_are_found() {
        let subuid =
            "alice:100000:65536\nbob:2137784320:65536\ncarol:2137849855:10\n# comment\nbad:line\n";
        assert_eq!(
            subuid_overlaps(subuid),
            vec!["bob:2137784320:65536", "carol:2137849855:10"]
        );
    }

    #[test]
    fn a_relay_line_is_kept_to_its_first_bytes_however_long() {
        let mut text = b"short\n".to_vec();
        text.extend(std::iter::repeat_n(b'x', 1 << 20));
        text.extend_from_slice(b"\nlast");
        let mut reader = tokio::io::BufReader::new(text.as_slice());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut lines = Vec::new();
        runtime.block_on(async {
            loop {
                let mut line = Vec::new();
                let read = read_line_capped(&mut reader, &mut line).await.unwrap();
                if read == 0 {
                    break;
                }
                lines.push((read, line));
            }
        });
        assert_eq!(lines[0], (6, b"short\n".to_vec()));
        assert_eq!(lines[1].0, (1 << 20) + 1, "the whole line is read");
        assert_eq!(
            lines[1].1,
            vec![b'x'; RELAY_LINE],
            "and its first bytes kept"
        );
        assert_eq!(lines[2], (4, b"last".to_vec()));
        assert_eq!(lines.len(), 3);
    }

    fn allow(users: &[u32], groups: &[u32]) -> Allow {
        Allow {
            users: users.iter().map(|u| (u.to_string(), *u)).collect(),
            groups: groups.iter().map(|g| (g.to_string(), *g)).collect(),
        }
    }

    #[test]
    fn the_socket_file_admits_what_one_owner_group_and_mode_can_say_of_allow() {
        let access = |users: &[u32], groups: &[u32]| {
            let a = SocketAccess::for_allow(&allow(users, groups));
            (a.mode, a.owner, a.group)
        };
        // The default: root and the linnet group.
        assert_eq!(access(&[0], &[120]), (0o660, 0, 120));
        assert_eq!(access(&[0], &[]), (0o600, 0, 0));
        assert_eq!(access(&[], &[]), (0o600, 0, 0));
        assert_eq!(access(&[0, 1000], &[]), (0o600, 1000, 0));
        // More than one mode and group can say: open, and SO_PEERCRED decides.
        assert_eq!(access(&[1000], &[120]), (0o666, 0, 0));
        assert_eq!(access(&[1000, 1001], &[]), (0o666, 0, 0));
        assert_eq!(access(&[], &[120, 121]), (0o666, 0, 0));
    }
}
