//! What a rewrite of a table keeps: its live rows and every row version that died after the
//! oldest open snapshot was taken, which that snapshot may still read. The compactor weighs a
//! table's heap against this ([`worth_rewriting`]), counting the dead versions from each table's
//! running count, sampled every round ([`Churn`]).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::store::storage::Candidate;

/// Each table's running count of the row versions its updates and deletes left dead, sampled
/// every round: how many of its dead rows a snapshot taken at a given instant may still read.
#[derive(Debug, Default)]
pub struct Churn {
    samples: HashMap<String, VecDeque<(Instant, i64)>>,
}

impl Churn {
    /// Records `table`'s count `dead_versions`, read no later than `at`, and forgets what is no
    /// longer needed: samples older than `keep`, except the newest of them.
    pub fn observe(&mut self, table: &str, at: Instant, dead_versions: i64, keep: Duration) {
        let samples = self.samples.entry(table.to_owned()).or_default();
        samples.push_back((at, dead_versions));
        while samples
            .get(1)
            .is_some_and(|(then, _)| at.saturating_duration_since(*then) >= keep)
        {
            samples.pop_front();
        }
    }

    /// At most how many row versions `table` has left dead since `since`, its count being
    /// `dead_versions` now: counted from the newest sample read at or before `since`, so the
    /// versions left dead between that sample and `since` count too (at most a round's worth).
    /// `None` when no sample is that old, or when the count went back (a statistics reset).
    pub fn dead_since(&self, table: &str, since: Instant, dead_versions: i64) -> Option<i64> {
        let (_, then) = self
            .samples
            .get(table)?
            .iter()
            .rev()
            .find(|(at, _)| *at <= since)?;
        (dead_versions >= *then).then(|| dead_versions - then)
    }
}

/// What the oldest open snapshot may still read, as a round sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// No transaction holds a snapshot: a rewrite keeps only the live rows.
    Nothing,
    /// Every row version that died since this instant (the snapshot is no older).
    Since(Instant),
    /// Versions from before anything this process can measure.
    Unknown,
}

impl Held {
    /// From the age of the oldest transaction holding a snapshot (0: none), read no earlier
    /// than `asked_at`.
    pub(super) fn of(asked_at: Instant, oldest_seconds: f64) -> Held {
        if oldest_seconds <= 0.0 {
            return Held::Nothing;
        }
        Duration::try_from_secs_f64(oldest_seconds)
            .ok()
            .and_then(|age| asked_at.checked_sub(age))
            .map_or(Held::Unknown, Held::Since)
    }

    /// How many of `table`'s dead row versions a rewrite would have to keep; `None` when that
    /// cannot be told.
    pub(super) fn pinned(self, churn: &Churn, table: &Candidate) -> Option<i64> {
        match self {
            Held::Nothing => Some(0),
            Held::Since(since) => churn.dead_since(&table.table, since, table.dead_versions),
            Held::Unknown => None,
        }
    }
}

/// Whether rewriting `table` gives back at least `1 - 1/factor` of its heap: a rewrite keeps
/// the live rows and the `pinned` dead versions an open snapshot may still read (`None`, not
/// known: not rewritten).
pub(super) fn worth_rewriting(table: &Candidate, pinned: Option<i64>, factor: f64) -> bool {
    let Some(pinned) = pinned else {
        return false;
    };
    let kept = table
        .live_bytes
        .saturating_add(pinned.saturating_mul(table.row_bytes));
    table.heap_bytes as f64 >= factor * kept as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::WASTE_FACTOR;

    fn candidate(heap_bytes: i64, live_bytes: i64) -> Candidate {
        Candidate {
            table: "tasks".to_owned(),
            bytes: heap_bytes,
            heap_bytes,
            live_bytes,
            row_bytes: 100,
            dead_versions: 0,
        }
    }

    #[test]
    fn a_rewrite_is_worth_it_only_when_live_and_pinned_rows_are_a_small_part_of_the_heap() {
        let table = candidate(4_000_000, 500_000);
        assert!(worth_rewriting(&table, Some(0), WASTE_FACTOR));
        // 5,000 pinned versions of 100 bytes: the rewrite would keep 1 MB of 4.
        assert!(worth_rewriting(&table, Some(5_000), WASTE_FACTOR));
        assert!(!worth_rewriting(&table, Some(5_001), WASTE_FACTOR));
        assert!(!worth_rewriting(&table, None, WASTE_FACTOR));
        assert!(!worth_rewriting(
            &candidate(1_999_999, 500_000),
            Some(0),
            WASTE_FACTOR
        ));
    }

    #[test]
    fn dead_versions_since_an_instant_count_from_the_newest_sample_not_after_it() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let keep = Duration::from_secs(80);
        let mut churn = Churn::default();
        for (s, count) in [(0, 1_000), (10, 3_000), (20, 7_000)] {
            churn.observe("tasks", at(s), count, keep);
        }
        // A snapshot from second 15: everything since the sample of second 10, the versions of
        // seconds 10 to 15 included.
        assert_eq!(churn.dead_since("tasks", at(15), 9_000), Some(6_000));
        assert_eq!(churn.dead_since("tasks", at(20), 9_000), Some(2_000));
        assert_eq!(churn.dead_since("tasks", at(0), 9_000), Some(8_000));
        // Older than every sample, or another table: not known.
        assert_eq!(
            churn.dead_since("tasks", start - Duration::from_secs(1), 9_000),
            None
        );
        assert_eq!(churn.dead_since("attempts", at(15), 9_000), None);
        // The statistics were reset: the count went back.
        assert_eq!(churn.dead_since("tasks", at(15), 10), None);
    }

    #[test]
    fn samples_older_than_needed_are_forgotten_but_the_newest_of_them() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let keep = Duration::from_secs(25);
        let mut churn = Churn::default();
        for s in (0..=100).step_by(10) {
            churn.observe("tasks", at(s), s as i64, keep);
        }
        // Sample 70 is the newest at least 25 s older than 100: kept, and nothing older.
        assert_eq!(churn.dead_since("tasks", at(75), 100), Some(30));
        assert_eq!(churn.dead_since("tasks", at(69), 100), None);
    }

    #[test]
    fn a_round_with_no_snapshot_open_counts_nothing_as_held() {
        let now = Instant::now();
        let churn = Churn::default();
        let table = candidate(4_000_000, 500_000);
        assert_eq!(Held::of(now, 0.0), Held::Nothing);
        assert_eq!(Held::of(now, 0.0).pinned(&churn, &table), Some(0));
        let held = Held::of(now, 2.0);
        assert!(matches!(held, Held::Since(since) if now - since == Duration::from_secs(2)));
        // Nothing sampled yet: not known.
        assert_eq!(held.pinned(&churn, &table), None);
        assert_eq!(Held::of(now, f64::INFINITY), Held::Unknown);
    }
}
