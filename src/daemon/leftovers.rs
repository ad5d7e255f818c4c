//! What undoing or tearing down could not remove: each failure is kept
//! with what it concerns and logged once the work is over, never dropped,
//! so a leftover link or table is named in the log at 3 a.m.

use std::fmt::Display;

use tracing::warn;

/// The failures met while undoing or tearing down one thing.
#[derive(Debug, Default)]
pub(super) struct Leftovers {
    failed: Vec<String>,
}

impl Leftovers {
    /// Keeps `result`'s error, if any, as `what`'s.
    pub fn note<E: Display>(&mut self, what: impl Display, result: Result<(), E>) {
        if let Err(e) = result {
            self.failed.push(format!("{what}: {e}"));
        }
    }

    /// Logs each failure, saying what was being undone (`context`).
    pub fn log(self, context: &str) {
        for failure in &self.failed {
            warn!("{context}: cannot {failure}; it may be left behind");
        }
    }

    #[cfg(test)]
    pub fn failures(&self) -> &[String] {
        &self.failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_kept_with_what_they_concern() {
        let mut left = Leftovers::default();
        left.note("delete link lnt3", Err::<(), _>("no such device"));
        left.note("remove the guard of lnt3", Ok::<(), String>(()));
        assert_eq!(left.failures(), ["delete link lnt3: no such device"]);
    }
}
