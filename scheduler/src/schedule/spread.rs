//! Spreading a run's recipients over a window: a stable stagger (the same recipient lands on the
//! same offset every run, so 1,000 reports at 9:00 go out 9:00–9:05 in the same order each day)
//! and a random jitter.

use chrono::{DateTime, Duration, Timelike, Utc};
use rand::Rng;
use sha2::{Digest, Sha256};

/// A stable offset in `[0, window)` for `recipient` within the thing identified by `scope` (a
/// schedule or campaign id): SHA-256, so it is the same on every replica and release.
pub fn stagger_offset(scope: &str, recipient: &str, window: Duration) -> Duration {
    let window_ms = window.num_milliseconds();
    if window_ms <= 0 {
        return Duration::zero();
    }
    let digest = Sha256::new()
        .chain_update(scope.as_bytes())
        .chain_update([0u8])
        .chain_update(recipient.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    Duration::milliseconds((u64::from_be_bytes(first) % window_ms as u64) as i64)
}

/// A uniformly random offset in `[0, bound)`.
pub fn jitter(bound: Duration) -> Duration {
    let ms = bound.num_milliseconds();
    if ms <= 0 {
        return Duration::zero();
    }
    Duration::milliseconds(rand::rng().random_range(0..ms))
}

/// Moves a time that falls in minute :00 or :30 of the hour (UTC minutes; every zone in use
/// has whole- or half-hour offsets for the minutes that matter here, except the rare :45 ones)
/// one minute later, so staggered sends stay off the moments everyone else fires at.
pub fn off_round_minutes(at: DateTime<Utc>) -> DateTime<Utc> {
    if at.minute().is_multiple_of(30) {
        at + Duration::minutes(1)
    } else {
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stagger_is_stable_and_inside_the_window() {
        let w = Duration::minutes(5);
        let a = stagger_offset("s1", "alice", w);
        assert_eq!(a, stagger_offset("s1", "alice", w));
        let spread: std::collections::HashSet<i64> = (0..1000)
            .map(|i| stagger_offset("s1", &format!("r{i}"), w).num_seconds())
            .collect();
        assert!(spread.iter().all(|s| (0..300).contains(s)));
        // 1,000 recipients over 300 seconds: nearly every second is used.
        assert!(spread.len() > 280, "{}", spread.len());
    }

    #[test]
    fn round_minutes_are_avoided() {
        let at = DateTime::parse_from_rfc3339("2026-06-01T09:00:10Z")
            .map(|d| d.with_timezone(&Utc))
            .unwrap_or_default();
        assert_eq!(off_round_minutes(at).minute(), 1);
        let at = at + Duration::minutes(7);
        assert_eq!(off_round_minutes(at), at);
    }
}
