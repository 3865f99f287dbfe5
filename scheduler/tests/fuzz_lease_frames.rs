//! Fuzzing the lease session's pure frame handling (issue #10): a Hello with any values is
//! accepted or refused with a status naming its field, and any report parses into a domain
//! report with sane numbers or is refused (acknowledged `accepted = false`), never a panic. The
//! same frames over a real stream are fuzzed in tests/tests/fuzz_lease.rs. Case counts:
//! `PROPTEST_CASES` (docs/fuzzing.md).

mod fuzz_support;

use chrono::Datelike;
use herald_proto::v1 as pb;
use herald_scheduler::api::lease::{hello as check_hello, report, MAX_RETRY_AFTER_MS};
use herald_scheduler::lease::reports::AttemptReport;
use proptest::prelude::*;
use tonic::{Code, Status};

use fuzz_support::*;

fn hello() -> impl Strategy<Value = pb::Hello> {
    (
        prop_oneof![3 => "exec-[a-z0-9]{1,8}", 1 => text()],
        prop_oneof![3 => Just(1u32), 1 => Just(0u32), 1 => any::<u32>()],
        prop::collection::vec(prop_oneof![3 => Just("default".to_string()), 1 => short_text()], 0..4),
        prop_oneof![3 => 0u32..10, 1 => prop::sample::select(vec![100_000u32, 100_001, u32::MAX]), 1 => any::<u32>()],
        prop::collection::vec(short_text(), 0..3),
    )
        .prop_map(|(executor_id, protocol_version, queues, initial_credit, credentials_refs)| pb::Hello {
            executor_id,
            protocol_version,
            queues,
            initial_credit,
            credentials_refs,
        })
}

fn attempt_result() -> impl Strategy<Value = pb::AttemptResult> {
    (
        prop_oneof![3 => Just(uuid::Uuid::now_v7().to_string()), 1 => text()],
        any::<i32>(),
        enum_value(),
        prop_oneof![3 => Just(String::new()), 1 => text()],
        opt_duration(),
        prop_oneof![3 => Just(String::new()), 1 => text()],
        prop::option::of(timestamp()),
        enum_value(),
    )
        .prop_map(
            |(
                task_id,
                attempt,
                outcome,
                error,
                retry_after,
                provider_message_id,
                started_at,
                scope,
            )| {
                pb::AttemptResult {
                    task_id,
                    attempt,
                    outcome,
                    error,
                    retry_after,
                    provider_message_id,
                    started_at,
                    rate_limit_scope: scope,
                    ..Default::default()
                }
            },
        )
}

/// A Hello as the lease edge answers it: accepted, or the stream's status.
fn validate_hello(h: &pb::Hello) -> Result<(), Status> {
    check_hello(h).map(|_| ()).map_err(Status::from)
}

/// A wire report as the domain report the engine applies; None when it is refused as it stands.
fn report_from_wire(r: &pb::AttemptResult) -> Option<AttemptReport> {
    report(r).report.ok()
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn hellos_are_accepted_or_refused_by_field(h in hello()) {
        match validate_hello(&h) {
            Ok(()) => {
                prop_assert!(!h.executor_id.is_empty() && h.executor_id.chars().count() <= 128);
                prop_assert!(h.protocol_version != 0);
                prop_assert!(h.initial_credit <= 100_000);
                // Everything stored from a Hello is storable text.
                prop_assert!(!h.executor_id.contains('\0'));
                prop_assert!(h.credentials_refs.iter().all(|c| !c.contains('\0')));
            }
            Err(status) => {
                prop_assert!(matches!(status.code(), Code::InvalidArgument | Code::FailedPrecondition));
                prop_assert!(status.message().starts_with("hello."), "{}", status.message());
            }
        }
    }

    #[test]
    fn reports_parse_with_sane_numbers_or_are_refused(r in attempt_result()) {
        if let Some(report) = report_from_wire(&r) {
            prop_assert_eq!(report.task_id.to_string(), r.task_id.to_lowercase());
            prop_assert_eq!(report.attempt, r.attempt);
            if let Some(ms) = report.retry_after_ms {
                prop_assert!((0..=MAX_RETRY_AFTER_MS).contains(&ms), "retry_after_ms {ms}");
            }
            // Storable: within protobuf's (and so PostgreSQL's) range.
            if let Some(at) = report.started_at {
                prop_assert!((1..=9999).contains(&at.year()), "started_at {at}");
            }
            prop_assert!(report.error.as_ref().is_none_or(|e| e.len() <= 4096 && !e.contains('\0')));
            prop_assert!(report.provider_message_id.as_ref().is_none_or(|p| p.len() <= 512 && !p.contains('\0')));
        }
    }
}

/// Regression (found by fuzzing, #10): a retry-after of i64::MAX seconds overflowed the
/// millisecond sum and panicked the session; it is now capped.
#[test]
fn an_absurd_retry_after_is_capped_not_an_overflow() {
    let r = pb::AttemptResult {
        task_id: uuid::Uuid::now_v7().to_string(),
        attempt: 1,
        outcome: pb::OutcomeClass::RateLimited as i32,
        retry_after: Some(prost_types::Duration {
            seconds: i64::MAX,
            nanos: 999_999_999,
        }),
        ..Default::default()
    };
    let report = report_from_wire(&r).expect("a rate-limited report parses");
    assert_eq!(report.retry_after_ms, Some(MAX_RETRY_AFTER_MS));
}

/// Regression (found by fuzzing, #10): a start time in year 250000 is a valid chrono instant
/// that PostgreSQL cannot store; it failed the whole report batch (UNAVAILABLE, on every
/// reconnect). It is now treated as absent.
#[test]
fn a_start_time_outside_protobufs_range_is_dropped() {
    let r = pb::AttemptResult {
        task_id: uuid::Uuid::now_v7().to_string(),
        attempt: 1,
        outcome: pb::OutcomeClass::Ok as i32,
        started_at: Some(prost_types::Timestamp {
            seconds: 8_000_000_000_000,
            nanos: 0,
        }),
        ..Default::default()
    };
    let report = report_from_wire(&r).expect("an OK report parses");
    assert_eq!(report.started_at, None);
}

/// Regression (found by fuzzing, #10): a NUL in a report's error text (a provider's response
/// excerpt can hold one) failed the whole batch in PostgreSQL, on every reconnect; NULs are now
/// dropped. A Hello whose executor id or credentials refs hold control characters is refused
/// before anything is stored.
#[test]
fn nul_characters_never_reach_the_database() {
    let r = pb::AttemptResult {
        task_id: uuid::Uuid::now_v7().to_string(),
        attempt: 1,
        outcome: pb::OutcomeClass::Transient as i32,
        error: "bad\0gateway".into(),
        provider_message_id: "\0id".into(),
        ..Default::default()
    };
    let report = report_from_wire(&r).expect("a transient report parses");
    assert_eq!(report.error.as_deref(), Some("badgateway"));
    assert_eq!(report.provider_message_id.as_deref(), Some("id"));

    let ok = pb::Hello {
        executor_id: "exec-1".into(),
        protocol_version: 1,
        ..Default::default()
    };
    assert!(validate_hello(&ok).is_ok());
    let nul_id = pb::Hello {
        executor_id: "exec\0".into(),
        ..ok.clone()
    };
    assert_eq!(
        validate_hello(&nul_id).unwrap_err().code(),
        Code::InvalidArgument
    );
    let nul_ref = pb::Hello {
        credentials_refs: vec!["wa-1".into(), "wa\u{1}".into()],
        ..ok
    };
    let status = validate_hello(&nul_ref).unwrap_err();
    assert!(
        status.message().starts_with("hello.credentials_refs[1]"),
        "{status:?}"
    );
}
