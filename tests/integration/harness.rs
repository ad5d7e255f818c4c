//! The integration harness: throwaway network namespaces and the processes in
//! them, all removed on Drop even when a test fails.
//!
//! A `World` is a "host" namespace where the daemon runs and an "upstream"
//! namespace behind a veth that plays the internet (a web server and a DNS
//! server that knows `web.upstream.test`). A `Guest` is a namespace that
//! plays a VM: `linnet run -- linnet-standin` attaches it through the real
//! TAP datapath, and real clients (udhcpc, dhclient, ping, curl, nslookup)
//! run inside it.
//!
//! Everything runs inside `scripts/sandbox` (its own network, mount and PID
//! namespaces), so even a bug here cannot touch the machine's network.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const UPSTREAM_IP: &str = "203.0.113.254";
pub const UPSTREAM_HOST_SIDE: &str = "203.0.113.1";
/// The uplink's IPv6 (documentation prefix): upstream ::fe, host ::1.
pub const UPSTREAM_IP6: &str = "2001:db8:113::fe";
pub const UPSTREAM_HOST_SIDE6: &str = "2001:db8:113::1";
pub const UPSTREAM_NAME: &str = "web.upstream.test";
pub const UPSTREAM_PAGE: &str = "hello from upstream";
/// Names the upstream's DNS answers beside UPSTREAM_NAME, with a TTL of
/// 3 s, on addresses a test puts on the upstream when it needs them.
pub const TEST_NAMES: [(&str, &str); 7] = [
    ("allowed.test", "198.51.100.1"),
    ("a.svc.test", "198.51.100.2"),
    ("other.test", "198.51.100.4"),
    ("edge.cdn.test", "198.51.100.5"),
    // Two names on one address, and a third elsewhere (secret_proxy.rs).
    ("api.secret.test", "198.51.100.6"),
    ("other.secret.test", "198.51.100.6"),
    ("forged.secret.test", "198.51.100.7"),
];
/// The IPv6 address the upstream's DNS gives the first of TEST_NAMES too.
pub const TEST_NAME6: &str = "2001:db8:100::1";
/// CNAMEs the upstream's DNS answers: www.alias.test leads to
/// edge.cdn.test, sneaky.test to allowed.test.
pub const TEST_CNAMES: [(&str, &str); 2] = [
    ("www.alias.test", "edge.cdn.test"),
    ("sneaky.test", "allowed.test"),
];

/// Run a wrapped command as nobody (see `World::linnet_wrapped`).
pub const AS_NOBODY: &[&str] = &[
    "setpriv",
    "--reuid",
    "65534",
    "--regid",
    "65534",
    "--clear-groups",
];

/// Run a wrapped command as uid 4242, a user no network allows and who
/// owns nothing.
pub const AS_4242: &[&str] = &[
    "setpriv",
    "--reuid",
    "4242",
    "--regid",
    "4242",
    "--clear-groups",
];

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A name unique within this test run, for namespaces and VMs.
pub fn unique(role: &str) -> String {
    format!("{role}-{}", COUNTER.fetch_add(1, Ordering::SeqCst))
}

pub fn linnet_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_linnet"))
}

pub fn standin_bin() -> PathBuf {
    let path = linnet_bin().with_file_name("linnet-standin");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build --workspace`",
        path.display()
    );
    path
}

pub fn repo_file(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .display()
        .to_string()
}

/// Refuses to run outside scripts/sandbox: these tests create bridges, rules
/// and sysctls, which must never land in the machine's own namespace.
fn assert_sandboxed() {
    assert_eq!(
        std::env::var("LINNET_SANDBOX").as_deref(),
        Ok("1"),
        "integration tests change network state: run them with `make test` (scripts/sandbox), never directly"
    );
    // A guest's DHCP hook writes the resolv.conf it sees: the sandbox's
    // own copy, never the machine's.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.split(' ').nth(4) == Some("/etc/resolv.conf")),
        "/etc/resolv.conf is the machine's here: run the tests in scripts/sandbox, which mounts a copy over it"
    );
    assert_others_reach(&linnet_bin());
}

/// Some scenarios run linnet as other users (a rootless daemon, a network
/// socket's relay, a VMM without privileges): every directory on the way
/// to the binaries must let others through, as a checkout under /root
/// (mode 0700) does not.
fn assert_others_reach(bin: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for dir in bin.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        assert!(
            meta.permissions().mode() & 0o001 != 0,
            "{} is closed to other users, so tests that run linnet as another user cannot reach {}: clone the repository where others may pass (e.g. /srv or /tmp), or chmod o+x {}",
            dir.display(),
            bin.display(),
            dir.display()
        );
    }
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn must(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a linnet command that must fail as linnet itself (exit 125, not
/// the VMM's status); returns its one-line message.
pub fn failure(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(!out.status.success(), "{cmd:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(
        out.status.code(),
        Some(125),
        "linnet's own failures exit 125: {err}"
    );
    err
}

pub fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A named network namespace (`ip netns`), deleted with everything in it on Drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(role: &str) -> Netns {
        assert_sandboxed();
        let name = unique(role);
        must(Command::new("ip").args(["netns", "add", &name]));
        std::fs::create_dir_all(format!("/etc/netns/{name}")).unwrap();
        std::fs::write(format!("/etc/netns/{name}/resolv.conf"), "").unwrap();
        let ns = Netns { name };
        must(&mut ns.cmd(&["ip", "link", "set", "lo", "up"]));
        ns
    }

    /// The network namespace of process `pid` (one an unprivileged
    /// process made), named so that `ip netns exec` enters it.
    pub fn adopt(role: &str, pid: u32) -> Netns {
        assert_sandboxed();
        let name = unique(role);
        let path = format!("/run/netns/{name}");
        std::fs::write(&path, "").unwrap();
        must(Command::new("mount").args(["--bind", &format!("/proc/{pid}/ns/net"), &path]));
        std::fs::create_dir_all(format!("/etc/netns/{name}")).unwrap();
        std::fs::write(format!("/etc/netns/{name}/resolv.conf"), "").unwrap();
        let ns = Netns { name };
        must(&mut ns.cmd(&["ip", "link", "set", "lo", "up"]));
        ns
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// A command run inside the namespace (with its /etc/netns files).
    pub fn cmd(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(argv);
        c
    }

    /// One echo request from here to `target` (2 s): whether it answered.
    pub fn ping(&self, target: &str) -> bool {
        run(&mut self.cmd(&["busybox", "ping", "-c", "1", "-W", "2", target]))
            .status
            .success()
    }

    pub fn set_resolv_conf(&self, text: &str) {
        std::fs::write(format!("/etc/netns/{}/resolv.conf", self.name), text).unwrap();
    }

    pub fn links(&self) -> Vec<String> {
        must(&mut self.cmd(&["ip", "-o", "link", "show"]))
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap().to_string())
            .collect()
    }

    /// The VMs' TAPs (`lnt…`), not the spares a network keeps ready
    /// (alias `linnet:spare:NETWORK`, on the bridge and down).
    pub fn vm_taps(&self) -> Vec<String> {
        must(&mut self.cmd(&["ip", "-o", "link", "show"]))
            .lines()
            .filter(|l| !l.contains("alias linnet:spare:"))
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap().to_string())
            .filter(|n| n.starts_with("lnt"))
            .collect()
    }

    pub fn nft_ruleset(&self) -> String {
        must(&mut self.cmd(&["nft", "list", "ruleset"]))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name));
    }
}

/// A veth between `host` and `other`: `v<other's name>` in the host,
/// `eth0` in the other. Returns the host side's name.
pub fn uplink(host: &Netns, other: &Netns) -> String {
    let name = format!("v{}", other.name);
    must(Command::new("ip").args([
        "link",
        "add",
        &name,
        "netns",
        &host.name,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &other.name,
    ]));
    name
}

pub struct World {
    pub host: Netns,
    /// The "internet": a web server on UPSTREAM_IP and UPSTREAM_IP6, DNS.
    pub upstream: Netns,
    pub dir: tempfile::TempDir,
    pub config: Option<PathBuf>,
    daemon: Option<Child>,
    /// The upstream's DNS: if it ended during the test, the test fails,
    /// as a lookup that found nothing would otherwise pass a check that a
    /// name must not resolve.
    upstream_dns: Helper,
}

impl World {
    pub fn new() -> World {
        World::build(None)
    }

    pub fn with_config(yaml: &str) -> World {
        World::build(Some(yaml))
    }

    fn build(yaml: Option<&str>) -> World {
        let host = Netns::new("host");
        let upstream = Netns::new("up");
        let dir = tempfile::tempdir().unwrap();
        let config = yaml.map(|y| {
            let p = dir.path().join("networks.yaml");
            std::fs::write(&p, y).unwrap();
            p
        });
        // The uplink: host 203.0.113.1 <-> upstream 203.0.113.254 (TEST-NET-3).
        let veth_up = uplink(&host, &upstream);
        must(&mut host.cmd(&[
            "ip",
            "addr",
            "add",
            &format!("{UPSTREAM_HOST_SIDE}/24"),
            "dev",
            &veth_up,
        ]));
        must(&mut host.cmd(&["ip", "link", "set", &veth_up, "up"]));
        must(&mut host.cmd(&["ip", "route", "add", "default", "via", UPSTREAM_IP]));
        // IPv6 on the uplink too (nodad: usable at once).
        must(&mut host.cmd(&[
            "ip",
            "addr",
            "add",
            &format!("{UPSTREAM_HOST_SIDE6}/64"),
            "dev",
            &veth_up,
            "nodad",
        ]));
        must(&mut host.cmd(&["ip", "-6", "route", "add", "default", "via", UPSTREAM_IP6]));
        must(&mut upstream.cmd(&[
            "ip",
            "addr",
            "add",
            &format!("{UPSTREAM_IP6}/64"),
            "dev",
            "eth0",
            "nodad",
        ]));
        must(&mut upstream.cmd(&[
            "ip",
            "addr",
            "add",
            &format!("{UPSTREAM_IP}/24"),
            "dev",
            "eth0",
        ]));
        must(&mut upstream.cmd(&["ip", "link", "set", "eth0", "up"]));
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).unwrap();
        std::fs::write(www.join("index.html"), format!("{UPSTREAM_PAGE}\n")).unwrap();
        for listen in [format!("{UPSTREAM_IP}:80"), format!("[{UPSTREAM_IP6}]:80")] {
            must(&mut upstream.cmd(&[
                "busybox",
                "httpd",
                "-p",
                &listen,
                "-h",
                www.to_str().unwrap(),
            ]));
        }
        let mut dnsmasq: Vec<String> = [
            "dnsmasq",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--user=root",
            "--local-ttl=3",
        ]
        .map(String::from)
        .to_vec();
        dnsmasq.push(format!("--listen-address={UPSTREAM_IP}"));
        dnsmasq.push(format!("--address=/{UPSTREAM_NAME}/{UPSTREAM_IP}"));
        dnsmasq.extend(TEST_NAMES.iter().enumerate().map(|(i, (name, ip))| {
            let six = if i == 0 {
                format!(",{TEST_NAME6}")
            } else {
                String::new()
            };
            format!("--host-record={name},{ip}{six}")
        }));
        dnsmasq.extend(TEST_CNAMES.map(|(name, to)| format!("--cname={name},{to}")));
        let dnsmasq: Vec<&str> = dnsmasq.iter().map(String::as_str).collect();
        let dns = serve_dnsmasq(
            &upstream,
            "the upstream's DNS (dnsmasq)",
            &dnsmasq,
            &dir.path().join("dnsmasq.log"),
        );
        host.set_resolv_conf(&format!("nameserver {UPSTREAM_IP}\n"));
        World {
            host,
            upstream,
            dir,
            config,
            daemon: None,
            upstream_dns: dns,
        }
    }

    /// linnet-testdns in the upstream namespace on `port` of both its
    /// addresses: one answer of every record type (see tools/testdns).
    pub fn start_testdns(&self, port: u16) -> Reaped {
        let bin = linnet_bin().with_file_name("linnet-testdns");
        let v4 = format!("{UPSTREAM_IP}:{port}");
        let v6 = format!("[{UPSTREAM_IP6}]:{port}");
        let child = self
            .upstream
            .cmd(&[bin.to_str().unwrap(), "--listen", &v4, "--listen", &v6])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut server = Reaped(child);
        // It prints one line once both addresses are bound.
        let mut said = std::io::BufReader::new(server.stderr.take().unwrap());
        let mut line = String::new();
        said.read_line(&mut line).unwrap();
        if !line.contains("serving") {
            // It failed: what it said, and how it ended (a kill stops
            // one still running, so the rest of its stderr can be read).
            let _ = server.kill();
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut said, &mut rest);
            let status = server.wait().unwrap();
            panic!("linnet-testdns ended ({status}) before serving: {line}{rest}");
        }
        server
    }

    /// Upstream routes `prefix` (IPv4 or IPv6) back to the host, as a
    /// router that knows the host's networks would: a packet from there
    /// that got out gets its answer, so only linnet's rules can stop it.
    pub fn route_back(&self, prefix: &str) {
        let via = if prefix.contains(':') {
            UPSTREAM_HOST_SIDE6
        } else {
            UPSTREAM_HOST_SIDE
        };
        must(
            &mut self
                .upstream
                .cmd(&["ip", "route", "add", prefix, "via", via]),
        );
    }

    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `linnet ARGS` inside the host namespace, pointed at this world's dirs.
    /// The interface `interface_id` (a JSON string) as `linnet ls --json`
    /// lists it, or Null when it is not attached.
    pub fn listed_interface(&self, interface_id: &Value) -> Value {
        let ls: Value = serde_json::from_str(&must(&mut self.linnet(&["ls", "--json"]))).unwrap();
        ls["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| &i["interface_id"] == interface_id)
            .cloned()
            .unwrap_or(Value::Null)
    }

    pub fn linnet(&self, args: &[&str]) -> Command {
        let mut c = self.host.cmd(&[linnet_bin().to_str().unwrap()]);
        c.env("LINNET_RUN_DIR", self.run_dir())
            .env("LINNET_STATE_DIR", self.state_dir())
            .env("LINNET_LOG", "debug");
        if let Some(cfg) = &self.config {
            c.env("LINNET_CONFIG", cfg);
        }
        c.args(args);
        c
    }

    /// `linnet ARGS` in the host namespace behind `wrapper` (e.g. setpriv to
    /// run as another user): ip netns exec HOST WRAPPER… linnet ARGS.
    pub fn linnet_wrapped(&self, wrapper: &[&str], args: &[&str]) -> Command {
        let plain = self.linnet(args);
        let argv: Vec<String> = plain
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let mut cmd = Command::new(plain.get_program());
        cmd.args(&argv[..3]).args(wrapper).args(&argv[3..]);
        for (k, v) in plain.get_envs() {
            cmd.env(k, v.unwrap());
        }
        cmd
    }

    pub fn start_daemon(&mut self) {
        self.start_daemon_with(&[], &[]);
    }

    /// `wrapper… linnet daemon extra…` (e.g. prlimit, daemon options).
    pub fn start_daemon_with(&mut self, wrapper: &[&str], extra: &[&str]) {
        if let Err(e) = self.try_start_daemon_with(wrapper, extra) {
            panic!("{e}");
        }
    }

    /// `start_daemon_with`, saying how the daemon ended if it did rather
    /// than answer.
    pub fn try_start_daemon_with(
        &mut self,
        wrapper: &[&str],
        extra: &[&str],
    ) -> Result<(), String> {
        assert!(self.daemon.is_none(), "daemon already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.daemon_log())
            .unwrap();
        let mut args = vec!["daemon"];
        args.extend_from_slice(extra);
        let child = self
            .linnet_wrapped(wrapper, &args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(child);
        wait_for("the daemon to answer", Duration::from_secs(10), || {
            if let Some(status) = self.daemon.as_mut().unwrap().try_wait().unwrap() {
                self.daemon = None;
                return Some(Err(format!(
                    "daemon exited with {status}:\n{}",
                    self.daemon_log_text()
                )));
            }
            run(&mut self.linnet(&["ls"]))
                .status
                .success()
                .then_some(Ok(()))
        })
    }

    /// Whether this world started a daemon that it has not stopped or
    /// killed since.
    pub fn has_daemon(&self) -> bool {
        self.daemon.is_some()
    }

    /// The daemon's pid (`ip netns exec` and wrappers such as prlimit exec
    /// it in place).
    pub fn daemon_pid(&self) -> u32 {
        self.daemon.as_ref().expect("daemon running").id()
    }

    pub fn daemon_log(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    pub fn daemon_log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.daemon_log()).unwrap_or_default()).into_owned()
    }

    /// Asserts that no bridge, TAP or nftables table of linnet's is left.
    pub fn assert_linnet_gone(&self) {
        let links = self.host.links();
        assert!(
            !links
                .iter()
                .any(|l| l.starts_with("ln-") || l.starts_with("lnt")),
            "left behind: {links:?}"
        );
        assert!(!self.host.nft_ruleset().contains("linnet"));
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop_daemon(&mut self) {
        let mut child = self.daemon.take().expect("daemon running");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "daemon exited with {status}:\n{}",
            self.daemon_log_text()
        );
    }

    pub fn kill_daemon(&mut self) {
        let mut child = self.daemon.take().expect("daemon running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Attaches a new guest namespace through `linnet run -- linnet-standin`.
    pub fn guest(&self, network: &str, extra: &[&str]) -> Guest {
        self.guest_via(network, Via::Tap, extra)
    }

    /// Attaches a new guest namespace whose stand-in speaks `via`.
    pub fn guest_via(&self, network: &str, via: Via, extra: &[&str]) -> Guest {
        self.try_guest_via(network, via, extra)
            .unwrap_or_else(|e| panic!("attach failed: {e}\n{}", self.daemon_log_text()))
    }

    /// The refusal of an attach to `network` (`linnet run` options
    /// `extra`) that must be refused.
    pub fn attach_refused(&self, network: &str, extra: &[&str]) -> String {
        self.try_guest_via(network, Via::Tap, extra)
            .err()
            .unwrap_or_else(|| panic!("an attach to {network} with {extra:?} was not refused"))
    }

    pub fn try_guest_via(&self, network: &str, via: Via, extra: &[&str]) -> Result<Guest, String> {
        self.try_guest_in(Netns::new("guest"), network, via, extra)
    }

    /// A guest in `ns`, which a guest used before (a VM restored into the
    /// state its snapshot left: its sockets, its addresses).
    pub fn guest_in(&self, ns: Netns, network: &str, extra: &[&str]) -> Guest {
        self.try_guest_in(ns, network, Via::Tap, extra)
            .unwrap_or_else(|e| panic!("attach failed: {e}\n{}", self.daemon_log_text()))
    }

    pub fn try_guest_in(
        &self,
        ns: Netns,
        network: &str,
        via: Via,
        extra: &[&str],
    ) -> Result<Guest, String> {
        let json = self.dir.path().join(format!("{}.json", ns.name));
        let stderr = self.dir.path().join(format!("{}.stderr", ns.name));
        // A guest before in `ns` (`guest_in`) wrote these.
        let _ = std::fs::remove_file(&json);
        let socket = self.dir.path().join(format!("{}.sock", ns.name));
        let (socket, json_s) = (socket.to_str().unwrap(), json.to_str().unwrap());
        let standin = standin_bin();
        let standin = standin.to_str().unwrap();
        let netns_path = ns.path();
        let (command, datapath) = via.linnet_args(standin, socket);
        let mut args = vec![command, "--network", network];
        if command == "run" {
            args.extend_from_slice(&["--json", json_s]);
        }
        args.extend_from_slice(extra);
        args.extend_from_slice(&datapath);
        let helper = command == "helper";
        if !helper {
            args.extend_from_slice(&["--netns", &netns_path]);
        }
        let stdout = if helper {
            Stdio::from(std::fs::File::create(&json).unwrap())
        } else {
            Stdio::null()
        };
        let mut run = self
            .linnet(&args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let info: Value = wait_for("the attach JSON", Duration::from_secs(15), || {
            if let Some(status) = run.try_wait().unwrap() {
                return Some(Err(format!(
                    "linnet exited with {status}: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )));
            }
            let text = std::fs::read_to_string(&json).ok()?;
            serde_json::from_str(&text).ok().map(Ok)
        })?;
        if helper {
            let log = PathBuf::from(format!("{}.vmm", stderr.display()));
            let mut guest = Guest::on_socket(ns, via.standin_flag(), socket, info, &log);
            guest.run = Some(run);
            return Ok(guest);
        }
        Ok(Guest::started_logging(
            ns,
            Some(run),
            None,
            info,
            Some(&stderr),
        ))
    }
}

/// How a guest's frames reach linnet: the datapath its VMM (the stand-in) speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `linnet run` hands the TAP fd over.
    Tap,
    /// `linnet run --datapath dgram`: one end of a datagram socketpair.
    RunDgram,
    /// `linnet run --datapath stream`: one end of a stream socketpair.
    RunStream,
    /// `linnet helper --socket PATH`; the stand-in binds its own and sends there.
    HelperDgram,
    /// `linnet helper --stream-socket PATH`; the stand-in connects.
    HelperStream,
    /// `linnet run --datapath vhost-user`: the stand-in is the vhost-user
    /// front-end of the back-end in `linnet run`, at `{socket}`.
    RunVhostUser,
    /// `linnet helper --vhost-user PATH`; the stand-in connects as the
    /// front-end.
    HelperVhostUser,
}

impl Via {
    /// `linnet run` or `linnet helper`, and what follows the options for
    /// this datapath: `run`'s with the stand-in's command line (`--netns`
    /// to add), `helper`'s with the socket at `socket`.
    pub fn linnet_args<'a>(
        self,
        standin: &'a str,
        socket: &'a str,
    ) -> (&'static str, Vec<&'a str>) {
        let run = |datapath: &'a str, flag: &'a str, value: &'a str| {
            (
                "run",
                vec!["--datapath", datapath, "--", standin, flag, value],
            )
        };
        match self {
            Via::Tap => run("tap", "--fd", "{fd}"),
            Via::RunDgram => run("dgram", "--dgram-fd", "{fd}"),
            Via::RunStream => run("stream", "--stream-fd", "{fd}"),
            Via::RunVhostUser => run("vhost-user", "--vhost-user", "{socket}"),
            Via::HelperDgram => ("helper", vec!["--socket", socket]),
            Via::HelperStream => ("helper", vec!["--stream-socket", socket]),
            Via::HelperVhostUser => ("helper", vec!["--vhost-user", socket]),
        }
    }

    /// The stand-in's flag for a helper's socket.
    pub fn standin_flag(self) -> &'static str {
        match self {
            Via::HelperDgram => "--dgram-socket",
            Via::HelperStream => "--stream-socket",
            Via::HelperVhostUser => "--vhost-user",
            _ => panic!("{self:?} is not a helper's"),
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &d.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while d.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", self.daemon_log_text());
        } else {
            self.upstream_dns.assert_running("the end of the test");
        }
    }
}

/// dnsmasq (`argv`, without its way of running) in `ns`, kept in the
/// foreground and logging to `log`, as `name`: ready once it has bound
/// its sockets and written its pid file (both before it serves).
pub fn serve_dnsmasq(ns: &Netns, name: &str, argv: &[&str], log: &Path) -> Helper {
    let pid = log.with_extension("pid");
    let mut full = argv.to_vec();
    let pid_arg = format!("--pid-file={}", pid.display());
    full.extend(["--keep-in-foreground", "--log-facility=-", &pid_arg]);
    let dnsmasq = Helper::start(name, ns.cmd(&full), log);
    dnsmasq.wait_for("its pid file", Duration::from_secs(10), || {
        pid.exists().then_some(())
    });
    dnsmasq
}

/// A namespace playing a VM, attached through `linnet run` or `linnet helper`.
pub struct Guest {
    pub ns: Netns,
    /// `linnet run` or `linnet helper`.
    pub run: Option<Child>,
    /// The stand-in, when it is not run's child (helper datapaths).
    pub vmm: Option<Child>,
    pub info: Value,
}

impl Guest {
    /// Stops the VMM and keeps its namespace (the guest's state, as a
    /// snapshot keeps it), for `World::guest_in`.
    pub fn into_ns(mut self) -> Netns {
        for mut child in [self.run.take(), self.vmm.take()].into_iter().flatten() {
            terminate(&mut child);
        }
        std::mem::replace(&mut self.ns, Netns::new("spare"))
    }

    /// A guest in `ns` whose VMM is a stand-in connecting to a helper's
    /// socket (`flag`: --dgram-socket, --stream-socket or --vhost-user), with the MAC and
    /// MTU of the helper's interface JSON `info`; its stderr goes to `log`.
    pub fn on_socket(ns: Netns, flag: &str, socket: &str, info: Value, log: &Path) -> Guest {
        let vmm = Command::new(standin_bin())
            .args([flag, socket, "--netns", &ns.path()])
            .args(["--mac", info["mac_address"].as_str().unwrap()])
            .args(["--mtu", &info["mtu"].to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        Guest::started_logging(ns, None, Some(vmm), info, Some(log))
    }

    /// A guest in `ns` whose VMM (`linnet run`'s child, or `vmm` started
    /// on its own) is making its eth0: ready once eth0 is there. A VMM
    /// that exits first fails the test at once, with what it said on a
    /// piped stderr.
    pub fn started(ns: Netns, run: Option<Child>, vmm: Option<Child>, info: Value) -> Guest {
        Guest::started_logging(ns, run, vmm, info, None)
    }

    /// `started`, for a VMM whose stderr goes to `log`.
    fn started_logging(
        ns: Netns,
        run: Option<Child>,
        vmm: Option<Child>,
        info: Value,
        log: Option<&Path>,
    ) -> Guest {
        let mut guest = Guest { ns, run, vmm, info };
        wait_for("eth0 in the guest", Duration::from_secs(10), || {
            let child = guest.vmm.as_mut().or(guest.run.as_mut())?;
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(stderr) = child.stderr.as_mut() {
                    let _ = std::io::Read::read_to_string(stderr, &mut err);
                }
                if let Some(log) = log {
                    err.push_str(&std::fs::read_to_string(log).unwrap_or_default());
                }
                panic!("the VMM exited with {status} before the guest had eth0: {err}");
            }
            guest.ns.links().contains(&"eth0".to_string()).then_some(())
        });
        guest
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.info["ip_address"].as_str().unwrap().parse().unwrap()
    }

    pub fn mac(&self) -> String {
        self.info["mac_address"].as_str().unwrap().to_string()
    }

    pub fn gateway(&self) -> String {
        self.info["gateway"].as_str().unwrap().to_string()
    }

    /// The SLAAC address the attach JSON says the guest forms.
    pub fn ipv6(&self) -> String {
        self.info["ipv6_address"]
            .as_str()
            .expect("the attach JSON has ipv6_address")
            .to_string()
    }

    pub fn gateway6(&self) -> String {
        self.info["gateway6"].as_str().unwrap().to_string()
    }

    /// The global IPv6 addresses eth0 has formed (not tentative), after
    /// waiting for the first: the kernel's own SLAAC, no client software.
    pub fn slaac_addresses(&self) -> Vec<String> {
        wait_for("a SLAAC address on eth0", Duration::from_secs(10), || {
            let out = must(&mut self.ns.cmd(&[
                "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global",
            ]));
            let ready: Vec<String> = out
                .lines()
                .filter(|l| !l.contains("tentative"))
                .filter_map(|l| {
                    l.split_whitespace()
                        .skip_while(|w| *w != "inet6")
                        .nth(1)
                        .map(|a| a.split('/').next().unwrap().to_string())
                })
                .collect();
            (!ready.is_empty()).then_some(ready)
        })
    }

    pub fn tap(&self) -> String {
        self.info["tap"].as_str().unwrap().to_string()
    }

    /// busybox udhcpc: returns the address it was given.
    pub fn udhcpc(&self) -> Ipv4Addr {
        self.udhcpc_as(None)
    }

    /// busybox udhcpc, sending `hostname` (DHCP option 12) when given.
    pub fn udhcpc_as(&self, hostname: Option<&str>) -> Ipv4Addr {
        let script = repo_file("guest/udhcpc.script");
        let option = hostname.map(|h| format!("hostname:{h}"));
        let mut argv = vec![
            "busybox", "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "5", "-T", "1", "-s",
            &script,
        ];
        if let Some(option) = &option {
            argv.extend(["-x", option.as_str()]);
        }
        let out = run(&mut self.ns.cmd(&argv));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "udhcpc failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ip = text
            .lines()
            .find_map(|l| l.strip_prefix("linnet-guest: lease ip="))
            .expect("udhcpc printed a lease");
        ip.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// ISC dhclient: returns the address it configured.
    pub fn dhclient(&self) -> Ipv4Addr {
        let dir = tempfile::tempdir().unwrap();
        let lease = dir.path().join("lease");
        let pid = dir.path().join("pid");
        let out = run(&mut self.ns.cmd(&[
            "timeout",
            "20",
            "dhclient",
            "-4",
            "-1",
            "-v",
            "-sf",
            &repo_file("tests/dhclient.script"),
            "-lf",
            lease.to_str().unwrap(),
            "-pf",
            pid.to_str().unwrap(),
            "eth0",
        ]));
        assert!(
            out.status.success(),
            "dhclient failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = run(&mut self
            .ns
            .cmd(&["dhclient", "-x", "-pf", pid.to_str().unwrap()]));
        self.address().expect("dhclient configured an address")
    }

    pub fn address(&self) -> Option<Ipv4Addr> {
        let out = must(
            &mut self
                .ns
                .cmd(&["ip", "-4", "-o", "addr", "show", "dev", "eth0"]),
        );
        out.split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .map(|a| a.split('/').next().unwrap().parse().unwrap())
    }

    /// Gives eth0 the address `cidr` as well and pings `target` from it
    /// (one echo, 2 s): whether it answered.
    pub fn ping_from(&self, cidr: &str, target: &str) -> bool {
        must(&mut self.ns.cmd(&["ip", "addr", "add", cidr, "dev", "eth0"]));
        let source = cidr.split('/').next().unwrap();
        run(&mut self.ns.cmd(&[
            "busybox", "ping", "-c", "1", "-W", "2", "-I", source, target,
        ]))
        .status
        .success()
    }

    pub fn ping(&self, target: &str) -> bool {
        self.ns.ping(target)
    }

    pub fn fetch(&self, url: &str) -> Option<String> {
        let out = run(&mut self.ns.cmd(&["curl", "-sS", "-g", "--max-time", "3", url]));
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A-record lookup with nslookup against `server`.
    pub fn lookup(&self, name: &str, server: &str) -> Option<String> {
        let out = run(&mut self
            .ns
            .cmd(&["nslookup", "-type=a", "-timeout=2", name, server]));
        let text = String::from_utf8_lossy(&out.stdout);
        let answer = text.split_once(&format!("Name:\t{name}"))?.1;
        answer
            .lines()
            .find_map(|l| l.strip_prefix("Address: "))
            .map(|a| a.trim().to_string())
    }

    /// Asserts what every guest on `shared` must do: fetch the upstream page
    /// through NAT, and resolve the upstream name through linnet's DNS on
    /// the gateway. `what` names the guest in failures.
    pub fn assert_reaches_upstream(&self, what: &str) {
        assert_eq!(
            self.fetch(&format!("http://{UPSTREAM_IP}/")).as_deref(),
            Some(format!("{UPSTREAM_PAGE}\n").as_str()),
            "{what}: NAT to upstream"
        );
        assert_eq!(
            self.lookup(UPSTREAM_NAME, &self.gateway()).as_deref(),
            Some(UPSTREAM_IP),
            "{what}: upstream names through linnet's DNS"
        );
    }

    /// One UDP datagram to `to` port 9 (discard) carrying `marker` (a
    /// "LINNET-…" word that `Capture` recognises), from the guest's own
    /// stack and routes.
    pub fn send_marker(&self, to: &str, marker: &str) {
        let script = "import socket, sys\n\
                      family = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET\n\
                      socket.socket(family, socket.SOCK_DGRAM).sendto(sys.argv[2].encode(), (sys.argv[1], 9))\n";
        must(&mut self.ns.cmd(&["python3", "-c", script, to, marker]));
    }

    /// SIGTERM to `linnet run`, and wait.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        terminate(self.run.as_mut().expect("running"))
    }

    pub fn kill_run(&mut self) {
        let mut run = self.run.take().expect("running");
        run.kill().unwrap();
        run.wait().unwrap();
    }
}

/// tests/echo_peer.py serving TCP and UDP on `port` in `ns`, answering
/// each client "TAG from CLIENT-ADDRESS"; ready when returned.
pub fn echo_serve(ns: &Netns, tag: &str, port: u16) -> Reaped {
    let script = repo_file("tests/echo_peer.py");
    let (child, line) =
        spawn_until_first_line(ns.cmd(&["python3", &script, "serve", tag, &port.to_string()]));
    assert_eq!(line, "serving");
    child
}

/// Starts `cmd` (stdin closed), waits for the first line it prints (a
/// tool saying it is ready, or what it found) and returns it, trimmed.
/// The rest of its stdout is not read.
pub fn spawn_until_first_line(cmd: Command) -> (Reaped, String) {
    let (child, line, _) = spawn_reading(cmd);
    (child, line)
}

/// As `spawn_until_first_line`, keeping the rest of its stdout to read.
pub fn spawn_reading(mut cmd: Command) -> (Reaped, String, BufReader<ChildStdout>) {
    let mut child = Reaped(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}")),
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    if line.is_empty() {
        // Its stdout closed before a line: it has ended (or closed it,
        // which none of ours does). Its stderr is the test's, above.
        let status = child.wait().unwrap();
        panic!("{cmd:?} ended ({status}) before its first line; its stderr is above");
    }
    (child, line.trim().to_string(), out)
}

/// tests/spoof.py capturing on `dev` in `ns` for `seconds`: the markers of
/// the frames it saw, once `finish` waits for it.
pub struct Capture {
    child: Reaped,
    out: BufReader<ChildStdout>,
}

impl Capture {
    pub fn start(ns: &Netns, dev: &str, seconds: u32) -> Capture {
        let script = repo_file("tests/spoof.py");
        let (child, said, out) =
            spawn_reading(ns.cmd(&["python3", &script, "capture", dev, &seconds.to_string()]));
        assert_eq!(said, "capturing");
        Capture { child, out }
    }

    pub fn finish(mut self) -> Vec<String> {
        self.child.wait().unwrap();
        self.out.lines().map(|l| l.unwrap()).collect()
    }

    /// Ends the capture now (SIGTERM) rather than at its time: the
    /// markers seen so far.
    pub fn stop(self) -> Vec<String> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.finish()
    }
}

/// One TCP connection from `ns` to a line server at HOST:PORT
/// (tests/echo_peer.py chat), kept open: each `ask` sends a line over it
/// and returns the answer.
pub struct Chat {
    child: Reaped,
    said: BufReader<ChildStdout>,
}

impl Chat {
    pub fn open(ns: &Netns, host: &str, port: u16) -> Chat {
        let script = repo_file("tests/echo_peer.py");
        let mut child = Reaped(
            ns.cmd(&["python3", &script, "chat", host, &port.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut said = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        said.read_line(&mut first).unwrap();
        assert_eq!(first.trim(), "connected");
        Chat { child, said }
    }

    pub fn ask(&mut self, text: &str) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{text}").unwrap();
        stdin.flush().unwrap();
        let mut answer = String::new();
        self.said.read_line(&mut answer).unwrap();
        answer.trim().to_string()
    }
}

/// The answer a client in `ns` gets from an echo server at HOST:PORT over
/// `proto` (tcp or udp), or None.
pub fn echo_ask(ns: &Netns, host: &str, port: u16, proto: &str) -> Option<String> {
    match echo_try(ns, host, port, proto) {
        Reply::Answer(answer) => Some(answer),
        Reply::Refused | Reply::Silent => None,
    }
}

/// User plus system CPU time of `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// What a client got from an echo server.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Answer(String),
    /// A TCP reset or an ICMP unreachable: a reject, not a silent drop.
    Refused,
    /// Nothing within 2 s.
    Silent,
}

/// Like `echo_ask`, telling a refusal from silence.
pub fn echo_try(ns: &Netns, host: &str, port: u16, proto: &str) -> Reply {
    echo_try_as(ns, host, port, proto, None)
}

/// `echo_try`; with `chaddr`, a UDP datagram is shaped as a DHCP request
/// from that MAC (what anti-spoofing lets through to port 67).
pub fn echo_try_as(ns: &Netns, host: &str, port: u16, proto: &str, chaddr: Option<&str>) -> Reply {
    let script = repo_file("tests/echo_peer.py");
    let port = port.to_string();
    let mut argv = vec![
        "python3",
        script.as_str(),
        "ask",
        host,
        port.as_str(),
        proto,
    ];
    argv.extend(chaddr);
    let out = run(&mut ns.cmd(&argv));
    match out.status.code() {
        Some(0) => Reply::Answer(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        Some(2) => Reply::Refused,
        Some(3) => Reply::Silent,
        // The probe itself failed (no namespace, a Python error): that
        // says nothing of the network, and must not pass for "no answer".
        _ => panic!(
            "the probe {argv:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// SIGTERM, and wait.
pub fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child.wait().unwrap()
}

/// A child process killed and reaped when dropped, so a failing test
/// leaves none behind.
pub struct Reaped(pub Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process a test starts and then waits on: a daemon, a server, a VMM,
/// a stand-in. Its output goes to log files; it is killed and reaped on
/// drop. Every wait on it ends as soon as it has exited, with its exit
/// status and the last lines of its logs, rather than at the timeout with
/// a message that cannot say why.
pub struct Helper {
    name: String,
    child: Child,
    logs: Vec<PathBuf>,
}

impl Helper {
    /// Starts `cmd` as `name`: stdin closed, stdout and stderr to `log`.
    pub fn start(name: &str, mut cmd: Command, log: &Path) -> Helper {
        let out = std::fs::File::create(log).unwrap();
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        Helper::spawn(name, cmd, &[log])
    }

    /// Starts `cmd` as `name` with the stdio it was given, whose output
    /// lands in `logs` (a console on stdout, say, and stderr apart).
    pub fn spawn(name: &str, mut cmd: Command, logs: &[&Path]) -> Helper {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Helper {
            name: name.to_string(),
            child,
            logs: logs.iter().map(|l| l.to_path_buf()).collect(),
        }
    }

    /// How it ended, once it has (None while it runs). Looked at without
    /// reaping it, so a later `wait` still has its status.
    pub fn ended(&self) -> Option<String> {
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::Exited(_, code)) => Some(format!("exit status {code}")),
            Ok(WaitStatus::Signaled(_, signal, _)) => Some(format!("signal {signal}")),
            Ok(_) => None,
            // Already reaped (a `wait` through DerefMut).
            Err(_) => Some("an exit already reaped".to_string()),
        }
    }

    /// Panics, saying how and with what it said last, if it has ended
    /// while something still waited for `what`.
    pub fn assert_running(&self, what: &str) {
        if let Some(how) = self.ended() {
            panic!(
                "{} ended ({how}) while waiting for {what}; the last of its output:\n{}",
                self.name,
                self.tail(30)
            );
        }
    }

    /// `wait_for(what, timeout, probe)` that fails as soon as this
    /// process has ended without `probe` being met.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        probe: impl FnMut() -> Option<T>,
    ) -> T {
        wait_while_running(&[self], what, timeout, probe)
    }

    /// The last `lines` lines of each of its logs.
    pub fn tail(&self, lines: usize) -> String {
        self.logs
            .iter()
            .map(|log| {
                let text =
                    String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default()).into_owned();
                let all: Vec<&str> = text.lines().collect();
                let tail = all[all.len().saturating_sub(lines)..].join("\n");
                format!("---- {} ----\n{tail}", log.display())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `wait_for` while every one of `helpers` must keep running: the first
/// to end fails the wait at once. Each round looks at them before the
/// probe, so what a process wrote before it ended is seen by the probe.
pub fn wait_while_running<T>(
    helpers: &[&Helper],
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    wait_for(what, timeout, || {
        let ended = helpers.iter().find(|h| h.ended().is_some());
        if let Some(v) = probe() {
            return Some(v);
        }
        if let Some(helper) = ended {
            helper.assert_running(what);
        }
        None
    })
}

impl std::ops::Deref for Helper {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for Helper {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        for mut child in [self.run.take(), self.vmm.take()].into_iter().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A field of /proc/PID/status, its words joined by one space.
pub fn proc_status(pid: impl std::fmt::Display, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether the far end closes `conn` within `within` (frames from the
/// network on their way in are read past). Closed with our bytes unread,
/// the kernel reports a reset. A read cut short (a signal, the socket's
/// timeout) is tried again until `within` has passed.
pub fn closed_by_peer(conn: &mut std::os::unix::net::UnixStream, within: Duration) -> bool {
    use std::io::{ErrorKind, Read};
    let deadline = Instant::now() + within;
    conn.set_nonblocking(false).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        conn.set_read_timeout(Some(left)).unwrap();
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                eprintln!("closed_by_peer: {e}");
                return false;
            }
        }
    }
}

/// `argv` in `ns`, in a mount namespace of its own whose /dev/net is an
/// empty tmpfs, with a tun node anyone may open when `tun` (this machine's
/// /dev/net/tun is 0600; distributions ship it 0666).
pub fn with_own_dev_net(ns: &Netns, tun: bool, argv: &[&str]) -> Command {
    in_own_mounts(ns, if tun { OWN_TUN } else { NO_DEV_NET }, argv)
}

/// `setup && exec argv…` in `ns`, in a mount namespace of its own.
pub fn in_own_mounts(ns: &Netns, setup: &str, argv: &[&str]) -> Command {
    let mut full = own_mounts(setup);
    full.extend(argv.iter().map(|a| a.to_string()));
    let full: Vec<&str> = full.iter().map(String::as_str).collect();
    ns.cmd(&full)
}

/// The wrapper that runs what follows it after `setup`, in a mount
/// namespace of its own (for `World::start_daemon_with`).
pub fn own_mounts(setup: &str) -> Vec<String> {
    let script = format!("{setup} && exec \"$0\" \"$@\"");
    [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]
    .map(String::from)
    .to_vec()
}

/// A copy of the machine's /etc in `dir`, with `lines` appended to its
/// files (file, text), and the setup that puts it over /etc in a mount
/// namespace of one's own (`in_own_mounts`, `own_mounts`). The resolv.conf
/// `ip netns exec` put in place comes along.
pub fn etc_with(dir: &Path, lines: &[(&str, &str)]) -> String {
    let etc = dir.join("etc");
    must(Command::new("cp").args(["-a", "/etc", etc.to_str().unwrap()]));
    for (file, line) in lines {
        let path = etc.join(file);
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str(line);
        std::fs::write(path, text).unwrap();
    }
    format!(
        "cp /etc/resolv.conf {0}/resolv.conf && mount --bind {0} /etc",
        etc.display()
    )
}

/// An empty /dev/net, and with OWN_TUN a tun node in it anyone may open.
const NO_DEV_NET: &str = "mount -t tmpfs none /dev/net";
pub const OWN_TUN: &str = "mount -t tmpfs none /dev/net && mknod -m 0666 /dev/net/tun c 10 200";
