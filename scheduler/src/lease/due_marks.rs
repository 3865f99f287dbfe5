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
//! A full batch at a level means every due task of that level up to the batch's latest due time
//! was leased, or locked by another claim at that moment, or not yet committed. So the next walk
//! at that level can start there. Tasks that land below a mark later (a returned lease keeps its
//! old due time, a create that committed late, a row another transaction held) are not lost:
//! a short batch, a due announcement earlier than a mark, or the mark's age past [`MARK_TTL`]
//! puts every level back to a full walk. The marks only steer the walk; they never decide what
//! is due.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::tasks::model::GrantedLease;

/// The longest a set of marks steers claims before a walk from the oldest entry: bounds how
/// late a task left below a mark can be, and costs one full walk per dispatcher per period.
pub const MARK_TTL: Duration = Duration::from_secs(1);

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
    /// The marks for a claim made at `now`, indexed by priority (the claim's `$6`, whose
    /// element `priority + 1` it reads); forgets them first once they are [`MARK_TTL`] old.
    pub fn for_claim(&mut self, now: Instant) -> Vec<Option<DateTime<Utc>>> {
        if self
            .since
            .is_some_and(|since| now.saturating_duration_since(since) >= MARK_TTL)
        {
            self.reset();
        }
        self.marks.to_vec()
    }

    /// Learns from a claim that asked for `want` leases through the queue walk and got
    /// `leases`, at `now`. A full batch moves the marks of the levels it reached; a short one
    /// means the walk found the end of what is due, so the next one starts from the oldest.
    pub fn record(&mut self, leases: &[GrantedLease], want: u32, now: Instant) {
        if leases.len() < want as usize {
            self.reset();
            return;
        }
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

    /// Learns of tasks that became due at `at` (None: unknown). An announcement does not say
    /// the level, and one earlier than any mark could be skipped by the walk that mark steers,
    /// so every level walks from the oldest again.
    pub fn heard_due(&mut self, at: Option<DateTime<Utc>>) {
        let highest = self.marks.iter().flatten().max();
        match (at, highest) {
            (_, None) => {}
            (Some(at), Some(highest)) if at >= *highest => {}
            _ => self.reset(),
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
    fn a_full_batch_marks_each_level_it_reached_at_its_latest_due_time() {
        let mut marks = DueMarks::default();
        let now = Instant::now();
        let batch = [lease(9, 3), lease(9, 7), lease(5, 2), lease(5, 4)];
        marks.record(&batch, 4, now);
        let claim = marks.for_claim(now);
        assert_eq!(claim.len(), 10);
        assert_eq!(claim[9], Some(at(7)));
        assert_eq!(claim[5], Some(at(4)));
        assert_eq!(claim[0], None, "a level the batch never reached");
    }

    #[test]
    fn a_short_batch_sends_every_level_back_to_the_oldest_entry() {
        let mut marks = DueMarks::default();
        let now = Instant::now();
        marks.record(&[lease(5, 4), lease(5, 6)], 2, now);
        marks.record(&[lease(3, 9)], 2, now);
        assert!(marks.for_claim(now).iter().all(Option::is_none));
    }

    #[test]
    fn marks_are_forgotten_once_they_are_a_ttl_old() {
        let mut marks = DueMarks::default();
        let set = Instant::now();
        marks.record(&[lease(5, 4)], 1, set);
        // A later full batch moves the mark but not its age.
        marks.record(&[lease(5, 8)], 1, set + MARK_TTL / 2);
        assert_eq!(marks.for_claim(set + MARK_TTL / 2)[5], Some(at(8)));
        assert!(marks.for_claim(set + MARK_TTL).iter().all(Option::is_none));
    }

    #[test]
    fn a_task_due_before_any_mark_resets_them_and_a_later_one_does_not() {
        let mut marks = DueMarks::default();
        let now = Instant::now();
        marks.record(&[lease(9, 10), lease(5, 20)], 2, now);
        marks.heard_due(Some(at(20)));
        assert_eq!(marks.for_claim(now)[5], Some(at(20)), "not below any mark");
        marks.heard_due(Some(at(15)));
        assert!(
            marks.for_claim(now).iter().all(Option::is_none),
            "below level 5's mark, though above level 9's"
        );
        marks.record(&[lease(5, 20)], 1, now);
        marks.heard_due(None);
        assert!(
            marks.for_claim(now).iter().all(Option::is_none),
            "an announcement without a time"
        );
    }
}
