//! Processes the daemon outlives: a client's pid alone could be another
//! process's by the time a new daemon looks, so a client is known by its
//! pid and the time it started (`/proc/PID/stat`, field 22, in clock
//! ticks since boot), which no later process with that pid shares.

/// A running process, as a new daemon can check it is still the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Process {
    pub pid: i32,
    pub started: u64,
}

impl Process {
    /// `pid` as it is now; None if it is not running.
    pub fn of(pid: i32) -> Option<Process> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some(Process {
            pid,
            started: start_time(&stat)?,
        })
    }

    /// Whether this very process still runs (a zombie has exited).
    pub fn is_running(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        start_time(&stat) == Some(self.started) && state(&stat) != Some('Z')
    }
}

/// The fields after the command's name, which is in parentheses and may
/// hold spaces and parentheses itself: the last `)` ends it.
fn after_name(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace())
}

/// The process's name and its parent's pid, from `/proc/PID/stat`.
pub fn name_and_parent(pid: i32) -> Option<(String, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let name = stat.get(stat.find('(')? + 1..stat.rfind(')')?)?.to_string();
    let parent = after_name(&stat)?.nth(1)?.parse().ok()?;
    Some((name, parent))
}

/// The real uid of `pid`, from `/proc/PID/status`.
pub fn uid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn state(stat: &str) -> Option<char> {
    after_name(stat)?.next()?.chars().next()
}

/// Field 22; the first after the name is field 3.
fn start_time(stat: &str) -> Option<u64> {
    after_name(stat)?.nth(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_known_by_its_start_time_whatever_its_name() {
        let stat =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(start_time(stat), Some(987654));
        assert_eq!(state(stat), Some('S'));
        assert_eq!(start_time("4242 (cut short) S 1"), None);
        let me = Process::of(std::process::id() as i32).expect("this process runs");
        assert!(me.is_running());
        let other = Process {
            started: me.started + 1,
            ..me
        };
        assert!(
            !other.is_running(),
            "the same pid started at another time is another process"
        );
        assert!(Process::of(i32::MAX).is_none());
    }
}
