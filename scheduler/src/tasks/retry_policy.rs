//! How a task's failed attempts are spaced: capped exponential backoff with jitter, or an
//! explicit list of delays; and the rules a policy must meet. The delays themselves are drawn
//! in SQL (`herald.retry_delay_ms`) when a report reschedules a task.

use herald_proto::v1 as pb;

use crate::error::Violations;
use crate::rules::duration_ms;

/// Longest delay a retry policy may ask for.
pub const MAX_RETRY_DELAY_MS: i64 = 7 * 24 * 3_600_000;

/// How retries are spaced.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryPolicy {
    /// Capped exponential backoff with jitter.
    Exponential {
        /// First delay, in milliseconds.
        initial_ms: i64,
        /// Largest delay, in milliseconds.
        max_ms: i64,
        /// Growth per attempt.
        multiplier: f64,
        /// Randomised fraction of each delay.
        jitter: f64,
    },
    /// Explicit delays in milliseconds, the last repeating.
    Delays(Vec<i64>),
}

impl RetryPolicy {
    /// Default first delay.
    pub const DEFAULT_INITIAL_MS: i64 = 1_000;
    /// Default largest delay.
    pub const DEFAULT_MAX_MS: i64 = 3_600_000;
    /// Default growth per attempt.
    pub const DEFAULT_MULTIPLIER: f64 = 2.0;
    /// Default jitter fraction.
    pub const DEFAULT_JITTER: f64 = 0.2;

    /// Exponential backoff with every default.
    pub fn default_exponential() -> Self {
        RetryPolicy::Exponential {
            initial_ms: Self::DEFAULT_INITIAL_MS,
            max_ms: Self::DEFAULT_MAX_MS,
            multiplier: Self::DEFAULT_MULTIPLIER,
            jitter: Self::DEFAULT_JITTER,
        }
    }

    /// A wire retry policy with its defaults filled in; None for the default policy. A malformed
    /// duration becomes a negative one, which the domain refuses with the field's own rule.
    pub fn from_wire(p: &pb::RetryPolicy) -> Option<RetryPolicy> {
        let ms = |d: &prost_types::Duration| duration_ms(d).unwrap_or(-1);
        match p.strategy.as_ref()? {
            pb::retry_policy::Strategy::Exponential(e) => {
                let initial_ms = e.initial.as_ref().map_or(Self::DEFAULT_INITIAL_MS, ms);
                Some(RetryPolicy::Exponential {
                    initial_ms,
                    max_ms: e
                        .max
                        .as_ref()
                        .map_or(Self::DEFAULT_MAX_MS.max(initial_ms), ms),
                    // 0 is proto3's "not set".
                    multiplier: if e.multiplier == 0.0 {
                        Self::DEFAULT_MULTIPLIER
                    } else {
                        e.multiplier
                    },
                    jitter: e.jitter.unwrap_or(Self::DEFAULT_JITTER),
                })
            }
            pb::retry_policy::Strategy::Delays(d) => {
                Some(RetryPolicy::Delays(d.delays.iter().map(ms).collect()))
            }
        }
    }

    /// The delay after the `n`-th failure in a row (1 for the first), as
    /// `herald.retry_delay_ms` draws it for a task: the listed delay (the last repeating), or
    /// the capped exponential less a random fraction of at most `jitter`. For what retries
    /// outside a task row, such as a schedule's variables source.
    pub fn delay_ms(&self, n: i32) -> i64 {
        let n = n.max(1);
        match self {
            RetryPolicy::Delays(delays) => delays
                .get((n as usize).min(delays.len()).saturating_sub(1))
                .copied()
                .unwrap_or(0),
            RetryPolicy::Exponential {
                initial_ms,
                max_ms,
                multiplier,
                jitter,
            } => {
                let grown = (*initial_ms as f64) * multiplier.powi(n - 1);
                let capped = grown.min(*max_ms as f64);
                (capped * (1.0 - jitter * rand::random::<f64>())) as i64
            }
        }
    }

    /// Records what is out of range under `path` (the policy's field path).
    pub fn check(&self, path: &str, v: &mut Violations) {
        match self {
            RetryPolicy::Exponential {
                initial_ms,
                max_ms,
                multiplier,
                jitter,
            } => {
                // Built only for a field that is out of range.
                let f = |name: &str| format!("{path}.exponential.{name}");
                if *initial_ms < 100 {
                    v.add(f("initial"), "must be at least 100ms");
                }
                if *max_ms < *initial_ms || *max_ms > MAX_RETRY_DELAY_MS {
                    v.add(f("max"), "must be at least initial and at most 7 days");
                }
                if !(1.0..=10.0).contains(multiplier) {
                    v.add(f("multiplier"), "must be between 1.0 and 10.0");
                }
                if !(0.0..=1.0).contains(jitter) {
                    v.add(f("jitter"), "must be between 0.0 and 1.0");
                }
            }
            RetryPolicy::Delays(delays) => {
                if delays.is_empty() || delays.len() > 20 {
                    v.add(format!("{path}.delays.delays"), "must list 1 to 20 delays");
                    return;
                }
                for (i, ms) in delays.iter().enumerate() {
                    if !(0..=MAX_RETRY_DELAY_MS).contains(ms) {
                        v.add(
                            format!("{path}.delays.delays[{i}]"),
                            "must be between 0 and 7 days",
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_repeat_their_last_and_backoff_grows_to_its_cap() {
        let listed = RetryPolicy::Delays(vec![60_000, 300_000, 900_000]);
        assert_eq!(listed.delay_ms(1), 60_000);
        assert_eq!(listed.delay_ms(3), 900_000);
        assert_eq!(listed.delay_ms(7), 900_000);
        let exact = RetryPolicy::Exponential {
            initial_ms: 1_000,
            max_ms: 5_000,
            multiplier: 2.0,
            jitter: 0.0,
        };
        assert_eq!(
            (1..=5).map(|n| exact.delay_ms(n)).collect::<Vec<_>>(),
            [1_000, 2_000, 4_000, 5_000, 5_000]
        );
        let jittered = RetryPolicy::Exponential {
            initial_ms: 1_000,
            max_ms: 1_000,
            multiplier: 2.0,
            jitter: 0.5,
        };
        for _ in 0..100 {
            assert!((500..=1_000).contains(&jittered.delay_ms(1)));
        }
    }
}
