//! The command line: one file per subcommand, each thin. Shared here: the
//! global options and reaching (or starting) the daemon.

mod ca;
mod connect;
pub mod connector;
mod daemon;
mod doctor;
mod events;
mod forward;
mod frr_config;
pub mod gate;
mod helper;
mod kept;
pub mod lifeline;
mod ls;
mod policy;
mod qemu;
pub mod relay;
mod run;
mod seccomp;
mod secret;
pub mod secrets_proxy;

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use crate::api::{
    AttachRequest, Channel, CloneOf, ErrorKind, InterfaceInfo, Request, Response, SOCKET_NAME,
};
use crate::config::{Config, DEFAULT_CONFIG_PATH};
use crate::datapath::relay::RelayError;
use crate::datapath::vnet::{self, ClientHeader};
use crate::datapath::{Counters, Datapath, RelayCounters};
use crate::forward::PortForward;
use crate::host::privileges;
use crate::policy::{ConnectRule, ListenRule, Policy, SecretRule};
use crate::rate::{Rate, RateLimits};
use crate::types::{InterfaceId, MacAddr};

/// linnet's own failures (as opposed to the command `linnet run` started),
/// following the convention of `docker run` and `podman run`.
pub const EXIT_LINNET_FAILED: u8 = 125;

/// What a client says when its connection to the daemon drops.
pub const DAEMON_GONE: &str = "the linnet daemon went away: this VM's interface is gone";

#[derive(Parser)]
#[command(
    name = "linnet",
    version,
    about = "Networks for virtual machines on Linux: NAT, host-only, DHCP, DNS, on the VMM's own datapath",
    long_about = "linnet gives virtual machines a network that the host and other VMs can reach, \
with internet through NAT, DHCP and DNS, without running the VM as root.\n\n\
Built-in networks (no config file needed):\n  \
shared  192.168.105.0/24, NAT to the host's default route, DHCP, DNS\n  \
host    192.168.106.0/24, host-only: VMs reach the host and each other\n\n\
Everyday use:\n  \
sudo linnet run -- qemu-system-x86_64 -m 512 -kernel vmlinuz ...\n\n\
The daemon is the only privileged process; `linnet run` as root starts one on demand."
)]
pub struct Cli {
    /// Runtime directory: the API socket and the daemon's lock
    /// [default: /run/linnet; rootless: $XDG_RUNTIME_DIR/linnet].
    #[arg(long, env = "LINNET_RUN_DIR", global = true)]
    pub run_dir: Option<PathBuf>,
    /// State directory: leases, kept across restarts [default:
    /// /var/lib/linnet; rootless: $XDG_STATE_HOME/linnet, or ~/.local/state/linnet].
    #[arg(long, env = "LINNET_STATE_DIR", global = true)]
    pub state_dir: Option<PathBuf>,
    /// Networks file [default: /etc/linnet/networks.yaml, if it exists;
    /// rootless: $XDG_CONFIG_HOME/linnet/networks.yaml, or ~/.config/linnet/networks.yaml]
    #[arg(long, env = "LINNET_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// Use your own rootless daemon (started on demand) rather than the
    /// system's. Without it, a user other than root gets the system's
    /// daemon when one runs, and their own otherwise.
    #[arg(long, env = "LINNET_ROOTLESS", global = true)]
    pub rootless: bool,
    /// Log filter, e.g. debug or linnet=trace [default: info for the daemon, warn otherwise]
    #[arg(long, env = "LINNET_LOG", global = true)]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: CommandArgs,
    /// Which daemon, where: decided once, after parsing.
    #[arg(skip)]
    place: Option<Place>,
}

/// The daemon a command works with, and where its files are.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    pub run_dir: PathBuf,
    pub state_dir: PathBuf,
    /// The networks file, and whether it was named (a missing default file
    /// means the built-in networks).
    pub config: (PathBuf, bool),
    pub rootless: bool,
}

impl Place {
    fn system(cli: &Cli) -> Place {
        Place {
            run_dir: cli.run_dir.clone().unwrap_or_else(|| SYSTEM_RUN_DIR.into()),
            state_dir: cli
                .state_dir
                .clone()
                .unwrap_or_else(|| SYSTEM_STATE_DIR.into()),
            config: match &cli.config {
                Some(p) => (p.clone(), true),
                None => (DEFAULT_CONFIG_PATH.into(), false),
            },
            rootless: false,
        }
    }

    /// A user's own daemon's places, from the XDG base directories (`env`
    /// looks a variable up), each overridden by its option.
    fn rootless(cli: &Cli, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Place> {
        let xdg = |var: &str, fallback: &str| -> Option<PathBuf> {
            env(var)
                .filter(|v| v.starts_with('/'))
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| Path::new(&h).join(fallback)))
        };
        let run_dir = match (
            &cli.run_dir,
            env("XDG_RUNTIME_DIR").filter(|v| v.starts_with('/')),
        ) {
            (Some(dir), _) => dir.clone(),
            (None, Some(runtime)) => Path::new(&runtime).join("linnet"),
            (None, None) => bail!(
                "XDG_RUNTIME_DIR is not set, and a rootless linnet keeps its socket there: log in through a session that sets it (systemd-logind does), or set it to a directory of yours with mode 0700, or give --run-dir"
            ),
        };
        let state_dir = match &cli.state_dir {
            Some(dir) => dir.clone(),
            None => xdg("XDG_STATE_HOME", ".local/state")
                .context("neither XDG_STATE_HOME nor HOME is set: give --state-dir for the leases")?
                .join("linnet"),
        };
        let config = match &cli.config {
            Some(p) => (p.clone(), true),
            None => match xdg("XDG_CONFIG_HOME", ".config") {
                Some(dir) => (dir.join("linnet").join("networks.yaml"), false),
                // No file to look for: the built-in networks.
                None => (PathBuf::new(), false),
            },
        };
        Ok(Place {
            run_dir,
            state_dir,
            config,
            rootless: true,
        })
    }
}

const SYSTEM_RUN_DIR: &str = "/run/linnet";
const SYSTEM_STATE_DIR: &str = "/var/lib/linnet";

#[derive(Subcommand)]
pub enum CommandArgs {
    /// Run the daemon that owns the networks (as root).
    Daemon(daemon::DaemonArgs),
    /// Attach an interface and run a VMM (or any command) with it.
    Run(run::RunArgs),
    /// Attach an interface and relay its frames to a unix socket (for VMMs that cannot take a TAP).
    Helper(helper::HelperArgs),
    /// Run a command with a connection to a network's socket as fd 3
    /// (socket_vmnet_client's way: QEMU -netdev socket,fd=3).
    Connect(connect::ConnectArgs),
    /// Attach an interface that outlives this command, for a VMM started on its own
    /// that opens its TAP by name (Firecracker, Cloud Hypervisor, crosvm).
    Attach(kept::AttachCmd),
    /// Detach an interface that `linnet attach` made (its owner or root).
    Detach(kept::DetachCmd),
    /// List networks and attached interfaces.
    Ls(ls::LsArgs),
    /// Publish ports of attached VMs on the host, at runtime.
    #[command(subcommand)]
    Forward(forward::ForwardCommand),
    /// Show or change what an attached VM may connect to and be connected on.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Check what the host's other firewalls (Docker, firewalld, iptables,
    /// nft tables) and routes do to each network's traffic, and how to fix
    /// what blocks it; for a network across hosts, its BGP sessions, its
    /// VNI in zebra and its remote MACs (FRR asked at frr.vty_socket).
    /// Exits 1 when something is blocked or missing.
    Doctor(doctor::DoctorArgs),
    /// Print FRR's configuration (zebra and bgpd) for this host's networks
    /// across hosts (those with an evpn: section).
    FrrConfig(frr_config::FrrConfigArgs),
    /// Keep secrets (API keys, tokens) that VMs use without holding them:
    /// set (from standard input), remove, list (never values).
    #[command(subcommand)]
    Secret(secret::SecretCommand),
    /// Print a network's secrets CA certificate (PEM), made the first
    /// time: install it in a guest's trust store, and linnet can put
    /// secrets into the guest's HTTPS requests (docs/secrets.md).
    Ca(ca::CaArgs),
    /// Follow what happens: one JSON line per attach, detach, lease,
    /// policy change, forward, cut-off, adoption; until the daemon stops.
    Events(events::EventsArgs),
}

/// `linnet`'s main.
/// The command line as clap defines it.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

pub fn main() -> ExitCode {
    let args = match Cli::try_parse() {
        Ok(args) => args,
        // Usage errors exit 125 too, so they are never mistaken for CMD's status.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                EXIT_LINNET_FAILED
            } else {
                0
            });
        }
    };
    init_logging(&args);
    let mut args = args;
    if let Err(e) = args.find_place() {
        eprintln!("linnet: {e:#}");
        return ExitCode::from(EXIT_LINNET_FAILED);
    }
    match dispatch(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("linnet: {e:#}");
            ExitCode::from(EXIT_LINNET_FAILED)
        }
    }
}

pub fn init_logging(cli: &Cli) {
    let default = if matches!(cli.command, CommandArgs::Daemon(_)) {
        "info"
    } else {
        "warn"
    };
    log_to_stderr(cli.log.as_deref(), default);
}

/// Logs to stderr what `filter` lets through (`default` when there is none
/// or it is invalid).
pub fn log_to_stderr(filter: Option<&str>, default: &str) {
    let filter = filter.unwrap_or(default);
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| {
        eprintln!("linnet: ignoring invalid --log filter \"{filter}\"");
        tracing_subscriber::EnvFilter::new(default)
    });
    if crate::host::systemd::stderr_is_journal() {
        // The journal stamps the time itself, and takes the level from a
        // `<N>` prefix: no time, no colours, no level word.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(io::stderr)
            // A log nobody reads any more (a closed pipe) must not end
            // the process: tracing would say so with eprintln!, which
            // panics then.
            .log_internal_errors(false)
            .event_format(JournalLine(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_level(false)
                    .with_target(false)
                    .with_ansi(false),
            ))
            .init();
        return;
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .log_internal_errors(false)
        // Colours only for a person at a terminal, not in log files.
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .with_target(false)
        .init();
}

/// A log line for the journal: its priority as a `<N>` prefix
/// (sd-daemon(3)), then the line as `F` formats it.
struct JournalLine<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for JournalLine<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let priority = crate::host::systemd::priority(event.metadata().level());
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}

pub fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    match &cli.command {
        CommandArgs::Daemon(args) => daemon::main(&cli, args).map(|()| 0),
        CommandArgs::Run(args) => run::main(&cli, args),
        CommandArgs::Helper(args) => helper::main(&cli, args).map(|()| 0),
        CommandArgs::Connect(args) => connect::main(&cli, args).map(|()| 0),
        CommandArgs::Attach(args) => kept::attach(&cli, args).map(|()| 0),
        CommandArgs::Detach(args) => kept::detach(&cli, args).map(|()| 0),
        CommandArgs::Ls(args) => ls::main(&cli, args).map(|()| 0),
        CommandArgs::Forward(cmd) => forward::main(&cli, cmd).map(|()| 0),
        CommandArgs::Policy(cmd) => policy::main(&cli, cmd).map(|()| 0),
        CommandArgs::Doctor(args) => doctor::main(&cli, args),
        CommandArgs::FrrConfig(args) => frr_config::main(&cli, args).map(|()| 0),
        CommandArgs::Events(args) => events::main(&cli, args).map(|()| 0),
        CommandArgs::Secret(cmd) => secret::main(&cli, cmd).map(|()| 0),
        CommandArgs::Ca(args) => ca::main(&cli, args).map(|()| 0),
    }
}

impl Cli {
    /// Decides which daemon this command works with: `linnet daemon` is
    /// the system's unless `--rootless`; a client is root's, or with
    /// `--rootless` or a `--run-dir` as told; a user other than root gets
    /// the system's daemon when its socket answers, and their own
    /// otherwise.
    pub fn find_place(&mut self) -> anyhow::Result<()> {
        let env = |var: &str| std::env::var(var).ok();
        let root = nix::unistd::geteuid().is_root();
        let rootless = match &self.command {
            // The system's networks file, unless told otherwise.
            CommandArgs::Daemon(_) | CommandArgs::FrrConfig(_) => self.rootless,
            _ if self.rootless => true,
            _ if root || self.run_dir.is_some() => false,
            _ => Channel::connect(&Path::new(SYSTEM_RUN_DIR).join(SOCKET_NAME)).is_err(),
        };
        if rootless && root {
            bail!(
                "--rootless is for users without root; root has the system daemon (`linnet daemon`)"
            );
        }
        self.place = Some(if rootless {
            Place::rootless(self, env)?
        } else {
            Place::system(self)
        });
        Ok(())
    }

    pub fn place(&self) -> &Place {
        self.place
            .as_ref()
            .expect("find_place runs before any command")
    }

    pub fn socket_path(&self) -> PathBuf {
        self.place().run_dir.join(SOCKET_NAME)
    }

    /// What re-claims an interface of the system daemon after it
    /// restarted, if it can be: a rootless daemon's interfaces go with it.
    pub fn reclaim_token(&self, attached: &Attached) -> Option<String> {
        let token = attached.reclaim_token.clone()?;
        (!self.place().rootless).then_some(token)
    }

    /// The configuration: the file given, or the default file if it exists,
    /// or the built-in networks.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        let (path, explicit) = &self.place().config;
        if path.as_os_str().is_empty() {
            return Ok(Config::builtin());
        }
        Ok(Config::load(path, *explicit)?)
    }

    pub fn connect(&self) -> anyhow::Result<Channel> {
        let path = self.socket_path();
        Channel::connect(&path).map_err(|e| unreachable_daemon(&path, &e, self.place().rootless))
    }

    /// Connects, starting a daemon first when none runs and we are root
    /// (the system's) or rootless (the user's own).
    /// A daemon started here comes back too, for the caller to reap.
    pub fn connect_or_start(&self) -> anyhow::Result<(Channel, Option<Child>)> {
        let path = self.socket_path();
        match Channel::connect(&path) {
            Ok(chan) => return Ok((chan, None)),
            Err(e)
                if !is_absent(&e)
                    || !(self.place().rootless || nix::unistd::geteuid().is_root()) =>
            {
                return Err(unreachable_daemon(&path, &e, self.place().rootless));
            }
            Err(_) => {}
        }
        let daemon = self.start_daemon()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Channel::connect(&path) {
                Ok(chan) => return Ok((chan, Some(daemon))),
                Err(e) if Instant::now() > deadline => {
                    bail!(
                        "started a linnet daemon but cannot reach it at {}: {e}; see {}",
                        path.display(),
                        self.place().run_dir.join("daemon.log").display()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Connects as the user the VMM will run as. Root through sudo (or
    /// with --user) first makes sure a daemon runs, then becomes that user
    /// — no capabilities, no_new_privs — and only then connects: the daemon
    /// sees, checks and records the real user, and gives the TAP to it.
    pub fn connect_as_user(&self, user: Option<&str>) -> anyhow::Result<(Channel, Option<Child>)> {
        let Some(who) = privileges::target(user)? else {
            return self.connect_or_start();
        };
        let (probe, daemon) = self.connect_or_start()?;
        drop(probe);
        privileges::become_user(Some(who))?;
        tracing::info!(uid = who.uid, gid = who.gid, "dropped root privileges");
        let channel = self.connect()?;
        Ok((channel, daemon))
    }

    /// Starts `linnet daemon` detached (own session, logs to the run dir);
    /// it exits by itself once idle.
    fn start_daemon(&self) -> anyhow::Result<Child> {
        let place = self.place();
        std::fs::create_dir_all(&place.run_dir)
            .with_context(|| format!("cannot create {}", place.run_dir.display()))?;
        let log_path = place.run_dir.join("daemon.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let mut cmd =
            Command::new(std::env::current_exe().context("cannot find the linnet executable")?);
        cmd.arg("--run-dir")
            .arg(&place.run_dir)
            .arg("--state-dir")
            .arg(&place.state_dir);
        if let (config, true) = &place.config {
            cmd.arg("--config").arg(config);
        }
        if let Some(log) = &self.log {
            cmd.arg("--log").arg(log);
        }
        cmd.args(["daemon", "--idle-exit", "10"]);
        if place.rootless {
            cmd.arg("--rootless");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(io::Error::from));
        }
        cmd.spawn().context("cannot start the linnet daemon")
    }
}

/// What identifies the interface to attach; shared by `run` and `helper`.
#[derive(Args)]
pub struct AttachArgs {
    /// Network to attach to.
    #[arg(long, short, default_value = crate::config::DEFAULT_NETWORK)]
    pub network: String,
    /// Interface id (a UUID); the same id always gets the same MAC and IP
    /// (a clone's are its guest's). Default: a new one.
    #[arg(long, value_name = "UUID")]
    pub interface_id: Option<InterfaceId>,
    /// MAC address for the VM. Default: derived from the interface id.
    #[arg(long)]
    pub mac: Option<MacAddr>,
    /// The VM's name: answered by the network's DNS as NAME.<network>.linnet.
    #[arg(long)]
    pub name: Option<String>,
    /// Publish a port of the VM on the host for as long as it is attached
    /// (repeatable): connections to HOST_PORT on the host's addresses (or
    /// only HOST_ADDR) go to GUEST_PORT of the VM, e.g. 8080:80,
    /// 127.0.0.1:2222:22, [2001:db8::1]:8443:443, 5353:53/udp.
    #[arg(
        long,
        short = 'p',
        value_name = "[HOST_ADDR:]HOST_PORT:GUEST_PORT[/tcp|/udp]"
    )]
    pub publish: Vec<PortForward>,
    /// Let the VM open connections only to these destinations (repeatable;
    /// replies pass, and DHCP and DNS to its gateway always do): e.g.
    /// 198.51.100.1:8080/tcp, 10.0.0.0/8, [2001:db8::/32]:443, or names:
    /// api.example.com:443, "*.cdn.example.net:443" (any name one label or
    /// more below). With a name, the VM reaches what linnet's DNS answered
    /// it for an allowed name, for the answer's TTL (at least the network's dns.learned_ttl.floor, a minute by default), and
    /// no other resolver: linnet's DNS refuses every other name. A name
    /// rule is TCP's (`/udp` for UDP, not checked for the name), and each
    /// connection must show that name (TLS server name, HTTP Host) at an
    /// address learned for it, or it is reset; `/tcp/any` lets its
    /// connections show none (SSH, databases). With addresses only, the
    /// gateway's DNS resolves any name, a way out the list does not close.
    /// Connections opened before a `policy set` carry on; new ones meet
    /// the new policy.
    #[arg(long, value_name = "CIDR|NAME[:PORT[-PORT]][/tcp[/any]|/udp]")]
    pub allow_connect: Vec<ConnectRule>,
    /// Accept connections to the VM only on these ports (repeatable), from
    /// the host, other VMs and port forwards, and broadcast and multicast
    /// only to them (ARP, neighbour discovery, DHCP replies and pings still
    /// arrive): e.g. 8000/tcp, 5000-5010. With --allow-connect and none of
    /// these, no other VM connects to it (the host and its published
    /// ports do), and its broadcasts reach no other VM.
    #[arg(long, value_name = "PORT[-PORT][/tcp|/udp]")]
    pub allow_listen: Vec<ListenRule>,
    /// Let linnet put your secret NAME (`linnet secret set NAME`) into the
    /// VM's HTTPS requests to HOST (a name, or "*.SUFFIX"), port 443, where
    /// a header says {{secret:NAME}}: the VM uses it and never holds it
    /// (repeatable; docs/secrets.md). HOST must be one --allow-connect lets
    /// the VM reach on 443/tcp.
    #[arg(long = "secret", value_name = "NAME@HOST")]
    pub secrets: Vec<SecretRule>,
    #[command(flatten)]
    pub rate: RateArgs,
    /// Queues of the VM's TAP (virtio-net multi-queue, for a VM with more
    /// than one vCPU): with --datapath tap the VMM gets an fd per queue
    /// ({fds}, LINNET_FDS: colon-separated, as QEMU's -netdev tap,fds=
    /// takes them; linnet's own QEMU NIC gets mq=on), with tap-name the
    /// TAP is made multi-queue for the VMM to open N queues by name
    /// (Cloud Hypervisor num_queues=2N). The relayed datapaths have one.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(crate::host::tap::MAX_QUEUES)))]
    pub queues: u16,
    /// As root: attach for USER, and run the VMM or relay as USER, with no
    /// capabilities (default under sudo: the invoking user, SUDO_UID/SUDO_GID).
    #[arg(long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,
    /// Attach a clone of the VM called NAME on the network (attached, or
    /// its lease still held): for a VM restored from NAME's snapshot, which
    /// keeps NAME's MAC and address. Each clone is reached at a unique
    /// address of the network's clone_subnet (`linnet ls`, its --name in
    /// DNS, its --publish); any number run at once. See docs/clones.md.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["like", "mac"])]
    pub clone_of: Option<String>,
    /// Attach a clone of the VM whose interface JSON (what `run --json` or
    /// `attach` printed when it was snapshotted) is in FILE: its MAC,
    /// address and TAP name.
    #[arg(long, value_name = "FILE", conflicts_with = "mac")]
    pub like: Option<PathBuf>,
}

impl AttachArgs {
    /// The guest a clone is of, if this attach is a clone's.
    fn clone_of(&self) -> anyhow::Result<Option<CloneOf>> {
        if let Some(name) = &self.clone_of {
            return Ok(Some(CloneOf::Name(name.clone())));
        }
        let Some(path) = &self.like else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --like {}", path.display()))?;
        let recorded: RecordedInterface = serde_json::from_str(&text).with_context(|| {
            format!(
                "--like {}: not an interface JSON (as `linnet run --json` prints)",
                path.display()
            )
        })?;
        if recorded.network != self.network {
            bail!(
                "--like {}: the VM was on network \"{}\", where its clones belong: add --network {}",
                path.display(),
                recorded.network,
                recorded.network
            );
        }
        let ip_address = recorded.ip_address.with_context(|| {
            format!(
                "--like {}: the interface has no ip_address (its network had no DHCP): a clone needs the guest's address",
                path.display()
            )
        })?;
        Ok(Some(CloneOf::Guest {
            mac_address: recorded.mac_address,
            ip_address,
            tap: recorded.tap,
        }))
    }
}

/// What `--like` reads of an interface JSON.
#[derive(serde::Deserialize)]
struct RecordedInterface {
    network: String,
    mac_address: MacAddr,
    ip_address: Option<std::net::Ipv4Addr>,
    tap: Option<String>,
}

/// Names an attached interface; shared by `forward` and `policy`.
#[derive(Args)]
pub struct InterfaceArgs {
    /// The VM's network.
    #[arg(long, short, default_value = crate::config::DEFAULT_NETWORK)]
    pub network: String,
    /// The VM's interface id.
    #[arg(
        long,
        value_name = "UUID",
        required_unless_present = "name",
        conflicts_with = "name"
    )]
    pub interface_id: Option<InterfaceId>,
    /// The VM's name (given with `run --name`).
    #[arg(long)]
    pub name: Option<String>,
}

impl InterfaceArgs {
    pub fn interface(&self) -> crate::api::InterfaceRef {
        crate::api::InterfaceRef {
            network: self.network.clone(),
            interface_id: self.interface_id,
            name: self.name.clone(),
        }
    }
}

/// An attached interface as its client holds it.
/// `--rate-limit` and its one-way forms, on run, attach, helper and
/// policy set.
#[derive(Args, Clone, Default)]
pub struct RateArgs {
    /// Limit what the VM sends and what it receives, each way, to RATE in
    /// bits per second (bit, kbit, mbit, gbit), with an optional BURST in
    /// bytes (b, kb, mb, kib, mib; default 20 ms of the rate, at least
    /// 128kib) that may pass above it: e.g. 100mbit or 20mbit/512kib. The
    /// kernel drops what exceeds it; TCP slows to it. An attach without
    /// it gets the network's rate_limit, if it has one; `policy set`
    /// replaces both ways (a way not given is then unlimited).
    #[arg(long, value_name = "RATE[/BURST]")]
    pub rate_limit: Option<Rate>,
    /// Limit only what the VM receives (over --rate-limit).
    #[arg(long, value_name = "RATE[/BURST]")]
    pub rate_limit_in: Option<Rate>,
    /// Limit only what the VM sends (over --rate-limit).
    #[arg(long, value_name = "RATE[/BURST]")]
    pub rate_limit_out: Option<Rate>,
}

impl RateArgs {
    pub fn limits(&self) -> RateLimits {
        RateLimits::from_options(self.rate_limit, self.rate_limit_in, self.rate_limit_out)
    }
}

pub struct Attached {
    /// What the VMM needs to know.
    pub info: InterfaceInfo,
    /// The TAP's fds, one per queue; none with tap-name, where the VMM
    /// opens it by name.
    pub taps: Vec<OwnedFd>,
    /// What re-claims it after a daemon restart (none when kept past the
    /// connection, or a clone).
    pub reclaim_token: Option<String>,
}

/// Attaches an interface as `args` say; `keep`: past this connection
/// (`linnet attach`).
pub fn attach(
    channel: &Channel,
    args: &AttachArgs,
    datapath: Datapath,
    keep: bool,
) -> anyhow::Result<Attached> {
    if let Some(name) = &args.name {
        crate::types::validate_hostname(name)?;
    }
    let request = AttachRequest {
        network: Some(args.network.clone()),
        interface_id: args.interface_id,
        mac: args.mac,
        name: args.name.clone(),
        datapath: Some(datapath),
        publish: args.publish.clone(),
        policy: (!args.allow_connect.is_empty()
            || !args.allow_listen.is_empty()
            || !args.secrets.is_empty()
            || !args.rate.limits().is_none())
        .then(|| Policy {
            egress: args.allow_connect.clone(),
            ingress: args.allow_listen.clone(),
            rate_limit: args.rate.limits(),
            secrets: args.secrets.clone(),
            network_secrets: Vec::new(),
        }),
        keep,
        clone_of: args.clone_of()?,
        queues: (args.queues != 1).then_some(args.queues),
    };
    let (response, fds) = channel.call(&Request::Attach(request))?;
    let (info, reclaim_token) = match response {
        Response::Attached {
            interface,
            reclaim_token,
        } => (*interface, reclaim_token),
        Response::Error {
            kind: ErrorKind::NotAllowed,
            message,
        } if nix::unistd::getuid().as_raw() != 0 && std::env::var_os("SUDO_UID").is_some() => {
            bail!(
                "{message} (under sudo, linnet attaches and runs the VMM as the user who ran sudo; `--user root` keeps root)"
            )
        }
        Response::Error { message, .. } => bail!(message),
        other => bail!("unexpected reply from the daemon: {other:?}"),
    };
    for w in &info.warnings {
        eprintln!("linnet: warning: network {}: {w}", info.network);
    }
    let expected = if datapath == Datapath::TapName {
        0
    } else {
        usize::from(info.queues)
    };
    if fds.len() != expected {
        bail!(
            "the daemon sent {} TAP file descriptors, not {expected}",
            fds.len()
        );
    }
    Ok(Attached {
        info,
        taps: fds,
        reclaim_token,
    })
}

fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED)
    )
}

/// A rootless daemon's user and network namespaces, opened to be entered
/// by a VMM that opens its TAP by name.
pub struct DaemonNamespaces {
    user: OwnedFd,
    net: OwnedFd,
}

impl DaemonNamespaces {
    /// Joins them (the user namespace first: it gives the right to join
    /// the other), then drops every capability that gave, for good:
    /// async-signal-safe, for a child between fork and exec.
    pub fn enter(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        for (fd, kind) in [
            (&self.user, libc::CLONE_NEWUSER),
            (&self.net, libc::CLONE_NEWNET),
        ] {
            // SAFETY: setns on a namespace fd we own.
            if unsafe { libc::setns(fd.as_raw_fd(), kind) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        privileges::clear_capabilities()
    }
}

/// The namespaces of the rootless daemon `cli` works with.
pub fn rootless_namespaces(cli: &Cli) -> anyhow::Result<DaemonNamespaces> {
    let pid_file = cli.place().run_dir.join(crate::daemon::rootless::PID_FILE);
    let pid = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .with_context(|| {
            format!(
                "cannot read the rootless daemon's pid from {}",
                pid_file.display()
            )
        })?;
    let open = |kind: &str| -> anyhow::Result<OwnedFd> {
        let path = format!("/proc/{pid}/ns/{kind}");
        Ok(std::fs::File::open(&path)
            .with_context(|| format!("cannot open {path} (is the rootless daemon running?)"))?
            .into())
    };
    Ok(DaemonNamespaces {
        user: open("user")?,
        net: open("net")?,
    })
}

fn unreachable_daemon(path: &Path, e: &io::Error, rootless: bool) -> anyhow::Error {
    let fix = if e.kind() == io::ErrorKind::PermissionDenied {
        "the socket is not yours to use (another user's, or the system daemon's that your user may not reach)"
    } else if !rootless {
        "start it with `sudo linnet daemon` (as root, `linnet run` starts one itself), or use a rootless daemon of your own (`linnet run --rootless`)"
    } else {
        "`linnet run` starts a rootless daemon by itself, or start one with `linnet daemon --rootless`"
    };
    anyhow::anyhow!(
        "cannot reach the linnet daemon at {}: {e}; {fix}",
        path.display()
    )
}

// ---- relayed datapaths, for `run` and `helper` -----------------------------------

/// The virtio-net header a relay's client speaks.
#[derive(Args)]
pub struct VnetArgs {
    /// Put a virtio-net header in front of each frame, so checksum and segmentation
    /// offloads pass and frames up to 64 KiB cross (for clients that support it,
    /// e.g. krunkit offloading=on).
    #[arg(long)]
    pub vnet_hdr: bool,
    /// Size of that header: 12 (virtio 1.x) or 10 (legacy virtio-net).
    #[arg(long, value_name = "BYTES", default_value_t = vnet::VIRTIO1_LEN, requires = "vnet_hdr")]
    pub vnet_hdr_size: usize,
}

impl VnetArgs {
    pub fn header(&self) -> anyhow::Result<ClientHeader> {
        if !self.vnet_hdr {
            return Ok(ClientHeader::None);
        }
        ClientHeader::parse(self.vnet_hdr_size).map_err(|e| anyhow::anyhow!("--vnet-hdr-size: {e}"))
    }
}

/// Runs the relay on its own thread; failures are logged there too.
pub fn spawn_relay(
    relay: impl FnOnce() -> Result<(), RelayError> + Send + 'static,
) -> JoinHandle<Result<(), RelayError>> {
    std::thread::Builder::new()
        .name("relay".into())
        .spawn(move || {
            let result = relay();
            if let Err(e) = &result {
                tracing::error!("relay stopped: {e}");
            }
            result
        })
        .expect("can start a thread")
}

/// Sends the relay's counters to the daemon when they changed. An error
/// means the daemon is gone, and with it the interface.
pub fn report(
    channel: &Channel,
    interface_id: InterfaceId,
    counters: &Counters,
    last: &mut RelayCounters,
) -> anyhow::Result<()> {
    let now = counters.snapshot();
    if now == *last {
        return Ok(());
    }
    match channel.call(&Request::Counters {
        interface_id,
        counters: now,
    }) {
        Ok((Response::Ok, _)) => {
            *last = now;
            Ok(())
        }
        Ok((Response::Error { message, .. }, _)) => bail!("the daemon refused counters: {message}"),
        Ok((other, _)) => bail!("unexpected reply from the daemon: {other:?}"),
        Err(e) => Err(anyhow::anyhow!("{DAEMON_GONE} ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootless_place(args: &[&str], vars: &[(&str, &str)]) -> anyhow::Result<Place> {
        let mut argv = vec!["linnet"];
        argv.extend_from_slice(args);
        argv.push("ls");
        let cli = Cli::try_parse_from(argv).unwrap();
        let env = |var: &str| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        };
        Place::rootless(&cli, env)
    }

    #[test]
    fn a_rootless_daemon_lives_in_the_users_xdg_directories() {
        let home = [("HOME", "/home/ann"), ("XDG_RUNTIME_DIR", "/run/user/1000")];
        let p = rootless_place(&[], &home).unwrap();
        assert_eq!(p.run_dir, Path::new("/run/user/1000/linnet"));
        assert_eq!(p.state_dir, Path::new("/home/ann/.local/state/linnet"));
        assert_eq!(
            p.config,
            (
                PathBuf::from("/home/ann/.config/linnet/networks.yaml"),
                false
            )
        );
        let xdg = [
            ("HOME", "/home/ann"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ("XDG_STATE_HOME", "/data/state"),
            ("XDG_CONFIG_HOME", "relative/is/ignored"),
        ];
        let p = rootless_place(&[], &xdg).unwrap();
        assert_eq!(p.state_dir, Path::new("/data/state/linnet"));
        assert_eq!(
            p.config.0,
            Path::new("/home/ann/.config/linnet/networks.yaml")
        );
        // Options win over the environment.
        let p = rootless_place(&["--run-dir", "/tmp/r", "--config", "/tmp/n.yaml"], &home).unwrap();
        assert_eq!(p.run_dir, Path::new("/tmp/r"));
        assert_eq!(p.config, (PathBuf::from("/tmp/n.yaml"), true));
    }

    #[test]
    fn a_rootless_daemon_without_a_runtime_dir_says_how_to_get_one() {
        let e = rootless_place(&[], &[("HOME", "/home/ann")]).unwrap_err();
        assert!(e.to_string().contains("XDG_RUNTIME_DIR is not set"), "{e}");
        let e = rootless_place(&[], &[("XDG_RUNTIME_DIR", "/run/user/1000")]).unwrap_err();
        assert!(e.to_string().contains("give --state-dir"), "{e}");
    }
}
