//! Where a background job's next walk of a time-ordered index starts.
//!
//! Retention walks `tasks_finished` from its oldest entry and the sweeper walks
//! `tasks_lease_expiry` from its oldest; each handles what it finds and leaves the entry behind
//! until VACUUM removes it. While any transaction on the database holds an older snapshot,
//! VACUUM can remove none of them, so every walk passes every entry handled since the snapshot
//! was taken (S6 in docs/performance.md: hundreds of thousands of buffers per pruning batch
//! after minutes of a held snapshot). A job that remembers how far its last walk got starts the
//! next one there.
//!
//! What a walk passed and left, a row another transaction held (SKIP LOCKED) or one committed
//! after the walk with an earlier time, would never be seen again below the mark; so once a
//! period the mark is forgotten and the walk starts from the oldest entry. That walk is the
//! long one while a snapshot is held, so the period stretches to twenty times the last such
//! walk's duration when that is longer (as the dispatcher's straggler claim does): the walks
//! from the oldest take at most a twentieth of the job's time. The mark only steers the walk:
//! what the job acts on is decided by its statement alone.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

/// How many times its own duration apart the walks from the oldest entry are, at least.
const FULL_WALK_DUTY: u32 = 20;

/// How long after a walk from the oldest entry the next one may start: `period`, or twenty
/// times as long as that walk `took` when that is longer, so such walks take at most a
/// twentieth of their job's time. Shared by the sweeper, retention, the dispatcher's
/// straggler claim and the live task gauge (telemetry/metrics.rs).
pub fn full_walk_spacing(period: Duration, took: Duration) -> Duration {
    period.max(took * FULL_WALK_DUTY)
}

/// One job's low-water mark: the time its next walk starts at (None: the oldest entry).
#[derive(Debug, Clone)]
pub struct LowWater {
    mark: Option<DateTime<Utc>>,
    /// How often a walk starts from the oldest entry, at most.
    period: Duration,
    /// When the last walk from the oldest entry started.
    last_full_walk: Instant,
    /// How long it took, once it is over.
    last_full_walk_took: Option<Duration>,
    /// Whether the walk under way started from the oldest entry.
    walking_full: bool,
}

impl LowWater {
    /// A mark that is forgotten every `period`; the first walk starts from the oldest entry.
    pub fn new(period: Duration) -> Self {
        Self {
            mark: None,
            period,
            last_full_walk: Instant::now(),
            last_full_walk_took: None,
            walking_full: false,
        }
    }

    /// Where the next walk starts: the mark, or None (the oldest entry) once a period (or twenty
    /// times the last such walk's duration) has passed since the last walk from there.
    pub fn next_walk_from(&mut self) -> Option<DateTime<Utc>> {
        let spacing = self
            .last_full_walk_took
            .map_or(self.period, |took| full_walk_spacing(self.period, took));
        if self.mark.is_none() || self.last_full_walk.elapsed() >= spacing {
            self.mark = None;
            self.last_full_walk = Instant::now();
        }
        self.walking_full = self.mark.is_none();
        self.mark
    }

    /// The mark as it stands, for a look that must agree with the last walk (None: the oldest
    /// entry).
    pub fn mark(&self) -> Option<DateTime<Utc>> {
        self.mark
    }

    /// Records that a walk handled everything it could below `through`: the mark rises to it.
    pub fn walked_through(&mut self, through: Option<DateTime<Utc>>) {
        if std::mem::take(&mut self.walking_full) {
            self.last_full_walk_took = Some(self.last_full_walk.elapsed());
        }
        if through > self.mark {
            self.mark = through;
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(s: i64) -> Option<DateTime<Utc>> {
        Utc.timestamp_opt(s, 0).single()
    }

    #[test]
    fn the_mark_only_rises_and_a_walk_starts_from_it() {
        let mut low = LowWater::new(Duration::from_secs(3600));
        assert_eq!(
            low.next_walk_from(),
            None,
            "the first walk is from the oldest"
        );
        low.walked_through(at(10));
        assert_eq!(low.next_walk_from(), at(10));
        low.walked_through(at(5));
        assert_eq!(
            low.next_walk_from(),
            at(10),
            "a lower time does not lower it"
        );
        low.walked_through(None);
        assert_eq!(low.next_walk_from(), at(10), "nothing walked leaves it");
    }

    #[test]
    fn a_long_walk_from_the_oldest_spaces_the_next_one_out() {
        let mut low = LowWater::new(Duration::ZERO);
        assert_eq!(low.next_walk_from(), None);
        low.last_full_walk -= Duration::from_secs(1);
        low.walked_through(at(10));
        assert!(low.last_full_walk_took >= Some(Duration::from_secs(1)));
        assert_eq!(
            low.next_walk_from(),
            at(10),
            "a one-second walk is not repeated before twenty seconds"
        );
    }

    #[test]
    fn once_a_period_the_walk_starts_from_the_oldest_entry() {
        let mut low = LowWater::new(Duration::ZERO);
        assert_eq!(low.next_walk_from(), None);
        low.walked_through(at(10));
        low.last_full_walk -= Duration::from_secs(1);
        assert_eq!(low.next_walk_from(), None, "the period has passed");
    }
}
