//! The Go client package (clients/go/linnet) against a live daemon: its
//! TestLive attaches (receiving the TAP fd), lists, adds and removes
//! forwards, detaches, and sees an interface go with its connection; and
//! hands a TAP it received to the stand-in VM, which leases the address
//! the client was told.

use std::path::Path;
use std::process::Command;

use crate::harness::*;

/// The Go toolchain: $GO (the Makefile exports it), on PATH, or where Go's
/// own tarball puts it.
fn go() -> String {
    let given = std::env::var("GO").ok();
    for candidate in given
        .iter()
        .map(String::as_str)
        .chain(["go", "/usr/local/go/bin/go"])
    {
        if Command::new(candidate)
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return candidate.into();
        }
    }
    panic!("no Go toolchain: scripts/install-deps installs Debian's golang-go");
}

#[test]
fn go_client_attaches_lists_forwards_and_detaches() {
    let mut world = World::with_config("networks:\n  shared:\n    socket: true\n");
    world.start_daemon();
    let socket = world.run_dir().join("linnet.sock");
    let guest = Netns::new("guest");
    let dir = repo_file("clients/go/linnet");
    // A build cache that outlives the test (the standard library builds
    // once), and nothing fetched: the package has no dependencies.
    let cache = Path::new(&repo_file("target")).join("go-cache");
    let out = run(Command::new(go())
        .args([
            "test",
            "-count=1",
            "-timeout=120s",
            "-run",
            "^TestLive$",
            "-v",
            "./...",
        ])
        .current_dir(&dir)
        .env("LINNET_TEST_SOCKET", &socket)
        .env(
            "LINNET_TEST_NETWORK_SOCKET",
            world.run_dir().join("shared.sock"),
        )
        .env("LINNET_TEST_STANDIN", standin_bin())
        .env("LINNET_TEST_NETNS", &guest.name)
        .env(
            "LINNET_TEST_UDHCPC_SCRIPT",
            repo_file("guest/udhcpc.script"),
        )
        .env("GOCACHE", &cache)
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "go test failed:\n{text}\n{}",
        world.daemon_log_text()
    );
    assert!(
        text.contains("--- PASS: TestLive") && !text.contains("SKIP"),
        "TestLive did not run and pass:\n{text}"
    );
}
