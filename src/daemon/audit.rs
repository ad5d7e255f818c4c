//! A network's audit log (`audit_log: PATH` in networks.yaml): what
//! happens on the network, as `linnet events` tells it — its VMs coming and
//! going, their policies, and every decision a policy made (`name`
//! records) — one JSON line each, in a file only root reads. It rotates by
//! size (`MAX_BYTES`, then PATH.1 … PATH.`KEEP`), so neither a VM nor the
//! daemon can fill a disk; what one VM makes it record is bounded where the
//! records are made (the name gate's budget), and events the writer fell
//! behind on are said in a `dropped` line rather than lost silently.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::events::{Bus, Event, What, wanted};

/// A file's size before it is rotated.
pub const MAX_BYTES: u64 = 16 << 20;
/// The rotated files kept (PATH.1 the newest).
pub const KEEP: u32 = 4;

/// An audit log file, appended to and rotated by size.
pub struct AuditLog {
    path: PathBuf,
    file: File,
    size: u64,
    max_bytes: u64,
}

impl AuditLog {
    /// Opens (or makes, mode 0600) the log at `path`, rotating it at
    /// `max_bytes`.
    pub fn open(path: &Path, max_bytes: u64) -> io::Result<AuditLog> {
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        Ok(AuditLog {
            path: path.to_path_buf(),
            file,
            size,
            max_bytes,
        })
    }

    /// Appends `event` as one line, rotating first if the line would take
    /// the file past its size.
    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(io::Error::other)?;
        line.push(b'\n');
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(&line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    /// PATH.k to PATH.k+1 (the oldest goes), PATH to PATH.1, a new PATH.
    fn rotate(&mut self) -> io::Result<()> {
        let numbered = |k: u32| PathBuf::from(format!("{}.{k}", self.path.display()));
        for k in (1..KEEP).rev() {
            match std::fs::rename(numbered(k), numbered(k + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, numbered(1))?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// Writes `network`'s events from `bus` to its audit log at `path` until
/// the bus goes. A log that cannot be written is said once in the
/// daemon's log, and tried again at the next event.
pub fn follow(network: String, path: PathBuf, bus: &Bus) -> JoinHandle<()> {
    let (_, mut events) = bus.subscribe(false);
    tokio::spawn(async move {
        let mut log: Option<AuditLog> = None;
        let mut failing = false;
        loop {
            let event = match events.recv().await {
                Ok(event) if wanted(&event, Some(&network)) && event.network.is_some() => event,
                Ok(_) => continue,
                Err(RecvError::Lagged(count)) => {
                    Event::now(Some(&network), What::Dropped { count })
                }
                Err(RecvError::Closed) => return,
            };
            let written = match &mut log {
                Some(log) => log.write(&event),
                None => AuditLog::open(&path, MAX_BYTES).and_then(|mut opened| {
                    let written = opened.write(&event);
                    log = Some(opened);
                    written
                }),
            };
            match written {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    log = None;
                    warn!(network, path = %path.display(), "cannot write the network's audit log: {e}");
                }
                Err(_) => log = None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u64) -> Event {
        Event {
            time_ms: n,
            network: Some("sandbox".into()),
            what: What::NetworkUp,
        }
    }

    #[test]
    fn lines_are_json_events_and_the_file_rotates_at_its_size_keeping_four() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let line_len = serde_json::to_vec(&event(1000)).unwrap().len() as u64 + 1;
        let mut log = AuditLog::open(&path, line_len * 3).unwrap();
        for n in 1000..1020 {
            log.write(&event(n)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only root reads it");
        let read = |p: &Path| -> Vec<u64> {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Event>(l).unwrap().time_ms)
                .collect()
        };
        // 20 lines, 3 a file: the newest 2 in the file, 3 in each of four
        // rotated ones, and the 6 oldest gone.
        assert_eq!(read(&path), vec![1018, 1019]);
        assert_eq!(
            read(&dir.path().join("audit.jsonl.1")),
            vec![1015, 1016, 1017]
        );
        assert_eq!(
            read(&dir.path().join("audit.jsonl.4")),
            vec![1006, 1007, 1008]
        );
        assert!(!dir.path().join("audit.jsonl.5").exists());
        // Opened again, it carries on from its size.
        let mut again = AuditLog::open(&path, line_len * 3).unwrap();
        again.write(&event(1020)).unwrap();
        assert_eq!(read(&path), vec![1018, 1019, 1020]);
    }

    /// The events in the log at `path` once its text is `done` (or 5 s
    /// have passed).
    async fn events_once(path: &Path, done: fn(&str) -> bool) -> Vec<Event> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if done(&text) || std::time::Instant::now() > deadline {
                return text
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
            }
        }
    }

    #[tokio::test]
    async fn the_writer_keeps_its_networks_events_and_says_what_it_missed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let bus = Bus::default();
        let writer = follow("sandbox".into(), path.clone(), &bus);
        bus.emit(Some("sandbox"), What::NetworkUp);
        bus.emit(Some("other"), What::NetworkUp);
        bus.emit(None, What::Dropped { count: 1 });
        bus.emit(Some("sandbox"), What::NetworkDown);
        let events = events_once(&path, |t| t.lines().count() >= 2).await;
        let what: Vec<&What> = events.iter().map(|e| &e.what).collect();
        assert_eq!(
            what,
            [&What::NetworkUp, &What::NetworkDown],
            "nor another network's, nor none's"
        );
        // More than the bus holds before the writer runs again.
        for _ in 0..crate::events::CAPACITY + 10 {
            bus.emit(Some("sandbox"), What::NetworkUp);
        }
        let events = events_once(&path, |t| t.contains("\"dropped\"")).await;
        writer.abort();
        assert!(
            events
                .iter()
                .any(|e| matches!(e.what, What::Dropped { count } if count > 0)
                    && e.network.as_deref() == Some("sandbox")),
            "{events:?}"
        );
    }

    use std::time::Duration;
}
