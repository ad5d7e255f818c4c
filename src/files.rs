//! The daemon's state files (leases, kept forwards): written so that a
//! crash or power loss leaves either the old file or the new one, never a
//! torn one, and read so that a damaged one costs what was in it, not the
//! network.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Replaces `path` with `bytes`: a temporary file beside it, written and
/// fsynced, renamed over it, and the directory fsynced so the rename lasts.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, 0o644, true)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Replaces `path` with `bytes`, readable by its owner alone, as
/// `write_atomically` does: for what must outlive the machine's stop and
/// no one else may read (the secrets).
pub fn write_private_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, 0o600, true)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Replaces `path` with `bytes`, readable by its owner alone, whole but
/// without waiting for the disk: for a file that must outlive the process
/// that writes it, not the machine.
pub fn replace_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, 0o600, false)
}

/// A temporary file beside `path` (`mode`, fsynced when `durable`),
/// renamed over it.
fn replace(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> io::Result<()> {
    // A name of its own per write: two writers of one file (a background
    // save and the last one when a network goes down) never share one.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            if durable {
                file.sync_all()?;
            }
            Ok(())
        });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        // A full disk must not also fill up with temporaries.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Makes `dir` (and what leads to it) if missing, and leaves it open to
/// its owner alone (0700), also when an earlier daemon made it with
/// looser permissions: for what other users must not see or hold open
/// (interface records, clones' namespaces).
pub fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Removes a file linnet made that should go now (a socket, a lock, a
/// temporary): one that is gone already is fine; any other failure is
/// logged with the file, as it may be in the way of a next daemon.
pub fn remove_left(path: &Path) {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            tracing::warn!("cannot remove {}: {e}", path.display());
        }
        _ => {}
    }
}

/// Removes the temporaries of `replace` that a killed process left in
/// `dir` (`NAME.tmp.PID.N`), other than this process's own.
pub fn remove_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if temporary_of(&name).is_some_and(|pid| pid != std::process::id()) {
            remove_left(&path);
        }
    }
}

/// The pid of the process whose temporary `name` is, if it is one.
fn temporary_of(name: &str) -> Option<u32> {
    let (_, rest) = name.rsplit_once(".tmp.")?;
    let (pid, n) = rest.split_once('.')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Moves a file that cannot be read as it should aside, to
/// `NAME.broken-UNIXTIME`, where an operator can look at it; returns where.
pub fn move_aside(path: &Path) -> io::Result<PathBuf> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".broken-{now}"));
    let aside = path.with_file_name(name);
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_a_broken_one_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared.json");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["shared.json"], "no temporary left");
        let aside = move_aside(&path).unwrap();
        assert!(!path.exists());
        assert_eq!(std::fs::read(&aside).unwrap(), b"two");
        assert!(aside.to_string_lossy().contains("shared.json.broken-"));
    }

    #[test]
    fn a_killed_writers_temporaries_go_and_the_files_and_our_own_stay() {
        let dir = tempfile::tempdir().unwrap();
        let own = format!("leases.json.tmp.{}.3", std::process::id());
        for name in [
            "shared.json",
            "shared.json.tmp.1.0",
            "x.tmp.12.7",
            "a.tmp.b",
            &own,
        ] {
            std::fs::write(dir.path().join(name), b"{").unwrap();
        }
        remove_temporaries(dir.path());
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want = vec!["a.tmp.b".to_string(), own, "shared.json".into()];
        want.sort();
        assert_eq!(names, want);
    }

    #[test]
    fn a_private_directory_is_its_owners_alone_even_when_made_open_before() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("a/netns");
        private_dir(&new).unwrap();
        assert_eq!(mode(&new), 0o700);
        let old = dir.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&old).unwrap();
        assert_eq!(mode(&old), 0o700, "tightened");
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(private_dir(&file).is_err(), "a file is no directory");
    }
}
