//! Budgets: at most so many of something in flight per key (a uid, a VM's
//! address) and in all, so that one local user or one VM cannot take what
//! the daemon and the others need. A permit is given back when dropped.
//! Refusals are counted, and the first one in each `REPORT_EVERY` is marked
//! for the caller to log, so a flood costs one log line per period.

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
    refused: u64,
    reported_at: Option<Instant>,
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
                refused: 0,
                reported_at: None,
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
            state.refused += 1;
            let now = Instant::now();
            let due = state
                .reported_at
                .is_none_or(|at| now.duration_since(at) >= REPORT_EVERY);
            let report = due.then(|| {
                state.reported_at = Some(now);
                std::mem::take(&mut state.refused)
            });
            return Err(Refused {
                report,
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

#[cfg(test)]
mod tests {
    use super::*;

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
