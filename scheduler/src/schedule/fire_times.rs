//! Fire times of a cron expression in an IANA time zone, with an explicit daylight-saving
//! policy. Pure: no clock, no database.
//!
//! croner parses the expression and walks *naive* local wall-clock times (it is handed them as
//! if they were UTC, so it never applies an offset of its own). Each wall-clock candidate is then
//! mapped to instants through the zone, and the policy decides the two cases where that mapping
//! is not one-to-one:
//!
//! - **Skipped** (spring forward: 02:30 does not exist in New York on the second Sunday of
//!   March): `ShiftForward` fires at the wall time shifted forward by the length of the gap
//!   (02:30 → 03:30 EDT, the instant 02:30 EST would have been; java.time and PostgreSQL do the
//!   same); `Skip` does not fire. A shifted time that equals another fire time fires once.
//! - **Repeated** (fall back: 01:30 happens twice): `FireOnce` fires at the first occurrence
//!   (EDT); `FireTwice` fires at both.
//!
//! The default is shift forward and fire once: every wall-clock time named by the expression
//! fires exactly once a day.

use chrono::{DateTime, Datelike, Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;

/// What to do with a wall-clock time that the zone skips (spring forward).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SkippedTime {
    /// Fire at the time shifted forward by the gap (02:30 → 03:30).
    #[default]
    ShiftForward,
    /// Do not fire.
    Skip,
}

/// What to do with a wall-clock time that happens twice (fall back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RepeatedTime {
    /// Fire at its first occurrence only.
    #[default]
    FireOnce,
    /// Fire at both occurrences.
    FireTwice,
}

/// The daylight-saving policy of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DstPolicy {
    /// Skipped wall-clock times.
    pub skipped: SkippedTime,
    /// Repeated wall-clock times.
    pub repeated: RepeatedTime,
}

/// A parsed cron expression bound to a time zone and a DST policy.
#[derive(Debug, Clone)]
pub struct FireTimes {
    cron: Cron,
    zone: Tz,
    policy: DstPolicy,
}

/// Why an expression or zone was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FireTimesError {
    /// The cron expression does not parse.
    #[error("is not a valid cron expression (5 fields, or 6 with seconds first): {0}")]
    Cron(String),
    /// Not an IANA zone name.
    #[error("is not an IANA time zone name")]
    Zone,
}

/// No DST shift or gap is larger than this, so instants and wall times farther apart than it
/// are always in the same order.
const MAX_SHIFT: Duration = Duration::hours(3);
/// Searches stop after this many wall-clock candidates (a `0 0 30 2 *` never fires).
const MAX_CANDIDATES: usize = 100_000;
/// Fire times are searched from year 1 up to croner's horizon (it finds nothing from year 5000
/// on). Outside it there is no next fire time; near chrono's own limits the arithmetic of a
/// search would overflow (found by fuzzing, issue #10).
const SEARCH_YEARS: std::ops::Range<i32> = 1..5000;

impl FireTimes {
    /// Parses `expression` (5 fields, or 6 with seconds first) in IANA zone `zone`.
    pub fn parse(expression: &str, zone: &str, policy: DstPolicy) -> Result<Self, FireTimesError> {
        let zone: Tz = zone.parse().map_err(|_| FireTimesError::Zone)?;
        let fields = expression.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(FireTimesError::Cron(format!("has {fields} fields")));
        }
        // croner accepts `L` in any field and a bare `,` as a field, but in the seconds,
        // minutes or hours either names no time at all, and its search then walks towards year
        // 5000 (with `L` in the seconds, second by second: a `next_after` that never returned,
        // found by fuzz_cron as a 240 s timeout). Those fields take numbers, ranges, lists and
        // steps only, and name at least one value.
        let time_fields = fields - 3;
        if let Some(field) = expression.split_whitespace().take(time_fields).find(|f| {
            !f.chars().all(|c| c.is_ascii_digit() || "*/,-".contains(c))
                || !f.chars().any(|c| c.is_ascii_digit() || c == '*')
        }) {
            return Err(FireTimesError::Cron(format!(
                "the time field {field:?} takes numbers, ranges, lists and steps only"
            )));
        }
        let cron = Cron::new(expression)
            .with_seconds_optional()
            .parse()
            .map_err(|e| FireTimesError::Cron(e.to_string()))?;
        Ok(FireTimes { cron, zone, policy })
    }

    /// The instants (0, 1 or 2) at which wall-clock time `local` fires under the policy.
    pub fn instants_of(&self, local: NaiveDateTime) -> Vec<DateTime<Utc>> {
        local_to_instants(&self.zone, local, self.policy)
    }

    /// The first fire time strictly after `after`; None when there is none, or when `after` is
    /// outside the years 1 to 4999.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if !SEARCH_YEARS.contains(&after.year()) {
            return None;
        }
        // Start early enough that a wall time shifted or repeated into the future is seen.
        let start_local = after.with_timezone(&self.zone).naive_local() - MAX_SHIFT;
        let mut cursor = start_local.and_utc();
        let mut inclusive = true;
        let mut best: Option<(DateTime<Utc>, NaiveDateTime)> = None;
        for _ in 0..MAX_CANDIDATES {
            let candidate = self.cron.find_next_occurrence(&cursor, inclusive).ok()?;
            inclusive = false;
            cursor = candidate;
            let local = candidate.naive_utc();
            if let Some((instant, first_local)) = best {
                // Past the reach of any shift: nothing later can fire earlier.
                if local > first_local + MAX_SHIFT * 2 {
                    return Some(instant);
                }
            }
            for instant in self.instants_of(local) {
                if instant > after && best.is_none_or(|(b, _)| instant < b) {
                    let first_local = best.map_or(local, |(_, l)| l);
                    best = Some((instant, first_local));
                    if !self.transition_near(instant) {
                        // No offset change nearby: wall time and instant order agree.
                        return Some(instant);
                    }
                }
            }
        }
        best.map(|(i, _)| i)
    }

    /// Up to `n` fire times strictly after `after`.
    pub fn preview(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut t = after;
        while out.len() < n {
            match self.next_after(t) {
                Some(next) => {
                    out.push(next);
                    t = next;
                }
                None => break,
            }
        }
        out
    }

    fn transition_near(&self, instant: DateTime<Utc>) -> bool {
        let before = self
            .zone
            .offset_from_utc_datetime(&(instant - MAX_SHIFT).naive_utc())
            .fix();
        let after = self
            .zone
            .offset_from_utc_datetime(&(instant + MAX_SHIFT).naive_utc())
            .fix();
        before != after
    }
}

/// Maps a wall-clock time in `zone` to the instants it names under `policy`; also used for
/// local-time sends (with the default policy).
pub fn local_to_instants(zone: &Tz, local: NaiveDateTime, policy: DstPolicy) -> Vec<DateTime<Utc>> {
    match zone.from_local_datetime(&local) {
        LocalResult::Single(t) => vec![t.with_timezone(&Utc)],
        LocalResult::Ambiguous(first, second) => match policy.repeated {
            RepeatedTime::FireOnce => vec![first.with_timezone(&Utc)],
            RepeatedTime::FireTwice => vec![first.with_timezone(&Utc), second.with_timezone(&Utc)],
        },
        LocalResult::None => match policy.skipped {
            SkippedTime::Skip => vec![],
            SkippedTime::ShiftForward => {
                // The offset in force before the gap: a day earlier is safely before it. At
                // chrono's limits (no gap: the instant is just not representable) there is none.
                local
                    .checked_sub_signed(Duration::days(1))
                    .map(|day_before| zone.offset_from_utc_datetime(&day_before).fix())
                    .and_then(|before| {
                        local.checked_sub_signed(Duration::seconds(i64::from(
                            before.local_minus_utc(),
                        )))
                    })
                    .map(|shifted| shifted.and_utc())
                    .into_iter()
                    .collect()
            }
        },
    }
}

/// The one instant a wall-clock time names under the default policy (shift forward, first
/// occurrence).
pub fn local_to_instant(zone: &Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    local_to_instants(zone, local, DstPolicy::default())
        .into_iter()
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .map(|d| d.with_timezone(&Utc))
            .unwrap_or_else(|e| panic!("bad test time {s}: {e}"))
    }

    const SHIFT_ONCE: DstPolicy = DstPolicy {
        skipped: SkippedTime::ShiftForward,
        repeated: RepeatedTime::FireOnce,
    };
    const SKIP_TWICE: DstPolicy = DstPolicy {
        skipped: SkippedTime::Skip,
        repeated: RepeatedTime::FireTwice,
    };

    /// (cron, zone, policy, after, expected next fire times in UTC)
    #[test]
    fn fire_time_table() {
        let cases: &[(&str, &str, DstPolicy, &str, &[&str])] = &[
            // New York spring forward 2026-03-08 02:00 EST → 03:00 EDT.
            (
                "30 2 * * *",
                "America/New_York",
                SHIFT_ONCE,
                "2026-03-07T12:00:00Z",
                &[
                    "2026-03-08T07:30:00Z", /* 02:30 EST = 03:30 EDT */
                    "2026-03-09T06:30:00Z",
                ],
            ),
            (
                "30 2 * * *",
                "America/New_York",
                SKIP_TWICE,
                "2026-03-07T12:00:00Z",
                &["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"],
            ),
            // New York fall back 2026-11-01 02:00 EDT → 01:00 EST: 01:30 happens twice.
            (
                "30 1 * * *",
                "America/New_York",
                SHIFT_ONCE,
                "2026-10-31T12:00:00Z",
                &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
            ),
            (
                "30 1 * * *",
                "America/New_York",
                SKIP_TWICE,
                "2026-10-31T12:00:00Z",
                &[
                    "2026-11-01T05:30:00Z",
                    "2026-11-01T06:30:00Z",
                    "2026-11-02T06:30:00Z",
                ],
            ),
            // Every 30 minutes across the New York fall-back hour, fired twice: in instant order.
            (
                "*/30 1 * * *",
                "America/New_York",
                SKIP_TWICE,
                "2026-11-01T05:00:00Z",
                &[
                    "2026-11-01T05:30:00Z",
                    "2026-11-01T06:00:00Z",
                    "2026-11-01T06:30:00Z",
                    "2026-11-02T06:00:00Z",
                ],
            ),
            // Berlin spring forward 2026-03-29 02:00 CET → 03:00 CEST.
            (
                "15 2 * * *",
                "Europe/Berlin",
                SHIFT_ONCE,
                "2026-03-28T12:00:00Z",
                &[
                    "2026-03-29T01:15:00Z", /* 03:15 CEST */
                    "2026-03-30T00:15:00Z",
                ],
            ),
            (
                "15 2 * * *",
                "Europe/Berlin",
                SKIP_TWICE,
                "2026-03-28T12:00:00Z",
                &["2026-03-30T00:15:00Z"],
            ),
            // Berlin fall back 2026-10-25 03:00 CEST → 02:00 CET.
            (
                "15 2 * * *",
                "Europe/Berlin",
                SHIFT_ONCE,
                "2026-10-24T12:00:00Z",
                &["2026-10-25T00:15:00Z", "2026-10-26T01:15:00Z"],
            ),
            (
                "15 2 * * *",
                "Europe/Berlin",
                SKIP_TWICE,
                "2026-10-24T12:00:00Z",
                &[
                    "2026-10-25T00:15:00Z",
                    "2026-10-25T01:15:00Z",
                    "2026-10-26T01:15:00Z",
                ],
            ),
            // A shifted time equal to a real one fires once (02:00 and 03:00 both → 03:00 CEST).
            (
                "0 2,3 * * *",
                "Europe/Berlin",
                SHIFT_ONCE,
                "2026-03-28T23:00:00Z",
                &["2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"],
            ),
            // 29 February: only leap years.
            (
                "0 9 29 2 *",
                "UTC",
                SHIFT_ONCE,
                "2025-01-01T00:00:00Z",
                &["2028-02-29T09:00:00Z", "2032-02-29T09:00:00Z"],
            ),
            // The 31st: short months have none.
            (
                "0 8 31 * *",
                "Asia/Tokyo",
                SHIFT_ONCE,
                "2026-03-31T00:00:00Z",
                &[
                    "2026-05-30T23:00:00Z",
                    "2026-07-30T23:00:00Z",
                    "2026-08-30T23:00:00Z",
                ],
            ),
            // Six fields: seconds first.
            (
                "*/20 * * * * *",
                "Europe/Berlin",
                SHIFT_ONCE,
                "2026-06-01T10:00:05Z",
                &[
                    "2026-06-01T10:00:20Z",
                    "2026-06-01T10:00:40Z",
                    "2026-06-01T10:01:00Z",
                ],
            ),
            (
                "30 0 9 * * MON",
                "Europe/Berlin",
                SHIFT_ONCE,
                "2026-06-01T07:00:30Z",
                &["2026-06-08T07:00:30Z"],
            ),
            // Five fields: seconds are 0.
            (
                "0 9 * * *",
                "America/New_York",
                SHIFT_ONCE,
                "2026-03-07T15:00:00Z",
                &[
                    "2026-03-08T13:00:00Z", /* EDT now */
                    "2026-03-09T13:00:00Z",
                ],
            ),
        ];
        for (cron, zone, policy, after, expected) in cases {
            let f = FireTimes::parse(cron, zone, *policy)
                .unwrap_or_else(|e| panic!("{cron} in {zone}: {e}"));
            let got: Vec<String> = f
                .preview(utc(after), expected.len())
                .iter()
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .collect();
            assert_eq!(
                &got, expected,
                "{cron} in {zone} with {policy:?} after {after}"
            );
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(
            FireTimes::parse("* * *", "UTC", DstPolicy::default()),
            Err(FireTimesError::Cron(_))
        ));
        assert!(matches!(
            FireTimes::parse("61 * * * *", "UTC", DstPolicy::default()),
            Err(FireTimesError::Cron(_))
        ));
        assert!(matches!(
            FireTimes::parse("* * * * *", "Mars/Base", DstPolicy::default()),
            Err(FireTimesError::Zone)
        ));
        assert!(FireTimes::parse("0 0 0 * * * *", "UTC", DstPolicy::default()).is_err());
        // `L` or a bare `,` names no second, minute or hour; croner accepted them and then
        // searched towards year 5000 (with `L` in the seconds, without end).
        for expr in [
            "L * * * 6 MON-FRI",
            "0 L * * *",
            "0 0 L * * *",
            "0 5W * * *",
            ", 7 * * 9 *",
            ", * * */23 7-12/23 *",
        ] {
            assert!(
                matches!(
                    FireTimes::parse(expr, "UTC", DstPolicy::default()),
                    Err(FireTimesError::Cron(_))
                ),
                "{expr}"
            );
        }
        // Days and months keep their names and flags.
        assert!(FireTimes::parse("0 9 L * *", "UTC", DstPolicy::default()).is_ok());
        assert!(FireTimes::parse("0 9 * JUL MON-FRI", "UTC", DstPolicy::default()).is_ok());
        assert!(FireTimes::parse("*/10 0-5,7 */2 1 * *", "UTC", DstPolicy::default()).is_ok());
    }
}
