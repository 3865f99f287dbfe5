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

    /// Records what is out of range under `path` (the policy's field path).
    pub fn check(&self, path: &str, v: &mut Violations) {
        match self {
            RetryPolicy::Exponential {
                initial_ms,
                max_ms,
                multiplier,
                jitter,
            } => {
                let path = format!("{path}.exponential");
                if *initial_ms < 100 {
                    v.add(format!("{path}.initial"), "must be at least 100ms");
                }
                if *max_ms < *initial_ms || *max_ms > MAX_RETRY_DELAY_MS {
                    v.add(
                        format!("{path}.max"),
                        "must be at least initial and at most 7 days",
                    );
                }
                if !(1.0..=10.0).contains(multiplier) {
                    v.add(format!("{path}.multiplier"), "must be between 1.0 and 10.0");
                }
                if !(0.0..=1.0).contains(jitter) {
                    v.add(format!("{path}.jitter"), "must be between 0.0 and 1.0");
                }
            }
            RetryPolicy::Delays(delays) => {
                let path = format!("{path}.delays.delays");
                if delays.is_empty() || delays.len() > 20 {
                    v.add(path, "must list 1 to 20 delays");
                    return;
                }
                for (i, ms) in delays.iter().enumerate() {
                    if !(0..=MAX_RETRY_DELAY_MS).contains(ms) {
                        v.add(format!("{path}[{i}]"), "must be between 0 and 7 days");
                    }
                }
            }
        }
    }
}
