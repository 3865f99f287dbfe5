//! A sliding-window counter per key, for provider limits that the executor must keep itself
//! because the provider drops the excess silently (WeCom: 30 messages a minute and 1,000 an
//! hour per app and member) instead of answering with an error the scheduler could act on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// At most `max` sends in any `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowLimit {
    /// Sends allowed in one window.
    pub max: usize,
    /// The window's length.
    pub window: Duration,
}

/// Sliding-window limits per key. Sends are counted when admitted, not when they succeed:
/// a send that fails after reaching the provider may still have been delivered.
#[derive(Debug)]
pub struct KeyedLimiter {
    limits: Vec<WindowLimit>,
    longest: Duration,
    history: Mutex<HashMap<String, VecDeque<Instant>>>,
}

/// Above this many keys, admitting a send also drops keys with no send in the longest window,
/// so the map does not grow with every member ever messaged.
const SWEEP_ABOVE_KEYS: usize = 10_000;

/// A key is over one of its limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverLimit {
    /// The key that is full.
    pub key: String,
    /// The limit it hit.
    pub limit: WindowLimit,
    /// How long until every key of the request has room again.
    pub retry_after: Duration,
}

impl KeyedLimiter {
    /// A limiter enforcing every limit in `limits` per key.
    pub fn new(limits: Vec<WindowLimit>) -> Self {
        let longest = limits
            .iter()
            .map(|l| l.window)
            .max()
            .unwrap_or(Duration::ZERO);
        KeyedLimiter {
            limits,
            longest,
            history: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, VecDeque<Instant>>> {
        // The map is consistent after any panic (each update is one push or pop).
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits one send to every key in `keys` at `now`, or none of them: a message to several
    /// members is sent to all or to nobody, so it must fit everyone's limits.
    pub fn try_acquire(&self, keys: &[String], now: Instant) -> Result<(), OverLimit> {
        let mut history = self.lock();
        let mut worst: Option<OverLimit> = None;
        for key in keys {
            let Some(sent) = history.get_mut(key.as_str()) else {
                continue;
            };
            while sent
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) >= self.longest)
            {
                sent.pop_front();
            }
            for limit in &self.limits {
                // Sends inside this window are the newest ones; the deque is in time order.
                let in_window = sent
                    .iter()
                    .rev()
                    .take_while(|t| now.saturating_duration_since(**t) < limit.window)
                    .count();
                if limit.max == 0 || in_window < limit.max {
                    continue;
                }
                // Room comes back when the oldest send that keeps the window full leaves it.
                let blocking = sent[sent.len() - limit.max];
                let wait = (blocking + limit.window).saturating_duration_since(now);
                if worst.as_ref().is_none_or(|w| wait > w.retry_after) {
                    worst = Some(OverLimit {
                        key: key.clone(),
                        limit: *limit,
                        retry_after: wait,
                    });
                }
            }
        }
        if let Some(over) = worst {
            return Err(over);
        }
        if history.len() > SWEEP_ABOVE_KEYS {
            let longest = self.longest;
            history.retain(|_, sent| {
                sent.back()
                    .is_some_and(|t| now.saturating_duration_since(*t) < longest)
            });
        }
        for key in keys {
            history.entry(key.clone()).or_default().push_back(now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter() -> KeyedLimiter {
        KeyedLimiter::new(vec![
            WindowLimit {
                max: 3,
                window: Duration::from_secs(60),
            },
            WindowLimit {
                max: 5,
                window: Duration::from_secs(3600),
            },
        ])
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn minute_window_fills_and_frees() {
        let l = limiter();
        let t0 = Instant::now();
        for i in 0..3 {
            l.try_acquire(&keys(&["a"]), t0 + Duration::from_secs(i))
                .unwrap();
        }
        let over = l
            .try_acquire(&keys(&["a"]), t0 + Duration::from_secs(10))
            .unwrap_err();
        assert_eq!(over.key, "a");
        assert_eq!(over.retry_after, Duration::from_secs(50));
        // Other keys are unaffected.
        l.try_acquire(&keys(&["b"]), t0 + Duration::from_secs(10))
            .unwrap();
        l.try_acquire(&keys(&["a"]), t0 + Duration::from_secs(60))
            .unwrap();
    }

    #[test]
    fn hour_window_counts_across_minutes() {
        let l = limiter();
        let t0 = Instant::now();
        for i in 0..5 {
            l.try_acquire(&keys(&["a"]), t0 + Duration::from_secs(100 * i))
                .unwrap();
        }
        let over = l
            .try_acquire(&keys(&["a"]), t0 + Duration::from_secs(1000))
            .unwrap_err();
        assert_eq!(over.limit.window, Duration::from_secs(3600));
        assert_eq!(over.retry_after, Duration::from_secs(2600));
    }

    #[test]
    fn all_or_nothing_for_several_keys() {
        let l = limiter();
        let t0 = Instant::now();
        for _ in 0..3 {
            l.try_acquire(&keys(&["a"]), t0).unwrap();
        }
        assert!(l.try_acquire(&keys(&["b", "a"]), t0).is_err());
        // "b" was not charged by the refused send.
        for _ in 0..3 {
            l.try_acquire(&keys(&["b"]), t0).unwrap();
        }
    }
}
