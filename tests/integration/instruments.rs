//! The harness's own instruments can fail: a helper process that ends
//! fails the wait on it at once, saying how and what it said; a server
//! the checks rely on that died during a test fails the test at its end.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

/// The message of the panic `f` ends in (it must end in one).
fn panic_of(f: impl FnOnce()) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("it should have failed");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn a_helper_that_ends_fails_the_wait_at_once_with_its_status_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("quitter.log");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo cannot bind its socket >&2; exit 3"]);
    let quitter = Helper::start("the quitter", cmd, &log);
    let started = Instant::now();
    let message = panic_of(|| {
        quitter.wait_for("its socket", Duration::from_secs(30), || None::<()>);
    });
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        message.contains("the quitter ended (exit status 3)"),
        "{message}"
    );
    assert!(message.contains("cannot bind its socket"), "{message}");
    // The positive control: one that keeps running is waited on until
    // the probe is met.
    let mut cmd = Command::new("sleep");
    cmd.arg("30");
    let sleeper = Helper::start("the sleeper", cmd, &dir.path().join("sleeper.log"));
    let mut rounds = 0;
    sleeper.wait_for("three rounds", Duration::from_secs(5), || {
        rounds += 1;
        (rounds == 3).then_some(())
    });
}

#[test]
fn a_world_whose_upstream_dns_died_fails_at_its_end() {
    let world = World::new();
    // The positive control: its DNS answers while it lives.
    let answer = must(&mut world.host.cmd(&[
        "nslookup",
        "-type=a",
        "-timeout=2",
        UPSTREAM_NAME,
        UPSTREAM_IP,
    ]));
    assert!(answer.contains(UPSTREAM_IP), "{answer}");
    // This world's dnsmasq only (other tests run theirs meanwhile).
    let pid = std::fs::read_to_string(world.dir.path().join("dnsmasq.pid")).unwrap();
    must(Command::new("kill").args(["-KILL", pid.trim()]));
    wait_for("dnsmasq to end", Duration::from_secs(5), || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok()?;
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
            .then_some(())
    });
    let message = panic_of(|| drop(world));
    assert!(
        message.contains("the upstream's DNS (dnsmasq) ended (signal SIGKILL)"),
        "{message}"
    );
}
