//! Fuzzing request validation (issue #10): arbitrary task, batch, schedule, campaign, account
//! and template requests never panic the validators, and each is either accepted or refused
//! with violations that name a field under the request's path. Accepted task specs round-trip
//! through the wire encoding. Case counts: `PROPTEST_CASES` (docs/fuzzing.md).

mod fuzz_support;

use chrono::Utc;
use herald_proto::v1 as pb;
use herald_scheduler::api::convert;
use herald_scheduler::error::{Error, FieldViolation, Violations};
use herald_scheduler::tasks::model::DueAt;
use proptest::prelude::*;
use prost::Message;

use fuzz_support::*;

/// The checks of each request as the scheduler runs them: wire conversion, then the domain's
/// rules.
mod validate {
    use chrono::{DateTime, Utc};
    use herald_proto::v1 as pb;
    use herald_scheduler::api::convert;
    use herald_scheduler::error::{Error, Violations};
    use herald_scheduler::tasks::model::NewTask;
    pub(crate) use herald_scheduler::tasks::model::{MAX_AHEAD, MAX_PAST};

    /// A wire task spec through the edge's conversion and the task domain's rules.
    pub(crate) fn task_spec(
        spec: &pb::TaskSpec,
        path: &str,
        _namespace: &str,
        now: DateTime<Utc>,
        v: &mut Violations,
    ) -> Option<NewTask> {
        let before = v.len();
        let domain = v.under(
            || path.to_owned(),
            |v| convert::tasks::task_spec(spec.clone(), v),
        );
        let wire_ok = v.len() == before;
        domain.validate(path, now, v).filter(|_| wire_ok)
    }

    pub(crate) fn duration_ms(d: &prost_types::Duration) -> Option<i64> {
        convert::duration_ms(d)
    }

    pub(crate) fn task_id(field: &str, value: &str) -> Result<uuid::Uuid, Error> {
        herald_scheduler::rules::uuid(field, value, "task")
    }

    pub(crate) fn parse_local_time(s: &str) -> Option<chrono::NaiveDateTime> {
        herald_scheduler::rules::parse_local_time(s)
    }

    pub(crate) fn queue_name_problem(name: &str) -> Option<&'static str> {
        herald_scheduler::rules::name_problem(name)
    }

    /// An account through conversion and the account domain's rules; whether it has limits
    /// (without them the definition holds stand-ins and a violation says so).
    pub(crate) fn account(a: &pb::Account, v: &mut Violations) -> bool {
        let spec = convert::accounts::account_spec(a, "account", v);
        spec.check("account", v);
        a.limits.is_some()
    }

    /// A template through conversion and the template domain's rules.
    pub(crate) fn template(t: &pb::Template) -> Result<String, Error> {
        let mut v = Violations::default();
        match convert::templates::template_spec(t).validate("template", &mut v) {
            Some(r) if v.is_empty() => Ok(r.id),
            _ => Err(v.into_error()),
        }
    }
}

fn content() -> impl Strategy<Value = Option<pb::Content>> {
    let text_body = prop_oneof![
        4 => Just("hello".to_string()),
        2 => text(),
        1 => (65_530usize..65_540).prop_map(|n| "y".repeat(n)),
    ];
    let template = (short_text(), short_text(), string_map()).prop_map(|(id, language, vars)| {
        pb::TemplateContent {
            template_id: id,
            language,
            variables: vars,
            ..Default::default()
        }
    });
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(pb::Content { body: None, ..Default::default() })),
        4 => text_body.prop_map(|t| Some(pb::Content { body: Some(pb::content::Body::Text(t)), ..Default::default() })),
        2 => template.prop_map(|t| Some(pb::Content { body: Some(pb::content::Body::Template(t)), ..Default::default() })),
    ]
}

fn retry_policy() -> impl Strategy<Value = Option<pb::RetryPolicy>> {
    let exponential = (
        opt_duration(),
        opt_duration(),
        float(),
        prop::option::of(float()),
    )
        .prop_map(|(initial, max, multiplier, jitter)| {
            pb::retry_policy::Strategy::Exponential(pb::ExponentialBackoff {
                initial,
                max,
                multiplier,
                jitter,
            })
        });
    let delays = prop::collection::vec(duration(), 0..24)
        .prop_map(|delays| pb::retry_policy::Strategy::Delays(pb::FixedDelays { delays }));
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(pb::RetryPolicy { strategy: None })),
        2 => exponential.prop_map(|s| Some(pb::RetryPolicy { strategy: Some(s) })),
        2 => delays.prop_map(|s| Some(pb::RetryPolicy { strategy: Some(s) })),
    ]
}

fn when() -> impl Strategy<Value = Option<pb::task_spec::When>> {
    prop_oneof![
        3 => Just(None),
        2 => timestamp().prop_map(|t| Some(pb::task_spec::When::RunAt(t))),
        2 => duration().prop_map(|d| Some(pb::task_spec::When::Delay(d))),
    ]
}

/// Mostly-valid values per field, so a fair share of specs is accepted.
fn queue() -> impl Strategy<Value = String> {
    prop_oneof![4 => Just("default".to_string()), 1 => text()]
}

fn recipient() -> impl Strategy<Value = String> {
    prop_oneof![4 => Just("+15550001".to_string()), 1 => text()]
}

fn optional_name() -> impl Strategy<Value = String> {
    prop_oneof![6 => Just(String::new()), 1 => short_text()]
}

fn task_spec() -> impl Strategy<Value = pb::TaskSpec> {
    let a = (
        queue(),
        recipient(),
        content(),
        when(),
        opt_i32(),
        prop_oneof![3 => Just(String::new()), 1 => text()],
        opt_i32(),
        retry_policy(),
    );
    let b = (
        prop_oneof![4 => Just(None), 1 => prop::option::of(timestamp())],
        string_map(),
        optional_name(),
        optional_name(),
        prop_oneof![4 => Just(String::new()), 1 => local_time()],
        prop_oneof![2 => Just(String::new()), 1 => zone()],
    );
    // Struct update syntax although every field is set today: a field added to TaskSpec then
    // starts at its default here instead of touching this file.
    #[allow(clippy::needless_update)]
    (a, b).prop_map(
        |(
            (queue, recipient, content, when, priority, idempotency_key, max_attempts, retry),
            (expire_at, labels, pool, account_id, local_time, local_time_zone),
        )| pb::TaskSpec {
            queue,
            recipient,
            content,
            when,
            priority,
            idempotency_key,
            max_attempts,
            retry_policy: retry,
            expire_at,
            labels,
            pool,
            account_id,
            local_time,
            local_time_zone,
            ..Default::default()
        },
    )
}

/// Every violation names a field under `path` and says something.
fn named_under(violations: &[FieldViolation], path: &str) -> Result<(), TestCaseError> {
    for v in violations {
        prop_assert!(
            v.field == path
                || v.field.starts_with(&format!("{path}."))
                || v.field.starts_with(&format!("{path}[")),
            "violation {v:?} is not under {path}"
        );
        prop_assert!(!v.description.is_empty(), "violation {v:?} says nothing");
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn task_specs_are_accepted_or_refused_by_field(spec in task_spec()) {
        let now = Utc::now();
        let mut v = Violations::default();
        let task = validate::task_spec(&spec, "task", "default", now, &mut v);
        prop_assert_eq!(task.is_some(), v.is_empty(), "accepted with violations {:?}", v.as_slice());
        named_under(v.as_slice(), "task")?;
        if let Some(task) = task {
            prop_assert_eq!(&task.queue, &spec.queue);
            prop_assert_eq!(&task.recipient, &spec.recipient);
            prop_assert_eq!(&task.labels, &spec.labels);
            prop_assert!((0..=9).contains(&task.priority));
            prop_assert!((1..=100).contains(&task.max_attempts));
            prop_assert_eq!(Some(task.content.clone()), spec.content.clone());
            if let DueAt::At(at) = task.due {
                prop_assert!(at >= now - validate::MAX_PAST && at <= now + validate::MAX_AHEAD);
            }
            // The wire round trip accepts it again, with the same idempotency hash.
            let decoded = pb::TaskSpec::decode(spec.encode_to_vec().as_slice()).unwrap();
            let mut again = Violations::default();
            let twin = validate::task_spec(&decoded, "task", "default", now, &mut again);
            prop_assert!(again.is_empty(), "round trip refused: {:?}", again.as_slice());
            let twin = twin.unwrap();
            prop_assert_eq!(task.idempotency.is_some(), !spec.idempotency_key.is_empty());
            prop_assert_eq!(twin.idempotency, task.idempotency);
        }
    }

    #[test]
    fn create_tasks_batches_name_each_element(specs in prop::collection::vec(task_spec(), 0..6)) {
        let now = Utc::now();
        let mut v = Violations::default();
        let accepted = specs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| validate::task_spec(s, &format!("tasks[{i}]"), "default", now, &mut v))
            .count();
        for (i, s) in specs.iter().enumerate() {
            let mut alone = Violations::default();
            let ok = validate::task_spec(s, &format!("tasks[{i}]"), "default", now, &mut alone).is_some();
            let mine: Vec<_> = v.as_slice().iter().filter(|f| f.field.starts_with(&format!("tasks[{i}]."))).cloned().collect();
            prop_assert_eq!(ok, mine.is_empty());
            prop_assert_eq!(mine, alone.as_slice().to_vec());
        }
        prop_assert_eq!(accepted == specs.len(), v.is_empty());
    }

    #[test]
    fn schedule_specs_are_accepted_or_refused_by_field(
        (id, cron, time_zone, skipped, repeated, jitter, stagger, off_round) in (
            queue(),
            prop_oneof![3 => Just("0 9 * * *".to_string()), 1 => Just("*/5 * * * * *".to_string()), 1 => text()],
            zone(),
            enum_value(),
            enum_value(),
            opt_duration(),
            opt_duration(),
            any::<bool>(),
        ),
        (overlap, misfire, grace, recipients, content, labels, priority, max_attempts) in (
            enum_value(),
            enum_value(),
            opt_duration(),
            prop_oneof![3 => Just(vec!["+15550001".to_string()]), 1 => prop::collection::vec(recipient(), 0..4), 1 => (990usize..1010).prop_map(|n| (0..n).map(|i| format!("+1{i}")).collect())],
            content(),
            string_map(),
            opt_i32(),
            opt_i32(),
        ),
        (queue, pool, account_id, expire_after) in (queue(), optional_name(), optional_name(), opt_duration()),
    ) {
        let spec = pb::ScheduleSpec {
            id,
            cron,
            time_zone,
            skipped_time: skipped,
            repeated_time: repeated,
            jitter,
            stagger,
            stagger_off_round_minutes: off_round,
            overlap,
            misfire,
            misfire_grace: grace,
            queue,
            recipients,
            content,
            labels,
            pool,
            account_id,
            priority,
            max_attempts,
            expire_after,
            ..Default::default()
        };
        let now = Utc::now();
        match herald_scheduler::schedule::spec::check(&spec, now) {
            Ok((record, fires)) => {
                prop_assert_eq!(&record.id, &spec.id);
                let stored = pb::ScheduleSpec::decode(record.spec.as_slice()).unwrap();
                prop_assert_eq!(&stored.cron, &spec.cron);
                prop_assert!((0..=3_600_000).contains(&record.jitter_ms));
                prop_assert!((1_000..=86_400_000).contains(&record.misfire_grace_ms));
                if let Some(next) = fires.next_after(now) {
                    prop_assert!(next > now);
                }
            }
            Err(Error::InvalidArgument(v)) => {
                prop_assert!(!v.is_empty());
                named_under(&v, "schedule")?;
            }
            Err(other) => prop_assert!(false, "not a validation error: {other}"),
        }
    }

    #[test]
    fn campaign_specs_are_accepted_or_refused_by_field(
        (name, queue, content, pool, start_at, local_start, time_zone) in (
            prop_oneof![3 => Just("spring sale".to_string()), 1 => text()],
            queue(),
            content(),
            optional_name(),
            prop::option::of(timestamp()),
            prop_oneof![2 => Just(String::new()), 1 => local_time()],
            prop_oneof![2 => Just(String::new()), 1 => zone()],
        ),
        (window, spacing, expire_at, labels, priority, max_attempts) in (
            opt_duration(),
            opt_duration(),
            prop_oneof![3 => Just(None), 1 => prop::option::of(timestamp())],
            string_map(),
            opt_i32(),
            opt_i32(),
        ),
    ) {
        let spec = pb::CampaignSpec {
            name,
            queue,
            content,
            pool,
            start_at,
            local_start,
            time_zone,
            window,
            spacing,
            expire_at,
            labels,
            priority,
            max_attempts,
            send_window: None,
            ..Default::default()
        };
        let v = herald_scheduler::campaigns::check_spec(&spec, Utc::now());
        named_under(v.as_slice(), "campaign")?;
    }

    #[test]
    fn accounts_are_accepted_or_refused_by_field(
        (id, sender_kind, pool, time_zone, credentials_ref, state, has_limits) in (
            queue(),
            prop_oneof![3 => Just("log".to_string()), 1 => text()],
            queue(),
            prop_oneof![2 => Just(String::new()), 1 => zone()],
            prop_oneof![3 => Just(String::new()), 1 => text()],
            enum_value(),
            prop::bool::weighted(0.9),
        ),
        (rate, burst, daily_cap, max_in_flight, interval, quiet, reserve, hp_min) in (
            prop_oneof![3 => Just(10.0), 1 => float()],
            opt_i32(),
            opt_i32(),
            opt_i32(),
            opt_duration(),
            prop::option::of((local_time(), prop_oneof![Just("22:00".to_string()), Just("08:00".to_string()), "[0-9]{2}:[0-9]{2}", short_text()])),
            prop_oneof![3 => Just(0.0), 1 => float()],
            opt_i32(),
        ),
        (floor, successes, cooldown) in (prop::option::of(float()), opt_i32(), opt_duration()),
        (ramp_initial, ramp_step, gap_min, gap_max, tier, pause) in (
            opt_i32(),
            opt_i32(),
            opt_duration(),
            opt_duration(),
            enum_value(),
            prop::option::of(float()),
        ),
    ) {
        let limits = has_limits.then(|| pb::AccountLimits {
            rate_per_second: rate,
            burst,
            daily_cap,
            max_in_flight,
            recipient_interval: interval,
            quiet_hours: quiet.map(|(start, end)| pb::QuietHours { start, end }),
            high_priority_reserve: reserve,
            high_priority_min: hp_min,
            adaptive_floor: floor,
            recovery_successes: successes,
            offline_cooldown: cooldown,
            warm_up: (ramp_initial.is_some() || ramp_step.is_some()).then(|| pb::WarmUp {
                initial: ramp_initial,
                step: ramp_step,
                ..Default::default()
            }),
            gaps: (gap_min.is_some() || gap_max.is_some()).then_some(pb::SendGaps {
                min: gap_min,
                max: gap_max,
            }),
            messaging_tier: tier,
            pause_failure_rate: pause,
        });
        let account = pb::Account {
            id,
            sender_kind,
            pool,
            time_zone,
            credentials_ref,
            state,
            limits,
            ..Default::default()
        };
        let mut v = Violations::default();
        let converted = validate::account(&account, &mut v);
        named_under(v.as_slice(), "account")?;
        if v.is_empty() {
            prop_assert!(converted);
            let spec = herald_scheduler::api::convert::accounts::checked_account(&account).unwrap();
            prop_assert_eq!(&spec.id, &account.id);
            prop_assert!(spec.limits.rate_per_sec > 0.0 && spec.limits.rate_per_sec <= 10_000.0);
        }
    }

    #[test]
    fn templates_are_accepted_or_refused_by_field(
        id in queue(),
        description in prop_oneof![3 => Just(String::new()), 1 => text()],
        kind in prop_oneof![
            1 => Just(None),
            3 => prop_oneof![3 => Just("Hi {{ name }}".to_string()), 2 => text()]
                .prop_map(|body| Some(pb::template::Kind::Text(pb::TextTemplate { body }))),
            2 => (short_text(), short_text(), prop::collection::vec(short_text(), 0..4))
                .prop_map(|(name, language, parameters)| Some(pb::template::Kind::Provider(pb::ProviderTemplate { name, language, parameters, ..Default::default() }))),
        ],
    ) {
        let t = pb::Template { id, description, kind, ..Default::default() };
        match validate::template(&t) {
            Ok(id) => prop_assert_eq!(&id, &t.id),
            Err(Error::InvalidArgument(v)) => {
                prop_assert!(!v.is_empty());
                named_under(&v, "template")?;
            }
            Err(other) => prop_assert!(false, "not a validation error: {other}"),
        }
    }

    #[test]
    fn wire_scalars_parse_or_refuse(
        d in duration(),
        t in timestamp(),
        id in prop_oneof![Just(uuid::Uuid::now_v7().to_string()), text()],
        local in local_time(),
        name in text(),
    ) {
        if let Some(ms) = validate::duration_ms(&d) {
            prop_assert!(ms >= 0);
            prop_assert_eq!(i128::from(ms), i128::from(d.seconds) * 1000 + i128::from(d.nanos / 1_000_000));
        }
        if let Some(at) = convert::from_timestamp(&t) {
            prop_assert_eq!(convert::timestamp(at), t);
        }
        if let Ok(parsed) = validate::task_id("id", &id) {
            prop_assert_eq!(parsed.to_string(), id.to_lowercase());
        }
        let _ = validate::parse_local_time(&local);
        if validate::queue_name_problem(&name).is_none() {
            prop_assert!(!name.is_empty() && name.len() <= 63);
            prop_assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-_".contains(c)));
        }
    }
}

fn huge() -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 999_999_999,
    })
}

/// Regression (found by fuzzing, #10): a schedule's jitter, stagger or misfire grace of
/// i64::MAX seconds overflowed the millisecond sum (a panic in debug builds, a wrapped value
/// in release); it is out of range.
#[test]
fn huge_schedule_durations_are_out_of_range() {
    let spec = pb::ScheduleSpec {
        id: "daily".into(),
        cron: "0 9 * * *".into(),
        queue: "default".into(),
        recipients: vec!["+15550001".into()],
        content: Some(pb::Content {
            body: Some(pb::content::Body::Text("hi".into())),
            ..Default::default()
        }),
        jitter: huge(),
        stagger: huge(),
        misfire_grace: huge(),
        ..Default::default()
    };
    let Err(Error::InvalidArgument(v)) = herald_scheduler::schedule::spec::check(&spec, Utc::now())
    else {
        panic!("accepted");
    };
    let fields: Vec<_> = v.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "schedule.jitter",
            "schedule.stagger",
            "schedule.misfire_grace"
        ]
    );
}

/// Regression (found by fuzzing, #10): the same overflow in a campaign's window and spacing.
#[test]
fn huge_campaign_durations_are_out_of_range() {
    let spec = pb::CampaignSpec {
        queue: "default".into(),
        content: Some(pb::Content {
            body: Some(pb::content::Body::Text("hi".into())),
            ..Default::default()
        }),
        window: huge(),
        spacing: huge(),
        ..Default::default()
    };
    let fields = herald_scheduler::campaigns::check_spec(&spec, Utc::now()).into_fields();
    assert_eq!(fields, vec!["campaign.window", "campaign.spacing"]);
}

/// Regression (found by fuzzing, #10): a local time at chrono's limits could not be shifted
/// into an instant without overflowing; it is refused as a field violation.
#[test]
fn local_times_at_chronos_limits_are_refused() {
    for (local, zone) in [
        ("+262143-12-31T23:59", "America/New_York"),
        ("-262144-01-01T00:00", "Asia/Shanghai"),
    ] {
        let spec = pb::TaskSpec {
            queue: "default".into(),
            recipient: "+15550001".into(),
            content: Some(pb::Content {
                body: Some(pb::content::Body::Text("hi".into())),
                ..Default::default()
            }),
            local_time: local.into(),
            local_time_zone: zone.into(),
            ..Default::default()
        };
        let mut v = Violations::default();
        assert!(validate::task_spec(&spec, "task", "default", Utc::now(), &mut v).is_none());
        assert_eq!(v.as_slice().len(), 1, "{local}: {:?}", v.as_slice());
        assert_eq!(v.as_slice()[0].field, "task.local_time");
    }
}

/// Regression (found by fuzzing, #10): a deadline in year 200000 is a valid chrono instant but
/// not a protobuf Timestamp, and PostgreSQL could not store it: CreateTask failed with a
/// database error instead of naming the field.
#[test]
fn timestamps_outside_protobufs_range_are_not_valid() {
    for seconds in [-62_135_596_801, 253_402_300_800, 6_000_000_000_000] {
        let spec = pb::TaskSpec {
            queue: "default".into(),
            recipient: "+15550001".into(),
            content: Some(pb::Content {
                body: Some(pb::content::Body::Text("hi".into())),
                ..Default::default()
            }),
            expire_at: Some(prost_types::Timestamp { seconds, nanos: 0 }),
            ..Default::default()
        };
        let mut v = Violations::default();
        assert!(validate::task_spec(&spec, "task", "default", Utc::now(), &mut v).is_none());
        assert_eq!(v.as_slice().len(), 1);
        assert_eq!(v.as_slice()[0].field, "task.expire_at");
    }
    let last = prost_types::Timestamp {
        seconds: 253_402_300_799,
        nanos: 999_999_999,
    };
    assert!(convert::from_timestamp(&last).is_some());
}
