//! kill -9 at any instant (issue 49, "Crashes at any instant"): VMs
//! attach on every datapath and leave (their client stopped or killed)
//! while the daemon is killed with SIGKILL at random instants, a hundred
//! times, each followed by a new daemon. After each: every VM whose client
//! lives is listed with the MAC and address it was given and still carries
//! traffic; nothing is left of a VM whose client is gone (TAP, record,
//! lease held, rule or set element naming its TAP); every state file
//! parses and no temporary one is left.

use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;

/// Daemons killed.
const KILLS: usize = 100;
/// VMs alive at most between two kills: more, and the round makes some leave.
const MOST: usize = 6;
/// The latest instant of a kill after a round's attaches and leaves start.
const KILL_WITHIN_MS: u64 = 400;
/// About how long the round's attaches take, from their start.
const ATTACHING_MS: u64 = 30;
/// Every datapath a VMM attaches through (a TAP by name and a network's
/// socket are attached as a tap is: `tap_name.rs`, `network_sockets.rs`).
const VIAS: [Via; 7] = [
    Via::Tap,
    Via::RunDgram,
    Via::RunStream,
    Via::RunVhostUser,
    Via::HelperDgram,
    Via::HelperStream,
    Via::HelperVhostUser,
];

/// xorshift64*: the storm's instants and choices, from a seed printed so
/// that a failing storm can be run again (LINNET_STORM_SEED).
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = std::env::var("LINNET_STORM_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("the storm's seed: LINNET_STORM_SEED={seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// A VM that lives through the kills, and what it was given.
struct Live {
    guest: Guest,
    via: Via,
    id: Value,
    mac: String,
    ip: String,
}

impl Live {
    /// Its address on eth0 (what DHCP would give it, set by hand: a
    /// hundred rounds of DHCP would measure DHCP), and a first ping.
    fn new(guest: Guest, via: Via) -> Live {
        let ip = guest.ip().to_string();
        let prefix = guest.info["subnet"]
            .as_str()
            .unwrap()
            .split('/')
            .nth(1)
            .unwrap()
            .to_string();
        must(&mut guest.ns.cmd(&["ip", "link", "set", "eth0", "up"]));
        must(&mut guest.ns.cmd(&[
            "ip",
            "addr",
            "add",
            &format!("{ip}/{prefix}"),
            "dev",
            "eth0",
        ]));
        Live {
            id: guest.info["interface_id"].clone(),
            mac: guest.mac(),
            ip,
            via,
            guest,
        }
    }

    /// The process the daemon knows as its client: `linnet run`, or the
    /// relay `linnet helper` became.
    fn client_pid(&self) -> u32 {
        self.guest.run.as_ref().unwrap().id()
    }

    /// Its client and the client's children (a relay may be one): the
    /// processes whose pid a relay's private directory may bear.
    fn processes(&self) -> Vec<u32> {
        let parent_of = |pid: u32| -> Option<u32> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            stat.rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        let all: Vec<u32> = (std::fs::read_dir("/proc").unwrap().flatten())
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        let mut tree = vec![self.client_pid()];
        let mut k = 0;
        while k < tree.len() {
            let pid = tree[k];
            tree.extend(all.iter().filter(|&&c| parent_of(c) == Some(pid)));
            k += 1;
        }
        tree
    }
}

/// Ends a client: SIGTERM (it detaches, or finds no daemon to tell) or
/// SIGKILL. A client that outlives its SIGTERM by 10 s fails the test.
fn leave(mut live: Live, kill: bool) {
    let run = live.guest.run.as_mut().unwrap();
    if kill {
        run.kill().unwrap();
        run.wait().unwrap();
    } else {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &run.id().to_string()])
            .status();
        reap_within(run, Duration::from_secs(10), "a client after its SIGTERM");
    }
    // The VMM goes with it (Guest's drop).
}

fn reap_within(child: &mut Child, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "{what} did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon a client started: `linnet run` and `linnet helper`, as root,
/// start one when none answers (as they do for a user), so an attach
/// after a kill often meets a daemon of its own making, detached from the
/// test. Killed when the test ends, however it ends.
struct Started(Option<u32>);

impl Started {
    /// The daemon a client started for `world`'s run directory, if one runs.
    fn find(world: &World) -> Option<u32> {
        let run_dir = world.run_dir().to_string_lossy().into_owned();
        std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<String> = (cmdline.split(|&b| b == 0))
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (args.iter().any(|a| a == "daemon") && args.contains(&run_dir)).then_some(pid)
        })
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            // SAFETY: a signal to a pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// The logs of every daemon so far: the test's own, and those clients
/// started (in the run directory).
fn logs(world: &World) -> String {
    let started = std::fs::read_to_string(world.run_dir().join("daemon.log")).unwrap_or_default();
    format!(
        "{}\n---- daemons clients started ----\n{started}",
        world.daemon_log_text()
    )
}

#[derive(Default, Debug)]
struct Counts {
    attached: usize,
    /// Attaches that met no daemon, or one killed while it answered.
    refused: usize,
    /// Daemons a client started, after a kill.
    started_by_clients: usize,
    stopped: usize,
    killed: usize,
    pings: usize,
}

#[test]
fn sigkill_at_random_instants_of_an_attach_and_detach_storm_keeps_every_live_vm_and_leaves_nothing_else()
 {
    let mut world = World::new();
    world.start_daemon();
    let mut rng = Rng::seeded();
    let mut live: Vec<Live> = Vec::new();
    let mut gone: Vec<(Value, String)> = Vec::new();
    let mut counts = Counts::default();
    let mut started = Started(None);
    // The vhost-user relays gone: a killed one cannot remove its private
    // directory, the next relay of the user's does.
    let mut relays_gone: Vec<u32> = Vec::new();
    let began = Instant::now();
    for round in 0..KILLS {
        // Who leaves this round (any, more often when many are up), who
        // comes (one to three, on any datapath), and when the kill falls.
        let mut leaving = Vec::new();
        while !live.is_empty() && (live.len() > MOST - 2 || rng.below(3) == 0) {
            leaving.push((
                live.swap_remove(rng.below(live.len() as u64) as usize),
                rng.below(2) == 0,
            ));
            if leaving.len() == 2 {
                break;
            }
        }
        let most_coming = (MOST + 1).saturating_sub(live.len()).clamp(1, 3) as u64;
        let coming: Vec<Via> = (0..1 + rng.below(most_coming))
            .map(|_| VIAS[rng.below(7) as usize])
            .collect();
        // Half the kills fall while the attaches are on their way (a few
        // ms each), the rest anywhere in the round.
        let within = if rng.below(2) == 0 {
            ATTACHING_MS
        } else {
            KILL_WITHIN_MS
        };
        let delay = Duration::from_millis(rng.below(within));
        let pid = started.0.take().unwrap_or_else(|| world.daemon_pid());
        for (l, kill) in &leaving {
            gone.push((l.id.clone(), l.guest.tap()));
            if matches!(l.via, Via::RunVhostUser | Via::HelperVhostUser) {
                relays_gone.extend(l.processes());
            }
            if *kill {
                counts.killed += 1;
            } else {
                counts.stopped += 1;
            }
        }
        let came: Vec<(Via, Result<Guest, String>)> = std::thread::scope(|s| {
            let world = &world;
            let attaching: Vec<_> = (coming.iter())
                .map(|&via| s.spawn(move || (via, world.try_guest_via("shared", via, &[]))))
                .collect();
            let leaving = s.spawn(move || {
                for (l, kill) in leaving {
                    leave(l, kill);
                }
            });
            std::thread::sleep(delay);
            // SAFETY: a signal to a pid (one that ended on its own is fine).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            leaving.join().unwrap();
            attaching.into_iter().map(|t| t.join().unwrap()).collect()
        });
        // Killed is not yet gone: the kernel closes a killed process's
        // files as it exits, the run directory's lock last, after its
        // sockets (a packet socket's close waits for a grace period).
        wait_for(
            "the killed daemon to be gone",
            Duration::from_secs(10),
            || {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                (status.is_empty() || status.contains("State:\tZ")).then_some(())
            },
        );
        if world.has_daemon() {
            world.kill_daemon();
        }
        for (via, attached) in came {
            match attached {
                Ok(guest) => {
                    counts.attached += 1;
                    live.push(Live::new(guest, via));
                }
                Err(_) => counts.refused += 1,
            }
        }
        // The next daemon: one a client started meanwhile, or the test's.
        // A client may start one between the look and the test's start,
        // and a daemon on its way out holds the run directory's lock until
        // its last file is released: the test's start then finds the
        // directory locked, and looks again.
        started.0 = wait_for("a daemon up", Duration::from_secs(15), || {
            if let Some(pid) = Started::find(&world) {
                return Some(Some(pid));
            }
            match world.try_start_daemon_with(&[], &[]) {
                Ok(()) => Some(None),
                Err(e) if e.contains("another linnet daemon is running") => None,
                Err(e) => panic!("{e}"),
            }
        });
        if started.0.is_some() {
            counts.started_by_clients += 1;
        }
        let daemon = started.0.unwrap_or_else(|| world.daemon_pid());
        check(&world, daemon, &mut live, &gone, round);
        for l in &live {
            assert!(
                l.guest.ns.ping(&l.guest.gateway()),
                "round {round}: the {:?} VM {} cannot reach its gateway",
                l.via,
                l.ip
            );
            counts.pings += 1;
        }
    }
    eprintln!(
        "{KILLS} daemons killed in {:.0} s: {counts:?}, {} VMs alive at the end",
        began.elapsed().as_secs_f64(),
        live.len()
    );
    // A vhost-user helper's relay killed leaves its private directory
    // (the control; `linnet run`'s, serving one VMM, removes it once the
    // VMM is connected), which the user's next relay removes, with those
    // of every relay killed in the storm.
    let killed = Live::new(
        world.guest_via("shared", Via::HelperVhostUser, &[]),
        Via::HelperVhostUser,
    );
    let pids = killed.processes();
    relays_gone.extend(&pids);
    let dirs_of = |pids: &[u32]| -> Vec<String> {
        (files_in(&std::env::temp_dir()).into_iter())
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .filter(|n| {
                (pids.iter()).any(|pid| n.starts_with(&format!("linnet-vhost-user-{pid}-")))
            })
            .collect()
    };
    leave(killed, true);
    assert_eq!(dirs_of(&pids).len(), 1, "a killed relay's directory");
    let next = Live::new(
        world.guest_via("shared", Via::HelperVhostUser, &[]),
        Via::HelperVhostUser,
    );
    let left = dirs_of(&relays_gone);
    assert!(
        left.is_empty(),
        "the next relay ({}) left these of the {} gone: {left:?}",
        next.id,
        relays_gone.len()
    );
    // The rest stop as VMMs do, each relay removing its own directory.
    let pids: Vec<u32> = live
        .iter()
        .chain([&next])
        .flat_map(Live::processes)
        .collect();
    for l in live.drain(..).chain([next]) {
        leave(l, false);
    }
    assert_eq!(
        dirs_of(&pids),
        Vec::<String>::new(),
        "relays that stopped left these"
    );
    assert!(
        counts.attached >= KILLS / 2,
        "too few attaches answered to tell: {counts:?}"
    );
    assert!(
        counts.refused + counts.started_by_clients > 0,
        "no attach met a killed daemon: {counts:?}"
    );
    assert!(counts.stopped > 0 && counts.killed > 0, "{counts:?}");
}

/// What a new daemon (`daemon`, its pid) must show after a kill (`round`
/// names it).
fn check(world: &World, daemon: u32, live: &mut [Live], gone: &[(Value, String)], round: usize) {
    // Each live VM's client and VMM outlive the kills.
    for l in live.iter_mut() {
        let ns = l.guest.ns.name.clone();
        for child in [l.guest.run.as_mut(), l.guest.vmm.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Some(status) = child.try_wait().unwrap() {
                let said = |ext: &str| {
                    std::fs::read_to_string(world.dir.path().join(format!("{ns}.{ext}")))
                        .unwrap_or_default()
                };
                panic!(
                    "round {round}: a process of the {:?} VM {} exited ({status}):\n{}\n{}",
                    l.via,
                    l.ip,
                    said("stderr"),
                    said("stderr.vmm")
                );
            }
        }
    }
    let live = &*live;
    let wanted: Vec<(Value, String, String, u32)> = (live.iter())
        .map(|l| (l.id.clone(), l.mac.clone(), l.ip.clone(), l.client_pid()))
        .collect();
    let listed = |i: &Value| {
        (
            i["interface_id"].clone(),
            i["mac_address"].as_str().unwrap_or_default().to_string(),
            i["ip_address"].as_str().unwrap_or_default().to_string(),
            i["client_pid"].as_u64().unwrap_or_default() as u32,
        )
    };
    let mut last = String::new();
    let settled = (0..500).any(|_| {
        let ls: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap();
        let mut got: Vec<_> = ls["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(listed)
            .collect();
        let mut want = wanted.clone();
        got.sort_by_key(|g| g.0.to_string());
        want.sort_by_key(|g| g.0.to_string());
        last = format!("{got:?}");
        got == want || {
            std::thread::sleep(Duration::from_millis(20));
            false
        }
    });
    assert!(
        settled,
        "round {round}: listed {last}\nwanted {wanted:?}\n{}",
        logs(world)
    );
    let mut taps: Vec<String> = world.host.vm_taps();
    let mut want_taps: Vec<String> = live.iter().map(|l| l.guest.tap()).collect();
    taps.sort();
    want_taps.sort();
    let missing: Vec<String> = (live.iter())
        .filter(|l| !taps.contains(&l.guest.tap()))
        .map(|l| {
            let said = |ext: &str| {
                let path = world.dir.path().join(format!("{}.{ext}", l.guest.ns.name));
                std::fs::read_to_string(path).unwrap_or_default()
            };
            format!(
                "{:?} {} ({}): {}{}",
                l.via,
                l.ip,
                l.guest.tap(),
                said("stderr"),
                said("stderr.vmm")
            )
        })
        .collect();
    assert_eq!(
        taps,
        want_taps,
        "round {round}: the TAPs left; the clients of those missing said:\n{}\nthe daemons' log:\n{}",
        missing.join("\n"),
        logs(world)
    );
    // The same probe finds each live VM's TAP in the rules (its guard).
    let ruleset = world.host.nft_ruleset();
    for tap in &want_taps {
        assert!(
            ruleset.contains(&format!("\"{tap}\"")),
            "round {round}: no rule names {tap}, a live VM's TAP:\n{ruleset}"
        );
    }
    for (id, tap) in gone {
        if !want_taps.contains(tap) {
            assert!(
                !ruleset.contains(&format!("\"{tap}\"")),
                "round {round}: a rule names {tap}, the TAP of {id}, gone"
            );
        }
    }
    // Every record is a live VM's, and parses.
    let records: Vec<Value> = files_in(&world.run_dir().join("interfaces"))
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| read_json(p, round))
        .collect();
    let mut recorded: Vec<String> = records
        .iter()
        .map(|r| r["interface_id"].to_string())
        .collect();
    let mut ids: Vec<String> = live.iter().map(|l| l.id.to_string()).collect();
    recorded.sort();
    ids.sort();
    assert_eq!(recorded, ids, "round {round}: the interface records");
    // The leases: each live VM's held for it at its address, no other
    // held (a gone VM's address stays its MAC's for the lease time, as
    // after any detach, and then goes).
    wait_until_leases(
        &world.state_dir().join("leases").join("shared.json"),
        live,
        round,
    );
    // Nothing torn, nothing half-written left behind (but what the new
    // daemon is writing now).
    let writing = format!(".tmp.{daemon}.");
    for dir in [world.state_dir(), world.run_dir()] {
        for path in walk(&dir) {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            assert!(
                !name.contains(".tmp.") || name.contains(&writing),
                "round {round}: a temporary file a killed daemon wrote is left: {}",
                path.display()
            );
            if name.ends_with(".json") {
                read_json(&path, round);
            }
        }
    }
}

/// Waits until the lease file holds (indefinitely: attached) exactly the
/// live VMs' addresses, each for its interface: the daemon writes it in
/// the background.
fn wait_until_leases(path: &std::path::Path, live: &[Live], round: usize) {
    let mut want: Vec<(String, String)> = live
        .iter()
        .map(|v| (v.id.to_string(), v.ip.clone()))
        .collect();
    want.sort();
    let mut last = Value::Null;
    for _ in 0..250 {
        let file: Value = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!("round {round}: {} does not parse: {e}", path.display())
            }),
            // Not written yet: the network had no lease.
            Err(_) => serde_json::json!({"leases": []}),
        };
        let mut held: Vec<(String, String)> = (file["leases"].as_array().unwrap().iter())
            .filter(|l| l["held_until"].is_null() && l["owner"]["kind"] == "interface")
            .map(|l| {
                (
                    l["owner"]["id"].to_string(),
                    l["ip"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        held.sort();
        if held == want {
            return;
        }
        last = file;
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("round {round}: the leases held are not the live VMs' ({want:?}): {last}");
}

/// A state file, which must parse; None when it went meanwhile (the
/// daemon replaced or removed it between the listing and the read).
fn read_json(path: &std::path::Path, round: usize) -> Option<Value> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("round {round}: cannot read {}: {e}", path.display()),
    };
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("round {round}: {} does not parse: {e}", path.display()));
    Some(value)
}

fn files_in(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for path in files_in(dir) {
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
