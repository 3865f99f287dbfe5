//! Reconnect backoff: exponential with jitter, capped.

use std::time::Duration;

/// The first delay.
const BASE: Duration = Duration::from_millis(100);
/// The largest delay.
const CAP: Duration = Duration::from_secs(5);

/// The delay before reconnect attempt `attempt` (0-based): `min(CAP, BASE * 2^attempt)`, then a
/// random point in its upper half so executors do not reconnect in lockstep.
pub(crate) fn delay(attempt: u32) -> Duration {
    let ceiling = BASE.saturating_mul(1u32 << attempt.min(16)).min(CAP);
    let half = ceiling / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        for attempt in 0..40 {
            let d = delay(attempt);
            assert!(d <= CAP, "{d:?}");
            assert!(d >= BASE / 2, "{d:?}");
        }
        assert!(delay(0) <= BASE);
        assert!(delay(30) >= CAP / 2);
    }
}
