//! `linnet events`: a VM's whole life as JSON lines, a network's alone,
//! what a restarted daemon adopted, and a subscriber that does not read
//! missing events (told how many) while the daemon serves everyone else.

use std::io::{BufRead, BufReader};
use std::process::ChildStdout;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;

/// `linnet events ARGS…`, running, and its lines.
pub struct Follower {
    _child: Reaped,
    lines: std::sync::mpsc::Receiver<Value>,
}

impl Follower {
    pub fn start(world: &World, args: &[&str]) -> Follower {
        let before = world.daemon_log_text().matches("following events").count();
        let mut argv = vec!["events"];
        argv.extend_from_slice(args);
        let mut child = Reaped(
            world
                .linnet(&argv)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let out: ChildStdout = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let event: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not one JSON object a line: {e}: {line}"));
                if send.send(event).is_err() {
                    return;
                }
            }
        });
        // Subscribed once the daemon says so.
        wait_for("the subscription", Duration::from_secs(5), || {
            (world.daemon_log_text().matches("following events").count() > before).then_some(())
        });
        Follower {
            _child: child,
            lines,
        }
    }

    /// The next event of kind `kind`, the ones before it skipped.
    pub fn next(&self, kind: &str) -> Value {
        self.until(kind).pop().expect("until ends with one")
    }

    /// Every event up to the next of `kind`, that one last (10 s at most).
    pub fn until(&self, kind: &str) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(event) => {
                    let last = event["event"] == kind;
                    seen.push(event);
                    if last {
                        return seen;
                    }
                }
                Err(_) => panic!("no {kind} event within 10 s; saw {seen:?}"),
            }
        }
    }

    /// Every event until none comes for `quiet`.
    pub fn drain(&self, quiet: Duration) -> Vec<Value> {
        std::iter::from_fn(|| self.lines.recv_timeout(quiet).ok()).collect()
    }
}

#[test]
fn events_follow_a_vms_whole_life() {
    let mut world = World::new();
    world.start_daemon();
    let all = Follower::start(&world, &[]);
    let host_only = Follower::start(&world, &["--network", "host"]);
    let mut g = world.guest("shared", &["--name", "ev1"]);
    let ip = g.udhcpc();
    let id = g.info["interface_id"].as_str().unwrap().to_string();
    must(&mut world.linnet(&[
        "policy",
        "set",
        "--network",
        "shared",
        "--name",
        "ev1",
        "--rate-limit",
        "50mbit",
    ]));
    must(&mut world.linnet(&[
        "forward",
        "add",
        "--network",
        "shared",
        "--name",
        "ev1",
        "8022:22",
    ]));
    must(&mut world.linnet(&[
        "forward",
        "rm",
        "--network",
        "shared",
        "--name",
        "ev1",
        "8022:22",
    ]));
    g.stop();

    let up = all.next("network_up");
    assert_eq!(up["network"], "shared");
    assert!(up["time_ms"].as_u64().unwrap() > 1_700_000_000_000);
    let attached = all.next("attached");
    assert_eq!(
        (
            &attached["interface_id"],
            &attached["name"],
            &attached["ip_address"],
            &attached["datapath"]
        ),
        (
            &Value::from(id.as_str()),
            &Value::from("ev1"),
            &Value::from(ip.to_string()),
            &Value::from("tap")
        ),
        "{attached}"
    );
    let lease = all.next("lease");
    assert_eq!(lease["ip_address"], ip.to_string());
    assert_eq!(lease["mac_address"], g.mac());
    let policy = all.next("policy");
    assert_eq!(policy["policy"]["rate_limit"]["in"], "50mbit");
    let added = all.next("forward");
    assert_eq!(
        (added["forward"].as_str(), added["added"].as_bool()),
        (Some("8022:22/tcp"), Some(true))
    );
    let removed = all.next("forward");
    assert_eq!(removed["added"], false);
    let detached = all.next("detached");
    assert_eq!(detached["interface_id"], id.as_str());
    assert_eq!(all.next("network_down")["network"], "shared");

    // The host network's follower saw none of that (what the first saw
    // above); a host VM's attach, and what comes with it, it sees.
    let early = host_only.drain(Duration::from_millis(500));
    assert!(early.is_empty(), "none of the shared network's: {early:?}");
    let h = world.guest("host", &["--name", "ev2"]);
    let seen = host_only.until("attached");
    assert_eq!(seen.last().unwrap()["name"], "ev2");
    drop(h);
    let mut all_seen = seen;
    all_seen.extend(host_only.until("detached"));
    all_seen.extend(host_only.drain(Duration::from_millis(500)));
    assert!(
        all_seen.iter().all(|e| e["network"] == "host"),
        "only the host network's: {all_seen:?}"
    );
    let refused = failure(&mut world.linnet(&["events", "--network", "nope"]));
    assert!(refused.contains("unknown network \"nope\""), "{refused}");
}

#[test]
fn a_restarted_daemon_tells_what_it_adopted_to_those_who_ask_for_recent_events() {
    let mut world = World::new();
    world.start_daemon();
    let g = world.guest("shared", &["--name", "ad1"]);
    assert_eq!(g.udhcpc(), g.ip());
    let id = g.info["interface_id"].as_str().unwrap().to_string();
    world.stop_daemon();
    world.start_daemon();
    let recent = Follower::start(&world, &["--recent"]);
    let adopted = recent.next("adopted");
    assert_eq!(adopted["interface_id"], id.as_str());
    assert_eq!(adopted["tap"], g.tap());
    // Its `linnet run` claims it again (within a few seconds).
    assert_eq!(recent.next("reclaimed")["interface_id"], id.as_str());
    // Without --recent, nothing from before.
    let now_only = Follower::start(&world, &[]);
    assert!(
        now_only.drain(Duration::from_millis(500)).is_empty(),
        "a subscriber without --recent starts now"
    );
    assert!(g.ping(&g.gateway()));
}

#[test]
fn a_subscriber_that_does_not_read_misses_events_and_holds_nobody_up() {
    let mut world = World::new();
    world.start_daemon();
    let g = world.guest("shared", &["--name", "slow"]);
    assert_eq!(g.udhcpc(), g.ip());
    // Subscribed, and never reading.
    let stalled = crate::api_connect(&world);
    // A missing event fails the test rather than hanging it.
    nix::sys::socket::setsockopt(
        &stalled,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(10, 0),
    )
    .unwrap();
    let (reply, _) = crate::api_call(&stalled, r#"{"op": "events"}"#);
    assert_eq!(reply["reply"], "subscribed", "{reply}");
    let api = crate::api_connect(&world);
    let set = |rate: u32| {
        format!(
            r#"{{"op": "policy_set", "network": "shared", "name": "slow", "only": "rate_limit", "policy": {{"rate_limit": {{"in": "{rate}mbit"}}}}}}"#
        )
    };
    // Far more events than a subscriber may fall behind by (256, and what
    // its socket holds: its backlog of 128), each answered.
    let started = Instant::now();
    for n in 0..800 {
        let (reply, _) = crate::api_call(&api, &set(10 + n % 7));
        assert_eq!(reply["reply"], "policy", "{reply}");
    }
    let took = started.elapsed();
    let ls = must(&mut world.linnet(&["ls"]));
    assert!(ls.contains("slow"), "the daemon answers others: {ls}");
    // Now it reads: the events its socket held, then how many it missed.
    let mut dropped = None;
    let mut policies = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while dropped.is_none() && Instant::now() < deadline {
        let (event, _) = crate::api_read(&stalled);
        match event["event"].as_str() {
            Some("policy") => policies += 1,
            Some("dropped") => dropped = event["count"].as_u64(),
            _ => {}
        }
    }
    let dropped = dropped.unwrap_or_else(|| {
        panic!("no dropped event after {policies} policy events ({took:?} for 800 sets)")
    });
    assert!(
        dropped > 0 && policies > 0,
        "{policies} read, {dropped} dropped"
    );
    assert!(
        policies as u64 + dropped <= 800,
        "{policies} + {dropped} is at most what was sent"
    );
}
