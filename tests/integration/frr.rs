//! `linnet frr-config` against FRR's own parser: vtysh accepts every line
//! of what it prints (and, as a positive control, refuses a line it does
//! not know).

use std::process::Command;

use crate::harness::linnet_bin;

const FABRIC: &str = include_str!("../networks/across-hosts.yaml");

/// vtysh's dry run of `conf`: whether it accepted it, and what it said.
fn vtysh_accepts(dir: &std::path::Path, conf: &str) -> (bool, String) {
    let path = dir.join("frr.conf");
    std::fs::write(&path, conf).unwrap();
    let out = Command::new("vtysh")
        .args(["--dryrun", "-f"])
        .arg(&path)
        .output()
        .expect("vtysh (Debian's frr, from scripts/install-deps)");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (
        out.status.success() && !said.contains("Unknown command"),
        said,
    )
}

/// `linnet --config FILE frr-config` with `yaml` in FILE, in `dir`.
fn frr_config(dir: &std::path::Path, yaml: &str) -> std::process::Output {
    let file = dir.join("networks.yaml");
    std::fs::write(&file, yaml).unwrap();
    Command::new(linnet_bin())
        .arg("--config")
        .arg(&file)
        .arg("frr-config")
        .output()
        .unwrap()
}

#[test]
fn vtysh_accepts_every_line_of_the_frr_config_linnet_prints() {
    let dir = tempfile::tempdir().unwrap();
    let out = frr_config(dir.path(), FABRIC);
    assert!(out.status.success(), "{out:?}");
    let conf = String::from_utf8(out.stdout).unwrap();
    assert!(conf.contains("router bgp 65000"), "{conf}");
    assert!(
        conf.contains("neighbor 192.0.2.14 peer-group linnet"),
        "{conf}"
    );
    let (accepted, said) = vtysh_accepts(dir.path(), &conf);
    assert!(accepted, "vtysh refused linnet's config: {said}\n{conf}");
    // The same check refuses what FRR does not know.
    let broken = conf.replace("  advertise-all-vni", "  advertise-every-vni");
    let (accepted, said) = vtysh_accepts(dir.path(), &broken);
    assert!(!accepted, "vtysh took an unknown line: {said}");
}

#[test]
fn frr_config_without_a_network_across_hosts_says_what_to_add() {
    let dir = tempfile::tempdir().unwrap();
    let out = frr_config(dir.path(), "networks: {}\n");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no network has an evpn: section"), "{said}");
}
