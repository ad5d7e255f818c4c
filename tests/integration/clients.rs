//! The Go client package (clients/go/linnet) against a live daemon: its
//! TestLive attaches (receiving the TAP fd), lists, adds and removes
//! forwards, detaches, and sees an interface go with its connection.

use std::path::Path;
use std::process::Command;

use crate::harness::*;

/// The Go toolchain: on PATH, or where the Go project's tarball puts it.
fn go() -> String {
    for candidate in ["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"] {
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
    let mut world = World::new();
    world.start_daemon();
    let socket = world.run_dir().join("linnet.sock");
    let dir = repo_file("clients/go/linnet");
    let cache = world.run_dir().join("go-cache");
    let out = run(Command::new(go())
        .args(["test", "-count=1", "-run", "^TestLive$", "-v", "./..."])
        .current_dir(&dir)
        .env("LINNET_TEST_SOCKET", &socket)
        // Its own build cache: the sandbox's HOME may not be writable, and
        // nothing from the Go module proxy is needed (no dependencies).
        .env("GOCACHE", &cache)
        .env("GOFLAGS", "-mod=mod -buildvcs=false")
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
    assert!(Path::new(&dir).join("go.mod").exists());
}
