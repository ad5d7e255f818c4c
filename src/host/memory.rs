//! Memory the daemon freed, given back to the system. glibc's allocator
//! keeps what a burst freed (a thousand interfaces detached at once: their
//! teardowns' buffers, the replies, the netlink messages) in its arenas,
//! so the daemon's RSS would stay at its peak for good; `malloc_trim`
//! returns the free pages at the top of each arena and, since glibc 2.8,
//! the free pages inside them.

/// The interfaces a daemon may drop from its peak before it gives memory
/// back: fewer is not worth the walk through every arena.
pub const TRIM_AFTER: usize = 64;

/// Gives freed memory back to the system (a walk through every arena:
/// milliseconds at most).
pub fn give_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes a size and touches only the allocator's
    // own state, under its own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// When to give memory back: after the number of interfaces fell by
/// TRIM_AFTER or more from its peak since the last time.
#[derive(Debug, Default)]
pub struct Trim {
    peak: usize,
}

impl Trim {
    /// With `now` interfaces: whether to give memory back now.
    pub fn due(&mut self, now: usize) -> bool {
        self.peak = self.peak.max(now);
        if self.peak - now >= TRIM_AFTER {
            self.peak = now;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_given_back_once_many_interfaces_went() {
        let mut trim = Trim::default();
        assert!(!trim.due(1000), "a peak");
        assert!(!trim.due(1000 - TRIM_AFTER + 1));
        assert!(trim.due(1000 - TRIM_AFTER), "fell by TRIM_AFTER");
        assert!(!trim.due(1000 - TRIM_AFTER), "once");
        assert!(trim.due(0));
        assert!(!trim.due(10), "growing again is no reason");
        give_back();
    }
}
