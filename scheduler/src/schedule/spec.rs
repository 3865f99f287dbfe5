//! What a schedule spec must meet, and the stored schedule it becomes. The spec is stored as the
//! `herald.v1.ScheduleSpec` the client sent (the task template of every run); the policy
//! columns are copies the materialiser reads without decoding.

use chrono::{DateTime, Utc};
use herald_proto::v1 as pb;
use prost::Message;

use super::fire_times::{DstPolicy, FireTimes, FireTimesError, RepeatedTime, SkippedTime};
use super::model::ScheduleRecord;
use crate::error::{Error, Violations};
use crate::rules;
use crate::tasks::model::TaskSpec;

/// Most recipients per schedule.
pub const MAX_RECIPIENTS: usize = 1_000;

/// How many upcoming fire times are checked against the minimum period: enough to cover a
/// day of a schedule that fires in bursts (`* 9 * * *` fires 60 times in its hour).
const PERIOD_SAMPLE: usize = 500;

/// The DST policy of wire enum values.
pub fn policy(skipped: i32, repeated: i32) -> DstPolicy {
    DstPolicy {
        skipped: if skipped == pb::SkippedTimePolicy::Skip as i32 {
            SkippedTime::Skip
        } else {
            SkippedTime::ShiftForward
        },
        repeated: if repeated == pb::RepeatedTimePolicy::FireTwice as i32 {
            RepeatedTime::FireTwice
        } else {
            RepeatedTime::FireOnce
        },
    }
}

/// The zone of a spec: UTC when none is given.
pub fn zone_or_utc(z: &str) -> &str {
    if z.is_empty() {
        "UTC"
    } else {
        z
    }
}

/// Fire-time rules of an expression given in a request; violations name `cron_field` or
/// `zone_field`.
pub fn fire_times(
    cron: &str,
    zone: &str,
    policy: DstPolicy,
    cron_field: &str,
    zone_field: &str,
) -> Result<FireTimes, Error> {
    FireTimes::parse(cron, zone_or_utc(zone), policy).map_err(|e| match e {
        FireTimesError::Zone => Error::invalid(zone_field, "is not an IANA time zone name"),
        e => Error::invalid(cron_field, e.to_string()),
    })
}

/// Records a violation, under `prefix`, for each daylight-saving policy that is not one of its
/// enum's values: stored as the default, an unknown one silently became another policy.
pub fn check_dst_policy(skipped: i32, repeated: i32, prefix: &str, v: &mut Violations) {
    if pb::SkippedTimePolicy::try_from(skipped).is_err() {
        v.add(
            format!("{prefix}skipped_time"),
            "is not a SkippedTimePolicy value",
        );
    }
    if pb::RepeatedTimePolicy::try_from(repeated).is_err() {
        v.add(
            format!("{prefix}repeated_time"),
            "is not a RepeatedTimePolicy value",
        );
    }
}

fn ms_of(d: Option<&prost_types::Duration>) -> Option<i64> {
    // Saturating: a huge duration is out of range, not an overflow (found by fuzzing, #10).
    d.map(|d| {
        d.seconds
            .saturating_mul(1000)
            .saturating_add(i64::from(d.nanos) / 1_000_000)
    })
}

/// The task one recipient of a run gets, before its due time is set.
pub fn task_of(spec: &pb::ScheduleSpec, recipient: &str) -> TaskSpec {
    TaskSpec {
        queue: spec.queue.clone(),
        recipient: recipient.to_owned(),
        content: spec.content.clone(),
        priority: spec.priority,
        max_attempts: spec.max_attempts,
        // The schedule's policy, applied to every task of every run.
        retry: spec
            .retry_policy
            .as_ref()
            .and_then(crate::tasks::model::RetryPolicy::from_wire),
        labels: spec.labels.clone(),
        pool: spec.pool.clone(),
        account_id: spec.account_id.clone(),
        ..Default::default()
    }
}

/// Checks a spec into a record (cursor unset) and its fire-time rules.
pub fn check(
    spec: &pb::ScheduleSpec,
    now: DateTime<Utc>,
) -> Result<(ScheduleRecord, FireTimes), Error> {
    let mut v = Violations::default();
    if let Some(p) = rules::name_problem(&spec.id) {
        v.add("schedule.id", p);
    }
    let fires = match FireTimes::parse(
        &spec.cron,
        zone_or_utc(&spec.time_zone),
        policy(spec.skipped_time, spec.repeated_time),
    ) {
        Ok(f) => Some(f),
        Err(FireTimesError::Zone) => {
            v.add("schedule.time_zone", "is not an IANA time zone name");
            None
        }
        Err(e) => {
            v.add("schedule.cron", e.to_string());
            None
        }
    };
    // A valid expression for a date that never comes (`0 0 30 2 *`) would make a schedule
    // that never runs, with nothing to say so.
    if fires.as_ref().is_some_and(|f| f.preview(now, 1).is_empty()) {
        v.add("schedule.cron", "never fires: no date matches it");
    }
    let mut bounded = |field: &str, d: Option<&prost_types::Duration>, max_ms: i64| -> i64 {
        match ms_of(d) {
            None => 0,
            Some(ms) if (0..=max_ms).contains(&ms) => ms,
            Some(_) => {
                v.add(format!("schedule.{field}"), "is out of range");
                0
            }
        }
    };
    let jitter_ms = bounded("jitter", spec.jitter.as_ref(), 3_600_000);
    let stagger_ms = bounded("stagger", spec.stagger.as_ref(), 86_400_000);
    // A task due at its fire time that expires at or before it would be refused when the run
    // makes it: every run would create nothing, with only a log line to say so.
    if let Some(ms) = ms_of(spec.expire_after.as_ref()) {
        if !(1..=366 * 86_400_000).contains(&ms) {
            v.add(
                "schedule.expire_after",
                "must be positive and at most 366 days",
            );
        }
    }
    if let Some(ms) = ms_of(spec.overrun_after.as_ref()) {
        if !(1_000..=7 * 86_400_000).contains(&ms) {
            v.add("schedule.overrun_after", "must be between 1 s and 7 days");
        }
    }
    let grace_ms = match ms_of(spec.misfire_grace.as_ref()) {
        None => 60_000,
        Some(ms) if (1_000..=86_400_000).contains(&ms) => ms,
        Some(_) => {
            v.add("schedule.misfire_grace", "must be between 1 s and 24 h");
            60_000
        }
    };
    if let Some(a) = &spec.audience {
        check_audience(spec, a, &mut v);
    } else if spec.recipients.is_empty() || spec.recipients.len() > MAX_RECIPIENTS {
        v.add("schedule.recipients", "must hold 1 to 1,000 recipients");
    }
    if let Some(src) = &spec.variables_source {
        check_source(src, &mut v);
    }
    let mut seen = std::collections::HashSet::new();
    if spec
        .recipients
        .iter()
        .any(|r| !seen.insert(crate::rules::recipient_key(r)))
    {
        v.add(
            "schedule.recipients",
            "must be distinct (a number with and without its leading + is one recipient)",
        );
    }
    if spec.labels.keys().any(|k| k.starts_with("herald.")) {
        v.add("schedule.labels", "keys starting with herald. are reserved");
    }
    check_dst_policy(spec.skipped_time, spec.repeated_time, "schedule.", &mut v);
    if pb::OverlapPolicy::try_from(spec.overlap).is_err() {
        v.add("schedule.overlap", "is not an OverlapPolicy value");
    }
    if pb::MisfirePolicy::try_from(spec.misfire).is_err() {
        v.add("schedule.misfire", "is not a MisfirePolicy value");
    }
    check_tasks(spec, now, &mut v);
    let overlap = if spec.overlap == pb::OverlapPolicy::Skip as i32 {
        "skip"
    } else {
        "allow"
    };
    let misfire = match pb::MisfirePolicy::try_from(spec.misfire) {
        Ok(pb::MisfirePolicy::Skip) => "skip",
        Ok(pb::MisfirePolicy::CatchUp) => "catch_up",
        _ => "fire_once_now",
    };
    let Some(fires) = fires.filter(|_| v.is_empty()) else {
        return Err(v.into_error());
    };
    let mut stored = spec.clone();
    stored.time_zone = zone_or_utc(&spec.time_zone).to_string();
    let p = policy(spec.skipped_time, spec.repeated_time);
    Ok((
        ScheduleRecord {
            id: spec.id.clone(),
            cron: spec.cron.clone(),
            time_zone: stored.time_zone.clone(),
            skipped_time: match p.skipped {
                SkippedTime::Skip => "skip",
                SkippedTime::ShiftForward => "shift_forward",
            }
            .into(),
            repeated_time: match p.repeated {
                RepeatedTime::FireTwice => "fire_twice",
                RepeatedTime::FireOnce => "fire_once",
            }
            .into(),
            overlap: overlap.into(),
            misfire: misfire.into(),
            misfire_grace_ms: grace_ms,
            jitter_ms,
            stagger_ms,
            stagger_off_round: spec.stagger_off_round_minutes,
            spec: stored.encode_to_vec(),
            paused: false,
            next_fire_at: None,
            last_fire_at: None,
            created_at: now,
            updated_at: now,
        },
        fires,
    ))
}

/// Applies an update mask's paths from `patch` onto `current` (UpdateSchedule); returns
/// whether the fire-time rules changed (expression, zone or DST policies), which moves the
/// schedule's cursor. `id` cannot change; an unknown path is INVALID_ARGUMENT naming
/// `update_mask`.
pub fn merge(
    current: &mut pb::ScheduleSpec,
    patch: &pb::ScheduleSpec,
    paths: &[String],
) -> Result<bool, Error> {
    if paths.is_empty() {
        return Err(Error::invalid(
            "update_mask",
            "name at least one field to change",
        ));
    }
    let rules_before = (
        current.cron.clone(),
        current.time_zone.clone(),
        current.skipped_time,
        current.repeated_time,
    );
    for path in paths {
        match path.as_str() {
            "cron" => current.cron.clone_from(&patch.cron),
            "time_zone" => current.time_zone.clone_from(&patch.time_zone),
            "skipped_time" => current.skipped_time = patch.skipped_time,
            "repeated_time" => current.repeated_time = patch.repeated_time,
            "jitter" => current.jitter = patch.jitter,
            "stagger" => current.stagger = patch.stagger,
            "stagger_off_round_minutes" => {
                current.stagger_off_round_minutes = patch.stagger_off_round_minutes
            }
            "overlap" => current.overlap = patch.overlap,
            "misfire" => current.misfire = patch.misfire,
            "misfire_grace" => current.misfire_grace = patch.misfire_grace,
            "queue" => current.queue.clone_from(&patch.queue),
            "recipients" => current.recipients.clone_from(&patch.recipients),
            "content" => current.content.clone_from(&patch.content),
            "labels" => current.labels.clone_from(&patch.labels),
            "pool" => current.pool.clone_from(&patch.pool),
            "account_id" => current.account_id.clone_from(&patch.account_id),
            "priority" => current.priority = patch.priority,
            "max_attempts" => current.max_attempts = patch.max_attempts,
            "expire_after" => current.expire_after = patch.expire_after,
            "retry_policy" => current.retry_policy.clone_from(&patch.retry_policy),
            "overrun_after" => current.overrun_after = patch.overrun_after,
            "audience" => current.audience.clone_from(&patch.audience),
            "variables_source" => current.variables_source.clone_from(&patch.variables_source),
            other => {
                return Err(Error::invalid(
                    "update_mask",
                    format!("unknown or read-only path {other:?}"),
                ))
            }
        }
    }
    // Changed in value, not merely named: a client that sends the whole schedule with every
    // path in its mask must not move the cursor past a fire time not yet materialised.
    let rules_after = (
        current.cron.clone(),
        current.time_zone.clone(),
        current.skipped_time,
        current.repeated_time,
    );
    Ok(rules_before != rules_after)
}

/// Checks an audience target: no inline recipients beside it, and well-formed filters (that
/// the audience exists and declares the date attribute is checked against the store).
fn check_audience(spec: &pb::ScheduleSpec, a: &pb::AudienceTarget, v: &mut Violations) {
    if !spec.recipients.is_empty() {
        v.add(
            "schedule.recipients",
            "must be empty when the schedule targets an audience",
        );
    }
    if let Some(p) = rules::name_problem(&a.audience_id) {
        v.add("schedule.audience.audience_id", p);
    }
    for (i, t) in a.tags.iter().enumerate() {
        if let Some(p) = crate::audiences::model::tag_problem(t) {
            v.add(format!("schedule.audience.tags[{i}]"), p);
        }
    }
    if !a.date_attribute.is_empty() {
        if let Some(p) = crate::audiences::model::attribute_name_problem(&a.date_attribute) {
            v.add("schedule.audience.date_attribute", p);
        }
    }
}

/// Checks a variables source: a URL herald may call, and a timeout within bounds.
fn check_source(src: &pb::VariablesSource, v: &mut Violations) {
    // Only the shape here: which addresses are allowed is the replica's configuration.
    let any_address = herald_outbound::guard::AddressPolicy {
        allow_private_networks: true,
        ..Default::default()
    };
    if let Err(p) = super::source::check_url(&src.url, &any_address) {
        v.add("schedule.variables_source.url", p);
    }
    if let Some(ms) = ms_of(src.timeout.as_ref()) {
        let max = super::source::MAX_TIMEOUT.as_millis() as i64;
        if !(1..=max).contains(&ms) {
            v.add(
                "schedule.variables_source.timeout",
                "must be between 1 ms and 60 s",
            );
        }
    }
}

/// Checks the task every recipient of a run will get, as the materialiser will create it; a
/// rule broken for several recipients is reported once (recipients by index). An audience's
/// contacts are checked when they are written, so its runs' tasks are checked with a stand-in
/// recipient for everything else.
fn check_tasks(spec: &pb::ScheduleSpec, now: DateTime<Utc>, v: &mut Violations) {
    let mut reported: Vec<(String, String)> = Vec::new();
    let stand_in = ["audience-contact".to_string()];
    let recipients: &[String] = if spec.audience.is_some() {
        &stand_in
    } else {
        &spec.recipients
    };
    for (i, r) in recipients.iter().enumerate().take(MAX_RECIPIENTS) {
        let mut tv = Violations::default();
        task_of(spec, r).validate("schedule", now, &mut tv);
        for f in tv.as_slice() {
            let field = if f.field == "schedule.recipient" {
                format!("schedule.recipients[{i}]")
            } else {
                f.field.clone()
            };
            let entry = (field, f.description.clone());
            if !reported.contains(&entry) {
                reported.push(entry);
            }
        }
    }
    for (field, description) in reported {
        v.add(field, description);
    }
}

/// Refuses expressions whose consecutive fire times come closer than `min_period`: a schedule
/// per second would turn one RPC into an unbounded stream of sends.
pub fn check_period(
    fires: &FireTimes,
    now: DateTime<Utc>,
    min_period: chrono::Duration,
) -> Result<(), Error> {
    let upcoming = fires.preview(now, PERIOD_SAMPLE);
    if upcoming
        .windows(2)
        .any(|pair| pair[1] - pair[0] < min_period)
    {
        return Err(Error::invalid(
            "schedule.cron",
            format!(
                "fires more often than the minimum period of {} s (HERALD_MIN_SCHEDULE_PERIOD)",
                min_period.num_seconds()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daily() -> pb::ScheduleSpec {
        pb::ScheduleSpec {
            id: "daily".into(),
            cron: "0 9 * * *".into(),
            time_zone: "Europe/Berlin".into(),
            ..Default::default()
        }
    }

    #[test]
    fn naming_the_rules_in_a_mask_without_changing_them_is_no_change_of_rules() {
        let every_rule: Vec<String> = ["cron", "time_zone", "skipped_time", "repeated_time"]
            .iter()
            .map(|p| p.to_string())
            .collect();
        let mut current = daily();
        assert!(matches!(
            merge(&mut current, &daily(), &every_rule),
            Ok(false)
        ));
        let later = pb::ScheduleSpec {
            cron: "0 10 * * *".into(),
            ..daily()
        };
        assert!(matches!(merge(&mut current, &later, &every_rule), Ok(true)));
        assert_eq!(current.cron, "0 10 * * *");
        let elsewhere = pb::ScheduleSpec {
            time_zone: "Asia/Tokyo".into(),
            ..later
        };
        assert!(matches!(
            merge(&mut current, &elsewhere, &["time_zone".to_string()]),
            Ok(true)
        ));
    }
}
