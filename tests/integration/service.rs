//! linnet as a system service: started by its socket (as linnet.socket
//! starts it; `systemd-socket-activate` plays systemd), telling the service
//! manager when it is ready, logging for the journal, exiting when idle.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::process::Stdio;
use std::time::Duration;

use crate::harness::*;

#[test]
fn a_socket_activated_daemon_starts_on_the_first_connection_says_it_is_ready_and_starts_again_after_an_idle_exit()
 {
    let world = World::new();
    std::fs::create_dir_all(world.run_dir()).unwrap();
    let socket = world.run_dir().join("linnet.sock");
    let notify_path = world.dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let log = world.dir.path().join("service.log");
    std::fs::write(&log, "").unwrap();
    // The journal's stream, as systemd names it: the log file's device and
    // inode.
    let meta = std::fs::metadata(&log).unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    // The socket unit: listening again each time the daemon has exited.
    let script = format!(
        "while :; do rm -f {socket}; systemd-socket-activate --seqpacket -l {socket} \
         -E LINNET_RUN_DIR={run} -E LINNET_STATE_DIR={state} -E NOTIFY_SOCKET={notify} \
         -E JOURNAL_STREAM={stream} {linnet} daemon --idle-exit 1 2>>{log}; done",
        socket = socket.display(),
        run = world.run_dir().display(),
        state = world.state_dir().display(),
        notify = notify_path.display(),
        linnet = linnet_bin().display(),
        log = log.display(),
    );
    let _unit = Reaped(
        world
            .host
            .cmd(&["sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the socket", Duration::from_secs(10), || {
        socket.exists().then_some(())
    });
    let said = |within: Duration| {
        notify.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 64];
        notify
            .recv(&mut buf)
            .ok()
            .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    assert_eq!(
        said(Duration::from_millis(300)),
        None,
        "nothing runs before a client comes"
    );
    for start in ["first", "second"] {
        // A client's connection starts the daemon, which answers it (in
        // time: a daemon blocked in accept never would).
        must(&mut world.linnet_wrapped(&["timeout", "10"], &["ls"]));
        assert_eq!(
            said(Duration::from_secs(10)).as_deref(),
            Some("READY=1"),
            "{start} start"
        );
        // Idle (no interface, no client, no network up) for a second: it exits.
        assert_eq!(
            said(Duration::from_secs(10)).as_deref(),
            Some("STOPPING=1"),
            "{start} stop"
        );
        wait_for(
            "the socket to listen again",
            Duration::from_secs(10),
            || {
                std::os::unix::net::UnixStream::connect(&socket)
                    .err()
                    .is_some_and(|e| e.raw_os_error() == Some(libc::EPROTOTYPE))
                    .then_some(())
            },
        );
    }
    // Lines for the journal: a priority, no time, no colours.
    let text = std::fs::read_to_string(&log).unwrap();
    let ready = text
        .lines()
        .find(|l| l.contains("linnet daemon ready"))
        .unwrap_or_else(|| panic!("no ready line in\n{text}"));
    assert!(ready.starts_with("<6>linnet daemon ready"), "{ready}");
    assert!(ready.contains("activated=true"), "{ready}");
    assert!(!text.contains('\u{1b}'), "no colours:\n{text}");
}

/// The units, with `linnet` where this build has it.
fn units(world: &World) -> std::path::PathBuf {
    let dir = world.dir.path().join("units");
    std::fs::create_dir_all(&dir).unwrap();
    for unit in ["linnet.socket", "linnet.service"] {
        let text = std::fs::read_to_string(repo_file(&format!("contrib/systemd/{unit}"))).unwrap();
        let here = text.replace("/usr/bin/linnet", linnet_bin().to_str().unwrap());
        std::fs::write(dir.join(unit), here).unwrap();
    }
    dir
}

#[test]
fn the_units_verify_and_the_service_is_hardened() {
    let world = World::new();
    let dir = units(&world);
    let verify = run(std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no", "linnet.socket", "linnet.service"])
        .current_dir(&dir));
    let said = String::from_utf8_lossy(&verify.stderr).into_owned()
        + &String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success() && said.trim().is_empty(), "{said}");
    // systemd's own reading of the sandboxing: "OK" or better.
    let security = must(
        std::process::Command::new("systemd-analyze")
            .args(["security", "--offline=true", "linnet.service"])
            .current_dir(&dir),
    );
    let level = security
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for linnet.service: "))
        .map(|(_, level)| level.trim().to_string())
        .unwrap_or_else(|| panic!("no overall level in\n{security}"));
    eprintln!("systemd-analyze security: {level}");
    assert!(
        level.contains(" OK") || level.contains(" SAFE"),
        "exposure {level}\n{security}"
    );
}
