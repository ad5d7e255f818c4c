//! Rootless: a user without root (a bare numeric uid, nothing in /etc)
//! runs `linnet run`, which starts that user's own daemon in a user and
//! network namespace of theirs, with pasta (or slirp4netns) as its way
//! out. Everything a user runs here runs as that uid, in a mount
//! namespace whose /dev/net/tun is a node of its own, 0666 as
//! distributions ship it. The guests' VMMs (the stand-in) are the user's
//! too: each makes its guest in namespaces of its own, which the test then
//! enters as root to play the VM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

/// A user without root and their XDG directories, under the world's dir.
pub(crate) struct Tenant {
    pub uid: u32,
    pub home: PathBuf,
}

impl Tenant {
    pub fn new(world: &World, uid: u32) -> Tenant {
        let home = world.dir.path().join(format!("home-{uid}"));
        std::fs::create_dir_all(home.join("run")).unwrap();
        for dir in [home.clone(), home.join("run")] {
            std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        // The world's dir is root's 0700 tempdir: the user goes through it
        // to their home and writes the attach JSON and pid files there.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(world.dir.path(), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        Tenant { uid, home }
    }

    /// $XDG_RUNTIME_DIR/linnet: the rootless daemon's socket and logs.
    pub fn run_dir(&self) -> PathBuf {
        self.home.join("run/linnet")
    }

    /// `argv` as this user, in the world's host namespace, with a fresh
    /// environment of theirs.
    pub fn cmd(&self, world: &World, argv: &[&str]) -> Command {
        let full = self.as_user(argv);
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        with_own_dev_net(&world.host, true, &full)
    }

    /// `argv` behind setpriv and env: as this user, with a fresh
    /// environment of theirs.
    fn as_user(&self, argv: &[&str]) -> Vec<String> {
        let uid = self.uid.to_string();
        let mut full: Vec<String> = [
            "setpriv",
            "--reuid",
            &uid,
            "--regid",
            &uid,
            "--clear-groups",
        ]
        .map(String::from)
        .to_vec();
        full.extend([
            "env".to_string(),
            "-i".to_string(),
            format!("HOME={}", self.home.display()),
            format!("XDG_RUNTIME_DIR={}", self.home.join("run").display()),
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            "LINNET_LOG=debug".to_string(),
        ]);
        full.extend(argv.iter().map(|a| a.to_string()));
        full
    }

    /// `linnet ARGS` as this user.
    pub fn linnet(&self, world: &World, args: &[&str]) -> Command {
        let bin = linnet_bin();
        let mut argv = vec![bin.to_str().unwrap()];
        argv.extend_from_slice(args);
        self.cmd(world, &argv)
    }

    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.run_dir().join("daemon.log")).unwrap_or_default()
    }

    /// A guest through `linnet run` as this user: the stand-in makes its
    /// guest in namespaces of its own.
    pub fn guest(&self, world: &World, network: &str, extra: &[&str]) -> Guest {
        self.guest_via(world, network, Via::Tap, extra)
    }

    pub fn guest_via(&self, world: &World, network: &str, via: Via, extra: &[&str]) -> Guest {
        self.try_guest(world, network, via, extra)
            .unwrap_or_else(|e| panic!("attach failed: {e}\n{}", self.daemon_log()))
    }

    /// A guest whose stand-in, the user's, speaks `via`: `linnet run`
    /// hands it a TAP or a socket, or `linnet helper` relays to the socket
    /// it connects to.
    pub fn try_guest(
        &self,
        world: &World,
        network: &str,
        via: Via,
        extra: &[&str],
    ) -> Result<Guest, String> {
        let name = unique("rguest");
        let file = |ext: &str| world.dir.path().join(format!("{name}.{ext}"));
        let (json, pid_file, stderr, socket) =
            (file("json"), file("pid"), file("stderr"), file("sock"));
        let standin = standin_bin();
        let standin = standin.to_str().unwrap();
        let own = format!("own:{}", pid_file.display());
        let socket = socket.to_str().unwrap();
        let (command, datapath) = via.linnet_args(standin, socket);
        let helper = command == "helper";
        let mut args = vec![command, "--network", network];
        if !helper {
            args.extend_from_slice(&["--json", json.to_str().unwrap()]);
        }
        args.extend_from_slice(extra);
        args.extend_from_slice(&datapath);
        if !helper {
            args.extend_from_slice(&["--netns", &own]);
        }
        let stdout = if helper {
            Stdio::from(std::fs::File::create(&json).unwrap())
        } else {
            Stdio::null()
        };
        // The helper's JSON goes to a file of root's, opened here.
        let mut run = self
            .linnet(world, &args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let failed = |run: &mut Child| -> Option<String> {
            let status = run.try_wait().unwrap()?;
            Some(format!(
                "linnet exited with {status}: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            ))
        };
        let info: Value = wait_for("the attach JSON", Duration::from_secs(20), || {
            if let Some(e) = failed(&mut run) {
                return Some(Err(e));
            }
            let text = std::fs::read_to_string(&json).ok()?;
            serde_json::from_str(&text).ok().map(Ok)
        })?;
        let mut vmm = None;
        if helper {
            let argv = [
                standin,
                via.standin_flag(),
                socket,
                "--netns",
                &own,
                "--mac",
                info["mac_address"].as_str().unwrap(),
                "--mtu",
                &info["mtu"].to_string(),
            ];
            let log = std::fs::File::create(file("vmm")).unwrap();
            vmm = Some(
                self.cmd(world, &argv)
                    .stdin(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap(),
            );
        }
        let pid: u32 = wait_for("the guest's namespaces", Duration::from_secs(10), || {
            if let Some(e) = failed(&mut run) {
                return Some(Err(e));
            }
            let text = std::fs::read_to_string(&pid_file).ok()?;
            text.trim().parse().ok().map(Ok)
        })?;
        Ok(Guest {
            ns: Netns::adopt("rguest", pid),
            run: Some(run),
            vmm,
            info,
        })
    }
}

/// A user's daemon goes with the test (rather than after its idle time):
/// SIGTERM to the daemon, which shuts down and takes its supervisor and
/// pasta with it.
impl Drop for Tenant {
    fn drop(&mut self) {
        let pid = std::fs::read_to_string(self.run_dir().join("daemon.pid")).unwrap_or_default();
        // Only if it is still the user's: a daemon that exited on its own
        // leaves its pid file, and the sandbox's PIDs (at most 32768) come
        // round again within a suite, so the number may be another test's
        // process by now.
        let owner = std::fs::read_to_string(format!("/proc/{}/status", pid.trim()))
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("Uid:"))?.to_string();
                line.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        if !pid.trim().is_empty() && owner == Some(self.uid) {
            let _ = Command::new("kill").args(["-TERM", pid.trim()]).status();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !processes_of(self.uid).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The processes of `uid` in the sandbox (but zombies: an orphan stays
/// one until the sandbox's PID 1 gets round to reaping it).
fn processes_of(uid: u32) -> Vec<String> {
    let out = run(Command::new("ps").args(["-o", "pid=,args=", "-U", &uid.to_string()]));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && !l.ends_with("<defunct>"))
        .collect()
}

/// Files in `dir` other than logs.
fn files_but_logs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".log"))
                .collect()
        })
        .unwrap_or_default()
}

/// A web server on the host's own 127.0.0.1:8088 answering a page of its
/// own, which the VMs reach at the gateway address the attach JSON names.
fn serve_on_the_hosts_loopback(world: &World) {
    let www = world.dir.path().join("loopback-www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "hello from the host's loopback\n").unwrap();
    must(&mut world.host.cmd(&[
        "busybox",
        "httpd",
        "-p",
        "127.0.0.1:8088",
        "-h",
        www.to_str().unwrap(),
    ]));
}

#[test]
fn rootless_guests_lease_resolve_and_reach_each_other_upstream_and_the_hosts_loopback() {
    let world = World::new();
    serve_on_the_hosts_loopback(&world);
    let user = Tenant::new(&world, 4301);
    let a = user.guest(&world, "shared", &["--name", "alpha"]);
    let b = user.guest(&world, "shared", &["--name", "beta"]);
    assert_eq!(a.udhcpc(), a.ip());
    assert_eq!(b.udhcpc(), b.ip());
    assert!(a.ping(&a.gateway()), "guest pings its gateway");
    assert!(a.ping(&b.ip().to_string()), "VM to VM");
    assert_eq!(
        a.lookup("beta.shared.linnet", &a.gateway()),
        Some(b.ip().to_string()),
        "another guest's name"
    );
    a.assert_reaches_upstream("a rootless guest");
    let loopback = a.info["host_loopback"]
        .as_str()
        .expect("the attach JSON names the host's loopback");
    assert_eq!(
        b.fetch(&format!("http://{loopback}:8088/")).as_deref(),
        Some("hello from the host's loopback\n"),
        "the host's 127.0.0.1 through {loopback}"
    );
    // The daemon is the user's, and so is everything it started.
    let procs = processes_of(user.uid);
    assert!(
        procs
            .iter()
            .any(|p| p.contains(" daemon ") && p.contains("--rootless")),
        "{procs:?}"
    );
    assert!(procs.iter().any(|p| p.contains("pasta")), "{procs:?}");
    // Other tests' system daemons run as root beside this one in the same
    // sandbox: what must not be root is a rootless daemon.
    let root = processes_of(0);
    assert!(
        root.iter()
            .all(|p| !(p.contains(" daemon ") && p.contains("--rootless"))),
        "no rootless daemon runs as root: {root:?}"
    );
}

#[test]
fn killing_the_rootless_daemon_and_pasta_leaves_nothing_and_the_next_run_starts_cleanly() {
    let world = World::new();
    let user = Tenant::new(&world, 4302);
    for victim in ["supervisor", "daemon"] {
        let mut g = user.guest(&world, "shared", &[]);
        assert_eq!(g.udhcpc(), g.ip());
        let procs = processes_of(user.uid);
        let pids: Vec<&str> = procs
            .iter()
            .filter(|p| p.contains(" daemon ") && p.contains("--rootless"))
            .map(|p| p.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(pids.len(), 2, "supervisor and daemon: {procs:?}");
        // The supervisor started first: the lower pid.
        let pid = if victim == "supervisor" {
            pids[0]
        } else {
            pids[1]
        };
        must(Command::new("kill").args(["-9", pid]));
        g.kill_run();
        drop(g);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left = processes_of(user.uid);
            if left.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "after the {victim} was killed, left: {left:?}\n{}",
                user.daemon_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            files_but_logs(&user.run_dir()),
            Vec::<String>::new(),
            "after the {victim} was killed"
        );
    }
    let g = user.guest(&world, "shared", &[]);
    assert_eq!(g.udhcpc(), g.ip(), "the next run starts cleanly");
    assert!(g.ping(&g.gateway()));
}

#[test]
fn rootless_published_ports_answer_on_the_host_and_privileged_ones_are_refused() {
    let world = World::new();
    let user = Tenant::new(&world, 4303);
    let g = user.guest(
        &world,
        "shared",
        &[
            "--name",
            "web",
            "--publish",
            "8080:7000",
            "--publish",
            "5353:7000/udp",
        ],
    );
    assert_eq!(g.udhcpc(), g.ip());
    let _echo = echo_serve(&g.ns, "vm", 7000);
    let gateway = g.gateway();
    for (host, proto, port) in [
        ("127.0.0.1", "tcp", 8080),
        (UPSTREAM_HOST_SIDE, "tcp", 8080),
        ("127.0.0.1", "udp", 5353),
        (UPSTREAM_HOST_SIDE, "udp", 5353),
    ] {
        assert_eq!(
            echo_ask(&world.host, host, port, proto).as_deref(),
            Some(format!("vm from {gateway}").as_str()),
            "{proto} to {host}:{port} on the host reaches the VM"
        );
    }
    // From another machine too (the upstream namespace).
    assert_eq!(
        echo_ask(&world.upstream, UPSTREAM_HOST_SIDE, 8080, "tcp").as_deref(),
        Some(format!("vm from {gateway}").as_str())
    );
    // At runtime, as the user.
    must(&mut user.linnet(&world, &["forward", "add", "--name", "web", "9090:7000"]));
    assert_eq!(
        echo_ask(&world.host, "127.0.0.1", 9090, "tcp").as_deref(),
        Some(format!("vm from {gateway}").as_str())
    );
    must(&mut user.linnet(&world, &["forward", "rm", "--name", "web", "9090:7000"]));
    assert_eq!(
        echo_ask(&world.host, "127.0.0.1", 9090, "tcp"),
        None,
        "removed"
    );
    // A privileged port is the host's to refuse: the message says why.
    let err = failure(&mut user.linnet(&world, &["forward", "add", "--name", "web", "80:7000"]));
    assert!(
        err.contains("host port 80/tcp is privileged on this host")
            && err.contains("net.ipv4.ip_unprivileged_port_start = 1024"),
        "{err}"
    );
    // A port another program holds.
    let _holder = echo_serve(&world.host, "host", 9191);
    let err = failure(&mut user.linnet(&world, &["forward", "add", "--name", "web", "9191:7000"]));
    assert!(err.contains("host port 9191/tcp is already taken"), "{err}");
}

#[test]
fn rootless_guests_on_every_datapath_lease_and_reach_each_other() {
    let world = World::new();
    let user = Tenant::new(&world, 4304);
    let guests: Vec<Guest> = [
        Via::Tap,
        Via::RunDgram,
        Via::RunStream,
        Via::HelperDgram,
        Via::HelperStream,
        Via::RunVhostUser,
        Via::HelperVhostUser,
    ]
    .into_iter()
    .map(|via| user.guest_via(&world, "shared", via, &[]))
    .collect();
    for g in &guests {
        assert_eq!(g.udhcpc(), g.ip(), "{}", g.info["datapath"]);
    }
    let first = &guests[0];
    for g in &guests[1..] {
        assert!(
            first.ping(&g.ip().to_string()),
            "to the {} guest",
            g.info["datapath"]
        );
    }
    guests[4].assert_reaches_upstream("a rootless guest behind linnet helper");
}

#[test]
fn users_never_see_each_others_networks() {
    let world = World::new();
    let (alice, bob) = (Tenant::new(&world, 4305), Tenant::new(&world, 4306));
    let a1 = alice.guest(&world, "shared", &["--name", "a1"]);
    let a2 = alice.guest(&world, "shared", &["--name", "a2"]);
    let b1 = bob.guest(&world, "shared", &["--name", "b1"]);
    for g in [&a1, &a2, &b1] {
        assert_eq!(g.udhcpc(), g.ip());
    }
    assert_ne!(a2.ip(), b1.ip());
    assert!(a1.ping(&a2.ip().to_string()), "within alice's network");
    assert!(
        !b1.ping(&a2.ip().to_string()),
        "bob's guest cannot reach alice's"
    );
    assert_eq!(b1.lookup("a2.shared.linnet", &b1.gateway()), None);
    let listed = |user: &Tenant| -> usize {
        let ls: Value =
            serde_json::from_str(&must(&mut user.linnet(&world, &["ls", "--json"]))).unwrap();
        ls["interfaces"].as_array().unwrap().len()
    };
    assert_eq!(
        (listed(&alice), listed(&bob)),
        (2, 1),
        "each lists their own"
    );
    // Alice's socket is hers: her run dir keeps bob out, and were it open,
    // her daemon would still refuse him.
    let alices = alice.run_dir();
    let err = failure(&mut bob.linnet(&world, &["--run-dir", alices.to_str().unwrap(), "ls"]));
    assert!(err.contains("Permission denied"), "{err}");
    use std::os::unix::fs::PermissionsExt;
    for (path, mode) in [
        (alice.home.clone(), 0o755),
        (alice.home.join("run"), 0o755),
        (alices.clone(), 0o755),
        (alices.join("linnet.sock"), 0o777),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let err = failure(&mut bob.linnet(&world, &["--run-dir", alices.to_str().unwrap(), "ls"]));
    assert!(
        err.contains("another user's rootless linnet daemon"),
        "{err}"
    );
}

#[test]
fn the_guards_spoof_tests_pass_rootless() {
    let world = World::new();
    let user = Tenant::new(&world, 4307);
    let attacker = user.guest(&world, "shared", &[]);
    let victim = user.guest(&world, "shared", &[]);
    for g in [&attacker, &victim] {
        assert_eq!(g.udhcpc(), g.ip());
        assert_eq!(g.slaac_addresses(), vec![g.ipv6()]);
    }
    let mut kinds = vec!["honest", "arp-probe-own", "ll-other-mac"];
    kinds.extend(crate::guard::SPOOFS);
    let seen = crate::guard::send_and_capture(&attacker, &victim, &kinds);
    assert_eq!(
        seen,
        ["LINNET-arp-probe-own", "LINNET-honest"],
        "only the honest frames cross the bridge"
    );
    let ls: Value =
        serde_json::from_str(&must(&mut user.linnet(&world, &["ls", "--json"]))).unwrap();
    let drops = ls["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["interface_id"] == attacker.info["interface_id"])
        .expect("listed")["spoofed_drops"]
        .as_u64();
    assert_eq!(drops, Some(crate::guard::SPOOFS.len() as u64));
    victim.assert_reaches_upstream("the victim after the spoofs");
}

#[test]
fn slirp4netns_is_the_way_out_when_asked_for() {
    let world = World::new();
    must(
        &mut world
            .host
            .cmd(&["busybox", "httpd", "-p", "127.0.0.1:8089", "-h", "/etc"]),
    );
    let user = Tenant::new(&world, 4308);
    let daemon = Helper::start(
        "the rootless daemon",
        user.linnet(&world, &["daemon", "--rootless", "--egress", "slirp4netns"]),
        &world.dir.path().join("slirp4netns-daemon.log"),
    );
    daemon.wait_for("the daemon's socket", Duration::from_secs(10), || {
        user.run_dir().join("linnet.sock").exists().then_some(())
    });
    let g = user.guest(&world, "shared", &[]);
    assert_eq!(g.udhcpc(), g.ip());
    g.assert_reaches_upstream("a guest behind slirp4netns");
    assert!(
        g.fetch("http://10.0.2.2:8089/hostname").is_some(),
        "the host's loopback through slirp4netns"
    );
    assert!(
        processes_of(user.uid)
            .iter()
            .any(|p| p.starts_with(|c: char| c.is_ascii_digit()) && p.contains("slirp4netns"))
    );
    assert!(!processes_of(user.uid).iter().any(|p| p.contains("pasta")));
    drop(g);
    drop(daemon);
    wait_for(
        "everything of the user to end",
        Duration::from_secs(10),
        || processes_of(user.uid).is_empty().then_some(()),
    );
}

#[test]
fn a_rootless_qemu_guest_opening_its_tap_by_name_and_a_stand_in_lease_resolve_and_reach_each_other_upstream_and_the_host()
 {
    use crate::qemu::{Vm, qemu_command, vm_dir};
    let world = World::new();
    serve_on_the_hosts_loopback(&world);
    let user = Tenant::new(&world, 4309);
    let standin = user.guest(&world, "shared", &["--name", "alpha"]);
    assert_eq!(standin.udhcpc(), standin.ip());
    let name = unique("linnet-vm");
    let json = vm_dir(&world).join(format!("{name}.json"));
    let script = format!(
        "ping -c 1 -W 3 {alpha} && echo RESULT-PING-PEER-OK\n\
         nslookup alpha.shared.linnet 192.168.105.1 | sed -n 's/^Address: /RESULT-PEER-NAME: /p'\n\
         wget -q -O - http://{UPSTREAM_IP}/ | sed 's/^/RESULT-PAGE: /'\n\
         wget -q -O - http://10.0.2.2:8088/ | sed 's/^/RESULT-HOST: /'\n\
         echo RESULT-READY; sleep 5\n",
        alpha = standin.ip()
    );
    let mut args: Vec<String> = [
        "run",
        "--network",
        "shared",
        "--name",
        "qemu",
        "--json",
        json.to_str().unwrap(),
        "--",
    ]
    .map(String::from)
    .to_vec();
    args.extend(qemu_command(&name, &script));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vm = Vm::launch(&world, user.linnet(&world, &args), name, &json);
    assert_eq!(vm.info["host_loopback"], "10.0.2.2");
    assert_eq!(
        standin.lookup("qemu.shared.linnet", &standin.gateway()),
        Some(vm.ip()),
        "the stand-in resolves the VM's name"
    );
    vm.wait_console("RESULT-READY");
    assert!(standin.ping(&vm.ip()), "the stand-in reaches the VM");
    let ip = vm.ip();
    let console = vm.finish();
    for want in [
        format!("linnet-guest: lease ip={ip} "),
        "RESULT-PING-PEER-OK".into(),
        format!("RESULT-PEER-NAME: {}", standin.ip()),
        format!("RESULT-PAGE: {UPSTREAM_PAGE}"),
        "RESULT-HOST: hello from the host's loopback".into(),
    ] {
        assert!(console.contains(&want), "{want}:\n{console}");
    }
}

#[test]
fn a_killed_egress_tool_comes_back_and_an_idle_daemon_exits_keeping_its_leases() {
    let world = World::new();
    let user = Tenant::new(&world, 4310);
    let id = "5eed0000-1111-4222-8333-444455556666";
    let first = user.guest(&world, "shared", &[]);
    let kept = user.guest(&world, "shared", &["--interface-id", id]);
    assert_eq!(first.udhcpc(), first.ip());
    assert_eq!(kept.udhcpc(), kept.ip());
    assert_ne!(kept.ip(), first.ip());
    let pasta = || -> Option<String> {
        processes_of(user.uid)
            .into_iter()
            .find(|p| p.contains("pasta "))
            .map(|p| p.split_whitespace().next().unwrap().to_string())
    };
    let old = pasta().expect("pasta runs");
    must(Command::new("kill").args(["-9", &old]));
    wait_for("pasta to be started again", Duration::from_secs(10), || {
        pasta().filter(|p| *p != old)
    });
    wait_for("the way out back", Duration::from_secs(10), || {
        kept.fetch(&format!("http://{UPSTREAM_IP}/")).map(|_| ())
    });
    kept.assert_reaches_upstream("a guest after pasta came back");
    assert!(
        user.daemon_log().contains("the egress tool exited"),
        "said in the log"
    );
    let ip = kept.ip();
    drop((first, kept));
    // `linnet run` started the daemon with --idle-exit 10.
    wait_for("the idle daemon to exit", Duration::from_secs(30), || {
        processes_of(user.uid).is_empty().then_some(())
    });
    assert_eq!(files_but_logs(&user.run_dir()), Vec::<String>::new());
    let again = user.guest(&world, "shared", &["--interface-id", id]);
    assert_eq!(again.ip(), ip, "the lease was kept for the next start");
    assert_eq!(again.udhcpc(), ip);
}

#[test]
fn a_vmm_started_on_its_own_enters_the_daemons_namespaces_and_opens_its_kept_tap_by_name() {
    let world = World::new();
    let user = Tenant::new(&world, 4311);
    let json = world.dir.path().join("fc1.json");
    // `linnet attach` starts the daemon when none runs, as `linnet run` does.
    must(&mut user.linnet(
        &world,
        &["attach", "--name", "fc1", "--json", json.to_str().unwrap()],
    ));
    let info: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let pid = std::fs::read_to_string(user.run_dir().join("daemon.pid")).unwrap();
    let pid_file = world.dir.path().join("fc1.pid");
    let own = format!("own:{}", pid_file.display());
    let standin = standin_bin();
    // What docs/rootless.md tells a user to run for a VMM of their own.
    let mut vmm = Reaped(
        user.cmd(
            &world,
            &[
                "nsenter",
                "--target",
                pid.trim(),
                "--user",
                "--net",
                "--preserve-credentials",
                standin.to_str().unwrap(),
                "--tap",
                info["tap"].as_str().unwrap(),
                "--mac",
                info["mac_address"].as_str().unwrap(),
                "--netns",
                &own,
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let guest_pid: u32 = wait_for("the VMM's guest", Duration::from_secs(10), || {
        assert!(vmm.try_wait().unwrap().is_none(), "the VMM exited");
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    let g = Guest {
        ns: Netns::adopt("rguest", guest_pid),
        run: None,
        vmm: None,
        info,
    };
    assert_eq!(g.udhcpc(), g.ip());
    assert!(g.ping(&g.gateway()));
    g.assert_reaches_upstream("a kept interface's VMM");
    must(&mut user.linnet(&world, &["detach", "--name", "fc1"]));
    wait_for("the VMM to lose its TAP", Duration::from_secs(10), || {
        vmm.try_wait().unwrap()
    });
}

#[test]
fn the_users_subordinate_ids_are_mapped_when_etc_subuid_gives_some() {
    let world = World::new();
    let user = Tenant::new(&world, 4312);
    // An /etc of the daemon's own (in its mount namespace) that knows the
    // user and gives it ranges; the machine's has neither.
    let etc = etc_with(
        world.dir.path(),
        &[
            ("passwd", "tenant:x:4312:4312::/nonexistent:/bin/sh\n"),
            ("group", "tenant:x:4312:\n"),
            ("subuid", "tenant:200000:65536\n"),
            ("subgid", "4312:300000:65536\n"),
        ],
    );
    let setup = format!("{etc} && {OWN_TUN}");
    let bin = linnet_bin();
    let daemon = user.as_user(&[bin.to_str().unwrap(), "daemon", "--rootless"]);
    let daemon: Vec<&str> = daemon.iter().map(String::as_str).collect();
    let log = world.dir.path().join("subids-daemon.log");
    let daemon = Helper::start(
        "the rootless daemon",
        in_own_mounts(&world.host, &setup, &daemon),
        &log,
    );
    let pid = daemon.wait_for("the daemon's pid file", Duration::from_secs(10), || {
        std::fs::read_to_string(user.run_dir().join("daemon.pid")).ok()
    });
    let maps = |file: &str| -> Vec<String> {
        std::fs::read_to_string(format!("/proc/{}/{file}", pid.trim()))
            .unwrap()
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(maps("uid_map"), ["0 4312 1", "1 200000 65536"]);
    assert_eq!(maps("gid_map"), ["0 4312 1", "1 300000 65536"]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("subordinate ids"), "{text}");
    // And it serves as ever.
    let g = user.guest(&world, "shared", &[]);
    assert_eq!(g.udhcpc(), g.ip());
    g.assert_reaches_upstream("a guest of a daemon with subordinate ids");
}
