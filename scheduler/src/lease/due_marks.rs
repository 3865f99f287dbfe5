//! Where a dispatcher's next walk of the due index starts, per priority level.
//!
//! The queue claim (`claim_due.sql`) reads `tasks_due`, a partial index on `state =
//! 'scheduled'`, from its oldest entry. Leasing a task leaves the entry of its scheduled
//! version behind until VACUUM removes it, and while any transaction on the database holds an
//! older snapshot that entry can be neither marked dead nor removed: every claim then walks
//! the entries of every task leased since, and checks each against the heap (S6 in
//! docs/performance.md: about one buffer per 32 tasks leased, tens of thousands per claim
//! after minutes of a held snapshot).
//!
//! A claim at a level leases every due task of that level up to its latest due time, except
//! rows another transaction held at that moment and rows not yet committed. So the next walk
//! at that level, and the dispatcher's look for the next due time, can start there. What lands
//! below a mark later is announced: new tasks and retries with their due time (the marks come
//! down to it), returned leases and everything else as "due now" without a time (the marks are
//! dropped). What is never announced, a row another transaction held while a walk passed it, is
//! found by the full walk each dispatcher makes once its marks are [`MARK_TTL`] old. The marks
//! only steer the walk; they never decide what is due.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::tasks::model::GrantedLease;

/// The longest a set of marks steers claims before a walk from the oldest entry: how late a
/// task can be whose row another transaction held while a walk passed it. A full walk under a
/// held snapshot reads every entry the snapshot keeps, so it is made this seldom.
pub const MARK_TTL: Duration = Duration::from_secs(5);

/// Priority levels (0 to 9): one mark each.
const LEVELS: usize = 10;

/// One dispatcher's marks: for each priority level, the due time its next walk starts at
/// (None: the oldest entry).
#[derive(Debug, Clone, Default)]
pub struct DueMarks {
    /// Indexed by priority.
    marks: [Option<DateTime<Utc>>; LEVELS],
    /// When the oldest of the current marks was set.
    since: Option<Instant>,
}

impl DueMarks {
    /// The marks for a claim or a look for the next due time made at `now`, indexed by priority
    /// (the statements read element `priority + 1`); forgets them first once they are
    /// [`MARK_TTL`] old.
    pub fn for_claim(&mut self, now: Instant) -> Vec<Option<DateTime<Utc>>> {
        if self.expires_in(now) == Some(Duration::ZERO) {
            self.reset();
        }
        self.marks.to_vec()
    }

    /// How long until the marks are forgotten (None: there are none). A dispatcher with nothing
    /// due above its marks sleeps no longer than this, so its full walk is not put off.
    pub fn expires_in(&self, now: Instant) -> Option<Duration> {
        self.since
            .map(|since| MARK_TTL.saturating_sub(now.saturating_duration_since(since)))
    }

    /// Learns from the leases a claim through the queue walk granted at `now`: each level they
    /// reached is marked at their latest due time.
    pub fn record(&mut self, leases: &[GrantedLease], now: Instant) {
        for lease in leases {
            let Some(mark) = usize::try_from(lease.priority)
                .ok()
                .and_then(|p| self.marks.get_mut(p))
            else {
                continue;
            };
            if mark.is_none_or(|m| m < lease.run_at) {
                *mark = Some(lease.run_at);
            }
        }
        if self.since.is_none() && self.marks.iter().any(Option::is_some) {
            self.since = Some(now);
        }
    }

    /// Learns of tasks that became due at `at` (None: now, at an unknown due time). An
    /// announcement does not say the level, so every mark later than `at` comes down to it;
    /// without a time every level walks from the oldest entry again.
    pub fn heard_due(&mut self, at: Option<DateTime<Utc>>) {
        let Some(at) = at else {
            self.reset();
            return;
        };
        for mark in self.marks.iter_mut().flatten() {
            if *mark > at {
                *mark = at;
            }
        }
    }

    /// Every level walks from the oldest entry again.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(second: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, 9, 0, second)
            .single()
            .unwrap_or_default()
    }

    fn lease(priority: i16, second: u32) -> GrantedLease {
        GrantedLease {
            priority,
            run_at: at(second),
            ..GrantedLease::default()
        }
    }

    #[test]
    fn a_claim_marks_each_level_it_reached_at_its_latest_due_time() {
        let mut marks = DueMarks::default();
        let now = Instant::now();
        marks.record(&[lease(9, 3), lease(9, 7), lease(5, 2), lease(5, 4)], now);
        let claim = marks.for_claim(now);
        assert_eq!(claim.len(), 10);
        assert_eq!(claim[9], Some(at(7)));
        assert_eq!(claim[5], Some(at(4)));
        assert_eq!(claim[0], None, "a level the claim never reached");
        marks.record(&[], now);
        assert_eq!(
            marks.for_claim(now)[5],
            Some(at(4)),
            "an empty claim moves nothing"
        );
    }

    #[test]
    fn marks_are_forgotten_once_they_are_a_ttl_old() {
        let mut marks = DueMarks::default();
        let set = Instant::now();
        assert_eq!(marks.expires_in(set), None);
        marks.record(&[lease(5, 4)], set);
        // A later claim moves the mark but not its age.
        marks.record(&[lease(5, 8)], set + MARK_TTL / 2);
        assert_eq!(marks.expires_in(set + MARK_TTL / 2), Some(MARK_TTL / 2));
        assert_eq!(marks.for_claim(set + MARK_TTL / 2)[5], Some(at(8)));
        assert!(marks.for_claim(set + MARK_TTL).iter().all(Option::is_none));
        assert_eq!(marks.expires_in(set + MARK_TTL), None);
    }

    #[test]
    fn an_announced_due_time_brings_the_later_marks_down_to_it() {
        let mut marks = DueMarks::default();
        let now = Instant::now();
        marks.record(&[lease(9, 10), lease(5, 20)], now);
        marks.heard_due(Some(at(25)));
        assert_eq!(
            marks.for_claim(now)[5],
            Some(at(20)),
            "due after every mark"
        );
        marks.heard_due(Some(at(15)));
        let claim = marks.for_claim(now);
        assert_eq!(
            claim[5],
            Some(at(15)),
            "the level is not said: every later mark"
        );
        assert_eq!(claim[9], Some(at(10)));
    }

    #[test]
    fn an_announcement_without_a_due_time_drops_every_mark() {
        let mut marks = DueMarks::default();
        let now = Instant::now();
        marks.record(&[lease(5, 20)], now);
        marks.heard_due(None);
        assert!(marks.for_claim(now).iter().all(Option::is_none));
        assert_eq!(marks.expires_in(now), None);
    }
}
