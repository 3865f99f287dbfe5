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
//! leased by the session's straggler claim, which walks from the oldest entry every few seconds
//! ([`Role::Stragglers`](super::dispatch::Role::Stragglers)), or by the dispatcher's own walk
//! from the oldest entry once it has found nothing for as long. The marks only steer the walk;
//! they never decide what is due.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::tasks::model::GrantedLease;

/// Priority levels (0 to 9): one mark each.
const LEVELS: usize = 10;

/// One dispatcher's marks: for each priority level, the due time its next walk starts at
/// (None: the oldest entry).
#[derive(Debug, Clone, Default)]
pub struct DueMarks {
    /// Indexed by priority.
    marks: [Option<DateTime<Utc>>; LEVELS],
}

impl DueMarks {
    /// The marks as a claim or a look for the next due time takes them, indexed by priority (the
    /// statements read element `priority + 1`).
    pub fn due_from(&self) -> Vec<Option<DateTime<Utc>>> {
        self.marks.to_vec()
    }

    /// Whether any level's walk starts past the oldest entry.
    pub fn is_set(&self) -> bool {
        self.marks.iter().any(Option::is_some)
    }

    /// Learns from the leases a claim through the queue walk granted: each level they reached
    /// is marked at their latest due time.
    pub fn record(&mut self, leases: &[GrantedLease]) {
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

    /// Whether a walk at `lease`'s level has passed its due time: the lease lies below that
    /// level's mark (none is below an unset mark, whose walk starts at the oldest entry).
    fn passed(&self, lease: &GrantedLease) -> bool {
        usize::try_from(lease.priority)
            .ok()
            .and_then(|p| self.marks.get(p).copied().flatten())
            .is_some_and(|mark| lease.run_at < mark)
    }

    /// Whether every one of `leases` lies below the mark of its level.
    pub fn all_passed(&self, leases: &[GrantedLease]) -> bool {
        leases.iter().all(|l| self.passed(l))
    }
}

/// The main claim loop's marks as the session's straggler claim sees them. A straggler walk
/// starts at the oldest entry; what it finds below the marks published when it began are
/// stragglers, and what it finds at or past them is the backlog the main claim is working
/// through, which is no reason to walk again at once (S6 in docs/performance.md). The marks
/// published while it ran are no measure: a main claim beside it skips the rows the straggler
/// walk holds and moves its marks past them.
#[derive(Debug, Clone, Default)]
pub struct PublishedMarks(Arc<Mutex<DueMarks>>);

impl PublishedMarks {
    /// Makes `marks` the ones the straggler claim compares with.
    pub fn publish(&self, marks: &DueMarks) {
        if let Ok(mut published) = self.0.lock() {
            published.clone_from(marks);
        }
    }

    /// The marks published last (none if the lock was poisoned: then nothing counts as passed).
    pub fn current(&self) -> DueMarks {
        self.0.lock().map(|marks| marks.clone()).unwrap_or_default()
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
        marks.record(&[lease(9, 3), lease(9, 7), lease(5, 2), lease(5, 4)]);
        let claim = marks.due_from();
        assert_eq!(claim.len(), 10);
        assert_eq!(claim[9], Some(at(7)));
        assert_eq!(claim[5], Some(at(4)));
        assert_eq!(claim[0], None, "a level the claim never reached");
        marks.record(&[]);
        assert_eq!(
            marks.due_from()[5],
            Some(at(4)),
            "an empty claim moves nothing"
        );
        marks.record(&[lease(5, 3)]);
        assert_eq!(
            marks.due_from()[5],
            Some(at(4)),
            "marks never go back on a claim"
        );
    }

    #[test]
    fn an_announced_due_time_brings_the_later_marks_down_to_it() {
        let mut marks = DueMarks::default();
        marks.record(&[lease(9, 10), lease(5, 20)]);
        marks.heard_due(Some(at(25)));
        assert_eq!(marks.due_from()[5], Some(at(20)), "due after every mark");
        marks.heard_due(Some(at(15)));
        let claim = marks.due_from();
        assert_eq!(
            claim[5],
            Some(at(15)),
            "the level is not said: every later mark"
        );
        assert_eq!(claim[9], Some(at(10)));
    }

    #[test]
    fn only_leases_below_the_published_marks_of_their_level_were_passed() {
        let published = PublishedMarks::default();
        assert!(
            !published.current().all_passed(&[lease(5, 1)]),
            "no mark: the main walk starts at the oldest entry"
        );
        let mut marks = DueMarks::default();
        marks.record(&[lease(5, 10)]);
        published.publish(&marks);
        let seen = published.current();
        assert!(seen.all_passed(&[lease(5, 3), lease(5, 9)]));
        assert!(
            !seen.all_passed(&[lease(5, 3), lease(5, 10)]),
            "at the mark: the main walk's next start"
        );
        assert!(
            !seen.all_passed(&[lease(5, 3), lease(4, 1)]),
            "a level the main walk has no mark for"
        );
        marks.record(&[lease(5, 20)]);
        published.publish(&marks);
        assert!(
            !seen.all_passed(&[lease(5, 15)]),
            "marks published after a walk began do not count for it"
        );
    }

    #[test]
    fn an_announcement_without_a_due_time_drops_every_mark() {
        let mut marks = DueMarks::default();
        marks.record(&[lease(5, 20)]);
        assert!(marks.is_set());
        marks.heard_due(None);
        assert!(marks.due_from().iter().all(Option::is_none));
        assert!(!marks.is_set());
    }
}
