//! `linnet daemon --rootless`: the daemon of a user without root, in a
//! user namespace and a network namespace of the user's own, where it is
//! root and runs the very same drivers as the system daemon.
//!
//! Two processes, both the user's:
//!
//! - the *supervisor* stays in the host's namespaces. It starts the egress
//!   tool (pasta, or slirp4netns) on the namespace once it exists, opens
//!   the host's ports that published forwards listen on (a socket made in
//!   the host's namespace, handed over), and, when the daemon ends however
//!   it ends, stops the egress tool and removes what the daemon left in
//!   the run directory. Nothing of it outlives the two of them: the
//!   namespaces, and every bridge and TAP in them, go with their last
//!   process.
//! - the *daemon* is forked before any thread exists, moves into the new
//!   namespaces, and waits until the way out is up before it starts.
//!
//! They speak over a seqpacket pair: first the start-up handshake, then
//! the daemon's requests for host ports ([`HostRequest`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{self, SigHandler, Signal};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType};
use nix::unistd::{ForkResult, Pid};
use tracing::{error, info, warn};

use super::host_ports::{HostReply, HostRequest, HostSide};
use super::server::{Options, Placement};
use crate::api::{Channel, SOCKET_NAME};
use crate::forward::{PortForward, Protocol};
use crate::host::egress::{self, Egress};
use crate::host::userns;

/// How long the egress tool may take to give the namespace its route.
const EGRESS_START: Duration = Duration::from_secs(10);
/// An egress tool that dies is started again, but not more often than this.
const EGRESS_RESTART_PAUSE: Duration = Duration::from_secs(1);

/// The daemon's pid in the host's pid namespace, in the run directory.
pub const PID_FILE: &str = "daemon.pid";

/// The handshake: the daemon is in its namespaces; the supervisor mapped
/// its ids, or it maps them itself; it is ready; the way out is up.
const UNSHARED: &str = "unshared";
const MAPPED: &str = "mapped";
const MAP_SELF: &str = "map yourself";
const READY: &str = "ready";
const GO: &str = "go";

/// The daemon's pid, for the signal handler to pass signals on.
static DAEMON_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn pass_on(signum: libc::c_int) {
    let pid = DAEMON_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, signum) };
    }
}

/// Runs the rootless daemon: forks it into its namespaces and supervises
/// it until it exits.
pub fn run(mut opts: Options, egress: Egress) -> anyhow::Result<()> {
    for dir in [&opts.run_dir, &opts.state_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // The run directory holds the API socket: the user's alone.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&opts.run_dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} private", opts.run_dir.display()))?;
    userns::check_tun()?;
    let (outer, inner) = socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("cannot make a socketpair")?;
    let supervisor = nix::unistd::getpid();
    // A process group of our own (supervisor, daemon, egress tool): a
    // daemon whose supervisor was killed takes the tool with it.
    if nix::unistd::getpgrp() != supervisor {
        nix::unistd::setpgid(supervisor, supervisor).context("cannot make a process group")?;
    }
    // SAFETY: no thread exists yet (nothing before this point starts one),
    // so the child may go on running ordinary code.
    match unsafe { nix::unistd::fork() }.context("cannot fork the daemon")? {
        ForkResult::Child => {
            drop(outer);
            let code = match inside(opts, Channel::from_fd(inner), supervisor) {
                Ok(()) => 0,
                Err(e) => {
                    error!("{e:#}");
                    1
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => {
            drop(inner);
            let run_dir = std::mem::take(&mut opts.run_dir);
            supervise(child, Channel::from_fd(outer), egress, &run_dir)
        }
    }
}

/// The forked daemon: into its namespaces, wait for the way out, serve.
fn inside(mut opts: Options, channel: Channel, supervisor: Pid) -> anyhow::Result<()> {
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let said = |r: std::io::Result<()>| -> anyhow::Result<()> {
        if let Err(e) = r {
            let _ = channel.send(&e.to_string(), &[]);
            return Err(e.into());
        }
        Ok(())
    };
    said(userns::unshare_user_and_net())?;
    channel
        .send(&UNSHARED, &[])
        .context("cannot reach the rootless supervisor")?;
    // The supervisor maps our ids (with the user's subordinate ranges), or
    // leaves it to us (our own ids alone).
    match channel.recv::<String>()? {
        Some((word, _)) if word == MAPPED => {}
        Some((word, _)) if word == MAP_SELF => said(userns::map_self(uid, gid))?,
        _ => bail!("the rootless supervisor gave up before our ids were mapped"),
    }
    // Ends with the supervisor, cleanly, whichever way it goes. (Set after
    // the namespaces: gaining capabilities clears it.)
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    if nix::unistd::getppid() != supervisor {
        bail!("the rootless supervisor exited during start-up");
    }
    channel
        .send(&READY, &[])
        .context("cannot reach the rootless supervisor")?;
    match channel.recv::<String>()? {
        Some((word, _)) if word == GO => {}
        _ => bail!("the rootless supervisor gave up before the namespace had a way out"),
    }
    opts.placement = Placement::Rootless(HostSide::new(channel));
    let pid_file = opts.run_dir.join(PID_FILE);
    let served = super::server::run(opts);
    // The supervisor wrote it, and may be gone.
    crate::files::remove_left(&pid_file);
    // The egress tool joined our namespaces, which clears the parent-death
    // signal it was started with: were the supervisor killed, the tool
    // would outlive us. Our group is the supervisor's, the tool's and ours.
    // SAFETY: ignoring a signal.
    let _ = unsafe { signal::signal(Signal::SIGTERM, SigHandler::SigIgn) };
    let _ = signal::killpg(nix::unistd::getpgrp(), Signal::SIGTERM);
    served
}

fn supervise(daemon: Pid, channel: Channel, egress: Egress, run_dir: &Path) -> anyhow::Result<()> {
    DAEMON_PID.store(daemon.as_raw(), Ordering::SeqCst);
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: the handler only reads an atomic and calls kill.
        unsafe { signal::signal(sig, SigHandler::Handler(pass_on)) }?;
    }
    let log = run_dir.join("egress.log");
    let started = handshake(&channel, daemon).and_then(|()| start_egress(egress, daemon, &log));
    let mut tool = match started {
        Ok(tool) => tool,
        Err(e) => {
            let _ = signal::kill(daemon, Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(daemon, None);
            return Err(e);
        }
    };
    if let Err(e) = channel.send(&GO, &[]) {
        stop(&mut tool);
        let status = wait_daemon(daemon);
        bail!("the rootless daemon went away during start-up ({e}; status {status})");
    }
    // For entering the namespaces from outside (`nsenter -t PID -U -n`).
    let pid_file = run_dir.join(PID_FILE);
    if let Err(e) = std::fs::write(&pid_file, format!("{daemon}\n")) {
        warn!("cannot write {}: {e}", pid_file.display());
    }
    info!(
        pid = daemon.as_raw(),
        egress = egress.program(),
        "rootless daemon started in its own namespaces"
    );
    let requests = std::thread::spawn(move || serve_host_requests(&channel));
    let daemon_fd = pidfd(daemon.as_raw() as u32)?;
    let status = loop {
        let tool_fd = pidfd(tool.id())?;
        if wait_either(&daemon_fd, &tool_fd) {
            break wait_daemon(daemon);
        }
        // The way out died under the daemon: start it again.
        let status = tool.wait()?;
        warn!(egress = egress.program(), %status, log = %log.display(), "the egress tool exited: VMs have no way out until it is back; starting it again");
        std::thread::sleep(EGRESS_RESTART_PAUSE);
        if !egress::namespace_alive(daemon.as_raw() as u32) {
            break wait_daemon(daemon);
        }
        match start_egress(egress, daemon, &log) {
            Ok(again) => tool = again,
            Err(e) => {
                error!("{e:#}; stopping the rootless daemon");
                let _ = signal::kill(daemon, Signal::SIGTERM);
                break wait_daemon(daemon);
            }
        }
    };
    stop(&mut tool);
    let _ = requests.join();
    // A daemon that was killed could not remove these.
    for file in [SOCKET_NAME, PID_FILE, super::server::LOCK_FILE] {
        crate::files::remove_left(&run_dir.join(file));
    }
    match status {
        0 => Ok(()),
        code => bail!("the rootless daemon exited with status {code}"),
    }
}

/// The supervisor's side of the start-up, until the daemon is ready for
/// its way out.
fn handshake(channel: &Channel, daemon: Pid) -> anyhow::Result<()> {
    let next = || match channel.recv::<String>() {
        Ok(Some((word, _))) => Ok(word),
        Ok(None) | Err(_) => Err(anyhow::anyhow!(
            "the rootless daemon exited during start-up"
        )),
    };
    let word = next()?;
    if word != UNSHARED {
        bail!("{word}");
    }
    let (uid, gid) = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    let mapped = match userns::map_with_sub_ids(daemon.as_raw() as u32, uid, gid) {
        Ok(mapped) => mapped,
        Err(e) => {
            warn!("{e}: mapping only your own ids");
            false
        }
    };
    if mapped {
        info!("your subordinate ids (/etc/subuid, /etc/subgid) are mapped from 1 up");
    }
    channel.send(&if mapped { MAPPED } else { MAP_SELF }, &[])?;
    match next()? {
        word if word == READY => Ok(()),
        why => bail!("{why}"),
    }
}

/// The daemon's exit status, as a shell would give it.
fn wait_daemon(daemon: Pid) -> i32 {
    use nix::sys::wait::{WaitStatus, waitpid};
    loop {
        match waitpid(daemon, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 1,
        }
    }
}

/// Starts the egress tool on `daemon`'s namespaces and waits until the
/// namespace has its default route through it.
fn start_egress(egress: Egress, daemon: Pid, log: &Path) -> anyhow::Result<Child> {
    let argv = egress.command(daemon.as_raw() as u32, log);
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe. The tool ends with the supervisor.
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(io::Error::from));
    }
    let mut tool = cmd.spawn().with_context(|| {
        format!(
            "cannot start {} for the namespace's way out (install the passt package, or slirp4netns)",
            argv[0]
        )
    })?;
    let deadline = Instant::now() + EGRESS_START;
    while !egress::has_default_route(daemon.as_raw() as u32) {
        if let Some(status) = tool.try_wait()? {
            bail!(
                "{} exited with {status} before the namespace had a route out: {}",
                argv[0],
                tail(log)
            );
        }
        if Instant::now() > deadline {
            stop(&mut tool);
            bail!(
                "{} gave the namespace no route out within {}s: {}",
                argv[0],
                EGRESS_START.as_secs(),
                tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(tool)
}

/// The last lines of a log, for an error message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    if lines.is_empty() {
        return format!("(nothing in {})", log.display());
    }
    lines.into_iter().rev().collect::<Vec<_>>().join("; ")
}

fn stop(tool: &mut Child) {
    if let Ok(Some(_)) = tool.try_wait() {
        return;
    }
    let _ = signal::kill(Pid::from_raw(tool.id() as i32), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = tool.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = tool.kill();
    let _ = tool.wait();
}

/// A pidfd for `pid`: readable once it exits.
fn pidfd(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd was just returned to us and is ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits until the daemon (true) or the tool (false) exits; a signal on
/// the way has already been passed on to the daemon.
fn wait_either(daemon: &OwnedFd, tool: &OwnedFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [
            PollFd::new(daemon.as_fd(), PollFlags::POLLIN),
            PollFd::new(tool.as_fd(), PollFlags::POLLIN),
        ];
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            continue;
        }
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[0]) {
            return true;
        }
        if ready(&fds[1]) {
            return false;
        }
    }
}

/// Answers the daemon's requests until it closes its end.
fn serve_host_requests(channel: &Channel) {
    while let Ok(Some((request, _))) = channel.recv::<HostRequest>() {
        let HostRequest::Listen(forward) = request;
        let sent = match listen_on_host(&forward) {
            Ok(fd) => channel.send(&HostReply::Listening, &[fd.as_raw_fd()]),
            Err(message) => channel.send(&HostReply::Refused { message }, &[]),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// The host side of a forward, opened as the user in the host's network
/// namespace: the kernel decides what the user may bind.
fn listen_on_host(forward: &PortForward) -> Result<OwnedFd, String> {
    let port = forward.host_port;
    let addrs: Vec<SocketAddr> = match forward.host_addr {
        Some(addr) => vec![SocketAddr::new(addr, port)],
        // Both families where the host has IPv6, else IPv4 alone.
        None => vec![
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        ],
    };
    let mut last = None;
    for addr in &addrs {
        match bind_host(addr, forward.protocol) {
            Ok(fd) => return Ok(fd),
            Err(e) => last = Some((addr, e)),
        }
    }
    let (addr, e) = last.expect("at least one address");
    let spec = format!("{port}/{}", forward.protocol.as_str());
    Err(match e.raw_os_error() {
        Some(libc::EACCES) => {
            let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
                .map(|t| t.trim().to_string())
                .unwrap_or_else(|_| "1024".into());
            format!(
                "host port {spec} is privileged on this host (below net.ipv4.ip_unprivileged_port_start = {start}) and a rootless linnet publishes ports as you; choose a host port of {start} or more, or have root lower that sysctl"
            )
        }
        Some(libc::EADDRINUSE) => format!(
            "host port {spec} is already taken on {addr} by another program; choose another host port or stop that program"
        ),
        Some(libc::EADDRNOTAVAIL) => format!(
            "host address {} is not one of this host's; publish on one of its addresses, or on all (no address)",
            addr.ip()
        ),
        _ => format!("cannot listen on {addr} for host port {spec}: {e}"),
    })
}

fn bind_host(addr: &SocketAddr, protocol: Protocol) -> io::Result<OwnedFd> {
    use socket2::{Domain, Socket, Type};
    let kind = match protocol {
        Protocol::Tcp => Type::STREAM,
        Protocol::Udp => Type::DGRAM,
    };
    let sock = Socket::new(Domain::for_address(*addr), kind.cloexec(), None)?;
    if addr.is_ipv6() {
        // [::] takes IPv4 too.
        sock.set_only_v6(false)?;
    }
    if protocol == Protocol::Tcp {
        sock.set_reuse_address(true)?;
    }
    sock.bind(&(*addr).into())?;
    if protocol == Protocol::Tcp {
        sock.listen(128)?;
    }
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}
