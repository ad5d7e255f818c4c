//! Tenant safety: what a hostile VMM (through the fd linnet gave it) or a
//! local user (through the daemon's socket) can do to other tenants.

use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

/// The bridge's MAC, as the kernel has it.
fn link_mac(ns: &Netns, link: &str) -> String {
    let out = must(&mut ns.cmd(&["ip", "-o", "link", "show", link]));
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("an Ethernet address")
        .to_string()
}

/// `linnet run -- hostile_vmm.py set-mac {fd} MAC`, once the VMM has set it.
fn vmm_setting_its_tap_mac(world: &World, mac: &str) -> (Reaped, Value) {
    let json = world.run_dir().join(format!("{}.json", unique("hostile")));
    let script = repo_file("tests/hostile_vmm.py");
    let mut child = Reaped(
        world
            .linnet(&[
                "run",
                "--network",
                "shared",
                "--json",
                json.to_str().unwrap(),
            ])
            .args(["--", "python3", &script, "set-mac", "{fd}", mac])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "set", "the VMM set its TAP's MAC");
    let info = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (child, info)
}

fn listed(world: &World, id: &Value) -> Value {
    let ls: Value = serde_json::from_str(&must(&mut world.linnet(&["ls", "--json"]))).unwrap();
    ls["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| &i["interface_id"] == id)
        .cloned()
        .expect("listed")
}

#[test]
fn a_vmm_that_changes_its_taps_mac_is_cut_off_and_harms_no_one() {
    let mut world = World::new();
    world.start_daemon();
    let victim = world.guest("shared", &[]);
    assert_eq!(victim.udhcpc(), victim.ip());
    let bridge_mac = link_mac(&world.host, "ln-shared");
    let ping_victim = || {
        run(&mut world.host.cmd(&[
            "busybox",
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            &victim.ip().to_string(),
        ]))
        .status
        .success()
    };
    assert!(victim.ping(&victim.gateway()));
    assert!(ping_victim());

    // One VMM takes the victim's MAC for its TAP, another the lowest MAC
    // there is (a bridge without a MAC of its own would take it).
    let (_thief, thief) = vmm_setting_its_tap_mac(&world, &victim.mac());
    let (_lowest, lowest) = vmm_setting_its_tap_mac(&world, "00:00:00:00:00:01");
    for info in [&thief, &lowest] {
        let tap = info["tap"].as_str().unwrap().to_string();
        let why = wait_for("the TAP to be cut off", Duration::from_secs(5), || {
            listed(&world, &info["interface_id"])["cut_off"]
                .as_str()
                .map(String::from)
        });
        assert!(why.contains("changed the TAP's MAC"), "{why}");
        let link = must(&mut world.host.cmd(&["ip", "-o", "link", "show", &tap]));
        assert!(!link.contains("master") && !link.contains(",UP"), "{link}");
        let human = must(&mut world.linnet(&["ls"]));
        assert!(human.contains(&format!("(TAP {tap})")), "{human}");
    }
    assert!(
        world
            .daemon_log_text()
            .contains("the VMM changed its TAP's MAC")
    );
    assert_eq!(
        link_mac(&world.host, "ln-shared"),
        bridge_mac,
        "the gateway's MAC stays"
    );
    let fdb = must(
        &mut world
            .host
            .cmd(&["bridge", "fdb", "show", "br", "ln-shared"]),
    );
    assert!(
        fdb.lines()
            .filter(|l| l.starts_with(&victim.mac()))
            .all(|l| l.contains(&victim.tap())),
        "the victim's MAC leads only to its own port: {fdb}"
    );
    assert!(ping_victim(), "the host still reaches the victim");
    assert!(
        victim.ping(&victim.gateway()),
        "the victim still reaches its gateway"
    );
    victim.assert_reaches_upstream("the victim");
}
