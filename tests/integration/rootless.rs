//! Rootless: a user without root (a bare numeric uid, nothing in /etc)
//! runs `linnet run`, which starts that user's own daemon in a user and
//! network namespace of theirs, with pasta (or slirp4netns) as its way
//! out. Everything a user runs here runs as that uid, in a mount
//! namespace whose /dev/net/tun is a node of its own, 0666 as
//! distributions ship it. The guests' VMMs (the stand-in) are the user's
//! too: each makes its guest in namespaces of its own, which the test then
//! enters as root to play the VM.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
        let uid = self.uid.to_string();
        let env = [
            format!("HOME={}", self.home.display()),
            format!("XDG_RUNTIME_DIR={}", self.home.join("run").display()),
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            "LINNET_LOG=debug".to_string(),
        ];
        let mut full: Vec<&str> = vec![
            "setpriv",
            "--reuid",
            &uid,
            "--regid",
            &uid,
            "--clear-groups",
            "env",
            "-i",
        ];
        full.extend(env.iter().map(String::as_str));
        full.extend_from_slice(argv);
        with_own_dev_net(&world.host, true, &full)
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
        self.try_guest(world, network, extra)
            .unwrap_or_else(|e| panic!("attach failed: {e}\n{}", self.daemon_log()))
    }

    pub fn try_guest(&self, world: &World, network: &str, extra: &[&str]) -> Result<Guest, String> {
        let name = unique("rguest");
        let json = world.dir.path().join(format!("{name}.json"));
        let pid_file = world.dir.path().join(format!("{name}.pid"));
        let stderr = world.dir.path().join(format!("{name}.stderr"));
        let standin = standin_bin();
        let own = format!("own:{}", pid_file.display());
        let mut args = vec![
            "run",
            "--network",
            network,
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[
            "--",
            standin.to_str().unwrap(),
            "--fd",
            "{fd}",
            "--netns",
            &own,
        ]);
        let mut run = self
            .linnet(world, &args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let failed = |run: &mut std::process::Child| -> Option<String> {
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
            vmm: None,
            info,
        })
    }
}

/// The processes of `uid` in the sandbox (but zombies: the sandbox's
/// init is the test, which reaps only its own children).
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

#[test]
fn rootless_guests_lease_resolve_and_reach_each_other_upstream_and_the_hosts_loopback() {
    let world = World::new();
    // A service on the host's own loopback, which the VMs reach through
    // the gateway address the attach JSON names.
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
    assert!(
        processes_of(0).iter().all(|p| !p.contains("linnet daemon")),
        "no daemon runs as root"
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
