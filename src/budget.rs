//! Budgets: at most so many of something in flight per key (a uid, a VM's
//! address) and in all, so that one local user or one VM cannot take what
//! the daemon and the others need. A permit is given back when dropped.
//! `RateLimit` is the same over time: at most so many per key in each
//! window. Refusals are counted, and the first one in each `REPORT_EVERY`
//! is marked for the caller to log, so a flood costs one log line per
//! period. `LogBudget` bounds the lines logged about what one account (and
//! all of them) makes the daemon say, counting what it holds back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REPORT_EVERY: Duration = Duration::from_secs(10);

pub struct Budget<K: Ord + Clone> {
    per_key: usize,
    total: usize,
    state: Arc<Mutex<State<K>>>,
}

struct State<K> {
    taken: BTreeMap<K, usize>,
    in_all: usize,
    refusals: Refusals,
}

/// Refusals counted, and when they were last reported.
#[derive(Default)]
pub struct Refusals {
    count: u64,
    reported_at: Option<Instant>,
}

impl Refusals {
    /// Counts one; the count to report now, if a report is due.
    pub fn one_more(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        let due = self
            .reported_at
            .is_none_or(|at| now.duration_since(at) >= REPORT_EVERY);
        due.then(|| {
            self.reported_at = Some(now);
            std::mem::take(&mut self.count)
        })
    }
}

/// What a refusal tells its caller.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    /// Whether the caller should say so now, and how many were refused
    /// since it last did.
    pub report: Option<u64>,
    /// Whether the key's own limit bit (else the limit in all).
    pub per_key: bool,
}

/// One unit of a budget, given back on drop.
pub struct Permit<K: Ord + Clone> {
    key: K,
    state: Arc<Mutex<State<K>>>,
}

impl<K: Ord + Clone> Budget<K> {
    pub fn new(per_key: usize, total: usize) -> Budget<K> {
        Budget {
            per_key,
            total,
            state: Arc::new(Mutex::new(State {
                taken: BTreeMap::new(),
                in_all: 0,
                refusals: Refusals::default(),
            })),
        }
    }

    pub fn per_key(&self) -> usize {
        self.per_key
    }

    pub fn try_take(&self, key: K) -> Result<Permit<K>, Refused> {
        let mut state = self.state.lock().expect("budget lock");
        let mine = state.taken.get(&key).copied().unwrap_or(0);
        if mine >= self.per_key || state.in_all >= self.total {
            return Err(Refused {
                report: state.refusals.one_more(Instant::now()),
                per_key: mine >= self.per_key,
            });
        }
        *state.taken.entry(key.clone()).or_default() += 1;
        state.in_all += 1;
        drop(state);
        Ok(Permit {
            key,
            state: self.state.clone(),
        })
    }
}

impl<K: Ord + Clone> std::fmt::Debug for Permit<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Permit")
    }
}

impl<K: Ord + Clone> Drop for Permit<K> {
    fn drop(&mut self) {
        let mut state = self.state.lock().expect("budget lock");
        state.in_all -= 1;
        if let Some(n) = state.taken.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                state.taken.remove(&self.key);
            }
        }
    }
}

/// At most `per_window` events per key in each `window`, for at most
/// `MAX_KEYS` keys at once (a key past those waits for old windows to end:
/// made-up keys cannot grow the table).
pub struct RateLimit<K: Ord + Clone> {
    per_window: u32,
    window: Duration,
    seen: BTreeMap<K, (Instant, u32)>,
    /// When the table was last cleared of ended windows.
    swept_at: Option<Instant>,
    refusals: Refusals,
}

const MAX_KEYS: usize = 4096;

impl<K: Ord + Clone> RateLimit<K> {
    pub fn new(per_window: u32, window: Duration) -> RateLimit<K> {
        RateLimit {
            per_window,
            window,
            seen: BTreeMap::new(),
            swept_at: None,
            refusals: Refusals::default(),
        }
    }

    /// Whether one more event of `key` may happen now; a refusal says when
    /// to log it, as `Budget::try_take` does.
    pub fn allow(&mut self, key: &K, now: Instant) -> Result<(), Refused> {
        let window = self.window;
        // A full table is swept at most once a window: new keys while it
        // stays full are refused without a walk through it each.
        let sweep_due = self
            .swept_at
            .is_none_or(|at| now.duration_since(at) >= window);
        if !self.seen.contains_key(key) && self.seen.len() >= MAX_KEYS && sweep_due {
            self.seen
                .retain(|_, (start, _)| now.duration_since(*start) < window);
            self.swept_at = Some(now);
        }
        let full = !self.seen.contains_key(key) && self.seen.len() >= MAX_KEYS;
        let entry = (!full).then(|| self.seen.entry(key.clone()).or_insert((now, 0)));
        let allowed = match entry {
            Some((start, count)) => {
                if now.duration_since(*start) >= window {
                    (*start, *count) = (now, 0);
                }
                *count += 1;
                *count <= self.per_window
            }
            None => false,
        };
        if allowed {
            return Ok(());
        }
        Err(Refused {
            report: self.refusals.one_more(now),
            per_key: !full,
        })
    }
}

/// Log lines about what clients cause: at most `per_key` a window for one
/// account and `in_all` for all of them, the rest counted and said with
/// the next line that goes out, so a user who makes the daemon complain in
/// a loop cannot grow its log without bound.
pub struct LogBudget {
    per_key: RateLimit<u32>,
    in_all: RateLimit<()>,
    held_back: BTreeMap<u32, u64>,
    held_back_in_all: u64,
}

/// Whether to log a line now, and how many were held back before it.
#[derive(Debug, PartialEq, Eq)]
pub struct LogTurn {
    /// Lines of this account's held back since its last one.
    pub suppressed: u64,
    /// Lines of all accounts' held back since the last line went out.
    pub suppressed_in_all: u64,
}

impl LogBudget {
    pub fn new(per_key: u32, in_all: u32, window: Duration) -> LogBudget {
        LogBudget {
            per_key: RateLimit::new(per_key, window),
            in_all: RateLimit::new(in_all, window),
            held_back: BTreeMap::new(),
            held_back_in_all: 0,
        }
    }

    /// A line about `key` at `now`: Some to log it (saying what was held
    /// back), None to hold it back.
    pub fn turn(&mut self, key: u32, now: Instant) -> Option<LogTurn> {
        if self.per_key.allow(&key, now).is_err() || self.in_all.allow(&(), now).is_err() {
            // Counted for a bounded set of keys; the total counts all.
            if self.held_back.len() < MAX_KEYS || self.held_back.contains_key(&key) {
                *self.held_back.entry(key).or_default() += 1;
            }
            self.held_back_in_all += 1;
            return None;
        }
        Some(LogTurn {
            suppressed: self.held_back.remove(&key).unwrap_or(0),
            suppressed_in_all: std::mem::take(&mut self.held_back_in_all),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_bounded_per_account_and_in_all_and_say_what_was_held_back() {
        let mut logs = LogBudget::new(2, 3, Duration::from_secs(10));
        let t0 = Instant::now();
        let fresh = Some(LogTurn {
            suppressed: 0,
            suppressed_in_all: 0,
        });
        assert_eq!(logs.turn(1000, t0), fresh);
        assert_eq!(logs.turn(1000, t0), fresh);
        for _ in 0..50 {
            assert_eq!(logs.turn(1000, t0), None, "its two are used");
        }
        assert_eq!(
            logs.turn(1001, t0),
            Some(LogTurn {
                suppressed: 0,
                suppressed_in_all: 50
            }),
            "another account's line says what all held back"
        );
        assert_eq!(logs.turn(1002, t0), None, "three in all");
        let later = t0 + Duration::from_secs(10);
        assert_eq!(
            logs.turn(1000, later),
            Some(LogTurn {
                suppressed: 50,
                suppressed_in_all: 1
            })
        );
    }

    #[test]
    fn a_rate_limit_allows_so_many_per_window_per_key() {
        let mut limit = RateLimit::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limit.allow(&"a", t0).is_ok());
        }
        let refused = limit.allow(&"a", t0).unwrap_err();
        assert_eq!(
            refused,
            Refused {
                report: Some(1),
                per_key: true
            }
        );
        assert!(limit.allow(&"b", t0).is_ok(), "another key has its own");
        assert!(
            limit.allow(&"a", t0 + Duration::from_secs(1)).is_ok(),
            "a new window"
        );
    }

    #[test]
    fn a_key_gets_its_share_the_others_theirs_and_refusals_are_reported_once() {
        let budget = Budget::new(2, 3);
        let a1 = budget.try_take("a").unwrap();
        let _a2 = budget.try_take("a").unwrap();
        let first = budget.try_take("a").unwrap_err();
        assert_eq!(
            first,
            Refused {
                report: Some(1),
                per_key: true
            }
        );
        let second = budget.try_take("a").unwrap_err();
        assert_eq!(second.report, None, "once per period");
        let _b = budget.try_take("b").expect("another key is not held back");
        let all = budget.try_take("c").unwrap_err();
        assert!(!all.per_key, "the limit in all");
        drop(a1);
        let _c = budget
            .try_take("c")
            .expect("a permit given back is free again");
    }
}
