//! `linnet secret`: secrets set from standard input, listed by name only,
//! kept for root alone and across restarts, each user's its own and a
//! network's root's (issue 51, "Secrets held by linnet").

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::harness::*;

const VALUE: &str = "ghp_Sup3rSecretValue0001";
const ROTATED: &str = "ghp_Sup3rSecretValue0002";
const NETWORK_VALUE: &str = "npm_NetworkWideValue";

/// `cmd` with `input` on its standard input.
fn with_input(mut cmd: Command, input: &str) -> Output {
    let mut child = (cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()))
    .spawn()
    .unwrap();
    // A command that refuses before it reads may be gone: not an error here.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().unwrap()
}

fn set_as(world: &World, who: &[&str], args: &[&str], input: &str) -> Output {
    let mut argv = vec!["secret", "set"];
    argv.extend_from_slice(args);
    with_input(world.linnet_wrapped(who, &argv), input)
}

/// The secrets `who` is shown, as (name, owner) pairs.
fn listed(world: &World, who: &[&str]) -> Vec<(String, Value)> {
    let out = must(&mut world.linnet_wrapped(who, &["secret", "ls", "--json"]));
    assert!(
        !out.contains(VALUE) && !out.contains(NETWORK_VALUE),
        "{out}"
    );
    let list: Vec<Value> = serde_json::from_str(&out).unwrap();
    list.into_iter()
        .map(|s| (s["name"].as_str().unwrap().to_string(), s["owner"].clone()))
        .collect()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn secrets_are_set_from_standard_input_listed_without_values_and_kept_for_root_alone() {
    let mut world =
        World::with_config("networks:\n  shared:\n    allow: { users: [root, nobody] }\n");
    world.start_daemon();

    // A user's own, from a pipe (the final newline is not part of it).
    let out = set_as(&world, AS_NOBODY, &["TOKEN"], &format!("{VALUE}\n"));
    assert!(out.status.success(), "{}", stderr(&out));
    // A network's, by root; a user may not set one.
    let out = set_as(&world, &[], &["--network", "shared", "NPM"], NETWORK_VALUE);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = set_as(&world, AS_NOBODY, &["--network", "shared", "MINE"], "x");
    assert!(
        !out.status.success() && stderr(&out).contains("only root may set a network's secret"),
        "{}",
        stderr(&out)
    );

    // Each sees its own and its networks'; root all; values never.
    let nobody = listed(&world, AS_NOBODY);
    assert_eq!(
        nobody,
        [
            ("TOKEN".to_string(), serde_json::json!({"uid": 65534})),
            ("NPM".to_string(), serde_json::json!({"network": "shared"})),
        ]
    );
    assert_eq!(
        listed(&world, AS_4242),
        [],
        "not nobody's, nor a network it may use"
    );
    assert_eq!(listed(&world, &[]).len(), 2);
    let table = must(&mut world.linnet_wrapped(AS_NOBODY, &["secret", "ls"]));
    assert!(
        table.contains("TOKEN") && table.contains("uid 65534"),
        "{table}"
    );
    assert!(!table.contains(VALUE), "{table}");

    // Another user removes only its own (and has none of that name).
    let err = failure(&mut world.linnet_wrapped(AS_4242, &["secret", "rm", "TOKEN"]));
    assert!(err.contains("no secret \"TOKEN\" of uid 4242"), "{err}");
    assert_eq!(
        listed(&world, AS_NOBODY).len(),
        2,
        "nobody's is still there"
    );

    // What is refused, and why.
    let out = set_as(&world, AS_NOBODY, &["TOKEN"], "two\nlines");
    assert!(
        stderr(&out).contains("control character"),
        "{}",
        stderr(&out)
    );
    let out = set_as(&world, AS_NOBODY, &["TOKEN"], "");
    assert!(stderr(&out).contains("value is empty"), "{}", stderr(&out));
    let out = set_as(&world, AS_NOBODY, &["1x"], VALUE);
    assert!(
        stderr(&out).contains("is not a secret name"),
        "{}",
        stderr(&out)
    );
    let out = set_as(&world, &[], &["--network", "nosuch", "X"], VALUE);
    assert!(
        stderr(&out).contains("unknown network \"nosuch\""),
        "{}",
        stderr(&out)
    );

    // Kept in a file root alone may read, the rotated value in place of
    // the first.
    let out = set_as(&world, AS_NOBODY, &["TOKEN"], ROTATED);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = world.state_dir().join("secrets.json");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!((meta.permissions().mode() & 0o777, meta.uid()), (0o600, 0));
    let kept = std::fs::read_to_string(&file).unwrap();
    assert!(
        kept.contains(ROTATED) && !kept.contains(VALUE),
        "rotated in the file"
    );
    let read = run(Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "cat",
        ])
        .arg(&file));
    assert!(!read.status.success(), "nobody read the secrets file");

    // Across a restart; then removed by its owner.
    world.stop_daemon();
    world.start_daemon();
    assert_eq!(listed(&world, AS_NOBODY).len(), 2, "kept across a restart");
    must(&mut world.linnet_wrapped(AS_NOBODY, &["secret", "rm", "TOKEN"]));
    assert_eq!(
        listed(&world, AS_NOBODY),
        [("NPM".to_string(), serde_json::json!({"network": "shared"}))]
    );
    let kept = std::fs::read_to_string(&file).unwrap();
    assert!(
        !kept.contains(ROTATED) && kept.contains(NETWORK_VALUE),
        "{kept}"
    );

    // No value in the daemon's log.
    let log = world.daemon_log_text();
    assert!(
        log.contains("secret set") && log.contains("TOKEN"),
        "the log names them"
    );
    for v in [VALUE, ROTATED, NETWORK_VALUE] {
        assert!(!log.contains(v), "a value in the daemon's log");
    }
}
