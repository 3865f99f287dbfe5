//! Fuzzing cron parsing and fire-time computation (issue #10): arbitrary expressions, zones,
//! DST policies and start instants never panic; for valid ones fire times strictly increase,
//! come after the start, and fall on wall-clock times the expression names (or on a DST
//! transition the policy moved them across); every search ends. Case counts:
//! `PROPTEST_CASES` (docs/fuzzing.md).

mod fuzz_support;

use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use herald_scheduler::schedule::fire_times::{
    local_to_instant, local_to_instants, DstPolicy, FireTimes, RepeatedTime, SkippedTime,
};
use proptest::prelude::*;

use fuzz_support::*;

/// One cron field from a small grammar that covers what croner accepts (and some it refuses).
fn field() -> impl Strategy<Value = String> {
    // Mostly 1..=12, valid in every field, so that a good share of expressions parse.
    let n = || prop_oneof![4 => 1u32..13, 1 => 0u32..70];
    prop_oneof![
        4 => Just("*".to_string()),
        2 => n().prop_map(|a| a.to_string()),
        1 => (n(), 1u32..40).prop_map(|(a, s)| format!("{a}/{s}")),
        1 => (1u32..40).prop_map(|s| format!("*/{s}")),
        1 => (n(), n()).prop_map(|(a, b)| format!("{a}-{b}")),
        1 => (n(), n(), 0u32..30).prop_map(|(a, b, s)| format!("{a}-{b}/{s}")),
        1 => prop::collection::vec(n(), 1..4).prop_map(|v| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
        1 => prop::sample::select(vec![
            "L", "W", "15W", "LW", "?", "5L", "1#2", "5#5", "6#6", "MON-FRI", "JAN", "dec",
            "SUN,SAT", "L-3", "0#1", "*/0", "-1", "99999999999999999999", "", "**", "1-", ",",
        ]).prop_map(str::to_string),
    ]
}

fn expression() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::collection::vec(field(), 5..7).prop_map(|f| f.join(" ")),
        1 => prop::collection::vec(field(), 0..9).prop_map(|f| f.join(" ")),
        1 => prop::sample::select(vec![
            "0 0 30 2 *", "0 0 31 4 *", "0 2 * * *", "30 1 * * *", "0 0 29 2 *", "0 0 L 2 *",
            "0 0 * * 5L", "0 0 1 1 *", "@daily", "@hourly", "0 30 2 * * *", "59 59 23 31 12 *",
        ]).prop_map(str::to_string),
        1 => text(),
    ]
}

fn policy() -> impl Strategy<Value = DstPolicy> {
    (any::<bool>(), any::<bool>()).prop_map(|(skip, twice)| DstPolicy {
        skipped: if skip {
            SkippedTime::Skip
        } else {
            SkippedTime::ShiftForward
        },
        repeated: if twice {
            RepeatedTime::FireTwice
        } else {
            RepeatedTime::FireOnce
        },
    })
}

/// Start instants: now-ish, around this decade's DST changes, and chrono's extremes.
fn instant() -> impl Strategy<Value = DateTime<Utc>> {
    let now = Utc::now().timestamp();
    prop_oneof![
        6 => (now - 400 * 86_400..now + 800 * 86_400).prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or_default()),
        1 => (-62_135_596_800i64..253_402_300_799).prop_map(|s| DateTime::from_timestamp(s, 0).unwrap_or_default()),
        1 => prop::sample::select(vec![
            DateTime::<Utc>::MIN_UTC,
            DateTime::<Utc>::MAX_UTC,
            DateTime::<Utc>::MIN_UTC + Duration::hours(2),
            DateTime::<Utc>::MAX_UTC - Duration::hours(2),
            DateTime::<Utc>::UNIX_EPOCH,
        ]),
    ]
}

/// Naive wall-clock times, including chrono's extremes.
fn naive() -> impl Strategy<Value = NaiveDateTime> {
    prop_oneof![
        3 => instant().prop_map(|t| t.naive_utc()),
        1 => prop::sample::select(vec![
            NaiveDateTime::MIN,
            NaiveDateTime::MAX,
            NaiveDate::from_ymd_opt(2027, 3, 14).and_then(|d| d.and_hms_opt(2, 30, 0)).unwrap_or_default(),
            NaiveDate::from_ymd_opt(2027, 11, 7).and_then(|d| d.and_hms_opt(1, 30, 0)).unwrap_or_default(),
        ]),
    ]
}

/// True when the zone's offset changes within `reach` of `at` (a policy may have moved a fire
/// time off the wall-clock time the expression names).
fn transition_within(zone: &Tz, at: DateTime<Utc>, reach: Duration) -> bool {
    let offset = |t: DateTime<Utc>| zone.offset_from_utc_datetime(&t.naive_utc()).fix();
    offset(at - reach) != offset(at + reach) || offset(at - reach) != offset(at)
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn fire_times_increase_and_match_the_expression(
        expr in expression(),
        zone in zone(),
        policy in policy(),
        after in instant(),
        n in 1usize..6,
    ) {
        let Ok(fires) = FireTimes::parse(&expr, &zone, policy) else {
            return Ok(());
        };
        let tz: Tz = zone.parse().unwrap();
        let cron = Cron::new(&expr).with_seconds_optional().parse().unwrap();
        let times = fires.preview(after, n);
        prop_assert!(times.len() <= n);
        let mut previous = after;
        for t in &times {
            prop_assert!(*t > previous, "{t} does not follow {previous} for {expr:?} in {zone}");
            previous = *t;
            let local = t.with_timezone(&tz).naive_local();
            let matches = cron.is_time_matching(&local.and_utc()).unwrap_or(false);
            prop_assert!(
                matches || transition_within(&tz, *t, Duration::hours(3)),
                "{t} ({local} in {zone}) is not named by {expr:?}"
            );
        }
        // next_after agrees with preview.
        prop_assert_eq!(fires.next_after(after), times.first().copied());
    }

    #[test]
    fn wall_clock_mapping_never_panics(
        zone in zone(),
        policy in policy(),
        local in naive(),
    ) {
        let Ok(tz) = zone.parse::<Tz>() else {
            return Ok(());
        };
        let all = local_to_instants(&tz, local, policy);
        prop_assert!(all.len() <= 2);
        if all.len() == 2 {
            prop_assert!(all[0] < all[1]);
        }
        let one = local_to_instant(&tz, local);
        if policy == DstPolicy::default() {
            prop_assert_eq!(one, all.first().copied());
        }
    }
}

/// Regression (found by fuzzing, #10): a wall-clock time at chrono's limits is not in any gap,
/// just unrepresentable as an instant; shifting it forward overflowed and panicked.
#[test]
fn wall_clock_times_at_chronos_limits_map_to_nothing() {
    let policy = DstPolicy::default();
    let adak: Tz = "America/Adak".parse().unwrap();
    let first = NaiveDate::from_ymd_opt(-262_143, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap();
    let _ = local_to_instants(&adak, first, policy);
    for zone in ["America/New_York", "Asia/Tokyo", "UTC"] {
        let tz: Tz = zone.parse().unwrap();
        for local in [NaiveDateTime::MIN, NaiveDateTime::MAX] {
            let instants = local_to_instants(&tz, local, policy);
            assert!(instants.len() <= 1, "{zone} {local}: {instants:?}");
        }
    }
}

/// Regression (found by fuzzing, #10): a search from an instant near chrono's limits (a
/// PreviewFireTimes `after` is any valid timestamp) overflowed; outside years 1 to 4999 there
/// is no next fire time.
#[test]
fn searches_from_the_ends_of_time_find_nothing() {
    let fires = FireTimes::parse("* * 1 * *", "Africa/Abidjan", DstPolicy::default()).unwrap();
    let ancient = NaiveDate::from_ymd_opt(-262_143, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap()
        .and_utc();
    for after in [ancient, DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
        assert_eq!(fires.next_after(after), None, "after {after}");
        assert!(fires.preview(after, 3).is_empty());
    }
    let w = FireTimes::parse("0 0 15W * *", "Pacific/Kiritimati", DstPolicy::default()).unwrap();
    assert_eq!(w.next_after(DateTime::<Utc>::MIN_UTC), None);
    // Year 1 still works.
    let year_one = NaiveDate::from_ymd_opt(1, 1, 1)
        .and_then(|d| d.and_hms_opt(12, 0, 0))
        .unwrap()
        .and_utc();
    assert!(fires.next_after(year_one).is_some_and(|t| t > year_one));
}

/// An expression that never fires ends its search (bounded iteration) with no fire time.
#[test]
fn an_expression_that_never_fires_ends_its_search() {
    for zone in ["UTC", "America/New_York"] {
        let fires = FireTimes::parse("0 0 30 2 *", zone, DstPolicy::default()).unwrap();
        assert_eq!(fires.next_after(Utc::now()), None);
        assert!(fires.preview(Utc::now(), 5).is_empty());
    }
}
