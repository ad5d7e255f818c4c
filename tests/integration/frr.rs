//! `linnet frr-config` against FRR's own parser: vtysh accepts every line
//! of what it prints (and, as a positive control, refuses a line it does
//! not know).

use std::process::Command;

use crate::harness::linnet_bin;

const FABRIC: &str = "networks:
  fabric:
    mode: shared
    subnet: 10.77.0.0/24
    dhcp: { range: 10.77.0.10-10.77.0.29 }
    evpn: { vni: 7700, vtep: 192.0.2.11, asn: 65000, peers: [192.0.2.12, 192.0.2.13] }
  lab:
    mode: host
    subnet: 10.78.0.0/24
    evpn: { vni: 7800, vtep: 192.0.2.11, asn: 65000, peers: [192.0.2.14] }
";

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

#[test]
fn vtysh_accepts_every_line_of_the_frr_config_linnet_prints() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("networks.yaml");
    std::fs::write(&yaml, FABRIC).unwrap();
    let out = Command::new(linnet_bin())
        .arg("--config")
        .arg(&yaml)
        .arg("frr-config")
        .output()
        .unwrap();
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
    let yaml = dir.path().join("networks.yaml");
    std::fs::write(&yaml, "networks: {}\n").unwrap();
    let out = Command::new(linnet_bin())
        .arg("--config")
        .arg(&yaml)
        .arg("frr-config")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no network has an evpn: section"), "{said}");
}
